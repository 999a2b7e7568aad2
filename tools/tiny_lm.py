"""Small byte-level hybrid models (Mamba-2 + attention, Gated DeltaNet + attention) for fidelity work.

* `hf_config(family)`: the HuggingFace config.json of the two tiny models (NemotronHForCausalLM,
  Qwen3NextForCausalLM) that the native engine loads (`sglang_replayssm.native.loader`).
* `init_weights(cfg)`: seeded initial weights in the native engine's canonical names
  (`sglang_replayssm.native.model.param_shapes`).
* `save_hf(folder, family, weights)`: canonical weights -> config.json + model.safetensors with the HF
  parameter names (the inverse of the loader's mapping).
* `TinyLM`: a batched, differentiable training forward over a whole sequence (`sequence_forward`). The
  per-layer maths is the native engine's (`sglang_replayssm.native.blocks`: norms, merged projections,
  gating, MLP, attention projections, RoPE, LM head), the raw SSM inputs become core form through
  `sglang_replayssm.reference` (`mamba2.prep` / `finish`, `gdn.prep`). What is this module's own is how the
  sequence runs: a zero-state causal conv over the whole sequence, causal SDPA over the whole sequence,
  and the SSM layers in the chunk form of the linear recurrence (`chunked_ssm`): inside a chunk, outputs
  are two matmuls against the chunk-start state plus a causally masked, decay-weighted `Q K^T` term (the
  same algebra as `reference.core.verify_matrix_form`); for the delta rule the chunk's `d` vectors come
  from one unit lower-triangular solve. Only the chunk-to-chunk state carry is sequential.
  tests/fidelity checks the logits against the engine's token-by-token decode.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang_replayssm.native import blocks
from sglang_replayssm.native.config import HybridConfig
from sglang_replayssm.native.model import param_shapes
from sglang_replayssm.reference import gdn as ref_gdn
from sglang_replayssm.reference import mamba2 as ref_mamba2
from sglang_replayssm.reference.core import expand_heads
from sglang_replayssm.reference.gdn import l2norm  # noqa: F401   (tests normalise keys with it)

VOCAB = 272            # bytes 0..255, BOS 256, EOS 257, padding up to a multiple of 16
BOS, EOS = 256, 257
FAMILIES = ("mamba2", "gdn")
ASSET_NAMES = {"mamba2": "tiny-mamba2-hybrid", "gdn": "tiny-gdn-hybrid"}
ASSETS_DIR = Path(__file__).resolve().parents[1] / "sglang_replayssm" / "native" / "assets"


def asset_path(family: str) -> Path:
    return ASSETS_DIR / ASSET_NAMES[family]


# ----------------------------------------------------------------------------- configs
def hf_config(family: str, size: str = "tiny") -> dict:
    """config.json of the model. ``size="micro"`` is a much smaller variant for CPU tests."""
    micro = size == "micro"
    hid = 32 if micro else 256
    common = {"vocab_size": VOCAB, "hidden_size": hid, "num_attention_heads": 2 if micro else 4,
              "num_key_value_heads": 1 if micro else 2, "head_dim": 16 if micro else 64,
              "tie_word_embeddings": True, "bos_token_id": BOS, "eos_token_id": EOS, "torch_dtype": "float32",
              "attention_bias": False}
    if family == "mamba2":
        return {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
                "hybrid_override_pattern": "M-*M-" if micro else "M-M-M*-M-",
                "num_hidden_layers": 5 if micro else 9,
                "intermediate_size": 64 if micro else 768, "mlp_hidden_act": "relu2", "mlp_bias": False,
                "mamba_num_heads": 4 if micro else 8, "mamba_head_dim": 8 if micro else 32,
                "ssm_state_size": 16 if micro else 64, "n_groups": 2, "conv_kernel": 4,
                "use_conv_bias": True, "use_bias": False, "layer_norm_epsilon": 1e-5, "chunk_size": 64,
                **common}
    if family == "gdn":
        types = (["linear_attention", "full_attention", "linear_attention"] if micro else
                 ["linear_attention", "linear_attention", "full_attention", "linear_attention", "linear_attention"])
        return {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
                "num_hidden_layers": len(types), "layer_types": types, "full_attention_interval": 4,
                "intermediate_size": 64 if micro else 512, "hidden_act": "silu",
                "linear_num_key_heads": 1 if micro else 2, "linear_num_value_heads": 2 if micro else 4,
                "linear_key_head_dim": 16 if micro else 64, "linear_value_head_dim": 8 if micro else 64,
                "linear_conv_kernel_dim": 4, "num_experts": 0, "rms_norm_eps": 1e-6,
                "partial_rotary_factor": 0.25, "rope_theta": 10000.0, "attn_output_gate": True, **common}
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def native_config(hf: dict) -> HybridConfig:
    return HybridConfig.from_hf(hf)


# ----------------------------------------------------------------------------- weights
def init_weights(cfg: HybridConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded initial weights (fp32, canonical names). SSM decays as Mamba-2 initializes them: per head
    ``A`` in [1, 16] and ``dt`` log-uniform in [1e-4, 1e-1] (Mamba-2's range with dt_min lowered tenfold,
    so that some heads start with a memory of ~10K tokens)."""
    g = torch.Generator().manual_seed(seed)
    n_resid = len(cfg.blocks)
    out = {}
    for name, shape in param_shapes(cfg).items():
        leaf = name.split(".")[-1]
        if leaf in ("norm", "gnorm", "q_norm", "k_norm", "final_norm", "D"):
            t = torch.ones(shape)
        elif leaf == "A_log":
            t = torch.log(torch.empty(shape).uniform_(1.0, 16.0, generator=g))
        elif leaf == "dt_bias":
            dt = torch.exp(torch.empty(shape).uniform_(math.log(1e-4), math.log(1e-1), generator=g))
            t = dt + torch.log(-torch.expm1(-dt))          # inverse softplus
        elif leaf.endswith("bias"):
            t = torch.zeros(shape)
        elif leaf == "conv_w":
            t = torch.empty(shape).uniform_(-1.0, 1.0, generator=g) / math.sqrt(shape[1])
        elif leaf in ("out_proj", "o", "down"):
            t = torch.randn(shape, generator=g) * (0.02 / math.sqrt(2 * n_resid))
        else:
            t = torch.randn(shape, generator=g) * 0.02
        out[name] = t
    return out


