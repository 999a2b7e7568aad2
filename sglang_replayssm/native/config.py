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
import math
from pathlib import Path


class ModelConfigError(ValueError):
    """config.json describes something the native engine cannot build."""


NEMOTRON_PATTERN = {"M": "ssm", "*": "attention", "-": "mlp", "E": "moe"}
NEMOTRON_TYPES = {"mamba": "ssm", "linear_attention": "ssm", "attention": "attention",
                  "full_attention": "attention", "mlp": "mlp", "moe": "moe"}
HF_NAMES = {   # HybridConfig field -> the config.json key it is read from, per arch
    "nemotron_h": dict(ssm_heads="mamba_num_heads", ssm_head_v_dim="mamba_head_dim", ssm_head_k_dim="ssm_state_size",
                       ssm_k_heads="n_groups", norm_eps="layer_norm_epsilon"),
    "qwen3_next": dict(ssm_heads="linear_num_value_heads", ssm_head_v_dim="linear_value_head_dim",
                       ssm_head_k_dim="linear_key_head_dim", ssm_k_heads="linear_num_key_heads",
                       conv_kernel="linear_conv_kernel_dim", norm_eps="rms_norm_eps"),
}

_REQUIRED = object()
MAX_DIM = 1 << 31   # no dimension, head count or vocabulary of a servable model is this large


def _show(v) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:60] + "..."


def _int(hf: dict, *keys, default=_REQUIRED, lo: int = 1):
    """The first of `keys` present (and not null) as an integer in [lo, MAX_DIM); `default` when none is."""
    for key in keys:
        v = hf.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelConfigError(f"config.json: {key} must be an integer, got {_show(v)}")
        if not lo <= v < MAX_DIM:
            raise ModelConfigError(f"config.json: {key} must be an integer in [{lo}, {MAX_DIM}), got {_show(v)}")
        return v
    if default is _REQUIRED:
        raise ModelConfigError(f"config.json: missing required key {keys[0]!r}")
    return default


def _num(hf: dict, key: str, default: float, lo: float = 0.0, hi: float = float("inf"), lo_open: bool = True) -> float:
    """A finite number in (lo, hi] (or [lo, hi] with lo_open=False); `default` when absent or null."""
    v = hf.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ModelConfigError(f"config.json: {key} must be a finite number, got {_show(v)}")
    if v < lo or (lo_open and v == lo) or v > hi:
        raise ModelConfigError(f"config.json: {key} must be in {'(' if lo_open else '['}{lo}, {hi}], got {_show(v)}")
    return float(v)


def _bool(hf: dict, key: str, default: bool) -> bool:
    v = hf.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ModelConfigError(f"config.json: {key} must be true or false, got {_show(v)}")
    return v


def _str(hf: dict, key: str, default: str) -> str:
    v = hf.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise ModelConfigError(f"config.json: {key} must be a string, got {_show(v)}")
    return v


