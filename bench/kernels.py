"""ReplaySSM kernel benchmark on one GPU (H200): ours vs our conventional kernel vs SGLang's kernels.

Run (from the repo root, with SGLang 0.5.23's own kernels in the git-ignored .peer/, bench/README.md):
    PYTHONPATH=.:.peer python3 bench/kernels.py --out $OUT
Writes kernels.json + kernels.png to --out. Times are triton.testing.do_bench medians of a CUDA graph
holding L=16 consecutive decode steps (per-row cursors preset so that over the window every row
flushes exactly once; in a batch of B rows about B/16 flush each step), divided by L: ms per step
averaged over a full window, flushes included. L2 is flushed by do_bench before each replay.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sglang_replayssm.kernels import gdn as kgdn, mamba2 as km2  # noqa: E402
from sglang_replayssm.kernels.tuning import KernelTuning, verify_methods as verify_methods_of  # noqa: E402
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry  # noqa: E402

import peers  # noqa: E402  (bench/peers.py: SGLang's spec verify, FlashInfer's checkpointing_ssu)

try:
    from sglang_replayssm.kernels import kda as kkda  # noqa: E402
except Exception:  # pragma: no cover
    kkda = None

L = 16
DEV = "cuda"
ACT = torch.bfloat16
RESULTS: dict = {"meta": {}, "rows": [], "checks": []}


def peer(name):
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001
        print(f"peer {name} unavailable: {e}")
        return None


FLA = peer("sglang.kernels.ops.attention.fla.fused_recurrent")
RSSM = peer("sglang.kernels.ops.attention.linear.fused_recurrent_linear_replayssm")
MSSM = peer("sglang.kernels.ops.mamba.triton_ops.mamba_ssm")


def bench_graph(steps, rep_ms):
    """steps: list of L callables (one decode step each). Returns ms per step (median)."""
    for f in steps:  # warm-up / compile outside the graph
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            for f in steps:
                f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    ms = do_bench(g.replay, warmup=10, rep=rep_ms, return_mode="median")
    return ms / len(steps)


def copy_bandwidth():
    n = 2 * 1024**3 // 4
    x = torch.randn(n, device=DEV)
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=20, rep=200, return_mode="median")
    return 2 * n * 4 / (ms * 1e-3) / 1e9  # GB/s, read + write


# ----------------------------------------------------------------------------- setups
GEOMS = [
    dict(name="gdn_qwen35_4b", family="gdn", H=32, Hk=16, Dv=128, Dk=128),
    dict(name="mamba2_nemotron3_super", family="mamba2", H=128, Hk=8, Dv=64, Dk=128),
    dict(name="gdn_qwen35_122b", family="gdn", H=64, Hk=16, Dv=128, Dk=128),
    dict(name="mamba2_nemotron3_nano4b", family="mamba2", H=96, Hk=8, Dv=80, Dk=128),
    dict(name="kda_32h", family="kda", H=32, Hk=32, Dv=128, Dk=128),
]
BATCHES = [1, 64, 256, 512]


def make_pool(geo, nslots, read_copy="none", record_dtype=torch.float32):
    g = SSMGeometry(family=geo["family"], num_heads=geo["H"], head_v_dim=geo["Dv"], head_k_dim=geo["Dk"],
                    num_k_heads=geo["Hk"])
    cfg = ReplayConfig(window=L, max_drafts=8, read_copy=read_copy, record_dtype=record_dtype)
    p = ReplayStatePool(g, 1, nslots, cfg, device=DEV)
    p.ckpt.normal_().mul_(0.05)
    if p.rc is not None:
        p.rc.copy_((torch.randn(p.rc.shape, device=DEV) * 100).to(p.rc.dtype))
        p.rc_scale.fill_(1e-3)
    p.rec_d.normal_()
    p.rec_k.copy_(torch.nn.functional.normalize(torch.randn(p.rec_k.shape, device=DEV), dim=-1))
    p.rec_g.uniform_(-0.2, -0.01)
    return p


def make_inputs(geo, B, T=None):
    H, Hk, Dv, Dk = geo["H"], geo["Hk"], geo["Dv"], geo["Dk"]
    lead = (B,) if T is None else (B, T)
    r = lambda *s: torch.randn(*s, device=DEV, dtype=ACT)
    if geo["family"] == "mamba2":
        return dict(x=r(*lead, H, Dv), dt=r(*lead, H), A=-torch.rand(H, device=DEV), B=r(*lead, Hk, Dk),
                    C=r(*lead, Hk, Dk), D=torch.randn(H, device=DEV), dt_bias=torch.randn(H, device=DEV) * 0.3,
                    z=r(*lead, H, Dv))
    a = r(*lead, H, Dk) if geo["family"] == "kda" else r(*lead, H)
    dtb = torch.randn(H, Dk, device=DEV) * 0.3 if geo["family"] == "kda" else torch.randn(H, device=DEV) * 0.3
    return dict(q=r(*lead, Hk, Dk), k=r(*lead, Hk, Dk), v=r(*lead, H, Dv), a=a, b=r(*lead, H),
                A_log=torch.randn(H, device=DEV) * 0.3, dt_bias=dtb)


def module(geo):
    return {"mamba2": km2, "gdn": kgdn, "kda": kkda}[geo["family"]]


CURSORS = ("staggered", "synchronized")


def cursor_sets(B, nslots, slots, cursors="staggered"):
    """L cursor tensors over all slots, one per step of a window, one step later +1 mod L. "staggered"
    (steady-state serving): row b starts at b % L (shuffled), so B / L rows flush in every step;
    "synchronized" (rows admitted together): every row starts at 0, so all B rows flush in the window's
    last step. Every row flushes once per window either way (the same bytes per step on average)."""
    if cursors not in CURSORS:
        raise ValueError(f"cursors must be one of {CURSORS}, got {cursors!r}")
    base = torch.randperm(B, device=DEV) % L if cursors == "staggered" else torch.zeros(B, dtype=torch.long, device=DEV)
    out = []
    for s in range(L):
        c = torch.zeros(nslots + 1, dtype=torch.int32, device=DEV)
        c[slots.long()] = ((base + s) % L).int()
        out.append(c)
    return out


# ----------------------------------------------------------------------------- byte counts
def bytes_conventional(geo, B, sb=4):
    E = geo["H"] * geo["Dv"] * geo["Dk"]
    return B * (2 * E * sb + io_bytes(geo))


def io_bytes(geo):
    H, Hk, Dv, Dk = geo["H"], geo["Hk"], geo["Dv"], geo["Dk"]
    if geo["family"] == "mamba2":
        return 2 * (3 * H * Dv + 2 * Hk * Dk + H)
    return 2 * (2 * Hk * Dk + 2 * H * Dv + H * (Dk if geo["family"] == "kda" else 1) + H)


def bytes_replay(geo, B, rc="none", rb=4):
    """Bytes per step averaged over the window (cursor c = 0..L-1 uniformly, c = L-1 flushes)."""
    H, Hk, Dv, Dk = geo["H"], geo["Hk"], geo["Dv"], geo["Dk"]
    E = H * Dv * Dk
    gk = Dk if geo["family"] == "kda" else 1
    rec = H * Dv * rb + Hk * Dk * rb + H * gk * 4
    rcb = {"none": 0, "fp8": E + H * Dv * 4}[rc]
    tot = 0.0
    for c in range(L):
        b = c * rec + rec + io_bytes(geo)  # read c records, write one, inputs/outputs
        if c == L - 1:
            b += 2 * E * 4 + rcb          # flush: read fp32 ckpt, write ckpt (+ read copy)
        else:
            b += E * 4 if rc == "none" else rcb
        tot += b
    return B * tot / L


def bytes_verify(geo, B, T):
    """Bytes of a verify step of T drafts + its commit: the state read, its write once per window (the T / L
    of a window a step commits), and half a window of records on average."""
    E = geo["H"] * geo["Dv"] * geo["Dk"]
    return B * (E * 4 * (1 + T / L) + 0.5 * (L - 1) * (geo["H"] * geo["Dv"] + geo["Hk"] * geo["Dk"]) * 4)


def bytes_state_only(geo, B, rc="none"):
    """The 'HBM limit' byte count (bench/README.md): state read every step + one state write per window."""
    E = geo["H"] * geo["Dv"] * geo["Dk"]
    if rc == "none":
        return B * (E * 4 + E * 4 / L)
    return B * ((L - 1) / L * E + (2 * E * 4 + E) / L)


# ----------------------------------------------------------------------------- runners
def run_conventional_ours(geo, B, state, slots, inp, cfg):
    mod = module(geo)
    bv, _bk, nw = cfg
    return [lambda: mod.conventional_decode(state, slots, **inp, tuning=KernelTuning(block_v=bv, num_warps=nw))] * L


def run_replay_ours(geo, pool, slots, inp, curs, cfg, method=None):
    """cfg: (block_v, block_k, warps[, stages[, flush_block_k[, flush_warps]]]) (0 = the default for the
    last three), or None for the library's defaults.
    method: the decode method ("fused" / "split"), None for the default."""
    mod = module(geo)
    kw = {"method": method} if method else {}
    if cfg is not None:  # None: the library's defaults (tuning.decode_plan)
        kw["tuning"] = KernelTuning(block_v=cfg[0], block_k=cfg[1], num_warps=cfg[2],
                                    stages=cfg[3] if len(cfg) > 3 and cfg[3] else None,
                                    flush_block_k=cfg[4] if len(cfg) > 4 and cfg[4] else None,
                                    flush_warps=cfg[5] if len(cfg) > 5 and cfg[5] else None)
    steps = []
    for s in range(L):
        def f(s=s):
            pool.cursor = curs[s]
            mod.decode(pool, 0, slots, **inp, **kw)
        steps.append(f)
    return steps


def run_sglang_conv(geo, B, state, slots, inp):
    H, Dv, Dk = geo["H"], geo["Dv"], geo["Dk"]
    if geo["family"] == "mamba2":
        if MSSM is None:
            return None
        x = inp["x"]
        dt = inp["dt"][..., None].expand(B, H, Dv)
        A = inp["A"][:, None, None].expand(H, Dv, Dk)
        D = inp["D"][:, None].expand(H, Dv)
        dtb = inp["dt_bias"][:, None].expand(H, Dv)
        out = torch.empty_like(x)
        return [lambda: MSSM.selective_state_update(state, x, dt, A, inp["B"], inp["C"], D=D, z=inp["z"],
                                                   dt_bias=dtb, dt_softplus=True, state_batch_indices=slots,
                                                   out=out)] * L
    if FLA is None:
        return None
    mixed = torch.cat([inp["q"].reshape(B, -1), inp["k"].reshape(B, -1), inp["v"].reshape(B, -1)], 1).contiguous()
    out = torch.empty(B, 1, H, Dv, device=DEV, dtype=ACT)
    if geo["family"] == "kda":
        a = inp["a"].reshape(B, H * Dk).contiguous()
        return [lambda: FLA.fused_recurrent_kda_packed_decode(mixed, a, inp["b"], inp["A_log"],
                                                             inp["dt_bias"].reshape(-1).contiguous(), Dk ** -0.5,
                                                             state, out, slots, use_qk_l2norm_in_kernel=True)] * L
    return [lambda: FLA.fused_recurrent_gated_delta_rule_packed_decode(mixed, inp["a"], inp["b"], inp["A_log"],
                                                                       inp["dt_bias"], Dk ** -0.5, state, out, slots,
                                                                       use_qk_l2norm_in_kernel=True)] * L


def run_sglang_replay(geo, B, state, slots, inp, nslots):
    if RSSM is None or geo["family"] == "mamba2":
        return None
    H, Hk, Dv, Dk = geo["H"], geo["Hk"], geo["Dv"], geo["Dk"]
    kda = geo["family"] == "kda"
    mixed = torch.cat([inp["q"].reshape(B, -1), inp["k"].reshape(B, -1), inp["v"].reshape(B, -1)], 1).contiguous()
    out = torch.empty(B, 1, H, Dv, device=DEV, dtype=ACT)
    S = nslots + 1
    dc = torch.randn(S, H, L, Dv, device=DEV)
    kc = torch.nn.functional.normalize(torch.randn(S, Hk, L, Dk, device=DEV), dim=-1)
    gc = -torch.rand((S, H, L, Dk) if kda else (S, H, L), device=DEV) * 0.2
    base = torch.randperm(B, device=DEV) % L
    wps = [((base + s) % L).int() for s in range(L)]
    steps = []
    for s in range(L):
        steps.append(lambda s=s: RSSM.fused_recurrent_linear_replayssm_decode(
            mixed, inp["a"], inp["b"], inp["A_log"], inp["dt_bias"], Dk ** -0.5, state, dc, kc, gc, out, slots,
            wps[s], use_qk_l2norm_in_kernel=True, is_kda=kda))
    return steps


def run_verify_ours(geo, pool, slots, inp_t, T, cfg, base, method=None):
    """One verify of T chain drafts + the commit fold of rows that reach the window (all drafts
    accepted: the most folds) + the on-device cursor update, per step; L steps per graph."""
    mod = module(geo)
    B = slots.shape[0]
    cur0 = torch.zeros(pool.cursor.shape, dtype=torch.int32, device=DEV)
    cur0[slots.long()] = base.int()
    counts = torch.zeros(B, dtype=torch.int32, device=DEV)

    kw = {"method": method} if method else {}
    if cfg is not None:  # None: the library's defaults
        kw["tuning"] = KernelTuning(block_v=cfg[0], block_k=cfg[1], num_warps=cfg[2])

    def f():
        mod.verify(pool, 0, slots, **inp_t, **kw)
        c = pool.cursor[slots.long()] + T
        full = c >= L
        counts.copy_(torch.where(full, c, torch.zeros_like(c)))
        mod.fold(pool, 0, slots, counts)
        pool.cursor[slots.long()] = torch.where(full, torch.zeros_like(c), c)

    def reset():
        pool.cursor = cur0.clone()
    reset()
    return [f] * L, reset


# ----------------------------------------------------------------------------- checks
def gpu_checks():
    """Fresh random inputs on CUDA: kernels vs the PyTorch reference, max relative error."""
    from sglang_replayssm.reference import gdn as rgdn, mamba2 as rm2
    refs = {"gdn": (kgdn, rgdn), "mamba2": (km2, rm2)}
    if kkda is not None:
        from sglang_replayssm.reference import kda as rkda
        refs["kda"] = (kkda, rkda)
    for fam, (km, rm) in refs.items():
        geo = dict(family=fam, H=8, Hk=4 if fam != "kda" else 8, Dv=64, Dk=128)
        for rc, method in (("none", "fused"), ("fp8", "fused"), ("none", "split"), ("fp8", "split")):
            pk = make_pool(geo, 12, read_copy=rc)
            if rc == "fp8":
                from sglang_replayssm.reference.quant import quant_fp8_rows
                pk.rc[:], pk.rc_scale[:] = quant_fp8_rows(pk.ckpt)
            pk.cursor.copy_(torch.randint(0, L, pk.cursor.shape, device=DEV, dtype=torch.int32))
            import copy
            pr = copy.deepcopy(pk)
            slots = torch.tensor([3, 1, 7, 12, 5, 0], dtype=torch.int32, device=DEV)
            errs = []
            for step in range(L + 2):
                inp = make_inputs(geo, 6)
                inp = {k: (v.float() if v.dtype == ACT else v) for k, v in inp.items()}
                kw = dict(method=method, tuning=KernelTuning(flush_block_k=geo["Dk"])) if method == "split" else dict(
                    method=method)
                o1 = km.decode(pk, 0, slots, **inp, **kw)
                o2 = rm.decode(pr, 0, slots, **inp)
                errs.append(((o1[:-1].double() - o2[:-1].double()).norm() / o2[:-1].double().norm()).item())
                pk.advance(slots)
                pr.advance(slots)
            ck = ((pk.ckpt[:, 1:] - pr.ckpt[:, 1:]).double().norm() / pr.ckpt[:, 1:].double().norm()).item()
            row = dict(family=fam, read_copy=rc, what=f"decode x18 steps, {method}", max_rel_err_out=max(errs),
                       rel_err_ckpt=ck)
            if hasattr(km, "verify"):
                try:
                    for tree, T, vm in [(False, 4, None), (True, 4, None), (False, 2, None)] + [
                            (tree, 4, m) for m in verify_methods(geo) for tree in (False, True)]:
                        inp = make_inputs(geo, 6, T=T)
                        inp = {k: (v.float() if v.dtype == ACT else v) for k, v in inp.items()}
                        par = torch.tensor([[-1, 0, 0, 1]] * 6, dtype=torch.int32, device=DEV) if tree else None
                        pr.cursor.copy_(pk.cursor)
                        o1 = km.verify(pk, 0, slots, **inp, parents=par, **({"method": vm} if vm else {}))
                        o2 = rm.verify(pr, 0, slots, **inp, parents=par)
                        row[f"max_rel_err_verify_T{T}_{'tree' if tree else 'chain'}" + (f"_{vm}" if vm else "")] = (
                            (o1[:-1].double() - o2[:-1].double()).norm() / o2[:-1].double().norm()).item()
                except Exception as e:  # noqa: BLE001
                    row["verify_error"] = repr(e)[:200]
            print("CHECK", row)
            RESULTS["checks"].append(row)
        # conventional
        st = torch.randn(9, geo["H"], geo["Dv"], geo["Dk"], device=DEV) * 0.1
        st0 = st.clone()
        slots = torch.tensor([2, 8, 0, 5], dtype=torch.int32, device=DEV)
        inp = make_inputs(geo, 4)
        inp = {k: (v.float() if v.dtype == ACT else v) for k, v in inp.items()}
        o1 = km.conventional_decode(st, slots, **inp)
        o2, s2 = rm.conventional_step(st0[slots.long()], **inp)
        row = dict(family=fam, what="conventional", max_rel_err_out=((o1 - o2).double().norm() / o2.double().norm()).item(),
                   rel_err_state=((st[slots.long()][[0, 1, 3]] - s2[[0, 1, 3]]).double().norm() / s2.double().norm()).item())
        print("CHECK", row)
        RESULTS["checks"].append(row)


# ----------------------------------------------------------------------------- main
def record(**kw):
    RESULTS["rows"].append(kw)
    t = kw.get("ms")
    print(f"{kw['geo']:26s} B={kw['B']:4d} {kw['kernel']:34s} {t if t is None else round(t, 4)!s:>8} ms "
          f"{kw.get('GBps', 0) or 0:8.0f} GB/s  {kw.get('note', '')}", flush=True)


def timed(fn, *a, **k):
    try:
        return fn(*a, **k)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return None


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
                         "flush launch; 0 = default)")
    ap.add_argument("--sweep-decode-methods", default="fused,split",
                    help="decode methods to sweep, comma-separated (fused, split)")
    ap.add_argument("--sweep-verify", default="16x16x1,16x16x2,32x16x2,32x16x4,32x32x4,64x16x4,64x16x8,"
                    "32x32x8,64x32x8,128x16x8", help="verify configs BVxBKxWARPS[xSTAGES] (STAGES: mma launches only)")
    ap.add_argument("--sweep-verify-methods", default=None,
                    help="verify methods to sweep, comma-separated (default: fma,mma,split for GDN, fma,mma for "
                         "Mamba-2 and KDA)")
    ap.add_argument("--cursors", choices=CURSORS, default="staggered",
                    help="ring cursors of the decode rows over a window: staggered (B / L rows flush every step, "
                         "steady-state serving) or synchronized (all rows flush in the same step)")
    ap.add_argument("--sweep-read-copies", default="none,fp8",
                    help="decode sweep read copies, comma-separated: none (the fp32 checkpoint) and/or fp8")
    ap.add_argument("--sweep-fold", default="",
                    help="commit fold configs BVxBKxWARPS (the fold after a verify of T = 8 with every draft "
                         "accepted: half the rows fold)")
    args = ap.parse_args()
    bad = [m for m in args.sweep_decode_methods.split(",") if m not in ("fused", "split")]
    if bad:
        ap.error(f"--sweep-decode-methods: unknown method {bad[0]!r} (choose from fused, split)")
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
            if hasattr(module(geo), "verify") and (B == 256 or geo["name"] == "gdn_qwen35_4b"):  # all families
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
            if geo["family"] == "mamba2" or B == 256 or geo["name"] == "gdn_qwen35_4b":
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


def _configs(spec):
    return [tuple(int(v) for v in c.split("x")) for c in spec.split(",") if c]


def verify_methods(geo, spec=None):
    """The verify methods a family's wrapper has (spec: a comma-separated subset to keep)."""
    return [m for m in verify_methods_of(geo["family"]) if spec is None or m in spec.split(",")]


