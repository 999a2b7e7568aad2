"""Mamba-2 Triton kernels vs the PyTorch reference (CPU: Triton interpreter)."""
import pytest
import torch

from sglang_replayssm.family_ops import FamilyOps
from sglang_replayssm.kernels import mamba2 as km2
from sglang_replayssm.kernels.tuning import KernelTuning
from sglang_replayssm.reference import mamba2 as rm2

from .helpers import (DEV, assert_untouched, clone_pool, close, compare_pools, make_pool, projection_views,
                      read_tol, snapshot)


def inputs(g, B, H, G, P, N, z=True, dtype=torch.float32, T=None, views=False):
    """views: x, dt, B, C, z as split views of one projection, as the mixer hands them out (read by token rows)."""
    lead = (B,) if T is None else (B, T)
    if views:
        parts = dict(x=(H, P), dt=(H,), B=(G, N), C=(G, N), z=(H, P))
        out = projection_views(g, lead, parts, dtype)
        assert not any(t.is_contiguous() for t in out.values())
        return {**out, "z": out["z"] if z else None}
    r = lambda *s: torch.randn(*s, generator=g).to(DEV, dtype)
    return dict(x=r(*lead, H, P), dt=r(*lead, H), B=r(*lead, G, N), C=r(*lead, G, N), z=r(*lead, H, P) if z else None)


def params(g, H):
    return dict(A=-(torch.rand(H, generator=g) + 0.1).to(DEV), D=torch.randn(H, generator=g).to(DEV),
                dt_bias=(torch.randn(H, generator=g) * 0.3).to(DEV))


@pytest.mark.parametrize("read_copy,ckpt,z,warps,stages,method", [
    ("none", "fp32", True, 1, 3, "fused"), ("fp8", "fp32", False, 4, None, "fused"),
    ("none", "fp16-sr", True, 1, None, "fused"), ("nvfp4", "fp32", True, 4, None, "fused"),
    ("none", "fp32", True, 1, None, "split"), ("fp8", "fp16-sr", False, 4, 2, "split"),
    ("nvfp4", "fp32", True, 2, None, "split")])
def test_decode_window_crossing_flushes(read_copy, ckpt, z, warps, stages, method):
    g = torch.Generator().manual_seed(11)
    pk = make_pool("mamba2", read_copy=read_copy, ckpt=ckpt, gen=g)
    pr = clone_pool(pk)
    H, P, N = pk.geo.state_shape
    G = pk.geo.num_k_heads
    par = params(g, H)
    slots = torch.tensor([2, 6, 3, 0], dtype=torch.int32, device=DEV)
    layer = 0
    flushes = 0
    for step in range(6):
        before = snapshot(pk)
        flushes += int(((pk.cursor[slots[:-1].long()] + 1) == pk.cfg.window).sum())
        x = inputs(g, 4, H, G, P, N, z=z, views=step % 2 == 0)   # the mixer's views and contiguous inputs
        yk = km2.decode(pk, layer, slots, **x, **par, method=method,
                        tuning=KernelTuning(num_warps=warps, stages=stages,
                                            flush_block_k=16 if read_copy == "fp8" else None))
        yr = rm2.decode(pr, layer, slots, **x, **par)
        close(yk[:-1], yr[:-1], **read_tol(ckpt))
        compare_pools(pk, pr, layer, read_copy, ckpt)
        assert_untouched(before, pk, slots.tolist())
        assert torch.equal(pk.ckpt[1], before["ckpt"][1])
        pk.advance(slots)
        pr.advance(slots)
    assert flushes >= 3


def test_conventional_decode():
    g = torch.Generator().manual_seed(12)
    H, G, P, N = 4, 2, 16, 32
    state = torch.randn(7, H, P, N, generator=g).to(DEV)
    before = state.clone()
    slots = torch.tensor([4, 0, 1], dtype=torch.int32, device=DEV)
    x = inputs(g, 3, H, G, P, N, views=True)
    par = params(g, H)
    out = km2.conventional_decode(state, slots, **x, **par)
    ro, rs = rm2.conventional_step(before[slots.long()], **x, **par)
    close(out[[0, 2]], ro[[0, 2]])
    close(state[[4, 1]], rs[[0, 2]])
    for s in (2, 3, 5, 6):
        assert torch.equal(state[s], before[s])


