"""The real server (`python -m sglang_replayssm.launch`, a subprocess on 127.0.0.1 and a free port)
answered by the real `openai` client; errors, concurrency beyond the pool, /metrics."""

import concurrent.futures as cf
import json
import time
import urllib.error
import urllib.request

import pytest

from sglang_replayssm.flags import ReplaySSMOptions
from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams

openai = pytest.importorskip("openai")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from .live_server import MODEL, SHARED_K as K, SHARED_SLOTS as SLOTS, SHARED_WINDOW as WINDOW  # noqa: E402


def wait_for(fn, timeout=20.0):
    """Poll fn() until it returns a truthy value (engine stats arrive with its next message)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def post(url, body: bytes, timeout=30):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def server(openai_server):
    """(url, process) of the package's shared server (conftest.py: SLOTS slots, K drafts, window WINDOW)."""
    return openai_server.url, openai_server.proc


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference_engine():
    return Engine(EngineArgs(max_running_requests=SLOTS, speculative_num_draft_tokens=K,
                             replayssm=ReplaySSMOptions(window=WINDOW)))


def expected_text(engine, prompt, n):
    return engine.tokenizer.decode(engine.generate([prompt], SamplingParams(max_tokens=n))[0])


def test_banner_and_models(server, client):
    url, proc = server
    models = client.models.list()
    assert [m.id for m in models.data] == ["replayssm-embedded-mamba2"]
    assert get(url + "/health")[0] == 200


def test_completion_matches_engine(client, reference_engine):
    r = client.completions.create(model=MODEL, prompt="Hello, world", max_tokens=24,
                                  temperature=0)
    assert r.choices[0].text == expected_text(reference_engine, "Hello, world", 24)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 24 and r.usage.prompt_tokens == len("Hello, world") + 1


def test_chat_and_streaming(client, reference_engine):
    msgs = [{"role": "user", "content": "Say something"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0)
    text = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant" and len(text) == 16
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"
    stream = client.completions.create(model=MODEL, prompt="abcabcabc", max_tokens=20, temperature=0, stream=True)
    parts = list(stream)
    assert "".join(p.choices[0].text for p in parts) == expected_text(reference_engine, "abcabcabc", 20)
    assert parts[-1].choices[0].finish_reason == "length"


def test_stream_ends_with_done(server):
    body = json.dumps({"prompt": "xyz", "max_tokens": 5, "stream": True, "temperature": 0}).encode()
    status, text = post(server[0] + "/v1/completions", body)
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


def test_stop_string(client, reference_engine):
    full = expected_text(reference_engine, "The sky", 30)
    stop = full[12:15]
    r = client.completions.create(model=MODEL, prompt="The sky", max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].text == full[:full.index(stop)] and r.choices[0].finish_reason == "stop"


def test_concurrent_requests_beyond_pool(server, client, reference_engine):
    prompts = [f"request number {i} " * 2 for i in range(4 * SLOTS)]
    want = {p: expected_text(reference_engine, p, 12) for p in prompts}
    seen_waiting = []

    def one(p):
        return p, client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0).choices[0].text

    with cf.ThreadPoolExecutor(len(prompts) + 1) as ex:
        futs = [ex.submit(one, p) for p in prompts]
        while not all(f.done() for f in futs):
            load = json.loads(get(server[0] + "/v1/replayssm/load")[1])
            seen_waiting.append(load["waiting"])
            assert load["running"] <= SLOTS and load["total_slots"] == SLOTS
            time.sleep(0.05)
        got = dict(f.result() for f in futs)
    assert got == want
    assert max(seen_waiting) > 0     # the pool was full and requests queued
    load = wait_for(lambda: (lambda d: d if d["running"] == 0 and d["waiting"] == 0 else None)(
        json.loads(get(server[0] + "/v1/replayssm/load")[1])))
    assert load == {"running": 0, "waiting": 0, "free_slots": SLOTS, "total_slots": SLOTS,
                    "batch_size": load["batch_size"], "cached_prefixes": load["cached_prefixes"],
                    "cached_prefix_blocks": load["cached_prefix_blocks"]}


def test_load_reports_cached_prefixes(server, client):
    client.completions.create(model=MODEL, prompt="a prompt long enough for the prefix cache", max_tokens=2)
    load = wait_for(lambda: (lambda d: d if d["cached_prefixes"] else None)(
        json.loads(get(server[0] + "/v1/replayssm/load")[1])))
    assert load and len(load["cached_prefixes"]) == 1
    assert all(len(h) == 12 and int(h, 16) >= 0 for h in load["cached_prefixes"])
    # the same entry as the chained block hashes the Ray router's prefix tree is keyed by (never as text):
    # the hashes of the prompt's leading blocks
    from sglang_replayssm.http_front.prefix_hash import block_hashes

    blocks = load["cached_prefix_blocks"]
    (hashes,) = blocks["prefixes"]
    assert hashes and hashes == block_hashes("a prompt long enough for the prefix cache", blocks["block_chars"])[:len(hashes)]


