"""Property-based fuzzing of the native server's HTTP layer (issue 17): random JSON bodies for
/v1/completions and /v1/chat/completions (random types for every known field, text with lone
surrogates and NUL, huge / NaN / infinite numbers, deep values, raw bytes) against the real server.
Every answer is a 2xx or a 4xx whose JSON names the problem, never a 5xx or a hang, and afterwards
the server is healthy, answers normally and logged no traceback. Bounded for CI: a fixed seed
(derandomize), 50 examples per endpoint, generation capped by the strategies."""

import json

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from .live_server import LiveServer

odd_chars = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\x00", "\ufffd", "\U0001f600", "\u202e"])
text = st.text(alphabet=st.one_of(st.characters(), odd_chars), max_size=24)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([1e-45, 5e-324, 1e-300, 1e308, -0.0, 1e-38, 0.9999999999999999]))
ints = st.one_of(st.integers(-(2 ** 70), 2 ** 70), st.integers(-3, 300),
                 st.sampled_from([2 ** 63, 2 ** 64 - 1, 2 ** 64, -(2 ** 63) - 1, 10 ** 400]))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, text)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
                      max_leaves=12)


def _cheap(v) -> bool:
    """Not a valid large token budget: every accepted request stays short."""
    return not (isinstance(v, (int, float)) and not isinstance(v, bool) and 12 < v <= 2 ** 20)


budget = st.one_of(st.integers(-2, 12), st.integers(2 ** 20 + 1, 2 ** 80), values).filter(_cheap)
part = st.fixed_dictionaries({}, optional={"type": st.one_of(st.just("text"), values), "text": st.one_of(text, values)})
message = st.fixed_dictionaries({}, optional={
    "role": st.one_of(st.sampled_from(["user", "assistant", "system"]), text, values),
    "content": st.one_of(text, st.lists(part, max_size=3), values)})
# each field: a value of any type and size, and (so that many requests get through) a plausible one
WILD = {
    "model": st.one_of(text, values),
    "max_tokens": budget,
    "temperature": st.one_of(floats, ints, values, st.floats(0, 2), st.sampled_from([0, 1e-45, 1e-6, 2])),
    "top_p": st.one_of(floats, ints, values, st.floats(1e-300, 1), st.sampled_from([1, 1e-45, 1e-320])),
    "seed": st.one_of(ints, values),
    "stop": st.one_of(text, st.lists(text, max_size=3), values),
    "n": st.one_of(ints, values),
    "stream": st.one_of(st.booleans(), values),
    "stream_options": st.one_of(st.fixed_dictionaries({}, optional={"include_usage": st.one_of(st.booleans(), values)}),
                                values),
    "ignore_eos": st.one_of(st.booleans(), values),
    "presence_penalty": st.one_of(floats, values),
    "frequency_penalty": st.one_of(floats, values),
    "logprobs": st.one_of(values, st.integers(-1, 21), st.booleans()), "echo": values, "user": values,
    "top_logprobs": st.one_of(ints, values), "top_k": st.one_of(ints, values), "min_p": st.one_of(floats, values),
    "repetition_penalty": st.one_of(floats, values), "min_tokens": st.one_of(st.integers(-2, 14), values),
    "logit_bias": st.one_of(values, st.dictionaries(st.one_of(text, st.integers(-5, 400).map(str)),
                                                   st.one_of(floats, st.integers(-150, 150)), max_size=3)),
    "stop_token_ids": st.one_of(values, st.lists(st.one_of(ints, st.integers(0, 300)), max_size=3)),
    "best_of": st.one_of(ints, values), "suffix": values, "response_format": values, "tools": values,
    "tool_choice": values,
}
PROMPT = st.one_of(text, st.lists(ints, max_size=6), st.lists(st.integers(0, 300), min_size=1, max_size=6),
                   st.lists(text, max_size=2), values)
