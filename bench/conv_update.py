"""The decode step's depthwise causal conv (native/fused.conv_update, one token per row) on a GPU: its
launch over channel blocks and warps, at the e2e models' conv widths, with the bytes it must move (state read + write, x, y; bf16) as GB/s. Timed as a CUDA graph of
--iters calls (an eager loop would time the wrapper's Python, not the kernel).

  python bench/conv_update.py                       # writes bench/results/conv_update.json
  python bench/conv_update.py --batches 256 --out /tmp/c.json

Before timing, every variant's outputs and new state are checked bit for bit against the default launch.
The eighth run also timed a tiled path ([channels, K] tiles of state and weights, removed after): 0.56-1.23x.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_replayssm.native import fused  # noqa: E402

# (name, conv channels, split into the SSM kernels' inputs): Qwen3.5-4B q | k | v, Nemotron-Nano-4B x | B | C
WIDTHS = [("qwen3.5-4b", [2048, 2048, 4096]), ("nemotron-3-nano-4b", [7680, 1024, 1024])]
# (block_c, warps); None: the wrapper's default, 512 in 4 warps (the first: the baseline of the ratios)
VARIANTS = [(None, None), (1024, 4), (1024, 8), (256, 2), (256, 1), (128, 1), (64, 1)]


def timed(fn, iters):
    """ms per call of fn: a CUDA graph of `iters` calls (no Python launch cost, as in the engine's graphed
    decode step), replayed 5 times after a warm-up, the median (CUDA events)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / iters)
    return sorted(times)[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="64,256,512")
    ap.add_argument("--kernel", type=int, default=4, help="conv kernel width K (state keeps K - 1 columns)")
    ap.add_argument("--iters", type=int, default=100, help="calls per CUDA graph")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "conv_update.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/conv_update.py needs a CUDA GPU (the tests check the kernel on CPU)")
    dev = torch.device("cuda")
    K, dt = args.kernel, torch.bfloat16
    rows = []
    for name, splits in WIDTHS:
        C = sum(splits)
        for B in (int(b) for b in args.batches.split(",")):
            g = torch.Generator(device=dev).manual_seed(B + C)
            proj = torch.randn(B, 1, C + 64, device=dev, generator=g).to(dt)
            x = proj[..., 32:32 + C]                               # a strided view, as in the model
            w = (torch.randn(C, K, device=dev, generator=g) / K ** 0.5).to(dt)
            state0 = torch.randn(B + 1, C, K - 1, device=dev, generator=g).to(dt)
            slots = (torch.randperm(B, device=dev, generator=g) + 1).int()
            nbytes = B * C * (2 * (K - 1) + 2) * 2                 # state read + write, x, y (bf16)
            ref_st = state0.clone()
            ref = fused.conv_update(x, ref_st, w, None, slots, None, splits)
            base = None
            for bc, nw in VARIANTS:
                st = state0.clone()
                out = fused.conv_update(x, st, w, None, slots, None, splits, block_c=bc, num_warps=nw)
                if not (all(torch.equal(o, r) for o, r in zip(out, ref)) and torch.equal(st, ref_st)):
                    raise SystemExit(f"{name} B={B} block_c={bc} warps={nw}: differs from the default launch")
                ms = timed(lambda: fused.conv_update(x, st, w, None, slots, None, splits, block_c=bc, num_warps=nw),
                           args.iters)
                base = base or ms
                r = dict(model=name, C=C, B=B, block_c=bc, warps=nw, ms=ms, GBps=nbytes / ms / 1e6,
                         vs_default=base / ms)
                rows.append(r)
                print(f"{name:20s} B={B:4d} C={C} block_c={bc!s:5s} warps={nw!s:4s} "
                      f"{ms * 1e3:8.1f} us {r['GBps']:7.0f} GB/s  {r['vs_default']:.2f}x the default", flush=True)
    res = dict(command="python bench/conv_update.py " + " ".join(sys.argv[1:]), device=torch.cuda.get_device_name(dev),
               torch=torch.__version__, time=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), K=K,
               dtype="bfloat16", rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
