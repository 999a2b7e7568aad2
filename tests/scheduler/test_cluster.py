"""Real local Ray cluster, 2 native-engine replicas behind the ReplaySSM router (fixture: conftest.py).

Tests run in file order on one Serve application: routing first, then the load test, then the
replica kill, then Prometheus + the Grafana dashboard over the traffic of all of them.
"""

import asyncio
import json
import os
import re
import signal
import subprocess
import time
import uuid

import httpx

from .client import Stream, chunk_text, complete, metric_values
from .conftest import POLICY, session_pids

LONG = 400          # tokens of a request that must still be running while the test looks
EXTRA = {"ignore_eos": True, "temperature": 0.0}


async def _wait_idle(client, timeout=30.0):
    """Until no replica has requests running or in flight (the router's view of the stats)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = (await client.get("/metrics")).text
        busy = {(n, k): v for n in ("replayssm_router_replica_running", "replayssm_router_replica_waiting",
                                    "replayssm_router_replica_inflight")
                for k, v in metric_values(text, n).items() if v > 0}
        if not busy:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"replicas did not become idle: {busy}")


async def _per_replica(client, name) -> dict[str, float]:
    """{replica: value} of a metric the router exports with a replica label (its own, or an engine's
    re-exported), summed over the metric's other labels."""
    text = (await client.get("/metrics")).text
    out = {}
    for key, v in metric_values(text, name).items():
        m = re.search(r'replica="([^"]+)"', key)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


async def _inflight(client) -> dict[str, float]:
    """{replica: requests the router counts in flight there} (what its routing decisions use)."""
    return await _per_replica(client, "replayssm_router_replica_inflight")


async def _send(client, body, path="/v1/completions", timeout=30.0) -> tuple[Stream, str]:
    """Start a stream; return it with the replica the router counted it on (whose in-flight count
    rose), known before any token while the engines are stopped (no other request may be starting)."""
    before = await _inflight(client)
    stream = Stream(client, body, path)
    deadline = time.monotonic() + timeout
    while True:
        now = await _inflight(client)
        rose = [r for r, v in now.items() if v > before.get(r, 0)]
        if rose:
            return stream, rose[0]
        assert not stream.task.done(), stream.task.result()
        assert time.monotonic() < deadline, f"not routed in {timeout} s: {now}"
        await asyncio.sleep(0.05)


def _run(coro):
    return asyncio.run(coro)


def test_router_health_means_it_can_route(cluster):
    """At the router's first /health 200 (probed every 0.1 s from before the app was deployed), a
    request is served at once: /health waits for an engine replica (issue 17, item 16)."""
    probe = cluster["health_probe"]
    assert probe.get("completion_status") == 200, probe
    assert probe["completion_s"] < 3.0, f"healthy {probe['completion_s']:.1f} s before it could serve: {probe}"


def test_concurrent_requests_all_succeed(cluster):
    async def main():
        async with httpx.AsyncClient(base_url=cluster["url"], timeout=120) as c:
            assert (await c.get("/health")).status_code == 200
            models = (await c.get("/v1/models")).json()
            assert models["data"] and models["data"][0]["id"]
            jobs = []
            for i in range(12):
                prompt = f"request {i}: the quick brown fox {uuid.uuid4().hex[:6]}"
                jobs.append(complete(c, prompt, 8, stream=bool(i % 2), **EXTRA))
            chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello there"}],
                                                        "max_tokens": 6, **EXTRA})
            res = await asyncio.gather(*jobs, chat)
            for r in res[:-1]:
                assert r["tokens"] == 8 and len(r["text"]) > 0
                if "done" in r:
                    assert r["done"] and len(r["ids"]) == 1
            assert res[-1].status_code == 200, res[-1].text
            assert res[-1].json()["choices"][0]["message"]["content"]
            # the engine's sampling parameters pass the router; logprobs survive its non-streamed answer
            r = await c.post("/v1/completions", json={"prompt": "logprobs through the router", "max_tokens": 6,
                                                      "logprobs": 2, "top_k": 5, "presence_penalty": 0.5, **EXTRA})
            assert r.status_code == 200, r.text
            (choice,) = r.json()["choices"]
            assert "".join(choice["logprobs"]["tokens"]) == choice["text"] and len(choice["text"]) == 6
            assert len(choice["logprobs"]["token_logprobs"]) == 6 and choice["logprobs"]["text_offset"][-1] == 5
            # a bad request is the engine's 400, passed through, not retried
            bad = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
            assert bad.status_code == 400 and "max_tokens" in bad.text
            replicas = {r["replica"] for r in res[:-1]}
            assert replicas and all(replicas)

    _run(main())


