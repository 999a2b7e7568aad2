"""The Ray commands as a user runs them by hand (issue 48), real subprocesses, each the leader of its own process
group as a terminal runs it, everything on 127.0.0.1 and free ports:

* `python -m sglang_replayssm.launch --replicas 1 ...` starting its own local Ray cluster, then Ctrl-C (SIGINT to
  the whole group, Ray's own processes included): it stops with one `sglang-replayssm: stopped` line and exit 0,
  without the lines Ray and Serve printed on every run (`Task ServeController.graceful_shutdown failed ...`,
  `Connecting to existing Serve app ... will not be applied`), and leaves no process behind;
* `python -m sglang_replayssm.scheduler.local_cluster --temp-dir DIR` where Ray's default temp folder does not
  exist (here `$RAY_TMPDIR/ray`, in place of /tmp/ray, which other processes use): it used to end in
  `FileNotFoundError: .../ray/ray_current_cluster`; the address file now goes into DIR.

Every process a command starts carries a marker in its environment, by which the test finds (and, if one
outlived the stop, ends) exactly those."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import httpx
import pytest

from sglang_replayssm.scheduler.engine_process import free_port

from .client import pids_with_env

MARKER = "SGLANG_REPLAYSSM_USER_COMMANDS"
NOISE = ("graceful_shutdown failed", "Connecting to existing Serve app", "will not be applied", "Traceback",
         "KeyboardInterrupt", "SIGTERM received")


@pytest.fixture
def run_dir():
    """A short private folder (Ray's unix sockets live under its temp folder) and this test's marker."""
    d = tempfile.mkdtemp(prefix="ruc", dir="/tmp")
    session = uuid.uuid4().hex
    yield d, session
    left = _alive(session)
    for pid in left:   # only what this test's commands started
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(d, ignore_errors=True)
    assert not left, f"processes left after the stop: {left}"


def _alive(session: str, wait_s: float = 20.0) -> dict:
    deadline = time.monotonic() + wait_s
    while True:
        left = pids_with_env(f"{MARKER}={session}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _start(cmd, d, session, name, extra_env=None):
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=d, **{MARKER: session})
    env.update(extra_env or {})
    out = open(os.path.join(d, f"{name}.out"), "w+")
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    return proc, out


def _text(out) -> str:
    out.flush()
    out.seek(0)
    return out.read()


def _wait_for(proc, out, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while needle not in _text(out):
        assert proc.poll() is None, f"exited {proc.returncode}:\n{_text(out)[-3000:]}"
        assert time.monotonic() < deadline, f"no {needle!r} in {timeout:.0f} s:\n{_text(out)[-3000:]}"
        time.sleep(0.2)


def _ctrl_c(proc, out) -> tuple[int, str]:
    os.killpg(proc.pid, signal.SIGINT)
    try:
        code = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise AssertionError(f"still running 90 s after Ctrl-C:\n{_text(out)[-3000:]}")
    return code, _text(out)


def test_ctrl_c_stops_the_launcher_and_its_own_ray_cluster_quietly(run_dir):
    d, session = run_dir
    port = free_port()
    os.makedirs(os.path.join(d, "ray"))
    proc, out = _start([sys.executable, "-m", "sglang_replayssm.launch", "--replicas", "1", "--engine", "native",
                        "--model-path", "embedded", "--replica-num-cpus", "0", "--device", "cpu", "--port", str(port)],
                       d, session, "launch")
    _wait_for(proc, out, "behind the router at", 300)
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text
    code, text = _ctrl_c(proc, out)
    assert code == 0, text
    assert text.rstrip().splitlines()[-1] == "sglang-replayssm: stopped", text
    for noise in NOISE:
        assert noise not in text, text


def test_local_cluster_with_a_temp_dir_where_rays_default_folder_is_missing(run_dir):
    d, session = run_dir
    port = free_port()
    temp = os.path.join(d, "t")
    absent = os.path.join(d, "absent")   # RAY_TMPDIR: Ray's default temp folder would be absent/ray
    proc, out = _start([sys.executable, "-m", "sglang_replayssm.scheduler.local_cluster", "--port", str(port),
                        "--workers", "1", "--worker-cpus", "0", "--temp-dir", temp], d, session, "cluster",
                       {"RAY_TMPDIR": absent})
    _wait_for(proc, out, "Prometheus file_sd:", 180)
    text = _text(out)
    assert "node worker-1: raylet pid" in text, text
    with open(os.path.join(temp, "ray_current_cluster")) as f:
        assert f.read().strip() == f"127.0.0.1:{port}"
    assert not os.path.exists(absent)   # nothing written outside the folder the user chose
    code, text = _ctrl_c(proc, out)
    assert code == 0 and text.rstrip().splitlines()[-1] == "sglang-replayssm local cluster: stopped", text
    assert "Traceback" not in text, text
