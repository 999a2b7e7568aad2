"""Native engine, in process: ReplaySSM decode == conventional decode == recomputation from scratch,
speculative decoding == greedy, continuous batching under a full pool, sampling and stop rules."""

import pytest
import torch

from sglang_replayssm.flags import ReplaySSMOptions
from sglang_replayssm.native.engine import Engine, EngineArgs, RequestError, SamplingParams

PROMPTS = ["Hello world, hello world, hello", "abcabcabcabcab", "The quick brown fox jumps", "zz"]
FAMILIES = ["mamba2", "gdn"]


def engine(family, slots=2, k=0, **opts):
    return Engine(EngineArgs(model_path=f"embedded:{family}", max_running_requests=slots,
                             speculative_num_draft_tokens=k, replayssm=ReplaySSMOptions(**opts), chunk_size=8))


@pytest.fixture(scope="module", params=FAMILIES)
def conventional_tokens(request):
    e = engine(request.param, decode=False)
    return request.param, e.generate(PROMPTS, SamplingParams(max_tokens=28))


def test_outputs_are_not_degenerate(conventional_tokens):
    family, outs = conventional_tokens
    assert all(len(o) == 28 for o in outs)
    assert len({tuple(o) for o in outs}) == len(outs)   # different prompts, different continuations


@pytest.mark.parametrize("window", [1, 3, 4, 16])
def test_replay_greedy_equals_conventional(conventional_tokens, window):
    family, expected = conventional_tokens
    e = engine(family, window=window)
    assert e.generate(PROMPTS, SamplingParams(max_tokens=28)) == expected
    assert e.counters["flushes"] > 0 and (window == 1 or e.counters["nonflush_steps"] > 0)
    if window > 1:  # ReplaySSM moves less state than conventional decoding would
        moved = e.counters["state_bytes_read"] + e.counters["state_bytes_written"]
        assert moved < e.counters["conventional_state_bytes"]


@pytest.mark.parametrize("opts", [dict(window=4), dict(window=16), dict(window=4, verify=False), dict(decode=False)],
                         ids=["replay-w4", "replay-w16", "snapshot-verify", "conventional"])
def test_speculative_equals_greedy(conventional_tokens, opts):
    family, expected = conventional_tokens
    e = engine(family, k=3, **opts)
    assert e.generate(PROMPTS, SamplingParams(max_tokens=28)) == expected
    assert e.counters["verify_steps"] > 0
    assert e.counters["accepted_draft_tokens"] > 0          # prompt lookup hits on repetitive text
    assert e.counters["rollbacks"] > 0                      # and some drafts were rejected
    assert e.counters["steps"] < 4 * 28 / 2                 # fewer engine steps than tokens


def test_speculation_off_at_large_batches(conventional_tokens):
    """--speculative-disable-by-batch-size N: no drafts while N or more requests decode together; below
    that the same engine verifies drafts again. Tokens stay the greedy ones either way."""
    family, expected = conventional_tokens

    def run(off):   # one prefill step each (chunk 64), then the 4 rows decode in lockstep and end together
        e = Engine(EngineArgs(model_path=f"embedded:{family}", max_running_requests=4, chunk_size=64,
                              speculative_num_draft_tokens=3, speculative_disable_by_batch_size=off))
        assert e.generate(PROMPTS, SamplingParams(max_tokens=28)) == expected
        return e
    assert run(0).counters["verify_steps"] > 0                  # drafts at batch 4 when nothing turns them off
    e = run(4)
    assert e.counters["verify_steps"] == 0 and e.counters["draft_tokens"] == 0 and e.counters["steps"] == 27
    assert e.generate(PROMPTS[:1], SamplingParams(max_tokens=28)) == expected[:1]
    assert e.counters["verify_steps"] > 0                      # a batch of 1 drafts again
    with pytest.raises(ValueError, match="--speculative-disable-by-batch-size"):
        Engine(EngineArgs(model_path=f"embedded:{family}", speculative_disable_by_batch_size=-1))


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_equals_recomputation(family):
    """Each decoded token equals the argmax of a fresh prefill of the whole sequence so far."""
    e = engine(family, slots=1, window=4)
    prompt = e.tokenizer.encode(PROMPTS[0])
    out = e.generate([prompt], SamplingParams(max_tokens=8))[0]
    for n in range(len(out)):
        fresh = engine(family, slots=1, window=4)
        assert fresh.generate([prompt + out[:n]], SamplingParams(max_tokens=1))[0] == [out[n]]


def test_full_pool_requests_wait_and_match(conventional_tokens):
    family, expected = conventional_tokens
    e = engine(family, slots=1, window=4)        # one slot for four requests
    reqs = [e.add_request(p, SamplingParams(max_tokens=28)) for p in PROMPTS]
    peak_wait = 0
    while e.has_work():
        e.step()
        assert len(e.running) <= 1
        peak_wait = max(peak_wait, len(e.waiting))
    assert peak_wait == len(PROMPTS) - 1
    assert [r.output for r in reqs] == expected
    assert e.pool.num_free == 1


