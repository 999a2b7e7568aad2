"""What every configuration of the real SGLang server is held to (the tests of one family call these)."""

from __future__ import annotations

import concurrent.futures as cf
import re
import time

import requests

from .conftest import NEW_TOKENS, PROMPTS, TRANSFORMERS5_FOLDERS, SGLangServer, metric_value, prompt_ids

# Logprobs of the tokens each configuration generated, against the stock SGLang server's logprobs for the same
# prompts (its conventional decode, measured in the same session). transformers is the oracle for tokens, not for
# logprobs: SGLang's own decode differs from transformers' full forward by up to ~0.04 nats on these models, in
# stock SGLang as much as with the plugin (its prefill matches transformers to 1e-6 for Qwen3-Next).
# Exact configurations (fp32 checkpoint and reads) must give stock's tokens, all of them, with logprobs within
# EXACT_LOGPROB_TOL. Quantized reads (fp8 / nvfp4 read copy, fp16-sr checkpoint) must give logprobs within
# QUANT_LOGPROB_TOL where their tokens agree with stock, and where they first part from stock the token they chose
# must be one of stock's top tokens there, within QUANT_LOGPROB_TOL of stock's best (a near tie that the
# quantization error may flip), never an unlikely token.
EXACT_LOGPROB_TOL = 1e-3   # fp32 rounding (measured up to 9e-5: these random-weight models have large logits)
QUANT_LOGPROB_TOL = 0.1    # fp8 e4m3 read copy (3 mantissa bits, one scale per row), fp16-sr checkpoint
NVFP4_LOGPROB_TOL = 0.5    # NVFP4 read copy: e2m1 values (1 mantissa bit), one fp8 scale per 16 elements
TOP = 8

STOCK: dict[str, dict[str, dict]] = {}   # family -> prompt -> generate answer with logprobs


def _answers(server: SGLangServer) -> dict[str, dict]:
    return {p: server.generate_logprobs(prompt_ids(server, p), top=TOP) for p in PROMPTS}


def record_stock(server: SGLangServer) -> None:
    STOCK[server.family] = _answers(server)


def logprobs_match_stock(server: SGLangServer, tol: float, exact: bool = True) -> float:
    """Max |logprob - stock logprob| over the positions where the tokens agree with stock (see above)."""
    assert server.family in STOCK, "the stock server's test of this family runs first"
    worst = 0.0
    for p, ans in _answers(server).items():
        ref = STOCK[server.family][p]
        toks, ref_toks = ans["output_ids"], ref["output_ids"]
        lps = [float(x[0]) for x in ans["meta_info"]["output_token_logprobs"]]
        ref_lps = [float(x[0]) for x in ref["meta_info"]["output_token_logprobs"]]
        agree = next((i for i, (a, b) in enumerate(zip(toks, ref_toks)) if a != b), len(toks))
        if exact:
            assert agree == len(toks), f"{server.name}: {p!r}: token {agree} differs from stock SGLang's"
        elif agree < len(toks):
            top = {int(t): float(lp) for lp, t, *_ in ref["meta_info"]["output_top_logprobs"][agree]}
            assert toks[agree] in top, f"{server.name}: {p!r}: token {agree} is not among stock's top {TOP}"
            gap = max(top.values()) - top[toks[agree]]
            assert gap <= tol, f"{server.name}: {p!r}: token {agree} is {gap:.3g} nats below stock's choice"
        worst = max([worst] + [abs(a - b) for a, b in zip(lps[:agree], ref_lps[:agree])])
    assert worst <= tol, f"{server.name}: logprobs differ from stock SGLang by {worst:.3g} > {tol}"
    print(f"\n{server.name}: max |logprob - stock SGLang's| = {worst:.3g} (tolerance {tol})")
    return worst


# transformers is the oracle for tokens. SGLang's kernels and transformers' differ by float rounding (up to
# ~3e-3 nats here), so where transformers' best token wins by less than TIE_NATS, either token is a correct
# greedy choice: the comparison accepts the server's token there and stops (the continuations part).
TIE_NATS = 0.02


