"""An OpenAI API that never lies (issue 17, items 14 and 16): every sampling parameter either works
or is a 400 naming it.

In process (the real Engine): logprobs equal the oracle's log-softmax (fresh prefills, oracle.py) on
the prefill, decode and verify paths; penalties, logit_bias, min_tokens, stop_token_ids, top_k/min_p
pick the tokens the oracle's logits say they must; n samples share one prefill and are the seeded
single samples. Over HTTP (the package's shared server, conftest.py, speculation on): completions and
chat logprobs (streamed too) equal the oracle's, n choices with summed usage, unknown models are a
404, unsupported fields a 400 naming them, SGLang's /generate, /v1/tokenize, /v1/detokenize,
/get_model_info, /get_server_info, /flush_cache, /health_generate, and the start banner, capacity
and stats lines."""

import json
import time

import httpx
import pytest
import torch

from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams

from .live_server import MODEL, SHARED_SLOTS
from .oracle import Oracle

PROMPT = "The quick brown fox, the quick brown"
TOL = 2e-4


@pytest.fixture(scope="module")
def oracle():
    return Oracle()


@pytest.fixture(scope="module")
def engine():
    return Engine(EngineArgs(max_running_requests=4, speculative_num_draft_tokens=3, max_model_len=256))


def run(engine, prompt, params):
    """(requests of all n samples, events) of one request run to completion."""
    req = engine.add_request(prompt, params)
    events = []
    while engine.has_work():
        events += engine.step()
    return req.group, events


# ------------------------------------------------------------------ in process
@pytest.mark.parametrize("params", [dict(temperature=0.0), dict(temperature=0.8, seed=5)], ids=["greedy", "sampled"])
def test_logprobs_equal_the_oracle(engine, oracle, params):
    (req,), events = run(engine, PROMPT, SamplingParams(max_tokens=12, logprobs=3, **params))
    entries = [e for ev in events for e in ev["logprobs"]]
    assert [e["id"] for e in entries] == req.output and len(req.output) == 12
    assert engine.counters["verify_steps"] > 0       # the verify path emitted some of them
    for j, e in enumerate(entries):
        want = oracle.logprobs(req.prompt + req.output[:j])
        assert abs(e["logprob"] - float(want[e["id"]])) < TOL
        top = want.topk(3)
        assert [t["id"] for t in e["top"]] == top.indices.tolist()
        assert all(abs(t["logprob"] - float(v)) < TOL for t, v in zip(e["top"], top.values))
        assert e["token"] == chr(e["id"]) and e["bytes"] == [e["id"]]


def test_penalties_and_logit_bias_follow_the_oracle(engine, oracle):
    """Greedy under repetition/frequency/presence penalties and a logit bias: each token is the argmax
    of the oracle's logits processed as SGLang/OpenAI define them (written out here)."""
    bias = {ord("e"): 3.0, ord("q"): -5.0}
    p = SamplingParams(max_tokens=10, repetition_penalty=1.3, frequency_penalty=0.7, presence_penalty=0.4,
                       logit_bias=bias)
    (req,), _ = run(engine, PROMPT, p)
    for j, tok in enumerate(req.output):
        x = oracle.logits(req.prompt + req.output[:j]).clone()
        for t, b in bias.items():
            x[t] += b
        seen = sorted(set(req.prompt + req.output[:j]))
        x[seen] = torch.where(x[seen] > 0, x[seen] / 1.3, x[seen] * 1.3)
        for t in set(req.output[:j]):
            x[t] -= 0.7 * req.output[:j].count(t) + 0.4
        assert tok == int(x.argmax()), j
    plain = engine.generate([PROMPT], SamplingParams(max_tokens=10))[0]
    assert req.output != plain                                  # the parameters changed the answer
    forced = engine.generate([PROMPT], SamplingParams(max_tokens=6, logit_bias={ord("Z"): 100.0}))[0]
    assert forced == [ord("Z")] * 6