def test_conventional_mode_pool_dispatches_to_conventional_kernel():
    g = torch.Generator().manual_seed(13)
    from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry
    from .helpers import GEOS
    pool = ReplayStatePool(SSMGeometry(**GEOS["mamba2"]), 1, 4, ReplayConfig(window=4, mode="conventional"), device=DEV)
    pool.alloc(4)
    pool.ckpt.copy_(torch.randn(pool.ckpt.shape, generator=g).to(DEV))
    pr = clone_pool(pool)
    H, P, N = pool.geo.state_shape
    slots = torch.tensor([1, 3], dtype=torch.int32, device=DEV)
    x = inputs(g, 2, H, 2, P, N)
    par = params(g, H)
    close(km2.decode(pool, 0, slots, **x, **par), rm2.decode(pr, 0, slots, **x, **par))
    close(pool.ckpt, pr.ckpt)


def _paths(trees, acc, T):
    """Root-to-node paths of the accepted depth per row (0 when the tree has no node that deep)."""
    paths = []
    for i, a in enumerate(acc):
        depth = {}
        for n in range(T):
            p = trees[i][n]
            depth[n] = 1 if p < 0 else depth[p] + 1
        cands = [n for n in range(T) if depth[n] == a]
        path = []
        if cands:
            n = cands[-1]
            while n >= 0:
                path.insert(0, n)
                n = trees[i][n]
        else:
            acc[i] = 0
        paths.append(path)
    return paths


@pytest.mark.parametrize("tree,read_copy,method", [(False, "none", "fma"), (True, "fp8", "fma"),
                                                  (True, "none", "mma"), (False, "fp8", "mma")])
def test_verify_then_commit(tree, read_copy, method):
    g = torch.Generator().manual_seed(14 + tree)
    pk = make_pool("mamba2", read_copy=read_copy, gen=g, max_drafts=4)
    pr = clone_pool(pk)
    H, P, N = pk.geo.state_shape
    G = pk.geo.num_k_heads
    par = params(g, H)
    slots_l = [5, 2, 6]
    slots = torch.tensor(slots_l + [0], dtype=torch.int32, device=DEV)
    T = 4
    x = inputs(g, 4, H, G, P, N, T=T, views=tree)
    trees = [[-1, 0, 0, 1], [-1, -1, 1, 2], [-1, 0, 1, 1], [-1, 0, 1, 2]]
    parents = torch.tensor(trees, dtype=torch.int32, device=DEV) if tree else None
    for p in (pk, pr):
        p.begin_verify(slots_l, T, trees[:3] if tree else None)
    before = snapshot(pk)
    yk = km2.verify(pk, 0, slots, **x, **par, parents=parents, method=method)
    yr = rm2.verify(pr, 0, slots, **x, **par, parents=parents)
    close(yk[:3], yr[:3], rtol=5e-4, atol=5e-5)
    close(pk.rec_d, pr.rec_d)
    close(pk.rec_k, pr.rec_k)
    close(pk.rec_g, pr.rec_g)
    assert_untouched(before, pk, slots_l)
    acc = torch.randint(0, T + 1, (3,), generator=g).tolist()
    paths = _paths(trees, acc, T) if tree else None
    pk.ops = FamilyOps.triton("mamba2")   # pk's commit folds with the kernel, pr's with the reference
    pk.accept_drafts(slots_l, acc, paths)
    pr.accept_drafts(slots_l, acc, paths)
    assert torch.equal(pk.cursor, pr.cursor) and torch.equal(pk.folded, pr.folded)
    close(pk.ckpt, pr.ckpt, rtol=5e-4, atol=5e-5)
    x1 = inputs(g, 4, H, G, P, N)
    close(km2.decode(pk, 0, slots, **x1, **par)[:3], rm2.decode(pr, 0, slots, **x1, **par)[:3], rtol=5e-4, atol=5e-5)
