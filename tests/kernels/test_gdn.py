"""GDN Triton kernels vs the PyTorch reference (CPU: Triton interpreter)."""
import pytest
import torch

from sglang_replayssm.family_ops import FamilyOps
from sglang_replayssm.kernels import gdn as kgdn
from sglang_replayssm.kernels.tuning import KernelTuning
from sglang_replayssm.reference import gdn as rgdn

from .helpers import (DEV, assert_untouched, clone_pool, close, compare_pools, make_pool, projection_views,
                      read_tol, snapshot)


def inputs(g, B, H, Hk, Dv, Dk, T=None, dtype=torch.float32, views=False):
    """views: q, k, v as SGLang's split views of one projection (the kernels read them by token rows)."""
    lead = (B,) if T is None else (B, T)
    r = lambda *s: torch.randn(*s, generator=g).to(DEV, dtype)
    if views:
        qkv = projection_views(g, lead, dict(q=(Hk, Dk), k=(Hk, Dk), v=(H, Dv)), dtype)
        assert not any(t.is_contiguous() for t in qkv.values())
        return dict(**qkv, a=r(*lead, H), b=r(*lead, H))
    return dict(q=r(*lead, Hk, Dk), k=r(*lead, Hk, Dk), v=r(*lead, H, Dv), a=r(*lead, H), b=r(*lead, H))


def params(g, H):
    return dict(A_log=(torch.randn(H, generator=g) * 0.5).to(DEV), dt_bias=(torch.randn(H, generator=g) * 0.5).to(DEV))


@pytest.mark.parametrize("read_copy,ckpt,warps,stages,method", [
    ("none", "fp32", 4, None, "fused"), ("fp8", "fp32", 1, 2, "fused"), ("none", "fp16-sr", 1, None, "fused"),
    ("nvfp4", "fp32", 1, None, "fused"), ("none", "fp32", 1, None, "split"), ("fp8", "fp16-sr", 4, 2, "split"),
    ("nvfp4", "fp32", 2, None, "split")])
def test_decode_window_crossing_flushes(read_copy, ckpt, warps, stages, method):
    """warps picks the per-chunk-reduce (1-2 warps) or the accumulate (>= 4 warps) variant; stages
    the software-pipelined state loop (the same results)."""
    g = torch.Generator().manual_seed(1)
    pk = make_pool("gdn", read_copy=read_copy, ckpt=ckpt, gen=g)
    pr = clone_pool(pk)
    H, Dv, Dk = pk.geo.state_shape
    Hk = pk.geo.num_k_heads
    par = params(g, H)
    slots = torch.tensor([4, 2, 5, 1, 0], dtype=torch.int32, device=DEV)  # slot 3, 6 untouched, 0 = padding
    layer = 1
    flushes = 0
    for step in range(6):  # window 4: every row crosses at least one flush
        before = snapshot(pk)
        flushes += int(((pk.cursor[slots[:-1].long()] + 1) == pk.cfg.window).sum())
        x = inputs(g, 5, H, Hk, Dv, Dk, views=step % 2 == 0)   # SGLang's views and contiguous inputs
        ok = kgdn.decode(pk, layer, slots, **x, **par, method=method,
                         tuning=KernelTuning(num_warps=warps, stages=stages,
                                             flush_block_k=16 if read_copy == "fp8" else None))
        orf = rgdn.decode(pr, layer, slots, **x, **par)
        close(ok[:-1], orf[:-1], **read_tol(ckpt))
        compare_pools(pk, pr, layer, read_copy, ckpt)
        assert_untouched(before, pk, slots.tolist())
        assert torch.equal(pk.ckpt[0], before["ckpt"][0])  # other layer untouched
        pk.advance(slots)
        pr.advance(slots)
        assert torch.equal(pk.cursor, pr.cursor) and torch.equal(pk.folded, pr.folded)
    assert flushes >= 4


