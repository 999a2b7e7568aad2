"""Nemotron-H (Mamba-2) served by the real SGLang server on CPU: stock, and our plugin at windows 1 / 4 / 16
with the reference ops and the Triton kernels (under Triton's interpreter), an NVFP4 read copy, and NGRAM
speculative decoding. (SGLang has no ReplaySSM of its own for Mamba-2.)"""

from __future__ import annotations

from . import checks


def test_stock_sglang_equals_transformers(servers):
    s = servers.get("m2-stock")
    checks.greedy_equals_transformers(s)
    checks.record_stock(s)


def test_plugin_window4_equals_transformers_and_stock(servers):
    s = servers.get("m2-L4")
    checks.greedy_equals_transformers(s)
    checks.logprobs_match_stock(s, checks.EXACT_LOGPROB_TOL)
    assert "ReplaySSM mamba pool (mamba2" in s.log_path.read_text(errors="replace")


def test_plugin_window4_metrics_move(servers):
    s = servers.get("m2-L4")
    before = checks.replayssm_counters(s)
    checks.greedy_equals_transformers(s)
    after = checks.replayssm_counters(s)
    assert after["replayssm:nonflush_steps_total"] > before["replayssm:nonflush_steps_total"]
    assert after["replayssm:flushes_total"] > before["replayssm:flushes_total"]


def test_plugin_triton_kernels_window1_equal_transformers(servers):
    s = servers.get("m2-L1-kernels")
    checks.greedy_equals_transformers(s)
    checks.logprobs_match_stock(s, checks.EXACT_LOGPROB_TOL)


def test_plugin_window16_nvfp4_read_copy_logprobs(servers):
    checks.logprobs_match_stock(servers.get("m2-L16-nvfp4"), checks.NVFP4_LOGPROB_TOL, exact=False)


def test_plugin_ngram_speculative_equals_greedy(servers):
    s = servers.get("m2-ngram")
    checks.greedy_equals_transformers(s)
    counters = checks.replayssm_counters(s)
    assert counters["replayssm:accepted_records_total"] > 0, counters
