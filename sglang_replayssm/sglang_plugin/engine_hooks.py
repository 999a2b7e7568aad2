"""The engine hooks: every SGLang model-runner-side target the plugin patches (pool, budget, kernels, per-step
metadata, extra_buffer track copies, the cursor move after a forward, the speculative commit), and their
registration. Installed only where ReplaySSM is on (``hooks.register_hooks`` at entry-point time, or
``ensure_engine_hooks`` when the flags are parsed later in the process, ``cli.from_cli_args``). Each hook passes
through to SGLang unless the layer lives in a ReplaySSM pool.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from . import backends, budget, spec, track
from .pool import ReplayMambaPool, settle_all

_HYB = "sglang.srt.layers.attention.hybrid_linear_attn_backend"
_GDN = "sglang.srt.layers.attention.linear.gdn_backend"
_KDA = "sglang.srt.layers.attention.linear.kda_backend"


def _settle_after_forward(result, runner, forward_batch=None, *args, **kwargs):
    settle_all(forward_batch)
    return result


def engine_table() -> list[tuple[str, object, HookType]]:
    """Installed where ReplaySSM is on (resolving them imports the model-runner modules)."""
    table = [
        # pool + budget
        ("sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.mamba_pool_cls", ReplayMambaPool, HookType.REPLACE),
        ("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._handle_max_mamba_cache",
         budget.handle_max_mamba_cache, HookType.AROUND),
        # Mamba-2 decode / verify kernel
        ("sglang.kernels.ops.mamba.triton_ops.ssu_dispatch.selective_state_update",
         backends.mamba2_selective_state_update, HookType.AROUND),
        # prefill -> checkpoint
        (f"{_HYB}.Mamba2AttnBackend.forward", backends.mamba2_forward, HookType.AROUND),
        (f"{_GDN}.GDNAttnBackend.forward_extend", backends.delta_forward_extend, HookType.AROUND),
        (f"{_KDA}.KDAAttnBackend.forward_extend", backends.delta_forward_extend, HookType.AROUND),
        (f"{_KDA}.KDAAttnBackend.supports_prefill_graph_extend", backends.no_prefill_graph_extend, HookType.AROUND),
        # per-step metadata (eager and CUDA-graph replay)
        (f"{_HYB}.Mamba2AttnBackend.init_forward_metadata", backends.init_metadata_after, HookType.AFTER),
        (f"{_HYB}.Mamba2AttnBackend.init_forward_metadata_out_graph", backends.init_metadata_after, HookType.AFTER),
        (f"{_GDN}.GDNAttnBackend.init_forward_metadata", backends.init_metadata_after, HookType.AFTER),
        (f"{_GDN}.GDNAttnBackend.init_forward_metadata_out_graph", backends.init_metadata_after, HookType.AFTER),
        (f"{_KDA}.KDAAttnBackend.init_forward_metadata", backends.init_metadata_after, HookType.AFTER),
        (f"{_HYB}.MambaAttnBackendBase.init_forward_metadata_out_graph", backends.init_metadata_after,
         HookType.AFTER),
        # extra_buffer: the radix cache's track slots get whole ReplaySSM slots (track.py)
        (f"{_HYB}.MambaAttnBackendBase._track_mamba_state_decode", track.track_mamba_state_decode, HookType.AROUND),
        (f"{_HYB}.MambaAttnBackendBase._track_mamba_state_extend", track.track_mamba_state_extend, HookType.AROUND),
        (f"{_HYB}.track_mamba_states_if_needed", track.track_mamba_states_if_needed, HookType.AROUND),
        # cursor move (and the noted track copies) once all layers of a decode step ran
        ("sglang.srt.model_executor.model_runner.ModelRunner.forward", _settle_after_forward, HookType.AFTER),
        # speculative commit
        ("sglang.srt.speculative.spec_utils.commit_mamba_states_after_verify", spec.commit_mamba_states_after_verify,
         HookType.AROUND),
        (f"{_HYB}.HybridLinearAttnBackend.update_mamba_state_after_mtp_verify",
         spec.update_mamba_state_after_mtp_verify, HookType.AROUND),
    ]
    for family, cls in (("gdn", f"{_GDN}.GDNKernelDispatcher"), ("kda", f"{_KDA}.KDAKernelDispatcher")):
        table += [
            (f"{cls}.decode", backends.make_decode_hook(family), HookType.AROUND),
            (f"{cls}.packed_decode", backends.make_packed_decode_hook(family), HookType.AROUND),
            (f"{cls}.target_verify", backends.make_target_verify_hook(family), HookType.AROUND),
        ]
    return table


_engine_registered = False


def register_engine_hooks() -> None:
    global _engine_registered
    if not _engine_registered:
        _engine_registered = True
        for target, hook, kind in engine_table():
            HookRegistry.register(target, hook, kind)


def ensure_engine_hooks() -> None:
    """ReplaySSM was turned on after the plugins loaded (flags parsed in this process): install the
    engine hooks now (apply_hooks skips targets it already patched)."""
    if not _engine_registered:
        register_engine_hooks()
        HookRegistry.apply_hooks()
