"""Tiny hybrid checkpoints SGLang can serve on a CPU: seeded random weights, no downloads.

    python -m sglang_replayssm.cpu_harness.tiny_checkpoints OUT_DIR [--family qwen3_next|nemotron_h|kimi_linear|qwen3_next_mtp|all]

Each family is written as a Hugging Face folder (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json`` with a chat template) by ``transformers`` itself, so the
same folder loads in ``transformers`` (the oracle of the server tests) and in SGLang:

* ``qwen3_next``: Qwen3-Next layout, Gated DeltaNet layers + full attention every second layer, every
  MLP a sparse MoE block with a shared expert (as the real model has it).
* ``nemotron_h``: Nemotron-H layout, Mamba-2 / attention / MLP blocks (``M*M-``).
* ``kimi_linear``: Kimi-Linear layout as released (Kimi-Linear-48B-A3B's config keys and tensor names), KDA layers 1
  and 3 + MLA layers 2 and 4 (no rotary embedding, as ``mla_use_nope``), a dense MLP in the first layer
  (``first_k_dense_replace: 1``) and sparse MoE blocks after it (4 experts, 2 per token, a sigmoid router with a
  score-correction bias, one shared expert); written directly (``transformers`` has no Kimi-Linear class without
  remote code).

``transformers`` 5.19 saves both with names SGLang 0.5.23 does not read (Nemotron-H's ``layers_block_type:
[linear_attention, full_attention, ...]``, Qwen3-Next's ``layer_types``); the names SGLang reads are added
beside them (``sglang_replayssm.checkpoint_names``), unless ``--as-saved``.

The tokenizer is byte-level BPE (``tokenizers``), trained here on a short fixed text: 256 byte tokens,
a few hundred merges, ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``. Weights are scaled up from
transformers' small init so greedy decoding does not collapse into one repeated token.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FAMILIES = ("qwen3_next", "nemotron_h")   # written by transformers (which is their oracle)
KIMI = "kimi_linear"                       # written directly (no transformers class): its oracle is stock SGLang
QWEN3_NEXT_MTP = "qwen3_next_mtp"          # qwen3_next + an MTP layer (NEXTN / EAGLE drafts)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB = 512
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

_TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. A state space model keeps a fixed-size state and updates it
with every token; attention layers keep every key and value. Hybrid models mix both. def main(argv):
    for i in range(10): print(i, i * i)  # numbers 0 1 2 3 4 5 6 7 8 9
Once upon a time there was a small model that answered questions about the weather, the sea and the
mountains. It said: hello, world! How are you today? I am fine, thank you. What is the capital of France?
"""


def write_tokenizer(out: Path) -> dict:
    """Byte-level BPE tokenizer.json + tokenizer_config.json; returns the special token ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_TRAIN_TEXT] * 4, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "chat_template": CHAT_TEMPLATE, "add_bos_token": False}, indent=1))
    return ids


def _config(family: str, ids: dict):
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                  max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=ids["<|im_end|>"],
                  pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"], torch_dtype="float32")
    if family == "qwen3_next":
        return transformers.Qwen3NextConfig(
            num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2, intermediate_size=128,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
            linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, decoder_sparse_step=1, norm_topk_prob=True, **common)
    if family == "nemotron_h":
        return transformers.NemotronHConfig(
            layers_block_type=["mamba", "attention", "mamba", "mlp"], intermediate_size=128,
            mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4, expand=1,
            chunk_size=64, mlp_hidden_act="relu2", use_mamba_kernels=False, **common)
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def _scale_weights(model, seed: int) -> None:
    """Larger random weights than transformers' 0.02-std init: varied greedy continuations."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / fan_in ** 0.5))


def _sglang_compatible_config(out: Path) -> None:
    """Add the names SGLang 0.5.23 reads beside transformers 5's (``checkpoint_names``, shared with the launcher,
    which does the same for a user's folder through an overlay)."""
    from sglang_replayssm.checkpoint_names import sglang_config

    cfg, _changes = sglang_config(json.loads((out / "config.json").read_text()))
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))


