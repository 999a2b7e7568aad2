"""EAGLE3 draft heads on the real server: tiny heads in the format SGLang 0.5.23 loads (``LlamaForCausalLMEagle3``,
``tiny_checkpoints.write_eagle3_head``: its own embedding and reduced draft vocabulary, ``d2t`` / ``t2d``) served
with ``--speculative-algorithm EAGLE3`` through SGLang's own EAGLE worker, our plugin on (window 4):

* Qwen3-Next, the head reading the target's aux hidden states (layers 1-3, SGLang's ``set_eagle3_layers_to_capture``):
  draft trees (top-3, 3 steps, 6 draft tokens), and chains (top-1, 3 steps) with SGLang's GPU defaults (the overlap
  scheduler, i.e. its spec-v2 EAGLE worker, and ``extra_buffer``);
* Nemotron-H, the head reading the target's final hidden state (``eagle_config.use_aux_hidden_state: false``: SGLang
  0.5.23's ``NemotronHForCausalLM`` captures no aux hidden states, and the launcher refuses a head that needs them,
  tests/sglang_plugin/test_draft_support.py): draft trees (top-2, 3 steps, 6 draft tokens).

Each server's greedy tokens equal transformers' (alone and batched) and the no-draft stock answer (when the stock
server ran in this session), the verify rows commit by pointer moves (``replayssm:accepted_records_total`` /
``rollbacks_total``) and, for trees, the plugin's verify received non-chain tree parents. The heads' weights are built
so that they draft the target's own greedy continuation of one prompt (``conftest.eagle3_heads``): on that prompt the
target accepts whole draft paths (accepted tokens per verify > 2 on average, verifies that accept every draft, tree
commits along paths that are not the drafts' first nodes in order), counted exactly in ``/metrics``
(metrics pushed every step); on the other prompts the drafts are mostly rejected, as a random head's."""

from __future__ import annotations

from . import checks
from .conftest import CONFIGS, EAGLE3_FOLLOW_PROMPT, EAGLE3_FOLLOW_TOKENS, PROMPTS, prompt_ids


def _flag(name: str, flag: str) -> int:
    argv = CONFIGS[name][2]
    return int(argv[argv.index(flag) + 1])


def _greedy_and_commits(s, batched: bool = True) -> None:
    """Greedy tokens (transformers', and the no-draft stock answer) of every prompt alone and in one batch, or (CI
    time) of one prompt alone; commits and rollbacks counted."""
    before = checks.replayssm_counters(s)
    if batched:
        prompts, solo = PROMPTS, checks.greedy_equals_transformers(s)
    else:
        prompts, solo = PROMPTS[1:2], [s.generate(prompt_ids(s, PROMPTS[1]))["output_ids"]]
        why = checks._agrees_with_transformers(s, prompt_ids(s, PROMPTS[1]), solo[0])
        assert why is None, f"{s.name}: {PROMPTS[1]!r}: {why}"
    after = checks.replayssm_counters(s)
    assert after["replayssm:accepted_records_total"] > before["replayssm:accepted_records_total"], after
    assert after["replayssm:rollbacks_total"] > before["replayssm:rollbacks_total"], after
    for p, got in zip(prompts, solo):
        stock = checks.STOCK.get(s.family, {}).get(p)   # the no-draft answer, when the stock server ran this session
        if stock is not None:
            why = checks.same_greedy(s, prompt_ids(s, p), got, stock["output_ids"])
            assert why is None, f"{s.name}: {p!r}: differs from the no-draft answer: {why}"


def _trees_reached_the_plugin(s) -> list[str]:
    log = s.log_path.read_text(errors="replace").splitlines()
    trees = [ln for ln in log if "cpu-harness: tree verify:" in ln]
    assert trees, f"{s.name}: no verify with a draft tree reached the plugin"
    print(f"\n{s.name}: {len(trees)} tree verifies, e.g. {trees[-1]}")
    return [ln for ln in log if "cpu-harness: tree commit:" in ln]


