"""Speculative decoding on real text: how many prompt-lookup drafts the trained tiny models accept, what that
buys on this machine, and what it would buy on the H200 given the verify costs measured there.

The native engine (`sglang_replayssm.native`) serves the committed tiny models (byte-level, trained on the
Python standard library: `sglang_replayssm/native/assets/tiny-*-hybrid`) greedily over prompts cut from
the held-out files of that corpus (`tools/corpus.py`: never seen in training), once without drafts and
once per draft count k. For every k it records

  * exactness: the tokens must equal the k = 0 run's, token for token (the run fails otherwise);
  * drafts proposed / accepted, the acceptance rate, and tokens per row-step (1 + accepted drafts on a
    verify step, 1 on a plain decode step);
  * wall-clock tokens/s of the whole run on this machine against k = 0 in the same run;
  * a projection for the H200 at batch 1 and 64: the tokens per row-step measured here divided by the
    cost of a verify of T = 1 + k tokens plus its commit in decode steps, measured on the H200 in the
    native engine with 4B-parameter models (`bench/results/e2e_b1_64_graph_<model>.json`: T = 5 and 8,
    every draft accepted). Every verify step is charged the cost of T = 1 + k even when the drafter
    offered fewer drafts, so the projection leans low.

Greedy decoding of models this small repeats itself (the distinct 8-gram share of their output is
recorded), and prompt lookup predicts repetition well: the models' acceptance leans high. So the same
drafter is also run on the held-out text itself ("real_text": the drafts checked against the file's true
continuation, as if the model predicted the text exactly), which is what the drafter can get from real
code, with the same projection.

    python bench/spec_decode.py                        # both tiny models, k = 0 1 2 4 7 (CPU, ~2 min)
    python bench/spec_decode.py --quick                # one model, few tokens (a check, seconds)
    python bench/spec_decode.py --plot bench/results/spec_decode.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_replayssm.flags import ReplaySSMOptions  # noqa: E402
from sglang_replayssm.native import drafter  # noqa: E402
from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams  # noqa: E402
from tools import corpus  # noqa: E402

ASSETS = ROOT / "sglang_replayssm" / "native" / "assets"
MODELS = ("tiny-gdn-hybrid", "tiny-mamba2-hybrid")
# the H200 model whose verify costs stand for each tiny model's family
H200_MODEL = {"gdn": "qwen3.5-4b", "mamba2": "nemotron-3-nano-4b"}


def heldout_texts(n: int, length: int, more: int) -> list[tuple[list[int], list[int]]]:
    """n (prompt, continuation) pairs: `length` prompt tokens (BOS + the first bytes of a file) and the
    file's next `more` bytes, from held-out files spread evenly over the sorted list (shorter files
    are skipped)."""
    root = corpus.stdlib_dir()
    files = [f for f in corpus.stdlib_files(root) if corpus.is_heldout(f)]
    texts = [(root / f).read_bytes() for f in files]
    texts = [t for t in texts if len(t) >= length - 1 + more]
    if len(texts) < n:
        raise SystemExit(f"only {len(texts)} held-out files have {length - 1 + more} bytes; ask for fewer or "
                         "shorter prompts")
    step = len(texts) / n
    picked = [texts[int(i * step)] for i in range(n)]
    return [([corpus.BOS] + list(t[:length - 1]), list(t[length - 1:length - 1 + more])) for t in picked]


def distinct_ngrams(seqs, n: int = 8) -> float:
    """Share of distinct n-grams among all n-grams of the sequences (1.0: nothing repeats)."""
    grams = [tuple(s[i:i + n]) for s in seqs for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def real_text(pairs, k: int) -> dict:
    """The drafter on the true text: at each row-step, k drafts from everything so far, accepted while
    they equal the file's next bytes; the step then emits the accepted drafts and one more true byte."""
    steps = verify = drafted = accepted = tokens = 0
    for prompt, cont in pairs:
        seq, pos = list(prompt), 0
        while pos < len(cont):
            d = drafter.propose(seq, min(k, len(cont) - pos - 1)) if k else []
            n = 0
            while n < len(d) and d[n] == cont[pos + n]:
                n += 1
            seq += cont[pos:pos + n + 1]
            pos += n + 1
            steps += 1
            verify += bool(d)
            drafted += len(d)
            accepted += n
            tokens += n + 1
    return {"row_steps": steps, "verify_steps": verify, "draft_tokens": drafted, "accepted_draft_tokens": accepted,
            "acceptance": accepted / drafted if drafted else None, "tokens_per_row_step": tokens / steps}