def sweep(args):
    """Block-size / warp sweep at one batch size: decode over a full window (flushes included) with
    an fp32 checkpoint and with an fp8 read copy (skipped with --sweep-decode ""), verify of T = 4 / 8
    chain drafts alone (no commit fold), and the commit fold after a T = 8 verify with every draft
    accepted (--sweep-fold), each config a CUDA graph of L steps. Picks the configs for the defaults."""
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
                for cfg in _configs(args.sweep_decode):
                    ms = timed(bench_graph, run_replay_ours(geo, pool, slots, inp, curs, cfg, method), 60)
                    record(geo=geo["name"], B=B, kernel=f"sweep_decode_{'fp32' if rc == 'none' else rc}"
                           + (f"_{method}" if method else ""), config=list(cfg), ms=ms,
                           GBps=nb / ms / 1e6 if ms else None,
                           note="bv{}_bk{}_w{}".format(*cfg) + (f"_s{cfg[3]}" if len(cfg) > 3 and cfg[3] else "")
                           + (f"_fbk{cfg[4]}" if len(cfg) > 4 and cfg[4] else "")
                           + (f"_fw{cfg[5]}" if len(cfg) > 5 and cfg[5] else ""))
            save()
            del pool
        pool = make_pool(geo, B)
        base = torch.zeros(B + 1, dtype=torch.int32, device=DEV)
        base[slots.long()] = (torch.randperm(B, device=DEV) % L).int()
        E = geo["H"] * geo["Dv"] * geo["Dk"]
        for T in (4, 8):
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
        cur = base[slots.long()] + 8
        counts = torch.where(cur >= L, cur, torch.zeros_like(cur)).int()
        nf = int((counts > 0).sum())
        nb = nf * (E * 8 + 12 * (geo["H"] * geo["Dv"] + geo["Hk"] * geo["Dk"]) * 4)
        for cfg in _configs(args.sweep_fold):
            bv, bk, nw = cfg

            def f(bv=bv, bk=bk, nw=nw, pool=pool):
                mod.fold(pool, 0, slots, counts, tuning=KernelTuning(block_v=bv, block_k=bk or None, num_warps=nw))
            ms = timed(bench_graph, [f] * L, 60)
            record(geo=geo["name"], B=B, kernel="sweep_fold_T8", config=list(cfg), ms=ms,
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
    """A sweep's PNG: per (geometry, swept kernel) one panel of horizontal bars, ms per step of each
    configuration (fastest in a darker colour), labelled with ms and GB/s."""
    panels = sorted({(r["geo"], r["kernel"]) for r in rows if r.get("ms")})
    if not panels:
        raise SystemExit("no timed rows to plot")
    cols = min(4, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 0.9 + 0.32 * max(
        sum(1 for r in rows if (r["geo"], r["kernel"]) == p and r.get("ms")) for p in panels) * nrows),
        squeeze=False)
    for ax, (geo, kernel) in zip(axes.flat, panels):
        sel = [r for r in rows if r["geo"] == geo and r["kernel"] == kernel and r.get("ms")]
        best = min(r["ms"] for r in sel)
        ys = range(len(sel))
        ax.barh(ys, [r["ms"] for r in sel], color=["C3" if r["ms"] == best else "C0" for r in sel])
        for y, r in zip(ys, sel):
            ax.annotate(f" {r['ms']:.3f} ms, {r.get('GBps') or 0:.0f} GB/s", (r["ms"], y), va="center", fontsize=6)
        ax.set_yticks(list(ys))
        ax.set_yticklabels([r.get("note", "") + (f" [{r['variant']}]" if "variant" in r else "") for r in sel], fontsize=6)
        ax.invert_yaxis()
        ax.set_xlim(0, max(r["ms"] for r in sel) * 1.45)
        ax.set_xlabel(f"ms / step at B = {sel[0]['B']}", fontsize=7)
        ax.set_title(f"{geo}\n{kernel}", fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=110)


if __name__ == "__main__":
    main()
