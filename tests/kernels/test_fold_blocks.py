"""The commit fold's block knobs (block_v, block_k up to the whole row, num_warps) and the verify
launches' `stages`: every choice gives the reference's result, and bad values are refused by name."""
import pytest
import torch

from sglang_replayssm.kernels import gdn as kgdn, kda as kkda, mamba2 as km2
from sglang_replayssm.kernels.tuning import KernelTuning
from sglang_replayssm.reference import gdn as rgdn, mamba2 as rm2
from sglang_replayssm.reference.replay import fold_rows

from . import test_gdn, test_mamba2
from .helpers import DEV, clone_pool, close, make_pool

KERNELS = {"gdn": kgdn, "mamba2": km2, "kda": kkda}


@pytest.mark.parametrize("family,read_copy,blocks", [
    ("gdn", "none", (32, 64, 4)), ("gdn", "fp8", (16, 64, 2)), ("mamba2", "none", (16, 32, 2)),
    ("mamba2", "fp8", (32, 64, 8)), ("kda", "none", (32, 64, 4)), ("kda", "fp8", (16, 64, 4)),
    ("mamba2", "none", (16, 16, 4)), ("gdn", "fp8", (16, None, 2))])
def test_fold_blocks_match_the_reference(family, read_copy, blocks):
    g = torch.Generator().manual_seed(11)
    pk = make_pool(family, read_copy=read_copy, gen=g, head_k_dim=64, max_drafts=4)
    pr = clone_pool(pk)
    slots = torch.tensor([1, 3, 5, 2], dtype=torch.int32, device=DEV)
    counts = torch.tensor([4, 0, 6, 2], dtype=torch.int32, device=DEV)   # slot 3: count 0, untouched
    bv, bk, nw = blocks
    before = pk.ckpt.clone()
    KERNELS[family].fold(pk, 1, slots, counts, tuning=KernelTuning(block_v=bv, block_k=bk, num_warps=nw))
    fold_rows(pr, 1, [1, 5, 2], [4, 6, 2])
    close(pk.ckpt, pr.ckpt, rtol=5e-4, atol=5e-5)
    assert torch.equal(pk.ckpt[:, 3], before[:, 3]) and torch.equal(pk.ckpt[0], before[0])
    if read_copy == "fp8":
        close(pk.rc.float() * pk.rc_scale[..., None], pr.rc.float() * pr.rc_scale[..., None], rtol=0.07, atol=1e-3)


def test_fold_refuses_bad_blocks():
    pk = make_pool("gdn", gen=torch.Generator().manual_seed(1))
    slots = torch.tensor([1], dtype=torch.int32, device=DEV)
    counts = torch.tensor([2], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="block_k must be None or a power of 2 >= 16 dividing head_k_dim 16, got 32"):
        kgdn.fold(pk, 0, slots, counts, tuning=KernelTuning(block_k=32))
    with pytest.raises(ValueError, match="block_v must be None or a power of 2 >= 16, got 24"):
        kgdn.fold(pk, 0, slots, counts, tuning=KernelTuning(block_v=24))
    with pytest.raises(ValueError, match="num_warps must be None or a power of 2 in 1..16, got 3"):
        kgdn.fold(pk, 0, slots, counts, tuning=KernelTuning(num_warps=3))


@pytest.mark.parametrize("family", ["gdn", "mamba2"])
def test_verify_mma_stages_and_whole_row_chunk(family):
    """The mma verify with the whole key row as one chunk and pipelining off (stages=1) matches the
    reference; a bad `stages` is refused."""
    g = torch.Generator().manual_seed(5)
    pk = make_pool(family, gen=g, head_k_dim=32, max_drafts=4)
    pr = clone_pool(pk)
    H, Dv, Dk = pk.geo.state_shape
    Hk = pk.geo.num_k_heads
    slots_l = [4, 2, 5]
    slots = torch.tensor(slots_l, dtype=torch.int32, device=DEV)
    T = 3
    if family == "gdn":
        km, rm, x, par = kgdn, rgdn, test_gdn.inputs(g, 3, H, Hk, Dv, Dk, T=T), test_gdn.params(g, H)
    else:
        r = lambda *s: torch.randn(*s, generator=g).to(DEV)   # noqa: E731
        km, rm, par = km2, rm2, test_mamba2.params(g, H)
        x = dict(x=r(3, T, H, Dv), dt=r(3, T, H), B=r(3, T, Hk, Dk), C=r(3, T, Hk, Dk), z=r(3, T, H, Dv))
    for p in (pk, pr):
        p.begin_verify(slots_l, T)
    ok = km.verify(pk, 0, slots, **x, **par, method="mma", tuning=KernelTuning(block_k=Dk, stages=1))
    orf = rm.verify(pr, 0, slots, **x, **par)
    close(ok, orf, rtol=5e-4, atol=5e-5)
    close(pk.rec_d, pr.rec_d, rtol=5e-4, atol=5e-5)
    with pytest.raises(ValueError, match="stages must be None or an int in 1..4, got 0"):
        km.verify(pk, 0, slots, **x, **par, method="mma", tuning=KernelTuning(stages=0))
    with pytest.raises(ValueError, match="method must be None"):
        km.verify(pk, 0, slots, **x, **par, method="tensor")