# Kimi Linear as Moonshot released it (Kimi-Linear-48B-A3B): KDA layers (1-based ids, as its config lists them) and MLA
# attention layers; the first ``first_k_dense_replace`` layers have a dense MLP, the others a sparse MoE block
# (``block_sparse_moe``: a sigmoid router with a score-correction bias choosing ``num_experts_per_token`` of
# ``num_experts``, renormalized and scaled by ``routed_scaling_factor``, plus ``num_shared_experts`` shared experts)
KIMI_LINEAR = dict(hidden=64, layers=4, kda_layers=[1, 3], heads=2, head_dim=32, conv=4, mla_heads=2,
                   kv_lora_rank=48, qk_nope=16, qk_rope=16, v_head=32, intermediate=128,
                   experts=4, experts_per_token=2, moe_intermediate=32, shared_experts=1, first_k_dense=1,
                   routed_scaling=2.446)


def _kimi_linear_config(ids: dict) -> dict:
    k = KIMI_LINEAR
    return {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "vocab_size": VOCAB,
        "hidden_size": k["hidden"], "intermediate_size": k["intermediate"], "num_hidden_layers": k["layers"],
        "num_attention_heads": k["mla_heads"], "num_key_value_heads": k["mla_heads"], "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "float32",
        "rope_theta": 10000.0, "rope_scaling": None,
        "q_lora_rank": None, "kv_lora_rank": k["kv_lora_rank"], "qk_nope_head_dim": k["qk_nope"],
        "qk_rope_head_dim": k["qk_rope"], "v_head_dim": k["v_head"], "mla_use_nope": True,
        "linear_attn_config": {"kda_layers": k["kda_layers"], "num_heads": k["heads"], "head_dim": k["head_dim"],
                               "short_conv_kernel_size": k["conv"],
                               "full_attn_layers": [i for i in range(1, k["layers"] + 1) if i not in k["kda_layers"]]},
        # the MoE keys as the released config spells them
        "num_experts": k["experts"], "num_experts_per_token": k["experts_per_token"],
        "moe_intermediate_size": k["moe_intermediate"], "num_shared_experts": k["shared_experts"],
        "first_k_dense_replace": k["first_k_dense"], "moe_layer_freq": 1, "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid", "routed_scaling_factor": k["routed_scaling"],
        "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0,
        "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"], "bos_token_id": ids["<|endoftext|>"],
    }


def kimi_moe_layer(cfg: dict, i: int) -> bool:
    """Whether layer ``i`` (0-based) of a Kimi-Linear config has a sparse MoE block (else a dense MLP)."""
    return (cfg.get("num_experts") is not None and i >= cfg.get("first_k_dense_replace", 0)
            and i % cfg.get("moe_layer_freq", 1) == 0)


