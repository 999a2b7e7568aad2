"""The wide checkpoints' tensor names and shapes (gpu_harness.wide_checkpoints) are those transformers writes.

``tensor_specs`` applied to a tiny checkpoint's own config.json must name and shape exactly the tensors
that ``transformers`` wrote into that tiny checkpoint (cpu_harness.tiny_checkpoints), for both families;
a wide checkpoint written on the CPU at small widths loads with the same names, shapes and bf16 dtype.
"""

import json

import pytest

from sglang_replayssm.gpu_harness import wide_checkpoints as wc

pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from sglang_replayssm.cpu_harness.tiny_checkpoints import write_checkpoint

    out = tmp_path_factory.mktemp("tiny")
    for fam in wc.FAMILIES:
        write_checkpoint(fam, out / fam)
    return out


def _shapes(path):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}


@pytest.mark.parametrize("family", wc.FAMILIES)
def test_specs_match_transformers_checkpoint(tiny_dir, family):
    cfg = json.loads((tiny_dir / family / "config.json").read_text())
    if family == "nemotron_h":
        assert cfg["hybrid_override_pattern"] == "M*M-"
    written = {k: s for k, (s, _) in _shapes(tiny_dir / family / "model.safetensors").items()}
    specs = {name: shape for name, shape, _ in wc.tensor_specs(family, cfg)}
    assert specs == written


@pytest.mark.parametrize("family", wc.FAMILIES)
def test_wide_checkpoint_written_on_cpu(tiny_dir, tmp_path, family):
    tiny_cfg = json.loads((tiny_dir / family / "config.json").read_text())
    cfg = wc.wide_config(family, tiny_cfg)
    assert cfg["hidden_size"] == wc.WIDTHS[family]["hidden_size"]
    assert "layers_block_type" not in cfg
    # the same layout at small widths (the real ones are GiBs): shrink every width, keep the layer pattern
    small = dict(cfg, hidden_size=32, vocab_size=600, num_experts=3, moe_intermediate_size=16,
                 shared_expert_intermediate_size=16, intermediate_size=48, mamba_num_heads=4, n_groups=2)
    out = wc.write_wide_checkpoint(family, tiny_dir / family, tmp_path / family, device="cpu", cfg=small)
    shapes = _shapes(out / "model.safetensors")
    assert {k: s for k, (s, _) in shapes.items()} == {n: s for n, s, _ in wc.tensor_specs(family, small)}
    assert {d for _, d in shapes.values()} == {"BF16"}
    assert json.loads((out / "config.json").read_text()) == small
    assert (out / "tokenizer.json").read_bytes() == (tiny_dir / family / "tokenizer.json").read_bytes()