def test_min_tokens_stop_token_ids_top_k_min_p(engine):
    greedy = engine.generate([PROMPT], SamplingParams(max_tokens=8))[0]
    stop = {"stop_token_ids": (greedy[0],), "logit_bias": {greedy[0]: 100.0}}   # a stop token made certain
    (r,), ev = run(engine, PROMPT, SamplingParams(max_tokens=8, **stop))
    assert r.output == [] and ev[-1]["finish_reason"] == "stop"
    (r,), ev = run(engine, PROMPT, SamplingParams(max_tokens=8, min_tokens=3, **stop))   # masked for 3 tokens
    assert len(r.output) == 3 and greedy[0] not in r.output and ev[-1]["finish_reason"] == "stop"
    stop_at = next(j for j, t in enumerate(greedy) if t not in greedy[:j] and j >= 2)
    (r,), ev = run(engine, PROMPT, SamplingParams(max_tokens=8, stop_token_ids=(greedy[stop_at],)))
    assert r.output == greedy[:stop_at] and ev[-1]["finish_reason"] == "stop"
    for p in (dict(top_k=1), dict(min_p=1.0)):       # only the most likely token survives: greedy
        assert engine.generate([PROMPT], SamplingParams(max_tokens=8, temperature=1.5, seed=3, **p))[0] == greedy


def test_n_samples_share_one_prefill_and_are_the_seeded_singles(engine):
    prompt_len = len(engine.tokenizer.encode(PROMPT))
    before = engine.counters["prompt_tokens"]
    group, events = run(engine, PROMPT, SamplingParams(max_tokens=10, temperature=1.0, seed=40, n=3))
    assert engine.counters["prompt_tokens"] - before <= prompt_len      # one prefill (or less: a cache hit)
    assert [s.index for s in group] == [0, 1, 2] and events[-1]["done"] and sum(e["done"] for e in events) == 1
    singles = [engine.generate([PROMPT], SamplingParams(max_tokens=10, temperature=1.0, seed=40 + i))[0]
               for i in range(3)]
    assert [s.output for s in group] == singles and len({tuple(s) for s in singles}) == 3
    assert engine.pool.num_free + len(engine.cache) == engine.pool.num_slots
    with pytest.raises(ValueError, match="^n: "):
        engine.add_request(PROMPT, SamplingParams(n=5))      # more samples than slots


# ------------------------------------------------------------------ over HTTP
def post(server, body, path="/v1/completions"):
    r = httpx.post(server.url + path, json=body, timeout=60)
    return r.status_code, (r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text)


def sse_events(server, body, path):
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_completion_logprobs_over_http(openai_server, oracle):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 10, "temperature": 0.7, "seed": 9, "logprobs": 2}
    status, r = post(openai_server, body)
    assert status == 200, r
    (choice,) = r["choices"]
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"] and len(lp["tokens"]) == 10
    assert lp["text_offset"] == list(range(10))
    ids = oracle.tokenizer.encode(PROMPT)
    out = [ord(t) for t in lp["tokens"]]
    for j, (t, got, top) in enumerate(zip(out, lp["token_logprobs"], lp["top_logprobs"])):
        want = oracle.logprobs(ids + out[:j])
        assert abs(got - float(want[t])) < TOL
        best = want.topk(2)
        assert set(top) >= {chr(i) for i in best.indices.tolist()} and top[chr(t)] == got
    chunks = sse_events(openai_server, body, "/v1/completions")      # the same seeded answer, streamed
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert [x for c in chunks for x in c["choices"][0]["logprobs"]["token_logprobs"]] == lp["token_logprobs"]


