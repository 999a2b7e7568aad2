"""End-to-end decode-step benchmark of the native engine: ReplaySSM vs conventional SSM decoding in
the same engine and run, on hybrid models with random weights.

  nemotron-3-nano-4b  Nemotron-H-shaped: 21 Mamba-2 + 4 attention layers (each followed by an MLP),
                      hidden 3072, Mamba-2 96 heads x 80 x 128 (8 groups), attention 32/8 heads x 128
  qwen3.5-4b          Qwen3.5-shaped: 24 Gated DeltaNet + 8 attention layers (+ gated MLP), hidden 2560,
                      GDN 16 k-heads / 32 v-heads x 128 x 128, attention 16/4 heads x 256

A decode step is the whole model forward for a batch of B sequences (one token each), the pool's
cursor advance and greedy sampling, with no host synchronisation (CUDA graph when --cuda-graph).
ReplaySSM rows start with staggered ring cursors (row b at b % window), so every step has B/window
flush rows, as in steady-state serving. Speculative decoding: one verify step of T = 1 + drafts
tokens per row (output-only ReplaySSM verify, draft records appended) + the pointer commit.

  python bench/e2e.py                 # GPU: both models, batch 1/64/256/512, writes bench/results/e2e.json + .png
  python bench/e2e.py --quick         # CPU check with tiny shapes (seconds)
  python bench/e2e.py --plot bench/results/e2e.json   # redraw the PNG from a JSON
  python bench/e2e.py --fused both    # GPU: time every mode with the fused non-SSM kernels off and on
  python bench/e2e_kernel_counts.py   # CPU: device kernels per decode/verify forward, fused off vs on
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_replayssm import accounting  # noqa: E402
from sglang_replayssm.native.config import HybridConfig  # noqa: E402
from sglang_replayssm.native.model import ForwardContext, HybridModel, KVCache, random_weights  # noqa: E402
from sglang_replayssm.native.ssm_ops import SSMOps  # noqa: E402
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry  # noqa: E402


def nemotron_blocks(n_ssm: int, n_attn: int) -> list[str]:
    """Mixers with attention spread evenly, each mixer followed by an MLP block (Nemotron-H style)."""
    n = n_ssm + n_attn
    attn_at = {round((i + 1) * n / (n_attn + 1)) - 1 for i in range(n_attn)} if n_attn else set()
    out = []
    for i in range(n):
        out += ["attention" if i in attn_at else "ssm", "mlp"]
    return out


def model_config(name: str) -> HybridConfig:
    if name == "nemotron-3-nano-4b":
        blocks = nemotron_blocks(21, 4)
        return HybridConfig(arch="nemotron_h", vocab_size=131072, hidden_size=3072, blocks=blocks,
                            block_layer=list(range(len(blocks))), num_attention_heads=32, num_key_value_heads=8,
                            head_dim=128, intermediate_size=12288, mlp_act="relu2", ssm_heads=96,
                            ssm_head_v_dim=80, ssm_head_k_dim=128, ssm_k_heads=8, conv_kernel=4).validate()
    if name == "qwen3.5-4b":
        layers = ["attention" if (i + 1) % 4 == 0 else "ssm" for i in range(32)]
        blocks = [b for kind in layers for b in (kind, "mlp")]
        return HybridConfig(arch="qwen3_next", vocab_size=248320, hidden_size=2560, blocks=blocks,
                            block_layer=[i // 2 for i in range(len(blocks))], tie_word_embeddings=True,
                            num_attention_heads=16, num_key_value_heads=4, head_dim=256, attn_output_gate=True,
                            qk_norm=True, rotary_dim=64, intermediate_size=9216, mlp_act="silu", mlp_gated=True,
                            ssm_heads=32, ssm_head_v_dim=128, ssm_head_k_dim=128, ssm_k_heads=16, conv_kernel=4,
                            conv_bias=False, norm_eps=1e-6).validate()
    if name.startswith("tiny-"):
        fam = name.split("-", 1)[1]
        blocks = ["ssm", "mlp", "attention", "mlp", "ssm", "mlp"]
        extra = (dict(arch="nemotron_h", mlp_act="relu2") if fam == "mamba2" else
                 dict(arch="qwen3_next", mlp_act="silu", mlp_gated=True, attn_output_gate=True, qk_norm=True,
                      rotary_dim=8, conv_bias=False))
        return HybridConfig(vocab_size=512, hidden_size=64, blocks=blocks, block_layer=list(range(6)),
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                            ssm_heads=4, ssm_head_v_dim=16, ssm_head_k_dim=32, ssm_k_heads=2, **extra).validate()
    raise SystemExit(f"--models: unknown model {name!r}")


class Timer:
    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def __call__(self, fn, iters: int) -> float:
        """Mean milliseconds per call of fn over iters calls (device time on CUDA)."""
        if self.cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                fn()
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b) / iters
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t) * 1e3 / iters


MODES = {"conventional": ("conventional", "none"), "replay": ("replay", "none"), "replay-fp8": ("replay", "fp8"),
         "no-ssm": ("conventional", "none")}


class NoSSMOps:
    """Breakdown only (mode no-ssm): SSM layers output zeros and touch no state, so the step time
    is the floor set by everything else (projections, conv, attention, MLPs, LM head)."""

    backend = verify_backend = "none"

    def __init__(self, family: str):
        self.out_like = 0 if family == "mamba2" else 2   # x [B, T, H, P] / v [B, T, H, Dv]

    def run(self, layer, slots, mode, inputs, T):
        return torch.zeros_like(inputs[self.out_like])

    def forward_scope(self, mode, slots):
        return contextlib.nullcontext()


def make_state(cfg, model, batch, mode, window, max_drafts, ctx_len, device, kernels, seed=0, ops_options=None):
    """Pool (mode: conventional | replay | replay-fp8), KV cache and SSM ops for `batch` sequences (`ctx`: the
    ForwardContext of the model's forward), and their slots."""
    pool_mode, read_copy = MODES[mode]
    geo = SSMGeometry(family=cfg.family, num_heads=cfg.ssm_heads, head_v_dim=cfg.ssm_head_v_dim,
                      head_k_dim=cfg.ssm_head_k_dim, num_k_heads=cfg.ssm_k_heads, conv_dim=cfg.conv_dim,
                      conv_kernel=cfg.conv_kernel)
    rcfg = ReplayConfig(window=window, max_drafts=max_drafts, mode=pool_mode, read_copy=read_copy)
    pool = ReplayStatePool(geo, cfg.num_ssm_layers, batch, rcfg, device=device, act_dtype=model.dtype)
    slots = pool.alloc(batch)
    g = torch.Generator(device=device).manual_seed(seed)
    pool.ckpt.normal_(0.0, 0.02, generator=g)
    pool.conv.normal_(0.0, 0.5, generator=g)
    if pool.rc is not None:   # read copy of the random checkpoints (scale 1: values are small)
        for layer in range(pool.num_layers):
            pool.rc[layer].copy_(pool.ckpt[layer].to(pool.rc.dtype))
    if pool_mode == "replay":   # staggered rings: row b holds b % window committed records
        pool.rec_d.normal_(0.0, 0.02, generator=g)
        pool.rec_k.normal_(0.0, 0.1, generator=g)
        pool.rec_g.uniform_(-0.1, 0.0, generator=g)
        if pool.rec_v is not None:   # a delta family's raw inputs, which its fold replays
            pool.rec_v.normal_(0.0, 0.5, generator=g)
            pool.rec_beta.uniform_(0.0, 1.0, generator=g)
        idx = torch.tensor(slots, device=device)
        pool.cursor[idx] = (idx % window).to(torch.int32)
    kv = KVCache(cfg, batch + 1, ctx_len + 16, device, model.dtype)
    kv.k.normal_(0.0, 1.0, generator=g)
    kv.v.normal_(0.0, 1.0, generator=g)
    ops = NoSSMOps(cfg.family) if mode == "no-ssm" else SSMOps(cfg.family, pool, replay_verify=True, kernels=kernels,
                                                               **(ops_options or {}))
    idx = torch.tensor(slots, device=device)
    return SimpleNamespace(ctx=ForwardContext(pool, kv, ops), pool=pool, kv=kv, ops=ops, slot_list=slots,
                           slots=idx.to(torch.int32), slots_long=idx)


def ops_options(args, family: str) -> dict:
    """--decode-stages / --decode-method / --verify-method / --verify-block-v as SSMOps options ("split"
    verify: GDN only)."""
    from sglang_replayssm.kernels.tuning import KernelTuning

    out = {}
    dec = {}
    if getattr(args, "decode_stages", None):
        dec["tuning"] = KernelTuning(stages=args.decode_stages)
    if getattr(args, "decode_method", None):
        dec["method"] = args.decode_method
    if dec:
        out["decode_options"] = dec
    if getattr(args, "verify_method", None) and (family == "gdn" or args.verify_method != "split"):
        out["verify_options"] = {"method": args.verify_method}
    if getattr(args, "verify_block_v", None):
        out.setdefault("verify_options", {})["tuning"] = KernelTuning(block_v=args.verify_block_v)
    return out


def decode_bench(cfg, model, batch, mode, args, device, timer):
    st = make_state(cfg, model, batch, mode, args.window, 0, args.context, device, args.kernels,
                    ops_options=ops_options(args, cfg.family))
    pos = torch.full((batch,), args.context - 1, device=device, dtype=torch.long)
    tokens = torch.randint(0, cfg.vocab_size, (batch, 1), device=device)

    def step():
        logits = model.forward(tokens, pos, st.slots, "decode", st.ctx, args.context)
        st.pool.advance(st.slots_long)
        tokens.copy_(logits[:, 0].argmax(-1, keepdim=True))

    for _ in range(2):
        step()
    graph = capture(step, timer, args.cuda_graph)
    run = graph.replay if graph is not None else step
    for _ in range(3):
        run()
    ms = timer(run, args.iters)
    sizes = accounting.StateSizes.of(st.pool)
    rd = wr = 0
    for b in range(batch):   # one full window: every row goes through every ring phase once
        if mode == "no-ssm":
            break
        for c in range(args.window if mode != "conventional" else 1):
            r, w = accounting.decode_bytes(sizes, mode == "conventional", c, c + 1 >= args.window)
            rd, wr = rd + r, wr + w
    phases = args.window if mode != "conventional" else 1
    state_bytes = (rd + wr) / phases
    out = {"ms": ms, "graph": graph is not None, "backend": st.ops.backend, "state_bytes_per_step": state_bytes,
           "state_GBps": state_bytes / (ms * 1e-3) / 1e9, "tokens_per_s": batch / (ms * 1e-3)}
    if getattr(args, "profile", 0) and timer.cuda:   # where the step's device time goes, kernel by kernel (eager)
        out["kernels"] = profile_module().profile_steps([step] * 4)[:args.profile]
    st = graph = None   # free the pool and the graph before the next case
    return out


def capture(step, timer, enabled: bool):
    """A CUDA graph of step() (warmed up on a side stream), or None (CPU, disabled, or capture failed)."""
    if not (enabled and timer.cuda):
        return None
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return graph
    except Exception as e:   # noqa: BLE001 - report and fall back to eager
        print(f"    cuda graph capture failed ({type(e).__name__}: {e}); timing eager", flush=True)
        return None


def verify_bench(cfg, model, batch, T, args, device, timer):
    st = make_state(cfg, model, batch, "replay", args.window, T, args.context, device, args.kernels,
                    ops_options=ops_options(args, cfg.family))
    if st.ops.verify_backend != "triton" and timer.cuda:
        return {"skipped": f"no Triton verify kernel for {cfg.family} (reference verify is per-row Python)"}
    pos = torch.full((batch,), args.context - T, device=device, dtype=torch.long)
    tokens = torch.randint(0, cfg.vocab_size, (batch, T), device=device)
    accepted = [T] * batch

    def forward():   # device work only: capturable (begin_verify is host bookkeeping, done before)
        model.forward(tokens, pos, st.slots, "verify", st.ctx, args.context).argmax(-1)

    def commit():
        st.ops.accept_drafts(st.slot_list, accepted)

    for _ in range(args.window // T + 2):   # every path once (incl. the commit fold) before timing
        st.ops.begin_verify(st.slot_list, T)
        forward()
        commit()
    st.ops.begin_verify(st.slot_list, T)
    graph = capture(forward, timer, args.cuda_graph)
    commit()
    run_fwd = graph.replay if graph is not None else forward
    n = max(args.iters // 4, 1)
    fwd_ms = commit_ms = 0.0
    for _ in range(n):
        st.ops.begin_verify(st.slot_list, T)
        fwd_ms += timer(run_fwd, 1)
        commit_ms += timer(commit, 1)
    fwd_ms, commit_ms = fwd_ms / n, commit_ms / n
    graphed = graph is not None
    commit_kernels = None
    if timer.cuda:   # where a commit's device time goes (folds, conv state, bookkeeping), kernel by kernel

        def begin_commit():
            st.ops.begin_verify(st.slot_list, T)
            commit()
        commit_kernels = profile_module().profile_steps([begin_commit])[:6]
    out = {"T": T, "verify_ms": fwd_ms, "commit_ms": commit_ms, "graph": graphed, "commit_kernels": commit_kernels,
           "tokens_per_s_all_accepted": batch * T / ((fwd_ms + commit_ms) * 1e-3)}
    if getattr(args, "profile", 0) and timer.cuda:   # the whole verify step (forward + commit), kernel by kernel

        def verify_step():
            st.ops.begin_verify(st.slot_list, T)
            forward()
            commit()
        out["kernels"] = profile_module().profile_steps([verify_step] * 4)[:args.profile]
    st = graph = None   # free the pool and the graph before the next case
    return out


def profile_module():
    """bench/profile_kernels.py (its profile_steps: GPU time per kernel of a list of steps)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_profile_kernels", Path(__file__).with_name("profile_kernels.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def time_batches(cfg, model, batches, args, device, timer):
    """Decode modes and verify steps of every batch size into batches[str(B)]."""
    for batch in args.batches:
        row = batches[str(batch)] = {}
        for mode in args.modes:
            row[mode] = decode_bench(cfg, model, batch, mode, args, device, timer)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            print(f"  B={batch:4d} {mode:12s} {row[mode]['ms']:8.3f} ms/step  "
                  f"{row[mode]['tokens_per_s']:10.0f} tok/s  SSM state {row[mode]['state_GBps']:7.1f} GB/s"
                  f"  ({row[mode]['backend']}{', graph' if row[mode]['graph'] else ''})", flush=True)
            for kr in row[mode].get("kernels") or []:
                print(f"      {kr['us_per_step']:9.1f} us  x{kr['launches_per_step']:.0f}  {kr['kernel'][:70]}")
        for mode in args.modes[1:]:
            if mode == "no-ssm":
                row["ssm_share_conventional"] = 1 - row[mode]["ms"] / row["conventional"]["ms"]
                print(f"  B={batch:4d} SSM work is {100 * row['ssm_share_conventional']:.0f}% of a conventional "
                      f"step (no-ssm floor {row[mode]['ms']:.3f} ms)", flush=True)
                continue
            key = "speedup" if mode == "replay" else f"speedup_{mode}"
            row[key] = row["conventional"]["ms"] / row[mode]["ms"]
            print(f"  B={batch:4d} {mode} speedup over conventional {row[key]:.3f}x", flush=True)
        row["spec"] = {}
        for T in args.verify_tokens:
            v = row["spec"][str(T)] = verify_bench(cfg, model, batch, T, args, device, timer)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if "skipped" in v:
                print(f"  B={batch:4d} verify T={T}: skipped ({v['skipped']})", flush=True)
                continue
            step_ms = row.get("replay", row["conventional"])["ms"]
            v["verify_over_decode"] = v["verify_ms"] / step_ms                       # the forward alone
            v["verify_commit_over_decode"] = (v["verify_ms"] + v["commit_ms"]) / step_ms
            print(f"  B={batch:4d} verify T={T} ({T - 1} drafts) {v['verify_ms']:8.3f} ms"
                  f"{' (graph)' if v['graph'] else ''} ({v['verify_over_decode']:.2f}x a decode step) + commit "
                  f"{v['commit_ms']:.3f} ms = {v['verify_commit_over_decode']:.2f}x; "
                  f"{v['tokens_per_s_all_accepted']:.0f} tok/s if all accepted", flush=True)
            for kr in v.get("commit_kernels") or []:
                print(f"      commit: {kr['us_per_step']:9.1f} us  x{kr['launches_per_step']:.0f}  {kr['kernel'][:70]}")
            for kr in v.get("kernels") or []:
                print(f"      verify step: {kr['us_per_step']:9.1f} us  x{kr['launches_per_step']:.0f}  {kr['kernel'][:70]}")


def run(args) -> dict:
    device = torch.device(args.device)
    timer = Timer(device)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    res = {"command": "python bench/e2e.py " + " ".join(sys.argv[1:]), "device": str(device),
           "attention": args.attention_impl, "fused": args.fused,
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
           "torch": torch.__version__, "dtype": args.dtype, "window": args.window, "context": args.context,
           "iters": args.iters, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "models": {}}
    for name in args.models:
        cfg = model_config(name)
        print(f"{name}: {cfg.num_ssm_layers} {cfg.family} + {cfg.num_attn_layers} attention layers", flush=True)
        model = HybridModel(cfg, random_weights(cfg, seed=0, device=device, dtype=dtype), device=device, dtype=dtype,
                            attn_impl=args.attention_impl)
        entry = res["models"][name] = {"family": cfg.family, "ssm_layers": cfg.num_ssm_layers,
                                       "attention_layers": cfg.num_attn_layers}
        for fused in {"off": [False], "on": [True], "both": [False, True]}[args.fused]:
            # "batches": the PyTorch element-wise path (as in earlier runs); "batches_fused": fused.py kernels
            model.fused = fused
            print(f"  fused non-SSM kernels: {'on' if fused else 'off'}", flush=True)
            time_batches(cfg, model, entry.setdefault("batches_fused" if fused else "batches", {}), args, device,
                         timer)
        if "batches" in entry and "batches_fused" in entry:   # the same steps with the fused kernels
            entry["fused_speedup"] = {}
            for b, row in entry["batches"].items():
                frow = entry["batches_fused"][b]
                sp = entry["fused_speedup"][b] = {m: row[m]["ms"] / frow[m]["ms"] for m in args.modes}
                for T, v in row["spec"].items():
                    if "verify_ms" in v and "verify_ms" in frow["spec"][T]:
                        sp[f"verify T={T}"] = v["verify_ms"] / frow["spec"][T]["verify_ms"]
                print(f"  B={int(b):4d} fused kernels speedup: " + ", ".join(f"{k} {x:.2f}x" for k, x in sp.items()),
                      flush=True)
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return res


def plot(res: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG (rerun with --plot JSON where it is)")
        return
    models = list(res["models"])
    keys = [k for k in ("batches", "batches_fused") if k in res["models"][models[0]]]
    fig, axes = plt.subplots(len(keys), len(models), figsize=(6 * len(models), 4.2 * len(keys)), squeeze=False)
    for ax, (key, name) in zip(axes.flat, [(k, n) for k in keys for n in models]):
        batches = list(res["models"][name][key])
        rows = [res["models"][name][key][b] for b in batches]
        x = range(len(batches))
        modes = [m for m in ("conventional", "replay", "replay-fp8", "no-ssm") if m in rows[0]]
        width = 0.8 / len(modes)
        for j, mode in enumerate(modes):
            ms = [r[mode]["ms"] for r in rows]
            off = (j - (len(modes) - 1) / 2) * width
            label = {"conventional": "conventional", "replay": f"ReplaySSM (L={res['window']}, fp32)",
                     "replay-fp8": "ReplaySSM + fp8 read copy", "no-ssm": "no SSM work (floor)"}[mode]
            ax.bar([i + off for i in x], ms, width, label=label)
            if mode not in ("conventional", "no-ssm"):
                for i, r in enumerate(rows):
                    ax.annotate(f"{r['conventional']['ms'] / r[mode]['ms']:.2f}x", (i + off, ms[i]), ha="center",
                                va="bottom", fontsize=8)
        ax.set_xticks(list(x), [f"B={b}" for b in batches])
        ax.set_ylabel("decode step (ms)")
        fused = {"batches": "", "batches_fused": ", fused kernels"}[key]
        ax.set_title(f"{name} ({res['dtype']}, {res['device_name']}{fused})", fontsize=10)
        ax.legend()
    fig.suptitle(res["command"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny models, CPU-sized batches (a check, seconds)")
    p.add_argument("--models", nargs="+", default=None)
    p.add_argument("--batches", nargs="+", type=int, default=None)
    p.add_argument("--verify-tokens", nargs="*", type=int, default=None,
                   help="verify steps of T = 1 + drafts tokens (default 5 8: 4 and 7 drafts)")
    p.add_argument("--modes", nargs="+", choices=tuple(MODES),
                   default=["conventional", "replay", "replay-fp8", "no-ssm"],
                   help="decode modes, conventional first (the baseline of the speedups); no-ssm: the step "
                        "without SSM state work (the floor of the other layers), for the breakdown")
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--context", type=int, default=512, help="tokens already in each sequence's KV cache")
    p.add_argument("--iters", type=int, default=None, help="timed steps (default 2 windows)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None)
    p.add_argument("--kernels", choices=("auto", "triton", "reference"), default="auto")
    p.add_argument("--attention", choices=("auto", "triton", "sdpa"), default="auto",
                   help="decode/verify attention: Triton over the KV cache in place (auto on CUDA) or SDPA on "
                        "gathered K/V")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--fused", nargs="?", const="on", default=None, choices=("both", "on", "off"),
                   help="non-SSM element-wise work through native/fused.py's Triton kernels: both (default on "
                        "CUDA: every mode timed off, then on; JSON keys batches / batches_fused), on (--fused), "
                        "off (default on CPU unless TRITON_INTERPRET=1)")
    p.add_argument("--no-fused", dest="fused", action="store_const", const="off", help="same as --fused off")
    p.add_argument("--decode-stages", type=int, default=None,
                   help="software-pipeline the ReplaySSM decode kernels' state loop (kernels.*.decode stages)")
    p.add_argument("--decode-method", choices=("fused", "split"), default=None,
                   help="ReplaySSM decode kernel variant (kernels.*.decode method; default: kernels.tuning.decode_plan)")
    p.add_argument("--verify-method", choices=("fma", "mma", "split"), default=None,
                   help="verify kernel variant (kernels.*.verify method; default mma; split: GDN only)")
    p.add_argument("--verify-block-v", type=int, default=None,
                   help="verify kernels' value rows per program (default: kernels.tuning.verify_plan)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="GPU: also profile each decode mode's step and each verify step (forward + commit; eager) and keep "
                        "its N costliest kernels")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/e2e[_quick].json)")
    p.add_argument("--plot", default=None, metavar="JSON", help="only redraw the PNG of a results JSON")
    args = p.parse_args(argv)
    if args.plot:
        plot(json.loads(Path(args.plot).read_text()), Path(args.plot).with_suffix(".png"))
        return 0
    if not args.quick and torch.device(args.device).type != "cuda":
        p.error("--device: the full benchmark needs a GPU; use --quick for a CPU check")
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if args.fused is None:
        args.fused = "both" if torch.device(args.device).type == "cuda" or interpret else "off"
    if args.fused != "off" and torch.device(args.device).type != "cuda" and not interpret:
        p.error("--fused: the Triton kernels need CUDA (or TRITON_INTERPRET=1 on CPU)")
    if args.modes[0] != "conventional":
        p.error("--modes: the first mode must be conventional (the baseline of the speedups)")
    args.attention_impl = args.attention if args.attention != "auto" else (
        "triton" if args.kernels == "triton" or (args.kernels == "auto" and torch.device(args.device).type == "cuda")
        else "sdpa")
    args.models = args.models or (["tiny-mamba2", "tiny-gdn"] if args.quick else ["nemotron-3-nano-4b", "qwen3.5-4b"])
    args.batches = args.batches or ([1, 4] if args.quick else [1, 64, 256, 512])
    args.verify_tokens = [5, 8] if args.verify_tokens is None else args.verify_tokens
    args.iters = args.iters or (4 if args.quick else 2 * args.window)
    args.dtype = args.dtype or ("float32" if args.quick else "bfloat16")
    if args.quick:
        args.context = min(args.context, 32)
    res = run(args)
    out = Path(args.out or ROOT / "bench" / "results" / ("e2e_quick.json" if args.quick else "e2e.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    plot(res, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
