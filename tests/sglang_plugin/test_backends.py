"""Decode, target verify and commit through SGLang's own backend classes on tiny CPU tensors, checked
against the reference conventional recurrence (sglang_replayssm.reference.<family>.conventional_step).

What runs for real: SGLang's HybridReqToTokenPool (with our pool class), Mamba2AttnBackend /
GDNAttnBackend / KDAAttnBackend construction and init_forward_metadata (decode and target-verify
batches), the module-level ``selective_state_update`` that MambaMixer2 calls, GDNKernelDispatcher /
KDAKernelDispatcher ``decode`` / ``packed_decode`` / ``target_verify``, ``Mamba2AttnBackend.forward``
(with a stand-in mixer for the prefill write) and ``spec_utils.commit_mamba_states_after_verify``.
What does not run here: MambaMixer2.forward / the GDN and KDA ``forward_decode`` bodies (their
causal-conv kernels are bound only on CUDA/NPU/XPU builds), so the tests call the kernel entry points
with the arguments those bodies pass.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.accounting import StateSizes
from sglang_replayssm.native.step_stats import account_verify
from sglang_replayssm.reference import gdn as ref_gdn
from sglang_replayssm.reference import kda as ref_kda
from sglang_replayssm.reference import mamba2 as ref_m2

from .conftest import GDN, KDA, M2, fake_runner, make_req_pool, replayssm, sglang_context

# every plugin step of these tests runs under the host-read guard (conftest.no_host_reads)
pytestmark = pytest.mark.usefixtures("no_host_reads")

TOL = dict(rtol=1e-4, atol=1e-4)


def _batch(mode, slots, req_pool, spec_info=None, tokens_per_row=1):
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    B = len(slots)
    req_pool.req_index_to_mamba_index_mapping[torch.arange(B)] = torch.tensor(slots, dtype=torch.int32)
    n = B * tokens_per_row
    seq = torch.full((B,), 8, dtype=torch.int32)
    return ForwardBatch(forward_mode=mode, batch_size=B, input_ids=torch.zeros(n, dtype=torch.int64),
                        req_pool_indices=torch.arange(B, dtype=torch.int32), seq_lens=seq, seq_lens_cpu=seq.clone(),
                        out_cache_loc=torch.zeros(n, dtype=torch.int64), seq_lens_sum=int(seq.sum()),
                        positions=torch.zeros(n, dtype=torch.int64), spec_info=spec_info)


def _metric(name):
    from sglang_replayssm.sglang_plugin import metrics

    return metrics.metrics()[name]._value.get()


def _commit(req_pool, slots, accepted_paths, T):
    """SGLang's commit entry point, as the EAGLE worker calls it."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative import spec_utils

    B = len(slots)
    accept_lens = torch.tensor([len(p) for p in accepted_paths], dtype=torch.int32)
    accept_index = torch.full((B, T), -1, dtype=torch.int64)
    for b, p in enumerate(accepted_paths):
        accept_index[b, : len(p)] = torch.tensor([b * T + n for n in p])
    worker = SimpleNamespace(model_runner=SimpleNamespace(req_to_token_pool=req_pool))
    batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, req_pool_indices=torch.arange(B, dtype=torch.int32))
    assert hasattr(spec_utils.commit_mamba_states_after_verify, "__wrapped__")
    spec_utils.commit_mamba_states_after_verify(worker, batch, accept_lens, accept_index, T)


# ----------------------------------------------------------------------------- Mamba-2 (Nemotron-H-like)


class _PrefillMixer:
    """Stands in for MambaMixer2.forward's prefill branch: writes the final state the way SGLang's
    chunked scan does (``ssm_state[state_indices] = varlen_state``)."""

    def __init__(self, states):
        self.states = states

    def forward(self, *, hidden_states, output, layer_cache, metadata, **kw):
        idx = metadata.mamba_cache_indices[: metadata.num_prefills].long()
        layer_cache.temporal[idx] = self.states.to(layer_cache.temporal.dtype)
        return hidden_states, None, None


