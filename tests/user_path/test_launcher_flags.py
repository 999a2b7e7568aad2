"""The launcher's flags as a user types them (issue 48): mistakes end at once in one line naming the flag, exit 2,
never a traceback nor a silently different flag.

* `--engine sglang` without a GPU and without `--device cpu` says so before SGLang spends its start-up finding out;
  a bad `--replayssm-*` value is one line labelled with the program's name, as with the native engine.
* Flags are spelled out in full: an abbreviation (`--max-running-request 4`) is an unknown flag with a "did you
  mean", for the native engine and for the replicas' engines; SGLang's own parser takes a unique prefix of its
  flags (its docs write `--tp 2`): such a flag reaches SGLang unchanged, with a note naming what SGLang reads.
* `--help` describes every flag and says that SGLang's flags pass through.

Each case runs `python -m sglang_replayssm.launch` in a subprocess; none starts a server."""

import argparse
import importlib.util
import subprocess
import sys
import time

import pytest

from sglang_replayssm import launch
from sglang_replayssm.scheduler import add_scheduler_args

PROG = "python -m sglang_replayssm.launch"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*args: str, timeout: float = 120):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sglang_replayssm.launch", *args], capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    r.seconds = time.monotonic() - t0
    return r


def error_line(r, *needles: str) -> str:
    """The one line on stderr of a run that exited 2; it contains every needle."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs the sglang package")


@needs_sglang
def test_engine_sglang_without_a_gpu_says_device_cpu_at_once(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = run("--engine", "sglang", "--model-path", str(tmp_path))
    line = error_line(r, f"{PROG}: error: --engine sglang: no GPU is visible", "add --device cpu")
    assert r.seconds < 10, (r.seconds, line)   # SGLang's own start-up took 14-17 s to fail, with a traceback
    assert r.stdout == "", r.stdout           # nothing started: no banner


@needs_sglang
@pytest.mark.parametrize("engine", ["sglang", "native"])
@pytest.mark.parametrize("flags, needle", [
    (["--replayssm-window", "0"], "error: --replayssm-window: must be in 1..1024, got 0"),
    (["--replayssm-read-copy", "fp3"], "error: argument --replayssm-read-copy: invalid choice: 'fp3'"),
])
def test_a_bad_replayssm_flag_is_one_line_for_either_engine(engine, flags, needle):
    r = run("--engine", engine, "--device", "cpu", "--port", str(free_port()), *flags)
    line = error_line(r, needle)
    assert line.startswith(f"{PROG}: error: "), line   # not `replayssm: error:`


def test_abbreviated_flags_are_unknown_with_a_suggestion():
    r = run("--engine", "native", "--max-running-request", "4")
    error_line(r, f"{PROG}: error: unrecognized arguments: --max-running-request 4",
               "(did you mean --max-running-requests?)")
    r = run("--engine", "native", "--por", "8000")   # a prefix of the launcher's own --port
    error_line(r, "unrecognized arguments: --por 8000", "did you mean --port?")


def test_abbreviated_flags_for_replica_engines_fail_before_ray_starts():
    pytest.importorskip("ray")
    r = run("--replicas", "2", "--engine", "native", "--device", "cpu", "--max-running-request", "4")
    error_line(r, "error: unrecognized arguments: --max-running-request 4", "did you mean --max-running-requests?")
    r = run("--replicas", "2", "--engine", "native", "--route-spil", "power_of_two")
    error_line(r, "error: unrecognized arguments: --route-spil power_of_two", "did you mean --route-spill?")
    assert r.seconds < 30, r.seconds


@needs_sglang
def test_flags_for_sglang_are_checked_and_never_expanded_silently(tmp_path):
    # SGLang's own parser takes a unique prefix of its flags (`--tp 2`, as its docs write it, is --tp-size): such a
    # flag goes on unchanged with a note; a prefix of one of ours, or a flag nobody knows, is the error
    known = ["--enable-metrics", "--tp-size", "2", "--mem-fraction-static=0.5", "--replayssm-window", "4",
             "--no-replayssm-verify"]   # SGLang's flags and ours, spelled out
    r = run("--engine", "sglang", "--device", "cpu", "--model-path", str(tmp_path), *known,
            "--max-running-request", "4", "--replayssm-win", "8", "--no-such-flag")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == ["sglang-replayssm: note: SGLang reads --max-running-request as --max-running-requests (its "
                     "parser takes a unique prefix of a flag; spell it out to be sure)",
                     f"{PROG}: error: unrecognized arguments: --replayssm-win --no-such-flag (did you mean "
                     "--replayssm-window?)"], r.stderr


def test_no_parser_of_the_launcher_expands_an_abbreviation():
    from sglang_replayssm.scheduler import local_cluster
    from sglang_replayssm.scheduler.serve_app import options_from_args

    parsers = [launch.common_parser(), launch.native_parser(), local_cluster.parser()]
    assert all(not p.allow_abbrev for p in parsers)
    ns = argparse.Namespace(replicas=2, engine="native", engine_argv=["--route-spil", "power_of_two",
                                                                      "--max-running-request", "4"])
    opts = options_from_args(ns)   # an abbreviation stays the engine's (which refuses it), never a scheduler flag
    assert opts.policy.spill == "least_loaded" and opts.autoscale_target is None
    assert opts.engine_argv == ["--route-spil", "power_of_two", "--max-running-request", "4"]


def test_help_describes_every_flag_and_that_sglangs_pass_through():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "every flag not listed below goes to SGLang unchanged (--enable-metrics" in text, text[:2000]
    assert "--route-spill {least_loaded,power_of_two} where a request goes once every replica holds" in text
    assert "--dtype {auto,float32,bfloat16,float16} dtype of the weights and activations" in text
    parser = launch.native_parser()
    add_scheduler_args(parser)
    undescribed = [a.option_strings for a in parser._actions if not (a.help or "").strip()]
    assert undescribed == [], undescribed
