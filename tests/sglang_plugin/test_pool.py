"""ReplayMambaPool inside SGLang's own HybridReqToTokenPool: construction for Nemotron-H-like (Mamba-2),
Qwen3-Next-like (GDN) and Kimi-like (KDA) tiny configs, and SGLang's slot semantics (alloc / free /
clear_slots / copy_from) on the checkpoint + record-ring state."""

from __future__ import annotations

from array import array

import pytest
import torch

from sglang_replayssm.flags import FlagError
from sglang_replayssm.reference import gdn as ref_gdn
from sglang_replayssm.sglang_plugin.pool import ReplayMambaPool

from .conftest import GDN, make_req_pool, replayssm


@pytest.mark.parametrize("family,shape", [("mamba2", (4, 8, 16)), ("gdn", (4, 8, 16)), ("kda", (2, 16, 16))])
def test_pool_replaces_sglang_state_and_skips_snapshots(family, shape):
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    assert HybridReqToTokenPool.mamba_pool_cls is ReplayMambaPool
    with replayssm(window=8, read_copy="fp8"):
        req_pool = make_req_pool(family, size=5, drafts=4, layers=(0, 2, 4))
    pool = req_pool.mamba_pool
    assert type(pool) is ReplayMambaPool and pool.replay is not None
    assert pool.family == family
    ckpt = pool.replay.ckpt
    assert ckpt.shape == (3, 6, *shape) and ckpt.dtype == torch.float32
    assert pool.mamba_cache.temporal is ckpt  # SGLang's prefill kernels write the checkpoint directly
    assert req_pool.mamba2_layer_cache(4).temporal.data_ptr() == ckpt[2].data_ptr()
    assert pool.replay.rc.dtype == torch.float8_e4m3fn
    assert pool.replay.rec_d.shape[2] == 8 + 4  # ring = window + drafts
    # no per-draft SSM snapshots (SGLang's intermediate_ssm), but SGLang's conv windows are kept
    assert pool.mamba_cache.intermediate_ssm.numel() == 0
    assert pool.mamba_cache.intermediate_conv_window[0].shape[:3] == (3, 6, 4)
    assert pool.get_kv_size_bytes() == pool.replay.bytes_per_slot() * 6 + sum(
        t.numel() * t.element_size() for t in [*pool.mamba_cache.conv, *pool.mamba_cache.intermediate_conv_window])


def test_start_log_compares_capacity_with_sglang_scheme(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="sglang_replayssm.sglang_plugin.pool"), replayssm(read_copy="fp8"):
        make_req_pool("gdn", size=8, drafts=8)
    msg = next(r.getMessage() for r in caplog.records if "ReplaySSM mamba pool" in r.getMessage())
    assert "per-draft snapshots" in msg and "ReplaySSM fits" in msg
    fits = int(msg.rsplit("ReplaySSM fits ", 1)[1])
    # with 8 drafts, SGLang's per-draft snapshots cost more than our ring + read copy (this toy geometry's state rows
    # are 16 wide and its value rows 8: a GDN record, d, v, k, g and beta, is a fifth of a state here, 3 % at 128 x 128)
    assert fits > 8


def test_slot_bytes_gauge_is_the_pools_price_of_a_slot():
    """replayssm:slot_bytes: checkpoint, read copy, record ring (a GDN record's raw v and beta too) and conv window of
    one slot, as the pool allocated them (its tensors over size + 1 slots)."""
    from sglang_replayssm.sglang_plugin import metrics

    with replayssm(read_copy="fp8"):
        pool = make_req_pool("gdn", size=5, drafts=4).mamba_pool
    conv = sum(c[:, 0].numel() * c.element_size() for c in pool.mamba_cache.conv)
    total = sum(t.numel() * t.element_size() for t in pool.replay._per_slot_tensors())
    assert metrics.metrics()["replayssm:slot_bytes"]._value.get() == pool.replay.bytes_per_slot() + conv
    assert pool.replay.bytes_per_slot() == total // 6 + 4 + 8 and pool.replay.rec_v is not None


def test_fp16_sr_checkpoint_is_sglang_temporal():
    with replayssm(ckpt_precision="fp16-sr", read_copy="nvfp4"):
        pool = make_req_pool("gdn", size=2).mamba_pool
    assert pool.mamba_cache.temporal is pool.replay.ckpt and pool.replay.ckpt.dtype == torch.float16
    assert pool.replay.rc.dtype == torch.uint8 and pool.replay.rc.shape[-1] == GDN["K"] // 2


def test_pool_is_sglang_own_when_replayssm_is_off():
    req_pool = make_req_pool("mamba2", size=3, drafts=2)
    pool = req_pool.mamba_pool
    assert pool.replay is None
    assert pool.mamba_cache.intermediate_ssm.shape == (2, 4, 2, 4, 8, 16)  # SGLang's per-draft snapshots
    assert pool.mamba_cache.temporal.shape == (2, 4, 4, 8, 16)


