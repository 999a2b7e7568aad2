"""Analytic SSM-state traffic of one decode or verify row, for the `replayssm:state_bytes_*` counters.

Per SSM layer and sequence (sizes from the pool's own tensors):
  conventional step      reads and writes the full state                       (ckpt, ckpt)
  ReplaySSM non-flush    reads the read copy (or checkpoint) + c records, writes one record
  ReplaySSM flush        reads checkpoint + c records, writes checkpoint (+ read copy) and no record
  verify of T tokens     reads the read copy + c records, writes T records; a commit that fills the
                         window folds: reads checkpoint + n records, writes checkpoint (+ read copy)
  snapshot verify        reads the state, writes T snapshots; commit copies one snapshot back
`conventional_bytes` is what a conventional engine moves for the same tokens (read + write per token).
`account_decode` / `account_verify` add one step's rows to the engine's counters (metric_names).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StateSizes:
    ckpt: int       # bytes of one layer's checkpoint of one sequence
    read: int       # bytes a non-flush step reads for the state (read copy or checkpoint)
    rc: int         # bytes of the read copy (0 without)
    record: int     # bytes of one record
    fp32_state: int  # a conventional engine's fp32 state
    layers: int

    @classmethod
    def of(cls, pool) -> "StateSizes":
        per = lambda t: 0 if t is None else t[0, 0].numel() * t.element_size()  # noqa: E731
        rc = per(pool.rc) + per(pool.rc_scale) + per(pool.rc_gscale)
        rec = 0
        if pool.rec_d is not None:
            rec = (pool.rec_d[0, 0, 0].numel() * pool.rec_d.element_size()
                   + pool.rec_k[0, 0, 0].numel() * pool.rec_k.element_size()
                   + pool.rec_g[0, 0, 0].numel() * pool.rec_g.element_size())
        H, Dv, Dk = pool.geo.state_shape
        ckpt = per(pool.ckpt)
        return cls(ckpt=ckpt, read=rc or ckpt, rc=rc, record=rec, fp32_state=H * Dv * Dk * 4,
                   layers=pool.num_layers)


def decode_bytes(s: StateSizes, conventional: bool, cursor: int, flush: bool) -> tuple[int, int]:
    """(read, written) bytes, all layers, of one decode row whose ring held `cursor` records."""
    if conventional:
        return s.layers * s.ckpt, s.layers * s.ckpt
    if flush:
        return s.layers * (s.ckpt + cursor * s.record), s.layers * (s.ckpt + s.rc)
    return s.layers * (s.read + cursor * s.record), s.layers * s.record


def verify_bytes(s: StateSizes, mode: str, cursor: int, T: int) -> tuple[int, int]:
    """(read, written) of verifying T tokens; mode 'replay' | 'snapshot' (state + T snapshots)."""
    if mode == "replay":
        return s.layers * (s.read + cursor * s.record), s.layers * T * s.record
    return s.layers * s.ckpt, s.layers * T * s.ckpt


def commit_bytes(s: StateSizes, mode: str, new_cursor: int, folds: bool) -> tuple[int, int]:
    if mode == "replay":
        return (s.layers * (s.ckpt + new_cursor * s.record), s.layers * (s.ckpt + s.rc)) if folds else (0, 0)
    return s.layers * s.ckpt, s.layers * (s.ckpt + s.rc)


def conventional_bytes(s: StateSizes, tokens: int) -> int:
    return 2 * s.layers * s.fp32_state * tokens


def account_decode(s: StateSizes, c: dict, conventional: bool, window: int, cursors: list[int]) -> None:
    """Add one decode step (rows whose rings held `cursors` records) to the counters `c`."""
    for cur in cursors:
        flush = not conventional and cur + 1 >= window
        rd, wr = decode_bytes(s, conventional, cur, flush)
        c["flushes" if flush else "nonflush_steps"] += 1
        c["state_bytes_read"] += rd
        c["state_bytes_written"] += wr
        c["conventional_state_bytes"] += conventional_bytes(s, 1)


def account_verify(s: StateSizes, c: dict, mode: str, window: int, cursors: list[int], accepted: list[int],
                   T: int) -> None:
    """Add one verify step of T tokens per row (and its commit of `accepted` records) to the counters."""
    for cur, a in zip(cursors, accepted):
        new = cur + a
        folds = mode == "replay" and new >= window
        r1, w1 = verify_bytes(s, mode, cur, T)
        r2, w2 = commit_bytes(s, mode, new, folds)
        c["state_bytes_read"] += r1 + r2
        c["state_bytes_written"] += w1 + w2
        c["conventional_state_bytes"] += conventional_bytes(s, T)
        c["accepted_records"] += a
        c["flushes" if (folds or mode == "snapshot") else "nonflush_steps"] += 1
