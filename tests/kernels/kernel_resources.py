"""Registers, spills, shared memory and occupancy of our Triton kernels on Hopper, without a GPU.

Every kernel is compiled for sm_90 (H100/H200) by Triton's own pipeline through the real wrappers
(kernels.gdn.decode etc.) on CPU tensors: a stand-in for Triton's active driver reports an sm_90
device, `JITFunction.run` compiles instead of launching, and cuobjdump (shipped with Triton) reads
the resource usage out of each cubin. The decode kernels are latency-bound at the batch sizes we
serve (bench/README.md), so registers per thread -> resident warps per SM is the number to watch
between GPU runs. Nothing is executed; the pool's contents do not matter.

Run (CPU is fine; no GPU, no TRITON_INTERPRET):
    python tests/kernels/kernel_resources.py --out $OUT [--quick] [--sass-dir $OUT/sass]
Writes kernel_resources.json (+ a table on stdout); --sass-dir also each kernel's SASS, normalised, for
diffs between two checkouts. tests/kernels/test_compile_sm90.py runs it in CI (--quick).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("kernel_resources.py compiles real kernels: unset TRITON_INTERPRET")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.driver import DriverBase  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from sglang_replayssm.kernels import gdn as kgdn, kda as kkda, mamba2 as km2  # noqa: E402
from sglang_replayssm.kernels.tuning import KernelTuning, verify_methods  # noqa: E402
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry  # noqa: E402

# Hopper SM limits (CUDA occupancy rules for compute capability 9.0)
REGS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
REG_ALLOC_UNIT = 256       # registers are allocated per warp in units of 256
SMEM_PER_SM = 228 * 1024
MAX_BLOCKS_PER_SM = 32

GEOMS = {
    "mamba2_nemotron3_super": dict(family="mamba2", H=128, Hk=8, Dv=64, Dk=128),
    "mamba2_nemotron3_nano4b": dict(family="mamba2", H=96, Hk=8, Dv=80, Dk=128),
    "gdn_qwen35_4b": dict(family="gdn", H=32, Hk=16, Dv=128, Dk=128),
    "gdn_qwen35_122b": dict(family="gdn", H=64, Hk=16, Dv=128, Dk=128),
    "kda_32h": dict(family="kda", H=32, Hk=32, Dv=128, Dk=128),
}
MODULES = {"mamba2": km2, "gdn": kgdn, "kda": kkda}


class _Sm90(DriverBase):
    """Triton's active driver as seen by JITFunction.run: an sm_90 device, nothing more."""

    @classmethod
    def is_active(cls):
        return True

    def map_python_to_cpp_type(self, ty):
        raise NotImplementedError

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_benchmarker(self):
        raise NotImplementedError

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        return torch.cuda

    def get_empty_cache_for_benchmark(self):
        raise NotImplementedError

    def clear_cache(self, cache):
        pass