def test_bad_pool_combinations_name_the_flag():
    with replayssm(read_copy="nvfp4"), pytest.raises(FlagError, match="--replayssm-read-copy"):
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
        from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=16, n_groups=1, num_heads=2, head_dim=8,
                                        state_size=24, conv_kernel=4)
        cp = Mamba2CacheParams(shape=shape, layers=[0], dtype=Mamba2StateDType(conv=torch.float32,
                                                                                temporal=torch.float32))
        HybridReqToTokenPool(size=2, mamba_size=2, mamba_spec_state_size=2, max_context_len=8, device="cpu",
                             enable_memory_saver=False, cache_params=cp, mamba_layer_ids=[0],
                             enable_mamba_extra_buffer=False)
    with replayssm(verify=False), pytest.raises(FlagError, match="--no-replayssm-verify"):
        make_req_pool("gdn", drafts=3)
    with replayssm(), pytest.raises(FlagError, match="--enable-linear-replayssm"):
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
        from .conftest import cache_params

        HybridReqToTokenPool(size=2, mamba_size=2, mamba_spec_state_size=2, max_context_len=8, device="cpu",
                             enable_memory_saver=False, cache_params=cache_params("gdn"), mamba_layer_ids=[0, 2],
                             enable_mamba_extra_buffer=False, enable_linear_replayssm=True)


def _req(rid):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid=rid, origin_input_text="", origin_input_ids=array("q"),
               sampling_params=SamplingParams(temperature=0, max_new_tokens=1))


def test_alloc_free_as_sglang_expects():
    with replayssm():
        req_pool = make_req_pool("gdn", size=3, drafts=2)
    mamba = req_pool.mamba_allocator
    assert req_pool.available_size() == 3 and mamba.available_size() == 3
    reqs = [_req(i) for i in range(3)]
    rows = req_pool.alloc(reqs)
    assert len(rows) == 3 and req_pool.available_size() == 0 and mamba.available_size() == 0
    slots = sorted(int(r.kv.mamba_pool_idx) for r in reqs)
    assert slots == [1, 2, 3]  # slot 0 is the padding slot in both pools
    assert all(req_pool.mamba_pool.replay.allocator.is_allocated(s) for s in slots)
    assert req_pool.alloc([_req(9)]) is None  # full: the request waits
    req_pool.free_mamba_cache(reqs[1])
    req_pool.free(reqs[1])
    assert req_pool.available_size() == 1 and mamba.available_size() == 1
    again = _req(10)
    req_pool.alloc([again])
    assert int(again.kv.mamba_pool_idx) == slots[1]


def _decode(pool, slots, steps, gen):
    """A few GDN decode steps on ``slots`` (all layers), via the plugin's reference ops."""
    H, Hk, K, V = GDN["H"], GDN["Hk"], GDN["K"], GDN["V"]
    A_log, dt_bias = torch.zeros(H), torch.zeros(H)
    idx = torch.tensor(slots, dtype=torch.int32)
    for _ in range(steps):
        pool.note_decode(idx)
        for layer in range(pool.num_mamba_layers):
            q, k = torch.randn(len(slots), Hk, K, generator=gen), torch.randn(len(slots), Hk, K, generator=gen)
            v, a, b = (torch.randn(len(slots), H, V, generator=gen), torch.randn(len(slots), H, generator=gen),
                       torch.randn(len(slots), H, generator=gen))
            ref_gdn.decode(pool.replay, layer, idx, q, k, v, a, b, A_log, dt_bias)
    pool.settle()


def test_clear_slots_and_copy_from_keep_sglang_semantics():
    with replayssm(window=4, read_copy="fp8"):
        req_pool = make_req_pool("gdn", size=4)
    pool = req_pool.mamba_pool
    gen = torch.Generator().manual_seed(0)
    _decode(pool, [1, 2], 6, gen)  # 6 steps, window 4: one flush and 2 pending records each
    assert pool.replay.cursor[[1, 2]].tolist() == [2, 2]
    pool.mamba_cache.conv[0][:, 1] = 7.0
    before = [pool.materialize(layer, [1])[0] for layer in range(2)]

    # copy-on-write of a cached prefix: the source folds its records, the copy is exact
    req_pool.copy_mamba_state(torch.tensor([1]), torch.tensor([3]))
    assert pool.replay.cursor[[1, 3]].tolist() == [0, 0]
    for layer in range(2):
        torch.testing.assert_close(pool.materialize(layer, [3])[0], before[layer], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool.materialize(layer, [1])[0], before[layer], rtol=1e-5, atol=1e-5)
        assert torch.equal(pool.replay.rc[layer, 3], pool.replay.rc[layer, 1])
    assert torch.equal(pool.mamba_cache.conv[0][:, 3], pool.mamba_cache.conv[0][:, 1])
    # the copy and the source then decode identically
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    _decode(pool, [1], 3, g1)
    _decode(pool, [3], 3, g2)
    for layer in range(2):
        torch.testing.assert_close(pool.materialize(layer, [3]), pool.materialize(layer, [1]))

    # clear_slots: empty state, empty ring, zero conv; other slots untouched
    other = pool.materialize(0, [2])
    pool.clear_slots(torch.tensor([1, 3]))
    assert pool.replay.cursor[[1, 3]].tolist() == [0, 0]
    assert pool.materialize(0, [1, 3]).abs().sum() == 0
    assert pool.mamba_cache.conv[0][:, [1, 3]].abs().sum() == 0
    torch.testing.assert_close(pool.materialize(0, [2]), other)
