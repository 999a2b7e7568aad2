"""Nothing one client sends fails another client's request or the engine (issue 17): the real native
server (default flags) with a greedy victim stream running beside each poison request; the victim
must end with exactly its solo output, the poison gets a 400 naming its field (or a correct answer),
and /health stays 200. Also the engine's own isolation: an exception in one request's admission or
sampling fails that request alone (real Engine / engine loop, the fault injected into one request)."""

import math
import threading
import time

import pytest
import zmq

from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams
from sglang_replayssm.native.engine_process import run_engine
from sglang_replayssm.native.messages import AddRequest, Ready, Shutdown, StepOutput, decode, encode

from .live_server import LiveServer, Victim, completion, stream_text, victim_body

SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1


@pytest.fixture(scope="module")
def server():
    s = LiveServer()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def solo(server):
    """The victim's output with nothing else running."""
    text, finish, done, errors = stream_text(server.url, victim_body())
    assert done and not errors and finish == "length"
    return text


def beside_victim(server, solo, *poisons):
    """Run each poison() while one victim streams; the victim must be unharmed. Returns their results."""
    victim = Victim(server.url)
    results = [poison() for poison in poisons]
    answered = time.monotonic()
    text, finish, done, errors = victim.finish()
    assert not errors and done and finish == "length", errors
    assert text == solo, "the victim's output changed"
    assert victim.ended > answered, "the victim ended before the poisons were answered: the test proves nothing"
    assert server.healthy()
    return results


def assert_400(status, body, field):
    assert status == 400, (field, status, body)
    err = body["error"]
    assert err["param"] == field and err["message"].startswith(field), err


def post(server, raw, path="/v1/completions"):
    return lambda: completion(server.url, raw, path)


# ------------------------------------------------------------------ item 1: lone surrogates
SURROGATES = [
    ("/v1/completions", '{"prompt": "abc\\ud800", "max_tokens": 4}', "prompt"),
    ("/v1/completions", '{"prompt": ["abc\\udfff"], "max_tokens": 4}', "prompt"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi \\ud800"}], "max_tokens": 4}',
     "messages"),
    ("/v1/chat/completions", '{"messages": [{"role": "us\\udc00er", "content": "hi"}], "max_tokens": 4}',
     "messages"),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}], "max_tokens": 4}',
     "messages"),
    ("/v1/completions", '{"prompt": "abc", "stop": ["\\udfff"], "max_tokens": 4}', "stop"),
]


def test_lone_surrogates_are_a_400_and_harm_no_one(server, solo):
    results = beside_victim(server, solo, *(post(server, raw, path) for path, raw, _ in SURROGATES))
    for (path, raw, field), (status, body) in zip(SURROGATES, results):
        assert_400(status, body, field)
        assert "Unicode" in body["error"]["message"]
    # a valid astral character (a surrogate *pair* in JSON) is text like any other
    status, body = completion(server.url, '{"prompt": "abc\\ud83d\\ude00", "max_tokens": 2}')
    assert status == 200 and body["usage"]["prompt_tokens"] == 1 + 3 + 4


# ------------------------------------------------------------------ item 2: seeds
BAD_SEEDS = [SEED_MAX + 1, SEED_MIN - 1, 10 ** 30, -(10 ** 30)]


def test_out_of_range_seeds_are_a_400_and_harm_no_one(server, solo):
    results = beside_victim(server, solo, *(
        post(server, {"prompt": "abc", "seed": s, "max_tokens": 4, "temperature": 1.0}) for s in BAD_SEEDS))
    for status, body in results:
        assert_400(status, body, "seed")


def test_seeds_across_the_whole_range_sample_deterministically(server, solo):
    """Seeds in [-2^63, 2^64 - 1] are accepted; a negative seed is taken mod 2^64."""
    def sample(seed):
        status, body = completion(server.url, {"prompt": "seeded", "seed": seed, "max_tokens": 12,
                                               "temperature": 1.0})
        assert status == 200, body
        return body["choices"][0]["text"]

    seeds = (SEED_MAX, SEED_MIN, -1, 12345, 2 ** 63)
    edges = dict(zip(seeds, beside_victim(server, solo, *(lambda s=s: sample(s) for s in seeds))))
    assert edges[-1] == edges[SEED_MAX] and edges[SEED_MIN] == edges[2 ** 63]
    assert sample(SEED_MAX) == edges[SEED_MAX]          # same seed, same text
    assert edges[12345] != edges[SEED_MAX]


# ------------------------------------------------------------------ item 3: sampling numbers
NON_FINITE = [
    ('{"prompt": "abc", "temperature": NaN}', "temperature"),
    ('{"prompt": "abc", "temperature": Infinity}', "temperature"),
    ('{"prompt": "abc", "top_p": NaN}', "top_p"),
    ('{"prompt": "abc", "top_p": -Infinity}', "top_p"),
    ('{"prompt": "abc", "max_tokens": NaN}', "max_tokens"),
    ('{"prompt": "abc", "max_tokens": 1e400}', "max_tokens"),
    ('{"prompt": "abc", "stop": ["x"], "presence_penalty": NaN}', "presence_penalty"),
]
TINY = [{"temperature": 1e-45}, {"temperature": 1e-38}, {"temperature": 5e-6},
        {"temperature": 1.0, "top_p": 1e-45}, {"temperature": 2.0, "top_p": 1e-300}]


