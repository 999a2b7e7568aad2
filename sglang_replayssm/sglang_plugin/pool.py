"""ReplayMambaPool: SGLang's ``MambaPool`` with its SSM state kept in our ``ReplayStatePool``.

Set as ``HybridReqToTokenPool.mamba_pool_cls`` by the plugin. When ReplaySSM is off in this process
(no ``--replayssm-*`` flags), or the model's layers are not a family we handle (Mamba-1 full-rank
mixers), it is exactly SGLang's ``MambaPool``.

When on:

* ``mamba_cache.temporal`` *is* our checkpoint tensor ``[layers, size + 1, H, Dv, Dk]`` (fp32, or fp16
  with ``--replayssm-ckpt-precision fp16-sr``). SGLang's prefill kernels read their initial state
  from it and write the final state into it; the backend hooks then refresh the read copy and keep
  the ring empty. Decode / verify go through our kernels (``backends.py``), which read checkpoint
  (or read copy) + records and append records.
* conv state stays in SGLang's own layout and kernels (we do not touch the short convolution),
  including the per-draft conv windows verify needs for the conv rollback.
* ``intermediate_ssm`` (SGLang's one full state per draft token) is never allocated: verify appends
  draft records and commit moves the ring pointer.
* slot ids are SGLang's (``MambaSlotAllocator``; slot 0 is the padding slot in both). Every usable
  slot is marked allocated in our pool once; ``clear_slots`` resets, ``copy_from`` folds the source's
  committed records (a flush at the cached boundary) and forks checkpoint + read copy + cursor.
* the cursor move after a decode step over all layers (``ReplayStatePool.advance``) is deferred to
  ``settle()``, which runs after ``ModelRunner.forward`` and at the start of the next step; so are the
  early folds that spread the flushes of rows prefilled together (``flush_stagger.py``) and the
  ``extra_buffer`` track copies of that step (``note_track``: whole-slot copies, ``track.py``); these step /
  verify / commit methods are ``step_machine.StepMachine``'s, the metrics publishing ``step_metrics.StepMetrics``'s.
* the arithmetic (decode / verify in the hooks, the fold and the checkpoint store here) is the pool's
  ``replay.ops``: a ``FamilyOps`` chosen once, at construction, from the family, the device and
  ``SGLANG_REPLAYSSM_OPS`` (``options.ops_backend``).
"""

from __future__ import annotations

import logging
import os
import weakref

import torch

from sglang.srt.mem_cache.memory_pool import MambaPool as _SGLangMambaPool

from sglang_replayssm.family_ops import FamilyOps
from sglang_replayssm.flags import FlagError
from sglang_replayssm.pool import ReplayStatePool, SSMGeometry
from sglang_replayssm.reference.replay import STEP_COUNTS

from . import metrics
from .flush_stagger import FlushStagger
from .options import active_options, ops_backend
from .reservation import running_request_bytes
from .step_machine import StepMachine
from .step_metrics import StepMetrics
from .sync_check import sync_checked
from .tp import tp_rank_label

logger = logging.getLogger(__name__)

# data_ptr of a layer's checkpoint view -> (pool, layer index); how the kernel hooks, which SGLang hands
# only `ssm_states` (= mamba_cache.temporal[layer]), find the pool and the layer.
_LAYER_VIEWS: dict[int, tuple[weakref.ref, int]] = {}
_POOLS: "weakref.WeakSet[ReplayMambaPool]" = weakref.WeakSet()

METRICS_INTERVAL_ENV = "SGLANG_REPLAYSSM_METRICS_INTERVAL"


def family_of(cache_params) -> str | None:
    """ReplaySSM family of SGLang's linear-state cache params, or None for layers we do not handle."""
    if getattr(cache_params, "is_kda", False):
        return "kda"
    shape = cache_params.shape
    if not hasattr(shape, "conv_dim"):
        return None
    if getattr(shape, "conv_shard_groups", None) is not None:
        return "gdn"  # Qwen3-Next style: conv over cat(q, k, v), recorded by the config
    if shape.conv_dim == shape.intermediate_size:
        return None  # Mamba-1 full-rank mixer (B, C not in the conv): per-channel A, not our Mamba-2 form
    return "mamba2"


