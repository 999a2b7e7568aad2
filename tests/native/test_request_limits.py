"""What one request may cost the real native server (issue 17, items 7 and 9), default flags:

* a non-streaming request whose client disconnects frees its engine slot at once (as streams do);
* a body over --max-request-bytes (8 MiB by default) is a 413 naming the limit, whether it declares
  its size (Content-Length) or not (chunked), and the engine never sees it (its RSS does not move); a
  client still sending gets that answer too, not a reset connection (issue 48);
* a large prompt within the limit is tokenized off the engine loop and off the event loop: a victim
  stream beside it keeps streaming (its longest pause between two chunks stays short).

Raw sockets where the test needs control of the connection (closing it, a chunked body)."""

import asyncio
import concurrent.futures as cf
import json
import socket
import time

import httpx
import pytest

from .live_server import Victim, load, request_head, wait_for

LIMIT = 8 << 20              # the default --max-request-bytes
FREED_S = 1.0                # a disconnected request's slot is free again within this
MAX_GAP_S = 1.5              # the longest pause a victim stream may see while big prompts arrive (before: ~5 s)
RSS_JUMP_MB = 64             # the engine's RSS may not grow more than this from a refused body


@pytest.fixture
def server(shared_server):
    return shared_server


def read_response(sock: socket.socket, timeout: float = 20.0) -> tuple[int, dict]:
    """(status, JSON body) of one HTTP/1.1 response read from a raw socket."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        assert part, f"connection closed before a response: {data!r}"
        data += part
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = int([line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")][0])
    while len(rest) < length:
        part = sock.recv(65536)
        assert part, "connection closed inside the body"
        rest += part
    return status, json.loads(rest[:length])


def engine_rss_mb(server) -> float:
    with open(f"/proc/{server.engine_pid()}/status") as f:
        kb = [line for line in f if line.startswith("VmRSS:")][0].split()[1]
    return int(kb) / 1024


# ------------------------------------------------------------------ item 7
def test_a_disconnected_non_streaming_request_frees_its_slot(server):
    body = json.dumps({"prompt": "nobody waits for me", "max_tokens": 1500, "temperature": 0,
                       "ignore_eos": True}).encode()
    idle = load(server)
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(request_head(server.port, len(body)) + body)
    assert wait_for(lambda: load(server)["running"] == 1, 10), "the request never started"
    time.sleep(0.2)   # decoding
    sock.close()
    t0 = time.monotonic()
    freed = wait_for(lambda: (lambda s: s["running"] == 0 and s["free_slots"] == idle["free_slots"])(load(server)),
                     5 * FREED_S)
    took = time.monotonic() - t0
    assert freed and took < FREED_S, f"the slot was held {took:.1f} s after the client left: {load(server)}"


# ------------------------------------------------------------------ item 9: the size limit
def test_a_body_declared_over_the_limit_is_413_without_being_read(server):
    rss = engine_rss_mb(server)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request_head(server.port, 100 << 20) + b'{"prompt": "')   # claims 100 MB, sends 12 bytes
        status, body = read_response(sock, timeout=10)
    assert status == 413, body
    assert str(LIMIT) in body["error"]["message"] and "--max-request-bytes" in body["error"]["message"]
    assert engine_rss_mb(server) - rss < RSS_JUMP_MB
    assert server.healthy()


def test_a_chunked_body_over_the_limit_is_413_and_never_reaches_the_engine(server):
    rss = engine_rss_mb(server)
    piece = b"a" * (1 << 20)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request_head(server.port, None))
        with cf.ThreadPoolExecutor(1) as pool:
            reply = pool.submit(read_response, sock, 30)
            try:   # a valid JSON body of 24 MiB in 1 MiB chunks: the server stops reading at 8 MiB
                chunks = [b'{"max_tokens": 1, "prompt": "'] + [piece] * 24 + [b'"}']
                for c in chunks:
                    sock.sendall(b"%x\r\n" % len(c) + c + b"\r\n")
                sock.sendall(b"0\r\n\r\n")
            except OSError:   # the server answered and closed: expected once the limit is passed
                pass
            status, body = reply.result()
    assert status == 413, body
    assert "--max-request-bytes" in body["error"]["message"]
    time.sleep(0.5)
    assert engine_rss_mb(server) - rss < RSS_JUMP_MB, (rss, engine_rss_mb(server))
    assert server.healthy()


def test_an_async_client_sending_a_large_body_gets_the_413_not_a_reset(server):
    """Issue 48: httpx's async client (the OpenAI SDK's transport, and the Ray replicas') sending a 64 MiB body got
    a reset connection (ReadError), no answer: the server answered while the body still came and closed the
    connection on unread data. The rest is now read and dropped first (http_front/body_limit.py), never kept."""
    rss = engine_rss_mb(server)
    body = b'{"max_tokens": 1, "prompt": "' + b"x" * (64 << 20) + b'"}'

    async def main():
        async with httpx.AsyncClient(timeout=60) as c:
            return [await c.post(server.url + "/v1/completions", content=body,
                                 headers={"content-type": "application/json"}) for _ in range(2)]

    for r in asyncio.run(main()):
        assert r.status_code == 413, r.text
        assert f"limit of {LIMIT} bytes (--max-request-bytes)" in r.json()["error"]["message"]
    assert engine_rss_mb(server) - rss < RSS_JUMP_MB
    assert server.healthy()


# ------------------------------------------------------------------ item 9: tokenization off the loops
def test_large_prompts_do_not_stall_another_clients_stream(server):
    """Three prompts of ~7.5 MB (within the limit, over the context: 400) while a victim streams."""
    big = json.dumps({"prompt": "x" * (LIMIT - (1 << 19)), "max_tokens": 1})
    gaps, last = [], [None]

    def tick():
        now = time.monotonic()
        if last[0] is not None:
            gaps.append(now - last[0])
        last[0] = now

    victim = Victim(server.url, max_tokens=900, on_chunk=tick)
    with cf.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: httpx.post(server.url + "/v1/completions", content=big,
                                                     headers={"content-type": "application/json"}, timeout=60),
                                range(3)))
    answered = time.monotonic()
    text, finish, done, errors = victim.finish()
    print(f"victim: longest pause {max(gaps):.3f} s over {len(gaps)} chunks")
    assert done and not errors and finish == "length"
    assert max(gaps) < MAX_GAP_S, f"the victim stream stalled {max(gaps):.2f} s"
    for r in answers:
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text[:300]
        assert "context length" in r.json()["error"]["message"]
    assert victim.ended > answered, "the victim ended before the big prompts were answered: the test proves nothing"
