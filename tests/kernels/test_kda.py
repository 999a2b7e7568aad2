"""KDA Triton kernels vs the PyTorch reference (CPU: Triton interpreter)."""
import pytest
import torch

from sglang_replayssm.kernels import kda as kkda
from sglang_replayssm.reference import kda as rkda

from .helpers import DEV, assert_untouched, clone_pool, close, make_pool, snapshot
from .test_gdn import compare_pools


def inputs(g, B, H, Hk, Dv, Dk):
    r = lambda *s: torch.randn(*s, generator=g).to(DEV)
    return dict(q=r(B, Hk, Dk), k=r(B, Hk, Dk), v=r(B, H, Dv), a=r(B, H, Dk), b=r(B, H))


def params(g, H, Dk):
    return dict(A_log=(torch.randn(H, generator=g) * 0.5).to(DEV), dt_bias=(torch.randn(H, Dk, generator=g) * 0.5).to(DEV))


@pytest.mark.parametrize("read_copy,ckpt", [("none", "fp32"), ("fp8", "fp32"), ("none", "fp16-sr")])
def test_decode_window_crossing_flushes(read_copy, ckpt):
    g = torch.Generator().manual_seed(21)
    pk = make_pool("kda", read_copy=read_copy, ckpt=ckpt, gen=g)
    pr = clone_pool(pk)
    H, Dv, Dk = pk.geo.state_shape
    Hk = pk.geo.num_k_heads
    par = params(g, H, Dk)
    slots = torch.tensor([5, 1, 3, 0], dtype=torch.int32, device=DEV)
    flushes = 0
    for step in range(6):
        before = snapshot(pk)
        flushes += int(((pk.cursor[slots[:-1].long()] + 1) == pk.cfg.window).sum())
        x = inputs(g, 4, H, Hk, Dv, Dk)
        ok = kkda.decode(pk, 1, slots, **x, **par)
        orf = rkda.decode(pr, 1, slots, **x, **par)
        close(ok[:-1], orf[:-1])
        compare_pools(pk, pr, 1, read_copy, ckpt)
        assert_untouched(before, pk, slots.tolist())
        pk.advance(slots)
        pr.advance(slots)
    assert flushes >= 3


def test_fold_matches_reference():
    g = torch.Generator().manual_seed(22)
    pk = make_pool("kda", read_copy="fp8", gen=g)
    pr = clone_pool(pk)
    kkda.fold(pk, 0, [2, 4, 6], [3, 0, 5])
    from sglang_replayssm.reference.replay import fold_rows
    fold_rows(pr, 0, [2, 6], [3, 5])
    close(pk.ckpt, pr.ckpt)
    close(pk.rc.float() * pk.rc_scale[..., None], pr.rc.float() * pr.rc_scale[..., None], rtol=0.07, atol=1e-3)


def test_conventional_decode():
    g = torch.Generator().manual_seed(23)
    H, Hk, Dv, Dk = 4, 2, 16, 32
    state = torch.randn(6, H, Dv, Dk, generator=g).to(DEV)
    before = state.clone()
    slots = torch.tensor([3, 0, 5], dtype=torch.int32, device=DEV)
    x = inputs(g, 3, H, Hk, Dv, Dk)
    par = params(g, H, Dk)
    out = kkda.conventional_decode(state, slots, **x, **par)
    ro, rs = rkda.conventional_step(before[slots.long()], **x, **par)
    close(out[[0, 2]], ro[[0, 2]])
    close(state[[3, 5]], rs[[0, 2]])
    for s in (1, 2, 4):
        assert torch.equal(state[s], before[s])
