"""The read rate a decode kernel can reach at best on this GPU: a minimal Triton kernel that reads
one [BV, K] state tile per (value block, head, row) program through the slot indirection (as every
ReplaySSM read pass does), reduces it against a vector and writes BV outputs — nothing else.

Modes add, one at a time, what our read pass adds: 1 the per-row scales of an fp8 read copy, 2 the
committed d records (masked by the row's cursor: a dependent load), 3 the early return of flush rows.
The state bytes alone count in GB/s; fp8 and fp32 states at GDN 16/32 (Qwen3.5-4B) dimensions, B = 256.

    python3 bench/read_ceiling.py [--out DIR]     # GPU; -> read_ceiling.json (+ a table)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _read_tiles(slots, cursor, state, scale, q, recd, out, H: tl.constexpr, V: tl.constexpr, K: tl.constexpr,
                BV: tl.constexpr, MODE: tl.constexpr, R: tl.constexpr, BR: tl.constexpr, WINDOW: tl.constexpr):
    i_v = tl.program_id(0)
    i_h = tl.program_id(1)
    i_b = tl.program_id(2)
    slot = tl.load(slots + i_b).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, K)
    rows = (slot * H + i_h) * V + o_v
    acc = tl.sum(tl.load(state + rows[:, None] * K + o_k[None, :]).to(tl.float32)
                 * tl.load(q + i_b * K + o_k)[None, :], axis=1)
    if MODE >= 1:
        acc = acc * tl.load(scale + rows)
    if MODE >= 2:
        cur = tl.load(cursor + slot)
        o_r = tl.arange(0, BR)
        acc += tl.sum(tl.load(recd + ((slot * R + o_r[:, None]) * H + i_h) * V + o_v[None, :],
                              mask=(o_r < cur)[:, None], other=0.0), axis=0)
        if MODE >= 3:
            if cur + 1 >= WINDOW:
                return
    tl.store(out + (i_b * H + i_h) * V + o_v, acc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/read_ceiling.py needs a CUDA GPU")
    B, H, V, K, R, W = 256, 32, 128, 128, 24, 16
    dev = "cuda"
    slots = (torch.randperm(B, device=dev) + 1).int()
    cursor = (torch.arange(B + 1, device=dev) % W).int()
    q = torch.randn(B, K, device=dev)
    recd = torch.randn(B + 1, R, H, V, device=dev)
    out = torch.empty(B, H, V, device=dev)
    res = dict(meta=dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                         B=B, H=H, V=V, K=K, command="python3 bench/read_ceiling.py " + " ".join(sys.argv[1:]),
                         time=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())), rows=[])
    for dt in (torch.float8_e4m3fn, torch.float32):
        state = torch.randn((B + 1) * H * V * K, device=dev).to(dt)
        scale = torch.rand((B + 1) * H * V, device=dev)
        nbytes = B * H * V * K * state.element_size()
        for mode in (0, 1, 2, 3):
            for BV, nw in ((16, 1), (16, 2), (32, 1), (32, 2), (32, 4), (64, 2), (64, 4), (128, 4), (128, 8)):
                def f():
                    _read_tiles[(V // BV, H, B)](slots, cursor, state, scale, q, recd, out, H=H, V=V, K=K, BV=BV,
                                                 MODE=mode, R=R, BR=16, WINDOW=W, num_warps=nw)
                f()
                ms = do_bench(f, warmup=10, rep=100, return_mode="median")
                row = dict(state=str(dt).replace("torch.", ""), mode=mode, block_v=BV, warps=nw, us=ms * 1e3,
                           GBps_state=nbytes / ms / 1e6)
                res["rows"].append(row)
                print(f"{row['state']:14s} mode{mode} BV{BV:4d} w{nw}  {row['us']:7.1f} us  {row['GBps_state']:6.0f} GB/s")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "read_ceiling.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
