"""A decode step's pointer move and a verify's counts, each in one Triton launch (the PyTorch reference:
``reference.replay.advance`` / ``count_commit``; the counts' offsets below are the order of its ``STEP_COUNTS``).

These run once per step outside SGLang's captured graphs, where every small PyTorch op is one more launch
on the host's critical path (about 25 for the decode's move and counts, 18 for a commit's counts): at batch 1
the host's launches are the step. One program walks the batch in blocks: rows are distinct slots but for the
padding slot 0, whose own bookkeeping is garbage by design, so no two programs or lanes race on a live slot.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import check, check_tensor

BLOCK = 256


@triton.jit
def _decode_advance_kernel(cursor_ptr, folded_ptr, slots_ptr, counts_ptr, B, W, HAS_COUNTS: tl.constexpr,
                           BLOCK: tl.constexpr):
    rows = tl.full([], 0, tl.int64)
    flushes = tl.full([], 0, tl.int64)
    held = tl.full([], 0, tl.int64)
    after = tl.full([], 0, tl.int64)
    for start in range(0, B, BLOCK):
        o = start + tl.arange(0, BLOCK)
        m = o < B
        s = tl.maximum(tl.load(slots_ptr + o, mask=m, other=0).to(tl.int64), 0)
        cur = tl.load(cursor_ptr + s, mask=m, other=0)
        nxt = cur + 1
        flushed = nxt >= W
        fo = tl.load(folded_ptr + s, mask=m, other=0)
        tl.store(folded_ptr + s, fo + tl.where(flushed, nxt, 0).to(fo.dtype), mask=m)
        tl.store(cursor_ptr + s, tl.where(flushed, 0, nxt).to(cur.dtype), mask=m)
        live = m & (s > 0)
        rows += tl.sum(live.to(tl.int64), axis=0)
        flushes += tl.sum((live & flushed).to(tl.int64), axis=0)
        held += tl.sum(tl.where(live, cur, 0).to(tl.int64), axis=0)
        after += tl.sum(tl.where(live & (nxt < W), nxt, 0).to(tl.int64), axis=0)
    if HAS_COUNTS:
        tl.store(counts_ptr + 0, tl.load(counts_ptr + 0) + rows)
        tl.store(counts_ptr + 1, tl.load(counts_ptr + 1) + flushes)
        tl.store(counts_ptr + 2, tl.load(counts_ptr + 2) + held)
        tl.store(counts_ptr + 10, after)
        tl.store(counts_ptr + 11, rows)


@triton.jit
def _count_commit_kernel(cursor_ptr, slots_ptr, acc_ptr, counts_ptr, B, T, W, BLOCK: tl.constexpr):
    # int64 throughout (no fp64 on the GPU: tests/kernels/test_compile_sm90.py)
    rows = tl.full([], 0, tl.int64)
    held = tl.full([], 0, tl.int64)
    folds = tl.full([], 0, tl.int64)
    folded = tl.full([], 0, tl.int64)
    accepted = tl.full([], 0, tl.int64)
    after = tl.full([], 0, tl.int64)
    for start in range(0, B, BLOCK):
        o = start + tl.arange(0, BLOCK)
        m = o < B
        s = tl.load(slots_ptr + o, mask=m, other=0).to(tl.int64)
        live = m & (s > 0)
        cur = tl.where(live, tl.load(cursor_ptr + tl.maximum(s, 0), mask=m, other=0).to(tl.int64), 0)
        a = tl.where(live, tl.load(acc_ptr + o, mask=m, other=0).to(tl.int64), 0)
        rows, held, folds, folded, accepted, after = add_commit_counts(live, cur, a, W, rows, held, folds, folded,
                                                                       accepted, after)
    store_commit_counts(counts_ptr, T, rows, held, folds, folded, accepted, after)


@triton.jit
def add_commit_counts(live, cur, acc, W, rows, held, folds, folded, accepted, after):
    """A block of a verify's counts (reference.replay.count_commit): ``live`` rows with cursors ``cur`` and ``acc``
    accepted drafts (both 0 where not live, int64), added to the running sums, which are returned."""
    new = cur + acc
    fo = live & (new >= W)
    return (rows + tl.sum(live.to(tl.int64), axis=0), held + tl.sum(cur, axis=0),
            folds + tl.sum(fo.to(tl.int64), axis=0), folded + tl.sum(tl.where(fo, new, 0), axis=0),
            accepted + tl.sum(acc, axis=0), after + tl.sum(tl.where(fo, 0, new), axis=0))


@triton.jit
def store_commit_counts(counts_ptr, T, rows, held, folds, folded, accepted, after):
    """A verify's counts of ``T`` drafts a row into STEP_COUNTS' slots 3..11 (totals added, the last two set)."""
    tokens = rows * T
    tl.store(counts_ptr + 3, tl.load(counts_ptr + 3) + rows)
    tl.store(counts_ptr + 4, tl.load(counts_ptr + 4) + tokens)
    tl.store(counts_ptr + 5, tl.load(counts_ptr + 5) + held)
    tl.store(counts_ptr + 6, tl.load(counts_ptr + 6) + folds)
    tl.store(counts_ptr + 7, tl.load(counts_ptr + 7) + folded)
    tl.store(counts_ptr + 8, tl.load(counts_ptr + 8) + accepted)
    tl.store(counts_ptr + 9, tl.load(counts_ptr + 9) + tokens - accepted)
    tl.store(counts_ptr + 10, after)
    tl.store(counts_ptr + 11, rows)


def _check_counts(pool, slots: torch.Tensor, counts) -> None:
    dev = pool.cursor.device
    check_tensor("slots", slots, shape=(slots.shape[0],), dtype=(torch.int32, torch.int64), device=dev)
    if counts is not None:
        check_tensor("counts", counts, shape=(12,), dtype=torch.int64, device=dev)


def advance(pool, slots: torch.Tensor, counts: torch.Tensor | None = None) -> None:
    """``reference.replay.advance`` in one launch (``slots``: int32 / int64 [B], contiguous, on the pool's device)."""
    B = int(slots.shape[0])
    _check_counts(pool, slots, counts)
    if B == 0:
        return
    dummy = counts if counts is not None else pool.cursor
    _decode_advance_kernel[(1,)](pool.cursor, pool.folded, slots, dummy, B, pool.cfg.window,
                                 HAS_COUNTS=counts is not None, BLOCK=BLOCK, num_warps=4)


def count_commit(pool, slots: torch.Tensor, accepted: torch.Tensor, num_drafts: int, counts: torch.Tensor) -> None:
    """``reference.replay.count_commit`` in one launch (``slots`` / ``accepted``: int32 or int64 [B], contiguous)."""
    B = int(slots.shape[0])
    _check_counts(pool, slots, counts)
    check_tensor("accepted", accepted, shape=(B,), dtype=(torch.int32, torch.int64), device=pool.cursor.device)
    check(num_drafts >= 1, f"num_drafts must be >= 1, got {num_drafts}")
    if B == 0:
        return
    _count_commit_kernel[(1,)](pool.cursor, slots, accepted, counts, B, num_drafts, pool.cfg.window, BLOCK=BLOCK,
                               num_warps=4)
