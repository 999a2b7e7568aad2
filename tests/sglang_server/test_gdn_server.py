"""Qwen3-Next (Gated DeltaNet + MoE) served by the real SGLang server on CPU: stock, SGLang's own
ReplaySSM, and our plugin at windows 1 / 4 / 16 with the reference ops and the Triton kernels (under
Triton's interpreter), fp16-sr checkpoints with an fp8 read copy, and NGRAM speculative decoding. The
window-16 server runs the radix cache's extra_buffer_lazy strategy, pages of 16 and the overlap scheduler; the NGRAM
server runs SGLang's default strategy with the overlap scheduler, which the plugin resolves to extra_buffer_lazy
(track slots written at accepted-prefix boundaries by the verify commit). extra_buffer itself is served by the
Nemotron-H, Kimi Linear, TP-2, MTP and EAGLE3 servers.

SGLang's own ReplaySSM (a peer, not our code: what the H200 benchmarks compare against) runs with
``SGLANG_REPLAYSSM_PEER_TESTS=1``: its server adds ~100 s to CI's critical path."""

from __future__ import annotations

import os

import pytest

from . import checks
from .conftest import prompt_ids

TRACK_GRID = 64   # gdn-ngram's extra_buffer track grid: lcm(FLA chunk 64, page 1, --mamba-track-interval 64)


def test_stock_sglang_equals_transformers(servers):
    s = servers.get("gdn-stock")
    checks.greedy_equals_transformers(s)
    checks.record_stock(s)


@pytest.mark.skipif(os.environ.get("SGLANG_REPLAYSSM_PEER_TESTS") != "1",
                    reason="a peer's server (SGLang's own ReplaySSM), ~100 s of CI: SGLANG_REPLAYSSM_PEER_TESTS=1 runs it")
def test_sglang_own_linear_replayssm_equals_transformers(servers):
    checks.greedy_equals_transformers(servers.get("gdn-sglang-replayssm"))


def test_plugin_window16_equals_transformers(servers):
    s = servers.get("gdn-L16")
    checks.greedy_equals_transformers(s)
    checks.plugin_log_says(s, "(gdn, 2 layers, window 16, ckpt fp32, read copy none", "ops reference")
    checks.server_args_say(s, disable_overlap_schedule=False, mamba_radix_cache_strategy="extra_buffer_lazy")


def test_plugin_window16_logprobs_equal_stock(servers):
    checks.logprobs_match_stock(servers.get("gdn-L16"), checks.EXACT_LOGPROB_TOL)


def test_plugin_window16_concurrency_above_max_running(servers):
    checks.concurrent_requests_equal_solo(servers.get("gdn-L16"), n=10)


def test_plugin_window16_extra_buffer_shared_prefixes_hit_and_equal_uncached(servers):
    checks.shared_prefix_workloads_hit_and_equal_uncached(servers.get("gdn-L16"))


def test_plugin_window16_aborted_streams_harm_no_one(servers):
    checks.aborted_streams_harm_no_one(servers.get("gdn-L16"))


def test_plugin_window16_openai_client(servers):
    checks.openai_client_answers(servers.get("gdn-L16"))


def test_plugin_window16_bench_serving_no_failures(servers, tmp_path):
    checks.bench_serving_no_failures(servers.get("gdn-L16"), tmp_path)


def test_plugin_window16_metrics_move(servers):
    checks.metrics_move(servers.get("gdn-L16"))


