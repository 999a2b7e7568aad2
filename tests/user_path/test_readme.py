"""README.md as a user follows it (issue 32): short, the two set-up commands unchanged (`.ci/run` runs the
second), and every `launch` line of "Serve on a GPU", "Ray cluster" and "Using it" accepted by the parsers that
will read it: the launcher's own, the Ray scheduler's (`options_from_args`) and SGLang 0.5.23's with the plugin's
flags (in a subprocess: loading SGLang's plugins there keeps this test process clean). The CPU lines are the
commands CI runs: the tiny-checkpoint writer runs here, and their flags are ones the CPU SGLang and Ray server
tests pass (`tests/sglang_server`, `tests/scheduler`). No server is started: CI starts those in the tests named."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sglang_replayssm import launch
from sglang_replayssm.native.engine_args import DEFAULT_MODEL
from sglang_replayssm.scheduler.serve_app import options_from_args
from tests.user_path.readme import README, ROOT, argv, commands, pip_extras, sections

SETUP_RUN = "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/python -m sglang_replayssm.launch"
TESTED = [ROOT / "tests" / "sglang_server" / "conftest.py", ROOT / "tests" / "sglang_server" / "test_ray_sglang_replicas.py",
          ROOT / "tests" / "scheduler" / "engine_setup.py", ROOT / "tests" / "scheduler" / "test_policy.py"]


def launch_lines(section: str) -> list[list[str]]:
    return [argv(c)[3:] for c in commands(section) if c.startswith("python -m sglang_replayssm.launch")]


def split(words: list[str]):
    """(the launcher's common flags, the rest) as main() splits them."""
    common, rest = launch.common_parser().parse_known_args(words)
    return common, rest


def test_readme_is_short_and_keeps_the_two_setup_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 155, len(lines)
    setup = commands("Set up")
    assert len(setup) == 2, setup
    assert setup[0] == SETUP_RUN
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith(("#", "set ", "cd "))]
    assert ci == [setup[1]], (ci, setup[1])
    # the first command serves the trained model that ships, and says so (test_first_run.py runs it)
    intro = " ".join(sections()["Set up"].split())
    assert f"Run the server (by default `{DEFAULT_MODEL}`, a tiny byte-level hybrid model trained on Python's standard " \
           "library that ships in the package: it answers in Python-like text;" in intro, intro[:300]


def test_extras_named_in_readme_exist():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gpu = [c for c in commands("Serve on a GPU") if c.startswith("pip install")]
    ray = [c for c in commands("Ray cluster") if c.startswith("pip install")]
    assert [pip_extras(c) for c in gpu] == [{"sglang"}] and [pip_extras(c) for c in ray] == [{"sglang", "ray"}]
    assert {"sglang", "ray"} <= set(extras)
    assert any(d.startswith("sglang==") for d in extras["sglang"]) and any(d.startswith("ray[serve]==") for d in extras["ray"])


def test_ray_cluster_lines_parse_for_the_scheduler():
    words = [w for w in launch_lines("Ray cluster") if "--replicas" in w][0]
    common, rest = split(words)
    assert common.replicas >= 1 and common.ray_address == "auto" and common.engine == "sglang"
    common.engine_argv = rest
    opts = options_from_args(common)   # SchedulerError on a bad scheduler flag
    assert opts.replica_num_gpus == 1.0 and opts.host == "0.0.0.0" and "--model-path" in opts.engine_argv
    starts = [c for c in commands("Ray cluster") if c.startswith("ray start")]
    assert any("--head" in c for c in starts) and any("--address" in c for c in starts)
    port = [c for c in starts if "--head" in c][0].split("--port")[1].split()[0]
    assert any(f":{port}" in c for c in starts if "--address" in c)


