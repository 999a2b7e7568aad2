"""Fixtures: tiny HuggingFace-format checkpoints written by `transformers` itself (real config.json and
safetensors names), for the loader and end-to-end tests; one real native server (default flags)
shared by the tests that only send it requests (request limits, soak), and the OpenAI-API server
(live_server.SHARED_FLAGS: few slots, speculative decoding) that test_server.py and
test_openai_params.py share; each started once for the package."""

import pytest
import torch


TINY = dict(vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=96)


def _save(model, path):
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """{"nemotron_h": dir, "qwen3_next": dir, "qwen3_5": dir} of tiny random models + the HF models."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("hf")
    out = {}
    c = transformers.NemotronHConfig(hybrid_override_pattern="M-M*-M", mamba_num_heads=8, mamba_head_dim=8,
                                     ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=16, **TINY)
    m = transformers.NemotronHForCausalLM(c).eval()
    out["nemotron_h"] = (_save(m, root / "nemotron_h"), m)
    gdn = dict(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
               linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=2, **TINY)
    m = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(num_experts=0, **gdn)).eval()
    out["qwen3_next"] = (_save(m, root / "qwen3_next"), m)
    m = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**gdn)).eval()
    out["qwen3_5"] = (_save(m, root / "qwen3_5"), m)
    return out


@pytest.fixture(scope="package")
def shared_server():
    """A real native server with default flags (live_server.LiveServer), started once for tests/native."""
    from .live_server import LiveServer

    s = LiveServer()
    yield s
    s.stop()


@pytest.fixture(scope="package")
def openai_server():
    """The OpenAI-API server of test_server.py and test_openai_params.py (live_server.SHARED_FLAGS)."""
    from .live_server import SHARED_FLAGS, LiveServer

    s = LiveServer(*SHARED_FLAGS)
    yield s
    s.stop()
