"""Speculative decoding: commit accepted drafts by moving the ring pointer, and the radix cache's
``extra_buffer`` track slots at accepted-prefix boundaries.

SGLang's target verify leaves one full SSM state per draft token (``intermediate_ssm``) and the commit
(``spec_utils.commit_mamba_states_after_verify`` -> ``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify``)
scatters the state of the last accepted draft into the cache. With the ReplaySSM pool the verify wrote
draft *records* into the ring, so the commit is ``ReplayStatePool.commit_prepared``: the accepted prefix (chain)
or root-to-node path (EAGLE / NGRAM tree, topk > 1) stays, the pointer moves, rejected records are left behind,
and a row whose committed records reach the window folds them. The short-convolution state still rolls
back through SGLang's own per-draft conv windows. Everything is computed from SGLang's device tensors
(slots, accept lengths, accepted positions, track steps) with device ops: the commit reads nothing back to
the host (``tests/sglang_plugin/test_host_reads.py`` keeps it so).

Track slots (``--mamba-radix-cache-strategy extra_buffer``): SGLang tracks no state inside a verify forward
(``prepare_mamba_track_for_verify`` clears the track mask); when a row's accepted tokens cross a track-grid
boundary, its commit also stores the state *at the boundary* into the row's track slot
(``batch.mamba_track_indices``), the boundary given as the draft node ``mamba_steps_to_track`` (-1: no
crossing; SGLang's ``_verify_commit_step_indices`` / ``fused_commit_track_indices``). Here the track slot
gets the whole live slot with its open verify (``ReplayStatePool.copy_slots``: checkpoint, read copy, ring
with the draft records, cursor, stochastic-rounding counter) and commits there the accepted path up to that
node (``commit_prepared`` on the copy: the same pointer move, and the same fold when the copy's committed
records reach the window), before the live row commits: what the tree keeps resumes exactly as the live row
would have after those tokens, whatever the live row's own commit folds, and the live slot is not touched.
The track slot's conv state comes from SGLang's conv window of that node. The copy and the commit of the
rows that do not cross do nothing (masked on the device).

Both SGLang entry points are wrapped: the generic ``commit_mamba_states_after_verify`` (EAGLE, NGRAM,
PP), which knows the accepted positions, and the backend method, which some workers (DFlash / DSpark)
call directly with only the last accepted step; the tree path is then rebuilt from the parents that the
verify recorded.
"""

from __future__ import annotations

import torch

from sglang_replayssm.reference.commit_prep import (LAST, ROWS, SRC_ROWS, TRACK_DST, TRACK_LAST, TRACK_SRC,
                                                    TRACK_UPTO)

from .sync_check import sync_checked


def _replay_pool(req_pool):
    pool = getattr(req_pool, "mamba_pool", None)
    return pool if getattr(pool, "replay", None) is not None else None


def commit_tracks(backend_cls, pool, prep: torch.Tensor, nodes: torch.Tensor | None, src_rows) -> None:
    """The ``extra_buffer`` track slots of one commit (``prep``: ``ReplayMambaPool.prepare_commit``'s rows): for every
    row whose accepted path crosses a track boundary, the track slot becomes the live slot with its open verify,
    committed there up to the boundary node, and gets the conv window of that node. Rows that do not cross copy and
    commit nothing (their prepared track rows are 0 / -1). Device ops only."""
    dst = prep[TRACK_DST]
    pool.replay.copy_slots(prep[TRACK_SRC], dst)
    pool.replay.commit_prepared(dst, prep[TRACK_UPTO], nodes)
    rollback_conv(backend_cls, pool, dst, prep[TRACK_LAST], src_rows)


def rollback_conv(backend_cls, pool, slots_t: torch.Tensor, last_steps: torch.Tensor, src_rows) -> None:
    """Conv state of ``slots_t[b]`` = SGLang's conv window of draft ``last_steps[b]`` (-1: left as it is)."""
    cache = pool.mamba_cache
    for conv, windows in zip(cache.conv, cache.intermediate_conv_window):
        backend_cls._scatter_speculative_state_with_mask(conv, windows, slots_t, last_steps, src_rows)


