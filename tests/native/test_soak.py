"""A bounded soak of the real native server (issue 17, Tests; SOAK_S seconds here, for the CI budget):
a repeated mixed workload from 4 clients at once (streams, non-streaming requests, chat, streams
and non-streaming requests whose clients disconnect midway, bad requests, oversized bodies), then
the memory (RSS) and open file descriptors of the front end and the engine process are flat: what
they were after a warm-up round, within a small margin, once the server is idle again."""

import concurrent.futures as cf
import itertools
import json
import os
import socket
import time

import httpx

from .live_server import load, request_head, wait_for

SOAK_S = 10.0
WARMUP_S = 3.0
RSS_GROWTH_MB = 40      # per process, after the warm-up
FD_GROWTH = 4           # per process, once idle


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int([line for line in f if line.startswith("VmRSS:")][0].split()[1]) / 1024


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _one(url: str, port: int, i: int) -> str:
    """One request of the mix (by i); returns what it was, raises on a wrong answer."""
    kind = i % 7
    prompt = f"soak request {i}: "
    if kind == 0:
        r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 24}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 24, r.text
    elif kind == 1:
        with httpx.stream("POST", url + "/v1/completions", json={"prompt": prompt, "max_tokens": 24, "stream": True},
                          timeout=60) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200 and lines[-1] == "data: [DONE]", lines[-3:]
    elif kind == 2:
        r = httpx.post(url + "/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 16})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
    elif kind == 3:   # a stream abandoned after its first chunk
        with httpx.stream("POST", url + "/v1/completions", json={"prompt": prompt, "max_tokens": 800, "stream": True},
                          timeout=60) as r:
            next(line for line in r.iter_lines() if line.startswith("data: "))
    elif kind == 4:   # a non-streaming request whose client hangs up
        body = json.dumps({"prompt": prompt, "max_tokens": 800}).encode()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(request_head(port, len(body)) + body)
            time.sleep(0.1)
    elif kind == 5:
        r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4, "temperature": "hot"},
                       timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "temperature", r.text
    else:   # a body over the limit (declared): refused unread
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(request_head(port, 64 << 20) + b'{"prompt": "')
            s.settimeout(30)
            assert s.recv(64).startswith(b"HTTP/1.1 413")
    return ("complete", "stream", "chat", "stream-abandoned", "unary-abandoned", "bad", "oversized")[kind]


def test_soak_rss_and_fds_stay_flat(shared_server):
    server = shared_server
    pids = {"front end": server.proc.pid, "engine": server.engine_pid()}
    counter = itertools.count()
    done: dict = {}

    def work(until: float):
        while time.monotonic() < until:
            what = _one(server.url, server.port, next(counter))
            done[what] = done.get(what, 0) + 1

    def idle():
        assert wait_for(lambda: load(server)["running"] == 0 and load(server)["waiting"] == 0, 30, 0.1)
        time.sleep(0.5)

    with cf.ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(work, time.monotonic() + WARMUP_S) for _ in range(4)]:
            f.result()
        idle()
        base = {k: (_rss_mb(p), _fds(p)) for k, p in pids.items()}
        for f in [pool.submit(work, time.monotonic() + SOAK_S) for _ in range(4)]:
            f.result()
    idle()
    end = {k: (_rss_mb(p), _fds(p)) for k, p in pids.items()}
    print(f"soak: {sum(done.values())} requests {done}; RSS MB / fds before -> after: {base} -> {end}")
    assert len(done) == 7 and min(done.values()) >= 3, done
    for k in pids:
        assert end[k][0] - base[k][0] < RSS_GROWTH_MB, f"{k}: RSS {base[k][0]:.0f} -> {end[k][0]:.0f} MB"
        assert end[k][1] - base[k][1] <= FD_GROWTH, f"{k}: {base[k][1]} -> {end[k][1]} open fds"
    assert server.healthy()
