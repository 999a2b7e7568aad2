"""What SGLang reserves per running request in the mamba pool, for this server and for its two peers.

SGLang caps the running requests at its mamba slots divided by the slots it reserves per request
(``KVCacheConfigurator._calculate_mamba_ratio``: 1 with the radix cache off; with it 3, plus the track slots of
``extra_buffer`` (2 with the overlap scheduler, 1 without) or ``extra_buffer_lazy`` (1)), so at equal memory the bytes
per running request decide concurrency. Exported as the ``replayssm:*running_request_bytes`` gauges
(``accounting.py``) when the pool is built.
"""

from __future__ import annotations

import sys

CONFIGURATOR_MODULE = "sglang.srt.mem_cache.kv_cache_configurator"


def running_request_bytes(cache_params, family: str, slot_bytes: int) -> dict[str, int] | None:
    """SSM state bytes reserved per running request on this TP rank, by this server and by its two peers (the
    ``replayssm:*running_request_bytes`` gauges): SGLang caps the running requests at its mamba slots divided by
    the slots it reserves per request (``KVCacheConfigurator._calculate_mamba_ratio``), so at equal memory these
    bytes decide concurrency. Peers: stock SGLang under ``extra_buffer`` with the overlap scheduler (its GPU default
    with the radix cache), SGLang's ``--enable-linear-replayssm`` under ``no_buffer`` (the strategy it forces; its
    record ring per slot for KDA, per request for GDN; none for Mamba-2). None where SGLang's run-time config is not
    published (a pool built outside a scheduler)."""
    mod = sys.modules.get(CONFIGURATOR_MODULE)
    try:
        ours_ratio = int(mod.KVCacheConfigurator._calculate_mamba_ratio(None))
        radix = not mod.get_memory().disable_radix_cache
        skip_lock = bool(mod.envs.SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK.get())
    except (AttributeError, ValueError, RuntimeError):
        return None
    base = mod.MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO - (mod.MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP if skip_lock else 0)
    stock_ratio = base + mod.get_mamba_tracking_slots(extra_buffer=True, overlap=True) if radix else 1
    rs_ratio = mod.MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO if radix else 1   # no_buffer: 3 with or without skip
    per_req = cache_params.mamba_cache_per_req
    if family == "mamba2":
        rs = 0
    else:
        ring = cache_params.replayssm_ring_bytes_per_req(record_len=16)   # SGLang's default --linear-replayssm-cache-len
        rs = rs_ratio * (per_req + ring) if family == "kda" else rs_ratio * per_req + ring
    return {"replayssm:running_request_bytes": ours_ratio * slot_bytes,
            "replayssm:stock_running_request_bytes": stock_ratio * per_req,
            "replayssm:sglang_replayssm_running_request_bytes": rs}
