"""Speculative sampling (issue 17, item 15): at temperature > 0 the native engine still verifies
prompt-lookup drafts, and what it emits is distributed exactly as the target distribution.

The check: many seeded samples of the first three tokens of one prompt, with speculation (drafts are
proposed and judged at tokens 2 and 3) and without, against the exact probabilities of every
three-token continuation computed from the oracle (fresh prefills, oracle.py). The total-variation
distance of each empirical distribution must be within a bound that sampling noise stays far below
and that a wrong acceptance rule (always accepting a draft, shown here) exceeds by far."""

import itertools

import pytest
import torch

from sglang_replayssm.native import sampling
from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams

from .oracle import Oracle

PROMPT = "abcabcabcab"
BIAS = {ord("a"): 30.0, ord("b"): 30.0, ord("c"): 30.0}   # three likely tokens, the drafter's alphabet
TEMPERATURE = 1.5
N, ROUNDS = 64, 4               # 256 samples per run: N parallel samples (one prefill) x ROUNDS seeds
# total-variation bounds: over (t1, t2) sampling noise is ~0.07 here, over (t1, t2, t3) ~0.13;
# always accepting drafts gives ~0.67 on both
PAIR_BOUND, TRIPLE_BOUND = 0.15, 0.25


@pytest.fixture(scope="module")
def exact():
    """{(t1, t2, t3): probability} of the processed target distribution, from the oracle."""
    oracle = Oracle()
    prompt = oracle.tokenizer.encode(PROMPT)
    bias = torch.zeros(oracle.engine.cfg.vocab_size)
    bias[list(BIAS)] = torch.tensor(list(BIAS.values()))

    def dist(out):   # the target, written out: softmax((logits + logit_bias) / temperature)
        return torch.softmax((oracle.logits(prompt + out) + bias) / TEMPERATURE, -1)
    probs = {}
    abc = sorted(BIAS)
    for seq in itertools.product(abc, repeat=3):
        p = 1.0
        for j in range(3):
            p *= float(dist(list(seq[:j]))[seq[j]])
        probs[seq] = p
    assert abs(sum(probs.values()) - 1) < 1e-3      # the bias really confines the samples to a, b, c
    return probs


def empirical(k: int):
    e = Engine(EngineArgs(max_running_requests=N, speculative_num_draft_tokens=k, chunk_size=64, max_model_len=32))
    counts = {}
    for r in range(ROUNDS):
        params = SamplingParams(max_tokens=3, temperature=TEMPERATURE, logit_bias=BIAS, seed=1000 * r, n=N)
        req = e.add_request(PROMPT, params)
        while e.has_work():
            e.step()
        for s in req.group:
            counts[tuple(s.output)] = counts.get(tuple(s.output), 0) + 1
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}, e


def tv(emp, exact, length=3):
    """Total-variation distance of the two distributions of the first `length` tokens."""
    def marginal(d):
        out = {}
        for k, v in d.items():
            out[k[:length]] = out.get(k[:length], 0.0) + v
        return out
    emp, exact = marginal(emp), marginal(exact)
    return 0.5 * sum(abs(emp.get(k, 0.0) - exact.get(k, 0.0)) for k in set(emp) | set(exact))


def test_speculative_sampling_is_exact(exact):
    plain, e0 = empirical(0)
    spec, e3 = empirical(3)
    assert e0.counters["draft_tokens"] == 0
    # drafts were proposed, some accepted and some rejected, at temperature > 0
    assert e3.counters["verify_steps"] > 0 and 0 < e3.counters["accepted_draft_tokens"] < e3.counters["draft_tokens"]
    for emp in (plain, spec):
        assert tv(emp, exact, 2) < PAIR_BOUND and tv(emp, exact, 3) < TRIPLE_BOUND, (tv(emp, exact, 2), tv(emp, exact))


def test_a_wrong_acceptance_rule_fails_the_check(exact, monkeypatch):
    """The bound has teeth: accepting every draft (the bug speculative sampling must not have) is caught."""
    real = sampling.speculate

    def always_accept(p, logits, prompt, output, drafts, eos_ids, generator):
        return list(drafts) + [sampling.sample(p, logits[len(drafts)], prompt, list(output) + list(drafts),
                                               eos_ids, generator)]
    monkeypatch.setattr(sampling, "speculate", always_accept)
    wrong, e = empirical(3)
    assert e.counters["accepted_draft_tokens"] == e.counters["draft_tokens"] > 0
    assert tv(wrong, exact, 2) > 2 * PAIR_BOUND and tv(wrong, exact, 3) > 2 * TRIPLE_BOUND, tv(wrong, exact)
    monkeypatch.setattr(sampling, "speculate", real)


def test_speculative_sampling_is_seeded():
    """Same seed, same output, with drafts at temperature > 0 (one request alone)."""
    def run():
        e = Engine(EngineArgs(max_running_requests=1, speculative_num_draft_tokens=3, max_model_len=64))
        out = e.generate([PROMPT * 2], SamplingParams(max_tokens=24, temperature=0.7, top_k=3, seed=11))[0]
        return out, e.counters["accepted_draft_tokens"]
    (a, acc), (b, _) = run(), run()
    assert a == b and acc > 0


def test_residual_sampling_never_returns_the_rejected_draft():
    """speculate() in isolation: a rejected draft x is replaced by a sample of p without x."""
    p = SamplingParams(temperature=1.0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]] * 2)
    g = torch.Generator().manual_seed(0)
    seen = {"accepted": 0, "replaced": set()}
    for _ in range(300):
        out = sampling.speculate(p, logits, [], [], [0], set(), g)
        if len(out) == 2:
            assert out[0] == 0
            seen["accepted"] += 1
        else:
            assert out[0] != 0
            seen["replaced"].add(out[0])
    want = float(torch.softmax(logits[0], -1)[0])
    assert abs(seen["accepted"] / 300 - want) < 0.1 and seen["replaced"] == {1, 2, 3}
