"""Where a profiled SGLang step goes, and the most a faster SSM could win there (issue 29's missed targets).

    python bench/h200/step_breakdown.py RESULTS.json [--vs OURS=PEER ...] [--json OUT]

RESULTS.json: a serving result with the profile summaries of ``bench/h200/h200_profile.py`` (its ``profiles``). For
each profiled server, per step: the step (ms), the GPU busy and idle time, the SSM kernels' time (the summary's
``ssm`` class: every SSM, short-conv, fold and commit kernel), the attention kernels' time among the 15 kernels of
most GPU time (classed with ``h200_profile.kernel_class``, so SGLang's Triton attention counts as attention in
summaries written before it was classed so), and the rest of the busy time.

``--vs OURS=PEER`` (default: every ``*ours*`` server against each server of the same family and draft mode) adds
the ceiling of ours against that peer: ``peer step / (peer step - peer SSM time)``, the ratio ours would reach if
its SSM kernels cost nothing and every other part of its step were the peer's. A target above that ceiling cannot
be met by the SSM kernels at that batch, whatever they do.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("h200_profile", Path(__file__).resolve().parent / "h200_profile.py")
_prof = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_prof)


def breakdown(summary: dict) -> dict:
    """One profile summary -> ms per step by part (step, busy, idle, ssm, attention, other busy)."""
    steps = max(1, int(summary["steps"]))
    step = float(summary["step_ms"])
    busy = float(summary["kernels"]["busy_ms"]) / steps
    ssm = busy * float(summary["kernels"]["share_of_busy"].get("ssm", 0.0))
    attention = sum(k["ms"] for k in summary["kernels"]["top"] if _prof.kernel_class(k["name"]) == "attention")
    attention = max(attention / steps, busy * float(summary["kernels"]["share_of_busy"].get("attention", 0.0)))
    return {"step_ms": step, "busy_ms": busy, "idle_ms": max(step - busy, 0.0), "ssm_ms": ssm,
            "attention_ms": attention, "other_busy_ms": max(busy - ssm - attention, 0.0),
            "conc": summary.get("conc")}


def ceiling(peer: dict) -> float:
    """The most ours can reach against ``peer`` (a breakdown) with SSM kernels that cost nothing."""
    rest = peer["step_ms"] - peer["ssm_ms"]
    return peer["step_ms"] / rest if rest > 0 else float("inf")


def _family(name: str) -> str:
    return name.split("_", 1)[0]


def _mode(name: str) -> str:
    if "_ngram" in name:
        return "ngram_chain" if "_ngram_chain" in name else "ngram"
    return "radix" if "_radix" in name else "nodraft"


def default_pairs(names: list[str]) -> list[tuple[str, str]]:
    """Every ours server (no python-stack profile) against each peer of its family, draft mode and concurrency
    suffix."""
    plain = [n for n in names if "_stack" not in n]

    def key(n):
        conc = re.search(r"_c(\d+)$", n)
        return _family(n), _mode(n), conc.group(1) if conc else ""

    return [(o, p) for o in plain if "_ours" in o for p in plain
            if "_ours" not in p and key(p) == key(o)]


def report(profiles: dict, pairs: list[tuple[str, str]] | None = None) -> dict:
    rows = {n: breakdown(s) for n, s in profiles.items() if "error" not in s}
    pairs = default_pairs(list(rows)) if pairs is None else pairs
    vs = {f"{o} vs {p}": {"measured_step_ratio": rows[p]["step_ms"] / rows[o]["step_ms"],
                          "ceiling": ceiling(rows[p])}
          for o, p in pairs if o in rows and p in rows}
    return {"servers": rows, "vs": vs}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--vs", action="append", default=[], metavar="OURS=PEER")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    profiles = json.loads(a.results.read_text()).get("profiles") or {}
    if not profiles:
        sys.exit(f"{a.results}: no profile summaries ('profiles')")
    pairs = [tuple(v.split("=", 1)) for v in a.vs] or None
    out = report(profiles, pairs)
    print(f"{'server':34s} {'conc':>4s} {'step':>7s} {'idle':>6s} {'ssm':>6s} {'attn':>6s} {'other':>6s}  (ms/step)")
    for n, r in out["servers"].items():
        print(f"{n:34s} {r['conc'] or '':>4} {r['step_ms']:7.2f} {r['idle_ms']:6.2f} {r['ssm_ms']:6.2f} "
              f"{r['attention_ms']:6.2f} {r['other_busy_ms']:6.2f}")
    for k, v in out["vs"].items():
        print(f"{k:60s} step ratio {v['measured_step_ratio']:.3f}, ceiling {v['ceiling']:.3f}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
