"""A verify's draft-tree parents from SGLang's first-child / next-sibling arrays, in one Triton launch (the PyTorch
reference: ``reference.replay.tree_parents``, a scatter per sibling generation: 2 (T - 1) + 8 launches).

One program per row holds the row's T nodes in registers: node c's first-child parent (the i with next_token[i] = c)
and its elder sibling (the e with next_sibling[e] = c) come from one [T, T] comparison each; a node that is nobody's
first child takes its elder sibling's parent, found by pointer jumping over the sibling lists (ceil(log2 T) rounds,
each a [T, T] one-hot gather). No host read.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import check, check_tensor, next_pow2


@triton.jit
def _gather(idx, vals, lanes):
    """vals[idx[c]] for every c (-1 where idx[c] < 0), with vals indexed by ``lanes``."""
    return tl.max(tl.where(idx[:, None] == lanes[None, :], vals[None, :], -1), axis=1)


@triton.jit
def _tree_parents_kernel(nxt_ptr, sib_ptr, out_ptr, T, BT: tl.constexpr, ROUNDS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BT)
    m = i < T
    nxt = tl.load(nxt_ptr + b * T + i, mask=m, other=-1).to(tl.int32)
    sib = tl.load(sib_ptr + b * T + i, mask=m, other=-1).to(tl.int32)
    nxt = tl.where((nxt >= 0) & (nxt < T), nxt, -1)
    sib = tl.where((sib >= 0) & (sib < T), sib, -1)
    # [c, i] tiles: node c is the first child / the next sibling of node i
    first = tl.max(tl.where(nxt[None, :] == i[:, None], i[None, :], -1), axis=1)
    elder = tl.max(tl.where(sib[None, :] == i[:, None], i[None, :], -1), axis=1)
    val = first                                   # final where ptr < 0
    ptr = tl.where(first >= 0, -1, elder)
    for _ in tl.static_range(ROUNDS):
        on = ptr >= 0
        val = tl.where(on, _gather(ptr, val, i), val)
        ptr = tl.where(on, _gather(ptr, ptr, i), ptr)
    tl.store(out_ptr + b * T + i, val, mask=m)


def tree_parents(next_token: torch.Tensor, next_sibling: torch.Tensor, out: torch.Tensor) -> None:
    """``reference.replay.tree_parents`` in one launch: ``out`` [B, T] int32 (contiguous) from ``next_token`` /
    ``next_sibling`` [B, T] (int32 or int64, contiguous, on ``out``'s device)."""
    check(out.dim() == 2, f"out must be [B, T], got shape {tuple(out.shape)}")
    B, T = out.shape
    for name, t in (("next_token", next_token), ("next_sibling", next_sibling)):
        check_tensor(name, t, shape=(B, T), dtype=(torch.int32, torch.int64), device=out.device)
    check_tensor("out", out, dtype=torch.int32, device=out.device)
    if B == 0 or T == 0:
        return
    _tree_parents_kernel[(B,)](next_token, next_sibling, out, T, BT=max(next_pow2(T), 2),
                               ROUNDS=max(T - 1, 1).bit_length(), num_warps=4)