def test_requests_join_between_steps():
    e = engine("mamba2", slots=4, window=4)
    solo = engine("mamba2", slots=4, window=4).generate([PROMPTS[1]], SamplingParams(max_tokens=20))[0]
    a = e.add_request(PROMPTS[0], SamplingParams(max_tokens=30))
    for _ in range(7):
        e.step()
    b = e.add_request(PROMPTS[1], SamplingParams(max_tokens=20))
    while e.has_work():
        e.step()
    assert b.output == solo and len(a.output) == 30


def test_stop_strings_and_max_tokens():
    e = engine("mamba2")
    full = e.tokenizer.decode(e.generate([PROMPTS[0]], SamplingParams(max_tokens=30))[0])
    stop = full[10:13]
    r = e.add_request(PROMPTS[0], SamplingParams(max_tokens=30, stop=(stop,)))
    events = []
    while e.has_work():
        events += [ev for ev in e.step() if ev["rid"] == r.rid]
    text = "".join(ev["text"] for ev in events)
    assert text == full[:full.index(stop)] and events[-1]["finish_reason"] == "stop"
    assert stop not in text
    r = e.generate([PROMPTS[0]], SamplingParams(max_tokens=5))[0]
    assert len(r) == 5


def test_sampling_is_seeded_and_top_p_narrows():
    e = engine("gdn")
    p = SamplingParams(max_tokens=20, temperature=1.0, seed=7)
    a, b = e.generate([PROMPTS[2]], p)[0], e.generate([PROMPTS[2]], p)[0]
    assert a == b
    c = e.generate([PROMPTS[2]], SamplingParams(max_tokens=20, temperature=1.0, seed=8))[0]
    assert c != a
    greedy = e.generate([PROMPTS[2]], SamplingParams(max_tokens=20))[0]
    tiny_p = e.generate([PROMPTS[2]], SamplingParams(max_tokens=20, temperature=1.0, top_p=1e-6, seed=3))[0]
    assert tiny_p == greedy


def test_bad_requests_are_refused():
    e = engine("mamba2")
    with pytest.raises(RequestError, match="prompt"):
        e.add_request([], SamplingParams())
    with pytest.raises(RequestError, match="vocabulary"):
        e.add_request([10 ** 6], SamplingParams())
    with pytest.raises(RequestError, match="max_tokens"):
        e.add_request("hi", SamplingParams(max_tokens=0))
    with pytest.raises(RequestError, match="context length"):
        e.add_request("x" * 5000, SamplingParams())


def test_abort_frees_the_slot():
    e = engine("mamba2", slots=1)
    r = e.add_request(PROMPTS[0], SamplingParams(max_tokens=100))
    e.step()
    assert e.pool.num_free == 0
    e.abort(r.rid)
    assert e.pool.num_free == 1 and not e.has_work()


def test_pool_state_equals_conventional_state():
    """After the same tokens, the ReplaySSM pool's materialized state equals the conventional one."""
    a, b = engine("gdn", slots=1, window=5), engine("gdn", slots=1, decode=False)
    ra = a.add_request(PROMPTS[0], SamplingParams(max_tokens=50))
    rb = b.add_request(PROMPTS[0], SamplingParams(max_tokens=50))
    for _ in range(8):
        a.step(), b.step()
    assert ra.output == rb.output
    for layer in range(a.pool.num_layers):
        torch.testing.assert_close(a.pool.materialize(layer, [ra.slot]), b.pool.materialize(layer, [rb.slot]),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_prefix_cache_hit_equals_fresh_prefill(family):
    base, longer = "Once upon a time, far away", "Once upon a time, far away, there lived"
    plain = engine(family, slots=3, window=4)
    want = plain.generate([base, longer], SamplingParams(max_tokens=12))
    e = Engine(EngineArgs(model_path=f"embedded:{family}", max_running_requests=3, prefix_cache_entries=2,
                          replayssm=ReplaySSMOptions(window=4), chunk_size=8))
    assert e.generate([base], SamplingParams(max_tokens=12))[0] == want[0]
    assert len(e.stats()["cached_prefixes"]) == 1 and e.stats()["free_slots"] == 3
    before = e.counters["prompt_tokens"]
    assert e.generate([longer], SamplingParams(max_tokens=12))[0] == want[1]
    assert e.cache.hits == 1
    n_base = len(e.tokenizer.encode(base)) - 1
    assert e.counters["prompt_tokens"] - before == len(e.tokenizer.encode(longer)) - n_base


def test_prefix_cache_yields_slots_to_requests():
    e = Engine(EngineArgs(model_path="embedded:mamba2", max_running_requests=2, prefix_cache_entries=2,
                          replayssm=ReplaySSMOptions(window=4)))
    e.generate(["a long enough prompt to cache"], SamplingParams(max_tokens=4))
    assert len(e.cache) == 1 and e.pool.num_free == 1
    outs = e.generate(PROMPTS[:3], SamplingParams(max_tokens=6))       # needs both slots: evicts
    assert len(e.cache) <= 1 and all(len(o) == 6 for o in outs)
    assert outs == engine("mamba2", slots=2, window=4).generate(PROMPTS[:3], SamplingParams(max_tokens=6))
