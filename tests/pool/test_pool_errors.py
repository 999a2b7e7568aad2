"""Every misuse of the pool raises its typed error, and loses nothing."""

import pytest
import torch

from sglang_replayssm.pool import (BadSlotError, CommitError, ConfigError, DoubleFreeError, DraftOverflowError,
                                   PoolError, PoolExhaustedError, ReplayConfig, ReplayStatePool, SSMGeometry)
from sglang_replayssm.reference import gdn

GEO = SSMGeometry("gdn", 2, 4, 16, 1, conv_dim=6, conv_kernel=4)


def make(num_slots=3, **cfg):
    return ReplayStatePool(GEO, 2, num_slots, ReplayConfig(**cfg))


def test_exhausted_then_free_makes_room():
    pool = make(2)
    a = pool.alloc(2)
    assert sorted(a) == [1, 2]
    with pytest.raises(PoolExhaustedError, match="only 0 of 2"):
        pool.alloc(1)
    pool.free([a[0]])
    assert pool.alloc(1) == [a[0]]


def test_double_free_and_bad_slots():
    pool = make()
    s = pool.alloc(1)[0]
    pool.free([s])
    with pytest.raises(DoubleFreeError):
        pool.free([s])
    with pytest.raises(DoubleFreeError):
        t = pool.alloc(1)[0]
        pool.free([t, t])
    for bad in (0, 4, -1):
        with pytest.raises(BadSlotError):
            pool.free([bad])
    with pytest.raises(BadSlotError, match="not allocated"):
        pool.reset([2])
    with pytest.raises(BadSlotError, match="padding"):
        pool.fork(0, 1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=0), "window"),
    (dict(window=2.5), "window"),
    (dict(max_drafts=-1), "max_drafts"),
    (dict(ckpt="bf16"), "ckpt"),
    (dict(read_copy="int4"), "read_copy"),
    (dict(mode="snapshot"), "mode"),
    (dict(shared_quant=True), "shared_quant"),
    (dict(shared_quant=True, read_copy="fp8", ckpt="fp16-sr"), "shared_quant"),
    (dict(mode="conventional", read_copy="fp8"), "conventional"),
    (dict(ckpt="fp64", read_copy="nvfp4"), "fp64"),
    (dict(record_dtype=torch.int8), "record_dtype"),
])
def test_bad_configs(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ReplayConfig(**kwargs)


def test_bad_geometry():
    with pytest.raises(ConfigError, match="multiple"):
        SSMGeometry("gdn", 3, 4, 4, 2)
    with pytest.raises(ConfigError, match="family"):
        SSMGeometry("rwkv", 2, 4, 4, 1)
    with pytest.raises(ConfigError, match="nvfp4"):
        ReplayStatePool(SSMGeometry("gdn", 2, 4, 8, 1), 1, 1, ReplayConfig(read_copy="nvfp4"))
    with pytest.raises(ConfigError, match="num_layers"):
        ReplayStatePool(GEO, 0, 1)
    with pytest.raises(PoolExhaustedError, match="at least one usable slot"):
        ReplayStatePool(GEO, 1, 0)


def test_draft_and_commit_misuse():
    pool = make(window=4, max_drafts=3)
    s = pool.alloc(2)
    with pytest.raises(DraftOverflowError, match="ring capacity"):
        pool.begin_verify(s, 4)
    with pytest.raises(CommitError, match="no pending"):
        pool.accept_drafts(s, [0, 0])
    pool.begin_verify(s, 2)
    with pytest.raises(CommitError, match="already"):
        pool.begin_verify(s, 1)
    with pytest.raises(CommitError, match="accepted 3 of 2"):
        pool.accept_drafts(s, [3, 0])
    with pytest.raises(CommitError, match="fork"):
        pool.fork(s[0], pool.alloc(1)[0])
    pool.accept_drafts(s, [2, 1])
    assert pool.cursor[s].tolist() == [2, 1]
    pool.begin_verify(s, 3, parents=[[-1, 0, 0], [-1, -1, 1]])
    with pytest.raises(CommitError, match="not a root-to-node path"):
        pool.accept_drafts(s, [1, 1], paths=[[1], [1]])        # node 1 of the first tree hangs off node 0
    pool.accept_drafts(s, [2, 2], paths=[[0, 2], [1, 2]])       # the rejected call kept the verify pending
    assert pool.cursor[s].tolist() == [0, 3]             # 2 + 2 reached the window (4) and folded; 1 + 2 did not
    assert isinstance(CommitError("x"), PoolError) and issubclass(PoolError, ValueError)


def test_failed_call_loses_nothing():
    """A rejected operation leaves every slot exactly as it was."""
    pool = make(2, window=4, max_drafts=2)
    s = pool.alloc(2)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 16, generator=gen), torch.randn(2, 1, 16, generator=gen)
    v, a, b = torch.randn(2, 2, 4, generator=gen), torch.randn(2, 2, generator=gen), torch.randn(2, 2, generator=gen)
    for layer in range(2):
        gdn.decode(pool, layer, torch.tensor(s), q, k, v, a, b, torch.zeros(2), torch.zeros(2))
    pool.advance(torch.tensor(s))
    before = [t.clone() for t in pool._per_slot_tensors()] + [pool.cursor.clone()]
    for bad in (lambda: pool.alloc(1), lambda: pool.free([s[0], s[0]]), lambda: pool.begin_verify(s, 9),
                lambda: pool.accept_drafts(s, [1, 1])):
        with pytest.raises(PoolError):
            bad()
    after = [t for t in pool._per_slot_tensors()] + [pool.cursor]
    assert all(torch.equal(x.view(torch.uint8) if x.dtype.itemsize == 1 else x, y.view(torch.uint8) if y.dtype.itemsize == 1 else y)
               for x, y in zip(before, after))