def _list(hf: dict, key: str, kind: type, what: str):
    """A list whose every item is a `kind` (never a bool), or None when absent or null."""
    v = hf.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, kind) and not isinstance(x, bool) for x in v):
        raise ModelConfigError(f"config.json: {key} must be a list of {what}, got {_show(v)}")
    return v


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

    def hf_name(self, field: str) -> str:
        """The config.json key a field comes from (for error messages)."""
        names = HF_NAMES.get(self.arch, {})
        return f"{names[field]} ({field})" if field in names else field

    def validate(self) -> "HybridConfig":
        def need(cond, msg):
            if not cond:
                raise ModelConfigError("config.json: " + msg)
        n = self.hf_name
        need(self.arch in ("nemotron_h", "qwen3_next"), f"unknown arch {self.arch!r}")
        for name in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "ssm_heads", "ssm_head_v_dim", "ssm_head_k_dim", "ssm_k_heads", "conv_kernel"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and 0 < v < MAX_DIM,
                 f"{n(name)} must be a positive integer, got {_show(v)}")
        need(isinstance(self.rotary_dim, int) and self.rotary_dim >= 0, f"rotary_dim must be >= 0, got {self.rotary_dim!r}")
        need(isinstance(self.norm_eps, (int, float)) and not isinstance(self.norm_eps, bool)
             and math.isfinite(self.norm_eps) and self.norm_eps > 0,
             f"norm_eps must be a positive number, got {self.norm_eps!r}")
        need(all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in self.eos_token_id),
             f"eos_token_id must be non-negative integers, got {_show(self.eos_token_id)}")
        bad = sorted(set(self.blocks) - {"ssm", "attention", "mlp"})
        where = "num_experts" if self.arch == "qwen3_next" else "hybrid_override_pattern / layers_block_type"
        need(not bad, f"layer kinds {bad} ({where}) are not supported by the native engine (MoE layers are not)")
        need(self.num_ssm_layers > 0, "the model has no SSM layers: nothing for ReplaySSM to do")
        need(self.ssm_heads % self.ssm_k_heads == 0,
             f"the SSM heads, {n('ssm_heads')} = {self.ssm_heads}, must be a multiple of the key heads/groups, "
             f"{n('ssm_k_heads')} = {self.ssm_k_heads}")
        if self.num_attn_layers:
            need(self.num_attention_heads % self.num_key_value_heads == 0,
                 f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                 f"({self.num_key_value_heads})")
            need(self.rotary_dim % 2 == 0 and self.rotary_dim <= self.head_dim,
                 f"bad rotary dimension {self.rotary_dim} (head_dim {self.head_dim} x partial_rotary_factor)")
        need(self.mlp_act in ("relu2", "silu"), f"unsupported MLP activation {self.mlp_act!r}")
        return self

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_hf(cls, hf: dict) -> "HybridConfig":
        """Every field read is type- and range-checked: a wrong one is a ModelConfigError naming it."""
        if not isinstance(hf, dict):
            raise ModelConfigError(f"config.json: expected a JSON object, got {_show(hf)}")
        archs = _list(hf, "architectures", str, "strings") or []
        model_type = _str(hf, "model_type", "")
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
    def _eos(hf: dict) -> list:
        eos = hf.get("eos_token_id")
        if eos is None:
            return []
        if isinstance(eos, list):
            _list(hf, "eos_token_id", int, "token ids")
            if any(e < 0 for e in eos):
                raise ModelConfigError(f"config.json: eos_token_id must be token ids >= 0, got {_show(eos)}")
            return list(eos)
        if isinstance(eos, bool) or not isinstance(eos, int) or eos < 0:
            raise ModelConfigError(f"config.json: eos_token_id must be a token id (an integer >= 0) or a list "
                                   f"of them, got {_show(eos)}")
        return [eos]

    @staticmethod
    def _layer_kinds(hf: dict, key: str, table: dict) -> list:
        types = _list(hf, key, str, "strings")
        bad = sorted(set(types or ()) - set(table))
        if bad:
            raise ModelConfigError(f"config.json: {key} has unknown layer types {bad}")
        return types

    @classmethod
    def _from_nemotron_h(cls, hf: dict) -> "HybridConfig":
        pattern = _str(hf, "hybrid_override_pattern", "")
        if pattern:
            bad = sorted(set(pattern) - set(NEMOTRON_PATTERN))
            if bad:
                raise ModelConfigError(f"config.json: hybrid_override_pattern has unknown symbols {bad}")
            blocks = [NEMOTRON_PATTERN[c] for c in pattern]
        else:
            types = (cls._layer_kinds(hf, "layers_block_type", NEMOTRON_TYPES)
                     or cls._layer_kinds(hf, "layer_types", NEMOTRON_TYPES))
            if not types:
                raise ModelConfigError("config.json: missing 'hybrid_override_pattern' (or 'layers_block_type')")
            blocks = [NEMOTRON_TYPES[t] for t in types]
        heads = _int(hf, "num_attention_heads")
        hidden = _int(hf, "hidden_size")
        mamba_act = _str(hf, "mamba_hidden_act", "silu")
        if mamba_act not in ("silu", "swish"):
            raise ModelConfigError(f"config.json: mamba_hidden_act {mamba_act!r} is not supported (silu)")
        return cls(
            arch="nemotron_h", vocab_size=_int(hf, "vocab_size"), hidden_size=hidden,
            blocks=blocks, block_layer=list(range(len(blocks))),
            norm_eps=_num(hf, "layer_norm_epsilon", 1e-5),
            tie_word_embeddings=_bool(hf, "tie_word_embeddings", False), eos_token_id=cls._eos(hf),
            num_attention_heads=heads, num_key_value_heads=_int(hf, "num_key_value_heads", default=heads),
            head_dim=_int(hf, "head_dim", "attention_head_dim", default=hidden // heads or 1),
            attn_bias=_bool(hf, "attention_bias", False),
            intermediate_size=_int(hf, "intermediate_size"),
            mlp_act=_act(_str(hf, "mlp_hidden_act", "relu2"), "mlp_hidden_act"),
            mlp_bias=_bool(hf, "mlp_bias", False),
            ssm_heads=_int(hf, "mamba_num_heads"), ssm_head_v_dim=_int(hf, "mamba_head_dim"),
            ssm_head_k_dim=_int(hf, "ssm_state_size"), ssm_k_heads=_int(hf, "n_groups", "mamba_n_groups", default=8),
            conv_kernel=_int(hf, "conv_kernel", "mamba_d_conv", default=4),
            conv_bias=_bool(hf, "use_conv_bias", _bool(hf, "mamba_conv_bias", True)),
            ssm_proj_bias=_bool(hf, "use_bias", False),
        )

    @classmethod
    def _from_qwen3_next(cls, hf: dict) -> "HybridConfig":
        n = _int(hf, "num_hidden_layers")
        types = _list(hf, "layer_types", str, "strings")
        if not types:
            interval = _int(hf, "full_attention_interval", default=4)
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
        if len(types) != n:
            raise ModelConfigError(f"config.json: layer_types has {len(types)} entries, num_hidden_layers is {n}")
        mlp_only = set(_list(hf, "mlp_only_layers", int, "layer indices") or [])
        experts = _int(hf, "num_experts", default=0, lo=0)
        sparse_step = _int(hf, "decoder_sparse_step", default=1, lo=0) or 1
        blocks, block_layer = [], []
        for i, t in enumerate(types):
            if t not in ("linear_attention", "full_attention"):
                raise ModelConfigError(f"config.json: layer_types[{i}] = {t!r} is not supported")
            blocks.append("ssm" if t == "linear_attention" else "attention")
            moe = experts > 0 and i not in mlp_only and (i + 1) % sparse_step == 0
            blocks.append("moe" if moe else "mlp")
            block_layer += [i, i]
        rope = hf.get("rope_parameters")
        if rope is None:
            rope = {}
        elif not isinstance(rope, dict):
            raise ModelConfigError(f"config.json: rope_parameters must be an object, got {_show(rope)}")
        hidden, heads = _int(hf, "hidden_size"), _int(hf, "num_attention_heads")
        head_dim = _int(hf, "head_dim", default=hidden // heads or 1)
        partial = _num(rope, "partial_rotary_factor", _num(hf, "partial_rotary_factor", 0.25, hi=1.0), hi=1.0)
        rotary = int(head_dim * partial)
        theta = _num(rope, "rope_theta", _num(hf, "rope_theta", 10000.0))
        return cls(
            arch="qwen3_next", vocab_size=_int(hf, "vocab_size"), hidden_size=hidden,
            blocks=blocks, block_layer=block_layer, norm_eps=_num(hf, "rms_norm_eps", 1e-6),
            tie_word_embeddings=_bool(hf, "tie_word_embeddings", False), eos_token_id=cls._eos(hf),
            num_attention_heads=heads, num_key_value_heads=_int(hf, "num_key_value_heads", default=heads),
            head_dim=head_dim, attn_bias=_bool(hf, "attention_bias", False),
            attn_output_gate=_bool(hf, "attn_output_gate", True), qk_norm=True,
            rotary_dim=rotary - rotary % 2, rope_theta=theta,
            intermediate_size=_int(hf, "intermediate_size"), mlp_act=_act(_str(hf, "hidden_act", "silu"), "hidden_act"),
            mlp_gated=True,
            ssm_heads=_int(hf, "linear_num_value_heads"), ssm_head_v_dim=_int(hf, "linear_value_head_dim"),
            ssm_head_k_dim=_int(hf, "linear_key_head_dim"), ssm_k_heads=_int(hf, "linear_num_key_heads"),
            conv_kernel=_int(hf, "linear_conv_kernel_dim", default=4), conv_bias=False,
        )

    @classmethod
    def from_file(cls, path) -> "HybridConfig":
        path = Path(path)
        try:
            text = path.read_bytes().decode("utf-8")
        except FileNotFoundError:
            raise ModelConfigError(f"{path}: config.json not found") from None
        except UnicodeDecodeError as e:
            raise ModelConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except OSError as e:
            raise ModelConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"{path}: not valid JSON ({e})") from None
        except (ValueError, RecursionError) as e:   # a >4300-digit integer, nesting too deep
            raise ModelConfigError(f"{path}: not valid JSON ({str(e)[:200] or type(e).__name__})") from None
        if not isinstance(data, dict):
            raise ModelConfigError(f"{path}: expected a JSON object")
        return cls.from_hf(data)


def _act(name: str, key: str = "activation") -> str:
    if name in ("relu2", "squared_relu"):
        return "relu2"
    if name in ("silu", "swish"):
        return "silu"
    raise ModelConfigError(f"config.json: {key}: unsupported activation {name!r}")

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
