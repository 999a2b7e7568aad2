"""Argument checks of the kernel wrappers (tensors, slots, block knobs) and their small size helpers."""
from __future__ import annotations

import math

import torch

def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_tensor(name: str, t, shape=None, dtype=None, device=None, contiguous: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if shape is not None and t.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if dtype is not None:
        dts = dtype if isinstance(dtype, (tuple, list)) else (dtype,)
        if t.dtype not in dts:
            raise ValueError(f"{name} must have dtype {' or '.join(map(str, dts))}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _token_stride(t: torch.Tensor, lead: int):
    """The element stride between t's token rows when its dims after the first `lead` are contiguous and its
    lead dims step through the rows one stride apart (0: a single row, any stride reads it), else None."""
    inner = 1
    for size, stride in reversed(list(zip(t.shape[lead:], t.stride()[lead:]))):
        if size != 1 and stride != inner:
            return None
        inner *= size
    row, step = 0, None
    for size, stride in reversed(list(zip(t.shape[:lead], t.stride()[:lead]))):
        if size == 1:
            continue
        if step is None:
            row = stride
        elif stride != step:
            return None
        step = stride * size
    return None if 0 < row < inner else row


def _row_plan(given: list, lead: int) -> tuple[int, bool]:
    """token_rows' decision for tensors of these shapes and strides: (the row stride, whether to copy)."""
    strides = [_token_stride(t, lead) for t in given]
    found = {s for s in strides if s}
    if None not in strides and len(found) <= 1:
        if found:
            return found.pop(), False
        # single rows only: any stride reads them; the tensors' own when they agree
        own = {t.stride(lead - 1) for t in given if t.stride(lead - 1) >= math.prod(t.shape[lead:])}
        if len(own) == 1:
            return own.pop(), False
    return (math.prod(given[0].shape[lead:]) if given else 0), True


_ROW_PLANS: dict = {}   # (lead, shapes and strides) -> _row_plan's answer: a step's layers repeat the same layouts


def token_rows(*ts, lead: int):
    """Inputs a kernel reads one token row at a time (GDN q/k, v; Mamba-2 x, B/C, z, dt): SGLang hands them out
    as views of one projection ([*tokens, heads, dim], the rows a fixed stride apart), and a copy into a
    contiguous tensor would cost a launch per input per layer. Returns (tensors, row): the tensors as given when
    each one's trailing dims are contiguous and its `lead` token dims ([B] or [B, T]) step through its rows by
    one stride shared by all of them, else contiguous copies of all of them; row: that stride in elements (the
    kernel's constexpr for this group). None entries pass through. The decision depends on the shapes and
    strides alone and is remembered for them (this runs once per input group per SSM layer per step)."""
    given = [t for t in ts if t is not None]
    key = (lead, *((t.shape, t.stride()) for t in given))
    plan = _ROW_PLANS.get(key)
    if plan is None:
        if len(_ROW_PLANS) >= 4096:
            _ROW_PLANS.clear()
        plan = _ROW_PLANS[key] = _row_plan(given, lead)
    row, copy = plan
    if copy:
        ts = tuple(None if t is None else t.contiguous() for t in ts)
    return ts, row


def token_inputs(q, k, v, lead: int):
    """q, k (one row stride) and v as the kernels read them (checks.token_rows): ((q, k, v), QK_ROW, V_ROW)."""
    (q, k), qk_row = token_rows(q, k, lead=lead)
    (v,), v_row = token_rows(v, lead=lead)
    return q, k, v, qk_row, v_row


def check_rows(name: str, t, shape=None, dtype=None, device=None) -> None:
    """check_tensor for an input read by token rows (token_rows): any row stride, the rest as check_tensor."""
    check_tensor(name, t, shape=shape, dtype=dtype, device=device, contiguous=False)


def output_tensor(out, shape, like: torch.Tensor, device) -> torch.Tensor:
    """The caller's `out` (checked: shape and device), or a new tensor of `like`'s dtype."""
    if out is None:
        out = torch.empty(shape, dtype=like.dtype, device=like.device)
    check_tensor("out", out, shape=shape, device=device)
    return out


def check_slots(slots, device, num_slots):
    check_tensor("slots", slots, dtype=torch.int32, device=device)
    check(slots.dim() == 1, f"slots must be 1-D [B], got shape {tuple(slots.shape)}")
    return int(slots.shape[0])


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of positive ints; plain Python (Triton's is a constexpr function, ~2 µs a call)."""
    return -(-int(a) // int(b))


def next_pow2(n: int) -> int:
    """The least power of 2 >= n (1 for n <= 1); plain Python (Triton's is a constexpr function, ~4 µs a call)."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def chunk_k(Dk: int, want: int = 32) -> int:
    """Column chunk of the state walked per loop iteration (a power of 2 >= 16 dividing Dk)."""
    for c in (want, 32, 16):
        if c <= Dk and Dk % c == 0:
            return c
    raise ValueError(f"head_k_dim {Dk} must be a multiple of 16")


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


def check_flush_block_k(flush_block_k, Dk: int) -> int:
    """The decode wrappers' `flush_block_k` (check_block_k; 0 to the kernel: use block_k)."""
    return check_block_k(flush_block_k, Dk, "flush_block_k")


def launch_stages(stages) -> dict:
    """The verify wrappers' `stages`: None (Triton's default software pipelining of the column loop) or
    the launch's num_stages, 1 (none) to 4; returned as launch keyword arguments."""
    check(stages is None or (isinstance(stages, int) and 1 <= stages <= 4),
          f"stages must be None or an int in 1..4, got {stages!r}")
    return {} if stages is None else {"num_stages": stages}


def flush_launch_warps(flush_warps, num_warps: int) -> int:
    """Warps of the split decode's flush launch (the decode wrappers' `flush_warps`): None -> at least
    4 (the fold's tensor-core dot and whole-row chunks want several warps), or a power of 2 in 1..16."""
    check(flush_warps is None or (isinstance(flush_warps, int) and flush_warps in (1, 2, 4, 8, 16)),
          f"flush_warps must be None or a power of 2 in 1..16, got {flush_warps!r}")
    return flush_warps or max(num_warps, 4)


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
