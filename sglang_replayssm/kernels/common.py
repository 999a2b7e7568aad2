"""Shared pieces of the ReplaySSM Triton kernels: interpreter switch, small math helpers,
read-copy quantizers (fp8 e4m3 per row, NVFP4), fp16 stochastic rounding, validation helpers.

The interpreter switch (CPU machines) lives in the package ``__init__``.
"""
from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
# fp32 products of state-sized tiles on the GPU: 3xTF32 tensor-core dots (fp32-level accuracy,
# few registers); the interpreter computes every dot in fp32 anyway.
FOLD_PREC = tl.constexpr("ieee" if INTERPRET else "tf32x3")
# the verify launches' state products: 3xTF32 tensor-core dots on the GPU (fp32-accurate), exact fp32 in the
# interpreter; read when a verify launches (bench/verify_parts.py times "ieee", FMA dots, on the GPU)
DOT_PREC = "ieee" if INTERPRET else "tf32x3"

SOFTPLUS_THRESHOLD = 20.0
FP8_MAX = 448.0

RC_NONE, RC_FP8, RC_NVFP4 = 0, 1, 2


# ----------------------------------------------------------------------------- math helpers
@triton.jit
def softplus(x):
    return tl.where(x <= 20.0, tl.log(1.0 + tl.exp(x)), x)


@triton.jit
def l2norm(x, EPS: tl.constexpr):
    return x / tl.sqrt(tl.sum(x * x, axis=0) + EPS)


@triton.jit
def col_select(X, idx, cols):
    """X[:, idx] of a 2-D tile, as a vector (cols = arange over X's second axis)."""
    return tl.sum(tl.where(cols[None, :] == idx, X, 0.0), axis=1)


@triton.jit
def row_select(X, idx, rows):
    """X[idx, :] of a 2-D tile, as a vector (rows = arange over X's first axis)."""
    return tl.sum(tl.where(rows[:, None] == idx, X, 0.0), axis=0)


# ----------------------------------------------------------------------------- fp8 e4m3
@triton.jit
def round_e4m3(y):
    """Round fp32 to the nearest e4m3 value (ties to even, saturating at 448), still in fp32.

    Only used under the interpreter, whose fp32->fp8 cast does not round correctly; on the
    GPU the hardware conversion (cvt.rn.satfinite) does exactly this."""
    bits = y.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)
    ulp = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    r = ((y / ulp + 12582912.0) - 12582912.0) * ulp
    return tl.minimum(tl.maximum(r, -448.0), 448.0)


# ----------------------------------------------------------------------------- NVFP4
@triton.jit
def nvfp4_code_value(idx):
    # table {0, .5, 1, 1.5, 2, 3, 4, 6}
    return tl.where(idx < 4, idx.to(tl.float32) * 0.5,
                    tl.where(idx == 4, 2.0, tl.where(idx == 5, 3.0, tl.where(idx == 6, 4.0, 6.0))))


