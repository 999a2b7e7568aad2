"""Mamba-2 ReplaySSM kernels: decode (non-flush + flush rows in one launch), output-only verify,
commit fold, and the conventional decode baseline (SGLang's selective_state_update math).

Per head h (group h // (H // G)): dt = softplus(dt_raw + dt_bias), a = exp(dt A), u = dt x,
S_t = a S + u B^T, y = S_t C + D x, then y *= silu(z) when z is given. Record = (u, B, dt A).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import (cdiv, check, check_block_k, check_block_v, check_flush_block_k, check_rows, check_slots,
                     check_stages, check_tensor, chunk_k, launch_stages, next_pow2, output_tensor, token_rows)
from .constants import DOT_PREC, INTERPRET, RC_NVFP4
from .drafts import draft_structure, stacked_draft_pass, stacked_halves
from .fold import _fold_kernel, commit as commit_records, fold as fold_records, fold_store, fold_tile_store
from .layer_views import layer_views
from .math_helpers import softplus
from .quant_tiles import load_state_chunk, state_tile
from .replay import flush_tiles, load_records, record_key_products, replay_pass, ring_program, ring_row
from .split_decode import decode_launch_rows, flush_rows, join_stream, on_stream
from .tuning import check_tuning, decode_plan, default_warps, KernelTuning, PREP_WARPS, verify_plan


@triton.jit
def _m2_token(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, i_b, i_h, i_g, o_k, mask_k,
              o_v, mask_v, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, X_ROW: tl.constexpr,
              BC_ROW: tl.constexpr, DT_ROW: tl.constexpr):
    xv = tl.load(x_ptr + i_b * X_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    Bv = tl.load(B_ptr + i_b * BC_ROW + i_g * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
    Cv = tl.load(C_ptr + i_b * BC_ROW + i_g * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
    dt = softplus(tl.load(dt_ptr + i_b * DT_ROW + i_h).to(tl.float32) + tl.load(dtb_ptr + i_h).to(tl.float32))
    g = dt * tl.load(A_ptr + i_h).to(tl.float32)
    Dh = tl.load(D_ptr + i_h).to(tl.float32)
    return xv, Bv, Cv, dt * xv, g, Dh


@triton.jit
def _m2_finish(y, xv, Dh, z_ptr, i_b, i_h, o_v, mask_v, H: tl.constexpr, V: tl.constexpr,
               HAS_Z: tl.constexpr, Z_ROW: tl.constexpr):
    y = y + Dh * xv
    if HAS_Z:
        zv = tl.load(z_ptr + i_b * Z_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
        y = y * zv * tl.sigmoid(zv)
    return y


@triton.jit
def _m2_out(sc0, kcr, a, gam, Dr, w, u, bc, xv, D_ptr, z_ptr, i_b, i_h, o_v, mask_v, H: tl.constexpr,
            V: tl.constexpr, HAS_Z: tl.constexpr, Z_ROW: tl.constexpr):
    """y = S_t C + D x (z-gated) from the checkpoint's S0 C ([BV]) and the committed keys' K_r C ([BR]),
    with S_t = a (gamma S0 + sum_j w_j u_j B_j^T) + u B^T."""
    y = a * (gam * sc0 + tl.sum(Dr * (w * kcr)[:, None], axis=0)) + u * bc
    y = y + tl.load(D_ptr + i_h).to(tl.float32) * xv
    if HAS_Z:
        zv = tl.load(z_ptr + i_b * Z_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
        y = y * zv * tl.sigmoid(zv)
    return y


@triton.jit
def _m2_decode_row(i_b, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, slots_ptr, cursor_ptr,
                   folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr, seed, layer,
                   H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr,
                   WINDOW: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr,
                   READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr, HAS_Z: tl.constexpr,
                   INTERPRET: tl.constexpr, REDUCE_ONCE: tl.constexpr, FLUSH_BLOCK_K: tl.constexpr,
                   NUM_STAGES: tl.constexpr, FOLD_DOT: tl.constexpr, X_ROW: tl.constexpr, BC_ROW: tl.constexpr, Z_ROW: tl.constexpr, DT_ROW: tl.constexpr):
    """The body of _m2_decode_kernel for batch row i_b (value block program_id(0), head program_id(1)).
    X_ROW, BC_ROW, Z_ROW, DT_ROW: the element stride between the tokens' rows of x, B / C, z and dt
    (checks.token_rows)."""
    i_v, i_h, i_b, i_g, slot, cur, o_v, mask_v, o_r, mask_r = ring_row(
        slots_ptr, cursor_ptr, i_b, H, G, V, BV, BR)
    is_flush = (cur + 1) >= WINDOW
    B_row = B_ptr + i_b * BC_ROW + i_g * K
    C_row = C_ptr + i_b * BC_ROW + i_g * K
    o_k = tl.arange(0, K)
    bc = tl.sum(tl.load(B_row + o_k).to(tl.float32) * tl.load(C_row + o_k).to(tl.float32), axis=0)
    xv = tl.load(x_ptr + i_b * X_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    dt = softplus(tl.load(dt_ptr + i_b * DT_ROW + i_h).to(tl.float32) + tl.load(dtb_ptr + i_h).to(tl.float32))
    g = dt * tl.load(A_ptr + i_h).to(tl.float32)
    a = tl.exp(g)
    u = dt * xv
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * G + i_g) * K
    if FLUSH_BLOCK_K == K:  # whole-row flush: the checkpoint tile and the keys loaded once, folded in registers
        if is_flush:
            S0, Kr = flush_tiles(ckpt_ptr, head_rows, o_v, mask_v, reck_base, o_r, mask_r, G * K, K)
            Cv = tl.load(C_row + o_k).to(tl.float32)
            y = _m2_out(tl.sum(S0 * Cv[None, :], axis=1), tl.sum(Kr * Cv[None, :], axis=1), a, gam, Dr, w, u, bc,
                        xv, D_ptr, z_ptr, i_b, i_h, o_v, mask_v, H, V, HAS_Z, Z_ROW)
            # S_t = a*replay(S0) + u B^T into the checkpoint (+ read copy)
            fold_tile_store(S0, Kr, Dr, w, gtot, a, u, tl.load(B_row + o_k).to(tl.float32), ckpt_ptr, rc_ptr, rs_ptr,
                            rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, seed, tl.load(folded_ptr + slot) + cur + 1,
                            (layer * H + i_h).to(tl.int64) * (V * K), K, BV, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)
        else:
            sc0, _s, kcr, _k = replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v,
                                           mask_v, C_row, B_row, 1.0, 1.0, reck_base, o_r, mask_r,
                                           G * K, K, BKC, BV, BR, READ_COPY, False, REDUCE_ONCE, NUM_STAGES)
            y = _m2_out(sc0, kcr, a, gam, Dr, w, u, bc, xv, D_ptr, z_ptr, i_b, i_h, o_v, mask_v, H, V, HAS_Z, Z_ROW)
    else:
        if is_flush:
            sc0, _s, kcr, _k = replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v,
                                           mask_v, C_row, B_row, 1.0, 1.0, reck_base, o_r, mask_r,
                                           G * K, K, FLUSH_BLOCK_K if FLUSH_BLOCK_K > 0 else BKC, BV, BR, 0, False,
                                           REDUCE_ONCE, NUM_STAGES)
        else:
            sc0, _s, kcr, _k = replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v,
                                           mask_v, C_row, B_row, 1.0, 1.0, reck_base, o_r, mask_r,
                                           G * K, K, BKC, BV, BR, READ_COPY, False, REDUCE_ONCE, NUM_STAGES)
        y = _m2_out(sc0, kcr, a, gam, Dr, w, u, bc, xv, D_ptr, z_ptr, i_b, i_h, o_v, mask_v, H, V, HAS_Z, Z_ROW)
        if is_flush:  # S_t = a*replay(S0) + u B^T into the checkpoint (+ read copy)
            fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, mask_v, reck_base,
                       recd_ptr + (slot * R * H + i_h) * V, recg_ptr + slot * R * H + i_h, cur, gtot,
                       a, u, B_row, 1.0, seed, tl.load(folded_ptr + slot) + cur + 1,
                       (layer * H + i_h).to(tl.int64) * (V * K), G * K, H * V, H, K,
                       FLUSH_BLOCK_K if FLUSH_BLOCK_K > 0 else BKC, BV, BR, READ_COPY, CKPT_SR, SHARED_QUANT, True,
                       INTERPRET, FOLD_DOT)
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, y.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, u.to(recd_ptr.dtype.element_ty),
             mask=mask_v)
    if i_v == 0:
        tl.store(recg_ptr + (slot * R + cur) * H + i_h, g)
        if i_h % (H // G) == 0:
            tl.store(reck_base + cur * (G * K) + o_k, tl.load(B_row + o_k).to(reck_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["seed", "layer", "min_rows"])
def _m2_decode_kernel(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, slots_ptr, cursor_ptr,
                      folded_ptr, frows_ptr, nflush_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr,
                      recg_ptr, seed, layer, min_rows, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr,
                      V: tl.constexpr, R: tl.constexpr, WINDOW: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr,
                      BR: tl.constexpr, READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr,
                      HAS_Z: tl.constexpr, INTERPRET: tl.constexpr, REDUCE_ONCE: tl.constexpr, X_ROW: tl.constexpr, BC_ROW: tl.constexpr, Z_ROW: tl.constexpr, DT_ROW: tl.constexpr,
                      FLUSH_BLOCK_K: tl.constexpr = 0, NUM_STAGES: tl.constexpr = None,
                      FLUSH_ROW_PROGRAMS: tl.constexpr = 1, FLUSH_ONLY: tl.constexpr = False):
    """All rows of a decode step, or (FLUSH_ONLY) only the rows whose record fills the window: the
    nflush rows that the split decode listed in frows (split_decode.flush_list), program_id(2) folding those
    split_decode.flush_rows gives it (the split decode runs the other rows through _m2_decode_prep_kernel +
    _m2_decode_read_kernel)."""
    if FLUSH_ONLY:
        lo, hi, step = flush_rows(nflush_ptr, min_rows, FLUSH_ROW_PROGRAMS)
        for j in range(lo, hi, step):
            _m2_decode_row(tl.load(frows_ptr + j), x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr,
                           out_ptr, slots_ptr, cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr,
                           reck_ptr, recg_ptr, seed, layer, H, G, K, V, R, WINDOW, BV, BKC, BR, READ_COPY, CKPT_SR, SHARED_QUANT,
                           HAS_Z, INTERPRET, REDUCE_ONCE, FLUSH_BLOCK_K, NUM_STAGES, True, X_ROW, BC_ROW, Z_ROW,
                           DT_ROW)
    else:
        _m2_decode_row(tl.program_id(2), x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr,
                       slots_ptr, cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr,
                       recg_ptr, seed, layer, H, G, K, V, R, WINDOW, BV, BKC, BR, READ_COPY, CKPT_SR, SHARED_QUANT, HAS_Z,
                       INTERPRET, REDUCE_ONCE, FLUSH_BLOCK_K, NUM_STAGES, False, X_ROW, BC_ROW, Z_ROW, DT_ROW)


@triton.jit
def _m2_decode_prep_kernel(B_ptr, C_ptr, slots_ptr, cursor_ptr, reck_ptr, prep_ptr, G: tl.constexpr, K: tl.constexpr,
                           R: tl.constexpr, WINDOW: tl.constexpr, BR: tl.constexpr, BC_ROW: tl.constexpr):
    """Split decode, stage 1, one program per (row, group) of a non-flush row: B.C and the committed
    keys' products K_r C, shared by the group's heads and value blocks -> prep row [K_r C (BR) | B.C];
    and the token's B record."""
    i_g = tl.program_id(0)
    i_b = tl.program_id(1)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    cur = tl.load(cursor_ptr + slot)
    if cur + 1 >= WINDOW:
        return
    B_row = B_ptr + i_b * BC_ROW + i_g * K
    C_row = C_ptr + i_b * BC_ROW + i_g * K
    o_k = tl.arange(0, K)
    Bv = tl.load(B_row + o_k)
    krc, _ = record_key_products(reck_ptr, C_row, C_row, slot, cur, i_g, 1.0, 1.0, G, K, R, BR, False)
    p = prep_ptr + (i_b * G + i_g) * (BR + 1)
    tl.store(p + tl.arange(0, BR), krc)
    tl.store(p + BR, tl.sum(Bv.to(tl.float32) * tl.load(C_row + o_k).to(tl.float32), axis=0))
    tl.store(reck_ptr + (slot * R * G + i_g) * K + cur * (G * K) + o_k, Bv.to(reck_ptr.dtype.element_ty))