def test_cancel_verify_closes_it_and_leaves_the_pointer():
    """A cancelled verify accepts nothing: no commit can follow it, the cursor stays, a new verify may open."""
    pool = make(2, window=4, max_drafts=2)
    s = pool.alloc(2)
    pool.begin_verify(s, 2)
    pool.cancel_verify([s[0]])
    assert pool.pending(s[0]) == 0 and pool.pending(s[1]) == 2
    with pytest.raises(CommitError, match="no pending verify"):
        pool.accept_drafts([s[0]], [1])
    pool.accept_drafts([s[1]], [1])
    pool.begin_verify([s[0]], 1)
    pool.accept_drafts([s[0]], [1])
    assert pool.cursor[s].tolist() == [1, 1]


def test_copy_slots_copies_everything_on_the_device():
    pool = make(3, window=4, max_drafts=2)
    s = pool.alloc(3)
    for t in pool._per_slot_tensors():
        t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(1)).to(t.dtype))
    pool.cursor[s[0]], pool.folded[s[0]] = 3, 40
    pool.copy_slots(torch.tensor([s[0], 0]), torch.tensor([s[2], 0]))
    for t in pool._per_slot_tensors():
        assert torch.equal(t[:, s[2]], t[:, s[0]]) and not torch.equal(t[:, s[1]], t[:, s[0]])
    assert (int(pool.cursor[s[2]]), int(pool.folded[s[2]])) == (3, 40)


def test_bytes_and_capacity_vs_snapshot_scheme():
    geo = SSMGeometry("gdn", 32, 128, 128, 16, conv_dim=8192, conv_kernel=4)
    cfg = ReplayConfig(window=16, max_drafts=8)
    per = ReplayStatePool.slot_bytes(geo, 24, cfg, torch.bfloat16)
    state = 32 * 128 * 128 * 4
    # a record: d and k (fp32 records), g; no raw inputs without a read copy (the stored d's fold as they are)
    ring = 24 * (32 * 128 + 16 * 128) * 4 + 24 * 32 * 4
    conv = 8192 * 3 * 2 + 8 * 8192 * 2
    assert per == 24 * state + 24 * ring + 24 * conv + 4 + 8
    cap = ReplayStatePool.capacity(geo, 24, cfg, 80 * 2 ** 30, torch.bfloat16)
    assert cap["snapshot_bytes_per_slot"] == 24 * (9 * state + 8192 * 3 * 2 + 8 * 8192 * 2) + 4 + 8
    assert cap["sequences"] > 4 * cap["snapshot_sequences"]
    fp8 = ReplayStatePool.slot_bytes(geo, 24, ReplayConfig(window=16, max_drafts=8, read_copy="fp8"), torch.bfloat16)
    # the fp8 read copy and its row scales; beside it the exact fold's raw v (the activations' bf16) and beta (fp32)
    assert fp8 == per + 24 * (32 * 128 * 128 + 32 * 128 * 4) + 24 * 24 * (32 * 128 * 2 + 32 * 4)


def test_commit_rolls_conv_state_along_the_accepted_path():
    """After a commit the conv state holds the last (kernel - 1) inputs of the accepted sequence: the
    old window followed by the accepted drafts' inputs (tree: along the accepted path)."""
    pool = make(4, window=4, max_drafts=4)
    s = pool.alloc(4)
    gen = torch.Generator().manual_seed(1)
    pool.conv[:, s] = torch.randn(2, 4, 6, 3, generator=gen)
    pool.conv_in[:, s] = torch.randn(2, 4, 4, 6, generator=gen)
    old, drafts = pool.conv[:, s].clone(), pool.conv_in[:, s].clone()
    pool.begin_verify(s, 4, parents=[[-1, 0, 1, 2], [-1, -1, 1, 0], [-1, 0, 0, 0], [-1, 0, 1, 2]])
    paths = [[0, 1], [1, 2], [], [0, 1, 2, 3]]   # the last: more accepted than the conv window, all new columns
    pool.accept_drafts(s, [2, 2, 0, 4], paths=paths)
    for b, path in enumerate(paths):
        want = torch.cat([old[:, b], drafts[:, b, path].transpose(-1, -2)], dim=-1)[..., -3:]
        assert torch.equal(pool.conv[:, s[b]], want)