def _m2_inputs(B, T=None):
    """x, dt, B, C as MambaMixer2 hands them out: x, B, C split out of one conv output, dt a slice of the projection
    (views whose token rows are a row of those apart; the kernels read them in place)."""
    H, P, N, G = M2["H"], M2["P"], M2["N"], M2["G"]
    lead = (B,) if T is None else (B, T)
    xbc = torch.randn(*lead, H * P + 2 * G * N)
    xbc[..., H * P:] *= 0.5
    x, b, c = torch.split(xbc, [H * P, G * N, G * N], dim=-1)
    dt = torch.randn(*lead, 2 * H)[..., :H] * 0.5
    return x.reshape(*lead, H, P), dt, b.reshape(*lead, G, N), c.reshape(*lead, G, N)


def _m2_call(layer_cache, idx, x, dt, Bm, Cm, A, D, dt_bias, out):
    """Call SGLang's selective_state_update the way MambaMixer2.forward does (A, dt, D, dt_bias expanded)."""
    from sglang.srt.layers.attention.mamba import mamba as mixer_mod

    P, N = M2["P"], M2["N"]
    assert hasattr(mixer_mod.selective_state_update, "__wrapped__"), "MambaMixer2's kernel binding is not hooked"
    A_d = A[:, None, None].expand(-1, P, N)
    dt_d = dt[..., None].expand(*dt.shape, P)
    mixer_mod.selective_state_update(layer_cache.temporal, x, dt_d, A_d, Bm, Cm, D[:, None].expand(-1, P), z=None,
                                     dt_bias=dt_bias[:, None].expand(-1, P), dt_softplus=True,
                                     state_batch_indices=idx, out=out)


@pytest.fixture(params=["reference", "kernels"])
def ops(request, monkeypatch):
    """Which implementation the hooks call: the PyTorch reference (what runs on CPU), or the Triton
    kernels (what runs on CUDA), here under TRITON_INTERPRET=1."""
    from sglang_replayssm.sglang_plugin.options import OPS_ENV

    monkeypatch.setenv(OPS_ENV, request.param)
    return request.param


