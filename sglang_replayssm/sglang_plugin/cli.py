"""The ``--replayssm-*`` flags on SGLang's own command line (``sglang serve``, ``python -m
sglang.launch_server``, our launcher).

* ``ServerArgs.add_cli_args`` (after): adds the flags of :mod:`sglang_replayssm.flags` to SGLang's
  parser, with "not given" defaults so we can tell whether the user asked for ReplaySSM.
* ``ServerArgs.from_cli_args`` (around): when any flag was given (or ``SGLANG_REPLAYSSM_OPTIONS`` is
  set), builds and validates the options (value checks in ``flags.py``, combination checks against
  SGLang's arguments in ``options.py``), stores the options in the environment for the processes SGLang
  spawns, and keeps a copy on the record (``server_args._replayssm_options``, bookkeeping that survives
  pickling).
* ``overrides._mamba_radix_cache_resolution`` (around): ``--mamba-radix-cache-strategy auto`` (SGLang's default)
  is resolved by SGLang from the model's config, with or without speculative decoding: ``extra_buffer`` with the
  overlap scheduler or pages > 1 where the model supports it, else ``no_buffer``. With ReplaySSM on, where SGLang
  picks ``extra_buffer`` with the overlap scheduler on (and no PD disaggregation), the plugin makes it
  ``extra_buffer_lazy``: a running request then holds one track slot (a second only for the step that crosses a
  track boundary) instead of two, and SGLang reserves 4 mamba slots per running request instead of 5
  (``_calculate_mamba_ratio``), so the same pool runs 1.25x the requests. ``no_buffer``, ``extra_buffer`` and
  ``extra_buffer_lazy`` given explicitly are kept; all three work with the ReplaySSM pool.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from sglang_replayssm.flags import ENV_VAR, ReplaySSMOptions, add_replayssm_args

from .engine_hooks import ensure_engine_hooks
from .options import active_options, check_against_sglang, set_active

logger = logging.getLogger(__name__)


class _NotGiven:
    """Default of our flags on SGLang's parser (not a str: argparse would run `type` on it)."""

    def __repr__(self):
        return "<not given>"


_NOT_GIVEN = _NotGiven()
_DESTS = ("replayssm_window", "replayssm_ckpt_precision", "replayssm_read_copy", "replayssm_decode",
          "replayssm_verify")


def add_cli_args(result, parser, *args, **kwargs):
    add_replayssm_args(parser)
    parser.set_defaults(**{dest: _NOT_GIVEN for dest in _DESTS})
    return result


def options_from_namespace(ns) -> ReplaySSMOptions | None:
    """Options the user asked for on this command line (None: ReplaySSM off)."""
    given = {d: getattr(ns, d) for d in _DESTS if getattr(ns, d, _NOT_GIVEN) is not _NOT_GIVEN}
    if not given and not os.environ.get(ENV_VAR):
        return None
    base = ReplaySSMOptions.from_env() if os.environ.get(ENV_VAR) else ReplaySSMOptions()
    fields = dataclasses.asdict(base)
    for dest, value in given.items():
        fields[dest[len("replayssm_"):]] = value
    return ReplaySSMOptions(**fields)


def from_cli_args(original, cls, args):
    opts = options_from_namespace(args)
    if opts is not None:
        check_against_sglang(opts, args)
    set_active(opts)
    if opts is not None:
        ensure_engine_hooks()  # this process parsed the flags after load_plugins() (e.g. bench_one_batch)
    server_args = original(cls, args)
    if opts is not None:
        server_args._replayssm_options = dataclasses.asdict(opts)
    return server_args


def lazy_extra_buffer_by_default(original, view):
    """SGLang's resolution of ``--mamba-radix-cache-strategy auto``, its ``extra_buffer`` made ``extra_buffer_lazy``
    where ReplaySSM is on and the overlap scheduler runs (the lazy strategy requires it), outside PD
    disaggregation (SGLang does not wire lazy slots there)."""
    declared = original(view)
    if (active_options() is None or declared.get("mamba_radix_cache_strategy") != "extra_buffer"
            or view.mamba_radix_cache_strategy != "auto" or view.disable_overlap_schedule
            or getattr(view, "disaggregation_mode", "null") != "null"):
        return declared
    logger.info("ReplaySSM: --mamba-radix-cache-strategy auto -> extra_buffer_lazy (one track slot per running request "
                "instead of two; give --mamba-radix-cache-strategy extra_buffer to keep two)")
    return {**declared, "mamba_radix_cache_strategy": "extra_buffer_lazy"}
