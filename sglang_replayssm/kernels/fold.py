"""The fold: records 0..count-1 into the checkpoint (+ read copy), as a piece of a decode's flush rows
(fold_store, fold_tile_store) and as the commit's own launch (fold, which takes the family's kernel)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import block_knobs, cdiv, check, check_block_k, check_slots, check_tensor, chunk_k, next_pow2
from .constants import FOLD_PREC, INTERPRET, RC_NVFP4
from .layer_views import LayerViews, layer_views
from .quant_tiles import read_copy_scales, store_state_chunk, store_state_tile
from .replay import weighted_records
from .tuning import FOLD_TUNED, check_tuning, fold_gram_columns

@triton.jit
def fold_layer_head(layer, H: tl.constexpr):
    """A fold program's layer and head: program_id(1) = l * H + head over the launch's layers (layer,
    layer + 1, ..); returns (layer + l, head, l). The pool's tensors are [num_layers, S, ...] and
    contiguous, so row `slot` of layer first + l is row l * S + slot of the first layer's view."""
    i_lh = tl.program_id(1)
    l = i_lh // H
    return layer + l, i_lh % H, l


@triton.jit
def fold_count(cursor_ptr, row, acc, WINDOW: tl.constexpr):
    """A commit's fold count for one row: the row's records up to cursor + acc accepted drafts if they reach
    the window, else 0 (the pointer has not moved yet: _advance_kernel moves it after the fold)."""
    c = tl.load(cursor_ptr + row) + acc
    return tl.where(c >= WINDOW, c, 0)


@triton.jit
def fold_program(slots_ptr, counts_ptr, cursor_ptr, folded_ptr, layer, S, H: tl.constexpr, HK: tl.constexpr,
                 WINDOW: tl.constexpr, FROM_ACCEPTED: tl.constexpr):
    """A fold program's coordinates (value block program_id(0), (layer, head) program_id(1), row program_id(2)):
    (value block, layer, head, k-head, the row's fold count (fold_count's with FROM_ACCEPTED), its stochastic-rounding
    stream after the fold, the row's slot in the first layer's views)."""
    i_v = tl.program_id(0)
    i_b = tl.program_id(2)
    layer, i_h, l = fold_layer_head(layer, H)
    cnt = tl.load(counts_ptr + i_b)
    row = tl.load(slots_ptr + i_b).to(tl.int64)
    if FROM_ACCEPTED:
        cnt = fold_count(cursor_ptr, row, cnt, WINDOW)
    stream = tl.load(folded_ptr + row) + cnt
    return i_v, layer, i_h, i_h // (H // HK), cnt, stream, row + l * S


