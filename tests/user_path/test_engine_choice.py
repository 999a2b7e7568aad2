"""What a user sees when the launcher picks an engine or lacks an optional dependency (issue 32): the first
line printed names the engine and why; `--replicas` without Ray and `--engine sglang` without SGLang end in
one line naming the extra to install, exit 2, no traceback.

A missing package is simulated in a subprocess by `sys.modules[name] = None` before the launcher runs:
`import name` then raises ImportError and `importlib.util.find_spec(name)` answers None, as on a machine
without it; nothing is uninstalled."""

import subprocess
import sys

import pytest

from sglang_replayssm import launch
from sglang_replayssm.scheduler.serve_app import ray_missing_error
from tests.user_path.test_launcher_flags import error_line


def run_without(blocked: list[str], argv: list[str], module: str = "sglang_replayssm.launch", timeout: float = 60):
    code = ("import sys, runpy\n"
            f"for name in {blocked!r}: sys.modules[name] = None\n"
            f"sys.argv = [{module!r}] + {argv!r}\n"
            f"runpy.run_module({module!r}, run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(r, *needles):
    error_line(r, *needles)
    assert "sglang-replayssm: " not in r.stdout, r.stdout   # no banner: nothing started


def test_replicas_without_ray_names_the_ray_extra():
    r = run_without(["ray"], ["--engine", "native", "--replicas", "2"])
    assert_one_line_error(r, "--replicas", "pip install 'sglang-replayssm[ray]'")


def test_scheduler_entry_without_ray_names_the_ray_extra():
    r = run_without(["ray"], ["--replicas", "2", "--engine", "native"], module="sglang_replayssm.scheduler")
    assert_one_line_error(r, "--replicas", "pip install 'sglang-replayssm[ray]'")


def test_ray_without_serve_extra_message():
    # ray importable but `from ray import serve` failing (ray installed without [serve]): the same line,
    # with the import error's reason
    msg = ray_missing_error(ImportError("No module named 'starlette'\nmore detail"))
    assert msg == ("error: --replicas needs Ray Serve, which is not installed (No module named 'starlette'): "
                   "pip install 'sglang-replayssm[ray]'")
    assert ray_missing_error() is None   # ray is installed here (the test extra)


def test_engine_sglang_without_sglang_names_the_sglang_extra():
    r = run_without(["sglang"], ["--engine", "sglang", "--model-path", "/nonexistent"])
    assert_one_line_error(r, "--engine sglang", "pip install 'sglang-replayssm[sglang]'")


def test_engine_auto_without_sglang_says_native_and_why_first():
    # --port 0 is a flag error raised after the banner's first line and before any engine is built
    r = run_without(["sglang"], ["--port", "0"])
    assert r.returncode == 2 and "--port" in r.stderr and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    first = r.stdout.splitlines()[0]
    assert first.startswith("sglang-replayssm: engine native (--engine auto: sglang is not installed;"), first
    assert "pip install 'sglang-replayssm[sglang]'" in first


def test_engine_auto_reasons_in_process():
    import importlib.util

    import torch

    engine, why = launch.choose_engine("auto")
    if importlib.util.find_spec("sglang") is None:
        assert (engine, why.split(";")[0]) == ("native", "--engine auto: sglang is not installed")
    elif torch.cuda.is_available():
        assert engine == "sglang" and "a CUDA GPU is present" in why
    else:   # CI: sglang installed (the test extra), no GPU
        assert engine == "native" and "sglang is installed but no CUDA GPU is visible" in why
    assert launch.choose_engine("native") == ("native", "--engine native")
    assert launch.choose_engine("sglang") == ("sglang", "--engine sglang")
    assert launch.engine_line("sglang", "--engine sglang", 3) == \
        "sglang-replayssm: 3 Ray Serve replica(s) of engine sglang (--engine sglang)"
