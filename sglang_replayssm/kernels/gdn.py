"""Gated DeltaNet (GDN) ReplaySSM kernels: decode (non-flush + flush rows in one launch),
output-only verify (chain + tree), commit fold, and the conventional decode baseline.

Layout and math: docs/layout.md. Per value head h (k-head h // (H // Hk)):
  g = -exp(A_log) softplus(a + dt_bias), alpha = exp(g), beta = sigmoid(b),
  S' = alpha S, d = beta (v - S' k), S_t = S' + d k^T, o = S_t q  (q, k L2-normalised, q scaled).
A non-flush step reads the checkpoint (or its read copy) once, replays the records for S q and
S k only (vectors, no state tile), writes the output and one record (d, k, g).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (check, check_block_k, check_block_v, check_flush_block_k, check_slots, check_stages, check_tensor,
                     chunk_k, decode_launch_rows, decode_plan, default_warps, delta_solve, draft_chunk, draft_inv_norms,
                     draft_structure, flush_rows, flush_tiles, fold_store, fold_tile_store, gram_update, INTERPRET,
                     join_stream, launch_stages, LayerViews, load_records, load_state_chunk, next_pow2, on_stream,
                     output_tensor, record_key_products, replay_pass, ring_program, ring_row, softplus,
                     stacked_draft_pass, stacked_halves, state_tile, store_draft_d, verify_plan)
from . import common

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
def _gdn_out(sq0, sk0, kqr, kkr, alpha, gam, Dr, w, beta, vv, kq):
    """d = beta (v - S' k) and o = S' q + d k.q from the checkpoint's S0 q, S0 k ([BV]) and the
    committed keys' K_r q, K_r k ([BR]), with S' = alpha (gamma S0 + sum_j w_j d_j k_j^T)."""
    sq = alpha * (gam * sq0 + tl.sum(Dr * (w * kqr)[:, None], axis=0))
    sk = alpha * (gam * sk0 + tl.sum(Dr * (w * kkr)[:, None], axis=0))
    d = beta * (vv - sk)
    return d, sq + d * kq


@triton.jit
def _gdn_decode_row(i_b, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr, cursor_ptr,
                    folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr, scale, seed, layer,
                    H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr,
                    WINDOW: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr, RC: tl.constexpr,
                    CKPT_SR: tl.constexpr, SHARED: tl.constexpr, EPS: tl.constexpr, INTERPRET: tl.constexpr,
                    ACC: tl.constexpr, FBKC: tl.constexpr, NS: tl.constexpr):
    """The body of _gdn_decode_kernel for batch row i_b (value block program_id(0), head program_id(1))."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_row(
        slots_ptr, cursor_ptr, i_b, H, HK, V, BV, BR)
    is_flush = (cur + 1) >= WINDOW
    q_row = q_ptr + (i_b * HK + i_hk) * K
    k_row = k_ptr + (i_b * HK + i_hk) * K
    rq, rk, kq, g, beta = _gdn_scalars(q_row, k_row, a_ptr, b_ptr, alog_ptr, dtb_ptr, i_b, i_h, scale,
                                       H, K, EPS)
    alpha = tl.exp(g)
    vv = tl.load(v_ptr + (i_b * H + i_h) * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * HK + i_hk) * K
    # S q and S k of the state before this token: checkpoint (flush rows: the fp32 one, others
    # the read copy) plus the records, without forming the state
    if FBKC == K:  # whole-row flush: the checkpoint tile and the keys loaded once, folded in registers
        if is_flush:
            S0, Kr = flush_tiles(ckpt_ptr, head_rows, o_v, mask_v, reck_base, o_r, mask_r, HK * K, K)
            o_k = tl.arange(0, K)
            qn = tl.load(q_row + o_k).to(tl.float32) * rq
            kn = tl.load(k_row + o_k).to(tl.float32) * rk
            d, o = _gdn_out(tl.sum(S0 * qn[None, :], axis=1), tl.sum(S0 * kn[None, :], axis=1),
                            tl.sum(Kr * qn[None, :], axis=1), tl.sum(Kr * kn[None, :], axis=1), alpha, gam, Dr, w,
                            beta, vv, kq)
            fold_tile_store(S0, Kr, Dr, w, gtot, alpha, d, kn, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows,
                            slot * H + i_h, o_v, mask_v, seed, tl.load(folded_ptr + slot) + cur + 1,
                            (layer * H + i_h).to(tl.int64) * (V * K), K, BV, RC, CKPT_SR, SHARED, INTERPRET)
        else:
            sq0, sk0, kqr, kkr = replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v,
                                             mask_v, q_row, k_row, rq, rk, reck_base, o_r, mask_r,
                                             HK * K, K, BKC, BV, BR, RC, True, ACC, NS)
            d, o = _gdn_out(sq0, sk0, kqr, kkr, alpha, gam, Dr, w, beta, vv, kq)
    else:
        if is_flush:
            sq0, sk0, kqr, kkr = replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v,
                                             mask_v, q_row, k_row, rq, rk, reck_base, o_r, mask_r,
                                             HK * K, K, FBKC if FBKC > 0 else BKC, BV, BR, 0, True, ACC, NS)
        else:
            sq0, sk0, kqr, kkr = replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v,
                                             mask_v, q_row, k_row, rq, rk, reck_base, o_r, mask_r,
                                             HK * K, K, BKC, BV, BR, RC, True, ACC, NS)
        d, o = _gdn_out(sq0, sk0, kqr, kkr, alpha, gam, Dr, w, beta, vv, kq)
        if is_flush:  # fold the window into the checkpoint: S_t = alpha*replay(S0) + d k^T
            fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, reck_base,
                       recd_ptr + (slot * R * H + i_h) * V, recg_ptr + slot * R * H + i_h, cur, gtot,
                       alpha, d, k_row, rk, seed, tl.load(folded_ptr + slot) + cur + 1,
                       (layer * H + i_h).to(tl.int64) * (V * K), HK * K, H * V, H, K, FBKC if FBKC > 0 else BKC,
                       BV, BR, RC, CKPT_SR, SHARED, True, INTERPRET)
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    # the record of this token at ring position cur
    tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, d.to(recd_ptr.dtype.element_ty),
             mask=mask_v)
    if i_v == 0:
        tl.store(recg_ptr + (slot * R + cur) * H + i_h, g)
        if i_h % (H // HK) == 0:
            o_k = tl.arange(0, K)
            kf = tl.load(k_row + o_k).to(tl.float32) * rk
            tl.store(reck_base + cur * (HK * K) + o_k, kf.to(reck_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["seed", "layer", "fmin"])
def _gdn_decode_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr, cursor_ptr,
                       folded_ptr, frows_ptr, nflush_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr,
                       recg_ptr, scale, seed, layer, fmin, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr,
                       V: tl.constexpr, R: tl.constexpr, WINDOW: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr,
                       BR: tl.constexpr, RC: tl.constexpr, CKPT_SR: tl.constexpr, SHARED: tl.constexpr,
                       EPS: tl.constexpr, INTERPRET: tl.constexpr, ACC: tl.constexpr, FBKC: tl.constexpr = 0,
                       NS: tl.constexpr = None, NFP: tl.constexpr = 1, FLUSH_ONLY: tl.constexpr = False):
    """All rows of a decode step, or (FLUSH_ONLY) only the rows whose record fills the window: the
    nflush rows that the split decode listed in frows (common.flush_list), program_id(2) folding those
    common.flush_rows gives it (the split decode runs the other rows through _gdn_decode_prep_kernel +
    _gdn_decode_read_kernel)."""
    if FLUSH_ONLY:
        lo, hi, step = flush_rows(nflush_ptr, fmin, NFP)
        for j in range(lo, hi, step):
            _gdn_decode_row(tl.load(frows_ptr + j), q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr,
                            slots_ptr, cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr,
                            reck_ptr, recg_ptr, scale, seed, layer, H, HK, K, V, R, WINDOW, BV, BKC, BR, RC,
                            CKPT_SR, SHARED, EPS, INTERPRET, ACC, FBKC, NS)
    else:
        _gdn_decode_row(tl.program_id(2), q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr,
                        cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr,
                        scale, seed, layer, H, HK, K, V, R, WINDOW, BV, BKC, BR, RC, CKPT_SR, SHARED, EPS,
                        INTERPRET, ACC, FBKC, NS)


@triton.jit
def _gdn_decode_prep_kernel(q_ptr, k_ptr, slots_ptr, cursor_ptr, reck_ptr, prep_ptr, scale,
                            HK: tl.constexpr, K: tl.constexpr, R: tl.constexpr, WINDOW: tl.constexpr,
                            BR: tl.constexpr, EPS: tl.constexpr):
    """Split decode, stage 1, one program per (row, k-head) of a non-flush row: the q/k normalisers,
    k.q and the committed keys' products K_r q, K_r k, shared by the group's value heads and value
    blocks -> prep row [K_r q (BR) | K_r k (BR) | k.q | rq | rk]; and the token's k record."""
    i_hk = tl.program_id(0)
    i_b = tl.program_id(1)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    cur = tl.load(cursor_ptr + slot)
    if cur + 1 >= WINDOW:
        return
    q_row = q_ptr + (i_b * HK + i_hk) * K
    k_row = k_ptr + (i_b * HK + i_hk) * K
    o_k = tl.arange(0, K)
    qf = tl.load(q_row + o_k).to(tl.float32)
    kf = tl.load(k_row + o_k).to(tl.float32)
    rq = scale / tl.sqrt(tl.sum(qf * qf, axis=0) + EPS)
    rk = 1.0 / tl.sqrt(tl.sum(kf * kf, axis=0) + EPS)
    krq, krk = record_key_products(reck_ptr, q_row, k_row, slot, cur, i_hk, rq, rk, HK, K, R, BR, True)
    o_r = tl.arange(0, BR)
    p = prep_ptr + (i_b * HK + i_hk) * (2 * BR + 3)
    tl.store(p + o_r, krq)
    tl.store(p + BR + o_r, krk)
    tl.store(p + 2 * BR, tl.sum(qf * kf, axis=0) * rq * rk)
    tl.store(p + 2 * BR + 1, rq)
    tl.store(p + 2 * BR + 2, rk)
    tl.store(reck_ptr + (slot * R * HK + i_hk) * K + cur * (HK * K) + o_k, (kf * rk).to(reck_ptr.dtype.element_ty))


@triton.jit
def _gdn_decode_read_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr, cursor_ptr,
                            ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, recg_ptr, prep_ptr,
                            H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                            R: tl.constexpr, WINDOW: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr,
                            BR: tl.constexpr, RC: tl.constexpr, ACC: tl.constexpr, NS: tl.constexpr = None):
    """Split decode, stage 2, non-flush rows: the state pass (S q, S k from the checkpoint or its read
    copy) with the record products from stage 1, then d, the output, the d and g records."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    if cur + 1 >= WINDOW:
        return
    p = prep_ptr + (i_b * HK + i_hk) * (2 * BR + 3)
    av = tl.load(a_ptr + i_b * H + i_h).to(tl.float32)
    g = _gdn_gate(av, alog_ptr, dtb_ptr, i_h)
    alpha = tl.exp(g)
    beta = tl.sigmoid(tl.load(b_ptr + i_b * H + i_h).to(tl.float32))
    vv = tl.load(v_ptr + (i_b * H + i_h) * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    sq0, sk0, _kq, _kk = replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, (slot * H + i_h) * V, slot * H + i_h, o_v,
                                     mask_v, q_ptr + (i_b * HK + i_hk) * K, k_ptr + (i_b * HK + i_hk) * K,
                                     tl.load(p + 2 * BR + 1), tl.load(p + 2 * BR + 2), recd_ptr, o_r, mask_r,  # no keys read
                                     HK * K, K, BKC, BV, BR, RC, True, ACC, NS, False)
    d, o = _gdn_out(sq0, sk0, tl.load(p + o_r), tl.load(p + BR + o_r), alpha, gam, Dr, w, beta, vv,
                    tl.load(p + 2 * BR))
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, d.to(recd_ptr.dtype.element_ty), mask=mask_v)
    if i_v == 0:
        tl.store(recg_ptr + (slot * R + cur) * H + i_h, g)


@triton.jit
def _gdn_conv_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr,
                     state_ptr, scale,
                     H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BV: tl.constexpr, BK: tl.constexpr, EPS: tl.constexpr):
    i_v, i_h, i_b, o_v, mask_v, o_k, mask_k, offs, mask2, S = state_tile(slots_ptr, state_ptr, H, K, V, BV, BK)
    i_hk = i_h // (H // HK)
    qv, kv, vv, g, beta = _gdn_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, i_b,
                                     i_h, i_hk, o_k, mask_k, o_v, mask_v, scale, H, HK, K, V, EPS)
    S = S * tl.exp(g)
    d = beta * (vv - tl.sum(S * kv[None, :], axis=1))
    S = S + d[:, None] * kv[None, :]
    o = tl.sum(S * qv[None, :], axis=1)
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(state_ptr + offs, S.to(state_ptr.dtype.element_ty), mask=mask2)


@triton.jit
def _gdn_drafts_finish(SQ, SK, QK, KK, rk, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr, k_ptr,
                       recd_ptr, recg_ptr, reck_base, qk_rows, tok, slot, cur, i_b, i_h, i_v, o_t, mask_t, o_v,
                       mask_v, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr,
                       HAS_PARENTS: tl.constexpr):
    """The drafts' part of a GDN verify, given Sc q_t (SQ), Sc k_t (SK) [BT, BV] of the committed
    state Sc and the drafts' Gram products q_t.k_i (QK), k_t.k_i (KK): gates, the path decays,
    the within-draft delta rule by forward substitution (topological order), the outputs and the T
    draft records (d, g, and the normalised k = k_row * rk) at ring positions cursor.."""
    Vd = tl.load(v_ptr + (tok[:, None] * H + i_h) * V + o_v[None, :],
                 mask=mask_t[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    av = tl.load(a_ptr + tok * H + i_h, mask=mask_t, other=0.0).to(tl.float32)
    bv = tl.load(b_ptr + tok * H + i_h, mask=mask_t, other=0.0).to(tl.float32)
    G = _gdn_gate(av, alog_ptr, dtb_ptr, i_h)
    G = tl.where(mask_t, G, 0.0)
    beta = tl.sigmoid(bv)
    ANC, LG = draft_structure(par_ptr + i_b * T, G, T, BT, HAS_PARENTS)
    E = tl.where(ANC > 0.0, tl.exp(tl.minimum(LG[:, None] - LG[None, :], 0.0)), 0.0)  # decay i -> t on the path
    M = tl.where(o_t[:, None] == o_t[None, :], 0.0, E * KK)
    RHS = Vd - tl.exp(LG)[:, None] * SK
    Dd = delta_solve(M, RHS, beta, o_t, T, BT, BV)
    O = tl.exp(LG)[:, None] * SQ + tl.sum((E * QK)[:, :, None] * Dd[None, :, :], axis=1)
    tl.store(out_ptr + (tok[:, None] * H + i_h) * V + o_v[None, :], O.to(out_ptr.dtype.element_ty),
             mask=mask_t[:, None] & mask_v[None, :])
    pos, mpos = store_draft_d(recd_ptr, Dd, slot, cur, i_h, o_t, mask_t, o_v, mask_v, H, V, R)
    if i_v == 0:
        tl.store(recg_ptr + (slot * R + pos) * H + i_h, G, mask=mpos)
        if i_h % (H // HK) == 0:
            for c in range(K // BKC):
                o_kc = c * BKC + tl.arange(0, BKC)
                Kc = tl.load(k_ptr + qk_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32) * rk[:, None]
                tl.store(reck_base + pos[:, None] * (HK * K) + o_kc[None, :], Kc.to(reck_base.dtype.element_ty),
                         mask=mpos[:, None])


@triton.jit
def _gdn_verify_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr,
                       slots_ptr, cursor_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr,
                       recd_ptr, reck_ptr, recg_ptr, scale,
                       H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                       BKC: tl.constexpr, BR: tl.constexpr, RC: tl.constexpr,
                       HAS_PARENTS: tl.constexpr, EPS: tl.constexpr):
    """Output-only verify of T drafts (chain or tree): O = exp(G) Sc Q + (E * QK^T) Dd, with the
    draft d's from the within-draft delta-rule solve; writes the T draft records at cursor..
    All products are exact fp32 elementwise/broadcast sums over column chunks (T is small:
    padding it to a tensor-core tile would waste most of the work)."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    o_t = tl.arange(0, BT)
    mask_t = o_t < T
    tok = i_b * T + o_t
    qk_rows = (tok * HK + i_hk) * K
    rq, rk = draft_inv_norms(q_ptr, k_ptr, qk_rows, mask_t, scale, K, BKC, BT, EPS)
    # one pass over the checkpoint (read copy) and the committed keys
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * HK + i_hk) * K
    aq = tl.zeros([BT, BV, BKC], dtype=tl.float32)
    ak = tl.zeros([BT, BV, BKC], dtype=tl.float32)
    KrQ = tl.zeros([BR, BT], dtype=tl.float32)
    KrK = tl.zeros([BR, BT], dtype=tl.float32)
    QK = tl.zeros([BT, BT], dtype=tl.float32)
    KK = tl.zeros([BT, BT], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        Qc, Kc = draft_chunk(q_ptr, k_ptr, qk_rows, o_kc, mask_t, rq, rk)
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc, mask_v, K, RC)
        Kr = tl.load(reck_base + o_r[:, None] * (HK * K) + o_kc[None, :], mask=mask_r[:, None], other=0.0).to(tl.float32)
        aq += S0[None, :, :] * Qc[:, None, :]
        ak += S0[None, :, :] * Kc[:, None, :]
        KrQ, KrK, QK, KK = gram_update(KrQ, KrK, QK, KK, Kr, Qc, Kc)
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    SQ = gam * tl.sum(aq, axis=2) + tl.sum((KrQ * w[:, None])[:, :, None] * Dr[:, None, :], axis=0)  # Sc q_t [BT, BV]
    SK = gam * tl.sum(ak, axis=2) + tl.sum((KrK * w[:, None])[:, :, None] * Dr[:, None, :], axis=0)  # Sc k_t
    _gdn_drafts_finish(SQ, SK, QK, KK, rk, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr, k_ptr,
                       recd_ptr, recg_ptr, reck_base, qk_rows, tok, slot, cur, i_b, i_h, i_v, o_t, mask_t, o_v,
                       mask_v, H, HK, K, V, R, T, BT, BV, BKC, HAS_PARENTS)


