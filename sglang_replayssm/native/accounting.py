"""The native engine's counters and gauges, which `Engine.stats()` reports (and `metrics.py` exposes).

`counters`: running totals (tokens, steps, speculative drafts, SSM state traffic: see metric_names);
`last_batch`: rows of the last decode / verify step; `ring_occupancy`: mean fill of the running
requests' replay rings; `throughput()`: generated tokens per second over a recent window.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from .. import metric_names

COUNTERS = ("prompt_tokens", "generation_tokens", "requests_finished", "steps", "decode_steps", "verify_steps",
            "flushes", "nonflush_steps", "state_bytes_read", "state_bytes_written", "conventional_state_bytes",
            "accepted_records", "rollbacks", "draft_tokens", "accepted_draft_tokens")


class Accounting:
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
        self.ring_occupancy = metric_names.ring_occupancy(cur.tolist(), pool.cfg.window)

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