@triton.jit
def _m2_decode_read_kernel(x_ptr, dt_ptr, A_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, slots_ptr, cursor_ptr,
                           ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, recg_ptr, prep_ptr, H: tl.constexpr,
                           G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr, WINDOW: tl.constexpr,
                           BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr, READ_COPY: tl.constexpr,
                           HAS_Z: tl.constexpr, REDUCE_ONCE: tl.constexpr, X_ROW: tl.constexpr, BC_ROW: tl.constexpr, Z_ROW: tl.constexpr, DT_ROW: tl.constexpr,
                           NUM_STAGES: tl.constexpr = None):
    """Split decode, stage 2, non-flush rows: the state pass (S C from the checkpoint or its read
    copy) with the record products from stage 1, then y, the u and g records."""
    i_v, i_h, i_b, i_g, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, G, V, BV, BR)
    if cur + 1 >= WINDOW:
        return
    p = prep_ptr + (i_b * G + i_g) * (BR + 1)
    xv = tl.load(x_ptr + i_b * X_ROW + i_h * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    dt = softplus(tl.load(dt_ptr + i_b * DT_ROW + i_h).to(tl.float32) + tl.load(dtb_ptr + i_h).to(tl.float32))
    g = dt * tl.load(A_ptr + i_h).to(tl.float32)
    u = dt * xv
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    C_row = C_ptr + i_b * BC_ROW + i_g * K
    sc0, _s, _k, _kk = replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, (slot * H + i_h) * V, slot * H + i_h, o_v,
                                   mask_v, C_row, C_row, 1.0, 1.0, recd_ptr, o_r, mask_r,  # no keys read
                                   G * K, K, BKC, BV, BR, READ_COPY, False, REDUCE_ONCE, NUM_STAGES, False)
    y = _m2_out(sc0, tl.load(p + o_r), tl.exp(g), gam, Dr, w, u, tl.load(p + BR), xv, D_ptr, z_ptr, i_b, i_h, o_v,
                mask_v, H, V, HAS_Z, Z_ROW)
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, y.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(recd_ptr + ((slot * R + cur) * H + i_h) * V + o_v, u.to(recd_ptr.dtype.element_ty), mask=mask_v)
    if i_v == 0:
        tl.store(recg_ptr + (slot * R + cur) * H + i_h, g)


