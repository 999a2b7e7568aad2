"""Speculative decoding: commit accepted drafts by moving the ring pointer.

SGLang's target verify leaves one full SSM state per draft token (``intermediate_ssm``) and the commit
(``spec_utils.commit_mamba_states_after_verify`` -> ``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify``)
scatters the state of the last accepted draft into the cache. With the ReplaySSM pool the verify wrote
draft *records* into the ring, so the commit is ``ReplayStatePool.accept_drafts``: the accepted prefix (chain)
or root-to-node path (EAGLE tree, topk > 1) stays, the pointer moves, rejected records are left behind,
and a row whose committed records reach the window folds them. The short-convolution state still rolls
back through SGLang's own per-draft conv windows.

Both SGLang entry points are wrapped: the generic ``commit_mamba_states_after_verify`` (EAGLE, NGRAM,
PP), which knows the accepted positions, and the backend method, which some workers (DFlash / DSpark)
call directly with only the last accepted step; the tree path is then rebuilt from the parents that the
verify recorded.
"""

from __future__ import annotations

import torch


def _replay_pool(req_pool):
    pool = getattr(req_pool, "mamba_pool", None)
    return pool if getattr(pool, "replay", None) is not None else None


def _path_to(parents_row, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents_row[node]
    return path[::-1]


def commit_rows(pool, slots: list[int], accepted: list[int], paths, slots_t=None, accepted_t=None) -> None:
    pool.settle()
    pool.accept_drafts(slots, accepted, paths, slots_t=slots_t, accepted_t=accepted_t)
    pool.verify_parents = None


def rollback_conv(backend_cls, pool, slots_t: torch.Tensor, last_steps: torch.Tensor, src_rows) -> None:
    cache = pool.mamba_cache
    for conv, windows in zip(cache.conv, cache.intermediate_conv_window):
        backend_cls._scatter_speculative_state_with_mask(conv, windows, slots_t, last_steps, src_rows)


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
    slots_t = req_pool.translate_mamba_indices(req_pool.get_mamba_indices(batch.req_pool_indices[:bs]))
    slots = [int(s) for s in slots_t.tolist()]
    acc = [int(a) for a in accept_lens.tolist()]
    pos = accept_index.reshape(bs, -1).tolist()
    paths = [[p - b * T for p in pos[b][: acc[b]]] for b in range(bs)]
    chain = all(p == list(range(len(p))) for p in paths)
    commit_rows(pool, slots, acc, None if chain else paths, slots_t=slots_t, accepted_t=accept_lens[:bs])
    last = torch.tensor([p[-1] if p else -1 for p in paths], dtype=torch.int64, device=accept_lens.device)
    src_rows = batch.req_pool_indices[:bs] if pp_spec_stable_rows_enabled() else None
    rollback_conv(HybridLinearAttnBackend, pool, slots_t, last, src_rows)
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
        slots_t = lin._translate_mamba_indices(lin.req_to_token_pool.get_mamba_indices(req_pool_indices[:bs]))
    else:
        slots_t = lin.forward_metadata.mamba_cache_indices[:bs]
    slots = [int(s) for s in slots_t.tolist()]
    last = [int(x) for x in last_correct_step_indices.tolist()]
    parents = None if pool.verify_parents is None else pool.verify_parents.tolist()
    paths = [list(range(n + 1)) if parents is None else _path_to(parents[b], n) for b, n in enumerate(last)]
    commit_rows(pool, slots, [len(p) for p in paths], None if parents is None else paths, slots_t=slots_t,
                accepted_t=None if parents is not None else last_correct_step_indices + 1)
    rollback_conv(type(self), pool, slots_t, last_correct_step_indices, None)
    return None
