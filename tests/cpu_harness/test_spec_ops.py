"""The speculative-decoding ``*_cpu`` ops of ``cpu_harness/spec_ops.py`` against independent oracles.

Each op is called exactly as SGLang calls it on CPU: through sgl_kernel's Python wrapper
(``sgl_kernel.speculative`` / ``sgl_kernel.kvcacheio``, which call ``torch.ops.sgl_kernel.<name>``). The
oracle is SGLang's own Triton kernel for the same job, run under Triton's interpreter (conftest sets
``TRITON_INTERPRET=1``), where SGLang has one, and always a result computed by hand from the documented
semantics on a small explicit input (the draft trees are drawn in the comments); random trees are
cross-checked against the Triton versions only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from sglang_replayssm.cpu_harness.bridge import install

install()   # `import sgl_kernel` needs the stand-in on a machine without a CUDA driver

from sglang_replayssm.cpu_harness import spec_ops  # noqa: E402

spec_ops.register()

import sgl_kernel.kvcacheio as kvio  # noqa: E402
import sgl_kernel.speculative as spec  # noqa: E402
from triton import next_power_of_2  # noqa: E402

I32, I64 = torch.int32, torch.int64


def t(values, dtype=I64):
    return torch.tensor(values, dtype=dtype)


# ----------------------------------------------------------------------------- registration
def test_every_cpu_op_of_the_wrappers_is_registered_with_its_mutations():
    spec_ops.register()   # idempotent
    import sgl_kernel

    root = Path(sgl_kernel.__path__[0])
    names = set()
    for wrapper in ("speculative.py", "kvcacheio.py"):
        names |= set(re.findall(r"torch\.ops\.sgl_kernel\.(\w+_cpu)\b", (root / wrapper).read_text()))
    assert names <= set(spec_ops._SCHEMAS), names - set(spec_ops._SCHEMAS)
    for name in spec_ops._SCHEMAS:
        assert hasattr(torch.ops.sgl_kernel, name), name

    def written(name):
        schema = getattr(torch.ops.sgl_kernel, name).default._schema
        return {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}

    assert written("verify_tree_greedy_cpu") == {"predicts", "accept_index", "accept_token_num"}
    assert written("build_tree_kernel_efficient_cpu") == {
        "tree_mask", "positions", "retrive_index", "retrive_next_token", "retrive_next_sibling"}
    assert written("reconstruct_indices_from_tree_mask_cpu") == {
        "positions", "retrive_index", "retrive_next_token", "retrive_next_sibling"}
    assert written("assign_req_to_token_pool_cpu") == {"req_to_token"}
    assert written("assign_extend_cache_locs_cpu") == {"out_cache_loc"}
    assert written("assign_draft_cache_locs_contiguous_cpu") == {"out_cache_loc"}
    assert written("fill_accept_out_cache_loc_cpu") == {"accept_out_cache_loc"}
    assert written("fill_bonus_tokens_cpu") == {"bonus_tokens"}
    assert written("rotate_input_ids_cpu") == {"input_ids"}
    assert written("build_draft_decode_metadata_cpu") == set()
    assert written("copy_all_layer_kv_cache_cpu") == set()   # it writes through raw addresses


# ----------------------------------------------------------------------------- req_to_token / KV slots
def test_assign_req_to_token_pool():
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool

    rpi = t([2, 0, 3])
    start, end = t([1, 0, 5], I32), t([4, 2, 9], I32)          # 3 + 2 + 4 slots
    out_cache_loc = torch.arange(100, 109, dtype=I64)
    ours = torch.full((4, 16), -1, dtype=I32)
    spec.assign_req_to_token_pool_cpu(rpi, ours, start, end, out_cache_loc, ours.shape[1])

    expected = torch.full((4, 16), -1, dtype=I32)
    expected[2, 1:4] = t([100, 101, 102], I32)
    expected[0, 0:2] = t([103, 104], I32)
    expected[3, 5:9] = t([105, 106, 107, 108], I32)
    assert torch.equal(ours, expected)

    triton_out = torch.full((4, 16), -1, dtype=I32)
    assign_req_to_token_pool[(3,)](rpi, triton_out, start, end, out_cache_loc, 16, next_power_of_2(3))
    assert torch.equal(ours, triton_out)


def test_assign_extend_cache_locs():
    from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs

    req_to_token = (torch.arange(4 * 16, dtype=I32) * 3).view(4, 16)
    rpi = t([3, 1])
    start, end = t([2, 7]), t([5, 9])                          # 3 + 2 slots, into a 7-slot buffer
    ours = torch.full((7,), -5, dtype=I64)
    spec.assign_extend_cache_locs_cpu(rpi, req_to_token, start, end, ours, 16)
    expected = t([3 * (48 + 2), 3 * (48 + 3), 3 * (48 + 4), 3 * (16 + 7), 3 * (16 + 8), -5, -5])
    assert torch.equal(ours, expected)

    triton_out = torch.full((7,), -5, dtype=I64)
    assign_extend_cache_locs[(2,)](rpi, req_to_token, start, end, triton_out, 16, next_power_of_2(2))
    assert torch.equal(ours, triton_out)

    # fill_front_out_cache_loc_func's use: rows = arange(bs) of an int32 window, int64 starts / ends
    window = torch.arange(12, dtype=I32).view(3, 4) + 50
    front = torch.zeros(6, dtype=I64)
    spec.assign_extend_cache_locs_cpu(torch.arange(3), window, torch.zeros(3, dtype=I64), t([1, 3, 2]), front, 4)
    assert front.tolist() == [50, 54, 55, 56, 58, 59]


def test_assign_draft_cache_locs_contiguous():
    from sglang.kernels.ops.speculative.cache_locs import assign_draft_cache_locs_contiguous

    topk, steps, pool_len = 2, 3, 20
    req_to_token = (torch.arange(3 * pool_len, dtype=I32) + 1000).view(3, pool_len)
    rpi, seq_lens = t([2, 0], I32), t([4, 9])
    ours = torch.zeros(2 * topk * steps, dtype=I64)
    spec.assign_draft_cache_locs_contiguous_cpu(rpi, req_to_token, seq_lens, ours, pool_len, topk, steps)
    expected = [1000 + 2 * pool_len + 4 + j for j in range(6)] + [1000 + 9 + j for j in range(6)]
    assert ours.tolist() == expected

    triton_out = torch.zeros_like(ours)
    assign_draft_cache_locs_contiguous[(2,)](rpi, req_to_token, seq_lens, triton_out, pool_len, topk, steps, BS=2)
    assert torch.equal(ours, triton_out)


def test_build_draft_decode_metadata():
    from sglang.kernels.ops.speculative.cache_locs import generate_draft_decode_kv_indices

    topk, steps, pool_len = 2, 3, 16
    req_to_token = (torch.arange(3 * pool_len, dtype=I32) + 500).view(3, pool_len)
    rpi, seq_lens = t([1, 2]), t([3, 5], I32)
    ours = spec.build_draft_decode_metadata_cpu(req_to_token, rpi, seq_lens, topk, steps, pool_len)
    assert ours.shape == (4, pool_len) and ours.dtype == I32

    # row b * topk + k: request b's prefix, then candidate k's `steps` draft slots after it
    row = lambda r, cols: [500 + r * pool_len + c for c in cols]  # noqa: E731
    expected = [
        row(1, [0, 1, 2]) + row(1, [3, 4, 5]),
        row(1, [0, 1, 2]) + row(1, [6, 7, 8]),
        row(2, [0, 1, 2, 3, 4]) + row(2, [5, 6, 7]),
        row(2, [0, 1, 2, 3, 4]) + row(2, [8, 9, 10]),
    ]
    lens = [3 + steps, 3 + steps, 5 + steps, 5 + steps]
    for r in range(4):
        assert ours[r, :lens[r]].tolist() == expected[r]

    # SGLang's Triton draft-decode KV indices (page size 1): the last step's segment of branch (b, k)
    # is what the attention reads through row b * topk + k.
    bs = 2
    total = int(seq_lens.sum()) * topk + bs * topk * steps
    kv_indices = torch.full((steps, total), -1, dtype=I64)
    kv_indptr = torch.zeros((steps, bs * topk + 1), dtype=I64)
    positions = seq_lens.to(I64).repeat_interleave(topk)
    generate_draft_decode_kv_indices[(steps, bs, topk)](
        rpi, req_to_token, seq_lens, kv_indices, kv_indptr, positions, pool_len, kv_indices.shape[1],
        kv_indptr.shape[1], next_power_of_2(bs), next_power_of_2(steps), next_power_of_2(bs * topk), 1)
    last, indptr = kv_indices[steps - 1], kv_indptr[steps - 1]
    for r in range(4):
        assert ours[r, :lens[r]].tolist() == last[int(indptr[r]):int(indptr[r]) + lens[r]].tolist()


def _kv_buffers():
    g = torch.Generator().manual_seed(0)
    k = [torch.randn(8, 2, 4, generator=g) for _ in range(2)]             # 32-byte rows
    v = [torch.randn(8, 3, generator=g).to(torch.bfloat16) for _ in range(2)]   # 6-byte rows
    return k + v


def test_copy_all_layer_kv_cache():
    from sglang.kernels.ops.kvcache.cache_move import copy_all_layer_kv_cache_tiled

    tgt, src = t([1, 2, 5]), t([0, 1, 2])     # overlapping: every source is read before any target write

    def ptrs_and_strides(bufs):
        return (torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64),
                torch.tensor([b.stride(0) * b.dtype.itemsize for b in bufs]))

    ours = _kv_buffers()
    before = [b.clone() for b in ours]
    kvio.copy_all_layer_kv_cache_cpu(*ptrs_and_strides(ours), tgt, src)
    for b, old in zip(ours, before):
        expected = old.clone()
        expected[1], expected[2], expected[5] = old[0], old[1], old[2]
        assert torch.equal(b, expected)

    ref = _kv_buffers()
    data_ptrs, strides = ptrs_and_strides(ref)
    copy_all_layer_kv_cache_tiled[(len(ref), 1)](data_ptrs, strides, tgt, src, 3, 4, BYTES_PER_TILE=128)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)

    kvio.copy_all_layer_kv_cache_cpu(*ptrs_and_strides(ours), t([], I64), t([], I64))   # nothing to move
    with pytest.raises(Exception, match="negative"):
        kvio.copy_all_layer_kv_cache_cpu(*ptrs_and_strides(ours), t([-1]), t([0]))


# ----------------------------------------------------------------------------- draft trees
# Two EAGLE drafts, topk = 2, spec steps (depth) = 3, n = 5 nodes. The draft's flattened candidates:
# step 0: c0, c1 (children of the root); step 1: c2..c5 (c2, c3 under c0; c4, c5 under c1); step 2: c6..c9
# (under the step-1 candidates the draft expanded, here c3 and c4). parent_list row = [-1, 0, 1, 3, 4]:
# candidate c's parent is candidate parent_list[c // topk] (the root when c // topk == 0).
#   request 0, selected [c0, c1, c3, c6]: root -> {1, 2}, 1 -> {3}, 3 -> {4}
#   request 1, selected [c0, c1, c2, c4]: root -> {1, 2}, 1 -> {3}, 2 -> {4}
TOPK, DEPTH, N = 2, 3, 5
PARENTS = [[-1, 0, 1, 3, 4], [-1, 0, 1, 3, 4]]
SELECTED = [[0, 1, 3, 6], [0, 1, 2, 4]]
SEQ_LENS = [3, 2]
NEXT_TOKEN = [[1, 3, -1, 4, -1], [1, 3, 4, -1, -1]]
NEXT_SIBLING = [[-1, 2, -1, -1, -1], [-1, 2, -1, -1, -1]]
DEPTHS = [[0, 1, 1, 2, 3], [0, 1, 1, 2, 2]]
ANCESTOR_ROWS = [   # row i: the nodes i attends (root, its ancestors, itself)
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]],
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
]


def _tree_outputs(dtype, mask):
    retrieve = torch.full((3, 2, N), -1, dtype=dtype)
    return mask, torch.empty(2 * N, dtype=dtype), retrieve[0], retrieve[1], retrieve[2]


def _expected_positions():
    return [s + d for s, ds in zip(SEQ_LENS, DEPTHS) for d in ds]


@pytest.mark.parametrize("dtype", [I64, I32])
def test_build_tree_kernel_efficient_qlen_only(dtype):
    from sglang.kernels.ops.speculative.spec_tree import sgl_build_tree_kernel_triton

    args = (t(PARENTS, dtype), t(SELECTED, dtype), t(SEQ_LENS, dtype))
    ours = _tree_outputs(dtype, torch.full((2 * N * N,), True))
    spec.build_tree_kernel_efficient_cpu(*args, *ours, TOPK, DEPTH, N, 1)
    mask, positions, ri, nt, ns = ours
    assert mask.view(2, N, N).int().tolist() == ANCESTOR_ROWS
    assert positions.tolist() == _expected_positions()
    assert ri.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert nt.tolist() == NEXT_TOKEN and ns.tolist() == NEXT_SIBLING

    if dtype == I64:   # SGLang's Triton version, as it is called (int64 everywhere)
        ref = _tree_outputs(dtype, torch.full((2 * N * N,), True))
        sgl_build_tree_kernel_triton(*args, *ref, TOPK, DEPTH, N, 1)
        for a, b in zip(ours, ref):
            assert torch.equal(a, b)


def test_build_tree_kernel_efficient_full_mask():
    from sglang.kernels.ops.speculative.spec_tree import sgl_build_tree_kernel_triton

    args = (t(PARENTS), t(SELECTED), t(SEQ_LENS))
    size = sum(SEQ_LENS) * N + 2 * N * N
    ours = _tree_outputs(I64, torch.full((size,), True))     # the caller fills the prefix columns
    spec.build_tree_kernel_efficient_cpu(*args, *ours, TOPK, DEPTH, N, 0)
    expected = []
    for b, s in enumerate(SEQ_LENS):   # request b: n rows of (s prefix columns, then its n tree columns)
        for row in ANCESTOR_ROWS[b]:
            expected += [1] * s + row
    assert ours[0].int().tolist() == expected
    assert ours[1].tolist() == _expected_positions()

    ref = _tree_outputs(I64, torch.full((size,), True))
    sgl_build_tree_kernel_triton(*args, *ref, TOPK, DEPTH, N, 0)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)


def test_build_tree_kernel_efficient_bitpacked_and_single_step():
    # QLEN_ONLY_BITPACKING (SGLang's CUDA layout; its Triton version has none): n <= 8 -> one byte per
    # node, bit j = "attends node j", over a zero-filled buffer
    ours = _tree_outputs(I64, torch.zeros(2 * N, dtype=torch.uint8))
    spec.build_tree_kernel_efficient_cpu(t(PARENTS), t(SELECTED), t(SEQ_LENS), *ours, TOPK, DEPTH, N, 2)
    packed = [sum(bit << j for j, bit in enumerate(row)) for rows in ANCESTOR_ROWS for row in rows]
    assert ours[0].tolist() == packed
    assert ours[1].tolist() == _expected_positions()
    assert ours[3].tolist() == NEXT_TOKEN and ours[4].tolist() == NEXT_SIBLING

    # 8 < n <= 16: two bytes per node (a uint16 buffer); a chain root -> 1 -> ... -> 9 of topk = 1, whose
    # step-s candidate is c_s with parent c_{s-1}
    n = 10
    mask, positions = torch.zeros(n, dtype=torch.uint16), torch.empty(n, dtype=I64)
    ri, nt, ns = torch.full((3, 1, n), -1, dtype=I64)
    parent_list, selected = t([[-1] + list(range(n - 2))]), t([list(range(n - 1))])
    spec.build_tree_kernel_efficient_cpu(parent_list, selected, t([7]), mask, positions, ri, nt, ns, 1, n - 1, n, 2)
    assert mask.tolist() == [(1 << (i + 1)) - 1 for i in range(n)]
    assert positions.tolist() == list(range(7, 7 + n))
    assert nt.tolist() == [list(range(1, n)) + [-1]] and ns.tolist() == [[-1] * n]

    # spec steps = 1 (MTP): an empty parent_list, every draft node a child of the root
    mask, positions = torch.full((2 * 3 * 3,), True), torch.empty(6, dtype=I64)
    ri, nt, ns = torch.full((3, 2, 3), -1, dtype=I64)
    spec.build_tree_kernel_efficient_cpu(torch.empty(2, 0, dtype=I64), t([[0, 1], [0, 1]]), t([4, 6]), mask,
                                         positions, ri, nt, ns, 2, 1, 3, 1)
    assert positions.tolist() == [4, 5, 5, 6, 7, 7]
    assert nt.tolist() == [[1, -1, -1]] * 2 and ns.tolist() == [[-1, 2, -1]] * 2
    assert mask.view(2, 3, 3).int().tolist() == [[[1, 0, 0], [1, 1, 0], [1, 0, 1]]] * 2


def test_reconstruct_indices_from_tree_mask():
    from sglang.kernels.ops.speculative.reconstruct_tree import reconstruct_indices_from_tree_mask_triton

    # NGRAM's mask: row i marks i's ancestors and i itself; here the two trees above
    mask = torch.tensor(ANCESTOR_ROWS, dtype=torch.bool).view(-1)
    seq_lens = t(SEQ_LENS)
    ours = _tree_outputs(I64, None)[1:]
    spec.reconstruct_indices_from_tree_mask(mask, seq_lens, *ours, 2, N)   # its CPU branch: the *_cpu op
    positions, ri, nt, ns = ours
    assert positions.tolist() == _expected_positions()
    assert ri.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert nt.tolist() == NEXT_TOKEN and ns.tolist() == NEXT_SIBLING

    ref = _tree_outputs(I64, None)[1:]
    reconstruct_indices_from_tree_mask_triton(mask, seq_lens, *ref, 2, N)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)

    # a wider tree: root -> {1, 4, 6}, 1 -> {2, 3}, 4 -> {5}, 6 -> {7}; int32 outputs keep their dtype
    parent = [-1, 0, 1, 1, 0, 4, 0, 6]
    rows = []
    for i in range(8):
        row, j = [0] * 8, i
        while j >= 0:
            row[j], j = 1, parent[j]
        rows.append(row)
    mask = torch.tensor(rows, dtype=torch.bool).view(-1)
    out = (torch.empty(8, dtype=I32), *torch.empty(3, 1, 8, dtype=I32))
    spec.reconstruct_indices_from_tree_mask(mask, t([10], I32), *out, 1, 8)
    assert out[0].tolist() == [10, 11, 12, 12, 11, 12, 11, 12]
    assert out[2].tolist() == [[1, 2, -1, -1, 5, -1, 7, -1]]
    assert out[3].tolist() == [[-1, 4, 3, -1, 6, -1, -1, -1]]
    ref = (torch.empty(8, dtype=I64), *torch.empty(3, 1, 8, dtype=I64))
    reconstruct_indices_from_tree_mask_triton(mask, t([10]), *ref, 1, 8)
    for a, b in zip(out, ref):
        assert a.tolist() == b.tolist()


def test_verify_tree_greedy():
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    # requests 0 and 1: the two trees above; request 2: a chain root -> 1 -> 2 -> 3 -> 4, longer than the
    # 3 drafts a verify may accept (accept_index has spec steps + 1 = 4 columns)
    retrieve_index = torch.arange(15, dtype=I64).view(3, N)
    next_token = t(NEXT_TOKEN + [[1, 2, 3, 4, -1]])
    next_sibling = t(NEXT_SIBLING + [[-1] * 5])
    candidates = t([[10, 11, 12, 13, 14], [20, 21, 22, 23, 24], [30, 31, 32, 33, 34]])
    target = 1000 + torch.arange(15, dtype=I64).view(3, N)
    target[0, 0] = 12        # root's argmax is node 2 (the second child: found through the sibling link)
    target[1, 0] = 21        # request 1 takes node 1, then its child node 3, and stops there
    target[1, 1] = 23
    target[2, :4] = t([31, 32, 33, 34])   # every draft matches: the cap stops after 3

    def run(fn, **names):
        predicts = torch.zeros(15, dtype=I32)
        accept_index = torch.full((3, DEPTH + 1), -1, dtype=I32)
        accept_num = torch.empty(3, dtype=I32)
        fn(predicts, accept_index, accept_num, candidates, retrieve_index, next_token, next_sibling, target)
        return predicts, accept_index, accept_num

    predicts, accept_index, accept_num = run(spec.verify_tree_greedy_cpu)
    assert accept_index.tolist() == [[0, 2, -1, -1], [5, 6, 8, -1], [10, 11, 12, 13]]
    assert accept_num.tolist() == [1, 2, 3]
    expected = [0] * 15
    for idx, tok in {0: 12, 2: 1002, 5: 21, 6: 23, 8: 1008, 10: 31, 11: 32, 12: 33, 13: 34}.items():
        expected[idx] = tok
    assert predicts.tolist() == expected

    for a, b in zip((predicts, accept_index, accept_num), run(verify_tree_greedy_triton)):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------- accept path / inputs
def test_fill_accept_out_cache_loc():
    from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc

    accept_index = t([[0, 2, -1, -1], [5, 6, 8, -1]], I32)
    out_cache_loc = torch.arange(200, 210, dtype=I64)
    ours = torch.zeros(8, dtype=I64)
    spec.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, ours)
    assert ours.tolist() == [200, 202, 205, 206, 208, 0, 0, 0]

    ref = torch.zeros(8, dtype=I64)
    fill_accept_out_cache_loc[(8,)](accept_index, out_cache_loc, ref, next_power_of_2(8))
    assert torch.equal(ours, ref)


def test_fill_bonus_tokens():
    from sglang.kernels.ops.speculative.eagle import fill_bonus_tokens

    accept_tokens = t([[7, 8, 9, 0], [4, 0, 0, 0], [1, 2, 3, 5]], I32)
    accept_lens = t([3, 1, 4], I32)
    ours = torch.zeros(3, dtype=I32)
    spec.fill_bonus_tokens_cpu(accept_tokens, accept_lens, ours, 4)
    assert ours.tolist() == [9, 4, 5]

    ref = torch.zeros(3, dtype=I32)
    fill_bonus_tokens[(3,)](accept_tokens, accept_lens, ref, 4)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("select", [False, True])
def test_rotate_input_ids(select):
    from sglang.kernels.ops.speculative.multi_layer_eagle import rotate_input_ids_kernel

    ids = torch.arange(10, 22, dtype=I64)               # segments [0, 4), [4, 9) (12 tokens long), [9, 9)
    start, lens = t([0, 4, 9], I32), t([4, 5, 0])
    new = t([100, 101, 102])
    select_index = t([1, 6, 11]) if select else None
    ours = ids.clone()
    spec.rotate_input_ids_cpu(ours, start, lens, new, select_index)
    if select:
        expected = [11, 100, 13, 13, 15, 16, 101, 18, 18, 19, 20, 21]
    else:
        expected = [11, 12, 13, 100, 15, 16, 17, 18, 101, 19, 20, 21]
    assert ours.tolist() == expected

    ref = ids.clone()
    rotate_input_ids_kernel[(3,)](ref, start, lens, new, select_index, BLOCK_SIZE=4096 if select else 8)
    assert torch.equal(ours, ref)


def test_random_trees_match_triton():
    """Random trees: reconstruct (NGRAM) and greedy verify against SGLang's Triton versions."""
    from sglang.kernels.ops.speculative.reconstruct_tree import reconstruct_indices_from_tree_mask_triton
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    g = torch.Generator().manual_seed(1)
    bs, n, steps = 3, 8, 5
    rows = torch.zeros(bs, n, n, dtype=torch.bool)
    for b in range(bs):
        parent = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
        for i in range(n):
            j = i
            while j >= 0:
                rows[b, i, j], j = True, parent[j]
    mask, seq_lens = rows.view(-1), torch.randint(1, 50, (bs,), generator=g)
    ours = (torch.empty(bs * n, dtype=I64), *torch.empty(3, bs, n, dtype=I64))
    ref = (torch.empty(bs * n, dtype=I64), *torch.empty(3, bs, n, dtype=I64))
    spec.reconstruct_indices_from_tree_mask(mask, seq_lens, *ours, bs, n)
    reconstruct_indices_from_tree_mask_triton(mask, seq_lens, *ref, bs, n)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)

    _, ri, nt, ns = ours
    for _ in range(4):   # tokens from a 3-word vocabulary: many matches, some on second siblings
        candidates = torch.randint(0, 3, (bs, n), generator=g)
        target = torch.randint(0, 3, (bs, n), generator=g)
        results = []
        for fn in (spec.verify_tree_greedy_cpu, verify_tree_greedy_triton):
            out = (torch.zeros(bs * n, dtype=I32), torch.full((bs, steps), -1, dtype=I32), torch.empty(bs, dtype=I32))
            fn(*out, candidates, ri, nt, ns, target)
            results.append(out)
        for a, b in zip(*results):
            assert torch.equal(a, b)
