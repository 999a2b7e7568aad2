"""Warm-up of the native engine before it reports ready: a few short requests through every path a
first request would take (chunked prefill, batched decode, sampling, a verify step when speculative
decoding is on), so one-time costs (allocator growth, kernel compilation, lazy imports) are paid
before the first client arrives. Afterwards the counters, the prefix cache and the throughput history
are as if nothing had run."""

from __future__ import annotations

import time

WARMUP_PROMPT = "warm up, warm up, warm up"
WARMUP_TOKENS = 4


def warm_up(engine) -> float:
    """Run the warm-up requests to completion; returns the seconds it took."""
    from .sampling import SamplingParams

    t0 = time.monotonic()
    counters = dict(engine.counters)
    room = engine.args.max_model_len                       # fit any --context-length (>= 2)
    prompts = [engine.tokenizer.encode(p)[:max(1, room // 2)] for p in (WARMUP_PROMPT, WARMUP_PROMPT[::-1])]
    n = max(1, min(WARMUP_TOKENS, room - max(map(len, prompts)) - 1))
    greedy = engine.add_request(prompts[0], SamplingParams(max_tokens=n))
    sampled = engine.add_request(prompts[1], SamplingParams(max_tokens=n, temperature=1.0, seed=0, logprobs=1))
    while engine.has_work():   # one batch: prefill, decode / verify, greedy and sampled rows, logprobs
        engine.step()
    assert greedy.output and sampled.output, "the warm-up generated nothing"
    engine.flush_cache()
    engine.step_stats.restore(counters)
    engine.cache.hits = engine.cache.hit_tokens = 0
    return time.monotonic() - t0
