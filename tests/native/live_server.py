"""A real native server for the hostile-request tests: `python -m sglang_replayssm.launch` (default
flags unless given, but the built-in random-weight model, `--model-path embedded`: the fastest to step, and
what these tests' token counts and timings were chosen for) as a subprocess on 127.0.0.1 and a free port,
and a greedy victim stream that runs beside the requests under test and must end with exactly its solo
output."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx

# the shared OpenAI-API server of test_server.py and test_openai_params.py (conftest.py `openai_server`)
SHARED_SLOTS, SHARED_K, SHARED_WINDOW = 2, 2, 4
SHARED_FLAGS = ("--max-running-requests", str(SHARED_SLOTS), "--speculative-num-draft-tokens", str(SHARED_K),
                "--replayssm-window", str(SHARED_WINDOW), "--prefix-cache-entries", "1", "--stats-log-interval", "0.5")
MODEL = "replayssm-embedded-mamba2"   # the built-in model's served name
VICTIM_PROMPT = "the victim stream: it must not notice the others "
VICTIM_TOKENS = 600     # ~1 s alone on one CPU core: long enough to overlap every poison request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        model = () if "--model-path" in args else ("--model-path", "embedded")
        cmd = [sys.executable, "-m", "sglang_replayssm.launch", "--engine", "native", "--host", "127.0.0.1",
               "--port", str(self.port), *model, *args]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.log = tempfile.TemporaryFile(mode="w+")   # a file, not a pipe: a chatty server never blocks
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True, env=env)
        deadline = time.monotonic() + 120
        while not self.healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.output()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("server did not become healthy in 120 s")
            time.sleep(0.1)

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def engine_pid(self) -> int:
        """The engine process: the front end's multiprocessing child running spawn_main."""
        with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
            kids = [int(p) for p in f.read().split()]
        for pid in kids:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    return pid
        raise AssertionError(f"no engine process among the server's children {kids}")

    def output(self) -> str:
        """Everything the server printed so far."""
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> str:
        """End the server (by its PID) and return what it printed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        out = self.output()
        self.log.close()
        return out


def completion(url: str, body, path="/v1/completions", timeout=60):
    """POST a body (a dict, or raw bytes/str sent as they are) -> (status, parsed JSON or text)."""
    if isinstance(body, dict):
        body = json.dumps(body)
    r = httpx.post(url + path, content=body, headers={"content-type": "application/json"}, timeout=timeout)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def stream_text(url: str, body: dict, on_first=None, timeout=60, on_chunk=None):
    """Stream one completion -> (text, finish_reason, [DONE] seen, error events); `on_chunk()` is
    called on every data line."""
    text, finish, done, errors = "", None, False, []
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if on_chunk is not None:
                on_chunk()
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                errors.append(chunk["error"])
                continue
            text += chunk["choices"][0]["text"]
            finish = chunk["choices"][0]["finish_reason"] or finish
            if on_first is not None and text:
                on_first()
                on_first = None
    return text, finish, done, errors


def victim_body(max_tokens=VICTIM_TOKENS) -> dict:
    return {"prompt": VICTIM_PROMPT, "max_tokens": max_tokens, "temperature": 0}


class Victim:
    """A greedy streaming completion in a thread; `started` once its first text arrived."""

    def __init__(self, url: str, max_tokens: int = VICTIM_TOKENS, on_chunk=None):
        self.started = threading.Event()
        self.result = None
        self.error = None
        self.ended = None    # time.monotonic() when the stream ended
        self.on_chunk = on_chunk
        self._thread = threading.Thread(target=self._run, args=(url, max_tokens), daemon=True)
        self._thread.start()
        assert self.started.wait(30), f"the victim stream did not start: {self.error}"

    def _run(self, url, max_tokens):
        try:
            self.result = stream_text(url, victim_body(max_tokens), on_first=self.started.set, on_chunk=self.on_chunk)
        except Exception as e:   # reported by finish()
            self.error = e
            self.started.set()
        finally:
            self.ended = time.monotonic()

    def finish(self, timeout=60):
        """(text, finish_reason, done, errors) of the whole stream."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the victim stream hung"
        assert self.error is None, f"the victim stream failed: {self.error!r}"
        return self.result


def load(server) -> dict:
    """The server's GET /v1/replayssm/load."""
    return httpx.get(server.url + "/v1/replayssm/load", timeout=5).json()


def wait_for(pred, timeout: float, step: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    return pred()


def request_head(port: int, length: int | None, path="/v1/completions") -> bytes:
    """The head of a raw HTTP/1.1 JSON POST: with Content-Length, or chunked (length None)."""
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"{size}\r\n").encode()
