"""Draft-tree helpers of the verify kernels: ancestor masks and path decays, norms, the within-draft
delta-rule solve, the draft records, the Gram products and the stacked tensor-core state pass."""
from __future__ import annotations

import triton
import triton.language as tl

from .math_helpers import row_select
from .quant_tiles import load_state_chunk

@triton.jit
def draft_structure(par_ptr, G, T: tl.constexpr, BT: tl.constexpr, HAS_PARENTS: tl.constexpr):
    """Ancestor-or-self mask ANC [BT, BT] (ANC[t, i] = 1 iff i is on the path root..t) and the
    cumulative log-decay LG [BT] (sum of g over that path) of a chain (HAS_PARENTS False) or a
    tree given by parents (par_ptr: this row's T parents, -1 = hangs off the committed state)."""
    rows = tl.arange(0, BT)
    ANC = tl.zeros([BT, BT], dtype=tl.float32)
    LG = tl.zeros([BT], dtype=tl.float32)
    for t in tl.static_range(T):
        if HAS_PARENTS:
            p = tl.load(par_ptr + t)
        else:
            p = t - 1
        prow = tl.where(p >= 0, row_select(ANC, p, rows), 0.0)
        plg = tl.where(p >= 0, tl.sum(tl.where(rows == p, LG, 0.0), axis=0), 0.0)
        gt = tl.sum(tl.where(rows == t, G, 0.0), axis=0)
        ANC = tl.where(rows[:, None] == t, prow[None, :] + (rows[None, :] == t).to(tl.float32), ANC)
        LG = tl.where(rows == t, plg + gt, LG)
    return ANC, LG