@triton.jit
def _m2_drafts_finish(SC, CB, x_ptr, dt_ptr, A_ptr, B_ptr, D_ptr, dtb_ptr, z_ptr, par_ptr, out_ptr, recd_ptr,
                      reck_ptr, recg_ptr, reck_base, bc_rows, tok, slot, cur, i_b, i_h, i_v, o_t, mask_t, o_v, mask_v,
                      H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr,
                      T: tl.constexpr, BT: tl.constexpr, BKC: tl.constexpr, HAS_PARENTS: tl.constexpr,
                      HAS_Z: tl.constexpr, X_ROW: tl.constexpr, Z_ROW: tl.constexpr, DT_ROW: tl.constexpr):
    """The drafts' part of a Mamba-2 verify, given Sc C_t (SC [BT, BV]) of the committed state Sc and
    the drafts' products C_t . B_i (CB [BT, BT]): gates, path decays, outputs, and the T draft
    records (u, B, dt A) at ring positions cursor.."""
    mtv = mask_t[:, None] & mask_v[None, :]
    X = tl.load(x_ptr + tok[:, None] * X_ROW + i_h * V + o_v[None, :], mask=mtv, other=0.0).to(tl.float32)
    dt = softplus(tl.load(dt_ptr + tok * DT_ROW + i_h, mask=mask_t, other=0.0).to(tl.float32)
                  + tl.load(dtb_ptr + i_h).to(tl.float32))
    Gd = tl.where(mask_t, dt * tl.load(A_ptr + i_h).to(tl.float32), 0.0)
    U = dt[:, None] * X
    ANC, LG = draft_structure(par_ptr + i_b * T, Gd, T, BT, HAS_PARENTS)
    E = tl.where(ANC > 0.0, tl.exp(tl.minimum(LG[:, None] - LG[None, :], 0.0)), 0.0)
    Y = tl.exp(LG)[:, None] * SC + tl.sum((E * CB)[:, :, None] * U[None, :, :], axis=1)
    Y = Y + tl.load(D_ptr + i_h).to(tl.float32) * X
    if HAS_Z:
        Z = tl.load(z_ptr + tok[:, None] * Z_ROW + i_h * V + o_v[None, :], mask=mtv, other=0.0).to(tl.float32)
        Y = Y * Z * tl.sigmoid(Z)
    tl.store(out_ptr + (tok[:, None] * H + i_h) * V + o_v[None, :], Y.to(out_ptr.dtype.element_ty), mask=mtv)
    pos = cur + o_t
    mpos = mask_t & (pos < R)
    tl.store(recd_ptr + ((slot * R + pos[:, None]) * H + i_h) * V + o_v[None, :], U.to(recd_ptr.dtype.element_ty),
             mask=mpos[:, None] & mask_v[None, :])
    if i_v == 0:
        tl.store(recg_ptr + (slot * R + pos) * H + i_h, Gd, mask=mpos)
        if i_h % (H // G) == 0:
            for c in range(K // BKC):
                o_kc = c * BKC + tl.arange(0, BKC)
                Bc = tl.load(B_ptr + bc_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0)
                tl.store(reck_base + pos[:, None] * (G * K) + o_kc[None, :], Bc.to(reck_ptr.dtype.element_ty),
                         mask=mpos[:, None])


@triton.jit
def _m2_verify_kernel(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, par_ptr, out_ptr,
                      slots_ptr, cursor_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr,
                      H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                      BKC: tl.constexpr, BR: tl.constexpr, READ_COPY: tl.constexpr,
                      HAS_PARENTS: tl.constexpr, HAS_Z: tl.constexpr, X_ROW: tl.constexpr, BC_ROW: tl.constexpr, Z_ROW: tl.constexpr, DT_ROW: tl.constexpr):
    """Output-only verify of T Mamba-2 drafts (chain or tree):
    y_t = exp(G_t) Sc C_t + sum_{i on the path to t} exp(G_t - G_i) (B_i . C_t) u_i + D x_t;
    writes the T draft records (u, B, dt A) at cursor.. (no state write). Exact fp32 broadcast products."""
    i_v, i_h, i_b, i_g, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, G, V, BV, BR)
    o_t = tl.arange(0, BT)
    mask_t = o_t < T
    tok = i_b * T + o_t
    bc_rows = tok * BC_ROW + i_g * K
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * G + i_g) * K
    ac = tl.zeros([BT, BV, BKC], dtype=tl.float32)
    KrC = tl.zeros([BR, BT], dtype=tl.float32)
    CB = tl.zeros([BT, BT], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        Cc = tl.load(C_ptr + bc_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
        Bc = tl.load(B_ptr + bc_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, slot * H + i_h, o_v, o_kc, mask_v, K, READ_COPY)
        Kr = tl.load(reck_base + o_r[:, None] * (G * K) + o_kc[None, :], mask=mask_r[:, None], other=0.0).to(tl.float32)
        ac += S0[None, :, :] * Cc[:, None, :]
        KrC += tl.sum(Kr[:, None, :] * Cc[None, :, :], axis=2)
        CB += tl.sum(Cc[:, None, :] * Bc[None, :, :], axis=2)
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    SC = gam * tl.sum(ac, axis=2) + tl.sum((KrC * w[:, None])[:, :, None] * Dr[:, None, :], axis=0)  # Sc C_t
    _m2_drafts_finish(SC, CB, x_ptr, dt_ptr, A_ptr, B_ptr, D_ptr, dtb_ptr, z_ptr, par_ptr, out_ptr, recd_ptr, reck_ptr,
                      recg_ptr, reck_base, bc_rows, tok, slot, cur, i_b, i_h, i_v, o_t, mask_t, o_v, mask_v,
                      H, G, K, V, R, T, BT, BKC, HAS_PARENTS, HAS_Z, X_ROW, Z_ROW, DT_ROW)


@triton.jit
def _m2_verify_mma_kernel(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, par_ptr, out_ptr,
                          slots_ptr, cursor_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, recd_ptr, reck_ptr, recg_ptr,
                          H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                          BKC: tl.constexpr, BR: tl.constexpr, READ_COPY: tl.constexpr,
                          HAS_PARENTS: tl.constexpr, HAS_Z: tl.constexpr, DOT_PRECISION: tl.constexpr, X_ROW: tl.constexpr, BC_ROW: tl.constexpr, Z_ROW: tl.constexpr, DT_ROW: tl.constexpr):
    """_m2_verify_kernel with the products on tensor cores: the drafts' C (rows 0..BT-1) and B (rows
    BT..2BT-1) stacked into one operand X (BT >= 8: >= 16 rows), S0 X^T, K_r X^T and X X^T one dot
    each per column chunk, the records' share of Sc C_t one dot more (3xTF32 default)."""
    i_v, i_h, i_b, i_g, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(
        slots_ptr, cursor_ptr, H, G, V, BV, BR)
    o_t = tl.arange(0, BT)
    mask_t = o_t < T
    tok = i_b * T + o_t
    head_rows = (slot * H + i_h) * V
    reck_base = reck_ptr + (slot * R * G + i_g) * K
    S0X, KrX, XX, _nx, _is_c = stacked_draft_pass(C_ptr, B_ptr, i_b, i_g, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows,
                                                  slot * H + i_h, o_v, mask_v, reck_base, o_r, mask_r, G, K, T, BT,
                                                  BV, BKC, BR, READ_COPY, DOT_PRECISION, False, BC_ROW)
    Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
    SX = gam * S0X + tl.dot(tl.trans(KrX * w[:, None]), Dr, input_precision=DOT_PRECISION)   # rows: Sc C_t, Sc B_t
    SC, _SB, CB, _BB = stacked_halves(SX, XX, BT, BV)
    _m2_drafts_finish(SC, CB, x_ptr, dt_ptr, A_ptr, B_ptr, D_ptr, dtb_ptr, z_ptr, par_ptr, out_ptr, recd_ptr, reck_ptr,
                      recg_ptr, reck_base, tok * BC_ROW + i_g * K, tok, slot, cur, i_b, i_h, i_v, o_t, mask_t, o_v,
                      mask_v, H, G, K, V, R, T, BT, BKC, HAS_PARENTS, HAS_Z, X_ROW, Z_ROW, DT_ROW)


@triton.jit
def _m2_conventional_kernel(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, slots_ptr,
                    state_ptr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, HAS_Z: tl.constexpr, X_ROW: tl.constexpr, BC_ROW: tl.constexpr, Z_ROW: tl.constexpr, DT_ROW: tl.constexpr):
    i_v, i_h, i_b, o_v, mask_v, o_k, mask_k, offs, mask2, S = state_tile(slots_ptr, state_ptr, H, K, V, BV, BK)
    i_g = i_h // (H // G)
    xv, Bv, Cv, u, g, Dh = _m2_token(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, i_b,
                                     i_h, i_g, o_k, mask_k, o_v, mask_v, H, G, K, V, X_ROW, BC_ROW, DT_ROW)
    S = S * tl.exp(g) + u[:, None] * Bv[None, :]
    y = _m2_finish(tl.sum(S * Cv[None, :], axis=1), xv, Dh, z_ptr, i_b, i_h, o_v, mask_v, H, V,
                   HAS_Z, Z_ROW)
    tl.store(out_ptr + (i_b * H + i_h) * V + o_v, y.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(state_ptr + offs, S.to(state_ptr.dtype.element_ty), mask=mask2)


def _check_inputs(B, H, G, P, N, x, dt, A, Bm, C, D, dt_bias, z, device, T=None):
    """The token inputs' checks; x, dt, B, C, z may be views read by token rows (checks.token_rows)."""
    lead = (B,) if T is None else (B, T)
    check_rows("x", x, shape=lead + (H, P), device=device)
    check_rows("dt", dt, shape=lead + (H,), device=device)
    check_tensor("A", A, shape=(H,), device=device)
    check_rows("B", Bm, shape=lead + (G, N), device=device)
    check_rows("C", C, shape=lead + (G, N), device=device)
    check_tensor("D", D, shape=(H,), device=device)
    check_tensor("dt_bias", dt_bias, shape=(H,), device=device)
    if z is not None:
        check_rows("z", z, shape=lead + (H, P), device=device)
    check(G > 0 and H % G == 0, f"num heads {H} must be a multiple of num groups {G}")


def _token_inputs(x, dt, B, C, z, lead: int):
    """x, dt, B / C (one row stride), z as the kernels read them (checks.token_rows; z None: x's place, never read):
    (x, dt, B, C, z, their strides as the kernels' X_ROW, BC_ROW, Z_ROW, DT_ROW)."""
    (x,), x_row = token_rows(x, lead=lead)
    (dt,), dt_row = token_rows(dt, lead=lead)
    (B, C), bc_row = token_rows(B, C, lead=lead)
    (z,), z_row = token_rows(z, lead=lead) if z is not None else ((x,), x_row)
    return x, dt, B, C, z, dict(X_ROW=x_row, BC_ROW=bc_row, Z_ROW=z_row, DT_ROW=dt_row)


def _block_v(P, block_v):
    return check_block_v(block_v, min(max(next_pow2(P), 16), 32))


def decode(pool, layer, slots, x, dt, A, B, C, D, dt_bias, z=None, *, out=None, method=None, tuning=None,
           flush_list=None):
    """One Mamba-2 decode step of a batch, in place on the pool (record at cursor; flush rows
    fold). Same contract as reference.mamba2.decode; returns y [B, H, P] in x's dtype. method:
    "fused" (one launch for all rows), "split" (a flush-row list, the flush rows on a side stream; the
    other rows through a small kernel for the group's record products, then the state pass) or None
    (tuning.decode_plan: split where it measured faster). tuning: a KernelTuning (None:
    tuning.decode_plan's blocks). flush_list: the split decode's (rows, count) of
    split_decode.flush_list for these slots and the pool's cursors, computed once per step and shared
    by its layers, or a function returning them (called only by a split decode; None: computed here)."""
    tuning = check_tuning(tuning)
    if getattr(pool.cfg, "mode", "replay") == "conventional":
        return conventional_decode(pool.ckpt[layer], slots, x, dt, A, B, C, D, dt_bias, z, out=out,
                                   tuning=KernelTuning(block_v=tuning.block_v, num_warps=tuning.num_warps))
    lv = layer_views(pool, layer)
    Bn = check_slots(slots, lv.device, lv.num_slots)
    H, G, P, N = lv.H, lv.Hk, lv.Dv, lv.Dk
    _check_inputs(Bn, H, G, P, N, x, dt, A, B, C, D, dt_bias, z, lv.device)
    has_z = z is not None
    x, dt, B, C, zz, row_strides = _token_inputs(x, dt, B, C, z, lead=1)
    out = output_tensor(out, (Bn, H, P), x, lv.device)
    if Bn == 0:
        return out
    method, tuning = decode_plan("mamba2", lv.rc_mode, Bn, H, N, method, tuning)
    block_v, block_k, num_warps, stages = tuning.block_v, tuning.block_k, tuning.num_warps, tuning.stages
    BV = _block_v(P, block_v)
    nw = num_warps or default_warps(Bn, H)
    if lv.rc_mode == RC_NVFP4:  # flush rows compute the per-head NVFP4 global scale
        BV = max(16, next_pow2(lv.Dv))
        nw, block_k = max(nw, 8), block_k or 16
    rc, rs, rgs = lv.rc_args()
    BR = max(16, next_pow2(lv.window))
    fbk = check_flush_block_k(tuning.flush_block_k, N)
    # split: this launch only does the flush rows' work (sized for the fold), beside the others
    launch = decode_launch_rows("mamba2", method, slots, lv, nw, tuning.flush_warps, flush_list)
    nw = launch.warps
    with on_stream(launch.stream):
        _m2_decode_kernel[(cdiv(P, BV), H, launch.grid_rows)](
            # the token's inputs and the output
            x_ptr=x, dt_ptr=dt, A_ptr=A, B_ptr=B, C_ptr=C, D_ptr=D, dtb_ptr=dt_bias, z_ptr=zz, out_ptr=out,
            # the rows, the split decode's flush list, the layer's state (DecodeRows.state_args)
            **launch.state_args(lv, slots),
            H=H, G=G, K=N, V=P, BV=BV, BKC=block_k or chunk_k(N), BR=BR, HAS_Z=has_z, **row_strides,
            REDUCE_ONCE=nw >= 4 and (fbk or block_k or 32) <= 32, FLUSH_BLOCK_K=fbk,
            NUM_STAGES=check_stages(stages), num_warps=nw)
    if method == "split":
        prep = torch.empty((Bn, G, BR + 1), dtype=torch.float32, device=lv.device)
        _m2_decode_prep_kernel[(G, Bn)](B_ptr=B, C_ptr=C, slots_ptr=slots, cursor_ptr=lv.cursor, reck_ptr=lv.rec_k,
                                        prep_ptr=prep, G=G, K=N, R=lv.R, WINDOW=lv.window, BR=BR,
                                        BC_ROW=row_strides["BC_ROW"], num_warps=PREP_WARPS)
        rbv, rnw = _block_v(P, block_v), num_warps or default_warps(Bn, H)
        _m2_decode_read_kernel[(cdiv(P, rbv), H, Bn)](
            x_ptr=x, dt_ptr=dt, A_ptr=A, C_ptr=C, D_ptr=D, dtb_ptr=dt_bias, z_ptr=zz, out_ptr=out, slots_ptr=slots,
            cursor_ptr=lv.cursor, ckpt_ptr=lv.ckpt, rc_ptr=rc, rs_ptr=rs, rgs_ptr=rgs, recd_ptr=lv.rec_d,
            recg_ptr=lv.rec_g, prep_ptr=prep, H=H, G=G, K=N, V=P, R=lv.R, WINDOW=lv.window, BV=rbv,
            BKC=block_k or chunk_k(N), BR=BR, READ_COPY=lv.rc_mode, HAS_Z=has_z, REDUCE_ONCE=rnw >= 4, **row_strides,
            NUM_STAGES=check_stages(stages), num_warps=rnw)
    join_stream(launch.stream)
    return out


def verify(pool, layer, slots, x, dt, A, B, C, D, dt_bias, z=None, parents=None, *, out=None, method=None,
           tuning=None):
    """Output-only verify of T Mamba-2 draft tokens per row (x [B, T, H, P], dt [B, T, H],
    B/C [B, T, G, N], z [B, T, H, P] or None; parents [B, T] int32 or None for a chain). Writes the
    draft records at cursor..cursor+T-1 (no state write); returns y [B, T, H, P] in x's dtype.
    Commit with pool.accept_drafts (its ops.commit). method: "fma" (exact fp32 broadcast products), "mma" (the
    state-sized products as 3xTF32 tensor-core dots) or None ("mma": 2-3x faster at T = 4..8 on the
    H200). tuning: a KernelTuning (default blocks: tuning.VERIFY_TUNED; stages: the mma launch's
    pipelining, checks.launch_stages; dot_precision: the mma launch's)."""
    tuning = check_tuning(tuning)
    if getattr(pool.cfg, "mode", "replay") != "replay":
        raise ValueError("verify kernels need a pool in mode='replay' (conventional verify keeps snapshots)")
    lv = layer_views(pool, layer)
    Bn = check_slots(slots, lv.device, lv.num_slots)
    H, G, P, N = lv.H, lv.Hk, lv.Dv, lv.Dk
    check(x.dim() == 4, f"x must be [B, T, H, P] for verify, got shape {tuple(x.shape)}")
    T = int(x.shape[1])
    check(1 <= T and lv.window - 1 + T <= lv.R,
          f"T={T} drafts do not fit the ring (capacity {lv.R}, window {lv.window})")
    _check_inputs(Bn, H, G, P, N, x, dt, A, B, C, D, dt_bias, z, lv.device, T=T)
    has_z = z is not None
    x, dt, B, C, zz, row_strides = _token_inputs(x, dt, B, C, z, lead=2)
    if parents is not None:
        check_tensor("parents", parents, shape=(Bn, T), dtype=torch.int32, device=lv.device)
    out = output_tensor(out, (Bn, T, H, P), x, lv.device)
    if Bn == 0:
        return out
    method, BV, num_warps = verify_plan("mamba2", method, tuning)
    rc, rs, rgs = lv.rc_args()
    kern, BT, extra = _m2_verify_kernel, next_pow2(T), {}
    if method == "mma":
        kern, BT = _m2_verify_mma_kernel, max(8, next_pow2(T))
        extra = dict(DOT_PRECISION=tuning.dot_precision or DOT_PREC, **launch_stages(tuning.stages))
    kern[(cdiv(P, BV), H, Bn)](
        # the drafts' inputs and the output (z, parents: never read where HAS_Z / HAS_PARENTS is False)
        x_ptr=x, dt_ptr=dt, A_ptr=A, B_ptr=B, C_ptr=C, D_ptr=D, dtb_ptr=dt_bias, z_ptr=zz,
        par_ptr=parents if parents is not None else slots, out_ptr=out,
        # the rows and the layer's state
        slots_ptr=slots, cursor_ptr=lv.cursor, ckpt_ptr=lv.ckpt, rc_ptr=rc, rs_ptr=rs, rgs_ptr=rgs,
        recd_ptr=lv.rec_d, reck_ptr=lv.rec_k, recg_ptr=lv.rec_g,
        H=H, G=G, K=N, V=P, R=lv.R, T=T, BT=BT, BV=BV, BKC=check_block_k(tuning.block_k, N) or chunk_k(N, 16),
        BR=max(16, next_pow2(lv.window)), READ_COPY=lv.rc_mode, HAS_PARENTS=parents is not None,
        HAS_Z=has_z, num_warps=num_warps, **row_strides, **extra)
    return out


def conventional_decode(state, slots, x, dt, A, B, C, D, dt_bias, z=None, *, out=None, tuning=None):
    """Conventional Mamba-2 decode: read, update and write state[slots] ([S, H, P, N]) in place.
    tuning: a KernelTuning (its block_v and num_warps)."""
    tuning = check_tuning(tuning)
    check(isinstance(state, torch.Tensor) and state.dim() == 4,
          "state must be a 4-D tensor [S, H, P, N]")
    check_tensor("state", state, dtype=(torch.float32, torch.float16, torch.bfloat16))
    _, H, P, N = state.shape
    Bn = check_slots(slots, state.device, state.shape[0])
    G = B.shape[1] if B.dim() == 3 else -1
    _check_inputs(Bn, H, G, P, N, x, dt, A, B, C, D, dt_bias, z, state.device)
    has_z = z is not None
    x, dt, B, C, zz, row_strides = _token_inputs(x, dt, B, C, z, lead=1)
    out = output_tensor(out, (Bn, H, P), x, state.device)
    if Bn == 0:
        return out
    BV = _block_v(P, tuning.block_v)
    _m2_conventional_kernel[(cdiv(P, BV), H, Bn)](
        x_ptr=x, dt_ptr=dt, A_ptr=A, B_ptr=B, C_ptr=C, D_ptr=D, dtb_ptr=dt_bias, z_ptr=zz,
        out_ptr=out, slots_ptr=slots, state_ptr=state, H=H, G=G, K=N, V=P, BV=BV, BK=next_pow2(N),
        HAS_Z=has_z, **row_strides, num_warps=tuning.num_warps or 4)
    return out


def fold(pool, layer, slots, counts, *, tuning=None):
    """Commit fold: records 0..counts[b]-1 into the checkpoint (+ read copy) of one layer, or of every layer
    in one launch (layer None); counts 0 = no-op (fold.fold with the scalar-decay kernel)."""
    fold_records(pool, layer, slots, counts, _fold_kernel, tuning)


def commit(pool, slots, accepted, *, tuning=None):
    """A chain commit's device work (fold.commit with the scalar-decay fold kernel): rows whose cursor +
    accepted drafts reach the window fold every layer, then the pointers move."""
    commit_records(pool, slots, accepted, _fold_kernel, tuning)