def test_chat_logprobs_streamed_and_not(openai_server, oracle):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    body = {"messages": msgs, "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    status, r = post(openai_server, body, "/v1/chat/completions")
    assert status == 200, r
    content = r["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == r["choices"][0]["message"]["content"]
    ids = oracle.tokenizer.chat_prompt(msgs)
    out = [e["bytes"][0] for e in content]
    for j, e in enumerate(content):
        want = oracle.logprobs(ids + out[:j])
        assert abs(e["logprob"] - float(want[out[j]])) < TOL and len(e["top_logprobs"]) == 2
        assert e["top_logprobs"][0]["token"] == e["token"]          # greedy: the chosen token is the top one
    chunks = sse_events(openai_server, body, "/v1/chat/completions")
    streamed = [e for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content


def test_n_choices_over_http(openai_server):
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 77, "n": SHARED_SLOTS}
    status, r = post(openai_server, body)
    assert status == 200, r
    assert [c["index"] for c in r["choices"]] == list(range(SHARED_SLOTS))
    assert r["usage"]["completion_tokens"] == 6 * SHARED_SLOTS and r["usage"]["prompt_tokens"] == len(PROMPT) + 1
    single = post(openai_server, dict(body, n=1, seed=78))[1]["choices"][0]["text"]
    assert r["choices"][1]["text"] == single                          # sample i: seed + i
    chunks = sse_events(openai_server, dict(body, stream_options={"include_usage": True}), "/v1/completions")
    texts = {}
    for c in chunks[:-1]:
        (ch,) = c["choices"]
        texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
    assert [texts[i] for i in range(SHARED_SLOTS)] == [c["text"] for c in r["choices"]]
    assert chunks[-1]["usage"] == r["usage"]


REFUSED = [({"best_of": 2}, "best_of"), ({"suffix": "x"}, "suffix"), ({"echo": True}, "echo"),
           ({"response_format": {"type": "json_object"}}, "response_format"), ({"logit_bias": {"a": 1}}, "logit_bias"),
           ({"logit_bias": {"5": 101}}, "logit_bias"), ({"logit_bias": {"99999": 1}}, "logit_bias"),
           ({"top_k": -2}, "top_k"), ({"min_p": 1.5}, "min_p"), ({"repetition_penalty": 0}, "repetition_penalty"),
           ({"presence_penalty": 2.5}, "presence_penalty"), ({"min_tokens": 50, "max_tokens": 5}, "min_tokens"),
           ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"stop_token_ids": [10 ** 6]}, "stop_token_ids"),
           ({"logprobs": 21}, "logprobs"), ({"logprobs": True}, "logprobs"), ({"model": 5}, "model")]