def test_plugin_window16_multi_turn_driver_serves_history_from_the_radix_cache(servers):
    """``bench/multi_turn.py`` (the multi-turn chat rows of the serving benchmarks), 3 conversations x 3 turns, 2 at
    once, against the extra_buffer_lazy server: every turn answers in full, and from turn 2 on the history comes
    from the radix cache (at least the 64-token track point under the shared ~150-token system prompt)."""
    from bench import multi_turn

    s = servers.get("gdn-L16")
    r = multi_turn.main(["--url", s.url, "--conversations", "3", "--turns", "3", "--concurrency", "2",
                         "--system-words", "60", "--question-words", "8", "--max-tokens", "8"])
    turns, summary = r["turns"], r["summary"]
    assert len(turns) == 9 and all(t["output_tokens"] == 8 for t in turns), turns
    assert summary["output_tokens"] == 72 and summary["output_tok_s"] > 0 and summary["ttft_p99_s"] > 0, summary
    for t in turns:
        assert t["cached_tokens"] < t["prompt_tokens"], t
        if t["turn"] > 0:
            assert t["cached_tokens"] >= 64, t
    by_turn = summary["cached_share_by_turn"]
    assert by_turn[1] > 0 and by_turn[2] > 0 and 0 < summary["cached_share"] < 1, summary


def test_plugin_window16_lazy_reserves_four_slots_per_running_request(servers):
    """extra_buffer_lazy: SGLang reserves 3 + 1 track slots per running request (extra_buffer with the overlap
    scheduler: 3 + 2), which the gauges report in bytes beside stock's and SGLang's ReplaySSM's."""
    checks.running_request_bytes(servers.get("gdn-L16"), slots_per_request=4)


def test_plugin_triton_kernels_window4_equal_transformers(servers):
    """Started from the folder as transformers 5 saves it (served through an overlay of SGLang's names)."""
    s = servers.get("gdn-L4-kernels")
    checks.served_through_overlay(s)
    checks.plugin_log_says(s, "window 4", "ops kernels")
    checks.greedy_equals_transformers(s)
    checks.logprobs_match_stock(s, checks.EXACT_LOGPROB_TOL)


def test_plugin_triton_kernels_window4_wave_of_requests_equals_solo(servers):
    """A wave of 6 requests at window 4: the rows fold early (the Triton fold) to spread their flushes."""
    checks.wave_equals_solo(servers.get("gdn-L4-kernels"), n=6)


def test_plugin_window4_fp16sr_fp8_read_copy_logprobs(servers):
    """Non-flush steps read the fp8 read copy; every fourth token folds the window from the fp16-SR checkpoint
    (the exact flush): logprobs within QUANT_LOGPROB_TOL of stock's fp32 state over 20 tokens (5 windows)."""
    s = servers.get("gdn-L4-fp16sr-fp8")
    checks.plugin_log_says(s, "window 4, ckpt fp16-sr, read copy fp8")
    checks.logprobs_match_stock(s, checks.QUANT_LOGPROB_TOL, exact=False)


def test_plugin_ngram_speculative_equals_greedy_and_commits_by_pointer(servers):
    """SGLang's GPU defaults for NGRAM: the overlap scheduler on (the harness keeps it for speculative decoding on
    CPU too), the worker splicing the previous step's accepted tokens while the next batch is scheduled."""
    s = servers.get("gdn-ngram")
    checks.server_args_say(s, disable_overlap_schedule=False, speculative_algorithm="NGRAM",
                           mamba_radix_cache_strategy="extra_buffer_lazy")   # the plugin's resolution of auto
    checks.speculative_commits_by_pointer(s)


def test_plugin_ngram_extra_buffer_tracks_boundary_crossed_inside_a_verify(servers):
    """Turn 1's prompt ends 6 tokens before the track boundary (64), which its NGRAM generation crosses inside a
    verify that accepts several drafts (the NGRAM corpus primed with turn 1's answer): nothing else puts a state
    there (the prefill tracks none), so turn 2 is served from exactly the 64 tokens of the node the verify commit
    tracked, and equals the same request on an empty cache (tokens, and logprobs to 1e-3)."""
    s = servers.get("gdn-ngram")
    turn1 = prompt_ids(s, checks.SYSTEM)[: TRACK_GRID - 6]
    checks.multi_turn_hits_cache_and_equals_uncached(s, turn1=turn1, new_tokens=16, cached_tokens=TRACK_GRID,
                                                     prime_ngram=True)
