"""The native engine's counters and gauges, which `Engine.stats()` reports (and `metrics.py` exposes).

`counters`: running totals (tokens, steps, speculative drafts, and the SSM state traffic that
`account_decode` / `account_verify` add per step, with the byte counts and metric meanings of
`sglang_replayssm.accounting`);
`last_batch`: rows of the last decode / verify step; `ring_occupancy`: mean fill of the running
requests' replay rings; `throughput()`: generated tokens per second over a recent window.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from sglang_replayssm.accounting import StateSizes, conventional_traffic, decode_traffic, ring_occupancy, verify_traffic

COUNTERS = ("prompt_tokens", "generation_tokens", "requests_finished", "steps", "decode_steps", "verify_steps",
            "flushes", "nonflush_steps", "state_bytes_read", "state_bytes_written", "conventional_state_bytes",
            "accepted_records", "rollbacks", "draft_tokens", "accepted_draft_tokens")


class StepStats:
    def __init__(self):
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.last_batch = 0
        self.ring_occupancy = 0.0
        self._history = deque(maxlen=64)   # (time, generation_tokens) for the throughput gauge

    def ring_gauge(self, pool, slots: list[int]) -> None:
        """Ring occupancy of the pool slots of the running requests."""
        if pool.cfg.mode == "conventional" or not slots:
            self.ring_occupancy = 0.0
            return
        cur = pool.cursor[torch.tensor(slots, device=pool.device)]
        self.ring_occupancy = ring_occupancy(cur.tolist(), pool.cfg.window)

    def throughput(self, window_s: float = 10.0) -> float:
        """Generated tokens per second over the last `window_s` seconds."""
        now = time.monotonic()
        self._history.append((now, self.counters["generation_tokens"]))
        old = [(t, n) for t, n in self._history if now - t <= window_s]
        if len(old) < 2 or old[-1][0] - old[0][0] <= 0:
            return 0.0
        return (old[-1][1] - old[0][1]) / (old[-1][0] - old[0][0])

    def restore(self, counters: dict) -> None:
        """Back to `counters` with empty gauges and throughput history (after the warm-up)."""
        self.counters.update(counters)
        self._history.clear()
        self.last_batch, self.ring_occupancy = 0, 0.0



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