MESSAGES = st.one_of(st.lists(message, min_size=1, max_size=3), values)
plain = st.text(st.characters(codec="utf-8"), min_size=1, max_size=24)
token_ids = st.lists(st.integers(0, 257), min_size=1, max_size=6)
valid_completion = st.fixed_dictionaries({"prompt": st.one_of(plain, token_ids), "max_tokens": st.integers(1, 12)},
                                         optional={"temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
                                                   "stream": st.booleans(), "seed": st.integers(0, 2 ** 64 - 1),
                                                   "stop": st.lists(plain, max_size=2)})
valid_chat = st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system"]), "content": plain}), min_size=1, max_size=2),
    "max_tokens": st.integers(1, 12)}, optional={"stream": st.booleans(), "temperature": st.floats(0, 2)})


def mutated(valid, fields: dict):
    """A valid body with 1-3 of its fields replaced by anything (unknown fields too)."""
    names = st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3, unique=True)
    changes = names.flatmap(lambda ns: st.fixed_dictionaries({n: fields[n] for n in ns}))
    extra = st.dictionaries(text, values, max_size=1)
    return st.tuples(valid, changes, extra).map(lambda t: {**t[2], **t[0], **t[1]})


def anything(fields: dict):
    """Every field optional and of any type."""
    return st.tuples(st.fixed_dictionaries({}, optional=fields), st.dictionaries(text, values, max_size=2)).map(
        lambda t: {**t[1], **t[0]})


completion_fields = {**WILD, "prompt": PROMPT}
chat_fields = {**WILD, "messages": MESSAGES, "max_completion_tokens": budget,
               "continue_final_message": st.one_of(st.booleans(), values)}
completion_body = st.one_of(valid_completion, mutated(valid_completion, completion_fields),
                            mutated(valid_completion, completion_fields), anything(completion_fields))
chat_body = st.one_of(valid_chat, mutated(valid_chat, chat_fields), mutated(valid_chat, chat_fields),
                      anything(chat_fields).map(lambda b: {"max_tokens": 8, **b} if _cheap(b.get("max_tokens")) else b))


def raw(bodies):
    """A body as JSON text (NaN / Infinity as Python writes them), sometimes mangled or not JSON."""
    as_json = bodies.map(lambda b: json.dumps(b).encode())
    return st.one_of(as_json, as_json, as_json, as_json.map(lambda b: b[: len(b) // 2]), st.binary(max_size=40),
                     st.sampled_from([b"[" * 50000, b'{"prompt": "' + b"\xff\xfe" + b'"}', b"null", b"{}"]))


@pytest.fixture(scope="module")
def server():
    s = LiveServer()
    yield s
    out = s.stop()
    assert "Traceback" not in out, out[-3000:]


def check_answer(url, path, body: bytes, timeout: float = 60):
    """One fuzzed body: never a 5xx; a 4xx has a message; a 200 is a whole answer (a stream ends with
    [DONE] and carries no error event). Shared with the Ray router's fuzz (tests/scheduler)."""
    r = httpx.post(url + path, content=body, headers={"content-type": "application/json"}, timeout=timeout)
    assert r.status_code < 500, (r.status_code, r.text[:500], body[:300])
    event(f"status {r.status_code}")   # --hypothesis-show-statistics: how many got through
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"], r.text
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", r.text[-300:]
        assert all("error" not in json.loads(e) for e in events[:-1]), r.text[-300:]
    else:
        assert r.json()["choices"], r.text


FUZZ = settings(max_examples=50, deadline=30_000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


@FUZZ
@given(body=raw(completion_body))
def test_fuzzed_completions_get_2xx_or_a_4xx_message(server, body):
    check_answer(server.url, "/v1/completions", body)


@FUZZ
@given(body=raw(chat_body))
def test_fuzzed_chat_completions_get_2xx_or_a_4xx_message(server, body):
    check_answer(server.url, "/v1/chat/completions", body)


def test_server_is_healthy_after_the_fuzzing(server):
    assert server.healthy()
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "after", "max_tokens": 5, "temperature": 0},
                   timeout=30)
    assert r.status_code == 200 and len(r.json()["choices"][0]["text"]) == 5
