"""Tuning plans: the blocks every launch uses by default, each measured on the H200, and the choice
of decode / verify method.

A wrapper takes one `tuning=KernelTuning(...)` record (every field None: these defaults). The tables
below are named records with a one-line reason each; the runs behind them are in docs/history/runs.md
(by date and time; the JSON files keep their commands).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

from .checks import block_knobs, cdiv, check, check_block_k, chunk_k
from .constants import RC_FP8, RC_NONE, RC_NVFP4


class KernelTuning(NamedTuple):
    """A launch's block knobs (None: the wrapper's default). block_v: value rows per program (a power
    of 2 >= 16); block_k: the state's column chunk per loop iteration (a power of 2 >= 16 dividing
    head_k_dim); num_warps; stages: software pipelining of the column loop (decode: None or >= 2,
    verify: None or 1..4); flush_block_k: the decode's flush rows' column chunk (head_k_dim: whole
    rows folded in registers); flush_warps: warps of the split decode's flush launch; dot_precision: the
    tensor-core verify's state products ("tf32x3", "ieee" FMA dots, ...; None: constants.DOT_PREC)."""
    block_v: int | None = None
    block_k: int | None = None
    num_warps: int | None = None
    stages: int | None = None
    flush_block_k: int | None = None
    flush_warps: int | None = None
    dot_precision: str | None = None


DEFAULT_TUNING = KernelTuning()


def check_tuning(tuning) -> KernelTuning:
    """A wrapper's `tuning` argument: None (the defaults) or a KernelTuning."""
    if tuning is None:
        return DEFAULT_TUNING
    check(isinstance(tuning, KernelTuning), f"tuning must be None or a KernelTuning, got {type(tuning).__name__}")
    return tuning


class SplitDecodeBlocks(NamedTuple):
    """A split decode's default blocks; Mamba-2's flush rows fold whole rows (flush_block_k = head_k_dim)."""
    block_v: int
    block_k: int
    num_warps: int
    stages: int | None
    flush_warps: int
    reason: str


# Where the split decode measured faster than the fused one on the H200 at batch 256, per (family, read copy).
SPLIT_TUNED = {
    ("gdn", RC_FP8): SplitDecodeBlocks(32, 128, 1, None, 2, "whole 128-column read rows, no chunk loop: 0.139 -> "
                                                            "0.127 ms (2026-11-30 15:58)"),
    ("mamba2", RC_NONE): SplitDecodeBlocks(16, 32, 1, None, 1, "Nano 0.345 -> 0.327 ms against the fused decode; "
                                                               "Super 0.345 -> 0.343 (2026-11-30 14:27, 15:58)"),
    ("mamba2", RC_FP8): SplitDecodeBlocks(32, 32, 1, None, 2, "Super 0.240 -> 0.220 ms, Nano 0.306 -> 0.231 "
                                                              "(2026-11-30 10:55, 14:27)"),
    ("kda", RC_NONE): SplitDecodeBlocks(32, 64, 1, 2, 2, "small programs as the other families: 0.277 -> 0.251 ms "
                                                         "(2026-11-30 15:58)"),
    ("kda", RC_FP8): SplitDecodeBlocks(32, 64, 1, 2, 2, "as fp32: 0.237 -> 0.197 ms (2026-11-30 15:58)"),
}


# A fused decode over a grid of fewer than SMALL_GRID (row, head) pairs gets small_grid_blocks: whole state rows in
# one chunk (block_k = head_k_dim) for KDA and the fp8 read copy with 2 warps a program, 32-column chunks with 1
# warp for the others; 4 warps on the smallest grids (batch 1): below TINY_GRID pairs with whole rows, up to and
# including it with chunks (at exactly 128 pairs, GDN 16/32 at batch 4 and Mamba-2 Super at batch 1, chunks
# measured fastest with 4 warps and whole rows with 2). H200, 2026-12-02, ms per step
# (bench/results/kernels_s12_small_sweep.json; the library's earlier default, 32-column chunks x 4 warps -> now):
#   B 1   KDA fp32 0.00873 -> 0.00534, fp8 0.00948 -> 0.00553; GDN 16/32 fp8 0.00474 -> 0.00408, 16/64 fp8
#         0.00529 -> 0.00470; Mamba-2 Super fp8 0.00473 -> 0.00449, Nano fp8 0.00537 -> 0.00482 (fp32 GDN / Mamba-2
#         unchanged: whole rows mixed there, GDN 16/32 0.00397 -> 0.00380, Nano 0.00478 -> 0.00493)
#   B 4   KDA 0.01220 -> 0.00858 / 0.01511 -> 0.00824; GDN 16/32 fp8 0.00988 -> 0.00598; 16/64 0.01060 -> 0.00821 /
#         0.01389 -> 0.00951; Super 0.00937 -> 0.00865 / 0.01066 -> 0.00967; Nano 0.00952 -> 0.00896 /
#         0.01211 -> 0.01103
#   B 16  GDN 16/32 0.02072 -> 0.01633 / 0.02605 -> 0.01842; KDA 0.05157 -> 0.03090 / 0.05177 -> 0.02775
# Whole-row flush chunks as well (flush_block_k) measured slower for Nano's fp8 read copy at B 1 (0.0063 ms); NVFP4
# keeps its own blocks (not timed).
SMALL_GRID = 1024
TINY_GRID = 128


