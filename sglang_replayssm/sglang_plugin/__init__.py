"""SGLang plugin for ReplaySSM (entry point ``sglang.srt.plugins: replayssm``).

``register()`` is what SGLang's ``load_plugins()`` calls in every process; it registers the hooks of
``hooks.py`` with SGLang's ``HookRegistry`` (SGLang applies them right after). ``launch_server(argv)``
starts SGLang's HTTP server with the plugin active (``python -m sglang_replayssm.launch --engine sglang``).

This package imports SGLang; the rest of ``sglang_replayssm`` does not.
"""

from __future__ import annotations

_registered = False


def register() -> None:
    """Entry point: register the ReplaySSM hooks (idempotent)."""
    global _registered
    if _registered:
        return
    from .hooks import register_hooks

    register_hooks()
    _registered = True


def is_registered() -> bool:
    return _registered


def launch_server(argv: list[str]) -> None:
    """Start SGLang's server (what ``python -m sglang.launch_server`` does) with ReplaySSM active."""
    from .launch import launch_server as _launch

    _launch(argv)
