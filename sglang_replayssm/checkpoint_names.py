"""Checkpoints as users have them: config names that ``transformers`` 5 saves, as SGLang 0.5.23 reads them.

``transformers`` 5 saves some hybrid models' ``config.json`` with names SGLang 0.5.23's config classes do
not read:

* **Nemotron-H** (``model_type: nemotron_h``): ``layers_block_type`` / ``mtp_layers_block_type`` use
  transformers' internal layer names (``linear_attention``, ``full_attention``); SGLang's
  ``NemotronHConfig`` accepts only ``mamba / attention / mlp / moe`` (a ValueError at start). The Mamba
  settings are saved as ``n_groups``, ``conv_kernel``, ``expand``, ``time_step_*``, ``use_conv_bias``,
  ``chunk_size``, while SGLang reads the names NVIDIA's released checkpoints use (``mamba_n_groups``,
  ``mamba_d_conv``, ...) and would otherwise take its defaults (8 groups ...) without a word.
* **Qwen3-Next** (``model_type: qwen3_next``): the layer pattern is saved as ``layer_types``; SGLang's
  ``Qwen3NextConfig`` derives the pattern from ``full_attention_interval`` (full attention at every
  interval-th layer), which such a folder lacks.

``sglang_config(cfg)`` returns the config with SGLang's names added (the user's names kept, so
``transformers`` still reads it) and the list of changes, or raises ``CheckpointNameError`` saying what to
change when SGLang cannot express the folder's layout (e.g. a Qwen3-Next layer pattern that is not "full
attention every n-th layer"). ``sglang_model_argv(argv)`` is what ``python -m sglang_replayssm.launch
--engine sglang`` calls: a ``--model-path`` (or ``--speculative-draft-model-path``) folder that needs the
names is replaced by an *overlay* folder — symlinks to every file of the user's folder and the rewritten
``config.json`` — under ``$SGLANG_REPLAYSSM_OVERLAY_DIR`` (default ``~/.cache/sglang_replayssm/
checkpoint_overlays``); the user's folder is never written. ``--served-model-name`` defaults to the user's
path, so clients see the folder they asked for.

The mapping is defined once, here; ``cpu_harness/tiny_checkpoints.py`` uses it for its own checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

# transformers 5's internal Nemotron-H layer names -> SGLang's (``mlp`` and ``moe`` are the same in both)
NEMOTRON_H_LAYER_NAMES = {"linear_attention": "mamba", "full_attention": "attention"}
NEMOTRON_H_SGLANG_LAYERS = ("mamba", "attention", "mlp", "moe")
# SGLang's hybrid_override_pattern letters
NEMOTRON_H_PATTERN_LETTERS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
# SGLang's NemotronHConfig name -> the name transformers 5 saves
NEMOTRON_H_MAMBA_NAMES = {
    "mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_expand": "expand",
    "mamba_conv_bias": "use_conv_bias", "mamba_dt_min": "time_step_min", "mamba_dt_max": "time_step_max",
    "mamba_dt_limit": "time_step_limit", "mamba_dt_init_floor": "time_step_floor", "mamba_chunk_size": "chunk_size",
}
QWEN3_NEXT_LAYERS = ("linear_attention", "full_attention")

OVERLAY_ENV = "SGLANG_REPLAYSSM_OVERLAY_DIR"
# flags naming a model folder SGLang reads a config.json from
MODEL_FLAGS = (("--model-path", "--model"), ("--speculative-draft-model-path", "--speculative-draft-model"))


class CheckpointNameError(ValueError):
    """The folder's config cannot be expressed in SGLang's names; the message says what to change."""


def _nemotron_h(cfg: dict, where: str) -> list[str]:
    changes = []
    for key in ("layers_block_type", "mtp_layers_block_type"):
        types = cfg.get(key)
        if types is None:
            continue
        if not isinstance(types, list):
            raise CheckpointNameError(f"{where}: {key} must be a list of layer names, got {types!r}")
        mapped = [NEMOTRON_H_LAYER_NAMES.get(t, t) for t in types]
        unknown = sorted({t for t in mapped if t not in NEMOTRON_H_SGLANG_LAYERS})
        if unknown:
            raise CheckpointNameError(
                f"{where}: {key} has layer names {unknown} that neither SGLang 0.5.23's NemotronHConfig "
                f"({', '.join(NEMOTRON_H_SGLANG_LAYERS)}) nor transformers 5 "
                f"({', '.join(sorted(NEMOTRON_H_LAYER_NAMES))}, mlp, moe) knows: fix {key} in config.json")
        if mapped != types:
            cfg[key] = mapped
            changes.append(f"{key}: {', '.join(sorted(set(types) - set(mapped)))} -> SGLang's layer names")
    types = cfg.get("layers_block_type")
    if any(c.startswith("layers_block_type:") for c in changes):   # NVIDIA's legacy names beside the list
        pattern = "".join(NEMOTRON_H_PATTERN_LETTERS[t] for t in types)
        if cfg.get("hybrid_override_pattern") != pattern:
            cfg["hybrid_override_pattern"] = pattern
            changes.append(f"hybrid_override_pattern = {pattern}")
        if cfg.get("num_hidden_layers") != len(types):
            cfg["num_hidden_layers"] = len(types)
            changes.append(f"num_hidden_layers = {len(types)}")
    for sglang_name, hf_name in NEMOTRON_H_MAMBA_NAMES.items():
        if hf_name in cfg and sglang_name not in cfg:
            cfg[sglang_name] = cfg[hf_name]
            changes.append(f"{sglang_name} = {hf_name}")
        elif hf_name in cfg and cfg[sglang_name] != cfg[hf_name]:
            raise CheckpointNameError(
                f"{where}: {sglang_name} ({cfg[sglang_name]!r}, read by SGLang) and {hf_name} "
                f"({cfg[hf_name]!r}, read by transformers) disagree: make them equal in config.json")
    return changes


def _qwen3_next(cfg: dict, where: str) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        return []
    if not isinstance(types, list) or any(t not in QWEN3_NEXT_LAYERS for t in types):
        raise CheckpointNameError(f"{where}: layer_types must list {' / '.join(QWEN3_NEXT_LAYERS)} per layer, "
                                  f"got {types!r}")
    layers = cfg.get("num_hidden_layers", len(types))
    if layers != len(types):
        raise CheckpointNameError(f"{where}: num_hidden_layers is {layers} but layer_types lists {len(types)} "
                                  "layers: make them agree in config.json")
    full = [i for i, t in enumerate(types) if t == "full_attention"]

    def pattern(n: int) -> list[str]:
        return ["full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(len(types))]

    if "full_attention_interval" in cfg:
        n = cfg["full_attention_interval"]
        if not isinstance(n, int) or n < 1 or pattern(n) != types:
            raise CheckpointNameError(
                f"{where}: full_attention_interval {n!r} (read by SGLang) does not give layer_types (read by "
                f"transformers: full attention at layers {full}): make them agree in config.json")
        return []
    n = full[0] + 1 if full else len(types) + 1
    if pattern(n) != types:
        raise CheckpointNameError(
            f"{where}: layer_types puts full attention at layers {full}; SGLang 0.5.23's Qwen3NextConfig can only "
            "place it at every n-th layer (full_attention_interval = n, layers n-1, 2n-1, ...), so SGLang cannot "
            "serve this layout (the native engine reads layer_types: --engine native)")
    cfg["full_attention_interval"] = n
    return [f"full_attention_interval = {n} (from layer_types)"]


_FAMILIES = {"nemotron_h": _nemotron_h, "qwen3_next": _qwen3_next}


def sglang_config(cfg: dict, where: str = "config.json") -> tuple[dict, list[str]]:
    """``cfg`` with the names SGLang 0.5.23 reads added, and what changed (empty: nothing to change).
    Raises ``CheckpointNameError`` (naming ``where`` and what to change) when SGLang cannot read the layout."""
    out = json.loads(json.dumps(cfg))   # a deep copy, JSON values only
    fix = _FAMILIES.get(out.get("model_type"))
    return (out, fix(out, where)) if fix else (out, [])


def _overlay_root() -> Path:
    root = os.environ.get(OVERLAY_ENV)
    if root:
        return Path(root)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "sglang_replayssm" / "checkpoint_overlays"


def overlay_folder(model_dir: str | os.PathLike, root: str | os.PathLike | None = None) -> tuple[Path, list[str]]:
    """The folder SGLang should read for ``model_dir``, and what was translated: ``model_dir`` itself when its
    config needs nothing, else an overlay folder (symlinks to the user's files + the rewritten config.json),
    reused while the user's file names and config are unchanged. Raises ``CheckpointNameError``."""
    src = Path(model_dir).resolve()
    config_path = src / "config.json"
    cfg = json.loads(config_path.read_text())
    new, changes = sglang_config(cfg, str(config_path))
    if not changes:
        return Path(model_dir), []
    text = json.dumps(new, indent=1, sort_keys=True)
    names = sorted(p.name for p in src.iterdir() if p.name != "config.json")
    key = hashlib.sha256("\0".join([str(src), text, *names]).encode()).hexdigest()[:16]
    root = Path(root) if root is not None else _overlay_root()
    dest = root / f"{src.name}-{key}"
    if (dest / "config.json").is_file():
        return dest, changes
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{src.name}-", dir=root))
    try:
        for name in names:
            (tmp / name).symlink_to(src / name)
        (tmp / "config.json").write_text(text)
        try:
            tmp.rename(dest)
        except OSError:   # another launcher made the same overlay meanwhile: same content, use it
            if not (dest / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dest, changes


def _flag_value(argv: list[str], names: tuple[str, ...]) -> tuple[int, str, bool] | None:
    """(index, value, inline ``--flag=value``) of the last occurrence of one of ``names``."""
    found = None
    for i, a in enumerate(argv):
        if a in names and i + 1 < len(argv):
            found = (i + 1, argv[i + 1], False)
        elif any(a.startswith(n + "=") for n in names):
            found = (i, a.split("=", 1)[1], True)
    return found


def sglang_model_argv(argv: list[str], log=print) -> list[str]:
    """``argv`` for SGLang with every model folder that needs SGLang's config names replaced by its overlay
    (see the module doc). Raises ``CheckpointNameError`` with what to change when SGLang cannot read one."""
    out = list(argv)
    for names in MODEL_FLAGS:
        found = _flag_value(out, names)
        if found is None or not (Path(found[1]) / "config.json").is_file():
            continue   # not a local folder (a hub id: SGLang downloads and reads it itself)
        i, value, inline = found
        try:
            folder, changes = overlay_folder(value)
        except CheckpointNameError as e:
            raise CheckpointNameError(f"{names[0]}: {e}") from None
        if not changes:
            continue
        out[i] = f"{names[0]}={folder}" if inline else str(folder)
        log(f"sglang_replayssm: {value}: config.json uses transformers 5 names that SGLang 0.5.23 does not read; "
            f"serving it through {folder} (symlinks to your files; config.json with {'; '.join(changes)})")
        if names[0] == "--model-path" and _flag_value(out, ("--served-model-name",)) is None:
            out += ["--served-model-name", value]
    return out
