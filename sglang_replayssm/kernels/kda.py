"""Kimi Delta Attention (KDA) ReplaySSM kernels: GDN with a per-channel (per key column) decay.

Per value head: g = -exp(A_log) softplus(a + dt_bias) in R^K, S' = S Diag(exp(g)),
d = beta (v - S' k), S_t = S' + d k^T, o = S_t q. With the records (d_j, k_j, g_j) since the
checkpoint and G = cumulative log-decays: S = S0 Diag(exp(G_c)) + sum_j d_j (k_j * exp(G_c - G_j))^T.
Records: d [H, Dv], k [Hk, Dk], g [H, Dk]. Decode (non-flush + flush rows in one launch),
commit fold and the conventional baseline.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (check, check_block_k, check_block_v, check_flush_block_k, check_slots, check_stages, check_tensor,
                     chunk_k, decode_launch_rows, decode_plan, default_warps, delta_solve, draft_chunk, draft_inv_norms,
                     draft_structure, flush_rows, fold_layer_head, FOLD_PREC, INTERPRET, join_stream, launch_stages,
                     LayerViews, load_state_chunk, next_pow2, on_stream, output_tensor, read_copy_scales, ring_program,
                     ring_row, softplus, store_draft_d, store_state_chunk, verify_plan)
from . import common

L2_EPS = 1e-6


@triton.jit
def _kda_chunk(recg_ptr, reck_base, slot, i_h, o_r, mask_r, o_kc, a_row, alog, dtb_row,
               H: tl.constexpr, K: tl.constexpr, R: tl.constexpr, RKS: tl.constexpr, HAS_CUR: tl.constexpr):
    """For one column chunk: record keys with their decay to now (K_r * W) [BR, BKC], the total
    record decay exp(G_c) [BKC] and the current token's decay alpha [BKC] (1 without a token)."""
    Gr = tl.load(recg_ptr + ((slot * R + o_r[:, None]) * H + i_h) * K + o_kc[None, :], mask=mask_r[:, None],
                 other=0.0)
    gtot = tl.sum(Gr, axis=0)
    W = tl.where(mask_r[:, None], tl.exp(gtot[None, :] - tl.cumsum(Gr, axis=0)), 0.0)
    Kr = tl.load(reck_base + o_r[:, None] * RKS + o_kc[None, :], mask=mask_r[:, None], other=0.0).to(tl.float32)
    if HAS_CUR:
        gc = -tl.exp(alog) * softplus(tl.load(a_row + o_kc).to(tl.float32) + tl.load(dtb_row + o_kc).to(tl.float32))
    else:
        gc = tl.zeros_like(gtot)
    return Kr * W, tl.exp(gtot), tl.exp(gc), gc


@triton.jit
def _kda_fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v, recg_ptr, reck_base, slot,
                    i_h, o_r, mask_r, Dr, a_row, alog, dtb_row, dcur, k_row, rk, seed, stream, idx_base,
                    H: tl.constexpr, K: tl.constexpr, R: tl.constexpr, RKS: tl.constexpr,
                    BKC: tl.constexpr, BV: tl.constexpr, RC: tl.constexpr, CKPT_SR: tl.constexpr,
                    SHARED: tl.constexpr, HAS_CUR: tl.constexpr, INTERPRET: tl.constexpr):
    """S_new = (S0 Diag(exp G) + Dr^T (K_r W)) Diag(alpha) + dcur k^T into ckpt (+ read copy: fp8 with
    per-row scales, or NVFP4 whose per-head global scale needs the whole head here, BV >= Dv).
    A quantized read copy needs the row maxima first: a first pass, unless whole rows are one chunk."""
    rows = head_rows + o_v
    amax = tl.zeros([BV], dtype=tl.float32)
    sc = amax
    gs = 1.0
    ONE_PASS: tl.constexpr = RC == 0 or BKC == K
    for p in tl.static_range(1 if ONE_PASS else 2):
        if p == 1 or RC == 0:
            sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, RC)
        for c in range(K // BKC):
            o_kc = c * BKC + tl.arange(0, BKC)
            KW, gam, al, _g = _kda_chunk(recg_ptr, reck_base, slot, i_h, o_r, mask_r, o_kc, a_row, alog,
                                         dtb_row, H, K, R, RKS, HAS_CUR)
            S0 = tl.load(ckpt_ptr + rows[:, None] * K + o_kc[None, :], mask=mask_v[:, None], other=0.0).to(tl.float32)
            S = (S0 * gam[None, :] + tl.dot(tl.trans(Dr), KW, input_precision=FOLD_PREC)) * al[None, :]
            if HAS_CUR:
                S = S + dcur[:, None] * (tl.load(k_row + o_kc).to(tl.float32) * rk)[None, :]
            if RC != 0 and ONE_PASS:  # the whole rows: scales from this chunk, then store
                amax = tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1)
                sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, RC)
                store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_kc, c, mask_v, sc, gs, seed, stream,
                                  idx_base, K, BKC, BV, RC, CKPT_SR, SHARED, INTERPRET)
            elif RC != 0 and p == 0:
                amax = tl.maximum(amax, tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1))
            else:
                store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_kc, c, mask_v, sc, gs, seed, stream,
                                  idx_base, K, BKC, BV, RC, CKPT_SR, SHARED, INTERPRET)


