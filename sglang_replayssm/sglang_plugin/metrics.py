"""ReplaySSM metrics, exported on SGLang's ``/metrics`` (prometheus_client multiprocess mode).

SGLang sets ``PROMETHEUS_MULTIPROC_DIR`` in the launcher when ``--enable-metrics`` is given, before it
spawns the schedulers; metrics created in a scheduler then land in that directory and SGLang's HTTP
server aggregates them. prometheus_client picks its value class when it is first imported, so the
metrics are created lazily, on first use, inside the scheduler.

Names (all per scheduler process; summed across processes):

* ``replayssm:flushes_total``               decode rows that folded their ring into the checkpoint
* ``replayssm:nonflush_steps_total``        decode rows that only appended a record
* ``replayssm:state_bytes_read_total``      SSM state bytes read by ReplaySSM decode rows (estimate from shapes)
* ``replayssm:state_bytes_written_total``   SSM state bytes written by ReplaySSM decode rows
* ``replayssm:conventional_state_bytes_total`` bytes a conventional decode of the same rows moves (read + write)
* ``replayssm:ring_occupancy``              mean committed records per active slot at the last update (gauge)
* ``replayssm:accepted_records_total``      draft records committed by speculative verify
* ``replayssm:rollbacks_total``             draft records rejected by verify (left behind in the ring)
"""

from __future__ import annotations

import threading

NAMES = (
    "replayssm:flushes_total",
    "replayssm:nonflush_steps_total",
    "replayssm:state_bytes_read_total",
    "replayssm:state_bytes_written_total",
    "replayssm:conventional_state_bytes_total",
    "replayssm:ring_occupancy",
    "replayssm:accepted_records_total",
    "replayssm:rollbacks_total",
)

_lock = threading.Lock()
_metrics: dict | None = None


def _create() -> dict:
    from prometheus_client import Counter, Gauge

    out = {}
    for name in NAMES:
        if name.endswith("_total"):
            # prometheus_client appends `_total` to counters itself.
            out[name] = Counter(name[: -len("_total")], _DOC[name])
        else:
            out[name] = Gauge(name, _DOC[name], multiprocess_mode="mostrecent")
    return out


_DOC = {
    "replayssm:flushes_total": "ReplaySSM decode rows that folded the record ring into the checkpoint.",
    "replayssm:nonflush_steps_total": "ReplaySSM decode rows that appended a record without writing the state.",
    "replayssm:state_bytes_read_total": "SSM state bytes read by ReplaySSM decode rows (from shapes).",
    "replayssm:state_bytes_written_total": "SSM state bytes written by ReplaySSM decode rows (from shapes).",
    "replayssm:conventional_state_bytes_total": "SSM state bytes a conventional decode of the same rows reads and writes.",
    "replayssm:ring_occupancy": "Mean committed records per active slot at the last update.",
    "replayssm:accepted_records_total": "Draft records committed by ReplaySSM speculative verify.",
    "replayssm:rollbacks_total": "Draft records rejected by ReplaySSM speculative verify.",
}


def metrics() -> dict:
    global _metrics
    with _lock:
        if _metrics is None:
            _metrics = _create()
        return _metrics


def inc(name: str, value: float) -> None:
    if value:
        metrics()[name].inc(value)


def set_gauge(name: str, value: float) -> None:
    metrics()[name].set(value)
