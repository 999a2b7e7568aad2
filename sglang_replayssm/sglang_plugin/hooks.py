"""Every hook the plugin installs, registered through SGLang's ``HookRegistry``.

SGLang's ``load_plugins()`` runs in the launcher and again in every spawned scheduler / detokenizer
process (entry point group ``sglang.srt.plugins``), then applies the registered hooks; so the hooks are
active wherever the model runs. ``SGLANG_PLUGINS=<names>`` restricts which plugins load
(``replayssm`` is ours). The flag hooks (``cli.py``) are always installed; the engine hooks
(``engine_hooks.py``) only in processes where ReplaySSM is on (``options.py``), so an SGLang launch without
``--replayssm-*`` flags does not pay for importing the model-runner modules in its tokenizer / detokenizer
processes. Even where installed, every hook passes through to SGLang unless the layer lives in a ReplaySSM pool.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from . import cli
from .engine_hooks import register_engine_hooks
from .options import active_options


def cli_table() -> list[tuple[str, object, HookType]]:
    """Always installed (cheap: server_args is imported by every SGLang process anyway)."""
    return [
        ("sglang.srt.server_args.ServerArgs.add_cli_args", cli.add_cli_args, HookType.AFTER),
        ("sglang.srt.server_args.ServerArgs.from_cli_args", cli.from_cli_args, HookType.AROUND),
        ("sglang.srt.arg_groups.overrides._mamba_radix_cache_resolution", cli.lazy_extra_buffer_by_default,
         HookType.AROUND),
    ]


def register_hooks() -> None:
    """Entry-point time: the flag hooks always; the engine hooks where ReplaySSM is already on (the
    processes SGLang spawns inherit SGLANG_REPLAYSSM_OPTIONS from the launcher)."""
    for target, hook, kind in cli_table():
        HookRegistry.register(target, hook, kind)
    if active_options() is not None:
        register_engine_hooks()