@triton.jit
def store_nvfp4_chunk(S, rc_ptr, bs_ptr, rows, c, mask_v, gs, K: tl.constexpr, BKC: tl.constexpr,
                      BV: tl.constexpr, SHARED: tl.constexpr, INTERPRET: tl.constexpr):
    """NVFP4-quantize column chunk c (whole 16-blocks) of rows of one head (reference.quant.quant_nvfp4):
    e4m3 block scale bs = e4m3(amax/6/gs), e2m1 code of |x|/(bs*gs) (ties to the lower magnitude),
    two codes per byte (even element in the low nibble). Returns the dequantized chunk (for shared
    mode) or S unchanged."""
    NB: tl.constexpr = BKC // 16
    S3 = tl.reshape(S, [BV, NB, 16])
    bamax = tl.max(tl.abs(S3), axis=2)
    bs = tl.minimum(bamax / 6.0 / gs, 448.0)
    if INTERPRET:
        bs = round_e4m3(bs)
    bs8 = bs.to(tl.float8e4nv)
    o_b = c * NB + tl.arange(0, NB)
    tl.store(bs_ptr + rows[:, None] * (K // 16) + o_b[None, :], bs8, mask=mask_v[:, None])
    denom = bs8.to(tl.float32) * gs
    # 1e-38 is below the smallest normal fp32: as a Python float it would make Triton divide and
    # compare in fp64 (and differ from the reference's fp32 division at the code thresholds)
    tiny = tl.full([BV, NB], 1e-38, tl.float32)
    y3 = tl.where(denom[:, :, None] > 0.0, S3 / tl.maximum(denom, tiny)[:, :, None], 0.0)
    ay = tl.abs(y3)
    idx = ((ay > 0.25).to(tl.int32) + (ay > 0.75).to(tl.int32) + (ay > 1.25).to(tl.int32)
           + (ay > 1.75).to(tl.int32) + (ay > 2.5).to(tl.int32) + (ay > 3.5).to(tl.int32)
           + (ay > 5.0).to(tl.int32))
    code = idx | tl.where(y3 < 0.0, 8, 0)
    code2 = tl.reshape(code, [BV, BKC // 2, 2])
    lo, hi = tl.split(code2)
    packed = (lo | (hi << 4)).to(tl.uint8)
    o_p = c * (BKC // 2) + tl.arange(0, BKC // 2)
    tl.store(rc_ptr + rows[:, None] * (K // 2) + o_p[None, :], packed, mask=mask_v[:, None])
    if SHARED:
        mag = nvfp4_code_value(idx)
        val = tl.where((code & 8) != 0, -mag, mag) * denom[:, :, None]
        S = tl.reshape(val, [BV, BKC])
    return S


# ----------------------------------------------------------------------------- fp16 + SR
@triton.jit
def _mix32(h):
    h = h ^ (h >> 16)
    h = h * 0x7FEB352D
    h = h ^ (h >> 15)
    h = h * 0x846CA68B
    h = h ^ (h >> 16)
    return h


@triton.jit
def sr_uniform(seed, stream, idx):
    """Counter-based uniform in [0, 1), bit-exact with reference.quant.sr_uniform:
    u = mix(idx ^ mix(seed * 0x9E3779B9 + stream)) >> 8 / 2**24, in uint32 arithmetic."""
    key = _mix32(seed.to(tl.uint32) * 0x9E3779B9 + stream.to(tl.uint32))
    h = _mix32(idx.to(tl.uint32) ^ key)
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)


# ----------------------------------------------------------------------------- validation
def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_tensor(name: str, t, shape=None, dtype=None, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if dtype is not None:
        dts = dtype if isinstance(dtype, (tuple, list)) else (dtype,)
        if t.dtype not in dts:
            raise ValueError(f"{name} must have dtype {' or '.join(map(str, dts))}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def output_tensor(out, shape, like: torch.Tensor, device) -> torch.Tensor:
    """The caller's `out` (checked: shape and device), or a new tensor of `like`'s dtype."""
    if out is None:
        out = torch.empty(shape, dtype=like.dtype, device=like.device)
    check_tensor("out", out, shape=shape, device=device)
    return out


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def check_stages(stages):
    """The decode wrappers' `stages`: None (plain loop over the state's column chunks) or an int >= 2
    (Triton software-pipelines that loop's loads with cp.async: more bytes in flight per warp, more
    shared memory per program)."""
    check(stages is None or (isinstance(stages, int) and stages >= 2),
          f"stages must be None or an int >= 2, got {stages!r}")
    return stages


def check_block_k(block_k, Dk: int, name: str = "block_k") -> int:
    """A wrapper's column-chunk knob (`block_k`, `flush_block_k`): None (0: the wrapper's default) or
    a power of 2 >= 16 dividing head_k_dim (a chunk that does not divide it would skip columns)."""
    if block_k is None:
        return 0
    check(isinstance(block_k, int) and block_k >= 16 and block_k & (block_k - 1) == 0 and Dk % block_k == 0,
          f"{name} must be None or a power of 2 >= 16 dividing head_k_dim {Dk}, got {block_k!r}")
    return block_k


def launch_stages(stages) -> dict:
    """The verify wrappers' `stages`: None (Triton's default software pipelining of the column loop) or
    the launch's num_stages, 1 (none) to 4; returned as launch keyword arguments."""
    check(stages is None or (isinstance(stages, int) and 1 <= stages <= 4),
          f"stages must be None or an int in 1..4, got {stages!r}")
    return {} if stages is None else {"num_stages": stages}


def check_flush_block_k(flush_block_k, Dk: int) -> int:
    """The decode wrappers' `flush_block_k` (check_block_k; 0 to the kernel: use block_k)."""
    return check_block_k(flush_block_k, Dk, "flush_block_k")


def flush_launch_warps(flush_warps, num_warps: int) -> int:
    """Warps of the split decode's flush launch (the decode wrappers' `flush_warps`): None -> at least
    4 (the fold's tensor-core dot and whole-row chunks want several warps), or a power of 2 in 1..16."""
    check(flush_warps is None or (isinstance(flush_warps, int) and flush_warps in (1, 2, 4, 8, 16)),
          f"flush_warps must be None or a power of 2 in 1..16, got {flush_warps!r}")
    return flush_warps or max(num_warps, 4)


# Where the split decode measured faster than the fused one on the H200 (batch 256; bench/README.md,
# Kernels, "Third run", "Fourth run", "Sixth run" and "Seventh run"), its best blocks: (block_v, block_k, num_warps,
# stages, whole-row flush, flush launch warps or None), per (family, read copy).
SPLIT_TUNED = {
    ("gdn", RC_FP8): (32, 128, 1, None, True, 2),
    ("mamba2", RC_NONE): (16, 32, 1, None, True, 1),
    ("mamba2", RC_FP8): (32, 32, 1, None, True, 2),
    ("kda", RC_NONE): (32, 64, 1, 2, True, 2),
    ("kda", RC_FP8): (32, 64, 1, 2, True, 2),
}


def decode_plan(family: str, rc_mode: int, batch: int, heads: int, Dk: int, method, knobs: dict):
    """The decode method and block knobs a wrapper uses. method None picks "split" where SPLIT_TUNED
    has an entry and the grid fills the GPU (batch * heads >= 1024), else "fused". A split decode
    with none of the knobs set gets the tuned blocks (block_k capped at head_k_dim; the whole-row
    flush is flush_block_k = head_k_dim)."""
    tuned = SPLIT_TUNED.get((family, rc_mode))
    if method is None:
        method = "split" if tuned is not None and batch * heads >= 1024 else "fused"
    check(method in ("fused", "split"), f"method must be None, 'fused' or 'split', got {method!r}")
    if method == "split" and tuned is not None and all(v is None for v in knobs.values()):
        bv, bk, nw, ns, whole, fw = tuned
        knobs = dict(knobs, block_v=bv, block_k=chunk_k(Dk, min(bk, Dk)), num_warps=nw, stages=ns,
                     flush_block_k=Dk if whole else None, flush_warps=fw)
    check_block_k(knobs.get("block_k"), Dk)
    return method, knobs


# Verify blocks (block_v, num_warps) per (family, method), from the H200 sweeps at batch 256 (bench/README.md,
# Kernels, "Fourth run"): the tensor-core verify is fastest as one warp per 64-128 value rows (4 warps: 2-4x
# slower).
VERIFY_TUNED = {("gdn", "fma"): (32, 2), ("gdn", "mma"): (64, 1), ("gdn", "split"): (32, 2),
                ("mamba2", "fma"): (64, 4), ("mamba2", "mma"): (64, 1),
                ("kda", "fma"): (32, 2), ("kda", "mma"): (128, 1)}


def check_block_v(block_v, default: int) -> int:
    """A wrapper's value rows per program (`block_v`): the given one (a power of 2 >= 16), else default."""
    check(block_v is None or (isinstance(block_v, int) and block_v >= 16 and block_v & (block_v - 1) == 0),
          f"block_v must be None or a power of 2 >= 16, got {block_v!r}")
    return block_v or default


def block_knobs(block_v, num_warps, default_v: int, default_warps: int) -> tuple[int, int]:
    """A launch's (block_v, num_warps): the given ones (validated), else the defaults."""
    check(num_warps is None or num_warps in (1, 2, 4, 8, 16),
          f"num_warps must be None or a power of 2 in 1..16, got {num_warps!r}")
    return check_block_v(block_v, default_v), num_warps or default_warps


def verify_methods(family: str) -> list[str]:
    """The verify methods a family's wrapper has (VERIFY_TUNED's keys): fma, mma, and split for GDN."""
    return [m for f, m in VERIFY_TUNED if f == family]


def verify_plan(family: str, method, block_v, num_warps) -> tuple[str, int, int]:
    """A verify launch's (method, block_v, num_warps): method None is "mma" (the fastest on the H200 at every
    T = 1..8), else one of verify_methods(family); the given blocks, else VERIFY_TUNED's."""
    have = verify_methods(family)
    method = "mma" if method is None else method
    check(method in have, f"method must be None, {', '.join(map(repr, have[:-1]))} or {have[-1]!r}, got {method!r}")
    return (method, *block_knobs(block_v, num_warps, *VERIFY_TUNED[(family, method)]))


def default_warps(batch: int, heads: int) -> int:
    """Warps per decode program. Measured on the H200 (bench/results/kernels.json): one warp per
    (row, head, 32 value rows) program, reducing each 32-column chunk with shuffles, moves the most
    bytes per second once the grid is large; 4 warps win only for tiny grids (batch 1)."""
    return 1 if batch * heads >= 1024 else 4


def chunk_k(Dk: int, want: int = 32) -> int:
    """Column chunk of the state walked per loop iteration (a power of 2 >= 16 dividing Dk)."""
    for c in (want, 32, 16):
        if c <= Dk and Dk % c == 0:
            return c
    raise ValueError(f"head_k_dim {Dk} must be a multiple of 16")


# ----------------------------------------------------------------------------- pool access
class LayerViews:
    """The pool tensors of one SSM layer (views, no copies) plus the config the kernels need."""

    def __init__(self, pool, layer: int):
        cfg = pool.cfg
        if getattr(cfg, "mode", "replay") != "replay":
            raise ValueError(f"ReplaySSM kernels need a pool in mode='replay', got mode={cfg.mode!r} "
                             "(use conventional_decode on pool.ckpt[layer])")
        if pool.ckpt.dtype not in (torch.float32, torch.float16):
            raise ValueError(f"kernels support ckpt 'fp32' and 'fp16-sr', got checkpoint dtype {pool.ckpt.dtype}")
        nl = pool.ckpt.shape[0]
        if not (0 <= int(layer) < nl):
            raise ValueError(f"layer must be in [0, {nl}), got {layer}")
        self.layer = int(layer)
        self.family = pool.geo.family
        self.ckpt = pool.ckpt[layer]
        self.rec_d = pool.rec_d[layer]
        self.rec_k = pool.rec_k[layer]
        self.rec_g = pool.rec_g[layer]
        self.cursor = pool.cursor
        self.folded = pool.folded
        self.window = int(cfg.window)
        self.R = int(self.rec_d.shape[1])
        self.num_slots = int(self.ckpt.shape[0])
        rc_mode = getattr(cfg, "read_copy", "none")
        self.rc_mode = {"none": RC_NONE, "fp8": RC_FP8, "nvfp4": RC_NVFP4}[rc_mode]
        self.rc = pool.rc[layer] if self.rc_mode != RC_NONE else None
        self.rc_scale = pool.rc_scale[layer] if self.rc_mode != RC_NONE else None
        self.rc_gscale = pool.rc_gscale[layer] if self.rc_mode == RC_NVFP4 else None
        self.ckpt_sr = getattr(cfg, "ckpt", "fp32") == "fp16-sr"
        self.shared_quant = bool(getattr(cfg, "shared_quant", False))
        self.seed = int(getattr(cfg, "sr_seed", 0))
        H, Dv, Dk = self.ckpt.shape[1:]
        self.H, self.Dv, self.Dk = int(H), int(Dv), int(Dk)
        self.Hk = int(self.rec_k.shape[2])
        self.device = self.ckpt.device

    def rc_args(self):
        """(rc, rc_scale, rc_gscale) pointers; dummies (the ckpt) where the mode has none."""
        if self.rc_mode == RC_NONE:
            return self.ckpt, self.ckpt, self.ckpt
        if self.rc_mode == RC_FP8:
            return self.rc, self.rc_scale, self.rc_scale
        return self.rc, self.rc_scale, self.rc_gscale


def check_slots(slots, device, num_slots):
    check_tensor("slots", slots, dtype=torch.int32, device=device)
    check(slots.dim() == 1, f"slots must be 1-D [B], got shape {tuple(slots.shape)}")
    return int(slots.shape[0])


# ----------------------------------------------------------------------------- state tiles
@triton.jit
def fp16_sr(x, seed, stream, idx):
    """fp32 -> fp16 with stochastic rounding between the two fp16 neighbours of x
    (reference.quant.round_fp16_sr)."""
    x = tl.minimum(tl.maximum(x, -65504.0), 65504.0)
    r = x.to(tl.float16)
    rf = r.to(tl.float32)
    rb = r.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    neg = (rb & 0x8000) != 0
    mag = rb & 0x7FFF
    # next fp16 above r (toward +inf) and below r (toward -inf), as bit patterns
    up_b = tl.where(neg, tl.where(mag == 0, 0x0001, rb - 1), rb + 1)
    dn_b = tl.where(neg, rb + 1, tl.where(mag == 0, 0x8001, rb - 1))
    up = up_b.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    dn = dn_b.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    below = rf < x
    lo = tl.where(below, rf, dn)
    hi = tl.where(below, up, rf)
    p = (x - lo) / (hi - lo)
    u = sr_uniform(seed, stream, idx)
    res = tl.where(u < p, hi, lo)
    res = tl.where(rf == x, rf, res)
    return res.to(tl.float16)


@triton.jit
def load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, o_kc, mask_v,
                     K: tl.constexpr, RC: tl.constexpr):
    """[BV, BKC] fp32 chunk (rows o_v, columns o_kc) of one head's checkpoint (RC=0) or of its
    dequantized read copy (RC=1 fp8 per-row scales, RC=2 NVFP4). head_rows: int64 index of the
    head's row 0 in the [S*H*Dv] row space; i_head: its index in the [S*H] head space."""
    rows = head_rows + o_v
    if RC == 0:
        S = tl.load(ckpt_ptr + rows[:, None] * K + o_kc[None, :], mask=mask_v[:, None], other=0.0).to(tl.float32)
    elif RC == 1:
        S = tl.load(rc_ptr + rows[:, None] * K + o_kc[None, :], mask=mask_v[:, None], other=0.0).to(tl.float32)
        S = S * tl.load(rs_ptr + rows, mask=mask_v, other=0.0)[:, None]
    else:
        byte = tl.load(rc_ptr + rows[:, None] * (K // 2) + (o_kc[None, :] // 2), mask=mask_v[:, None],
                       other=0).to(tl.int32)
        code = tl.where((o_kc[None, :] % 2) == 0, byte & 0xF, (byte >> 4) & 0xF)
        mag = nvfp4_code_value(code & 0x7)
        val = tl.where((code & 0x8) != 0, -mag, mag)
        bs = tl.load(rs_ptr + rows[:, None] * (K // 16) + (o_kc[None, :] // 16), mask=mask_v[:, None],
                     other=0.0).to(tl.float32)
        S = val * bs * tl.load(rgs_ptr + i_head)
    return S


@triton.jit
def replay_pass(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v,
                q_row, k_row, rq, rk, reck_base, o_r, mask_r,
                RKS: tl.constexpr, K: tl.constexpr, BKC: tl.constexpr, BV: tl.constexpr,
                BR: tl.constexpr, RC: tl.constexpr, NEED_K: tl.constexpr, ACC: tl.constexpr,
                NS: tl.constexpr = None, RECS: tl.constexpr = True):
    """One pass over the head's state in column chunks: S0 q, S0 k ([BV]) and the record dot
    products K_r q, K_r k ([BR]) for the current token (q = q_row * rq, k = k_row * rk).
    ACC: accumulate products elementwise and reduce once at the end (many warps per program),
    else reduce every chunk (one- or two-warp programs, where reductions are cheap shuffles)."""
    if ACC:
        aq = tl.zeros([BV, BKC], dtype=tl.float32)
        ak = tl.zeros([BV, BKC], dtype=tl.float32)
        rqa = tl.zeros([BR, BKC], dtype=tl.float32)
        rka = tl.zeros([BR, BKC], dtype=tl.float32)
    else:
        sq = tl.zeros([BV], dtype=tl.float32)
        sk = tl.zeros([BV], dtype=tl.float32)
        kq = tl.zeros([BR], dtype=tl.float32)
        kk = tl.zeros([BR], dtype=tl.float32)
    for c in tl.range(0, K // BKC, num_stages=NS):  # NS: software-pipelined loads (None: plain loop)
        o_kc = c * BKC + tl.arange(0, BKC)
        qc = tl.load(q_row + o_kc).to(tl.float32)
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, o_kc, mask_v, K, RC)
        if RECS:
            Kr = tl.load(reck_base + o_r[:, None] * RKS + o_kc[None, :], mask=mask_r[:, None],
                         other=0.0).to(tl.float32)
        if ACC:
            aq += S0 * qc[None, :]
            if RECS:
                rqa += Kr * qc[None, :]
        else:
            sq += tl.sum(S0 * qc[None, :], axis=1)
            if RECS:
                kq += tl.sum(Kr * qc[None, :], axis=1)
        if NEED_K:
            kc = tl.load(k_row + o_kc).to(tl.float32)
            if ACC:
                ak += S0 * kc[None, :]
                if RECS:
                    rka += Kr * kc[None, :]
            else:
                sk += tl.sum(S0 * kc[None, :], axis=1)
                if RECS:
                    kk += tl.sum(Kr * kc[None, :], axis=1)
    if ACC:
        sq = tl.sum(aq, axis=1)
        sk = tl.sum(ak, axis=1)
        kq = tl.sum(rqa, axis=1)
        kk = tl.sum(rka, axis=1)
    return sq * rq, sk * rk, kq * rq, kk * rk


@triton.jit
def _loop_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, recd_base, recg_base, cnt, gtot,
                      alpha, dcur, k_row, rk, RKS: tl.constexpr, RDS: tl.constexpr, RGS: tl.constexpr,
                      K: tl.constexpr, HAS_CUR: tl.constexpr):
    """_new_state_chunk by rank-1 fp32 FMA updates, one record at a time: few registers and no shared
    memory, but two dependent loads per record (fold_store DOT=False)."""
    rows = head_rows + o_v
    S = tl.load(ckpt_ptr + rows[:, None] * K + o_kc[None, :], mask=mask_v[:, None], other=0.0).to(tl.float32)
    S = S * tl.exp(gtot)
    cum = gtot * 0.0
    for j in range(cnt):
        cum += tl.load(recg_base + j * RGS)
        dj = tl.load(recd_base + j * RDS + o_v, mask=mask_v, other=0.0).to(tl.float32) * tl.exp(gtot - cum)
        kj = tl.load(reck_base + j * RKS + o_kc).to(tl.float32)
        S += dj[:, None] * kj[None, :]
    S = alpha * S
    if HAS_CUR:
        kc = tl.load(k_row + o_kc).to(tl.float32) * rk
        S = S + dcur[:, None] * kc[None, :]
    return S


@triton.jit
def weighted_records(recd_base, recg_base, cnt, gtot, o_v, mask_v, RDS: tl.constexpr, RGS: tl.constexpr,
                     BR: tl.constexpr):
    """Records 0..cnt-1 of one head as one tile: d_j w_j [BR, BV] (rows o_v; w_j = exp(gtot - sum_{i<=j} g_i),
    the decay from record j to the last one; rows >= cnt are 0), and the record index vector and mask."""
    o_r = tl.arange(0, BR)
    mr = o_r < cnt
    Gr = tl.load(recg_base + o_r * RGS, mask=mr, other=0.0)
    w = tl.where(mr, tl.exp(gtot - tl.cumsum(Gr, axis=0)), 0.0)
    Dr = tl.load(recd_base + o_r[:, None] * RDS + o_v[None, :], mask=mr[:, None] & mask_v[None, :],
                 other=0.0).to(tl.float32)
    return Dr * w[:, None], o_r, mr


@triton.jit
def _new_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, Dw, o_r, mr, gtot,
                     alpha, dcur, k_row, rk, RKS: tl.constexpr, K: tl.constexpr, HAS_CUR: tl.constexpr):
    """Columns o_kc of alpha*(S0 exp(gtot) + Dw^T K_r) (+ dcur k^T), Dw the weighted records of
    weighted_records: the checkpoint chunk and the record keys are two loads in flight at once, the
    record sum one tensor-core dot (3xTF32: fp32-level accuracy)."""
    rows = head_rows + o_v
    S = tl.load(ckpt_ptr + rows[:, None] * K + o_kc[None, :], mask=mask_v[:, None], other=0.0).to(tl.float32)
    Kr = tl.load(reck_base + o_r[:, None] * RKS + o_kc[None, :], mask=mr[:, None], other=0.0).to(tl.float32)
    S = alpha * (S * tl.exp(gtot) + tl.dot(tl.trans(Dw), Kr, input_precision=FOLD_PREC))
    if HAS_CUR:
        kc = tl.load(k_row + o_kc).to(tl.float32) * rk
        S = S + dcur[:, None] * kc[None, :]
    return S


@triton.jit
def read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, RC: tl.constexpr):
    """Store and return the read copy's scales from the new state's row maxima amax [BV]: fp8
    (RC=1) per-row scales amax/448, NVFP4 (RC=2) the per-head global scale max/(448*6) (the whole
    head is in this program). 1.0 where the maximum is 0; the unused one is returned as 1.0."""
    sc = tl.full(amax.shape, 1.0, tl.float32)
    gs = 1.0
    if RC == 1:
        sc = tl.where(amax == 0.0, 1.0, amax / 448.0)
        tl.store(rs_ptr + rows, sc, mask=mask_v)
    if RC == 2:
        hmax = tl.max(amax, axis=0)
        gs = tl.where(hmax == 0.0, 1.0, hmax / (448.0 * 6.0))
        tl.store(rgs_ptr + i_head, gs)
    return sc, gs


@triton.jit
def store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_kc, c, mask_v, sc, gs, seed, stream, idx_base,
                      K: tl.constexpr, BKC: tl.constexpr, BV: tl.constexpr, RC: tl.constexpr,
                      CKPT_SR: tl.constexpr, SHARED: tl.constexpr, INTERPRET: tl.constexpr):
    """Write column chunk c (columns o_kc) of a folded state S [BV, BKC]: the read copy (fp8 with
    per-row scales sc, or NVFP4 with global scale gs), then the checkpoint (fp32, or fp16 with
    stochastic rounding). SHARED: the checkpoint gets the dequantized read copy."""
    offs = rows[:, None] * K + o_kc[None, :]
    if RC == 1:
        y = tl.minimum(tl.maximum(S / sc[:, None], -448.0), 448.0)
        if INTERPRET:
            y = round_e4m3(y)
        y8 = y.to(tl.float8e4nv)
        tl.store(rc_ptr + offs, y8, mask=mask_v[:, None])
        if SHARED:
            S = y8.to(tl.float32) * sc[:, None]
    if RC == 2:
        S = store_nvfp4_chunk(S, rc_ptr, rs_ptr, rows, c, mask_v, gs, K, BKC, BV, SHARED, INTERPRET)
    if CKPT_SR:
        idx = idx_base + (o_v[:, None] * K + o_kc[None, :]).to(tl.int64)
        tl.store(ckpt_ptr + offs, fp16_sr(S, seed, stream, idx), mask=mask_v[:, None])
    else:
        tl.store(ckpt_ptr + offs, S.to(ckpt_ptr.dtype.element_ty), mask=mask_v[:, None])


@triton.jit
def fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v, reck_base, recd_base,
               recg_base, cnt, gtot, alpha, dcur, k_row, rk, seed, stream, idx_base,
               RKS: tl.constexpr, RDS: tl.constexpr, RGS: tl.constexpr, K: tl.constexpr,
               BKC: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr,
               RC: tl.constexpr, CKPT_SR: tl.constexpr, SHARED: tl.constexpr, HAS_CUR: tl.constexpr,
               INTERPRET: tl.constexpr, DOT: tl.constexpr = True):
    """Write the folded state S = alpha*(S0 exp(gtot) + sum_j w_j d_j k_j^T) (+ dcur k^T) of rows
    o_v of one head: checkpoint (fp32, or fp16 with stochastic rounding) and the read copy: fp8
    (per-row scales) or NVFP4 (the per-head global scale needs the whole head in this program:
    BV >= Dv). Reads S0 from the fp32/fp16 checkpoint. A quantized read copy needs the rows' maxima
    first: with whole rows in one chunk (BKC == K) the state is formed once, else in two passes.
    DOT False: the records' sum by per-record FMA updates (_loop_state_chunk) instead of one
    tensor-core dot: fewer registers and no shared memory where the fold shares a kernel with the
    non-flush rows (the fused Mamba-2 decode), at a serial chain of loads per record."""
    rows = head_rows + o_v
    if not DOT:
        amax = tl.zeros([BV], dtype=tl.float32)
        if RC != 0:
            for c in range(K // BKC):
                o_kc = c * BKC + tl.arange(0, BKC)
                S = _loop_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, recd_base, recg_base, cnt,
                                      gtot, alpha, dcur, k_row, rk, RKS, RDS, RGS, K, HAS_CUR)
                amax = tl.maximum(amax, tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1))
        sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, RC)
        for c in range(K // BKC):
            o_kc = c * BKC + tl.arange(0, BKC)
            S = _loop_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, recd_base, recg_base, cnt,
                                  gtot, alpha, dcur, k_row, rk, RKS, RDS, RGS, K, HAS_CUR)
            store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_kc, c, mask_v, sc, gs, seed, stream,
                              idx_base, K, BKC, BV, RC, CKPT_SR, SHARED, INTERPRET)
        return
    Dw, o_r, mr = weighted_records(recd_base, recg_base, cnt, gtot, o_v, mask_v, RDS, RGS, BR)
    if RC != 0 and BKC == K:
        o_k = tl.arange(0, K)
        S = _new_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_k, reck_base, Dw, o_r, mr, gtot, alpha, dcur,
                             k_row, rk, RKS, K, HAS_CUR)
        amax = tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1)
        sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, RC)
        store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_k, 0, mask_v, sc, gs, seed, stream, idx_base,
                          K, BKC, BV, RC, CKPT_SR, SHARED, INTERPRET)
    else:
        amax = tl.zeros([BV], dtype=tl.float32)
        if RC != 0:
            for c in range(K // BKC):
                o_kc = c * BKC + tl.arange(0, BKC)
                S = _new_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, Dw, o_r, mr, gtot, alpha,
                                     dcur, k_row, rk, RKS, K, HAS_CUR)
                amax = tl.maximum(amax, tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1))
        sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, RC)
        for c in range(K // BKC):
            o_kc = c * BKC + tl.arange(0, BKC)
            S = _new_state_chunk(ckpt_ptr, head_rows, o_v, mask_v, o_kc, reck_base, Dw, o_r, mr, gtot, alpha,
                                 dcur, k_row, rk, RKS, K, HAS_CUR)
            store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, o_kc, c, mask_v, sc, gs, seed, stream,
                              idx_base, K, BKC, BV, RC, CKPT_SR, SHARED, INTERPRET)


