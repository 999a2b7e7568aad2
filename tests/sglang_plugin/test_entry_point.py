"""The entry point is discovered by SGLang's plugin loader, and a freshly *spawned* process (as SGLang
starts its schedulers) gets the hooks and the options from the entry point and the environment alone,
builds the ReplaySSM pool, decodes, and exports the replayssm: metrics in prometheus multiprocess mode
(the directory SGLang's /metrics endpoint aggregates)."""

from __future__ import annotations

import importlib.metadata
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

from sglang_replayssm.accounting import SGLANG_GAUGES
from sglang_replayssm.flags import ENV_VAR, ReplaySSMOptions
from sglang_replayssm.sglang_plugin import metrics as plugin_metrics

OUR_TARGETS = (
    "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.mamba_pool_cls",
    "sglang.kernels.ops.mamba.triton_ops.ssu_dispatch.selective_state_update",
    "sglang.srt.layers.attention.linear.gdn_backend.GDNKernelDispatcher.packed_decode",
    "sglang.srt.speculative.spec_utils.commit_mamba_states_after_verify",
    "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._handle_max_mamba_cache",
)


def test_entry_point_is_discovered():
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    ours = [ep for ep in eps if ep.name == "replayssm"]
    assert len(ours) == 1 and ours[0].value == "sglang_replayssm.sglang_plugin:register"
    from sglang.srt.plugins import load_plugins_by_group

    found = load_plugins_by_group("sglang.srt.plugins")
    import sglang_replayssm.sglang_plugin as plugin

    assert found["replayssm"][0] is plugin.register


def test_only_flag_hooks_without_replayssm():
    """A fresh Python that loads SGLang's plugins with ReplaySSM not asked for gets our CLI hooks and none of the
    engine hooks. (In a fresh process: a test process that already applied the engine hooks keeps them.)"""
    from sglang_replayssm.sglang_plugin.engine_hooks import engine_table
    from sglang_replayssm.sglang_plugin.hooks import cli_table

    code = ("import json\nfrom sglang.srt.plugins import load_plugins\n"
            "from sglang.srt.plugins.hook_registry import HookRegistry\n"
            "load_plugins()\nprint(json.dumps(sorted(HookRegistry._patched)))")
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert {t for t, _, _ in cli_table()} <= loaded
    assert not {t for t, _, _ in engine_table()} & loaded


def test_sglang_plugins_whitelist_can_exclude_it(monkeypatch):
    from sglang.srt.plugins import load_plugins_by_group

    monkeypatch.setenv("SGLANG_PLUGINS", "some-other-plugin")
    assert "replayssm" not in load_plugins_by_group("sglang.srt.plugins")
    monkeypatch.setenv("SGLANG_PLUGINS", "replayssm")
    assert list(load_plugins_by_group("sglang.srt.plugins")) == ["replayssm"]


def _scheduler_like_child(queue):
    """What run_scheduler_process does first (load_plugins), then what its model runner does with the
    mamba pool; reports back what it saw."""
    try:
        import torch

        from sglang.srt.plugins import load_plugins
        from sglang.srt.plugins.hook_registry import HookRegistry

        load_plugins()
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

        from tests.sglang_plugin.conftest import GDN, make_req_pool

        pool = make_req_pool("gdn", size=3)
        mp_ = pool.mamba_pool
        H, Hk, K, V = GDN["H"], GDN["Hk"], GDN["K"], GDN["V"]
        from sglang.srt.layers.attention.linear.gdn_backend import GDNKernelDispatcher
        from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend as KB

        disp = GDNKernelDispatcher(KB.TRITON, KB.TRITON, KB.TRITON)
        idx = torch.tensor([1, 2], dtype=torch.int32)
        for _ in range(5):
            mp_.note_decode(idx)
            for layer_id in (0, 2):
                cache = pool.mamba2_layer_cache(layer_id)
                disp.decode(torch.randn(1, 2, Hk, K), torch.randn(1, 2, Hk, K), torch.randn(1, 2, H, V),
                            torch.randn(2, H), torch.randn(2, H), A_log=torch.zeros(H), dt_bias=torch.zeros(H),
                            ssm_states=cache.temporal, cache_indices=idx, query_start_loc=None)
        mp_.settle()
        mp_.flush_metrics()
        queue.put({
            "patched": [t for t in OUR_TARGETS if t in HookRegistry._patched],
            "pool_cls": HybridReqToTokenPool.mamba_pool_cls.__name__,
            "window": mp_.replay.cfg.window if mp_.replay is not None else None,
            "cursor": mp_.replay.cursor[[1, 2]].tolist(),
        })
    except BaseException as e:  # report, do not hang the parent
        import traceback

        queue.put({"error": "".join(traceback.format_exception(e))})


def test_hooks_and_options_active_in_spawned_process(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setenv(ENV_VAR, ReplaySSMOptions(window=3).to_env()[ENV_VAR])
    monkeypatch.setenv("SGLANG_REPLAYSSM_METRICS_INTERVAL", "1")
    repo_root = str(Path(__file__).resolve().parents[2])  # the child imports tests.sglang_plugin.conftest
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [repo_root, os.environ.get("PYTHONPATH")])))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_scheduler_like_child, args=(queue,))
    proc.start()
    try:
        report = queue.get(timeout=150)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert "error" not in report, report.get("error")
    assert report["patched"] == list(OUR_TARGETS)
    assert report["pool_cls"] == "ReplayMambaPool"
    assert report["window"] == 3  # the options came through the environment only
    assert report["cursor"] == [5 % 3, 5 % 3]

    # SGLang's /metrics aggregates this directory with prometheus_client's multiprocess collector
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    samples = {s.name: s.value for m in registry.collect() for s in m.samples}
    # 5 steps x 2 rows with window 3: rows flush at their 3rd step -> 2 flushes, 8 non-flush rows
    assert samples["replayssm:flushes_total"] == 2
    assert samples["replayssm:nonflush_steps_total"] == 8
    state_bytes = 4 * 8 * 16 * 4  # H x V x K fp32
    assert samples["replayssm:conventional_state_bytes_total"] == 2 * 10 * 2 * state_bytes  # layers x rows x r+w
    assert 0 < samples["replayssm:state_bytes_written_total"] < samples["replayssm:conventional_state_bytes_total"]
    assert samples["replayssm:state_bytes_read_total"] > 0
    assert "replayssm:ring_occupancy" in samples
    # every family but the reservation gauges, which only a pool built in SGLang's scheduler (its run-time config
    # published) sets: the server tests read them (checks.running_request_bytes)
    for name in set(plugin_metrics.NAMES) - set(SGLANG_GAUGES):
        assert name in samples