def test_mamba2_prefill_decode_verify_commit_match_conventional(ops):
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    torch.manual_seed(0)
    H, P, N = M2["H"], M2["P"], M2["N"]
    T, W = 3, 4
    with replayssm(window=W), sglang_context(speculative_num_draft_tokens=T) as sa:
        req_pool = make_req_pool("mamba2", size=4, drafts=T)
        pool = req_pool.mamba_pool
        be = Mamba2AttnBackend(fake_runner(sa, req_pool))
        slots, layer_id, layer = [3, 1], 2, 1
        A, D, dt_bias = -torch.exp(torch.randn(H) * 0.3), torch.randn(H), torch.randn(H) * 0.3
        cache = req_pool.mamba2_layer_cache(layer_id)
        assert cache.temporal.data_ptr() == pool.replay.ckpt[layer].data_ptr()

        # prefill: SGLang's Mamba2AttnBackend.forward (hooked) with a mixer that writes the final state
        init = torch.randn(2, H, P, N) * 0.3
        fb = _batch(ForwardMode.EXTEND, slots, req_pool)
        fb.extend_seq_lens = torch.tensor([2, 2], dtype=torch.int32)
        fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu = [2, 2], [0, 0]
        fb.extend_prefix_lens = torch.zeros(2, dtype=torch.int32)
        fb.extend_start_loc = torch.tensor([0, 2], dtype=torch.int32)
        fb.extend_num_tokens = 4
        fb.input_ids = torch.zeros(4, dtype=torch.int64)
        fb.positions = torch.tensor([0, 1, 0, 1])
        fb.out_cache_loc = torch.zeros(4, dtype=torch.int64)
        be.init_forward_metadata(fb)
        be.forward(_PrefillMixer(init), torch.zeros(4, 8), None, layer_id, fb)
        ref = init.clone()
        torch.testing.assert_close(pool.materialize(layer, slots), ref)

        # decode: more steps than the window, so rows flush
        for _ in range(2 * W + 1):
            be.init_forward_metadata(_batch(ForwardMode.DECODE, slots, req_pool))
            x, dt, Bm, Cm = _m2_inputs(2)
            out = torch.empty(2, H, P)
            _m2_call(cache, be.forward_metadata.mamba_cache_indices, x, dt, Bm, Cm, A, D, dt_bias, out)
            y, ref = ref_m2.conventional_step(ref, x, dt, A, Bm, Cm, D, dt_bias)
            torch.testing.assert_close(out, y, **TOL)
        pool.settle()
        assert pool.replay.cursor[slots].tolist() == [(2 * W + 1) % W] * 2
        torch.testing.assert_close(pool.materialize(layer, slots), ref, **TOL)

        # target verify of a chain of T tokens, then commit 2 of row 0 and 3 of row 1
        spec = SimpleNamespace(draft_token_num=T, ragged_verify_layout=None, retrieve_next_token=None,
                               retrieve_next_sibling=None)
        be.init_forward_metadata(_batch(ForwardMode.TARGET_VERIFY, slots, req_pool, spec, T))
        assert pool.verify_parents is None   # a chain verify: no tree parents for the kernels
        x, dt, Bm, Cm = _m2_inputs(2, T)
        out = torch.empty(2, T, H, P)
        _m2_call(cache, be.forward_metadata.mamba_cache_indices, x, dt, Bm, Cm, A, D, dt_bias, out)
        states = []
        s = ref.clone()
        for t in range(T):
            y, s = ref_m2.conventional_step(s, x[:, t], dt[:, t], A, Bm[:, t], Cm[:, t], D, dt_bias)
            torch.testing.assert_close(out[:, t], y, **TOL)
            states.append(s)
        windows = pool.mamba_cache.intermediate_conv_window[0]
        windows.copy_(torch.randn_like(windows))
        accepted = [[0, 1], [0, 1, 2]]
        pool.flush_metrics()   # the decode steps' counts out first
        names = ("replayssm:accepted_records_total", "replayssm:rollbacks_total", "replayssm:flushes_total",
                 "replayssm:nonflush_steps_total")
        counts = {n: _metric(n) for n in names}
        bytes_before = {k: _metric(f"replayssm:{k}_total") for k in
                        ("state_bytes_read", "state_bytes_written", "conventional_state_bytes")}
        _commit(req_pool, slots, accepted, T)
        pool.flush_metrics()   # the verify rows' fold count is a device counter, published with the decode ones
        delta = {n: _metric(n) - counts[n] for n in names}
        # cursor 1 + 2 accepted < W: no fold; 1 + 3 = W: that row folds
        assert delta == {"replayssm:accepted_records_total": 5, "replayssm:rollbacks_total": 1,
                         "replayssm:flushes_total": 1, "replayssm:nonflush_steps_total": 1}, delta
        # its state bytes are what the native engine counts for the same rows (one accounting, accounting.py)
        native = dict.fromkeys(["flushes", "nonflush_steps", "state_bytes_read", "state_bytes_written",
                                "conventional_state_bytes", "accepted_records"], 0)
        sizes = StateSizes.of(pool.replay, conventional_itemsize=cache.temporal.element_size())
        account_verify(sizes, native, "replay", W, [1, 1], [2, 3], T)
        assert {k: _metric(f"replayssm:{k}_total") - bytes_before[k] for k in bytes_before} == {
            k: native[k] for k in bytes_before}
        # r + w, 2 layers, 2 rows of T tokens, fp32 states
        assert native["state_bytes_read"] > 0 and native["conventional_state_bytes"] == 2 * 2 * 2 * T * H * P * N * 4
        ref = torch.stack([states[1][0], states[2][1]])
        torch.testing.assert_close(pool.materialize(layer, slots), ref, **TOL)
        conv = pool.mamba_cache.conv[0]
        torch.testing.assert_close(conv[:, slots[0]], windows[:, 0, 1])
        torch.testing.assert_close(conv[:, slots[1]], windows[:, 1, 2])

        # decoding after the commit continues from the committed state
        be.init_forward_metadata(_batch(ForwardMode.DECODE, slots, req_pool))
        x, dt, Bm, Cm = _m2_inputs(2)
        out = torch.empty(2, H, P)
        _m2_call(cache, be.forward_metadata.mamba_cache_indices, x, dt, Bm, Cm, A, D, dt_bias, out)
        y, ref = ref_m2.conventional_step(ref, x, dt, A, Bm, Cm, D, dt_bias)
        torch.testing.assert_close(out, y, **TOL)


