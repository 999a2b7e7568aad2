"""GPU harness: stock SGLang 0.5.23 (with or without our plugin) on a CUDA machine that cannot install it.

For the H200 lent to this project: torch 2.11 / Triton 3.6 / Python 3.12, no internet, no SGLang.
SGLang's Python code and its pure-Python (and small binary) dependencies travel as wheels
(``bench/h200/h200_wheels.sh`` builds them, ``bench/h200/h200_wheels.txt`` lists them); its 373 MB compiled kernel
wheel does not, and ``bridge.py`` stands in for it. Switched on by ``activate()`` in the launching
process (``bench/h200/h200_serve.py`` does); nothing here runs unless asked.

``activate()``: ``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1``, ``site/`` first on ``PYTHONPATH`` (its
``sitecustomize`` installs the bridge in every process SGLang spawns, before they import SGLang) and the
bridge in this process.
``gpu_server_args(argv)`` adds ``GPU_DEFAULTS`` unless the user gave the flag (an explicit flag wins).
"""

from __future__ import annotations

import os
from pathlib import Path

from sglang_replayssm.argparsing import flag_value
from sglang_replayssm.cpu_harness import _given, site_first

SITE_DIR = Path(__file__).resolve().parent / "site"

# flag -> value (None: a switch): the paths whose compiled kernels the bridge replaces or avoids
GPU_DEFAULTS: dict[str, str | None] = {
    "--attention-backend": "triton",
    "--sampling-backend": "pytorch",
    "--grammar-backend": "none",
    # SM90 would default GDN prefill to FlashInfer's Hopper kernel (flashinfer is not shipped)
    "--linear-attn-prefill-backend": "triton",
    "--linear-attn-decode-backend": "triton",
    # the plugin's radix-cache strategy; SGLang refuses no_buffer with the overlap scheduler while the radix
    # cache is on (gpu_server_args adds the switch only then)
    "--mamba-radix-cache-strategy": "no_buffer",
    "--disable-overlap-schedule": None,
    # the model runner's warm-up imports flashinfer for its autotuner (not shipped), graphs off or on
    "--disable-flashinfer-autotune": None,
}


def gpu_server_args(argv: list[str]) -> list[str]:
    """``argv`` plus every GPU default it does not set itself. ``--disable-overlap-schedule`` is added only where
    SGLang requires it: the radix cache on with the ``no_buffer`` strategy (the default here). With
    ``--disable-radix-cache`` or another strategy the overlap scheduler stays on, as SGLang runs a server with
    those flags."""
    out = list(argv)
    needs_sync_scheduler = (not _given(argv, "--disable-radix-cache")
                            and flag_value(argv, "--mamba-radix-cache-strategy") in (None, "no_buffer"))
    for flag, value in GPU_DEFAULTS.items():
        if _given(argv, flag) or (flag == "--disable-overlap-schedule" and not needs_sync_scheduler):
            continue
        out += [flag] if value is None else [flag, value]
    return out


def harness_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's) with ``site/`` first on ``PYTHONPATH`` and SGLang's kernel
    version check off."""
    env = dict(os.environ if env is None else env)
    # SGLang's own switch for its sglang-kernel version check (the stand-in has no package metadata)
    env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] = "1"
    return site_first(env, SITE_DIR)


def activate() -> None:
    """Switch this process (and every process it starts from now on) to the GPU harness."""
    os.environ.update(harness_env())
    from .bridge import install

    install()
