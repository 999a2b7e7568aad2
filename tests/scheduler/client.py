"""A small HTTP client for the scheduler tests: OpenAI requests through the router, SSE parsing."""

import asyncio
import json
import os
import threading
import time

import httpx


def parse_sse(lines):
    """-> (chunks, meta, done): data objects in order, the router's `: replayssm` comment, [DONE] seen."""
    chunks, meta, done = [], None, False
    for line in lines:
        if not line:
            continue
        if line.startswith(": replayssm "):
            meta = json.loads(line[len(": replayssm "):])
        elif line.startswith("data: "):
            data = line[len("data: "):]
            if data == "[DONE]":
                assert not done, "two [DONE] markers"
                done = True
            else:
                assert not done, "data after [DONE]"
                chunks.append(json.loads(data))
    return chunks, meta, done


def chunk_text(chunk):
    out = ""
    for c in chunk.get("choices") or ():
        out += c.get("text") or (c.get("delta") or {}).get("content") or ""
    return out


async def complete(client: httpx.AsyncClient, prompt: str, max_tokens: int, stream: bool = False, **extra):
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": stream, **extra}
    if not stream:
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        j = r.json()
        return {"text": j["choices"][0]["text"], "replica": j["replayssm"]["replica"],
                "route": j["replayssm"]["route"], "retries": j["replayssm"]["retries"],
                "finish": j["choices"][0]["finish_reason"], "tokens": j["usage"]["completion_tokens"]}
    lines = []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            lines.append(line)
    chunks, meta, done = parse_sse(lines)
    text = "".join(chunk_text(c) for c in chunks)
    ids = {c["id"] for c in chunks}
    return {"text": text, "chunks": chunks, "done": done, "meta": meta, "ids": ids,
            "replica": meta["replicas"][-1] if meta else None, "route": meta["route"] if meta else None,
            "retries": meta["retries"] if meta else None,
            "tokens": sum(1 for c in chunks if chunk_text(c))}


class Stream:
    """A streamed completion (``body``: the request, ``stream`` forced on; ``path``: /v1/completions or
    /v1/chat/completions) running in the background;
    ``started`` once its first data line arrived (the router sends its headers, ``replica`` and
    ``route``, with the first token); ``task`` resolves to ``parse_sse(lines)``.
    ``await s.until_started()`` waits for that (or a timeout) and raises if the request ended first."""

    def __init__(self, client: httpx.AsyncClient, body: dict, path: str = "/v1/completions"):
        self.started = asyncio.Event()
        self.replica = self.route = None
        self.lines: list = []
        self.task = asyncio.create_task(self._run(client, {**body, "stream": True}, path))

    async def _run(self, client, body, path):
        async with client.stream("POST", path, json=body) as r:
            assert r.status_code == 200, await r.aread()
            self.replica = r.headers["x-replayssm-replica"]
            self.route = r.headers["x-replayssm-route"]
            async for line in r.aiter_lines():
                self.lines.append(line)
                if line.startswith("data: ") and not self.started.is_set():
                    self.started.set()
        return parse_sse(self.lines)

    async def until_started(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` (None: no limit) for the first token: True once it arrived, False at the
        timeout; raises if the request ended first."""
        waiter = asyncio.create_task(self.started.wait())
        try:
            await asyncio.wait({waiter, self.task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if self.started.is_set():
            return True
        if self.task.done():
            self.task.result()   # the request's own error, if it failed
            raise AssertionError(f"the request ended before its first token: {self.lines[-3:]}")
        return False

    async def cancel(self):
        self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, Exception):
            pass


def pids_with_env(entry: str) -> dict:
    """Live processes (not zombies, not this one) whose environment holds ``entry`` ("NAME=value"):
    pid -> command line. How the tests find every process of a cluster they started, and only those."""
    needle = entry.encode()
    pids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{d}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # zombie: already dead
            with open(f"/proc/{d}/cmdline", "rb") as f:
                pids[int(d)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return pids


def metric_values(text: str, name: str) -> dict:
    """{label part: value} of every sample of metric ``name`` in a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, val = line.rpartition(" ")
            out[key[len(name):]] = float(val)
    return out


class HealthProbe:
    """While a router starts: GET /health every 0.1 s; at its first 200, one completion (1 token).
    ``result`` (once ``done``): {"health_200_after_s", "completion_status", "completion_s"}: whether
    a router saying healthy can really serve at once."""

    def __init__(self, url: str, timeout: float = 600.0):
        self.url, self.result, self.done = url, {}, threading.Event()
        self._stop = time.monotonic() + timeout
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        t0 = time.monotonic()
        try:
            with httpx.Client(base_url=self.url, timeout=30) as c:
                while time.monotonic() < self._stop:
                    try:
                        ok = c.get("/health", timeout=5).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    if ok:
                        t1 = time.monotonic()
                        r = c.post("/v1/completions", json={"prompt": "probe", "max_tokens": 1}, timeout=60)
                        self.result = {"health_200_after_s": t1 - t0, "completion_status": r.status_code,
                                       "completion_s": time.monotonic() - t1}
                        return
                    time.sleep(0.1)
        except Exception as e:   # reported through result
            self.result = {"error": repr(e)}
        finally:
            self.done.set()
