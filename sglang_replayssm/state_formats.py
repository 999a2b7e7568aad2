"""The names of the state formats a ReplaySSM pool keeps, and the one check that ties a format to a model.

Standard library only: the command-line flags (``flags.py``), the pool's configuration (``pool/config.py``, which
maps the names to torch dtypes) and the kernels (``kernels/constants.py``: a read copy's code, the ``READ_COPY``
constexpr) all take their vocabulary from here.
"""

from __future__ import annotations

READ_COPIES = ("none", "fp8", "nvfp4")
READ_COPY_CODES = {name: code for code, name in enumerate(READ_COPIES)}   # the kernels' READ_COPY constexpr
AUTO = "auto"                                 # the read-copy flag's default: chosen per SSM family and device
FLAG_READ_COPIES = (AUTO,) + READ_COPIES
CKPT_PRECISIONS = ("fp32", "fp16-sr", "fp64")
FLAG_CKPT_PRECISIONS = ("fp32", "fp16-sr")   # fp64 is for the exactness tests: no flag value
NVFP4_BLOCK = 16                              # elements per NVFP4 block scale along the key dim


def read_copy_geometry_error(read_copy: str, head_k_dim: int) -> str | None:
    """Why a read copy cannot be kept for states of key dim ``head_k_dim`` (None: it can)."""
    if read_copy == "nvfp4" and head_k_dim % NVFP4_BLOCK:
        return f"nvfp4 needs the SSM key dim to be a multiple of {NVFP4_BLOCK}, the model has {head_k_dim}"
    return None
