"""Tensor parallelism: the real SGLang server with ``--tp 2`` on CPU (one scheduler process per TP rank, joined by
``torch.distributed`` over gloo; the CPU harness's ``dist_ops.py``), our plugin on (window 4) with NGRAM speculative
decoding and the radix cache's ``extra_buffer`` strategy (track grid 64 tokens). Each rank's ReplaySSM pool holds
its shard of the SSM heads (the tiny models' head counts divide by 2: GDN 2 key / 4 value heads, Mamba-2 4 heads
in 2 groups; the single KV head of their attention layers is replicated).

Held to: transformers' greedy tokens (alone and batched), and ``--tp 1``: stock SGLang's tokens (all equal) and
logprobs (within 1e-3), as recorded by the TP-1 stock server of the family (started here when that test did not run
in this session); the ``replayssm:`` metrics counted once per server: the sequence counts once (not once per rank),
the state bytes of both ranks' shards (the whole model's state, not one rank's half); a track boundary crossed inside
a verify serves the next turn from exactly that node, equal to the same request uncached (GDN).

CI runs the GDN server only (one TP-2 server: the CI budget); ``SGLANG_REPLAYSSM_TP_TESTS=all`` adds Mamba-2."""

from __future__ import annotations

import json
import os

import pytest

from . import checks
from .conftest import CONFIGS, PROMPTS, metric_value, prompt_ids

DRAFTS = 4   # --speculative-num-draft-tokens of the TP configurations
TRACK_GRID = 64   # gdn-tp2-ngram's extra_buffer track grid: lcm(FLA chunk 64, page 1, --mamba-track-interval 64)
ALL_ENV = "SGLANG_REPLAYSSM_TP_TESTS"
STOCK_CONFIG = {"qwen3_next": "gdn-stock", "nemotron_h": "m2-stock"}
SEQUENCE_COUNTS = ("replayssm:flushes_total", "replayssm:nonflush_steps_total", "replayssm:accepted_records_total",
                   "replayssm:rollbacks_total", "replayssm:conventional_state_bytes_total")


def _tp1_reference(servers, family: str) -> None:
    """Stock SGLang's TP-1 answers of the family (``checks.STOCK``): recorded by that family's stock test when it ran
    in this session, else by starting that server here."""
    if family not in checks.STOCK:
        checks.record_stock(servers.get(STOCK_CONFIG[family]))


def full_state_bytes(model_dir) -> int:
    """One sequence's SSM state over all SSM layers of the whole model (every head), fp32 as SGLang keeps it here."""
    cfg = json.loads((model_dir / "config.json").read_text())
    if "linear_num_value_heads" in cfg:   # Qwen3-Next (GDN)
        layers = sum(t == "linear_attention" for t in cfg["layer_types"])
        per_layer = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"] * cfg["linear_key_head_dim"]
    else:                                 # Nemotron-H (Mamba-2)
        layers = cfg["hybrid_override_pattern"].count("M")
        per_layer = cfg["mamba_num_heads"] * cfg["mamba_head_dim"] * cfg["ssm_state_size"]
    return layers * per_layer * 4


def both_ranks_built_pools(server, family: str) -> None:
    """Each TP rank's scheduler built its own ReplaySSM pool (its log line carries the rank)."""
    lines = [ln for ln in server.log_path.read_text(errors="replace").splitlines() if "ReplaySSM mamba pool (" in ln]
    for rank in ("TP0", "TP1"):
        assert any(rank in ln and f"({family}, 2 layers, window 4" in ln for ln in lines), (rank, lines)


def equals_tp1_and_transformers(servers, name: str) -> None:
    _tp1_reference(servers, CONFIGS[name][0])   # before the TP-2 server starts: one server at a time
    s = servers.get(name)
    both_ranks_built_pools(s, {"qwen3_next": "gdn", "nemotron_h": "mamba2"}[s.family])
    checks.greedy_equals_transformers(s)
    checks.logprobs_match_stock(s, checks.EXACT_LOGPROB_TOL)


