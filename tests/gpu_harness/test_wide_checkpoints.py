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


@pytest.mark.parametrize("family", wc.FAMILIES)
def test_full_depth_config_has_every_layer_of_the_real_model(tiny_dir, family):
    """--depth full: Qwen3-Next-80B's 48 layers (36 GDN, every 4th attention), Nemotron-H-8B's 52 (24 Mamba-2,
    4 attention, 24 MLP); the tensor specs cover each layer."""
    cfg = wc.wide_config(family, json.loads((tiny_dir / family / "config.json").read_text()), depth="full")
    kinds = cfg["layer_types"] if family == "qwen3_next" else list(cfg["hybrid_override_pattern"])
    assert len(kinds) == cfg["num_hidden_layers"] == {"qwen3_next": 48, "nemotron_h": 52}[family]
    ssm = kinds.count("linear_attention") + kinds.count("M")
    assert ssm == {"qwen3_next": 36, "nemotron_h": 24}[family]
    prefix = "model.layers." if family == "qwen3_next" else "backbone.layers."
    layers = {name[len(prefix):].split(".")[0] for name, _, _ in wc.tensor_specs(family, cfg) if name.startswith(prefix)}
    assert layers == {str(i) for i in range(len(kinds))}
    with pytest.raises(ValueError, match="depth"):
        wc.wide_config(family, {}, depth="deep")


def test_echo_successor_cycles_inside_blocks():
    succ = wc.echo_successor(20, 8)
    assert succ.tolist() == [1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12, 13, 14, 15, 8, 16, 17, 18, 19]


@pytest.mark.parametrize("family", wc.FAMILIES)
def test_echo_checkpoint_greedy_output_cycles(tiny_dir, tmp_path, family):
    """--echo-cycle: transformers' own greedy decoding of the checkpoint (small widths, the wide layer pattern)
    continues every prompt with the successor chain of its last token, while the runner-up logits still vary
    with the context (they come from the layers)."""
    import torch
    import transformers

    cfg = wc.wide_config(family, json.loads((tiny_dir / family / "config.json").read_text()))
    small = dict(cfg, hidden_size=128, vocab_size=600, num_experts=3, num_experts_per_tok=2,
                 moe_intermediate_size=16, shared_expert_intermediate_size=16, intermediate_size=48,
                 mamba_num_heads=4, n_groups=2, mamba_n_groups=2)
    out = wc.write_wide_checkpoint(family, tiny_dir / family, tmp_path / family, device="cpu", cfg=small,
                                   echo_cycle=8)
    assert json.loads((out / "config.json").read_text())["replayssm_echo_cycle"] == 8
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    succ = wc.echo_successor(600, 8)
    for prompt in ([5, 77, 130], [400, 9, 9, 9, 21, 333]):
        with torch.no_grad():
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                 pad_token_id=0)[0, len(prompt):].tolist()
        want, t = [], prompt[-1]
        for _ in range(12):
            t = int(succ[t])
            want.append(t)
        assert ids == want, (family, prompt, ids)
    with torch.no_grad():
        a = model(torch.tensor([[5, 77, 130]])).logits[0, -1].log_softmax(-1)
        b = model(torch.tensor([[400, 9, 130]])).logits[0, -1].log_softmax(-1)
    assert int(a.argmax()) == int(b.argmax()) == 131
    assert a[131] > a.topk(2).values[1] + 5                               # the successor leads clearly
    assert (a.topk(5).values[1:] - b.topk(5).values[1:]).abs().max() > 1e-3   # the rest depends on context
