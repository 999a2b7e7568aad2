"""bench/spec_decode.py: the drafter-on-real-text simulation and the quick run on a trained tiny model
(speculative tokens equal the greedy ones; the counters add up)."""
import json

from bench import spec_decode as sd


def test_real_text_simulation_counts():
    text = list(b"def f(x):\n    return x\n")
    pairs = [(text * 2, text * 3), (list(b"abc"), list(b"xyzxyzq"))]
    for k in (0, 1, 4):
        r = sd.real_text(pairs, k)
        # every byte of every continuation is emitted exactly once: drafts accepted + one per row-step
        assert r["accepted_draft_tokens"] + r["row_steps"] == sum(len(c) for _, c in pairs)
        assert r["accepted_draft_tokens"] <= r["draft_tokens"] and r["verify_steps"] <= r["row_steps"]
        if k == 0:
            assert r["tokens_per_row_step"] == 1.0 and r["draft_tokens"] == 0
    # a continuation that repeats the prompt: nearly every draft is right
    r = sd.real_text([(text * 2, text * 3)], 4)
    assert r["acceptance"] > 0.9 and r["tokens_per_row_step"] > 4
    # the projection: all-decode costs 1 per token; a verify step charged its measured cost
    r = {"row_steps": 10, "verify_steps": 10, "tokens_per_row_step": 2.0}
    assert abs(sd.projection(r, 4, {1: {5: 1.25}})["1"] - 1.6) < 1e-9
    assert sd.projection(r, 2, {1: {5: 1.25}}) == {}        # no measured cost for T = 3
    assert sd.distinct_ngrams([[1, 2] * 10], n=2) < 0.2 and sd.distinct_ngrams([list(range(20))], n=8) == 1.0


def test_quick_run_matches_greedy(tmp_path):
    out = tmp_path / "spec.json"
    assert sd.main(["--quick", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    (model, rows), = res["models"].items()
    assert set(rows) == {"0", "4"}
    for k, r in rows.items():
        assert r["identical_to_greedy"], k
        assert r["tokens"] == res["prompts"] * res["max_tokens"]
        # row-steps and accepted drafts account for every token after the prefill's first
        assert r["row_steps"] + r["accepted_draft_tokens"] == r["tokens"] - res["prompts"]
    assert rows["0"]["draft_tokens"] == 0 and rows["4"]["draft_tokens"] > 0
    assert 0 <= rows["4"]["acceptance"] <= 1 and rows["4"]["tokens_per_row_step"] >= 1
    assert (tmp_path / "spec.png").stat().st_size > 10_000