@triton.jit
def flush_tiles(ckpt_ptr, head_rows, o_v, mask_v, reck_base, o_r, mask_r, RKS: tl.constexpr, K: tl.constexpr):
    """A flush row's whole checkpoint rows o_v ([BV, K], fp32) and committed keys ([BR, K]), one load each."""
    o_k = tl.arange(0, K)
    S0 = tl.load(ckpt_ptr + (head_rows + o_v)[:, None] * K + o_k[None, :], mask=mask_v[:, None],
                 other=0.0).to(tl.float32)
    Kr = tl.load(reck_base + o_r[:, None] * RKS + o_k[None, :], mask=mask_r[:, None], other=0.0).to(tl.float32)
    return S0, Kr


@triton.jit
def fold_tile_store(S0, Kr, Dr, w, gtot, alpha, dcur, kcur, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head,
                    o_v, mask_v, seed, stream, idx_base, K: tl.constexpr, BV: tl.constexpr, RC: tl.constexpr,
                    CKPT_SR: tl.constexpr, SHARED: tl.constexpr, INTERPRET: tl.constexpr):
    """fold_store from registers (whole rows, flush_tiles): S = alpha (S0 exp(gtot) + (w D_r)^T K_r)
    + dcur kcur^T, then its read copy (scales from the rows' maxima) and checkpoint."""
    S = alpha * (S0 * tl.exp(gtot) + tl.dot(tl.trans(Dr * w[:, None]), Kr, input_precision=FOLD_PREC))
    S = S + dcur[:, None] * kcur[None, :]
    rows = head_rows + o_v
    amax = tl.max(tl.abs(tl.where(mask_v[:, None], S, 0.0)), axis=1)
    sc, gs = read_copy_scales(amax, rs_ptr, rgs_ptr, rows, mask_v, i_head, RC)
    store_state_chunk(S, ckpt_ptr, rc_ptr, rs_ptr, rows, o_v, tl.arange(0, K), 0, mask_v, sc, gs, seed, stream,
                      idx_base, K, K, BV, RC, CKPT_SR, SHARED, INTERPRET)


