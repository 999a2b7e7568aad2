"""KDA pieces shared by the decode and the verify kernels: one column chunk's record keys with their
per-channel decays, the exact fold (the window's d's solved from the checkpoint, then the linear fold), and the
wrappers' input checks."""
from __future__ import annotations

import triton
import triton.language as tl

from ..checks import check, check_block_v, check_rows, check_tensor
from ..constants import FOLD_PREC
from ..math_helpers import softplus, unit_lower_inverse
from ..quant_tiles import read_copy_scales, store_state_chunk


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


@triton.jit
def kda_exact_d(ckpt_ptr, head_rows, o_v, mask_v, recv_base, recb_base, reck_base, recg_base, cnt,
                REC_V_STRIDE: tl.constexpr, REC_B_STRIDE: tl.constexpr, REC_K_STRIDE: tl.constexpr,
                REC_G_STRIDE: tl.constexpr, K: tl.constexpr, BKC: tl.constexpr, MKC: tl.constexpr, BV: tl.constexpr,
                BR: tl.constexpr):
    """The exact d's [BR, BV] of records 0..cnt-1 for value rows o_v of a KDA head, solved from the full-precision
    checkpoint and the records' raw inputs: with G the per-channel cumulative log-decays, (I + M) d = beta (v -
    S0 (exp(G_i) * k_i)), M_ij = beta_i sum_c k_i[c] k_j[c] exp(G_i[c] - G_j[c]) (j < i). S0 (exp(G) k)^T is a
    tensor-core dot per BKC-column chunk; M's per-channel sums, broadcast over MKC columns at a time (a [BR, BR, MKC]
    tile); then the inverse of I + M and one dot. The *_base pointers point at record 0 of this (slot, head)."""
    o_r = tl.arange(0, BR)
    mr = o_r < cnt
    lower = (o_r[:, None] > o_r[None, :]) & mr[:, None]
    A = tl.zeros([BV, BR], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        G = tl.cumsum(tl.load(recg_base + o_r[:, None] * REC_G_STRIDE + o_kc[None, :], mask=mr[:, None], other=0.0),
                      axis=0)
        Kc = tl.load(reck_base + o_r[:, None] * REC_K_STRIDE + o_kc[None, :], mask=mr[:, None], other=0.0).to(tl.float32)
        S0 = tl.load(ckpt_ptr + (head_rows + o_v)[:, None] * K + o_kc[None, :], mask=mask_v[:, None],
                     other=0.0).to(tl.float32)
        A += tl.dot(S0, tl.trans(Kc * tl.exp(G)), input_precision=FOLD_PREC)
    M = tl.zeros([BR, BR], dtype=tl.float32)
    for c in range(K // MKC):
        o_kc = c * MKC + tl.arange(0, MKC)
        G = tl.cumsum(tl.load(recg_base + o_r[:, None] * REC_G_STRIDE + o_kc[None, :], mask=mr[:, None], other=0.0),
                      axis=0)
        Kc = tl.load(reck_base + o_r[:, None] * REC_K_STRIDE + o_kc[None, :], mask=mr[:, None], other=0.0).to(tl.float32)
        dec = tl.exp(tl.where(lower[:, :, None], G[:, None, :] - G[None, :, :], 0.0))
        M += tl.sum(tl.where(lower[:, :, None], Kc[:, None, :] * Kc[None, :, :] * dec, 0.0), axis=2)
    beta = tl.load(recb_base + o_r * REC_B_STRIDE, mask=mr, other=0.0)
    X = unit_lower_inverse(beta[:, None] * M, o_r, BR)
    Vr = tl.load(recv_base + o_r[:, None] * REC_V_STRIDE + o_v[None, :], mask=mr[:, None] & mask_v[None, :],
                 other=0.0).to(tl.float32)
    return tl.dot(X, beta[:, None] * (Vr - tl.trans(A)), input_precision=FOLD_PREC)


@triton.jit
def _kda_fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v, recg_ptr, reck_base, slot,
                    i_h, o_r, mask_r, Dr, a_row, alog, dtb_row, dcur, k_row, rk, seed, stream, idx_base,
                    H: tl.constexpr, K: tl.constexpr, R: tl.constexpr, REC_K_STRIDE: tl.constexpr,
                    BKC: tl.constexpr, BV: tl.constexpr, READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr,
                    SHARED_QUANT: tl.constexpr, HAS_CUR: tl.constexpr, INTERPRET: tl.constexpr):
    """S_new = (S0 Diag(exp G) + Dr^T (K_r W)) Diag(alpha) + dcur k^T into ckpt (+ read copy: fp8 with
    per-row scales, or NVFP4 whose per-head global scale needs the whole head here, BV >= Dv), Dr the
    records' exact d's (kda_exact_d). A quantized read copy needs the row maxima first: a first pass,
    unless whole rows are one chunk."""
    rows = head_rows + o_v
    amax = tl.zeros([BV], dtype=tl.float32)
    sc = amax
    gs = 1.0
    ONE_PASS: tl.constexpr = READ_COPY == 0 or BKC == K
    for p in tl.static_range(1 if ONE_PASS else 2):
        if p == 1 or READ_COPY == 0:
            sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, READ_COPY)
        for c in range(K // BKC):
            o_kc = c * BKC + tl.arange(0, BKC)
            KW, gam, al, _g = _kda_chunk(recg_ptr, reck_base, slot, i_h, o_r, mask_r, o_kc, a_row, alog,
                                         dtb_row, H, K, R, REC_K_STRIDE, HAS_CUR)
            S0 = tl.load(ckpt_ptr + rows[:, None] * K + o_kc[None, :], mask=mask_v[:, None], other=0.0).to(tl.float32)
            S = (S0 * gam[None, :] + tl.dot(tl.trans(Dr), KW, input_precision=FOLD_PREC)) * al[None, :]
            if HAS_CUR:
                S = S + dcur[:, None] * (tl.load(k_row + o_kc).to(tl.float32) * rk)[None, :]
            if READ_COPY != 0 and ONE_PASS:  # the whole rows: scales from this chunk, then store
                amax = tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1)
                sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, READ_COPY)
                store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_kc, c, mask_v, sc, gs, seed, stream,
                                  idx_base, K, BKC, BV, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)
            elif READ_COPY != 0 and p == 0:
                amax = tl.maximum(amax, tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1))
            else:
                store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_kc, c, mask_v, sc, gs, seed, stream,
                                  idx_base, K, BKC, BV, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)


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
