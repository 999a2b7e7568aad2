"""The Ray cluster tests of tests/scheduler, once with real SGLang replicas (issue 16, item 4).

One local Ray cluster on 127.0.0.1, started the way a user starts it:

    python -m sglang_replayssm.launch --replicas 2 --engine sglang --device cpu --model-path <tiny qwen3_next> \\
        --replayssm-window 4 --enable-metrics --replica-num-cpus 0 ...

two Ray Serve replicas, each owning a real SGLang server (CPU harness, our ReplaySSM plugin at window 4), behind
our router. Checked through the router, in file order on that one cluster:

1. greedy completions from both replicas equal transformers' greedy text;
2. prefix affinity: a prompt extending a served conversation goes to the replica that served it (where SGLang's
   radix cache then reuses it), also when packing alone would pick the other replica;
3. the SGLang engine of one replica killed (SIGKILL to its process group) under streams: every stream completes
   once, with every token once, equal to the undisturbed answer; Serve replaces the replica;
4. a real Prometheus scrapes the router and Ray's metrics port and has the engines' ``replayssm:`` and
   ``sglang:`` samples of both current replicas.

Oracles. Test 1: transformers' greedy text of the same checkpoint, only where its best token beats the second by
at least TIE_NATS at every position (asserted, so a near tie cannot flake). Test 3: the undisturbed answer of the
same request on the same cluster afterwards (SGLang's greedy decoding is deterministic); not transformers: over 96
tokens the tiny Qwen3-Next's MoE gates meet near ties where SGLang's CPU kernels and transformers route a token to
different experts (measured: 0.75 nats apart at token 31 of one prompt, stock SGLang as much as with the plugin).
The kill test's outputs are restricted to six capital letters that no BPE merge of the tiny tokenizer contains
(``logit_bias``): the router resumes a cut completion from its *text* (prompt + text so far), which is exact only
when that text re-tokenizes to the tokens generated (asserted for every cut point); the unrestricted tiny model
emits partial UTF-8 bytes, whose text does not round-trip (docs/scheduler.md, "Limits").

The cluster runs after the single servers of this package (``servers.close()`` first: one SGLang stack at a
time fits this 2-core machine). Every process it starts carries MARKER=SESSION in its environment; at teardown
the launcher is stopped and every marked process must be gone.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
yaml = pytest.importorskip("yaml")

from sglang_replayssm.scheduler.engine_process import free_port  # noqa: E402
from tests.scheduler.client import Stream, chunk_text, metric_values, pids_with_env  # noqa: E402

from .checks import TIE_NATS  # noqa: E402
from .conftest import _hf_model, tokenize  # noqa: E402

MARKER = "SGLANG_REPLAYSSM_RAY_SGLANG_TEST"
SESSION = uuid.uuid4().hex
START_TIMEOUT_S = 300
REPLACE_TIMEOUT_S = 240
TARGET_BATCH = 2        # --route-target-batch: a request routed after two running ones goes to the other replica
MIN_PREFIX_CHARS = 16   # --route-min-prefix-chars
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
GREEDY = {"temperature": 0.0, "ignore_eos": True}

# test 1: plain greedy, 12 tokens; transformers' top-1 beats its top-2 by >= TIE_NATS at every position
GREEDY_PROMPTS = ("The quick brown fox", "hello, world! How are you", "What is the capital of France?",
                  "the sea and the mountains", "numbers 0 1 2 3", "Once upon a time")
GREEDY_TOKENS = 12

# tests 2 and 3: output restricted to letters no BPE merge of the tiny tokenizer contains (one byte, one token,
# one character each), so text and tokens convert both ways exactly
LETTERS = "BCDGJK"
# Measured on one SGLang server (plugin, window 4): for each of these, the request resumed after any of its first
# 48 tokens (prompt + text so far) continues exactly as the undisturbed answer. Not every prompt does: for
# "engine kill 28: ..." a resume after token 34..36 parts from it (prefill and decode round differently and an
# MoE gate near tie flips), which is SGLang's numerics, not the router.
KILL_PROMPTS = ("engine kill 11: every token exactly once", "engine kill 16: every token exactly once",
                "engine kill 17: every token exactly once")
KILL_TOKENS = 96


# -- processes of this module's cluster ----------------------------------------------------------------
def marked_pids() -> dict[int, str]:
    """Live processes carrying MARKER=SESSION (pytest excluded): pid -> command line."""
    return {pid: cmd[:200] for pid, cmd in pids_with_env(f"{MARKER}={SESSION}").items()}


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


class Cluster:
    def __init__(self, model_dir: Path, tmp: Path):
        self.model_dir = model_dir
        self.tmp = tmp
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "launcher.log"
        self.engine_logs = tmp / "engine-logs"
        cmd = [sys.executable, "-m", "sglang_replayssm.launch", "--replicas", "2", "--engine", "sglang",
               "--device", "cpu", "--model-path", str(model_dir), "--replayssm-window", "4", "--enable-metrics",
               "--replica-num-cpus", "0", "--host", "127.0.0.1", "--port", str(self.port),
               "--health-check-period", "1", "--replica-log-dir", str(self.engine_logs),
               "--ray-metrics-port", str(self.metrics_port), "--route-target-batch", str(TARGET_BATCH),
               "--route-min-prefix-chars", str(MIN_PREFIX_CHARS)]
        # the engines push their replayssm: counts at every step (default: every 16 decode steps), so a replica that
        # served only a few short requests shows them to Prometheus too (the scrape test asserts both replicas' counts)
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", SGLANG_REPLAYSSM_METRICS_INTERVAL="1", **{MARKER: SESSION})
        env.pop("SGLANG_REPLAYSSM_OPTIONS", None)
        self.started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)

    def log_tail(self, n: int = 40) -> str:
        parts = [f"--- {self.log_path.name}\n" + "\n".join(
            self.log_path.read_text(errors="replace").splitlines()[-n:])]
        for p in sorted(self.engine_logs.glob("*.log")) if self.engine_logs.is_dir() else ():
            parts.append(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    def replicas_up(self) -> set[str]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return set(re.findall(r'^replayssm_router_replica_up\{replica="([^"]+)"\} 1(?:\.0)?$', text, re.M))

    def wait_ready(self) -> None:
        deadline = self.started + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the launcher exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if (httpx.get(self.url + "/health", timeout=5).status_code == 200
                        and len(self.replicas_up()) == 2):
                    self.startup_s = time.monotonic() - self.started
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        pytest.fail(f"no router with 2 replicas up after {START_TIMEOUT_S}s:\n{self.log_tail()}")

    def stop(self) -> dict[int, str]:
        """Stop the launcher (it shuts Serve and Ray down), then its process group; SIGKILL what is left of
        ours. Returns the marked processes that had to be killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:   # Ray's daemons are in the launcher's process group (Ray's reaper makes it their group)
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while marked_pids() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = marked_pids()
        for pid in left:   # ours only: found by the marker, killed by PID
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=30)
        return left