@triton.jit
def draft_inv_norms(q_ptr, k_ptr, qk_rows, mask_t, scale, K: tl.constexpr, BKC: tl.constexpr, BT: tl.constexpr,
                    EPS: tl.constexpr):
    """scale / ||q_t|| and 1 / ||k_t|| ([BT]) of the drafts' q and k rows at offsets qk_rows."""
    nq = tl.zeros([BT], dtype=tl.float32)
    nk = tl.zeros([BT], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        Qc = tl.load(q_ptr + qk_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
        Kc = tl.load(k_ptr + qk_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
        nq += tl.sum(Qc * Qc, axis=1)
        nk += tl.sum(Kc * Kc, axis=1)
    return scale / tl.sqrt(nq + EPS), 1.0 / tl.sqrt(nk + EPS)


@triton.jit
def delta_solve(M, RHS, beta, o_t, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr):
    """The drafts' delta-rule values D [BT, BV]: d_t = beta_t (RHS_t - sum_i M[t, i] d_i), by forward
    substitution in draft order (a topological order of chains and trees; M is zero off the path)."""
    Dd = tl.zeros([BT, BV], dtype=tl.float32)
    for t in tl.static_range(T):
        corr = tl.sum(row_select(M, t, o_t)[:, None] * Dd, axis=0)
        bt = tl.sum(tl.where(o_t == t, beta, 0.0), axis=0)
        dt = bt * (row_select(RHS, t, o_t) - corr)
        Dd = tl.where(o_t[:, None] == t, dt[None, :], Dd)
    return Dd


@triton.jit
def store_draft_d(recd_ptr, Dd, slot, cur, i_h, o_t, mask_t, o_v, mask_v, H: tl.constexpr, V: tl.constexpr,
                  R: tl.constexpr):
    """Write the drafts' d records at ring positions cur..; returns (positions, their mask)."""
    pos = cur + o_t
    mpos = mask_t & (pos < R)
    tl.store(recd_ptr + ((slot * R + pos[:, None]) * H + i_h) * V + o_v[None, :],
             Dd.to(recd_ptr.dtype.element_ty), mask=mpos[:, None] & mask_v[None, :])
    return pos, mpos


@triton.jit
def draft_chunk(q_ptr, k_ptr, qk_rows, o_kc, mask_t, rq, rk):
    """Columns o_kc of the drafts' normalised q and k ([BT, BKC] each)."""
    Qc = tl.load(q_ptr + qk_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
    Kc = tl.load(k_ptr + qk_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
    return Qc * rq[:, None], Kc * rk[:, None]


@triton.jit
def gram_update(KrQ, KrK, QK, KK, Kr, Qc, Kc):
    """Add one column chunk's share of K_r q_t, K_r k_t ([BR, BT]) and q_t.k_i, k_t.k_i ([BT, BT])."""
    KrQ += tl.sum(Kr[:, None, :] * Qc[None, :, :], axis=2)
    KrK += tl.sum(Kr[:, None, :] * Kc[None, :, :], axis=2)
    QK += tl.sum(Qc[:, None, :] * Kc[None, :, :], axis=2)
    KK += tl.sum(Kc[:, None, :] * Kc[None, :, :], axis=2)
    return KrQ, KrK, QK, KK


@triton.jit
def stacked_draft_pass(a_ptr, b_ptr, i_b, i_g, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v,
                       reck_base, o_r, mask_r, G: tl.constexpr, K: tl.constexpr, T: tl.constexpr, BT: tl.constexpr,
                       BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr, READ_COPY: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, NORMS: tl.constexpr, ROW: tl.constexpr):
    """The state pass of a tensor-core verify (GDN: q, k; Mamba-2: C, B): the drafts' rows of a (rows
    0..BT-1) and of b (rows BT..2BT-1), [T, G, K] per batch row i_b, taken for group i_g, stacked into one
    operand X (BT >= 8: >= 16 rows, a dot's least); per column chunk S0 X^T [2BT, BV], K_r X^T [BR, 2BT]
    and X X^T [2BT, 2BT] are one dot each. NORMS: also the rows' squared norms [2BT] (else zeros).
    ROW: the element stride between the tokens' rows of a and b. Returns (S0X, KrX, XX, norms, the a rows' mask)."""
    o_x = tl.arange(0, 2 * BT)
    is_a = o_x < BT
    t_x = tl.where(is_a, o_x, o_x - BT)
    mask_x = t_x < T
    x_rows = (i_b * T + t_x) * ROW + i_g * K
    x_base = tl.where(is_a, a_ptr + x_rows, b_ptr + x_rows)
    nx = tl.zeros([2 * BT], dtype=tl.float32)
    S0X = tl.zeros([2 * BT, BV], dtype=tl.float32)
    KrX = tl.zeros([BR, 2 * BT], dtype=tl.float32)
    XX = tl.zeros([2 * BT, 2 * BT], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        Xc = tl.load(x_base[:, None] + o_kc[None, :], mask=mask_x[:, None], other=0.0).to(tl.float32)
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, o_kc, mask_v, K, READ_COPY)
        Kr = tl.load(reck_base + o_r[:, None] * (G * K) + o_kc[None, :], mask=mask_r[:, None], other=0.0).to(tl.float32)
        if NORMS:
            nx += tl.sum(Xc * Xc, axis=1)
        S0X += tl.dot(Xc, tl.trans(S0), input_precision=DOT_PRECISION)
        KrX += tl.dot(Kr, tl.trans(Xc), input_precision=DOT_PRECISION)
        XX += tl.dot(Xc, tl.trans(Xc), input_precision=DOT_PRECISION)
    return S0X, KrX, XX, nx, is_a


@triton.jit
def stacked_halves(SX, XX, BT: tl.constexpr, BV: tl.constexpr):
    """Split stacked_draft_pass's products: SX [2BT, BV] into its a rows and its b rows [BT, BV]; X X^T
    into the blocks AB[t, i] = a_t . b_i and BB[t, i] = b_t . b_i [BT, BT]. Returns (SA, SB, AB, BB)."""
    SA, SB = tl.split(tl.permute(tl.reshape(SX, [2, BT, BV]), (1, 2, 0)))
    XXa, XXb = tl.split(tl.permute(tl.reshape(XX, [2, BT, 2 * BT]), (1, 2, 0)))
    _aa, AB = tl.split(tl.permute(tl.reshape(XXa, [BT, 2, BT]), (0, 2, 1)))
    _ba, BB = tl.split(tl.permute(tl.reshape(XXb, [BT, 2, BT]), (0, 2, 1)))
    return SA, SB, AB, BB
