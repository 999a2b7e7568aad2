"""Constants every kernel file shares: the interpreter flag, the dot precisions and the read-copy modes.

The interpreter switch itself (CPU machines) lives in the package ``__init__``.
"""
from __future__ import annotations

import os

import triton.language as tl

from ..state_formats import READ_COPY_CODES

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# fp32 products of state-sized tiles on the GPU: 3xTF32 tensor-core dots (fp32-level accuracy,
# few registers); the interpreter computes every dot in fp32 anyway.
FOLD_PREC = tl.constexpr("ieee" if INTERPRET else "tf32x3")


# the verify launches' state products: 3xTF32 tensor-core dots on the GPU (fp32-accurate), exact fp32 in the
# interpreter; read when a verify launches (bench/verify_parts.py times "ieee", FMA dots, on the GPU)
DOT_PREC = "ieee" if INTERPRET else "tf32x3"


# a read copy's code in the kernels (their READ_COPY constexpr), from its one name (state_formats.READ_COPIES)
RC_NONE, RC_FP8, RC_NVFP4 = (READ_COPY_CODES[name] for name in ("none", "fp8", "nvfp4"))
