"""Spreading the flushes of rows that start decoding together.

A row's ring is empty when its prefill ends (the step's metadata hook folds it, ``ReplayMambaPool.flush_rows``)
and gains one record per decode step, so the rows of one prefill -- a wave of requests sent together, as
``bench_serving`` sends them -- fill their rings on the same decode step and all flush on it: every
``window``-th step folds the whole batch (reads and writes every checkpoint, writes every read copy) while the
steps between read only, and that step is the wave's p99 inter-token latency. So a row folds once early, when its
ring first holds ``slot % window`` records (``ReplayStatePool.flush_rows``, the exact fold a copy-on-write uses):
rows of consecutive slots then reach the window on different steps, and every step flushes about
``rows / window`` of them, the load the decode kernels are tuned for. The cost: one extra fold per request.

Device ops, no host read. They run only in the ``window`` decode steps after a prefill (a host count) and for
decode steps of at least ``window`` rows (fewer rows flushing together barely load a step).
"""

from __future__ import annotations

import torch

from sglang_replayssm.reference.replay import STEP_COUNTS

FLUSH_COUNT = STEP_COUNTS.index("decode_flush_rows")   # an early fold counts as a flush in the metrics


class FlushStagger:
    """The record count at which each slot folds early (0 or -1: none ahead) and the decode steps left to look for
    it."""

    def __init__(self, replay, num_slots: int):
        self.replay = replay
        self.window = replay.cfg.window
        self.enabled = replay.cfg.mode == "replay" and self.window > 1
        self.fold_at = torch.full((num_slots,), -1, dtype=torch.long, device=replay.device)
        self.steps_left = 0

    def after_prefill(self, slots: torch.Tensor) -> None:
        """The rings of ``slots`` (device; padding <= 0) were emptied for a prefill: each folds early at
        ``slot % window`` records (none for 0: it flushes at the window, as without this). Four launches."""
        if not self.enabled or slots.numel() == 0:
            return
        idx = slots.reshape(-1).to(torch.long).clamp(min=0)
        self.fold_at.index_copy_(0, idx, idx % self.window)
        self.steps_left = self.window

    def after_decode(self, slots: torch.Tensor, counts: torch.Tensor) -> None:
        """After a decode step's cursor move over ``slots`` [B] (device, padding 0): the rows whose ring now holds
        their early-fold count fold every layer; ``counts`` (``STEP_COUNTS``) adds them to the flushes."""
        if self.steps_left <= 0:
            return
        self.steps_left -= 1
        if slots.shape[0] < self.window:
            return
        cur = self.replay.cursor[slots]
        due = (cur == self.fold_at[slots]) & (cur > 0)   # a count of 0 is no early fold (nor is the padding slot)
        rows = torch.where(due, slots, 0)
        self.replay.flush_rows(rows)
        self.fold_at.index_fill_(0, rows.to(torch.long), -1)
        counts[FLUSH_COUNT] += due.sum()