# ----------------------------------------------------------------------------- GDN (Qwen3-Next-like), KDA


def _delta_inputs(family, B, T=None):
    lead = (B,) if T is None else (B, T)
    if family == "gdn":
        Hk, H, K, V = GDN["Hk"], GDN["H"], GDN["K"], GDN["V"]
        a = torch.randn(*lead, H)
    else:
        Hk = H = KDA["H"]
        K = V = KDA["D"]
        a = torch.randn(*lead, H * K)
    return torch.randn(*lead, Hk, K), torch.randn(*lead, Hk, K), torch.randn(*lead, H, V), a, torch.randn(*lead, H)


def _delta_backend(family, sa, req_pool):
    if family == "gdn":
        from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend as cls
    else:
        from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend as cls
    return cls(fake_runner(sa, req_pool))


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_delta_decode_verify_tree_commit_match_conventional(family, ops):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    torch.manual_seed(1)
    ref_mod = ref_gdn if family == "gdn" else ref_kda
    H = GDN["H"] if family == "gdn" else KDA["H"]
    K = GDN["K"] if family == "gdn" else KDA["D"]
    T, W = 4, 3
    with replayssm(window=W), sglang_context(speculative_num_draft_tokens=T, speculative_eagle_topk=2) as sa:
        req_pool = make_req_pool(family, size=3, drafts=T)
        pool = req_pool.mamba_pool
        be = _delta_backend(family, sa, req_pool)
        disp = be.kernel_dispatcher
        slots, layer_id, layer = [2, 3], 0, 0
        A_log = torch.randn(H) * 0.3
        dt_bias = torch.randn(H) * 0.3 if family == "gdn" else torch.randn(H * K) * 0.3
        ref_bias = dt_bias if family == "gdn" else dt_bias.reshape(H, K)
        cache = req_pool.mamba2_layer_cache(layer_id)
        ref = torch.zeros(2, *pool.replay.ckpt.shape[2:])
        for step in range(2 * W):
            be.init_forward_metadata(_batch(ForwardMode.DECODE, slots, req_pool))
            idx = be.forward_metadata.mamba_cache_indices
            q, k, v, a, b = _delta_inputs(family, 2)
            if step % 2 == 0:
                out = disp.decode(q[None], k[None], v[None], a, b, A_log=A_log, dt_bias=dt_bias,
                                  ssm_states=cache.temporal, cache_indices=idx, query_start_loc=None)
            else:  # the packed path GDNAttnBackend.forward_decode takes on CUDA builds
                mixed = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=-1)
                out = disp.packed_decode(mixed, a, b, A_log=A_log, dt_bias=dt_bias, scale=K ** -0.5,
                                         ssm_states=cache.temporal, cache_indices=idx, num_v_heads=H,
                                         head_v_dim=v.shape[-1])
            a_ref = a if family == "gdn" else a.reshape(2, H, K)
            y, ref = ref_mod.conventional_step(ref, q, k, v, a_ref, b, A_log, ref_bias)
            torch.testing.assert_close(out[0], y, **TOL)

        # tree verify: node 0 is the root, nodes 1 and 2 its children, node 3 a child of node 2
        nxt = torch.tensor([[1, -1, 3, -1]] * 2)
        sib = torch.tensor([[-1, 2, -1, -1]] * 2)
        parents = [-1, 0, 0, 2]
        spec = SimpleNamespace(draft_token_num=T, ragged_verify_layout=None, retrieve_next_token=nxt,
                               retrieve_next_sibling=sib)
        be.init_forward_metadata(_batch(ForwardMode.TARGET_VERIFY, slots, req_pool, spec, T))
        assert pool.verify_parents.tolist() == [parents, parents]
        q, k, v, a, b = _delta_inputs(family, 2, T)
        # as GDNAttnBackend.forward_extend hands them out: views split out of the conv output (read in place)
        mixed = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=-1).flatten(0, 1)
        qv, kv, vv = torch.split(mixed, [q[0, 0].numel(), k[0, 0].numel(), v[0, 0].numel()], dim=-1)
        out = disp.target_verify(A_log, dt_bias, qv.view(1, 2 * T, *q.shape[2:]), kv.view(1, 2 * T, *k.shape[2:]),
                                 vv.view(1, 2 * T, *v.shape[2:]), a.flatten(0, 1), b.flatten(0, 1),
                                 ssm_states=cache.temporal, cache_indices=be.forward_metadata.mamba_cache_indices,
                                 query_start_loc=None, intermediate_states_buffer=None,
                                 intermediate_state_indices=None, cache_steps=T, retrieve_parent_token=None)
        out = out.reshape(2, T, *out.shape[2:])
        a_ref = a if family == "gdn" else a.reshape(2, T, H, K)
        node_state = {}
        for n in range(T):
            base = ref if parents[n] < 0 else node_state[parents[n]]
            y, node_state[n] = ref_mod.conventional_step(base, q[:, n], k[:, n], v[:, n], a_ref[:, n], b[:, n],
                                                         A_log, ref_bias)
            torch.testing.assert_close(out[:, n], y, **TOL)
        # row 0 accepts root -> 2 -> 3, row 1 accepts root -> 1
        _commit(req_pool, slots, [[0, 2, 3], [0, 1]], T)
        ref = torch.stack([node_state[3][0], node_state[1][1]])
        torch.testing.assert_close(pool.materialize(layer, slots), ref, **TOL)
        be.init_forward_metadata(_batch(ForwardMode.DECODE, slots, req_pool))
        q, k, v, a, b = _delta_inputs(family, 2)
        out = disp.decode(q[None], k[None], v[None], a, b, A_log=A_log, dt_bias=dt_bias, ssm_states=cache.temporal,
                          cache_indices=be.forward_metadata.mamba_cache_indices, query_start_loc=None)
        a_ref = a if family == "gdn" else a.reshape(2, H, K)
        y, ref = ref_mod.conventional_step(ref, q, k, v, a_ref, b, A_log, ref_bias)
        torch.testing.assert_close(out[0], y, **TOL)


