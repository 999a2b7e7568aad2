"""Commit of tree drafts: the records of each row's accepted root-to-node path moved to the ring positions
right after its cursor, in one Triton launch (the PyTorch reference: ``reference.replay.compact_paths``).

A verify of T draft nodes leaves node n's record at ring position cursor + n. A chain commit keeps the
prefix as it is; a tree commit of the path p_0 < p_1 < ... (a root-to-node path lists nodes in draft
order, parents before children) needs record p_j at cursor + j. Each program takes one (row, layer, column
block) and walks j in order: position cursor + j is written only after every earlier read of it (p_k >= k
for every k, and p_k > p_j for k > j), so the move is in place. Rows whose path is the chain prefix, and
entries past the accepted count, do nothing: a chain-shaped commit reads nothing but the row's indices.
No host sync: slots, accepted counts and nodes stay on the device.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import cdiv, check, check_tensor

BLOCK = 1024
MAX_GRID_YZ = 65535


@triton.jit
def _move(ptr, src, dst, o, NCOL: tl.constexpr):
    m = o < NCOL
    x = tl.load(ptr + src * NCOL + o, mask=m)
    tl.store(ptr + dst * NCOL + o, x, mask=m)


@triton.jit
def _compact_kernel(slots_ptr, acc_ptr, nodes_ptr, cursor_ptr, recd_ptr, reck_ptr, recg_ptr, recv_ptr, recb_ptr, S, R,
                    N: tl.constexpr, ND: tl.constexpr, NK: tl.constexpr, NG: tl.constexpr, NB: tl.constexpr,
                    BLOCK: tl.constexpr, HAS_INPUTS: tl.constexpr):
    """HAS_INPUTS: the ring also holds a delta family's raw v (ND per record, as d) and beta (NB) rows."""
    b = tl.program_id(0).to(tl.int64)
    lay = tl.program_id(1).to(tl.int64)
    o = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    a = tl.load(acc_ptr + b)
    live = (slot > 0) & (slot < S)
    cur = tl.load(cursor_ptr + slot, mask=live, other=0).to(tl.int64)
    row = (lay * S + slot) * R + cur              # ring position cursor of (layer, slot), in record rows
    for j in tl.static_range(N):
        node = tl.load(nodes_ptr + b * N + j).to(tl.int64)
        if live & (j < a) & (node != j) & (node >= 0):
            _move(recd_ptr, row + node, row + j, o, ND)
            _move(reck_ptr, row + node, row + j, o, NK)
            _move(recg_ptr, row + node, row + j, o, NG)
            if HAS_INPUTS:
                _move(recv_ptr, row + node, row + j, o, ND)
                _move(recb_ptr, row + node, row + j, o, NB)


def compact_paths(pool, slots: torch.Tensor, accepted: torch.Tensor, nodes: torch.Tensor) -> None:
    """Move each row's accepted path records (``nodes[b, :accepted[b]]``, draft indices root to node) to
    ring positions cursor .. cursor + accepted - 1 of every layer, in place (see the module docstring).
    slots / accepted: int32 [B]; nodes: int32 [B, N] (entries past the accepted count are ignored). Rows of
    slot 0 (padding) are skipped. Cursors do not move (``commit`` does that)."""
    B = int(slots.shape[0])
    if B == 0 or pool.rec_d is None:
        return
    dev = pool.cursor.device
    check_tensor("slots", slots, shape=(B,), dtype=torch.int32, device=dev)
    check_tensor("accepted", accepted, shape=(B,), dtype=torch.int32, device=dev)
    check_tensor("nodes", nodes, dtype=torch.int32, device=dev)
    check(nodes.dim() == 2 and nodes.shape[0] == B, f"nodes must be [B={B}, N], got {tuple(nodes.shape)}")
    nl, S, R = pool.rec_d.shape[:3]
    ND = pool.rec_d[0, 0, 0].numel()
    NK = pool.rec_k[0, 0, 0].numel()
    NG = pool.rec_g[0, 0, 0].numel()
    inputs = getattr(pool, "rec_v", None) is not None      # a delta family's v and beta records move too
    NB = pool.rec_beta[0, 0, 0].numel() if inputs else 1
    check(nl <= MAX_GRID_YZ, f"compact_paths covers at most {MAX_GRID_YZ} layers, got {nl}")
    grid = (B, nl, cdiv(max(ND, NK, NG), BLOCK))
    _compact_kernel[grid](slots, accepted, nodes, pool.cursor, pool.rec_d, pool.rec_k, pool.rec_g,
                          pool.rec_v if inputs else pool.rec_d, pool.rec_beta if inputs else pool.rec_g, S, R,
                          N=int(nodes.shape[1]), ND=ND, NK=NK, NG=NG, NB=NB, BLOCK=BLOCK, HAS_INPUTS=inputs,
                          num_warps=4)
