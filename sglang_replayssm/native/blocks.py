"""The per-layer maths of the hybrid decoder, as pure functions over a weight dict: one definition, used by
the engine's `model.HybridModel.forward` and by the whole-sequence forward of `tools/tiny_lm.py`
(training, and `bench/fidelity.py`'s teacher-forced replay).

Weights are the canonical names of `model.param_shapes` (`b{i}.xxx`) after `merge_projections` (one
GEMM per group of projections of the same input: attention `qkv`, MLP `gate_up`, GDN `in_proj`).
Each block is split where its memory comes in, and only that part differs between the callers:

  * SSM blocks: `mamba2_in` / `gdn_in` (projections), then the causal conv and the SSM core (the engine:
    the pool's conv state and `SSMOps.run`, Triton or reference; the whole-sequence forward: a zero-state
    conv over the sequence and a chunked or windowed recurrence), `mamba2_ssm_inputs` / `gdn_ssm_inputs`
    (the raw core inputs in the signature of `reference.mamba2` / `reference.gdn`), then `mamba2_out` /
    `gdn_out` (gated group norm, output projection).
  * attention: `attention_qkv`, `qk_norm_rope` (the PyTorch path; the engine's fused path does it in
    `fused.norm_rope` straight into the KV cache), the attention itself (the engine: over the per-slot
    KV cache; the whole-sequence forward: causal SDPA), then `attention_out` (output gate, projection).
  * `mlp`, `rms_norm`, `rope`, `lm_logits` are whole.

`fused=True` runs the element-wise parts through the Triton kernels of fused.py (the engine on CUDA);
the PyTorch code here is the CPU path, their oracle, and the differentiable training path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import HybridConfig


# --------------------------------------------------------------------------- small functions
def rms_norm(x, w, eps):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (w * xf).to(x.dtype)


def linear(x, w, b=None):
    return F.linear(x, w, b)


_MM_OUT_DTYPE = [None]   # whether torch.mm takes out_dtype here (CUDA, torch >= 2.8): probed on first use


def logits_fp32(h, w):
    """h @ w^T in fp32. On CUDA with bf16/fp16 the GEMM writes fp32 directly (torch.mm's out_dtype: no rounding
    of the logits to h's dtype, and no separate conversion pass over [B, vocab], 0.19 ms at B = 256 with a
    248k vocabulary on an H200); elsewhere, or where torch.mm has no out_dtype, linear(h, w).float()."""
    if h.is_cuda and h.dtype in (torch.bfloat16, torch.float16) and _MM_OUT_DTYPE[0] is not False:
        try:
            out = torch.mm(h.reshape(-1, h.shape[-1]), w.t(), out_dtype=torch.float32)
            _MM_OUT_DTYPE[0] = True
            return out.view(*h.shape[:-1], w.shape[0])
        except (TypeError, RuntimeError, NotImplementedError):
            if _MM_OUT_DTYPE[0]:   # it worked before: a real error
                raise
            _MM_OUT_DTYPE[0] = False
    return linear(h, w).float()


def lm_logits(cfg: HybridConfig, w: dict, h):
    """The LM head (tied to the embeddings or not, optional fp32 bias) on the final-normed h: fp32 logits."""
    logits = logits_fp32(h, w["embed"] if cfg.tie_word_embeddings else w["lm_head"])
    if "lm_head_bias" in w:
        logits = logits + w["lm_head_bias"]
    return logits


def rope_tables(n: int, rotary_dim: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, rotary_dim] (fp32) of positions 0..n-1, rotate-half layout (frequencies repeated)."""
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim))
    freqs = torch.arange(n, device=device, dtype=torch.float32)[:, None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rope(x, cos, sin):
    """Rotary embedding (rotate-half form) on the first rotary_dim = cos.shape[-1] channels.
    x: [B, T, H, D]; cos, sin: [B, T, rotary_dim] fp32 (rows of `rope_tables` gathered by position;
    a leading 1 broadcasts over the batch)."""
    rotary_dim = cos.shape[-1]
    if rotary_dim == 0:
        return x
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    xr, xp = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    x1, x2 = xr.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat(((xr * cos + rotated * sin).to(x.dtype), xp), dim=-1)


# --------------------------------------------------------------------------- weights
def merge_projections(cfg: HybridConfig, w: dict) -> dict:
    """In place: one weight (and bias) per group of projections of the same input, concatenated along the
    output dimension (attention q|k|v -> `qkv`, gated MLP gate|up -> `gate_up`, GDN in_qkv|in_z|in_a|in_b
    -> `in_proj`); the separate entries are removed (the engine keeps no second copy). Returns w.
    torch.cat keeps gradients: the training forward merges a shallow copy of its parameters."""

    def merge(p, new, names, bias_names=None):
        w[p + new] = torch.cat([w.pop(p + n) for n in names], dim=0)
        if bias_names is not None:
            w[p + new + "_bias"] = torch.cat([w.pop(p + b) if isinstance(b, str) else b for b in bias_names])

    for i, kind in enumerate(cfg.blocks):
        p = f"b{i}."
        if kind == "attention":
            merge(p, "qkv", ["q", "k", "v"], ["q_bias", "k_bias", "v_bias"] if cfg.attn_bias else None)
        elif kind == "mlp" and cfg.mlp_gated:
            bias = None
            if cfg.mlp_bias:   # the gate has no bias: zeros in its half
                up_bias = w[p + "up_bias"]
                bias = [torch.zeros(cfg.intermediate_size, device=up_bias.device, dtype=up_bias.dtype), "up_bias"]
            merge(p, "gate_up", ["gate", "up"], bias)
        elif kind == "ssm" and cfg.family == "gdn":
            merge(p, "in_proj", ["in_qkv", "in_z", "in_a", "in_b"])
    return w


# --------------------------------------------------------------------------- MLP
def mlp(cfg: HybridConfig, w: dict, p: str, x, fused: bool = False):
    """(Gated) MLP of block prefix p over x [B, T, hid]."""
    if cfg.mlp_gated:
        gate, up = linear(x, w[p + "gate_up"], w.get(p + "gate_up_bias")).split(cfg.intermediate_size, dim=-1)
    else:
        gate, up = linear(x, w[p + "up"], w.get(p + "up_bias")), None
    if fused:
        from .fused import act_mul
        act = act_mul(gate, up, cfg.mlp_act)
    else:
        act = F.silu(gate) if cfg.mlp_act == "silu" else torch.relu(gate).square()
        if up is not None:
            act = act * up
    return linear(act, w[p + "down"], w.get(p + "down_bias"))


# --------------------------------------------------------------------------- attention
def attention_qkv(cfg: HybridConfig, w: dict, p: str, x):
    """The q|k|v projection of x [B, T, hid]: q [B, T, H, D], output gate [B, T, H, D] or None,
    k, v [B, T, Hkv, D] (views of one GEMM's output)."""
    B, T, _ = x.shape
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    nq = H * D * (2 if cfg.attn_output_gate else 1)
    q, k, v = linear(x, w[p + "qkv"], w.get(p + "qkv_bias")).split([nq, Hkv * D, Hkv * D], dim=-1)
    gate = None
    if cfg.attn_output_gate:
        q, gate = q.view(B, T, H, 2 * D).chunk(2, dim=-1)       # [B, T, H, D] views
    else:
        q = q.view(B, T, H, D)
    return q, gate, k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)


