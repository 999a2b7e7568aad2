"""KDA output-only verify of T drafts (chain or tree): the fma and mma (tensor-core) kernels."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import (cdiv, check, check_block_k, check_slots, check_tensor, chunk_k, launch_stages, next_pow2,
                      output_tensor, token_inputs)
from ..drafts import delta_solve, draft_chunk, draft_inv_norms, draft_structure, store_draft_d
from ..delta_fold import store_draft_inputs
from ..layer_views import layer_views
from ..math_helpers import softplus
from ..quant_tiles import load_state_chunk
from ..replay import ring_program
from ..constants import DOT_PREC
from ..tuning import check_tuning, verify_plan
from .token import _check_inputs, _kda_chunk, L2_EPS


@triton.jit
def _kda_drafts_setup(q_ptr, k_ptr, alog_ptr, par_ptr, scale, i_b, i_h, i_hk, HK: tl.constexpr, K: tl.constexpr,
                      T: tl.constexpr, BT: tl.constexpr, BKC: tl.constexpr, HAS_PARENTS: tl.constexpr,
                      EPS: tl.constexpr, QK_ROW: tl.constexpr):
    """What both KDA verify kernels start from: the drafts' index vector o_t, mask and token rows, the
    q/k row offsets, A_log of head i_h, the q/k normalisers, and the draft tree's ancestor-or-self and
    strict-ancestor masks [t, i, 1]."""
    o_t = tl.arange(0, BT)
    mask_t = o_t < T
    tok = i_b * T + o_t
    qk_rows = tok * QK_ROW + i_hk * K
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
                       recg_ptr, recv_ptr, recb_ptr, reck_base, qk_rows, tok, slot, cur, i_h, i_v, o_t, mask_t, o_v, mask_v,
                       H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr,
                       T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, V_ROW: tl.constexpr):
    """The drafts' part of a KDA verify, given S'_t q_t (SQ) and S'_t k_t (SK) [BT, BV] of the
    committed state and the draft products PQ, PK (_kda_draft_terms): the within-draft delta rule by
    forward substitution, the outputs and the T draft records (d, the raw v and beta, g, normalised k) at
    cursor.."""
    Vd = tl.load(v_ptr + tok[:, None] * V_ROW + i_h * V + o_v[None, :],
                 mask=mask_t[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    beta = tl.sigmoid(tl.load(b_ptr + tok * H + i_h, mask=mask_t, other=0.0).to(tl.float32))
    Dd = delta_solve(PK, Vd - SK, beta, o_t, T, BT, BV)
    O = SQ + tl.sum(PQ[:, :, None] * Dd[None, :, :], axis=1)
    tl.store(out_ptr + (tok[:, None] * H + i_h) * V + o_v[None, :], O.to(out_ptr.dtype.element_ty),
             mask=mask_t[:, None] & mask_v[None, :])
    pos, mpos = store_draft_d(recd_ptr, Dd, slot, cur, i_h, o_t, mask_t, o_v, mask_v, H, V, R)
    store_draft_inputs(recv_ptr, recb_ptr, Vd, beta, slot, cur, i_h, i_v, o_t, mask_t, o_v, mask_v, H, V, R)
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
                       recd_ptr, reck_ptr, recg_ptr, recv_ptr, recb_ptr, scale,
                       H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                       BKC: tl.constexpr, BR: tl.constexpr, READ_COPY: tl.constexpr,
                       HAS_PARENTS: tl.constexpr, EPS: tl.constexpr, QK_ROW: tl.constexpr, V_ROW: tl.constexpr):
    """Output-only verify of T KDA drafts (chain or tree). Per key channel c, with G the committed
    records' cumulative log-decay and L_t the drafts' along the path to t:
    S'_t x = S0 (exp(G + L_t) x) + sum_j d_j (k_j exp(G - G_j + L_t)) . x
             + sum_{i strict ancestor of t} d_i (k_i exp(L_t - L_i)) . x,
    d_t = beta_t (v_t - S'_t k_t) (forward substitution), o_t = S'_t q_t + d_t (k_t . q_t).
    Exact fp32 broadcast products."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    o_t, mask_t, tok, qk_rows, alog, rq, rk, anc3, strict3 = _kda_drafts_setup(
        q_ptr, k_ptr, alog_ptr, par_ptr, scale, i_b, i_h, i_hk, HK, K, T, BT, BKC, HAS_PARENTS, EPS, QK_ROW)
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
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc, mask_v, K, READ_COPY)
        aq += S0[None, :, :] * (qL * egt[None, :])[:, None, :]
        ak += S0[None, :, :] * (kL * egt[None, :])[:, None, :]
        KrQ += tl.sum(Kr[:, None, :] * qL[None, :, :], axis=2)
        KrK += tl.sum(Kr[:, None, :] * kL[None, :, :], axis=2)
    Dr = tl.load(recd_ptr + ((slot * R + o_r[:, None]) * H + i_h) * V + o_v[None, :],
                 mask=mask_r[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    SQ = tl.sum(aq, axis=2) + tl.sum(KrQ[:, :, None] * Dr[:, None, :], axis=0)
    SK = tl.sum(ak, axis=2) + tl.sum(KrK[:, :, None] * Dr[:, None, :], axis=0)
    _kda_drafts_finish(SQ, SK, PQ, PK, rk, alog, v_ptr, a_ptr, b_ptr, dtb_ptr, out_ptr, k_ptr, recd_ptr, reck_ptr,
                       recg_ptr, recv_ptr, recb_ptr, reck_base, qk_rows, tok, slot, cur, i_h, i_v, o_t, mask_t, o_v, mask_v,
                       H, HK, K, V, R, T, BT, BV, BKC, V_ROW)


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
def _kda_verify_mma_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, par_ptr, out_ptr, slots_ptr,
                           cursor_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr, recv_ptr,
                           recb_ptr, scale,
                           H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr,
                           T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr,
                           READ_COPY: tl.constexpr, HAS_PARENTS: tl.constexpr, EPS: tl.constexpr,
                           DOT_PRECISION: tl.constexpr, X_ROWS: tl.constexpr, QK_ROW: tl.constexpr,
                           V_ROW: tl.constexpr):
    """The same verify as _kda_verify_kernel, with the state-sized products on tensor cores: per
    column chunk the drafts' q_t exp(L_t) (rows 0..BT-1) and k_t exp(L_t) (rows BT..2BT-1) are
    stacked into one operand X (zero rows up to X_ROWS = max(16, 2 BT), a dot's least), and
    (S0 Diag(exp G)) X^T [BV, X_ROWS] and (K_r W) X^T [BR, X_ROWS] are one dot each, sharing the X^T operand
    (3xTF32 default); the records' share D_r^T (K_r W X^T) one dot more after the loop. The draft
    x draft products keep their per-channel decays (broadcast sums, _kda_draft_terms) and stay at
    the drafts' own size BT = next_pow2(T)."""
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    o_t, mask_t, tok, qk_rows, alog, rq, rk, anc3, strict3 = _kda_drafts_setup(
        q_ptr, k_ptr, alog_ptr, par_ptr, scale, i_b, i_h, i_hk, HK, K, T, BT, BKC, HAS_PARENTS, EPS, QK_ROW)
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * HK + i_hk) * K
    S0X = tl.zeros([BV, X_ROWS], dtype=tl.float32)
    KrX = tl.zeros([BR, X_ROWS], dtype=tl.float32)
    PQ = tl.zeros([BT, BT], dtype=tl.float32)
    PK = tl.zeros([BT, BT], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        qL, kL, Kr, egt, PQ, PK = _kda_draft_terms(q_ptr, k_ptr, a_ptr, dtb_ptr, recg_ptr, reck_base, qk_rows, tok,
                                                   o_kc, mask_t, rq, rk, alog, anc3, strict3, slot, i_h, o_r,
                                                   mask_r, PQ, PK, H, HK, K, R)
        X = tl.reshape(tl.permute(tl.join(qL, kL), (2, 0, 1)), [2 * BT, BKC])   # rows: qL, then kL
        XT = tl.trans(_pad_rows(X, 2 * BT, X_ROWS, BKC))
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc, mask_v, K, READ_COPY)
        S0X += tl.dot(S0 * egt[None, :], XT, input_precision=DOT_PRECISION)
        KrX += tl.dot(Kr, XT, input_precision=DOT_PRECISION)
    Dr = tl.load(recd_ptr + ((slot * R + o_r[:, None]) * H + i_h) * V + o_v[None, :],
                 mask=mask_r[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    SX = S0X + tl.dot(tl.trans(Dr), KrX, input_precision=DOT_PRECISION)          # columns: S'_t q_t, S'_t k_t, 0..
    SX = _unpad_rows(tl.trans(SX), 2 * BT, X_ROWS, BV)                      # [2BT, BV]
    SQ, SK = tl.split(tl.permute(tl.reshape(SX, [2, BT, BV]), (1, 2, 0)))
    _kda_drafts_finish(SQ, SK, PQ, PK, rk, alog, v_ptr, a_ptr, b_ptr, dtb_ptr, out_ptr, k_ptr, recd_ptr, reck_ptr,
                       recg_ptr, recv_ptr, recb_ptr, reck_base, qk_rows, tok, slot, cur, i_h, i_v, o_t, mask_t, o_v, mask_v,
                       H, HK, K, V, R, T, BT, BV, BKC, V_ROW)


def verify(pool, layer, slots, q, k, v, a, b, A_log, dt_bias, scale=None, parents=None, *, out=None, method=None,
           tuning=None):
    """Output-only verify of T KDA draft tokens per row (q/k [B, T, Hk, Dk], v [B, T, H, Dv],
    a [B, T, H, Dk], b [B, T, H]; parents [B, T] int32 or None for a chain). Writes the draft records
    at cursor..cursor+T-1 (no state write); returns out [B, T, H, Dv]. Commit: pool.accept_drafts (its ops.commit).
    method: "fma" (exact fp32 broadcast products), "mma" (the state-sized products as 3xTF32
    tensor-core dots; the draft x draft products stay broadcast sums) or None ("mma": 5-8x faster at T = 4..8
    on the H200). tuning: a KernelTuning (default blocks: tuning.VERIFY_TUNED; stages: the mma launch's
    software pipelining of the column loop, checks.launch_stages; dot_precision: the mma launch's)."""
    tuning = check_tuning(tuning)
    if getattr(pool.cfg, "mode", "replay") != "replay":
        raise ValueError("verify kernels need a pool in mode='replay' (conventional verify keeps snapshots)")
    lv = layer_views(pool, layer)
    B = check_slots(slots, lv.device, lv.num_slots)
    H, Hk, Dv, Dk = lv.H, lv.Hk, lv.Dv, lv.Dk
    check(q.dim() == 4, f"q must be [B, T, Hk, Dk] for verify, got shape {tuple(q.shape)}")
    T = int(q.shape[1])
    check(1 <= T and lv.window - 1 + T <= lv.R,
          f"T={T} drafts do not fit the ring (capacity {lv.R}, window {lv.window})")
    _check_inputs(B, H, Hk, Dv, Dk, q, k, v, a, b, A_log, dt_bias, lv.device, T=T)
    q, k, v, qk_row, v_row = token_inputs(q, k, v, lead=2)
    if parents is not None:
        check_tensor("parents", parents, shape=(B, T), dtype=torch.int32, device=lv.device)
    method, BV, num_warps = verify_plan("kda", method, tuning)
    nst = launch_stages(tuning.stages)
    scale = Dk ** -0.5 if scale is None else float(scale)
    out = output_tensor(out, (B, T, H, Dv), v, lv.device)
    if B == 0:
        return out
    rc, rs, rgs = lv.rc_args()
    kern, extra = _kda_verify_kernel, {}
    if method == "mma":  # tensor-core variant (3xTF32 on the GPU); X_ROWS: the stacked q/k operand's rows, >= 16
        kern, extra = _kda_verify_mma_kernel, dict(DOT_PRECISION=tuning.dot_precision or DOT_PREC,
                                                   X_ROWS=max(16, 2 * next_pow2(T)), **nst)
    kern[(cdiv(Dv, BV), H, B)](
        # the drafts' inputs and the output
        q_ptr=q, k_ptr=k, v_ptr=v, a_ptr=a, b_ptr=b, alog_ptr=A_log, dtb_ptr=dt_bias,
        par_ptr=parents if parents is not None else slots, out_ptr=out,
        # the rows and the layer's state
        slots_ptr=slots, cursor_ptr=lv.cursor, ckpt_ptr=lv.ckpt, rc_ptr=rc, rs_ptr=rs, rgs_ptr=rgs,
        recd_ptr=lv.rec_d, reck_ptr=lv.rec_k, recg_ptr=lv.rec_g, recv_ptr=lv.rec_v, recb_ptr=lv.rec_beta, scale=scale,
        H=H, HK=Hk, K=Dk, V=Dv, R=lv.R, T=T, BT=next_pow2(T), BV=BV,
        BKC=check_block_k(tuning.block_k, Dk) or chunk_k(Dk, 16), BR=max(16, next_pow2(lv.window)),
        READ_COPY=lv.rc_mode, HAS_PARENTS=parents is not None, EPS=L2_EPS, QK_ROW=qk_row, V_ROW=v_row,
        num_warps=num_warps, **extra)
    return out