@pytest.fixture(scope="module")
def cluster(tiny_models, tmp_path_factory):
    # the other server modules' servers stopped with their modules (conftest's module-scoped `servers`)
    c = Cluster(tiny_models / "qwen3_next", tmp_path_factory.mktemp("ray-sglang"))
    try:
        c.wait_ready()
        print(f"\n[ray + sglang replicas] healthy with 2 replicas after {c.startup_s:.0f}s")
        yield c
    finally:
        left = c.stop()
        deadline = time.monotonic() + 15
        while marked_pids() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not marked_pids(), f"processes of the cluster survived SIGKILL: {marked_pids()}"
        assert not left, f"processes left 30 s after the launcher stopped (SIGKILLed): {left}"


# -- the oracle ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _tokenizer(model_dir: str):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(model_dir)


def letter_ids(model_dir: str) -> list[int]:
    tok = _tokenizer(model_dir)
    ids = [tok.convert_tokens_to_ids(c) for c in LETTERS]
    assert len(set(ids)) == len(LETTERS) and all(tok.decode([i]) == c for i, c in zip(ids, LETTERS))
    return ids


def hf_greedy(model_dir: str, prompt: str, n: int) -> tuple[list[int], float]:
    """transformers' greedy tokens after ``prompt`` and the smallest margin of each chosen token over the best
    other token, from one full forward (negative: not its argmax there)."""
    import torch

    model = _hf_model(model_dir)
    ids = list(tokenize(model_dir, prompt))
    gen: list[int] = []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            gen.append(int(out.logits[0, -1].argmax()))
            out = model(torch.tensor([[gen[-1]]]), past_key_values=out.past_key_values, use_cache=True)
        lp = torch.log_softmax(model(torch.tensor([ids + gen])).logits[0].float(), dim=-1)
    margin = float("inf")
    for i, t in enumerate(gen):
        row = lp[len(ids) - 1 + i].clone()
        chosen = float(row[t])
        row[t] = float("-inf")
        margin = min(margin, chosen - float(row.max()))
    return gen, margin