def _agrees_with_transformers(server: SGLangServer, ids: list[int], got: list[int]) -> str | None:
    """None when ``got`` is transformers' greedy continuation of ``ids`` (up to a near tie), else why not."""
    import torch

    from .conftest import _hf_model

    with torch.no_grad():
        logits = _hf_model(str(server.model_dir))(torch.tensor([ids + got])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    for i, tok in enumerate(got):
        row = lp[len(ids) - 1 + i]
        best = int(row.argmax())
        if tok == best:
            continue
        gap = float(row[best] - row[tok])
        if gap < TIE_NATS:
            return None   # a near tie: both are greedy within rounding; what follows differs legitimately
        return f"token {i}: {tok} where transformers' greedy token is {best} (by {gap:.3g} nats)"
    return None


def _hf_logprobs_after(server: SGLangServer, ids: list[int], i: int, a: list[int]):
    import torch

    from .conftest import _hf_model

    with torch.no_grad():
        logits = _hf_model(str(server.model_dir))(torch.tensor([ids + a[:i]])).logits[0, -1].float()
    return torch.log_softmax(logits, dim=-1)


def same_greedy(server: SGLangServer, ids: list[int], a: list[int], b: list[int]) -> str | None:
    """None when two greedy continuations of ``ids`` are equal, or equal up to a near tie (by transformers'
    logprobs after their common prefix) where they part; else why not."""
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None:
        return None if len(a) == len(b) else f"lengths {len(a)} != {len(b)}"
    lp = _hf_logprobs_after(server, ids, i, a)
    gap = abs(float(lp[a[i]] - lp[b[i]]))
    return None if gap < TIE_NATS else f"token {i}: {a[i]} vs {b[i]} ({gap:.3g} nats apart: not a tie)"


def greedy_equals_transformers(server: SGLangServer) -> list[list[int]]:
    """Each prompt alone, then all together in one batch: transformers' greedy tokens, the batch equal to
    the solo answers. Returns the solo answers."""
    solo = []
    for p in PROMPTS:
        ids = prompt_ids(server, p)
        got = server.generate(ids)["output_ids"]
        assert len(got) == NEW_TOKENS
        why = _agrees_with_transformers(server, ids, got)
        assert why is None, f"{server.name}: {p!r}: {why}"
        solo.append(got)
    batch = server.generate([prompt_ids(server, p) for p in PROMPTS])   # one request of the batch
    for p, one, r in zip(PROMPTS, solo, batch):
        why = same_greedy(server, prompt_ids(server, p), one, r["output_ids"])
        assert why is None, f"{server.name}: {p!r}: batched answer differs from solo: {why}"
    return solo


def replayssm_counters(server: SGLangServer) -> dict[str, float]:
    text = server.metrics()
    names = ("replayssm:flushes_total", "replayssm:nonflush_steps_total", "replayssm:state_bytes_read_total",
             "replayssm:accepted_records_total", "replayssm:rollbacks_total")
    return {n: metric_value(text, n) for n in names}


def server_args_say(server: SGLangServer, **expected) -> None:
    """SGLang's resolved server arguments (the ``server_args={...}`` line it logs at start, after its own
    resolution) hold ``expected``: e.g. that the overlap scheduler really ran (SGLang turns it off by itself in
    some configurations)."""
    import ast

    log = server.log_path.read_text(errors="replace")
    line = next((ln for ln in log.splitlines() if "server_args={" in ln), "")
    assert line, f"{server.name}: SGLang logged no server_args"
    args = ast.literal_eval(line[line.index("server_args=") + len("server_args="):].strip())
    wrong = {k: args.get(k) for k, v in expected.items() if args.get(k) != v}
    assert not wrong, f"{server.name}: resolved server args {wrong}, expected {expected}"


def plugin_log_says(server: SGLangServer, *needles: str) -> None:
    """The plugin's start-up line names the pool it built (family, window, precisions, ops)."""
    log = server.log_path.read_text(errors="replace")
    line = next((ln for ln in log.splitlines() if "ReplaySSM mamba pool (" in ln), "")
    assert line, f"{server.name}: no ReplaySSM pool was built"
    for n in needles:
        assert n in line, f"{server.name}: {n!r} not in {line!r}"


def running_request_bytes(server: SGLangServer, slots_per_request: int) -> None:
    """``replayssm:running_request_bytes`` is the slot's bytes times the slots SGLang reserves per running request
    under this server's strategy; the peers' gauges are SGLang's own slot (the start-up line's "vs SGLang N
    bytes/slot") times 5 (stock: extra_buffer with overlap) and times 3 plus a record ring (SGLang's ReplaySSM:
    no_buffer)."""

    text = server.metrics()
    got = {n: metric_value(text, f"replayssm:{n}") for n in
           ("slot_bytes", "running_request_bytes", "stock_running_request_bytes",
            "sglang_replayssm_running_request_bytes")}
    log = server.log_path.read_text(errors="replace")
    theirs = int(re.search(r"vs SGLang (\d+) bytes/slot", log).group(1))
    assert got["slot_bytes"] > 0 and got["running_request_bytes"] == slots_per_request * got["slot_bytes"], got
    assert got["stock_running_request_bytes"] == 5 * theirs, (got, theirs)
    assert got["sglang_replayssm_running_request_bytes"] > 3 * theirs, (got, theirs)


def served_through_overlay(server: SGLangServer) -> None:
    """A checkpoint as users have it: the server started from the tiny folder exactly as transformers 5 saves it
    (``conftest.TRANSFORMERS5_FOLDERS``), which SGLang 0.5.23 itself cannot read; ``python -m
    sglang_replayssm.launch`` served it through an overlay folder with SGLang's config names
    (``sglang_replayssm/checkpoint_names.py``), under the user's folder name (read from the server's log)."""
    user_folder = server.model_dir
    assert user_folder.name == TRANSFORMERS5_FOLDERS[server.name], user_folder
    log = server.log_path.read_text(errors="replace")
    overlays = server.log_path.parent / "checkpoint-overlays"
    assert (f"{user_folder}: config.json uses transformers 5 names that SGLang 0.5.23 does not read; "
            f"serving it through {overlays}") in log
    # SGLang logs its server args at start (as a dict): clients see the user's folder as the model name
    assert re.search(rf"served_model_name'?(=|: )'{re.escape(str(user_folder))}'", log), "served_model_name"


def metrics_move(server: SGLangServer) -> None:
    """``/metrics`` (``--enable-metrics``): the replayssm: decode counters and SGLang's own sglang: counters move
    with traffic."""
    def sample():
        text = server.metrics()
        return {**replayssm_counters(server), "sglang:generation_tokens_total":
                metric_value(text, "sglang:generation_tokens_total")}

    before = sample()
    greedy_equals_transformers(server)
    after = sample()
    for name in ("replayssm:nonflush_steps_total", "replayssm:flushes_total", "replayssm:state_bytes_read_total",
                 "sglang:generation_tokens_total"):
        assert after[name] > before[name], (name, before[name], after[name])


def speculative_commits_by_pointer(server: SGLangServer) -> None:
    """SGLang's own speculative worker with the plugin: greedy tokens, and the verify rows committed by
    pointer moves (accepted records counted, rejected draft records rolled back)."""
    before = replayssm_counters(server)
    greedy_equals_transformers(server)
    after = replayssm_counters(server)
    assert after["replayssm:accepted_records_total"] > before["replayssm:accepted_records_total"], after
    assert after["replayssm:rollbacks_total"] > before["replayssm:rollbacks_total"], after


def concurrent_requests_equal_solo(server: SGLangServer, n: int) -> None:
    """``n`` requests at once (more than --max-running-requests: some wait for a slot), each equal to the
    same request served alone."""
    texts = [f"{PROMPTS[i % len(PROMPTS)]} {i}" for i in range(n)]
    want = {t: server.generate(prompt_ids(server, t))["output_ids"] for t in texts}
    with cf.ThreadPoolExecutor(n) as pool:
        got = dict(zip(texts, pool.map(lambda t: server.generate(prompt_ids(server, t))["output_ids"], texts)))
    bad = [t for t in texts if same_greedy(server, prompt_ids(server, t), got[t], want[t]) is not None]
    assert not bad, f"{server.name}: {len(bad)} of {n} concurrent answers differ from their solo answers: {bad}"


def wave_equals_solo(server: SGLangServer, n: int) -> None:
    """``n`` requests in one batch (prefilled together, so their rings fill in step and, with ``n`` >= the window,
    most fold once early: ``sglang_plugin/flush_stagger.py``), each equal to the same request served alone."""
    texts = [f"{PROMPTS[i % len(PROMPTS)]} wave {i}" for i in range(n)]
    ids = [prompt_ids(server, t) for t in texts]
    want = [server.generate(i)["output_ids"] for i in ids]
    batch = server.generate(ids)   # one request: the wave
    bad = [t for t, i, w, r in zip(texts, ids, want, batch) if same_greedy(server, i, r["output_ids"], w)]
    assert not bad, f"{server.name}: {len(bad)} of {n} answers of the wave differ from their solo answers: {bad}"


def _flush_cache(server: SGLangServer, wait_s: float = 10.0) -> None:
    """SGLang flushes the radix cache of an idle scheduler only, and answers "Flush cache failed." while the last
    request's batch is still being retired (which can outlast that request's HTTP answer by a step, with the overlap
    scheduler): asked again until it flushes, for at most ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        r = requests.post(server.url + "/flush_cache", timeout=60)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.status_code == 200, f"{server.name}: still not flushed after {wait_s} s: {r.status_code} {r.text}"


def multi_turn_hits_cache_and_equals_uncached(server: SGLangServer, turn1: list[int] | None = None,
                                              new_tokens: int = NEW_TOKENS, cached_tokens: int | None = None,
                                              prime_ngram: bool = False, same=None) -> None:
    """Turn 2 extends turn 1's prompt (default: ``PROMPTS[2]``) + answer (``new_tokens``): served from the radix
    cache (cached tokens reported; exactly ``cached_tokens`` when given), its answer equal to the same request on
    an empty cache, sent afterwards (so no state a turn-2 prefill tracked can be left in a reused slot), and its
    logprobs within EXACT_LOGPROB_TOL of that request's (a wrong cached state moves them before it flips a token).

    ``prime_ngram`` (NGRAM speculative decoding): turn 1 is answered once, the cache flushed (radix tree and NGRAM
    corpus), turn 1 + answer put in the NGRAM corpus by a request that shares no radix prefix with it, and turn 1
    sent again: its drafts are now accepted several at a time (asserted), so what the radix cache keeps of turn 1
    was committed from multi-token accepts. ``same``: how two greedy answers may part (default ``same_greedy``, by
    transformers' logprobs; a model transformers cannot load brings its own oracle)."""
    same = same_greedy if same is None else same
    turn1 = prompt_ids(server, PROMPTS[2]) if turn1 is None else list(turn1)
    _flush_cache(server)
    answer1 = server.generate(turn1, max_new_tokens=new_tokens)["output_ids"]
    if prime_ngram:
        _flush_cache(server)
        server.generate(prompt_ids(server, "Q:")[:1] + turn1 + answer1, max_new_tokens=2)
        again = server.generate(turn1, max_new_tokens=new_tokens)
        assert again["output_ids"] == answer1
        assert again["meta_info"].get("spec_num_correct_drafts", 0) > 0, again["meta_info"]
    turn2 = turn1 + answer1 + prompt_ids(server, "\n    return i")
    cached = server.generate_logprobs(turn2)
    _flush_cache(server)
    uncached = server.generate_logprobs(turn2)
    assert uncached["meta_info"]["cached_tokens"] == 0
    assert cached["meta_info"]["cached_tokens"] > 0, cached["meta_info"]
    if cached_tokens is not None:
        assert cached["meta_info"]["cached_tokens"] == cached_tokens, (cached_tokens, cached["meta_info"])
    why = same(server, turn2, cached["output_ids"], uncached["output_ids"])
    assert why is None, f"cached answer differs from uncached: {why}"
    toks, ref = cached["output_ids"], uncached["output_ids"]
    agree = next((i for i, (a, b) in enumerate(zip(toks, ref)) if a != b), len(toks))
    lps = [[float(x[0]) for x in r["meta_info"]["output_token_logprobs"]][:agree] for r in (cached, uncached)]
    worst = max(abs(a - b) for a, b in zip(*lps))
    assert worst <= EXACT_LOGPROB_TOL, f"{server.name}: cached logprobs differ from uncached by {worst:.3g}"


# Shared-prefix workloads (extra_buffer): the radix cache holds states at track boundaries only (multiples of
# the track grid, 64 tokens in the configurations that run these), so the shared parts are longer than that.
SYSTEM = ("You are a careful assistant. Answer briefly and precisely; when a question is unclear, say so and "
          "ask for the missing detail.\n")
FEW_SHOT = "Q: 2 + 2?\nA: 4\nQ: 3 + 5?\nA: 8\nQ: 10 - 4?\nA: 6\nQ: 7 * 3?\nA: 21\n"
SHARED_NEW_TOKENS = 8


def _workload(server: SGLangServer, fresh: bool) -> dict[str, dict]:
    """Multi-turn chat (turn 2 extends turn 1 and its answer), a fork of that conversation (two follow-ups, sent
    at once), few-shot prompts (one prefix, two questions), in that order, each request built from the answers
    before it. ``fresh``: every request alone on an empty cache (the cache flushed before each)."""
    ids = lambda t: prompt_ids(server, t)  # noqa: E731

    def gen(x):
        if fresh:
            _flush_cache(server)
        return server.generate(x, max_new_tokens=SHARED_NEW_TOKENS)

    out = {}

    def run(name, x):
        out[name] = {"ids": x, **gen(x)}
        return out[name]["output_ids"]

    turn1 = ids(SYSTEM + "User: what is the capital of France?\nAssistant:")
    turn2 = turn1 + run("turn1", turn1) + ids("\nUser: and of Spain?\nAssistant:")
    conv = turn2 + run("turn2", turn2)
    forks = {f"fork{i}": conv + ids(f"\nUser: {q}\nAssistant:") for i, q in enumerate(("why?", "spell it."))}
    with cf.ThreadPoolExecutor(1 if fresh else 2) as pool:
        for name, res in zip(forks, pool.map(gen, forks.values())):
            out[name] = {"ids": forks[name], **res}
    for i, q in enumerate(("Q: 6 + 9?\nA:", "Q: 12 / 4?\nA:")):
        run(f"few_shot{i}", ids(SYSTEM + FEW_SHOT + q))
    return out


def shared_prefix_workloads_hit_and_equal_uncached(server: SGLangServer) -> None:
    """Every request of the shared-prefix workloads, served through the radix cache, equals the same request
    alone on an empty cache; the requests after the first of each workload are served from the cache."""
    uncached = _workload(server, fresh=True)
    _flush_cache(server)
    cached = _workload(server, fresh=False)
    for name, want in uncached.items():
        assert want["meta_info"]["cached_tokens"] == 0, (name, want["meta_info"])
        got = cached[name]
        assert got["ids"] == want["ids"], f"{server.name}: {name}: an earlier cached answer differed"
        why = same_greedy(server, want["ids"], got["output_ids"], want["output_ids"])
        assert why is None, f"{server.name}: {name}: cached answer differs from uncached: {why}"
    for name in ("turn2", "fork0", "fork1", "few_shot1"):
        assert cached[name]["meta_info"]["cached_tokens"] > 0, (name, cached[name]["meta_info"])
    print(f"\n{server.name}: cached tokens " + ", ".join(
        f"{n} {cached[n]['meta_info']['cached_tokens']}/{len(cached[n]['ids'])}" for n in cached))


def aborted_streams_harm_no_one(server: SGLangServer) -> None:
    """Streams cut by their clients mid-generation: a request running beside them, and the same requests
    sent again afterwards, equal their solo answers; the server stays healthy."""
    import threading

    victim_ids = prompt_ids(server, PROMPTS[0])
    victim_solo = server.generate(victim_ids, max_new_tokens=60)["output_ids"]
    cut_ids = [prompt_ids(server, f"{PROMPTS[1]} {i}") for i in range(3)]
    solo = [server.generate(ids)["output_ids"] for ids in cut_ids]
    result = {}
    t = threading.Thread(target=lambda: result.update(v=server.generate(victim_ids, max_new_tokens=60)["output_ids"]))
    t.start()
    for ids in cut_ids:
        with requests.post(server.url + "/generate", stream=True, timeout=300, json={
                "input_ids": ids, "stream": True,
                "sampling_params": {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
        # leaving the block closes the connection: SGLang aborts the request
    t.join(300)
    assert same_greedy(server, victim_ids, result["v"], victim_solo) is None
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    for ids, one in zip(cut_ids, solo):
        assert same_greedy(server, ids, server.generate(ids)["output_ids"], one) is None


def openai_client_answers(server: SGLangServer) -> None:
    """The `openai` client: completions and chat completions, greedy, equal to /generate on the same text."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    c = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    direct = requests.post(server.url + "/generate", timeout=300, json={
        "text": PROMPTS[0], "sampling_params": {"max_new_tokens": 12, "temperature": 0}}).json()
    assert c.choices[0].text == direct["text"]
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].message.content is not None and chat.usage.completion_tokens >= 1


def bench_serving_no_failures(server: SGLangServer, tmp_path) -> None:
    """A bounded run of SGLang's own benchmark client (random token-id dataset, loopback): nothing fails."""
    import json
    import subprocess
    import sys

    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", server.url,
           "--dataset-name", "random-ids", "--num-prompts", "12", "--random-input-len", "24",
           "--random-output-len", "8", "--random-range-ratio", "0.5", "--request-rate", "inf",
           "--max-concurrency", "6", "--tokenizer", str(server.model_dir), "--output-file", str(out),
           "--disable-tqdm", "--seed", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = json.loads(out.read_text().splitlines()[-1])
    assert row["completed"] == 12, row
    assert row.get("total_output_tokens", 0) > 0, row
