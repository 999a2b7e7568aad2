"""The commit's storage ops (kernels.compact_paths, kernels.slot_copy) against their PyTorch references
(reference.replay.compact_paths / copy_slots), and the references against a plain per-row loop: bit-exact
moves of records and whole slots, padding and repeated rows included."""
import pytest
import torch

from sglang_replayssm.kernels.compact_paths import compact_paths
from sglang_replayssm.kernels.slot_copy import copy_slots
from sglang_replayssm.reference import replay as ref

from .helpers import DEV, assert_untouched, clone_pool, make_pool, snapshot

T = 3   # make_pool's max_drafts
# (slot, accepted count, padded path): a tree path, a chain prefix (nothing moves), a deeper path, nothing
# accepted, and a padding row (slot 0, junk path) that must be ignored
ROWS = [(2, 2, [1, 2, -1]), (3, 3, [0, 1, 2]), (4, 2, [0, 2, 1]), (5, 0, [2, 1, 0]), (0, 3, [2, 2, 2])]


def _rows(device):
    slots = torch.tensor([s for s, _, _ in ROWS], dtype=torch.int32, device=device)
    acc = torch.tensor([a for _, a, _ in ROWS], dtype=torch.int32, device=device)
    nodes = torch.tensor([p for _, _, p in ROWS], dtype=torch.int32, device=device)
    return slots, acc, nodes


def _equal(a, b, names=("rec_d", "rec_k", "rec_g", "rec_v", "rec_beta", "ckpt", "rc", "rc_scale", "cursor", "folded")):
    for n in names:
        x, y = getattr(a, n), getattr(b, n)
        if x is not None:
            assert torch.equal(x.cpu().view(torch.uint8), y.cpu().view(torch.uint8)), n


@pytest.mark.parametrize("family", ["gdn", "kda", "mamba2"])
def test_compact_paths_kernel_equals_reference_equals_loop(family):
    gen = torch.Generator().manual_seed(3)
    pool = make_pool(family, gen=gen, window=4, max_drafts=T)
    want = clone_pool(pool)
    for s, a, path in ROWS:   # the plain loop: record path[j] to position cursor + j
        if s == 0:
            continue
        c = int(want.cursor[s])
        for t in (t for t in (want.rec_d, want.rec_k, want.rec_g, want.rec_v, want.rec_beta) if t is not None):
            moved = [t[:, s, c + n].clone() for n in path[:a]]
            for j, m in enumerate(moved):
                t[:, s, c + j] = m
    before = snapshot(pool)
    refp = clone_pool(pool)
    ref.compact_paths(refp, *_rows(refp.cursor.device))
    compact_paths(pool, *_rows(pool.cursor.device))
    _equal(refp, want)
    _equal(pool, want)
    assert_untouched(before, pool, [2, 4])   # chain rows, empty rows and padding: not a byte changes


@pytest.mark.parametrize("read_copy", ["none", "fp8"])
def test_copy_slots_kernel_equals_reference(read_copy):
    gen = torch.Generator().manual_seed(4)
    pool = make_pool("gdn", gen=gen, read_copy=read_copy)
    tensors = [t for t in (pool.ckpt, pool.rc, pool.rc_scale, pool.rec_d, pool.rec_k, pool.rec_g, pool.rec_v,
                           pool.rec_beta) if t is not None]
    # rows: a copy, a row that copies nothing (dst 0), the padding row, a slot onto itself, a second copy
    src = torch.tensor([1, 2, 0, 3, 4], dtype=torch.int64, device=DEV)
    dst = torch.tensor([5, 0, 6, 3, 6], dtype=torch.int64, device=DEV)
    refp = clone_pool(pool)
    rtensors = [t for t in (refp.ckpt, refp.rc, refp.rc_scale, refp.rec_d, refp.rec_k, refp.rec_g, refp.rec_v,
                            refp.rec_beta) if t is not None]
    ref.copy_slots(rtensors, src.to(refp.ckpt.device), dst.to(refp.ckpt.device), 1)
    ref.copy_slots([refp.cursor, refp.folded], src, dst, 0)
    before = snapshot(pool)
    copy_slots(tensors, src, dst, 1)
    copy_slots([pool.cursor, pool.folded], src.to(torch.int32), dst.to(torch.int32), 0)
    _equal(pool, refp)
    for n, t in before.items():   # slots 5 and 6 are now copies of 1 and 4
        now = getattr(pool, n)
        for s, d in ((1, 5), (4, 6)):
            got = now[d] if n in ("cursor", "folded") else now[:, d]
            want = t[s] if n in ("cursor", "folded") else t[:, s]
            assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), n
    assert_untouched(before, pool, [5, 6])
