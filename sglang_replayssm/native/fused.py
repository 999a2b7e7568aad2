"""Fused element-wise work of the native model's non-SSM layers, in Triton (used on CUDA by default:
`HybridModel(fused=None)`; the PyTorch code in model.py stays the CPU path and the oracle).

Why: a bf16 decode step at batch 256 spends most of its non-SSM time in many small kernels per
layer (RMSNorm alone is ~6 fp32 element-wise ops, the Mamba-2 gated group norm ~10, the depthwise
conv a gather + unfold + multiply + scatter, RoPE ~12 for q and k). Each kernel below replaces one such
chain with one launch; the arithmetic is the PyTorch path's (fp32 math, roundings to the activation
dtype at the same points, same order of operations), so results agree to fp32 rounding.

  add_rms_norm     h = h + x (residual, rounded to h's dtype); y = rms_norm(h) * w       (1 launch)
  group_rms_norm   per-group RMSNorm of [R, G, N] with an optional SiLU gate, applied before the norm
                   (Mamba-2 / Nemotron-H gated norm) or after it (GDN output norm)            (1 launch)
  norm_rope        per-head q/k RMSNorm + rotary embedding, written to a tensor or straight into
                   the KV cache at (slot, position) (also plain K/V cache writes)            (1 launch)
  act_mul          act(a) * b (gated MLP, attention output gate) or act(a)                   (1 launch)
  conv_update      depthwise causal conv + SiLU of T = 1..16 tokens per row, reading the pool's
                   conv state in place by slot; writes the state back (decode, prefill) or the
                   conv inputs into pool.conv_in (verify; the commit moves the state)        (1 launch)

Every wrapper validates its arguments and raises ValueError naming the bad one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_CONV_TOKENS = 16
# conv_update's default launch: 512 channels per program, a warp per 128 of them. H200, bf16, K = 4, one token
# per row (bench/conv_update.py, CUDA graphs): 19.8 us at B = 256, C = 8192, against 30.6 us with 1024 channels
# in 4 warps (256 per warp; 1.55x, the same at B = 64 and 512 and for C = 9728); 64 or 128 per warp: 1.42-1.49x.
CONV_BLOCK_C = 512
CONV_CHANNELS_PER_WARP = 128
_ACTS = {"silu": 0, "relu2": 1, "sigmoid": 2}


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(max(int(n), 1)))


def _warps(block: int) -> int:
    """Warps for a 1-D block of a row-wise kernel: one per 256 elements, 1 to 8."""
    return max(1, min(8, block // 256))


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """[..., N] -> [R, N] view (copy only if the leading dims cannot be merged); last stride 1."""
    _need(t.dim() >= 1, f"{name} must have at least one dimension")
    t2 = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
    if t2.shape[-1] > 1 and t2.stride(-1) != 1:
        t2 = t2.contiguous()
    return t2


# --------------------------------------------------------------------------- (a) residual add + RMSNorm
@triton.jit
def _add_rms_norm_kernel(h_ptr, x_ptr, w_ptr, h_out_ptr, y_ptr, N, eps, s_h, s_x, s_ho, s_y,
                         HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    h = tl.load(h_ptr + row * s_h + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:   # the residual stream is stored in its own dtype, and the norm reads the stored value
        x = tl.load(x_ptr + row * s_x + cols, mask=m, other=0.0).to(tl.float32)
        hr = (h + x).to(h_out_ptr.dtype.element_ty)
        tl.store(h_out_ptr + row * s_ho + cols, hr, mask=m)
        h = hr.to(tl.float32)
    r = tl.math.rsqrt(tl.sum(h * h, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * s_y + cols, (w * (h * r)).to(y_ptr.dtype.element_ty), mask=m)


def add_rms_norm(h: torch.Tensor, x: torch.Tensor | None, w: torch.Tensor, eps: float):
    """(h + x, rms_norm(h + x) * w), both in h's dtype; x None: (h, rms_norm(h) * w).
    h, x: [..., N] (same shape), w: [N]. Same math as blocks.rms_norm after `h = h + x`."""
    _need(h.dim() >= 1 and w.dim() == 1 and w.shape[0] == h.shape[-1],
          f"add_rms_norm: weight shape {tuple(w.shape)} does not match h {tuple(h.shape)}")
    _need(x is None or x.shape == h.shape, f"add_rms_norm: x {None if x is None else tuple(x.shape)} "
                                           f"and h {tuple(h.shape)} differ")
    _need(x is None or x.dtype == h.dtype, f"add_rms_norm: x dtype {getattr(x, 'dtype', None)} != h dtype {h.dtype}")
    N = h.shape[-1]
    BLOCK = _pow2(N)
    _need(BLOCK <= 65536, f"add_rms_norm: rows of {N} elements are too long for one program")
    h2 = _rows(h, "h")
    x2 = h2 if x is None else _rows(x, "x")
    w = w.contiguous()
    h_out = torch.empty(h2.shape, device=h.device, dtype=h.dtype) if x is not None else h2
    y = torch.empty(h2.shape, device=h.device, dtype=h.dtype)
    if h2.shape[0]:
        _add_rms_norm_kernel[(h2.shape[0],)](h2, x2, w, h_out, y, N, float(eps), h2.stride(0), x2.stride(0),
                                             h_out.stride(0), y.stride(0), HAS_RES=x is not None, BLOCK=BLOCK,
                                             num_warps=_warps(BLOCK))
    return (h if x is None else h_out.view(h.shape)), y.view(h.shape)


# --------------------------------------------------------------------------- (b) gated group RMSNorm
@triton.jit
def _group_norm_kernel(x_ptr, z_ptr, w_ptr, y_ptr, N, eps, s_xr, s_xg, s_zr, s_zg, s_yr, s_yg, s_wg,
                       GATE: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + r * s_xr + g * s_xg + cols, mask=m, other=0.0).to(tl.float32)
    if GATE != 0:
        z = tl.load(z_ptr + r * s_zr + g * s_zg + cols, mask=m, other=0.0).to(tl.float32)
        z = z * tl.sigmoid(z)
    if GATE == 1:   # Mamba-2 (Nemotron-H): gate before the norm
        x = x * z
    x = x * tl.math.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + g * s_wg + cols, mask=m, other=0.0).to(tl.float32)
    y = w * x
    if GATE == 2:   # GDN: gate after the norm
        y = y * z
    tl.store(y_ptr + r * s_yr + g * s_yg + cols, y.to(y_ptr.dtype.element_ty), mask=m)


def group_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, z: torch.Tensor | None = None,
                   gate: str = "none", out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """RMSNorm over the last axis of x [R, G, N] (per row and group), in fp32, times w, with a SiLU gate z
    [R, G, N]: gate "before" -> norm(x * silu(z)) * w (Mamba-2), "after" -> norm(x) * w * silu(z) (GDN),
    "none" -> norm(x) * w. w: [G * N] (one weight per channel) or [N] (shared by the groups).
    x and z may be strided views (last stride 1). Returns a contiguous [R, G, N] of out_dtype (x's)."""
    _need(gate in ("none", "before", "after"), f"group_rms_norm: gate must be none/before/after, got {gate!r}")
    _need(x.dim() == 3, f"group_rms_norm: x must be [R, G, N], got shape {tuple(x.shape)}")
    R, G, N = x.shape
    _need((z is None) == (gate == "none"), "group_rms_norm: z is needed exactly when gate is before/after")
    _need(z is None or tuple(z.shape) == tuple(x.shape),
          f"group_rms_norm: z shape {None if z is None else tuple(z.shape)} != x shape {tuple(x.shape)}")
    _need(w.dim() == 1 and w.shape[0] in (N, G * N),
          f"group_rms_norm: weight has shape {tuple(w.shape)}, expected [{N}] or [{G * N}]")
    BLOCK = _pow2(N)
    _need(BLOCK <= 65536, f"group_rms_norm: groups of {N} elements are too long for one program")
    if N > 1 and x.stride(-1) != 1:
        x = x.contiguous()
    if z is not None and N > 1 and z.stride(-1) != 1:
        z = z.contiguous()
    w = w.contiguous()
    y = torch.empty((R, G, N), device=x.device, dtype=out_dtype or x.dtype)
    zz = x if z is None else z
    if R and G:
        _group_norm_kernel[(R, G)](x, zz, w, y, N, float(eps), x.stride(0), x.stride(1), zz.stride(0), zz.stride(1),
                                   y.stride(0), y.stride(1), N if w.shape[0] == G * N else 0,
                                   GATE={"none": 0, "before": 1, "after": 2}[gate], BLOCK=BLOCK,
                                   num_warps=_warps(BLOCK))
    return y


# --------------------------------------------------------------------------- q/k norm + RoPE (+ KV cache write)
@triton.jit
def _norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, slots_ptr, out_ptr, D, T, eps,
                      s_xb, s_xt, s_xh, s_ob, s_ot, s_oh, s_tab,
                      NORM: tl.constexpr, ROT: tl.constexpr, TO_CACHE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)            # token row b * T + t
    hd = tl.program_id(1).to(tl.int64)
    b = (row // T).to(tl.int64)
    t = (row % T).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < D
    base = x_ptr + b * s_xb + t * s_xt + hd * s_xh
    x = tl.load(base + cols, mask=m, other=0.0)
    odt = out_ptr.dtype.element_ty
    if NORM:   # rms_norm(x) * w, rounded to the activation dtype (as model.rms_norm returns it)
        xf = x.to(tl.float32)
        r = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        y = (w * (xf * r)).to(odt)
    else:
        y = x.to(odt)
    pos = tl.load(pos_ptr + b).to(tl.int64) + t
    if ROT > 0:   # rotate-half on the first ROT channels: out = x * cos + rot(x) * sin, rot = [-x2, x1]
        HALF: tl.constexpr = ROT // 2
        rot = cols < ROT
        partner = tl.where(cols < HALF, cols + HALF, cols - HALF)
        p = tl.load(base + partner, mask=rot, other=0.0)
        if NORM:
            pf = p.to(tl.float32)
            wp = tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32)
            p = (wp * (pf * r)).to(odt)
        else:
            p = p.to(odt)
        p = tl.where(cols < HALF, -p.to(tl.float32), p.to(tl.float32))
        cs = tl.load(cos_ptr + pos * s_tab + cols, mask=rot, other=1.0)
        sn = tl.load(sin_ptr + pos * s_tab + cols, mask=rot, other=0.0)
        roped = (y.to(tl.float32) * cs + p * sn).to(odt)
        y = tl.where(rot, roped, y)
    if TO_CACHE:   # out is one layer's cache [S, L, Hkv, D]: row (slot, position)
        slot = tl.load(slots_ptr + b).to(tl.int64)
        obase = out_ptr + slot * s_ob + pos * s_ot + hd * s_oh
    else:
        obase = out_ptr + b * s_ob + t * s_ot + hd * s_oh
    tl.store(obase + cols, y, mask=m)