@pytest.mark.parametrize("family,read_copy", [("gdn", "fp8"), ("mamba2", "none"), ("kda", "none")])
def test_fold_every_layer_in_one_launch(family, read_copy):
    """layer None (pool.accept_drafts' call): each layer folded as the reference folds it, layer by layer."""
    g = torch.Generator().manual_seed(12)
    pk = make_pool(family, read_copy=read_copy, gen=g, num_layers=3)
    pr = clone_pool(pk)
    slots = torch.tensor([2, 4, 1], dtype=torch.int32, device=DEV)
    counts = torch.tensor([3, 0, 5], dtype=torch.int32, device=DEV)
    before = pk.ckpt.clone()
    KERNELS[family].fold(pk, None, slots, counts)
    for layer in range(3):
        fold_rows(pr, layer, [2, 1], [3, 5])
    close(pk.ckpt, pr.ckpt, rtol=5e-4, atol=5e-5)
    assert torch.equal(pk.ckpt[:, 4], before[:, 4]) and not torch.equal(pk.ckpt[2, 1], before[2, 1])
    if read_copy == "fp8":
        close(pk.rc.float() * pk.rc_scale[..., None], pr.rc.float() * pr.rc_scale[..., None], rtol=0.07, atol=1e-3)


@pytest.mark.parametrize("family,read_copy,ckpt", [
    ("gdn", "none", "fp32"), ("gdn", "fp8", "fp32"), ("mamba2", "none", "fp16-sr"), ("kda", "fp8", "fp32")])
def test_commit_matches_the_reference(family, read_copy, ckpt):
    """The kernels' whole commit (the fold counting from the cursor, then the pointer move) against the
    reference's: rows that reach the window exactly, pass it, stay short, accept nothing, and a padding row
    (slot 0, 0 accepted); every layer folds, cursors and fold counters move alike, other slots untouched."""
    from sglang_replayssm.reference import kda as rkda
    from .helpers import assert_untouched, snapshot

    g = torch.Generator().manual_seed(12)
    pk = make_pool(family, read_copy=read_copy, ckpt=ckpt, gen=g, max_drafts=4)   # window 4
    pk.cursor[1:6] = torch.tensor([3, 2, 1, 0, 2], dtype=torch.int32, device=DEV)
    pr = clone_pool(pk)
    before = snapshot(pk)
    slots = torch.tensor([1, 2, 3, 4, 5, 0], dtype=torch.int32, device=DEV)
    acc = torch.tensor([1, 4, 2, 0, 1, 0], dtype=torch.int32, device=DEV)   # 4 (exact), 6 (past), 3, 0, 3, pad
    KERNELS[family].commit(pk, slots, acc)
    {"gdn": rgdn, "mamba2": rm2, "kda": rkda}[family].commit(pr, slots, acc)
    assert pk.cursor[1:6].tolist() == [0, 0, 3, 0, 3] and torch.equal(pk.cursor, pr.cursor)
    assert (pk.folded - before["folded"])[1:6].tolist() == [4, 6, 0, 0, 0] and torch.equal(pk.folded, pr.folded)
    if ckpt == "fp16-sr":   # stochastic rounding from the same counters: equal but for ties of the last bit
        assert (pk.ckpt == pr.ckpt).float().mean().item() > 0.99
        close(pk.ckpt, pr.ckpt, rtol=2e-3, atol=2e-3)
    else:
        close(pk.ckpt, pr.ckpt, rtol=5e-4, atol=5e-5)
    assert not torch.equal(pk.ckpt[:, 1], before["ckpt"][:, 1]) and not torch.equal(pk.ckpt[:, 2], before["ckpt"][:, 2])
    for s in (0, 3, 4, 5):   # short of the window, nothing accepted, padding: no fold
        assert torch.equal(pk.ckpt[:, s].view(torch.uint8), before["ckpt"][:, s].view(torch.uint8)), s
    if read_copy == "fp8":
        close(pk.rc.float() * pk.rc_scale[..., None], pr.rc.float() * pr.rc_scale[..., None], rtol=0.07, atol=1e-3)
    assert_untouched(before, pk, [1, 2, 3, 4, 5])


def test_commit_refuses_bad_rows():
    pk = make_pool("gdn", gen=torch.Generator().manual_seed(1))
    slots = torch.tensor([1, 2], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="accepted"):
        kgdn.commit(pk, slots, torch.tensor([1], dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="accepted"):
        kgdn.commit(pk, slots, torch.tensor([1, 1], dtype=torch.int64, device=DEV))
