"""The CPU bridge: what stock SGLang 0.5.23 from PyPI lacks to run its CPU engine on a machine with no GPU.

``install()`` is idempotent and does, in this process:

1. ``sgl_kernel`` stand-in: PyPI's ``sglang-kernel`` is a CUDA build whose shared objects link
   ``libcuda.so.1``, so ``import sgl_kernel`` fails without a driver. The stand-in module keeps the
   wheel's pure-Python submodules importable (its ``__path__`` is the wheel's folder) and answers every
   other name with a function that raises a clear error when called (no compiler, nothing written).
2. ``torch.get_device_module()`` answers ``torch.cpu`` (PyPI's torch is a CUDA build, so it would
   answer ``torch.cuda``), ``torch.cpu.device`` exists (a no-op context, as ``torch.cuda.device``), and
   ``Tensor.pin_memory()`` returns the tensor and ``torch.cuda.synchronize()`` returns at once (both need a CUDA
   driver).
3. PyTorch versions of the ``torch.ops.sgl_kernel.*_cpu`` ops SGLang's CPU engine calls, which only
   SGLang's unpublished CPU kernel build has (``cpu_ops.py``: convolution, gated delta rule, gated norm;
   ``spec_ops.py``: the speculative-decoding bookkeeping ops).
4. Triton's autotuner takes its first config under the interpreter (``TRITON_INTERPRET=1``, which the
   harness sets: SGLang launches a few Triton kernels on CPU tensors).
5. Some SGLang modules are completed right after they are imported (``_AFTER_IMPORT``):
   ``layers/attention/mamba/mamba.py`` binds its causal-conv functions only on CUDA/NPU/XPU, so on CPU
   they are bound to SGLang's own Triton versions (as its XPU branch does); the GDN and KDA backends' CPU conv
   update has no per-draft conv window, so a target-verify call (``intermediate_conv_window=``) goes to
   SGLang's Triton conv update instead; GDN decode takes the packed Triton kernels it takes on a GPU
   (which is where SGLang's own ``--enable-linear-replayssm`` decode lives), and its prefill returns the
   per-chunk states ``h`` (as FLA's kernel does; the CPU op's wrapper returns None); the NGRAM worker builds
   the full tree mask the Triton attention backend reads, and so does the EAGLE / NEXTN verify;
   ``--mamba-radix-cache-strategy extra_buffer`` is allowed on the CPU platform (its track snapshots are SGLang's
   Triton kernels and that ``h``); KDA's prefill and decode/verify kernels, unbound on CPU, are ``kda_ops.py``'s;
   the CPU MoE experts (``moe_forward_native``) apply the layer's ``routed_scaling_factor`` as SGLang's GPU runner
   does (its CPU path drops it: Kimi Linear's MoE output would be 2.446x too small); with
   ``SGLANG_REPLAYSSM_CPU_OVERLAP=1`` speculative decoding keeps the overlap scheduler (SGLang turns it off on
   the CPU platform).
6. Test instrumentation: with ``SGLANG_REPLAYSSM_CPU_LOG_TREES=1`` every verify the plugin's pool opens with a draft
   tree prints a ``cpu-harness: tree verify`` line.
7. What is expected on this harness is not logged (``quiet_expected_noise``): SGLang imports every model module at
   start and logs ``Ignore import error when loading sglang.srt.models.<m>: '_OpNamespace' 'sgl_kernel' object has
   no attribute '<op>_cpu'`` for each module that binds an op of SGLang's CPU kernel build at import (11 in 0.5.23:
   grok, qwen3_5, minicpmv, ...; the stand-in has only the ops the harness's models run); such a model is then
   not served here (`Model architectures [...] are not supported`). Import errors of any other kind are still
   logged. Also dropped: SGLang's and Triton's warnings that AWQ / GGUF quantization and Triton kernels (which run
   under the interpreter) need a GPU, and Triton's deprecation of ``tl.make_block_ptr`` (SGLang's FLA kernels use
   it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import re
import sys
import types
import warnings

_installed = False

# sgl_kernel's pure-Python submodules whose functions SGLang imports by name from the package root
_SGL_SUBMODULES = ("mamba", "elementwise", "sampling", "kvcacheio", "memory", "moe", "gemm", "attention",
                   "speculative", "top_k", "allreduce")


class CPUHarnessMissingKernel(NotImplementedError):
    pass


def _missing(name: str):
    def fn(*args, **kwargs):
        raise CPUHarnessMissingKernel(
            f"sgl_kernel.{name} has no CPU implementation in the sglang-replayssm CPU harness "
            "(a CUDA kernel of sglang-kernel; this code path needs a GPU)")
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


def install_sgl_kernel_stand_in() -> None:
    if "sgl_kernel" in sys.modules:
        return
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is None or not spec.submodule_search_locations:
        return
    mod = types.ModuleType("sgl_kernel")
    mod.__path__ = list(spec.submodule_search_locations)
    mod.__file__ = spec.origin
    mod.__package__ = "sgl_kernel"
    mod.__spec__ = importlib.util.spec_from_loader("sgl_kernel", loader=None, is_package=True)
    mod.__spec__.submodule_search_locations = mod.__path__
    mod.__version__ = "0.0.0+cpu-harness"
    mod.__sglang_replayssm_cpu_harness__ = True

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        for sub in _SGL_SUBMODULES:
            try:
                m = importlib.import_module(f"sgl_kernel.{sub}")
            except Exception:
                continue
            if hasattr(m, name):
                value = getattr(m, name)
                setattr(mod, name, value)
                return value
        value = _missing(name)
        setattr(mod, name, value)
        return value

    mod.__getattr__ = __getattr__
    sys.modules["sgl_kernel"] = mod


class _NullDevice(contextlib.nullcontext):
    def __init__(self, device=None):
        super().__init__()


def _patch_torch_device_module() -> None:
    import torch

    if not hasattr(torch.cpu, "device"):
        torch.cpu.device = _NullDevice
    original = torch.get_device_module
    if getattr(original, "_cpu_harness", False):
        return

    @functools.wraps(original)
    def get_device_module(device=None):
        if device is None:
            return torch.cpu
        return original(device)

    get_device_module._cpu_harness = True
    torch.get_device_module = get_device_module
    _patch_pin_memory(torch)
    _patch_cuda_synchronize(torch)


def _patch_cuda_synchronize(torch) -> None:
    """``torch.cuda.synchronize()`` needs a CUDA driver; without one there is nothing to wait for (SGLang's
    Qwen3-Next MTP draft calls it when it takes the target's embedding and head)."""
    if torch.cuda.is_available() or getattr(torch.cuda.synchronize, "_cpu_harness", False):
        return

    @functools.wraps(torch.cuda.synchronize)   # torch.compile's tracer reads __wrapped__ of torch functions
    def synchronize(device=None):
        return None

    synchronize._cpu_harness = True
    torch.cuda.synchronize = synchronize


def _patch_pin_memory(torch) -> None:
    """``Tensor.pin_memory()`` needs a CUDA driver; without one it returns the tensor (the host copy it
    would stage through is the tensor itself). SGLang's extra_buffer decode pins its track mask."""
    if torch.cuda.is_available() or getattr(torch.Tensor.pin_memory, "_cpu_harness", False):
        return

    def pin_memory(self, *args, **kwargs):
        return self

    pin_memory._cpu_harness = True
    torch.Tensor.pin_memory = pin_memory


def _patch_triton_autotune() -> None:
    """Under the interpreter, autotuning would time every config on the CPU: take the first."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import autotuner
    except Exception:
        return
    if getattr(autotuner.Autotuner, "_cpu_harness", False):
        return
    original_init = autotuner.Autotuner.__init__

    def __init__(self, fn, arg_names, configs, *args, **kwargs):
        original_init(self, fn, arg_names, configs[:1], *args, **kwargs)

    autotuner.Autotuner.__init__ = __init__
    autotuner.Autotuner._cpu_harness = True


def _bind_mamba_conv(mod) -> None:
    from sglang.kernels.ops.mamba import causal_conv1d_triton as triton_conv

    for name, fn in (("causal_conv1d_fn", triton_conv.causal_conv1d_fn),
                     ("causal_conv1d_fn_triton", triton_conv.causal_conv1d_fn),
                     ("causal_conv1d_update", triton_conv.causal_conv1d_update),
                     ("causal_conv1d_update_triton", triton_conv.causal_conv1d_update)):
        if not hasattr(mod, name):
            setattr(mod, name, fn)


def _route_verify_conv(mod) -> None:
    """The GDN and KDA backends' CPU conv update has no per-draft conv window: a target-verify call
    (``intermediate_conv_window=``) goes to SGLang's Triton conv update, which keeps them (as on a GPU)."""
    cpu_update = getattr(mod, "causal_conv1d_update", None)
    if cpu_update is None or getattr(cpu_update, "_cpu_harness", False):
        return

    def causal_conv1d_update(x, conv_states, weight, bias, activation, conv_state_indices=None, **verify_kwargs):
        if verify_kwargs:   # target verify: per-draft conv windows, which only the Triton kernel keeps
            from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update as triton_update

            return triton_update(x, conv_states, weight, bias, activation,
                                 conv_state_indices=conv_state_indices, **verify_kwargs)
        return cpu_update(x, conv_states, weight, bias, activation, conv_state_indices)

    causal_conv1d_update._cpu_harness = True
    mod.causal_conv1d_update = causal_conv1d_update


def _gdn_packed_decode_on_cpu(mod) -> None:
    """SGLang's own ``--enable-linear-replayssm`` decode lives in the packed GDN decode, which its CPU engine
    never calls (``supports_packed_decode`` is False on CPU). Turn the packed path on: with ReplaySSM rings it
    runs SGLang's ReplaySSM Triton kernel (under the interpreter), as on a GPU; without them it unpacks
    ``mixed_qkv`` and takes the CPU decode op (SGLang's plain packed Triton kernel does not run under the
    interpreter)."""
    from sglang.kernels.ops.attention.linear.fused_recurrent_linear_replayssm import (
        fused_recurrent_gdn_replayssm_decode)

    mod.fused_recurrent_gdn_replayssm_decode = fused_recurrent_gdn_replayssm_decode
    cls = mod.TritonGDNKernel
    packed = cls.packed_decode
    if getattr(packed, "_cpu_harness", False):
        return

    def packed_decode(self, mixed_qkv, a, b, *, A_log, dt_bias, scale, ssm_states, cache_indices, num_v_heads,
                      head_v_dim, **kwargs):
        if kwargs.get("replayssm_d") is not None:
            return packed(self, mixed_qkv, a, b, A_log=A_log, dt_bias=dt_bias, scale=scale, ssm_states=ssm_states,
                          cache_indices=cache_indices, num_v_heads=num_v_heads, head_v_dim=head_v_dim, **kwargs)
        import torch

        B, K = mixed_qkv.shape[0], ssm_states.shape[-1]
        v_dim = num_v_heads * head_v_dim
        qk_dim = (mixed_qkv.shape[-1] - v_dim) // 2
        q, k, v = torch.split(mixed_qkv, [qk_dim, qk_dim, v_dim], dim=-1)
        return torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=A_log, dt_bias=dt_bias, q=q.reshape(1, B, qk_dim // K, K), k=k.reshape(1, B, qk_dim // K, K),
            v=v.reshape(1, B, num_v_heads, head_v_dim), a=a, b=b, initial_state_source=ssm_states,
            initial_state_indices=cache_indices,
            cu_seqlens=torch.arange(B + 1, dtype=torch.int32), use_qk_l2norm_in_kernel=True, scale=scale)

    packed_decode._cpu_harness = True
    cls.packed_decode = packed_decode
    cls.supports_packed_decode = True


def _gdn_prefill_with_chunk_states(mod) -> None:
    """GDN prefill returns the per-chunk states ``h`` as FLA's kernel does on a GPU (the CPU op's wrapper
    returns None), which the extra_buffer radix cache tracks interior chunk boundaries from."""
    from .cpu_ops import chunk_gated_delta_rule_with_h

    mod.chunk_gated_delta_rule = chunk_gated_delta_rule_with_h


def _gdn_triton_on_cpu(mod) -> None:
    _gdn_packed_decode_on_cpu(mod)
    _gdn_prefill_with_chunk_states(mod)


def _mamba_snapshots_on_cpu(mod) -> None:
    """SGLang allows ``--mamba-radix-cache-strategy extra_buffer`` only on platforms whose kernels write
    the track snapshots; on CPU they are SGLang's Triton track kernels (under the interpreter) and the
    chunk states of ``_gdn_prefill_with_chunk_states``."""
    mod._platform_supports_mamba_cache_extra_buffer = lambda: True


def _ngram_full_tree_mask(mod) -> None:
    """On CPU SGLang's NGRAM worker builds the draft-only tree mask its AMX attention backend reads; the
    harness verifies with the Triton attention backend, which reads the full mask (prefix + drafts), as on
    a GPU. Without this the verify attends with a mask of the wrong shape."""
    mod._is_cpu = False


def _kda_kernels_on_cpu(mod) -> None:
    """``kda_triton.py`` imports its prefill and decode/verify kernels only off CPU: bind the PyTorch versions of
    ``kda_ops.py`` (KDA's per-channel decay; SGLang's Triton ``chunk_kda`` is wrong under the interpreter)."""
    from . import kda_ops

    for name in ("chunk_kda", "fused_sigmoid_gating_delta_rule_update"):
        if not hasattr(mod, name):
            setattr(mod, name, getattr(kda_ops, name))


def _eagle_full_tree_mask(mod) -> None:
    """On CPU SGLang's EAGLE / NEXTN verify builds the qlen x qlen tree mask its AMX attention backend reads
    (``TreeMaskMode.QLEN_ONLY``); the harness verifies with the Triton attention backend, which reads the full mask
    (prefix + drafts), as on a GPU. Without this, tree drafts are verified against the wrong mask."""
    mod.default_tree_mask_mode = lambda: mod.TreeMaskMode.FULL_MASK


def _speculative_overlap_on_cpu(mod) -> None:
    """SGLang turns the overlap scheduler off for speculative decoding on the CPU platform ("Overlap schedule is
    not implemented for speculative decoding on CPU", its log says). Where the harness keeps the overlap scheduler
    (``SGLANG_REPLAYSSM_CPU_OVERLAP=1``, ``cpu_server_args``), speculative decoding keeps it too, so the path a GPU
    server takes by default runs here: the scheduler one batch ahead, NGRAM's worker splicing the previous step's
    accepted tokens, EAGLE / NEXTN through SGLang's spec-v2 worker."""
    from . import OVERLAP_ENV

    if os.environ.get(OVERLAP_ENV) == "1":
        mod._disable_overlap_schedule_for_cpu = lambda server_args: None


def _moe_routed_scaling_on_cpu(mod) -> None:
    """SGLang's unquantized MoE on a GPU (the Triton runner, ``fused_experts``) multiplies the experts' weighted sum
    by the layer's ``routed_scaling_factor`` unless the router already did
    (``should_fuse_routed_scaling_factor_in_topk``); its CPU path without AMX (``moe_forward_native``) never does.
    Models that leave that factor to the experts (Kimi Linear: ``KimiMoE`` passes ``routed_scaling_factor`` to
    ``FusedMoE`` and multiplies nothing itself) were served on CPU with their routed experts' output that factor too
    small. Scaled here as the GPU runner scales it."""
    native = mod.moe_forward_native
    if getattr(native, "_cpu_harness", False):
        return

    @functools.wraps(native)
    def moe_forward_native(layer, x, topk_output, moe_runner_config):
        out = native(layer, x, topk_output, moe_runner_config)
        factor = moe_runner_config.routed_scaling_factor
        if factor is not None and factor != 1.0 and not getattr(layer, "should_fuse_routed_scaling_factor_in_topk",
                                                                 False):
            out = out * factor
        return out

    moe_forward_native._cpu_harness = True
    mod.moe_forward_native = moe_forward_native


TREE_LOG_ENV = "SGLANG_REPLAYSSM_CPU_LOG_TREES"


def _log_tree_verifies(mod) -> None:
    """Test instrumentation (``SGLANG_REPLAYSSM_CPU_LOG_TREES=1``): every verify the plugin's pool opens with a draft
    tree (some node's parent is not the node before it) prints one ``cpu-harness: tree verify`` line with the
    parents, and every commit of an accepted path that is not the drafts' first nodes in order (a tree path) one
    ``cpu-harness: tree commit`` line with the path, so a server test can tell that real draft trees reached the
    ReplaySSM verify and which paths it committed."""
    if os.environ.get(TREE_LOG_ENV) != "1":
        return
    cls = mod.ReplayMambaPool
    for name in ("open_verify", "open_tree_verify"):
        opened = getattr(cls, name)
        if not getattr(opened, "_cpu_harness", False):
            setattr(cls, name, _logged_open(opened))
    if not getattr(cls.commit_prepared, "_cpu_harness", False):
        cls.commit_prepared = _logged_commit(cls.commit_prepared)


def _logged_open(opened):
    @functools.wraps(opened)
    def open_verify(self, *args):
        out = opened(self, *args)
        parents = self.verify_parents
        rows = [] if parents is None else parents.tolist()   # CPU tensors: the harness may read them
        trees = [p for p in rows if list(p) != list(range(-1, len(p) - 1))]
        if trees:
            print(f"cpu-harness: tree verify: {len(trees)} of {len(rows)} rows, parents {list(trees[0])}",
                  file=sys.stderr, flush=True)
        return out

    open_verify._cpu_harness = True
    return open_verify


def _logged_commit(commit):
    from sglang_replayssm.reference.commit_prep import ACC, ROWS

    @functools.wraps(commit)
    def commit_prepared(self, prep, nodes):
        if nodes is not None:   # CPU tensors: the harness may read them
            for slot, acc, path in zip(prep[ROWS].tolist(), prep[ACC].tolist(), nodes.tolist()):
                path = path[:acc]
                if slot > 0 and path != list(range(len(path))):
                    print(f"cpu-harness: tree commit: {acc} records along {path}", file=sys.stderr, flush=True)
        return commit(self, prep, nodes)

    commit_prepared._cpu_harness = True
    return commit_prepared


_AFTER_IMPORT = {
    "sglang_replayssm.sglang_plugin.pool": _log_tree_verifies,
    "sglang.srt.speculative.eagle_utils": _eagle_full_tree_mask,
    "sglang.srt.layers.attention.linear.kernels.kda_triton": _kda_kernels_on_cpu,
    "sglang.srt.speculative.ngram_worker": _ngram_full_tree_mask,
    "sglang.srt.layers.attention.linear.kernels.gdn_triton": _gdn_triton_on_cpu,
    "sglang.srt.arg_groups.mamba_hook": _mamba_snapshots_on_cpu,
    "sglang.srt.arg_groups.speculative_hook": _speculative_overlap_on_cpu,
    "sglang.srt.layers.attention.mamba.mamba": _bind_mamba_conv,
    "sglang.srt.layers.attention.linear.gdn_backend": _route_verify_conv,
    "sglang.srt.layers.attention.linear.kda_backend": _route_verify_conv,
    "sglang.srt.layers.moe.fused_moe_native": _moe_routed_scaling_on_cpu,
}


class _AfterImportFinder:
    """A meta-path finder that runs ``patches[name](module)`` right after ``name`` executed."""

    def __init__(self, patches: dict):
        self.patches = patches

    def find_spec(self, name, path=None, target=None):
        if name not in self.patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module, _exec=original_exec, _patch=self.patches[name]):
            _exec(module)
            _patch(module)

        try:
            loader.exec_module = exec_module
        except AttributeError:
            return None
        return spec