def norm_rope(x: torch.Tensor, pos: torch.Tensor, eps: float = 1e-6, w: torch.Tensor | None = None,
              cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, rotary_dim: int = 0,
              cache: torch.Tensor | None = None, slots: torch.Tensor | None = None) -> torch.Tensor:
    """Per-head RMSNorm (w [D], optional) then rotate-half RoPE on the first rotary_dim channels
    (tables cos/sin [P, rotary_dim] fp32, row = position) of x [B, T, H, D] (a strided view, last stride 1),
    token t of row b at position pos[b] + t. Same roundings as blocks.rms_norm then blocks.rope.
    cache None: returns a new contiguous [B, T, H, D]. cache [S, L, H, D] (one layer of KVCache) and
    slots [B]: writes the result at cache[slots[b], pos[b] + t] (replaces KVCache.write) and returns cache."""
    _need(x.dim() == 4, f"norm_rope: x must be [B, T, H, D], got {tuple(x.shape)}")
    B, T, H, D = x.shape
    _need(D == 1 or x.stride(-1) == 1, "norm_rope: x's last dimension must be contiguous")
    _need(w is None or (w.dim() == 1 and w.shape[0] == D),
          f"norm_rope: weight shape {None if w is None else tuple(w.shape)}, expected [{D}]")
    _need(rotary_dim % 2 == 0 and 0 <= rotary_dim <= D, f"norm_rope: bad rotary_dim {rotary_dim} for head dim {D}")
    _need(pos.dim() == 1 and pos.shape[0] == B, f"norm_rope: pos must be [B={B}], got {tuple(pos.shape)}")
    if rotary_dim:
        _need(cos is not None and sin is not None and cos.shape == sin.shape and cos.dim() == 2
              and cos.shape[1] == rotary_dim and cos.stride(-1) == 1 and sin.stride() == cos.stride(),
              f"norm_rope: cos/sin must be [P, {rotary_dim}] tables with the same contiguous rows")
        _need(cos.dtype == torch.float32 and sin.dtype == torch.float32, "norm_rope: cos/sin tables must be fp32")
    if cache is not None:
        _need(cache.dim() == 4 and cache.shape[2] == H and cache.shape[3] == D and cache.stride(-1) == 1,
              f"norm_rope: cache must be [S, L, {H}, {D}] (last dim contiguous), got {tuple(cache.shape)}")
        _need(slots is not None and slots.dim() == 1 and slots.shape[0] == B, "norm_rope: cache writes need slots [B]")
        _need(cache.dtype == x.dtype, f"norm_rope: cache dtype {cache.dtype} != x dtype {x.dtype}")
        out = cache
    else:
        out = torch.empty((B, T, H, D), device=x.device, dtype=x.dtype)
    BLOCK = _pow2(D)
    tab = cos if rotary_dim else pos
    if B * T and H:
        _norm_rope_kernel[(B * T, H)](x, w if w is not None else x, tab, sin if rotary_dim else pos, pos,
                                      slots if slots is not None else pos, out, D, T, float(eps),
                                      x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1),
                                      out.stride(2), tab.stride(0) if rotary_dim else 0,
                                      NORM=w is not None, ROT=rotary_dim, TO_CACHE=cache is not None,
                                      BLOCK=BLOCK, num_warps=1 if BLOCK <= 256 else 2)
    return out


