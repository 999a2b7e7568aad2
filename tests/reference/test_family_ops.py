"""The backend switch (family_ops.FamilyOps) and the reference half of its interface: the reference's
conventional_decode and fold do what the pool's reference paths do, both backends take the same
arguments, and the pool's arithmetic is the ops it is given."""

import inspect

import pytest
import torch

from sglang_replayssm.family_ops import FamilyOps
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry
from sglang_replayssm.reference import FAMILY_MODULES
from sglang_replayssm.reference.replay import fold_rows

from .helpers import call, random_inputs, random_params

GEOS = {"mamba2": dict(num_heads=4, head_v_dim=3, head_k_dim=5, num_k_heads=2),
        "gdn": dict(num_heads=4, head_v_dim=3, head_k_dim=5, num_k_heads=2),
        "kda": dict(num_heads=2, head_v_dim=3, head_k_dim=4, num_k_heads=1)}


@pytest.mark.parametrize("family", sorted(GEOS))
def test_conventional_decode_equals_decode_on_a_conventional_pool(family):
    g = torch.Generator().manual_seed(3)
    geo = SSMGeometry(family=family, **GEOS[family])
    pools = [ReplayStatePool(geo, 1, 4, ReplayConfig(window=1, max_drafts=0, mode="conventional")) for _ in range(2)]
    init = torch.randn(pools[0].ckpt.shape, generator=g)
    for p in pools:
        p.alloc(4)
        p.ckpt.copy_(init)
    slots = torch.tensor([3, 1, 0], dtype=torch.int32)   # a padding row too
    ref = FAMILY_MODULES[family]
    for _ in range(3):
        inputs, params = random_inputs(geo, 3, torch.float32, gen=g), random_params(geo, torch.float32, gen=g)
        want = call(ref.decode, geo, inputs, params, pools[0], 0, slots)
        got = call(ref.conventional_decode, geo, inputs, params, pools[1].ckpt[0], slots)
        torch.testing.assert_close(got[:2], want[:2], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(pools[1].ckpt[:, 1:], pools[0].ckpt[:, 1:], rtol=1e-6, atol=1e-6)
    assert not torch.equal(pools[1].ckpt[0, 1:4], init[0, 1:4])          # the rows moved
    assert torch.equal(pools[1].ckpt[0, 2], init[0, 2])                  # the others did not


@pytest.mark.parametrize("ckpt", ["fp32", "fp16-sr"])
def test_reference_fold_is_fold_rows_of_the_counted_rows(ckpt):
    """fold(pool, None, slots, counts): every layer, rows with count 0 untouched (also their read copy)."""
    g = torch.Generator().manual_seed(5)
    geo = SSMGeometry(family="gdn", **GEOS["gdn"])
    cfg = ReplayConfig(window=4, max_drafts=2, ckpt=ckpt, read_copy="fp8")
    pools = [ReplayStatePool(geo, 2, 4, cfg) for _ in range(2)]
    for p in pools:
        p.alloc(4)
        for t in (p.rec_d, p.rec_k, p.rec_g):
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(7)) * 0.3)
        p.rec_g.neg_().abs_().neg_()
        for layer in range(2):
            p.write_state(layer, [1, 2, 3, 4], torch.randn(4, 4, 3, 5, generator=torch.Generator().manual_seed(layer)))
    before = pools[0].ckpt.clone()
    FAMILY_MODULES["gdn"].fold(pools[0], None, torch.tensor([2, 4, 3], dtype=torch.int32),
                               torch.tensor([3, 0, 5], dtype=torch.int32))
    for layer in range(2):
        fold_rows(pools[1], layer, [2, 3], [3, 5])
    for name in ("ckpt", "rc", "rc_scale"):
        a, b = getattr(pools[0], name), getattr(pools[1], name)
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    assert torch.equal(pools[0].ckpt[:, 4].view(torch.uint8), before[:, 4].view(torch.uint8))
    assert not torch.equal(pools[0].ckpt[:, 2], before[:, 2])


def test_select_chooses_once_by_family_device_and_override():
    assert FamilyOps.select("gdn", "cpu").backend == "reference"
    assert FamilyOps.select("gdn", "cpu", "reference") == FamilyOps.reference("gdn")
    assert FamilyOps.resolve("kernels", "cpu") == FamilyOps.resolve("triton", "cpu") == "triton"
    assert FamilyOps.resolve("auto", "cuda") == "triton"
    with pytest.raises(ValueError, match="backend must be one of"):
        FamilyOps.select("gdn", "cpu", "cuda")
    with pytest.raises(ValueError, match="family must be one of"):
        FamilyOps.select("mamba1", "cpu")


@pytest.mark.parametrize("family", sorted(GEOS))
def test_both_backends_take_the_same_arguments(family):
    """The Triton wrappers take the reference's parameters, in order, plus keyword-only ones."""
    pytest.importorskip("triton")
    ref, tri = FamilyOps.reference(family), FamilyOps.triton(family)
    assert tri.backend == "triton" and tri.fold_on_device and not ref.fold_on_device
    assert (tri.package, ref.package) == ("kernels", "reference")
    for name in ("decode", "verify", "fold", "conventional_decode", "roll_conv"):
        r = list(inspect.signature(getattr(ref, name)).parameters.values())
        t = [p for p in inspect.signature(getattr(tri, name)).parameters.values() if p.kind is not p.KEYWORD_ONLY]
        assert [p.name for p in r] == [p.name for p in t[:len(r)]], name
        assert all(p.default is not p.empty for p in t[len(r):]), name
    assert ref.conventional_step is tri.conventional_step and ref.store_checkpoint is tri.store_checkpoint


def test_the_pool_folds_with_the_ops_it_is_given():
    """A pool given the Triton ops commits with them (here under the interpreter), bit-equal in cursors and
    close in states to a pool on the reference (the default)."""
    pytest.importorskip("triton")
    geo = SSMGeometry(family="gdn", num_heads=2, head_v_dim=16, head_k_dim=16, num_k_heads=1)
    cfg = ReplayConfig(window=2, max_drafts=2)
    pr = ReplayStatePool(geo, 1, 2, cfg)
    pk = ReplayStatePool(geo, 1, 2, cfg, ops=FamilyOps.triton("gdn"))
    assert pr.ops == FamilyOps.reference("gdn") and pk.ops.backend == "triton"
    g = torch.Generator().manual_seed(2)
    for p in (pr, pk):
        p.alloc(2)
        p.write_state(0, [1, 2], torch.randn(2, 2, 16, 16, generator=torch.Generator().manual_seed(1)))
    inputs = random_inputs(geo, 2, torch.float32, drafts=2, gen=g)
    params = random_params(geo, torch.float32, gen=g)
    slots = torch.tensor([1, 2], dtype=torch.int32)
    for p in (pr, pk):
        p.begin_verify([1, 2], 2)
        call(FAMILY_MODULES["gdn"].verify, geo, inputs, params, p, 0, slots)
        p.accept_drafts([1, 2], [2, 1])
    assert pk.cursor.tolist() == pr.cursor.tolist() == [0, 0, 1]
    torch.testing.assert_close(pk.ckpt, pr.ckpt, rtol=1e-5, atol=1e-5)
