"""`python -m sglang_replayssm.launch` flag handling and the shared ReplaySSM flags."""

import argparse
import json
import subprocess
import sys

import pytest

from sglang_replayssm import launch
from sglang_replayssm.flags import FlagError, ReplaySSMOptions, add_replayssm_args, split_argv
from sglang_replayssm.native.engine_args import default_model_path

from .live_server import free_port


def parse(argv):
    parser = launch.native_parser()
    return launch.engine_args_from(parser.parse_args(argv), parser)


def test_defaults_and_flags():
    a = parse([])
    assert a.device == "cpu" and a.max_running_requests == 8 and a.served_name == "tiny-gdn-hybrid"
    assert a.model_path == default_model_path() and a.embedded_family is None   # the trained model that ships
    assert a.replayssm == ReplaySSMOptions()
    a = parse(["--replayssm-window", "8", "--replayssm-ckpt-precision", "fp16-sr", "--replayssm-read-copy", "fp8",
               "--no-replayssm-verify", "--speculative-num-draft-tokens", "4", "--max-running-requests", "3",
               "--model-path", "embedded:gdn"])
    assert a.replayssm == ReplaySSMOptions(window=8, ckpt_precision="fp16-sr", read_copy="fp8", verify=False)
    assert a.speculative_num_draft_tokens == 4 and a.max_running_requests == 3 and a.served_name.endswith("gdn")
    assert a.speculative_disable_by_batch_size == 0
    a = parse(["--speculative-num-draft-tokens", "4", "--speculative-disable-by-batch-size", "16"])
    assert a.speculative_disable_by_batch_size == 16
    assert parse(["--no-replayssm-decode"]).replayssm.replay_config(family="mamba2", device="cpu").mode == "conventional"
    assert a.prefix_cache_interval == 64 and parse(["--prefix-cache-interval", "16"]).prefix_cache_interval == 16


@pytest.mark.parametrize("family, device, capability, want", [
    ("mamba2", "cpu", None, "none"),
    ("gdn", "cpu", None, "none"),
    ("mamba2", "cuda", (9, 0), "fp8"),     # H100 / H200: the fp8 read copy for every family
    ("mamba2", "cuda:1", (8, 9), "fp8"),
    ("gdn", "cuda", (9, 0), "fp8"),
    ("kda", "cuda", (10, 0), "fp8"),
    ("mamba2", "cuda", (8, 0), "none"),    # A100: no fp8 in Triton
])
def test_read_copy_auto_is_fp8_on_an_fp8_gpu_only(monkeypatch, family, device, capability, want):
    """`--replayssm-read-copy auto`, the default, per family and device (flags.GPU_READ_COPY); an explicit value
    wins, and without ReplaySSM decode auto is none. The GPU's compute capability is what torch would report."""
    import torch

    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: asked.append(d) or capability)
    assert parse([]).replayssm.read_copy == "auto"
    assert parse([]).replayssm.replay_config(family=family, device=device).read_copy == want
    assert bool(asked) == (device != "cpu") and all(torch.device(d) == torch.device(device) for d in asked)
    for explicit in ("none", "fp8", "nvfp4"):
        opts = parse(["--replayssm-read-copy", explicit]).replayssm
        assert opts.replay_config(family=family, device=device).read_copy == explicit
    conventional = parse(["--no-replayssm-decode"]).replayssm.replay_config(family=family, device=device)
    assert conventional.read_copy == "none" and conventional.mode == "conventional"


@pytest.mark.parametrize("argv, flag", [
    (["--replayssm-window", "0"], "--replayssm-window"),
    (["--replayssm-window", "x"], "--replayssm-window"),
    (["--replayssm-read-copy", "int4"], "--replayssm-read-copy"),
    (["--replayssm-ckpt-precision", "bf16"], "--replayssm-ckpt-precision"),
    (["--no-replayssm-decode", "--replayssm-read-copy", "fp8"], "--replayssm-read-copy"),
    (["--port", "0"], "--port"),
    (["--port", "http"], "--port"),
    (["--max-running-requests", "0"], "--max-running-requests"),
    (["--speculative-num-draft-tokens", "-1"], "--speculative-num-draft-tokens"),
    (["--speculative-disable-by-batch-size", "-1"], "--speculative-disable-by-batch-size"),
    (["--speculative-disable-by-batch-size", "8"], "--speculative-disable-by-batch-size"),   # without drafts
    (["--prefix-cache-interval", "0"], "--prefix-cache-interval"),
    (["--device", "tpu"], "--device"),
    (["--device", "cuda"], "--device"),
    (["--model-path", "/nonexistent/model"], "--model-path"),
    (["--model-path", "embedded:rwkv"], "--model-path"),
    (["--engine", "vllm"], "--engine"),
    (["--no-such-flag"], "--no-such-flag"),
])
def test_bad_flags_name_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        launch.main(argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


def test_engine_auto_is_native_without_gpu():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: auto may pick sglang")
    assert launch.resolve_engine("auto") == "native"
    assert launch.resolve_engine("sglang") == "sglang"


def test_shared_flags_module():
    p = argparse.ArgumentParser()
    add_replayssm_args(p)
    o = ReplaySSMOptions.from_args(p.parse_args(["--replayssm-window=4", "--replayssm-read-copy", "nvfp4"]))
    assert ReplaySSMOptions.parse(o.to_argv()) == o == ReplaySSMOptions.from_env(o.to_env())
    ours, rest = split_argv(["--model-path", "m", "--replayssm-window", "4", "--no-replayssm-verify", "--tp", "2"])
    assert ours == ["--replayssm-window", "4", "--no-replayssm-verify"] and rest == ["--model-path", "m", "--tp", "2"]
    with pytest.raises(FlagError, match="--replayssm-read-copy"):
        o.check_model(head_k_dim=24)
    with pytest.raises(FlagError, match="--replayssm-window"):
        ReplaySSMOptions(window=4096)


def test_unservable_model_is_refused_before_start(tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"model_type": "nemotron_h", "hybrid_override_pattern": "M*"}')
    with pytest.raises(SystemExit) as e:
        launch.main(["--engine", "native", "--model-path", str(tmp_path)])
    assert e.value.code == 2
    assert "--model-path" in (err := capsys.readouterr().err) and "missing required key 'num_attention_heads'" in err


def test_broken_weights_fail_with_a_clear_message(tmp_path):
    cfg = dict(model_type="nemotron_h", hybrid_override_pattern="M*", vocab_size=300, hidden_size=64,
               num_attention_heads=4, intermediate_size=96, mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=16,
               n_groups=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    r = subprocess.run([sys.executable, "-m", "sglang_replayssm.launch", "--engine", "native", "--model-path",
                        str(tmp_path), "--tokenizer", "byte", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode != 0
    assert "model.safetensors: cannot read safetensors file" in r.stderr


def test_help_lists_engine_replayssm_and_scheduler_flags(capsys):
    from sglang_replayssm import launch

    assert launch.main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--model-path", "--replayssm-window", "--speculative-num-draft-tokens", "--replicas",
                 "--route-target-batch", "--replica-num-gpus"):
        assert flag in out, flag
