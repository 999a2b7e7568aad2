"""The exact fold of the delta-rule families (GDN, KDA): a window's records replayed from their raw inputs
(v, beta, k, g) through the delta rule, from the full-precision checkpoint, a few value rows at a time in registers
(each value row of a delta-rule state evolves on its own given the keys). The records' stored d were computed
by steps that read the low-precision read copy; the fold never uses them, so the read copy's error does not
reach the recurrence (reference: ``core.replay_inputs``).

GDN (a scalar decay per token) replays the window in its chunk form, as chunked prefill does: with G the records'
cumulative log-decays, the exact d's solve ``(I + M) d = beta (v - exp(G) S0 k)``, ``M_ij = beta_i exp(G_i - G_j)
k_i . k_j`` (j < i): per (row, head) the keys' Gram matrix and the inverse of that unit lower-triangular window x
window matrix (``gdn_window``), per value-row tile one pass over the checkpoint in column chunks (``gdn_exact_d``,
tensor-core dots), and then the linear fold of those d's (``fold.fold_store_dw``). KDA's per-channel decays keep the
token-by-token replay (``delta_replay``: a K-wide reduction per record).

Used by a decode's flush rows (the GDN decode kernels; KDA's ``delta_flush_rows``) and by the commit / flush launch
(``_delta_fold_kernel``, through ``fold.fold`` / ``fold.commit``)."""
from __future__ import annotations

import triton
import triton.language as tl

from .constants import FOLD_PREC
from .fold import fold_program, fold_store_dw
from .math_helpers import row_select
from .quant_tiles import store_state_tile


@triton.jit
def delta_replay(S, o_v, mask_v, recv_base, recb_base, reck_base, recg_base, cnt, REC_V_STRIDE: tl.constexpr,
                 REC_B_STRIDE: tl.constexpr, REC_K_STRIDE: tl.constexpr, REC_G_STRIDE: tl.constexpr,
                 K: tl.constexpr, PER_CHANNEL: tl.constexpr):
    """Rows o_v ([BV, K] fp32 tile S) of one head's state after records 0..cnt-1: for each record j,
    S <- S exp(g_j) (per column for KDA), d_j = beta_j (v_j - S k_j), S <- S + d_j k_j^T. The *_base pointers
    point at record 0 of this (slot, head) (k: its k-head), the strides step one record."""
    o_k = tl.arange(0, K)
    for j in range(cnt):
        if PER_CHANNEL:
            S = S * tl.exp(tl.load(recg_base + j * REC_G_STRIDE + o_k))[None, :]
        else:
            S = S * tl.exp(tl.load(recg_base + j * REC_G_STRIDE))
        kj = tl.load(reck_base + j * REC_K_STRIDE + o_k).to(tl.float32)
        vj = tl.load(recv_base + j * REC_V_STRIDE + o_v, mask=mask_v, other=0.0).to(tl.float32)
        dj = tl.load(recb_base + j * REC_B_STRIDE) * (vj - tl.sum(S * kj[None, :], axis=1))
        S = S + dj[:, None] * kj[None, :]
    return S


@triton.jit
def unit_lower_inverse(M, o_r, BR: tl.constexpr):
    """(I + M)^-1 of a strictly lower-triangular M [BR, BR], by forward substitution, row by row."""
    X = tl.zeros([BR, BR], dtype=tl.float32)
    for t in tl.static_range(BR):
        xt = (o_r == t).to(tl.float32) - tl.sum(row_select(M, t, o_r)[:, None] * X, axis=0)
        X = tl.where(o_r[:, None] == t, xt[None, :], X)
    return X