@triton.jit
def record_key_products(reck_ptr, x_row, y_row, slot, cur, i_hk, rx, ry, HK: tl.constexpr, K: tl.constexpr,
                        R: tl.constexpr, BR: tl.constexpr, NEED_Y: tl.constexpr):
    """K_r x and K_r y ([BR], rows >= cur are 0) of the committed record keys of (slot, k-head i_hk)
    with the token's vectors x = x_row * rx, y = y_row * ry: the part of a decode that every value
    head of the group and every value block shares (split decode, stage 1)."""
    o_r = tl.arange(0, BR)
    o_k = tl.arange(0, K)
    Kr = tl.load(reck_ptr + (slot * R * HK + i_hk) * K + o_r[:, None] * (HK * K) + o_k[None, :],
                 mask=(o_r < cur)[:, None], other=0.0).to(tl.float32)
    kx = tl.sum(Kr * tl.load(x_row + o_k).to(tl.float32)[None, :], axis=1) * rx
    ky = kx
    if NEED_Y:
        ky = tl.sum(Kr * tl.load(y_row + o_k).to(tl.float32)[None, :], axis=1) * ry
    return kx, ky


@triton.jit
def ring_program(slots_ptr, cursor_ptr, H: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                 BR: tl.constexpr):
    """Coordinates of a (value block, head, row) program of a decode / verify launch: its value rows
    o_v (mask_v), the row's slot and ring cursor, the committed records 0..cur-1 (o_r, mask_r), and
    the k-head (group) i_hk of value head i_h."""
    return ring_row(slots_ptr, cursor_ptr, tl.program_id(2), H, HK, V, BV, BR)


