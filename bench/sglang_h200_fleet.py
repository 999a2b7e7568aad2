"""Issue 21's H200 serving numbers: gather the device calls of ``bench/h200/h200_fleet.sh`` into one JSON + PNG.

    python bench/sglang_h200_fleet.py --out bench/results/sglang_h200_fleet \\
        --call 3=/path/to/call3/results.json --call 5=/path/to/call5/results.json ...

Each ``--call LABEL=results.json`` is one device call's ``results.json`` (servers, greedy tokens, SGLang
``bench_serving`` rows). Writes ``OUT.json`` (``meta``; per call: servers that served, greedy-token divergence
positions, the top-5 logprob differences against stock, every bench row's metrics; the ``--profiles``
summaries) and ``OUT.png`` (output throughput and median ITL per row), and
prints the markdown table of bench/h200/README.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

# what each call ran on the device (bench/h200/README.md; FLEET_ONLY / FLEET_EXTRA varied per call)
DEVICE_COMMAND = "set -o pipefail; [FLEET_ONLY=...] [FLEET_EXTRA=...] BUDGET=... bash .h200/src/bench/h200/h200_fleet.sh " \
                 "2>&1 | tee $OUT/log   (carry [\".h200\"])"

METRICS = ("output_throughput", "median_itl_ms", "mean_itl_ms", "p99_itl_ms", "median_tpot_ms", "median_ttft_ms",
           "duration", "completed", "total_output_tokens", "max_concurrency", "random_input_len", "random_output_len",
           "accept_length")


def divergence(x: list, y: list) -> int | None:
    """Index of the first differing token of two greedy continuations (None: equal)."""
    return next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), None)


def gather(calls: dict[str, Path]) -> dict:
    out = {}
    for label, path in calls.items():
        res = json.loads(Path(path).read_text())
        servers = {}
        for name, s in res["servers"].items():
            tok = s.get("tokens")
            servers[name] = {"argv": s["argv"][1:], "served": tok is not None}
            if tok:
                servers[name].update(ready_s=round(tok.get("ready_s", 0)), solo_ids=tok["solo_ids"],
                                     batch_ids=tok["batch_ids"],
                                     solo_vs_batch=[divergence(a, b) for a, b in zip(tok["solo_ids"], tok["batch_ids"])])
        pairs = {}
        for name in servers:
            ref = name.split("_")[0] + "_stock"
            if name != ref and servers[name]["served"] and servers.get(ref, {}).get("served"):
                pairs[f"{ref} vs {name}"] = {
                    k: [divergence(a, b) for a, b in zip(servers[ref][k], servers[name][k])]
                    for k in ("solo_ids", "batch_ids")}
        rows = {k: {m: v.get(m) for m in METRICS} for k, v in res["bench"].items()}
        out[label] = {"servers": servers, "stock_vs_other": pairs, "logprobs": logprob_lines(res.get("compare", "")),
                      "bench": rows}
    return out


def logprob_lines(compare: str) -> dict[str, dict]:
    """The fleet's ``A vs B logprobs: {...}`` lines (bench/h200/h200_query.py ``logprob_delta``) by pair."""
    return {line.split(" logprobs: ", 1)[0]: json.loads(line.split(" logprobs: ", 1)[1])
            for line in compare.splitlines() if " logprobs: " in line}


ROW_NAME = re.compile(r"^(?P<server>.+)_c(?P<conc>\d+)(?:_r(?P<round>\d+))?$")


def parse_row(row: str) -> tuple[str, int, int]:
    """A bench row's file stem (bench/h200/h200_fleet.py: NAME_cC, NAME_cC_rK for round K > 1) as (server, concurrency,
    round)."""
    m = ROW_NAME.match(row)
    if m is None:
        raise ValueError(f"not a bench row name: {row!r}")
    return m["server"], int(m["conc"]), int(m["round"] or 1)


def rounds_by_row(call: dict) -> dict[tuple[str, int], dict[int, dict]]:
    """{(server, concurrency): {round: metrics}} of one call, servers in their bench order."""
    out: dict[tuple[str, int], dict[int, dict]] = {}
    for row, m in call["bench"].items():
        server, conc, rnd = parse_row(row)
        out.setdefault((server, conc), {})[rnd] = m
    return out


