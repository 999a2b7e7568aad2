"""The split decode's launch plumbing: the flush-row list built on the device, which listed rows each
flush row program folds, and the side stream the flush launch runs on beside the prep + read launches."""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .checks import cdiv, check, check_tensor, flush_launch_warps, next_pow2
from .constants import INTERPRET
from .tuning import flush_rows_min

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
    [1] int32, the flush launch's row programs). The row programs (the kernels' FLUSH_ROW_PROGRAMS) are
    twice the rows that flush per step in steady state (B / window), so a step with more flush rows than
    usual can still fold them in one wave; flush_rows decides how many of them work and which rows each
    folds, so any count is handled (all B rows at once: B / FLUSH_ROW_PROGRAMS rounds)."""
    B = int(slots.shape[0])
    rows = torch.empty(B, dtype=torch.int32, device=slots.device)
    count = torch.empty(1, dtype=torch.int32, device=slots.device)
    _flush_list_kernel[(1,)](slots, cursor, rows, count, B, WINDOW=window, BLOCK=next_pow2(B),
                             num_warps=4 if B <= 1024 else 8)
    return rows, count, flush_row_programs(B, window)


def flush_row_programs(B: int, window: int) -> int:
    """FLUSH_ROW_PROGRAMS of flush_list for B rows."""
    return min(B, max(1, 2 * cdiv(B, window)))


@triton.jit
def flush_rows(nflush_ptr, min_rows, FLUSH_ROW_PROGRAMS: tl.constexpr):
    """(first, end, step) of the listed flush rows that this row program (program_id(2)) folds:
    every step-th from the first, step = the number of working row programs, clamp(ceil(count / min_rows),
    1, FLUSH_ROW_PROGRAMS); a program at or past step folds none."""
    n = tl.load(nflush_ptr)
    step = tl.minimum(tl.maximum((n + min_rows - 1) // min_rows, 1), FLUSH_ROW_PROGRAMS)
    p = tl.program_id(2)
    return p, tl.where(p < step, n, 0), step


def check_flush_list(given, B: int, device):
    """A decode wrapper's flush_list argument: (rows [B] int32, count [1] int32) on the pool's device,
    as flush_list returns them for this step's slots and cursors (one list serves every layer of a step:
    cursors move only between steps)."""
    check(isinstance(given, (tuple, list)) and len(given) == 2,
          f"flush_list must be (rows, count) from split_decode.flush_list, got {type(given).__name__}")
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


class DecodeRows(NamedTuple):
    """The row axis of a decode wrapper's main launch (decode_launch_rows)."""
    frows: torch.Tensor            # the flush rows' batch indices (fused: the slots, unread)
    nflush: torch.Tensor           # how many of them (fused: the slots, unread)
    flush_row_programs: int        # the kernel's FLUSH_ROW_PROGRAMS
    min_rows: int                  # tuning.flush_rows_min
    grid_rows: int                 # the launch grid's row axis
    warps: int                     # the launch's num_warps
    stream: object                 # the side stream it runs on (split), or None
    flush_only: bool               # the kernel's FLUSH_ONLY: this launch folds the flush rows only (split)

    def state_args(self, lv, slots) -> dict:
        """The keyword arguments every family's decode kernel takes alike for this launch: the rows, their cursors
        and fold counts, the split decode's flush list; the layer's state (checkpoint, read copy and its scales,
        the records; a delta family's raw inputs, None without a read copy) and the constexprs that describe it."""
        rc, rs, rgs = lv.rc_args()
        args = dict(slots_ptr=slots, cursor_ptr=lv.cursor, folded_ptr=lv.folded, frows_ptr=self.frows,
                    nflush_ptr=self.nflush, ckpt_ptr=lv.ckpt, rc_ptr=rc, rs_ptr=rs, rgs_ptr=rgs, recd_ptr=lv.rec_d,
                    reck_ptr=lv.rec_k, recg_ptr=lv.rec_g, seed=lv.seed, layer=lv.layer, min_rows=self.min_rows,
                    R=lv.R, WINDOW=lv.window, READ_COPY=lv.rc_mode, CKPT_SR=lv.ckpt_sr, SHARED_QUANT=lv.shared_quant,
                    INTERPRET=INTERPRET, FLUSH_ROW_PROGRAMS=self.flush_row_programs, FLUSH_ONLY=self.flush_only)
        if lv.family != "mamba2":
            args.update(recv_ptr=lv.rec_v, recb_ptr=lv.rec_beta)
        return args


def decode_launch_rows(family: str, method: str, slots, lv, num_warps: int, flush_warps, given=None) -> DecodeRows:
    """The row axis of a decode wrapper's main launch: every batch row for "fused"; for "split" only
    the flush rows (flush_list, or `given`: its (rows, count) computed earlier in the same step, or a
    function returning them, called only here), with the flush launch's warps (flush_launch_warps), the
    side stream it runs on beside the prep + read launches, and min_rows (tuning.flush_rows_min)."""
    B = int(slots.shape[0])
    if method != "split":
        return DecodeRows(slots, slots, 1, 1, B, num_warps, None, False)
    if given is None:
        frows, nflush, nfp = flush_list(slots, lv.cursor, lv.window)
    else:
        frows, nflush = check_flush_list(given() if callable(given) else given, B, lv.device)
        nfp = flush_row_programs(B, lv.window)
    return DecodeRows(frows, nflush, nfp, flush_rows_min(family, B, lv.window), nfp,
                      flush_launch_warps(flush_warps, num_warps), side_stream(lv.device), True)