def test_decode_bf16_inputs_and_out_dtype():
    g = torch.Generator().manual_seed(2)
    pk = make_pool("gdn", gen=g)
    pr = clone_pool(pk)
    H, Dv, Dk = pk.geo.state_shape
    slots = torch.tensor([3, 6, 1], dtype=torch.int32, device=DEV)
    x = inputs(g, 3, H, 2, Dv, Dk, dtype=torch.bfloat16)
    par = params(g, H)
    ok = kgdn.decode(pk, 0, slots, **x, **par)
    assert ok.dtype == torch.bfloat16
    orf = rgdn.decode(pr, 0, slots, **x, **par)
    close(ok, orf, rtol=1e-2, atol=1e-2)


def test_conventional_decode():
    g = torch.Generator().manual_seed(3)
    H, Hk, Dv, Dk = 4, 2, 32, 16
    state = torch.randn(7, H, Dv, Dk, generator=g).to(DEV)
    before = state.clone()
    slots = torch.tensor([5, 2, 0, 6], dtype=torch.int32, device=DEV)
    x = inputs(g, 4, H, Hk, Dv, Dk, views=True)
    par = params(g, H)
    out = kgdn.conventional_decode(state, slots, **x, **par)
    ro, rs = rgdn.conventional_step(before[slots.long()], **x, **par)
    close(out[[0, 1, 3]], ro[[0, 1, 3]])
    close(state[[5, 2, 6]], rs[[0, 1, 3]])
    for s in (1, 3, 4):
        assert torch.equal(state[s], before[s])


@pytest.mark.parametrize("tree,read_copy,method,dk", [
    (False, "none", "fma", None), (True, "none", "fma", None), (False, "fp8", "fma", None), (True, "nvfp4", "fma", None),
    # Dk 32 / 64 with the mma launch: one-wave grids, so 32-column chunks (1 / 2 of them)
    (True, "fp8", "mma", None), (False, "none", "mma", 32), (True, "none", "mma", 64),
    (False, "none", "split", None), (True, "fp8", "split", None)])
def test_verify_then_commit(tree, read_copy, method, dk):
    g = torch.Generator().manual_seed(4 + tree)
    pk = make_pool("gdn", read_copy=read_copy, gen=g, max_drafts=4, head_k_dim=dk)
    pr = clone_pool(pk)
    H, Dv, Dk = pk.geo.state_shape
    Hk = pk.geo.num_k_heads
    par = params(g, H)
    slots_l = [6, 1, 4, 3]
    slots = torch.tensor(slots_l + [0], dtype=torch.int32, device=DEV)
    T = 4
    x = inputs(g, 5, H, Hk, Dv, Dk, T=T, views=method != "fma" or tree)
    parents = None
    if tree:
        trees = [[-1, 0, 0, 1], [-1, -1, 1, 2], [-1, 0, 1, 2], [-1, 0, 0, 2], [-1, 0, 1, 2]]
        parents = torch.tensor(trees, dtype=torch.int32, device=DEV)
    for p in (pk, pr):
        p.begin_verify(slots_l, T, None if parents is None else parents[:4].tolist())
    before = snapshot(pk)
    ok = kgdn.verify(pk, 1, slots, **x, **par, parents=parents, method=method)
    orf = rgdn.verify(pr, 1, slots, **x, **par, parents=parents)
    close(ok[:4], orf[:4], rtol=5e-4, atol=5e-5)
    close(pk.rec_d, pr.rec_d, rtol=5e-4, atol=5e-5)
    close(pk.rec_k, pr.rec_k)
    close(pk.rec_g, pr.rec_g)
    assert_untouched(before, pk, slots_l)
    assert torch.equal(pk.ckpt.view(torch.uint8), before["ckpt"].view(torch.uint8))  # verify writes no state
    # commit random accepted lengths (tree: root-to-node paths), folding with the kernel
    acc = torch.randint(0, T + 1, (4,), generator=g).tolist()
    paths = None
    if tree:
        paths = []
        for i, a in enumerate(acc):
            path = []
            leaves = [n for n in range(T)]
            # pick the deepest node of depth a if any, else shorten
            depth = {}
            for n in range(T):
                p_ = trees[i][n]
                depth[n] = 1 if p_ < 0 else depth[p_] + 1
            cands = [n for n in leaves if depth[n] == a]
            if not cands:
                acc[i], path = 0, []
            else:
                n = cands[-1]
                while n >= 0:
                    path.insert(0, n)
                    n = trees[i][n]
            paths.append(path)
    pk.ops = FamilyOps.triton("gdn")   # pk's commit folds with the kernel, pr's with the reference
    pk.accept_drafts(slots_l, acc, paths)
    pr.accept_drafts(slots_l, acc, paths)
    assert torch.equal(pk.cursor, pr.cursor) and torch.equal(pk.folded, pr.folded)
    close(pk.ckpt, pr.ckpt, rtol=5e-4, atol=5e-5)
    if read_copy == "fp8":
        close(pk.rc.float() * pk.rc_scale[..., None], pr.rc.float() * pr.rc_scale[..., None], rtol=0.07, atol=1e-3)
    if read_copy == "nvfp4":
        assert (pk.rc == pr.rc).float().mean().item() > 0.98
        close(pk.rc_gscale, pr.rc_gscale)
    # the committed state decodes the same next token
    x1 = inputs(g, 5, H, Hk, Dv, Dk)
    close(kgdn.decode(pk, 1, slots, **x1, **par)[:4], rgdn.decode(pr, 1, slots, **x1, **par)[:4],
          rtol=5e-4, atol=5e-5)


