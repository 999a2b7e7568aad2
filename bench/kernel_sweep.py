"""`bench/kernels.py --sweep`: block sizes and warps of decode, verify and fold at one batch size."""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import triton

from kernel_harness import (DEV, GEOMS, L, RESULTS, KernelTuning, bench_graph, bytes_replay, copy_bandwidth,
                            cursor_sets, make_inputs, make_pool, module, record, run_replay_ours, run_sglang_replay, timed,
                            verify_methods)


def _configs(spec):
    """Configs BVxBKxWARPS[...] of a comma-separated spec; "default" is the library's own blocks (None)."""
    return [None if c == "default" else tuple(int(v) for v in c.split("x")) for c in spec.split(",") if c]


def _note(cfg) -> str:
    if cfg is None:
        return "the library's default blocks"
    return ("bv{}_bk{}_w{}".format(*cfg) + (f"_s{cfg[3]}" if len(cfg) > 3 and cfg[3] else "")
            + (f"_fbk{cfg[4]}" if len(cfg) > 4 and cfg[4] else "") + (f"_fw{cfg[5]}" if len(cfg) > 5 and cfg[5] else ""))


def sweep(args):
    """Block-size / warp sweep at one batch size: decode over a full window (flushes included) with
    an fp32 checkpoint and with an fp8 read copy (skipped with --sweep-decode ""), verify of T chain drafts
    alone (no commit fold; T from --sweep-verify-T, default 4 and 8), and the commit fold after a verify of
    the largest T with every draft accepted (--sweep-fold), each config a CUDA graph of L steps. Picks the
    configs for the defaults."""
    dev = torch.cuda.get_device_properties(0)
    RESULTS["meta"] = dict(device=dev.name, torch=torch.__version__, triton=triton.__version__, window=L, cursors=args.cursors,
                           command="python bench/kernels.py " + " ".join(sys.argv[1:]), kind="sweep",
                           time=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    bw = copy_bandwidth()
    RESULTS["meta"]["copy_GBps"] = bw
    B = args.sweep_batch
    names = (["gdn_qwen35_4b", "mamba2_nemotron3_super", "kda_32h"] if args.geos == "all"
             else args.geos.split(","))
    out = os.path.join(args.out, "kernels_sweep.json")

    def save():   # after every group: a run cut by a time limit keeps what it measured
        with open(out, "w") as fh:
            json.dump(RESULTS, fh, indent=1)
    for geo in [g for g in GEOMS if g["name"] in names]:
        mod = module(geo)
        if mod is None:
            continue
        slots = (torch.randperm(B, device=DEV) + 1).int()
        inp = make_inputs(geo, B)
        curs = cursor_sets(B, B, slots, args.cursors)
        for rc in args.sweep_read_copies.split(",") if args.sweep_decode else ():
            pool = make_pool(geo, B, read_copy=rc)
            nb = bytes_replay(geo, B, rc)
            for method in args.sweep_decode_methods.split(","):
                method = None if method == "default" else method   # default: the library's decode_plan picks
                for cfg in _configs(args.sweep_decode):
                    ms = timed(bench_graph, run_replay_ours(geo, pool, slots, inp, curs, cfg, method), 60)
                    record(geo=geo["name"], B=B, kernel=f"sweep_decode_{'fp32' if rc == 'none' else rc}"
                           + (f"_{method}" if method else ""), config=None if cfg is None else list(cfg), ms=ms,
                           GBps=nb / ms / 1e6 if ms else None, note=_note(cfg))
            # the peer on the same rows and inputs (its ring positions spread as ours); SGLang has no ReplaySSM
            # decode for Mamba-2, so that family has no peer row
            if args.sweep_peer and rc == "none" and geo["family"] != "mamba2":
                state = torch.randn(B + 1, geo["H"], geo["Dv"], geo["Dk"], device=DEV) * 0.05
                sr = timed(run_sglang_replay, geo, B, state, slots, inp, B)
                ms = timed(bench_graph, sr, 60) if sr else None
                record(geo=geo["name"], B=B, kernel="sglang_replayssm", ms=ms, GBps=nb / ms / 1e6 if ms else None,
                       note="SGLang's fused_recurrent_linear_replayssm_decode" if sr else "peer not importable")
                del state
            save()
            del pool
        pool = make_pool(geo, B)
        base = torch.zeros(B + 1, dtype=torch.int32, device=DEV)
        base[slots.long()] = (torch.randperm(B, device=DEV) % L).int()
        E = geo["H"] * geo["Dv"] * geo["Dk"]
        Ts = [int(t) for t in args.sweep_verify_T.split(",")]
        for T in Ts:
            inp_t = make_inputs(geo, B, T=T)
            nb = B * (E * 4 + 0.5 * (L - 1) * (geo["H"] * geo["Dv"] + geo["Hk"] * geo["Dk"]) * 4)
            for method in verify_methods(geo, args.sweep_verify_methods):
                kw = {"method": method}
                for cfg in _configs(args.sweep_verify):
                    bv, bk, nw = cfg[:3]
                    if len(cfg) > 3 and cfg[3] and method != "mma":
                        continue   # stages: the mma launch's pipelining only
                    kws = dict(kw, tuning=KernelTuning(block_v=bv, block_k=min(bk, geo["Dk"]), num_warps=nw,
                                                       stages=cfg[3] if len(cfg) > 3 and cfg[3] else None))

                    def f(kws=kws, pool=pool):
                        pool.cursor = base
                        mod.verify(pool, 0, slots, **inp_t, **kws)
                    ms = timed(bench_graph, [f] * L, 60)
                    record(geo=geo["name"], B=B, kernel=f"sweep_verify_T{T}_{method}", config=list(cfg), T=T,
                           ms=ms, GBps=nb / ms / 1e6 if ms else None,
                           note="bv{}_bk{}_w{}".format(*cfg) + (f"_s{cfg[3]}" if len(cfg) > 3 and cfg[3] else ""))
                save()
        Tf = max(Ts)
        cur = base[slots.long()] + Tf
        counts = torch.where(cur >= L, cur, torch.zeros_like(cur)).int()
        nf = int((counts > 0).sum())
        nb = nf * (E * 8 + 12 * (geo["H"] * geo["Dv"] + geo["Hk"] * geo["Dk"]) * 4)
        for cfg in _configs(args.sweep_fold):
            bv, bk, nw = cfg

            def f(bv=bv, bk=bk, nw=nw, pool=pool):
                mod.fold(pool, 0, slots, counts, tuning=KernelTuning(block_v=bv, block_k=bk or None, num_warps=nw))
            ms = timed(bench_graph, [f] * L, 60)
            record(geo=geo["name"], B=B, kernel=f"sweep_fold_T{Tf}", config=list(cfg), ms=ms,
                   GBps=nb / ms / 1e6 if ms else None, note="bv{}_bk{}_w{}".format(*cfg) + f" ({nf} rows fold)")
        save()
        del pool
        torch.cuda.empty_cache()
    save()
    best = {}
    for r in RESULTS["rows"]:
        key = (r["geo"], r["kernel"])
        if r.get("ms") and (key not in best or r["ms"] < best[key]["ms"]):
            best[key] = r
    print("\nbest per kernel:")
    for (g, k), r in sorted(best.items()):
        print(f"  {g:26s} {k:28s} {r['ms']:.4f} ms  {r['note']}")
    return 0