def oracle(model_dir: str, prompt: str, n: int) -> str:
    """transformers' greedy text, asserted free of near ties."""
    gen, margin = hf_greedy(model_dir, prompt, n)
    assert margin >= TIE_NATS, f"{prompt!r}: transformers' greedy choice is a near tie ({margin:.4f} nats)"
    return _tokenizer(model_dir).decode(gen, skip_special_tokens=True)


def assert_text_resumes_exactly(model_dir: str, prompt: str, text: str) -> None:
    """The router resumes from prompt + text so far: at every cut point that text must re-tokenize to the
    tokens generated (one letter, one token)."""
    tok = _tokenizer(model_dir)
    ids = list(tokenize(model_dir, prompt))
    by_letter = dict(zip(LETTERS, letter_ids(model_dir)))
    gen = [by_letter[c] for c in text]
    for k in range(1, len(text) + 1):
        assert tok(prompt + text[:k], add_special_tokens=False).input_ids == ids + gen[:k], (prompt, k)


# -- requests ----------------------------------------------------------------------------------------------
def _run(coro):
    return asyncio.run(coro)


async def _per_replica(client, name: str) -> dict[str, float]:
    """{replica: sum} of an engine metric as re-exported by the router."""
    out: dict[str, float] = {}
    for key, v in metric_values((await client.get("/metrics")).text, name).items():
        m = re.search(r'replica="([^"]+)"', key)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