def test_prefix_affinity_packing_and_overload_override(cluster):
    assert POLICY.target_batch == 2 and POLICY.imbalance_threshold == 2
    shared = "You are a helpful assistant. Shared system prompt 0123456789: "
    assert len(shared) >= POLICY.min_prefix_chars

    async def main():
        async with httpx.AsyncClient(base_url=cluster["url"], timeout=120) as c:
            await _wait_idle(c)
            with await _stop_engines(c) as engines:   # requests stay in flight while the test needs
                # 1. two long unique requests on an idle cluster: packed onto ONE replica (A)
                l1, a = await _send(c, {"prompt": f"unique long one {uuid.uuid4().hex}", "max_tokens": LONG, **EXTRA})
                l2, a2 = await _send(c, {"prompt": f"unique long two {uuid.uuid4().hex}", "max_tokens": LONG, **EXTRA})
                assert a2 == a
                (b,) = set(engines) - {a}
                engines[b].resume()
                # 2. A is at its target batch: the shared prompt spills to B
                r0 = await complete(c, shared, 4, **EXTRA)
                loads = await _per_replica(c, "replayssm_router_replica_load")
                assert (r0["replica"], r0["route"]) == (b, "pack"), (a, b, loads)
            await l2.until_started()
            assert l1.replica == l2.replica == a and l1.route == l2.route == "pack"
            hits_before = await _per_replica(c, "replayssm:prefix_cache_hits_total")
            # 3. requests extending it follow it to B (prefix hits), where the engine starts them from
            #    its cached prompt-prefix state instead of prefilling the shared part again
            for q in ("question one", "question two"):
                r = await complete(c, shared + q, 4, **EXTRA)
                assert (r["replica"], r["route"]) == (b, "prefix_hit")
            deadline = time.monotonic() + 10
            while True:
                hits = await _per_replica(c, "replayssm:prefix_cache_hits_total")
                if hits.get(b, 0) - hits_before.get(b, 0) >= 2 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert hits.get(b, 0) - hits_before.get(b, 0) >= 2, (hits_before, hits)
            assert hits.get(a, 0) == hits_before.get(a, 0)
            await l1.cancel()
            await l2.cancel()
            await _wait_idle(c)
            # 4. idle cluster: packing alone sends a new prompt to A, the shared prefix still goes to B
            u = await complete(c, f"an unrelated prompt {uuid.uuid4().hex}", 4, **EXTRA)
            assert (u["replica"], u["route"]) == (a, "pack")
            r = await complete(c, shared + "question three", 4, **EXTRA)
            assert (r["replica"], r["route"]) == (b, "prefix_hit")
            # 5. skew: B holds 2 long shared-prefix requests (its target batch), A none -> override to A
            with await _stop_engines(c) as engines:
                engines[a].resume()
                h1, b1 = await _send(c, {"prompt": shared + "long four", "max_tokens": LONG, **EXTRA})
                h2, b2 = await _send(c, {"prompt": shared + "long five", "max_tokens": LONG, **EXTRA})
                assert b1 == b2 == b
                r = await complete(c, shared + "question six", 4, **EXTRA)
                loads = await _per_replica(c, "replayssm_router_replica_load")   # what that decision counted
                assert (r["replica"], r["route"]) == (a, "load_override"), (a, b, loads)
                assert loads == {a: 0, b: 2}
            await h2.until_started()
            assert (h1.replica, h1.route) == (b, "prefix_hit") and (h2.replica, h2.route) == (b, "prefix_hit")
            await h1.cancel()
            await h2.cancel()
            text = (await c.get("/metrics")).text
            decisions = metric_values(text, "replayssm_router_decisions_total")
            assert decisions['{decision="prefix_hit"}'] >= 5
            assert decisions['{decision="load_override"}'] >= 1
            await _wait_idle(c)

    _run(main())


