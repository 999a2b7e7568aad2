"""Whole-slot copies (``ReplayStatePool.copy_slots``: a radix-cache track slot, a forked verify) in one
Triton launch per pool tensor, with no host read and no traffic for the rows that copy nothing (the PyTorch
reference: ``reference.replay.copy_slots``).

SGLang hands the copies over as device tensors of every batch row (``extra_buffer``: a track mask over the
whole batch), and at most a few rows copy in a step. Indexing every row (rows that copy nothing sending the
padding slot onto itself) would move a whole slot per row: megabytes per row and layer at real widths. Here
each program takes one (row, leading index, column group), reads the row's two slot ids and exits unless
the row copies (source and destination > 0, distinct).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import cdiv, check, check_tensor

BLOCK = 1024
GROUPS = 8          # programs per (row, leading index); each walks 1/GROUPS of the slot's columns
MAX_GRID_YZ = 65535
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@triton.jit
def _copy_rows_kernel(t_ptr, src_ptr, dst_ptr, S, X, CHUNKS, BLOCK: tl.constexpr, GROUPS: tl.constexpr):
    b = tl.program_id(0)
    lead = tl.program_id(1).to(tl.int64)
    grp = tl.program_id(2)
    s = tl.load(src_ptr + b).to(tl.int64)
    d = tl.load(dst_ptr + b).to(tl.int64)
    if (s > 0) & (d > 0) & (s != d) & (s < S) & (d < S):
        sbase = (lead * S + s) * X
        dbase = (lead * S + d) * X
        for c in range(grp, CHUNKS, GROUPS):
            o = c * BLOCK + tl.arange(0, BLOCK)
            m = o < X
            tl.store(t_ptr + dbase + o, tl.load(t_ptr + sbase + o, mask=m), mask=m)


def copy_slots(tensors, src: torch.Tensor, dst: torch.Tensor, slot_dim: int) -> None:
    """For every row b with src[b] > 0, dst[b] > 0 and src[b] != dst[b]: slot dst[b] of each tensor becomes a
    copy of slot src[b]. ``tensors``: contiguous tensors whose dim ``slot_dim`` (0 or 1) is the slot;
    src / dst: int32 or int64 [B] on their device. Other rows do nothing."""
    B = int(src.shape[0])
    if B == 0:
        return
    check(slot_dim in (0, 1), f"slot_dim must be 0 or 1, got {slot_dim}")
    dev = src.device
    check_tensor("dst", dst, shape=(B,), dtype=src.dtype, device=dev)
    check_tensor("src", src, shape=(B,), dtype=(torch.int32, torch.int64), device=dev)
    for t in tensors:
        check_tensor("slot tensor", t, device=dev)
        lead = 1 if slot_dim == 0 else int(t.shape[0])
        S = int(t.shape[slot_dim])
        X = t[0].numel() if slot_dim == 0 else t[0, 0].numel()
        check(lead <= MAX_GRID_YZ, f"copy_slots covers at most {MAX_GRID_YZ} leading indices, got {lead}")
        chunks = cdiv(X, BLOCK)
        view = t.view(_SAME_SIZE_INT[t.element_size()])   # bytes moved as integers (fp8, bool, ...)
        _copy_rows_kernel[(B, lead, min(GROUPS, chunks))](view, src, dst, S, X, chunks, BLOCK=BLOCK, GROUPS=GROUPS,
                                                          num_warps=4)
