"""Loading HF-format checkpoints (written by transformers itself): logits match the HF model,
generation matches HF greedy, and broken folders fail with errors that name the problem."""

import json
import shutil

import pytest
import torch

from sglang_replayssm.flags import ReplaySSMOptions
from sglang_replayssm.native.config import HybridConfig, ModelConfigError
from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams
from sglang_replayssm.native.loader import ModelLoadError, load_model

IDS = [5, 17, 99, 3, 250, 7, 7, 42, 1, 11, 64, 200, 5, 17, 99]


@pytest.mark.parametrize("arch", ["nemotron_h", "qwen3_next", "qwen3_5"])
def test_checkpoint_matches_hf(hf_checkpoints, arch):
    path, hf = hf_checkpoints[arch]
    cfg, _ = load_model(path)
    assert cfg.family == ("mamba2" if arch == "nemotron_h" else "gdn")
    e = Engine(EngineArgs(model_path=str(path), max_running_requests=2, chunk_size=4,
                          replayssm=ReplaySSMOptions(window=3)))
    req = e.add_request(IDS, SamplingParams(max_tokens=1))
    e.running.append(e.waiting.popleft())
    req.slot = e.pool.alloc(1)[0]
    start = 0
    while start < len(IDS):                            # chunked prefill, 4 tokens a chunk
        chunk = IDS[start:start + 4]
        logits = e.model.forward(torch.tensor([chunk]), torch.tensor([start]), torch.tensor([req.slot]),
                                 "prefill", e.forward_ctx, start + len(chunk))
        start += len(chunk)
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0, -1]
    torch.testing.assert_close(logits[0], ref, rtol=1e-4, atol=1e-5)
    # generation through ReplaySSM decode + speculative verify == HF teacher-forced greedy
    spec = Engine(EngineArgs(model_path=str(path), max_running_requests=2, speculative_num_draft_tokens=2,
                             replayssm=ReplaySSMOptions(window=3)))
    out = spec.generate([IDS], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    with torch.no_grad():
        tf = hf(torch.tensor([IDS + out])).logits[0, len(IDS) - 1:-1].argmax(-1).tolist()
    assert out == tf


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_and_wrong_files(hf_checkpoints, tmp_path):
    src = hf_checkpoints["nemotron_h"][0]
    with pytest.raises(ModelLoadError, match="not a directory"):
        load_model(tmp_path / "nope")
    d = _copy(src, tmp_path / "noconfig")
    (d / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json not found"):
        load_model(d)
    d = _copy(src, tmp_path / "badjson")
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_model(d)
    d = _copy(src, tmp_path / "noweights")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_model(d)
    d = _copy(src, tmp_path / "corrupt")
    (d / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelLoadError, match="model.safetensors: cannot read"):
        load_model(d)
    d = _copy(src, tmp_path / "shape")
    cfg = json.loads((d / "config.json").read_text())
    cfg["ssm_state_size"] = 32
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="shape"):
        load_model(d)
    d = _copy(src, tmp_path / "shard")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-00002.safetensors"}}))
    with pytest.raises(ModelLoadError, match="model-00002.safetensors"):
        load_model(d)


def test_missing_tensor_is_named(hf_checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file
    d = _copy(hf_checkpoints["qwen3_next"][0], tmp_path / "missing")
    t = load_file(str(d / "model.safetensors"))
    del t["model.layers.0.linear_attn.A_log"]
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="model.layers.0.linear_attn.A_log"):
        load_model(d)


def test_unsupported_configs():
    with pytest.raises(ModelConfigError, match="unsupported model"):
        HybridConfig.from_hf({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    base = dict(model_type="nemotron_h", vocab_size=300, hidden_size=64, num_attention_heads=4,
                intermediate_size=96, mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=16, n_groups=2)
    with pytest.raises(ModelConfigError, match="MoE"):
        HybridConfig.from_hf({**base, "hybrid_override_pattern": "ME*"})
    with pytest.raises(ModelConfigError, match="unknown symbols"):
        HybridConfig.from_hf({**base, "hybrid_override_pattern": "MX"})
    with pytest.raises(ModelConfigError, match="mamba_num_heads"):
        HybridConfig.from_hf({k: v for k, v in base.items() if k != "mamba_num_heads"} | {"hybrid_override_pattern": "M"})
    cfg = HybridConfig.from_hf({**base, "hybrid_override_pattern": "M-M*-"})
    assert cfg.blocks == ["ssm", "mlp", "ssm", "attention", "mlp"] and cfg.ssm_k_heads == 2


def test_hf_tokenizer_in_model_folder(hf_checkpoints, tmp_path):
    """A folder with tokenizer files is served with its own tokenizer and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<eos>", "hello", "world", "the", "cat", "sat", "on", "mat", "user", "assistant", ":"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}assistant :{% endif %}")
    d = _copy(hf_checkpoints["qwen3_next"][0], tmp_path / "with_tokenizer")
    fast.save_pretrained(str(d))
    e = Engine(EngineArgs(model_path=str(d), max_running_requests=2))
    assert e.tokenizer.name == "hf" and e.tokenizer.eos_ids == {1}
    assert e.tokenizer.encode("the cat sat") == [4, 5, 6]
    req = e.add_request({"messages": [{"role": "user", "content": "hello world"}]}, SamplingParams(max_tokens=5))
    assert req.prompt == [9, 11, 2, 3, 10, 11]
    while e.has_work():
        e.step()
    assert 1 <= len(req.output) <= 5