def test_bounded_load_zero_errors(cluster):
    n, concurrency, max_tokens = 300, 32, 4

    async def main():
        sem = asyncio.Semaphore(concurrency)
        errors = []
        tokens = 0

        async def one(i, c):
            nonlocal tokens
            async with sem:
                try:
                    r = await complete(c, f"load {i % 20} shared prefix for caching, item {i}", max_tokens,
                                       stream=bool(i % 3 == 0), **EXTRA)
                    assert r["tokens"] == max_tokens, r
                    tokens += r["tokens"]
                except Exception as e:  # counted, then asserted zero
                    errors.append(repr(e))

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=cluster["url"], timeout=300, limits=limits) as c:
            t0 = time.monotonic()
            await asyncio.gather(*(one(i, c) for i in range(n)))
            dt = time.monotonic() - t0
        return errors, tokens, dt

    errors, tokens, dt = _run(main())
    assert errors == []
    assert tokens == n * max_tokens
    report = {"requests": n, "concurrency": concurrency, "max_tokens": max_tokens, "seconds": round(dt, 2),
              "requests_per_s": round(n / dt, 1), "tokens_per_s": round(tokens / dt, 1)}
    (cluster["tmp"] / "load_test.json").write_text(json.dumps(report))
    print(f"\n[scheduler load test] {report}")


