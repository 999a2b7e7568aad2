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
    if pool.rec_v is not None:   # a delta family's raw inputs, which its exact fold replays
        pool.rec_v.copy_(torch.randn(pool.rec_v.shape, generator=gen).to(pool.rec_v))
        pool.rec_beta.copy_(torch.rand(pool.rec_beta.shape, generator=gen).to(pool.rec_beta))
    pool.cursor.copy_(torch.randint(0, window, (pool.cursor.numel(),), generator=gen, dtype=torch.int32))
    pool.folded.copy_(torch.randint(0, 1000, (pool.folded.numel(),), generator=gen))
    return pool


def clone_pool(pool):
    return copy.deepcopy(pool)


TENSORS = ("ckpt", "rc", "rc_scale", "rc_gscale", "rec_d", "rec_k", "rec_g", "rec_v", "rec_beta", "cursor", "folded")


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


def read_tol(ckpt):
    """The tolerance of values read from a checkpoint of precision ``ckpt`` (its entries, the outputs of a step
    reading it) against the reference: an fp16-sr entry may round to the other neighbour on a GPU, whose fp32
    arithmetic before the stochastic rounding differs from the reference's in the last bits (one fp16 ulp,
    2**-11 relative; seen on the H200 in one Mamba-2 output of 192)."""
    return dict(rtol=2e-3, atol=2e-3) if ckpt == "fp16-sr" else dict(rtol=2e-4, atol=2e-5)


def compare_pools(pk, pr, layer, read_copy, ckpt):
    if ckpt == "fp16-sr":
        same = (pk.ckpt[layer] == pr.ckpt[layer]).float().mean().item()
        assert same > 0.995, f"only {same:.4f} of fp16-sr checkpoint entries bit-equal"
    close(pk.ckpt[layer], pr.ckpt[layer], **read_tol(ckpt))
    if read_copy == "nvfp4":
        from sglang_replayssm.reference.quant import dequant_nvfp4
        same = (pk.rc[layer] == pr.rc[layer]).float().mean().item()
        assert same > 0.98, f"only {same:.4f} of nvfp4 code bytes equal"
        dk = dequant_nvfp4(pk.rc[layer], pk.rc_scale[layer], pk.rc_gscale[layer])
        dr = dequant_nvfp4(pr.rc[layer], pr.rc_scale[layer], pr.rc_gscale[layer])
        close(pk.rc_gscale[layer], pr.rc_gscale[layer])
        assert ((dk - dr).abs() > 1e-5).float().mean().item() < 0.02
    if read_copy == "fp8":
        same = (pk.rc[layer].view(torch.uint8) == pr.rc[layer].view(torch.uint8)).float().mean().item()
        assert same > 0.99, f"only {same:.4f} of fp8 codes equal"
        close(pk.rc[layer].float() * pk.rc_scale[layer][..., None], pr.rc[layer].float() * pr.rc_scale[layer][..., None],
              rtol=0.07, atol=1e-3)
    close(pk.rec_d[layer], pr.rec_d[layer])
    close(pk.rec_k[layer], pr.rec_k[layer])
    close(pk.rec_g[layer], pr.rec_g[layer])
    if pr.rec_v is not None:
        close(pk.rec_v[layer], pr.rec_v[layer])
        close(pk.rec_beta[layer], pr.rec_beta[layer])