@triton.jit
def _gdn_draft_gram_kernel(q_ptr, k_ptr, slots_ptr, cursor_ptr, reck_ptr, gram_ptr, scale,
                           HK: tl.constexpr, K: tl.constexpr, R: tl.constexpr, T: tl.constexpr,
                           BT: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr, EPS: tl.constexpr):
    """Split verify, stage 1, one program per (row, k-head): everything of a verify that does not
    touch the state or the value rows, computed once instead of in every (value head, value block)
    program: the drafts' q/k normalisers and the products K_r q_t, K_r k_t (committed keys x drafts)
    and q_t.k_i, k_t.k_i (drafts x drafts). gram row layout: KrQ [BR, BT], KrK [BR, BT], QK [BT, BT],
    KK [BT, BT], rq [BT], rk [BT]."""
    i_hk = tl.program_id(0)
    i_b = tl.program_id(1)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    cur = tl.load(cursor_ptr + slot)
    o_r = tl.arange(0, BR)
    mask_r = o_r < cur
    o_t = tl.arange(0, BT)
    mask_t = o_t < T
    qk_rows = ((i_b * T + o_t) * HK + i_hk) * K
    rq, rk = draft_inv_norms(q_ptr, k_ptr, qk_rows, mask_t, scale, K, BKC, BT, EPS)
    reck_base = reck_ptr + (slot * R * HK + i_hk) * K
    KrQ = tl.zeros([BR, BT], dtype=tl.float32)
    KrK = tl.zeros([BR, BT], dtype=tl.float32)
    QK = tl.zeros([BT, BT], dtype=tl.float32)
    KK = tl.zeros([BT, BT], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        Qc, Kc = draft_chunk(q_ptr, k_ptr, qk_rows, o_kc, mask_t, rq, rk)
        Kr = tl.load(reck_base + o_r[:, None] * (HK * K) + o_kc[None, :], mask=mask_r[:, None], other=0.0).to(tl.float32)
        KrQ, KrK, QK, KK = gram_update(KrQ, KrK, QK, KK, Kr, Qc, Kc)
    g = gram_ptr + (i_b * HK + i_hk) * (2 * BR * BT + 2 * BT * BT + 2 * BT)
    rt = o_r[:, None] * BT + o_t[None, :]
    tt = o_t[:, None] * BT + o_t[None, :]
    tl.store(g + rt, KrQ)
    tl.store(g + BR * BT + rt, KrK)
    tl.store(g + 2 * BR * BT + tt, QK)
    tl.store(g + 2 * BR * BT + BT * BT + tt, KK)
    tl.store(g + 2 * BR * BT + 2 * BT * BT + o_t, rq)
    tl.store(g + 2 * BR * BT + 2 * BT * BT + BT + o_t, rk)


@triton.jit
def _gdn_verify_split_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr,
                             slots_ptr, cursor_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr,
                             recd_ptr, reck_ptr, recg_ptr, gram_ptr,
                             H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                             R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                             BKC: tl.constexpr, BR: tl.constexpr, RC: tl.constexpr,
                             HAS_PARENTS: tl.constexpr):
    """Split verify, stage 2: the same result as _gdn_verify_kernel, whose state pass here only
    accumulates S0 q_t and S0 k_t elementwise (no reduction inside the loop); the record and draft
    products come from stage 1 (gram_ptr)."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    o_t = tl.arange(0, BT)
    mask_t = o_t < T
    tok = i_b * T + o_t
    qk_rows = (tok * HK + i_hk) * K
    g = gram_ptr + (i_b * HK + i_hk) * (2 * BR * BT + 2 * BT * BT + 2 * BT)
    rq = tl.load(g + 2 * BR * BT + 2 * BT * BT + o_t)
    rk = tl.load(g + 2 * BR * BT + 2 * BT * BT + BT + o_t)
    head_rows = (slot * H + i_h) * V
    aq = tl.zeros([BT, BV, BKC], dtype=tl.float32)
    ak = tl.zeros([BT, BV, BKC], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        Qc, Kc = draft_chunk(q_ptr, k_ptr, qk_rows, o_kc, mask_t, rq, rk)
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc, mask_v, K, RC)
        aq += S0[None, :, :] * Qc[:, None, :]
        ak += S0[None, :, :] * Kc[:, None, :]
    rt = o_r[:, None] * BT + o_t[None, :]
    tt = o_t[:, None] * BT + o_t[None, :]
    KrQ = tl.load(g + rt)
    KrK = tl.load(g + BR * BT + rt)
    QK = tl.load(g + 2 * BR * BT + tt)
    KK = tl.load(g + 2 * BR * BT + BT * BT + tt)
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    SQ = gam * tl.sum(aq, axis=2) + tl.sum((KrQ * w[:, None])[:, :, None] * Dr[:, None, :], axis=0)
    SK = gam * tl.sum(ak, axis=2) + tl.sum((KrK * w[:, None])[:, :, None] * Dr[:, None, :], axis=0)
    _gdn_drafts_finish(SQ, SK, QK, KK, rk, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr, k_ptr,
                       recd_ptr, recg_ptr, reck_ptr + (slot * R * HK + i_hk) * K, qk_rows, tok, slot, cur, i_b,
                       i_h, i_v, o_t, mask_t, o_v, mask_v, H, HK, K, V, R, T, BT, BV, BKC, HAS_PARENTS)


@triton.jit
def _gdn_verify_mma_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr,
                           slots_ptr, cursor_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr,
                           recd_ptr, reck_ptr, recg_ptr, scale,
                           H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                           BKC: tl.constexpr, BR: tl.constexpr, RC: tl.constexpr,
                           HAS_PARENTS: tl.constexpr, EPS: tl.constexpr, PREC: tl.constexpr):
    """The same verify as _gdn_verify_kernel, with the state-sized products on tensor cores: the
    drafts' q (rows 0..BT-1) and k (rows BT..2BT-1) are stacked into one operand X (BT >= 8, so
    X has >= 16 rows) and S0 X^T, K_r X^T, X X^T are three dots per column chunk (3xTF32 default),
    of the raw rows in one pass (the norms scale the products after), and the records' share of
    Sc X^T one dot more. block_k up to head_k_dim (one chunk: the whole tile in one load)."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    o_t = tl.arange(0, BT)
    mask_t = o_t < T
    tok = i_b * T + o_t
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * HK + i_hk) * K
    # one pass over the raw rows (q, then k) and their norms; the normalisation scales the products after
    S0X, KrX, XX, nx, is_q = stacked_draft_pass(q_ptr, k_ptr, i_b, i_hk, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows,
                                                slot * H + i_h, o_v, mask_v, reck_base, o_r, mask_r, HK, K, T, BT,
                                                BV, BKC, BR, RC, PREC, True)
    rx = tl.where(is_q, scale, 1.0) / tl.sqrt(nx + EPS)
    S0X = S0X * rx[:, None]
    KrX = KrX * rx[None, :]
    XX = XX * rx[:, None] * rx[None, :]
    # Sc x for the stacked rows: gamma S0 x + (w K_r x)^T D_r, the record sum one more dot
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    SX = gam * S0X + tl.dot(tl.trans(KrX * w[:, None]), Dr, input_precision=PREC)
    SQ, SK, QK, KK = stacked_halves(SX, XX, BT, BV)
    _rq, rk = tl.split(tl.permute(tl.reshape(rx, [2, BT]), (1, 0)))
    _gdn_drafts_finish(SQ, SK, QK, KK, rk, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr, k_ptr,
                       recd_ptr, recg_ptr, reck_base, (tok * HK + i_hk) * K, tok, slot, cur, i_b, i_h, i_v, o_t,
                       mask_t, o_v, mask_v, H, HK, K, V, R, T, BT, BV, BKC, HAS_PARENTS)