def test_chat_continue_final_message_resumes_exactly(client):
    """A chat answer cut after a few tokens and resent as a final assistant message with
    continue_final_message continues exactly where the greedy answer went (the Ray router's resume)."""
    msgs = [{"role": "user", "content": "tell me something"}]
    full = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0).choices[0].message.content
    head = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, temperature=0).choices[0].message.content
    assert full.startswith(head) and len(head) < len(full)
    rest = client.chat.completions.create(
        model=MODEL, messages=msgs + [{"role": "assistant", "content": head}], max_tokens=7, temperature=0,
        extra_body={"continue_final_message": True}).choices[0].message.content
    assert head + rest == full


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"prompt": "hi", "temperature": -1}).encode(), "temperature"),
    (json.dumps({"prompt": "hi", "max_tokens": 0}).encode(), "max_tokens"),
    (json.dumps({"prompt": "hi", "max_tokens": "ten"}).encode(), "max_tokens"),
    (json.dumps({"prompt": "hi", "top_p": 0}).encode(), "top_p"),
    (json.dumps({"prompt": "hi", "n": 0}).encode(), "n"),
    (json.dumps({"prompt": "hi", "n": SLOTS + 1}).encode(), "n"),
    (json.dumps({"prompt": "hi", "stop": 5}).encode(), "stop"),
    (json.dumps({"max_tokens": 5}).encode(), "prompt"),
    (json.dumps({"prompt": "x" * 3000}).encode(), "context length"),
    (json.dumps({"prompt": [10 ** 7]}).encode(), "vocabulary"),
])
def test_bad_requests_get_4xx_and_server_keeps_serving(server, client, body, fragment):
    status, text = post(server[0] + "/v1/completions", body)
    assert 400 <= status < 500
    assert fragment in json.loads(text)["error"]["message"]
    status, text = post(server[0] + "/v1/chat/completions", json.dumps({"messages": "nope"}).encode())
    assert status == 400 and "messages" in json.loads(text)["error"]["message"]
    status, text = post(server[0] + "/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "continue_final_message": True}).encode())
    assert status == 400 and "continue_final_message" in json.loads(text)["error"]["message"]
    r = client.completions.create(model=MODEL, prompt="still alive", max_tokens=3, temperature=0)
    assert len(r.choices[0].text) == 3


def test_openai_client_sees_400(client):
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="hi", temperature=5)


def _metrics(url) -> dict:
    out = {}
    for fam in text_string_to_metric_families(get(url + "/metrics")[1]):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_metrics_parse_and_move(server, client):
    before = _metrics(server[0])
    for name in ("replayssm:flushes_total", "replayssm:nonflush_steps_total", "replayssm:state_bytes_read_total",
                 "replayssm:state_bytes_written_total", "replayssm:conventional_state_bytes_total",
                 "replayssm:ring_occupancy", "replayssm:accepted_records_total", "replayssm:rollbacks_total",
                 "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:prompt_tokens_total",
                 "sglang:generation_tokens_total", "sglang:time_to_first_token_seconds_count",
                 "sglang:inter_token_latency_seconds_count", "sglang:gen_throughput", "replayssm:pool_usage"):
        assert name in before, name
    every_char = "".join(chr(c) for c in range(32, 127))   # so prompt lookup always finds drafts
    client.completions.create(model=MODEL, prompt=every_char, max_tokens=20, temperature=0)
    gen = "sglang:generation_tokens_total"
    after = wait_for(lambda: (lambda m: m if m[gen] >= before[gen] + 20 else None)(_metrics(server[0])))
    assert after, "engine stats did not arrive"
    for name in ("sglang:generation_tokens_total", "sglang:prompt_tokens_total", "replayssm:flushes_total",
                 "replayssm:nonflush_steps_total", "replayssm:state_bytes_read_total",
                 "replayssm:state_bytes_written_total", "replayssm:conventional_state_bytes_total",
                 "replayssm:accepted_records_total", "sglang:time_to_first_token_seconds_count",
                 "sglang:inter_token_latency_seconds_count"):
        assert after[name] > before[name], name
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == 20
    moved = after["replayssm:state_bytes_read_total"] + after["replayssm:state_bytes_written_total"]
    assert moved < after["replayssm:conventional_state_bytes_total"]
    # a slot's bytes, as the engine's own configuration states them
    info = json.loads(get(server[0] + "/get_server_info")[1])
    assert after["replayssm:slot_bytes"] == info["state_bytes_per_sequence"] > 0


def test_disconnected_stream_frees_its_slot(server):
    body = json.dumps({"prompt": "long one", "max_tokens": 1500, "stream": True}).encode()
    req = urllib.request.Request(server[0] + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.readline()      # the stream started
    idle = lambda d: d if d["running"] == 0 and d["free_slots"] == SLOTS else None  # noqa: E731
    assert wait_for(lambda: idle(json.loads(get(server[0] + "/v1/replayssm/load")[1])), timeout=60)
