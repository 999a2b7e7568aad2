"""The exact fold of the delta-rule families' records: the window's d's solved again from the full-precision
checkpoint and the records' raw inputs (v, beta, k, g), so the read copy a non-flush step read never reaches the
recurrence (reference: ``core.replay_inputs``). GDN's pieces live here, KDA's (per-channel decays) in
``kda/token.py``; both write the raw inputs with these helpers.

GDN (a scalar decay per token) solves the window in its chunk form, as chunked prefill does: with G the records'
cumulative log-decays, the exact d's solve ``(I + M) d = beta (v - exp(G) S0 k)``, ``M_ij = beta_i exp(G_i - G_j)
k_i . k_j`` (j < i): per (row, head) the keys' Gram matrix and the inverse of that unit lower-triangular window x
window matrix (``gdn_window``), per value-row tile one pass over the checkpoint in column chunks (``gdn_exact_d``,
tensor-core dots), and then the linear fold of those d's (``fold.fold_store_dw``).

Used by a GDN decode's flush rows and by its commit / flush launch (``_delta_fold_kernel``, through ``fold.fold`` /
``fold.commit``)."""
from __future__ import annotations

import triton
import triton.language as tl

from .constants import FOLD_PREC
from .fold import fold_program, fold_store_dw
from .math_helpers import unit_lower_inverse
from .replay import load_records


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
def store_delta_inputs(recv_ptr, recb_ptr, slot, pos, i_h, o_v, mask_v, vv, beta, i_v, H: tl.constexpr,
                       V: tl.constexpr, R: tl.constexpr):
    """A decode token's raw value rows and (once per head) beta at ring position pos: what the exact fold
    replays (nothing where the pool keeps no raw inputs: recv_ptr None, no read copy; ReplayConfig.folds_exactly)."""
    if recv_ptr is not None:
        tl.store(recv_ptr + ((slot * R + pos) * H + i_h) * V + o_v, vv.to(recv_ptr.dtype.element_ty), mask=mask_v)
        store_delta_beta(recb_ptr, slot, pos, i_h, beta, i_v, H, R)


@triton.jit
def store_delta_beta(recb_ptr, slot, pos, i_h, beta, i_v, H: tl.constexpr, R: tl.constexpr):
    """A decode token's beta at ring position pos, once per head (value block 0); nothing where recb_ptr is None."""
    if recb_ptr is not None and i_v == 0:
        tl.store(recb_ptr + (slot * R + pos) * H + i_h, beta)


@triton.jit
def store_draft_inputs(recv_ptr, recb_ptr, Vd, beta, slot, cur, i_h, i_v, o_t, mask_t, o_v, mask_v, H: tl.constexpr,
                       V: tl.constexpr, R: tl.constexpr):
    """A verify's drafts' raw value rows Vd [BT, BV] and (once per head) betas [BT] at ring positions cur...;
    nothing where the pool keeps no raw inputs (recv_ptr None)."""
    if recv_ptr is not None:
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
                       INTERPRET: tl.constexpr, WINDOW: tl.constexpr, FROM_ACCEPTED: tl.constexpr):
    """fold._fold_kernel for GDN: records 0..count-1 of each row folded exactly into its checkpoint (+ read copy):
    their d's solved from the checkpoint and their raw inputs (gdn_window, gdn_exact_d), then the linear fold
    (fold.fold_store_dw), in BKC-column chunks, for one layer or several (fold.fold_program; S: the pool's slots).
    count 0: no-op. FROM_ACCEPTED: counts_ptr holds a commit's accepted drafts. recd_ptr is read only where the pool
    keeps no raw inputs (recv_ptr None: no read copy, the stored d's are exact and fold linearly)."""
    i_v, layer, i_h, i_hk, cnt, stream, slot = fold_program(slots_ptr, counts_ptr, cursor_ptr, folded_ptr, layer, S,
                                                            H, HK, WINDOW, FROM_ACCEPTED)
    if cnt > 0:
        head_rows = (slot * H + i_h) * V
        reck_base = reck_ptr + (slot * R * HK + i_hk) * K
        o_v = i_v * BV + tl.arange(0, BV)
        mask_v = o_v < V
        o_r = tl.arange(0, BR)
        mr = o_r < cnt
        if recv_ptr is not None:   # beside a read copy: the d's solved again from the checkpoint
            G, gtot, br, X = gdn_window(recb_ptr + slot * R * H + i_h, reck_base, recg_ptr + slot * R * H + i_h, cnt,
                                        H, HK * K, H, K, BKC, BR)
            D, _sq, _sk, _kq, _kk = gdn_exact_d(ckpt_ptr, head_rows, o_v, mask_v,
                                                recv_ptr + (slot * R * H + i_h) * V, reck_base, cnt, G, br, X,
                                                reck_ptr, reck_ptr, 1.0, 1.0, H * V, HK * K, K, BKC, BV, BR, False)
            Dw = D * tl.where(mr, tl.exp(gtot - G), 0.0)[:, None]
        else:   # no read copy: the stored d's came from the checkpoint itself
            D, w, _gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mr, o_v, mask_v, H, V, R)
            Dw = D * w[:, None]
        fold_store_dw(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, reck_base, Dw, o_r, mr,
                      gtot, 1.0, tl.zeros([BV], dtype=tl.float32), reck_ptr, 1.0, seed, stream,
                      (layer * H + i_h).to(tl.int64) * (V * K), HK * K, K, BKC, BV, READ_COPY, CKPT_SR, SHARED_QUANT,
                      False, INTERPRET)
