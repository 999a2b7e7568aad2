"""Record replay: a decode / verify program's ring coordinates and the passes that read the checkpoint
and the records since it without forming the state (S q, S k, K_r q, K_r k)."""
from __future__ import annotations

import triton
import triton.language as tl

from .quant_tiles import load_state_chunk

@triton.jit
def ring_program(slots_ptr, cursor_ptr, H: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                 BR: tl.constexpr):
    """Coordinates of a (value block, head, row) program of a decode / verify launch: its value rows
    o_v (mask_v), the row's slot and ring cursor, the committed records 0..cur-1 (o_r, mask_r), and
    the k-head (group) i_hk of value head i_h."""
    return ring_row(slots_ptr, cursor_ptr, tl.program_id(2), H, HK, V, BV, BR)


@triton.jit
def ring_row(slots_ptr, cursor_ptr, i_b, H: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
             BR: tl.constexpr):
    """ring_program for batch row i_b (value block program_id(0), head program_id(1))."""
    i_v = tl.program_id(0)
    i_h = tl.program_id(1)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    cur = tl.load(cursor_ptr + slot)
    o_v = i_v * BV + tl.arange(0, BV)
    o_r = tl.arange(0, BR)
    return i_v, i_h, i_b, i_h // (H // HK), slot, cur, o_v, o_v < V, o_r, o_r < cur


@triton.jit
def load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H: tl.constexpr,
                 V: tl.constexpr, R: tl.constexpr):
    """Records 0..c-1 of one head: d [BR, BV] (rows o_v), per-record weights w [BR]
    (w_j = prod_{i>j} exp(g_i)) and the total decay gamma = prod_j exp(g_j)."""
    Gr = tl.load(recg_ptr + (slot * R + o_r) * H + i_h, mask=mask_r, other=0.0)
    gtot = tl.sum(Gr, axis=0)
    w = tl.where(mask_r, tl.exp(gtot - tl.cumsum(Gr, axis=0)), 0.0)
    return stored_d(recd_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R), w, tl.exp(gtot), gtot


@triton.jit
def stored_d(recd_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H: tl.constexpr, V: tl.constexpr, R: tl.constexpr):
    """The stored d's [BR, BV] of records o_r (mask mask_r) of one head, value rows o_v, in fp32."""
    return tl.load(recd_ptr + ((slot * R + o_r[:, None]) * H + i_h) * V + o_v[None, :],
                   mask=mask_r[:, None] & mask_v[None, :], other=0.0).to(tl.float32)


@triton.jit
def replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v,
                q_row, k_row, rq, rk, reck_base, o_r, mask_r,
                REC_K_STRIDE: tl.constexpr, K: tl.constexpr, BKC: tl.constexpr, BV: tl.constexpr,
                BR: tl.constexpr, READ_COPY: tl.constexpr, NEED_K: tl.constexpr, REDUCE_ONCE: tl.constexpr,
                NUM_STAGES: tl.constexpr = None, WITH_RECORDS: tl.constexpr = True):
    """One pass over the head's state in column chunks: S0 q, S0 k ([BV]) and the record dot
    products K_r q, K_r k ([BR]) for the current token (q = q_row * rq, k = k_row * rk).
    REDUCE_ONCE: accumulate products elementwise and reduce once at the end (many warps per program),
    else reduce every chunk (one- or two-warp programs, where reductions are cheap shuffles)."""
    if REDUCE_ONCE:
        aq = tl.zeros([BV, BKC], dtype=tl.float32)
        ak = tl.zeros([BV, BKC], dtype=tl.float32)
        rqa = tl.zeros([BR, BKC], dtype=tl.float32)
        rka = tl.zeros([BR, BKC], dtype=tl.float32)
    else:
        sq = tl.zeros([BV], dtype=tl.float32)
        sk = tl.zeros([BV], dtype=tl.float32)
        kq = tl.zeros([BR], dtype=tl.float32)
        kk = tl.zeros([BR], dtype=tl.float32)
    for c in tl.range(0, K // BKC, num_stages=NUM_STAGES):  # NUM_STAGES: software-pipelined loads (None: plain loop)
        o_kc = c * BKC + tl.arange(0, BKC)
        qc = tl.load(q_row + o_kc).to(tl.float32)
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, o_kc, mask_v, K, READ_COPY)
        if WITH_RECORDS:
            Kr = tl.load(reck_base + o_r[:, None] * REC_K_STRIDE + o_kc[None, :], mask=mask_r[:, None],
                         other=0.0).to(tl.float32)
        if REDUCE_ONCE:
            aq += S0 * qc[None, :]
            if WITH_RECORDS:
                rqa += Kr * qc[None, :]
        else:
            sq += tl.sum(S0 * qc[None, :], axis=1)
            if WITH_RECORDS:
                kq += tl.sum(Kr * qc[None, :], axis=1)
        if NEED_K:
            kc = tl.load(k_row + o_kc).to(tl.float32)
            if REDUCE_ONCE:
                ak += S0 * kc[None, :]
                if WITH_RECORDS:
                    rka += Kr * kc[None, :]
            else:
                sk += tl.sum(S0 * kc[None, :], axis=1)
                if WITH_RECORDS:
                    kk += tl.sum(Kr * kc[None, :], axis=1)
    if REDUCE_ONCE:
        sq = tl.sum(aq, axis=1)
        sk = tl.sum(ak, axis=1)
        kq = tl.sum(rqa, axis=1)
        kk = tl.sum(rka, axis=1)
    return sq * rq, sk * rk, kq * rq, kk * rk


