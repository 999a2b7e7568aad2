"""The CPU harness's launcher side: its defaults, a user's flag winning, the environment spawned processes get,
and which flags switch it on (no SGLang server here: tests/sglang_server starts real ones)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sglang_replayssm import accounting
from sglang_replayssm.cpu_harness import CPU_DEFAULTS, SITE_DIR, cpu_server_args, harness_env, wants_cpu


def _flag_values(argv):
    out, i = {}, 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = None
            i += 1
    return out


def test_defaults_fill_what_the_user_did_not_give():
    got = _flag_values(cpu_server_args(["--model-path", "m"]))
    for flag, value in CPU_DEFAULTS.items():
        assert got[flag] == value, flag
    assert got["--model-path"] == "m"


def test_an_explicit_flag_wins_in_both_spellings():
    argv = ["--attention-backend", "triton", "--max-running-requests=3", "--dtype", "bfloat16"]
    out = cpu_server_args(argv)
    assert out.count("--attention-backend") == 1 and out[out.index("--attention-backend") + 1] == "triton"
    assert not any(a == "--max-running-requests" for a in out) and "--max-running-requests=3" in out
    assert out[out.index("--dtype") + 1] == "bfloat16"


def test_speculative_decoding_gets_the_triton_attention_backend():
    out = cpu_server_args(["--speculative-algorithm", "NGRAM"])
    assert out[out.index("--attention-backend") + 1] == "triton"


def test_spawned_processes_get_the_harness_environment():
    env = harness_env({"PYTHONPATH": "/a:/b"})
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["TRITON_INTERPRET"] == "1"
    assert env["PYTHONPATH"].split(":") == [str(SITE_DIR), "/a", "/b"]
    assert (SITE_DIR / "sitecustomize.py").is_file()
    assert harness_env(env)["PYTHONPATH"] == env["PYTHONPATH"]   # idempotent


def test_only_device_cpu_switches_it_on():
    assert wants_cpu(["--device", "cpu"]) and wants_cpu(["--model-path", "x", "--device=cpu"])
    assert not wants_cpu(["--device", "cuda"]) and not wants_cpu(["--model-path", "cpu"]) and not wants_cpu([])


def test_one_definition_of_the_replayssm_metrics_for_both_engines_and_the_dashboard():
    from sglang_replayssm.native import metrics as native

    native_names = {n for n, _k, _d in native.COUNTERS + native.GAUGES if n in accounting.COUNTERS
                    or n in accounting.GAUGES}
    assert native_names == set(accounting.COUNTERS) | set(accounting.GAUGES)
    for n, _k, doc in native.COUNTERS + native.GAUGES:
        if n in accounting.COUNTERS or n in accounting.GAUGES:
            assert doc == {**accounting.COUNTERS, **accounting.GAUGES}[n]
    dash = json.loads((Path(__file__).parents[2] / "deploy/grafana/replayssm-serving.json").read_text())
    exprs = json.dumps(dash)
    assert "replayssm:ring_occupancy" in exprs   # drawn beside pool usage: a fraction in both engines
    assert accounting.ring_occupancy([4, 8], window=16) == 0.375 and accounting.ring_occupancy([], 16) == 0.0
    # every replayssm: metric of the native engine comes from the table, with its help
    ours = {(n, d) for n, _k, d in native.COUNTERS + native.GAUGES if n.startswith("replayssm:")}
    assert ours == {(m.name, m.help) for m in accounting.METRICS if accounting.NATIVE in m.engines}


def test_every_replayssm_dashboard_panel_is_described_by_the_metric_table():
    dash = json.loads((Path(__file__).parents[2] / "deploy/grafana/replayssm-serving.json").read_text())
    exported = {m.exported: m for m in accounting.METRICS}
    described = 0
    for panel in dash["panels"]:
        names = list(dict.fromkeys(n for t in panel.get("targets", []) for n in re.findall(r"replayssm:\w+", t["expr"])))
        if not names:
            continue
        assert set(names) <= set(exported), (panel["title"], set(names) - set(exported))
        assert panel.get("description") == accounting.panel_description(names), (
            f"panel {panel['title']!r}: set its description to {accounting.panel_description(names)!r}")
        if any(exported[n].unit == "bytes" for n in names):
            assert panel["fieldConfig"]["defaults"]["unit"] == "Bps", panel["title"]   # rates of byte counters
        described += 1
    assert described == 5


def test_mla_models_default_to_the_triton_attention_backend(tmp_path):
    """torch_native's SDPA cannot read MLA's latent cache (Kimi Linear, DeepSeek): a model folder whose config has
    kv_lora_rank gets SGLang's Triton backend unless the user names one."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_linear", "kv_lora_rank": 48}))
    out = cpu_server_args(["--model-path", str(tmp_path)])
    assert out[out.index("--attention-backend") + 1] == "triton"
    out = cpu_server_args([f"--model-path={tmp_path}", "--attention-backend", "torch_native"])
    assert out[out.index("--attention-backend") + 1] == "torch_native" and out.count("--attention-backend") == 1
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_next"}))
    out = cpu_server_args(["--model-path", str(tmp_path)])
    assert out[out.index("--attention-backend") + 1] == CPU_DEFAULTS["--attention-backend"]