def test_non_finite_numbers_are_a_400_and_harm_no_one(server, solo):
    results = beside_victim(server, solo, *(post(server, raw) for raw, _ in NON_FINITE))
    for (raw, field), (status, body) in zip(NON_FINITE, results):
        assert_400(status, body, field)


def test_tiny_temperature_or_top_p_samples_greedily_beside_the_victim(server, solo):
    """A temperature below 1e-5 is greedy; a top_p smaller than any probability keeps the top token."""
    greedy = completion(server.url, {"prompt": "tiny", "max_tokens": 24, "temperature": 0})[1]
    results = beside_victim(server, solo, *(
        post(server, {"prompt": "tiny", "max_tokens": 24, **params}) for params in TINY))
    for params, (status, body) in zip(TINY, results):
        assert status == 200, (params, body)
        assert body["choices"][0]["text"] == greedy["choices"][0]["text"], params


# ------------------------------------------------------------------ the engine's own isolation
def _engine(**kw):
    return Engine(EngineArgs(max_running_requests=4, **kw))


def test_a_failing_row_fails_alone():
    """An exception in one row's sampling (as a NaN would raise in torch.multinomial) fails that
    request only: the others, decoding in the same batch, give their solo output."""
    eng = _engine()
    params = SamplingParams(max_tokens=40)
    solo_out = eng.generate(["victim one", "victim two"], params)
    sample = eng.output.sample

    def poisoned(req, logits):
        if req.rid == "poison" and len(req.output) >= 3:
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return sample(req, logits)

    eng.output.sample = poisoned
    victims = [eng.add_request(p, params) for p in ("victim one", "victim two")]
    eng.add_request("poison prompt", SamplingParams(max_tokens=40, temperature=1.0, seed=1), rid="poison")
    events = []
    while eng.has_work():
        events += eng.step()
    errors = [e for e in events if "error" in e]
    assert [(e["rid"], e["status"]) for e in errors] == [("poison", 500)]
    assert "RuntimeError" in errors[0]["error"]
    assert [v.output for v in victims] == solo_out
    assert eng.pool.num_free == eng.pool.num_slots                    # the poison's slot came back
    assert eng.generate(["victim one"], params) == solo_out[:1]       # and the engine still serves


def test_tiny_temperature_never_reaches_the_sampler():
    eng = _engine()
    req = eng.add_request("x", SamplingParams(temperature=1e-45, top_p=1e-45))
    assert req.params.temperature == 0.0 and req.generator is None
    for bad in (dict(temperature=math.nan), dict(top_p=math.nan), dict(seed=SEED_MAX + 1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            eng.add_request("x", SamplingParams(**bad))


def test_engine_loop_survives_an_unexpected_error_in_one_request(tmp_path):
    """The real engine loop behind real zmq sockets: an `add` whose handling raises something other
    than a RequestError (here: a parameter the engine does not know) gets a 500 event and the loop
    keeps serving the request next to it."""
    ctx = zmq.Context()
    req_addr, out_addr = f"ipc://{tmp_path}/requests", f"ipc://{tmp_path}/outputs"
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    push.bind(req_addr)
    pull.bind(out_addr)
    loop = threading.Thread(target=run_engine, args=(EngineArgs(max_running_requests=2), req_addr, out_addr),
                            daemon=True)
    loop.start()
    try:
        assert pull.poll(60_000) and isinstance(decode(pull.recv()), Ready)
        params = {"max_tokens": 8, "temperature": 0.0}
        push.send(encode(AddRequest(rid="bad", prompt="x", params={**params, "bogus": 1})))
        push.send(encode(AddRequest(rid="good", prompt="hello", params=params)))
        got, deadline = {}, time.monotonic() + 60
        while "good" not in got or not got["good"][-1].get("finished"):
            assert loop.is_alive(), "the engine loop died"
            assert time.monotonic() < deadline, f"no answer: {got}"
            if pull.poll(1000):
                msg = decode(pull.recv())
                for ev in msg.events if isinstance(msg, StepOutput) else []:
                    got.setdefault(ev["rid"], []).append(ev)
        assert got["bad"][0]["status"] == 500 and "TypeError" in got["bad"][0]["error"]
        want = Engine(EngineArgs(max_running_requests=2)).generate(["hello"], SamplingParams(max_tokens=8))[0]
        assert [t for ev in got["good"] for t in ev["token_ids"]] == want
    finally:
        push.send(encode(Shutdown()))
        loop.join(30)
        push.close(0)
        pull.close(0)
        ctx.term()
    assert not loop.is_alive()
