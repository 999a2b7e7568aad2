"""Which ReplaySSM options are in force in this process, and how they coexist with SGLang's flags.

ReplaySSM is *off* in SGLang unless asked for: the options are in force when any ``--replayssm-*``
flag was given on SGLang's command line, or when ``SGLANG_REPLAYSSM_OPTIONS`` is set (our launcher
sets it). The launcher process parses the flags (``cli.py``) and stores them in that environment
variable, so every process SGLang spawns (schedulers, detokenizer) reads the same options back.

The flag names, parsing and value checks live in :mod:`sglang_replayssm.flags` (shared with the
native engine); this module adds the checks against SGLang's own arguments, and which implementation
the pools use: ``SGLANG_REPLAYSSM_OPS=reference|kernels`` forces the PyTorch reference or the Triton
kernels (tests run the kernels on CPU under ``TRITON_INTERPRET=1`` that way); unset, the kernels run on
CUDA and the reference elsewhere (``family_ops.FamilyOps.select``).
"""

from __future__ import annotations

import os

from sglang_replayssm.flags import ENV_VAR, FlagError, ReplaySSMOptions

OPS_ENV = "SGLANG_REPLAYSSM_OPS"
_UNSET = object()
_cached = _UNSET


def active_options() -> ReplaySSMOptions | None:
    """The options in force in this process, or None when ReplaySSM is off."""
    global _cached
    if _cached is _UNSET:
        _cached = ReplaySSMOptions.from_env() if os.environ.get(ENV_VAR) else None
    return _cached


def set_active(opts: ReplaySSMOptions | None) -> None:
    """Make ``opts`` the options of this process and of every process it spawns from now on."""
    global _cached
    _cached = opts
    if opts is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ.update(opts.to_env())


def ops_backend() -> str:
    """The ``backend`` argument of ``FamilyOps.select`` for this process: ``auto`` unless ``OPS_ENV`` forces one."""
    forced = os.environ.get(OPS_ENV, "").strip()
    if forced and forced not in ("reference", "kernels"):
        raise ValueError(f"{OPS_ENV} must be 'reference' or 'kernels', got {forced!r}")
    return forced or "auto"


def _reset_cache_for_tests() -> None:
    global _cached
    _cached = _UNSET


def _get(args, name, default=None):
    return getattr(args, name, default)


def check_against_sglang(opts: ReplaySSMOptions, args) -> None:
    """Refuse combinations with SGLang's own arguments (``args``: ServerArgs or argparse Namespace).

    Raises FlagError naming the flag at fault."""
    for name, flag in (("enable_linear_replayssm", "--enable-linear-replayssm"),
                       ("enable_linear_replayssm_spec", "--enable-linear-replayssm-spec")):
        if _get(args, name, False):
            raise FlagError(
                flag,
                "SGLang's built-in linear ReplaySSM cannot run together with the sglang-replayssm plugin's "
                "--replayssm-* flags (both replace the same mamba state pool and kernels). Use one: drop "
                f"{flag}, or drop the --replayssm-* flags (or unset {ENV_VAR}).")
    strategy = _get(args, "mamba_radix_cache_strategy", "auto")
    if opts.decode and strategy == "extra_buffer_lazy":
        raise FlagError(
            "--mamba-radix-cache-strategy",
            "'extra_buffer_lazy' is not supported with --replayssm-decode (its lazily allocated and promoted track "
            "slots are not wired to the ReplaySSM pool, nor tested with it): use 'extra_buffer' (with or without "
            "--speculative-algorithm) or 'no_buffer'")
    if _get(args, "enable_int8_mamba_checkpoint", False):
        raise FlagError(
            "--enable-int8-mamba-checkpoint",
            "the int8 mamba checkpoint pool stores SGLang-format states; it is not supported together with "
            "the ReplaySSM pool (--replayssm-* flags)")
