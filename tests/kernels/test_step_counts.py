"""A decode step's pointer move with its counts, and a verify's counts before its commit, in one Triton launch
each (kernels/step_counts.py), against the PyTorch reference (reference.replay.advance / count_commit); the
reference against the plain bookkeeping it replaces (the cursors and counts worked out row by row)."""
import pytest
import torch

from sglang_replayssm.kernels import step_counts
from sglang_replayssm.reference import replay as ref

from .helpers import DEV, clone_pool, make_pool

WINDOW = 4


def _batch(gen, num_slots, B):
    """B rows: distinct live slots, then padding rows (0, and SGLang's -1)."""
    live = torch.randperm(num_slots - 1, generator=gen)[: B - 2] + 1
    return torch.cat([live, torch.tensor([0, -1])]).to(torch.int32).to(DEV)


@pytest.mark.parametrize("B", [3, 300])   # one block of the kernel, and several (BLOCK 256)
def test_advance_with_counts_matches_reference_and_plain_bookkeeping(B):
    gen = torch.Generator().manual_seed(B)
    pool = make_pool("gdn", window=WINDOW, num_slots=B + 1, num_layers=1, gen=gen)
    slots = _batch(gen, B + 1, B)
    twin = clone_pool(pool)
    before_cur, before_fold = pool.cursor.clone(), pool.folded.clone()
    c_ref = torch.full((12,), 5, dtype=torch.int64, device=DEV)
    c_ker = c_ref.clone()
    ref.advance(pool, slots, c_ref)
    step_counts.advance(twin, slots, c_ker)
    live = [int(s) for s in slots if int(s) > 0]
    assert torch.equal(pool.cursor[1:], twin.cursor[1:]) and torch.equal(pool.folded[1:], twin.folded[1:])
    assert torch.equal(c_ref, c_ker)
    # the plain bookkeeping, row by row
    flushes = held = after = 0
    for s in live:
        c = int(before_cur[s])
        held += c
        if c + 1 >= WINDOW:
            flushes += 1
            assert int(pool.cursor[s]) == 0 and int(pool.folded[s]) == int(before_fold[s]) + c + 1
        else:
            after += c + 1
            assert int(pool.cursor[s]) == c + 1 and int(pool.folded[s]) == int(before_fold[s])
    assert c_ref.tolist() == [5 + len(live), 5 + flushes, 5 + held] + [5] * 7 + [after, len(live)]
    untouched = [s for s in range(1, B + 1) if s not in live]
    assert torch.equal(pool.cursor[untouched], before_cur[untouched])


def test_advance_without_counts_and_on_an_empty_batch():
    gen = torch.Generator().manual_seed(1)
    pool = make_pool("mamba2", window=WINDOW, num_slots=8, num_layers=1, gen=gen)
    twin = clone_pool(pool)
    slots = _batch(gen, 8, 5)
    ref.advance(pool, slots)
    step_counts.advance(twin, slots)
    assert torch.equal(pool.cursor[1:], twin.cursor[1:]) and torch.equal(pool.folded[1:], twin.folded[1:])
    counts = torch.ones(12, dtype=torch.int64, device=DEV)
    empty = torch.zeros(0, dtype=torch.int32, device=DEV)
    ref.advance(pool, empty, counts)
    step_counts.advance(twin, empty, counts)
    ref.count_commit(pool, empty, empty, 4, counts)
    step_counts.count_commit(twin, empty, empty, 4, counts)
    assert counts.tolist() == [1] * 12
    with pytest.raises(ValueError, match="counts"):
        step_counts.advance(twin, slots, torch.zeros(12, dtype=torch.float64, device=DEV))


@pytest.mark.parametrize("B", [4, 290])
def test_commit_counts_match_reference_and_plain_bookkeeping(B):
    gen = torch.Generator().manual_seed(10 + B)
    T = 3
    pool = make_pool("kda", window=WINDOW, num_slots=B + 1, num_layers=1, gen=gen)
    slots = _batch(gen, B + 1, B)
    accepted = torch.randint(1, T + 1, (B,), generator=gen, dtype=torch.int32).to(DEV)
    c_ref = torch.zeros(12, dtype=torch.int64, device=DEV)
    c_ker = c_ref.clone()
    cursor = pool.cursor.clone()
    ref.count_commit(pool, slots, accepted, T, c_ref)
    step_counts.count_commit(pool, slots, accepted.long(), T, c_ker)
    assert torch.equal(c_ref, c_ker)
    assert torch.equal(pool.cursor, cursor)                 # counting moves nothing
    rows = folds = folded = acc = held = after = 0
    for s, a in zip(slots.tolist(), accepted.tolist()):
        if s <= 0:
            continue
        c = int(cursor[s])
        rows, held, acc = rows + 1, held + c, acc + a
        if c + a >= WINDOW:
            folds, folded = folds + 1, folded + c + a
        else:
            after += c + a
    assert c_ref.tolist() == [0, 0, 0, rows, rows * T, held, folds, folded, acc, rows * T - acc, after, rows]
