"""Greedy tokens from a running SGLang server, for the stock-vs-plugin comparison of issue 21.

    python3 bench/h200/h200_query.py PORT OUT.json [PID]  # wait for /health (giving up when PID dies), query, write OUT.json
    python3 bench/h200/h200_query.py --compare A.json B.json

Each prompt alone, then all of them in one batched request; ``temperature 0``, 32 new tokens, EOS
ignored. ``--compare`` prints, per prompt, whether the two runs' output ids agree and where they part.

Logprobs (issue 29: correctness judged by logits, not by greedy equality of near-tied random models):
``LOGPROB_PROMPTS`` fixed prompts of ``LOGPROB_LEN`` ids, in one batched request, 48 greedy tokens each,
with the top-5 logprobs of every prompt position (teacher-forced: the prefill) and of every output
position (the decode). ``logprob_delta`` compares two servers: the largest |difference| of the logprobs
of the tokens both list in a position's top 5, over the prefill positions and over the decode positions
before the first differing output token (after it the two runs no longer see the same text).
"""

from __future__ import annotations

import json
import os
import sys
import time

import requests

PROMPTS = ("The quick brown fox", "Once upon a time there was", "def main(argv):\n    for i in range(",
           "What is the capital of France? The capital of France is")
PARAMS = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}


def wait_healthy(base: str, timeout: float, pid: int | None = None) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pid is not None and not os.path.exists(f"/proc/{pid}"):
            raise RuntimeError(f"server process {pid} exited before it was healthy")
        try:
            if requests.get(base + "/health", timeout=2).status_code == 200:
                return time.time() - t0
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError(f"{base} not healthy after {timeout} s")


def generate(base: str, text):
    r = requests.post(base + "/generate", json={"text": text, "sampling_params": PARAMS}, timeout=120)
    r.raise_for_status()
    out = r.json()
    outs = out if isinstance(out, list) else [out]
    return [o["output_ids"] for o in outs], [o["text"] for o in outs]


LOGPROB_PROMPTS, LOGPROB_LEN, LOGPROB_NEW = 8, 192, 48


def logprob_prompts() -> list[list[int]]:
    return [[(11 * i + 17 * j + j * j) % 500 + 3 for j in range(LOGPROB_LEN)] for i in range(LOGPROB_PROMPTS)]


def logprobs(base: str) -> dict:
    """Top-5 logprobs of the fixed prompts' positions and of their greedy outputs (one batched request)."""
    body = {"input_ids": logprob_prompts(), "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 5,
            "sampling_params": {"temperature": 0, "max_new_tokens": LOGPROB_NEW, "ignore_eos": True}}
    r = requests.post(base + "/generate", json=body, timeout=300)
    r.raise_for_status()
    out = []
    for o in r.json():
        m = o["meta_info"]
        top = lambda rows: [{str(t[1]): t[0] for t in row if t[0] is not None} for row in rows or [] if row]
        out.append({"ids": o["output_ids"], "input_top": top(m.get("input_top_logprobs")),
                    "output_top": top(m.get("output_top_logprobs"))})
    return {"prompts": out}


def _max_delta(rows_a: list[dict], rows_b: list[dict]) -> float:
    d = 0.0
    for a, b in zip(rows_a, rows_b):
        for tok in set(a) & set(b):
            d = max(d, abs(a[tok] - b[tok]))
    return d


def logprob_delta(a: dict, b: dict) -> dict:
    """Max |logprob difference| of two servers' ``logprobs`` (module docstring): prefill, decode, and how many
    decode positions were compared (the outputs' common prefix)."""
    pre = dec = 0.0
    same = 0
    for pa, pb in zip(a["prompts"], b["prompts"]):
        pre = max(pre, _max_delta(pa["input_top"], pb["input_top"]))
        n = next((j for j, (u, v) in enumerate(zip(pa["ids"], pb["ids"])) if u != v), min(len(pa["ids"]), len(pb["ids"])))
        dec = max(dec, _max_delta(pa["output_top"][:n + 1], pb["output_top"][:n + 1]))   # position n: same text
        same += n
    return {"prefill_max_abs": pre, "decode_max_abs": dec, "decode_positions_compared": same}


def query(port: int, path: str, pid: int | None = None, timeout: float = 240) -> None:
    base = f"http://127.0.0.1:{port}"
    ready = wait_healthy(base, timeout, pid)
    t = time.time()
    solo = [generate(base, p) for p in PROMPTS]
    solo_s = time.time() - t
    batch_ids, batch_text = generate(base, list(PROMPTS))
    res = {"ready_s": ready, "solo_s": solo_s, "solo_ids": [s[0][0] for s in solo],
           "solo_text": [s[1][0] for s in solo], "batch_ids": batch_ids, "batch_text": batch_text}
    try:
        res["logprobs"] = logprobs(base)
    except Exception as e:   # noqa: BLE001 -- recorded: a server that cannot return logprobs still answers
        res["logprobs_error"] = repr(e)
    json.dump(res, open(path, "w"), indent=1)
    same = sum(a == b for a, b in zip(res["solo_ids"], batch_ids))
    print(f"healthy after {ready:.0f}s; 4 solo requests {solo_s:.1f}s; batch equals solo for {same}/4;"
          f" first: {res['solo_text'][0]!r}", flush=True)


def compare(a_path: str, b_path: str) -> None:
    a, b = json.load(open(a_path)), json.load(open(b_path))
    for key in ("solo_ids", "batch_ids"):
        for i, (x, y) in enumerate(zip(a[key], b[key])):
            n = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            verdict = "EQUAL" if x == y else f"differ from token {n}"
            print(f"{key}[{i}]: {verdict} ({len(x)} tokens)")


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        query(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
