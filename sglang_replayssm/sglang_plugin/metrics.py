"""ReplaySSM metrics, exported on SGLang's ``/metrics`` (prometheus_client multiprocess mode).

Names and meanings: the table of :mod:`sglang_replayssm.accounting` (the same in the native engine). SGLang sets
``PROMETHEUS_MULTIPROC_DIR`` in the launcher when ``--enable-metrics`` is given, before it spawns the
schedulers; metrics created in a scheduler then land in that directory and SGLang's HTTP server aggregates
them. prometheus_client picks its value class when it is first imported, so the metrics are created
inside the scheduler, when its ReplaySSM pool is built (every family is exported from the start, at 0).

Tensor parallelism (``--tp N``): every TP rank runs a scheduler with its own pool holding its shard of the SSM
heads, and the multiprocess collector sums a counter over the processes. The byte counters are per-shard traffic,
so every rank counts its own and ``/metrics`` shows the server's total. The sequence counts (flushes, non-flush
steps, accepted records, rollbacks) and the ring occupancy are the same on every rank of an attention-TP group (the
same rows step together), so only its first rank (attention-TP rank 0, context-parallel rank 0, pipeline stage 0)
records them, as SGLang records its own scheduler metrics: counted once per sequence step, not once per rank.
"""

from __future__ import annotations

import threading

from sglang_replayssm.accounting import COUNTERS, GAUGES, SGLANG_GAUGES

from .tp import first_rank_of_group

NAMES = tuple(f"{n}_total" for n in COUNTERS) + tuple(GAUGES) + tuple(SGLANG_GAUGES)
# the same on every TP rank (the rows' steps, not the shard's bytes): recorded by the first rank only
PER_SEQUENCE = ("replayssm:flushes_total", "replayssm:nonflush_steps_total", "replayssm:accepted_records_total",
                "replayssm:rollbacks_total", "replayssm:ring_occupancy")

_lock = threading.Lock()
_metrics: dict | None = None
_first_rank: bool | None = None


def records_sequence_counts() -> bool:
    """True in the process that records the per-sequence metrics (``tp.first_rank_of_group``; decided once)."""
    global _first_rank
    if _first_rank is None:
        _first_rank = first_rank_of_group()
    return _first_rank


def _create() -> dict:
    from prometheus_client import Counter, Gauge

    out = {f"{name}_total": Counter(name, doc) for name, doc in COUNTERS.items()}
    out.update({name: Gauge(name, doc, multiprocess_mode="mostrecent")
                for name, doc in (GAUGES | SGLANG_GAUGES).items()})
    return out


def metrics() -> dict:
    global _metrics
    with _lock:
        if _metrics is None:
            _metrics = _create()
        return _metrics


def inc(name: str, value: float) -> None:
    if value and (name not in PER_SEQUENCE or records_sequence_counts()):
        metrics()[name].inc(value)


def set_gauge(name: str, value: float) -> None:
    if name not in PER_SEQUENCE or records_sequence_counts():
        metrics()[name].set(value)