@triton.jit
def ring_row(slots_ptr, cursor_ptr, i_b, H: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
             BR: tl.constexpr):
    """ring_program for batch row i_b (value block program_id(0), head program_id(1))."""
    i_v = tl.program_id(0)
    i_h = tl.program_id(1)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    cur = tl.load(cursor_ptr + slot)
    o_v = i_v * BV + tl.arange(0, BV)
    o_r = tl.arange(0, BR)
    return i_v, i_h, i_b, i_h // (H // HK), slot, cur, o_v, o_v < V, o_r, o_r < cur


@triton.jit
def _flush_list_kernel(slots_ptr, cursor_ptr, frows_ptr, nflush_ptr, B, WINDOW: tl.constexpr, BLOCK: tl.constexpr):
    """The batch rows whose record fills the window this step, in row order, and their count."""
    o = tl.arange(0, BLOCK)
    m = o < B
    slot = tl.load(slots_ptr + o, mask=m, other=0)
    flush = m & (tl.load(cursor_ptr + slot, mask=m, other=0) + 1 >= WINDOW)
    fi = flush.to(tl.int32)
    tl.store(frows_ptr + tl.cumsum(fi, axis=0) - 1, o, mask=flush)
    tl.store(nflush_ptr, tl.sum(fi, axis=0))