def _kimi_linear_weights(seed: int, cfg: dict) -> dict:
    """The tensors SGLang 0.5.23's ``KimiLinearForCausalLM.load_weights`` reads, under a Kimi-Linear checkpoint's
    names (``q_proj``/``k_proj``/``v_proj``/``b_proj``, low-rank ``f_a``/``f_b`` decay and ``g_a``/``g_b`` output-gate
    projections, per-channel ``dt_bias``, per-head ``A_log``, ``q/k/v_conv1d``; MLA ``q_proj``,
    ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``; dense ``mlp.gate/up/down_proj``; MoE
    ``block_sparse_moe.gate.weight`` / ``.gate.e_score_correction_bias``, ``block_sparse_moe.experts.E.w1/w2/w3``
    (gate, down, up) and ``block_sparse_moe.shared_experts.gate/up/down_proj``)."""
    import math

    import torch

    k = KIMI_LINEAR
    g = torch.Generator().manual_seed(seed)
    D, H, K, I = k["hidden"], k["heads"], k["head_dim"], k["intermediate"]
    E, Im = k["experts"], k["moe_intermediate"]
    P = H * K

    def lin(out_f, in_f):
        return torch.randn(out_f, in_f, generator=g) * (1.5 / in_f ** 0.5)

    w = {"model.embed_tokens.weight": torch.randn(VOCAB, D, generator=g), "lm_head.weight": lin(VOCAB, D),
         "model.norm.weight": torch.ones(D)}
    for i in range(k["layers"]):
        pre = f"model.layers.{i}."
        w[pre + "input_layernorm.weight"] = torch.ones(D)
        w[pre + "post_attention_layernorm.weight"] = torch.ones(D)
        if kimi_moe_layer(cfg, i):
            m = pre + "block_sparse_moe."
            w[m + "gate.weight"] = lin(E, D)
            # a bias large enough to change which experts the router picks (scores are sigmoids in (0, 1))
            w[m + "gate.e_score_correction_bias"] = torch.randn(E, generator=g) * 0.3
            for e in range(E):
                w[m + f"experts.{e}.w1.weight"], w[m + f"experts.{e}.w3.weight"] = lin(Im, D), lin(Im, D)
                w[m + f"experts.{e}.w2.weight"] = lin(D, Im)
            Is = Im * k["shared_experts"]
            w[m + "shared_experts.gate_proj.weight"], w[m + "shared_experts.up_proj.weight"] = lin(Is, D), lin(Is, D)
            w[m + "shared_experts.down_proj.weight"] = lin(D, Is)
        else:
            w[pre + "mlp.gate_proj.weight"], w[pre + "mlp.up_proj.weight"] = lin(I, D), lin(I, D)
            w[pre + "mlp.down_proj.weight"] = lin(D, I)
        a = pre + "self_attn."
        if i + 1 in k["kda_layers"]:
            for n in ("q", "k", "v"):
                w[a + f"{n}_proj.weight"] = lin(P, D)
                w[a + f"{n}_conv1d.weight"] = torch.randn(P, 1, k["conv"], generator=g) / math.sqrt(k["conv"])
            w[a + "b_proj.weight"] = lin(H, D)
            w[a + "f_a_proj.weight"], w[a + "f_b_proj.weight"] = lin(K, D), lin(P, K)
            w[a + "g_a_proj.weight"], w[a + "g_b_proj.weight"] = lin(K, D), lin(P, K)
            w[a + "dt_bias"] = torch.randn(P, generator=g) * 0.5
            w[a + "A_log"] = torch.log(torch.empty(1, 1, H, 1).uniform_(1, 16, generator=g))
            w[a + "o_norm.weight"] = torch.ones(K)
            w[a + "o_proj.weight"] = lin(D, P)
        else:
            nh, r = k["mla_heads"], k["kv_lora_rank"]
            w[a + "q_proj.weight"] = lin(nh * (k["qk_nope"] + k["qk_rope"]), D)
            w[a + "kv_a_proj_with_mqa.weight"] = lin(r + k["qk_rope"], D)
            w[a + "kv_a_layernorm.weight"] = torch.ones(r)
            w[a + "kv_b_proj.weight"] = lin(nh * (k["qk_nope"] + k["v_head"]), r)
            w[a + "o_proj.weight"] = lin(D, nh * k["v_head"])
    return {n: t.contiguous() for n, t in w.items()}


