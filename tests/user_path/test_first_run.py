"""The main command as a new user runs it (issue 48): `python -m sglang_replayssm.launch` with no flag but a free
port, from a folder of the user's (not the repository), a real subprocess in its own process group, as a terminal
runs it. It serves the trained tiny model that ships in the package, so the first answer is readable Python-like
text, not noise; its capacity line says plainly which engine needs how much memory; and Ctrl-C (SIGINT to the whole
group, as a terminal sends it) or `kill -TERM -PGID` stops it with one short line and exit status 0 — no traceback
from the engine process, no "engine process died" — after letting a stream in flight finish (the drain)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from sglang_replayssm.native.engine_args import DEFAULT_MODEL

from .readme import ROOT

# words of Python and of its docstrings (lower case)
WORDS = {"def", "class", "return", "import", "from", "self", "if", "else", "elif", "for", "in", "not", "and", "or",
         "none", "true", "false", "is", "with", "as", "try", "except", "raise", "while", "lambda", "pass", "assert",
         "yield", "print", "len", "str", "int", "name", "data", "value", "args", "os", "sys", "path", "file", "the",
         "a", "an", "of", "to", "this", "that", "be", "list", "string", "object", "test", "system", "error", "type"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MainCommand:
    """`python -m sglang_replayssm.launch --port P [args]` in `cwd`, leader of its own process group."""

    def __init__(self, cwd, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(cwd, f"launch-{self.port}.log"), "w+")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # the installed package, as a user has it
        self.proc = subprocess.Popen([sys.executable, "-m", "sglang_replayssm.launch", "--port", str(self.port), *args],
                                     cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        deadline = time.monotonic() + 120
        while not self._healthy():
            assert self.proc.poll() is None, f"the server exited {self.proc.returncode}:\n{self.output()}"
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"not healthy in 120 s:\n{self.output()}")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def signal_group(self, sig) -> tuple[int, float]:
        """Send `sig` to the whole process group (a terminal's Ctrl-C) -> (exit status, seconds to exit)."""
        t0 = time.monotonic()
        os.killpg(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout=60), time.monotonic() - t0
        finally:
            self.kill()

    def kill(self) -> None:
        try:   # whatever is left of the group this test started (by its id)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


@pytest.fixture
def user_dir(tmp_path):
    d = tmp_path / "home"
    d.mkdir()
    assert not (d / "sglang_replayssm").exists()
    return d


def assert_clean_stop(out: str, status: int) -> None:
    assert status == 0, (status, out)
    tail = out.split("draining:", 1)[-1]
    assert "sglang-replayssm: stopped" in tail.splitlines()[-1], out
    for bad in ("Traceback", "KeyboardInterrupt", "error", "died"):
        assert bad not in tail, out


def test_main_command_answers_with_the_trained_model_and_ctrl_c_stops_it(user_dir):
    server = MainCommand(user_dir)
    try:
        models = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in models] == [DEFAULT_MODEL] == ["tiny-gdn-hybrid"]
        r = httpx.post(server.url + "/v1/completions", timeout=60, json={
            "prompt": "import os\nimport sys\n\n\ndef main(", "max_tokens": 64, "temperature": 0})
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["text"]
        # the random-weight model answered e.g. 'y/H{7lf!kvLQ6~d.DE-^C([u4k^C([u4k': no word of Python in it
        assert all(c.isprintable() or c in "\n\t" for c in text), repr(text)
        words = {w.lower() for w in re.findall(r"[A-Za-z_]+", text)}
        assert len(words & WORDS) >= 2, repr(text)
        out = server.output()
        lines = out.splitlines()
        assert lines[0].startswith("sglang-replayssm: engine native")
        assert lines[1].startswith(f"sglang-replayssm: model {DEFAULT_MODEL} (the default without --model-path: "
                                   "a tiny byte-level model trained on Python's standard library"), lines[1]
        # the capacity line says which is which: this engine's bytes, a conventional engine's, and who needs more
        cap = next(ln for ln in lines if ln.startswith("sglang-replayssm capacity: "))
        m = re.search(r"SSM state per sequence: ([\d.]+) KiB here \(ReplaySSM: checkpoint fp32 \+ ring of 16 records, "
                      r"read copy none\), a conventional engine holds ([\d.]+) KiB \(its state, no drafts\): "
                      r"ReplaySSM needs ([\d.]+)x the memory;", cap)
        assert m, cap
        ours, theirs, ratio = map(float, m.groups())
        assert ours > theirs and abs(ours / theirs - ratio) < 0.01, cap
    except BaseException:
        server.kill()
        raise
    status, took = server.signal_group(signal.SIGINT)
    out = server.output()
    assert_clean_stop(out, status)
    assert took < 30, took


def test_sigterm_to_the_process_group_drains_a_stream_then_stops_cleanly(user_dir):
    server = MainCommand(user_dir, "--model-path", "embedded")   # the fast random-weight model: the stop is tested
    tokens = 400
    try:
        with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
                "prompt": "a stream in flight", "max_tokens": tokens, "ignore_eos": True, "stream": True}) as r:
            assert r.status_code == 200
            got, done, sent = 0, False, None
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[len("data: "):])
                assert "error" not in chunk, chunk   # the engine died under the drain: a 503 event
                if chunk["choices"][0]["text"]:
                    got += 1
                if got == 1 and sent is None:   # the stream is running: stop the server as `kill -TERM -PGID`
                    sent = time.monotonic()
                    os.killpg(server.proc.pid, signal.SIGTERM)
        assert done and got == tokens, (done, got)
        status = server.proc.wait(timeout=60)
    finally:
        server.kill()
    out = server.output()
    assert_clean_stop(out, status)
    assert "draining: 1 request(s) in flight" in out, out
