"""Numerical fidelity of ReplaySSM state precisions over long generations, on the small trained models.

Teacher-forced over long held-out text (tools/corpus.py), every configuration decodes every token
(window L = 16, from an empty state) and we measure, per position bucket, the KL divergence of its
next-token distribution from fp32-state decoding, and the relative error of the SSM layers' outputs:

  fp32                 baseline: fp32 recurrence, no read copy (ReplaySSM with fp32 everything is
                       conventional decoding up to float rounding; `fp32_floor` below measures that)
  shared-fp8/nvfp4     the checkpoint itself is quantized at every flush (error feeds the recurrence)
  fp8/nvfp4 + fp32     separate precisions: fp32 recurrence checkpoint, low-precision read copy
  fp8/nvfp4 + fp16-SR  separate precisions: fp16 checkpoint with stochastic rounding, read copy

How: all configurations x text streams are rows of one batch; the model runs layer by layer over the
whole sequence (`tools.tiny_lm.sequence_forward`: the engine's per-layer maths of native/blocks.py;
attention / MLP / conv are exact per row). SSM layers run `windowed_ssm`: the ReplaySSM
decode semantics of the pool (reference/replay.py) in window form — inside a window the 15 non-flush
tokens read the read copy, records (d, k, g) combined with the two-matmul output form; the flush token
and the fold take the window from the recurrence checkpoint (a delta family's d solved from it, the exact
flush: the read copy never reaches the recurrence), and the flush rewrites the read copy with the quantizers of reference/quant.py (fp8 rows, NVFP4, fp16 SR with the
pool's stream / element-index convention). tests/fidelity checks it against the reference pool path.

    python bench/fidelity.py --quick                                   # CPU, 2K tokens
    python bench/fidelity.py --tokens 65536 --streams 8 --device cuda  # H200
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_replayssm.native.loader import load_model  # noqa: E402
from sglang_replayssm.reference.core import expand_heads  # noqa: E402
from sglang_replayssm.reference.quant import fake_quant, round_fp16_sr, state_element_index  # noqa: E402
from tools import corpus, tiny_lm  # noqa: E402

WINDOW = 16
# name -> (recurrence checkpoint precision, read copy, shared quantized checkpoint)
CONFIGS = {
    "fp32": ("fp32", "none", False),
    "shared-fp8": ("fp32", "fp8", True),
    "shared-nvfp4": ("fp32", "nvfp4", True),
    "fp8-read+fp32": ("fp32", "fp8", False),
    "nvfp4-read+fp32": ("fp32", "nvfp4", False),
    "fp8-read+fp16sr": ("fp16-sr", "fp8", False),
    "nvfp4-read+fp16sr": ("fp16-sr", "nvfp4", False),
}


# ----------------------------------------------------------------------------- SSM layer, window form
class _Rows:
    """Row groups of a batch by storage rule."""

    def __init__(self, rows: list[tuple], device):
        ix = lambda pred: torch.tensor([i for i, r in enumerate(rows) if pred(r)], dtype=torch.long,  # noqa: E731
                                       device=device)
        self.fp8 = ix(lambda r: r[1] == "fp8")
        self.nvfp4 = ix(lambda r: r[1] == "nvfp4")
        self.shared = ix(lambda r: r[2])
        self.sr = ix(lambda r: r[0] == "fp16-sr")
        for r in rows:
            if r[2] and r[1] == "none":
                raise ValueError("a shared quantized checkpoint needs a read-copy format")
            if r[0] not in ("fp32", "fp16-sr"):
                raise ValueError(f"checkpoint precision {r[0]!r}: expected fp32 or fp16-sr")


def _sr_fp16(x, seed, stream, idx):
    """reference.quant.round_fp16_sr, run on the CPU where the device lacks half nextafter."""
    try:
        return round_fp16_sr(x, seed, stream, idx).float()
    except (RuntimeError, NotImplementedError):
        return round_fp16_sr(x.cpu(), seed, stream, idx.cpu()).float().to(x.device)


def _store(S_new, rows: _Rows, layer_idx, stream: int, sr_seed: int):
    """A flush: (recurrence checkpoint, read copy) of every row after folding into S_new (fp32)."""
    Sr = S_new.clone()
    for kind, ix in (("fp8", rows.fp8), ("nvfp4", rows.nvfp4)):
        if ix.numel():
            Sr[ix] = fake_quant(S_new[ix], kind)
    S = S_new
    if rows.shared.numel() or rows.sr.numel():
        S = S_new.clone()
        if rows.shared.numel():
            S[rows.shared] = Sr[rows.shared]
        if rows.sr.numel():
            S[rows.sr] = _sr_fp16(S_new[rows.sr], sr_seed, stream, layer_idx)
    return S, Sr


def windowed_ssm(q, k, v, g, beta, rows: list[tuple], layer: int, window: int = WINDOW, sr_seed: int = 0,
                 block: int = 256) -> torch.Tensor:
    """ReplaySSM decoding of every token of every row, from an empty state, in window form.

    Core inputs as in `tools.tiny_lm.chunked_ssm` (``q, k [R, T, Hk, Dk]`` per key head, ``v [R, T, H,
    Dv]``, ``g, beta [R, T, H]``, beta None for Mamba-2); ``rows[r] = (ckpt, read_copy, shared)``;
    ``layer`` the SSM layer's index in the pool (stochastic-rounding element index). ``T`` must be a
    multiple of the window. Returns ``o [R, T, H, Dv]`` (fp32)."""
    R, T, Hk, Dk = q.shape
    H, Dv = v.shape[2], v.shape[-1]
    L = window
    if T % L:
        raise ValueError(f"sequence length {T} is not a multiple of the window {L}")
    dev = q.device
    groups = _Rows(rows, dev)
    idx = state_element_index((H, Dv, Dk), layer, device=dev)
    S = torch.zeros(R, H, Dv, Dk, device=dev)      # recurrence checkpoint (fp16-SR rows hold fp16 values)
    Sr = torch.zeros_like(S)                        # what non-flush tokens read (dequantized read copy)
    out = torch.empty(R, T, H, Dv, device=dev)
    causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    strict = causal.tril(-1)
    eye = torch.eye(L, device=dev)
    nW = T // L
    for w0 in range(0, nW, block):
        nb = min(block, nW - w0)
        sl = slice(w0 * L, (w0 + nb) * L)
        per = lambda t, d: expand_heads(t[:, sl].float(), H).reshape(R, nb, L, H, d).permute(0, 3, 1, 2, 4)  # noqa: E731
        qb, kb, vb = per(q, Dk), per(k, Dk), per(v, Dv)                        # [R, H, nb, L, *]
        G = g[:, sl].float().reshape(R, nb, L, H).permute(0, 3, 1, 2).cumsum(-1)
        Lm = torch.exp((G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~causal, float("-inf")))
        QKL = (qb @ kb.transpose(-1, -2)) * Lm
        eG = torch.exp(G).unsqueeze(-1)
        Qd = qb * eG
        Gl = G[..., -1]
        Kd = kb * torch.exp(Gl.unsqueeze(-1) - G).unsqueeze(-1)
        if beta is not None:
            bt = beta[:, sl].float().reshape(R, nb, L, H).permute(0, 3, 1, 2).unsqueeze(-1)
            M = eye + bt * ((kb @ kb.transpose(-1, -2)) * Lm * strict)
            Minv = torch.linalg.solve_triangular(M, eye.expand_as(M), upper=False, unitriangular=True)
            Kb = bt * eG * kb
            Vb = bt * vb
        decay = torch.exp(Gl)
        ob = torch.empty(R, H, nb, L, Dv, device=dev)
        for w in range(nb):
            Srt, St = Sr.transpose(-1, -2), S.transpose(-1, -2)
            # tokens 0..L-2 read the read copy; the flush token L-1 and the fold take the window from the
            # recurrence checkpoint (a delta family's d replayed from it: the exact flush)
            if beta is None:
                d_read = d = vb[:, :, w]
            else:
                d_read = Minv[:, :, w] @ (Vb[:, :, w] - Kb[:, :, w] @ Srt)
                d = Minv[:, :, w] @ (Vb[:, :, w] - Kb[:, :, w] @ St)
            o_read = Qd[:, :, w, :-1] @ Srt + QKL[:, :, w, :-1] @ d_read
            o_flush = Qd[:, :, w, -1:] @ St + QKL[:, :, w, -1:] @ d
            ob[:, :, w] = torch.cat([o_read, o_flush], dim=2)
            S_new = S * decay[:, :, w, None, None] + d.transpose(-1, -2) @ Kd[:, :, w]
            S, Sr = _store(S_new, groups, idx, (w0 + w + 1) * L, sr_seed)
        out[:, sl] = ob.permute(0, 2, 3, 1, 4).reshape(R, nb * L, H, Dv)
    return out


# ----------------------------------------------------------------------------- the model, teacher-forced
@torch.no_grad()
def teacher_forced(cfg, w, tokens: torch.Tensor, configs: dict, isolated: bool = True, window: int = WINDOW):
    """Run every configuration over every stream. tokens [S, T]. Returns (logits [C, S, T, V],
    ssm stats): per SSM layer and configuration, squared errors of the SSM outputs vs the first
    configuration, end to end (each row's own inputs) and isolated (the first configuration's inputs)."""
    names = list(configs)
    C, (Sn, T) = len(names), tokens.shape
    rows = [configs[n] for n in names for _ in range(Sn)]
    stats = []

    def run_core(i, *core):   # SSM block i: every configuration's window-form decode, and its error stats
        layer = len(stats)
        o = windowed_ssm(*core, rows, layer, window)
        ref = o[:Sn].repeat(C, 1, 1, 1)
        st = {"block": i, "sq_err": (o - ref).pow(2).sum((-1, -2)).view(C, Sn, T),
              "sq_ref": ref[:Sn].pow(2).sum((-1, -2)).view(Sn, T)}
        if isolated:
            base_core = tuple(None if t is None else t[:Sn].repeat(C, *([1] * (t.dim() - 1))) for t in core)
            oi = windowed_ssm(*base_core, rows, layer, window)
            st["sq_err_isolated"] = (oi - ref).pow(2).sum((-1, -2)).view(C, Sn, T)
        stats.append(st)
        return o

    logits = tiny_lm.sequence_forward(cfg, w, tokens.repeat(C, 1), run_core)      # [C*S, T, V]
    return logits.view(C, Sn, T, -1), stats


def kl_from_first(logits: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """KL(p_first || p_c) per position: logits [C, S, T, V] -> [C, S, T]."""
    C, Sn, T, V = logits.shape
    out = torch.empty(C, Sn, T, device=logits.device)
    for t0 in range(0, T, chunk):
        lp = torch.log_softmax(logits[:, :, t0:t0 + chunk].double(), dim=-1)
        out[:, :, t0:t0 + chunk] = (lp[0].exp() * (lp[0] - lp)).sum(-1).clamp_min(0).float()
    return out


def buckets_for(T: int) -> list[tuple[int, int]]:
    edges = [0, 256]
    while edges[-1] * 2 <= T:
        edges.append(edges[-1] * 2)
    if edges[-1] < T:
        edges.append(T)
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if a < T]


def bucketize(per_pos: torch.Tensor, bks, denom: torch.Tensor | None = None) -> tuple[list, list]:
    """per_pos [S, T] -> (mean over streams and positions per bucket, standard error over streams).
    With denom [S, T]: sqrt(sum per_pos / sum denom) (relative error), stderr over streams."""
    means, errs = [], []
    for a, b in bks:
        x = per_pos[:, a:b].double()
        if denom is None:
            per_stream = x.mean(1)
            m = x.mean()
        else:
            dd = denom[:, a:b].double()
            per_stream = (x.sum(1) / dd.sum(1)).sqrt()
            m = (x.sum() / dd.sum()).sqrt()
        n = per_stream.numel()
        means.append(float(m))
        errs.append(float(per_stream.std() / math.sqrt(n)) if n > 1 else 0.0)
    return means, errs


def run_family(model_dir, family: str, text: torch.Tensor, args, device) -> dict:
    cfg, w = load_model(model_dir)
    w = {k: v.to(device, torch.float32) for k, v in w.items()}
    T, Sn = args.tokens, args.streams
    if Sn * T > text.numel():
        raise SystemExit(f"--streams {Sn} x --tokens {T} exceed the held-out text ({text.numel()} tokens)")
    tokens = text[: Sn * T].view(Sn, T).to(device)
    names = list(CONFIGS)
    t0 = time.time()
    logits, stats = teacher_forced(cfg, w, tokens, CONFIGS, isolated=not args.no_isolated)
    if device.type == "cuda":
        torch.cuda.synchronize()
    secs = time.time() - t0
    kl = kl_from_first(logits)
    lp0 = torch.log_softmax(logits[0, :, :-1].double(), -1)
    bpb = float(-lp0.gather(-1, tokens[:, 1:, None].long()).mean() / math.log(2))
    del lp0
    # fp32 floor: the chunked (training) forward vs the fp32 window-form decode, same weights
    model = tiny_lm.TinyLM(json.loads((Path(model_dir) / "config.json").read_text()), weights=w).to(device)
    floor_T = min(T, 8192)
    with torch.no_grad():
        chunk_logits = model(tokens[:, :floor_T]).float()
    both = torch.stack([logits[0, :, :floor_T], chunk_logits])
    floor = float(kl_from_first(both)[1].mean())
    del model, chunk_logits, both
    bks = buckets_for(T)
    res = {"model": str(model_dir), "family": family, "params": sum(v.numel() for v in w.values()),
           "tokens": T, "streams": Sn, "window": WINDOW, "buckets": bks, "seconds": secs,
           "baseline_bits_per_byte": bpb, "fp32_floor_kl_chunked_vs_window": floor, "configs": {}}
    for c, name in enumerate(names):
        m, e = bucketize(kl[c], bks)
        entry = {"spec": dict(zip(("ckpt", "read_copy", "shared"), CONFIGS[name])), "kl": m, "kl_stderr": e,
                 "kl_mean": float(kl[c].mean()), "ssm_rel_err": [], "ssm_rel_err_isolated": []}
        for st in stats:
            entry["ssm_rel_err"].append({"block": st["block"], "rel_err": bucketize(st["sq_err"][c], bks, st["sq_ref"])[0]})
            if "sq_err_isolated" in st:
                entry["ssm_rel_err_isolated"].append(
                    {"block": st["block"], "rel_err": bucketize(st["sq_err_isolated"][c], bks, st["sq_ref"])[0]})
        if c:
            k1 = [i for i, (a, _) in enumerate(bks) if a >= 1024]
            if k1:
                entry["kl_at_1k"] = m[k1[0]]
                entry["kl_longest"] = m[-1]
                entry["longest_over_1k"] = m[-1] / m[k1[0]] if m[k1[0]] > 0 else float("inf")
                # the same ratio stream by stream: its spread says how much of it is the text, not the length
                (a1, b1), (aL, bL) = bks[k1[0]], bks[-1]
                first, last = kl[c][:, a1:b1].double().mean(1), kl[c][:, aL:bL].double().mean(1)
                entry["longest_over_1k_streams"] = (last / first.clamp_min(1e-30)).tolist()
        res["configs"][name] = entry
    return res


def plot(results: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = list(results["families"])
    fig, axes = plt.subplots(1, len(fams), figsize=(6.5 * len(fams), 4.6), squeeze=False)
    styles = {"shared": "--", "fp32": "-", "fp16sr": ":"}
    for ax, fam in zip(axes[0], fams):
        r = results["families"][fam]
        mids = [math.sqrt(max(a, 1) * b) for a, b in r["buckets"]]
        for name, e in r["configs"].items():
            if name == "fp32":
                continue
            ls = styles["shared"] if name.startswith("shared") else styles["fp16sr" if "fp16sr" in name else "fp32"]
            ax.errorbar(mids, e["kl"], yerr=e["kl_stderr"], ls=ls, marker="o", ms=3, capsize=2, label=name)
        ax.axhline(0.0038, color="grey", lw=0.8, label="target 0.0038")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("position (tokens, bucket geometric mid)")
        ax.set_ylabel("KL(fp32 || config), nats/token")
        ax.set_title(f"{fam}: {r['params'] / 1e6:.1f} M params, L={r['window']}, {r['streams']} streams")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CPU-sized: 2048 tokens, 1 stream")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--families", default="mamba2,gdn")
    ap.add_argument("--model", action="append", default=[], metavar="FAMILY=DIR",
                    help="model folder per family (default: the committed assets)")
    ap.add_argument("--corpus", default=None, help="packed corpus .npz (tools/corpus.py)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-isolated", action="store_true", help="skip the isolated per-layer SSM error pass")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fidelity"), help="output path prefix")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="only combine result JSONs of separate runs (one family each) into --out .json/.png")
    args = ap.parse_args(argv)
    if args.merge:
        parts = [json.loads(Path(p).read_text()) for p in args.merge]
        results = dict(parts[0], families={}, command=[p["command"] for p in parts])
        for p in parts:
            results["families"].update(p["families"])
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
        plot(results, out.with_suffix(".png"))
        return results
    if args.quick:
        args.tokens, args.streams = 2048, 1
        if args.out == str(ROOT / "bench" / "results" / "fidelity"):
            args.out += "_quick"
    if args.tokens < WINDOW or args.tokens % WINDOW:
        ap.error(f"--tokens must be a positive multiple of the window ({WINDOW})")
    if args.streams < 1:
        ap.error("--streams must be >= 1")
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dirs = {f: tiny_lm.asset_path(f) for f in tiny_lm.FAMILIES}
    for spec in args.model:
        fam, _, d = spec.partition("=")
        if fam not in dirs or not d:
            ap.error(f"--model {spec!r}: expected FAMILY=DIR with FAMILY in {tiny_lm.FAMILIES}")
        dirs[fam] = Path(d)
    fams = [f for f in args.families.split(",") if f]
    for f in fams:
        if f not in dirs:
            ap.error(f"--families: unknown family {f!r}")
    data = corpus.load(args.corpus)
    results = {"command": "python bench/fidelity.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "corpus": data["source"], "target_kl": 0.0038, "families": {}}
    for f in fams:
        r = run_family(dirs[f], f, data["heldout"], args, device)
        results["families"][f] = r
        print(f"== {f}: {r['tokens']} tokens x {r['streams']} streams, {r['seconds']:.1f}s, baseline "
              f"{r['baseline_bits_per_byte']:.3f} bits/byte, fp32 floor KL {r['fp32_floor_kl_chunked_vs_window']:.2e}")
        print("   buckets " + " ".join(f"{a}-{b}" for a, b in r["buckets"]))
        for name, e in r["configs"].items():
            extra = f"  longest/1K {e['longest_over_1k']:.2f}" if "longest_over_1k" in e else ""
            print(f"   {name:18s} KL " + " ".join(f"{x:.2e}" for x in e["kl"]) + extra, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
