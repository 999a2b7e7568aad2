"""The router's `--api-key` and start checks, and its prefix tree keyed by hashes (issue 17, items 10,
12, 13): the flag reaches the router and every engine (whose replicas send it); a second router with a
key on the shared cluster answers 401 without it and serves with it; a router port in use is a flag
error before Ray starts; the prefix tree holds hashes, never prompt text."""

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from sglang_replayssm.http_front.body_limit import MAX_REQUEST_BYTES
from sglang_replayssm.http_front.prefix_hash import block_hashes
from sglang_replayssm.scheduler.prefix_tree import PrefixTree
from sglang_replayssm.scheduler.serve_app import ENGINE_BODY_HEADROOM, SchedulerError, build_app, options_from_args

from .client import complete

KEY = "router-test-key"
APP = "replayssm-keyed"


def _ns(**kw):
    base = dict(replicas=1, ray_address=None, host="127.0.0.1", port=8000, engine="native", engine_argv=[])
    base.update(kw)
    return argparse.Namespace(**base)


def test_api_key_flag_reaches_the_router_and_every_engine():
    o = options_from_args(_ns(engine_argv=["--device", "cpu", "--api-key", KEY, "--route-target-batch", "4"]))
    assert o.api_key == KEY and o.engine_argv == ["--device", "cpu"] and KEY not in repr(o)
    router = build_app(o)._bound_deployment
    engine = router._replica_config.init_args[0]._bound_deployment
    assert router._replica_config.init_args[3] == KEY
    # the engines get the key, and a body limit of the router's plus room for what the router adds (issue 48)
    assert router._replica_config.init_args[5] == MAX_REQUEST_BYTES
    assert engine._replica_config.init_args[1] == ["--device", "cpu", "--api-key", KEY, "--max-request-bytes",
                                                   str(MAX_REQUEST_BYTES + ENGINE_BODY_HEADROOM)]
    assert engine.func_or_class.__name__ == "KeyedEngineReplica"
    plain = build_app(options_from_args(_ns()))._bound_deployment
    assert plain._replica_config.init_args[3] is None
    for bad in ("", " x", "caf\u00e9"):
        with pytest.raises(SchedulerError, match="--api-key"):
            options_from_args(_ns(engine_argv=["--api-key", bad]))


def test_prefix_tree_holds_hashes_not_text():
    t = PrefixTree(block_chars=8)
    secret = "user B's secret prompt that stays in the engine"
    t.insert(secret, "r1")
    keys, stack = [], [t._root]
    while stack:
        node = stack.pop()
        keys += list(node.children)
        stack += node.children.values()
    assert keys and all(len(k) == 16 and int(k, 16) >= 0 for k in keys)
    assert not any(word in k for k in keys for word in ("user", "secret", "prompt"))
    assert t.match(secret[:20] + " other text") == {"r1": 16}
    # chained: a block hash names the whole prefix up to it, so equal blocks after different ones differ
    assert block_hashes("aaaaaaaabbbbbbbb", 8)[1] != block_hashes("ccccccccbbbbbbbb", 8)[1]
    assert t.match("X" + secret) == {}
    t.insert_hashes(block_hashes("engine-reported prefix text", 8), "r2")
    assert t.match("engine-reported prefix text, extended") == {"r2": 24}


def test_router_port_in_use_is_a_flag_error_before_ray_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "sglang_replayssm.launch", "--engine", "native", "--replicas", "1",
                            "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"--port: 127.0.0.1:{port} is already in use" in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 30   # no Ray cluster was started


def test_keyed_router_on_the_shared_cluster(cluster):
    """A second router with --api-key, in front of the shared cluster's engine replicas (no new engine:
    the replicas' side of the key is tested against a keyed engine in tests/native)."""
    import dataclasses

    from ray import serve

    from sglang_replayssm.scheduler.ingress import RouterIngress
    from sglang_replayssm.scheduler.serve_app import APP_NAME, ENGINE_DEPLOYMENT

    engines = serve.get_deployment_handle(ENGINE_DEPLOYMENT, app_name=APP_NAME)
    router = serve.deployment(RouterIngress).options(name="KeyedRouter", num_replicas=1,
                                                     ray_actor_options={"num_cpus": 0})
    policy = dataclasses.asdict(cluster["opts"].policy)
    serve.run(router.bind(engines, policy, 3, KEY), name=APP, route_prefix="/keyed", blocking=False)
    try:
        deadline = time.monotonic() + 120
        while not str(getattr(serve.status().applications.get(APP), "status", "")).endswith("RUNNING"):
            assert time.monotonic() < deadline, serve.status().applications.get(APP)
            time.sleep(0.2)

        async def run():
            base = cluster["url"] + "/keyed"
            async with httpx.AsyncClient(base_url=base, timeout=120) as anon, \
                    httpx.AsyncClient(base_url=base, timeout=120, headers={"Authorization": "Bearer " + KEY}) as ok:
                body = {"prompt": "hello", "max_tokens": 4}
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                    for r in (await anon.post("/v1/completions", json=body, headers=headers),
                              await anon.post("/v1/completions", json=dict(body, stream=True), headers=headers),
                              await anon.post("/v1/chat/completions", headers=headers,
                                              json={"messages": [{"role": "user", "content": "hi"}]}),
                              await anon.get("/v1/models", headers=headers)):
                        assert r.status_code == 401, r.text
                        assert r.json()["error"]["code"] == "invalid_api_key"
                assert (await anon.get("/health")).status_code == 200
                metrics = await anon.get("/metrics")
                assert metrics.status_code == 200 and "replayssm_router_requests_total" in metrics.text
                a, b = await asyncio.gather(complete(ok, "hello keyed router", 6, temperature=0),
                                            complete(ok, "hello keyed router", 6, stream=True, temperature=0))
                assert a["tokens"] == b["tokens"] == 6 and a["text"] == b["text"] and b["done"]
                assert (await ok.get("/v1/models")).json()["data"]
                # what a browser page may not send is refused before the key check (browser_guard.py)
                raw = json.dumps(body)
                for headers, status, param in (({"Host": "rebound.example:8000"}, 421, "host"),
                                               ({"Origin": "http://evil.example"}, 403, "origin"),
                                               ({"Content-Type": "text/plain"}, 415, "content-type")):
                    r = await ok.post("/v1/completions", content=raw, headers=headers)
                    assert r.status_code == status and r.json()["error"]["param"] == param, r.text
                for path in ("/docs", "/openapi.json"):
                    assert (await ok.get(path)).status_code == 404
        asyncio.run(run())
    finally:
        serve.delete(APP)
