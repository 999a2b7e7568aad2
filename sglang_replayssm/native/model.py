"""The hybrid decoder of the native engine: embeddings, pre-norm residual blocks, LM head.

Weights are a flat dict with canonical names (see `param_shapes`); `loader.py` maps HF checkpoints
onto them and `random_weights` makes seeded ones (the built-in `--model-path embedded` model, benchmarks). The per-layer
maths (norms, projections, gating, MLP, RoPE, LM head) is `blocks.py`'s; this module runs it over the
pool and the KV cache.

One forward serves three modes, always over a batch `[B, T]` of token ids:
  "prefill"  T prompt tokens per row continue from the state in the pool (chunked prefill): SSM layers
             step the recurrence token by token from `pool.materialize` and store the final state with
             `pool.write_state` (checkpoint, empty ring); returns logits of the last position only.
  "decode"   T = 1: SSM layers go through the pool (`ops.decode`, ReplaySSM or conventional).
  "verify"   T = 1 + drafts: SSM layers go through `ops.verify` (draft records appended to the ring);
             the caller commits the accepted prefix (`SSMOps.accept_drafts`: pointer move, conv state).
Attention layers append K/V at positions `pos .. pos+T-1` of the sequence's KV cache (`KVCache`).
What a forward reads and writes besides the weights comes in explicitly: a `ForwardContext` (the
pool, the KV cache, the SSM-layer dispatch). No host synchronisation inside the forward: lengths
come in as host ints.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .blocks import (attention_out, attention_qkv, gdn_conv_split, gdn_in, gdn_out, gdn_ssm_inputs, lm_logits,
                     mamba2_conv_split, mamba2_in, mamba2_out, mamba2_ssm_inputs, merge_projections, mlp, qk_norm_rope,
                     rms_norm, rope_tables)
from .config import HybridConfig

if TYPE_CHECKING:
    from ..pool import ReplayStatePool
    from .ssm_ops import SSMOps


# --------------------------------------------------------------------------- parameters
def param_shapes(cfg: HybridConfig) -> dict[str, tuple]:
    """Canonical parameter names and shapes (biases only where the config has them)."""
    hid, shapes = cfg.hidden_size, {}
    shapes["embed"] = (cfg.vocab_size, hid)
    for i, kind in enumerate(cfg.blocks):
        p = f"b{i}."
        shapes[p + "norm"] = (hid,)
        if kind == "mlp":
            shapes[p + "up"] = (cfg.intermediate_size, hid)
            shapes[p + "down"] = (hid, cfg.intermediate_size)
            if cfg.mlp_gated:
                shapes[p + "gate"] = (cfg.intermediate_size, hid)
            if cfg.mlp_bias:
                shapes[p + "up_bias"] = (cfg.intermediate_size,)
                shapes[p + "down_bias"] = (hid,)
        elif kind == "attention":
            H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            shapes[p + "q"] = (H * D * (2 if cfg.attn_output_gate else 1), hid)
            shapes[p + "k"] = (Hkv * D, hid)
            shapes[p + "v"] = (Hkv * D, hid)
            shapes[p + "o"] = (hid, H * D)
            if cfg.attn_bias:
                for n in "qkv":
                    shapes[p + n + "_bias"] = (shapes[p + n][0],)
                shapes[p + "o_bias"] = (hid,)
            if cfg.qk_norm:
                shapes[p + "q_norm"] = (D,)
                shapes[p + "k_norm"] = (D,)
        elif kind == "ssm":
            H, I, C, K = cfg.ssm_heads, cfg.ssm_inner, cfg.conv_dim, cfg.conv_kernel
            shapes[p + "conv_w"] = (C, K)
            if cfg.conv_bias:
                shapes[p + "conv_b"] = (C,)
            shapes[p + "A_log"] = (H,)
            shapes[p + "dt_bias"] = (H,)
            shapes[p + "out_proj"] = (hid, I)
            if cfg.family == "mamba2":
                shapes[p + "in_proj"] = (I + C + H, hid)   # [z | x B C | dt]
                shapes[p + "D"] = (H,)
                shapes[p + "gnorm"] = (I,)
                if cfg.ssm_proj_bias:
                    shapes[p + "in_proj_bias"] = (I + C + H,)
                    shapes[p + "out_proj_bias"] = (hid,)
            else:
                shapes[p + "in_qkv"] = (C, hid)            # [q (Hk*Dk) | k (Hk*Dk) | v (H*Dv)]
                shapes[p + "in_z"] = (I, hid)
                shapes[p + "in_b"] = (H, hid)
                shapes[p + "in_a"] = (H, hid)
                shapes[p + "gnorm"] = (cfg.ssm_head_v_dim,)
        else:
            raise ValueError(f"block {i}: unsupported kind {kind!r}")
    shapes["final_norm"] = (hid,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (cfg.vocab_size, hid)
    return shapes


FP32_PARAMS = ("A_log", "D", "dt_bias", "norm", "gnorm", "q_norm", "k_norm", "final_norm", "lm_head_bias")


def random_weights(cfg: HybridConfig, seed: int = 0, std: float = 0.02, device="cpu",
                   dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Seeded weights in the canonical layout: deterministic for a given seed and device. Matrices
    in `dtype`; decay, skip and norm parameters in fp32. Generated on `device` (benchmarks: no
    host-side copy of a multi-GB model)."""
    g = torch.Generator(device=device).manual_seed(seed)
    z = dict(device=device, dtype=torch.float32)
    out = {}
    for name, shape in param_shapes(cfg).items():
        leaf = name.split(".")[-1]
        if leaf in ("norm", "gnorm", "q_norm", "k_norm", "final_norm", "D"):
            t = torch.ones(shape, **z)
        elif leaf == "A_log":
            t = torch.log(torch.empty(shape, **z).uniform_(1.0, 16.0, generator=g))
        elif leaf == "dt_bias":   # inverse softplus of dt in [1e-3, 1e-1], log-uniform
            dt = torch.exp(torch.empty(shape, **z).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
            t = dt + torch.log(-torch.expm1(-dt))
        elif leaf.endswith("bias"):
            t = torch.zeros(shape, device=device, dtype=dtype)
        elif leaf == "conv_w":
            t = (torch.randn(shape, generator=g, **z) / math.sqrt(shape[1])).to(dtype)
        elif leaf == "embed":
            t = torch.randn(shape, generator=g, device=device, dtype=dtype)
        else:
            t = torch.randn(shape, generator=g, device=device, dtype=dtype).mul_(std)
        out[name] = t
    return out


# --------------------------------------------------------------------------- caches
class KVCache:
    """Per-slot attention cache: k, v of shape [n_attn_layers, slots, max_len, Hkv, D]."""

    def __init__(self, cfg: HybridConfig, num_slots: int, max_len: int, device, dtype):
        shape = (max(cfg.num_attn_layers, 1), num_slots, max_len, cfg.num_key_value_heads, cfg.head_dim)
        self.max_len = max_len
        if cfg.num_attn_layers == 0:
            shape = (0,) + shape[1:]
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def write(self, layer: int, slots, pos, k, v):
        T = k.shape[1]
        idx = pos[:, None] + torch.arange(T, device=pos.device)
        self.k[layer, slots[:, None], idx] = k
        self.v[layer, slots[:, None], idx] = v

    def read(self, layer: int, slots, length: int):
        return self.k[layer, slots, :length], self.v[layer, slots, :length]

    def copy(self, src: int, dst: int):
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]


