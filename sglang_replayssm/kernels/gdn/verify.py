"""GDN output-only verify of T drafts (chain or tree): the fma, mma (tensor-core) and split kernels."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...device_info import sm_count
from ..checks import cdiv, check, check_slots, check_tensor, launch_stages, next_pow2, output_tensor, token_inputs
from ..drafts import (delta_solve, draft_chunk, draft_inv_norms, draft_structure, gram_update, stacked_draft_pass,
                      stacked_halves, store_draft_d)
from ..delta_fold import store_draft_inputs
from ..layer_views import layer_views
from ..quant_tiles import load_state_chunk
from ..replay import load_records, ring_program
from ..constants import DOT_PREC
from ..tuning import check_tuning, verify_block_k, verify_plan
from .token import _check_inputs, _gdn_gate, L2_EPS


@triton.jit
def _gdn_drafts_finish(SQ, SK, QK, KK, rk, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr, k_ptr,
                       recd_ptr, recg_ptr, recv_ptr, recb_ptr, reck_base, qk_rows, tok, slot, cur, i_b, i_h, i_v, o_t, mask_t, o_v,
                       mask_v, H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr,
                       HAS_PARENTS: tl.constexpr, V_ROW: tl.constexpr):
    """The drafts' part of a GDN verify, given Sc q_t (SQ), Sc k_t (SK) [BT, BV] of the committed
    state Sc and the drafts' Gram products q_t.k_i (QK), k_t.k_i (KK): gates, the path decays,
    the within-draft delta rule by forward substitution (topological order), the outputs and the T
    draft records (d, the raw v and beta, g, and the normalised k = k_row * rk) at ring positions cursor.."""
    Vd = tl.load(v_ptr + tok[:, None] * V_ROW + i_h * V + o_v[None, :],
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
    store_draft_inputs(recv_ptr, recb_ptr, Vd, beta, slot, cur, i_h, i_v, o_t, mask_t, o_v, mask_v, H, V, R)
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
                       recd_ptr, reck_ptr, recg_ptr, recv_ptr, recb_ptr, scale,
                       H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                       BKC: tl.constexpr, BR: tl.constexpr, READ_COPY: tl.constexpr,
                       HAS_PARENTS: tl.constexpr, EPS: tl.constexpr, QK_ROW: tl.constexpr, V_ROW: tl.constexpr):
    """Output-only verify of T drafts (chain or tree): O = exp(G) Sc Q + (E * QK^T) Dd, with the
    draft d's from the within-draft delta-rule solve; writes the T draft records at cursor..
    All products are exact fp32 elementwise/broadcast sums over column chunks (T is small:
    padding it to a tensor-core tile would waste most of the work)."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    o_t = tl.arange(0, BT)
    mask_t = o_t < T
    tok = i_b * T + o_t
    qk_rows = tok * QK_ROW + i_hk * K
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
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc, mask_v, K, READ_COPY)
        Kr = tl.load(reck_base + o_r[:, None] * (HK * K) + o_kc[None, :], mask=mask_r[:, None], other=0.0).to(tl.float32)
        aq += S0[None, :, :] * Qc[:, None, :]
        ak += S0[None, :, :] * Kc[:, None, :]
        KrQ, KrK, QK, KK = gram_update(KrQ, KrK, QK, KK, Kr, Qc, Kc)
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    SQ = gam * tl.sum(aq, axis=2) + tl.sum((KrQ * w[:, None])[:, :, None] * Dr[:, None, :], axis=0)  # Sc q_t [BT, BV]
    SK = gam * tl.sum(ak, axis=2) + tl.sum((KrK * w[:, None])[:, :, None] * Dr[:, None, :], axis=0)  # Sc k_t
    _gdn_drafts_finish(SQ, SK, QK, KK, rk, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr, k_ptr,
                       recd_ptr, recg_ptr, recv_ptr, recb_ptr, reck_base, qk_rows, tok, slot, cur, i_b, i_h, i_v,
                       o_t, mask_t, o_v, mask_v, H, HK, K, V, R, T, BT, BV, BKC, HAS_PARENTS, V_ROW)


