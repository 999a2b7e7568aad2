"""Oversized requests through the Ray router (issue 48): a 64 MiB prompt was forwarded to the replicas four times
and answered `502 no replica could serve the request (4 attempts failed)` (each native engine reset the connection
on it). Now the router answers 413 naming its --max-request-bytes before any replica sees the body (no routing
decision, no retry), and a body within the router's limit but over an engine's own (the session's engines take
1 MiB, engine_setup.py) is the engine's 413, passed through once, never retried. Real HTTP clients (httpx's async
client, as the OpenAI SDK's), on the session's cluster (conftest.py)."""

import asyncio
import json

import httpx

from sglang_replayssm.http_front.body_limit import MAX_REQUEST_BYTES

from .client import complete
from .engine_setup import ENGINE_MAX_REQUEST_BYTES


def _total(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


async def _counters(c) -> tuple[float, float]:
    text = (await c.get("/metrics")).text
    return _total(text, "replayssm_router_decisions_total"), _total(text, "replayssm_router_retries_total")


def _body(size: int) -> bytes:
    return b'{"max_tokens": 4, "prompt": "' + b"x" * size + b'"}'


def test_a_body_over_the_routers_limit_is_its_413_before_any_replica(cluster):
    async def main():
        async with httpx.AsyncClient(base_url=cluster["url"], timeout=120) as c:
            before = await _counters(c)
            answers = [await c.post("/v1/completions", content=_body(64 << 20),
                                    headers={"content-type": "application/json"}),
                       await c.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "'
                                    + b"y" * (9 << 20) + b'"}]}', headers={"content-type": "application/json"})]
            after = await _counters(c)
            ok = await complete(c, "still serving", 4, temperature=0.0)
            return answers, before, after, ok

    answers, before, after, ok = asyncio.run(main())
    for r in answers:
        assert r.status_code == 413, r.text[:300]
        message = r.json()["error"]["message"]
        assert message == (f"request body: larger than the router's limit of {MAX_REQUEST_BYTES} bytes "
                           "(--max-request-bytes)"), message
    assert after == before, (before, after)   # no routing decision: no replica saw it; no retry
    assert ok["tokens"] == 4 and ok["retries"] == 0


def test_an_engines_413_is_passed_through_once_never_retried(cluster):
    size = 2 << 20
    assert ENGINE_MAX_REQUEST_BYTES < size < MAX_REQUEST_BYTES

    async def main():
        async with httpx.AsyncClient(base_url=cluster["url"], timeout=120) as c:
            before = await _counters(c)
            plain = await c.post("/v1/completions", content=_body(size), headers={"content-type": "application/json"})
            body = json.loads(_body(size))
            async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                streamed = (r.status_code, (await r.aread()).decode())
            after = await _counters(c)
            return plain, streamed, before, after

    plain, streamed, before, after = asyncio.run(main())
    expected = f"request body: larger than this server's limit of {ENGINE_MAX_REQUEST_BYTES} bytes (--max-request-bytes)"
    assert plain.status_code == 413 and plain.json()["error"]["message"] == expected, plain.text[:300]
    assert streamed[0] == 413 and json.loads(streamed[1])["error"]["message"] == expected, streamed
    assert after[0] - before[0] == 2, (before, after)   # each routed once...
    assert after[1] == before[1], (before, after)       # ...and never re-sent to another replica
