"""Decode / verify attention over the per-slot KV cache, in Triton (used on CUDA for T <= 16 query
tokens per sequence; prefill and CPU use PyTorch SDPA in model.py).

One program per (sequence, KV head) reads that sequence's keys and values straight from the cache
(`[S, L, Hkv, D]`, indexed by slot: no gathered copy) once, for all the query rows that share the KV
head (T tokens x G = H / Hkv heads), with an online softmax. Query row r attends to key positions
<= qpos[r].

Split KV ("flash decoding"): with few (sequence, KV head) pairs (at most half the SMs), those
programs are too few to fill the GPU and each is a long serial loop over the keys. Then the keys are
cut into NSPLIT chunks of CHUNK keys (a whole number of key blocks), and stage 1 runs one program per
(sequence, KV head, chunk) that writes the chunk's unnormalised softmax state (running max m, sum l, acc = sum of
exp(s - m) v) to fp32 scratch; a row that sees no key of its chunk (all past qpos, or none left)
writes m = -1e30, l = 0, acc = 0. Stage 2 merges the NSPLIT partials of each row, rescaling each by
exp(m_s - max_s m_s), and writes acc / l (0 for a row that saw no key). NSPLIT depends on the shapes
and length only (no sync, fixed at CUDA-graph capture); NSPLIT = 1 is the single-pass kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device_info import sm_count

NEG = tl.constexpr(-1.0e30)   # a global a kernel reads must be a constexpr (compiled Triton refuses others)
# the NSPLIT heuristic (default_num_splits; bench/attention.py measured it on an H200)
MIN_CHUNK = 64                # keys per split at least
MAX_SPLITS = 16


@triton.jit
def _attn_kernel(q_ptr, k_ptr, v_ptr, slots_ptr, qpos_ptr, out_ptr, m_ptr, l_ptr, scale, length, chunk,
                 s_ks, s_kl, s_kh, HKV: tl.constexpr, R: tl.constexpr, D: tl.constexpr,
                 BR: tl.constexpr, BD: tl.constexpr, BL: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr):
    """SPLIT False: grid (B, Hkv), all keys, normalised rows to out [B, Hkv, R, D].
    SPLIT True: grid (B, Hkv, NSPLIT), keys [s * chunk, (s + 1) * chunk), m, l [B, Hkv, NSPLIT, R]
    and acc (to out [B, Hkv, NSPLIT, R, D]) in fp32."""
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
    if SPLIT:
        lo = tl.program_id(2) * chunk
        hi = tl.minimum(lo + chunk, length)
    else:
        lo = 0
        hi = length
    m = tl.full((BR,), NEG, tl.float32)
    l = tl.zeros((BR,), tl.float32)
    acc = tl.zeros((BR, BD), tl.float32)
    kbase = slot * s_ks + i_h * s_kh
    for start in range(lo, hi, BL):
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
    if SPLIT:
        # keys a row sees are a prefix, so it saw one here iff qpos >= lo (and the chunk is not empty);
        # a row that saw none summed exp(NEG - NEG) = 1 per masked key: drop that
        seen = (qpos >= lo) & (lo < hi)
        part = ((i_b * HKV + i_h) * tl.num_programs(2) + tl.program_id(2)).to(tl.int64) * R + rows
        tl.store(m_ptr + part, m, mask=row_ok)
        tl.store(l_ptr + part, tl.where(seen, l, 0.0), mask=row_ok)
        tl.store(out_ptr + part[:, None] * D + dims[None, :], tl.where(seen[:, None], acc, 0.0),
                 mask=row_ok[:, None] & dim_ok[None, :])
    else:
        out = acc / tl.where(l > 0, l, 1.0)[:, None]
        tl.store(out_ptr + (base + rows[:, None]) * D + dims[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & dim_ok[None, :])


@triton.jit
def _combine_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, NS, HKV: tl.constexpr, R: tl.constexpr,
                    D: tl.constexpr, BS: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    """Grid (B, Hkv): out[b, h, r] = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s, M = max_s m_s."""
    i_bh = (tl.program_id(0) * HKV + tl.program_id(1)).to(tl.int64)
    rows = tl.arange(0, BR)
    dims = tl.arange(0, BD)
    splits = tl.arange(0, BS)
    row_ok = rows < R
    mask = row_ok[:, None] & (dims < D)[None, :]
    ms = tl.load(m_ptr + (i_bh * NS + splits[:, None]) * R + rows[None, :],
                 mask=(splits < NS)[:, None] & row_ok[None, :], other=NEG)
    m_max = tl.max(ms, axis=0)                                                     # [BR]
    l = tl.zeros((BR,), tl.float32)
    acc = tl.zeros((BR, BD), tl.float32)
    for s in range(NS):
        part = (i_bh * NS + s) * R + rows
        w = tl.exp(tl.load(m_ptr + part, mask=row_ok, other=NEG) - m_max)
        l += w * tl.load(l_ptr + part, mask=row_ok, other=0.0)
        acc += w[:, None] * tl.load(acc_ptr + part[:, None] * D + dims[None, :], mask=mask, other=0.0)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + (i_bh * R + rows[:, None]) * D + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, 1 << (max(n, 1) - 1).bit_length())


def _key_block(BD: int) -> int:
    return 64 if BD <= 128 else 32


def _prec(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def default_num_splits(B: int, Hkv: int, length: int, device: torch.device) -> int:
    """Splits per (sequence, KV head) from the shapes only: split only while the B * Hkv programs are
    at most half the SMs, into about one program per SM, chunks of at least MIN_CHUNK keys, at most
    MAX_SPLITS. (On an H200 at 512-2048 keys, the single pass already reads the KV at 3.2-4.4 TB/s from
    B * Hkv = 128 programs up, and the extra combine pass and scratch traffic then cost more than the
    split wins: 0.8-1.0x. Below it, 4-32 programs, splitting gives 1.5-2.7x.)"""
    return max(1, min(sm_count(device) // (B * Hkv), length // MIN_CHUNK, MAX_SPLITS))


def _split_partials(q, k_cache, v_cache, slots, qpos, length: int, scale: float, chunk: int, ns: int):
    """Stage 1 on contiguous q and int32 slots / qpos: m, l [B, Hkv, ns, R] and acc [B, Hkv, ns, R, D],
    fp32, of the keys [s * chunk, min((s + 1) * chunk, length)) for split s (chunk a multiple of BL)."""
    B, Hkv, R, D = q.shape
    BD = _pow2(D)
    m = torch.empty(B, Hkv, ns, R, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty(B, Hkv, ns, R, D, device=q.device, dtype=torch.float32)
    _attn_kernel[(B, Hkv, ns)](q, k_cache, v_cache, slots, qpos, acc, m, l, float(scale), length, chunk,
                               k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), HKV=Hkv, R=R, D=D,
                               BR=_pow2(R), BD=BD, BL=_key_block(BD), PREC=_prec(q.dtype), SPLIT=True,
                               num_warps=4)
    return m, l, acc


def cache_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    qpos: torch.Tensor, length: int, scale: float, num_splits: int | None = None) -> torch.Tensor:
    """q [B, Hkv, R, D] (R = T * G query rows per KV head), caches [S, L, Hkv, D] of one layer,
    slots [B] int, qpos [B, R] int (last key position each row sees), keys 0..length-1.
    num_splits: key chunks per (sequence, KV head) (module docstring); None picks it from the shapes
    (default_num_splits), 1 is the single-pass kernel. It is an upper bound: chunks are whole key
    blocks, and only as many as length needs are launched.
    Returns [B, Hkv, R, D] in q's dtype."""
    B, Hkv, R, D = q.shape
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q and the caches must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride() or k_cache.shape[2] != Hkv:
        raise ValueError("k/v caches must be [S, L, Hkv, D] with the same strides, last dim contiguous")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be None or an int >= 1, got {num_splits!r}")
    q = q.contiguous()
    qpos = qpos.to(torch.int32).contiguous()
    slots = slots.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    if B == 0:
        return out
    BD = _pow2(D)
    BL = _key_block(BD)
    length = int(length)
    ns = default_num_splits(B, Hkv, length, q.device) if num_splits is None else num_splits
    chunk = max(BL, triton.cdiv(triton.cdiv(length, ns), BL) * BL)     # whole key blocks
    ns = max(1, triton.cdiv(length, chunk))                             # no empty chunk launched
    if ns == 1:
        _attn_kernel[(B, Hkv)](q, k_cache, v_cache, slots, qpos, out, out, out, float(scale), length, length,
                               k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), HKV=Hkv, R=R, D=D,
                               BR=_pow2(R), BD=BD, BL=BL, PREC=_prec(q.dtype), SPLIT=False, num_warps=4)
        return out
    m, l, acc = _split_partials(q, k_cache, v_cache, slots, qpos, length, scale, chunk, ns)
    # the split count is a runtime argument (BS covers any count up to MAX_SPLITS), so a serving loop whose
    # key count grows does not compile a merge per count
    _combine_kernel[(B, Hkv)](m, l, acc, out, ns, HKV=Hkv, R=R, D=D, BS=_pow2(max(ns, MAX_SPLITS), 2),
                              BR=_pow2(R), BD=BD, num_warps=4)
    return out
