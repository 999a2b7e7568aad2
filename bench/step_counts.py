"""The per-step bookkeeping the SGLang plugin runs outside SGLang's CUDA graphs, on a GPU: a decode step's pointer
move with its metric counts, and a verify's counts before its commit, as one Triton launch each
(``kernels/step_counts.py``) against the PyTorch ops they replace (``reference.replay.advance`` / ``count_commit``,
the code the plugin ran before).

    python bench/step_counts.py --out bench/results/step_counts_h200.json

First checks the kernels against the reference on the device (cursors, folded counts, every count equal), then
times each way per call: the host's time to issue the work (what a batch-1 step waits for) and the device time
(CUDA events around 200 back-to-back calls, after a synchronize), at batch 1 and 128.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_replayssm.kernels import step_counts as kern  # noqa: E402
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry  # noqa: E402
from sglang_replayssm.reference import replay as ref  # noqa: E402

CALLS = 200


def _pool(num_slots: int) -> ReplayStatePool:
    geo = SSMGeometry(family="gdn", num_heads=4, head_v_dim=32, head_k_dim=16, num_k_heads=2)
    pool = ReplayStatePool(geo, 1, num_slots, ReplayConfig(window=16, max_drafts=4), device="cuda")
    pool.cursor.copy_(torch.randint(0, 16, pool.cursor.shape, dtype=torch.int32))
    return pool


def check(B: int) -> dict:
    a, b = _pool(B + 1), _pool(B + 1)
    b.cursor.copy_(a.cursor)
    b.folded.copy_(a.folded)
    slots = torch.arange(1, B + 1, dtype=torch.int32, device="cuda")
    ca, cb = (torch.zeros(12, dtype=torch.int64, device="cuda") for _ in range(2))
    acc = torch.randint(1, 5, (B,), dtype=torch.int32, device="cuda")
    for _ in range(20):
        ref.count_commit(a, slots, acc, 4, ca)
        kern.count_commit(b, slots, acc, 4, cb)
        ref.advance(a, slots, ca)
        kern.advance(b, slots, cb)
    torch.cuda.synchronize()
    return {"batch": B, "cursor_equal": bool(torch.equal(a.cursor, b.cursor)),
            "folded_equal": bool(torch.equal(a.folded, b.folded)), "counts_equal": bool(torch.equal(ca, cb)),
            "counts": cb.tolist()}


def _time(fn) -> dict:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(CALLS):
        fn()
    host = (time.perf_counter() - t0) / CALLS
    end.record()
    torch.cuda.synchronize()
    return {"host_us": host * 1e6, "device_us": start.elapsed_time(end) * 1e3 / CALLS}


def timings(B: int) -> dict:
    pool = _pool(B + 1)
    slots = torch.arange(1, B + 1, dtype=torch.int32, device="cuda")
    acc = torch.ones(B, dtype=torch.int32, device="cuda")
    counts = torch.zeros(12, dtype=torch.int64, device="cuda")
    return {"batch": B,
            "decode_torch": _time(lambda: ref.advance(pool, slots, counts)),
            "decode_kernel": _time(lambda: kern.advance(pool, slots, counts)),
            "commit_counts_torch": _time(lambda: ref.count_commit(pool, slots, acc, 4, counts)),
            "commit_counts_kernel": _time(lambda: kern.count_commit(pool, slots, acc, 4, counts))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench/step_counts.py needs a CUDA device")
    res = {"meta": {"command": "python bench/step_counts.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "device": torch.cuda.get_device_name(), "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "torch": torch.__version__},
           "checks": [check(B) for B in (1, 128, 300)], "timings": [timings(B) for B in (1, 128)]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    ok = all(c["cursor_equal"] and c["folded_equal"] and c["counts_equal"] for c in res["checks"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