def small_grid_blocks(family: str, rc_mode: int, pairs: int, Dk: int) -> KernelTuning:
    """The blocks of a fused decode over `pairs` (batch * heads) < SMALL_GRID (see above)."""
    if family == "kda" or rc_mode == RC_FP8:
        return KernelTuning(block_k=Dk, num_warps=4 if pairs < TINY_GRID else 2)
    return KernelTuning(num_warps=default_warps(pairs, 1))


@functools.lru_cache(maxsize=4096)   # pure in its arguments; called once per SSM layer per step
def decode_plan(family: str, rc_mode: int, batch: int, heads: int, Dk: int, method,
                tuning: KernelTuning = DEFAULT_TUNING) -> tuple[str, KernelTuning]:
    """The decode method and blocks a wrapper uses. method None picks "split" where SPLIT_TUNED has an
    entry and the grid fills the GPU (batch * heads >= 1024), else "fused". A split decode with no
    field of `tuning` set gets the tuned blocks (block_k capped at head_k_dim; Mamba-2: whole-row flush; GDN and
    KDA keep their exact fold's 32-column chunks, whole rows of their tensor-core dots spill); a fused decode over a
    grid under SMALL_GRID with no field set gets small_grid_blocks (NVFP4: its own)."""
    tuned = SPLIT_TUNED.get((family, rc_mode))
    if method is None:
        method = "split" if tuned is not None and batch * heads >= SMALL_GRID else "fused"
    check(method in ("fused", "split"), f"method must be None, 'fused' or 'split', got {method!r}")
    if method == "split" and tuned is not None and tuning == DEFAULT_TUNING:
        tuning = KernelTuning(block_v=tuned.block_v, block_k=chunk_k(Dk, min(tuned.block_k, Dk)),
                              num_warps=tuned.num_warps, stages=tuned.stages,
                              flush_block_k=Dk if family == "mamba2" else None, flush_warps=tuned.flush_warps)
    elif method == "fused" and batch * heads < SMALL_GRID and rc_mode != RC_NVFP4 and tuning == DEFAULT_TUNING:
        tuning = small_grid_blocks(family, rc_mode, batch * heads, Dk)
    check_block_k(tuning.block_k, Dk)
    return method, tuning


class VerifyBlocks(NamedTuple):
    """A verify method's default (block_v, num_warps)."""
    block_v: int
    num_warps: int
    reason: str


# Verify blocks per (family, method), from the H200 sweeps at batch 256 (2026-11-30 10:55): the tensor-core
# verify is fastest as one warp per 64-128 value rows.
VERIFY_TUNED = {
    ("gdn", "fma"): VerifyBlocks(32, 2, "exact fp32 broadcast products; 4 warps slower"),
    ("gdn", "mma"): VerifyBlocks(64, 1, "T = 8: 32 x 2 warps 0.653 ms, 32 x 1 0.356, 64 x 1 0.294"),
    ("gdn", "split"): VerifyBlocks(32, 2, "as fma; the draft products come from the gram launch"),
    ("mamba2", "fma"): VerifyBlocks(64, 4, "T = 8: 1.449 ms (mma 0.454)"),
    ("mamba2", "mma"): VerifyBlocks(64, 1, "T = 8: 32 x 2 warps 0.981 ms, 64 x 1 0.454"),
    ("kda", "fma"): VerifyBlocks(32, 2, "T = 8: 4 warps 5.19 ms, 2 warps 3.55"),
    ("kda", "mma"): VerifyBlocks(128, 1, "T = 8: 0.629 ms against fma's 3.55"),
}


# Programs an SM holds at once (Hopper's resident-block limit): a grid of one-warp programs up to SMs x this
# runs in one wave.
RESIDENT_PROGRAMS_PER_SM = 32


class OneWaveBlockK(NamedTuple):
    """A verify method's column chunk when its grid runs in one wave (block_k given: that one)."""
    block_k: int
    reason: str


# GDN's tensor-core verify over a grid that fits one wave: each program's state pass is then its whole
# latency, and 32-column chunks halve its dependent loads; a larger grid keeps VERIFY_TUNED's 16 columns
# (more programs resident per SM). H200, 2026-12-02 13:24 (bench/results/verify_block_k_s11.json): 16/32 heads
# at B 64 (4096 programs) T 2 / 4 / 8: 0.0671 -> 0.0612, 0.0719 -> 0.0677, 0.0831 -> 0.0793 ms; 16/64 at B 64
# (8192 programs) and every geometry at B 256 / 512: 16 columns as fast or up to 13 % faster (one exception,
# 16/64 at B 512 T 8: 4 % slower).
ONE_WAVE_BLOCK_K = {("gdn", "mma"): OneWaveBlockK(32, "one wave: half the state pass's dependent loads")}


