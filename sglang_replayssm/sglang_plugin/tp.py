"""This scheduler process's place in SGLang's parallel layout (``--tp N``): which rank's shard its pool holds, and
whether it records the metrics that are the same on every rank. Read from SGLang's published layout, which a
scheduler has once its process groups are built; a process without one (a pool built outside a scheduler, the unit
tests) is taken for the only rank."""

from __future__ import annotations


def _parallel():
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        return p, int(p.tp_rank), int(p.tp_size)
    except Exception:   # nothing published in this process
        return None, 0, 1


def tp_rank_label() -> str:
    """"TP rank r of N" of this process ("TP rank 0 of 1" without a published layout)."""
    _, rank, size = _parallel()
    return f"TP rank {rank} of {size}"


def first_rank_of_group() -> bool:
    """True in attention-TP rank 0 (context-parallel rank 0, pipeline stage 0): the process that records what every
    rank of its attention-TP group sees alike (the rows' steps), as SGLang records its own scheduler metrics there."""
    p, _, _ = _parallel()
    if p is None:
        return True
    try:
        return int(p.attn_tp_rank) == 0 and int(p.attn_cp_rank) == 0 and int(p.pp_rank) == 0
    except Exception:
        return True
