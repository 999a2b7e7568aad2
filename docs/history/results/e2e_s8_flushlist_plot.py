"""PNG of e2e_s8_flushlist.json (bench/results/e2e_s8_flushlist.sh): ms per Qwen3.5-shaped batch-256 decode step
and the fp8 speedup of each run.   python bench/results/e2e_s8_flushlist_plot.py"""
import json
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = Path(__file__).resolve().parent
d = json.loads((here / "e2e_s8_flushlist.json").read_text())
runs = d["runs"]
modes = ["conventional", "replay", "replay-fp8", "no-ssm"]
fig, ax = plt.subplots(figsize=(9, 4))
w = 0.8 / len(runs)
for j, r in enumerate(runs):
    row = r["batch_256"]
    ms = [row[m]["ms"] for m in modes]
    bars = ax.bar([i + j * w for i in range(len(modes))], ms, w,
                  label=f"{r['variant']}: fp8 {row['speedup_replay-fp8']:.3f}x, fp32 {row['speedup']:.3f}x")
    ax.bar_label(bars, fmt="%.2f", fontsize=6)
ax.set_xticks([i + w * (len(runs) - 1) / 2 for i in range(len(modes))], modes)
ax.set_ylabel("ms per decode step, batch 256")
ax.set_title("Qwen3.5-shaped, H200: flush-row list per SSM layer vs once per step (one call)")
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(here / "e2e_s8_flushlist.png", dpi=120)
print("wrote", here / "e2e_s8_flushlist.png")
