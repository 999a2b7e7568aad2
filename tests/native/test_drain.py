"""SIGTERM drains the real native server (issue 17, item 8): with `--drain-timeout 3`, a short stream in
flight finishes normally; new requests get a 503 saying the server is draining and /health a 503
"draining"; the long stream and the long non-streaming request still running at the timeout are
ended cleanly (the stream: an SSE error event with code 503, then `data: [DONE]`; the other: a 503
JSON error); then the server exits 0."""

import concurrent.futures as cf
import signal
import threading
import time

import httpx

from .live_server import LiveServer, stream_text

DRAIN_S = 3.0


def test_sigterm_drains_then_exits_zero():
    t_start = time.monotonic()
    server = LiveServer("--drain-timeout", str(DRAIN_S))
    try:
        long_body = {"prompt": "a long answer", "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
        pool = cf.ThreadPoolExecutor(3)
        started = []
        long_stream = pool.submit(stream_text, server.url, long_body, lambda: started.append(1))
        long_unary = pool.submit(httpx.post, server.url + "/v1/completions", json=long_body, timeout=60)
        deadline = time.monotonic() + 20
        while not started or httpx.get(server.url + "/v1/replayssm/load").json()["running"] < 2:
            assert time.monotonic() < deadline, "the long requests did not start"
            time.sleep(0.05)
        short_started = threading.Event()
        short = pool.submit(stream_text, server.url, {"prompt": "a short one", "max_tokens": 60, "temperature": 0,
                                                      "ignore_eos": True}, short_started.set)
        assert short_started.wait(20), "the short request did not start"
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        health = httpx.get(server.url + "/health", timeout=5)
        assert (health.status_code, health.text) == (503, "draining")
        late = httpx.post(server.url + "/v1/completions", json={"prompt": "too late", "max_tokens": 4}, timeout=5)
        assert late.status_code == 503 and "draining" in late.json()["error"]["message"], late.text

        text, finish, done, errors = short.result(timeout=30)
        assert (finish, done, errors) == ("length", True, []) and len(text) == 60

        text, finish, done, errors = long_stream.result(timeout=30)
        assert errors and errors[0]["code"] == 503 and "shutting down" in errors[0]["message"], errors
        assert done and finish is None and 0 < len(text) < 2000   # an error event, then [DONE]
        r = long_unary.result(timeout=30)
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"], r.text
        ended = time.monotonic() - t0
        assert DRAIN_S - 0.5 < ended < DRAIN_S + 5, f"the long requests ended {ended:.1f} s after SIGTERM"
        t1 = time.monotonic()
        assert server.proc.wait(timeout=20) == 0, server.output()
        print(f"start-to-sigterm {t0 - t_start:.1f} s, drain {ended:.1f} s, exit {time.monotonic() - t1:.1f} s")
        pool.shutdown()
    finally:
        out = server.stop()
    assert "draining: " in out and "drain timeout: ending 2 request(s)" in out, out