def metrics_once_per_server(servers, name: str) -> None:
    """A request whose NGRAM drafts are accepted several at a time (its prompt was answered before, so the corpus
    holds its continuation): the sequence counts move once per verify row and the byte counters by the whole model's
    state, i.e. summed over both ranks' shards, counted once."""
    s = servers.get(name)
    ids = prompt_ids(s, PROMPTS[0])
    s.generate(ids)   # the NGRAM corpus holds this continuation from here on
    before = checks.replayssm_counters(s) | _counters(s)
    r = s.generate(ids)
    after = checks.replayssm_counters(s) | _counters(s)
    d = {k: after[k] - before[k] for k in after}
    meta = r["meta_info"]
    verifies, produced = meta["spec_verify_ct"], meta["completion_tokens"] - 1   # the first token comes from prefill
    assert meta["spec_num_correct_drafts"] > 0, meta   # multi-token commits happened
    print(f"\n{name}: {verifies} verify steps, {meta['spec_num_correct_drafts']} drafts accepted; deltas {d}")
    assert d["replayssm:flushes_total"] + d["replayssm:nonflush_steps_total"] == verifies, d
    assert d["replayssm:accepted_records_total"] == produced, d
    assert d["replayssm:rollbacks_total"] == verifies * DRAFTS - produced, d
    assert d["replayssm:conventional_state_bytes_total"] == 2 * full_state_bytes(s.model_dir) * verifies * DRAFTS, d
    assert d["replayssm:state_bytes_read_total"] > 0 and d["replayssm:state_bytes_written_total"] > 0, d


def _counters(server) -> dict[str, float]:
    text = server.metrics()
    return {n: metric_value(text, n) for n in SEQUENCE_COUNTS + ("replayssm:state_bytes_written_total",)}


def test_tp2_gdn_plugin_ngram_equals_tp1_and_transformers(servers):
    equals_tp1_and_transformers(servers, "gdn-tp2-ngram")


def test_tp2_gdn_plugin_metrics_counted_once_per_server(servers):
    metrics_once_per_server(servers, "gdn-tp2-ngram")


def test_tp2_gdn_plugin_extra_buffer_tracks_boundary_crossed_inside_a_verify(servers):
    """``extra_buffer`` under TP 2 (each rank tracks its shard): turn 1 ends 6 tokens before the track boundary (64),
    which its NGRAM generation crosses inside a verify accepting several drafts; turn 2 is served from exactly the
    node the verify commit tracked (64 cached tokens) and equals the same request on an empty cache."""
    s = servers.get("gdn-tp2-ngram")
    turn1 = prompt_ids(s, checks.SYSTEM)[: TRACK_GRID - 6]
    checks.multi_turn_hits_cache_and_equals_uncached(s, turn1=turn1, new_tokens=16, cached_tokens=TRACK_GRID,
                                                     prime_ngram=True)


mamba2 = pytest.mark.skipif(os.environ.get(ALL_ENV) != "all", reason=(
    f"CI runs one TP-2 server (GDN): the TP-2 Mamba-2 server adds ~3 min; {ALL_ENV}=all runs it"))


@mamba2
def test_tp2_mamba2_plugin_ngram_equals_tp1_and_transformers(servers):
    equals_tp1_and_transformers(servers, "m2-tp2-ngram")


@mamba2
def test_tp2_mamba2_plugin_metrics_counted_once_per_server(servers):
    metrics_once_per_server(servers, "m2-tp2-ngram")


def test_cpu_harness_splits_cores_over_ranks():
    """The harness's per-rank core split when SGLang's CPU engine has more TP ranks than NUMA nodes."""
    from sglang_replayssm.cpu_harness.dist_ops import split_cores

    assert split_cores([0, 1], 2) == "0|1"
    assert split_cores([1, 0], 4) == "0|1|0|1"          # fewer cores than ranks: ranks share cores round-robin
    assert split_cores(list(range(8)), 3) == "0,1,2|3,4,5|6,7"
