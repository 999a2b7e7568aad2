"""Shared test helpers: a randomized pool and a bit-for-bit clone, for kernel-vs-reference tests."""
import copy

import torch

from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry

DEV = "cuda" if torch.cuda.is_available() else "cpu"

GEOS = {
    "gdn": dict(family="gdn", num_heads=4, head_v_dim=32, head_k_dim=16, num_k_heads=2),
    "mamba2": dict(family="mamba2", num_heads=4, head_v_dim=16, head_k_dim=32, num_k_heads=2),
    "kda": dict(family="kda", num_heads=4, head_v_dim=16, head_k_dim=32, num_k_heads=2),
}


def projection_views(g, lead, parts: dict, dtype=torch.float32, pad: int = 3) -> dict:
    """Token inputs as SGLang hands them out: views of one projection [*lead, sum of the parts + pad] split along
    its last dim, so each input's token rows are a projection row apart (not contiguous). parts: name -> the
    trailing shape ((heads, dim) or (heads,)); returns name -> view [*lead, *shape]."""
    sizes = [int(torch.Size(shape).numel()) for shape in parts.values()]
    proj = torch.randn(*lead, sum(sizes) + pad, generator=g).to(DEV, dtype)
    views = torch.split(proj, sizes + [pad], dim=-1)
    return {name: v.view(*lead, *shape) for (name, shape), v in zip(parts.items(), views)}


def make_pool(family, *, window=4, max_drafts=3, num_slots=6, num_layers=2, gen=None, head_k_dim=None,
              head_v_dim=None, **cfg):
    dims = {k: v for k, v in (("head_k_dim", head_k_dim), ("head_v_dim", head_v_dim)) if v}
    geo = SSMGeometry(**{**GEOS[family], **dims})
    pool = ReplayStatePool(geo, num_layers, num_slots, ReplayConfig(window=window, max_drafts=max_drafts, **cfg),
                           device=DEV)
    slots = pool.alloc(num_slots)
    H, Dv, Dk = geo.state_shape
    for layer in range(num_layers):
        st = torch.randn(num_slots, H, Dv, Dk, generator=gen).to(DEV) * 0.5
        pool.write_state(layer, slots, st)
    # random committed records and cursors
    pool.rec_d.copy_(torch.randn(pool.rec_d.shape, generator=gen).to(pool.rec_d))
    k = torch.randn(pool.rec_k.shape, generator=gen)
    if family != "mamba2":
        k = torch.nn.functional.normalize(k, dim=-1)
    pool.rec_k.copy_(k.to(pool.rec_k))
    pool.rec_g.copy_((-torch.rand(pool.rec_g.shape, generator=gen) * 0.4).to(pool.rec_g))
    pool.cursor.copy_(torch.randint(0, window, (pool.cursor.numel(),), generator=gen, dtype=torch.int32))
    pool.folded.copy_(torch.randint(0, 1000, (pool.folded.numel(),), generator=gen))
    return pool


def clone_pool(pool):
    return copy.deepcopy(pool)


TENSORS = ("ckpt", "rc", "rc_scale", "rc_gscale", "rec_d", "rec_k", "rec_g", "cursor", "folded")


def snapshot(pool):
    return {n: getattr(pool, n).clone() for n in TENSORS if getattr(pool, n) is not None}


def assert_untouched(before, pool, slots_touched):
    """Every slot outside slots_touched (and the padding slot 0) is bit-identical to before."""
    keep = [s for s in range(pool.ckpt.shape[1]) if s not in set(slots_touched) | {0}]
    idx = torch.tensor(keep, device=pool.ckpt.device)
    for n, t in before.items():
        now = getattr(pool, n)
        if n in ("cursor", "folded"):
            assert torch.equal(now[idx], t[idx]), n
        else:
            assert torch.equal(now[:, idx].view(torch.uint8), t[:, idx].view(torch.uint8)), n


def close(a, b, rtol=2e-4, atol=2e-5):
    torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=atol)