def _hf_tensors(cfg: HybridConfig, w: dict) -> dict[str, torch.Tensor]:
    """Canonical weights -> HF parameter names (inverse of native/loader.py)."""
    t = {}
    c = lambda x: x.detach().float().cpu().contiguous()  # noqa: E731
    if cfg.arch == "nemotron_h":
        p = "backbone."
        t[p + "embeddings.weight"] = c(w["embed"])
        t[p + "norm_f.weight"] = c(w["final_norm"])
        for i, kind in enumerate(cfg.blocks):
            b, m = f"b{i}.", f"{p}layers.{i}.mixer."
            t[f"{p}layers.{i}.norm.weight"] = c(w[b + "norm"])
            if kind == "ssm":
                t[m + "in_proj.weight"] = c(w[b + "in_proj"])
                t[m + "conv1d.weight"] = c(w[b + "conv_w"]).unsqueeze(1)
                if b + "conv_b" in w:
                    t[m + "conv1d.bias"] = c(w[b + "conv_b"])
                for src, dst in (("A_log", "A_log"), ("D", "D"), ("dt_bias", "dt_bias"), ("gnorm", "norm.weight"),
                                 ("out_proj", "out_proj.weight")):
                    t[m + dst] = c(w[b + src])
            elif kind == "attention":
                for n in "qkvo":
                    t[m + f"{n}_proj.weight"] = c(w[b + n])
            else:
                t[m + "up_proj.weight"] = c(w[b + "up"])
                t[m + "down_proj.weight"] = c(w[b + "down"])
        return t
    p = "model."
    zc = lambda x: c(x) - 1.0  # noqa: E731   Qwen stores zero-centred RMSNorm weights
    t[p + "embed_tokens.weight"] = c(w["embed"])
    t[p + "norm.weight"] = zc(w["final_norm"])
    H, Hk, Dk, Dv = cfg.ssm_heads, cfg.ssm_k_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim
    r, hid = H // Hk, cfg.hidden_size
    for i, kind in enumerate(cfg.blocks):
        b, hf = f"b{i}.", f"{p}layers.{cfg.block_layer[i]}."
        if kind in ("ssm", "attention"):
            t[hf + "input_layernorm.weight"] = zc(w[b + "norm"])
        else:
            t[hf + "post_attention_layernorm.weight"] = zc(w[b + "norm"])
        if kind == "ssm":
            m = hf + "linear_attn."
            q, k, v = c(w[b + "in_qkv"]).split([Hk * Dk, Hk * Dk, H * Dv], dim=0)
            groups = [q.reshape(Hk, Dk, hid), k.reshape(Hk, Dk, hid), v.reshape(Hk, r * Dv, hid),
                      c(w[b + "in_z"]).reshape(Hk, r * Dv, hid)]
            t[m + "in_proj_qkvz.weight"] = torch.cat(groups, dim=1).reshape(-1, hid).contiguous()
            ba = [c(w[b + "in_b"]).reshape(Hk, r, hid), c(w[b + "in_a"]).reshape(Hk, r, hid)]
            t[m + "in_proj_ba.weight"] = torch.cat(ba, dim=1).reshape(-1, hid).contiguous()
            t[m + "conv1d.weight"] = c(w[b + "conv_w"]).unsqueeze(1)
            for src, dst in (("A_log", "A_log"), ("dt_bias", "dt_bias"), ("gnorm", "norm.weight"),
                             ("out_proj", "out_proj.weight")):
                t[m + dst] = c(w[b + src])
        elif kind == "attention":
            m = hf + "self_attn."
            for n in "qkvo":
                t[m + f"{n}_proj.weight"] = c(w[b + n])
            t[m + "q_norm.weight"] = zc(w[b + "q_norm"])
            t[m + "k_norm.weight"] = zc(w[b + "k_norm"])
        else:
            for n in ("gate", "up", "down"):
                t[f"{hf}mlp.{n}_proj.weight"] = c(w[b + n])
    return t


