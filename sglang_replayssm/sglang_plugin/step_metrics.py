"""The metrics publishing of ``ReplayMambaPool`` (a mixin of it, ``pool.py``): the step counts the kernels add on the
device (``self._acc``: ``reference.replay.STEP_COUNTS``: decode rows, their flushes and records; verify rows at their
commit, tokens, records, folds, folded records, accepted records, rejected drafts; the last step's committed records
and rows, i.e. the ring occupancy), read once per metrics interval without a step ever waiting on the device, and
turned into the ``replayssm:`` families (``sglang_replayssm/accounting.py``: state bytes read and written, and what a
conventional decode would have moved)."""

from __future__ import annotations

import torch

from sglang_replayssm.accounting import StateSizes, conventional_traffic, decode_traffic, verify_traffic
from sglang_replayssm.reference.replay import ADDED_COUNTS

from . import metrics


class StepMetrics:
    # self._acc: the step counts of reference.replay.STEP_COUNTS (decode rows, their flushes and records; verify
    # rows at their commit, tokens, records, folds, folded records, accepted records, rejected drafts; the last
    # step's committed records and rows: the ring occupancy), added on the device by replay.advance /
    # replay.count_commit or the commit preparation (prepare_commit) and read once per metrics interval.
    def _count_step(self) -> None:
        self._steps_since_metrics += 1
        if self._steps_since_metrics >= self._metrics_interval:
            self._publish_metrics(wait=False)

    def flush_metrics(self) -> None:
        """Publish every count so far (waits for the device: tests, shutdown; the step path never does)."""
        self._publish_metrics(wait=True)

    def _publish_metrics(self, wait: bool) -> None:
        """Move the device counts to the host and publish them. On CUDA the copy is queued (pinned buffer, an
        event) and published at a later call once done, so a step never waits on the device; a copy still in
        flight makes this interval's counts wait on the device for the next one."""
        if self.replay is None:
            return
        if self._acc_copy is not None:
            host, done = self._acc_copy
            if not done.query():
                if not wait:
                    return
                done.synchronize()
            self._acc_copy = None
            self._publish(host.tolist())   # noqa: host-read (a finished copy in pinned memory: no device wait)
        self._steps_since_metrics = 0
        if self._acc.device.type != "cuda":
            snap = self._acc.tolist()   # noqa: host-read (CPU tensors)
            self._reset_counts()
            self._publish(snap)
            return
        if self._acc_host is None:
            self._acc_host = torch.empty(self._acc.shape, dtype=self._acc.dtype, pin_memory=True)
        self._acc_host.copy_(self._acc, non_blocking=True)
        self._reset_counts()
        done = torch.cuda.Event()
        done.record()
        self._acc_copy = (self._acc_host, done)
        if wait:
            self._publish_metrics(wait=True)

    def _reset_counts(self) -> None:
        self._acc[:ADDED_COUNTS] = 0   # the last step's records and rows stay

    def _publish(self, counts: list[float]) -> None:
        d_rows, d_flushes, d_records, v_rows, v_tokens, v_records, v_folds, v_fold_records, accepted, rollbacks, \
            last_records, last_rows = counts
        occupancy = last_records / max(last_rows, 1) / self.replay.cfg.window
        s = StateSizes.of(self.replay, conventional_itemsize=self._ssm_itemsize)
        d_read, d_written = decode_traffic(s, d_rows, d_flushes, d_records)
        v_read, v_written = verify_traffic(s, "replay", v_rows, v_tokens, v_records, v_folds, v_fold_records)
        metrics.inc("replayssm:flushes_total", d_flushes + v_folds)
        metrics.inc("replayssm:nonflush_steps_total", d_rows - d_flushes + v_rows - v_folds)
        metrics.inc("replayssm:state_bytes_read_total", d_read + v_read)
        metrics.inc("replayssm:state_bytes_written_total", d_written + v_written)
        metrics.inc("replayssm:conventional_state_bytes_total", conventional_traffic(s, d_rows + v_tokens))
        metrics.inc("replayssm:accepted_records_total", accepted)
        metrics.inc("replayssm:rollbacks_total", rollbacks)
        metrics.set_gauge("replayssm:ring_occupancy", occupancy)