def qk_norm_rope(cfg: HybridConfig, w: dict, p: str, q, k, cos, sin):
    """Per-head RMSNorm of q and k (where the model has it), then RoPE (where rotary_dim > 0); cos, sin
    [B or 1, T, rotary_dim]. The PyTorch path (the engine's fused path: `fused.norm_rope`)."""
    if cfg.qk_norm:
        q = rms_norm(q, w[p + "q_norm"], cfg.norm_eps)
        k = rms_norm(k, w[p + "k_norm"], cfg.norm_eps)
    if cfg.rotary_dim:
        q, k = rope(q, cos, sin), rope(k, cos, sin)
    return q, k


def attention_out(cfg: HybridConfig, w: dict, p: str, o, gate, fused: bool = False):
    """Output gate (sigmoid, where the model has one) and output projection of o [B, T, H, D]."""
    B, T, H, D = o.shape
    if gate is not None:
        if fused:
            from .fused import act_mul
            o = act_mul(gate, o, "sigmoid")
        else:
            o = o * torch.sigmoid(gate)
    return linear(o.reshape(B, T, H * D), w[p + "o"], w.get(p + "o_bias"))


# --------------------------------------------------------------------------- Mamba-2 mixer
def mamba2_in(cfg: HybridConfig, w: dict, p: str, x):
    """in_proj of x [B, T, hid]: z [B, T, I] (gate), xBC [B, T, conv_dim] (the conv's input), dt [B, T, H]."""
    proj = linear(x, w[p + "in_proj"], w.get(p + "in_proj_bias"))
    return proj.split([cfg.ssm_inner, cfg.conv_dim, cfg.ssm_heads], dim=-1)


