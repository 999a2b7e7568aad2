"""KDA Triton kernels vs the PyTorch reference (CPU: Triton interpreter)."""
import pytest
import torch

from sglang_replayssm.family_ops import FamilyOps
from sglang_replayssm.kernels import kda as kkda
from sglang_replayssm.kernels.tuning import KernelTuning
from sglang_replayssm.reference import kda as rkda

from .helpers import (DEV, assert_untouched, clone_pool, close, compare_pools, make_pool, projection_views,
                      read_tol, snapshot)


def inputs(g, B, H, Hk, Dv, Dk, T=None, views=False):
    """views: q, k, v as split views of one projection, as SGLang hands them out (read by token rows)."""
    lead = (B,) if T is None else (B, T)
    r = lambda *s: torch.randn(*s, generator=g).to(DEV)
    if views:
        qkv = projection_views(g, lead, dict(q=(Hk, Dk), k=(Hk, Dk), v=(H, Dv)))
        assert not any(t.is_contiguous() for t in qkv.values())
        return dict(**qkv, a=r(*lead, H, Dk), b=r(*lead, H))
    return dict(q=r(*lead, Hk, Dk), k=r(*lead, Hk, Dk), v=r(*lead, H, Dv), a=r(*lead, H, Dk), b=r(*lead, H))


def params(g, H, Dk):
    return dict(A_log=(torch.randn(H, generator=g) * 0.5).to(DEV), dt_bias=(torch.randn(H, Dk, generator=g) * 0.5).to(DEV))


@pytest.mark.parametrize("read_copy,ckpt,shared,stages,method", [
    ("none", "fp32", False, None, "fused"), ("fp8", "fp32", False, 2, "fused"), ("none", "fp16-sr", False, None, "fused"),
    ("nvfp4", "fp32", False, None, "fused"), ("nvfp4", "fp16-sr", False, None, "fused"),
    ("nvfp4", "fp32", True, None, "fused"),
    ("none", "fp32", False, None, "split"), ("fp8", "fp32", False, 2, "split"), ("nvfp4", "fp16-sr", False, None, "split")])
def test_decode_window_crossing_flushes(read_copy, ckpt, shared, stages, method):
    g = torch.Generator().manual_seed(21)
    pk = make_pool("kda", read_copy=read_copy, ckpt=ckpt, shared_quant=shared, gen=g)
    pr = clone_pool(pk)
    H, Dv, Dk = pk.geo.state_shape
    Hk = pk.geo.num_k_heads
    par = params(g, H, Dk)
    slots = torch.tensor([5, 1, 3, 0], dtype=torch.int32, device=DEV)
    flushes = 0
    for step in range(6):
        before = snapshot(pk)
        flushes += int(((pk.cursor[slots[:-1].long()] + 1) == pk.cfg.window).sum())
        x = inputs(g, 4, H, Hk, Dv, Dk, views=step % 2 == 0)   # SGLang's views and contiguous inputs
        ok = kkda.decode(pk, 1, slots, **x, **par, method=method,
                         tuning=KernelTuning(stages=stages, flush_block_k=Dk if read_copy == "fp8" else None))
        orf = rkda.decode(pr, 1, slots, **x, **par)
        close(ok[:-1], orf[:-1], **read_tol(ckpt))
        compare_pools(pk, pr, 1, read_copy, ckpt)
        assert_untouched(before, pk, slots.tolist())
        pk.advance(slots)
        pr.advance(slots)
    assert flushes >= 3


@pytest.mark.parametrize("read_copy", ["fp8", "nvfp4"])
def test_fold_matches_reference(read_copy):
    g = torch.Generator().manual_seed(22)
    pk = make_pool("kda", read_copy=read_copy, gen=g)
    pr = clone_pool(pk)
    before = snapshot(pk)
    kkda.fold(pk, 0, [2, 4, 6], [3, 0, 5])
    from sglang_replayssm.reference.replay import fold_rows
    fold_rows(pr, 0, [2, 6], [3, 5])
    compare_pools(pk, pr, 0, read_copy, "fp32")
    assert_untouched(before, pk, [2, 6])  # counts 0 (slot 4) is a no-op


def test_conventional_decode():
    g = torch.Generator().manual_seed(23)
    H, Hk, Dv, Dk = 4, 2, 16, 32
    state = torch.randn(6, H, Dv, Dk, generator=g).to(DEV)
    before = state.clone()
    slots = torch.tensor([3, 0, 5], dtype=torch.int32, device=DEV)
    x = inputs(g, 3, H, Hk, Dv, Dk, views=True)
    par = params(g, H, Dk)
    out = kkda.conventional_decode(state, slots, **x, **par)
    ro, rs = rkda.conventional_step(before[slots.long()], **x, **par)
    close(out[[0, 2]], ro[[0, 2]])
    close(state[[3, 5]], rs[[0, 2]])
    for s in (1, 2, 4):
        assert torch.equal(state[s], before[s])


