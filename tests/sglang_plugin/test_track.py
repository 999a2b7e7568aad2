"""``extra_buffer`` track copies through SGLang's own backend classes (``track.py``): the track slot the radix
cache will hold gets the whole ReplaySSM slot of the live row after the decode step (checkpoint + ring +
cursor, conv), and a prefill-tracked slot's stale ring is emptied; the live slot is left as it was."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from .conftest import GDN, make_req_pool, replayssm, sglang_context
from .test_backends import _batch, _delta_backend, _delta_inputs

# every plugin step of these tests runs under the host-read guard (conftest.no_host_reads)
pytestmark = pytest.mark.usefixtures("no_host_reads")


def _decode_step(be, req_pool, slots, A_log, dt_bias, track=None, same_inputs=False):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    fb = _batch(ForwardMode.DECODE, slots, req_pool)
    if track is not None:
        fb.mamba_track_mask = torch.tensor([s in track for s in slots])
        fb.mamba_track_indices = torch.tensor([track.get(s, -1) for s in slots], dtype=torch.int64)
    be.init_forward_metadata(fb)
    idx = be.forward_metadata.mamba_cache_indices
    for layer_id in (0, 2):
        cache = req_pool.mamba2_layer_cache(layer_id)
        q, k, v, a, b = _delta_inputs("gdn", len(slots))
        if same_inputs:
            q, k, v, a, b = (t[:1].expand_as(t).contiguous() for t in (q, k, v, a, b))
        be.kernel_dispatcher.decode(q[None], k[None], v[None], a, b, A_log=A_log, dt_bias=dt_bias,
                                    ssm_states=cache.temporal, cache_indices=idx, query_start_loc=None)
        cache.conv[0][idx.long()] = torch.randn_like(cache.conv[0][idx.long()])   # what SGLang's conv kernel does
        # GDNAttnBackend.forward_decode's call after each layer (hooked: noted, copied after the step)
        be._track_mamba_state_decode(fb, cache.conv[0], cache.temporal, idx, layer_id)
    req_pool.mamba_pool.settle()   # the ModelRunner.forward hook's call


def test_decode_track_copies_the_whole_slot_after_the_step():
    torch.manual_seed(3)
    W = 4
    with replayssm(window=W), sglang_context() as sa:
        req_pool = make_req_pool("gdn", size=5)
        pool = req_pool.mamba_pool
        be = _delta_backend("gdn", sa, req_pool)
        slots = [1, 2]
        A_log, dt_bias = torch.randn(GDN["H"]) * 0.3, torch.randn(GDN["H"]) * 0.3
        for _ in range(2):
            _decode_step(be, req_pool, slots, A_log, dt_bias)
        # step 3: slot 1 is at a track boundary (state after this step -> slot 4), slot 2 is not
        _decode_step(be, req_pool, slots, A_log, dt_bias, track={1: 4})
        assert pool.replay.cursor[[1, 4]].tolist() == [3, 3]   # the ring came along, after the cursor move
        for layer in range(2):
            torch.testing.assert_close(pool.materialize(layer, [4]), pool.materialize(layer, [1]), rtol=0, atol=0)
        for conv in pool.mamba_cache.conv:
            assert torch.equal(conv[:, 4], conv[:, 1])
        live_before = [pool.materialize(layer, slots) for layer in range(2)]
        # a request matching the node resumes from it; the node and the live rows decode on unchanged
        pool.copy_from(torch.tensor([4]), torch.tensor([3]))
        for layer in range(2):
            torch.testing.assert_close(pool.materialize(layer, [3]), live_before[layer][:1], rtol=1e-6, atol=1e-6)
        _decode_step(be, req_pool, [1, 3], A_log, dt_bias, same_inputs=True)
        for layer in range(2):
            torch.testing.assert_close(pool.materialize(layer, [3]), pool.materialize(layer, [1]), rtol=1e-6, atol=1e-6)
        # a row without the mask is never copied, nor is a padding destination
        assert int(pool.replay.cursor[5]) == 0 and not pool.replay.ckpt[:, 5].any()


def test_decode_track_in_a_cuda_graph_replay_is_copied_after_the_forward():
    """Decode in a CUDA graph: SGLang makes the replay metadata from a view of the batch that has no track mask
    (``build_replay_fb_view``: its captured track-save reads a static copy) and the replayed graph runs no Python,
    so no layer notes the track. The copy still happens: the metadata hook keeps the step's rows and destinations,
    and the ModelRunner.forward hook brings the real batch's mask."""
    import inspect

    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner

    from sglang_replayssm.sglang_plugin import engine_hooks

    assert "mamba_track_mask" not in inspect.getsource(decode_cuda_graph_runner.build_replay_fb_view)
    torch.manual_seed(5)
    with replayssm(window=4), sglang_context() as sa:
        req_pool = make_req_pool("gdn", size=5)
        pool = req_pool.mamba_pool
        be = _delta_backend("gdn", sa, req_pool)
        be.init_cuda_graph_state(4, 4)
        slots = [1, 2]
        A_log, dt_bias = torch.randn(GDN["H"]) * 0.3, torch.randn(GDN["H"]) * 0.3
        _decode_step(be, req_pool, slots, A_log, dt_bias)
        # the replayed step: 2 requests in the graph of 4; slot 1 at a track boundary (its state after the step ->
        # slot 4), slot 2 not
        fb = _batch(ForwardMode.DECODE, slots, req_pool)
        fb.mamba_track_mask = torch.tensor([True, False])
        fb.mamba_track_indices = torch.tensor([4, -1], dtype=torch.int64)
        view = SimpleNamespace(batch_size=4, forward_mode=ForwardMode.DECODE, actual_forward_mode=ForwardMode.DECODE,
                               req_pool_indices=torch.tensor([0, 1, 0, 0], dtype=torch.int32),
                               seq_lens=torch.tensor([8, 8, 1, 1], dtype=torch.int32),
                               seq_lens_cpu=torch.tensor([8, 8, 1, 1], dtype=torch.int32), num_padding=2,
                               spec_info=None, mamba_track_indices=torch.tensor([4, -1, 0, 0], dtype=torch.int64))
        be.init_forward_metadata_out_graph(view)
        idx = be.forward_metadata.mamba_cache_indices
        assert idx.tolist() == [1, 2, -1, -1]
        for layer_id in (0, 2):   # what the graph runs: the layers' kernels, no track-save of ours
            cache = req_pool.mamba2_layer_cache(layer_id)
            q, k, v, a, b = _delta_inputs("gdn", 4)
            be.kernel_dispatcher.decode(q[None], k[None], v[None], a, b, A_log=A_log, dt_bias=dt_bias,
                                        ssm_states=cache.temporal, cache_indices=idx, query_start_loc=None)
            cache.conv[0][slots] = torch.randn_like(cache.conv[0][slots])
        assert int(pool.replay.cursor[4]) == 0
        engine_hooks._settle_after_forward(None, SimpleNamespace(), fb)   # the ModelRunner.forward hook
        assert pool.replay.cursor[[1, 2, 4]].tolist() == [2, 2, 2]
        for layer in range(2):
            torch.testing.assert_close(pool.materialize(layer, [4]), pool.materialize(layer, [1]), rtol=0, atol=0)
        for conv in pool.mamba_cache.conv:
            assert torch.equal(conv[:, 4], conv[:, 1])
        # the next step (eager, nothing tracked) copies nothing more
        _decode_step(be, req_pool, slots, A_log, dt_bias)
        assert pool.replay.cursor[[1, 4]].tolist() == [3, 2]