@triton.jit
def _gdn_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, i_b, i_h, i_hk, o_k, mask_k,
               o_v, mask_v, scale, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr,
               V: tl.constexpr, EPS: tl.constexpr):
    qv = tl.load(q_ptr + (i_b * HK + i_hk) * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
    kv = tl.load(k_ptr + (i_b * HK + i_hk) * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
    qv = qv * (scale / tl.sqrt(tl.sum(qv * qv, axis=0) + EPS))
    kv = kv / tl.sqrt(tl.sum(kv * kv, axis=0) + EPS)
    vv = tl.load(v_ptr + (i_b * H + i_h) * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    av = tl.load(a_ptr + i_b * H + i_h).to(tl.float32)
    bv = tl.load(b_ptr + i_b * H + i_h).to(tl.float32)
    g = _gdn_gate(av, alog_ptr, dtb_ptr, i_h)
    return qv, kv, vv, g, tl.sigmoid(bv)


# ----------------------------------------------------------------------------- wrappers
def _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, device, T=None):
    lead = (B,) if T is None else (B, T)
    check_tensor("q", q, shape=lead + (Hk, Dk), device=device)
    check_tensor("k", k, shape=lead + (Hk, Dk), device=device)
    check_tensor("v", v, shape=lead + (H, Dv), device=device)
    check_tensor("a", a, shape=lead + (H,), device=device)
    check_tensor("b", b, shape=lead + (H,), device=device)
    check_tensor("A_log", A_log, shape=(H,), device=device)
    check_tensor("dt_bias", dt_bias, shape=(H,), device=device)
    check(H % Hk == 0, f"num value heads {H} must be a multiple of num k-heads {Hk}")


def _block_v(Dv, block_v):
    return check_block_v(block_v, min(max(next_pow2(Dv), 16), 32))


def decode(pool, layer, slots, q, k, v, a, b, A_log, dt_bias, scale=None, *, out=None,
           block_v=None, block_k=None, num_warps=None, stages=None, flush_block_k=None, method=None,
           flush_warps=None, flush_list=None):
    """One GDN decode step of a batch, in place on the pool (record at cursor; flush rows fold).

    Same contract as reference.gdn.decode; returns out [B, H, Dv] in v's dtype. Does not move
    the cursor (pool.advance does).
    Tuning knobs (defaults: common.decode_plan): stages software-pipelines the state loop
    (common.check_stages); flush_block_k is the flush rows' column chunk (their fp32 read and the
    fold; head_k_dim: the tile is loaded once and folded in registers); flush_warps the split
    decode's flush launch's warps (default >= 4). method: "fused" (one launch for all rows),
    "split" (a flush-row list, the flush rows on a side stream; the other rows through a small
    kernel for the k-head's record products, then the state pass) or None (common.decode_plan: split
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
    check(lv.R >= lv.window, f"ring capacity {lv.R} < window {lv.window}")
    scale = Dk ** -0.5 if scale is None else float(scale)
    out = output_tensor(out, (B, H, Dv), v, lv.device)
    if B == 0:
        return out
    method, kn = decode_plan("gdn", lv.rc_mode, B, H, Dk, method,
                             dict(block_v=block_v, block_k=block_k, num_warps=num_warps, stages=stages,
                                  flush_block_k=flush_block_k, flush_warps=flush_warps))
    block_v, block_k, num_warps, stages, flush_block_k, flush_warps = (
        kn[n] for n in ("block_v", "block_k", "num_warps", "stages", "flush_block_k", "flush_warps"))
    BV = _block_v(Dv, block_v)
    nw = num_warps or default_warps(B, H)
    if lv.rc_mode == common.RC_NVFP4:  # flush rows compute the per-head NVFP4 global scale
        BV = max(16, next_pow2(lv.Dv))
        nw, block_k = max(nw, 8), block_k or 16
    rc, rs, rgs = lv.rc_args()
    BR = max(16, next_pow2(lv.window))
    fbk = check_flush_block_k(flush_block_k, Dk)
    # split: this launch only does the flush rows' work (sized for the fold), beside the others
    frows, nflush, nfp, fmin, rows, nw, side = decode_launch_rows("gdn", method, slots, lv, nw, flush_warps,
                                                                  flush_list)
    with on_stream(side):
        grid = (triton.cdiv(Dv, BV), H, rows)
        _gdn_decode_kernel[grid](q, k, v, a, b, A_log, dt_bias, out, slots, lv.cursor, lv.folded, frows, nflush,
                                 lv.ckpt, rc, rs, rgs, lv.rec_d, lv.rec_k, lv.rec_g,
                                 scale, lv.seed, lv.layer, fmin,
                                 H=H, HK=Hk, K=Dk, V=Dv, R=lv.R, WINDOW=lv.window, BV=BV,
                                 BKC=block_k or chunk_k(Dk), BR=BR, RC=lv.rc_mode,
                                 CKPT_SR=lv.ckpt_sr, SHARED=lv.shared_quant, EPS=L2_EPS,
                                 INTERPRET=INTERPRET, ACC=nw >= 4 and (fbk or block_k or 32) <= 32, FBKC=fbk,
                                 NS=check_stages(stages), NFP=nfp, FLUSH_ONLY=method == "split", num_warps=nw)
    if method == "split":
        prep = torch.empty((B, Hk, 2 * BR + 3), dtype=torch.float32, device=lv.device)
        _gdn_decode_prep_kernel[(Hk, B)](q, k, slots, lv.cursor, lv.rec_k, prep, scale, HK=Hk, K=Dk,
                                         R=lv.R, WINDOW=lv.window, BR=BR, EPS=L2_EPS, num_warps=common.PREP_WARPS)
        rbv, rnw = _block_v(Dv, block_v), num_warps or default_warps(B, H)
        _gdn_decode_read_kernel[(triton.cdiv(Dv, rbv), H, B)](
            q, k, v, a, b, A_log, dt_bias, out, slots, lv.cursor, lv.ckpt, rc, rs, rgs, lv.rec_d, lv.rec_g, prep,
            H=H, HK=Hk, K=Dk, V=Dv, R=lv.R, WINDOW=lv.window, BV=rbv, BKC=block_k or chunk_k(Dk), BR=BR,
            RC=lv.rc_mode, ACC=rnw >= 4, NS=check_stages(stages), num_warps=rnw)
    join_stream(side)
    return out


def verify(pool, layer, slots, q, k, v, a, b, A_log, dt_bias, scale=None, parents=None, *,
           out=None, block_v=None, block_k=None, num_warps=None, method=None, stages=None):
    """Output-only verify of T draft tokens per row (q [B, T, Hk, Dk], ...; parents [B, T] int32
    or None for a chain). Writes the draft records at cursor..cursor+T-1 (no state write);
    returns out [B, T, H, Dv]. Commit with pool.commit (which folds through fold below).
    method: "fma" (exact fp32 broadcast products), "mma" (the state products as 3xTF32 tensor-core
    dots), "split" (draft/record products once per (row, k-head) first) or None: "mma" (the fastest at
    every T = 1..8 on the H200, bench/README.md). Default blocks: common.VERIFY_TUNED (mma: one warp per 64
    value rows). stages: the mma launch's software pipelining of the column loop (common.launch_stages)."""
    lv = LayerViews(pool, layer)
    B = check_slots(slots, lv.device, lv.num_slots)
    H, Hk, Dv, Dk = lv.H, lv.Hk, lv.Dv, lv.Dk
    check(q.dim() == 4, f"q must be [B, T, Hk, Dk] for verify, got shape {tuple(q.shape)}")
    T = int(q.shape[1])
    check(T >= 1, "verify needs at least one draft token (T >= 1)")
    check(lv.window - 1 + T <= lv.R, f"T={T} drafts do not fit the ring (capacity {lv.R}, window {lv.window})")
    _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, lv.device, T=T)
    if parents is not None:
        check_tensor("parents", parents, shape=(B, T), dtype=torch.int32, device=lv.device)
    scale = Dk ** -0.5 if scale is None else float(scale)
    out = output_tensor(out, (B, T, H, Dv), v, lv.device)
    if B == 0:
        return out
    method, BV, num_warps = verify_plan("gdn", method, block_v, num_warps)
    nst = launch_stages(stages)
    BKC, BR = check_block_k(block_k, Dk) or chunk_k(Dk, 16), max(16, next_pow2(lv.window))
    rc, rs, rgs = lv.rc_args()
    grid = (triton.cdiv(Dv, BV), H, B)
    if method == "split":  # record/draft products once per (row, k-head), then the state pass
        BT = next_pow2(T)
        gram = torch.empty((B, Hk, 2 * BR * BT + 2 * BT * BT + 2 * BT), dtype=torch.float32, device=lv.device)
        _gdn_draft_gram_kernel[(Hk, B)](q, k, slots, lv.cursor, lv.rec_k, gram, scale, HK=Hk, K=Dk, R=lv.R, T=T,
                                         BT=BT, BKC=BKC, BR=BR, EPS=L2_EPS, num_warps=4)
        _gdn_verify_split_kernel[grid](q, k, v, a, b, A_log, dt_bias, parents if parents is not None else slots,
                                       out, slots, lv.cursor, lv.ckpt, rc, rs, rgs, lv.rec_d, lv.rec_k, lv.rec_g,
                                       gram, H=H, HK=Hk, K=Dk, V=Dv, R=lv.R, T=T, BT=BT, BV=BV, BKC=BKC, BR=BR,
                                       RC=lv.rc_mode, HAS_PARENTS=parents is not None, num_warps=num_warps)
        return out
    if method == "mma":  # tensor-core variant (3xTF32 on the GPU)
        _gdn_verify_mma_kernel[grid](q, k, v, a, b, A_log, dt_bias,
                                     parents if parents is not None else slots, out, slots, lv.cursor,
                                     lv.ckpt, rc, rs, rgs, lv.rec_d, lv.rec_k, lv.rec_g, scale,
                                     H=H, HK=Hk, K=Dk, V=Dv, R=lv.R, T=T, BT=max(8, next_pow2(T)), BV=BV,
                                     BKC=BKC, BR=BR, RC=lv.rc_mode, HAS_PARENTS=parents is not None, EPS=L2_EPS,
                                     PREC=common.DOT_PREC, num_warps=num_warps, **nst)
        return out
    _gdn_verify_kernel[grid](q, k, v, a, b, A_log, dt_bias,
                             parents if parents is not None else slots, out, slots, lv.cursor,
                             lv.ckpt, rc, rs, rgs, lv.rec_d, lv.rec_k, lv.rec_g, scale,
                             H=H, HK=Hk, K=Dk, V=Dv, R=lv.R, T=T, BT=next_pow2(T), BV=BV,
                             BKC=BKC, BR=BR, RC=lv.rc_mode, HAS_PARENTS=parents is not None, EPS=L2_EPS,
                             num_warps=num_warps)
    return out


def conventional_decode(state, slots, q, k, v, a, b, A_log, dt_bias, scale=None, *, out=None,
                        block_v=None, num_warps=None):
    """Conventional GDN decode: read, update and write state[slots] ([S, H, Dv, Dk]) in place."""
    check(isinstance(state, torch.Tensor) and state.dim() == 4,
          "state must be a 4-D tensor [S, H, Dv, Dk]")
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
    _gdn_conv_kernel[grid](q, k, v, a, b, A_log, dt_bias, out, slots, state, scale,
                           H=H, HK=Hk, K=Dk, V=Dv, BV=BV, BK=next_pow2(Dk), EPS=L2_EPS,
                           num_warps=num_warps or 4)
    return out


def fold(pool, layer, slots, counts, **kw):
    """Commit fold: records 0..counts[b]-1 into the checkpoint (+ read copy) of one layer, or of every layer
    in one launch (layer None); counts 0 = no-op (common.fold)."""
    common.fold(pool, layer, slots, counts, per_channel=False, **kw)