@pytest.mark.parametrize("tree,read_copy,method,dk,T", [
    (False, "none", "fma", None, 4), (True, "fp8", "fma", None, 4), (False, "nvfp4", "fma", None, 4),
    (True, "nvfp4", "fma", None, 4), (False, "none", "mma", None, 4), (True, "fp8", "mma", None, 4),
    (True, "none", "mma", 64, 4),                         # 4 column chunks (2 at head_k_dim 32)
    (False, "fp8", "mma", None, 1), (False, "none", "mma", None, 2)])   # the stacked operand zero-padded
def test_verify_then_commit(tree, read_copy, method, dk, T):
    from .test_mamba2 import _paths
    g = torch.Generator().manual_seed(24 + tree)
    pk = make_pool("kda", read_copy=read_copy, gen=g, max_drafts=4, head_k_dim=dk)
    pr = clone_pool(pk)
    H, Dv, Dk = pk.geo.state_shape
    Hk = pk.geo.num_k_heads
    par = params(g, H, Dk)
    slots_l = [3, 6, 1]
    slots = torch.tensor(slots_l + [0], dtype=torch.int32, device=DEV)
    x = inputs(g, 4, H, Hk, Dv, Dk, T=T, views=tree or method == "mma")
    trees = [[-1, 0, 0, 1], [-1, -1, 1, 2], [-1, 0, 1, 1], [-1, 0, 1, 2]]
    parents = torch.tensor(trees, dtype=torch.int32, device=DEV) if tree else None
    for p in (pk, pr):
        p.cursor[slots_l[0]] = p.cfg.window - 1  # this row's commit below must fold (window crossed)
        p.begin_verify(slots_l, T, trees[:3] if tree else None)
    before = snapshot(pk)
    ok = kkda.verify(pk, 0, slots, **x, **par, parents=parents, method=method)
    orf = rkda.verify(pr, 0, slots, **x, **par, parents=parents)
    close(ok[:3], orf[:3], rtol=5e-4, atol=5e-5)
    close(pk.rec_d, pr.rec_d, rtol=5e-4, atol=5e-5)
    close(pk.rec_k, pr.rec_k)
    close(pk.rec_g, pr.rec_g)
    assert_untouched(before, pk, slots_l)
    acc = torch.randint(0, T + 1, (3,), generator=g).tolist()
    acc[0] = 3 if tree else T  # the deepest node of trees[0]
    paths = _paths(trees, acc, T) if tree else None
    pk.ops = FamilyOps.triton("kda")   # pk's commit folds with the kernel, pr's with the reference
    pk.accept_drafts(slots_l, acc, paths)
    pr.accept_drafts(slots_l, acc, paths)
    assert torch.equal(pk.cursor, pr.cursor) and torch.equal(pk.folded, pr.folded)
    assert (pk.folded != before["folded"]).any()  # the commit folded at least one row with the kernel
    close(pk.ckpt, pr.ckpt, rtol=5e-4, atol=5e-5)
    if read_copy == "nvfp4":
        assert (pk.rc == pr.rc).float().mean().item() > 0.98
        close(pk.rc_gscale, pr.rc_gscale)
    x1 = inputs(g, 4, H, Hk, Dv, Dk)
    close(kkda.decode(pk, 0, slots, **x1, **par)[:3], rkda.decode(pr, 0, slots, **x1, **par)[:3], rtol=5e-4, atol=5e-5)


def test_verify_method_errors():
    g = torch.Generator().manual_seed(25)
    pk = make_pool("kda", gen=g, max_drafts=4)
    H, Dv, Dk = pk.geo.state_shape
    Hk = pk.geo.num_k_heads
    r = lambda *s: torch.randn(*s, generator=g).to(DEV)
    x = dict(q=r(2, 2, Hk, Dk), k=r(2, 2, Hk, Dk), v=r(2, 2, H, Dv), a=r(2, 2, H, Dk), b=r(2, 2, H))
    slots = torch.tensor([1, 2], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="method must be None, 'fma' or 'mma', got 'split'"):
        kkda.verify(pk, 0, slots, **x, **params(g, H, Dk), method="split")
    with pytest.raises(ValueError, match="stages must be None or an int in 1..4, got 5"):
        kkda.verify(pk, 0, slots, **x, **params(g, H, Dk), method="mma", tuning=KernelTuning(stages=5))
