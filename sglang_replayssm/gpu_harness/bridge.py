"""The GPU bridge: what stock SGLang 0.5.23 lacks to run on a CUDA machine without its kernel wheel.

Made for the H200 lent to this project (torch 2.11 / Triton 3.6, no internet, no ``sglang-kernel``:
its 373 MB CUDA wheel is built for torch 2.14 and is more than a device call may carry). ``install()``
is idempotent and does, in this process, before SGLang is imported:

1. ``sgl_kernel`` stand-in (the CPU harness's, ``cpu_harness.bridge``): the wheel's pure-Python
   wrappers stay importable, every compiled name answers a function that raises a clear error.
2. ``gpu_ops.register()``: the compiled ``torch.ops.sgl_kernel.*`` ops our paths reach (norms, gated
   activations, rotary embedding, MoE top-k softmax, block align and sum-reduce, ``weak_ref_tensor``) in PyTorch.
3. SGLang's kernel registry (``sglang.kernels.selector``): an op that has an AOT (``sgl_kernel:NAME``)
   backend whose op ``gpu_ops`` provides resolves to it, instead of a JIT backend that would compile CUDA
   with tvm-ffi at first call; every resolution is logged once (``replayssm gpu-harness: kernel ...``).
4. ``sglang.srt.layers.attention.mamba.causal_conv1d``: the compiled causal conv is off, so the Mamba-2
   and GDN convolutions take SGLang's own Triton kernels (its ROCm/XPU path).

Nothing here imports SGLang at import time; the SGLang patches run right after their module executes
(the CPU bridge's after-import finder).
"""

from __future__ import annotations

import functools
import sys

from sglang_replayssm.cpu_harness import bridge as cpu_bridge

_installed = False


def _aot_name(spec) -> str | None:
    target = getattr(spec, "target", "") or ""
    if isinstance(target, str) and target.startswith("sgl_kernel:"):
        return target.split(":", 1)[1]
    return None


def _patch_kernel_selector(mod) -> None:
    from . import gpu_ops

    original = mod._resolve
    if getattr(original, "_gpu_harness", False):
        return
    registry = mod.registry
    provided = set(gpu_ops.OPS)

    def pick(op: str, backend):
        if backend is None:
            for spec in registry.get(op) or ():
                if _aot_name(spec) in provided:
                    return spec
        return None

    def _resolve(op, backend=None):
        spec = pick(op, backend)
        if spec is not None:
            print(f"replayssm gpu-harness: kernel {op} -> {spec.target} (PyTorch op)", file=sys.stderr, flush=True)
            return spec.load()
        try:
            fn = original(op, backend)
        except Exception as e:
            print(f"replayssm gpu-harness: kernel {op} (backend {backend}) unresolved: {e}", file=sys.stderr, flush=True)
            raise
        print(f"replayssm gpu-harness: kernel {op} -> {getattr(fn, '__module__', '?')}.{getattr(fn, '__name__', '?')}",
              file=sys.stderr, flush=True)
        return fn

    _resolve = functools.lru_cache(maxsize=None)(_resolve)   # as SGLang caches its own resolution
    _resolve._gpu_harness = True
    mod._resolve = _resolve


def _triton_causal_conv(mod) -> None:
    mod._HAS_CONV1D_KERNEL = False


_AFTER_IMPORT = {
    "sglang.kernels.selector": _patch_kernel_selector,
    "sglang.srt.layers.attention.mamba.causal_conv1d": _triton_causal_conv,
}


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    cpu_bridge.install_sgl_kernel_stand_in()
    from . import gpu_ops

    gpu_ops.register()
    cpu_bridge.install_after_import_patches(_AFTER_IMPORT)