def _forced_acceptance(s, follow: list[int]) -> dict:
    """The prompt the head was built for: the served answer is the target's greedy continuation the head drafts,
    whole draft paths are accepted, and the request's metric deltas count its verify rows exactly."""
    steps, drafts = _flag(s.name, "--speculative-num-steps"), _flag(s.name, "--speculative-num-draft-tokens")
    ids = prompt_ids(s, EAGLE3_FOLLOW_PROMPT)
    before = checks.replayssm_counters(s)
    r = s.generate(ids, max_new_tokens=EAGLE3_FOLLOW_TOKENS)
    after = checks.replayssm_counters(s)
    assert r["output_ids"] == follow, f"{s.name}: {r['output_ids']} is not the target's greedy continuation {follow}"
    meta = r["meta_info"]
    verifies, produced = meta["spec_verify_ct"], meta["completion_tokens"] - 1   # the first token comes from prefill
    hist = meta["spec_correct_drafts_histogram"]   # verifies by the number of drafts they accepted (0..steps)
    d = {k: after[k] - before[k] for k in after}
    print(f"\n{s.name}: {verifies} verifies for {produced} tokens ({produced / verifies:.2f} per verify), "
          f"accepted drafts histogram {hist}, metric deltas {d}")
    assert produced / verifies > 2, meta
    assert len(hist) == steps + 1 and hist[steps] > 0, meta   # verifies that accepted every draft
    # every verify row counted once; the last verify may accept past max_new_tokens (SGLang drops those tokens)
    accepted = d["replayssm:accepted_records_total"]
    assert d["replayssm:flushes_total"] + d["replayssm:nonflush_steps_total"] == verifies, d
    assert produced <= accepted <= produced + steps, d
    assert d["replayssm:rollbacks_total"] == verifies * drafts - accepted, d
    return meta


def test_qwen3_next_eagle3_tree_drafts_equal_greedy_and_commit_by_pointer(servers, eagle3_heads):
    s = servers.get("gdn-eagle3-tree")
    checks.server_args_say(s, speculative_algorithm="EAGLE3", speculative_eagle_topk=3, speculative_num_steps=3,
                           speculative_num_draft_tokens=6)
    checks.plugin_log_says(s, "(gdn, 2 layers, window 4")
    _greedy_and_commits(s)
    _trees_reached_the_plugin(s)


def test_qwen3_next_eagle3_tree_commits_long_accepted_paths(servers, eagle3_heads):
    s = servers.get("gdn-eagle3-tree")
    _forced_acceptance(s, eagle3_heads["qwen3_next"])
    commits = _trees_reached_the_plugin(s)
    long_paths = [ln for ln in commits if int(ln.split("tree commit: ")[1].split()[0]) >= 3]
    assert long_paths, f"{s.name}: no tree path of 3 or more records committed: {commits[-5:]}"
    print(f"{s.name}: {len(long_paths)} commits of 3+ records along tree paths, e.g. {long_paths[-1]}")


def test_qwen3_next_eagle3_chain_with_the_overlap_scheduler_and_extra_buffer(servers, eagle3_heads):
    """EAGLE3 chains (top-1) with SGLang's GPU defaults: the overlap scheduler (its spec-v2 EAGLE worker) and the radix
    cache's default strategy (with the plugin extra_buffer_lazy); the forced prompt accepts whole chains (CI time: one other prompt, unbatched)."""
    s = servers.get("gdn-eagle3-chain-overlap")
    checks.server_args_say(s, speculative_algorithm="EAGLE3", speculative_eagle_topk=1, disable_overlap_schedule=False,
                           mamba_radix_cache_strategy="extra_buffer_lazy")
    _greedy_and_commits(s, batched=False)
    _forced_acceptance(s, eagle3_heads["qwen3_next"])


def test_nemotron_h_eagle3_tree_final_hidden_state_head(servers, eagle3_heads):
    """Mamba-2 tree verify through a served EAGLE3 head: greedy tokens, pointer commits, long accepted tree paths."""
    s = servers.get("m2-eagle3-tree")
    checks.server_args_say(s, speculative_algorithm="EAGLE3", speculative_eagle_topk=2)
    checks.plugin_log_says(s, "(mamba2, 2 layers, window 4")
    _greedy_and_commits(s)
    _forced_acceptance(s, eagle3_heads["nemotron_h"])
    commits = _trees_reached_the_plugin(s)
    assert any(int(ln.split("tree commit: ")[1].split()[0]) >= 3 for ln in commits), commits[-5:]
