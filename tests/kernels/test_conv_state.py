"""kernels.conv_state.roll_conv_state: bit-exact with the pool's PyTorch conv commit (the reference)."""
import pytest
import torch

from sglang_replayssm.kernels.conv_state import roll_conv_state
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry

from .helpers import DEV   # the kernel runs here (CUDA when present); the reference pool stays on the CPU

C, T, NL = 70, 5, 2   # C: not a multiple of the channel blocks below
# (slot, draft tree parents, accepted path): a = 1, a tree path (non-contiguous nodes), a chain longer
# than any W, a deeper tree path, an empty path (no change); slot 6 is allocated but not committed
ROWS = [(1, [-1, 0, 1, 2, 3], [0]),
        (2, [-1, -1, 1, 1, 3], [1, 3, 4]),
        (3, [-1, 0, 1, 2, 3], [0, 1, 2, 3, 4]),
        (4, [-1, -1, 1, 2, 1], [1, 4]),
        (5, [-1, 0, 1, 2, 3], [])]


def filled_pool(W, dtype, seed=0):
    geo = SSMGeometry("gdn", 2, 4, 16, 1, conv_dim=C, conv_kernel=W + 1)
    pool = ReplayStatePool(geo, NL, 6, ReplayConfig(window=16, max_drafts=T), act_dtype=dtype)
    slots = pool.alloc(6)
    gen = torch.Generator().manual_seed(seed)
    pool.conv.copy_(torch.randn(pool.conv.shape, generator=gen).to(dtype))
    pool.conv_in.copy_(torch.randn(pool.conv_in.shape, generator=gen).to(dtype))
    return pool, sorted(slots)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("W", [1, 3])
@pytest.mark.parametrize("block_c", [None, 32])
def test_roll_matches_the_pools_torch_path(W, dtype, block_c):
    pool, slots = filled_pool(W, dtype)
    assert slots == [1, 2, 3, 4, 5, 6]
    conv, conv_in = pool.conv.clone(), pool.conv_in.clone()
    # the reference: the pool's own commit on CPU (PyTorch path)
    pool.begin_verify([s for s, _, _ in ROWS], T, parents=[par for _, par, _ in ROWS])
    pool.accept_drafts([s for s, _, _ in ROWS], [len(p) for _, _, p in ROWS], paths=[p for _, _, p in ROWS])
    # the kernel: committed rows only, paths padded with junk (past acc: must be ignored), mixed index dtypes
    rows = [(s, p) for s, _, p in ROWS if p]
    nodes = torch.full((len(rows), T + 2), 99, dtype=torch.int64)
    for b, (_, p) in enumerate(rows):
        nodes[b, :len(p)] = torch.tensor(p)
    conv_d, conv_in_d = conv.to(DEV), conv_in.to(DEV)
    out = roll_conv_state(conv_d, conv_in_d, torch.tensor([s for s, _ in rows], dtype=torch.int32, device=DEV),
                          torch.tensor([len(p) for _, p in rows], dtype=torch.int64, device=DEV), nodes.to(DEV),
                          block_c=block_c)
    assert out is conv_d
    conv = conv_d.cpu()
    assert torch.equal(conv, pool.conv)
    # and the definition, directly: the last W columns of (old state, accepted inputs along the path)
    fresh, _ = filled_pool(W, dtype)
    ref, ref_in = fresh.conv, fresh.conv_in
    for s, _, p in ROWS:
        want = torch.cat([ref[:, s], ref_in[:, s, p].transpose(-1, -2)], dim=-1)[..., len(p):len(p) + W]
        assert torch.equal(conv[:, s], want), (s, p)
    for s in (0, 5, 6):   # padding slot, empty path, not committed: untouched
        assert torch.equal(conv[:, s], ref[:, s])
    assert torch.equal(conv_in_d.cpu(), ref_in)


@pytest.mark.parametrize("change, match", [
    (dict(conv_in=lambda x: x.to(torch.float16)), "conv_in must have dtype torch.float32"),
    (dict(conv_in=lambda x: x[:, :, :, :-1].contiguous()), r"conv_in must be \[2, 7, Tmax, 70\]"),
    (dict(conv=lambda x: x.to(torch.float64)), "conv must have dtype"),
    (dict(rows=lambda x: x.float()), "rows must have dtype torch.int32 or torch.int64"),
    (dict(acc=lambda x: x[:1]), r"acc must have shape \(2,\)"),
    (dict(nodes=lambda x: x[0]), r"nodes must be \[B=2, N\]"),
    (dict(nodes=lambda x: x.t()), "nodes must be contiguous"),
    (dict(block_c=48), "block_c must be None or a power of 2"),
])
def test_bad_inputs_raise_clear_errors(change, match):
    pool, _ = filled_pool(3, torch.float32)
    args = dict(conv=pool.conv, conv_in=pool.conv_in, rows=torch.tensor([1, 2]), acc=torch.tensor([1, 2]),
                nodes=torch.tensor([[0, 1], [1, 2]]))
    for k, f in change.items():
        args[k] = f(args[k]) if callable(f) else f
    before = pool.conv.clone()
    with pytest.raises(ValueError, match=match):
        roll_conv_state(**args)
    assert torch.equal(pool.conv, before)
