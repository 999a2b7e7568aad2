"""Load a HuggingFace-format model folder (config.json + *.safetensors) into the native engine's
canonical weights (see model.param_shapes), with errors that name the file and the tensor.

Parameter names handled:
  Nemotron-H  backbone.embeddings, backbone.layers.N.norm, backbone.layers.N.mixer.{in_proj, conv1d,
              A_log, D, dt_bias, norm, out_proj | q_proj, k_proj, v_proj, o_proj | up_proj, down_proj},
              backbone.norm_f, lm_head  (the prefix may also be `model.`)
  Qwen3-Next  model.embed_tokens, model.layers.N.{input_layernorm, post_attention_layernorm},
              .linear_attn.{in_proj_qkvz, in_proj_ba | in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
              (Qwen3.5), conv1d, A_log, dt_bias, norm, out_proj}, .self_attn.{q,k,v,o}_proj,
              .self_attn.{q,k}_norm, .mlp.{gate,up,down}_proj, model.norm, lm_head
              (Qwen3.5 multimodal checkpoints: prefix model.language_model.)
Qwen's zero-centred RMSNorm weights (x * (1 + w)) are stored as 1 + w.
`build_model` makes the engine's (config, model, tokenizer): the built-in model, or such a folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import HybridConfig, ModelConfigError, embedded_config
from .engine_args import EngineArgs
from .model import HybridModel, param_shapes, random_weights
from .tokenizer import ByteTokenizer, load_tokenizer


class ModelLoadError(ValueError):
    """The model folder cannot be loaded; the message names the file or tensor at fault."""


def _read_tensors(folder: Path) -> tuple[dict, list[str]]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelLoadError(f"{index}: not a valid safetensors index ({e})") from None
        files = sorted(set(weight_map.values()))
        for f in files:
            if not (folder / f).exists():
                raise ModelLoadError(f"{index} lists shard {f!r}, which is missing from {folder}")
        paths = [folder / f for f in files]
    else:
        paths = sorted(folder.glob("*.safetensors"))
    if not paths:
        raise ModelLoadError(f"{folder}: no *.safetensors weight files found")
    tensors = {}
    for p in paths:
        try:
            part = load_file(str(p))
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelLoadError(f"{p}: cannot read safetensors file ({e})") from None
        tensors.update(part)
    return tensors, [p.name for p in paths]


def _prefix(tensors: dict, candidates: tuple[str, ...], probe: str) -> str:
    for p in candidates:
        if p + probe in tensors:
            return p
    raise ModelLoadError(f"embedding tensor not found: expected one of {[p + probe for p in candidates]}")


def load_model(path) -> tuple[HybridConfig, dict]:
    """(config, canonical weights on CPU) for the model folder `path`."""
    folder = Path(path)
    if not folder.is_dir():
        raise ModelLoadError(f"--model-path {folder}: not a directory")
    try:
        cfg = HybridConfig.from_file(folder / "config.json")
    except ModelConfigError as e:
        raise ModelLoadError(str(e)) from None
    tensors, files = _read_tensors(folder)
    used = set()

    def take(name: str, required: bool = True):
        if name not in tensors:
            if required:
                raise ModelLoadError(f"tensor {name!r} missing from {folder} (files: {', '.join(files)})")
            return None
        used.add(name)
        return tensors[name]

    try:
        weights = (_map_nemotron if cfg.arch == "nemotron_h" else _map_qwen)(cfg, tensors, take)
    except RuntimeError as e:   # a reshape of a tensor whose size config.json does not imply
        raise ModelLoadError(f"{folder}: tensor shapes do not match config.json ({e})") from None
    expected = param_shapes(cfg)
    for name, shape in expected.items():
        if name not in weights:
            raise ModelLoadError(f"{folder}: no tensor for parameter {name}")
        if tuple(weights[name].shape) != tuple(shape):
            raise ModelLoadError(f"{folder}: tensor for {name} has shape {tuple(weights[name].shape)}, "
                                 f"config.json implies {tuple(shape)}")
    return cfg, {k: v for k, v in weights.items() if k in expected}


def _map_nemotron(cfg: HybridConfig, tensors: dict, take) -> dict:
    p = _prefix(tensors, ("backbone.", "model."), "embeddings.weight")
    w = {"embed": take(p + "embeddings.weight"), "final_norm": take(p + "norm_f.weight")}
    if not cfg.tie_word_embeddings:
        w["lm_head"] = take("lm_head.weight")
    for i, kind in enumerate(cfg.blocks):
        hf, b = f"{p}layers.{i}.", f"b{i}."
        w[b + "norm"] = take(hf + "norm.weight")
        m = hf + "mixer."
        if kind == "ssm":
            w[b + "in_proj"] = take(m + "in_proj.weight")
            w[b + "conv_w"] = take(m + "conv1d.weight").reshape(cfg.conv_dim, -1)
            for src, dst in (("A_log", "A_log"), ("D", "D"), ("dt_bias", "dt_bias"), ("norm.weight", "gnorm"),
                             ("out_proj.weight", "out_proj")):
                w[b + dst] = take(m + src)
            for src, dst in (("conv1d.bias", "conv_b"), ("in_proj.bias", "in_proj_bias"),
                             ("out_proj.bias", "out_proj_bias")):
                t = take(m + src, required=False)
                if t is not None:
                    w[b + dst] = t
        elif kind == "attention":
            for n in "qkvo":
                w[b + n] = take(m + f"{n}_proj.weight")
                t = take(m + f"{n}_proj.bias", required=False)
                if t is not None:
                    w[b + n + "_bias"] = t
        else:
            w[b + "up"] = take(m + "up_proj.weight")
            w[b + "down"] = take(m + "down_proj.weight")
            for n in ("up", "down"):
                t = take(m + f"{n}_proj.bias", required=False)
                if t is not None:
                    w[b + n + "_bias"] = t
    return w


def _map_qwen(cfg: HybridConfig, tensors: dict, take) -> dict:
    p = _prefix(tensors, ("model.", "model.language_model.", ""), "embed_tokens.weight")
    one = lambda t: t.float() + 1.0  # noqa: E731  zero-centred RMSNorm weight
    w = {"embed": take(p + "embed_tokens.weight"), "final_norm": one(take(p + "norm.weight"))}
    if not cfg.tie_word_embeddings:
        w["lm_head"] = take("lm_head.weight")
    H, Hk, Dk, Dv = cfg.ssm_heads, cfg.ssm_k_heads, cfg.ssm_head_k_dim, cfg.ssm_head_v_dim
    r = H // Hk
    for i, kind in enumerate(cfg.blocks):
        layer, b = cfg.block_layer[i], f"b{i}."
        hf = f"{p}layers.{layer}."
        if kind in ("ssm", "attention"):
            w[b + "norm"] = one(take(hf + "input_layernorm.weight"))
        else:
            w[b + "norm"] = one(take(hf + "post_attention_layernorm.weight"))
        if kind == "ssm":
            m = hf + "linear_attn."
            qkvz = take(m + "in_proj_qkvz.weight", required=False)
            if qkvz is not None:   # Qwen3-Next: per k-head groups [q | k | r*v | r*z] and [r*b | r*a]
                g = qkvz.reshape(Hk, 2 * Dk + 2 * r * Dv, -1)
                q, k, v, z = g.split([Dk, Dk, r * Dv, r * Dv], dim=1)
                w[b + "in_qkv"] = torch.cat([q.reshape(Hk * Dk, -1), k.reshape(Hk * Dk, -1),
                                             v.reshape(H * Dv, -1)], dim=0)
                w[b + "in_z"] = z.reshape(H * Dv, -1)
                ba = take(m + "in_proj_ba.weight").reshape(Hk, 2 * r, -1)
                w[b + "in_b"] = ba[:, :r].reshape(H, -1)
                w[b + "in_a"] = ba[:, r:].reshape(H, -1)
            else:                  # Qwen3.5: separate projections, flat layout
                for src, dst in (("in_proj_qkv", "in_qkv"), ("in_proj_z", "in_z"), ("in_proj_b", "in_b"),
                                 ("in_proj_a", "in_a")):
                    w[b + dst] = take(m + src + ".weight")
            w[b + "conv_w"] = take(m + "conv1d.weight").reshape(cfg.conv_dim, -1)
            for src, dst in (("A_log", "A_log"), ("dt_bias", "dt_bias"), ("norm.weight", "gnorm"),
                             ("out_proj.weight", "out_proj")):
                w[b + dst] = take(m + src)
        elif kind == "attention":
            m = hf + "self_attn."
            for n in "qkvo":
                w[b + n] = take(m + f"{n}_proj.weight")
                t = take(m + f"{n}_proj.bias", required=False)
                if t is not None:
                    w[b + n + "_bias"] = t
            w[b + "q_norm"] = one(take(m + "q_norm.weight"))
            w[b + "k_norm"] = one(take(m + "k_norm.weight"))
        else:
            m = hf + "mlp."
            for n in ("gate", "up", "down"):
                w[b + n] = take(m + f"{n}_proj.weight")
    return w


def build_model(args: EngineArgs):
    """(HybridConfig, HybridModel, tokenizer) for `args` (the built-in model or a HF folder)."""
    device = torch.device(args.device)
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32, "float32": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    if args.embedded_family is not None:
        cfg = embedded_config(args.embedded_family)
        weights = random_weights(cfg, seed=args.seed)
        # the random model only emits printable ASCII (never EOS), so its text is readable
        bias = torch.full((cfg.vocab_size,), -1e4)
        bias[32:127] = 0.0
        weights["lm_head_bias"] = bias
        tok = ByteTokenizer(cfg.vocab_size)
    else:
        cfg, weights = load_model(args.model_path)
        tok = load_tokenizer(args.model_path, cfg.vocab_size, cfg.eos_token_id, mode=args.tokenizer)
    return cfg, HybridModel(cfg, weights, device=device, dtype=dtype), tok
