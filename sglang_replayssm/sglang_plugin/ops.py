"""Where a family's ReplaySSM math comes from: ``sglang_replayssm.kernels.<family>`` (Triton) on CUDA,
``sglang_replayssm.reference.<family>`` (PyTorch) elsewhere. Both modules have the same signatures:

    decode(pool, layer, slots, <raw inputs>) -> out
    verify(pool, layer, slots, <raw inputs with a T axis>, parents=None) -> out

``SGLANG_REPLAYSSM_OPS=reference|kernels`` forces one of them (tests run the Triton kernels on CPU
under ``TRITON_INTERPRET=1`` that way).
"""

from __future__ import annotations

import importlib
import logging
import os

import torch

OPS_ENV = "SGLANG_REPLAYSSM_OPS"
logger = logging.getLogger(__name__)


def ops_kind(device) -> str:
    forced = os.environ.get(OPS_ENV, "").strip()
    if forced:
        if forced not in ("reference", "kernels"):
            raise ValueError(f"{OPS_ENV} must be 'reference' or 'kernels', got {forced!r}")
        return forced
    return "kernels" if torch.device(device).type == "cuda" else "reference"


_warned: set = set()


def _module(kind: str, family: str):
    try:
        return importlib.import_module(f"sglang_replayssm.{kind}.{family}")
    except ModuleNotFoundError:
        return None


def family_op(family: str, name: str, device):
    """``decode`` / ``verify`` / ``fold`` of ``family`` for tensors on ``device``. Where the Triton kernels
    do not (yet) provide a function, the PyTorch reference's is used, with a warning (correct, slow)."""
    kind = ops_kind(device)
    mod = _module(kind, family)
    fn = getattr(mod, name, None) if mod is not None else None
    if fn is None and kind == "kernels":
        if (family, name) not in _warned:
            _warned.add((family, name))
            logger.warning("sglang_replayssm.kernels.%s has no %s(): using the PyTorch reference (slow)", family, name)
        fn = getattr(_module("reference", family), name)
    return fn


def fold_fn(family: str, device):
    """The flush fold the pool uses in commit / force_flush (None: the pool's reference default)."""
    if ops_kind(device) != "kernels":
        return None
    mod = _module("kernels", family)
    return getattr(mod, "fold", None) if mod is not None else None
