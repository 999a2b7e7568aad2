"""Small @triton.jit math helpers of the kernels: softplus, L2 norm, one row of a 2-D tile."""
from __future__ import annotations

import triton
import triton.language as tl

@triton.jit
def softplus(x):
    return tl.where(x <= 20.0, tl.log(1.0 + tl.exp(x)), x)


@triton.jit
def l2norm(x, EPS: tl.constexpr):
    return x / tl.sqrt(tl.sum(x * x, axis=0) + EPS)


@triton.jit
def row_select(X, idx, rows):
    """X[idx, :] of a 2-D tile, as a vector (rows = arange over X's first axis)."""
    return tl.sum(tl.where(rows[:, None] == idx, X, 0.0), axis=0)
