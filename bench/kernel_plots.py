"""The kernel benchmark's plots and printed summary (bench/kernels.py, its sweep and `--plot`)."""
from __future__ import annotations

import os

from kernel_harness import GEOMS, RESULTS


def summary():
    rows = RESULTS["rows"]
    get = lambda g, B, k: next((r["ms"] for r in rows if r["geo"] == g and r["B"] == B and r["kernel"] == k), None)
    print("\nSUMMARY at B=256 (ms/step, window-averaged):")
    for geo in GEOMS:
        g = geo["name"]
        vals = {k: get(g, 256, k) for k in ("hbm_limit_replay_state_only", "ours_conventional", "sglang_conventional",
                                            "sglang_replayssm", "ours_replay_fp32", "ours_replay_fp8",
                                            "ours_replay_fp32_bf16records", "ours_verify_T8")}
        print(g, {k: (round(v, 4) if v else None) for k, v in vals.items()})


def plot(out, results=None, name="kernels.png"):
    """`name` in `out`: ms per step per geometry and kernel, lines over the batch sizes, or (one
    batch size) grouped bars labelled with GB/s."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = (results or RESULTS)["rows"]
    if (results or RESULTS).get("meta", {}).get("kind") == "sweep":
        return plot_sweep(out, rows, name, plt)
    kinds = ["hbm_limit_replay_state_only", "sglang_conventional", "ours_conventional", "sglang_replayssm",
             "flashinfer_ssu", "ours_replay_fp32", "flashinfer_ssu_fp8", "ours_replay_fp8"]
    geos = [g["name"] for g in GEOMS if any(r["geo"] == g["name"] for r in rows)]
    batches = sorted({r["B"] for r in rows})
    fig, axes = plt.subplots(1, len(geos), figsize=(5 * len(geos), 4.5), squeeze=False)
    for ax, geo in zip(axes[0], geos):
        if len(batches) == 1:
            vals = [next((r for r in rows if r["geo"] == geo and r["kernel"] == k and r.get("ms")), None)
                    for k in kinds]
            xs = [i for i, r in enumerate(vals) if r]
            bars = ax.bar(xs, [vals[i]["ms"] for i in xs], color=[f"C{i}" for i in xs])
            for bar, i in zip(bars, xs):
                ax.annotate(f"{vals[i]['ms']:.3f}\n{vals[i].get('GBps') or 0:.0f} GB/s",
                            (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=6)
            ax.set_xticks(range(len(kinds)))
            ax.set_xticklabels([k.replace("hbm_limit_replay_state_only", "HBM limit").replace("_", "\n", 1)
                                for k in kinds], fontsize=6)
            ax.set_ylabel(f"ms / step at B = {batches[0]} (window avg)")
        else:
            for k in kinds:
                pts = sorted((r["B"], r["ms"]) for r in rows if r["geo"] == geo and r["kernel"] == k and r["ms"])
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=k)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch")
            ax.set_ylabel("ms / step (window avg)")
            ax.legend(fontsize=7)
        ax.set_title(geo)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=110)


def plot_sweep(out, rows, name, plt):
    """A sweep's PNG: per (geometry, swept kernel, batch) one panel of horizontal bars, ms per step of each
    configuration (fastest in a darker colour), labelled with ms and GB/s."""
    def panel_of(r):
        return r["geo"], r["kernel"], r["B"]
    panels = sorted({panel_of(r) for r in rows if r.get("ms")}, key=lambda p: (p[0], p[2], p[1]))
    if not panels:
        raise SystemExit("no timed rows to plot")
    cols = min(4, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 0.9 + 0.32 * max(
        sum(1 for r in rows if panel_of(r) == p and r.get("ms")) for p in panels) * nrows),
        squeeze=False)
    for ax, (geo, kernel, B) in zip(axes.flat, panels):
        sel = [r for r in rows if panel_of(r) == (geo, kernel, B) and r.get("ms")]
        best = min(r["ms"] for r in sel)
        ys = range(len(sel))
        ax.barh(ys, [r["ms"] for r in sel], color=["C3" if r["ms"] == best else "C0" for r in sel])
        for y, r in zip(ys, sel):
            ax.annotate(f" {r['ms']:.3f} ms, {r.get('GBps') or 0:.0f} GB/s", (r["ms"], y), va="center", fontsize=6)
        ax.set_yticks(list(ys))
        ax.set_yticklabels([r.get("note", "")[:32] + (f" [{r['variant']}]" if "variant" in r else "") for r in sel],
                           fontsize=6)
        ax.invert_yaxis()
        ax.set_xlim(0, max(r["ms"] for r in sel) * 1.45)
        ax.set_xlabel(f"ms / step at B = {B}", fontsize=7)
        ax.set_title(f"{geo}\n{kernel}", fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=110)