def geometry_of(family: str, cache_params) -> SSMGeometry:
    H, Dv, Dk = cache_params.shape.temporal
    Hk = cache_params.shape.num_k_heads_per_tp
    if family == "mamba2" and H % Hk:
        Hk = 1
    return SSMGeometry(family=family, num_heads=H, head_v_dim=Dv, head_k_dim=Dk, num_k_heads=Hk, conv_dim=0)


def lookup_layer(ssm_states: torch.Tensor):
    """(pool, layer) when ``ssm_states`` is a checkpoint layer view of an active ReplayMambaPool."""
    hit = _LAYER_VIEWS.get(ssm_states.data_ptr())
    if hit is None:
        return None
    pool = hit[0]()
    if pool is None or pool.replay is None:
        return None
    return pool, hit[1]


def settle_all(forward_batch=None) -> None:
    """After ``ModelRunner.forward``: every pool's deferred cursor move and track copies; ``forward_batch`` (the real
    batch) brings the track mask of a decode step replayed in a CUDA graph (``ReplayMambaPool.await_track_mask``)."""
    mask = getattr(forward_batch, "mamba_track_mask", None)
    for pool in list(_POOLS):
        pool.take_track_mask(mask, getattr(forward_batch, "batch_size", 0))
        pool.settle()


def _tensor_bytes(t) -> int:
    if t is None:
        return 0
    if isinstance(t, (list, tuple)):
        return sum(_tensor_bytes(x) for x in t)
    return t.numel() * t.element_size()


