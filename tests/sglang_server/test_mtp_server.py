"""Draft trees from a real draft model: the tiny Qwen3-Next with its MTP layer (``tiny_checkpoints.add_mtp_layer``)
served with ``--speculative-algorithm NEXTN`` and EAGLE trees (``--speculative-eagle-topk 2``, 2 steps, 4 draft
tokens) through SGLang's own EAGLE worker, our plugin on (window 4): greedy tokens equal transformers' (and the
no-draft stock server's, same target weights), verify rows committed by pointer moves along the accepted tree path
(``replayssm:accepted_records_total`` / ``rollbacks_total`` move), and the ReplaySSM verify saw real draft trees
(``cpu-harness: tree verify`` lines: the harness logs every verify opened with non-chain parents). Twice: with the
overlap scheduler off, and with SGLang's GPU defaults (the overlap scheduler, i.e. its spec-v2 EAGLE worker, and
``extra_buffer``).

The MTP layer has random weights, so its drafts are rarely accepted: this checks the plumbing and exactness of tree
verification with a real draft model, not the acceptance rate."""

from __future__ import annotations

from . import checks
from .conftest import PROMPTS, prompt_ids


def test_nextn_eagle_tree_drafts_equal_greedy_and_commit_by_pointer(servers):
    _tree_drafts_equal_greedy_and_commit_by_pointer(servers.get("gdn-mtp-tree"), PROMPTS[:2])


def test_nextn_eagle_tree_drafts_with_the_overlap_scheduler_and_extra_buffer(servers):
    """SGLang's GPU defaults for MTP drafts: the overlap scheduler (its spec-v2 EAGLE worker, another code path
    than the synchronous one above) and the radix cache's default strategy, which the plugin resolves to
    extra_buffer_lazy."""
    s = servers.get("gdn-mtp-tree-overlap")
    checks.server_args_say(s, disable_overlap_schedule=False, mamba_radix_cache_strategy="extra_buffer_lazy")
    _tree_drafts_equal_greedy_and_commit_by_pointer(s, PROMPTS[:1])   # CI time: one prompt, the same checks


def _tree_drafts_equal_greedy_and_commit_by_pointer(s, prompts):
    before = checks.replayssm_counters(s)
    for p in prompts:
        ids = prompt_ids(s, p)
        got = s.generate(ids)["output_ids"]
        why = checks._agrees_with_transformers(s, ids, got)
        assert why is None, f"{s.name}: {p!r}: {why}"
        stock = checks.STOCK.get("qwen3_next", {}).get(p)   # the no-draft answer, when gdn-stock ran this session
        if stock is not None:
            why = checks.same_greedy(s, ids, got, stock["output_ids"])
            assert why is None, f"{s.name}: {p!r}: differs from the no-draft answer: {why}"
    after = checks.replayssm_counters(s)
    assert after["replayssm:accepted_records_total"] > before["replayssm:accepted_records_total"], after
    assert after["replayssm:rollbacks_total"] > before["replayssm:rollbacks_total"], after
    log = s.log_path.read_text(errors="replace")
    trees = [ln for ln in log.splitlines() if "cpu-harness: tree verify:" in ln]
    assert trees, f"{s.name}: no verify with a draft tree reached the plugin"
    print(f"\n{s.name}: {len(trees)} tree verifies, e.g. {trees[-1]}")