# --------------------------------------------------------------------------- activation * gate
@triton.jit
def _act_mul_kernel(a_ptr, b_ptr, out_ptr, F, G, s_ar, s_ag, s_br, s_bg, s_o, ACT: tl.constexpr,
                    HAS_B: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    r = (pid // G).to(tl.int64)
    g = (pid % G).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < F
    odt = out_ptr.dtype.element_ty
    a = tl.load(a_ptr + r * s_ar + g * s_ag + cols, mask=m, other=0.0).to(tl.float32)
    if ACT == 0:
        a = a * tl.sigmoid(a)
    elif ACT == 1:   # relu(a) rounded, then squared (two roundings, as torch.relu(a).square())
        a = tl.maximum(a, 0.0).to(odt).to(tl.float32)
        a = a * a
    else:
        a = tl.sigmoid(a)
    y = a.to(odt)
    if HAS_B:
        y = (y.to(tl.float32) * tl.load(b_ptr + r * s_br + g * s_bg + cols, mask=m, other=0.0).to(tl.float32)).to(odt)
    tl.store(out_ptr + pid.to(tl.int64) * s_o + cols, y, mask=m)


def _rows3(t: torch.Tensor) -> torch.Tensor:
    """[..., G, F] -> a [R, G, F] view (last stride 1; [..., F] -> [R, 1, F]); copies only if it must."""
    t3 = t.reshape(-1, t.shape[-2], t.shape[-1]) if t.dim() >= 3 else t.reshape(-1, 1, t.shape[-1])
    if t3.shape[-1] > 1 and t3.stride(-1) != 1:
        t3 = t3.contiguous()
    return t3


def act_mul(a: torch.Tensor, b: torch.Tensor | None = None, act: str = "silu") -> torch.Tensor:
    """act(a) * b (or act(a) when b is None), act in silu | relu2 | sigmoid; a, b [..., F] of one shape
    (strided views are fine, e.g. the two halves of a merged gate|up GEMM output, or the attention
    output gate inside the q projection). Same roundings as the PyTorch ops (act rounded to the dtype,
    then the product). Returns a contiguous tensor of a's shape and dtype."""
    _need(act in _ACTS, f"act_mul: act must be one of {sorted(_ACTS)}, got {act!r}")
    _need(a.dim() >= 1, "act_mul: a must have at least one dimension")
    _need(b is None or (b.shape == a.shape and b.dtype == a.dtype),
          f"act_mul: b {None if b is None else (tuple(b.shape), b.dtype)} must match a {(tuple(a.shape), a.dtype)}")
    shape, F = a.shape, a.shape[-1]
    a3 = _rows3(a)
    b3 = a3 if b is None else _rows3(b)
    R, G = a3.shape[0], a3.shape[1]
    out = torch.empty((R * G, F), device=a.device, dtype=a.dtype)
    BLOCK = min(_pow2(F), 1024)
    if R * G and F:
        _act_mul_kernel[(R * G, triton.cdiv(F, BLOCK))](a3, b3, out, F, G, a3.stride(0), a3.stride(1), b3.stride(0),
                                                        b3.stride(1), out.stride(0), ACT=_ACTS[act],
                                                        HAS_B=b is not None, BLOCK=BLOCK, num_warps=_warps(BLOCK))
    return out.view(shape)


# --------------------------------------------------------------------------- (c) depthwise causal conv update
@triton.jit
def _conv_kernel(x_ptr, state_ptr, w_ptr, bias_ptr, slots_ptr, out0_ptr, out1_ptr, out2_ptr, cin_ptr, C, S1, S2,
                 s_xb, s_xt, s_ss, s_sc, s_wc, s_cs, s_ct,
                 T: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr, VERIFY: tl.constexpr,
                 BLOCK_C: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m = ch < C
    slot = tl.load(slots_ptr + b).to(tl.int64)
    chl = ch.to(tl.int64)
    sbase = state_ptr + slot * s_ss + chl * s_sc       # conv state of this slot: [C, K-1], oldest first
    xbase = x_ptr + b * s_xb + chl
    act = x_ptr.dtype.element_ty
    odt = out0_ptr.dtype.element_ty
    # the window of token t is columns t .. t+K-1 of xa = [state (K-1 columns) | x (T columns)]
    for t in tl.static_range(T):
        acc = tl.zeros((BLOCK_C,), tl.float32)
        for k in tl.static_range(K):
            if t + k < K - 1:
                v = tl.load(sbase + (t + k), mask=m, other=0.0).to(act).to(tl.float32)
            else:
                v = tl.load(xbase + (t + k - (K - 1)) * s_xt, mask=m, other=0.0).to(tl.float32)
            acc += v * tl.load(w_ptr + chl * s_wc + k, mask=m, other=0.0).to(tl.float32)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + ch, mask=m, other=0.0).to(tl.float32)
        y = (acc * tl.sigmoid(acc)).to(odt)
        # channels [0, S1), [S1, S2), [S2, C) go to three contiguous [B, T, width] outputs
        row = b * T + t
        tl.store(out0_ptr + row * S1 + chl, y, mask=m & (ch < S1))
        tl.store(out1_ptr + row * (S2 - S1) + (chl - S1), y, mask=m & (ch >= S1) & (ch < S2))
        tl.store(out2_ptr + row * (C - S2) + (chl - S2), y, mask=m & (ch >= S2))
    if VERIFY:   # keep the draft tokens' conv inputs; SSMOps.accept_drafts / pool.accept_drafts move the state
        for t in tl.static_range(T):
            v = tl.load(xbase + t * s_xt, mask=m, other=0.0)
            tl.store(cin_ptr + slot * s_cs + t * s_ct + chl, v.to(cin_ptr.dtype.element_ty), mask=m)
    else:        # new state = columns T .. T+K-2 of xa, in place
        # the compiler may give these loads/stores another thread layout than the reads above: the barrier
        # orders every thread's reads of the old state before any write; below, each element is read and
        # written by one thread, and column j is written only after columns > j were read
        tl.debug_barrier()
        for j in tl.static_range(K - 1):
            if T + j < K - 1:
                v = tl.load(sbase + (T + j), mask=m, other=0.0).to(act)
            else:
                v = tl.load(xbase + (T + j - (K - 1)) * s_xt, mask=m, other=0.0)
            tl.store(sbase + j, v.to(state_ptr.dtype.element_ty), mask=m)


def conv_update(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                slots: torch.Tensor, conv_in: torch.Tensor | None = None, splits: list | None = None, *,
                block_c: int | None = None, num_warps: int | None = None):
    """Depthwise causal conv + SiLU of x [B, T, C] (T = 1..16, a strided view with contiguous channels),
    continuing each row from its conv state `state[slots[b]]` ([S, C, K-1]: one layer of pool.conv), with
    weight [C, K] and bias [C] or None; fp32 math, as model._conv. conv_in None (decode, prefill): the
    state of each slot becomes the last K-1 inputs, in place. conv_in [S, D, C] (one layer of
    pool.conv_in, verify): x is stored at conv_in[slots[b], :T] and the state is left alone.
    Returns y [B, T, C] in x's dtype; with splits (up to 3 channel counts summing to C, e.g. the
    x | B | C or q | k | v parts) a tuple of contiguous [B, T, split] tensors instead, so that the SSM
    kernels get contiguous inputs without a copy each. Slots must be distinct (rows sharing a padding
    slot only garble that slot's state, as the PyTorch scatter does). block_c (a power of 2 >= 16) and
    num_warps: the launch's channel block and warps (default CONV_BLOCK_C channels, one warp per
    CONV_CHANNELS_PER_WARP of them)."""
    _need(x.dim() == 3, f"conv_update: x must be [B, T, C], got {tuple(x.shape)}")
    B, T, C = x.shape
    _need(1 <= T <= MAX_CONV_TOKENS, f"conv_update: T={T} tokens per row, the kernel takes 1..{MAX_CONV_TOKENS}")
    _need(weight.dim() == 2 and weight.shape[0] == C,
          f"conv_update: weight must be [C={C}, K], got {tuple(weight.shape)}")
    K = weight.shape[1]
    _need(K >= 1, "conv_update: conv kernel width must be >= 1")
    _need(state.dim() == 3 and state.shape[1] == C and state.shape[2] == K - 1,
          f"conv_update: state must be [S, {C}, {K - 1}], got {tuple(state.shape)}")
    _need(K == 1 or state.stride(2) == 1, "conv_update: state's last dimension must be contiguous")
    _need(bias is None or (bias.dim() == 1 and bias.shape[0] == C), f"conv_update: bias must be [{C}]")
    _need(slots.dim() == 1 and slots.shape[0] == B, f"conv_update: slots must be [B={B}], got {tuple(slots.shape)}")
    _need(not slots.is_floating_point(), f"conv_update: slots must be integers, got {slots.dtype}")
    sizes = [C] if splits is None else [int(n) for n in splits]
    _need(1 <= len(sizes) <= 3 and sum(sizes) == C and min(sizes) >= 0,
          f"conv_update: splits {splits} must be 1 to 3 channel counts summing to C={C}")
    if conv_in is not None:
        _need(conv_in.dim() == 3 and conv_in.shape[2] == C and conv_in.stride(2) == 1 and T <= conv_in.shape[1]
              and conv_in.shape[0] == state.shape[0],
              f"conv_update: conv_in must be [S, >= {T}, {C}] with contiguous channels, got {tuple(conv_in.shape)}")
    if C > 1 and x.stride(2) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    outs = [torch.empty((B, T, n), device=x.device, dtype=x.dtype) for n in sizes]
    padded = outs + [outs[-1]] * (3 - len(outs))
    S1 = sizes[0]
    S2 = S1 + (sizes[1] if len(sizes) > 1 else 0)
    _need(block_c is None or (isinstance(block_c, int) and block_c >= 16 and block_c & (block_c - 1) == 0),
          f"conv_update: block_c must be None or a power of 2 >= 16, got {block_c!r}")
    _need(num_warps is None or num_warps in (1, 2, 4, 8),
          f"conv_update: num_warps must be None or 1, 2, 4, 8, got {num_warps!r}")
    BLOCK_C = block_c or min(_pow2(C, 32), CONV_BLOCK_C)
    num_warps = num_warps or max(1, min(8, BLOCK_C // CONV_CHANNELS_PER_WARP))
    cin = conv_in if conv_in is not None else x
    if B and C:
        _conv_kernel[(B, triton.cdiv(C, BLOCK_C))](
            x, state, weight, bias if bias is not None else weight, slots, *padded, cin, C, S1, S2,
            x.stride(0), x.stride(1), state.stride(0), state.stride(1), weight.stride(0),
            cin.stride(0), cin.stride(1),
            T=T, K=K, HAS_BIAS=bias is not None, VERIFY=conv_in is not None, BLOCK_C=BLOCK_C,
            num_warps=num_warps)
    return outs[0] if splits is None else tuple(outs)