@triton.jit
def _kda_decode_row(i_b, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr, cursor_ptr,
                    folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr, scale, seed, layer,
                    H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr,
                    WINDOW: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr, RC: tl.constexpr,
                    CKPT_SR: tl.constexpr, SHARED: tl.constexpr, EPS: tl.constexpr, INTERPRET: tl.constexpr,
                    FBKC: tl.constexpr, NS: tl.constexpr):
    """The body of _kda_decode_kernel for batch row i_b (value block program_id(0), head program_id(1))."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_row(
        slots_ptr, cursor_ptr, i_b, H, HK, V, BV, BR)
    is_flush = (cur + 1) >= WINDOW
    q_row = q_ptr + (i_b * HK + i_hk) * K
    k_row = k_ptr + (i_b * HK + i_hk) * K
    a_row = a_ptr + (i_b * H + i_h) * K
    dtb_row = dtb_ptr + i_h * K
    alog = tl.load(alog_ptr + i_h).to(tl.float32)
    o_k = tl.arange(0, K)
    qf = tl.load(q_row + o_k).to(tl.float32)
    kf = tl.load(k_row + o_k).to(tl.float32)
    rq = scale / tl.sqrt(tl.sum(qf * qf, axis=0) + EPS)
    rk = 1.0 / tl.sqrt(tl.sum(kf * kf, axis=0) + EPS)
    kq = tl.sum(qf * kf, axis=0) * rq * rk
    beta = tl.sigmoid(tl.load(b_ptr + i_b * H + i_h).to(tl.float32))
    vv = tl.load(v_ptr + (i_b * H + i_h) * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    Dr = tl.load(recd_ptr + ((slot * R + o_r[:, None]) * H + i_h) * V + o_v[None, :],
                 mask=mask_r[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * HK + i_hk) * K
    sq = tl.zeros([BV], dtype=tl.float32)
    sk = tl.zeros([BV], dtype=tl.float32)
    kqr = tl.zeros([BR], dtype=tl.float32)
    kkr = tl.zeros([BR], dtype=tl.float32)
    for c in tl.range(0, K // BKC, num_stages=NS):
        o_kc = c * BKC + tl.arange(0, BKC)
        KW, gam, al, _g = _kda_chunk(recg_ptr, reck_base, slot, i_h, o_r, mask_r, o_kc, a_row, alog, dtb_row,
                                     H, K, R, HK * K, True)
        qc = tl.load(q_row + o_kc).to(tl.float32) * rq * al
        kc = tl.load(k_row + o_kc).to(tl.float32) * rk * al
        if is_flush:
            S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc,
                                  mask_v, K, 0)
        else:
            S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc,
                                  mask_v, K, RC)
        sq += tl.sum(S0 * (gam * qc)[None, :], axis=1)
        sk += tl.sum(S0 * (gam * kc)[None, :], axis=1)
        kqr += tl.sum(KW * qc[None, :], axis=1)
        kkr += tl.sum(KW * kc[None, :], axis=1)
    sq = sq + tl.sum(Dr * kqr[:, None], axis=0)
    sk = sk + tl.sum(Dr * kkr[:, None], axis=0)
    d = beta * (vv - sk)
    o = sq + d * kq
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    if is_flush:
        stream = tl.load(folded_ptr + slot) + cur + 1
        idx_base = (layer * H + i_h).to(tl.int64) * (V * K)
        _kda_fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, recg_ptr,
                        reck_base, slot, i_h, o_r, mask_r, Dr, a_row, alog, dtb_row, d, k_row, rk, seed, stream, idx_base,
                        H, K, R, HK * K, FBKC if FBKC > 0 else BKC, BV, RC, CKPT_SR, SHARED, True,
                        INTERPRET)
    tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, d.to(recd_ptr.dtype.element_ty), mask=mask_v)
    if i_v == 0:
        g = -tl.exp(alog) * softplus(tl.load(a_row + o_k).to(tl.float32) + tl.load(dtb_row + o_k).to(tl.float32))
        tl.store(recg_ptr + ((slot * R + cur) * H + i_h) * K + o_k, g)
        if i_h % (H // HK) == 0:
            tl.store(reck_base + cur * (HK * K) + o_k, (kf * rk).to(reck_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["seed", "layer", "fmin"])
def _kda_decode_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr, cursor_ptr,
                       folded_ptr, frows_ptr, nflush_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr,
                       recg_ptr, scale, seed, layer, fmin, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr,
                       V: tl.constexpr, R: tl.constexpr, WINDOW: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr,
                       BR: tl.constexpr, RC: tl.constexpr, CKPT_SR: tl.constexpr, SHARED: tl.constexpr,
                       EPS: tl.constexpr, INTERPRET: tl.constexpr, FBKC: tl.constexpr = 0, NS: tl.constexpr = None,
                       NFP: tl.constexpr = 1, FLUSH_ONLY: tl.constexpr = False):
    """All rows of a decode step, or (FLUSH_ONLY) only the rows whose record fills the window: the
    nflush rows that the split decode listed in frows (common.flush_list), program_id(2) folding those
    common.flush_rows gives it (the split decode runs the other rows through _kda_decode_prep_kernel +
    _kda_decode_read_kernel)."""
    if FLUSH_ONLY:
        lo, hi, step = flush_rows(nflush_ptr, fmin, NFP)
        for j in range(lo, hi, step):
            _kda_decode_row(tl.load(frows_ptr + j), q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr,
                            slots_ptr, cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr,
                            reck_ptr, recg_ptr, scale, seed, layer, H, HK, K, V, R, WINDOW, BV, BKC, BR, RC,
                            CKPT_SR, SHARED, EPS, INTERPRET, FBKC, NS)
    else:
        _kda_decode_row(tl.program_id(2), q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr,
                        cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr,
                        scale, seed, layer, H, HK, K, V, R, WINDOW, BV, BKC, BR, RC, CKPT_SR, SHARED, EPS,
                        INTERPRET, FBKC, NS)


@triton.jit
def _kda_decode_prep_kernel(q_ptr, k_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, slots_ptr, cursor_ptr, reck_ptr, recg_ptr,
                            prep_ptr, scale, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, R: tl.constexpr,
                            WINDOW: tl.constexpr, BR: tl.constexpr, EPS: tl.constexpr):
    """Split decode, stage 1, one program per (row, head) of a non-flush row: everything that does
    not involve the state or the value rows, once instead of in every value block. With G the
    records' cumulative log-decay per channel, W_j = exp(G - G_j) and alpha the token's decay:
    u = exp(G) alpha q, w = exp(G) alpha k ([K]), kq_j = (k_j W_j).(alpha q), kk_j = (k_j W_j).(alpha k)
    ([BR]), k.q and beta -> prep row [u | w | kq_j | kk_j | k.q, beta]. Also writes the token's g and
    k records at ring position cursor."""
    i_h = tl.program_id(0)
    i_b = tl.program_id(1)
    i_hk = i_h // (H // HK)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    cur = tl.load(cursor_ptr + slot)
    if cur + 1 >= WINDOW:
        return
    o_r = tl.arange(0, BR)
    mask_r = o_r < cur
    o_k = tl.arange(0, K)
    k_row = k_ptr + (i_b * HK + i_hk) * K
    a_row = a_ptr + (i_b * H + i_h) * K
    alog = tl.load(alog_ptr + i_h).to(tl.float32)
    qf = tl.load(q_ptr + (i_b * HK + i_hk) * K + o_k).to(tl.float32)
    kf = tl.load(k_row + o_k).to(tl.float32)
    rq = scale / tl.sqrt(tl.sum(qf * qf, axis=0) + EPS)
    rk = 1.0 / tl.sqrt(tl.sum(kf * kf, axis=0) + EPS)
    reck_base = reck_ptr + (slot * R * HK + i_hk) * K
    KW, gam, al, g = _kda_chunk(recg_ptr, reck_base, slot, i_h, o_r, mask_r, o_k, a_row, alog, dtb_ptr + i_h * K,
                                H, K, R, HK * K, True)
    qc = qf * rq * al
    kc = kf * rk * al
    p = prep_ptr + (i_b * H + i_h) * (2 * K + 2 * BR + 2)
    tl.store(p + o_k, gam * qc)
    tl.store(p + K + o_k, gam * kc)
    tl.store(p + 2 * K + o_r, tl.sum(KW * qc[None, :], axis=1))
    tl.store(p + 2 * K + BR + o_r, tl.sum(KW * kc[None, :], axis=1))
    tl.store(p + 2 * K + 2 * BR, tl.sum(qf * kf, axis=0) * rq * rk)
    tl.store(p + 2 * K + 2 * BR + 1, tl.sigmoid(tl.load(b_ptr + i_b * H + i_h).to(tl.float32)))
    tl.store(recg_ptr + ((slot * R + cur) * H + i_h) * K + o_k, g)
    if i_h % (H // HK) == 0:
        tl.store(reck_base + cur * (HK * K) + o_k, (kf * rk).to(reck_ptr.dtype.element_ty))


@triton.jit
def _kda_decode_read_kernel(v_ptr, out_ptr, slots_ptr, cursor_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr,
                            prep_ptr, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                            R: tl.constexpr, WINDOW: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr,
                            BR: tl.constexpr, RC: tl.constexpr, NS: tl.constexpr = None):
    """Split decode, stage 2, non-flush rows: S u and S w from the checkpoint (or its read copy) as
    a GDN decode does, the records' share from stage 1's kq_j / kk_j, then d = beta (v - S'k),
    o = S'q + d k.q, and the d record."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    if cur + 1 >= WINDOW:
        return
    p = prep_ptr + (i_b * H + i_h) * (2 * K + 2 * BR + 2)
    head_rows = (slot * H + i_h) * V
    sq = tl.zeros([BV], dtype=tl.float32)
    sk = tl.zeros([BV], dtype=tl.float32)
    for c in tl.range(0, K // BKC, num_stages=NS):
        o_kc = c * BKC + tl.arange(0, BKC)
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc, mask_v, K, RC)
        sq += tl.sum(S0 * tl.load(p + o_kc)[None, :], axis=1)
        sk += tl.sum(S0 * tl.load(p + K + o_kc)[None, :], axis=1)
    Dr = tl.load(recd_ptr + ((slot * R + o_r[:, None]) * H + i_h) * V + o_v[None, :],
                 mask=mask_r[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    sq = sq + tl.sum(Dr * tl.load(p + 2 * K + o_r)[:, None], axis=0)
    sk = sk + tl.sum(Dr * tl.load(p + 2 * K + BR + o_r)[:, None], axis=0)
    vv = tl.load(v_ptr + (i_b * H + i_h) * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    d = tl.load(p + 2 * K + 2 * BR + 1) * (vv - sk)
    o = sq + d * tl.load(p + 2 * K + 2 * BR)
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, d.to(recd_ptr.dtype.element_ty), mask=mask_v)


@triton.jit(do_not_specialize=["seed", "layer"])
def _kda_fold_kernel(slots_ptr, counts_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr,
                     recd_ptr, reck_ptr, recg_ptr, seed, layer, S,
                     H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     R: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr,
                     RC: tl.constexpr, CKPT_SR: tl.constexpr, SHARED: tl.constexpr,
                     INTERPRET: tl.constexpr):
    """common._fold_kernel for KDA's per-channel decays (one layer or several: common.fold_layer_head;
    S: the pool's slots)."""
    i_v = tl.program_id(0)
    i_b = tl.program_id(2)
    layer, i_h, l = fold_layer_head(layer, H)
    cnt = tl.load(counts_ptr + i_b)
    if cnt > 0:
        i_hk = i_h // (H // HK)
        row = tl.load(slots_ptr + i_b).to(tl.int64)
        stream = tl.load(folded_ptr + row) + cnt
        slot = row + l * S                   # in the first layer's views (common.fold_layer_head)
        o_v = i_v * BV + tl.arange(0, BV)
        o_r = tl.arange(0, BR)
        mask_v = o_v < V
        mask_r = o_r < cnt
        Dr = tl.load(recd_ptr + ((slot * R + o_r[:, None]) * H + i_h) * V + o_v[None, :],
                     mask=mask_r[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        idx_base = (layer * H + i_h).to(tl.int64) * (V * K)
        _kda_fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, (slot * H + i_h) * V, slot * H + i_h, o_v, mask_v, recg_ptr,
                        reck_ptr + (slot * R * HK + i_hk) * K, slot, i_h, o_r, mask_r, Dr, recg_ptr, 0.0,
                        recg_ptr, tl.zeros([BV], dtype=tl.float32), reck_ptr, 1.0, seed, stream, idx_base,
                        H, K, R, HK * K, BKC, BV, RC, CKPT_SR, SHARED, False, INTERPRET)


@triton.jit
def _kda_drafts_setup(q_ptr, k_ptr, alog_ptr, par_ptr, scale, i_b, i_h, i_hk, HK: tl.constexpr, K: tl.constexpr,
                      T: tl.constexpr, BT: tl.constexpr, BKC: tl.constexpr, HAS_PARENTS: tl.constexpr,
                      EPS: tl.constexpr):
    """What both KDA verify kernels start from: the drafts' index vector o_t, mask and token rows, the
    q/k row offsets, A_log of head i_h, the q/k normalisers, and the draft tree's ancestor-or-self and
    strict-ancestor masks [t, i, 1]."""
    o_t = tl.arange(0, BT)
    mask_t = o_t < T
    tok = i_b * T + o_t
    qk_rows = (tok * HK + i_hk) * K
    alog = tl.load(alog_ptr + i_h).to(tl.float32)
    rq, rk = draft_inv_norms(q_ptr, k_ptr, qk_rows, mask_t, scale, K, BKC, BT, EPS)
    ANC, _lg = draft_structure(par_ptr + i_b * T, tl.zeros([BT], dtype=tl.float32), T, BT, HAS_PARENTS)
    anc3 = ANC[:, :, None] > 0.0
    strict3 = anc3 & (o_t[:, None, None] != o_t[None, :, None])
    return o_t, mask_t, tok, qk_rows, alog, rq, rk, anc3, strict3


@triton.jit
def _kda_draft_terms(q_ptr, k_ptr, a_ptr, dtb_ptr, recg_ptr, reck_base, qk_rows, tok, o_kc, mask_t, rq, rk, alog,
                     anc3, strict3, slot, i_h, o_r, mask_r, PQ, PK, H: tl.constexpr, HK: tl.constexpr,
                     K: tl.constexpr, R: tl.constexpr):
    """One column chunk o_kc of a KDA verify, all but the state: the drafts' normalised q_t, k_t times
    their path decay exp(L_t) (qL, kL [BT, BKC]), the committed records' keys with their decay to now
    (K_r W [BR, BKC]) and exp(G) [BKC]; adds the chunk's share of PQ[t, i] = q_t . (k_i exp(L_t - L_i))
    (i on the path to t) and PK[t, i] = k_t . (k_i exp(L_t - L_i)) (i a strict ancestor of t)
    [BT, BT]: per-channel decays, so broadcast sums rather than dots."""
    Qc, Kc = draft_chunk(q_ptr, k_ptr, qk_rows, o_kc, mask_t, rq, rk)
    ac = tl.load(a_ptr + (tok[:, None] * H + i_h) * K + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
    gd = -tl.exp(alog) * softplus(ac + tl.load(dtb_ptr + i_h * K + o_kc).to(tl.float32)[None, :])
    gd = tl.where(mask_t[:, None], gd, 0.0)                                            # [t, c]
    LGc = tl.sum(tl.where(anc3, gd[None, :, :], 0.0), axis=1)                           # path sums [t, c]
    KW, egt, _al, _gc = _kda_chunk(recg_ptr, reck_base, slot, i_h, o_r, mask_r, o_kc, a_ptr, alog, dtb_ptr,
                                   H, K, R, HK * K, False)
    eL = tl.exp(LGc)
    dec = tl.exp(tl.where(anc3, LGc[:, None, :] - LGc[None, :, :], 0.0))               # [t, i, c]
    PQ += tl.sum(tl.where(anc3, Qc[:, None, :] * Kc[None, :, :] * dec, 0.0), axis=2)
    PK += tl.sum(tl.where(strict3, Kc[:, None, :] * Kc[None, :, :] * dec, 0.0), axis=2)
    return Qc * eL, Kc * eL, KW, egt, PQ, PK


@triton.jit
def _kda_drafts_finish(SQ, SK, PQ, PK, rk, alog, v_ptr, a_ptr, b_ptr, dtb_ptr, out_ptr, k_ptr, recd_ptr, reck_ptr,
                       recg_ptr, reck_base, qk_rows, tok, slot, cur, i_h, i_v, o_t, mask_t, o_v, mask_v,
                       H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr,
                       T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr):
    """The drafts' part of a KDA verify, given S'_t q_t (SQ) and S'_t k_t (SK) [BT, BV] of the
    committed state and the draft products PQ, PK (_kda_draft_terms): the within-draft delta rule by
    forward substitution, the outputs and the T draft records (d, g, normalised k) at cursor.."""
    Vd = tl.load(v_ptr + (tok[:, None] * H + i_h) * V + o_v[None, :],
                 mask=mask_t[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    beta = tl.sigmoid(tl.load(b_ptr + tok * H + i_h, mask=mask_t, other=0.0).to(tl.float32))
    Dd = delta_solve(PK, Vd - SK, beta, o_t, T, BT, BV)
    O = SQ + tl.sum(PQ[:, :, None] * Dd[None, :, :], axis=1)
    tl.store(out_ptr + (tok[:, None] * H + i_h) * V + o_v[None, :], O.to(out_ptr.dtype.element_ty),
             mask=mask_t[:, None] & mask_v[None, :])
    pos, mpos = store_draft_d(recd_ptr, Dd, slot, cur, i_h, o_t, mask_t, o_v, mask_v, H, V, R)
    if i_v == 0:
        for c in range(K // BKC):
            o_kc = c * BKC + tl.arange(0, BKC)
            ac = tl.load(a_ptr + (tok[:, None] * H + i_h) * K + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
            gd = -tl.exp(alog) * softplus(ac + tl.load(dtb_ptr + i_h * K + o_kc).to(tl.float32)[None, :])
            tl.store(recg_ptr + ((slot * R + pos[:, None]) * H + i_h) * K + o_kc[None, :], gd, mask=mpos[:, None])
            if i_h % (H // HK) == 0:
                Kc = tl.load(k_ptr + qk_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32) * rk[:, None]
                tl.store(reck_base + pos[:, None] * (HK * K) + o_kc[None, :], Kc.to(reck_ptr.dtype.element_ty),
                         mask=mpos[:, None])


@triton.jit
def _kda_verify_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr,
                       slots_ptr, cursor_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr,
                       recd_ptr, reck_ptr, recg_ptr, scale,
                       H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                       BKC: tl.constexpr, BR: tl.constexpr, RC: tl.constexpr,
                       HAS_PARENTS: tl.constexpr, EPS: tl.constexpr):
    """Output-only verify of T KDA drafts (chain or tree). Per key channel c, with G the committed
    records' cumulative log-decay and L_t the drafts' along the path to t:
    S'_t x = S0 (exp(G + L_t) x) + sum_j d_j (k_j exp(G - G_j + L_t)) . x
             + sum_{i strict ancestor of t} d_i (k_i exp(L_t - L_i)) . x,
    d_t = beta_t (v_t - S'_t k_t) (forward substitution), o_t = S'_t q_t + d_t (k_t . q_t).
    Exact fp32 broadcast products."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    o_t, mask_t, tok, qk_rows, alog, rq, rk, anc3, strict3 = _kda_drafts_setup(
        q_ptr, k_ptr, alog_ptr, par_ptr, scale, i_b, i_h, i_hk, HK, K, T, BT, BKC, HAS_PARENTS, EPS)
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * HK + i_hk) * K
    aq = tl.zeros([BT, BV, BKC], dtype=tl.float32)
    ak = tl.zeros([BT, BV, BKC], dtype=tl.float32)
    KrQ = tl.zeros([BR, BT], dtype=tl.float32)
    KrK = tl.zeros([BR, BT], dtype=tl.float32)
    PQ = tl.zeros([BT, BT], dtype=tl.float32)
    PK = tl.zeros([BT, BT], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        qL, kL, Kr, egt, PQ, PK = _kda_draft_terms(q_ptr, k_ptr, a_ptr, dtb_ptr, recg_ptr, reck_base, qk_rows, tok,
                                                   o_kc, mask_t, rq, rk, alog, anc3, strict3, slot, i_h, o_r,
                                                   mask_r, PQ, PK, H, HK, K, R)
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc, mask_v, K, RC)
        aq += S0[None, :, :] * (qL * egt[None, :])[:, None, :]
        ak += S0[None, :, :] * (kL * egt[None, :])[:, None, :]
        KrQ += tl.sum(Kr[:, None, :] * qL[None, :, :], axis=2)
        KrK += tl.sum(Kr[:, None, :] * kL[None, :, :], axis=2)
    Dr = tl.load(recd_ptr + ((slot * R + o_r[:, None]) * H + i_h) * V + o_v[None, :],
                 mask=mask_r[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    SQ = tl.sum(aq, axis=2) + tl.sum(KrQ[:, :, None] * Dr[:, None, :], axis=0)
    SK = tl.sum(ak, axis=2) + tl.sum(KrK[:, :, None] * Dr[:, None, :], axis=0)
    _kda_drafts_finish(SQ, SK, PQ, PK, rk, alog, v_ptr, a_ptr, b_ptr, dtb_ptr, out_ptr, k_ptr, recd_ptr, reck_ptr,
                       recg_ptr, reck_base, qk_rows, tok, slot, cur, i_h, i_v, o_t, mask_t, o_v, mask_v,
                       H, HK, K, V, R, T, BT, BV, BKC)


@triton.jit
def _pad2(x, R: tl.constexpr, C: tl.constexpr):
    """[x; 0] [2R, C] of x [R, C]."""
    return tl.reshape(tl.permute(tl.join(x, tl.zeros_like(x)), (2, 0, 1)), [2 * R, C])


@triton.jit
def _unpad2(x, R: tl.constexpr, C: tl.constexpr):
    """Rows 0..R-1 of x [2R, C]."""
    top, _bot = tl.split(tl.permute(tl.reshape(x, [2, R, C]), (1, 2, 0)))
    return top


@triton.jit
def _pad_rows(x, R: tl.constexpr, N: tl.constexpr, C: tl.constexpr):
    """x [R, C] with zero rows appended up to N rows (R, N powers of 2, R <= N <= 8 R)."""
    if 2 * R <= N:
        x = _pad2(x, R, C)
    if 4 * R <= N:
        x = _pad2(x, 2 * R, C)
    if 8 * R <= N:
        x = _pad2(x, 4 * R, C)
    return x


@triton.jit
def _unpad_rows(x, R: tl.constexpr, N: tl.constexpr, C: tl.constexpr):
    """Rows 0..R-1 of x [N, C] (_pad_rows' inverse)."""
    if 8 * R <= N:
        x = _unpad2(x, 4 * R, C)
    if 4 * R <= N:
        x = _unpad2(x, 2 * R, C)
    if 2 * R <= N:
        x = _unpad2(x, R, C)
    return x


@triton.jit
def _kda_verify_mma_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr,
                           slots_ptr, cursor_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr,
                           recd_ptr, reck_ptr, recg_ptr, scale,
                           H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                           BKC: tl.constexpr, BR: tl.constexpr, RC: tl.constexpr,
                           HAS_PARENTS: tl.constexpr, EPS: tl.constexpr, PREC: tl.constexpr, NX: tl.constexpr):
    """The same verify as _kda_verify_kernel, with the state-sized products on tensor cores: per
    column chunk the drafts' q_t exp(L_t) (rows 0..BT-1) and k_t exp(L_t) (rows BT..2BT-1) are
    stacked into one operand X (zero rows up to NX = max(16, 2 BT), a dot's least), and
    (S0 Diag(exp G)) X^T [BV, NX] and (K_r W) X^T [BR, NX] are one dot each, sharing the X^T operand
    (3xTF32 default); the records' share D_r^T (K_r W X^T) one dot more after the loop. The draft
    x draft products keep their per-channel decays (broadcast sums, _kda_draft_terms) and stay at
    the drafts' own size BT = next_pow2(T)."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    o_t, mask_t, tok, qk_rows, alog, rq, rk, anc3, strict3 = _kda_drafts_setup(
        q_ptr, k_ptr, alog_ptr, par_ptr, scale, i_b, i_h, i_hk, HK, K, T, BT, BKC, HAS_PARENTS, EPS)
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * HK + i_hk) * K
    S0X = tl.zeros([BV, NX], dtype=tl.float32)
    KrX = tl.zeros([BR, NX], dtype=tl.float32)
    PQ = tl.zeros([BT, BT], dtype=tl.float32)
    PK = tl.zeros([BT, BT], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        qL, kL, Kr, egt, PQ, PK = _kda_draft_terms(q_ptr, k_ptr, a_ptr, dtb_ptr, recg_ptr, reck_base, qk_rows, tok,
                                                   o_kc, mask_t, rq, rk, alog, anc3, strict3, slot, i_h, o_r,
                                                   mask_r, PQ, PK, H, HK, K, R)
        X = tl.reshape(tl.permute(tl.join(qL, kL), (2, 0, 1)), [2 * BT, BKC])   # rows: qL, then kL
        XT = tl.trans(_pad_rows(X, 2 * BT, NX, BKC))
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc, mask_v, K, RC)
        S0X += tl.dot(S0 * egt[None, :], XT, input_precision=PREC)
        KrX += tl.dot(Kr, XT, input_precision=PREC)
    Dr = tl.load(recd_ptr + ((slot * R + o_r[:, None]) * H + i_h) * V + o_v[None, :],
                 mask=mask_r[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    SX = S0X + tl.dot(tl.trans(Dr), KrX, input_precision=PREC)          # columns: S'_t q_t, S'_t k_t, 0..
    SX = _unpad_rows(tl.trans(SX), 2 * BT, NX, BV)                      # [2BT, BV]
    SQ, SK = tl.split(tl.permute(tl.reshape(SX, [2, BT, BV]), (1, 2, 0)))
    _kda_drafts_finish(SQ, SK, PQ, PK, rk, alog, v_ptr, a_ptr, b_ptr, dtb_ptr, out_ptr, k_ptr, recd_ptr, reck_ptr,
                       recg_ptr, reck_base, qk_rows, tok, slot, cur, i_h, i_v, o_t, mask_t, o_v, mask_v,
                       H, HK, K, V, R, T, BT, BV, BKC)


@triton.jit
def _kda_conv_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr,
                     state_ptr, scale, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr,
                     V: tl.constexpr, BV: tl.constexpr, EPS: tl.constexpr):
    i_v = tl.program_id(0)
    i_h = tl.program_id(1)
    i_b = tl.program_id(2)
    i_hk = i_h // (H // HK)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, K)
    mask_v = o_v < V
    offs = ((slot * H + i_h) * V + o_v[:, None]) * K + o_k[None, :]
    S = tl.load(state_ptr + offs, mask=mask_v[:, None], other=0.0).to(tl.float32)
    qv = tl.load(q_ptr + (i_b * HK + i_hk) * K + o_k).to(tl.float32)
    kv = tl.load(k_ptr + (i_b * HK + i_hk) * K + o_k).to(tl.float32)
    qv = qv * (scale / tl.sqrt(tl.sum(qv * qv, axis=0) + EPS))
    kv = kv / tl.sqrt(tl.sum(kv * kv, axis=0) + EPS)
    vv = tl.load(v_ptr + (i_b * H + i_h) * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    g = -tl.exp(tl.load(alog_ptr + i_h).to(tl.float32)) * softplus(
        tl.load(a_ptr + (i_b * H + i_h) * K + o_k).to(tl.float32) + tl.load(dtb_ptr + i_h * K + o_k).to(tl.float32))
    beta = tl.sigmoid(tl.load(b_ptr + i_b * H + i_h).to(tl.float32))
    S = S * tl.exp(g)[None, :]
    d = beta * (vv - tl.sum(S * kv[None, :], axis=1))
    S = S + d[:, None] * kv[None, :]
    o = tl.sum(S * qv[None, :], axis=1)
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(state_ptr + offs, S.to(state_ptr.dtype.element_ty), mask=mask_v[:, None])


def _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, device, T=None):
    lead = (B,) if T is None else (B, T)
    check_tensor("q", q, shape=lead + (Hk, Dk), device=device)
    check_tensor("k", k, shape=lead + (Hk, Dk), device=device)
    check_tensor("v", v, shape=lead + (H, Dv), device=device)
    check_tensor("a", a, shape=lead + (H, Dk), device=device)
    check_tensor("b", b, shape=lead + (H,), device=device)
    check_tensor("A_log", A_log, shape=(H,), device=device)
    check_tensor("dt_bias", dt_bias, shape=(H, Dk), device=device)
    check(H % Hk == 0, f"num value heads {H} must be a multiple of num k-heads {Hk}")
    check(Dk >= 16 and Dk & (Dk - 1) == 0, f"head_k_dim must be a power of 2 >= 16, got {Dk}")


def _block_v(Dv, block_v):
    return check_block_v(block_v, 32)


def decode(pool, layer, slots, q, k, v, a, b, A_log, dt_bias, scale=None, *, out=None,
           block_v=None, block_k=None, num_warps=None, stages=None, flush_block_k=None, method=None,
           flush_warps=None, flush_list=None):
    """One KDA decode step of a batch, in place on the pool (record at cursor; flush rows fold).
    Same contract as reference.kda.decode; returns out [B, H, Dv] in v's dtype.
    Tuning knobs (defaults: common.decode_plan): stages software-pipelines the state loop
    (common.check_stages); flush_block_k is the flush rows' column chunk (their fp32 read and the
    fold; head_k_dim: the tile is loaded once and folded in registers); flush_warps the split
    decode's flush launch's warps (default >= 4). method: "fused" (one launch for all rows),
    "split" (a flush-row list, the flush rows on a side stream; the other rows through a small
    kernel for the head's record products, then the state pass) or None (common.decode_plan: split
    where it measured faster). flush_list: the split decode's (rows, count) of common.flush_list for
    these slots and the pool's cursors, computed once per step and shared by its layers, or a function
    returning them (called only by a split decode; None: computed here)."""
    if getattr(pool.cfg, "mode", "replay") == "conventional":
        return conventional_decode(pool.ckpt[layer], slots, q, k, v, a, b, A_log, dt_bias, scale, out=out,
                                   block_v=block_v, num_warps=num_warps)
    lv = LayerViews(pool, layer)
    B = check_slots(slots, lv.device, lv.num_slots)
    H, Hk, Dv, Dk = lv.H, lv.Hk, lv.Dv, lv.Dk
    _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, lv.device)
    scale = Dk ** -0.5 if scale is None else float(scale)
    out = output_tensor(out, (B, H, Dv), v, lv.device)
    if B == 0:
        return out
    method, kn = decode_plan("kda", lv.rc_mode, B, H, Dk, method,
                             dict(block_v=block_v, block_k=block_k, num_warps=num_warps, stages=stages,
                                  flush_block_k=flush_block_k, flush_warps=flush_warps))
    block_v, block_k, num_warps, stages, flush_block_k, flush_warps = (
        kn[n] for n in ("block_v", "block_k", "num_warps", "stages", "flush_block_k", "flush_warps"))
    BV = _block_v(Dv, block_v)
    nw = num_warps or default_warps(B, H)
    if lv.rc_mode == common.RC_NVFP4:  # flush rows compute the per-head NVFP4 global scale
        BV = next_pow2(Dv)
        nw, block_k = max(nw, 8), block_k or 16
    rc, rs, rgs = lv.rc_args()
    BR = max(16, next_pow2(lv.window))
    fbk = check_flush_block_k(flush_block_k, Dk)
    # split: this launch only does the flush rows' work (sized for the fold), beside the others
    frows, nflush, nfp, fmin, rows, nw, side = decode_launch_rows("kda", method, slots, lv, nw, flush_warps,
                                                                  flush_list)
    with on_stream(side):
        grid = (triton.cdiv(Dv, BV), H, rows)
        _kda_decode_kernel[grid](q, k, v, a, b, A_log, dt_bias, out, slots, lv.cursor, lv.folded, frows, nflush,
                                 lv.ckpt, rc, rs, rgs, lv.rec_d, lv.rec_k, lv.rec_g, scale, lv.seed, lv.layer, fmin,
                                 H=H, HK=Hk, K=Dk, V=Dv, R=lv.R, WINDOW=lv.window, BV=BV,
                                 BKC=block_k or chunk_k(Dk), BR=BR, RC=lv.rc_mode,
                                 CKPT_SR=lv.ckpt_sr, SHARED=lv.shared_quant, EPS=L2_EPS,
                                 INTERPRET=INTERPRET, FBKC=fbk,
                                 NS=check_stages(stages), NFP=nfp, FLUSH_ONLY=method == "split", num_warps=nw)
    if method == "split":
        prep = torch.empty((B, H, 2 * Dk + 2 * BR + 2), dtype=torch.float32, device=lv.device)
        _kda_decode_prep_kernel[(H, B)](q, k, a, b, A_log, dt_bias, slots, lv.cursor, lv.rec_k, lv.rec_g, prep, scale,
                                        H=H, HK=Hk, K=Dk, R=lv.R, WINDOW=lv.window, BR=BR, EPS=L2_EPS,
                                        num_warps=common.PREP_WARPS)
        rbv = _block_v(Dv, block_v)
        rnw = num_warps or default_warps(B, H)
        _kda_decode_read_kernel[(triton.cdiv(Dv, rbv), H, B)](
            v, out, slots, lv.cursor, lv.ckpt, rc, rs, rgs, lv.rec_d, prep, H=H, HK=Hk, K=Dk, V=Dv, R=lv.R,
            WINDOW=lv.window, BV=rbv, BKC=block_k or chunk_k(Dk), BR=BR, RC=lv.rc_mode, NS=check_stages(stages),
            num_warps=rnw)
    join_stream(side)
    return out


def verify(pool, layer, slots, q, k, v, a, b, A_log, dt_bias, scale=None, parents=None, *,
           out=None, block_v=None, block_k=None, num_warps=None, method=None, stages=None):
    """Output-only verify of T KDA draft tokens per row (q/k [B, T, Hk, Dk], v [B, T, H, Dv],
    a [B, T, H, Dk], b [B, T, H]; parents [B, T] int32 or None for a chain). Writes the draft records
    at cursor..cursor+T-1 (no state write); returns out [B, T, H, Dv]. Commit: pool.commit(fold=fold).
    method: "fma" (exact fp32 broadcast products), "mma" (the state-sized products as 3xTF32
    tensor-core dots; the draft x draft products stay broadcast sums) or None ("mma": 5-8x faster at T = 4..8
    on the H200). Default blocks: common.VERIFY_TUNED. stages: the mma launch's software pipelining of the
    column loop (common.launch_stages)."""
    if getattr(pool.cfg, "mode", "replay") != "replay":
        raise ValueError("verify kernels need a pool in mode='replay' (conventional verify keeps snapshots)")
    lv = LayerViews(pool, layer)
    B = check_slots(slots, lv.device, lv.num_slots)
    H, Hk, Dv, Dk = lv.H, lv.Hk, lv.Dv, lv.Dk
    check(q.dim() == 4, f"q must be [B, T, Hk, Dk] for verify, got shape {tuple(q.shape)}")
    T = int(q.shape[1])
    check(1 <= T and lv.window - 1 + T <= lv.R,
          f"T={T} drafts do not fit the ring (capacity {lv.R}, window {lv.window})")
    _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, lv.device, T=T)
    if parents is not None:
        check_tensor("parents", parents, shape=(B, T), dtype=torch.int32, device=lv.device)
    method, BV, num_warps = verify_plan("kda", method, block_v, num_warps)
    nst = launch_stages(stages)
    scale = Dk ** -0.5 if scale is None else float(scale)
    out = output_tensor(out, (B, T, H, Dv), v, lv.device)
    if B == 0:
        return out
    rc, rs, rgs = lv.rc_args()
    grid = (triton.cdiv(Dv, BV), H, B)
    kern, extra = _kda_verify_kernel, {}
    if method == "mma":  # tensor-core variant (3xTF32 on the GPU); NX: the stacked q/k operand's rows, >= 16
        kern, extra = _kda_verify_mma_kernel, dict(PREC=common.DOT_PREC, NX=max(16, 2 * next_pow2(T)),
                                                   **nst)
    kern[grid](q, k, v, a, b, A_log, dt_bias, parents if parents is not None else slots, out,
               slots, lv.cursor, lv.ckpt, rc, rs, rgs, lv.rec_d, lv.rec_k, lv.rec_g, scale,
               H=H, HK=Hk, K=Dk, V=Dv, R=lv.R, T=T, BT=next_pow2(T), BV=BV,
               BKC=check_block_k(block_k, Dk) or chunk_k(Dk, 16), BR=max(16, next_pow2(lv.window)), RC=lv.rc_mode,
               HAS_PARENTS=parents is not None, EPS=L2_EPS, num_warps=num_warps, **extra)
    return out


def conventional_decode(state, slots, q, k, v, a, b, A_log, dt_bias, scale=None, *, out=None,
                        block_v=None, num_warps=None):
    """Conventional KDA decode: read, update and write state[slots] ([S, H, Dv, Dk]) in place."""
    check(isinstance(state, torch.Tensor) and state.dim() == 4, "state must be a 4-D tensor [S, H, Dv, Dk]")
    check_tensor("state", state, dtype=(torch.float32, torch.float16, torch.bfloat16))
    _, H, Dv, Dk = state.shape
    B = check_slots(slots, state.device, state.shape[0])
    Hk = q.shape[1] if q.dim() == 3 else -1
    _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, state.device)
    scale = Dk ** -0.5 if scale is None else float(scale)
    out = output_tensor(out, (B, H, Dv), v, state.device)
    if B == 0:
        return out
    BV = _block_v(Dv, block_v)
    grid = (triton.cdiv(Dv, BV), H, B)
    _kda_conv_kernel[grid](q, k, v, a, b, A_log, dt_bias, out, slots, state, scale,
                           H=H, HK=Hk, K=Dk, V=Dv, BV=BV, EPS=L2_EPS, num_warps=num_warps or 4)
    return out


def fold(pool, layer, slots, counts, **kw):
    """Commit fold: records 0..counts[b]-1 into the checkpoint (+ read copy) of one layer, or of every layer
    in one launch (layer None); counts 0 = no-op (common.fold)."""
    common.fold(pool, layer, slots, counts, per_channel=True, **kw)
