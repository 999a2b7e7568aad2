"""A verify commit's index preparation with its step counts, and a flush's rows, each in one Triton launch; a flush's
pointer move after its fold in one more (the PyTorch reference: ``reference.commit_prep``, whose docstrings define
the outputs; the counts' offsets are the order of ``reference.replay.STEP_COUNTS``).

These run once per step outside SGLang's graphs, where every small PyTorch op is one launch on the host's critical
path: a tree commit's preparation was about 25 of them (84 with extra_buffer track slots), a prefill's flush of its
rows 25. One program walks the batch in blocks of rows (a commit's rows are distinct slots but for padding rows,
which count nothing), with a row's draft nodes in a [rows, nodes] tile; a tree path from the last accepted node is
walked up its parents (T loads per row) and written back in root-to-node order. A flush finds a slot's repeats by
comparing each block of rows with the rows before it ([BLOCK, FLUSH_BQ] tiles). No host read.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference.commit_prep import COMMIT_PREP_ROWS
from .checks import cdiv, check, check_tensor, next_pow2
from .step_counts import add_commit_counts, store_commit_counts

BLOCK = 128
FLUSH_BQ = 32   # earlier rows per comparison tile of a flush's repeat search ([BLOCK, FLUSH_BQ]: no register spills)
INDEX = (torch.int32, torch.int64)


@triton.jit
def _commit_prep_kernel(slots_ptr, acc_ptr, pos_ptr, par_ptr, track_ptr, steps_ptr, cursor_ptr, counts_ptr, out_ptr,
                        nodes_ptr, B, T, N, W, FROM_LAST: tl.constexpr, HAS_POS: tl.constexpr, HAS_PAR: tl.constexpr,
                        HAS_TRACK: tl.constexpr, HAS_COUNTS: tl.constexpr, BLOCK: tl.constexpr, BN: tl.constexpr):
    n_rows = tl.full([], 0, tl.int64)
    held = tl.full([], 0, tl.int64)
    folds = tl.full([], 0, tl.int64)
    folded = tl.full([], 0, tl.int64)
    accepted = tl.full([], 0, tl.int64)
    after = tl.full([], 0, tl.int64)
    j = tl.arange(0, BN)
    for start in range(0, B, BLOCK):
        r = start + tl.arange(0, BLOCK)
        m = r < B
        r64 = r.to(tl.int64)
        s = tl.load(slots_ptr + r, mask=m, other=0).to(tl.int64)
        live = m & (s > 0)
        ain = tl.load(acc_ptr + r, mask=m, other=0).to(tl.int64)
        st = tl.full([BLOCK], -1, tl.int64)
        tr = tl.zeros([BLOCK], tl.int64)
        if HAS_TRACK:
            st = tl.load(steps_ptr + r, mask=m, other=-1).to(tl.int64)
            tr = tl.load(track_ptr + r, mask=m, other=0).to(tl.int64)
        upto = st + 1                                       # chains: the boundary node + 1
        mn = m[:, None] & (j[None, :] < N)
        if FROM_LAST:
            last = ain
            if HAS_PAR:                                     # the path's depth, then the path written root first
                node = ain
                a = tl.zeros([BLOCK], tl.int64)
                for _ in range(T):
                    ok = m & (node >= 0) & (node < T)
                    a += ok.to(tl.int64)
                    node = tl.where(ok, tl.load(par_ptr + r64 * T + tl.where(ok, node, 0), mask=ok, other=-1), -1)
                    node = node.to(tl.int64)
                tl.store(nodes_ptr + r64[:, None] * N + j[None, :], tl.full([BLOCK, BN], -1, tl.int32),
                         mask=mn & (j[None, :] >= a[:, None]))
                node = ain
                upto = tl.zeros([BLOCK], tl.int64)
                for i in range(T):
                    ok = m & (node >= 0) & (node < T)
                    at = a - 1 - i
                    tl.store(nodes_ptr + r64 * N + at, node.to(tl.int32), mask=ok)
                    upto = tl.where(ok & (node == st), at + 1, upto)
                    node = tl.where(ok, tl.load(par_ptr + r64 * T + tl.where(ok, node, 0), mask=ok, other=-1), -1)
                    node = node.to(tl.int64)
            else:
                a = ain + 1
        else:
            a = ain
            last = a - 1
            if HAS_POS:
                pos = tl.load(pos_ptr + r64[:, None] * N + j[None, :], mask=mn, other=-1).to(tl.int64)
                nd = tl.where(pos >= 0, pos - r64[:, None] * T, -1)
                tl.store(nodes_ptr + r64[:, None] * N + j[None, :], nd.to(tl.int32), mask=mn)
                last = tl.max(tl.where(j[None, :] == (a - 1)[:, None], nd, -1), axis=1)
                hit = (nd == st[:, None]) & (j[None, :] < a[:, None]) & mn
                upto = tl.max(tl.where(hit, j[None, :] + 1, 0), axis=1)
        acc = tl.where(live, a, 0)
        rows = tl.maximum(s, 0)
        tl.store(out_ptr + r, rows.to(tl.int32), mask=m)
        tl.store(out_ptr + B + r, acc.to(tl.int32), mask=m)
        tl.store(out_ptr + 2 * B + r, tl.where(live & (acc > 0), last, -1).to(tl.int32), mask=m)
        tl.store(out_ptr + 3 * B + r, r, mask=m)
        if HAS_TRACK:
            on = live & (st >= 0) & (tr > 0)
            tl.store(out_ptr + 4 * B + r, tl.where(on, tr, 0).to(tl.int32), mask=m)
            tl.store(out_ptr + 5 * B + r, tl.where(on, s, 0).to(tl.int32), mask=m)
            tl.store(out_ptr + 6 * B + r, tl.where(on, upto, 0).to(tl.int32), mask=m)
            tl.store(out_ptr + 7 * B + r, tl.where(on, st, -1).to(tl.int32), mask=m)
        if HAS_COUNTS:   # reference.replay.count_commit of (rows, acc); int64 throughout
            cur = tl.where(live, tl.load(cursor_ptr + rows, mask=live, other=0).to(tl.int64), 0)
            n_rows, held, folds, folded, accepted, after = add_commit_counts(live, cur, acc, W, n_rows, held, folds,
                                                                             folded, accepted, after)
    if HAS_COUNTS:
        store_commit_counts(counts_ptr, T, n_rows, held, folds, folded, accepted, after)


@triton.jit
def _flush_prep_kernel(rows_ptr, cursor_ptr, out_ptr, B, BLOCK: tl.constexpr, BQ: tl.constexpr):
    for start in range(0, B, BLOCK):
        r = start + tl.arange(0, BLOCK)
        m = r < B
        s = tl.load(rows_ptr + r, mask=m, other=0).to(tl.int32)   # slot ids fit in int32 (the cursor's index)
        keep = m & (s > 0)
        for c in range(0, start + BLOCK, BQ):           # the rows before, BQ at a time: [BLOCK, BQ] int32 tiles
            q = c + tl.arange(0, BQ)
            sq = tl.load(rows_ptr + q, mask=q < B, other=0).to(tl.int32)
            dup = (sq[None, :] == s[:, None]) & (q[None, :] < r[:, None])
            keep = keep & (tl.max(dup.to(tl.int32), axis=1) == 0)
        cnt = tl.load(cursor_ptr + tl.where(keep, s, 0), mask=keep, other=0)
        tl.store(out_ptr + r, tl.where(keep, s, 0).to(tl.int32), mask=m)
        tl.store(out_ptr + B + r, tl.where(keep, cnt, 0).to(tl.int32), mask=m)


@triton.jit
def _flush_move_kernel(rows_ptr, counts_ptr, cursor_ptr, folded_ptr, B, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < B
    c = tl.load(counts_ptr + o, mask=m, other=0)
    on = m & (c > 0)
    s = tl.load(rows_ptr + o, mask=on, other=0).to(tl.int64)
    f = tl.load(folded_ptr + s, mask=on, other=0)
    tl.store(folded_ptr + s, f + c.to(f.dtype), mask=on)
    tl.store(cursor_ptr + s, tl.zeros_like(c).to(cursor_ptr.dtype.element_ty), mask=on)


def commit_prep(pool, slots: torch.Tensor, accepted: torch.Tensor, num_drafts: int, counts: torch.Tensor | None,
                out: torch.Tensor, nodes: torch.Tensor | None = None, *, positions: torch.Tensor | None = None,
                parents: torch.Tensor | None = None, from_last: bool = False, track: torch.Tensor | None = None,
                steps: torch.Tensor | None = None) -> None:
    """``reference.commit_prep.commit_prep`` in one launch: int32 / int64 index tensors, contiguous, on the pool's
    device; ``out`` [COMMIT_PREP_ROWS, B] and ``nodes`` [B, N] int32."""
    dev = pool.cursor.device
    B = int(slots.shape[0])
    check_tensor("slots", slots, shape=(B,), dtype=INDEX, device=dev)
    check_tensor("accepted", accepted, shape=(B,), dtype=INDEX, device=dev)
    check_tensor("out", out, shape=(COMMIT_PREP_ROWS, B), dtype=torch.int32, device=dev)
    check(num_drafts >= 1, f"num_drafts must be >= 1, got {num_drafts}")
    if counts is not None:
        check_tensor("counts", counts, shape=(12,), dtype=torch.int64, device=dev)
    tree = positions is not None or (from_last and parents is not None)
    check(nodes is not None or not tree, "a tree commit (positions, or parents with from_last) needs nodes")
    N = 0
    if tree:
        check_tensor("nodes", nodes, dtype=torch.int32, device=dev)
        check(nodes.dim() == 2 and nodes.shape[0] == B, f"nodes must be [B={B}, N], got {tuple(nodes.shape)}")
        N = int(nodes.shape[1])
    if positions is not None:
        check(not from_last, "positions go with accepted counts, not with from_last")
        check_tensor("positions", positions, shape=(B, N), dtype=INDEX, device=dev)
    if from_last and parents is not None:
        check_tensor("parents", parents, shape=(B, num_drafts), dtype=INDEX, device=dev)
        check(N == num_drafts, f"a path from the parents needs nodes [B, {num_drafts}], got {tuple(nodes.shape)}")
    check((track is None) == (steps is None), "track and steps go together")
    if track is not None:
        check_tensor("track", track, shape=(B,), dtype=INDEX, device=dev)
        check_tensor("steps", steps, shape=(B,), dtype=INDEX, device=dev)
    if B == 0:
        return
    dummy = out
    _commit_prep_kernel[(1,)](slots, accepted, dummy if positions is None else positions,
                              dummy if parents is None else parents, dummy if track is None else track,
                              dummy if steps is None else steps, pool.cursor, pool.cursor if counts is None else counts,
                              out, dummy if nodes is None else nodes, B, num_drafts, N, pool.cfg.window,
                              FROM_LAST=from_last, HAS_POS=positions is not None,
                              HAS_PAR=from_last and parents is not None, HAS_TRACK=track is not None,
                              HAS_COUNTS=counts is not None, BLOCK=BLOCK, BN=max(next_pow2(N), 2), num_warps=4)


def flush_prep(pool, rows: torch.Tensor, out: torch.Tensor) -> None:
    """``reference.commit_prep.flush_prep`` in one launch (``rows`` int32 / int64 [B]; ``out`` [2, B] int32)."""
    dev = pool.cursor.device
    B = int(rows.shape[0])
    check_tensor("rows", rows, shape=(B,), dtype=INDEX, device=dev)
    check_tensor("out", out, shape=(2, B), dtype=torch.int32, device=dev)
    if B:
        _flush_prep_kernel[(1,)](rows, pool.cursor, out, B, BLOCK=BLOCK, BQ=FLUSH_BQ, num_warps=4)


def flush_move(pool, rows: torch.Tensor, counts: torch.Tensor) -> None:
    """``reference.commit_prep.flush_move`` in one launch (``rows`` / ``counts`` int32 [B], ``flush_prep``'s)."""
    dev = pool.cursor.device
    B = int(rows.shape[0])
    check_tensor("rows", rows, shape=(B,), dtype=torch.int32, device=dev)
    check_tensor("counts", counts, shape=(B,), dtype=torch.int32, device=dev)
    if B:
        _flush_move_kernel[(cdiv(B, BLOCK),)](rows, counts, pool.cursor, pool.folded, B, BLOCK=BLOCK,
                                                     num_warps=4)
