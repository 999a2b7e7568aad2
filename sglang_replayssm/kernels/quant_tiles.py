"""State I/O of the kernels: checkpoint and read-copy tiles in and out, with the read-copy quantizers
(fp8 e4m3 per row, NVFP4) and the fp16 stochastic rounding of reference.quant, bit for bit; and the
conventional decode's state tile."""
from __future__ import annotations

import triton
import triton.language as tl

from ..reference import quant

# the largest e4m3 magnitude (reference.quant.FP8_MAX), as a constant the kernels can read
FP8_MAX = tl.constexpr(quant.FP8_MAX)

@triton.jit
def round_e4m3(y):
    """Round fp32 to the nearest e4m3 value (ties to even, saturating at 448), still in fp32.

    Only used under the interpreter, whose fp32->fp8 cast does not round correctly; on the
    GPU the hardware conversion (cvt.rn.satfinite) does exactly this."""
    bits = y.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)
    ulp = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    r = ((y / ulp + 12582912.0) - 12582912.0) * ulp
    return tl.minimum(tl.maximum(r, -FP8_MAX), FP8_MAX)


@triton.jit
def nvfp4_code_value(idx):
    # table {0, .5, 1, 1.5, 2, 3, 4, 6}
    return tl.where(idx < 4, idx.to(tl.float32) * 0.5,
                    tl.where(idx == 4, 2.0, tl.where(idx == 5, 3.0, tl.where(idx == 6, 4.0, 6.0))))