@dataclasses.dataclass
class ForwardContext:
    """The state one `HybridModel.forward` reads and writes: the SSM state pool, the attention KV cache,
    and the SSM-layer dispatch (`SSMOps`, or anything with its `run(layer, slots, mode, inputs, T)` and
    `forward_scope(mode, slots)`)."""

    pool: ReplayStatePool
    kv: KVCache
    ops: SSMOps


# --------------------------------------------------------------------------- the model
class HybridModel:
    """The decoder. Projections that read the same input are merged at construction into one GEMM each
    (attention q|k|v, MLP gate|up, GDN in_qkv|in_z|in_a|in_b; outputs split by views); the canonical
    per-projection names stay the input format (`param_shapes`, loader). The per-layer maths is
    blocks.py's (shared with the whole-sequence forward of tools/tiny_lm.py); what is the engine's own
    here is where a block's memory lives: the causal conv on the pool's conv state, the SSM core through
    `ctx.ops` (the pool), attention over the per-slot KV cache. `fused` (default: on CUDA) runs the
    element-wise work of the non-SSM layers through the Triton kernels of fused.py; the PyTorch code is
    the CPU path and their oracle."""

    def __init__(self, cfg: HybridConfig, weights: dict, device="cpu", dtype=torch.float32,
                 attn_impl: str | None = None, fused: bool | None = None):
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        # decode/verify attention: "triton" (native/attention.py, reads the KV cache in place; default on
        # CUDA) or "sdpa" (gathers the sequences' K/V, then PyTorch SDPA; default on CPU, always prefill)
        self.attn_impl = attn_impl or ("triton" if self.device.type == "cuda" else "sdpa")
        self.fused = self.device.type == "cuda" if fused is None else bool(fused)
        if self.fused and self.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise ValueError(f"fused=True runs Triton kernels: it needs a CUDA device (got {self.device}) "
                             "or TRITON_INTERPRET=1 (CPU tests)")
        expected = param_shapes(cfg)
        missing = sorted(set(expected) - set(weights))
        if missing:
            raise ValueError(f"missing parameters: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        self.w = {}
        for name, shape in expected.items():
            t = weights[name]
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"parameter {name}: shape {tuple(t.shape)}, expected {tuple(shape)}")
            fp32 = name.split(".")[-1] in FP32_PARAMS
            self.w[name] = t.to(device=self.device, dtype=torch.float32 if fp32 else dtype).contiguous()
        if "lm_head_bias" in weights:
            self.w["lm_head_bias"] = weights["lm_head_bias"].to(self.device, torch.float32)
        merge_projections(cfg, self.w)   # after the fp32/dtype conversion above: no second copy
        self.ssm_index, self.attn_index = {}, {}
        for i, kind in enumerate(cfg.blocks):
            if kind == "ssm":
                self.ssm_index[i] = len(self.ssm_index)
            elif kind == "attention":
                self.attn_index[i] = len(self.attn_index)
        self.A = {i: -torch.exp(self.w[f"b{i}.A_log"]) for i in self.ssm_index}
        self._cos = self._sin = None   # RoPE tables, grown to the longest KV cache seen (rope_tables)

    def _rope(self, n: int):
        if self._cos is None or self._cos.shape[0] < n:
            self._cos, self._sin = rope_tables(max(n, 256), self.cfg.rotary_dim, self.cfg.rope_theta, self.device)
        return self._cos, self._sin

    # ------------------------------------------------------------------ forward
    def forward(self, tokens, pos, slots, mode: str, ctx: ForwardContext, max_len: int):
        """tokens [B, T] long, pos [B] long (first position), slots [B] int; max_len = max(pos) + T.
        Returns logits (float32): [B, V] for prefill (last position), [B, T, V] otherwise."""
        assert mode in ("prefill", "decode", "verify"), mode
        cfg, w = self.cfg, self.w
        B, T = tokens.shape
        slots32, slots = slots.to(torch.int32), slots.long()   # kernels take int32, indexing int64
        h = F.embedding(tokens, w["embed"])
        att = None
        if cfg.num_attn_layers:   # per-step attention inputs, shared by all attention layers
            att = self._attention_inputs(pos, T, ctx, max_len)
        x = None
        with ctx.ops.forward_scope(mode, slots32):   # per-step work shared by the SSM layers
            for i, kind in enumerate(cfg.blocks):
                h, x = self._add_norm(h, x, w[f"b{i}.norm"])
                if kind == "mlp":
                    x = mlp(cfg, w, f"b{i}.", x, self.fused)
                elif kind == "attention":
                    x = self._attention(i, x, pos, slots, slots32, ctx, max_len, att)
                elif cfg.family == "mamba2":
                    x = self._mamba2(i, x, slots, slots32, mode, ctx)
                else:
                    x = self._gdn(i, x, slots, slots32, mode, ctx)
        if mode == "prefill":
            h, x = h[:, -1], x[:, -1]
        _, h = self._add_norm(h, x, w["final_norm"])
        return lm_logits(cfg, w, h)

    def _add_norm(self, h, x, weight):
        """The residual add of the previous block's output x (None before the first block) and the next
        pre-norm: returns (h + x, rms_norm(h + x))."""
        if self.fused:
            from .fused import add_rms_norm
            return add_rms_norm(h, x, weight, self.cfg.norm_eps)
        if x is not None:
            h = h + x
        return h, rms_norm(h, weight, self.cfg.norm_eps)

    def _attention_inputs(self, pos, T, ctx, max_len):
        """Positions [B, T], query positions of the Triton attention [B, T * G], RoPE rows [B, T, rd]."""
        cfg = self.cfg
        out = {}
        triton_attn = self.attn_impl == "triton" and T <= 16
        if not self.fused or not triton_attn:
            out["positions"] = pos[:, None] + torch.arange(T, device=pos.device)                 # [B, T]
        if triton_attn:
            G = cfg.num_attention_heads // cfg.num_key_value_heads
            qpos = pos[:, None] + torch.arange(T, device=pos.device).repeat_interleave(G)
            out["qpos"] = qpos.to(torch.int32)                                                      # [B, T*G]
        if cfg.rotary_dim:
            cos, sin = self._rope(max(max_len, ctx.kv.max_len))
            if self.fused:
                out["tables"] = (cos, sin)
            else:
                out["cos"], out["sin"] = cos[out["positions"]], sin[out["positions"]]
        return out

    # ------------------------------------------------------------------ blocks
    def _attention(self, i, x, pos, slots, slots32, ctx, max_len, att):
        cfg, w, p = self.cfg, self.w, f"b{i}."
        B, T, _ = x.shape
        H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q, gate, k, v = attention_qkv(cfg, w, p, x)
        layer = self.attn_index[i]
        if self.fused:   # norm + RoPE of q; of k straight into the cache; v copied into the cache
            from .fused import norm_rope
            cos, sin = att.get("tables", (None, None))
            eps, rd = cfg.norm_eps, cfg.rotary_dim
            qn, kn = (w[p + "q_norm"], w[p + "k_norm"]) if cfg.qk_norm else (None, None)
            if qn is not None or rd:
                q = norm_rope(q, pos, eps, qn, cos, sin, rd)
            norm_rope(k, pos, eps, kn, cos, sin, rd, cache=ctx.kv.k[layer], slots=slots32)
            norm_rope(v, pos, cache=ctx.kv.v[layer], slots=slots32)
        else:
            q, k = qk_norm_rope(cfg, w, p, q, k, att.get("cos"), att.get("sin"))
            ctx.kv.write(layer, slots, pos, k, v)
        # grouped-query attention without copying K/V per query head: the G = H / Hkv query heads of
        # a KV head become G query rows of that KV head (row t * G + g: token t, head kv * G + g)
        G = H // Hkv
        qg = q.reshape(B, T, Hkv, G, D).permute(0, 2, 1, 3, 4).reshape(B, Hkv, T * G, D)
        if "qpos" in att:
            from .attention import cache_attention

            o = cache_attention(qg, ctx.kv.k[layer], ctx.kv.v[layer], slots32, att["qpos"], max_len, D ** -0.5)
        else:
            positions = att["positions"]
            K_, V_ = ctx.kv.read(layer, slots, max_len)                                            # [B, L, Hkv, D]
            mask = torch.arange(max_len, device=pos.device)[None, None, :] <= positions[:, :, None]  # [B, T, L]
            mask = mask.repeat_interleave(G, dim=1)[:, None]                                     # [B, 1, T*G, L]
            o = F.scaled_dot_product_attention(qg, K_.transpose(1, 2), V_.transpose(1, 2), attn_mask=mask,
                                               scale=D ** -0.5)                                  # [B, Hkv, T*G, D]
        o = o.view(B, Hkv, T, G, D).permute(0, 2, 1, 3, 4).reshape(B, T, H, D)
        return attention_out(cfg, w, p, o, gate, self.fused)

    def _conv(self, i, xc, slots, slots32, mode, ctx, splits):
        """Depthwise causal conv + SiLU over [B, T, C], continuing from the pool's conv state; returns the
        output split into channel groups of `splits` (views here; contiguous tensors from the fused kernel)."""
        layer, K = self.ssm_index[i], self.cfg.conv_kernel
        T = xc.shape[1]
        if self.fused and T <= 16:
            from .fused import conv_update
            conv_in = ctx.pool.conv_in[layer] if mode == "verify" else None
            return conv_update(xc, ctx.pool.conv[layer], self.w[f"b{i}.conv_w"], self.w.get(f"b{i}.conv_b"),
                               slots32, conv_in, splits)
        state = ctx.pool.conv[layer, slots].to(xc.dtype)                     # [B, C, K-1]
        xa = torch.cat((state, xc.transpose(1, 2)), dim=2)                   # [B, C, K-1+T]
        win = xa.unfold(2, K, 1)                                             # [B, C, T, K]
        y = (win.float() * self.w[f"b{i}.conv_w"].float()[None, :, None, :]).sum(-1)
        if f"b{i}.conv_b" in self.w:
            y = y + self.w[f"b{i}.conv_b"].float()[None, :, None]
        if mode == "verify":   # the commit (SSMOps.accept_drafts / pool.accept_drafts) moves the conv state
            ctx.pool.conv_in[layer, slots, :T] = xc.to(ctx.pool.conv_in.dtype)
        else:
            ctx.pool.conv[layer, slots] = xa[:, :, T:].to(ctx.pool.conv.dtype)
        return F.silu(y).transpose(1, 2).to(xc.dtype).split(splits, dim=-1)   # [B, T, C] in groups

    def _mamba2(self, i, x, slots, slots32, mode, ctx):
        cfg, w, p = self.cfg, self.w, f"b{i}."
        z, xbc, dt = mamba2_in(cfg, w, p, x)
        xs, Bm, Cm = self._conv(i, xbc, slots, slots32, mode, ctx, mamba2_conv_split(cfg))
        inputs = mamba2_ssm_inputs(cfg, w, p, xs, dt, Bm, Cm, self.A[i])
        y = ctx.ops.run(self.ssm_index[i], slots32, mode, inputs, x.shape[1])   # [B, T, H, P], D skip included
        return mamba2_out(cfg, w, p, y, z, x.dtype, self.fused)

    def _gdn(self, i, x, slots, slots32, mode, ctx):
        cfg, w, p = self.cfg, self.w, f"b{i}."
        qkv, z, a, b = gdn_in(cfg, w, p, x)
        q, k, v = self._conv(i, qkv, slots, slots32, mode, ctx, gdn_conv_split(cfg))
        inputs = gdn_ssm_inputs(cfg, w, p, q, k, v, a, b)
        o = ctx.ops.run(self.ssm_index[i], slots32, mode, inputs, x.shape[1])   # [B, T, H, Dv]
        return gdn_out(cfg, w, p, o, z, x.dtype, self.fused)
