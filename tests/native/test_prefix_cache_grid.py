"""The native engine's prefix cache on a grid of tokens (the SGLang plugin's extra_buffer semantics):
forks hit at the grid boundary where they branch, few-shot prompts at the last boundary of the shared
examples, multi-turn chats at the last boundary the previous answer reached (a state kept at decode),
with and without speculative decoding; and every answer equals the same request on an empty cache.
A full pool takes the entries' slots back for requests."""

import random

import pytest

from sglang_replayssm.flags import ReplaySSMOptions
from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams
from sglang_replayssm.native.prefix_cache import prefix_hash
from sglang_replayssm.http_front.prefix_hash import MAX_REPORTED_BLOCKS, block_hashes

GRID = 16
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


def engine(family="mamba2", slots=6, entries=8, k=0):
    return Engine(EngineArgs(model_path=f"embedded:{family}", max_running_requests=slots, chunk_size=32,
                             prefix_cache_entries=entries, prefix_cache_interval=GRID,
                             speculative_num_draft_tokens=k, replayssm=ReplaySSMOptions(window=4)))


def tokens(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(1, 250) for _ in range(n)]


def serve(e, prompts, params=GREEDY):
    """Each prompt alone, in turn; returns (outputs, hit tokens of each)."""
    outs, hits = [], []
    for p in prompts:
        before = e.cache.hit_tokens
        outs.append(e.generate([p], params)[0])
        hits.append(e.cache.hit_tokens - before)
    return outs, hits


def uncached(ref, prompts, params=GREEDY):
    """The same requests, each on an empty cache."""
    outs = []
    for p in prompts:
        assert ref.flush_cache()
        outs.append(ref.generate([p], params)[0])
    return outs


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_forks_and_few_shot_hit_at_shared_grid_boundaries(family):
    e, ref = engine(family), engine(family)
    shared = tokens(0, 40)                                  # forks: 40 shared tokens, 10 of their own
    forks = [shared + tokens(10 + i, 10) for i in range(3)]
    outs, hits = serve(e, forks)
    # the first fork finds nothing; the second leaves the first at token 40 and keeps the state at
    # boundary 32 (its branching point); the third starts there
    assert hits == [0, 0, 32]
    assert outs == uncached(ref, forks)
    # the load report names every entry, boundaries included, by id and by its text's chained block hashes
    load, keys = e.stats(), [list(k) for k in e.cache.entries]
    assert sorted(map(len, keys)) == [32, 48, 48, 49, 49]
    assert load["cached_prefixes"] == [prefix_hash(k) for k in keys]
    assert load["cached_prefix_blocks"]["prefixes"] == [
        block_hashes(e.tokenizer.decode(k), load["cached_prefix_blocks"]["block_chars"], MAX_REPORTED_BLOCKS)
        for k in keys]
    examples = tokens(1, 50)                                # few-shot: 50 tokens of examples, then a question
    shots = [examples + tokens(20 + i, 6) for i in range(3)]
    outs, hits = serve(e, shots)
    assert hits == [0, 48, 48]                              # the last boundary of the examples
    assert outs == uncached(ref, shots)


def test_multi_turn_hits_where_the_answer_reached():
    e, ref = engine(), engine()
    turn = tokens(2, 20)
    prompts, outs, hits = [], [], []
    for i in range(3):                                      # the next turn extends the whole previous answer
        prompts.append(turn)
        (out,), (hit,) = serve(e, [turn], SamplingParams(max_tokens=30, ignore_eos=True))
        outs.append(out)
        hits.append(hit)
        turn = turn + out + tokens(30 + i, 8)
    # the state kept at decode at the last grid boundary the previous answer reached: 20 + 29 tokens -> 48
    assert hits == [0, 48, (len(prompts[1]) + 29) // GRID * GRID]
    assert outs == uncached(ref, prompts, SamplingParams(max_tokens=30, ignore_eos=True))


def samples(e, prompt, params):
    """All n samples' outputs of one request."""
    req = e.add_request(prompt, params)
    while e.has_work():
        e.step()
    return [s.output for s in req.group]


def test_drafts_land_on_the_grid_and_n_samples_fork_a_hit():
    """With speculative decoding a verify step stops at the next grid boundary (drafts are capped there), so
    the decode states are kept as without drafts; n sampled samples start from a hit like one."""
    e, ref = engine(k=3), engine(k=3)
    first = tokens(3, 20)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    (answer,), (hit,) = serve(e, [first], params)
    assert hit == 0 and e.counters["accepted_draft_tokens"] > 0 and e.counters["verify_steps"] > 0
    assert [len(k) for k in e.cache.entries] == [16, 19, 48]   # prefill: 16, 19; decode: 32, then 48
    second = first + answer + tokens(40, 8)
    (out,), (hit,) = serve(e, [second], params)
    assert hit == 48
    sampled = SamplingParams(max_tokens=12, temperature=0.8, seed=5, n=2, ignore_eos=True)
    before = e.cache.hit_tokens
    outs = samples(e, second + out[:25], sampled)
    assert e.cache.hit_tokens - before == 80 and len({tuple(o) for o in outs}) == 2
    assert [answer, out] == uncached(ref, [first, second], params)
    assert ref.flush_cache() and outs == samples(ref, second + out[:25], sampled)


def test_a_full_pool_takes_the_entries_slots_back():
    e, ref = engine(slots=3, entries=3), engine(slots=3, entries=3)
    examples = tokens(1, 50)
    outs, hits = serve(e, [examples + tokens(20 + i, 6) for i in range(2)])
    assert hits == [0, 48] and len(e.cache) == 2 and e.pool.num_free == 1   # entries hold 2 of the 3 slots
    burst = [examples + tokens(50 + i, 12) for i in range(3)]          # 3 requests at once need every slot:
    before = e.cache.hit_tokens                                        # the entries go, least recently used first
    assert e.generate(burst, GREEDY) == ref.generate(burst, GREEDY)    # the reference: on an empty cache
    assert e.cache.hit_tokens - before == 2 * 48                       # 2 admitted before their entry went
    assert len(e.cache) == 0 and e.pool.num_free == e.pool.num_slots == e.stats()["free_slots"] == 3
