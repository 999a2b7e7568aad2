"""Decode attention over the per-slot KV cache (sglang_replayssm/native/attention.py) on one GPU:
the single-pass kernel (num_splits=1) against the split-KV path, with the shape heuristic's choice
(auto) and with fixed splits.

Shapes: B in --batches x {Qwen3.5-4B: 4 KV heads, 4 query heads each, head dim 256; Nemotron-Nano-4B:
8 KV heads, 4 each, head dim 128}, one query token per sequence, every row seeing all --length keys;
bf16 caches [S = B + 1, length, Hkv, D] and shuffled slots (one slot unused). Each variant is first
checked against num_splits=1 (max |error| printed; exit 1 beyond bf16 tolerance), then timed with CUDA
events: a CUDA graph of 10 calls (no launch overhead, as in serving), replayed --reps times after a
warm-up; the median per call is reported. GB/s counts the K and V bytes read (B * length * Hkv * D * 2 * 2).
The KV of the smallest shapes (67 MB at B = 64) is close to the L2 size, so those read partly from L2.

    python3 bench/attention.py [--length 512] [--out bench/results/attention.json]     # ~5 s on an H200
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sglang_replayssm.native.attention import cache_attention, default_num_splits  # noqa: E402

MODELS = {"qwen3.5-4b": (4, 4, 256), "nemotron-nano-4b": (8, 4, 128)}      # Hkv, G, D
CALLS = 10                                                                     # calls per CUDA graph


def time_calls(fn, reps: int) -> float:
    """Median ms per call of fn over reps replays of a CUDA graph of CALLS calls (eager if capture fails)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                        # warm-up (compiles) off the capture stream
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(CALLS):
                fn()
        run = graph.replay
    except RuntimeError as e:                            # pragma: no cover (timing only)
        print(f"  CUDA graph capture failed ({e}); timing eagerly")
        run = lambda: [fn() for _ in range(CALLS)]       # noqa: E731
    run()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / CALLS)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=512, help="keys per sequence (default 512)")
    ap.add_argument("--batches", default="64,256,512", help="comma-separated batch sizes")
    ap.add_argument("--splits", default="2,4,8", help="comma-separated fixed num_splits to time besides 1 and auto")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    ap.add_argument("--reps", type=int, default=5, help=f"timed graph replays ({CALLS} calls each)")
    ap.add_argument("--out", default="bench/results/attention.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench/attention.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    batches = [int(b) for b in args.batches.split(",")]
    fixed = [int(s) for s in args.splits.split(",") if s]
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            ap.error(f"--models: unknown {m!r} (choose from {', '.join(MODELS)})")
    dev, L, t0 = torch.device("cuda"), args.length, time.time()
    g = torch.Generator(device=dev).manual_seed(0)
    rows, failed = [], []
    print(f"{torch.cuda.get_device_name(dev)}, {torch.cuda.get_device_properties(dev).multi_processor_count} SMs, "
          f"length {L}, bf16")
    print(f"{'model':17s} {'B':>4s} {'splits':>8s} {'ms':>8s} {'GB/s':>7s} {'x vs 1':>7s} {'max err':>8s}")
    for name in models:
        Hkv, G, D = MODELS[name]
        for B in batches:
            S = B + 1
            kc = torch.randn(S, L, Hkv, D, device=dev, dtype=torch.bfloat16, generator=g)
            vc = torch.randn(S, L, Hkv, D, device=dev, dtype=torch.bfloat16, generator=g)
            slots = torch.randperm(S, device=dev, generator=g)[:B].to(torch.int32)
            q = torch.randn(B, Hkv, G, D, device=dev, dtype=torch.bfloat16, generator=g)
            qpos = torch.full((B, G), L - 1, device=dev, dtype=torch.int32)
            call = lambda ns: cache_attention(q, kc, vc, slots, qpos, L, D ** -0.5, num_splits=ns)  # noqa: E731
            ref = call(1).float()
            auto = default_num_splits(B, Hkv, L, dev)
            kv_bytes = B * L * Hkv * D * 2 * 2
            variants = [1, None] + fixed
            errs = []
            for ns in variants:                          # check every variant before timing any
                err = (call(ns).float() - ref).abs().max().item()
                errs.append((err, err <= 2e-2 * max(1.0, ref.abs().max().item())))
                if not errs[-1][1]:
                    failed.append((name, B, ns, err))
            base = None
            for ns, (err, ok) in zip(variants, errs):
                ms = time_calls(lambda: call(ns), args.reps)
                base = base or ms
                label = f"auto({auto})" if ns is None else str(ns)
                rows.append(dict(model=name, B=B, Hkv=Hkv, G=G, D=D, T=1, length=L, num_splits=label,
                                 splits=auto if ns is None else ns, ms=ms, gbps=kv_bytes / ms / 1e6,
                                 speedup_vs_1=base / ms, max_err_vs_1=err, ok=ok))
                print(f"{name:17s} {B:4d} {label:>8s} {ms:8.4f} {kv_bytes / ms / 1e6:7.0f} {base / ms:7.2f} "
                      f"{err:8.1e}{'' if ok else '  FAIL'}")
    out = dict(command="python3 " + " ".join([sys.argv[0]] + (sys.argv[1:] if argv is None else list(argv))),
               device=torch.cuda.get_device_name(dev),
               sms=torch.cuda.get_device_properties(dev).multi_processor_count, length=L, dtype="bfloat16",
               timing=f"median over {args.reps} replays of a CUDA graph of {CALLS} calls, CUDA events",
               kv_bytes="B * length * Hkv * D * 2 (K and V) * 2 B", rows=rows,
               failed=[dict(model=m, B=b, num_splits=n, max_err=e) for m, b, n, e in failed],
               wall_s=round(time.time() - t0, 1))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out} ({time.time() - t0:.0f} s)")
    if failed:
        print(f"FAILED: {len(failed)} split outputs differ from num_splits=1 beyond bf16 tolerance: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