@triton.jit
def _advance_kernel(slots_ptr, acc_ptr, cursor_ptr, folded_ptr, B, WINDOW: tl.constexpr, BLOCK: tl.constexpr):
    """A commit's pointer move, after its fold: cursor += acc, and a row that reached the window restarts at 0
    with folded += its new count (the fold's records). Rows are distinct slots, or padding rows (acc 0) that
    rewrite a slot's own values."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < B
    slot = tl.load(slots_ptr + o, mask=m, other=0).to(tl.int64)
    c = tl.load(cursor_ptr + slot, mask=m, other=0) + tl.load(acc_ptr + o, mask=m, other=0)
    full = c >= WINDOW
    f = tl.load(folded_ptr + slot, mask=m, other=0)
    tl.store(folded_ptr + slot, f + tl.where(full, c, 0).to(f.dtype), mask=m)
    tl.store(cursor_ptr + slot, tl.where(full, 0, c).to(cursor_ptr.dtype.element_ty), mask=m)


@triton.jit
def _loop_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, recd_base, recg_base, cnt, gtot, alpha, dcur,
                      k_row, rk, REC_K_STRIDE: tl.constexpr, REC_D_STRIDE: tl.constexpr, REC_G_STRIDE: tl.constexpr,
                      K: tl.constexpr, HAS_CUR: tl.constexpr):
    """_new_state_chunk by rank-1 fp32 FMA updates, one record at a time: few registers and no shared
    memory, but two dependent loads per record (fold_store DOT=False)."""
    rows = head_rows + o_v
    S = tl.load(ckpt_ptr + rows[:, None] * K + o_kc[None, :], mask=mask_v[:, None], other=0.0).to(tl.float32)
    S = S * tl.exp(gtot)
    cum = gtot * 0.0
    for j in range(cnt):
        cum += tl.load(recg_base + j * REC_G_STRIDE)
        dj = tl.load(recd_base + j * REC_D_STRIDE + o_v, mask=mask_v, other=0.0).to(tl.float32) * tl.exp(gtot - cum)
        kj = tl.load(reck_base + j * REC_K_STRIDE + o_kc).to(tl.float32)
        S += dj[:, None] * kj[None, :]
    S = alpha * S
    if HAS_CUR:
        kc = tl.load(k_row + o_kc).to(tl.float32) * rk
        S = S + dcur[:, None] * kc[None, :]
    return S


@triton.jit
def _new_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, Dw, o_r, mr, gtot,
                     alpha, dcur, k_row, rk, REC_K_STRIDE: tl.constexpr, K: tl.constexpr, HAS_CUR: tl.constexpr):
    """Columns o_kc of alpha*(S0 exp(gtot) + Dw^T K_r) (+ dcur k^T), Dw the weighted records of
    weighted_records: the checkpoint chunk and the record keys are two loads in flight at once, the
    record sum one tensor-core dot (3xTF32: fp32-level accuracy)."""
    rows = head_rows + o_v
    S = tl.load(ckpt_ptr + rows[:, None] * K + o_kc[None, :], mask=mask_v[:, None], other=0.0).to(tl.float32)
    Kr = tl.load(reck_base + o_r[:, None] * REC_K_STRIDE + o_kc[None, :], mask=mr[:, None], other=0.0).to(tl.float32)
    S = alpha * (S * tl.exp(gtot) + tl.dot(tl.trans(Dw), Kr, input_precision=FOLD_PREC))
    if HAS_CUR:
        kc = tl.load(k_row + o_kc).to(tl.float32) * rk
        S = S + dcur[:, None] * kc[None, :]
    return S


@triton.jit
def fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v, reck_base, recd_base,
               recg_base, cnt, gtot, alpha, dcur, k_row, rk, seed, stream, idx_base,
               REC_K_STRIDE: tl.constexpr, REC_D_STRIDE: tl.constexpr, REC_G_STRIDE: tl.constexpr, K: tl.constexpr,
               BKC: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr,
               READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr, HAS_CUR: tl.constexpr,
               INTERPRET: tl.constexpr, DOT: tl.constexpr = True):
    """Write the folded state S = alpha*(S0 exp(gtot) + sum_j w_j d_j k_j^T) (+ dcur k^T) of rows
    o_v of one head: checkpoint (fp32, or fp16 with stochastic rounding) and the read copy: fp8
    (per-row scales) or NVFP4 (the per-head global scale needs the whole head in this program:
    BV >= Dv). Reads S0 from the fp32/fp16 checkpoint. A quantized read copy needs the rows' maxima
    first: with whole rows in one chunk (BKC == K) the state is formed once, else in two passes.
    DOT False: the records' sum by per-record FMA updates (_loop_state_chunk) instead of one
    tensor-core dot: fewer registers and no shared memory where the fold shares a kernel with the
    non-flush rows (the fused Mamba-2 decode), at a serial chain of loads per record."""
    rows = head_rows + o_v
    if not DOT:
        amax = tl.zeros([BV], dtype=tl.float32)
        if READ_COPY != 0:
            for c in range(K // BKC):
                o_kc = c * BKC + tl.arange(0, BKC)
                S = _loop_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, recd_base, recg_base, cnt,
                                      gtot, alpha, dcur, k_row, rk, REC_K_STRIDE, REC_D_STRIDE, REC_G_STRIDE, K, HAS_CUR)
                amax = tl.maximum(amax, tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1))
        sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, READ_COPY)
        for c in range(K // BKC):
            o_kc = c * BKC + tl.arange(0, BKC)
            S = _loop_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, recd_base, recg_base, cnt,
                                  gtot, alpha, dcur, k_row, rk, REC_K_STRIDE, REC_D_STRIDE, REC_G_STRIDE, K, HAS_CUR)
            store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_kc, c, mask_v, sc, gs, seed, stream,
                              idx_base, K, BKC, BV, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)
        return
    Dw, o_r, mr = weighted_records(recd_base, recg_base, cnt, gtot, o_v, mask_v, REC_D_STRIDE, REC_G_STRIDE, BR)
    fold_store_dw(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v, reck_base, Dw, o_r, mr, gtot, alpha,
                  dcur, k_row, rk, seed, stream, idx_base, REC_K_STRIDE, K, BKC, BV, READ_COPY, CKPT_SR, SHARED_QUANT,
                  HAS_CUR, INTERPRET)


@triton.jit
def fold_store_dw(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v, reck_base, Dw, o_r, mr, gtot,
                  alpha, dcur, k_row, rk, seed, stream, idx_base, REC_K_STRIDE: tl.constexpr, K: tl.constexpr,
                  BKC: tl.constexpr, BV: tl.constexpr, READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr,
                  SHARED_QUANT: tl.constexpr, HAS_CUR: tl.constexpr, INTERPRET: tl.constexpr):
    """fold_store's tensor-core path with the weighted records given: Dw [BR, BV] = d_j w_j of records o_r (mask
    mr); a delta family's exact fold passes the d's it solved from the checkpoint (delta_fold.gdn_exact_d)."""
    rows = head_rows + o_v
    if READ_COPY != 0 and BKC == K:
        o_k = tl.arange(0, K)
        S = _new_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_k, reck_base, Dw, o_r, mr, gtot, alpha, dcur,
                             k_row, rk, REC_K_STRIDE, K, HAS_CUR)
        amax = tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1)
        sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, READ_COPY)
        store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_k, 0, mask_v, sc, gs, seed, stream, idx_base,
                          K, BKC, BV, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)
    else:
        amax = tl.zeros([BV], dtype=tl.float32)
        if READ_COPY != 0:
            for c in range(K // BKC):
                o_kc = c * BKC + tl.arange(0, BKC)
                S = _new_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, Dw, o_r, mr, gtot, alpha,
                                     dcur, k_row, rk, REC_K_STRIDE, K, HAS_CUR)
                amax = tl.maximum(amax, tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1))
        sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, READ_COPY)
        for c in range(K // BKC):
            o_kc = c * BKC + tl.arange(0, BKC)
            S = _new_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, Dw, o_r, mr, gtot, alpha,
                                 dcur, k_row, rk, REC_K_STRIDE, K, HAS_CUR)
            store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_kc, c, mask_v, sc, gs, seed, stream,
                              idx_base, K, BKC, BV, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)


@triton.jit
def fold_tile_store(S0, Kr, Dr, w, gtot, alpha, dcur, kcur, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head,
                    o_v, mask_v, seed, stream, idx_base, K: tl.constexpr, BV: tl.constexpr, READ_COPY: tl.constexpr,
                    CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr, INTERPRET: tl.constexpr):
    """fold_store from registers (whole rows, flush_tiles): S = alpha (S0 exp(gtot) + (w D_r)^T K_r)
    + dcur kcur^T, then its read copy (scales from the rows' maxima) and checkpoint."""
    S = alpha * (S0 * tl.exp(gtot) + tl.dot(tl.trans(Dr * w[:, None]), Kr, input_precision=FOLD_PREC))
    S = S + dcur[:, None] * kcur[None, :]
    store_state_tile(S, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v, seed, stream, idx_base,
                     K, BV, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)


@triton.jit(do_not_specialize=["seed", "layer"])
def _fold_kernel(slots_ptr, counts_ptr, cursor_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr,
                 recd_ptr, reck_ptr, recg_ptr, seed, layer, S,
                 H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 R: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr,
                 READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr,
                 INTERPRET: tl.constexpr, WINDOW: tl.constexpr, FROM_ACCEPTED: tl.constexpr):
    """Fold records 0..count-1 of each row into its checkpoint (+ read copy), for one layer or several
    (fold_layer_head; S: the pool's slots). count 0: no-op. FROM_ACCEPTED: counts_ptr holds a commit's
    accepted drafts and the count is fold_count's. Mamba-2, whose records d = u depend on no state: the
    delta families fold exactly from their records' raw inputs instead (delta_fold._delta_fold_kernel)."""
    i_v, layer, i_h, i_hk, cnt, stream, slot = fold_program(slots_ptr, counts_ptr, cursor_ptr, folded_ptr, layer, S,
                                                            H, HK, WINDOW, FROM_ACCEPTED)
    if cnt > 0:
        o_v = i_v * BV + tl.arange(0, BV)
        o_r = tl.arange(0, BR)
        mask_v = o_v < V
        mask_r = o_r < cnt
        Gr = tl.load(recg_ptr + (slot * R + o_r) * H + i_h, mask=mask_r, other=0.0)
        gtot = tl.sum(Gr, axis=0)
        idx_base = (layer * H + i_h).to(tl.int64) * (V * K)
        fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, (slot * H + i_h) * V, slot * H + i_h, o_v, mask_v,
                   reck_ptr + (slot * R * HK + i_hk) * K, recd_ptr + (slot * R * H + i_h) * V,
                   recg_ptr + slot * R * H + i_h, cnt, gtot, 1.0,
                   tl.zeros([BV], dtype=tl.float32), reck_ptr, 1.0, seed, stream, idx_base,
                   HK * K, H * V, H, K, BKC, BV, BR, READ_COPY, CKPT_SR, SHARED_QUANT, False, INTERPRET)