@triton.jit
def _gdn_verify_mma_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr,
                           slots_ptr, cursor_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr,
                           recd_ptr, reck_ptr, recg_ptr, recv_ptr, recb_ptr, scale,
                           H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                           BKC: tl.constexpr, BR: tl.constexpr, READ_COPY: tl.constexpr,
                           HAS_PARENTS: tl.constexpr, EPS: tl.constexpr, DOT_PRECISION: tl.constexpr,
                           QK_ROW: tl.constexpr, V_ROW: tl.constexpr):
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
                                                BV, BKC, BR, READ_COPY, DOT_PRECISION, True, QK_ROW)
    rx = tl.where(is_q, scale, 1.0) / tl.sqrt(nx + EPS)
    S0X = S0X * rx[:, None]
    KrX = KrX * rx[None, :]
    XX = XX * rx[:, None] * rx[None, :]
    # Sc x for the stacked rows: gamma S0 x + (w K_r x)^T D_r, the record sum one more dot
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    SX = gam * S0X + tl.dot(tl.trans(KrX * w[:, None]), Dr, input_precision=DOT_PRECISION)
    SQ, SK, QK, KK = stacked_halves(SX, XX, BT, BV)
    _rq, rk = tl.split(tl.permute(tl.reshape(rx, [2, BT]), (1, 0)))
    _gdn_drafts_finish(SQ, SK, QK, KK, rk, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr, k_ptr,
                       recd_ptr, recg_ptr, recv_ptr, recb_ptr, reck_base, tok * QK_ROW + i_hk * K, tok, slot, cur,
                       i_b, i_h, i_v, o_t,
                       mask_t, o_v, mask_v, H, HK, K, V, R, T, BT, BV, BKC, HAS_PARENTS, V_ROW)


