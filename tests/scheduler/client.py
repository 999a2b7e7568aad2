"""A small HTTP client for the scheduler tests: OpenAI requests through the router, SSE parsing."""

import asyncio
import json
import os

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
    """A streamed completion (``body``: the request, ``stream`` forced on) running in the background;
    ``started`` once its first data line arrived; ``task`` resolves to ``parse_sse(lines)``."""

    def __init__(self, client: httpx.AsyncClient, body: dict):
        self.started = asyncio.Event()
        self.replica = self.route = None
        self.lines: list = []
        self.task = asyncio.create_task(self._run(client, {**body, "stream": True}))

    async def _run(self, client, body):
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            self.replica = r.headers["x-replayssm-replica"]
            self.route = r.headers["x-replayssm-route"]
            async for line in r.aiter_lines():
                self.lines.append(line)
                if line.startswith("data: ") and not self.started.is_set():
                    self.started.set()
        return parse_sse(self.lines)

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
