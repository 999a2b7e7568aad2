"""The kernel benchmark's harness (bench/kernels.py and its sweep): the geometries, pools and inputs,
the L-step CUDA-graph timer, the byte counts behind every GB/s, the runners of our kernels and of
SGLang's decode kernels, and the results being gathered (`RESULTS`, `record`, `timed`)."""
from __future__ import annotations

import os
import sys
import traceback

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sglang_replayssm.kernels import gdn as kgdn, mamba2 as km2  # noqa: E402
from sglang_replayssm.kernels.tuning import KernelTuning, verify_methods as verify_methods_of  # noqa: E402
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry  # noqa: E402

from peers import ACT, peer  # noqa: E402  (bench/peers.py: the activation dtype the peers get too, their imports)

try:
    from sglang_replayssm.kernels import kda as kkda  # noqa: E402
except Exception:  # pragma: no cover
    kkda = None

L = 16
DEV = "cuda"
RESULTS: dict = {"meta": {}, "rows": [], "checks": []}


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
    p = ReplayStatePool(g, 1, nslots, cfg, device=DEV, act_dtype=ACT)   # raw v records in the activations' dtype
    p.ckpt.normal_().mul_(0.05)
    if p.rc is not None:
        p.rc.copy_((torch.randn(p.rc.shape, device=DEV) * 100).to(p.rc.dtype))
        p.rc_scale.fill_(1e-3)
    p.rec_d.normal_()
    p.rec_k.copy_(torch.nn.functional.normalize(torch.randn(p.rec_k.shape, device=DEV), dim=-1))
    p.rec_g.uniform_(-0.2, -0.01)
    if getattr(p, "rec_v", None) is not None:   # a delta family's raw inputs (its exact fold replays them)
        p.rec_v.normal_()
        p.rec_beta.uniform_(0.0, 1.0)
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
    # a delta family's record also keeps its raw v (the activations' dtype) and beta, written every step and read by
    # the flush in place of d
    inputs = 0 if geo["family"] == "mamba2" else H * Dv * torch.finfo(ACT).bits // 8 + H * 4
    rcb = {"none": 0, "fp8": E + H * Dv * 4}[rc]
    tot = 0.0
    for c in range(L):
        b = c * rec + rec + inputs + io_bytes(geo)  # read c records, write one, inputs/outputs
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
    """One verify of T chain drafts + the commit of all T (the library's `commit`, as pool.accept_drafts
    calls it: the fold of rows that reach the window, counted from the cursor, then the pointer move), per
    step; L steps per graph."""
    mod = module(geo)
    B = slots.shape[0]
    cur0 = torch.zeros(pool.cursor.shape, dtype=torch.int32, device=DEV)
    cur0[slots.long()] = base.int()
    accepted = torch.full((B,), T, dtype=torch.int32, device=DEV)

    kw = {"method": method} if method else {}
    if cfg is not None:  # None: the library's defaults
        kw["tuning"] = KernelTuning(block_v=cfg[0], block_k=cfg[1], num_warps=cfg[2])

    def f():
        mod.verify(pool, 0, slots, **inp_t, **kw)
        mod.commit(pool, slots, accepted)

    def reset():
        pool.cursor = cur0.clone()
    reset()
    return [f] * L, reset


# ----------------------------------------------------------------------------- results
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


def verify_methods(geo, spec=None):
    """The verify methods a family's wrapper has (spec: a comma-separated subset to keep)."""
    return [m for m in verify_methods_of(geo["family"]) if spec is None or m in spec.split(",")]
