"""Checkpoints at a real model's widths, few layers, seeded random bf16 weights: written on the GPU machine.

    python -m sglang_replayssm.gpu_harness.wide_checkpoints TINY_DIR OUT_DIR [--family ...] [--device cuda]

For issue 21's CUDA-graph runs and ``bench_serving`` on the H200: a real model's tensors cannot travel in
a device call (64 MiB), so the weights are drawn there. ``TINY_DIR`` holds the tiny checkpoints of
``cpu_harness.tiny_checkpoints`` (their tokenizer and ``config.json`` are reused, the config's widths
replaced by ``WIDTHS``); the tensors are named and shaped as the Hugging Face checkpoints SGLang loads
(``tensor_specs``, checked in CI against the tiny checkpoints that ``transformers`` itself writes).

* ``qwen3_next``: Qwen3-Next-80B-A3B's widths (hidden 2048, GDN 16 key / 32 value heads of 128, attention
  16 q / 2 kv heads of 256, MoE top-10 of 512-wide experts + a shared expert, vocabulary 151936), 4 layers
  (3 GDN + 1 attention) and 64 experts instead of 512 (every expert is hit at batch 64 either way; keeps
  a server's weights at ~2 GB so that many servers share one GPU).
* ``nemotron_h``: Nemotron-H-8B's widths (hidden 4096, Mamba-2 128 heads of 64, 8 groups, state 128,
  attention 32 q / 8 kv heads of 128, relu2 MLP 21504, vocabulary 131072), pattern ``M-M-M*-``.

The tokenizer keeps its 512 tokens (ids above it decode to nothing); only ids matter to the comparisons.
Weights: ``randn * 1.5 / sqrt(fan_in)`` for matrices (as the tiny checkpoints), transformers' own init
for the vectors (norms, ``A_log``, ``D``, ``dt_bias``, conv bias), one seed, drawn on ``device``.

``--echo-cycle C`` (issue 29: a workload where speculative drafts are accepted, with random weights) makes
the greedy continuation of token ``t`` the next id of its block of ``C`` ids (``echo_successor``), so every
output cycles through ``C`` tokens and an n-gram drafter's drafts are accepted once a cycle has been seen.
The embeddings are drawn at RMS 1, each layer's output projection (``ECHO_OUTPUT_SCALE``) scaled so that the
layers' sum stays within about twice the embedding's size at full depth, and the LM head's row of ``echo_successor(t)`` is token
``t``'s embedding scaled to a logit of ``ECHO_TARGET_LOGIT`` (before the final norm shares it with the layers'
sum): at a real model's width the successor's logit leads by ~15 nats while the other tokens'
logits (the top-k logprobs a comparison reads) still come from every layer, the SSM layers included. Every
layer computes what it computes in the plain checkpoint: a step costs the same.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

FAMILIES = ("qwen3_next", "nemotron_h")

# config.json fields replaced in the tiny checkpoint's config (the rest, e.g. eos / pad ids, is kept)
WIDTHS: dict[str, dict] = {
    "qwen3_next": dict(
        hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, num_experts=64, num_experts_per_tok=10, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, intermediate_size=5120, vocab_size=151936, num_hidden_layers=4,
        full_attention_interval=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], max_position_embeddings=32768,
        rope_parameters={"partial_rotary_factor": 0.25, "rope_theta": 10000000.0, "rope_type": "default"},
        dtype="bfloat16"),
    "nemotron_h": dict(
        hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        mamba_num_heads=128, mamba_head_dim=64, n_groups=8, mamba_n_groups=8, ssm_state_size=128,
        conv_kernel=4, mamba_d_conv=4, expand=2, mamba_expand=2, chunk_size=128, mamba_chunk_size=128,
        intermediate_size=21504, vocab_size=131072, hybrid_override_pattern="M-M-M*-", num_hidden_layers=7,
        max_position_embeddings=32768, dtype="bfloat16"),
}


# --depth full: every layer of the real model (issue 29: models where the SSM's share of a step is the real one)
FULL_DEPTH: dict[str, dict] = {
    # Qwen3-Next-80B-A3B: 48 layers, every 4th full attention; 16 experts instead of 512 (top-10 kept) so that
    # one server's weights are ~10 GB
    "qwen3_next": dict(num_hidden_layers=48, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 12,
                       num_experts=16),
    # Nemotron-H-8B: 52 layers, 24 Mamba-2, 4 attention, 24 MLP
    "nemotron_h": dict(num_hidden_layers=52,
                       hybrid_override_pattern="M-M-M-M*-" + "M-M-M-M-M*-" * 3 + "M-M-M-M-M-"),
}
DEPTHS = ("short", "full")

# --echo-cycle: the tensors whose size changes (by name suffix), and how
ECHO_OUTPUT_SCALE = 0.1
ECHO_TARGET_LOGIT = 40.0
ECHO_OUTPUTS = (".out_proj.weight", ".o_proj.weight", ".down_proj.weight")
EMBEDDINGS = {"qwen3_next": "model.embed_tokens.weight", "nemotron_h": "backbone.embeddings.weight"}


def _qwen3_next_layer(cfg: dict, i: int, kind: str) -> list[tuple[str, tuple, str]]:
    h, p = cfg["hidden_size"], f"model.layers.{i}."
    out = [(p + "input_layernorm.weight", (h,), "zeros"), (p + "post_attention_layernorm.weight", (h,), "zeros")]
    if kind == "linear_attention":
        nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv, k = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
        a = p + "linear_attn."
        out += [(a + "A_log", (nv,), "log_uniform_1_16"), (a + "dt_bias", (nv,), "ones"),
                (a + "conv1d.weight", (2 * nk * dk + nv * dv, 1, k), "matrix"),
                (a + "in_proj_ba.weight", (2 * nv, h), "matrix"),
                (a + "in_proj_qkvz.weight", (2 * nk * dk + 2 * nv * dv, h), "matrix"),
                (a + "norm.weight", (dv,), "ones"), (a + "out_proj.weight", (h, nv * dv), "matrix")]
    else:
        nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        a = p + "self_attn."
        out += [(a + "q_proj.weight", (2 * nq * hd, h), "matrix"), (a + "k_proj.weight", (nkv * hd, h), "matrix"),
                (a + "v_proj.weight", (nkv * hd, h), "matrix"), (a + "o_proj.weight", (h, nq * hd), "matrix"),
                (a + "q_norm.weight", (hd,), "zeros"), (a + "k_norm.weight", (hd,), "zeros")]
    m, inter, shared = p + "mlp.", cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    out.append((m + "gate.weight", (cfg["num_experts"], h), "matrix"))
    for e in range(cfg["num_experts"]):
        x = f"{m}experts.{e}."
        out += [(x + "gate_proj.weight", (inter, h), "matrix"), (x + "up_proj.weight", (inter, h), "matrix"),
                (x + "down_proj.weight", (h, inter), "matrix")]
    out += [(m + "shared_expert.gate_proj.weight", (shared, h), "matrix"),
            (m + "shared_expert.up_proj.weight", (shared, h), "matrix"),
            (m + "shared_expert.down_proj.weight", (h, shared), "matrix"),
            (m + "shared_expert_gate.weight", (1, h), "matrix")]
    return out


def _nemotron_h_layer(cfg: dict, i: int, kind: str) -> list[tuple[str, tuple, str]]:
    h, p = cfg["hidden_size"], f"backbone.layers.{i}."
    out = [(p + "norm.weight", (h,), "ones")]
    x = p + "mixer."
    if kind == "M":
        nh, hd, ng, ds = cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["n_groups"], cfg["ssm_state_size"]
        conv = nh * hd + 2 * ng * ds
        out += [(x + "A_log", (nh,), "log_arange"), (x + "D", (nh,), "ones"), (x + "dt_bias", (nh,), "dt_bias"),
                (x + "conv1d.weight", (conv, 1, cfg["conv_kernel"]), "matrix"), (x + "conv1d.bias", (conv,), "zeros"),
                (x + "in_proj.weight", (2 * nh * hd + 2 * ng * ds + nh, h), "matrix"),
                (x + "norm.weight", (nh * hd,), "ones"), (x + "out_proj.weight", (h, nh * hd), "matrix")]
    elif kind == "*":
        nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        out += [(x + "q_proj.weight", (nq * hd, h), "matrix"), (x + "k_proj.weight", (nkv * hd, h), "matrix"),
                (x + "v_proj.weight", (nkv * hd, h), "matrix"), (x + "o_proj.weight", (h, nq * hd), "matrix")]
    elif kind == "-":
        out += [(x + "up_proj.weight", (cfg["intermediate_size"], h), "matrix"),
                (x + "down_proj.weight", (h, cfg["intermediate_size"]), "matrix")]
    else:
        raise ValueError(f"layer kind {kind!r} (only M, *, -)")
    return out


def tensor_specs(family: str, cfg: dict) -> list[tuple[str, tuple, str]]:
    """(name, shape, init) of every tensor of ``family``'s checkpoint for config ``cfg`` (a config.json dict)."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    if family == "qwen3_next":
        out = [("model.embed_tokens.weight", (v, h), "matrix"), ("lm_head.weight", (v, h), "matrix"),
               ("model.norm.weight", (h,), "zeros")]
        for i, kind in enumerate(cfg["layer_types"]):
            out += _qwen3_next_layer(cfg, i, kind)
        return out
    if family == "nemotron_h":
        out = [("backbone.embeddings.weight", (v, h), "matrix"), ("lm_head.weight", (v, h), "matrix"),
               ("backbone.norm_f.weight", (h,), "ones")]
        for i, kind in enumerate(cfg["hybrid_override_pattern"]):
            out += _nemotron_h_layer(cfg, i, kind)
        return out
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def _draw(shape: tuple, init: str, cfg: dict, gen, device):
    import torch

    if init == "matrix":
        return torch.randn(shape, generator=gen, device=device) * (1.5 / math.sqrt(shape[-1]))
    if init == "zeros":
        return torch.zeros(shape, device=device)
    if init == "ones":
        return torch.ones(shape, device=device)
    if init == "log_uniform_1_16":
        return torch.empty(shape, device=device).uniform_(1, 16, generator=gen).log()
    if init == "log_arange":
        return torch.arange(1, shape[0] + 1, device=device, dtype=torch.float32).log()
    if init == "dt_bias":   # inverse softplus of dt, log-uniform in [dt_min, dt_max] (transformers' Mamba-2 init)
        lo, hi = math.log(cfg.get("time_step_min", 1e-3)), math.log(cfg.get("time_step_max", 0.1))
        dt = (torch.rand(shape, generator=gen, device=device) * (hi - lo) + lo).exp().clamp(min=1e-4)
        return dt + torch.log(-torch.expm1(-dt))
    raise ValueError(init)


