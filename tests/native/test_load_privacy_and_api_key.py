"""One real native server with `--api-key` (issue 17, items 12 and 13):

* GET /v1/replayssm/load names the cached prompt prefixes by chained block hashes, never by their text,
  and the Ray router's prefix tree still matches a new prompt against those hashes;
* without the key (or with a wrong one) every route but /health and /metrics is a 401 with an
  OpenAI-style error; with it, a 200; the Ray replica's HTTP client sends the key its engine was
  started with;
* what a web page may make a browser send is refused before any route runs: a Host that is not a
  loopback name (DNS rebinding) 421, a cross-site Origin 403, a text/plain or form body 415; /docs and
  /openapi.json are served only with --enable-docs.
"""

import asyncio
import json
import uuid

import httpx
import pytest

from sglang_replayssm import launch
from sglang_replayssm.scheduler.policy import PREFIX_HIT, PolicyConfig, choose
from sglang_replayssm.http_front.prefix_hash import block_hashes
from sglang_replayssm.scheduler.state import RouterState

from .live_server import LiveServer

KEY = "sk-test-" + uuid.uuid4().hex
AUTH = {"Authorization": f"Bearer {KEY}"}
SERVED = "keyed-model"


@pytest.fixture(scope="module")
def server():
    # a grid coarser than the prompt: its one cached state is the prompt without its last token
    s = LiveServer("--api-key", KEY, "--served-model-name", SERVED, "--prefix-cache-interval", "128")
    yield s
    s.stop()