def _row_tensors(lv: LayerViews, slots, counts, name: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """slots and a per-row count (int32 tensors [B] on the pool's device, or int sequences) as checked tensors."""
    if not isinstance(slots, torch.Tensor):
        slots = torch.tensor([int(s) for s in slots], dtype=torch.int32, device=lv.device)
    if not isinstance(counts, torch.Tensor):
        counts = torch.tensor([int(c) for c in counts], dtype=torch.int32, device=lv.device)
    B = check_slots(slots, lv.device, lv.num_slots)
    check_tensor(name, counts, shape=(B,), dtype=torch.int32, device=lv.device)
    return slots, counts, B


def fold(pool, layer: int | None, slots, counts, kernel, tuning=None) -> None:
    """Fold records 0..counts[b]-1 of slots[b] into the checkpoint (+ read copy), in place, of one layer
    or (layer None) of every layer of the pool in one launch, with the family's fold kernel (`_fold_kernel`
    here for Mamba-2, `delta_fold._delta_fold_kernel` for GDN and KDA, which replays the records' raw inputs).

    slots / counts: int32 tensors [B] on the pool's device, or sequences of ints. Rows with
    counts[b] == 0 are untouched. Does not move cursor/folded (the pool does; commit below does both).
    tuning: a KernelTuning (block_v, block_k, num_warps; FOLD_TUNED where none is given)."""
    tuning = check_tuning(tuning)
    lv = layer_views(pool, 0 if layer is None else layer)
    slots, counts, B = _row_tensors(lv, slots, counts, "counts")
    if B > 0:
        _launch_fold(pool, lv, layer, slots, counts, B, kernel, tuning, from_accepted=False)


def _launch_fold(pool, lv: LayerViews, layer: int | None, slots, counts, B: int, kernel, tuning,
                 from_accepted: bool) -> None:
    """The fold launch over checked rows and tuning (fold, commit). from_accepted: counts are a commit's accepted
    drafts, and a row folds cursor + accepted records where they reach the window (fold_count)."""
    block_v, block_k, num_warps = tuning.block_v, tuning.block_k, tuning.num_warps
    nl = int(pool.ckpt.shape[0]) if layer is None else 1
    check_block_k(block_k, lv.Dk)
    if block_v is None and block_k is None and num_warps is None:
        block_v, block_k, num_warps, _why = FOLD_TUNED[lv.family]
    BV, num_warps = block_knobs(block_v, num_warps, 16, 4)
    BKC = chunk_k(lv.Dk, min(block_k, lv.Dk)) if block_k else chunk_k(lv.Dk)
    if lv.rc_mode == RC_NVFP4:  # the per-head global scale needs the whole head in one program
        BV, BKC, num_warps = max(16, next_pow2(lv.Dv)), 16, max(num_warps, 8)
    BR = max(16, next_pow2(lv.R))
    rc, rs, rgs = lv.rc_args()
    check(lv.H * nl <= 65535, f"a fold launch covers at most 65535 (layer, head) pairs, got {nl} x {lv.H}")
    grid = (cdiv(lv.Dv, BV), lv.H * nl, B)
    # the delta families' exact folds read the records' raw inputs (and KDA's its Gram sums' column step)
    # (None where the pool keeps none: no read copy, the stored d's fold as they are)
    inputs = {} if lv.family == "mamba2" else dict(recv_ptr=lv.rec_v, recb_ptr=lv.rec_beta)
    if lv.family == "kda":
        inputs["MKC"] = fold_gram_columns(BR)
    kernel[grid](slots_ptr=slots, counts_ptr=counts, cursor_ptr=lv.cursor, folded_ptr=lv.folded, ckpt_ptr=lv.ckpt,
                 rc_ptr=rc, rs_ptr=rs, rgs_ptr=rgs, recd_ptr=lv.rec_d, reck_ptr=lv.rec_k, recg_ptr=lv.rec_g, **inputs,
                 seed=lv.seed, layer=lv.layer, S=lv.num_slots,
                 H=lv.H, HK=lv.Hk, K=lv.Dk, V=lv.Dv, R=lv.R, BV=BV, BKC=BKC, BR=BR,
                 READ_COPY=lv.rc_mode, CKPT_SR=lv.ckpt_sr, SHARED_QUANT=lv.shared_quant,
                 INTERPRET=INTERPRET, WINDOW=lv.window, FROM_ACCEPTED=from_accepted, num_warps=num_warps)


# rows per program of the commit's pointer move
ADVANCE_BLOCK = 128


def commit(pool, slots, accepted, kernel, tuning=None) -> None:
    """A chain commit's device work on the records already at cursor..: the rows whose cursor + accepted
    drafts reach the window fold them into the checkpoint (+ read copy) of every layer (`kernel`, counting
    from the cursor itself), then _advance_kernel moves cursor and folded. Two launches, no host sync
    (the pool's accept_drafts; was ~10 indexing launches around the fold). slots / accepted: as fold's."""
    lv = layer_views(pool, 0)
    slots, accepted, B = _row_tensors(lv, slots, accepted, "accepted")
    if B == 0:
        return
    _launch_fold(pool, lv, None, slots, accepted, B, kernel, check_tuning(tuning), from_accepted=True)
    _advance_kernel[(cdiv(B, ADVANCE_BLOCK),)](slots, accepted, lv.cursor, lv.folded, B, WINDOW=lv.window,
                                                     BLOCK=ADVANCE_BLOCK, num_warps=4)
