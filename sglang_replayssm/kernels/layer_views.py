"""The pool tensors of one SSM layer as the kernels see them (views, no copies), built once per pool layer."""
from __future__ import annotations

import torch

from ..state_formats import READ_COPY_CODES
from .constants import RC_FP8, RC_NONE, RC_NVFP4

class LayerViews:
    """The pool tensors of one SSM layer (views, no copies) plus the config the kernels need."""

    def __init__(self, pool, layer: int):
        cfg = pool.cfg
        if getattr(cfg, "mode", "replay") != "replay":
            raise ValueError(f"ReplaySSM kernels need a pool in mode='replay', got mode={cfg.mode!r} "
                             "(use conventional_decode on pool.ckpt[layer])")
        if pool.ckpt.dtype not in (torch.float32, torch.float16):
            raise ValueError(f"kernels support ckpt 'fp32' and 'fp16-sr', got checkpoint dtype {pool.ckpt.dtype}")
        nl = pool.ckpt.shape[0]
        if not (0 <= int(layer) < nl):
            raise ValueError(f"layer must be in [0, {nl}), got {layer}")
        self.layer = int(layer)
        self.family = pool.geo.family
        self.ckpt = pool.ckpt[layer]
        self.rec_d = pool.rec_d[layer]
        self.rec_k = pool.rec_k[layer]
        self.rec_g = pool.rec_g[layer]
        # a delta family's raw inputs, replayed by its exact fold (delta_fold.py); None for Mamba-2 and without a
        # read copy (ReplayConfig.folds_exactly), where the kernels fold the stored d's
        rec_v = getattr(pool, "rec_v", None)
        self.rec_v = rec_v[layer] if rec_v is not None else None
        self.rec_beta = pool.rec_beta[layer] if rec_v is not None else None
        self.cursor = pool.cursor
        self.folded = pool.folded
        self.window = int(cfg.window)
        self.R = int(self.rec_d.shape[1])
        self.num_slots = int(self.ckpt.shape[0])
        rc_mode = getattr(cfg, "read_copy", "none")
        self.rc_mode = READ_COPY_CODES[rc_mode]
        self.rc = pool.rc[layer] if self.rc_mode != RC_NONE else None
        self.rc_scale = pool.rc_scale[layer] if self.rc_mode != RC_NONE else None
        self.rc_gscale = pool.rc_gscale[layer] if self.rc_mode == RC_NVFP4 else None
        self.ckpt_sr = getattr(cfg, "ckpt", "fp32") == "fp16-sr"
        self.shared_quant = bool(getattr(cfg, "shared_quant", False))
        self.seed = int(getattr(cfg, "sr_seed", 0))
        H, Dv, Dk = self.ckpt.shape[1:]
        self.H, self.Dv, self.Dk = int(H), int(Dv), int(Dk)
        self.Hk = int(self.rec_k.shape[2])
        self.device = self.ckpt.device

    def rc_args(self):
        """(rc, rc_scale, rc_gscale) pointers; dummies (the ckpt) where the mode has none."""
        if self.rc_mode == RC_NONE:
            return self.ckpt, self.ckpt, self.ckpt
        if self.rc_mode == RC_FP8:
            return self.rc, self.rc_scale, self.rc_scale
        return self.rc, self.rc_scale, self.rc_gscale


def layer_views(pool, layer: int) -> LayerViews:
    """LayerViews(pool, layer), kept on the pool: the wrappers look the views up on every call (once per SSM layer
    per step, on the host's critical path). A pool allocates its tensors once, in its constructor, beside its
    config; a pool whose checkpoint or config is another object (a clone) gets new views."""
    cache = getattr(pool, "_kernel_layer_views", None)
    if cache is None or cache[0] is not pool.ckpt or cache[1] is not pool.cfg:
        cache = (pool.ckpt, pool.cfg, {})
        try:
            pool._kernel_layer_views = cache
        except AttributeError:   # a pool-like object that takes no attributes: no cache
            return LayerViews(pool, layer)
    views = cache[2].get(layer)
    if views is None:
        views = cache[2][layer] = LayerViews(pool, layer)
    return views
