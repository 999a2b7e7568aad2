"""Decode / verify attention over the per-slot KV cache, in Triton (used on CUDA for T <= 16 query
tokens per sequence; prefill and CPU use PyTorch SDPA in model.py).

One program per (sequence, KV head) reads that sequence's keys and values straight from the cache
(`[S, L, Hkv, D]`, indexed by slot: no gathered copy) once, for all the query rows that share the KV
head (T tokens x G = H / Hkv heads), with an online softmax. Query row r attends to key positions
<= qpos[r].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NEG = tl.constexpr(-1.0e30)   # a global a kernel reads must be a constexpr (compiled Triton refuses others)


@triton.jit
def _attn_kernel(q_ptr, k_ptr, v_ptr, slots_ptr, qpos_ptr, out_ptr, scale, length,
                 s_ks, s_kl, s_kh, HKV: tl.constexpr, R: tl.constexpr, D: tl.constexpr,
                 BR: tl.constexpr, BD: tl.constexpr, BL: tl.constexpr, PREC: tl.constexpr):
    i_b = tl.program_id(0)
    i_h = tl.program_id(1)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    rows = tl.arange(0, BR)
    dims = tl.arange(0, BD)
    row_ok = rows < R
    dim_ok = dims < D
    base = ((i_b * HKV + i_h) * R).to(tl.int64)
    q = tl.load(q_ptr + (base + rows[:, None]) * D + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :],
                other=0.0)
    qpos = tl.load(qpos_ptr + i_b * R + rows, mask=row_ok, other=-1)
    m = tl.full((BR,), NEG, tl.float32)
    l = tl.zeros((BR,), tl.float32)
    acc = tl.zeros((BR, BD), tl.float32)
    kbase = slot * s_ks + i_h * s_kh
    for start in range(0, length, BL):
        keys = start + tl.arange(0, BL)
        key_ok = keys < length
        off = kbase + keys[:, None].to(tl.int64) * s_kl + dims[None, :]
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + off, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale             # [BR, BL], fp32 accumulate
        s = tl.where((keys[None, :] <= qpos[:, None]) & key_ok[None, :], s, NEG)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + off, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + (base + rows[:, None]) * D + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, 1 << (max(n, 1) - 1).bit_length())


def cache_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    qpos: torch.Tensor, length: int, scale: float) -> torch.Tensor:
    """q [B, Hkv, R, D] (R = T * G query rows per KV head), caches [S, L, Hkv, D] of one layer,
    slots [B] int, qpos [B, R] int (last key position each row sees), keys 0..length-1.
    Returns [B, Hkv, R, D] in q's dtype."""
    B, Hkv, R, D = q.shape
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q and the caches must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride() or k_cache.shape[2] != Hkv:
        raise ValueError("k/v caches must be [S, L, Hkv, D] with the same strides, last dim contiguous")
    q = q.contiguous()
    qpos = qpos.to(torch.int32).contiguous()
    slots = slots.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    if B == 0:
        return out
    BD = _pow2(D)
    BL = 64 if BD <= 128 else 32
    _attn_kernel[(B, Hkv)](q, k_cache, v_cache, slots, qpos, out, float(scale), int(length),
                           k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                           HKV=Hkv, R=R, D=D, BR=_pow2(R), BD=BD, BL=BL,
                           PREC="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4)
    return out
