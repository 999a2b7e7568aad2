"""Model configuration of the native engine: one dataclass for both hybrid families.

A model is a stack of pre-norm residual *blocks*, each one of:
  "ssm"        a Mamba-2 mixer (Nemotron-H) or a Gated DeltaNet mixer (Qwen3-Next / Qwen3.5)
  "attention"  causal self-attention with a per-sequence KV cache
  "mlp"        a feed-forward block
Nemotron-H layers map one-to-one to blocks ('M' -> ssm, '*' -> attention, '-' -> mlp).
A Qwen3-Next layer is two blocks: its token mixer (input_layernorm) then its MLP (post_attention_layernorm).

`HybridConfig.from_hf(dict)` reads a HuggingFace config.json (NemotronHForCausalLM,
Qwen3NextForCausalLM, Qwen3.5 text models) and says clearly what it cannot serve.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


class ModelConfigError(ValueError):
    """config.json describes something the native engine cannot build."""


NEMOTRON_PATTERN = {"M": "ssm", "*": "attention", "-": "mlp", "E": "moe"}
NEMOTRON_TYPES = {"mamba": "ssm", "linear_attention": "ssm", "attention": "attention",
                  "full_attention": "attention", "mlp": "mlp", "moe": "moe"}


@dataclasses.dataclass
class HybridConfig:
    arch: str                      # "nemotron_h" | "qwen3_next"
    vocab_size: int
    hidden_size: int
    blocks: list                   # block kinds, see module doc
    block_layer: list              # HF layer index of each block (for parameter names)
    norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    eos_token_id: list = dataclasses.field(default_factory=list)
    # attention
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    head_dim: int = 16
    attn_bias: bool = False
    attn_output_gate: bool = False  # Qwen3-Next: q_proj also yields a sigmoid gate
    qk_norm: bool = False           # Qwen3-Next: RMSNorm on q and k per head
    rotary_dim: int = 0             # 0: no rotary embedding (Nemotron-H)
    rope_theta: float = 10000.0
    # mlp
    intermediate_size: int = 64
    mlp_act: str = "relu2"          # "relu2" | "silu"
    mlp_gated: bool = False         # True: down(act(gate(x)) * up(x)) (Qwen); False: down(act(up(x)))
    mlp_bias: bool = False
    # ssm (generic names of docs/layout.md)
    ssm_heads: int = 4              # H (value heads)
    ssm_head_v_dim: int = 16        # Dv (Mamba-2 headdim P)
    ssm_head_k_dim: int = 16        # Dk (Mamba-2 d_state N)
    ssm_k_heads: int = 1            # Hk (Mamba-2 n_groups)
    conv_kernel: int = 4
    conv_bias: bool = True
    ssm_proj_bias: bool = False

    @property
    def family(self) -> str:
        return "mamba2" if self.arch == "nemotron_h" else "gdn"

    @property
    def num_ssm_layers(self) -> int:
        return self.blocks.count("ssm")

    @property
    def num_attn_layers(self) -> int:
        return self.blocks.count("attention")

    @property
    def ssm_inner(self) -> int:
        return self.ssm_heads * self.ssm_head_v_dim

    @property
    def conv_dim(self) -> int:
        if self.family == "mamba2":   # x, B, C
            return self.ssm_inner + 2 * self.ssm_k_heads * self.ssm_head_k_dim
        return 2 * self.ssm_k_heads * self.ssm_head_k_dim + self.ssm_inner  # q, k, v

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def validate(self) -> "HybridConfig":
        def need(cond, msg):
            if not cond:
                raise ModelConfigError(msg)
        need(self.arch in ("nemotron_h", "qwen3_next"), f"unknown arch {self.arch!r}")
        need(self.vocab_size > 0 and self.hidden_size > 0, "vocab_size and hidden_size must be positive")
        bad = sorted(set(self.blocks) - {"ssm", "attention", "mlp"})
        need(not bad, f"layer kinds {bad} are not supported by the native engine (MoE layers are not)")
        need(self.num_ssm_layers > 0, "the model has no SSM layers: nothing for ReplaySSM to do")
        need(self.ssm_heads % self.ssm_k_heads == 0,
             f"SSM heads ({self.ssm_heads}) must be a multiple of the key heads/groups ({self.ssm_k_heads})")
        if self.num_attn_layers:
            need(self.num_attention_heads % self.num_key_value_heads == 0,
                 "num_attention_heads must be a multiple of num_key_value_heads")
            need(self.rotary_dim % 2 == 0 and self.rotary_dim <= self.head_dim, "bad rotary dimension")
        need(self.mlp_act in ("relu2", "silu"), f"unsupported MLP activation {self.mlp_act!r}")
        return self

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_hf(cls, hf: dict) -> "HybridConfig":
        archs = hf.get("architectures") or []
        model_type = hf.get("model_type", "")
        if "text_config" in hf and isinstance(hf["text_config"], dict):   # Qwen3.5 multimodal wrapper
            inner = dict(hf["text_config"])
            inner.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", False))
            return cls.from_hf(inner)
        if model_type == "nemotron_h" or any("NemotronH" in a for a in archs):
            return cls._from_nemotron_h(hf).validate()
        if model_type.startswith("qwen3_next") or model_type.startswith("qwen3_5") or any(
                a.startswith(("Qwen3Next", "Qwen3_5")) for a in archs):
            return cls._from_qwen3_next(hf).validate()
        raise ModelConfigError(
            f"config.json: unsupported model (model_type={model_type!r}, architectures={archs}); "
            "the native engine serves NemotronHForCausalLM (Mamba-2) and Qwen3-Next/Qwen3.5 (Gated DeltaNet)")

    @staticmethod
    def _req(hf: dict, *keys):
        for key in keys:
            if key in hf and hf[key] is not None:
                return hf[key]
        raise ModelConfigError(f"config.json: missing required key {keys[0]!r}")

    @staticmethod
    def _eos(hf: dict) -> list:
        eos = hf.get("eos_token_id")
        if eos is None:
            return []
        return list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]

    @classmethod
    def _from_nemotron_h(cls, hf: dict) -> "HybridConfig":
        req = lambda *k: cls._req(hf, *k)  # noqa: E731
        if hf.get("hybrid_override_pattern"):
            pattern = hf["hybrid_override_pattern"]
            bad = sorted(set(pattern) - set(NEMOTRON_PATTERN))
            if bad:
                raise ModelConfigError(f"config.json: hybrid_override_pattern has unknown symbols {bad}")
            blocks = [NEMOTRON_PATTERN[c] for c in pattern]
        else:
            types = hf.get("layers_block_type") or hf.get("layer_types")
            if not types:
                raise ModelConfigError("config.json: missing 'hybrid_override_pattern' (or 'layers_block_type')")
            bad = sorted(set(types) - set(NEMOTRON_TYPES))
            if bad:
                raise ModelConfigError(f"config.json: unknown layer types {bad}")
            blocks = [NEMOTRON_TYPES[t] for t in types]
        heads = req("num_attention_heads")
        if hf.get("mamba_hidden_act", "silu") not in ("silu", "swish"):
            raise ModelConfigError(f"config.json: mamba_hidden_act {hf['mamba_hidden_act']!r} is not supported (silu)")
        return cls(
            arch="nemotron_h", vocab_size=req("vocab_size"), hidden_size=req("hidden_size"),
            blocks=blocks, block_layer=list(range(len(blocks))),
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), eos_token_id=cls._eos(hf),
            num_attention_heads=heads, num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf.get("attention_head_dim") or req("hidden_size") // heads,
            attn_bias=bool(hf.get("attention_bias", False)),
            intermediate_size=req("intermediate_size"), mlp_act=_act(hf.get("mlp_hidden_act", "relu2")),
            mlp_bias=bool(hf.get("mlp_bias", False)),
            ssm_heads=req("mamba_num_heads"), ssm_head_v_dim=req("mamba_head_dim"),
            ssm_head_k_dim=req("ssm_state_size"), ssm_k_heads=hf.get("n_groups", hf.get("mamba_n_groups", 8)),
            conv_kernel=hf.get("conv_kernel", hf.get("mamba_d_conv", 4)),
            conv_bias=bool(hf.get("use_conv_bias", hf.get("mamba_conv_bias", True))),
            ssm_proj_bias=bool(hf.get("use_bias", False)),
        )

    @classmethod
    def _from_qwen3_next(cls, hf: dict) -> "HybridConfig":
        req = lambda *k: cls._req(hf, *k)  # noqa: E731
        n = req("num_hidden_layers")
        types = hf.get("layer_types")
        if not types:
            interval = hf.get("full_attention_interval", 4)
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
        if len(types) != n:
            raise ModelConfigError(f"config.json: layer_types has {len(types)} entries, num_hidden_layers is {n}")
        mlp_only = set(hf.get("mlp_only_layers") or [])
        experts, sparse_step = hf.get("num_experts", 0) or 0, hf.get("decoder_sparse_step", 1) or 1
        blocks, block_layer = [], []
        for i, t in enumerate(types):
            if t not in ("linear_attention", "full_attention"):
                raise ModelConfigError(f"config.json: layer_types[{i}] = {t!r} is not supported")
            blocks.append("ssm" if t == "linear_attention" else "attention")
            moe = experts > 0 and i not in mlp_only and (i + 1) % sparse_step == 0
            blocks.append("moe" if moe else "mlp")
            block_layer += [i, i]
        rope = hf.get("rope_parameters") or {}
        head_dim = hf.get("head_dim") or req("hidden_size") // req("num_attention_heads")
        partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25))
        rotary = int(head_dim * partial)
        return cls(
            arch="qwen3_next", vocab_size=req("vocab_size"), hidden_size=req("hidden_size"),
            blocks=blocks, block_layer=block_layer, norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), eos_token_id=cls._eos(hf),
            num_attention_heads=req("num_attention_heads"),
            num_key_value_heads=hf.get("num_key_value_heads") or req("num_attention_heads"),
            head_dim=head_dim, attn_bias=bool(hf.get("attention_bias", False)),
            attn_output_gate=bool(hf.get("attn_output_gate", True)), qk_norm=True,
            rotary_dim=rotary - rotary % 2, rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            intermediate_size=req("intermediate_size"), mlp_act=_act(hf.get("hidden_act", "silu")), mlp_gated=True,
            ssm_heads=req("linear_num_value_heads"), ssm_head_v_dim=req("linear_value_head_dim"),
            ssm_head_k_dim=req("linear_key_head_dim"), ssm_k_heads=req("linear_num_key_heads"),
            conv_kernel=hf.get("linear_conv_kernel_dim", 4), conv_bias=False,
        )

    @classmethod
    def from_file(cls, path) -> "HybridConfig":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelConfigError(f"{path}: config.json not found") from None
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise ModelConfigError(f"{path}: expected a JSON object")
        return cls.from_hf(data)


def _act(name: str) -> str:
    if name in ("relu2", "squared_relu"):
        return "relu2"
    if name in ("silu", "swish"):
        return "silu"
    raise ModelConfigError(f"config.json: unsupported activation {name!r}")


def embedded_config(family: str = "mamba2") -> HybridConfig:
    """The small built-in model served when no --model-path is given (byte-level vocabulary)."""
    common = dict(vocab_size=272, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, ssm_heads=4, ssm_head_v_dim=16, ssm_head_k_dim=16, ssm_k_heads=2,
                  conv_kernel=4, eos_token_id=[257])
    if family == "mamba2":
        blocks = ["ssm", "mlp", "ssm", "attention", "mlp", "ssm", "mlp"]
        return HybridConfig(arch="nemotron_h", blocks=blocks, block_layer=list(range(len(blocks))),
                            mlp_act="relu2", **common).validate()
    if family == "gdn":
        blocks = ["ssm", "mlp", "attention", "mlp", "ssm", "mlp"]
        return HybridConfig(arch="qwen3_next", blocks=blocks, block_layer=[0, 0, 1, 1, 2, 2], mlp_act="silu",
                            mlp_gated=True, attn_output_gate=True, qk_norm=True, rotary_dim=4, conv_bias=False,
                            norm_eps=1e-6, **common).validate()
    raise ModelConfigError(f"embedded model family must be 'mamba2' or 'gdn', got {family!r}")