class ReplayMambaPool(StepMachine, StepMetrics, _SGLangMambaPool):
    """SGLang's MambaPool with the ReplaySSM state: its fields and slot operations here, the step / verify / commit
    state machine in ``step_machine.StepMachine``, the metrics publishing in ``step_metrics.StepMetrics``."""
    replay: ReplayStatePool | None = None
    last_metadata = None  # the backend metadata object whose step was last noted
    step_slots = None     # (SGLang's index tensor, our int32 slots) of this step's layers (backends._slots)

    def __init__(self, *, size, spec_state_size, cache_params, mamba_layer_ids, device,
                 enable_memory_saver=False, speculative_num_draft_tokens=None, speculative_eagle_topk=None,
                 enable_linear_replayssm=False, linear_replayssm_cache_len=16, envelope_layout=False,
                 enable_linear_replayssm_spec=False, **extra):
        opts = active_options()
        family = family_of(cache_params) if opts is not None else None
        if opts is None or family is None or not opts.decode:
            if opts is not None:
                logger.info("ReplaySSM: %s; this mamba pool is SGLang's own", "--no-replayssm-decode given"
                            if opts.decode is False else "layers are not Mamba-2 / GDN / KDA")
            super().__init__(size=size, spec_state_size=spec_state_size, cache_params=cache_params,
                             mamba_layer_ids=mamba_layer_ids, device=device,
                             enable_memory_saver=enable_memory_saver,
                             speculative_num_draft_tokens=speculative_num_draft_tokens,
                             speculative_eagle_topk=speculative_eagle_topk,
                             enable_linear_replayssm=enable_linear_replayssm,
                             linear_replayssm_cache_len=linear_replayssm_cache_len,
                             envelope_layout=envelope_layout,
                             enable_linear_replayssm_spec=enable_linear_replayssm_spec, **extra)
            return
        if enable_linear_replayssm or enable_linear_replayssm_spec:
            flag = "--enable-linear-replayssm" if enable_linear_replayssm else "--enable-linear-replayssm-spec"
            raise FlagError(flag, "SGLang's built-in linear ReplaySSM cannot run together with the "
                                  "sglang-replayssm plugin's --replayssm-* flags: use one of them")
        if envelope_layout:
            raise FlagError("--enable-page-major-kv-layout",
                            "the page-major envelope layout of the mamba pool is not supported with --replayssm-*")
        drafts = int(speculative_num_draft_tokens or 0)
        if drafts and not opts.verify:
            raise FlagError("--no-replayssm-verify",
                            "speculative decoding with ReplaySSM decode needs --replayssm-verify (SGLang's "
                            "snapshot verify reads the full state, which a ReplaySSM slot keeps as checkpoint + ring)")
        self._init_replay(opts, family, size=size, spec_state_size=spec_state_size, cache_params=cache_params,
                          mamba_layer_ids=mamba_layer_ids, device=device, drafts=drafts,
                          linear_replayssm_cache_len=linear_replayssm_cache_len,
                          enable_memory_saver=enable_memory_saver)

    # ------------------------------------------------------------------ construction
    def _init_replay(self, opts, family, *, size, spec_state_size, cache_params, mamba_layer_ids, device,
                     drafts, linear_replayssm_cache_len, enable_memory_saver):
        from sglang.srt.utils.torch_memory_saver_adapter import TorchMemorySaverAdapter

        opts.check_model(cache_params.shape.temporal[2])
        self.memory_saver_adapter = TorchMemorySaverAdapter.create(enable=enable_memory_saver)
        self.family = family
        self.options = opts
        self.mamba_layer_ids = list(mamba_layer_ids)
        self.num_mamba_layers = nl = len(mamba_layer_ids)
        self.size = size
        self.device = device
        # SGLang's MambaPool fields, its own linear ReplaySSM's off (the plugin refuses it)
        self.debug_memory_pool = self.enable_linear_replayssm = self.enable_linear_replayssm_spec = False
        self.linear_replayssm_cache_len = linear_replayssm_cache_len
        self.replayssm_spec_fold = self.replayssm_is_kda = False
        self.replayssm_write_pos = self.replayssm_spec_write_pos = self.replayssm_cache_base = None
        self.replayssm_is_flush = None
        self.enable_custom_mem_pool, self.custom_mem_pool = False, None
        self.conv_shard_groups = getattr(cache_params.shape, "conv_shard_groups", None)
        self.conv_slice_axis = getattr(cache_params.shape, "conv_slice_axis", 0)
        self.draft_tokens = drafts
        self.geometry = geometry_of(family, cache_params)
        cfg = opts.replay_config(max_drafts=drafts, family=family, device=device)
        ops = FamilyOps.select(family, device, ops_backend())
        self.replay = ReplayStatePool(self.geometry, nl, size, cfg, device=device, act_dtype=cache_params.dtype.conv,
                                      ops=ops)
        self.replay.alloc(size)  # SGLang's MambaSlotAllocator hands slots out; ours are all "in use"
        self._stagger = FlushStagger(self.replay, size + 1)
        conv_dtype = cache_params.dtype.conv
        conv = [torch.zeros((nl, size + 1) + tuple(shape), dtype=conv_dtype, device=device)
                for shape in cache_params.shape.conv]
        temporal = self.replay.ckpt
        if drafts:
            # Dense per-draft conv windows: SGLang's conv kernels write them during verify and the
            # commit rolls the conv state back from them. No intermediate_ssm.
            windows = [torch.zeros((nl, spec_state_size + 1, drafts) + tuple(shape), dtype=conv_dtype, device=device)
                       for shape in cache_params.shape.conv]
            self._intermediate_conv_window_phys = windows
            # intermediate_ssm: an empty placeholder (0 bytes), because SGLang's verify paths assert the
            # field is not None before calling the (hooked) verify kernel, which never reads it.
            empty = torch.zeros((nl, 0), dtype=temporal.dtype, device=device)
            self.mamba_cache = self.SpeculativeState(conv=conv, temporal=temporal, intermediate_ssm=empty,
                                                     intermediate_conv_window=windows)
        else:
            self._intermediate_conv_window_phys = []
            self.mamba_cache = self.State(conv=conv, temporal=temporal)
        for layer in range(nl):
            _LAYER_VIEWS[temporal[layer].data_ptr()] = (weakref.ref(self), layer)
        _POOLS.add(self)
        metrics.metrics()   # every replayssm: family exported from the start
        self._pending_decode: torch.Tensor | None = None
        self._pending_track: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._steps_since_metrics = 0
        self._metrics_interval = max(1, int(os.environ.get(METRICS_INTERVAL_ENV, "16")))
        self._acc = torch.zeros(len(STEP_COUNTS), dtype=torch.int64, device=device)   # metrics counts (below)
        self._acc_host: torch.Tensor | None = None     # pinned host copy of _acc (CUDA)
        self._acc_copy = None                          # (host buffer, event) of a queued copy not yet published
        self._ssm_itemsize = cache_params.dtype.temporal.itemsize
        ours = self.replay.bytes_per_slot() + sum(_tensor_bytes(c[:, 0]) for c in conv)
        theirs_slot = cache_params.mamba_cache_per_req
        theirs_spec = drafts * nl * cache_params.shape.temporal[0] * cache_params.shape.temporal[1] \
            * cache_params.shape.temporal[2] * self._ssm_itemsize
        self.mem_usage = (ours * (size + 1) + _tensor_bytes(self._intermediate_conv_window_phys)) / (1 << 30)
        metrics.set_gauge("replayssm:slot_bytes", ours)
        reserved = running_request_bytes(cache_params, family, ours)
        for name, value in (reserved or {}).items():
            metrics.set_gauge(name, value)
        budget = (size + 1) * (theirs_slot + theirs_spec)
        logger.info(
            "ReplaySSM mamba pool (%s, %d layers, window %d, ckpt %s, read copy %s, %d draft tokens, ops %s), per TP "
            "rank (%s: %d SSM heads per layer on this rank): %d bytes/slot vs SGLang %d bytes/slot + %d bytes/slot of "
            "per-draft snapshots; in this rank's SGLang memory for %d sequences ReplaySSM fits %d",
            family, nl, cfg.window, cfg.ckpt, cfg.read_copy, drafts, ops.package, tp_rank_label(),
            self.geometry.num_heads, ours, theirs_slot, theirs_spec, size, budget // max(ours, 1) - 1)
        if reserved:
            logger.info("ReplaySSM: SSM state bytes reserved per running request on this rank: %d (this server), %d "
                        "(stock SGLang, extra_buffer with overlap), %d (SGLang --enable-linear-replayssm, no_buffer)",
                        *reserved.values())

    # ------------------------------------------------------------------ SGLang's slot operations
    @sync_checked
    def clear_slots(self, indices: torch.Tensor):
        if self.replay is None:
            return super().clear_slots(indices)
        for sibling in self._slot_siblings:
            sibling.reset_slots(indices)
        idx64 = indices.reshape(-1).to(torch.int64)
        for conv in self.mamba_cache.conv:
            conv.index_fill_(1, idx64, 0)
        self.replay.reset_rows(idx64)

    @sync_checked
    def copy_from(self, src_indices: torch.Tensor, dst_indices: torch.Tensor):
        """Copy-on-write of a cached prefix: fold the source's committed records (flush at the cached
        boundary), then fork checkpoint + read copy (+ empty ring) into the destination. Device ops."""
        if self.replay is None:
            return super().copy_from(src_indices, dst_indices)
        src, dst = src_indices.reshape(-1), dst_indices.reshape(-1)
        if src.shape != dst.shape:
            raise ValueError(f"copy_from: {src.numel()} sources for {dst.numel()} destinations")
        self.replay.flush_rows(src)
        self.replay.copy_slots(src.to(torch.long), dst.to(device=src.device, dtype=torch.long))
        for conv in self.mamba_cache.conv:
            conv[:, dst_indices] = conv[:, src_indices]
        for sibling in self._slot_siblings:
            sibling.copy_slots(src_indices, dst_indices)

    def get_cpu_copy(self, indices):
        """HiCache backup: the copy holds whole states (records folded first, on the device)."""
        if self.replay is not None:
            self.replay.flush_rows(torch.as_tensor(indices, device=self.replay.device).reshape(-1))
        return super().get_cpu_copy(indices)

    def load_cpu_copy(self, mamba_cache_cpu, indices):
        super().load_cpu_copy(mamba_cache_cpu, indices)
        if self.replay is not None:
            for layer in range(self.num_mamba_layers):
                self.after_prefill(layer, indices)

    def get_kv_size_bytes(self):
        if self.replay is None:
            return super().get_kv_size_bytes()
        return (self.replay.bytes_per_slot() * (self.size + 1) + _tensor_bytes(self.mamba_cache.conv)
                + _tensor_bytes(self._intermediate_conv_window_phys))

    def materialize(self, layer: int, slots) -> torch.Tensor:
        """Full fp32 state of slots (checkpoint + committed records), for tests and debugging."""
        return self.replay.materialize(layer, [int(s) for s in slots])
