"""The early folds that spread the flushes of rows prefilled together (``sglang_plugin/flush_stagger.py``): with
as many rows as the window, consecutive slots flush on different steps, the states stay those of the same decode
without it, and the metrics count each early fold as a flush; with the pool's Triton ops (what runs on a GPU, under
the interpreter here) and no host read on the step path."""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.sglang_plugin.flush_stagger import FLUSH_COUNT

from .conftest import make_req_pool, replayssm
from .test_pool import _decode

WINDOW = 4
pytestmark = pytest.mark.usefixtures("no_host_reads")


@pytest.fixture(autouse=True)
def kernel_ops(monkeypatch):
    from sglang_replayssm.sglang_plugin.options import OPS_ENV

    monkeypatch.setenv(OPS_ENV, "kernels")


def _run(rows: list[int], steps: int, prefill: bool):
    """A pool whose ``rows`` start decoding together (their prefill's ring flush noted, or not: no early folds),
    ``steps`` decode steps of the same inputs; the cursors after each step and the states at the end."""
    with replayssm(window=WINDOW):
        pool = make_req_pool("gdn", size=8).mamba_pool
    assert pool.replay.ops.package == "kernels"
    idx = torch.tensor(rows)
    if prefill:
        pool.flush_rows(idx)   # what the metadata hook does for a prefill step's rows
    gen = torch.Generator().manual_seed(0)
    cursors = []
    for _ in range(steps):
        _decode(pool, rows, 1, gen)
        cursors.append(pool.replay.cursor[idx].tolist())
    states = [pool.materialize(layer, rows) for layer in range(pool.num_mamba_layers)]
    return pool, cursors, states


def test_rows_prefilled_together_flush_on_different_steps_with_the_same_states():
    rows = list(range(1, 9))                         # 8 rows, window 4: two per early-fold count 0..3
    steps = 3 * WINDOW
    pool, cursors, states = _run(rows, steps, prefill=True)
    plain, plain_cursors, plain_states = _run(rows, steps, prefill=False)
    flushing = [sum(c == 0 for c in step) for step in cursors]
    # without the early folds all 8 flush on every 4th step and none between; with them 2 a step once every row
    # folded early (slot % 4 records: slots 4 and 8 at the window)
    assert [sum(c == 0 for c in step) for step in plain_cursors] == [0, 0, 0, 8] * 3
    assert flushing[WINDOW - 1:] == [2] * (steps - WINDOW + 1), flushing
    assert cursors[-1] == [(steps - r % WINDOW) % WINDOW if r % WINDOW else steps % WINDOW for r in rows]
    for got, want in zip(states, plain_states):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # each early fold counts as a flush (over these 12 steps it replaces a row's third window flush); the six rows
    # with a count of 1..3 folded early once, and only once
    assert int(pool._acc[FLUSH_COUNT]) == sum(flushing) == int(plain._acc[FLUSH_COUNT]) == 24
    assert pool._stagger.fold_at[torch.tensor(rows)].tolist() == [0 if r % WINDOW == 0 else -1 for r in rows]
    assert pool._stagger.steps_left == 0


def test_fewer_rows_than_the_window_flush_together():
    rows = [1, 2, 3]
    _, cursors, _ = _run(rows, WINDOW, prefill=True)
    assert cursors == [[1] * 3, [2] * 3, [3] * 3, [0] * 3]