@triton.jit
def _gdn_draft_gram_kernel(q_ptr, k_ptr, slots_ptr, cursor_ptr, reck_ptr, gram_ptr, scale,
                           HK: tl.constexpr, K: tl.constexpr, R: tl.constexpr, T: tl.constexpr,
                           BT: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr, EPS: tl.constexpr,
                           QK_ROW: tl.constexpr):
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
    qk_rows = (i_b * T + o_t) * QK_ROW + i_hk * K
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
                             recd_ptr, reck_ptr, recg_ptr, recv_ptr, recb_ptr, gram_ptr,
                             H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                             R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                             BKC: tl.constexpr, BR: tl.constexpr, READ_COPY: tl.constexpr,
                             HAS_PARENTS: tl.constexpr, QK_ROW: tl.constexpr, V_ROW: tl.constexpr):
    """Split verify, stage 2: the same result as _gdn_verify_kernel, whose state pass here only
    accumulates S0 q_t and S0 k_t elementwise (no reduction inside the loop); the record and draft
    products come from stage 1 (gram_ptr)."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    o_t = tl.arange(0, BT)
    mask_t = o_t < T
    tok = i_b * T + o_t
    qk_rows = tok * QK_ROW + i_hk * K
    g = gram_ptr + (i_b * HK + i_hk) * (2 * BR * BT + 2 * BT * BT + 2 * BT)
    rq = tl.load(g + 2 * BR * BT + 2 * BT * BT + o_t)
    rk = tl.load(g + 2 * BR * BT + 2 * BT * BT + BT + o_t)
    head_rows = (slot * H + i_h) * V
    aq = tl.zeros([BT, BV, BKC], dtype=tl.float32)
    ak = tl.zeros([BT, BV, BKC], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        Qc, Kc = draft_chunk(q_ptr, k_ptr, qk_rows, o_kc, mask_t, rq, rk)
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc, mask_v, K, READ_COPY)
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
                       recd_ptr, recg_ptr, recv_ptr, recb_ptr, reck_ptr + (slot * R * HK + i_hk) * K, qk_rows, tok,
                       slot, cur, i_b,
                       i_h, i_v, o_t, mask_t, o_v, mask_v, H, HK, K, V, R, T, BT, BV, BKC, HAS_PARENTS, V_ROW)


def verify(pool, layer, slots, q, k, v, a, b, A_log, dt_bias, scale=None, parents=None, *, out=None, method=None,
           tuning=None):
    """Output-only verify of T draft tokens per row (q [B, T, Hk, Dk], ...; parents [B, T] int32
    or None for a chain). Writes the draft records at cursor..cursor+T-1 (no state write);
    returns out [B, T, H, Dv]. Commit with pool.accept_drafts (which folds and moves the pointers through its
    ops.commit).
    method: "fma" (exact fp32 broadcast products), "mma" (the state products as 3xTF32 tensor-core
    dots), "split" (draft/record products once per (row, k-head) first) or None: "mma" (the fastest at
    every T = 1..8 on the H200). tuning: a KernelTuning (block_v, block_k, num_warps; default blocks:
    tuning.VERIFY_TUNED, mma: one warp per 64 value rows; stages: the mma launch's software pipelining
    of the column loop, checks.launch_stages) and dot_precision (the mma launch's, None: DOT_PREC)."""
    tuning = check_tuning(tuning)
    lv = layer_views(pool, layer)
    B = check_slots(slots, lv.device, lv.num_slots)
    H, Hk, Dv, Dk = lv.H, lv.Hk, lv.Dv, lv.Dk
    check(q.dim() == 4, f"q must be [B, T, Hk, Dk] for verify, got shape {tuple(q.shape)}")
    T = int(q.shape[1])
    check(T >= 1, "verify needs at least one draft token (T >= 1)")
    check(lv.window - 1 + T <= lv.R, f"T={T} drafts do not fit the ring (capacity {lv.R}, window {lv.window})")
    _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, lv.device, T=T)
    q, k, v, qk_row, v_row = token_inputs(q, k, v, lead=2)
    if parents is not None:
        check_tensor("parents", parents, shape=(B, T), dtype=torch.int32, device=lv.device)
    scale = Dk ** -0.5 if scale is None else float(scale)
    out = output_tensor(out, (B, T, H, Dv), v, lv.device)
    if B == 0:
        return out
    method, BV, num_warps = verify_plan("gdn", method, tuning)
    nst = launch_stages(tuning.stages)
    grid = (cdiv(Dv, BV), H, B)
    BKC = verify_block_k("gdn", method, grid[0] * H * B, Dk, sm_count(lv.device), tuning)
    BR = max(16, next_pow2(lv.window))
    rc, rs, rgs = lv.rc_args()
    # the drafts' inputs, the output, the rows and the layer's state (the same for every method)
    args = dict(q_ptr=q, k_ptr=k, v_ptr=v, a_ptr=a, b_ptr=b, alog_ptr=A_log, dtb_ptr=dt_bias,
                par_ptr=parents if parents is not None else slots, out_ptr=out, slots_ptr=slots, cursor_ptr=lv.cursor,
                ckpt_ptr=lv.ckpt, rc_ptr=rc, rs_ptr=rs, rgs_ptr=rgs, recd_ptr=lv.rec_d, reck_ptr=lv.rec_k,
                recg_ptr=lv.rec_g, recv_ptr=lv.rec_v, recb_ptr=lv.rec_beta,
                H=H, HK=Hk, K=Dk, V=Dv, R=lv.R, T=T, BV=BV, BKC=BKC, BR=BR, READ_COPY=lv.rc_mode,
                HAS_PARENTS=parents is not None, QK_ROW=qk_row, V_ROW=v_row, num_warps=num_warps)
    if method == "split":  # record/draft products once per (row, k-head), then the state pass
        BT = next_pow2(T)
        gram = torch.empty((B, Hk, 2 * BR * BT + 2 * BT * BT + 2 * BT), dtype=torch.float32, device=lv.device)
        _gdn_draft_gram_kernel[(Hk, B)](q_ptr=q, k_ptr=k, slots_ptr=slots, cursor_ptr=lv.cursor, reck_ptr=lv.rec_k,
                                         gram_ptr=gram, scale=scale, HK=Hk, K=Dk, R=lv.R, T=T, BT=BT, BKC=BKC, BR=BR,
                                         EPS=L2_EPS, QK_ROW=qk_row, num_warps=4)
        _gdn_verify_split_kernel[grid](**args, gram_ptr=gram, BT=BT)
    elif method == "mma":  # tensor-core variant (3xTF32 on the GPU)
        _gdn_verify_mma_kernel[grid](**args, scale=scale, BT=max(8, next_pow2(T)), EPS=L2_EPS,
                                     DOT_PRECISION=tuning.dot_precision or DOT_PREC, **nst)
    else:
        _gdn_verify_kernel[grid](**args, scale=scale, BT=next_pow2(T), EPS=L2_EPS)
    return out
