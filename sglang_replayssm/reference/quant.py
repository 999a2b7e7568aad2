"""Quantizers for the checkpoint read copy and the fp16 recurrence checkpoint.

Plain PyTorch; these definitions are the bit-exact contract the Triton kernels follow
(docs/layout.md). All functions work on the trailing ``[..., H, Dv, Dk]`` state layout.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
NVFP4_BLOCK = 16
_MASK32 = 0xFFFFFFFF


# ----------------------------------------------------------------------------- fp8 e4m3, per row
def quant_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize along the last dim with one fp32 scale per row: returns (fp8 values, scales)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (xf / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequant_fp8_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.unsqueeze(-1)


# ----------------------------------------------------------------------------- NVFP4
def _e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code (ties to the lower magnitude), sign in bit 3, as uint8."""
    mids = torch.tensor(E2M1_MIDPOINTS, dtype=torch.float32, device=y.device)
    idx = (y.abs().unsqueeze(-1) > mids).sum(-1).to(torch.uint8)
    sign = (y < 0).to(torch.uint8) << 3
    return idx | sign


def _e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    mag = table[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def quant_nvfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 of ``[..., H, Dv, Dk]``: (packed uint8 ``[..., Dk/2]``, e4m3 block scales
    ``[..., Dk/16]``, fp32 global scale per head ``[..., H]``)."""
    if x.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 needs the last dim to be a multiple of {NVFP4_BLOCK}, got {x.shape[-1]}")
    xf = x.float()
    gamax = xf.abs().amax(dim=(-1, -2))
    gs = torch.where(gamax > 0, gamax / (FP8_MAX * 6.0), torch.ones_like(gamax))
    blocks = xf.unflatten(-1, (-1, NVFP4_BLOCK))
    bamax = blocks.abs().amax(dim=-1)
    gsb = gs[..., None, None]
    bs = (bamax / 6.0 / gsb).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    denom = bs.float() * gsb
    y = torch.where(denom[..., None] > 0, blocks / denom[..., None].clamp(min=1e-38), torch.zeros_like(blocks))
    codes = _e2m1_codes(y).flatten(-2)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, bs, gs


def dequant_nvfp4(packed: torch.Tensor, bscale: torch.Tensor, gscale: torch.Tensor) -> torch.Tensor:
    lo = _e2m1_values(packed & 0xF)
    hi = _e2m1_values(packed >> 4)
    vals = torch.stack([lo, hi], dim=-1).flatten(-2)
    blocks = vals.unflatten(-1, (-1, NVFP4_BLOCK))
    scale = bscale.float() * gscale[..., None, None]
    return (blocks * scale[..., None]).flatten(-2)


# ----------------------------------------------------------------------------- fp16 stochastic rounding
def _mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finalizer (xorshift-multiply), computed in int64 and masked."""
    h = h & _MASK32
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & _MASK32
    h = h ^ (h >> 15)
    h = (h * 0x846CA68B) & _MASK32
    h = h ^ (h >> 16)
    return h


def sr_uniform(seed: int | torch.Tensor, stream: int | torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Deterministic uniform in [0, 1) with 24 random bits, from (seed, stream, element index).

    ``u = mix(idx ^ mix(seed * 0x9E3779B9 + stream)) >> 8 / 2**24`` in uint32 arithmetic.
    """
    seed = torch.as_tensor(seed, dtype=torch.int64, device=idx.device)
    stream = torch.as_tensor(stream, dtype=torch.int64, device=idx.device)
    key = _mix32((seed * 0x9E3779B9 + stream) & _MASK32)
    h = _mix32((idx.to(torch.int64) & _MASK32) ^ key)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def round_fp16_sr(x: torch.Tensor, seed: int, stream: int | torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Stochastically round fp32 ``x`` to fp16: up with probability (x - lo) / (hi - lo)."""
    xf = x.float().clamp(-65504.0, 65504.0)
    near = xf.half()
    nf = near.float()
    lo = torch.where(nf <= xf, near, torch.nextafter(near, torch.full_like(near, -float("inf"))))
    hi = torch.where(nf >= xf, near, torch.nextafter(near, torch.full_like(near, float("inf"))))
    gap = hi.float() - lo.float()
    p_up = torch.where(gap > 0, (xf - lo.float()) / torch.where(gap > 0, gap, torch.ones_like(gap)), torch.zeros_like(gap))
    u = sr_uniform(seed, stream, idx)
    return torch.where(u < p_up, hi, lo)


def state_element_index(shape: tuple[int, int, int], layer: int, device=None) -> torch.Tensor:
    """Element index inside one slot's layer state ``[H, Dv, Dk]``, offset by ``layer * H*Dv*Dk``."""
    h, dv, dk = shape
    n = h * dv * dk
    return (torch.arange(n, device=device, dtype=torch.int64) + layer * n).view(h, dv, dk)


# ----------------------------------------------------------------------------- round trips
def fake_quant(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Quantize + dequantize ``[..., H, Dv, Dk]`` (the value a read copy of ``kind`` holds)."""
    if kind == "fp8":
        return dequant_fp8_rows(*quant_fp8_rows(x))
    if kind == "nvfp4":
        return dequant_nvfp4(*quant_nvfp4(x))
    if kind == "none":
        return x.float()
    raise ValueError(f"unknown read copy kind {kind!r} (expected none, fp8 or nvfp4)")
