"""The CPU harness's KDA kernels (``cpu_harness/kda_ops.py``: what SGLang's ``kda_triton.py`` leaves unbound on CPU)
against the fp64 reference recurrence (``sglang_replayssm/reference/kda.py``), in SGLang's layouts and call forms:
varlen prefill from cached states (with the per-chunk states and the track snapshot), decode, chain and tree
target verify. The served model is tested in tests/sglang_server/test_kda_server.py."""

from __future__ import annotations

import torch

from sglang_replayssm.cpu_harness import kda_ops
from sglang_replayssm.reference import kda as ref

H, K = 2, 16
TOL = 1e-5


def _params(g):
    return torch.randn(1, 1, H, 1, generator=g) * 0.5, torch.randn(H * K, generator=g)


def _ref_tokens(S, q, k, v, a, b, A_log, dt_bias):
    """fp64 reference over tokens of one sequence: ``q, k, v, a [t, H, K]``, ``b [t, H]``; ``S [H, V, K]``."""
    outs, states = [], []
    S = S.double()[None]
    for t in range(q.shape[0]):
        o, S = ref.conventional_step(S, q[t:t + 1].double(), k[t:t + 1].double(), v[t:t + 1].double(),
                                     a[t:t + 1].double(), b[t:t + 1].double(), A_log.reshape(H).double(),
                                     dt_bias.reshape(H, K).double())
        outs.append(o[0])
        states.append(S[0])
    return torch.stack(outs), torch.stack(states)


def test_varlen_prefill_from_cached_states_equals_the_reference():
    g = torch.Generator().manual_seed(0)
    A_log, dt_bias = _params(g)
    lens = [70, 5]   # the first crosses the 64-token chunk grid
    T = sum(lens)
    q, k, v, a = (torch.randn(1, T, H, K, generator=g) for _ in range(4))
    b = torch.randn(1, T, H, generator=g)
    state = torch.randn(5, H, K, K, generator=g) * 0.1
    before = state.clone()
    slots = torch.tensor([3, 1])
    track = torch.zeros(2, H, K, K)
    o, h = kda_ops.chunk_kda(q, k, v, a, b, initial_state=state, initial_state_indices=slots,
                             use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor([0, 70, T]), A_log=A_log,
                             dt_bias=dt_bias, beta_is_raw=True, output_intermediate_states=True, track_state=track,
                             track_chunk_idx=torch.tensor([1, 0]))
    assert h.shape == (1, 3, H, K, K)   # chunks: 2 of the first sequence, 1 of the second
    lo = 0
    for i, (n, slot) in enumerate(zip(lens, slots.tolist())):
        ro, rs = _ref_tokens(before[slot], q[0, lo:lo + n], k[0, lo:lo + n], v[0, lo:lo + n], a[0, lo:lo + n],
                             b[0, lo:lo + n], A_log, dt_bias)
        assert (o[0, lo:lo + n].double() - ro).abs().max() < TOL
        assert (state[slot].double() - rs[-1]).abs().max() < TOL
        lo += n
    assert (h[0, 1].double() - _ref_tokens(before[3], q[0, :64], k[0, :64], v[0, :64], a[0, :64], b[0, :64], A_log,
                                           dt_bias)[1][-1]).abs().max() < TOL
    assert torch.equal(track[0], h[0, 1]) and torch.equal(track[1], before[1])
    assert torch.equal(state[[0, 2, 4]], before[[0, 2, 4]])


def test_decode_and_verify_chain_and_tree_equal_the_reference():
    g = torch.Generator().manual_seed(1)
    A_log, dt_bias = _params(g)
    state = torch.randn(4, H, K, K, generator=g) * 0.1
    before = state.clone()
    # decode: two rows, one token each (a as SGLang's decode passes it: [tokens, H * K])
    q, k, v = (torch.randn(1, 2, H, K, generator=g) for _ in range(3))
    a, b = torch.randn(2, H * K, generator=g), torch.randn(1, 2, H, generator=g)
    o = kda_ops.fused_sigmoid_gating_delta_rule_update(
        A_log, dt_bias, q, k, v, a, b, state, torch.tensor([2, 0]), cu_seqlens=torch.tensor([0, 1, 2]),
        use_qk_l2norm_in_kernel=True, is_kda=True)
    for r, slot in enumerate([2, 0]):
        ro, rs = _ref_tokens(before[slot], q[0, r:r + 1], k[0, r:r + 1], v[0, r:r + 1], a[r:r + 1].view(1, H, K),
                             b[0, r:r + 1], A_log, dt_bias)
        assert (o[0, r].double() - ro[0]).abs().max() < TOL and (state[slot].double() - rs[0]).abs().max() < TOL
    # target verify of 4 drafts, a tree (token 3's parent is token 1): the pool's state is left alone
    committed = state.clone()
    T = 4
    q, k, v = (torch.randn(1, T, H, K, generator=g) for _ in range(3))
    a, b = torch.randn(T, H * K, generator=g), torch.randn(1, T, H, generator=g)
    inter = torch.zeros(3, T, H, K, K)
    parents = torch.tensor([[-1, 0, 1, 1]])
    o = kda_ops.fused_sigmoid_gating_delta_rule_update(
        A_log, dt_bias, q, k, v, a, b, state, torch.tensor([2]), cu_seqlens=torch.tensor([0, T]),
        use_qk_l2norm_in_kernel=True, is_kda=True, disable_state_update=True, intermediate_states_buffer=inter,
        intermediate_state_indices=torch.tensor([1]), cache_steps=T, retrieve_parent_token=parents)
    assert torch.equal(state, committed)
    for t, path in enumerate([[0], [0, 1], [0, 1, 2], [0, 1, 3]]):   # root-to-node paths
        idx = torch.tensor(path)
        ro, rs = _ref_tokens(committed[2], q[0, idx], k[0, idx], v[0, idx], a[idx].view(-1, H, K), b[0, idx], A_log,
                             dt_bias)
        assert (o[0, t].double() - ro[-1]).abs().max() < TOL
        assert (inter[1, t].double() - rs[-1]).abs().max() < TOL