@triton.jit
def store_nvfp4_chunk(S, rc_ptr, bs_ptr, rows, c, mask_v, gs, K: tl.constexpr, BKC: tl.constexpr,
                      BV: tl.constexpr, SHARED_QUANT: tl.constexpr, INTERPRET: tl.constexpr):
    """NVFP4-quantize column chunk c (whole 16-blocks) of rows of one head (reference.quant.quant_nvfp4):
    e4m3 block scale bs = e4m3(amax/6/gs), e2m1 code of |x|/(bs*gs) (ties to the lower magnitude),
    two codes per byte (even element in the low nibble). Returns the dequantized chunk (for shared
    mode) or S unchanged."""
    NB: tl.constexpr = BKC // 16
    S3 = tl.reshape(S, [BV, NB, 16])
    bamax = tl.max(tl.abs(S3), axis=2)
    bs = tl.minimum(bamax / 6.0 / gs, FP8_MAX)
    if INTERPRET:
        bs = round_e4m3(bs)
    bs8 = bs.to(tl.float8e4nv)
    o_b = c * NB + tl.arange(0, NB)
    tl.store(bs_ptr + rows[:, None] * (K // 16) + o_b[None, :], bs8, mask=mask_v[:, None])
    denom = bs8.to(tl.float32) * gs
    # 1e-38 is below the smallest normal fp32: as a Python float it would make Triton divide and
    # compare in fp64 (and differ from the reference's fp32 division at the code thresholds)
    tiny = tl.full([BV, NB], 1e-38, tl.float32)
    y3 = tl.where(denom[:, :, None] > 0.0, S3 / tl.maximum(denom, tiny)[:, :, None], 0.0)
    ay = tl.abs(y3)
    idx = ((ay > 0.25).to(tl.int32) + (ay > 0.75).to(tl.int32) + (ay > 1.25).to(tl.int32)
           + (ay > 1.75).to(tl.int32) + (ay > 2.5).to(tl.int32) + (ay > 3.5).to(tl.int32)
           + (ay > 5.0).to(tl.int32))
    code = idx | tl.where(y3 < 0.0, 8, 0)
    code2 = tl.reshape(code, [BV, BKC // 2, 2])
    lo, hi = tl.split(code2)
    packed = (lo | (hi << 4)).to(tl.uint8)
    o_p = c * (BKC // 2) + tl.arange(0, BKC // 2)
    tl.store(rc_ptr + rows[:, None] * (K // 2) + o_p[None, :], packed, mask=mask_v[:, None])
    if SHARED_QUANT:
        mag = nvfp4_code_value(idx)
        val = tl.where((code & 8) != 0, -mag, mag) * denom[:, :, None]
        S = tl.reshape(val, [BV, BKC])
    return S


@triton.jit
def _mix32(h):
    h = h ^ (h >> 16)
    h = h * 0x7FEB352D
    h = h ^ (h >> 15)
    h = h * 0x846CA68B
    h = h ^ (h >> 16)
    return h


@triton.jit
def sr_uniform(seed, stream, idx):
    """Counter-based uniform in [0, 1), bit-exact with reference.quant.sr_uniform:
    u = mix(idx ^ mix(seed * 0x9E3779B9 + stream)) >> 8 / 2**24, in uint32 arithmetic."""
    key = _mix32(seed.to(tl.uint32) * 0x9E3779B9 + stream.to(tl.uint32))
    h = _mix32(idx.to(tl.uint32) ^ key)
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def fp16_sr(x, seed, stream, idx):
    """fp32 -> fp16 with stochastic rounding between the two fp16 neighbours of x
    (reference.quant.round_fp16_sr)."""
    x = tl.minimum(tl.maximum(x, -65504.0), 65504.0)
    r = x.to(tl.float16)
    rf = r.to(tl.float32)
    rb = r.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    neg = (rb & 0x8000) != 0
    mag = rb & 0x7FFF
    # next fp16 above r (toward +inf) and below r (toward -inf), as bit patterns
    up_b = tl.where(neg, tl.where(mag == 0, 0x0001, rb - 1), rb + 1)
    dn_b = tl.where(neg, rb + 1, tl.where(mag == 0, 0x8001, rb - 1))
    up = up_b.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    dn = dn_b.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    below = rf < x
    lo = tl.where(below, rf, dn)
    hi = tl.where(below, up, rf)
    p = (x - lo) / (hi - lo)
    u = sr_uniform(seed, stream, idx)
    res = tl.where(u < p, hi, lo)
    res = tl.where(rf == x, rf, res)
    return res.to(tl.float16)


@triton.jit
def load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, o_kc, mask_v,
                     K: tl.constexpr, READ_COPY: tl.constexpr):
    """[BV, BKC] fp32 chunk (rows o_v, columns o_kc) of one head's checkpoint (READ_COPY=0) or of its
    dequantized read copy (READ_COPY=1 fp8 per-row scales, READ_COPY=2 NVFP4). head_rows: int64 index of the
    head's row 0 in the [S*H*Dv] row space; i_head: its index in the [S*H] head space."""
    rows = head_rows + o_v
    if READ_COPY == 0:
        S = tl.load(ckpt_ptr + rows[:, None] * K + o_kc[None, :], mask=mask_v[:, None], other=0.0).to(tl.float32)
    elif READ_COPY == 1:
        S = tl.load(rc_ptr + rows[:, None] * K + o_kc[None, :], mask=mask_v[:, None], other=0.0).to(tl.float32)
        S = S * tl.load(rs_ptr + rows, mask=mask_v, other=0.0)[:, None]
    else:
        byte = tl.load(rc_ptr + rows[:, None] * (K // 2) + (o_kc[None, :] // 2), mask=mask_v[:, None],
                       other=0).to(tl.int32)
        code = tl.where((o_kc[None, :] % 2) == 0, byte & 0xF, (byte >> 4) & 0xF)
        mag = nvfp4_code_value(code & 0x7)
        val = tl.where((code & 0x8) != 0, -mag, mag)
        bs = tl.load(rs_ptr + rows[:, None] * (K // 16) + (o_kc[None, :] // 16), mask=mask_v[:, None],
                     other=0.0).to(tl.float32)
        S = val * bs * tl.load(rgs_ptr + i_head)
    return S


@triton.jit
def read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, READ_COPY: tl.constexpr):
    """Store and return the read copy's scales from the new state's row maxima amax [BV]: fp8
    (READ_COPY=1) per-row scales amax/448, NVFP4 (READ_COPY=2) the per-head global scale max/(448*6) (the whole
    head is in this program). 1.0 where the maximum is 0; the unused one is returned as 1.0."""
    sc = tl.full(amax.shape, 1.0, tl.float32)
    gs = 1.0
    if READ_COPY == 1:
        sc = tl.where(amax == 0.0, 1.0, amax / FP8_MAX)
        tl.store(rs_ptr + rows, sc, mask=mask_v)
    if READ_COPY == 2:
        hmax = tl.max(amax, axis=0)
        gs = tl.where(hmax == 0.0, 1.0, hmax / (FP8_MAX * 6.0))
        tl.store(rgs_ptr + i_head, gs)
    return sc, gs


@triton.jit
def store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_kc, c, mask_v, sc, gs, seed, stream, idx_base,
                      K: tl.constexpr, BKC: tl.constexpr, BV: tl.constexpr, READ_COPY: tl.constexpr,
                      CKPT_SR: tl.constexpr, SHARED_QUANT: tl.constexpr, INTERPRET: tl.constexpr):
    """Write column chunk c (columns o_kc) of a folded state S [BV, BKC]: the read copy (fp8 with
    per-row scales sc, or NVFP4 with global scale gs), then the checkpoint (fp32, or fp16 with
    stochastic rounding). SHARED_QUANT: the checkpoint gets the dequantized read copy."""
    offs = rows[:, None] * K + o_kc[None, :]
    if READ_COPY == 1:
        y = tl.minimum(tl.maximum(S / sc[:, None], -FP8_MAX), FP8_MAX)
        if INTERPRET:
            y = round_e4m3(y)
        y8 = y.to(tl.float8e4nv)
        tl.store(rc_ptr + offs, y8, mask=mask_v[:, None])
        if SHARED_QUANT:
            S = y8.to(tl.float32) * sc[:, None]
    if READ_COPY == 2:
        S = store_nvfp4_chunk(S, rc_ptr, rs_ptr, rows, c, mask_v, gs, K, BKC, BV, SHARED_QUANT, INTERPRET)
    if CKPT_SR:
        idx = idx_base + (o_v[:, None] * K + o_kc[None, :]).to(tl.int64)
        tl.store(ckpt_ptr + offs, fp16_sr(S, seed, stream, idx), mask=mask_v[:, None])
    else:
        tl.store(ckpt_ptr + offs, S.to(ckpt_ptr.dtype.element_ty), mask=mask_v[:, None])


@triton.jit
def store_state_tile(S, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v, seed, stream, idx_base,
                     K: tl.constexpr, BV: tl.constexpr, READ_COPY: tl.constexpr, CKPT_SR: tl.constexpr,
                     SHARED_QUANT: tl.constexpr, INTERPRET: tl.constexpr):
    """Write a new state's whole rows o_v of one head (S [BV, K], fp32, in registers): the read copy's scales
    from the rows' maxima (NVFP4: the whole head is in this program, BV >= Dv), the read copy, the checkpoint."""
    rows = head_rows + o_v
    amax = tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1)
    sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, READ_COPY)
    store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, tl.arange(0, K), 0, mask_v, sc, gs, seed, stream,
                      idx_base, K, K, BV, READ_COPY, CKPT_SR, SHARED_QUANT, INTERPRET)


@triton.jit
def state_tile(slots_ptr, state_ptr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
               BK: tl.constexpr):
    """A conventional-decode program's coordinates and its [BV, BK] fp32 tile of state[slot, head]
    (rows o_v, all K columns), with the offsets and mask to store it back."""
    i_v = tl.program_id(0)
    i_h = tl.program_id(1)
    i_b = tl.program_id(2)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, BK)
    mask_v = o_v < V
    mask_k = o_k < K
    mask2 = mask_v[:, None] & mask_k[None, :]
    offs = ((slot * H + i_h) * V + o_v[:, None]) * K + o_k[None, :]
    S = tl.load(state_ptr + offs, mask=mask2, other=0.0).to(tl.float32)
    return i_v, i_h, i_b, o_v, mask_v, o_k, mask_k, offs, mask2, S