@functools.lru_cache(maxsize=4096)   # pure in its arguments; called once per SSM layer per step
def verify_block_k(family: str, method: str, programs: int, Dk: int, sms: int,
                   tuning: KernelTuning = DEFAULT_TUNING) -> int:
    """A verify launch's column chunk: tuning.block_k if given, else ONE_WAVE_BLOCK_K's where the launch's
    `programs` fit one wave of `sms` SMs (num_warps <= 1), else 16 (a power of 2 dividing head_k_dim)."""
    given = check_block_k(tuning.block_k, Dk)
    if given:
        return given
    wave = ONE_WAVE_BLOCK_K.get((family, method))
    if wave is not None and (tuning.num_warps or 1) == 1 and programs <= sms * RESIDENT_PROGRAMS_PER_SM:
        return chunk_k(Dk, min(wave.block_k, Dk))
    return chunk_k(Dk, 16)


def verify_methods(family: str) -> list[str]:
    """The verify methods a family's wrapper has (VERIFY_TUNED's keys): fma, mma, and split for GDN."""
    return [m for f, m in VERIFY_TUNED if f == family]


@functools.lru_cache(maxsize=4096)   # pure in its arguments; called once per SSM layer per step
def verify_plan(family: str, method, tuning: KernelTuning = DEFAULT_TUNING) -> tuple[str, int, int]:
    """A verify launch's (method, block_v, num_warps): method None is "mma" (the fastest on the H200 at every
    T = 1..8), else one of verify_methods(family); the given blocks, else VERIFY_TUNED's."""
    have = verify_methods(family)
    method = "mma" if method is None else method
    check(method in have, f"method must be None, {', '.join(map(repr, have[:-1]))} or {have[-1]!r}, got {method!r}")
    tuned = VERIFY_TUNED[(family, method)]
    return (method, *block_knobs(tuning.block_v, tuning.num_warps, tuned.block_v, tuned.num_warps))


def default_warps(batch: int, heads: int) -> int:
    """Warps per decode program where the tuning names none. Measured on the H200 (docs/history/runs.md, Kernels,
    first and twelfth runs): one warp per (row, head, 32 value rows) program, reducing each 32-column chunk with
    shuffles, moves the most bytes per second above TINY_GRID (row, head) pairs; 4 warps win up to it (batch 1)."""
    return 1 if batch * heads > TINY_GRID else 4


class FoldBlocks(NamedTuple):
    """The commit fold's default (block_v, block_k, num_warps)."""
    block_v: int
    block_k: int
    num_warps: int
    reason: str


# The commit fold per family, timed on the H200 at batch 256 with half the rows folding (2026-11-30 10:55).
FOLD_TUNED = {
    "gdn": FoldBlocks(32, 32, 2, "0.263 -> 0.207 ms against 16 x 32 x 4; whole 128-column rows 0.24-0.32"),
    "mamba2": FoldBlocks(32, 32, 2, "Super 0.516 -> 0.398 ms against 16 x 32 x 4"),
    "kda": FoldBlocks(32, 32, 2, "0.589 -> 0.372 ms against 16 x 32 x 4"),
}


# The flush-launch row programs that work per (value block, head) in steady state (B / window rows flush
# every step, staggered cursors), by family; each folds ceil(count / that) of the listed rows, one after the
# other (flush_rows_min), so the flush holds fewer of each SM's registers and the read launch beside it gets
# more. More flush rows than usual (a burst) put more row programs to work, up to all of them, so a burst is
# folded as parallel as when every row program works. H200, B = 256 (2026-11-30 17:25): Mamba-2 Super fp32 0.3441
# -> 0.3298 ms, Nano fp32 0.3268 -> 0.3153. A family not listed: every row program works (KDA: its heavier fold
# measured 7 % slower with 2; GDN since its fold replays the window exactly, kernels/delta_fold.py: 2 programs
# folding 8 rows each one after the other made its split decode 1.7x slower on an H100 at B = 256).
FLUSH_PROGRAMS = {"mamba2": 1}


def flush_rows_min(family: str, B: int, window: int) -> int:
    """The least listed rows one working flush row program folds (the kernels' min_rows_per_program) for a
    split decode of B rows, so that the steady-state count (ceil(B / window)) keeps FLUSH_PROGRAMS[family]
    of them busy."""
    a = FLUSH_PROGRAMS.get(family)
    return 1 if a is None else max(1, cdiv(cdiv(B, window), a))


def fold_gram_columns(BR: int) -> int:
    """Key columns per step of KDA's exact fold's per-channel Gram sums (kda/token.kda_exact_d's MKC): a [BR, BR,
    MKC] tile of 4096 elements, BR the window's records rounded up (not measured: the size keeps the tile in
    registers at 1-4 warps)."""
    return max(1, min(16, 4096 // (BR * BR)))


# Warps of the split decode's prep launch (one small program per row and k-head / group / head): one warp
# measured faster than 4 (KDA 0.252 -> 0.223 ms fp32, 0.196 -> 0.168 fp8; GDN fp8 0.126 -> 0.124; Mamba-2
# unchanged; 2026-11-30 15:58).
PREP_WARPS = 1