def test_mamba2_track_function_is_hooked_and_deferred():
    """Mamba2AttnBackend.forward calls the module function itself for its decode rows."""
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hyb

    torch.manual_seed(4)
    with replayssm(window=4), sglang_context():
        req_pool = make_req_pool("mamba2", size=4)
        pool = req_pool.mamba_pool
        pool.replay.ckpt[:, 2] = torch.randn_like(pool.replay.ckpt[:, 2])
        pool.replay.rec_d[:, 2, 0] = torch.randn_like(pool.replay.rec_d[:, 2, 0])
        pool.replay.cursor[2] = 1
        idx = torch.tensor([2], dtype=torch.int32)
        cache = req_pool.mamba2_layer_cache(0)
        hyb.track_mamba_states_if_needed(cache.conv[0], cache.temporal, idx, torch.tensor([True]),
                                         torch.tensor([3]), 1)
        assert int(pool.replay.cursor[3]) == 0   # deferred to settle()
        pool.settle()
        assert int(pool.replay.cursor[3]) == 1
        torch.testing.assert_close(pool.materialize(0, [3]), pool.materialize(0, [2]), rtol=0, atol=0)


def test_prefill_track_empties_the_track_slots_stale_ring():
    """SGLang's extend track writes the tracked chunk state into the track slot's checkpoint; a ring left
    there by an earlier decode track must not be added on top."""
    torch.manual_seed(5)
    with replayssm(window=4), sglang_context() as sa:
        req_pool = make_req_pool("gdn", size=4)
        pool = req_pool.mamba_pool
        be = _delta_backend("gdn", sa, req_pool)
        pool.replay.rec_d[:, 3, :2] = torch.randn_like(pool.replay.rec_d[:, 3, :2])
        pool.replay.cursor[3] = 2   # stale: slot 3 held an earlier decode track
        h = torch.randn(1, 2, *pool.replay.ckpt.shape[2:])
        md = SimpleNamespace(has_mamba_track_mask=True, track_ssm_h_src=torch.tensor([1]),
                             track_ssm_h_dst=torch.tensor([3]), track_ssm_recompute_dst=None,
                             track_ssm_final_src=torch.tensor([], dtype=torch.long),
                             track_ssm_final_dst=torch.tensor([], dtype=torch.long))
        cache = req_pool.mamba2_layer_cache(2)
        be._track_mamba_state_extend(None, h, cache.temporal, md)
        assert int(pool.replay.cursor[3]) == 0
        torch.testing.assert_close(pool.materialize(1, [3])[0], h[0, 1], rtol=0, atol=0)