@triton.jit
def gdn_window(recb_base, reck_base, recg_base, cnt, REC_B_STRIDE: tl.constexpr, REC_K_STRIDE: tl.constexpr,
               REC_G_STRIDE: tl.constexpr, K: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr):
    """What a GDN head's exact fold of records 0..cnt-1 shares over its value rows: the cumulative log-decays G [BR]
    and their total, beta [BR] (rows >= cnt zero), and X = (I + M)^-1 with M_ij = beta_i exp(G_i - G_j) k_i . k_j for
    j < i (the delta rule's coupling inside the window; the keys' Gram matrix one tensor-core dot per column chunk)."""
    o_r = tl.arange(0, BR)
    mr = o_r < cnt
    g = tl.load(recg_base + o_r * REC_G_STRIDE, mask=mr, other=0.0)
    G = tl.cumsum(g, axis=0)
    beta = tl.load(recb_base + o_r * REC_B_STRIDE, mask=mr, other=0.0)
    KK = tl.zeros([BR, BR], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        Kc = tl.load(reck_base + o_r[:, None] * REC_K_STRIDE + o_kc[None, :], mask=mr[:, None], other=0.0).to(tl.float32)
        KK += tl.dot(Kc, tl.trans(Kc), input_precision=FOLD_PREC)
    lower = (o_r[:, None] > o_r[None, :]) & mr[:, None]
    M = tl.where(lower, beta[:, None] * tl.exp(tl.where(lower, G[:, None] - G[None, :], 0.0)) * KK, 0.0)
    return G, tl.sum(g, axis=0), beta, unit_lower_inverse(M, o_r, BR)


@triton.jit
def gdn_exact_d(ckpt_ptr, head_rows, o_v, mask_v, recv_base, reck_base, cnt, G, beta, X, q_row, k_row, rq, rk,
                REC_V_STRIDE: tl.constexpr, REC_K_STRIDE: tl.constexpr, K: tl.constexpr, BKC: tl.constexpr,
                BV: tl.constexpr, BR: tl.constexpr, WITH_TOKEN: tl.constexpr):
    """One pass over a GDN head's checkpoint rows o_v (the full-precision one) and its record keys in column chunks:
    the exact d's of records 0..cnt-1 for these rows, D = X beta (v - exp(G) S0 k) [BR, BV] (gdn_window's pieces),
    and, WITH_TOKEN, the current token's S0 q, S0 k [BV] and K_r q, K_r k [BR] (q, k = q_row * rq, k_row * rk)."""
    o_r = tl.arange(0, BR)
    mr = o_r < cnt
    eG = tl.exp(G)
    A = tl.zeros([BV, BR], dtype=tl.float32)
    sq0 = tl.zeros([BV], dtype=tl.float32)
    sk0 = tl.zeros([BV], dtype=tl.float32)
    kqr = tl.zeros([BR], dtype=tl.float32)
    kkr = tl.zeros([BR], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        S0 = tl.load(ckpt_ptr + (head_rows + o_v)[:, None] * K + o_kc[None, :], mask=mask_v[:, None],
                     other=0.0).to(tl.float32)
        Kc = tl.load(reck_base + o_r[:, None] * REC_K_STRIDE + o_kc[None, :], mask=mr[:, None], other=0.0).to(tl.float32)
        A += tl.dot(S0, tl.trans(Kc * eG[:, None]), input_precision=FOLD_PREC)      # exp(G_i) S0 k_i
        if WITH_TOKEN:
            qc = tl.load(q_row + o_kc).to(tl.float32) * rq
            kc = tl.load(k_row + o_kc).to(tl.float32) * rk
            sq0 += tl.sum(S0 * qc[None, :], axis=1)
            sk0 += tl.sum(S0 * kc[None, :], axis=1)
            kqr += tl.sum(Kc * qc[None, :], axis=1)
            kkr += tl.sum(Kc * kc[None, :], axis=1)
    Vr = tl.load(recv_base + o_r[:, None] * REC_V_STRIDE + o_v[None, :], mask=mr[:, None] & mask_v[None, :],
                 other=0.0).to(tl.float32)
    D = tl.dot(X, beta[:, None] * (Vr - tl.trans(A)), input_precision=FOLD_PREC)
    return D, sq0, sk0, kqr, kkr


@triton.jit
def delta_head_bases(recv_ptr, recb_ptr, reck_ptr, recg_ptr, slot, i_h, i_hk, H: tl.constexpr, HK: tl.constexpr,
                     K: tl.constexpr, V: tl.constexpr, R: tl.constexpr, PER_CHANNEL: tl.constexpr):
    """Record 0 of (slot, head i_h) in each ring tensor of a layer's views: v [S, R, H, V], beta [S, R, H],
    k [S, R, HK, K] (k-head i_hk), g [S, R, H] (KDA: [S, R, H, K])."""
    if PER_CHANNEL:
        recg_base = recg_ptr + (slot * R * H + i_h) * K
    else:
        recg_base = recg_ptr + slot * R * H + i_h
    return (recv_ptr + (slot * R * H + i_h) * V, recb_ptr + slot * R * H + i_h, reck_ptr + (slot * R * HK + i_hk) * K,
            recg_base)


@triton.jit
def delta_flush_rows(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, recv_ptr, recb_ptr, reck_ptr, recg_ptr, v_ptr,
                     out_ptr, slot, i_b, i_h, i_hk, i_v, cur, q_row, k_row, rq, rk, alpha, beta, seed, stream, layer,
                     H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr,
                     BV: tl.constexpr, SUB: tl.constexpr, V_ROW: tl.constexpr, READ_COPY: tl.constexpr,
                     CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr, INTERPRET: tl.constexpr):
    """A KDA decode flush row, value block i_v (BV rows) of head i_h, SUB rows at a time (whole rows in registers:
    SUB * K elements; NVFP4's per-head scale needs SUB = BV >= Dv): the state before this token from the
    full-precision checkpoint and the window's records 0..cur-1 (delta_replay), this token's step on it (alpha: its
    per-channel decay [K]; q, k = q_row * rq, k_row * rk), the new state stored as checkpoint and read copy (stream:
    its stochastic-rounding stream); the token's output, d and v records stored."""
    o_k = tl.arange(0, K)
    kn = tl.load(k_row + o_k).to(tl.float32) * rk
    qn = tl.load(q_row + o_k).to(tl.float32) * rq
    recv_base, recb_base, reck_base, recg_base = delta_head_bases(recv_ptr, recb_ptr, reck_ptr, recg_ptr, slot, i_h,
                                                                  i_hk, H, HK, K, V, R, True)
    head_rows = (slot * H + i_h) * V
    for sb in tl.static_range(BV // SUB):
        o_v = i_v * BV + sb * SUB + tl.arange(0, SUB)
        mask_v = o_v < V
        S = tl.load(ckpt_ptr + (head_rows + o_v)[:, None] * K + o_k[None, :], mask=mask_v[:, None],
                    other=0.0).to(tl.float32)
        S = delta_replay(S, o_v, mask_v, recv_base, recb_base, reck_base, recg_base, cur, H * V, H, HK * K, H * K, K,
                         True) * alpha[None, :]
        vv = tl.load(v_ptr + i_b * V_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
        d = beta * (vv - tl.sum(S * kn[None, :], axis=1))
        S = S + d[:, None] * kn[None, :]
        o = tl.sum(S * qn[None, :], axis=1)
        store_state_tile(S, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, seed, stream,
                         (layer * H + i_h).to(tl.int64) * (V * K), K, SUB, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)
        tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
        tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, d.to(recd_ptr.dtype.element_ty), mask=mask_v)
        tl.store(recv_ptr + ((slot * R + cur) * H + i_h) * V + o_v, vv.to(recv_ptr.dtype.element_ty), mask=mask_v)


@triton.jit
def store_delta_inputs(recv_ptr, recb_ptr, slot, pos, i_h, o_v, mask_v, vv, beta, i_v, H: tl.constexpr,
                       V: tl.constexpr, R: tl.constexpr):
    """A decode token's raw value rows and (once per head) beta at ring position pos: what the exact fold
    replays."""
    tl.store(recv_ptr + ((slot * R + pos) * H + i_h) * V + o_v, vv.to(recv_ptr.dtype.element_ty), mask=mask_v)
    store_delta_beta(recb_ptr, slot, pos, i_h, beta, i_v, H, R)


@triton.jit
def store_delta_beta(recb_ptr, slot, pos, i_h, beta, i_v, H: tl.constexpr, R: tl.constexpr):
    """A decode token's beta at ring position pos, once per head (value block 0)."""
    if i_v == 0:
        tl.store(recb_ptr + (slot * R + pos) * H + i_h, beta)


@triton.jit
def store_draft_inputs(recv_ptr, recb_ptr, Vd, beta, slot, cur, i_h, i_v, o_t, mask_t, o_v, mask_v, H: tl.constexpr,
                       V: tl.constexpr, R: tl.constexpr):
    """A verify's drafts' raw value rows Vd [BT, BV] and (once per head) betas [BT] at ring positions cur..."""
    pos = cur + o_t
    mpos = mask_t & (pos < R)
    tl.store(recv_ptr + ((slot * R + pos[:, None]) * H + i_h) * V + o_v[None, :],
             Vd.to(recv_ptr.dtype.element_ty), mask=mpos[:, None] & mask_v[None, :])
    if i_v == 0:
        tl.store(recb_ptr + (slot * R + pos) * H + i_h, beta, mask=mpos)


@triton.jit(do_not_specialize=["seed", "layer"])
def _delta_fold_kernel(slots_ptr, counts_ptr, cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr,
                       recd_ptr, reck_ptr, recg_ptr, recv_ptr, recb_ptr, seed, layer, S,
                       H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       R: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr,
                       READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr,
                       INTERPRET: tl.constexpr, WINDOW: tl.constexpr, FROM_ACCEPTED: tl.constexpr,
                       PER_CHANNEL: tl.constexpr, SUB: tl.constexpr):
    """fold._fold_kernel for the delta families: records 0..count-1 of each row replayed into its checkpoint
    (+ read copy) from their raw inputs (GDN: gdn_exact_d in BKC-column chunks; KDA: delta_replay, whole rows, SUB
    at a time), for one layer or several (fold.fold_program; S: the pool's slots). count 0: no-op. FROM_ACCEPTED:
    counts_ptr holds a commit's accepted drafts. recd_ptr is not read."""
    i_v, layer, i_h, i_hk, cnt, stream, slot = fold_program(slots_ptr, counts_ptr, cursor_ptr, folded_ptr, layer, S,
                                                            H, HK, WINDOW, FROM_ACCEPTED)
    if cnt > 0:
        head_rows = (slot * H + i_h) * V
        recv_base, recb_base, reck_base, recg_base = delta_head_bases(recv_ptr, recb_ptr, reck_ptr, recg_ptr, slot,
                                                                      i_h, i_hk, H, HK, K, V, R, PER_CHANNEL)
        idx_base = (layer * H + i_h).to(tl.int64) * (V * K)
        if PER_CHANNEL:   # KDA: token by token, SUB rows at a time
            for sb in tl.static_range(BV // SUB):
                o_v = i_v * BV + sb * SUB + tl.arange(0, SUB)
                mask_v = o_v < V
                St = tl.load(ckpt_ptr + (head_rows + o_v)[:, None] * K + tl.arange(0, K)[None, :],
                             mask=mask_v[:, None], other=0.0).to(tl.float32)
                St = delta_replay(St, o_v, mask_v, recv_base, recb_base, reck_base, recg_base, cnt, H * V, H, HK * K,
                                  H * K, K, True)
                store_state_tile(St, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, seed,
                                 stream, idx_base, K, SUB, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)
        else:             # GDN: the chunk form, then the linear fold of the exact d's
            o_v = i_v * BV + tl.arange(0, BV)
            mask_v = o_v < V
            o_r = tl.arange(0, BR)
            mr = o_r < cnt
            G, gtot, br, X = gdn_window(recb_base, reck_base, recg_base, cnt, H, HK * K, H, K, BKC, BR)
            D, _sq, _sk, _kq, _kk = gdn_exact_d(ckpt_ptr, head_rows, o_v, mask_v, recv_base, reck_base, cnt, G, br, X,
                                                reck_ptr, reck_ptr, 1.0, 1.0, H * V, HK * K, K, BKC, BV, BR, False)
            Dw = D * tl.where(mr, tl.exp(gtot - G), 0.0)[:, None]
            fold_store_dw(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, reck_base, Dw,
                          o_r, mr, gtot, 1.0, tl.zeros([BV], dtype=tl.float32), reck_ptr, 1.0, seed, stream, idx_base,
                          HK * K, K, BKC, BV, READ_COPY, CKPT_SR, SHARED_QUANT, False, INTERPRET)