@triton.jit
def record_key_products(reck_ptr, x_row, y_row, slot, cur, i_hk, rx, ry, HK: tl.constexpr, K: tl.constexpr,
                        R: tl.constexpr, BR: tl.constexpr, NEED_Y: tl.constexpr):
    """K_r x and K_r y ([BR], rows >= cur are 0) of the committed record keys of (slot, k-head i_hk)
    with the token's vectors x = x_row * rx, y = y_row * ry: the part of a decode that every value
    head of the group and every value block shares (split decode, stage 1)."""
    o_r = tl.arange(0, BR)
    o_k = tl.arange(0, K)
    Kr = tl.load(reck_ptr + (slot * R * HK + i_hk) * K + o_r[:, None] * (HK * K) + o_k[None, :],
                 mask=(o_r < cur)[:, None], other=0.0).to(tl.float32)
    kx = tl.sum(Kr * tl.load(x_row + o_k).to(tl.float32)[None, :], axis=1) * rx
    ky = kx
    if NEED_Y:
        ky = tl.sum(Kr * tl.load(y_row + o_k).to(tl.float32)[None, :], axis=1) * ry
    return kx, ky


@triton.jit
def weighted_records(recd_base, recg_base, cnt, gtot, o_v, mask_v, REC_D_STRIDE: tl.constexpr,
                     REC_G_STRIDE: tl.constexpr, BR: tl.constexpr):
    """Records 0..cnt-1 of one head as one tile: d_j w_j [BR, BV] (rows o_v; w_j = exp(gtot - sum_{i<=j} g_i),
    the decay from record j to the last one; rows >= cnt are 0), and the record index vector and mask."""
    o_r = tl.arange(0, BR)
    mr = o_r < cnt
    Gr = tl.load(recg_base + o_r * REC_G_STRIDE, mask=mr, other=0.0)
    w = tl.where(mr, tl.exp(gtot - tl.cumsum(Gr, axis=0)), 0.0)
    Dr = tl.load(recd_base + o_r[:, None] * REC_D_STRIDE + o_v[None, :], mask=mr[:, None] & mask_v[None, :],
                 other=0.0).to(tl.float32)
    return Dr * w[:, None], o_r, mr


@triton.jit
def flush_tiles(ckpt_ptr, head_rows, o_v, mask_v, reck_base, o_r, mask_r, REC_K_STRIDE: tl.constexpr,
                K: tl.constexpr):
    """A flush row's whole checkpoint rows o_v ([BV, K], fp32) and committed keys ([BR, K]), one load each."""
    o_k = tl.arange(0, K)
    S0 = tl.load(ckpt_ptr + (head_rows + o_v)[:, None] * K + o_k[None, :], mask=mask_v[:, None],
                 other=0.0).to(tl.float32)
    Kr = tl.load(reck_base + o_r[:, None] * REC_K_STRIDE + o_k[None, :], mask=mask_r[:, None], other=0.0).to(tl.float32)
    return S0, Kr
