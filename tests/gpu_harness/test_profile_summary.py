"""The profile summary of issue 29 (bench/h200/h200_profile.py), on a made-up Chrome trace with known answers:
GPU busy share and idle gaps over the window, every host sync found and named by its innermost python
frame, kernels classed by name; and on a real (CPU-only) torch-profiler trace, the frames it names."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("h200_profile", ROOT / "bench" / "h200" / "h200_profile.py")
prof = importlib.util.module_from_spec(_spec)
sys.modules["h200_profile"] = prof
_spec.loader.exec_module(prof)


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def _trace():
    return {"traceEvents": [
        # host: one step's python frames, a graph launch, a D2H copy + its sync inside the plugin's commit
        _x("python_function", "sglang/srt/managers/scheduler.py(10): event_loop", 0, 1000),
        _x("python_function", "sglang_replayssm/sglang_plugin/spec.py(120): _commit", 300, 200),
        _x("python_function", "torch/_tensor.py(5): tolist", 310, 50),
        _x("cuda_runtime", "cudaGraphLaunch", 10, 5),
        _x("cuda_runtime", "cudaMemcpyAsync", 320, 30, correlation=7),
        _x("cuda_runtime", "cudaStreamSynchronize", 600, 40),   # outside the commit: named by the loop
        _x("cuda_driver", "cuLaunchKernelEx", 400, 3),
        # GPU (another thread id): 100-300 busy on two overlapping kernels, 300-400 idle, 400-450 the copy,
        # 450-460 idle (under the 20 us gap threshold), 460-600 a kernel
        _x("kernel", "_gdn_decode_kernel", 100, 150, tid=7),
        _x("kernel", "nvjet_tst_128x64_gemm", 200, 100, tid=8),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 400, 50, tid=7, correlation=7),
        _x("kernel", "fused_moe_kernel", 460, 140, tid=7),
    ]}


def test_window_busy_share_and_gaps():
    s = prof.summarize(_trace(), steps=2)
    assert s["window_ms"] == pytest.approx(0.5)           # 100 .. 600 us
    assert s["step_ms"] == pytest.approx(0.25)
    assert s["gpu_busy"] == pytest.approx((200 + 50 + 140) / 500)
    assert s["gaps"]["count"] == 1 and s["gaps"]["largest_us"] == [100.0]
    assert s["launches"] == {"cudaGraphLaunch": 1, "cuLaunchKernelEx": 1}
    # the eager launch (not the graph's) named by its innermost enclosing frame: the plugin's commit
    assert s["launches_where"] == {"sglang_replayssm/sglang_plugin/spec.py(120): _commit < "
                                   "sglang/srt/managers/scheduler.py(10): event_loop": 1}


def test_every_sync_is_found_and_named_by_its_innermost_frame():
    s = prof.summarize(_trace(), steps=2)
    assert s["syncs"]["count"] == 2
    where = s["syncs"]["where"]
    # the copy inside tolist() inside the plugin's commit: torch's own frame is skipped, the plugin's named
    assert where["cudaMemcpyAsync @ sglang_replayssm/sglang_plugin/spec.py(120): _commit < "
                 "sglang/srt/managers/scheduler.py(10): event_loop"] == 1
    assert where["cudaStreamSynchronize @ sglang/srt/managers/scheduler.py(10): event_loop"] == 1
    assert s["syncs"]["host_ms"] == pytest.approx(0.07)


def test_kernels_are_classed_by_name():
    s = prof.summarize(_trace(), steps=2)
    share = s["kernels"]["share_of_busy"]
    assert set(share) == {"ssm", "gemm", "copy", "moe"}
    assert share["ssm"] == pytest.approx(150 / 390, abs=1e-4)
    assert [k["name"] for k in s["kernels"]["top"]][0] == "_gdn_decode_kernel"
    assert prof.kernel_class("flash_fwd_splitkv_kernel") == prof.kernel_class("_fwd_kernel") == "attention"
    assert prof.kernel_class("_gdn_verify_mma_kernel") == "ssm"
    assert prof.kernel_class("some_elementwise_kernel") == "other"


def test_a_trace_without_gpu_activity_says_so(tmp_path):
    """A real torch-profiler trace (CPU only here): loaded from its gzip file, it has no GPU window."""
    import gzip

    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as p:
        (torch.ones(8) * 2).sum().item()
    raw = tmp_path / "t.json"
    p.export_chrome_trace(str(raw))
    gz = tmp_path / "t.trace.json.gz"
    gz.write_bytes(gzip.compress(raw.read_bytes()))
    trace = prof._load(gz)
    assert any(e.get("cat") == "python_function" for e in trace["traceEvents"])
    assert prof.summarize(trace) == {"error": "no GPU activity in the trace"}
    assert json.loads(json.dumps(prof.summarize(_trace())))["steps"] == 1   # no steps given: graph launches


def test_step_breakdown_and_the_ceiling_of_a_free_ssm():
    """bench/h200/step_breakdown.py on summaries with known answers: ms per step by part (SGLang's Triton attention
    found among the top kernels even where the summary's classes missed it), and the ceiling of ours against a
    peer, peer step / (peer step - peer SSM), for every ours server against the peers of its family and mode."""
    from tests.bench_scripts import load_bench

    sb = load_bench("h200/step_breakdown.py")

    def summary(step_ms, busy_ms, ssm_share, top):
        return {"steps": 2, "step_ms": step_ms, "conc": 128,
                "kernels": {"busy_ms": busy_ms, "share_of_busy": {"ssm": ssm_share, "other": 1 - ssm_share},
                            "top": top}}

    peer = summary(10.0, 16.0, 0.25, [{"name": "_fwd_kernel", "ms": 6.0, "calls": 24}])
    ours = summary(9.0, 14.0, 0.2, [{"name": "_fwd_kernel", "ms": 6.0, "calls": 24}])
    b = sb.breakdown(peer)
    assert b["busy_ms"] == pytest.approx(8.0) and b["idle_ms"] == pytest.approx(2.0)
    assert b["ssm_ms"] == pytest.approx(2.0) and b["attention_ms"] == pytest.approx(3.0)
    assert b["other_busy_ms"] == pytest.approx(3.0)
    assert sb.ceiling(b) == pytest.approx(10.0 / 8.0)
    out = sb.report({"gdn_stock_ngram": peer, "gdn_ours_fp32_ngram": ours, "gdn_ours_fp32_ngram_stack": ours,
                     "gdn_stock": peer, "m2_stock": peer})
    assert list(out["vs"]) == ["gdn_ours_fp32_ngram vs gdn_stock_ngram"]
    assert out["vs"]["gdn_ours_fp32_ngram vs gdn_stock_ngram"]["measured_step_ratio"] == pytest.approx(10.0 / 9.0)
    assert sb.default_pairs(["gdn_ours_fp32_ngram_c1", "gdn_stock_ngram_c1", "gdn_stock_ngram"]) == [
        ("gdn_ours_fp32_ngram_c1", "gdn_stock_ngram_c1")]