CHAT_REFUSED = [({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                ({"tool_choice": "auto"}, "tool_choice"), ({"functions": [{"name": "f"}]}, "functions"),
                ({"top_logprobs": 2}, "top_logprobs"), ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
                ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages")]


def test_unsupported_or_bad_fields_are_a_400_naming_them(openai_server):
    for extra, field in REFUSED:
        status, r = post(openai_server, {"prompt": "hi", "max_tokens": 2, **extra})
        assert status == 400 and r["error"]["param"] == field and r["error"]["message"].startswith(field), (extra, r)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for extra, field in CHAT_REFUSED:
        status, r = post(openai_server, {**chat, **extra}, "/v1/chat/completions")
        assert status == 400 and r["error"]["param"] == field, (extra, r)
    # the no-op defaults are accepted
    status, r = post(openai_server, {**chat, "response_format": {"type": "text"}, "tool_choice": "none", "n": 1,
                                     "best_of": 1, "max_completion_tokens": 3, "max_tokens": None},
                     "/v1/chat/completions")
    assert status == 200 and r["usage"]["completion_tokens"] == 3, r
    status, r = post(openai_server, {"prompt": "hi", "max_completion_tokens": 4})       # completions too
    assert status == 200 and r["usage"]["completion_tokens"] == 4


def test_unknown_model_is_a_404(openai_server):
    status, r = post(openai_server, {"model": "gpt-4o", "prompt": "hi", "max_tokens": 2})
    assert status == 404 and r["error"]["param"] == "model" and "gpt-4o" in r["error"]["message"]
    assert post(openai_server, {"model": MODEL, "prompt": "hi", "max_tokens": 2})[0] == 200


def test_sglang_generate_and_tokenizer_routes(openai_server, engine):
    want = engine.generate([PROMPT], SamplingParams(max_tokens=7))[0]
    status, r = post(openai_server, {"text": PROMPT, "sampling_params": {"max_new_tokens": 7, "temperature": 0}},
                     "/generate")
    assert status == 200, r
    assert r["output_ids"] == want and r["text"] == engine.tokenizer.decode(want)
    assert r["meta_info"]["finish_reason"] == {"type": "length", "length": 7} and r["meta_info"]["completion_tokens"] == 7
    ids = engine.tokenizer.encode(PROMPT)
    status, s = post(openai_server, {"input_ids": ids, "stream": True, "return_logprob": True,
                                     "sampling_params": {"max_new_tokens": 7, "temperature": 0}}, "/generate")
    chunks = [json.loads(line[6:]) for line in s.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    assert chunks[-1]["output_ids"] == want and s.rstrip().endswith("data: [DONE]")   # cumulative, as SGLang streams
    assert [lp[1] for lp in chunks[-1]["meta_info"]["output_token_logprobs"]] == want
    for body, field in (({"text": "x", "sampling_params": {"regex": "a+"}}, "sampling_params"),
                        ({"text": "x", "sampling_params": {"max_new_tokens": 0}}, "sampling_params"),
                        ({"text": "x", "image_data": "http://x"}, "image_data"), ({"sampling_params": {}}, "text")):
        status, r = post(openai_server, body, "/generate")
        assert status == 400 and r["error"]["param"] == field, (body, r)
    assert post(openai_server, {"prompt": PROMPT}, "/v1/tokenize")[1] == {"tokens": ids, "count": len(ids),
                                                                          "max_model_len": 2048}
    assert post(openai_server, {"prompt": [PROMPT, "ab"], "add_special_tokens": False}, "/v1/tokenize")[1]["tokens"] == [
        ids[1:], [97, 98]]
    assert post(openai_server, {"tokens": want}, "/v1/detokenize")[1] == {"text": engine.tokenizer.decode(want)}
    assert post(openai_server, {"tokens": [10 ** 6]}, "/v1/detokenize")[0] == 400


def test_sglang_info_cache_and_health_routes(openai_server):
    info = httpx.get(openai_server.url + "/get_model_info").json()
    assert info["served_model_name"] == MODEL and info["is_generation"] and info["architectures"] == ["nemotron_h"]
    server_info = httpx.get(openai_server.url + "/get_server_info").json()
    assert server_info["max_running_requests"] == SHARED_SLOTS and "internal_states" in server_info
    assert httpx.get(openai_server.url + "/health_generate", timeout=30).status_code == 200
    post(openai_server, {"prompt": "a prompt long enough for the prefix cache", "max_tokens": 2})
    load = lambda: httpx.get(openai_server.url + "/v1/replayssm/load").json()  # noqa: E731
    deadline = time.monotonic() + 20
    while not load()["cached_prefixes"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert load()["cached_prefixes"]
    assert httpx.post(openai_server.url + "/flush_cache").status_code == 200
    deadline = time.monotonic() + 20
    while load()["cached_prefixes"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not load()["cached_prefixes"]
    with httpx.stream("POST", openai_server.url + "/v1/completions", timeout=60,
                      json={"prompt": "busy", "max_tokens": 400, "stream": True}) as s:
        lines = s.iter_lines()          # kept: a dropped iterator closes the stream
        assert next(lines).startswith("data: ")
        busy = httpx.get(openai_server.url + "/flush_cache")            # a request runs: refused, as SGLang does
    assert busy.status_code == 400 and "running" in busy.text


def test_info_banner_capacity_and_stats_lines(openai_server):
    info = httpx.get(openai_server.url + "/v1/replayssm/info").json()
    assert info["read_copy"] == "none" and info["ckpt_precision"] == "fp32"
    assert info["speculative_num_draft_tokens"] == 2 and "exactly" in info["speculative_decoding"]
    assert 0 < info["state_bytes_per_sequence"] < info["snapshot_state_bytes_per_sequence"]
    post(openai_server, {"prompt": "for the stats line", "max_tokens": 30})
    deadline = time.monotonic() + 10
    while "sglang-replayssm stats: #running-req" not in openai_server.output() and time.monotonic() < deadline:
        time.sleep(0.2)
    out = openai_server.output()
    assert "checkpoint fp32, read copy none" in out and "speculative decoding 2 drafts" in out
    assert f"capacity: {SHARED_SLOTS} slots; SSM state per sequence: " in out and "a conventional engine holds" in out
    assert "less memory" in out and "warm-up" in out   # with 2 drafts the snapshots a conventional engine keeps cost more
    assert "sglang-replayssm stats: #running-req" in out and "gen throughput (token/s)" in out