def write_kimi_linear(out: Path, seed: int = 0) -> Path:
    """The tiny Kimi-Linear checkpoint (``transformers`` has no Kimi-Linear class without remote code: the folder
    is written directly, config.json and model.safetensors as Moonshot's checkpoints lay them out)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out)
    cfg = _kimi_linear_config(ids)
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))
    save_file(_kimi_linear_weights(seed, cfg), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def add_mtp_layer(out: Path, seed: int = 0) -> Path:
    """Give the tiny Qwen3-Next in ``out`` a multi-token-prediction layer as Qwen3-Next checkpoints carry it
    (``mtp.fc``, ``mtp.pre_fc_norm_embedding`` / ``_hidden``, ``mtp.layers.0.*``: a full-attention + MoE layer,
    ``mtp.norm``; ``num_nextn_predict_layers: 1``), what SGLang's ``--speculative-algorithm NEXTN`` drafts with. The
    layer starts as a copy of the model's last full-attention layer (random weights: the drafts are poor, the verify
    decides; ``transformers`` ignores ``mtp.*``)."""
    import torch
    from safetensors.torch import load_file, save_file

    out = Path(out)
    cfg = json.loads((out / "config.json").read_text())
    full = [i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"][-1]
    w = load_file(str(out / "model.safetensors"))
    src = f"model.layers.{full}."
    for name in [n for n in w if n.startswith(src)]:
        w["mtp.layers.0." + name[len(src):]] = w[name].clone()
    D = cfg["hidden_size"]
    g = torch.Generator().manual_seed(seed + 1)
    w["mtp.fc.weight"] = torch.randn(D, 2 * D, generator=g) * (1.5 / (2 * D) ** 0.5)
    for n in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"):
        w[n] = torch.zeros(D)   # Qwen3-Next's (1 + w) RMSNorm: unit gain
    save_file({n: t.contiguous() for n, t in w.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))
    return out


# EAGLE3 draft heads (SGLang's ``LlamaForCausalLMEagle3``, ``models/llama_eagle3.py``): one Llama decoder layer whose
# first projections read [its token embedding; the hidden state], an ``fc`` from the target's captured hidden states,
# its own embedding (hidden size 128 against the target's 64: ``target_hidden_size``) and a reduced draft vocabulary
# (``draft_vocab_size``, ``d2t``: draft id -> target id offsets, ``t2d``: which target ids it has), under the names
# EAGLE3 checkpoints use (``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``embed_tokens``).
EAGLE3 = dict(hidden=128, head_dim=128, intermediate=128, draft_vocab=256)


def _target_hidden(target: Path) -> tuple[dict, int]:
    cfg = json.loads((Path(target) / "config.json").read_text())
    return cfg, int(cfg["hidden_size"])


def write_eagle3_head(target: Path, out: Path, follow: list[int] | None = None, aux_layers: list[int] | None = None,
                      seed: int = 0) -> Path:
    """A tiny EAGLE3 draft head for the tiny checkpoint in ``target``, in the format SGLang 0.5.23 loads.

    ``aux_layers``: the target layers whose hidden states the head reads
    (``eagle_config.eagle_aux_hidden_state_layer_ids``, three of them as EAGLE3 heads have it); None: a head that
    reads the target's final hidden state instead (``use_aux_hidden_state: false``, one input to ``fc``), the form a
    target without EAGLE3 capture can serve.

    ``follow``: a token sequence (e.g. the target's own greedy continuation of a prompt) whose successor map the head
    computes exactly, whatever the context: at a token ``c`` of ``follow`` (each token whose successor is the same
    wherever it occurs) it drafts the token that follows ``c`` there, and continues the draft from its own choice, so a
    target that continues that sequence accepts every draft. The weights are built, not trained (``r`` indexes the
    distinct tokens, ``e_r`` a unit vector of the head's 128-dim hidden space):

    * the embedding of token ``r`` is ``e_r`` (others 0); ``hidden_norm`` is 0, so the attention reads tokens only;
    * q = k = 21.3 ``e_r`` in rotary pair ``r`` (``r`` < 64: distinct pairs stay orthogonal under any rotation), so a
      position attends to the positions holding its own token (its own score ~40, every other token's 0), whose values
      are all ``e_r``; ``o_proj`` writes ``A e_r`` (A = 100);
    * the MLP (``silu(gate) * up`` with gate = up = 10 ``z_r``, one unit per token) writes
      ``alpha e_next(r) + 0.85 alpha e_runner(r) - (A + alpha) e_r`` (alpha = 10; ``runner(r)`` a token of its own
      outside ``follow``): the step's output ``T = mlp + attn + residual`` then telescopes along a draft to
      ``alpha (e_next - e_first) + 0.85 alpha (sum of the runner-ups so far)`` (the residual a step hands the next is
      its ``T``; the first step's residual is ``fc`` of the target's hidden states, small here, 1e-3 weights);
    * ``lm_head`` reads ``4 e_r`` for token ``r``: the successor leads its runner-up by ~4 nats and every other token
      by ~25, so a draft tree holds near-miss branches at every depth and the accepted path is not its first nodes.

    Tokens without a consistent successor draft nothing in particular. Without ``follow`` (or for every other token)
    the head proposes what its small random parts give: drafts a target rarely accepts."""
    import torch
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tcfg, D_t = _target_hidden(target)
    e = EAGLE3
    H, hd, I, Vd = e["hidden"], e["head_dim"], e["intermediate"], e["draft_vocab"]
    V = int(tcfg["vocab_size"])
    g = torch.Generator().manual_seed(seed + 7)
    n_aux = 1 if aux_layers is None else len(aux_layers)
    follow = list(follow or [])
    tokens = list(dict.fromkeys(follow))                 # distinct, in order of appearance
    if len(tokens) > hd // 2:
        raise ValueError(f"follow: {len(tokens)} distinct tokens, the head has codes for {hd // 2}")
    succ: dict[int, int | None] = {}
    for a, b in zip(follow, follow[1:]):
        succ[a] = b if succ.get(a, b) == b else None      # None: successors disagree
    code = {t: r for r, t in enumerate(tokens)}
    # each token's runner-up: a token of its own outside ``follow``, drafted ~4 nats below the successor, so that
    # draft trees hold near-miss branches at every depth (the successor path is then not the trees' first nodes)
    fillers = [t for t in reversed(range(V)) if t not in code]   # from the top of the vocabulary (no special tokens)
    runner = {t: fillers[i] for i, t in enumerate(tokens) if succ.get(t) is not None}
    code.update({m: len(tokens) + i for i, m in enumerate(runner.values())})
    if len(code) > H:
        raise ValueError(f"follow: {len(code)} codes, the head's hidden size is {H}")
    hot = list(code) + [t for t in fillers if t not in code][:Vd - len(code)]   # draft id -> target id

    A, alpha, kappa, gain, lam, second = 100.0, 10.0, 21.3, 10.0, 4.0, 8.5
    unit_in = H ** -0.5          # RMSNorm gives a unit code the norm sqrt(H): a weight of unit_in reads it as 1
    act0 = float(torch.nn.functional.silu(torch.tensor(gain)) * gain)

    def small(*shape):
        return torch.randn(*shape, generator=g) * 1e-3 / shape[-1] ** 0.5

    embed = torch.zeros(V, H)
    q, k, v = torch.zeros(hd, 2 * H), torch.zeros(hd, 2 * H), torch.zeros(hd, 2 * H)
    o = torch.zeros(H, hd)
    gate, up, down = torch.zeros(I, H), torch.zeros(I, H), torch.zeros(H, I)
    lm_head = torch.zeros(Vd, H)
    for t in tokens:
        r = code[t]
        embed[t, r] = 1.0
        q[r, r] = k[r, r] = kappa * unit_in
        v[r, r] = unit_in
        o[r, r] = A
        gate[r, r] = up[r, r] = gain * unit_in
        nxt = succ.get(t)
        if nxt is not None:
            down[code[nxt], r] += alpha / act0
            down[code[runner[t]], r] += second / act0
        down[r, r] -= (A + alpha) / act0
    for t, r in code.items():
        lm_head[hot.index(t), r] = lam
    w = {
        "embed_tokens.weight": embed, "fc.weight": small(H, n_aux * D_t), "lm_head.weight": lm_head,
        "norm.weight": torch.ones(H),
        "midlayer.input_layernorm.weight": torch.ones(H), "midlayer.hidden_norm.weight": torch.zeros(H),
        "midlayer.post_attention_layernorm.weight": torch.ones(H),
        "midlayer.self_attn.q_proj.weight": q, "midlayer.self_attn.k_proj.weight": k,
        "midlayer.self_attn.v_proj.weight": v, "midlayer.self_attn.o_proj.weight": o,
        "midlayer.mlp.gate_proj.weight": gate, "midlayer.mlp.up_proj.weight": up, "midlayer.mlp.down_proj.weight": down,
        "d2t": torch.tensor(hot) - torch.arange(Vd),
        "t2d": torch.zeros(V, dtype=torch.bool).index_fill_(0, torch.tensor(hot), True),
    }
    save_file({n: t.contiguous() for n, t in w.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    eagle = ({"use_aux_hidden_state": False} if aux_layers is None else
             {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": list(aux_layers)})
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "target_hidden_size": D_t, "num_aux_hidden_states": n_aux, "intermediate_size": I, "num_hidden_layers": 1,
        "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": hd, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096, "vocab_size": V,
        "draft_vocab_size": Vd, "tie_word_embeddings": False, "torch_dtype": "float32", "eagle_config": eagle,
        "bos_token_id": tcfg.get("bos_token_id"), "eos_token_id": tcfg.get("eos_token_id"),
        "pad_token_id": tcfg.get("pad_token_id"),
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))
    return out


def write_checkpoint(family: str, out: Path, seed: int = 0, sglang_names: bool = True) -> Path:
    """The tiny ``family`` checkpoint in ``out``; ``sglang_names=False`` leaves config.json as transformers 5
    saved it (a folder as users have it: SGLang itself cannot read it, our launcher serves it)."""
    if family == KIMI:
        return write_kimi_linear(out, seed)
    if family == QWEN3_NEXT_MTP:
        return add_mtp_layer(write_checkpoint("qwen3_next", out, seed, sglang_names), seed)
    import torch
    import transformers

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out)
    torch.manual_seed(seed)
    cfg = _config(family, ids)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _scale_weights(model, seed)
    model.save_pretrained(out, safe_serialization=True)
    if sglang_names:
        _sglang_compatible_config(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_replayssm.cpu_harness.tiny_checkpoints",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("out_dir")
    p.add_argument("--family", choices=FAMILIES + (KIMI, QWEN3_NEXT_MTP, "all"), default="all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--as-saved", action="store_true",
                   help="leave config.json as transformers 5 saves it (without the names SGLang 0.5.23 reads)")
    a = p.parse_args(argv)
    for fam in FAMILIES + (KIMI,) if a.family == "all" else (a.family,):
        path = write_checkpoint(fam, Path(a.out_dir) / fam, a.seed, sglang_names=not a.as_saved)
        print(f"{fam}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