def cuobjdump(cubin: bytes, flag: str) -> str:
    """The text of `cuobjdump <flag>` (shipped with Triton) on a cubin."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def resource_usage(cubin: bytes) -> dict:
    text = cuobjdump(cubin, "--dump-resource-usage")
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    if m is None:
        raise RuntimeError(f"no resource line in cuobjdump output:\n{text}")
    reg, stack, shared, local = map(int, m.groups())
    return dict(regs=reg, stack=stack, static_smem=shared, local=local)


def sass_fingerprint(cubin: bytes, dump: str | None = None) -> str:
    """sha256 of the SASS instruction stream (addresses, encodings and symbol names stripped): equal
    fingerprints mean a source change (e.g. folding repeated code into a shared @triton.jit helper)
    left the machine code as it was."""
    instrs = []
    for line in cuobjdump(cubin, "-sass").splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*(/\*.*\*/)?\s*$", line)
        if m:
            instrs.append(m.group(1))
    if dump:
        with open(dump, "w") as f:
            f.write("\n".join(instrs) + "\n")
    return hashlib.sha256("\n".join(instrs).encode()).hexdigest()[:16]


def sass_path(folder, geo, label, kernel):
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{geo}__{label}__{kernel}") + ".sass")


def occupancy(regs: int, num_warps: int, smem: int) -> dict:
    """Resident blocks and warps per SM (registers, warps, shared memory and block-count limits)."""
    per_warp = -(-regs * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    by_regs = REGS_PER_SM // (per_warp * num_warps)
    by_warps = MAX_WARPS_PER_SM // num_warps
    by_smem = SMEM_PER_SM // smem if smem else MAX_BLOCKS_PER_SM
    blocks = min(by_regs, by_warps, by_smem, MAX_BLOCKS_PER_SM)
    return dict(blocks_per_sm=blocks, warps_per_sm=blocks * num_warps,
                occupancy=blocks * num_warps / MAX_WARPS_PER_SM)


class Recorder:
    """Compiles (for sm_90) instead of launching, and keeps what each launch compiled."""

    def __init__(self):
        self.launches: list = []
        self._orig = JITFunction.run

    def __enter__(self):
        rec = self

        def run(fn, *args, grid, warmup, **kwargs):
            kernel = rec._orig(fn, *args, grid=grid, warmup=True, **kwargs)
            rec.launches.append((fn.fn.__name__, kernel))
            return kernel

        self._prev_driver = triton.runtime.driver._active
        triton.runtime.driver.set_active(_Sm90())
        JITFunction.run = run
        return self

    def __exit__(self, *exc):
        JITFunction.run = self._orig
        triton.runtime.driver._active = self._prev_driver

    def take(self) -> list:
        out, self.launches = self.launches, []
        return out


def make_pool(geo, read_copy="none", ckpt="fp32", nslots=8, window=16):
    g = SSMGeometry(family=geo["family"], num_heads=geo["H"], head_v_dim=geo["Dv"], head_k_dim=geo["Dk"],
                    num_k_heads=geo["Hk"])
    cfg = ReplayConfig(window=window, max_drafts=8, read_copy=read_copy, ckpt=ckpt)
    return ReplayStatePool(g, 1, nslots, cfg, device="cpu")


def make_inputs(geo, B, T=None, dtype=torch.bfloat16):
    H, Hk, Dv, Dk = geo["H"], geo["Hk"], geo["Dv"], geo["Dk"]
    lead = (B,) if T is None else (B, T)
    r = lambda *s: torch.zeros(*s, dtype=dtype)
    if geo["family"] == "mamba2":
        return dict(x=r(*lead, H, Dv), dt=r(*lead, H), A=torch.zeros(H), B=r(*lead, Hk, Dk), C=r(*lead, Hk, Dk),
                    D=torch.zeros(H), dt_bias=torch.zeros(H), z=r(*lead, H, Dv))
    kda = geo["family"] == "kda"
    return dict(q=r(*lead, Hk, Dk), k=r(*lead, Hk, Dk), v=r(*lead, H, Dv), a=r(*lead, H, Dk) if kda else r(*lead, H),
                b=r(*lead, H), A_log=torch.zeros(H), dt_bias=torch.zeros(H, Dk) if kda else torch.zeros(H))


# the blocks the fourth H200 run sweeps (bench/h200/h200_perf.sh PART=sweep-verify), besides the defaults
FOLD_CONFIGS = ((32, 128, 4), (64, 128, 4), (32, 64, 4), (64, 128, 8), (16, 128, 2))
MMA_VERIFY_CONFIGS = ((32, 64, 4), (32, 128, 4), (64, 64, 4), (64, 128, 8), (32, 128, 8))


def cases(geos, batch, quick=False):
    """(geometry, label, callable) for every kernel configuration the benchmarks time
    (quick: one configuration per kernel and variant, for the CI check that everything compiles)."""
    slots = torch.arange(1, batch + 1, dtype=torch.int32)
    for name, geo in geos.items():
        mod = MODULES[geo["family"]]
        inp = make_inputs(geo, batch)
        state = torch.zeros(batch + 1, geo["H"], geo["Dv"], geo["Dk"])
        for bv, nw in ((16, 2),) if quick else ((32, 2), (16, 2)):
            yield name, f"conventional bv{bv} w{nw}", lambda mod=mod, state=state, inp=inp, bv=bv, nw=nw: \
                mod.conventional_decode(state, slots, **inp, tuning=KernelTuning(block_v=bv, num_warps=nw))
        variants = [("fp32", "none", "fp32"), ("fp8", "fp8", "fp32"), ("nvfp4", "nvfp4", "fp32"),
                    ("fp16-sr", "none", "fp16-sr")]
        for label, rc, ck in variants:
            try:
                pool = make_pool(geo, rc, ck, nslots=batch)
            except Exception as e:  # an unsupported combination is reported, not hidden
                yield name, f"decode {label}", e
                continue
            for bv, bk, nw in ((32, 32, 1),) if quick else ((32, 32, 1), (64, 16, 2), (32, 32, 4)):
                yield name, f"decode {label} bv{bv} bk{bk} w{nw}", \
                    lambda mod=mod, pool=pool, inp=inp, bv=bv, bk=bk, nw=nw: \
                    mod.decode(pool, 0, slots, **inp, tuning=KernelTuning(block_v=bv, block_k=bk, num_warps=nw))
            if label in ("fp32", "fp8"):
                # the blocks the library uses at serving batch sizes (tuning.decode_plan: SPLIT_TUNED)
                yield name, f"decode {label} split defaults", lambda mod=mod, pool=pool, inp=inp: \
                    mod.decode(pool, 0, slots, **inp, method="split")
                yield name, f"decode {label} split bv32 bk32 w2", lambda mod=mod, pool=pool, inp=inp: \
                    mod.decode(pool, 0, slots, **inp, method="split",
                                                   tuning=KernelTuning(block_v=32, block_k=32, num_warps=2))
                # the flush rows' column chunk: whole rows for Mamba-2's fold, 32 columns for the delta families'
                # exact fold (its tensor-core dots over whole rows spill)
                fbk = geo["Dk"] if geo["family"] == "mamba2" else 32
                yield name, f"decode {label} split fbk{fbk} bv32 bk32 w2", \
                    lambda mod=mod, pool=pool, inp=inp, fbk=fbk: mod.decode(pool, 0, slots, **inp, method="split",
                                                                          tuning=KernelTuning(block_v=32, block_k=32,
                                                                                              num_warps=2, flush_block_k=fbk))
            counts = torch.full((batch,), 3, dtype=torch.int32)
            yield name, f"fold {label}", lambda mod=mod, pool=pool, counts=counts: mod.fold(pool, 0, slots, counts)
            for bv, bk, nw in () if quick or label != "fp32" else FOLD_CONFIGS:
                yield name, f"fold {label} bv{bv} bk{bk} w{nw}", \
                    lambda mod=mod, pool=pool, counts=counts, bv=bv, bk=bk, nw=nw: \
                    mod.fold(pool, 0, slots, counts, tuning=KernelTuning(block_v=bv, block_k=min(bk, geo["Dk"]), num_warps=nw))
        pool = make_pool(geo, nslots=batch)
        for T in (4,) if quick else (1, 4, 8):
            inp_t = make_inputs(geo, batch, T=T)
            for method in verify_methods(geo["family"]):
                kw = {"method": method}
                cfgs = [("", c) for c in ((32, 16, 4),) + (() if quick or method != "mma" else MMA_VERIFY_CONFIGS)]
                if method == "mma" and geo["family"] == "gdn":   # the one-wave grid's blocks (tuning.ONE_WAVE_BLOCK_K)
                    cfgs.append((" one-wave", (64, 32, 1)))
                for tag, (bv, bk, nw) in cfgs:
                    yield name, f"verify T{T} {method}{tag} bv{bv} bk{bk} w{nw}", \
                        lambda mod=mod, pool=pool, inp_t=inp_t, kw=kw, bv=bv, bk=bk, nw=nw: \
                        mod.verify(pool, 0, slots, **inp_t, **kw,
                                   tuning=KernelTuning(block_v=bv, block_k=min(bk, geo["Dk"]), num_warps=nw))
    yield from pool_cases()
    yield from native_cases(batch, quick)


def pool_cases():
    """The pool's own commit kernel (ReplayStatePool._roll_conv on CUDA) at the Qwen3.5-4B conv shape:
    24 SSM layers, C = 8192 channels, kernel 4 (W = 3), bf16, 256 rows. Nothing is launched: the
    tensors (torch.empty, ~1.1 GB) are never touched, so they take address space, not memory."""
    from sglang_replayssm.kernels.conv_state import roll_conv_state

    B, nl, C, W, Tmax = 256, 24, 8192, 3, 8
    yield "pool", f"conv_roll B{B} nl{nl} C{C} W{W} bf16", lambda: roll_conv_state(
        torch.empty(nl, B + 1, C, W, dtype=torch.bfloat16), torch.empty(nl, B + 1, Tmax, C, dtype=torch.bfloat16),
        torch.arange(1, B + 1, dtype=torch.int64), torch.full((B,), 2, dtype=torch.int64),
        torch.zeros(B, Tmax, dtype=torch.int64))
    # a decode step's pointer move with its counts, a verify's counts (kernels/step_counts.py)
    from types import SimpleNamespace

    from sglang_replayssm.kernels import step_counts

    lean = SimpleNamespace(cursor=torch.zeros(B + 1, dtype=torch.int32), folded=torch.zeros(B + 1, dtype=torch.int64),
                           cfg=SimpleNamespace(window=16))
    slots, counts = torch.arange(1, B + 1, dtype=torch.int32), torch.zeros(12, dtype=torch.int64)
    yield "pool", f"decode advance + counts B{B}", lambda: step_counts.advance(lean, slots, counts)
    yield "pool", f"commit counts B{B} T4", lambda: step_counts.count_commit(lean, slots, slots, 4, counts)
    # a tree verify's parents from SGLang's child / sibling arrays (kernels/draft_tree.py), EAGLE's largest trees
    from sglang_replayssm.kernels import draft_tree

    nxt = torch.full((B, 64), -1, dtype=torch.int64)
    yield "pool", f"tree parents B{B} T64", lambda: draft_tree.tree_parents(nxt, nxt, torch.empty(B, 64, dtype=torch.int32))
    # a verify commit's indices + counts (SGLang's accepted positions with track slots; a path from the last node up
    # the tree parents), a flush's rows and its pointer move (kernels/commit_prep.py)
    from sglang_replayssm.kernels import commit_prep

    prep, nodes, T = torch.empty(8, B, dtype=torch.int32), torch.empty(B, 8, dtype=torch.int32), 8
    yield "pool", f"commit prep B{B} T{T} positions + track", lambda: commit_prep.commit_prep(
        lean, slots, slots, T, counts, prep, nodes, positions=torch.empty(B, T, dtype=torch.int64), track=slots,
        steps=slots)
    yield "pool", f"commit prep B{B} T{T} parents", lambda: commit_prep.commit_prep(
        lean, slots, slots, T, counts, prep, nodes, parents=torch.empty(B, T, dtype=torch.int32), from_last=True)
    yield "pool", f"flush prep B{B}", lambda: commit_prep.flush_prep(lean, slots, prep[:2])
    yield "pool", f"flush move B{B}", lambda: commit_prep.flush_move(lean, slots, slots)


def native_cases(batch, quick=False):
    """The native engine's own kernels at the e2e models' shapes (bench/e2e.py): decode attention
    reading the KV cache in place, and the fused non-SSM element-wise kernels (native/fused.py)."""
    from sglang_replayssm.native import fused
    from sglang_replayssm.native.attention import cache_attention
    from sglang_replayssm.native.model import rope_tables

    bf, f32, B = torch.bfloat16, torch.float32, batch
    z = lambda *s, dt=bf: torch.zeros(*s, dtype=dt)   # noqa: E731
    slots = torch.arange(1, B + 1, dtype=torch.int32)
    pos = torch.zeros(B, dtype=torch.long)
    # (model, hidden, SSM inner, groups, conv channels, SSM heads, head dim, MLP, attention (Hq, Hkv, D, rotary, qk-norm))
    shapes = (("nemotron-3-nano-4b", 3072, 7680, 8, 9728, 96, 80, 12288, (32, 8, 128, 0, False)),
              ("qwen3.5-4b", 2560, 4096, 32, 8192, 32, 128, 9216, (16, 4, 256, 64, True)))
    for name, hid, I, G, C, H, P, F, (Hq, Hkv, D, rd, qkn) in shapes:
        yield name, "add_rms_norm", lambda hid=hid: fused.add_rms_norm(z(B, 1, hid), z(B, 1, hid), z(hid, dt=f32), 1e-5)
        if name.startswith("nemotron"):
            yield name, "group_rms_norm before", lambda I=I, G=G: fused.group_rms_norm(
                z(B, G, I // G), z(I, dt=f32), 1e-5, z(B, G, I // G), "before")
            yield name, "act_mul relu2", lambda F=F: fused.act_mul(z(B, 1, F), None, "relu2")
        else:
            yield name, "group_rms_norm after", lambda H=H, P=P: fused.group_rms_norm(
                z(B, H, P), z(P, dt=f32), 1e-6, z(B, H, P), "after")
            yield name, "act_mul silu", lambda F=F: fused.act_mul(z(B, 1, F), z(B, 1, F), "silu")
        cos, sin = rope_tables(256, rd, 1e7, "cpu") if rd else (None, None)
        cache = z(B + 1, 256, Hkv, D)
        for T in (1,) if quick else (1, 5, 8):
            if qkn or rd:
                yield name, f"norm_rope k->cache T{T}", lambda T=T, Hkv=Hkv, D=D, cos=cos, sin=sin, rd=rd, cache=cache: \
                    fused.norm_rope(z(B, T, Hkv, D), pos, 1e-6, z(D, dt=f32), cos, sin, rd, cache=cache, slots=slots)
            yield name, f"cache write v T{T}", lambda T=T, Hkv=Hkv, D=D, cache=cache: \
                fused.norm_rope(z(B, T, Hkv, D), pos, cache=cache, slots=slots)
        state, cin, w = z(B + 1, C, 3), z(B + 1, 8, C), z(C, 4)
        bias = z(C) if name.startswith("nemotron") else None
        sp = [I, G * 128, G * 128] if name.startswith("nemotron") else [2048, 2048, 4096]
        for T in (1, 5) if quick else (1, 5, 8, 16):
            yield name, f"conv_update T{T}", lambda T=T, C=C, state=state, w=w, bias=bias, sp=sp: \
                fused.conv_update(z(B, T, C), state, w, bias, slots, None, sp)
        yield name, "conv_update verify T5", lambda C=C, state=state, cin=cin, w=w, bias=bias, sp=sp: \
            fused.conv_update(z(B, 5, C), state, w, bias, slots, cin, sp)
    for D, G in ((128, 4),) if quick else ((128, 4), (256, 4)):
        Hkv, L = 8, 128
        q = torch.zeros(batch, Hkv, G, D, dtype=torch.bfloat16)
        kc = torch.zeros(batch + 1, L, Hkv, D, dtype=torch.bfloat16)
        qpos = torch.zeros(batch, G, dtype=torch.int32)
        yield "attention", f"decode D{D} G{G}", lambda q=q, kc=kc, qpos=qpos: \
            cache_attention(q, kc, kc, slots, qpos, L, D ** -0.5)
        # the split-KV path (two chunks of L / 2 keys, then the merge launch)
        yield "attention", f"decode split D{D} G{G}", lambda q=q, kc=kc, qpos=qpos: \
            cache_attention(q, kc, kc, slots, qpos, L, D ** -0.5, num_splits=2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--geos", default="all", help="comma-separated names of " + ", ".join(GEOMS))
    ap.add_argument("--filter", default="", help="only labels containing this text")
    ap.add_argument("--batch", type=int, default=4, help="rows per launch (does not change the code compiled)")
    ap.add_argument("--quick", action="store_true", help="one configuration per kernel and variant")
    ap.add_argument("--sass-dir", default=None, help="also write each kernel's normalized SASS here (for diffs)")
    args = ap.parse_args(argv)
    unknown = [g for g in args.geos.split(",") if args.geos != "all" and g not in GEOMS]
    if unknown:
        ap.error(f"--geos: unknown geometry {unknown[0]!r} (choose from {', '.join(GEOMS)})")
    geos = GEOMS if args.geos == "all" else {g: GEOMS[g] for g in args.geos.split(",")}
    rows = []
    t0 = time.time()
    print(f"{'geometry':26s} {'launch':34s} {'kernel':28s} {'regs':>4s} {'local':>5s} {'stack':>5s} {'smem':>6s} "
          f"{'warps':>5s} {'blk/SM':>6s} {'occ':>5s}")
    with Recorder() as rec:
        for name, label, fn in cases(geos, args.batch, args.quick):
            if args.filter and args.filter not in label:
                continue
            if isinstance(fn, Exception):
                rows.append(dict(geo=name, launch=label, error=str(fn)))
                print(f"{name:26s} {label:34s} unsupported: {fn}")
                continue
            try:
                fn()
            except Exception as e:
                rows.append(dict(geo=name, launch=label, error=f"{type(e).__name__}: {e}"))
                print(f"{name:26s} {label:34s} error: {type(e).__name__}: {str(e)[:80]}")
                rec.take()
                continue
            for kname, k in rec.take():
                md = k.metadata
                ru = resource_usage(k.asm["cubin"])
                smem = max(int(md.shared), ru["static_smem"])
                occ = occupancy(ru["regs"], md.num_warps, smem)
                row = dict(geo=name, launch=label, kernel=kname, num_warps=md.num_warps, shared=smem, **ru, **occ,
                           sass=sass_fingerprint(k.asm["cubin"], dump=sass_path(args.sass_dir, name, label, kname)))
                rows.append(row)
                print(f"{name:26s} {label:34s} {kname:28s} {ru['regs']:4d} {ru['local']:5d} {ru['stack']:5d} {smem:6d} "
                      f"{md.num_warps:5d} {occ['blocks_per_sm']:6d} {occ['occupancy']:5.2f}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "kernel_resources.json")
    meta = dict(command="python tests/kernels/kernel_resources.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                target="sm_90 (compiled offline)", triton=triton.__version__, torch=torch.__version__,
                time=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), seconds=round(time.time() - t0, 1))
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(f"wrote {path} ({len(rows)} rows, {meta['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