def save_hf(folder, hf: dict, weights: dict, metadata: dict | None = None) -> Path:
    """Write config.json + model.safetensors (fp32) that `native.loader.load_model` reads back."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = native_config(hf)
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    meta = {"format": "pt"}
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    save_file(_hf_tensors(cfg, weights), str(folder / "model.safetensors"), metadata=meta)
    return folder


# ----------------------------------------------------------------------------- whole-sequence forward
def causal_conv_silu(x, w, b, K: int):
    """Depthwise causal conv (zero initial state) + SiLU over a whole sequence x [B, T, C]; w [C, K]. The
    engine's conv (`HybridModel._conv`) continues from the pool's conv state instead."""
    y = F.conv1d(x.float().transpose(1, 2), w.float().unsqueeze(1), None if b is None else b.float(),
                 padding=K - 1, groups=x.shape[-1])[..., : x.shape[1]]
    return F.silu(y).transpose(1, 2).to(x.dtype)


def causal_attention(cfg, w, p, x, cos, sin):
    """Full causal self-attention of block prefix p over x [B, T, hid] (positions 0..T-1); the projections,
    q/k norm, RoPE, output gate and projection are the engine's (`native.blocks`)."""
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q, gate, k, v = blocks.attention_qkv(cfg, w, p, x)
    q, k = blocks.qk_norm_rope(cfg, w, p, q, k, cos, sin)
    if H != Hkv:
        k = k.repeat_interleave(H // Hkv, dim=2)
        v = v.repeat_interleave(H // Hkv, dim=2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=True, scale=D ** -0.5)
    return blocks.attention_out(cfg, w, p, o.transpose(1, 2), gate)


def ssm_block(cfg, w, p, x, run_core):
    """An SSM mixer of block prefix p over a whole sequence x [B, T, hid]: the engine's projections and
    gated norm (`native.blocks`), a zero-state conv, the raw inputs turned into core form by the reference
    (`reference.mamba2` / `reference.gdn`), and `run_core(q, k, v, g, beta) -> o [B, T, H, Dv]` for the
    recurrence itself (`chunked_ssm` in training, `bench.fidelity.windowed_ssm` in the fidelity bench)."""
    K = cfg.conv_kernel
    if cfg.family == "mamba2":
        z, xbc, dt = blocks.mamba2_in(cfg, w, p, x)
        xs, Bm, Cm = causal_conv_silu(xbc, w[p + "conv_w"], w.get(p + "conv_b"), K).split(
            blocks.mamba2_conv_split(cfg), dim=-1)
        xs, dt, A, Bm, Cm, D, dt_bias = blocks.mamba2_ssm_inputs(cfg, w, p, xs, dt, Bm, Cm,
                                                                 -torch.exp(w[p + "A_log"].float()))
        o = run_core(*ref_mamba2.prep(xs, dt, A, Bm, Cm, dt_bias), None)
        return blocks.mamba2_out(cfg, w, p, ref_mamba2.finish(o, xs, D, None), z, x.dtype)
    qkv, z, a, b = blocks.gdn_in(cfg, w, p, x)
    q, k, v = causal_conv_silu(qkv, w[p + "conv_w"], w.get(p + "conv_b"), K).split(blocks.gdn_conv_split(cfg), dim=-1)
    o = run_core(*ref_gdn.prep(*blocks.gdn_ssm_inputs(cfg, w, p, q, k, v, a, b)))
    return blocks.gdn_out(cfg, w, p, o, z, x.dtype)


def sequence_forward(cfg, weights: dict, tokens: torch.Tensor, run_core) -> torch.Tensor:
    """Logits [B, T, V] (fp32) of tokens [B, T] from an empty state, every block over the whole sequence:
    the engine's per-layer maths (`native.blocks`, on merged projections of `weights`, gradients kept),
    with `run_core(i, q, k, v, g, beta) -> o` running block i's SSM recurrence in core form."""
    w = blocks.merge_projections(cfg, dict(weights))
    h = F.embedding(tokens, w["embed"])
    cos = sin = None
    if cfg.num_attn_layers:
        cos, sin = blocks.rope_tables(tokens.shape[1], cfg.rotary_dim, cfg.rope_theta, tokens.device)
        cos, sin = cos[None], sin[None]
    for i, kind in enumerate(cfg.blocks):
        p = f"b{i}."
        x = blocks.rms_norm(h, w[p + "norm"], cfg.norm_eps)
        if kind == "mlp":
            x = blocks.mlp(cfg, w, p, x)
        elif kind == "attention":
            x = causal_attention(cfg, w, p, x, cos, sin)
        else:
            x = ssm_block(cfg, w, p, x, lambda *core, i=i: run_core(i, *core))
        h = h + x
    return blocks.lm_logits(cfg, w, blocks.rms_norm(h, w["final_norm"], cfg.norm_eps))


# ----------------------------------------------------------------------------- chunked recurrence
def chunked_ssm(q, k, v, g, beta=None, chunk: int = 64, state=None):
    """Linear recurrence ``S_t = exp(g_t) S_{t-1} + d_t k_t^T``, ``o_t = S_t q_t`` over a whole batch of
    sequences, in chunk form (differentiable). ``q, k [B, T, Hk, Dk]`` (per key head / group; value
    head h uses h // (H // Hk)),
    ``v [B, T, H, Dv]``, ``g [B, T, H]`` (log-decay), ``beta [B, T, H]`` for the delta rule
    (``d_t = beta_t (v_t - exp(g_t) S_{t-1} k_t)``) or None (``d_t = v_t``). ``state [B, H, Dv, Dk]``
    or None (zeros). Returns ``(o [B, T, H, Dv], final state)`` in fp32."""
    with torch.autocast(q.device.type, enabled=False):   # the recurrence stays fp32 under bf16 autocast
        return _chunked_ssm(expand_heads(q, v.shape[2]), expand_heads(k, v.shape[2]), v, g, beta, chunk, state)


def _chunked_ssm(q, k, v, g, beta, chunk, state):
    H = v.shape[2]
    B, T, _, Dk = q.shape
    Dv = v.shape[-1]
    pad = (-T) % chunk
    if pad:   # zero keys / values and no decay after the end leave every real output unchanged
        padf = lambda t: F.pad(t, [0, 0] * (t.dim() - 2) + [0, pad])  # noqa: E731
        q, k, v, g = padf(q), padf(k), padf(v), padf(g)
        beta = None if beta is None else padf(beta)
    n = (T + pad) // chunk
    # [B, H, n, C, *]
    q = q.float().reshape(B, n, chunk, H, Dk).permute(0, 3, 1, 2, 4)
    k = k.float().reshape(B, n, chunk, H, Dk).permute(0, 3, 1, 2, 4)
    v = v.float().reshape(B, n, chunk, H, Dv).permute(0, 3, 1, 2, 4)
    G = g.float().reshape(B, n, chunk, H).permute(0, 3, 1, 2).cumsum(-1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    L = torch.exp((G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~causal, float("-inf")))
    QKL = (q @ k.transpose(-1, -2)) * L                       # decayed, causal Q K^T
    eG = torch.exp(G).unsqueeze(-1)
    Qd = q * eG                                               # queries decayed from the chunk start
    Gl = G[..., -1:]
    Kd = k * torch.exp(Gl - G).unsqueeze(-1)                  # keys decayed to the chunk end
    if beta is not None:
        bt = beta.float().reshape(B, n, chunk, H).permute(0, 3, 1, 2).unsqueeze(-1)
        strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
        M = torch.eye(chunk, device=q.device) + bt * ((k @ k.transpose(-1, -2)) * L * strict)
        U = torch.linalg.solve_triangular(M, bt * v, upper=False, unitriangular=True)
        W = torch.linalg.solve_triangular(M, bt * eG * k, upper=False, unitriangular=True)
    S = q.new_zeros(B, H, Dv, Dk) if state is None else state.float()
    outs = []
    for c in range(n):
        St = S.transpose(-1, -2)
        d = v[:, :, c] if beta is None else U[:, :, c] - W[:, :, c] @ St
        outs.append(Qd[:, :, c] @ St + QKL[:, :, c] @ d)
        S = S * torch.exp(Gl[:, :, c]).unsqueeze(-1) + d.transpose(-1, -2) @ Kd[:, :, c]
    o = torch.stack(outs, dim=2).reshape(B, H, n * chunk, Dv)[:, :, :T].transpose(1, 2)
    return o, S


# ----------------------------------------------------------------------------- the model
class TinyLM(torch.nn.Module):
    """Trainable hybrid model over canonical weights; `forward(tokens [B, T]) -> logits [B, T, V]`."""

    def __init__(self, hf: dict, weights: dict | None = None, seed: int = 0, chunk: int = 64):
        super().__init__()
        self.hf, self.cfg, self.chunk = hf, native_config(hf), chunk
        w = weights if weights is not None else init_weights(self.cfg, seed)
        self.names = list(param_shapes(self.cfg))
        self.params = torch.nn.ParameterDict({n.replace(".", "__"): torch.nn.Parameter(w[n].float().clone())
                                              for n in self.names})

    def weights(self) -> dict[str, torch.Tensor]:
        return {n: self.params[n.replace(".", "__")] for n in self.names}

    def num_params(self) -> int:
        return sum(p.numel() for p in self.params.values())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return sequence_forward(self.cfg, self.weights(), tokens,
                                lambda i, *core: chunked_ssm(*core, chunk=self.chunk)[0])
