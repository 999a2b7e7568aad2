"""ReplaySSM metrics, exported on SGLang's ``/metrics`` (prometheus_client multiprocess mode).

Names and meanings: the table of :mod:`sglang_replayssm.accounting` (the same in the native engine). SGLang sets
``PROMETHEUS_MULTIPROC_DIR`` in the launcher when ``--enable-metrics`` is given, before it spawns the
schedulers; metrics created in a scheduler then land in that directory and SGLang's HTTP server aggregates
them. prometheus_client picks its value class when it is first imported, so the metrics are created
inside the scheduler, when its ReplaySSM pool is built (every family is exported from the start, at 0).
"""

from __future__ import annotations

import threading

from sglang_replayssm.accounting import COUNTERS, GAUGES

NAMES = tuple(f"{n}_total" for n in COUNTERS) + tuple(GAUGES)

_lock = threading.Lock()
_metrics: dict | None = None


def _create() -> dict:
    from prometheus_client import Counter, Gauge

    out = {f"{name}_total": Counter(name, doc) for name, doc in COUNTERS.items()}
    out.update({name: Gauge(name, doc, multiprocess_mode="mostrecent") for name, doc in GAUGES.items()})
    return out


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
