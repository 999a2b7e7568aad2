"""Triton kernels for ReplaySSM: one module per family (mamba2, gdn/, kda/) and shared pieces of one job each.

On a machine without CUDA the kernels run under Triton's interpreter: ``TRITON_INTERPRET=1`` is
set here, before this package imports triton, unless the caller set it already. (Triton decides
interpreter vs compiler per ``@triton.jit`` at decoration time and its own ``tl.*`` helpers at
its import, so the variable must be set before triton is first imported in the process.)
"""
import os as _os
import sys as _sys

if "triton" not in _sys.modules:
    import torch as _torch

    if not _torch.cuda.is_available():
        _os.environ.setdefault("TRITON_INTERPRET", "1")
