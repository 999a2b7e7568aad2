"""Host and device time of one speculative commit (pool.accept_drafts with the Triton fold and conv roll),
the part of a verify step that is not in the graph-captured forward (bench/e2e.py times them together).

Per batch size: a Qwen3.5-4B-shaped pool (24 GDN layers, conv_dim 8192), every row verifying T drafts
and accepting them all; reports the mean wall time of begin_verify + commit (the host returns when
its launches are queued, plus any wait on the device inside), the same with a device sync after each,
and the top functions of a cProfile of the loop.

    PYTHONPATH=. python3 bench/commit_host.py --out $OUT
    python3 bench/commit_host.py --plot bench/results/commit_host_graph.json bench/results/commit_host_eager.json
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sglang_replayssm.native.ssm_ops import SSMOps  # noqa: E402
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry  # noqa: E402


def run(B: int, T: int, iters: int, device: str) -> dict:
    geo = SSMGeometry(family="gdn", num_heads=32, head_v_dim=128, head_k_dim=128, num_k_heads=16, conv_dim=8192,
                      conv_kernel=4)
    pool = ReplayStatePool(geo, 24, B, ReplayConfig(window=16, max_drafts=8), device=device,
                           act_dtype=torch.bfloat16)
    slots = pool.alloc(B)
    pool.cursor[torch.tensor(slots, device=device)] = (torch.arange(B, device=device) % 16).int()
    ops = SSMOps("gdn", pool, kernels="triton" if device == "cuda" else "reference")
    acc = [T] * B

    def step():
        ops.begin_verify(slots, T)
        ops.accept_drafts(slots, acc)
    for _ in range(4):
        step()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        step()
    host = (time.perf_counter() - t) * 1e3 / iters
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        step()
        sync()
    synced = (time.perf_counter() - t) * 1e3 / iters
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        step()
    sync()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
    return {"B": B, "T": T, "host_ms": host, "synced_ms": synced, "profile": s.getvalue()}


def plot(paths: list[str], out: str) -> None:
    """Bars of the commit's host and synced ms per (batch, drafts), one group per results JSON."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [(os.path.basename(p)[:-5], json.load(open(p))["rows"]) for p in paths]
    keys = sorted({(r["B"], r["T"]) for _, rows in runs for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(runs)
    for ax, field, title in zip(axes, ("host_ms", "synced_ms"), ("host time", "with a device sync")):
        for i, (name, rows) in enumerate(runs):
            val = {(r["B"], r["T"]): r[field] for r in rows}
            ax.bar([k + i * width for k in range(len(keys))], [val.get(k, 0) for k in keys], width, label=name)
        ax.set_xticks([k + width * (len(runs) - 1) / 2 for k in range(len(keys))])
        ax.set_xticklabels([f"B={b}\nT={t}" for b, t in keys])
        ax.set_yscale("log")
        ax.set_ylabel("ms per begin_verify + commit")
        ax.set_title(f"pool.accept_drafts, {title} (H200)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,256")
    ap.add_argument("--drafts", default="5,8")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", nargs="+", default=None, metavar="JSON",
                    help="only draw these results' bars into the first JSON's name + .png")
    a = ap.parse_args()
    if a.plot:
        plot(a.plot, a.plot[0][:-5] + ".png")
        return
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for B in (int(b) for b in a.batches.split(",")):
        for T in (int(t) for t in a.drafts.split(",")):
            r = run(B, T, a.iters, dev)
            print(f"B={B:4d} T={T}: begin_verify + commit {r['host_ms']:.3f} ms host, {r['synced_ms']:.3f} ms with a "
                  f"device sync after each", flush=True)
            print(r["profile"])
            rows.append(r)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        meta = dict(device=torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", torch=torch.__version__,
                    command="python bench/commit_host.py " + " ".join(sys.argv[1:]),
                    time=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
        with open(os.path.join(a.out, "commit_host.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
