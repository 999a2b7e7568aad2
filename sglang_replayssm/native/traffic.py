"""The native engine's step accounting: adds one decode or verify step's rows to the engine's counters (the
``replayssm:`` flush / non-flush / state-byte counters), with the byte counts of ``sglang_replayssm.accounting``.
"""

from __future__ import annotations

from sglang_replayssm.accounting import StateSizes, conventional_traffic, decode_traffic, verify_traffic

__all__ = ["StateSizes", "account_decode", "account_verify"]


def account_decode(s: StateSizes, c: dict, conventional: bool, window: int, cursors: list[int]) -> None:
    """Add one decode step (rows whose rings held `cursors` records) to the counters `c`."""
    flushes = 0 if conventional else sum(cur + 1 >= window for cur in cursors)
    rd, wr = decode_traffic(s, len(cursors), flushes, sum(cursors), conventional)
    c["flushes"] += flushes
    c["nonflush_steps"] += len(cursors) - flushes
    c["state_bytes_read"] += rd
    c["state_bytes_written"] += wr
    c["conventional_state_bytes"] += conventional_traffic(s, len(cursors))


def account_verify(s: StateSizes, c: dict, mode: str, window: int, cursors: list[int], accepted: list[int],
                   T: int) -> None:
    """Add one verify step of T tokens per row (and its commit of `accepted` records) to the counters."""
    rows = len(cursors)
    new = [cur + a for cur, a in zip(cursors, accepted)]
    fold_records = sum(n for n in new if n >= window) if mode == "replay" else 0
    folds = sum(n >= window for n in new) if mode == "replay" else rows
    rd, wr = verify_traffic(s, mode, rows, rows * T, sum(cursors), folds, fold_records)
    c["state_bytes_read"] += rd
    c["state_bytes_written"] += wr
    c["conventional_state_bytes"] += conventional_traffic(s, rows * T)
    c["accepted_records"] += sum(accepted)
    c["flushes"] += folds
    c["nonflush_steps"] += rows - folds