async def _wait_idle(client, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        text = (await client.get("/metrics")).text
        busy = {(n, k): v for n in ("replayssm_router_replica_running", "replayssm_router_replica_waiting",
                                    "replayssm_router_replica_inflight")
                for k, v in metric_values(text, n).items() if v > 0}
        if not busy:
            return
        assert time.monotonic() < deadline, f"replicas did not become idle: {busy}"
        await asyncio.sleep(0.3)


async def complete(client, prompt: str, max_tokens: int, **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": False, **GREEDY, **extra}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    j = r.json()
    return {"text": j["choices"][0]["text"], "replica": j["replayssm"]["replica"], "route": j["replayssm"]["route"],
            "retries": j["replayssm"]["retries"], "tokens": j["usage"]["completion_tokens"],
            "finish": j["choices"][0]["finish_reason"]}


def _Stream(client, prompt: str, max_tokens: int, **extra) -> Stream:
    return Stream(client, {"prompt": prompt, "max_tokens": max_tokens,
                           "stream_options": {"include_usage": True}, **GREEDY, **extra})


async def _started(stream: _Stream, timeout: float = 120.0) -> _Stream:
    done, _ = await asyncio.wait([asyncio.ensure_future(stream.started.wait()), stream.task], timeout=timeout,
                                 return_when=asyncio.FIRST_COMPLETED)
    assert stream.started.is_set(), f"no token within {timeout}s" + (
        f": {stream.task.exception()!r}" if stream.task.done() and stream.task.exception() else "")
    return stream


def _bias(model_dir: Path) -> dict:
    return {"logit_bias": {str(i): 100.0 for i in letter_ids(str(model_dir))}}


# -- 1. greedy completions from both replicas ---------------------------------------------------------------
async def _hold(client, n: int, prefix: str, max_tokens: int = 400) -> list[_Stream]:
    """``n`` streams started one after another (each routed before the next arrives)."""
    return [await _started(_Stream(client, f"{prefix} {k} {uuid.uuid4().hex}", max_tokens)) for k in range(n)]


def test_greedy_completions_from_both_replicas_equal_transformers(cluster):
    md = str(cluster.model_dir)
    want = {p: oracle(md, p, GREEDY_TOKENS) for p in GREEDY_PROMPTS}
    first, second = GREEDY_PROMPTS[:3], GREEDY_PROMPTS[3:]

    async def main():
        async with httpx.AsyncClient(base_url=cluster.url, timeout=300) as c:
            assert (await c.get("/health")).status_code == 200
            models = (await c.get("/v1/models")).json()
            assert models["data"] and models["data"][0]["id"]
            await _wait_idle(c)
            # replica A at its target batch (two long streams packed onto it): three requests at once go to B
            holders = await _hold(c, TARGET_BATCH, "hold replica A")
            a = holders[0].replica
            assert {h.replica for h in holders} == {a}
            res1 = await asyncio.gather(*(complete(c, p, GREEDY_TOKENS) for p in first))
            for h in holders:
                await h.cancel()
            await _wait_idle(c)
            # B at its target batch (two long streams extending a prompt B served: prefix affinity): three more
            # requests at once go to A
            on_b = next((p for p, r in zip(first, res1) if r["replica"] != a), None)
            assert on_b is not None, f"replica A was full, yet it got all of {res1}"
            holders = await _hold(c, TARGET_BATCH, on_b + " hold replica B")
            res2 = await asyncio.gather(*(complete(c, p, GREEDY_TOKENS) for p in second))
            for h in holders:
                await h.cancel()
            await _wait_idle(c)
            return res1 + res2

    res = _run(main())
    for p, r in zip(GREEDY_PROMPTS, res):
        assert r["tokens"] == GREEDY_TOKENS and r["finish"] == "length" and r["retries"] == 0, r
        assert r["text"] == want[p], f"{p!r} on {r['replica']}: {r['text']!r} != transformers' {want[p]!r}"
    assert len({r["replica"] for r in res}) == 2, f"all answers from one replica: {res}"


# -- 2. prefix affinity --------------------------------------------------------------------------------------
def test_prefix_affinity_follows_the_cached_conversation(cluster):
    shared = "You are a helpful assistant. Shared system prompt 0123456789: "
    assert len(shared) >= MIN_PREFIX_CHARS
    bias = _bias(cluster.model_dir)

    async def main():
        async with httpx.AsyncClient(base_url=cluster.url, timeout=300) as c:
            await _wait_idle(c)
            # two long unique requests on an idle cluster: packed onto ONE replica (A), which is then full
            l1 = await _started(_Stream(c, f"unique long one {uuid.uuid4().hex}", 400))
            l2 = await _started(_Stream(c, f"unique long two {uuid.uuid4().hex}", 400))
            assert l1.replica == l2.replica and l1.route == l2.route == "pack", (l1.route, l2.route)
            a = l1.replica
            # turn 1 of a conversation spills to B
            t1 = await complete(c, shared, 8, **bias)
            b = t1["replica"]
            assert b != a and t1["route"] == "pack", t1
            await l1.cancel()
            await l2.cancel()
            await _wait_idle(c)
            cached_before = await _per_replica(c, "sglang:cached_tokens_total")
            # idle cluster: packing alone picks A for a new prompt ...
            u = await complete(c, f"an unrelated prompt {uuid.uuid4().hex}", 4)
            assert (u["replica"], u["route"]) == (a, "pack"), u
            # ... but the conversation's next turns follow it to B, where SGLang's radix cache holds turn 1
            turns = []
            for q in (" question one", " question two"):
                r = await complete(c, shared + t1["text"] + q, 8, **bias)
                assert (r["replica"], r["route"]) == (b, "prefix_hit"), r
                turns.append(r)
            deadline = time.monotonic() + 15
            while True:
                cached = await _per_replica(c, "sglang:cached_tokens_total")
                if cached.get(b, 0) - cached_before.get(b, 0) >= 2 * n_shared or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            decisions = metric_values((await c.get("/metrics")).text, "replayssm_router_decisions_total")
            return a, b, cached_before, cached, decisions

    n_shared = len(tokenize(str(cluster.model_dir), shared))
    a, b, before, after, decisions = _run(main())
    # each of the two turns started from SGLang's cached prefix on B (at least the shared prompt's tokens)
    assert after.get(b, 0) - before.get(b, 0) >= 2 * n_shared, (before, after)
    assert decisions['{decision="prefix_hit"}'] >= 2, decisions


# -- 3. a killed engine loses nothing --------------------------------------------------------------------------
def _kill_engine(replica: str) -> list[int]:
    """SIGKILL the process group(s) of one replica's engine (guard, SGLang server, scheduler, detokenizer),
    found by SGLANG_REPLAYSSM_REPLICA=<replica> among this cluster's processes; the replica actor stays."""
    entry = f"SGLANG_REPLAYSSM_REPLICA={replica}".encode()
    groups = {os.getpgid(pid) for pid in marked_pids() if _environ_has(pid, entry)}
    groups.discard(os.getpgrp())
    assert groups, f"no engine processes found for replica {replica}"
    for g in groups:
        os.killpg(g, signal.SIGKILL)
    return sorted(groups)


def test_killed_engine_streams_complete_exactly_once_and_replica_is_replaced(cluster):
    md = str(cluster.model_dir)
    bias = _bias(cluster.model_dir)

    async def main():
        async with httpx.AsyncClient(base_url=cluster.url, timeout=600) as c:
            await _wait_idle(c)
            streams = [await _started(_Stream(c, p, KILL_TOKENS, **bias)) for p in KILL_PROMPTS]
            replicas = [s.replica for s in streams]
            assert len(set(replicas)) == 2, f"the streams are not spread over both replicas: {replicas}"
            victim = max(set(replicas), key=replicas.count)   # packing: the first two share a replica
            mid = [s for s in streams if s.replica == victim and not s.task.done()]
            _kill_engine(victim)
            t_kill = time.monotonic()
            results = [await s.task for s in streams]
            # the undisturbed answers (served by the survivor while the victim is being replaced)
            ref = asyncio.gather(*(complete(c, p, KILL_TOKENS, **bias) for p in KILL_PROMPTS))
            # the replica fails its health check and Serve replaces it (a new SGLang engine starts)
            while True:
                up = set(re.findall(r'^replayssm_router_replica_up\{replica="([^"]+)"\} 1(?:\.0)?$',
                                    (await c.get("/metrics")).text, re.M))
                if victim not in up and len(up) == 2:
                    break
                assert time.monotonic() - t_kill < REPLACE_TIMEOUT_S, f"replica {victim} not replaced: {up}"
                await asyncio.sleep(1.0)
            replaced_s = time.monotonic() - t_kill
            return streams, results, await ref, victim, mid, replaced_s

    streams, results, ref, victim, mid, replaced_s = _run(main())
    print(f"\n[ray + sglang replicas] killed replica replaced after {replaced_s:.0f}s")
    assert mid, "every stream of the victim finished before the kill"
    resumed = 0
    for p, s, (chunks, meta, done), r in zip(KILL_PROMPTS, streams, results, ref):
        assert done, f"{p!r}: stream ended without [DONE]"
        assert not any("error" in ch for ch in chunks), chunks
        text = "".join(chunk_text(ch) for ch in chunks)
        assert len({ch["id"] for ch in chunks}) == 1
        assert [c["finish_reason"] for ch in chunks for c in ch.get("choices") or ()].count("length") == 1
        usage = [ch["usage"] for ch in chunks if ch.get("usage")]
        assert usage and usage[-1]["completion_tokens"] == KILL_TOKENS, usage
        # one letter per token: KILL_TOKENS characters = every token once, none lost or repeated
        assert len(text) == KILL_TOKENS and set(text) <= set(LETTERS), text
        assert_text_resumes_exactly(md, p, text)
        assert r["tokens"] == KILL_TOKENS and r["text"] == text, (
            f"{p!r} (retries {meta['retries']}): stream {text!r} != the undisturbed answer {r['text']!r}")
        if meta["retries"]:   # cut by the kill: resumed on the other replica
            assert s in mid and meta["replicas"][0] == victim and meta["replicas"][-1] != victim, meta
            resumed += 1
        else:
            assert meta["replicas"] == [s.replica], meta
    assert resumed >= 1, "no stream was cut by the kill"
    assert all(r["replica"] != victim for r in ref), ref


# -- 4. Prometheus scrapes both -----------------------------------------------------------------------------
def test_prometheus_scrapes_engine_metrics_of_both_replicas(cluster, tmp_path):
    assert Path(PROMETHEUS).exists(), "prometheus not installed: apt-get install -y prometheus"
    replicas = cluster.replicas_up()
    assert len(replicas) == 2, replicas
    cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
           "scrape_configs": [
               {"job_name": "replayssm-router", "metrics_path": "/metrics",
                "static_configs": [{"targets": [f"127.0.0.1:{cluster.port}"]}]},
               {"job_name": "ray", "static_configs": [{"targets": [f"127.0.0.1:{cluster.metrics_port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    queries = {
        "flushes": 'sum by (replica) (replayssm:flushes_total{job="replayssm-router"})',
        "nonflush": 'sum by (replica) (replayssm:nonflush_steps_total{job="replayssm-router"})',
        "sglang": 'count by (replica) ({__name__=~"sglang:.+", job="replayssm-router"})',
        "sglang_tokens": 'sum by (replica) (sglang:generation_tokens_total{job="replayssm-router"})',
        "ray_engine_up": 'max by (replica) (ray_replayssm_replica_engine_up{job="ray"})',
    }

    async def main():
        async with httpx.AsyncClient(base_url=cluster.url, timeout=300) as c, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as prom:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if (await prom.get("/-/ready")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "prometheus did not become ready"
                await asyncio.sleep(0.3)
            got: dict = {}
            i = 0
            deadline = time.monotonic() + 120
            while True:
                # traffic to both replicas, so the counters move: two short streams fill the first replica
                # (--route-target-batch 2), the two requests sent next go to the other one
                holders = await _hold(c, TARGET_BATCH, f"prometheus hold {i}", max_tokens=16)
                await asyncio.gather(*(complete(c, f"prometheus traffic {i} {k} {uuid.uuid4().hex[:8]}", 8)
                                       for k in range(TARGET_BATCH)))
                for h in holders:
                    await h.task
                i += 1
                for key, q in queries.items():
                    r = (await prom.get("/api/v1/query", params={"query": q})).json()
                    assert r["status"] == "success", (q, r)
                    got[key] = r["data"]["result"]
                per = {k: {s["metric"].get("replica"): float(s["value"][1]) for s in v} for k, v in got.items()}
                if all(per[k].get(r, 0) > 0 for r in replicas for k in per) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(1.0)
            targets = (await prom.get("/api/v1/targets")).json()["data"]["activeTargets"]
            return per, targets

    try:
        per, targets = _run(main())
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
    assert {t["labels"]["job"]: t["health"] for t in targets} == {"replayssm-router": "up", "ray": "up"}, targets
    for key in queries:
        assert replicas <= set(per[key]), f"{key}: Prometheus has {per[key]}, want both replicas {replicas}"
    for r in replicas:   # both engines decoded through ReplaySSM (window 4: appends and flushes) ...
        assert per["nonflush"][r] > 0 and per["flushes"][r] > 0 and per["sglang_tokens"][r] > 0, (r, per)
        assert per["sglang"][r] >= 10, (r, per["sglang"])   # ... and SGLang's own metrics came along
        # the replica's own metrics, from Ray's metrics port: its engine is up
        assert per["ray_engine_up"][r] == 1.0, (r, per["ray_engine_up"])