def echo_successor(vocab: int, cycle: int):
    """The id each id's greedy continuation is in an echo checkpoint (a LongTensor over ``range(vocab)``): the
    next id of its block of ``cycle`` ids, wrapping; the ids past the last whole block map to themselves."""
    import torch

    t = torch.arange(vocab)
    succ = t - t % cycle + (t % cycle + 1) % cycle
    return torch.where(t < vocab - vocab % cycle, succ, t)


def make_echo(family: str, tensors: dict, cycle: int) -> None:
    """Turn the drawn ``tensors`` (fp32, in place) into an echo checkpoint's (module docstring)."""
    emb = tensors[EMBEDDINGS[family]]
    emb /= emb.pow(2).mean().sqrt()
    for name, t in tensors.items():
        if name.endswith(ECHO_OUTPUTS):
            t *= ECHO_OUTPUT_SCALE
    head = tensors["lm_head.weight"]
    head[echo_successor(emb.shape[0], cycle).to(head.device)] = emb * (ECHO_TARGET_LOGIT / emb.shape[1])


def wide_config(family: str, tiny_cfg: dict, depth: str = "short") -> dict:
    if depth not in DEPTHS:
        raise ValueError(f"depth must be one of {DEPTHS}, got {depth!r}")
    cfg = dict(tiny_cfg)
    cfg.update(WIDTHS[family])
    if depth == "full":
        cfg.update(FULL_DEPTH[family])
    cfg.pop("layers_block_type", None)       # the device's transformers 5.17 reads hybrid_override_pattern
    cfg.pop("mtp_layers_block_type", None)
    return cfg


