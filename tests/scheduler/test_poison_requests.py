"""Poison requests through the Ray router (issue 17): a request that is bad is that request's
error, never a replica failure. It is a 4xx naming the field, passed through (or given by the router
itself), never re-sent to another replica, and no answer carries a traceback, an install path, a PID
or an actor id. Innocent requests running beside it finish with exactly their solo output, on the
same replicas, with no retry. Uses the session's cluster (conftest.py), after test_cluster.py."""

import asyncio
import json
import re

import httpx

from .client import complete

LEAK = re.compile(r"Traceback|File \"|site-packages|/work/|\.py\b|pid=|actor_id|ActorID|Actor ID|"
                  r"ReplaySSMEngine#|SERVE_REPLICA")

# (raw JSON body, path, the field the 400 must name)
POISONS = [
    ('{"prompt": "abc", "max_tokens": 4, "temperature": 1.0, "seed": 18446744073709551616}', "completions", "seed"),
    ('{"prompt": "abc", "max_tokens": 4, "temperature": NaN}', "completions", "temperature"),
    ('{"prompt": "abc", "max_tokens": 4, "top_p": Infinity}', "completions", "top_p"),
    ('{"prompt": "abc\\ud800", "max_tokens": 4}', "completions", "prompt"),
    ('{"prompt": "abc\\ud800", "max_tokens": 4, "stream": true}', "completions", "prompt"),
    ('{"prompt": "abc", "max_tokens": "ten"}', "completions", "max_tokens"),
    ('{"prompt": "abc", "max_tokens": 2.5}', "completions", "max_tokens"),
    ('{"prompt": "abc", "max_tokens": 4, "user": "\\udfff"}', "completions", "user"),
    ('{"messages": [{"role": "user", "content": "hi \\udc00"}], "max_tokens": 4}', "chat", "messages"),
    ('{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}], "max_tokens": 4}', "chat", "messages"),
    ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": -9223372036854775809,'
     ' "stream": true}', "chat", "seed"),
]


def _counter(text, name):
    """{labels: value} of one router counter."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            key, _, val = line.rpartition(" ")
            out[key[len(name):]] = float(val)
    return out


async def _retries(c):
    return sum(_counter((await c.get("/metrics")).text, "replayssm_router_retries_total").values())


async def _post(c, raw, kind):
    path = "/v1/completions" if kind == "completions" else "/v1/chat/completions"
    r = await c.post(path, content=raw, headers={"content-type": "application/json"})
    return r.status_code, r.text


def _assert_named_400(status, text, field):
    assert status == 400, (field, status, text)
    assert not LEAK.search(text), text
    err = json.loads(text)["error"]
    msg = err["message"] if isinstance(err, dict) else str(err)
    assert field in msg, (field, text)


def test_bad_requests_are_a_named_400_never_retried_and_leak_nothing(cluster):
    async def main():
        async with httpx.AsyncClient(base_url=cluster["url"], timeout=120) as c:
            before = await _retries(c)
            results = [await _post(c, raw, kind) for raw, kind, _ in POISONS]
            after = await _retries(c)
            ok = await complete(c, "still serving", 4, temperature=0.0)
            return results, after - before, ok

    results, retried, ok = asyncio.run(main())
    for (raw, kind, field), (status, text) in zip(POISONS, results):
        _assert_named_400(status, text, field)
    assert retried == 0, f"{retried} poison request(s) were re-sent to another replica"
    assert ok["tokens"] == 4 and ok["retries"] == 0


def test_poison_seed_among_innocent_requests_harms_no_one(cluster):
    """The issue's reproduction: seed 2**64 among 20 requests (both engines used to die and 15 of the
    19 innocent requests failed). Now the poison is a 400, the 19 others finish as they would alone."""
    prompts = [f"innocent {i}: a request beside the poison" for i in range(19)]

    async def batch(c, with_poison):
        jobs = [complete(c, p, 24, stream=bool(i % 2), temperature=0.0) for i, p in enumerate(prompts)]
        if with_poison:
            raw = '{"prompt": "poison", "max_tokens": 24, "temperature": 1.0, "seed": 18446744073709551616}'
            jobs.insert(7, _post(c, raw, "completions"))
        return await asyncio.gather(*jobs)

    async def main():
        async with httpx.AsyncClient(base_url=cluster["url"], timeout=120) as c:
            solo = await batch(c, with_poison=False)
            before = await _retries(c)
            mixed = await batch(c, with_poison=True)
            after = await _retries(c)
            health = (await c.get("/health")).status_code
            return solo, mixed, after - before, health

    solo, mixed, retried, health = asyncio.run(main())
    status, text = mixed.pop(7)
    _assert_named_400(status, text, "seed")
    assert retried == 0
    replicas = {r["replica"] for r in solo}
    for s, m in zip(solo, mixed):
        assert m["text"] == s["text"] and m["tokens"] == 24 and m["retries"] == 0
        assert m["replica"] in replicas        # no engine died: no replica was replaced
    assert health == 200
