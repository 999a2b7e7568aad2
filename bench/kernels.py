"""ReplaySSM kernel benchmark on one GPU (H200): ours vs our conventional kernel vs the peers (SGLang's decode,
ReplaySSM decode and ReplaySSM spec verify; FlashInfer's checkpointing_ssu: bench/peers.py).

Run (from the repo root, with SGLang 0.5.23's own kernels in the git-ignored .peer/ and FlashInfer unpacked
into /tmp/site, bench/README.md):
    PYTHONPATH=/tmp/site:.:.peer python3 bench/kernels.py --out $OUT
Writes kernels.json + kernels.png to --out and prints the ours / best-peer table. The harness is
kernel_harness.py, the GPU checks run before any timing kernel_checks.py, the plots kernel_plots.py, the
block sweep (--sweep) kernel_sweep.py. Times are triton.testing.do_bench medians of a CUDA graph
holding L=16 consecutive decode steps (per-row cursors preset so that over the window every row
flushes exactly once; in a batch of B rows about B/16 flush each step), divided by L: ms per step
averaged over a full window, flushes included. L2 is flushed by do_bench before each replay.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton

from kernel_checks import gpu_checks
from kernel_harness import (ACT, CURSORS, DEV, GEOMS, L, RESULTS, bench_graph, bytes_conventional, bytes_replay,
                            bytes_state_only, bytes_verify, copy_bandwidth, cursor_sets, make_inputs, make_pool, module,
                            record, run_conventional_ours, run_replay_ours, run_sglang_conv, run_sglang_replay,
                            run_verify_ours, timed, verify_methods)
from kernel_plots import plot, summary
from kernel_sweep import sweep
import peers  # (bench/peers.py: SGLang's spec verify, FlashInfer's checkpointing_ssu)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--geos", default="all")
    ap.add_argument("--batches", default="1,64,256,512")
    ap.add_argument("--quick", action="store_true", help="only the library's default blocks (no alternatives)")
    ap.add_argument("--plot", default=None, metavar="JSON", help="only redraw the plot of a results JSON (JSON name .png, beside it)")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--sweep", action="store_true",
                    help="instead of the comparison: time decode (fp32, fp8 read copy) and verify alone (T = 4, 8)"
                         " over a grid of block sizes and warps at batch --sweep-batch; writes kernels_sweep.json")
    ap.add_argument("--sweep-batch", type=int, default=256)
    ap.add_argument("--sweep-decode", default="16x32x1,32x32x1,32x64x1,64x32x1,32x16x2,32x32x2,64x16x2,64x32x2,"
                    "32x32x4,64x32x4,128x32x4,128x32x8,32x32x1x2,32x32x2x2,32x32x2x3,64x32x4x2,"
                    "32x64x1x0x32,32x128x2x0x32,64x128x4x0x32",
                    help="decode configs BVxBKxWARPS[xSTAGES[xFLUSH_BK[xFLUSH_WARPS]]] (STAGES: software-pipelined "
                         "state loop; FLUSH_BK: column chunk of flush rows; FLUSH_WARPS: warps of the split decode's "
                         "flush launch; 0 = default), or default (the library's blocks)")
    ap.add_argument("--sweep-peer", action="store_true",
                    help="the sweep also times SGLang's ReplaySSM decode (GDN, KDA) at the sweep batch, same harness")
    ap.add_argument("--sweep-decode-methods", default="fused,split",
                    help="decode methods to sweep, comma-separated (fused, split, default: the library's choice)")
    ap.add_argument("--sweep-verify", default="16x16x1,16x16x2,32x16x2,32x16x4,32x32x4,64x16x4,64x16x8,"
                    "32x32x8,64x32x8,128x16x8", help="verify configs BVxBKxWARPS[xSTAGES] (STAGES: mma launches only)")
    ap.add_argument("--sweep-verify-T", default="4,8",
                    help="draft counts of the verify sweep, comma-separated (the fold sweep commits the largest)")
    ap.add_argument("--sweep-verify-methods", default=None,
                    help="verify methods to sweep, comma-separated (default: fma,mma,split for GDN, fma,mma for "
                         "Mamba-2 and KDA)")
    ap.add_argument("--cursors", choices=CURSORS, default="staggered",
                    help="ring cursors of the decode rows over a window: staggered (B / L rows flush every step, "
                         "steady-state serving) or synchronized (all rows flush in the same step)")
    ap.add_argument("--sweep-read-copies", default="none,fp8",
                    help="decode sweep read copies, comma-separated: none (the fp32 checkpoint) and/or fp8")
    ap.add_argument("--sweep-fold", default="",
                    help="commit fold configs BVxBKxWARPS (the fold after a verify of the sweep's largest T with "
                         "every draft accepted: at T = 8 half the rows fold)")
    args = ap.parse_args()
    bad = [m for m in args.sweep_decode_methods.split(",") if m not in ("fused", "split", "default")]
    if bad:
        ap.error(f"--sweep-decode-methods: unknown method {bad[0]!r} (choose from fused, split, default)")
    bad = [r for r in args.sweep_read_copies.split(",") if r not in ("none", "fp8")]
    if bad:
        ap.error(f"--sweep-read-copies: unknown read copy {bad[0]!r} (choose from none, fp8)")
    if args.plot:
        with open(args.plot) as fh:
            plot(os.path.dirname(os.path.abspath(args.plot)), json.load(fh),
                 os.path.splitext(os.path.basename(args.plot))[0] + ".png")
        return 0
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    if args.sweep:
        return sweep(args)
    dev = torch.cuda.get_device_properties(0)
    RESULTS["meta"] = dict(device=dev.name, sms=dev.multi_processor_count, cursors=args.cursors, torch=torch.__version__,
                           triton=triton.__version__, window=L, act_dtype=str(ACT), state_dtype="float32",
                           method="do_bench median of a CUDA graph of L steps / L; L2 flushed before each replay",
                           command="python bench/kernels.py " + " ".join(sys.argv[1:]),
                           time=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    bw = copy_bandwidth()
    RESULTS["meta"]["copy_GBps"] = bw
    print(f"copy bandwidth {bw:.0f} GB/s")
    if not args.skip_checks:
        timed(gpu_checks)
        if peers.FI is not None:
            for geo in (g for g in GEOMS if g["family"] == "mamba2"):
                err = timed(peers.flashinfer_check, geo)
                row = dict(family="mamba2", geo=geo["name"], what="peer: FlashInfer checkpointing_ssu with nothing "
                           "to replay vs our reference's conventional step", max_rel_err_out=err)
                print("CHECK", row)
                RESULTS["checks"].append(row)
    batches = [int(b) for b in args.batches.split(",")]
    geos = GEOMS if args.geos == "all" else [g for g in GEOMS if g["name"] in args.geos.split(",")]
    # None: the library's defaults (what the engines run); the others for context
    rcfgs = [None] if args.quick else [None, (32, 32, 1), (32, 32, 2, 3)]
    ccfgs = [(16, None, 2)] if args.quick else [(32, None, 8), (16, None, 2)]
    for geo in geos:
        if module(geo) is None:
            print("skip", geo["name"], "(no kernel)")
            continue
        Bmax = max(batches)
        nslots = Bmax
        state = torch.randn(nslots + 1, geo["H"], geo["Dv"], geo["Dk"], device=DEV) * 0.05
        pool = make_pool(geo, nslots)
        pool8 = make_pool(geo, nslots, read_copy="fp8")
        for B in batches:
            rep = 60 if B < 256 else 120
            slots = (torch.randperm(nslots, device=DEV)[:B] + 1).int()
            inp = make_inputs(geo, B)
            curs = cursor_sets(B, nslots, slots, args.cursors)
            name = geo["name"]
            lim = dict(state_only=bytes_state_only(geo, B) / bw / 1e6, state_only_fp8=bytes_state_only(geo, B, "fp8") / bw / 1e6)
            cb = bytes_conventional(geo, B)
            record(geo=name, B=B, kernel="hbm_limit_conventional", ms=cb / bw / 1e6, GBps=bw)
            record(geo=name, B=B, kernel="hbm_limit_replay_state_only", ms=lim["state_only"], GBps=bw)
            record(geo=name, B=B, kernel="hbm_limit_replay_fp8_state_only", ms=lim["state_only_fp8"], GBps=bw)
            best = {}
            for kind in ("conventional", "replay_fp32", "replay_fp8"):
                for cfg in (ccfgs if kind == "conventional" else rcfgs):
                    if kind == "conventional":
                        steps = run_conventional_ours(geo, B, state, slots, inp, cfg)
                        nb = cb
                    else:
                        p = pool if kind == "replay_fp32" else pool8
                        steps = run_replay_ours(geo, p, slots, inp, curs, cfg)
                        nb = bytes_replay(geo, B, "none" if kind == "replay_fp32" else "fp8")
                    ms = timed(bench_graph, steps, rep)
                    if ms is None:
                        continue
                    tag = "default" if cfg is None else "bv{}_bk{}_w{}".format(*cfg) + (
                        f"_s{cfg[3]}" if len(cfg) > 3 and cfg[3] else "")
                    record(geo=name, B=B, kernel=f"ours_{kind}_{tag}", ms=ms, GBps=nb / ms / 1e6, bytes=nb)
                    if kind not in best or ms < best[kind][0]:
                        best[kind] = (ms, cfg, nb)
            for kind, (ms, cfg, nb) in best.items():
                record(geo=name, B=B, kernel=f"ours_{kind}", ms=ms, GBps=nb / ms / 1e6, bytes=nb,
                       config=None if cfg is None else list(cfg), hbm_limit_ms=nb / bw / 1e6)
            pool.cursor = curs[0]
            pool8.cursor = curs[0]
            if B == 256:   # both methods at their tuned / default blocks
                for m in ("split", "fused"):
                    ms = timed(bench_graph, run_replay_ours(geo, pool, slots, inp, curs, None, m), rep)
                    if ms:
                        nb = bytes_replay(geo, B, "none")
                        record(geo=name, B=B, kernel=f"ours_replay_fp32_{m}", ms=ms, GBps=nb / ms / 1e6, bytes=nb)
                    pool.cursor = curs[0]
            # records in bf16 (smaller ring traffic), fp32 state
            if B == 256:
                pb = make_pool(geo, nslots, record_dtype=torch.bfloat16)
                ms = timed(bench_graph, run_replay_ours(geo, pb, slots, inp, curs, None), rep)
                if ms:
                    nb = bytes_replay(geo, B, "none", rb=2)
                    record(geo=name, B=B, kernel="ours_replay_fp32_bf16records", ms=ms, GBps=nb / ms / 1e6, bytes=nb)
                del pb
            sg = timed(run_sglang_conv, geo, B, state, slots, inp)
            if sg:
                ms = timed(bench_graph, sg, rep)
                if ms:
                    record(geo=name, B=B, kernel="sglang_conventional", ms=ms, GBps=cb / ms / 1e6, bytes=cb)
            sr = timed(run_sglang_replay, geo, B, state, slots, inp, nslots)
            if sr:
                ms = timed(bench_graph, sr, rep)
                if ms:
                    nb = bytes_replay(geo, B, "none")
                    record(geo=name, B=B, kernel="sglang_replayssm", ms=ms, GBps=nb / ms / 1e6, bytes=nb)
            if hasattr(module(geo), "verify") and (B == 256 or geo["family"] == "gdn"):  # all families at 256
                base = torch.randperm(B, device=DEV) % L
                for T in range(1, 9):
                    inp_t = make_inputs(geo, B, T=T)
                    variants = [(None, None)]   # the library's defaults
                    if B == 256 and T in (1, 4, 8):
                        variants += [(None, m) for m in verify_methods(geo) if m != "split"]
                        if geo["family"] == "gdn":
                            variants.append(((16, 16, 2), "split"))
                    for vcfg, method in variants:
                        steps, reset = run_verify_ours(geo, pool, slots, inp_t, T, vcfg, base, method)
                        ms = timed(bench_graph, steps, rep)
                        reset()
                        if not ms:
                            continue
                        nb = bytes_verify(geo, B, T)
                        record(geo=name, B=B, kernel=f"ours_verify_T{T}" + (f"_{method}" if method else ""),
                               ms=ms, GBps=nb / ms / 1e6, bytes=nb, T=T, config=None if vcfg is None else list(vcfg),
                               note=f"{ms / T:.4f} ms/draft")
                pool.cursor = curs[0]
            if geo["family"] in ("mamba2", "gdn") or B == 256:
                timed(peers.time_peers, geo, B, L, bench_graph, record, rep, bytes_replay, bytes_verify)
        del state, pool, pool8
        torch.cuda.empty_cache()
        with open(os.path.join(args.out, "kernels.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)
    with open(os.path.join(args.out, "kernels.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)
    timed(plot, args.out)
    summary()
    print(peers.peer_table(RESULTS))


if __name__ == "__main__":
    main()