def mamba2_conv_split(cfg: HybridConfig) -> list[int]:
    """Channel groups of the conv output: x, B, C."""
    return [cfg.ssm_inner, cfg.ssm_k_heads * cfg.ssm_head_k_dim, cfg.ssm_k_heads * cfg.ssm_head_k_dim]


def mamba2_ssm_inputs(cfg: HybridConfig, w: dict, p: str, xs, dt, Bm, Cm, A):
    """Raw SSM inputs (x [B, T, H, P], dt, A, B, C [B, T, G, N], D, dt_bias), as `reference.mamba2` and
    `SSMOps.run` take them; A = -exp(A_log) (the engine precomputes it)."""
    B, T = dt.shape[:2]
    H, P, N, G = cfg.ssm_heads, cfg.ssm_head_v_dim, cfg.ssm_head_k_dim, cfg.ssm_k_heads
    return (xs.reshape(B, T, H, P), dt, A, Bm.reshape(B, T, G, N), Cm.reshape(B, T, G, N),
            w[p + "D"], w[p + "dt_bias"])


def mamba2_out(cfg: HybridConfig, w: dict, p: str, y, z, dtype, fused: bool = False):
    """Gated RMSNorm over groups of I // G channels, gate applied before the norm (Nemotron-H), then
    out_proj. y [B, T, H, P] (the SSM output with the D skip), z [B, T, I]; returns [B, T, hid] in dtype."""
    B, T = z.shape[:2]
    I, G = cfg.ssm_inner, cfg.ssm_k_heads
    if fused:
        from .fused import group_rms_norm
        y = group_rms_norm(y.reshape(B * T, G, I // G), w[p + "gnorm"], cfg.norm_eps,
                           z.reshape(B * T, G, I // G), "before", dtype).view(B, T, I)
    else:
        y = y.reshape(B, T, I).float() * F.silu(z.float())
        y = y.view(B, T, G, I // G)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + cfg.norm_eps)
        y = (w[p + "gnorm"] * y.reshape(B, T, I)).to(dtype)
    return linear(y, w[p + "out_proj"], w.get(p + "out_proj_bias"))


# --------------------------------------------------------------------------- Gated DeltaNet mixer
def gdn_in(cfg: HybridConfig, w: dict, p: str, x):
    """The merged in_proj of x [B, T, hid]: qkv [B, T, conv_dim] (the conv's input), z [B, T, I], a, b [B, T, H]."""
    H = cfg.ssm_heads
    return linear(x, w[p + "in_proj"]).split([cfg.conv_dim, cfg.ssm_inner, H, H], dim=-1)


def gdn_conv_split(cfg: HybridConfig) -> list[int]:
    """Channel groups of the conv output: q, k, v."""
    nk = cfg.ssm_k_heads * cfg.ssm_head_k_dim
    return [nk, nk, cfg.ssm_heads * cfg.ssm_head_v_dim]


def gdn_ssm_inputs(cfg: HybridConfig, w: dict, p: str, q, k, v, a, b):
    """Raw SSM inputs (q, k [B, T, Hk, Dk], v [B, T, H, Dv], a, b [B, T, H], A_log, dt_bias), as
    `reference.gdn` and `SSMOps.run` take them."""
    B, T = a.shape[:2]
    H, Dv, Dk, Hk = cfg.ssm_heads, cfg.ssm_head_v_dim, cfg.ssm_head_k_dim, cfg.ssm_k_heads
    return (q.reshape(B, T, Hk, Dk), k.reshape(B, T, Hk, Dk), v.reshape(B, T, H, Dv),
            a, b, w[p + "A_log"], w[p + "dt_bias"])


def gdn_out(cfg: HybridConfig, w: dict, p: str, o, z, dtype, fused: bool = False):
    """Per-head RMSNorm of the SSM output o [B, T, H, Dv], gated after the norm by silu(z), then out_proj."""
    B, T, H, Dv = o.shape
    if fused:
        from .fused import group_rms_norm
        o = group_rms_norm(o.reshape(B * T, H, Dv), w[p + "gnorm"], cfg.norm_eps, z.reshape(B * T, H, Dv),
                           "after", dtype)
    else:
        o = (rms_norm(o.float(), w[p + "gnorm"], cfg.norm_eps) * F.silu(z.float().view(B, T, H, Dv))).to(dtype)
    return linear(o.reshape(B, T, H * Dv), w[p + "out_proj"])