def _sockets(kind):
    """(local, peer, pid) of TCP sockets: kind 'l' = listening, 't' = established."""
    out = subprocess.run(["ss", f"-{kind}np", "-H"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        pids = [int(x) for x in re.findall(r"pid=(\d+)", line)]
        local, peer = parts[3], parts[4]
        for pid in pids:
            rows.append((local, peer, pid))
    return rows


def _host(addr):
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host[len("::ffff:"):] if host.startswith("::ffff:") else host  # IPv4-mapped IPv6


def test_everything_is_on_loopback(cluster):
    """Ray, Serve, the replicas and the engines listen on and talk over 127.0.0.1 only (ss -tnp)."""
    async def traffic():
        async with httpx.AsyncClient(base_url=cluster["url"], timeout=120) as c:
            await asyncio.gather(*(complete(c, f"loopback check {i}", 8, stream=True, **EXTRA) for i in range(4)))

    _run(traffic())
    procs = session_pids()
    assert any("sglang_replayssm.launch" in a for a in procs.values())  # the engines are among them
    ours = set(procs) | {os.getpid()}
    listening = [(l, pid) for l, _, pid in _sockets("tl") if pid in ours]
    established = [(l, p, pid) for l, p, pid in _sockets("t") if pid in ours]
    assert listening and established
    assert {_host(l) for l, _ in listening} == {"127.0.0.1"}, listening
    assert {_host(a) for l, p, _ in established for a in (l, p)} == {"127.0.0.1"}, established


def _engine_groups(replica_uid):
    """Process groups of one replica's engine (found by the replica id in their environment)."""
    needle = f"SGLANG_REPLAYSSM_REPLICA={replica_uid}".encode()
    groups = set()
    for pid in session_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    groups.add(os.getpgid(pid))
        except OSError:
            pass
    assert groups, f"no engine processes found for replica {replica_uid}"
    return groups


class Frozen:
    """One replica's engine stopped with SIGSTOP (`stop()`), so that requests routed there stay
    unfinished, counted in flight by the router, for as long as the test needs, whatever the machine's
    speed: a 300-token answer of the test model takes about a second, less than a busy 2-core machine
    may take between two steps of a test. `resume()` (SIGCONT) is idempotent. Keep stops short: the
    replica's health check gives its engine 24 s to answer (serve_app.engine_health_timeout), then Serve
    replaces the replica."""

    def __init__(self, replica_uid):
        self.groups = _engine_groups(replica_uid)
        self.stopped = False

    def stop(self):
        for g in self.groups:
            os.killpg(g, signal.SIGSTOP)
        self.stopped = True
        return self

    def resume(self):
        if self.stopped:
            self.stopped = False
            for g in self.groups:
                try:
                    os.killpg(g, signal.SIGCONT)
                except ProcessLookupError:   # killed meanwhile
                    pass

    async def run_until_started(self, *streams, slice_s=0.01, settle_s=0.3):
        """Let the stopped engine run in slices of `slice_s` until every stream sent its first token;
        each slice's tokens get `settle_s` to reach the client before the next, so the engine makes
        only a few tokens more than the client has seen (on a busy machine, letting it run until the
        first token arrives could be a whole short answer). Stopped again at the end."""
        for s in streams:
            while not await s.until_started(timeout=0):
                self.resume()
                await asyncio.sleep(slice_s)
                self.stop()
                await s.until_started(timeout=settle_s)


class StoppedEngines(dict):
    """{replica: Frozen}: every replica's engine, stopped; all resumed at the end of a `with` block."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.resume_all()

    def resume_all(self):
        for f in self.values():
            f.resume()


async def _stop_engines(client) -> StoppedEngines:
    replicas = sorted(await _inflight(client))
    assert len(replicas) == 2, replicas
    engines = StoppedEngines()
    try:
        for r in replicas:
            engines[r] = Frozen(r).stop()
    except BaseException:
        engines.resume_all()
        raise
    return engines


def _kill_engine(replica_uid):
    """SIGKILL the engine process group of one replica (the replica actor itself stays)."""
    for g in _engine_groups(replica_uid):
        os.killpg(g, signal.SIGKILL)


def _kill_replica(replica_uid):
    import ray

    from sglang_replayssm.scheduler.serve_app import APP_NAME, ENGINE_DEPLOYMENT

    name = f"SERVE_REPLICA::{APP_NAME}#{ENGINE_DEPLOYMENT}#{replica_uid}"
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


def _wait_replicas_running(n, timeout=180.0):
    from ray import serve

    from sglang_replayssm.scheduler.serve_app import APP_NAME, ENGINE_DEPLOYMENT

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dep = serve.status().applications[APP_NAME].deployments[ENGINE_DEPLOYMENT]
        states = {str(k).split(".")[-1]: v for k, v in dep.replica_states.items()}
        if states.get("RUNNING", 0) == n and sum(states.values()) == n:
            return
        time.sleep(0.5)
    raise AssertionError(f"Serve did not restore {n} replicas: {dep.replica_states}")


async def _spread_over_two(c, engines, bodies, attempts=3):
    """With every engine stopped (`engines`), start four streams (body, path): packing sends the first
    two to one replica (A) and, A at its target batch of 2, the last two to the other (B). A's engine
    then resumes; B's runs until both of its streams sent a first token and stays stopped, so that
    what the test does next cuts both of B's requests mid-answer. Returns the streams.

    The policy ranks, Serve sends: a replica that does not answer Serve's queue-length probe in time
    (a loaded machine) is passed over for the next in the ranking. Such a start is cancelled and
    made again, `attempts` times at most."""
    for _ in range(attempts):
        streams, where = [], []
        for body in bodies:
            s, r = await _send(c, *body)
            streams.append(s)
            where.append(r)
        a, b = where[0], where[2]
        if where == [a, a, b, b] and a != b:
            engines[a].resume()
            await engines[b].run_until_started(streams[2], streams[3])
            return streams
        for s in streams:
            await s.cancel()
        engines.resume_all()
        await _wait_idle(c)
        for f in engines.values():
            f.stop()
    raise AssertionError(f"the four streams were not packed two and two in {attempts} attempts: {where}")


CHAT_DEFAULT_TOKENS = 128   # the native engine's max_tokens of a chat request that names none


def test_killed_replica_requests_complete_exactly_once(cluster):
    """A replica killed under streams and unary requests: each answer completes once, equal to the
    undisturbed greedy answer. The killed replica held a prompt of token ids and a chat request
    without max_tokens, both resumed exactly from the token ids delivered (issue 17, item 11)."""
    prompts = [f"kill test {i}: resume me exactly once {uuid.uuid4().hex[:8]}" for i in range(6)]
    max_tokens = 300
    token_prompt = [256] + list(prompts[2].encode())          # the byte tokenizer's ids of prompts[2]
    chat = {"messages": [{"role": "user", "content": prompts[3]}], **EXTRA}   # no max_tokens

    async def main():
        async with httpx.AsyncClient(base_url=cluster["url"], timeout=300) as c:
            await _wait_idle(c)
            with await _stop_engines(c) as engines:
                streams = await _spread_over_two(
                    c, engines, [({"prompt": prompts[0], "max_tokens": max_tokens, **EXTRA}, "/v1/completions"),
                                 ({"prompt": prompts[1], "max_tokens": max_tokens, **EXTRA}, "/v1/completions"),
                                 ({"prompt": token_prompt, "max_tokens": max_tokens, **EXTRA}, "/v1/completions"),
                                 (chat, "/v1/chat/completions")])
                victim = streams[-1].replica
                unary = [asyncio.create_task(complete(c, p, max_tokens, **EXTRA)) for p in prompts[4:]]
                mid = [s for s in streams if s.replica == victim and not s.task.done()]
                _kill_replica(victim)
                results = [await s.task for s in streams]
            unary_res = await asyncio.gather(*unary)
            # reference: the same requests with no failure (greedy decoding is deterministic)
            _wait_replicas_running(2)
            ref = await asyncio.gather(*(complete(c, p, max_tokens, **EXTRA) for p in prompts))
            ref_chat = (await c.post("/v1/chat/completions", json=chat)).json()["choices"][0]["message"]["content"]
            return streams, results, unary_res, ref, ref_chat, victim, mid

    streams, results, unary_res, ref, ref_chat, victim, mid = _run(main())
    assert mid == streams[2:], "the token-id and chat requests were not cut: no resume tested"
    assert streams[1].replica == streams[0].replica != victim
    expected = [r["text"] for r in ref[:4]]
    expected[3] = ref_chat
    assert expected[2] == ref[2]["text"] and len(ref_chat) == CHAT_DEFAULT_TOKENS
    for i, (s, (chunks, meta, done), want) in enumerate(zip(streams, results, expected)):
        assert done, "stream ended without [DONE]"
        text = "".join(chunk_text(ch) for ch in chunks)
        n = CHAT_DEFAULT_TOKENS if i == 3 else max_tokens
        assert sum(1 for ch in chunks if chunk_text(ch)) == n, (i, meta)
        assert text == want, f"stream {i}: resumed answer differs from the undisturbed one (token lost or repeated)"
        assert len({ch["id"] for ch in chunks}) == 1
        assert [ch["choices"][0]["finish_reason"] for ch in chunks if ch.get("choices")].count("length") == 1
        assert not any("token_ids" in c for ch in chunks for c in ch.get("choices") or ()), "engine-only field leaked"
        if meta["retries"]:  # cut by the kill: resumed on the other replica
            assert s in mid and meta["replicas"][0] == victim and meta["replicas"][-1] != victim
    assert results[2][1]["retries"] >= 1 and results[3][1]["retries"] >= 1
    for u, r in zip(unary_res, ref[4:]):
        assert u["tokens"] == max_tokens and u["text"] == r["text"]


def test_engine_crash_requests_resume_and_replica_is_replaced(cluster):
    """The engine process dies (not the Ray actor): cut streams resume on the other replica, the
    replica fails its health check and Serve replaces it."""
    prompts = [f"engine crash {i}: keep going {uuid.uuid4().hex[:8]}" for i in range(4)]
    max_tokens = 200

    async def main():
        async with httpx.AsyncClient(base_url=cluster["url"], timeout=300) as c:
            await _wait_idle(c)
            with await _stop_engines(c) as engines:
                streams = await _spread_over_two(
                    c, engines, [({"prompt": p, "max_tokens": max_tokens, **EXTRA}, "/v1/completions") for p in prompts])
                victim = streams[-1].replica
                mid = [s for s in streams if s.replica == victim and not s.task.done()]
                _kill_engine(victim)
                results = [await s.task for s in streams]
            # the replica fails its health check; Serve replaces it
            deadline = time.monotonic() + 120
            while True:
                text = (await c.get("/metrics")).text
                up = set(re.findall(r'^replayssm_router_replica_up\{replica="([^"]+)"\} 1', text, re.M))
                if victim not in up and len(up) == 2:
                    break
                assert time.monotonic() < deadline, f"replica {victim} not replaced: {up}"
                await asyncio.sleep(0.5)
            _wait_replicas_running(2)
            ref = await asyncio.gather(*(complete(c, p, max_tokens, **EXTRA) for p in prompts))
            return streams, results, ref, victim, mid

    streams, results, ref, victim, mid = _run(main())
    assert mid == streams[2:] and streams[1].replica == streams[0].replica != victim
    for i, (s, (chunks, meta, done), r) in enumerate(zip(streams, results, ref)):
        text = "".join(chunk_text(ch) for ch in chunks)
        assert done, (i, meta)
        assert text == r["text"], (i, meta, text, r["text"])
        assert sum(1 for ch in chunks if chunk_text(ch)) == max_tokens
        if s in mid:   # cut by the crash: resumed elsewhere
            assert meta["retries"] >= 1 and meta["replicas"][0] == victim and meta["replicas"][-1] != victim
        else:
            assert meta["retries"] == 0
    assert victim not in {r["replica"] for r in ref}  # the crashed replica was replaced
    assert all(r["retries"] == 0 for r in ref)