def test_kda_prefill_stays_out_of_sglangs_prefill_graph_over_a_replay_pool():
    """SGLang would run a KDA prefill inside its breakable prefill CUDA graph (GLM-5.3 Flash by default), where the
    plugin's Python around a prefill runs at capture only: over a ReplaySSM pool the backend says it cannot."""
    from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend

    with replayssm(window=4), sglang_context() as sa:
        be = _delta_backend("kda", sa, make_req_pool("kda", size=2))
        be.kernel_dispatcher.extend_kernel = SimpleNamespace(prefill_graph_wrapper_cls=object)
        be.accept_lens_pool = None
        assert KDAAttnBackend.supports_prefill_graph_extend.__wrapped__(be) is True   # SGLang's own answer
        assert be.supports_prefill_graph_extend() is False


def test_prefill_batch_folds_pending_records_first():
    """A prefill / mixed batch: SGLang's chunked kernels read the checkpoint as the initial state, so the
    metadata hook folds the rows' committed records before them (GDN: all rows go through extend)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    torch.manual_seed(2)
    with replayssm(window=8), sglang_context() as sa:
        req_pool = make_req_pool("gdn", size=3)
        pool = req_pool.mamba_pool
        be = _delta_backend("gdn", sa, req_pool)
        slots, H = [1, 3], GDN["H"]
        cache = req_pool.mamba2_layer_cache(0)
        for _ in range(3):
            be.init_forward_metadata(_batch(ForwardMode.DECODE, slots, req_pool))
            q, k, v, a, b = _delta_inputs("gdn", 2)
            be.kernel_dispatcher.decode(q[None], k[None], v[None], a, b, A_log=torch.zeros(H), dt_bias=torch.zeros(H),
                                        ssm_states=cache.temporal, cache_indices=be.forward_metadata.mamba_cache_indices,
                                        query_start_loc=None)
        pool.settle()
        assert pool.replay.cursor[slots].tolist() == [3, 3]
        state = pool.materialize(0, slots)
        before_ckpt = pool.replay.ckpt[0, slots].clone()
        fb = _batch(ForwardMode.EXTEND, slots, req_pool)
        fb.extend_seq_lens = torch.tensor([1, 1], dtype=torch.int32)
        fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu = [1, 1], [7, 7]
        fb.extend_prefix_lens = torch.tensor([7, 7], dtype=torch.int32)
        fb.extend_start_loc = torch.tensor([0, 1], dtype=torch.int32)
        fb.extend_num_tokens = 2
        be.init_forward_metadata(fb)
        assert pool.replay.cursor[slots].tolist() == [0, 0]
        assert not torch.equal(pool.replay.ckpt[0, slots], before_ckpt)
        torch.testing.assert_close(pool.replay.ckpt[0, slots], state, **TOL)  # the checkpoint is the full state


def _graph_backend(sa):
    """A Mamba-2 request pool of 4 slots and SGLang's Mamba-2 backend with CUDA-graph state for 4 rows."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend

    req_pool = make_req_pool("mamba2", size=4)
    be = Mamba2AttnBackend(fake_runner(sa, req_pool))
    be.init_cuda_graph_state(4, 4)
    return req_pool, be