@sync_checked
def _commit(backend_cls, pool, slots: torch.Tensor, accepted: torch.Tensor, T: int, src_rows, *,
            positions: torch.Tensor | None = None, from_last: bool = False, track: torch.Tensor | None = None,
            steps: torch.Tensor | None = None) -> None:
    """One verify's commit: its indices and counts in one launch (``prepare_commit``), the track slots (from the live
    rows with their open verify), then the live rows, then the live rows' conv states. SGLang's conv-window rows are
    the batch rows unless given (``src_rows``): the prepared int32 row numbers, no conversion on SGLang's side."""
    pool.settle()
    prep, nodes = pool.prepare_commit(slots, accepted, T, positions=positions, from_last=from_last, track=track,
                                      steps=steps)
    src = prep[SRC_ROWS] if src_rows is None else src_rows
    if track is not None:
        commit_tracks(backend_cls, pool, prep, nodes, src)
    pool.commit_prepared(prep, nodes)
    rollback_conv(backend_cls, pool, prep[ROWS], prep[LAST], src)


def commit_mamba_states_after_verify(original, target_worker, batch, accept_lens, accept_index, draft_token_num,
                                     prepared_step_indices=None):
    req_pool = target_worker.model_runner.req_to_token_pool
    pool = _replay_pool(req_pool)
    if pool is None:
        return original(target_worker, batch, accept_lens, accept_index, draft_token_num,
                        prepared_step_indices=prepared_step_indices)
    if batch.forward_mode.is_idle() or accept_index.numel() == 0:
        return None
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
    from sglang.srt.layers.attention.linear.utils import pp_spec_stable_rows_enabled

    bs = accept_lens.shape[0]
    T = int(draft_token_num)
    slots = req_pool.translate_mamba_indices(req_pool.get_mamba_indices(batch.req_pool_indices[:bs]))
    positions = None if pool.verify_parents is None else accept_index.reshape(bs, -1)
    src_rows = batch.req_pool_indices[:bs] if pp_spec_stable_rows_enabled() else None

    steps = None
    track = getattr(batch, "mamba_track_indices", None)
    if track is not None and prepared_step_indices is not None:
        steps = prepared_step_indices[1]
    elif track is not None:
        from sglang.srt.speculative.spec_utils import _verify_commit_step_indices

        steps = _verify_commit_step_indices(batch=batch, accept_index=accept_index, accept_lens=accept_lens,
                                            draft_token_num=T)[1]
    if track is not None and steps is not None:
        track, steps = req_pool.translate_mamba_indices(track[:bs]), steps[:bs].to(slots.device)
    if steps is None:
        track = None
    _commit(HybridLinearAttnBackend, pool, slots, accept_lens[:bs], T, src_rows, positions=positions, track=track,
            steps=steps)
    return None


def update_mamba_state_after_mtp_verify(original, self, last_correct_step_indices, mamba_track_indices,
                                        mamba_steps_to_track, model, req_pool_indices=None):
    lin = self.linear_attn_backend
    pool = _replay_pool(lin.req_to_token_pool)
    if pool is None:
        return original(self, last_correct_step_indices, mamba_track_indices, mamba_steps_to_track, model,
                        req_pool_indices=req_pool_indices)
    bs = last_correct_step_indices.shape[0]
    if req_pool_indices is not None:
        slots = lin._translate_mamba_indices(lin.req_to_token_pool.get_mamba_indices(req_pool_indices[:bs]))
    else:
        slots = lin.forward_metadata.mamba_cache_indices[:bs]
    T = int(pool.draft_tokens) if pool.verify_parents is None else pool.verify_parents.shape[1]
    track = steps = None
    if mamba_track_indices is not None and mamba_steps_to_track is not None:
        track = lin._translate_mamba_indices(mamba_track_indices[:bs])
        steps = mamba_steps_to_track[:bs].to(slots.device)
    _commit(type(self), pool, slots, last_correct_step_indices, T, None, from_last=True, track=track, steps=steps)
    return None
