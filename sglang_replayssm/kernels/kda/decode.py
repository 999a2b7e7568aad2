"""KDA decode: the fused decode (non-flush + flush rows in one launch), the split decode's prep / read /
flush launches, the conventional decode baseline; the flush rows and the commit fold replay the window exactly
(delta_fold.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import (cdiv, check, check_slots, check_stages, check_tensor, check_flush_block_k, chunk_k, next_pow2,
                      output_tensor, token_inputs)
from ..constants import INTERPRET, RC_NVFP4
from ..delta_fold import store_delta_inputs
from ..fold import commit as commit_records, fold as fold_records, fold_program
from ..layer_views import layer_views
from ..math_helpers import softplus
from ..quant_tiles import load_state_chunk
from ..replay import ring_program, ring_row, stored_d
from ..split_decode import decode_launch_rows, flush_rows, join_stream, on_stream
from ..tuning import check_tuning, decode_plan, default_warps, fold_gram_columns, KernelTuning, PREP_WARPS
from .token import _block_v, _check_inputs, _kda_chunk, _kda_fold_store, kda_exact_d, L2_EPS


@triton.jit
def _kda_decode_row(i_b, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr, cursor_ptr,
                    folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr, recv_ptr, recb_ptr,
                    scale, seed, layer, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    R: tl.constexpr, WINDOW: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr,
                    READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr, EPS: tl.constexpr,
                    INTERPRET: tl.constexpr, NUM_STAGES: tl.constexpr, QK_ROW: tl.constexpr, V_ROW: tl.constexpr,
                    FOLD_BK: tl.constexpr, MKC: tl.constexpr):
    """The body of _kda_decode_kernel for batch row i_b (value block program_id(0), head program_id(1)).
    QK_ROW, V_ROW: the element stride between the tokens' rows of q / k and of v (checks.token_rows). A flush row
    reads the full-precision checkpoint and (beside a read copy) the window's exact d's (kda_exact_d), a non-flush
    row the read copy and the stored d's."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_row(
        slots_ptr, cursor_ptr, i_b, H, HK, V, BV, BR)
    is_flush = (cur + 1) >= WINDOW
    q_row = q_ptr + i_b * QK_ROW + i_hk * K
    k_row = k_ptr + i_b * QK_ROW + i_hk * K
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
    vv = tl.load(v_ptr + i_b * V_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * HK + i_hk) * K
    if recv_ptr is not None:   # beside a read copy
        if is_flush:   # the window's d's solved again from the fp32 checkpoint and their raw inputs
            Dr = kda_exact_d(ckpt_ptr, head_rows, o_v, mask_v, recv_ptr + (slot * R * H + i_h) * V,
                             recb_ptr + slot * R * H + i_h, reck_base, recg_ptr + (slot * R * H + i_h) * K, cur,
                             H * V, H, HK * K, H * K, K, FOLD_BK, MKC, BV, BR)
        else:
            Dr = stored_d(recd_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    else:   # no read copy: every stored d, a flush row's too, came from the checkpoint itself
        Dr = stored_d(recd_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    sq = tl.zeros([BV], dtype=tl.float32)
    sk = tl.zeros([BV], dtype=tl.float32)
    kqr = tl.zeros([BR], dtype=tl.float32)
    kkr = tl.zeros([BR], dtype=tl.float32)
    for c in tl.range(0, K // BKC, num_stages=NUM_STAGES):
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
                                  mask_v, K, READ_COPY)
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
        _kda_fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, recg_ptr,
                        reck_base, slot, i_h, o_r, mask_r, Dr, a_row, alog, dtb_row, d, k_row, rk, seed,
                        tl.load(folded_ptr + slot) + cur + 1, (layer * H + i_h).to(tl.int64) * (V * K), H, K, R,
                        HK * K, FOLD_BK, BV, READ_COPY, CKPT_SR, SHARED_QUANT, True, INTERPRET)
    # the record of this token at ring position cur: d, the raw v and beta, g, k
    tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, d.to(recd_ptr.dtype.element_ty), mask=mask_v)
    store_delta_inputs(recv_ptr, recb_ptr, slot, cur, i_h, o_v, mask_v, vv, beta, i_v, H, V, R)
    if i_v == 0:
        g = -tl.exp(alog) * softplus(tl.load(a_row + o_k).to(tl.float32) + tl.load(dtb_row + o_k).to(tl.float32))
        tl.store(recg_ptr + ((slot * R + cur) * H + i_h) * K + o_k, g)
        if i_h % (H // HK) == 0:
            tl.store(reck_base + cur * (HK * K) + o_k, (kf * rk).to(reck_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["seed", "layer", "min_rows"])
def _kda_decode_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr, cursor_ptr,
                       folded_ptr, frows_ptr, nflush_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr,
                       recg_ptr, recv_ptr, recb_ptr, scale, seed, layer, min_rows, H: tl.constexpr, HK: tl.constexpr,
                       K: tl.constexpr, V: tl.constexpr, R: tl.constexpr, WINDOW: tl.constexpr, BV: tl.constexpr,
                       BKC: tl.constexpr, BR: tl.constexpr, READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr,
                       SHARED_QUANT: tl.constexpr, EPS: tl.constexpr, INTERPRET: tl.constexpr, QK_ROW: tl.constexpr,
                       V_ROW: tl.constexpr, NUM_STAGES: tl.constexpr = None, FLUSH_ROW_PROGRAMS: tl.constexpr = 1,
                       FLUSH_ONLY: tl.constexpr = False, FOLD_BK: tl.constexpr = 32,
                       MKC: tl.constexpr = 16):
    """All rows of a decode step, or (FLUSH_ONLY) only the rows whose record fills the window: the
    nflush rows that the split decode listed in frows (split_decode.flush_list), program_id(2) folding those
    split_decode.flush_rows gives it (the split decode runs the other rows through _kda_decode_prep_kernel +
    _kda_decode_read_kernel)."""
    if FLUSH_ONLY:
        lo, hi, step = flush_rows(nflush_ptr, min_rows, FLUSH_ROW_PROGRAMS)
        for j in range(lo, hi, step):
            _kda_decode_row(tl.load(frows_ptr + j), q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr,
                            slots_ptr, cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr,
                            reck_ptr, recg_ptr, recv_ptr, recb_ptr, scale, seed, layer, H, HK, K, V, R, WINDOW, BV,
                            BKC, BR, READ_COPY, CKPT_SR, SHARED_QUANT, EPS, INTERPRET, NUM_STAGES, QK_ROW, V_ROW, FOLD_BK, MKC)
    else:
        _kda_decode_row(tl.program_id(2), q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr,
                        cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr,
                        recv_ptr, recb_ptr, scale, seed, layer, H, HK, K, V, R, WINDOW, BV, BKC, BR, READ_COPY,
                        CKPT_SR, SHARED_QUANT, EPS, INTERPRET, NUM_STAGES, QK_ROW, V_ROW, FOLD_BK, MKC)


@triton.jit
def _kda_decode_prep_kernel(q_ptr, k_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, slots_ptr, cursor_ptr, reck_ptr, recg_ptr,
                            prep_ptr, scale, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, R: tl.constexpr,
                            WINDOW: tl.constexpr, BR: tl.constexpr, EPS: tl.constexpr, QK_ROW: tl.constexpr):
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
    k_row = k_ptr + i_b * QK_ROW + i_hk * K
    a_row = a_ptr + (i_b * H + i_h) * K
    alog = tl.load(alog_ptr + i_h).to(tl.float32)
    qf = tl.load(q_ptr + i_b * QK_ROW + i_hk * K + o_k).to(tl.float32)
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
                            recv_ptr, recb_ptr, prep_ptr, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                            R: tl.constexpr, WINDOW: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr,
                            BR: tl.constexpr, READ_COPY: tl.constexpr, V_ROW: tl.constexpr,
                            NUM_STAGES: tl.constexpr = None):
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
    for c in tl.range(0, K // BKC, num_stages=NUM_STAGES):
        o_kc = c * BKC + tl.arange(0, BKC)
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc, mask_v, K, READ_COPY)
        sq += tl.sum(S0 * tl.load(p + o_kc)[None, :], axis=1)
        sk += tl.sum(S0 * tl.load(p + K + o_kc)[None, :], axis=1)
    Dr = tl.load(recd_ptr + ((slot * R + o_r[:, None]) * H + i_h) * V + o_v[None, :],
                 mask=mask_r[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    sq = sq + tl.sum(Dr * tl.load(p + 2 * K + o_r)[:, None], axis=0)
    sk = sk + tl.sum(Dr * tl.load(p + 2 * K + BR + o_r)[:, None], axis=0)
    vv = tl.load(v_ptr + i_b * V_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    d = tl.load(p + 2 * K + 2 * BR + 1) * (vv - sk)
    o = sq + d * tl.load(p + 2 * K + 2 * BR)
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, d.to(recd_ptr.dtype.element_ty), mask=mask_v)
    store_delta_inputs(recv_ptr, recb_ptr, slot, cur, i_h, o_v, mask_v, vv, tl.load(p + 2 * K + 2 * BR + 1), i_v, H,
                       V, R)


@triton.jit(do_not_specialize=["seed", "layer"])
def _kda_fold_kernel(slots_ptr, counts_ptr, cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr,
                     recd_ptr, reck_ptr, recg_ptr, recv_ptr, recb_ptr, seed, layer, S,
                     H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     R: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr,
                     READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr,
                     INTERPRET: tl.constexpr, WINDOW: tl.constexpr, FROM_ACCEPTED: tl.constexpr, MKC: tl.constexpr):
    """The KDA fold (fold.fold / fold.commit's kernel): records 0..count-1 of each row folded exactly into its
    checkpoint (+ read copy): their d's solved from the checkpoint and their raw inputs (kda_exact_d), then the
    linear fold with per-channel decays (_kda_fold_store), for one layer or several (fold.fold_program; S: the
    pool's slots). count 0: no-op. FROM_ACCEPTED: counts_ptr holds a commit's accepted drafts. Without raw inputs
    (recv_ptr None: no read copy) the stored d's fold as they are."""
    i_v, layer, i_h, i_hk, cnt, stream, slot = fold_program(slots_ptr, counts_ptr, cursor_ptr, folded_ptr, layer, S,
                                                            H, HK, WINDOW, FROM_ACCEPTED)
    if cnt > 0:
        o_v = i_v * BV + tl.arange(0, BV)
        o_r = tl.arange(0, BR)
        mask_v = o_v < V
        head_rows = (slot * H + i_h) * V
        reck_base = reck_ptr + (slot * R * HK + i_hk) * K
        if recv_ptr is not None:   # beside a read copy: the d's solved again from the checkpoint
            Dr = kda_exact_d(ckpt_ptr, head_rows, o_v, mask_v, recv_ptr + (slot * R * H + i_h) * V,
                             recb_ptr + slot * R * H + i_h, reck_base, recg_ptr + (slot * R * H + i_h) * K, cnt,
                             H * V, H, HK * K, H * K, K, BKC, MKC, BV, BR)
        else:   # no read copy: the stored d's came from the checkpoint itself
            Dr = stored_d(recd_ptr, slot, i_h, o_r, o_r < cnt, o_v, mask_v, H, V, R)
        _kda_fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, recg_ptr,
                        reck_base, slot, i_h, o_r, o_r < cnt, Dr, recg_ptr, 0.0, recg_ptr,
                        tl.zeros([BV], dtype=tl.float32), reck_ptr, 1.0, seed, stream,
                        (layer * H + i_h).to(tl.int64) * (V * K), H, K, R, HK * K, BKC, BV, READ_COPY, CKPT_SR,
                        SHARED_QUANT, False, INTERPRET)


@triton.jit
def _kda_conventional_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr,
                     state_ptr, scale, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr,
                     V: tl.constexpr, BV: tl.constexpr, EPS: tl.constexpr, QK_ROW: tl.constexpr,
                     V_ROW: tl.constexpr):
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
    qv = tl.load(q_ptr + i_b * QK_ROW + i_hk * K + o_k).to(tl.float32)
    kv = tl.load(k_ptr + i_b * QK_ROW + i_hk * K + o_k).to(tl.float32)
    qv = qv * (scale / tl.sqrt(tl.sum(qv * qv, axis=0) + EPS))
    kv = kv / tl.sqrt(tl.sum(kv * kv, axis=0) + EPS)
    vv = tl.load(v_ptr + i_b * V_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    g = -tl.exp(tl.load(alog_ptr + i_h).to(tl.float32)) * softplus(
        tl.load(a_ptr + (i_b * H + i_h) * K + o_k).to(tl.float32) + tl.load(dtb_ptr + i_h * K + o_k).to(tl.float32))
    beta = tl.sigmoid(tl.load(b_ptr + i_b * H + i_h).to(tl.float32))
    S = S * tl.exp(g)[None, :]
    d = beta * (vv - tl.sum(S * kv[None, :], axis=1))
    S = S + d[:, None] * kv[None, :]
    o = tl.sum(S * qv[None, :], axis=1)
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(state_ptr + offs, S.to(state_ptr.dtype.element_ty), mask=mask_v[:, None])


def decode(pool, layer, slots, q, k, v, a, b, A_log, dt_bias, scale=None, *, out=None, method=None, tuning=None,
           flush_list=None):
    """One KDA decode step of a batch, in place on the pool (record at cursor; flush rows fold).
    Same contract as reference.kda.decode; returns out [B, H, Dv] in v's dtype. method: "fused" (one
    launch for all rows), "split" (a flush-row list, the flush rows on a side stream; the other rows
    through a small kernel for the head's record products, then the state pass) or None
    (tuning.decode_plan: split where it measured faster). tuning: a KernelTuning (None:
    tuning.decode_plan's blocks). flush_list: as gdn.decode's."""
    tuning = check_tuning(tuning)
    if getattr(pool.cfg, "mode", "replay") == "conventional":
        return conventional_decode(pool.ckpt[layer], slots, q, k, v, a, b, A_log, dt_bias, scale, out=out,
                                   tuning=KernelTuning(block_v=tuning.block_v, num_warps=tuning.num_warps))
    lv = layer_views(pool, layer)
    B = check_slots(slots, lv.device, lv.num_slots)
    H, Hk, Dv, Dk = lv.H, lv.Hk, lv.Dv, lv.Dk
    _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, lv.device)
    q, k, v, qk_row, v_row = token_inputs(q, k, v, lead=1)
    scale = Dk ** -0.5 if scale is None else float(scale)
    out = output_tensor(out, (B, H, Dv), v, lv.device)
    if B == 0:
        return out
    method, tuning = decode_plan("kda", lv.rc_mode, B, H, Dk, method, tuning)
    block_v, block_k, num_warps, stages = tuning.block_v, tuning.block_k, tuning.num_warps, tuning.stages
    BV = _block_v(Dv, block_v)
    nw = num_warps or default_warps(B, H)
    if lv.rc_mode == RC_NVFP4:  # flush rows compute the per-head NVFP4 global scale
        BV = next_pow2(Dv)
        nw, block_k = max(nw, 8), block_k or 16
    rc, rs, rgs = lv.rc_args()
    BR = max(16, next_pow2(lv.window))
    fbk = check_flush_block_k(tuning.flush_block_k, Dk)   # the flush rows' column chunk (0: 32; NVFP4: 16)
    # split: this launch only does the flush rows' work (sized for the fold), beside the others
    launch = decode_launch_rows("kda", method, slots, lv, nw, tuning.flush_warps, flush_list)
    nw = launch.warps
    with on_stream(launch.stream):
        _kda_decode_kernel[(cdiv(Dv, BV), H, launch.grid_rows)](
            # the token's inputs and the output
            q_ptr=q, k_ptr=k, v_ptr=v, a_ptr=a, b_ptr=b, alog_ptr=A_log, dtb_ptr=dt_bias, out_ptr=out,
            # the rows, the split decode's flush list, the layer's state (DecodeRows.state_args)
            **launch.state_args(lv, slots), scale=scale,
            H=H, HK=Hk, K=Dk, V=Dv, BV=BV, BKC=block_k or chunk_k(Dk), BR=BR, EPS=L2_EPS,
            QK_ROW=qk_row, V_ROW=v_row, NUM_STAGES=check_stages(stages),
            FOLD_BK=16 if lv.rc_mode == RC_NVFP4 else fbk or chunk_k(Dk, min(Dk, 32)),
            MKC=fold_gram_columns(BR), num_warps=nw)
    if method == "split":
        prep = torch.empty((B, H, 2 * Dk + 2 * BR + 2), dtype=torch.float32, device=lv.device)
        _kda_decode_prep_kernel[(H, B)](q_ptr=q, k_ptr=k, a_ptr=a, b_ptr=b, alog_ptr=A_log, dtb_ptr=dt_bias,
                                        slots_ptr=slots, cursor_ptr=lv.cursor, reck_ptr=lv.rec_k, recg_ptr=lv.rec_g,
                                        prep_ptr=prep, scale=scale, H=H, HK=Hk, K=Dk, R=lv.R, WINDOW=lv.window, BR=BR,
                                        EPS=L2_EPS, QK_ROW=qk_row, num_warps=PREP_WARPS)
        rbv = _block_v(Dv, block_v)
        rnw = num_warps or default_warps(B, H)
        _kda_decode_read_kernel[(cdiv(Dv, rbv), H, B)](
            v_ptr=v, out_ptr=out, slots_ptr=slots, cursor_ptr=lv.cursor, ckpt_ptr=lv.ckpt, rc_ptr=rc, rs_ptr=rs,
            rgs_ptr=rgs, recd_ptr=lv.rec_d, recv_ptr=lv.rec_v, recb_ptr=lv.rec_beta, prep_ptr=prep, H=H, HK=Hk, K=Dk, V=Dv, R=lv.R, WINDOW=lv.window, BV=rbv,
            BKC=block_k or chunk_k(Dk), BR=BR, READ_COPY=lv.rc_mode, V_ROW=v_row, NUM_STAGES=check_stages(stages),
            num_warps=rnw)
    join_stream(launch.stream)
    return out


