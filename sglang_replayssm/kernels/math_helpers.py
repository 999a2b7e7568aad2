"""Small @triton.jit math helpers of the kernels: softplus, L2 norm, one row of a 2-D tile, the inverse of a unit
lower-triangular matrix."""
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


@triton.jit
def unit_lower_inverse(M, o_r, BR: tl.constexpr):
    """(I + M)^-1 of a strictly lower-triangular M [BR, BR] (o_r = arange(BR)), by forward substitution, row by row."""
    X = tl.zeros([BR, BR], dtype=tl.float32)
    for t in tl.static_range(BR):
        xt = (o_r == t).to(tl.float32) - tl.sum(row_select(M, t, o_r)[:, None] * X, axis=0)
        X = tl.where(o_r[:, None] == t, xt[None, :], X)
    return X