def projection(r: dict, k: int, by_batch: dict) -> dict:
    """{batch: speedup} on the H200: tokens per row-step over the row-steps' cost in decode steps (a verify
    step charged the measured verify + commit of T = 1 + k, a plain decode step 1)."""
    out = {}
    for b, by_t in by_batch.items():
        if k and (k + 1) in by_t and r["row_steps"]:
            cost = r["row_steps"] - r["verify_steps"] + r["verify_steps"] * by_t[k + 1]
            out[str(b)] = r["tokens_per_row_step"] * r["row_steps"] / cost
    return out


def h200_costs(results_dir: Path) -> dict:
    """{model: {batch: {T: verify + commit over one decode step}}} from the committed H200 runs."""
    out = {}
    for model in H200_MODEL.values():
        path = results_dir / f"e2e_b1_64_graph_{model}.json"
        if not path.exists():
            continue
        runs = json.loads(path.read_text())["models"][model]["batches_fused"]
        out[model] = {int(b): {int(t): s["verify_commit_over_decode"] for t, s in r.get("spec", {}).items()}
                      for b, r in runs.items()}
    return out


def run(model: str, k: int, prompts, args) -> dict:
    eng = Engine(EngineArgs(model_path=str(ASSETS / model), device=args.device, max_running_requests=args.batch,
                            max_model_len=args.prompt_tokens + args.max_tokens + 8, speculative_num_draft_tokens=k,
                            replayssm=ReplaySSMOptions(window=args.window, read_copy="none"),   # fp32 reads (as committed)
                            kernels=args.kernels))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    eng.generate(prompts[:1], SamplingParams(max_tokens=4, ignore_eos=True))   # warm-up (first-call costs)
    before = dict(eng.counters)
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    wall = time.perf_counter() - t0
    c = {n: eng.counters[n] - before[n] for n in ("steps", "verify_steps", "decode_steps", "draft_tokens",
                                                 "accepted_draft_tokens", "generation_tokens")}
    # every request's first token comes from its prefill; the rest from decode / verify row-steps
    stepped = c["generation_tokens"] - len(prompts)
    row_steps = stepped - c["accepted_draft_tokens"]   # each row-step emits 1 + its accepted drafts
    if args.batch > 1:   # per row: a batch's verify step is a verify step of each of its rows
        c["verify_steps"] = None
    return {"outputs": outs, "family": eng.cfg.family, "wall_s": wall, "tokens": c["generation_tokens"],
            "tokens_per_s": c["generation_tokens"] / wall, **c, "row_steps": row_steps,
            "acceptance": c["accepted_draft_tokens"] / c["draft_tokens"] if c["draft_tokens"] else None,
            "tokens_per_row_step": stepped / row_steps if row_steps else None,
            "distinct_8grams": distinct_ngrams(outs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), help=f"asset names ({', '.join(MODELS)})")
    p.add_argument("--drafts", nargs="+", type=int, default=[0, 1, 2, 4, 7], help="draft counts k (0 is added)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=384)
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--batch", type=int, default=1, help="requests decoded together (max_running_requests)")
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--kernels", choices=("auto", "triton", "reference"), default="auto")
    p.add_argument("--quick", action="store_true", help="one model, 2 prompts, 32 tokens, k = 0 4")
    p.add_argument("--results-dir", default=str(ROOT / "bench" / "results"), help="where the H200 e2e JSONs are")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/spec_decode[_quick].json)")
    p.add_argument("--plot", default=None, metavar="JSON", help="only redraw the PNG of a results JSON")
    args = p.parse_args(argv)
    if args.plot:
        plot(json.loads(Path(args.plot).read_text()), Path(args.plot).with_suffix(".png"))
        return 0
    unknown = [m for m in args.models if not (ASSETS / m).is_dir()]
    if unknown:
        p.error(f"--models: no asset {unknown[0]!r} (have {', '.join(MODELS)})")
    if any(k < 0 for k in args.drafts):
        p.error("--drafts: counts must be >= 0")
    if args.quick:
        args.models, args.drafts, args.prompts, args.prompt_tokens, args.max_tokens = \
            args.models[:1], [0, 4], 2, 96, 32
    drafts = sorted(set(args.drafts) | {0})
    out = Path(args.out or ROOT / "bench" / "results" / f"spec_decode{'_quick' if args.quick else ''}.json")
    pairs = heldout_texts(args.prompts, args.prompt_tokens, args.max_tokens)
    prompts = [p_ for p_, _ in pairs]
    costs = h200_costs(Path(args.results_dir))
    res = {"command": "python bench/spec_decode.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": args.device,
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs" if args.device == "cpu"
           else torch.cuda.get_device_name(0), "torch": torch.__version__,
           "prompts": args.prompts, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
           "batch": args.batch, "window": args.window, "h200_costs": costs, "models": {}, "real_text": {
               "distinct_8grams": distinct_ngrams([c for _, c in pairs])}}
    for k in drafts:
        r = real_text(pairs, k)
        r["h200_projection"] = {m: projection(r, k, by_b) for m, by_b in costs.items()}
        res["real_text"][str(k)] = r
        acc = "—" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        proj = "; ".join(f"{m} " + ", ".join(f"B={b} {v:.2f}x" for b, v in pr.items())
                         for m, pr in r["h200_projection"].items() if pr) or "—"
        print(f"{'held-out text':20s} k={k}  acceptance {acc}  tokens/row-step {r['tokens_per_row_step']:.2f}  "
              f"H200 projection {proj}", flush=True)
    failed = []
    for model in args.models:
        rows, base = {}, None
        for k in drafts:
            r = run(model, k, prompts, args)
            outs = r.pop("outputs")
            if base is None:
                base = (outs, r)
            r["identical_to_greedy"] = outs == base[0]
            r["speedup_vs_greedy"] = r["tokens_per_s"] / base[1]["tokens_per_s"]
            r["h200_projection"] = (projection(r, k, costs.get(H200_MODEL[r["family"]], {}))
                                    if r["verify_steps"] is not None else {})
            rows[str(k)] = r
            acc = "—" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
            proj = ", ".join(f"B={b} {v:.2f}x" for b, v in r["h200_projection"].items()) or "—"
            print(f"{model:20s} k={k}  {r['tokens']:5d} tokens  {r['tokens_per_s']:8.1f} tok/s "
                  f"({r['speedup_vs_greedy']:.2f}x)  acceptance {acc}  tokens/row-step "
                  f"{r['tokens_per_row_step']:.2f}  distinct 8-grams {r['distinct_8grams']:.2f}  identical "
                  f"{r['identical_to_greedy']}  H200 projection {proj}",
                  flush=True)
            if not r["identical_to_greedy"]:
                failed.append(f"{model} k={k}")
        res["models"][model] = rows
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    plot(res, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    if failed:
        print(f"speculative decoding changed the greedy tokens: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    series = {m: rows for m, rows in res["models"].items()}       # the tiny models' own greedy streams
    text = {k: r for k, r in res["real_text"].items() if k != "distinct_8grams"}
    ks = sorted({int(k) for rows in list(series.values()) + [text] for k in rows})
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))

    def bars(ax, named, labels, value):
        w = 0.8 / len(named)
        for i, (name, rows) in enumerate(named.items()):
            xs = [x + (i - (len(named) - 1) / 2) * w for x in range(len(labels))]
            vals = [value(rows, lab) for lab in labels]
            ax.bar([x for x, v in zip(xs, vals) if v], [v for v in vals if v], w, label=name)
        ax.set_xticks(range(len(labels)))
    tps = lambda rows, k: rows.get(str(k), {}).get("tokens_per_row_step")   # noqa: E731
    bars(axes[0], {**series, "held-out text (drafter alone)": text}, ks, tps)
    axes[0].set_xticklabels([f"k={k}" for k in ks])
    bars(axes[1], series, ks, lambda rows, k: rows.get(str(k), {}).get("speedup_vs_greedy"))
    axes[1].set_xticklabels([f"k={k}" for k in ks])
    proj = {f"{m} (its H200 family)": {lab: v for k, r in rows.items() for b, v in r["h200_projection"].items()
                                       for lab in [(int(k), int(b))]} for m, rows in series.items()}
    for h200 in res["h200_costs"]:
        proj[f"held-out text, {h200} costs"] = {(int(k), int(b)): v for k, r in text.items()
                                                for b, v in r["h200_projection"].get(h200, {}).items()}
    labels = sorted({lab for d in proj.values() for lab in d}, key=lambda kb: (kb[1], kb[0]))
    bars(axes[2], proj, labels, lambda d, lab: d.get(lab))
    axes[2].set_xticklabels([f"k={k}\nB={b}" for k, b in labels])
    axes[0].set_title("tokens per row-step (1 + accepted drafts)")
    axes[1].set_title(f"tokens/s against k = 0 ({res['machine']}, batch {res['batch']})", fontsize=9)
    axes[2].set_title("H200 projection: tokens per row-step / verify + commit cost")
    for ax in axes:
        ax.axhline(1.0, color="k", lw=0.6)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"prompt-lookup drafts, greedy, {res['prompts']} held-out prompts of {res['prompt_tokens']} "
                 f"bytes, {res['max_tokens']} tokens each", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
