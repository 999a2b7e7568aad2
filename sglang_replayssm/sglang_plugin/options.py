"""Which ReplaySSM options are in force in this process, and how they coexist with SGLang's flags.

ReplaySSM is *off* in SGLang unless asked for: the options are in force when any ``--replayssm-*``
flag was given on SGLang's command line, or when ``SGLANG_REPLAYSSM_OPTIONS`` is set (our launcher
sets it). The launcher process parses the flags (``cli.py``) and stores them in that environment
variable, so every process SGLang spawns (schedulers, detokenizer) reads the same options back.

The flag names, parsing and value checks live in :mod:`sglang_replayssm.flags` (shared with the
native engine); this module adds the checks against SGLang's own arguments, and which implementation
the pools use: ``SGLANG_REPLAYSSM_OPS=reference|kernels`` forces the PyTorch reference or the Triton
kernels (tests run the kernels on CPU under ``TRITON_INTERPRET=1`` that way); unset, the kernels run on
CUDA and the reference elsewhere (``family_ops.FamilyOps.select``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from pathlib import Path

from sglang_replayssm.flags import ENV_VAR, FlagError, ReplaySSMOptions

OPS_ENV = "SGLANG_REPLAYSSM_OPS"
_UNSET = object()
_cached = _UNSET


def active_options() -> ReplaySSMOptions | None:
    """The options in force in this process, or None when ReplaySSM is off."""
    global _cached
    if _cached is _UNSET:
        _cached = ReplaySSMOptions.from_env() if os.environ.get(ENV_VAR) else None
    return _cached


def set_active(opts: ReplaySSMOptions | None) -> None:
    """Make ``opts`` the options of this process and of every process it spawns from now on."""
    global _cached
    _cached = opts
    if opts is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ.update(opts.to_env())


def ops_backend() -> str:
    """The ``backend`` argument of ``FamilyOps.select`` for this process: ``auto`` unless ``OPS_ENV`` forces one."""
    forced = os.environ.get(OPS_ENV, "").strip()
    if forced and forced not in ("reference", "kernels"):
        raise ValueError(f"{OPS_ENV} must be 'reference' or 'kernels', got {forced!r}")
    return forced or "auto"


def _reset_cache_for_tests() -> None:
    global _cached
    _cached = _UNSET


def _get(args, name, default=None):
    return getattr(args, name, default)


def check_against_sglang(opts: ReplaySSMOptions, args) -> None:
    """Refuse combinations with SGLang's own arguments (``args``: ServerArgs or argparse Namespace).

    Raises FlagError naming the flag at fault."""
    for name, flag in (("enable_linear_replayssm", "--enable-linear-replayssm"),
                       ("enable_linear_replayssm_spec", "--enable-linear-replayssm-spec")):
        if _get(args, name, False):
            raise FlagError(
                flag,
                "SGLang's built-in linear ReplaySSM cannot run together with the sglang-replayssm plugin's "
                "--replayssm-* flags (both replace the same mamba state pool and kernels). Use one: drop "
                f"{flag}, or drop the --replayssm-* flags (or unset {ENV_VAR}).")
    if _get(args, "enable_int8_mamba_checkpoint", False):
        raise FlagError(
            "--enable-int8-mamba-checkpoint",
            "the int8 mamba checkpoint pool stores SGLang-format states; it is not supported together with "
            "the ReplaySSM pool (--replayssm-* flags)")
    check_drafts(opts, args)


def _local_config(path) -> dict | None:
    """``config.json`` of a local model folder (None: not a local folder, e.g. a hub id SGLang downloads)."""
    try:
        return json.loads((Path(path) / "config.json").read_text()) if path else None
    except (OSError, ValueError):
        return None


def sglang_model_class(arch: str | None):
    """SGLang's model class for the architecture name ``arch``, importing only the module of ``sglang.srt.models``
    that defines it (SGLang's registry would import every model), or None."""
    spec = importlib.util.find_spec("sglang.srt.models") if arch else None
    if spec is None or not spec.submodule_search_locations:
        return None
    for f in sorted(Path(spec.submodule_search_locations[0]).glob("*.py")):
        if f"class {arch}(" in f.read_text(errors="ignore"):
            cls = getattr(importlib.import_module(f"sglang.srt.models.{f.stem}"), arch, None)
            if cls is not None:
                return cls
    return None


def _hybrid(cfg: dict | None) -> bool:
    """A config of one of the hybrid SSM families the plugin serves (Nemotron-H, Qwen3-Next, Kimi Linear)."""
    cfg = cfg or {}
    keys = ("hybrid_override_pattern", "layers_block_type", "mamba_num_heads", "linear_num_value_heads",
            "linear_attn_config")
    return any(k in cfg or k in (cfg.get("text_config") or {}) for k in keys)


# the speculative algorithms whose draft workers take the target's embedding and head from the target model
# (SGLang's SpeculativeAlgorithm.is_eagle(): EAGLE and its alias NEXTN, EAGLE3, FROZEN_KV_MTP)
def _eagle_family(name: str) -> bool:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    try:
        return SpeculativeAlgorithm.from_string(name).is_eagle()
    except ValueError:
        return False   # SGLang reports an unknown name itself


def check_drafts(opts: ReplaySSMOptions, args) -> None:
    """Refuse, at start, the draft algorithms SGLang 0.5.23 cannot run for the model being served (found out from
    SGLang's own model class, so a later SGLang that can is not refused), instead of a scheduler traceback once the
    weights loaded; on ``--device cpu``, SGLang's own speculative commit of a hybrid model; and speculative decoding
    with ReplaySSM decode but not its verify."""
    algo = _get(args, "speculative_algorithm")
    if not algo or str(algo).upper() == "NONE":
        return
    if opts.decode and not opts.verify:   # also checked where the pool is built; here before any weight loads
        raise FlagError("--no-replayssm-verify",
                        "speculative decoding with ReplaySSM decode needs --replayssm-verify (SGLang's snapshot "
                        "verify reads the full state, which a ReplaySSM slot keeps as checkpoint + ring)")
    target = _local_config(_get(args, "model_path"))
    if not opts.decode and str(_get(args, "device", "") or "").startswith("cpu") and _hybrid(target):
        raise FlagError(
            "--no-replayssm-decode",
            f"with --speculative-algorithm {algo} on --device cpu, SGLang 0.5.23 commits the drafts of a hybrid model "
            "itself, and its state scatter (fused_mamba_state_scatter_with_mask) runs on CUDA/XPU only: keep "
            "ReplaySSM decode on (its commit runs on CPU), or drop --speculative-algorithm")
    if target is None or not _eagle_family(str(algo)):
        return
    arch = (target.get("architectures") or [None])[0]
    cls = sglang_model_class(arch)
    if cls is None:
        return
    if not (hasattr(cls, "get_embed_and_head") or hasattr(cls, "get_embed_and_head_for_draft")):
        raise FlagError(
            "--speculative-algorithm",
            f"{algo} drafts share the target's embedding and LM head, and SGLang 0.5.23's {arch} does not hand them "
            "out (no get_embed_and_head): its EAGLE / EAGLE3 / NEXTN (MTP) drafts cannot run; use "
            "--speculative-algorithm NGRAM")
    draft_path = _get(args, "speculative_draft_model_path")
    draft = _local_config(draft_path) or {}
    eagle = draft.get("eagle_config") or {}
    if (str(algo).upper() == "EAGLE3" and eagle.get("use_aux_hidden_state", True)
            and not hasattr(cls, "set_eagle3_layers_to_capture")):
        raise FlagError(
            "--speculative-algorithm",
            f"EAGLE3 with a draft head that reads the target's intermediate (aux) hidden states ({draft_path}: "
            "eagle_config.use_aux_hidden_state is not false) needs the target to capture them, and SGLang 0.5.23's "
            f"{arch} does not (no set_eagle3_layers_to_capture): serve a head that reads the final hidden state "
            "(eagle_config.use_aux_hidden_state: false), or --speculative-algorithm NGRAM")