def test_fold_counts_zero_is_noop_and_lists_accepted():
    g = torch.Generator().manual_seed(7)
    pk = make_pool("gdn", gen=g, read_copy="fp8")
    before = snapshot(pk)
    kgdn.fold(pk, 0, [2, 3], [0, 0])
    for n, t in before.items():
        assert torch.equal(getattr(pk, n).view(torch.uint8) if getattr(pk, n).dtype.is_floating_point else getattr(pk, n),
                           t.view(torch.uint8) if t.dtype.is_floating_point else t), n


def test_wrapper_errors():
    g = torch.Generator().manual_seed(8)
    pk = make_pool("gdn", gen=g)
    H, Dv, Dk = pk.geo.state_shape
    x = inputs(g, 2, H, 2, Dv, Dk)
    par = params(g, H)
    with pytest.raises(ValueError, match="slots"):
        kgdn.decode(pk, 0, torch.tensor([1, 2], dtype=torch.int64, device=DEV), **x, **par)
    with pytest.raises(ValueError, match="q must have shape"):
        kgdn.decode(pk, 0, torch.tensor([1, 2], dtype=torch.int32, device=DEV), **{**x, "q": x["q"][:, :1]}, **par)
    with pytest.raises(ValueError, match="layer"):
        kgdn.decode(pk, 5, torch.tensor([1, 2], dtype=torch.int32, device=DEV), **x, **par)
    with pytest.raises(ValueError, match="stages must be None or an int >= 2, got 1"):
        kgdn.decode(pk, 0, torch.tensor([1, 2], dtype=torch.int32, device=DEV), **x, **par, tuning=KernelTuning(stages=1))
    with pytest.raises(ValueError, match="flush_block_k must be None or a power of 2 >= 16 dividing"):
        kgdn.decode(pk, 0, torch.tensor([1, 2], dtype=torch.int32, device=DEV), **x, **par, tuning=KernelTuning(flush_block_k=24))
    with pytest.raises(ValueError, match="block_k must be None or a power of 2 >= 16 dividing head_k_dim"):
        kgdn.decode(pk, 0, torch.tensor([1, 2], dtype=torch.int32, device=DEV), **x, **par, tuning=KernelTuning(block_k=48))
    with pytest.raises(ValueError, match="flush_warps must be None or a power of 2 in 1..16, got 3"):
        kgdn.decode(pk, 0, torch.tensor([1, 2], dtype=torch.int32, device=DEV), **x, **par, method="split",
                    tuning=KernelTuning(flush_warps=3))
    with pytest.raises(ValueError, match="verify"):
        kgdn.verify(pk, 0, torch.tensor([1, 2], dtype=torch.int32, device=DEV), **x, **par)
