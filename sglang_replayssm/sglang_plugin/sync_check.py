"""``SGLANG_REPLAYSSM_SYNC_CHECK=1``: every step function of the plugin runs under
``torch.cuda.set_sync_debug_mode("error")``, so a device -> host read in it (``.tolist()``, ``.item()``,
``if tensor:``, a boolean-mask index, ``nonzero``) raises instead of stalling the GPU.

The plugin's step (decode and verify hooks, the per-step metadata note, the speculative commit, the deferred
cursor move, track copies, the prefill refresh and SGLang's slot operations) reads nothing back to the host:
the overlap scheduler keeps running ahead and verify stays inside SGLang's CUDA graphs. This switch proves it
on a GPU server (``bench/sync_free_check.py``); on CPU the host-read guard of ``tests/sglang_plugin`` keeps it
true in CI. Off by default (read once, at import: the spawned scheduler inherits it from the launcher). Meant
for a check run with the overlap scheduler off: the mode is process-wide while a step function runs.
"""
from __future__ import annotations

import functools
import os

import torch

SYNC_CHECK_ENV = "SGLANG_REPLAYSSM_SYNC_CHECK"
ENABLED = os.environ.get(SYNC_CHECK_ENV, "").strip() not in ("", "0")


def sync_checked(fn):
    """``fn`` as it is, or (with ``SGLANG_REPLAYSSM_SYNC_CHECK`` set and CUDA present) run with host syncs
    made errors."""
    if not ENABLED:
        return fn

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if not torch.cuda.is_available():
            return fn(*args, **kwargs)
        before = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return fn(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(before)
    return checked
