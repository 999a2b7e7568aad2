"""Where a decode or verify step's GPU time goes, kernel by kernel (H200).

`bench/kernels.py` times whole steps (CUDA graphs of a window of L = 16 steps). This profiles the same
steps, run eagerly under torch.profiler, and reports each kernel's GPU time per step (summed over the
window, divided by L) and its launches per step, beside the step's achieved GB/s: it tells a slow
read pass from a slow flush launch or a slow commit fold.

    PYTHONPATH=. python3 bench/profile_kernels.py --out $OUT          # -> profile_kernels.json (+ a table)
    PYTHONPATH=. python3 bench/profile_kernels.py --cases gdn_fp8_split,gdn_verify8_mma

Cases: `CASES` below (geometry, what, config as in bench/kernels.py's sweep), or any other as
GEO:KIND:CONFIG:METHOD (e.g. gdn_qwen35_4b:fp8:32x128x2x0x128:split). Batch 256 unless --batch.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import kernel_harness as bk  # noqa: E402  (bench/kernel_harness.py: geometries, pools, runners, byte counts)

# name: (geometry, kind, config, method); kind: conventional | fp32 | fp8 | verifyT (T drafts + commit fold)
CASES = {
    "gdn_conventional": ("gdn_qwen35_4b", "conventional", (16, None, 2), None),
    "gdn_fp32_fused": ("gdn_qwen35_4b", "fp32", (32, 32, 1), "fused"),
    "gdn_fp32_split": ("gdn_qwen35_4b", "fp32", (32, 32, 2, 3), "split"),
    "gdn_fp8_fused": ("gdn_qwen35_4b", "fp8", (32, 32, 2), "fused"),
    "gdn_fp8_split": ("gdn_qwen35_4b", "fp8", (32, 64, 2, 0, 128), "split"),
    "gdn_verify8_mma": ("gdn_qwen35_4b", "verify8", (64, 16, 1), "mma"),
    "gdn_verify8_split": ("gdn_qwen35_4b", "verify8", (16, 16, 2), "split"),
    "m2_conventional": ("mamba2_nemotron3_super", "conventional", (16, None, 2), None),
    "m2_fp32_fused": ("mamba2_nemotron3_super", "fp32", (32, 32, 1), "fused"),
    "m2_fp32_split": ("mamba2_nemotron3_super", "fp32", (32, 32, 2, 3), "split"),
    "m2_fp8_split": ("mamba2_nemotron3_super", "fp8", (32, 64, 2, 0, 128), "split"),
    "m2_verify8": ("mamba2_nemotron3_super", "verify8", (64, 16, 4), "fma"),
    "m2_verify8_mma": ("mamba2_nemotron3_super", "verify8", (64, 16, 1), "mma"),
    "kda_conventional": ("kda_32h", "conventional", (16, None, 2), None),
    "kda_fp32_split": ("kda_32h", "fp32", (32, 128, 4, 0, 128), "split"),
    "kda_fp8_split": ("kda_32h", "fp8", (32, 128, 4, 0, 128), "split"),
    "kda_verify8": ("kda_32h", "verify8", (32, 16, 4), "fma"),
    "kda_verify8_mma": ("kda_32h", "verify8", (128, 16, 1), "mma"),
}


def _device_us(avg) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
        v = getattr(avg, attr, None)
        if v:
            return float(v)
    return 0.0


def profile_steps(steps, reset=None):
    """Per-kernel GPU microseconds per step and launches per step, over one pass of `steps`."""
    for f in steps:   # compile + warm up
        f()
    if reset:
        reset()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for f in steps:
            f()
        torch.cuda.synchronize()
    n = len(steps)
    rows = []
    for a in prof.key_averages():
        us = _device_us(a)
        if us > 0:
            rows.append(dict(kernel=a.key[:80], us_per_step=us / n, launches_per_step=a.count / n))
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows


def case_spec(case):
    """CASES[case], or a GEO:KIND:BVxBKxW[xS[xFBK[xFW]]]:METHOD spec (BK 0: whole rows for conventional)."""
    if case in CASES:
        return CASES[case]
    try:
        geo, kind, cfg, method = case.split(":")
        vals = tuple(int(v) for v in cfg.split("x"))
    except ValueError:
        raise SystemExit(f"unknown case {case!r}: a name of CASES or GEO:KIND:BVxBKxW[...]:METHOD") from None
    return geo, kind, vals, (None if method in ("", "none") else method)


def build(case, B, cursors="staggered"):
    geo_name, kind, cfg, method = case_spec(case)
    geo = next(g for g in bk.GEOMS if g["name"] == geo_name)
    slots = (torch.randperm(B, device=bk.DEV) + 1).int()
    if kind == "conventional":
        state = torch.randn(B + 1, geo["H"], geo["Dv"], geo["Dk"], device=bk.DEV) * 0.05
        inp = bk.make_inputs(geo, B)
        return geo, bk.run_conventional_ours(geo, B, state, slots, inp, cfg), None, bk.bytes_conventional(geo, B)
    if kind.startswith("verify"):
        T = int(kind[len("verify"):])
        pool = bk.make_pool(geo, B)
        base = torch.randperm(B, device=bk.DEV) % bk.L
        steps, reset = bk.run_verify_ours(geo, pool, slots, bk.make_inputs(geo, B, T=T), T, cfg[:3], base, method)
        return geo, steps, reset, bk.bytes_verify(geo, B, T)
    rc = "none" if kind == "fp32" else kind
    pool = bk.make_pool(geo, B, read_copy=rc)
    curs = bk.cursor_sets(B, B, slots, cursors)
    steps = bk.run_replay_ours(geo, pool, slots, bk.make_inputs(geo, B), curs, cfg, method)
    return geo, steps, None, bk.bytes_replay(geo, B, rc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated names of CASES")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--cursors", choices=bk.CURSORS, default="staggered",
                    help="decode rows' ring cursors: staggered (B / L rows flush every step) or synchronized")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    torch.manual_seed(0)
    out = dict(meta=dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
                         triton=importlib.import_module("triton").__version__, batch=args.batch, window=bk.L,
                         cursors=args.cursors,
                         command="python bench/profile_kernels.py " + " ".join(sys.argv[1:]),
                         time=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())), cases={})
    os.makedirs(args.out, exist_ok=True)
    for case in args.cases.split(","):
        try:
            geo, steps, reset, nb = build(case, args.batch, args.cursors)
            rows = profile_steps(steps, reset)
        except Exception as e:  # noqa: BLE001 - one broken case must not lose the others
            print(f"{case}: FAILED {type(e).__name__}: {e}")
            out["cases"][case] = dict(error=f"{type(e).__name__}: {e}")
            continue
        tot = sum(r["us_per_step"] for r in rows)
        spec = case_spec(case)
        out["cases"][case] = dict(geo=spec[0], kind=spec[1], config=list(spec[2]), method=spec[3], bytes_per_step=nb,
                                  us_per_step=tot, GBps=nb / (tot * 1e-6) / 1e9 if tot else None, kernels=rows)
        print(f"\n{case}  ({spec[0]}, {spec[1]}, cfg {spec[2]}, {spec[3]}): "
              f"{tot:.1f} us/step of kernels, {nb / (tot * 1e-6) / 1e9 if tot else 0:.0f} GB/s")
        for r in rows:
            print(f"    {r['us_per_step']:9.2f} us  x{r['launches_per_step']:.2f}  {r['kernel']}")
        torch.cuda.empty_cache()
        with open(os.path.join(args.out, "profile_kernels.json"), "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