def install_after_import_patches(patches: dict) -> None:
    """Run ``patches[name](module)`` on ``name`` now if it is imported, else right after its import."""
    for name, patch in patches.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _AfterImportFinder) and f.patches is patches for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder(patches))


# `Ignore import error when loading sglang.srt.models.grok: '_OpNamespace' 'sgl_kernel' object has no attribute
# 'fused_moe_router_cpu'`: a model module binding a CPU-kernel-build op at import (item 7 above)
_MISSING_CPU_OP = re.compile(r"^Ignore import error when loading \S+: '_OpNamespace' 'sgl_kernel' object has no "
                             r"attribute '\w+_cpu'$")
_IMPORT_ERROR_LOGGERS = ("sglang.srt.models.registry", "sglang.srt.managers.multimodal_processor")
# warnings (message regexes) that only say this is not a GPU
_CPU_WARNINGS = (r"Only CUDA, .* support (AWQ|GGUF)", r"Triton is not supported on current platform, roll back to CPU",
                 r"tl\.make_block_ptr is deprecated")


class _QuietMissingCPUOps(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _MISSING_CPU_OP.match(record.getMessage())


def quiet_expected_noise() -> None:
    """Item 7 of the module docstring: logger filters and warning filters, in this process."""
    for name in _IMPORT_ERROR_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _QuietMissingCPUOps) for f in logger.filters):
            logger.addFilter(_QuietMissingCPUOps())
    for message in _CPU_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    quiet_expected_noise()
    install_sgl_kernel_stand_in()
    _patch_torch_device_module()
    from . import cpu_ops, spec_ops

    cpu_ops.register()
    spec_ops.register()
    _patch_triton_autotune()
    install_after_import_patches(_AFTER_IMPORT)
    from . import dist_ops   # tensor parallelism (--tp N): per-rank CPU binding, gloo collectives

    dist_ops.register()
    install_after_import_patches(dist_ops.AFTER_IMPORT)