def flush_list(slots, cursor, window: int):
    """The split decode's flush-row list, built on the device (no host sync): (rows [B] int32, count
    [1] int32, NFP). NFP, the flush launch's row programs, is twice the rows that flush per step in
    steady state (B / window) so a step with more flush rows than usual can still fold them in one wave;
    flush_rows decides how many of them work and which rows each folds, so any count is handled (all B
    rows at once: B / NFP rounds)."""
    B = int(slots.shape[0])
    rows = torch.empty(B, dtype=torch.int32, device=slots.device)
    count = torch.empty(1, dtype=torch.int32, device=slots.device)
    _flush_list_kernel[(1,)](slots, cursor, rows, count, B, WINDOW=window, BLOCK=next_pow2(B),
                             num_warps=4 if B <= 1024 else 8)
    return rows, count, flush_row_programs(B, window)


def flush_row_programs(B: int, window: int) -> int:
    """NFP of flush_list for B rows."""
    return min(B, max(1, 2 * triton.cdiv(B, window)))


# The flush-launch row programs that work per (value block, head) in steady state (B / window rows flush
# every step, staggered cursors), by family; each folds ceil(count / that) of the listed rows, one after the
# other (flush_rows_min), so the flush holds fewer of each SM's registers and the read launch beside it gets
# more. More flush rows than usual (a burst) put more row programs to work, up to all NFP (from NFP * fmin
# rows on), so a burst is folded as parallel as when every row program works. A family not listed: every
# row program works (KDA: its heavier fold measured fastest so). H200, B = 256: GDN fp8 0.1249 -> 0.1216
# ms, Mamba-2 Super fp32 0.3441 -> 0.3298, Nano fp32 0.3268 -> 0.3153; KDA with 2 working programs 7 %
# slower (bench/README.md, Kernels, "Eighth run").
FLUSH_PROGRAMS = {"gdn": 2, "mamba2": 1}


def flush_rows_min(family: str, B: int, window: int) -> int:
    """fmin of flush_rows for a split decode of B rows: the least listed rows one working row program
    folds, so that the steady-state count (ceil(B / window)) keeps FLUSH_PROGRAMS[family] of them busy."""
    a = FLUSH_PROGRAMS.get(family)
    return 1 if a is None else max(1, triton.cdiv(triton.cdiv(B, window), a))


