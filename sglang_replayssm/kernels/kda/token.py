"""KDA pieces shared by the decode and the verify kernels: one column chunk's record keys with their
per-channel decays, and the wrappers' input checks."""
from __future__ import annotations

import triton
import triton.language as tl

from ..checks import check, check_block_v, check_rows, check_tensor
from ..math_helpers import softplus


L2_EPS = 1e-6


@triton.jit
def _kda_chunk(recg_ptr, reck_base, slot, i_h, o_r, mask_r, o_kc, a_row, alog, dtb_row,
               H: tl.constexpr, K: tl.constexpr, R: tl.constexpr, REC_K_STRIDE: tl.constexpr, HAS_CUR: tl.constexpr):
    """For one column chunk: record keys with their decay to now (K_r * W) [BR, BKC], the total
    record decay exp(G_c) [BKC] and the current token's decay alpha [BKC] (1 without a token)."""
    Gr = tl.load(recg_ptr + ((slot * R + o_r[:, None]) * H + i_h) * K + o_kc[None, :], mask=mask_r[:, None],
                 other=0.0)
    gtot = tl.sum(Gr, axis=0)
    W = tl.where(mask_r[:, None], tl.exp(gtot[None, :] - tl.cumsum(Gr, axis=0)), 0.0)
    Kr = tl.load(reck_base + o_r[:, None] * REC_K_STRIDE + o_kc[None, :], mask=mask_r[:, None], other=0.0).to(tl.float32)
    if HAS_CUR:
        gc = -tl.exp(alog) * softplus(tl.load(a_row + o_kc).to(tl.float32) + tl.load(dtb_row + o_kc).to(tl.float32))
    else:
        gc = tl.zeros_like(gtot)
    return Kr * W, tl.exp(gtot), tl.exp(gc), gc


def _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, device, T=None):
    """The token inputs' checks; q, k, v may be views read by token rows (checks.token_rows)."""
    lead = (B,) if T is None else (B, T)
    check_rows("q", q, shape=lead + (Hk, Dk), device=device)
    check_rows("k", k, shape=lead + (Hk, Dk), device=device)
    check_rows("v", v, shape=lead + (H, Dv), device=device)
    check_tensor("a", a, shape=lead + (H, Dk), device=device)
    check_tensor("b", b, shape=lead + (H,), device=device)
    check_tensor("A_log", A_log, shape=(H,), device=device)
    check_tensor("dt_bias", dt_bias, shape=(H, Dk), device=device)
    check(H % Hk == 0, f"num value heads {H} must be a multiple of num k-heads {Hk}")
    check(Dk >= 16 and Dk & (Dk - 1) == 0, f"head_k_dim must be a power of 2 >= 16, got {Dk}")


def _block_v(Dv, block_v):
    return check_block_v(block_v, 32)