def conventional_decode(state, slots, q, k, v, a, b, A_log, dt_bias, scale=None, *, out=None, tuning=None):
    """Conventional KDA decode: read, update and write state[slots] ([S, H, Dv, Dk]) in place.
    tuning: a KernelTuning (its block_v and num_warps)."""
    tuning = check_tuning(tuning)
    check(isinstance(state, torch.Tensor) and state.dim() == 4, "state must be a 4-D tensor [S, H, Dv, Dk]")
    check_tensor("state", state, dtype=(torch.float32, torch.float16, torch.bfloat16))
    _, H, Dv, Dk = state.shape
    B = check_slots(slots, state.device, state.shape[0])
    Hk = q.shape[1] if q.dim() == 3 else -1
    _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, state.device)
    q, k, v, qk_row, v_row = token_inputs(q, k, v, lead=1)
    scale = Dk ** -0.5 if scale is None else float(scale)
    out = output_tensor(out, (B, H, Dv), v, state.device)
    if B == 0:
        return out
    BV = _block_v(Dv, tuning.block_v)
    _kda_conventional_kernel[(cdiv(Dv, BV), H, B)](
        q_ptr=q, k_ptr=k, v_ptr=v, a_ptr=a, b_ptr=b, alog_ptr=A_log, dtb_ptr=dt_bias, out_ptr=out, slots_ptr=slots,
        state_ptr=state, scale=scale, H=H, HK=Hk, K=Dk, V=Dv, BV=BV, EPS=L2_EPS, QK_ROW=qk_row, V_ROW=v_row,
        num_warps=tuning.num_warps or 4)
    return out


def fold(pool, layer, slots, counts, *, tuning=None):
    """Commit fold: records 0..counts[b]-1 into the checkpoint (+ read copy) of one layer, or of every layer
    in one launch (layer None); counts 0 = no-op (fold.fold with the exact KDA fold kernel)."""
    fold_records(pool, layer, slots, counts, _kda_fold_kernel, tuning)


def commit(pool, slots, accepted, *, tuning=None):
    """A chain commit's device work (fold.commit with the exact KDA fold kernel): rows whose cursor +
    accepted drafts reach the window fold every layer, then the pointers move."""
    commit_records(pool, slots, accepted, _kda_fold_kernel, tuning)
