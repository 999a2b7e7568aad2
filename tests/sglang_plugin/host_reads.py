"""A guard that records every device -> host read made by the project's own step code.

On a GPU such a read (``tensor.tolist()``, ``.item()``, ``int(t)``, ``if t:``, a boolean-mask index, ``nonzero``,
and ``t[idx] = 0``, whose scalar is copied to the device first)
makes the host wait for the device: the overlap scheduler stalls and the step cannot be captured in a CUDA
graph. On this CPU machine nothing waits, so the guard finds them by their call sites instead: it wraps the
torch entry points that read a tensor's values on the host and records each call whose caller is a file of
``sglang_replayssm`` (not the PyTorch reference, whose oracle loops read on the host by design, nor the CPU
harness). A line that reads on purpose (a finished copy in pinned memory) carries ``# noqa: host-read``.
On the H200 the same paths run under ``torch.cuda.set_sync_debug_mode("error")`` (bench/sync_free_check.py).
"""
from __future__ import annotations

import contextlib
import linecache
import pathlib
import sys

import torch

import sglang_replayssm

PKG = pathlib.Path(sglang_replayssm.__file__).resolve().parent
EXEMPT_DIRS = (PKG / "reference", PKG / "cpu_harness")
MARK = "noqa: host-read"

# Tensor methods that hand values to the host; functions of torch that do.
METHODS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero",
           "masked_select", "unique")
FUNCTIONS = ("nonzero", "equal", "masked_select", "unique", "allclose")


def _ours(frame) -> bool:
    path = pathlib.Path(frame.f_code.co_filename).resolve()
    if PKG not in path.parents or any(d in path.parents for d in EXEMPT_DIRS):
        return False
    return MARK not in linecache.getline(str(path), frame.f_lineno)


class HostReads:
    def __init__(self):
        self.sites: list[str] = []

    def _note(self, what: str) -> None:
        frame = sys._getframe(2)
        if _ours(frame):
            rel = pathlib.Path(frame.f_code.co_filename).resolve().relative_to(PKG.parent)
            self.sites.append(f"{rel}:{frame.f_lineno} {frame.f_code.co_name}: {what}")

    def _wrap(self, name, fn):
        def wrapper(*args, **kwargs):
            self._note(name)
            return fn(*args, **kwargs)
        return wrapper

    def _wrap_index(self, name, fn):
        def wrapper(t, idx, *rest):
            items = idx if isinstance(idx, tuple) else (idx,)
            tensors = [i for i in items if isinstance(i, torch.Tensor)]
            if any(i.dtype == torch.bool for i in tensors):
                self._note(f"{name} with a boolean mask")
            elif tensors and rest and isinstance(rest[0], (int, float, bool)):
                # t[idx] = 0: the scalar goes to the device as a tensor first, a synchronizing copy on CUDA
                # (seen on the H200 under set_sync_debug_mode); index_fill_ / a device tensor value do not
                self._note(f"{name} of a Python scalar through an index tensor")
            return fn(t, idx, *rest)
        return wrapper


@contextlib.contextmanager
def host_reads():
    """Record the host reads of our step code inside the block (``.sites``: 'file:line function: what')."""
    guard = HostReads()
    saved = []
    for name in METHODS:
        saved.append((torch.Tensor, name, getattr(torch.Tensor, name)))
        setattr(torch.Tensor, name, guard._wrap(f"Tensor.{name}", getattr(torch.Tensor, name)))
    for name in ("__getitem__", "__setitem__"):
        saved.append((torch.Tensor, name, getattr(torch.Tensor, name)))
        setattr(torch.Tensor, name, guard._wrap_index(f"Tensor.{name}", getattr(torch.Tensor, name)))
    for name in FUNCTIONS:
        saved.append((torch, name, getattr(torch, name)))
        setattr(torch, name, guard._wrap(f"torch.{name}", getattr(torch, name)))
    try:
        yield guard
    finally:
        for owner, name, fn in reversed(saved):
            setattr(owner, name, fn)
