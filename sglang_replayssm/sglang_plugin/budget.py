"""Memory budget: make SGLang size its mamba pool for ReplaySSM slots.

SGLang solves for ``max_mamba_cache_size`` in ``KVCacheConfigurator._handle_max_mamba_cache`` from
``mamba_cache_per_req`` (conv + full state per layer) plus ``extra_mamba_cache_bytes_per_req``, and,
with speculative decoding, reserves one full state per draft token per running request
(``intermediate_ssm``). With the ReplaySSM pool:

* ``extra_mamba_cache_bytes_per_req`` += (our slot bytes: checkpoint + read copy + record ring +
  cursors) - (SGLang's full-state bytes) + (the per-draft conv windows we keep), so the slot price SGLang
  divides by is the real one;
* the per-draft state reservation is skipped (our verify allocates no snapshots): during the call
  the configurator's ``_pd_prefill_skips_mamba_spec_state`` answers True, which is the switch SGLang
  itself uses for pools that allocate no verify snapshots. Pool construction is not affected.

Everything here is per TP rank, as SGLang's configurator is: with ``--tp N`` each rank sizes its own pool from its
own memory, and ``cache_params`` are that rank's shard (``H / N`` SSM heads per layer), so the slot price and the
start-up line below are one rank's (the line names the rank).
"""

from __future__ import annotations

import logging
import math
import sys

from sglang_replayssm.pool import ReplayStatePool

from .options import active_options
from .pool import family_of, geometry_of
from .reservation import CONFIGURATOR_MODULE
from .tp import tp_rank_label

logger = logging.getLogger(__name__)


def extra_bytes_per_slot(cache_params, opts, drafts: int, device) -> int:
    """Bytes one ReplaySSM slot on `device` needs beyond what SGLang's ``mamba_cache_per_req`` already counts."""
    family = family_of(cache_params)
    if family is None:
        return 0
    nl = len(cache_params.layers)
    cfg = opts.replay_config(max_drafts=drafts, family=family, device=device)
    ours = ReplayStatePool.slot_bytes(geometry_of(family, cache_params), nl, cfg, act_dtype=cache_params.dtype.conv)
    theirs_ssm = math.prod(cache_params.shape.temporal) * cache_params.dtype.temporal.itemsize * nl
    conv_windows = drafts * sum(math.prod(s) for s in cache_params.shape.conv) * cache_params.dtype.conv.itemsize * nl
    return ours - theirs_ssm + conv_windows


def handle_max_mamba_cache(original, self, total_rest_memory):
    opts = active_options()
    cfg = self.mambaish_config
    if opts is None or not opts.decode or cfg is None or family_of(cfg.mamba2_cache_params) is None:
        return original(self, total_rest_memory)
    mod = sys.modules[CONFIGURATOR_MODULE]
    drafts = 0
    if not self.spec_algorithm.is_none():
        drafts = int(mod.max_speculative_num_draft_tokens() or 0)
    cache_params = cfg.mamba2_cache_params
    extra = extra_bytes_per_slot(cache_params, opts, drafts, self.device)
    saved_extra = self.extra_mamba_cache_bytes_per_req
    saved_switch = mod._pd_prefill_skips_mamba_spec_state
    self.extra_mamba_cache_bytes_per_req = saved_extra + extra
    if drafts:
        mod._pd_prefill_skips_mamba_spec_state = lambda: True
    try:
        result = original(self, total_rest_memory)
    finally:
        mod._pd_prefill_skips_mamba_spec_state = saved_switch
        self.extra_mamba_cache_bytes_per_req = saved_extra
    per_req = cache_params.mamba_cache_per_req
    logger.info("ReplaySSM budget, per TP rank (%s: its shard of the SSM heads, its own memory): %d bytes per mamba "
                "slot (SGLang's scheme: %d + %d per-draft snapshot bytes)", tp_rank_label(), per_req + extra, per_req,
                drafts * math.prod(cache_params.shape.temporal) * cache_params.dtype.temporal.itemsize
                * len(cache_params.layers))
    return result
