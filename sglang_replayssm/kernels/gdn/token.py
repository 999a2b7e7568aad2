"""GDN per-token pieces shared by the decode and the verify kernels: the gate, the token's q/k
normalisers and scalars, and the wrappers' input checks."""
from __future__ import annotations

import triton
import triton.language as tl

from ..checks import check, check_block_v, check_rows, check_tensor, next_pow2
from ..math_helpers import softplus


L2_EPS = 1e-6


@triton.jit
def _gdn_gate(av, alog_ptr, dtb_ptr, i_h):
    """g = -exp(A_log) softplus(a + dt_bias) of value head i_h (av: a, one value or one per draft)."""
    return -tl.exp(tl.load(alog_ptr + i_h).to(tl.float32)) * softplus(av + tl.load(dtb_ptr + i_h).to(tl.float32))


@triton.jit
def _gdn_scalars(q_row, k_row, a_ptr, b_ptr, alog_ptr, dtb_ptr, i_b, i_h, scale, H: tl.constexpr,
                 K: tl.constexpr, EPS: tl.constexpr):
    """Per (row, head) scalars of the current token: q/k normalisers, k.q, g, beta."""
    o_k = tl.arange(0, K)
    qf = tl.load(q_row + o_k).to(tl.float32)
    kf = tl.load(k_row + o_k).to(tl.float32)
    rq = scale / tl.sqrt(tl.sum(qf * qf, axis=0) + EPS)
    rk = 1.0 / tl.sqrt(tl.sum(kf * kf, axis=0) + EPS)
    kq = tl.sum(qf * kf, axis=0) * rq * rk
    av = tl.load(a_ptr + i_b * H + i_h).to(tl.float32)
    bv = tl.load(b_ptr + i_b * H + i_h).to(tl.float32)
    g = _gdn_gate(av, alog_ptr, dtb_ptr, i_h)
    return rq, rk, kq, g, tl.sigmoid(bv)


@triton.jit
def _gdn_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, i_b, i_h, i_hk, o_k, mask_k,
               o_v, mask_v, scale, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr,
               V: tl.constexpr, EPS: tl.constexpr, QK_ROW: tl.constexpr, V_ROW: tl.constexpr):
    qv = tl.load(q_ptr + i_b * QK_ROW + i_hk * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
    kv = tl.load(k_ptr + i_b * QK_ROW + i_hk * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
    qv = qv * (scale / tl.sqrt(tl.sum(qv * qv, axis=0) + EPS))
    kv = kv / tl.sqrt(tl.sum(kv * kv, axis=0) + EPS)
    vv = tl.load(v_ptr + i_b * V_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    av = tl.load(a_ptr + i_b * H + i_h).to(tl.float32)
    bv = tl.load(b_ptr + i_b * H + i_h).to(tl.float32)
    g = _gdn_gate(av, alog_ptr, dtb_ptr, i_h)
    return qv, kv, vv, g, tl.sigmoid(bv)


def _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, device, T=None):
    """The token inputs' checks; q, k, v may be views read by token rows (checks.token_rows)."""
    lead = (B,) if T is None else (B, T)
    check_rows("q", q, shape=lead + (Hk, Dk), device=device)
    check_rows("k", k, shape=lead + (Hk, Dk), device=device)
    check_rows("v", v, shape=lead + (H, Dv), device=device)
    check_tensor("a", a, shape=lead + (H,), device=device)
    check_tensor("b", b, shape=lead + (H,), device=device)
    check_tensor("A_log", A_log, shape=(H,), device=device)
    check_tensor("dt_bias", dt_bias, shape=(H,), device=device)
    check(H % Hk == 0, f"num value heads {H} must be a multiple of num k-heads {Hk}")


def _block_v(Dv, block_v):
    return check_block_v(block_v, min(max(next_pow2(Dv), 16), 32))