def test_cpu_lines_are_the_tested_commands(tmp_path):
    lines = commands("Using it")
    writer = [c for c in lines if "tiny_checkpoints" in c]
    assert len(writer) == 1
    target = argv(writer[0])[-1]
    r = subprocess.run([sys.executable, *argv(writer[0])[1:-1], str(tmp_path / "tiny")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    tested = "\n".join(p.read_text() for p in TESTED)
    launches = launch_lines("Using it")
    assert len(launches) >= 2 and any("--replicas" in w for w in launches)
    for words in launches:
        for w in words:
            if w.startswith("--"):
                assert f'"{w}"' in tested, f"README flag {w} is in no tested command"
        assert "--device" in words and words[words.index("--device") + 1] == "cpu"
        if "--model-path" in words:
            path = words[words.index("--model-path") + 1]
            assert path.startswith(target + "/")
            assert (tmp_path / "tiny" / Path(path).name / "config.json").is_file(), path
    ray_native = [w for w in launches if "--replicas" in w][0]
    common, rest = split(ray_native)
    common.engine_argv = rest
    opts = options_from_args(common)
    assert opts.engine == "native" and opts.replica_num_cpus == 0.0 and opts.engine_argv == ["--device", "cpu"]
    ns = launch.native_parser().parse_args(opts.engine_argv)   # each replica's engine flags
    assert ns.device == "cpu"


def test_cpu_harness_line_is_the_quiet_metrics_server_ci_starts():
    """README's CPU-harness command is tests/sglang_server's `m2-L4` configuration, which CI starts and whose
    /metrics and quiet log test_mamba2_server.py checks (issue 48: it had no --enable-metrics, /metrics was a 404)."""
    pytest.importorskip("sglang")
    from tests.sglang_server.conftest import CONFIGS

    words = [w for w in launch_lines("Using it") if w[w.index("--engine") + 1:][:1] == ["sglang"]]
    assert len(words) == 1, words
    words = words[0]
    assert "--enable-metrics" in words
    family = Path(words[words.index("--model-path") + 1]).name
    rest = [w for i, w in enumerate(words) if w not in ("--engine", "--device", "--model-path")
            and (i == 0 or words[i - 1] not in ("--engine", "--device", "--model-path"))]
    assert CONFIGS["m2-L4"][:3] == (family, True, rest), (CONFIGS["m2-L4"], family, rest)


SGLANG_PARSE = r"""
import argparse, contextlib, io, json, sys
from sglang.cli.main import main as sglang_cli
lines = json.loads(sys.argv[1])

def sglang(*argv):                  # `sglang ARGV...` -> (stdout, the exception it ended with)
    sys.argv, out = ["sglang", *argv], io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            sglang_cli()
    except SystemExit:
        pass
    except Exception as e:
        return out.getvalue(), f"{type(e).__name__}: {e}"
    return out.getvalue(), None

serve_help = sglang("serve", "--help")[0]   # before any plugin is loaded, as `sglang serve --help` runs
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs
load_plugins()                      # our entry point adds the --replayssm-* flags to SGLang's parser
from sglang_replayssm.flags import ReplaySSMOptions, split_argv
out = []
for words in lines:
    p = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(p)
    ns = p.parse_args(words)
    opts = ReplaySSMOptions.parse(split_argv(words)[0])
    out.append([ns.model_path, opts.window, opts.read_copy, bool(getattr(ns, "enable_metrics", False))])
print("PARSED " + json.dumps(out))
# `sglang serve` reads our flags (a bad value is refused by name, before any model is looked at)
serve_error = sglang("serve", "--model-type", "llm", "--model-path", "/nonexistent", "--replayssm-window", "0")[1]
print("SERVE " + json.dumps({"help_lists_model_path": "--model-path" in serve_help,
                             "help_lists_ours": "--replayssm-window" in serve_help, "error": serve_error}))
"""


def test_sglang_lines_parse_with_sglang_and_the_plugin():
    pytest.importorskip("sglang")
    engine_lines = []
    for section in ("Serve on a GPU", "Ray cluster", "Using it"):
        for words in launch_lines(section):
            common, rest = split(words)
            if common.engine != "sglang":
                continue
            if common.replicas is not None:   # the scheduler's flags stay with the router
                common.engine_argv = rest
                rest = options_from_args(common).engine_argv
            engine_lines.append([w for w in rest if w not in ("--device", "cpu")])   # the CPU harness's flag
    assert len(engine_lines) >= 3, engine_lines
    r = subprocess.run([sys.executable, "-c", SGLANG_PARSE, json.dumps(engine_lines)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    parsed = json.loads(r.stdout.split("PARSED ", 1)[1].splitlines()[0])
    gpu = parsed[0]
    assert gpu[0].startswith("/models/") and gpu[1] == 16 and gpu[2] == "auto" and gpu[3] is True, gpu
    # what README says of `sglang serve`: it serves with our flags, and its --help (SGLang loads plugins only to
    # serve) does not list them
    serve = json.loads(r.stdout.split("SERVE ", 1)[1].splitlines()[0])
    assert serve == {"help_lists_model_path": True, "help_lists_ours": False,
                     "error": "FlagError: --replayssm-window: must be in 1..1024, got 0"}, serve
    text = " ".join(README.read_text().split())
    assert "`sglang serve --model-path ... --replayssm-window 16` works too" in text
    assert "`sglang serve --help` omits our flags: SGLang loads plugins only to serve" in text


def test_readme_links_exist():
    import re

    text = README.read_text()
    for path in sorted(set(re.findall(r"`((?:docs|bench|deploy|sglang_replayssm|tests)/[^`*<> ]+?)`", text))):
        path = path.split("#")[0].rstrip("/")
        assert (ROOT / path).exists(), path
    assert "current-results-h200" in text and "## Current results (H200)" in (ROOT / "bench" / "README.md").read_text()
    for name in re.findall(r"`([a-z0-9_.\-]+\.json)`", sections()["Results (H200)"]):
        if "<" not in name:
            assert (ROOT / "bench" / "results" / name).is_file(), name
