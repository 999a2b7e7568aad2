"""GDN decode: the fused decode (non-flush + flush rows in one launch), the split decode's prep / read /
flush launches, the conventional decode baseline and the commit fold."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import (cdiv, check, check_slots, check_stages, check_tensor, check_flush_block_k, chunk_k, next_pow2,
                      output_tensor, token_inputs)
from ..constants import INTERPRET, RC_NVFP4
from ..delta_fold import _delta_fold_kernel, gdn_exact_d, gdn_window, store_delta_inputs
from ..fold import commit as commit_records, fold as fold_records, fold_store_dw
from ..layer_views import layer_views
from ..quant_tiles import state_tile
from ..replay import load_records, record_key_products, replay_pass, ring_program, ring_row
from ..split_decode import decode_launch_rows, flush_rows, join_stream, on_stream
from ..tuning import check_tuning, decode_plan, default_warps, KernelTuning, PREP_WARPS
from .token import _block_v, _check_inputs, _gdn_gate, _gdn_scalars, _gdn_token, L2_EPS


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
                    folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr, recv_ptr, recb_ptr,
                    scale, seed, layer, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    R: tl.constexpr, WINDOW: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr,
                    READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr, EPS: tl.constexpr,
                    INTERPRET: tl.constexpr, REDUCE_ONCE: tl.constexpr, NUM_STAGES: tl.constexpr,
                    QK_ROW: tl.constexpr, V_ROW: tl.constexpr, FOLD_BK: tl.constexpr):
    """The body of _gdn_decode_kernel for batch row i_b (value block program_id(0), head program_id(1)).
    QK_ROW, V_ROW: the element stride between the tokens' rows of q / k and of v (checks.token_rows)."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_row(
        slots_ptr, cursor_ptr, i_b, H, HK, V, BV, BR)
    is_flush = (cur + 1) >= WINDOW
    q_row = q_ptr + i_b * QK_ROW + i_hk * K
    k_row = k_ptr + i_b * QK_ROW + i_hk * K
    rq, rk, kq, g, beta = _gdn_scalars(q_row, k_row, a_ptr, b_ptr, alog_ptr, dtb_ptr, i_b, i_h, scale,
                                       H, K, EPS)
    alpha = tl.exp(g)
    vv = tl.load(v_ptr + i_b * V_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * HK + i_hk) * K
    if is_flush:  # the window folded into the fp32 checkpoint with this token on it, stored
        if recv_ptr is not None:  # beside a read copy: the window's d's solved again from the checkpoint
            G, gtot, br, X = gdn_window(recb_ptr + slot * R * H + i_h, reck_base, recg_ptr + slot * R * H + i_h, cur,
                                        H, HK * K, H, K, FOLD_BK, BR)
            D, sq0, sk0, kqr, kkr = gdn_exact_d(ckpt_ptr, head_rows, o_v, mask_v,
                                                recv_ptr + (slot * R * H + i_h) * V, reck_base, cur, G, br, X, q_row,
                                                k_row, rq, rk, H * V, HK * K, K, FOLD_BK, BV, BR, True)
            w = tl.where(mask_r, tl.exp(gtot - G), 0.0)
            gam = tl.exp(gtot)
        else:  # no read copy: every stored d came from the checkpoint itself, so they fold as they are
            D, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
            sq0, sk0, kqr, kkr = replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v,
                                             mask_v, q_row, k_row, rq, rk, reck_base, o_r, mask_r,
                                             HK * K, K, FOLD_BK, BV, BR, 0, True, REDUCE_ONCE, NUM_STAGES)
        d, o = _gdn_out(sq0, sk0, kqr, kkr, alpha, gam, D, w, beta, vv, kq)
        fold_store_dw(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, reck_base,
                      D * w[:, None], o_r, mask_r, gtot, alpha, d, k_row, rk, seed, tl.load(folded_ptr + slot) + cur + 1,
                      (layer * H + i_h).to(tl.int64) * (V * K), HK * K, K, FOLD_BK, BV, READ_COPY, CKPT_SR,
                      SHARED_QUANT, True, INTERPRET)
    else:  # S q and S k of the state before this token from the read copy (or checkpoint) and the records
        Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
        sq0, sk0, kqr, kkr = replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v,
                                         mask_v, q_row, k_row, rq, rk, reck_base, o_r, mask_r,
                                         HK * K, K, BKC, BV, BR, READ_COPY, True, REDUCE_ONCE, NUM_STAGES)
        d, o = _gdn_out(sq0, sk0, kqr, kkr, alpha, gam, Dr, w, beta, vv, kq)
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    # the record of this token at ring position cur: d, the raw v and beta, g, k
    tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, d.to(recd_ptr.dtype.element_ty), mask=mask_v)
    store_delta_inputs(recv_ptr, recb_ptr, slot, cur, i_h, o_v, mask_v, vv, beta, i_v, H, V, R)
    if i_v == 0:
        tl.store(recg_ptr + (slot * R + cur) * H + i_h, g)
        if i_h % (H // HK) == 0:
            o_k = tl.arange(0, K)
            kf = tl.load(k_row + o_k).to(tl.float32) * rk
            tl.store(reck_base + cur * (HK * K) + o_k, kf.to(reck_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["seed", "layer", "min_rows"])
def _gdn_decode_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr, cursor_ptr,
                       folded_ptr, frows_ptr, nflush_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr,
                       recg_ptr, recv_ptr, recb_ptr, scale, seed, layer, min_rows, H: tl.constexpr, HK: tl.constexpr,
                       K: tl.constexpr, V: tl.constexpr, R: tl.constexpr, WINDOW: tl.constexpr, BV: tl.constexpr,
                       BKC: tl.constexpr, BR: tl.constexpr, READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr,
                       SHARED_QUANT: tl.constexpr, EPS: tl.constexpr, INTERPRET: tl.constexpr,
                       REDUCE_ONCE: tl.constexpr, QK_ROW: tl.constexpr, V_ROW: tl.constexpr,
                       NUM_STAGES: tl.constexpr = None, FLUSH_ROW_PROGRAMS: tl.constexpr = 1,
                       FLUSH_ONLY: tl.constexpr = False, FOLD_BK: tl.constexpr = 32):
    """All rows of a decode step, or (FLUSH_ONLY) only the rows whose record fills the window: the
    nflush rows that the split decode listed in frows (split_decode.flush_list), program_id(2) folding those
    split_decode.flush_rows gives it (the split decode runs the other rows through _gdn_decode_prep_kernel +
    _gdn_decode_read_kernel)."""
    if FLUSH_ONLY:
        lo, hi, step = flush_rows(nflush_ptr, min_rows, FLUSH_ROW_PROGRAMS)
        for j in range(lo, hi, step):
            _gdn_decode_row(tl.load(frows_ptr + j), q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr,
                            slots_ptr, cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr,
                            reck_ptr, recg_ptr, recv_ptr, recb_ptr, scale, seed, layer, H, HK, K, V, R, WINDOW, BV,
                            BKC, BR, READ_COPY, CKPT_SR, SHARED_QUANT, EPS, INTERPRET, REDUCE_ONCE, NUM_STAGES,
                            QK_ROW, V_ROW, FOLD_BK)
    else:
        _gdn_decode_row(tl.program_id(2), q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr,
                        cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr,
                        recv_ptr, recb_ptr, scale, seed, layer, H, HK, K, V, R, WINDOW, BV, BKC, BR, READ_COPY,
                        CKPT_SR, SHARED_QUANT, EPS, INTERPRET, REDUCE_ONCE, NUM_STAGES, QK_ROW, V_ROW, FOLD_BK)


@triton.jit
def _gdn_decode_prep_kernel(q_ptr, k_ptr, slots_ptr, cursor_ptr, reck_ptr, prep_ptr, scale,
                            HK: tl.constexpr, K: tl.constexpr, R: tl.constexpr, WINDOW: tl.constexpr,
                            BR: tl.constexpr, EPS: tl.constexpr, QK_ROW: tl.constexpr):
    """Split decode, stage 1, one program per (row, k-head) of a non-flush row: the q/k normalisers,
    k.q and the committed keys' products K_r q, K_r k, shared by the group's value heads and value
    blocks -> prep row [K_r q (BR) | K_r k (BR) | k.q | rq | rk]; and the token's k record."""
    i_hk = tl.program_id(0)
    i_b = tl.program_id(1)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    cur = tl.load(cursor_ptr + slot)
    if cur + 1 >= WINDOW:
        return
    q_row = q_ptr + i_b * QK_ROW + i_hk * K
    k_row = k_ptr + i_b * QK_ROW + i_hk * K
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
                            ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, recg_ptr, recv_ptr, recb_ptr, prep_ptr,
                            H: tl.constexpr,
                            HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr, WINDOW: tl.constexpr,
                            BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr, READ_COPY: tl.constexpr,
                            REDUCE_ONCE: tl.constexpr, QK_ROW: tl.constexpr, V_ROW: tl.constexpr,
                            NUM_STAGES: tl.constexpr = None):
    """Split decode, stage 2, non-flush rows: the state pass (S q, S k from the checkpoint or its read
    copy) with the record products from stage 1, then d, the output, the d, v, beta and g records."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    if cur + 1 >= WINDOW:
        return
    p = prep_ptr + (i_b * HK + i_hk) * (2 * BR + 3)
    av = tl.load(a_ptr + i_b * H + i_h).to(tl.float32)
    g = _gdn_gate(av, alog_ptr, dtb_ptr, i_h)
    alpha = tl.exp(g)
    beta = tl.sigmoid(tl.load(b_ptr + i_b * H + i_h).to(tl.float32))
    vv = tl.load(v_ptr + i_b * V_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    sq0, sk0, _kq, _kk = replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, (slot * H + i_h) * V, slot * H + i_h, o_v,
                                     mask_v, q_ptr + i_b * QK_ROW + i_hk * K, k_ptr + i_b * QK_ROW + i_hk * K,
                                     tl.load(p + 2 * BR + 1), tl.load(p + 2 * BR + 2), recd_ptr, o_r, mask_r,  # no keys read
                                     HK * K, K, BKC, BV, BR, READ_COPY, True, REDUCE_ONCE, NUM_STAGES, False)
    d, o = _gdn_out(sq0, sk0, tl.load(p + o_r), tl.load(p + BR + o_r), alpha, gam, Dr, w, beta, vv,
                    tl.load(p + 2 * BR))
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, d.to(recd_ptr.dtype.element_ty), mask=mask_v)
    store_delta_inputs(recv_ptr, recb_ptr, slot, cur, i_h, o_v, mask_v, vv, beta, i_v, H, V, R)
    if i_v == 0:
        tl.store(recg_ptr + (slot * R + cur) * H + i_h, g)


@triton.jit
def _gdn_conventional_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr,
                     state_ptr, scale,
                     H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BV: tl.constexpr, BK: tl.constexpr, EPS: tl.constexpr, QK_ROW: tl.constexpr,
                     V_ROW: tl.constexpr):
    i_v, i_h, i_b, o_v, mask_v, o_k, mask_k, offs, mask2, S = state_tile(slots_ptr, state_ptr, H, K, V, BV, BK)
    i_hk = i_h // (H // HK)
    qv, kv, vv, g, beta = _gdn_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, i_b,
                                     i_h, i_hk, o_k, mask_k, o_v, mask_v, scale, H, HK, K, V, EPS, QK_ROW,
                                     V_ROW)
    S = S * tl.exp(g)
    d = beta * (vv - tl.sum(S * kv[None, :], axis=1))
    S = S + d[:, None] * kv[None, :]
    o = tl.sum(S * qv[None, :], axis=1)
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(state_ptr + offs, S.to(state_ptr.dtype.element_ty), mask=mask2)


def decode(pool, layer, slots, q, k, v, a, b, A_log, dt_bias, scale=None, *, out=None, method=None, tuning=None,
           flush_list=None):
    """One GDN decode step of a batch, in place on the pool (record at cursor; flush rows fold).

    Same contract as reference.gdn.decode; returns out [B, H, Dv] in v's dtype. Does not move
    the cursor (pool.advance does). method: "fused" (one launch for all rows), "split" (a flush-row
    list, the flush rows on a side stream; the other rows through a small kernel for the k-head's
    record products, then the state pass) or None (tuning.decode_plan: split where it measured
    faster). tuning: a KernelTuning (None: tuning.decode_plan's blocks). flush_list: the split
    decode's (rows, count) of split_decode.flush_list for these slots and the pool's cursors,
    computed once per step and shared by its layers, or a function returning them (called only by a
    split decode; None: computed here)."""
    tuning = check_tuning(tuning)
    if getattr(pool.cfg, "mode", "replay") == "conventional":
        return conventional_decode(pool.ckpt[layer], slots, q, k, v, a, b, A_log, dt_bias, scale, out=out,
                                   tuning=KernelTuning(block_v=tuning.block_v, num_warps=tuning.num_warps))
    lv = layer_views(pool, layer)
    B = check_slots(slots, lv.device, lv.num_slots)
    H, Hk, Dv, Dk = lv.H, lv.Hk, lv.Dv, lv.Dk
    _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, lv.device)
    check(lv.R >= lv.window, f"ring capacity {lv.R} < window {lv.window}")
    q, k, v, qk_row, v_row = token_inputs(q, k, v, lead=1)
    scale = Dk ** -0.5 if scale is None else float(scale)
    out = output_tensor(out, (B, H, Dv), v, lv.device)
    if B == 0:
        return out
    method, tuning = decode_plan("gdn", lv.rc_mode, B, H, Dk, method, tuning)
    block_v, block_k, num_warps, stages = tuning.block_v, tuning.block_k, tuning.num_warps, tuning.stages
    flush_block_k, flush_warps = tuning.flush_block_k, tuning.flush_warps
    BV = _block_v(Dv, block_v)
    nw = num_warps or default_warps(B, H)
    if lv.rc_mode == RC_NVFP4:  # flush rows compute the per-head NVFP4 global scale
        BV = max(16, next_pow2(lv.Dv))
        nw, block_k = max(nw, 8), block_k or 16
    rc, rs, rgs = lv.rc_args()
    BR = max(16, next_pow2(lv.window))
    fbk = check_flush_block_k(flush_block_k, Dk)   # the flush rows' column chunk (0: 32; NVFP4: 16)
    # split: this launch only does the flush rows' work (sized for the fold), beside the others
    launch = decode_launch_rows("gdn", method, slots, lv, nw, flush_warps, flush_list)
    nw = launch.warps
    with on_stream(launch.stream):
        _gdn_decode_kernel[(cdiv(Dv, BV), H, launch.grid_rows)](
            # the token's inputs and the output
            q_ptr=q, k_ptr=k, v_ptr=v, a_ptr=a, b_ptr=b, alog_ptr=A_log, dtb_ptr=dt_bias, out_ptr=out,
            # the rows, the split decode's flush list, the layer's state (DecodeRows.state_args)
            **launch.state_args(lv, slots), scale=scale,
            H=H, HK=Hk, K=Dk, V=Dv, BV=BV, BKC=block_k or chunk_k(Dk), BR=BR, EPS=L2_EPS,
            REDUCE_ONCE=nw >= 4 and (block_k or 32) <= 32, QK_ROW=qk_row, V_ROW=v_row,
            NUM_STAGES=check_stages(stages),
            FOLD_BK=16 if lv.rc_mode == RC_NVFP4 else fbk or chunk_k(Dk, min(Dk, 32)), num_warps=nw)
    if method == "split":
        prep = torch.empty((B, Hk, 2 * BR + 3), dtype=torch.float32, device=lv.device)
        _gdn_decode_prep_kernel[(Hk, B)](q_ptr=q, k_ptr=k, slots_ptr=slots, cursor_ptr=lv.cursor, reck_ptr=lv.rec_k,
                                         prep_ptr=prep, scale=scale, HK=Hk, K=Dk, R=lv.R, WINDOW=lv.window, BR=BR,
                                         EPS=L2_EPS, QK_ROW=qk_row, num_warps=PREP_WARPS)
        rbv, rnw = _block_v(Dv, block_v), num_warps or default_warps(B, H)
        _gdn_decode_read_kernel[(cdiv(Dv, rbv), H, B)](
            q_ptr=q, k_ptr=k, v_ptr=v, a_ptr=a, b_ptr=b, alog_ptr=A_log, dtb_ptr=dt_bias, out_ptr=out,
            slots_ptr=slots, cursor_ptr=lv.cursor, ckpt_ptr=lv.ckpt, rc_ptr=rc, rs_ptr=rs, rgs_ptr=rgs,
            recd_ptr=lv.rec_d, recg_ptr=lv.rec_g, recv_ptr=lv.rec_v, recb_ptr=lv.rec_beta, prep_ptr=prep,
            H=H, HK=Hk, K=Dk, V=Dv, R=lv.R, WINDOW=lv.window, BV=rbv, BKC=block_k or chunk_k(Dk), BR=BR,
            READ_COPY=lv.rc_mode, REDUCE_ONCE=rnw >= 4, QK_ROW=qk_row, V_ROW=v_row, NUM_STAGES=check_stages(stages),
            num_warps=rnw)
    join_stream(launch.stream)
    return out


def conventional_decode(state, slots, q, k, v, a, b, A_log, dt_bias, scale=None, *, out=None, tuning=None):
    """Conventional GDN decode: read, update and write state[slots] ([S, H, Dv, Dk]) in place.
    tuning: a KernelTuning (its block_v and num_warps)."""
    tuning = check_tuning(tuning)
    check(isinstance(state, torch.Tensor) and state.dim() == 4,
          "state must be a 4-D tensor [S, H, Dv, Dk]")
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
    _gdn_conventional_kernel[(cdiv(Dv, BV), H, B)](
        q_ptr=q, k_ptr=k, v_ptr=v, a_ptr=a, b_ptr=b, alog_ptr=A_log, dtb_ptr=dt_bias, out_ptr=out, slots_ptr=slots,
        state_ptr=state, scale=scale, H=H, HK=Hk, K=Dk, V=Dv, BV=BV, BK=next_pow2(Dk), EPS=L2_EPS, QK_ROW=qk_row,
        V_ROW=v_row, num_warps=tuning.num_warps or 4)
    return out


def fold(pool, layer, slots, counts, *, tuning=None):
    """Commit fold: records 0..counts[b]-1 into the checkpoint (+ read copy) of one layer, or of every layer
    in one launch (layer None); counts 0 = no-op (fold.fold with the exact delta-rule fold kernel)."""
    fold_records(pool, layer, slots, counts, _delta_fold_kernel, tuning)


def commit(pool, slots, accepted, *, tuning=None):
    """A chain commit's device work (fold.commit with the exact delta-rule fold kernel): rows whose cursor +
    accepted drafts reach the window fold every layer, then the pointers move."""
    commit_records(pool, slots, accepted, _delta_fold_kernel, tuning)
