"""The engine process dies under the real native server (SIGKILL, as the OOM killer would): every
request pending on it, and every request sent in the moments after, gets an answer at once (a 503,
or a refused connection once the server is gone), none hangs; and the server exits non-zero with a
logged reason, so that a supervisor (or the Ray replica's health check) restarts it (issue 17)."""

import concurrent.futures as cf
import os
import signal
import time

import httpx
import pytest

from .live_server import LiveServer, stream_text

ANSWER_S = 10.0    # the longest any request may wait for its answer once the engine died


@pytest.fixture
def server():
    s = LiveServer()
    yield s
    s.stop()


def _outcome(url, i):
    """One request sent after the kill -> (what it got, seconds it took)."""
    t0 = time.monotonic()
    body = {"prompt": f"late request {i}", "max_tokens": 8}
    try:
        if i % 2:
            text, finish, done, errors = stream_text(url, body, timeout=3 * ANSWER_S)
            got = f"stream error {errors[0]['code']}" if errors else "stream ok"
        else:
            got = httpx.post(url + "/v1/completions", json=body, timeout=3 * ANSWER_S).status_code
    except AssertionError as e:   # stream_text: a non-200 answer
        got = f"status {str(e)[:40]}"
    except httpx.TimeoutException:
        got = "hung"
    except httpx.TransportError as e:   # refused / reset: the server is gone, which is an answer too
        got = type(e).__name__
    return got, time.monotonic() - t0


def test_requests_pending_on_a_dead_engine_are_answered_promptly(server):
    pending = cf.ThreadPoolExecutor(34)
    streams = [pending.submit(stream_text, server.url, {"prompt": f"in flight {i}", "max_tokens": 1500},
                              timeout=3 * ANSWER_S) for i in range(4)]
    time.sleep(0.5)   # the streams are decoding
    os.kill(server.engine_pid(), signal.SIGKILL)
    late = [pending.submit(_outcome, server.url, i) for i in range(30)]
    for f in streams:
        text, finish, done, errors = f.result(timeout=ANSWER_S)
        assert errors and errors[0]["code"] == 503, errors    # cut with a 503 error event
        assert finish is None and len(text) < 1500
    results = [f.result(timeout=3 * ANSWER_S + 5) for f in late]
    pending.shutdown()
    hung = [r for r in results if r[0] == "hung" or r[1] > ANSWER_S]
    assert not hung, f"{len(hung)} of 30 requests got no answer in time: {results}"
    assert not [r for r in results if r[0] in (200, "stream ok")], results


def test_a_dead_engine_makes_the_server_exit_nonzero_with_a_message(server):
    pid = server.engine_pid()
    os.kill(pid, signal.SIGKILL)
    try:
        code = server.proc.wait(timeout=ANSWER_S)
    except Exception:
        pytest.fail(f"the server still runs {ANSWER_S:.0f} s after its engine died (health: {server.healthy()})")
    assert code != 0
    assert "error: the engine process died (exit code -9)" in server.output()