def _graph_decode_step(be, rows, req_pool):
    """SGLang's CUDA-graph replay metadata for a decode of ``rows`` padded to the graph's 4 rows (padding rows: the
    first row's slot, sequence length 1): SGLang's static index buffer, its padding rows -1."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    fb = _batch(ForwardMode.DECODE, rows + [rows[0]] * (4 - len(rows)), req_pool)
    fb.seq_lens_cpu = torch.tensor([8] * len(rows) + [1] * (4 - len(rows)), dtype=torch.int32)
    be.init_forward_metadata_out_graph(fb)
    return be.forward_metadata.mamba_cache_indices


def test_cuda_graph_replay_metadata_notes_decode_rows_and_padding_hits_slot_0():
    """The CUDA-graph path: init_forward_metadata_out_graph fills SGLang's static index buffer (padding
    rows = -1); the hook notes the step, padding rows land on our padding slot 0, real rows advance."""
    torch.manual_seed(3)
    H, P = M2["H"], M2["P"]
    with replayssm(window=4), sglang_context() as sa:
        req_pool, be = _graph_backend(sa)
        pool = req_pool.mamba_pool
        idx = _graph_decode_step(be, [2, 3], req_pool)
        assert idx.tolist() == [2, 3, -1, -1]
        A, D, dt_bias = -torch.ones(H), torch.zeros(H), torch.zeros(H)
        before = pool.materialize(0, [1, 2, 3, 4])
        pool.get_cpu_copy(torch.tensor([2, 3]))  # e.g. a HiCache backup mid-step: must not move cursors
        assert pool.replay.cursor[[2, 3]].tolist() == [0, 0]
        x, dt, Bm, Cm = _m2_inputs(4)
        _m2_call(req_pool.mamba2_layer_cache(0), idx, x, dt, Bm, Cm, A, D, dt_bias, torch.empty(4, H, P))
        pool.settle()
        assert pool.replay.cursor[[1, 2, 3, 4]].tolist() == [0, 1, 1, 0]
        after = pool.materialize(0, [1, 2, 3, 4])
        torch.testing.assert_close(after[[0, 3]], before[[0, 3]])  # untouched slots
        assert not torch.equal(after[1], before[1]) and not torch.equal(after[2], before[2])


def test_cuda_graph_replay_of_a_padded_tree_verify_opens_with_chains_on_the_padding_rows(ops):
    """A tree verify of 3 requests replayed in the graph captured for 4 (SGLang pads to a captured size; on the
    H200 13 running requests replayed as 14 killed the scheduler once): SGLang's draft-tree arrays hold the 3 real
    rows only. The verify opens: the real rows' parents from the tree, the padding row a chain (its slot is -1)."""
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    T = 4
    with replayssm(window=4), sglang_context(speculative_num_draft_tokens=T, speculative_eagle_topk=2) as sa:
        req_pool = make_req_pool("gdn", size=4, drafts=T)
        be = GDNAttnBackend(fake_runner(sa, req_pool))
        be.init_cuda_graph_state(4, 4 * T)
        nxt = torch.tensor([[1, -1, 3, -1], [1, 2, 3, -1], [1, -1, 3, -1]])
        sib = torch.tensor([[-1, 2, -1, -1], [-1, -1, -1, -1], [-1, 2, -1, -1]])
        spec = SimpleNamespace(draft_token_num=T, ragged_verify_layout=None, retrieve_next_token=nxt,
                               retrieve_next_sibling=sib)
        fb = _batch(ForwardMode.TARGET_VERIFY, [2, 3, 4, 2], req_pool, spec, T)
        fb.seq_lens_cpu = torch.tensor([8, 8, 8, 1], dtype=torch.int32)   # the padding row: SGLang's fill value
        be.init_forward_metadata_out_graph(fb)
        assert be.forward_metadata.mamba_cache_indices.tolist() == [2, 3, 4, -1]
        pool = req_pool.mamba_pool
        assert pool.verify_parents.tolist() == [[-1, 0, 0, 2], [-1, 0, 1, 2], [-1, 0, 0, 2], [-1, 0, 1, 2]]