@pytest.mark.parametrize("ops", ["reference", "kernels"])
@pytest.mark.parametrize("entry", ["spec_utils", "backend"])
def test_verify_track_at_accepted_prefix_boundary_tree_and_fold(entry, ops, monkeypatch):
    """extra_buffer with speculative decoding: SGLang's commit entry point (``spec_utils``), with the boundary step
    SGLang itself computes from the sequence lengths (``_verify_commit_step_indices``, track grid 64), or the
    backend method DFlash / DSpark call with the steps given (``backend``). Row 0 holds 62 tokens and accepts the
    tree path root -> 2 -> 3: it crosses 64 at node 2, so its track slot gets the state after root -> 2 (a copy that
    folds: 2 committed records + 2 >= window 4) and the conv window of node 2, while the live slot commits the whole
    path (and folds too). Row 1 crosses nothing: its track slot stays as it was. With the PyTorch reference and with
    the Triton kernels (what runs on CUDA; the commit's preparation in one launch), under TRITON_INTERPRET=1."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative import spec_utils

    from sglang_replayssm.reference import gdn as ref_gdn
    from sglang_replayssm.sglang_plugin.options import OPS_ENV

    monkeypatch.setenv(OPS_ENV, ops)

    torch.manual_seed(6)
    T, W, H = 4, 4, GDN["H"]
    with replayssm(window=W), sglang_context(speculative_num_draft_tokens=T, speculative_eagle_topk=2,
                                             mamba_track_interval=64) as sa:
        req_pool = make_req_pool("gdn", size=6, drafts=T)
        pool = req_pool.mamba_pool
        be = _delta_backend("gdn", sa, req_pool)
        disp = be.kernel_dispatcher
        slots, track = [1, 2], [4, 5]
        A_log, dt_bias = torch.randn(H) * 0.3, torch.randn(H) * 0.3
        cache = req_pool.mamba2_layer_cache(0)
        ref = torch.zeros(2, *pool.replay.ckpt.shape[2:])
        for _ in range(2):   # two committed records in each ring
            be.init_forward_metadata(_batch(ForwardMode.DECODE, slots, req_pool))
            q, k, v, a, b = _delta_inputs("gdn", 2)
            disp.decode(q[None], k[None], v[None], a, b, A_log=A_log, dt_bias=dt_bias, ssm_states=cache.temporal,
                        cache_indices=be.forward_metadata.mamba_cache_indices, query_start_loc=None)
            ref = ref_gdn.conventional_step(ref, q, k, v, a, b, A_log, dt_bias)[1]
        pool.settle()
        assert pool.replay.cursor[slots].tolist() == [2, 2]
        folded_before = pool.replay.folded[slots].tolist()
        untouched = pool.replay.ckpt[:, 5].clone()

        parents = [-1, 0, 0, 2]
        spec = SimpleNamespace(draft_token_num=T, ragged_verify_layout=None,
                               retrieve_next_token=torch.tensor([[1, -1, 3, -1]] * 2),
                               retrieve_next_sibling=torch.tensor([[-1, 2, -1, -1]] * 2))
        be.init_forward_metadata(_batch(ForwardMode.TARGET_VERIFY, slots, req_pool, spec, T))
        q, k, v, a, b = _delta_inputs("gdn", 2, T)
        disp.target_verify(A_log, dt_bias, q.flatten(0, 1)[None], k.flatten(0, 1)[None], v.flatten(0, 1)[None],
                           a.flatten(0, 1), b.flatten(0, 1), ssm_states=cache.temporal,
                           cache_indices=be.forward_metadata.mamba_cache_indices, query_start_loc=None,
                           intermediate_states_buffer=None, intermediate_state_indices=None, cache_steps=T,
                           retrieve_parent_token=None)
        node = {}
        for n in range(T):
            base = ref if parents[n] < 0 else node[parents[n]]
            node[n] = ref_gdn.conventional_step(base, q[:, n], k[:, n], v[:, n], a[:, n], b[:, n], A_log, dt_bias)[1]
        windows = pool.mamba_cache.intermediate_conv_window
        for w in windows:   # SGLang's conv kernel: the conv state after each draft, per batch row
            w[:, :2] = torch.randn_like(w[:, :2])

        accept_index = torch.tensor([[0, 2, 3, -1], [T + 0, T + 1, -1, -1]])
        batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, req_pool_indices=torch.arange(2),
                                mamba_track_indices=torch.tensor(track), seq_lens=torch.tensor([62, 10]),
                                tree_cache=SimpleNamespace(page_size=1))
        if entry == "spec_utils":
            worker = SimpleNamespace(model_runner=SimpleNamespace(req_to_token_pool=req_pool))
            spec_utils.commit_mamba_states_after_verify(worker, batch, torch.tensor([3, 2], dtype=torch.int32),
                                                        accept_index, T)
        else:
            from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend

            hybrid = object.__new__(HybridLinearAttnBackend)   # only its linear backend is read
            hybrid.linear_attn_backend = be
            hybrid.update_mamba_state_after_mtp_verify(torch.tensor([3, 1]), torch.tensor(track),
                                                       torch.tensor([2, -1]), None,
                                                       req_pool_indices=torch.arange(2, dtype=torch.int32))

        tol = dict(rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pool.materialize(0, [4])[0], node[2][0], **tol)      # the boundary state
        torch.testing.assert_close(pool.materialize(0, slots), torch.stack([node[3][0], node[1][1]]), **tol)
        assert pool.replay.cursor[[4, 1, 2]].tolist() == [0, 0, 0]   # 2 + 2, 2 + 3 and 2 + 2 records fold
        assert pool.replay.folded[4].item() == folded_before[0] + 4
        assert torch.equal(pool.replay.ckpt[:, 5], untouched) and pool.replay.cursor[5].item() == 0
        for conv, w in zip(pool.mamba_cache.conv, windows):
            assert torch.equal(conv[:, 4], w[:, 0, 2])    # conv window of the boundary node
            assert torch.equal(conv[:, 1], w[:, 0, 3])    # the live row's: its last accepted node
            assert not conv[:, 5].any()
