"""Checkpoints as users have them: folders saved by transformers 5 (its config names), which SGLang 0.5.23's config
classes cannot read, served by our launcher through an overlay folder or refused with what to change
(``sglang_replayssm/checkpoint_names.py``). SGLang's own config loader (``get_config``, what its model runner
calls) is the judge; the served answers of such folders are tested in tests/sglang_server (the m2-L4 and
gdn-L4-kernels servers start from them)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_replayssm.checkpoint_names import CheckpointNameError, overlay_folder, sglang_model_argv

pytest.importorskip("transformers")
FAMILIES = ("nemotron_h", "qwen3_next")
# the layers each tiny family has, as SGLang's config class reports them
SGLANG_LAYERS = {"nemotron_h": ["mamba", "attention", "mamba", "mlp"],
                 "qwen3_next": ["linear_attention", "attention", "linear_attention", "attention"]}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """The tiny checkpoints exactly as transformers 5 saves them."""
    from sglang_replayssm.cpu_harness.tiny_checkpoints import write_checkpoint

    out = tmp_path_factory.mktemp("transformers5-folders")
    return {f: write_checkpoint(f, out / f, seed=0, sglang_names=False) for f in FAMILIES}


def _fingerprint(folder: Path) -> dict[str, tuple[str, int]]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def _sglang_config(folder):
    sglang_config = pytest.importorskip("sglang.srt.utils.hf_transformers.config")
    return sglang_config.get_config(str(folder), trust_remote_code=False)


def test_sglang_cannot_read_the_folders_transformers5_saves(saved):
    """Why the overlay exists: SGLang's NemotronHConfig raises on transformers 5's layer names, and its
    Qwen3NextConfig has no layer pattern without full_attention_interval."""
    with pytest.raises(ValueError, match="linear_attention"):
        _sglang_config(saved["nemotron_h"])
    cfg = _sglang_config(saved["qwen3_next"])
    with pytest.raises(AttributeError, match="full_attention_interval"):
        cfg.layers_block_type


@pytest.mark.parametrize("family", FAMILIES)
def test_launcher_argv_serves_the_folder_through_an_overlay_sglang_reads(saved, family, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_REPLAYSSM_OVERLAY_DIR", str(tmp_path / "overlays"))
    src = saved[family]
    before = _fingerprint(src)
    said = []
    argv = sglang_model_argv(["--model-path", str(src), "--device", "cpu"], log=said.append)
    folder = Path(argv[1])
    assert folder.parent == tmp_path / "overlays" and argv[2:4] == ["--device", "cpu"]
    # clients see the folder they asked for
    assert argv[argv.index("--served-model-name") + 1] == str(src)
    assert len(said) == 1 and str(src) in said[0] and str(folder) in said[0]
    cfg = _sglang_config(folder)
    assert type(cfg).__module__.startswith("sglang.srt.configs.")
    assert cfg.layers_block_type == SGLANG_LAYERS[family]
    user_cfg = json.loads((src / "config.json").read_text())
    if family == "nemotron_h":   # the Mamba settings under the names SGLang reads, not its defaults (8 groups, ...)
        assert (cfg.mamba_n_groups, cfg.conv_kernel, cfg.mamba_chunk_size) == (
            user_cfg["n_groups"], user_cfg["conv_kernel"], user_cfg["chunk_size"])
    # every other file is a link to the user's; the user's folder is untouched
    for p in src.iterdir():
        if p.name != "config.json":
            assert (folder / p.name).is_symlink() and (folder / p.name).resolve() == p.resolve()
    assert _fingerprint(src) == before
    # transformers still reads the overlay (the user's names are kept beside SGLang's)
    import transformers

    assert transformers.AutoConfig.from_pretrained(folder).layer_types == user_cfg.get(
        "layers_block_type", user_cfg.get("layer_types"))
    # the same folder again: the same overlay; a changed config: a new one
    assert sglang_model_argv(["--model-path=" + str(src)], log=said.append)[0] == f"--model-path={folder}"
    other = tmp_path / "copy"
    other.mkdir()
    for p in src.iterdir():
        (other / p.name).write_bytes(p.read_bytes())
    assert overlay_folder(other)[0] != folder


def test_a_folder_sglang_reads_is_passed_unchanged(tmp_path):
    from sglang_replayssm.cpu_harness.tiny_checkpoints import _sglang_compatible_config

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "nemotron_h", "layers_block_type": [
        "linear_attention", "full_attention"], "n_groups": 2}))
    _sglang_compatible_config(folder)   # the tiny checkpoints' own rewrite: the same mapping
    argv = ["--model-path", str(folder), "--speculative-draft-model-path", str(folder)]
    assert sglang_model_argv(argv, log=pytest.fail) == argv
    assert sglang_model_argv(["--model-path", "org/hub-model"], log=pytest.fail) == ["--model-path", "org/hub-model"]


def _write(tmp_path: Path, cfg: dict) -> Path:
    folder = tmp_path / "user-model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("cfg, says", [
    ({"model_type": "qwen3_next", "num_hidden_layers": 4,
      "layer_types": ["linear_attention", "full_attention", "full_attention", "linear_attention"]},
     "full attention at layers [1, 2]; SGLang 0.5.23's Qwen3NextConfig can only place it at every n-th layer"),
    ({"model_type": "qwen3_next", "num_hidden_layers": 4, "full_attention_interval": 4,
      "layer_types": ["linear_attention", "full_attention"] * 2}, "full_attention_interval 4 (read by SGLang)"),
    ({"model_type": "nemotron_h", "layers_block_type": ["linear_attention", "sliding_attention"]},
     "layer names ['sliding_attention']"),
    ({"model_type": "nemotron_h", "layers_block_type": ["mamba"], "n_groups": 2, "mamba_n_groups": 8},
     "mamba_n_groups (8, read by SGLang) and n_groups (2, read by transformers) disagree"),
])
def test_a_layout_sglang_cannot_express_is_refused_with_what_to_change(tmp_path, cfg, says):
    folder = _write(tmp_path, cfg)
    with pytest.raises(CheckpointNameError, match="--model-path: ") as e:
        sglang_model_argv(["--model-path", str(folder)])
    assert says in str(e.value) and str(folder / "config.json") in str(e.value)


def test_the_launcher_refuses_at_start_naming_the_flag(tmp_path):
    """``launch --engine sglang`` exits 2 with the message before SGLang is imported (no model load)."""
    folder = _write(tmp_path, {"model_type": "qwen3_next", "num_hidden_layers": 3,
                               "layer_types": ["full_attention", "linear_attention", "full_attention"]})
    env = dict(os.environ, SGLANG_REPLAYSSM_OVERLAY_DIR=str(tmp_path / "overlays"))
    r = subprocess.run([sys.executable, "-m", "sglang_replayssm.launch", "--engine", "sglang", "--device", "cpu",
                        "--model-path", str(folder)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    assert "--model-path: " in r.stderr and "full_attention_interval" in r.stderr, r.stderr
    assert not (tmp_path / "overlays").exists()