def write_wide_checkpoint(family: str, tiny_dir: Path, out: Path, device: str = "cuda", seed: int = 0,
                          cfg: dict | None = None, depth: str = "short", echo_cycle: int = 0) -> Path:
    """Write ``out`` (config.json, tokenizer files, model.safetensors in bf16) for ``family``; ``echo_cycle`` > 0:
    an echo checkpoint (module docstring), its cycle recorded in config.json as ``replayssm_echo_cycle``."""
    import torch
    from safetensors.torch import save_file

    tiny_dir, out = Path(tiny_dir), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg is None:
        cfg = wide_config(family, json.loads((tiny_dir / "config.json").read_text()), depth)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_dir / name, out / name)
    if echo_cycle:
        cfg = dict(cfg, replayssm_echo_cycle=echo_cycle)
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {name: _draw(shape, init, cfg, gen, device) for name, shape, init in tensor_specs(family, cfg)}
    if echo_cycle:
        make_echo(family, tensors, echo_cycle)
    tensors = {name: t.to(torch.bfloat16).cpu() for name, t in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_replayssm.gpu_harness.wide_checkpoints", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tiny_dir", help="folder holding the tiny checkpoints (one sub-folder per family)")
    p.add_argument("out_dir")
    p.add_argument("--family", choices=FAMILIES + ("all",), default="all")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--depth", choices=DEPTHS, default="short",
                   help="short: the few layers above; full: every layer of the real model (FULL_DEPTH)")
    p.add_argument("--echo-cycle", type=int, default=0, metavar="C",
                   help="an echo checkpoint: greedy outputs cycle through C ids (drafts get accepted); 0: off")
    a = p.parse_args(argv)
    if a.echo_cycle < 0:
        p.error(f"--echo-cycle must be >= 0, got {a.echo_cycle}")
    for fam in FAMILIES if a.family == "all" else (a.family,):
        path = write_wide_checkpoint(fam, Path(a.tiny_dir) / fam, Path(a.out_dir) / fam, a.device, a.seed,
                                     depth=a.depth, echo_cycle=a.echo_cycle)
        size = (path / "model.safetensors").stat().st_size
        print(f"{fam}: {path} ({size / 2**30:.2f} GiB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
