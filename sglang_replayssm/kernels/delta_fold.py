"""The exact fold of the delta-rule families (GDN, KDA): a window's records replayed from their raw inputs
(v, beta, k, g) through the delta rule, from the full-precision checkpoint, one value-row tile in registers
(each value row of a delta-rule state evolves on its own given the keys). The records' stored d were computed
by steps that read the low-precision read copy; the fold never uses them, so the read copy's error does not
reach the recurrence (reference: ``core.replay_inputs``).

Used by a decode's flush rows (``delta_flush_rows``, GDN and KDA decode kernels) and by the commit / flush launch
(``_delta_fold_kernel``, through ``fold.fold`` / ``fold.commit``)."""
from __future__ import annotations

import triton
import triton.language as tl

from .fold import fold_count, fold_layer_head
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
                     BV: tl.constexpr, SUB: tl.constexpr, V_ROW: tl.constexpr, PER_CHANNEL: tl.constexpr,
                     READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr,
                     INTERPRET: tl.constexpr):
    """A decode flush row of a delta family, value block i_v (BV rows) of head i_h, SUB rows at a time (whole
    rows in registers: SUB * K elements; NVFP4's per-head scale needs SUB = BV >= Dv): the state before this
    token from the full-precision checkpoint and the window's records 0..cur-1 (delta_replay), this token's step on
    it (alpha: its decay, a scalar or [K]; q, k = q_row * rq, k_row * rk), the new state stored as checkpoint and
    read copy (stream: its stochastic-rounding stream); the token's output, d and v records stored."""
    o_k = tl.arange(0, K)
    kn = tl.load(k_row + o_k).to(tl.float32) * rk
    qn = tl.load(q_row + o_k).to(tl.float32) * rq
    recv_base, recb_base, reck_base, recg_base = delta_head_bases(recv_ptr, recb_ptr, reck_ptr, recg_ptr, slot, i_h,
                                                                  i_hk, H, HK, K, V, R, PER_CHANNEL)
    head_rows = (slot * H + i_h) * V
    for sb in tl.static_range(BV // SUB):
        o_v = i_v * BV + sb * SUB + tl.arange(0, SUB)
        mask_v = o_v < V
        S = tl.load(ckpt_ptr + (head_rows + o_v)[:, None] * K + o_k[None, :], mask=mask_v[:, None],
                    other=0.0).to(tl.float32)
        S = delta_replay(S, o_v, mask_v, recv_base, recb_base, reck_base, recg_base, cur, H * V, H, HK * K,
                         H * K if PER_CHANNEL else H, K, PER_CHANNEL)
        if PER_CHANNEL:
            S = S * alpha[None, :]
        else:
            S = S * alpha
        vv = tl.load(v_ptr + i_b * V_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
        d = beta * (vv - tl.sum(S * kn[None, :], axis=1))
        S = S + d[:, None] * kn[None, :]
        o = tl.sum(S * qn[None, :], axis=1)
        store_state_tile(S, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, seed, stream,
                         (layer * H + i_h).to(tl.int64) * (V * K), K, SUB, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)
        tl.store(out_ptr + (i_b * H + i_h) * V + o_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
        tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, d.to(recd_ptr.dtype.element_ty), mask=mask_v)
        tl.store(recv_ptr + ((slot * R + cur) * H + i_h) * V + o_v, vv.to(recv_ptr.dtype.element_ty), mask=mask_v)


def flush_sub_rows(BV: int, Dk: int, num_warps: int, nvfp4: bool) -> int:
    """The value rows a decode flush row replays at once (delta_flush_rows' SUB): about 32 fp32 state elements per
    thread (a [SUB, Dk] tile over num_warps warps), at least 2 and at most BV; NVFP4: BV (its per-head scale)."""
    if nvfp4:
        return BV
    sub = 2
    while sub * 2 <= BV and sub * 2 * Dk <= 1024 * num_warps:
        sub *= 2
    return sub


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
                       PER_CHANNEL: tl.constexpr):
    """fold._fold_kernel for the delta families: records 0..count-1 of each row replayed into its checkpoint
    (+ read copy) from their raw inputs (delta_replay; whole rows, BKC = K), for one layer or several
    (fold.fold_layer_head; S: the pool's slots). count 0: no-op. FROM_ACCEPTED: counts_ptr holds a commit's
    accepted drafts and the count is fold.fold_count's. recd_ptr is not read."""
    i_v = tl.program_id(0)
    i_b = tl.program_id(2)
    layer, i_h, l = fold_layer_head(layer, H)
    cnt = tl.load(counts_ptr + i_b)
    row = tl.load(slots_ptr + i_b).to(tl.int64)
    if FROM_ACCEPTED:
        cnt = fold_count(cursor_ptr, row, cnt, WINDOW)
    if cnt > 0:
        i_hk = i_h // (H // HK)
        stream = tl.load(folded_ptr + row) + cnt
        slot = row + l * S                   # in the first layer's views
        o_v = i_v * BV + tl.arange(0, BV)
        mask_v = o_v < V
        head_rows = (slot * H + i_h) * V
        St = tl.load(ckpt_ptr + (head_rows + o_v)[:, None] * K + tl.arange(0, K)[None, :], mask=mask_v[:, None],
                     other=0.0).to(tl.float32)
        recv_base, recb_base, reck_base, recg_base = delta_head_bases(recv_ptr, recb_ptr, reck_ptr, recg_ptr, slot,
                                                                      i_h, i_hk, H, HK, K, V, R, PER_CHANNEL)
        St = delta_replay(St, o_v, mask_v, recv_base, recb_base, reck_base, recg_base, cnt, H * V, H, HK * K,
                          H * K if PER_CHANNEL else H, K, PER_CHANNEL)
        store_state_tile(St, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, seed, stream,
                         (layer * H + i_h).to(tl.int64) * (V * K), K, BV, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)