def test_load_report_names_prefixes_without_their_text(server):
    marker = f"MARKER-{uuid.uuid4().hex}"
    prompt = f"user A's private prompt {marker}: the rest of the secret text"
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=60,
                   json={"prompt": prompt, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    load = None
    for _ in range(100):   # the report follows the engine's next step
        body = httpx.get(server.url + "/v1/replayssm/load", headers=AUTH, timeout=10).text
        load = json.loads(body)
        if load["cached_prefix_blocks"]["prefixes"]:
            break
    (hashes,) = load["cached_prefix_blocks"]["prefixes"]
    for fragment in (marker, marker[:16], "private prompt", "secret"):
        assert fragment not in body
    # the chained hashes of the prompt's leading blocks (the cache key is the prompt without its last token)
    assert hashes == block_hashes(prompt, load["cached_prefix_blocks"]["block_chars"])[:len(hashes)]
    assert len(hashes) == (len(prompt) - 1) // load["cached_prefix_blocks"]["block_chars"]
    # the router merges the report into its prefix tree and sends an extension of the prompt there
    state = RouterState(PolicyConfig(min_prefix_chars=16))
    state.update_stats("replica-a", dict(load, seq=1))
    matches = state.tree.match(prompt + " and a follow-up question", ["replica-a", "replica-b"])
    assert matches == {"replica-a": len(hashes) * 16}
    choice = choose({"replica-a": 0, "replica-b": 0}, matches, state.cfg, order=["replica-b", "replica-a"])
    assert (choice.decision, choice.ranked[0]) == (PREFIX_HIT, "replica-a")
    assert not state.tree.match("another user's prompt, unrelated to the first", ["replica-a"])


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                                     {"Authorization": f"Basic {KEY}"}], ids=["none", "wrong", "no-scheme", "basic"])
def test_routes_need_the_api_key(server, headers):
    body = {"prompt": "hello", "max_tokens": 2}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    answers = [httpx.post(server.url + "/v1/completions", json=body, headers=headers),
               httpx.post(server.url + "/v1/completions", json=dict(body, stream=True), headers=headers),
               httpx.post(server.url + "/v1/chat/completions", json=chat, headers=headers),
               httpx.get(server.url + "/v1/models", headers=headers),
               httpx.get(server.url + "/v1/replayssm/load", headers=headers),
               httpx.get(server.url + "/v1/replayssm/info", headers=headers),
               httpx.post(server.url + "/generate", json={"text": "hi"}, headers=headers),
               httpx.post(server.url + "/v1/tokenize", json={"prompt": "hi"}, headers=headers),
               httpx.post(server.url + "/v1/detokenize", json={"tokens": [97]}, headers=headers),
               httpx.post(server.url + "/flush_cache", headers=headers),
               httpx.get(server.url + "/get_model_info", headers=headers),
               httpx.get(server.url + "/get_server_info", headers=headers),
               httpx.get(server.url + "/health_generate", headers=headers)]
    for r in answers:
        assert r.status_code == 401, (r.request.url, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error" and "API key" in err["message"]
        assert r.headers["www-authenticate"] == "Bearer"


def test_the_key_opens_them_and_health_metrics_stay_open(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3}, headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    with httpx.stream("POST", server.url + "/v1/chat/completions", headers=AUTH, timeout=60,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}) as s:
        assert s.status_code == 200 and "data: [DONE]" in s.read().decode()
    assert httpx.get(server.url + "/v1/models", headers={"authorization": f"bearer {KEY}"}).status_code == 200
    r = httpx.post(server.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                   headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 2
    assert httpx.post(server.url + "/v1/tokenize", json={"prompt": "hi"}, headers=AUTH).json()["count"] == 3
    assert httpx.get(server.url + "/health_generate", headers=AUTH, timeout=30).status_code == 200
    assert httpx.get(server.url + "/health").text == "ok"
    metrics = httpx.get(server.url + "/metrics")
    assert metrics.status_code == 200 and "sglang:num_requests_total" in metrics.text


def test_a_ray_replica_sends_its_engines_key(server):
    """The replica class the router deploys for a keyed engine (scheduler/auth.py), its own HTTP client
    against this keyed engine; the plain replica's client is refused. (Built without Serve: only its
    engine handle and client are used.)"""
    import asyncio

    from sglang_replayssm.scheduler.auth import KeyedEngineReplica
    from sglang_replayssm.scheduler.engine_process import EngineProcess
    from sglang_replayssm.scheduler.replica import EngineReplica

    async def load_status(cls):
        replica = cls.__new__(cls)
        replica.engine = EngineProcess("native", ["--device", "cpu", "--api-key", KEY])
        replica.engine.port = server.port
        replica._client = None
        try:
            return (await replica._http().get("/v1/replayssm/load")).status_code
        finally:
            await replica._http().aclose()

    assert asyncio.run(load_status(KeyedEngineReplica)) == 200
    assert asyncio.run(load_status(EngineReplica)) == 401


@pytest.mark.parametrize("key", ["", " padded ", "tab\tkey"])
def test_unusable_api_key_is_a_flag_error(key, capsys):
    with pytest.raises(SystemExit) as e:
        launch.main(["--engine", "native", "--api-key", key])
    assert e.value.code == 2 and "--api-key: " in capsys.readouterr().err


def test_served_model_name(server):
    """--served-model-name: the name /v1/models lists and requests may use; any other is a 404."""
    assert [m["id"] for m in httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"]] == [SERVED]
    body = {"prompt": "hi", "max_tokens": 2}
    assert httpx.post(server.url + "/v1/completions", json=dict(body, model=SERVED), headers=AUTH,
                      timeout=60).status_code == 200
    r = httpx.post(server.url + "/v1/completions", json=dict(body, model="replayssm-embedded-mamba2"), headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    assert httpx.get(server.url + "/get_model_info", headers=AUTH).json()["served_model_name"] == SERVED


@pytest.mark.parametrize("headers,status,param", [
    ({"Host": "rebound.example:30000"}, 421, "host"),
    ({"Origin": "http://evil.example"}, 403, "origin"),
    ({"Origin": "null"}, 403, "origin"),
    ({"Content-Type": "text/plain;charset=UTF-8"}, 415, "content-type"),
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "content-type"),
])
def test_what_a_browser_page_may_send_is_refused(server, headers, status, param):
    body = json.dumps({"prompt": "hi", "max_tokens": 2})
    for path in ("/v1/completions", "/generate"):
        r = httpx.post(server.url + path, content=body, headers=AUTH | headers, timeout=30)
        assert r.status_code == status, r.text
        assert r.json()["error"]["param"] == param
    if param == "host":   # reads too: a rebound page cannot read the load report or the metrics
        for path in ("/v1/replayssm/load", "/metrics"):
            assert httpx.get(server.url + path, headers=AUTH | headers, timeout=30).status_code == 421


def test_same_origin_and_loopback_names_pass_and_docs_are_off(server):
    port = server.url.rsplit(":", 1)[1]
    body = {"prompt": "hi", "max_tokens": 2}
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60,
                       headers=AUTH | {"Host": host, "Origin": f"http://{host}"})
        assert r.status_code == 200, r.text
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(server.url + path, headers=AUTH, timeout=30).status_code == 404


def test_enable_docs_serves_them():
    from sglang_replayssm.native.engine import EngineArgs
    from sglang_replayssm.native.engine_client import EngineClient
    from sglang_replayssm.native.server import create_app

    client = EngineClient(EngineArgs())   # not started: only the app's routes are looked at
    try:
        paths = {getattr(r, "path", None) for r in create_app(client, enable_docs=True).routes}
        assert {"/docs", "/openapi.json"} <= paths
        assert not {"/docs", "/openapi.json"} & {getattr(r, "path", None) for r in create_app(client).routes}
    finally:
        asyncio.run(client.close())
