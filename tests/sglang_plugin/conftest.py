"""Shared fixtures: the real installed SGLang with our plugin loaded through its own plugin loader."""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace

import prometheus_client  # noqa: F401  (pick the in-process value class before any test sets PROMETHEUS_MULTIPROC_DIR)
import pytest
import torch

pytest.importorskip("sglang", reason="the SGLang plugin tests need the sglang package (pip install -e .[test])")

from sglang_replayssm.flags import ENV_VAR, ReplaySSMOptions  # noqa: E402
from sglang_replayssm.sglang_plugin import options as plugin_options  # noqa: E402


def load_plugin() -> None:
    """What every SGLang process does at start: discover entry points, run them, apply the hooks (with ReplaySSM
    not yet asked for); then the engine hooks, as the flag parser adds them once ReplaySSM is asked for."""
    saved = os.environ.pop(ENV_VAR, None)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang_replayssm.sglang_plugin.engine_hooks import ensure_engine_hooks

    ensure_engine_hooks()
    if saved is not None:
        os.environ[ENV_VAR] = saved


@pytest.fixture(scope="session", autouse=True)
def sglang_plugins_loaded():
    saved = os.environ.pop(ENV_VAR, None)
    load_plugin()
    yield
    if saved is not None:
        os.environ[ENV_VAR] = saved


@pytest.fixture(autouse=True)
def clean_options():
    """Every test starts with ReplaySSM off in this process and leaves it off."""
    saved = os.environ.pop(ENV_VAR, None)
    plugin_options._reset_cache_for_tests()
    yield
    plugin_options.set_active(None)
    plugin_options._reset_cache_for_tests()
    if saved is not None:
        os.environ[ENV_VAR] = saved


@contextlib.contextmanager
def replayssm(**kw):
    opts = ReplaySSMOptions(**kw)
    plugin_options.set_active(opts)
    try:
        yield opts
    finally:
        plugin_options.set_active(None)


# ----------------------------------------------------------------------------- tiny model geometries
# Nemotron-H-like Mamba-2: 4 heads x headdim 8 x d_state 16, 2 groups.
M2 = dict(H=4, P=8, N=16, G=2)
# Qwen3-Next-like GDN: 2 k-heads, 4 v-heads, head_k_dim 16, head_v_dim 8.
GDN = dict(Hk=2, H=4, K=16, V=8)
# Kimi-Linear-like KDA: 2 heads of 16 x 16.
KDA = dict(H=2, D=16)


def cache_params(family: str, layers=(0, 2), conv_dtype=torch.float32, ssm_dtype=torch.float32):
    """SGLang's linear-state cache params of a tiny model, from SGLang's own config classes where they
    build on CPU (NemotronHConfig, Qwen3NextConfig); KDA from KimiLinearStateShape directly."""
    import dataclasses

    from sglang.srt.configs import NemotronHConfig, Qwen3NextConfig
    from sglang.srt.configs.mamba_utils import KimiLinearCacheParams, KimiLinearStateShape, Mamba2StateDType
    from sglang.srt.runtime_context import get_context

    dtype = Mamba2StateDType(conv=conv_dtype, temporal=ssm_dtype)
    n = max(layers) + 2
    common = dict(hidden_size=32, num_hidden_layers=n, num_attention_heads=2, num_key_value_heads=1,
                  vocab_size=64, intermediate_size=64)
    if family == "mamba2":
        pattern = "".join("M" if i in layers else "*" for i in range(n))
        cfg = NemotronHConfig(hybrid_override_pattern=pattern, mamba_num_heads=M2["H"], mamba_head_dim=M2["P"],
                              ssm_state_size=M2["N"], n_groups=M2["G"], conv_kernel=4, expand=1, **common)
    elif family == "gdn":
        assert all(i % 2 == 0 for i in layers), "Qwen3-Next-like: every second layer is full attention"
        cfg = Qwen3NextConfig(full_attention_interval=2, linear_num_key_heads=GDN["Hk"],
                              linear_num_value_heads=GDN["H"], linear_key_head_dim=GDN["K"],
                              linear_value_head_dim=GDN["V"], linear_conv_kernel_dim=4, head_dim=16, **common)
    else:
        shape = KimiLinearStateShape.create(tp_world_size=1, num_heads=KDA["H"], head_dim=KDA["D"],
                                            conv_kernel_size=4)
        return KimiLinearCacheParams(shape=shape, layers=list(layers), dtype=dtype)
    with get_context().override_server_args(attention_backend="triton"):
        cp = cfg.mamba2_cache_params
    cp = dataclasses.replace(cp, dtype=dtype, layers=[i for i in cp.layers if i in layers])
    assert cp.layers == list(layers), cp.layers
    return cp


def make_req_pool(family: str, *, size=4, drafts=None, layers=(0, 2), **kw):
    """SGLang's own HybridReqToTokenPool (its mamba pool class is what the plugin installed)."""
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    return HybridReqToTokenPool(size=size, mamba_size=size, mamba_spec_state_size=size, max_context_len=64,
                                device="cpu", enable_memory_saver=False, cache_params=cache_params(family, layers, **kw),
                                mamba_layer_ids=list(layers), enable_mamba_extra_buffer=False,
                                speculative_num_draft_tokens=drafts, enable_overlap_schedule=False)


@contextlib.contextmanager
def sglang_context(**overrides):
    """Publish a minimal server-args context, as SGLang's own attention unit-test kits do."""
    from sglang.srt.runtime_context import get_context

    args = dict(attention_backend="triton", speculative_eagle_topk=0, speculative_num_draft_tokens=None,
                enable_mis=False, linear_attn_backend="triton", mamba_backend="triton", _mamba_cache_chunk_size=64)
    args.update(overrides)
    with get_context().override_server_args(**args) as server_args:
        yield server_args


def fake_runner(server_args, req_pool):
    """The attributes of ModelRunner that SGLang's linear-attention backends read in __init__."""
    from sglang.srt.layers.attention.linear.utils import LinearAttnBackends, LinearAttnKernelBackend

    t = LinearAttnKernelBackend.TRITON
    return SimpleNamespace(server_args=server_args, device="cpu", is_draft_worker=False, req_to_token_pool=req_pool,
                           token_to_kv_pool=None, linear_attn_backends=LinearAttnBackends(decode=t, prefill=t, verify=t),
                           model_config=SimpleNamespace(hf_text_config=SimpleNamespace(mamba_chunk_size=64)))


@pytest.fixture
def no_host_reads():
    """The test's plugin steps (decode, verify, commit, track, prefill flush, slot operations, metrics) read no
    device value back to the host (``host_reads.py``): the sync-free step of a GPU server, kept true here."""
    from .host_reads import host_reads

    with host_reads() as guard:
        yield guard
    assert not guard.sites, "host reads on the step path:\n" + "\n".join(guard.sites)
