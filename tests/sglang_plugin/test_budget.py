"""The budget hook changes what SGLang's KVCacheConfigurator computes for the mamba pool size."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_replayssm.sglang_plugin import options
from sglang_replayssm.sglang_plugin.budget import extra_bytes_per_slot

from .conftest import cache_params, replayssm, sglang_context

GIB = 1 << 30


def _configurator(cp, spec):
    """The fields of KVCacheConfigurator that _handle_max_mamba_cache reads."""
    return SimpleNamespace(mambaish_config=SimpleNamespace(mamba2_cache_params=cp), pp_size=1,
                           fused_entry_bytes=lambda kind: None, spec_algorithm=spec, hybrid_gdn_config=None,
                           hybrid_kda_config=None, attn_dp_size=1, extra_mamba_cache_bytes_per_req=0,
                           _calculate_mamba_ratio=lambda: 3, device="cpu")


def _solve(cp, spec, rest_gib, **ctx):
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.runtime_context import get_schedule

    with sglang_context(mamba_full_memory_ratio=1.0, max_running_requests=64, **ctx):
        left = KVCacheConfigurator._handle_max_mamba_cache(_configurator(cp, spec), rest_gib)
        return get_schedule().max_mamba_cache_size, left


@pytest.mark.parametrize("drafts", [None, 4])
def test_budget_hook_prices_replayssm_slots(drafts):
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    assert hasattr(KVCacheConfigurator._handle_max_mamba_cache, "__wrapped__")
    cp = cache_params("gdn", layers=tuple(range(0, 8, 2)))
    spec = SpeculativeAlgorithm.NONE if drafts is None else SpeculativeAlgorithm.EAGLE
    ctx = {} if drafts is None else dict(speculative_algorithm="EAGLE", speculative_num_draft_tokens=drafts,
                                         speculative_eagle_topk=1, speculative_num_steps=drafts - 1)
    rest = 0.01  # GiB left for states after weights
    budget = rest * GIB / 2  # mamba_full_memory_ratio = 1: half of it for mamba states
    theirs, _ = _solve(cp, spec, rest, **ctx)
    per_req = cp.mamba_cache_per_req
    if drafts is None:
        assert theirs == int((budget - per_req) // per_req)  # SGLang's own formula, plugin inactive
    with replayssm(window=16, read_copy="fp8"):
        ours, left = _solve(cp, spec, rest, **ctx)
        extra = extra_bytes_per_slot(cp, options.active_options(), drafts or 0, "cpu")
    per_slot = per_req + extra
    assert extra > 0
    # no per-draft snapshot reservation with our verify: the plain per-slot solve
    assert ours == int((budget - per_slot) // per_slot)
    assert ours != theirs
    assert left == pytest.approx(rest - (ours + 1) * per_slot / GIB)


@pytest.mark.parametrize("family, capability, read_copy", [("mamba2", (9, 0), "fp8"), ("gdn", (9, 0), "fp8"),
                                                           ("gdn", (8, 0), "none"), ("mamba2", None, "none")])
def test_auto_read_copy_is_priced_as_the_pool_will_keep_it(monkeypatch, family, capability, read_copy):
    """The budget resolves `--replayssm-read-copy auto` on the configurator's device as the pool does: fp8 on an
    fp8 GPU (capability as torch would report it), the fp32 checkpoint alone elsewhere."""
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)
    device = "cpu" if capability is None else "cuda"
    cp = cache_params(family)
    with replayssm(window=16) as auto:
        assert auto.read_copy == "auto"
        got = extra_bytes_per_slot(cp, auto, 0, device)
    with replayssm(window=16, read_copy=read_copy) as explicit:
        assert got == extra_bytes_per_slot(cp, explicit, 0, device)
    if read_copy == "fp8":
        with replayssm(window=16, read_copy="none") as fp32:
            assert got > extra_bytes_per_slot(cp, fp32, 0, device)   # the read copy's bytes are in the price
