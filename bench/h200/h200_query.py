"""Greedy tokens from a running SGLang server, for the stock-vs-plugin comparison of issue 21.

    python3 bench/h200/h200_query.py PORT OUT.json [PID]  # wait for /health (giving up when PID dies), query, write OUT.json
    python3 bench/h200/h200_query.py --compare A.json B.json

Each prompt alone, then all of them in one batched request; ``temperature 0``, 32 new tokens, EOS
ignored. ``--compare`` prints, per prompt, whether the two runs' output ids agree and where they part.
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


def query(port: int, path: str, pid: int | None = None, timeout: float = 240) -> None:
    base = f"http://127.0.0.1:{port}"
    ready = wait_healthy(base, timeout, pid)
    t = time.time()
    solo = [generate(base, p) for p in PROMPTS]
    solo_s = time.time() - t
    batch_ids, batch_text = generate(base, list(PROMPTS))
    res = {"ready_s": ready, "solo_s": solo_s, "solo_ids": [s[0][0] for s in solo],
           "solo_text": [s[1][0] for s in solo], "batch_ids": batch_ids, "batch_text": batch_text}
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