def _cell(ms: dict[int, dict], metric: str, fmt: str) -> str:
    vals = [ms[r][metric] for r in sorted(ms) if ms[r].get(metric) is not None]
    return " / ".join(fmt.format(v) for v in vals) if vals else "–"


def table(data: dict) -> str:
    """One markdown row per (call, server, concurrency); a row measured in several rounds shows each round's value
    (round 1 / round 2 ...)."""
    lines = ["| call | server | concurrency | output tok/s | median ITL ms | p99 ITL ms | median TPOT ms "
             "| accept length |",
             "|---|---|---|---|---|---|---|---|"]
    for label, call in data.items():
        order = list(call["servers"])
        rows = rounds_by_row(call)
        for server, conc in sorted(rows, key=lambda sc: (sc[1], order.index(sc[0]) if sc[0] in order else len(order))):
            ms = rows[(server, conc)]
            lines.append(f"| {label} | {server} | {conc} | {_cell(ms, 'output_throughput', '{:.0f}')} | "
                         f"{_cell(ms, 'median_itl_ms', '{:.2f}')} | {_cell(ms, 'p99_itl_ms', '{:.2f}')} | "
                         f"{_cell(ms, 'median_tpot_ms', '{:.2f}')} | {_cell(ms, 'accept_length', '{:.2f}')} |")
    return "\n".join(lines)


def plot(data: dict, path: Path, gpu: str = "H200") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{server} c{conc}" + (f" ({label})" if len(data) > 1 else ""), ms) for label, call in data.items()
            for (server, conc), ms in rounds_by_row(call).items()]
    nr = max((max(ms) for _, ms in rows), default=1)
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(rows) + 2))
    h = 0.8 / nr
    for ax, metric, title in ((axes[0], "output_throughput", "output throughput (tok/s)"),
                              (axes[1], "median_itl_ms", "median ITL (ms)")):
        for r in range(1, nr + 1):
            ax.barh([i + (r - 1) * h for i in range(len(rows))],
                    [(ms[r].get(metric) or 0) if r in ms else 0 for _, ms in rows], height=h, label=f"round {r}")
        ax.set_yticks([i + 0.4 - h / 2 for i in range(len(rows))],
                      [r for r, _ in rows] if ax is axes[0] else [""] * len(rows), fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title)
    if nr > 1:
        axes[0].legend(fontsize=8)
    first = next((m for _, ms in rows for m in ms.values()), {})
    fig.suptitle(f"SGLang 0.5.23 bench_serving on one {gpu}, CUDA graphs on (random {first.get('random_input_len')} in"
                 f" / {first.get('random_output_len')} out, rate inf)\n"
                 "servers up together, benchmarked one at a time; rows of one call are one run", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--call", action="append", required=True, help="LABEL=path/to/results.json (repeat)")
    p.add_argument("--out", required=True, help="output path without suffix (.json and .png are written)")
    p.add_argument("--device-command", default=DEVICE_COMMAND, help="what ran on the device (for the meta)")
    p.add_argument("--profiles", action="append", default=[],
                   help="a profiles.json of bench/h200/h200_profile.py summaries to keep beside the rows (repeat)")
    p.add_argument("--gpu", default="H200", help="the card the calls ran on (the device tool's reply names it)")
    p.add_argument("--commit", help="the commit whose code ran (default: HEAD)")
    p.add_argument("--note", default="a call label names one run (UTC): its servers were started once and each row "
                                      "benchmarked while the others idled; rows of different labels are different runs")
    a = p.parse_args(argv)
    calls = dict(c.split("=", 1) for c in a.call)
    data = gather(calls)
    out = Path(a.out)
    import subprocess

    head = subprocess.run(["git", "rev-parse", a.commit or "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    meta = {"command": "python bench/sglang_h200_fleet.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "device_command": a.device_command, "device": f"1x NVIDIA {a.gpu} (device tool), torch 2.11, Triton 3.6",
            "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": head, "note": a.note}
    doc = {"meta": meta, "calls": data}
    if a.profiles:
        doc["profiles"] = {k: v for path in a.profiles for k, v in json.loads(Path(path).read_text()).items()}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    plot(data, out.with_suffix(".png"), a.gpu)
    print(table(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