@triton.jit
def flush_rows(nflush_ptr, fmin, NFP: tl.constexpr):
    """(first, end, step) of the listed flush rows that this row program (program_id(2)) folds:
    every step-th from the first, step = the number of working row programs, clamp(ceil(count / fmin),
    1, NFP); a program at or past step folds none."""
    n = tl.load(nflush_ptr)
    step = tl.minimum(tl.maximum((n + fmin - 1) // fmin, 1), NFP)
    p = tl.program_id(2)
    return p, tl.where(p < step, n, 0), step


# Warps of the split decode's prep launch (one small program per row and k-head / group / head): one warp
# measured faster than 4 (KDA 0.252 -> 0.223 ms fp32, 0.196 -> 0.168 fp8; GDN fp8 0.126 -> 0.124; Mamba-2
# unchanged; bench/README.md, Kernels, "Seventh run").
PREP_WARPS = 1


def decode_launch_rows(family: str, method: str, slots, lv, num_warps: int, flush_warps, given=None):
    """The row axis of a decode wrapper's main launch: every batch row for "fused"; for "split" only
    the flush rows (flush_list, or `given`: its (rows, count) computed earlier in the same step, or a
    function returning them, called only here), with
    the flush launch's warps (flush_launch_warps), the side stream it runs on beside the prep + read
    launches, and fmin (flush_rows_min). Returns (frows, nflush, NFP, fmin, grid rows, warps, stream)."""
    B = int(slots.shape[0])
    if method != "split":
        return slots, slots, 1, 1, B, num_warps, None
    if given is None:
        frows, nflush, nfp = flush_list(slots, lv.cursor, lv.window)
    else:
        frows, nflush = check_flush_list(given() if callable(given) else given, B, lv.device)
        nfp = flush_row_programs(B, lv.window)
    return (frows, nflush, nfp, flush_rows_min(family, B, lv.window), nfp, flush_launch_warps(flush_warps, num_warps),
            side_stream(lv.device))


def check_flush_list(given, B: int, device):
    """A decode wrapper's flush_list argument: (rows [B] int32, count [1] int32) on the pool's device,
    as flush_list returns them for this step's slots and cursors (one list serves every layer of a step:
    cursors move only between steps)."""
    check(isinstance(given, (tuple, list)) and len(given) == 2,
          f"flush_list must be (rows, count) from common.flush_list, got {type(given).__name__}")
    rows, count = given
    check_tensor("flush_list rows", rows, shape=(B,), dtype=torch.int32, device=device)
    check_tensor("flush_list count", count, shape=(1,), dtype=torch.int32, device=device)
    return rows, count


_SIDE_STREAMS: dict = {}


def side_stream(device):
    """A second stream of `device` forked from the current one (it waits for the work queued so far),
    so that a launch queued on it runs concurrently with the next launches on the current stream
    (captured into a CUDA graph as a parallel branch); join_stream waits for it. None on CPU, and
    while a graph is being captured before the stream exists (it is created on an eager call)."""
    if device.type != "cuda":
        return None
    s = _SIDE_STREAMS.get(device.index)
    if s is None:
        if torch.cuda.is_current_stream_capturing():
            return None
        s = _SIDE_STREAMS[device.index] = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    return s


def join_stream(s) -> None:
    if s is not None:
        torch.cuda.current_stream(s.device).wait_stream(s)


def on_stream(s):
    """torch.cuda.stream(s), or nothing for s None."""
    return torch.cuda.stream(s) if s is not None else contextlib.nullcontext()


@triton.jit
def state_tile(slots_ptr, state_ptr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
               BK: tl.constexpr):
    """A conventional-decode program's coordinates and its [BV, BK] fp32 tile of state[slot, head]
    (rows o_v, all K columns), with the offsets and mask to store it back."""
    i_v = tl.program_id(0)
    i_h = tl.program_id(1)
    i_b = tl.program_id(2)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, BK)
    mask_v = o_v < V
    mask_k = o_k < K
    mask2 = mask_v[:, None] & mask_k[None, :]
    offs = ((slot * H + i_h) * V + o_v[:, None]) * K + o_k[None, :]
    S = tl.load(state_ptr + offs, mask=mask2, other=0.0).to(tl.float32)
    return i_v, i_h, i_b, o_v, mask_v, o_k, mask_k, offs, mask2, S


@triton.jit
def load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H: tl.constexpr,
                 V: tl.constexpr, R: tl.constexpr):
    """Records 0..c-1 of one head: d [BR, BV] (rows o_v), per-record weights w [BR]
    (w_j = prod_{i>j} exp(g_i)) and the total decay gamma = prod_j exp(g_j)."""
    Gr = tl.load(recg_ptr + (slot * R + o_r) * H + i_h, mask=mask_r, other=0.0)
    gtot = tl.sum(Gr, axis=0)
    w = tl.where(mask_r, tl.exp(gtot - tl.cumsum(Gr, axis=0)), 0.0)
    Dr = tl.load(recd_ptr + ((slot * R + o_r[:, None]) * H + i_h) * V + o_v[None, :],
                 mask=mask_r[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    return Dr, w, tl.exp(gtot), gtot


@triton.jit
def fold_layer_head(layer, H: tl.constexpr):
    """A fold program's layer and head: program_id(1) = l * H + head over the launch's layers (layer,
    layer + 1, ..); returns (layer + l, head, l). The pool's tensors are [num_layers, S, ...] and
    contiguous, so row `slot` of layer first + l is row l * S + slot of the first layer's view."""
    i_lh = tl.program_id(1)
    l = i_lh // H
    return layer + l, i_lh % H, l


@triton.jit(do_not_specialize=["seed", "layer"])
def _fold_kernel(slots_ptr, counts_ptr, folded_ptr, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr,
                 recd_ptr, reck_ptr, recg_ptr, seed, layer, S,
                 H: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 R: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr,
                 RC: tl.constexpr, CKPT_SR: tl.constexpr, SHARED: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """Fold records 0..count-1 of each row into its checkpoint (+ read copy), for one layer or several
    (fold_layer_head; S: the pool's slots). count 0: no-op. Scalar-decay families (Mamba-2, GDN); KDA
    has its own in kda.py."""
    i_v = tl.program_id(0)
    i_b = tl.program_id(2)
    layer, i_h, l = fold_layer_head(layer, H)
    cnt = tl.load(counts_ptr + i_b)
    if cnt > 0:
        i_hk = i_h // (H // HK)
        row = tl.load(slots_ptr + i_b).to(tl.int64)
        stream = tl.load(folded_ptr + row) + cnt
        slot = row + l * S                   # in the first layer's views
        o_v = i_v * BV + tl.arange(0, BV)
        o_r = tl.arange(0, BR)
        mask_v = o_v < V
        mask_r = o_r < cnt
        Gr = tl.load(recg_ptr + (slot * R + o_r) * H + i_h, mask=mask_r, other=0.0)
        gtot = tl.sum(Gr, axis=0)
        idx_base = (layer * H + i_h).to(tl.int64) * (V * K)
        fold_store(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, (slot * H + i_h) * V, slot * H + i_h, o_v, mask_v,
                   reck_ptr + (slot * R * HK + i_hk) * K, recd_ptr + (slot * R * H + i_h) * V,
                   recg_ptr + slot * R * H + i_h, cnt, gtot, 1.0,
                   tl.zeros([BV], dtype=tl.float32), reck_ptr, 1.0, seed, stream, idx_base,
                   HK * K, H * V, H, K, BKC, BV, BR, RC, CKPT_SR, SHARED, False, INTERPRET)


# The commit fold's blocks (block_v, block_k, num_warps) per family, measured on the H200 at batch 256 with
# half the rows folding (bench/README.md, Kernels, "Fourth run"): 2-warp programs of 32 value rows walking
# 32-column chunks (whole 128-column rows and 4-8 warps were slower).
FOLD_TUNED = {"gdn": (32, 32, 2), "mamba2": (32, 32, 2), "kda": (32, 32, 2)}


def fold(pool, layer: int | None, slots, counts, per_channel: bool,
         block_v: int | None = None, block_k: int | None = None, num_warps: int | None = None) -> None:
    """Fold records 0..counts[b]-1 of slots[b] into the checkpoint (+ read copy), in place, of one layer
    or (layer None) of every layer of the pool in one launch (pool.commit's call).

    slots / counts: int32 tensors [B] on the pool's device, or sequences of ints. Rows with
    counts[b] == 0 are untouched. Does not move cursor/folded (the pool does). Blocks: FOLD_TUNED where
    none is given."""
    lv = LayerViews(pool, 0 if layer is None else layer)
    nl = int(pool.ckpt.shape[0]) if layer is None else 1
    if not isinstance(slots, torch.Tensor):
        slots = torch.tensor([int(s) for s in slots], dtype=torch.int32, device=lv.device)
    if not isinstance(counts, torch.Tensor):
        counts = torch.tensor([int(c) for c in counts], dtype=torch.int32, device=lv.device)
    B = check_slots(slots, lv.device, lv.num_slots)
    check_tensor("counts", counts, shape=(B,), dtype=torch.int32, device=lv.device)
    if B == 0:
        return
    check_block_k(block_k, lv.Dk)
    if block_v is None and block_k is None and num_warps is None:
        block_v, block_k, num_warps = FOLD_TUNED[lv.family]
    BV, num_warps = block_knobs(block_v, num_warps, 16, 4)
    BKC = chunk_k(lv.Dk, min(block_k, lv.Dk)) if block_k else chunk_k(lv.Dk)
    if lv.rc_mode == RC_NVFP4:  # the per-head global scale needs the whole head in one program
        BV, BKC, num_warps = max(16, next_pow2(lv.Dv)), 16, max(num_warps, 8)
    BR = max(16, next_pow2(lv.R))
    rc, rs, rgs = lv.rc_args()
    check(lv.H * nl <= 65535, f"a fold launch covers at most 65535 (layer, head) pairs, got {nl} x {lv.H}")
    grid = (triton.cdiv(lv.Dv, BV), lv.H * nl, B)
    if per_channel:
        from .kda import _kda_fold_kernel as kern
    else:
        kern = _fold_kernel
    kern[grid](slots, counts, lv.folded, lv.ckpt, rc, rs, rgs, lv.rec_d, lv.rec_k,
               lv.rec_g, lv.seed, lv.layer, lv.num_slots,
               H=lv.H, HK=lv.Hk, K=lv.Dk, V=lv.Dv, R=lv.R, BV=BV, BKC=BKC, BR=BR,
               RC=lv.rc_mode, CKPT_SR=lv.ckpt_sr, SHARED=lv.shared_quant,
               INTERPRET=INTERPRET, num_warps=num_warps)


# ----------------------------------------------------------------------------- draft trees
@triton.jit
def draft_structure(par_ptr, G, T: tl.constexpr, BT: tl.constexpr, HAS_PARENTS: tl.constexpr):
    """Ancestor-or-self mask ANC [BT, BT] (ANC[t, i] = 1 iff i is on the path root..t) and the
    cumulative log-decay LG [BT] (sum of g over that path) of a chain (HAS_PARENTS False) or a
    tree given by parents (par_ptr: this row's T parents, -1 = hangs off the committed state)."""
    rows = tl.arange(0, BT)
    ANC = tl.zeros([BT, BT], dtype=tl.float32)
    LG = tl.zeros([BT], dtype=tl.float32)
    for t in tl.static_range(T):
        if HAS_PARENTS:
            p = tl.load(par_ptr + t)
        else:
            p = t - 1
        prow = tl.where(p >= 0, row_select(ANC, p, rows), 0.0)
        plg = tl.where(p >= 0, tl.sum(tl.where(rows == p, LG, 0.0), axis=0), 0.0)
        gt = tl.sum(tl.where(rows == t, G, 0.0), axis=0)
        ANC = tl.where(rows[:, None] == t, prow[None, :] + (rows[None, :] == t).to(tl.float32), ANC)
        LG = tl.where(rows == t, plg + gt, LG)
    return ANC, LG


@triton.jit
def draft_inv_norms(q_ptr, k_ptr, qk_rows, mask_t, scale, K: tl.constexpr, BKC: tl.constexpr, BT: tl.constexpr,
                    EPS: tl.constexpr):
    """scale / ||q_t|| and 1 / ||k_t|| ([BT]) of the drafts' q and k rows at offsets qk_rows."""
    nq = tl.zeros([BT], dtype=tl.float32)
    nk = tl.zeros([BT], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        Qc = tl.load(q_ptr + qk_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
        Kc = tl.load(k_ptr + qk_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
        nq += tl.sum(Qc * Qc, axis=1)
        nk += tl.sum(Kc * Kc, axis=1)
    return scale / tl.sqrt(nq + EPS), 1.0 / tl.sqrt(nk + EPS)


@triton.jit
def delta_solve(M, RHS, beta, o_t, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr):
    """The drafts' delta-rule values D [BT, BV]: d_t = beta_t (RHS_t - sum_i M[t, i] d_i), by forward
    substitution in draft order (a topological order of chains and trees; M is zero off the path)."""
    Dd = tl.zeros([BT, BV], dtype=tl.float32)
    for t in tl.static_range(T):
        corr = tl.sum(row_select(M, t, o_t)[:, None] * Dd, axis=0)
        bt = tl.sum(tl.where(o_t == t, beta, 0.0), axis=0)
        dt = bt * (row_select(RHS, t, o_t) - corr)
        Dd = tl.where(o_t[:, None] == t, dt[None, :], Dd)
    return Dd


@triton.jit
def store_draft_d(recd_ptr, Dd, slot, cur, i_h, o_t, mask_t, o_v, mask_v, H: tl.constexpr, V: tl.constexpr,
                  R: tl.constexpr):
    """Write the drafts' d records at ring positions cur..; returns (positions, their mask)."""
    pos = cur + o_t
    mpos = mask_t & (pos < R)
    tl.store(recd_ptr + ((slot * R + pos[:, None]) * H + i_h) * V + o_v[None, :],
             Dd.to(recd_ptr.dtype.element_ty), mask=mpos[:, None] & mask_v[None, :])
    return pos, mpos


@triton.jit
def draft_chunk(q_ptr, k_ptr, qk_rows, o_kc, mask_t, rq, rk):
    """Columns o_kc of the drafts' normalised q and k ([BT, BKC] each)."""
    Qc = tl.load(q_ptr + qk_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
    Kc = tl.load(k_ptr + qk_rows[:, None] + o_kc[None, :], mask=mask_t[:, None], other=0.0).to(tl.float32)
    return Qc * rq[:, None], Kc * rk[:, None]


@triton.jit
def gram_update(KrQ, KrK, QK, KK, Kr, Qc, Kc):
    """Add one column chunk's share of K_r q_t, K_r k_t ([BR, BT]) and q_t.k_i, k_t.k_i ([BT, BT])."""
    KrQ += tl.sum(Kr[:, None, :] * Qc[None, :, :], axis=2)
    KrK += tl.sum(Kr[:, None, :] * Kc[None, :, :], axis=2)
    QK += tl.sum(Qc[:, None, :] * Kc[None, :, :], axis=2)
    KK += tl.sum(Kc[:, None, :] * Kc[None, :, :], axis=2)
    return KrQ, KrK, QK, KK


@triton.jit
def stacked_draft_pass(a_ptr, b_ptr, i_b, i_g, ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, mask_v,
                       reck_base, o_r, mask_r, G: tl.constexpr, K: tl.constexpr, T: tl.constexpr, BT: tl.constexpr,
                       BV: tl.constexpr, BKC: tl.constexpr, BR: tl.constexpr, RC: tl.constexpr, PREC: tl.constexpr,
                       NORMS: tl.constexpr):
    """The state pass of a tensor-core verify (GDN: q, k; Mamba-2: C, B): the drafts' rows of a (rows
    0..BT-1) and of b (rows BT..2BT-1), [T, G, K] per batch row i_b, taken for group i_g, stacked into one
    operand X (BT >= 8: >= 16 rows, a dot's least); per column chunk S0 X^T [2BT, BV], K_r X^T [BR, 2BT]
    and X X^T [2BT, 2BT] are one dot each. NORMS: also the rows' squared norms [2BT] (else zeros).
    Returns (S0X, KrX, XX, norms, the a rows' mask)."""
    o_x = tl.arange(0, 2 * BT)
    is_a = o_x < BT
    t_x = tl.where(is_a, o_x, o_x - BT)
    mask_x = t_x < T
    x_rows = ((i_b * T + t_x) * G + i_g) * K
    x_base = tl.where(is_a, a_ptr + x_rows, b_ptr + x_rows)
    nx = tl.zeros([2 * BT], dtype=tl.float32)
    S0X = tl.zeros([2 * BT, BV], dtype=tl.float32)
    KrX = tl.zeros([BR, 2 * BT], dtype=tl.float32)
    XX = tl.zeros([2 * BT, 2 * BT], dtype=tl.float32)
    for c in range(K // BKC):
        o_kc = c * BKC + tl.arange(0, BKC)
        Xc = tl.load(x_base[:, None] + o_kc[None, :], mask=mask_x[:, None], other=0.0).to(tl.float32)
        S0 = load_state_chunk(ckpt_ptr, rc_ptr, rs_ptr, rgs_ptr, head_rows, i_head, o_v, o_kc, mask_v, K, RC)
        Kr = tl.load(reck_base + o_r[:, None] * (G * K) + o_kc[None, :], mask=mask_r[:, None], other=0.0).to(tl.float32)
        if NORMS:
            nx += tl.sum(Xc * Xc, axis=1)
        S0X += tl.dot(Xc, tl.trans(S0), input_precision=PREC)
        KrX += tl.dot(Kr, tl.trans(Xc), input_precision=PREC)
        XX += tl.dot(Xc, tl.trans(Xc), input_precision=PREC)
    return S0X, KrX, XX, nx, is_a


@triton.jit
def stacked_halves(SX, XX, BT: tl.constexpr, BV: tl.constexpr):
    """Split stacked_draft_pass's products: SX [2BT, BV] into its a rows and its b rows [BT, BV]; X X^T
    into the blocks AB[t, i] = a_t . b_i and BB[t, i] = b_t . b_i [BT, BT]. Returns (SA, SB, AB, BB)."""
    SA, SB = tl.split(tl.permute(tl.reshape(SX, [2, BT, BV]), (1, 2, 0)))
    XXa, XXb = tl.split(tl.permute(tl.reshape(XX, [2, BT, 2 * BT]), (1, 2, 0)))
    _aa, AB = tl.split(tl.permute(tl.reshape(XXa, [BT, 2, BT]), (0, 2, 1)))
    _ba, BB = tl.split(tl.permute(tl.reshape(XXb, [BT, 2, BT]), (0, 2, 1)))
    return SA, SB, AB, BB