def test_slot_conversion_is_made_once_a_step_and_afresh_for_the_next_step():
    """Every layer of a step passes the same index tensor; its int32 slots are made once (pool.step_slots). SGLang's
    CUDA-graph metadata refills one static buffer each step: the next noted step converts the new rows, never
    reusing the last step's."""
    from sglang_replayssm.sglang_plugin.backends import _slots

    H, P = M2["H"], M2["P"]
    with replayssm(window=4), sglang_context() as sa:
        req_pool, be = _graph_backend(sa)
        pool = req_pool.mamba_pool
        A, D, dt_bias = -torch.ones(H), torch.zeros(H), torch.zeros(H)
        static = None
        for rows, want, cursors in (([2, 3], [2, 3, 0, 0], [0, 1, 1, 0]), ([4, 2], [4, 2, 0, 0], [0, 2, 1, 1])):
            idx = _graph_decode_step(be, rows, req_pool)
            assert pool.step_slots is None                                   # noted: nothing carried over
            static = idx if static is None else static
            assert idx is static                                             # one buffer, refilled each step
            x, dt, Bm, Cm = _m2_inputs(4)
            _m2_call(req_pool.mamba2_layer_cache(0), idx, x, dt, Bm, Cm, A, D, dt_bias, torch.empty(4, H, P))
            assert pool.step_slots[1].tolist() == want
            assert _slots(pool, idx) is pool.step_slots[1]                   # the next layer reuses it
            pool.settle()
            assert pool.replay.cursor[[1, 2, 3, 4]].tolist() == cursors


def test_host_read_guard_names_a_reintroduced_read():
    """The guard of these tests is not blind: a read in the project's step code (the native engine's checked
    flush, which reads the cursors on the host, as the plugin's flush used to) is recorded with its file and
    line, while the same kind of read in test code is not."""
    from .host_reads import host_reads

    with replayssm(window=4), sglang_context():
        pool = make_req_pool("gdn", size=3).mamba_pool
        with host_reads() as guard:
            assert torch.tensor([1, 2]).tolist() == [1, 2]
            assert not guard.sites
            pool.replay.force_flush([1, 2])
        assert len(guard.sites) == 1 and "pool/pool.py" in guard.sites[0] and "force_flush: Tensor.tolist" in guard.sites[0]
