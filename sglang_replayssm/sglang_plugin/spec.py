"""Speculative decoding: commit accepted drafts by moving the ring pointer, and the radix cache's
``extra_buffer`` track slots at accepted-prefix boundaries.

SGLang's target verify leaves one full SSM state per draft token (``intermediate_ssm``) and the commit
(``spec_utils.commit_mamba_states_after_verify`` -> ``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify``)
scatters the state of the last accepted draft into the cache. With the ReplaySSM pool the verify wrote
draft *records* into the ring, so the commit is ``ReplayStatePool.accept_drafts``: the accepted prefix (chain)
or root-to-node path (EAGLE tree, topk > 1) stays, the pointer moves, rejected records are left behind,
and a row whose committed records reach the window folds them. The short-convolution state still rolls
back through SGLang's own per-draft conv windows.

Track slots (``--mamba-radix-cache-strategy extra_buffer``): SGLang tracks no state inside a verify forward
(``prepare_mamba_track_for_verify`` clears the track mask); when a row's accepted tokens cross a track-grid
boundary, its commit also stores the state *at the boundary* into the row's track slot
(``batch.mamba_track_indices``), the boundary given as the draft node ``mamba_steps_to_track`` (-1: no
crossing; SGLang's ``_verify_commit_step_indices`` / ``fused_commit_track_indices``). Here the track slot
gets the whole live slot with its open verify (``ReplayStatePool.fork_verify``: checkpoint, read copy, ring
with the draft records, cursor, stochastic-rounding counter) and commits there the accepted path up to that
node (``accept_drafts`` on the copy: the same pointer move, and the same fold when the copy's committed
records reach the window), before the live row commits: what the tree keeps resumes exactly as the live row
would have after those tokens, whatever the live row's own commit folds, and the live slot is not touched.
The track slot's conv state comes from SGLang's conv window of that node. Rows that cross are known on the
host (one read of the step indices, only with ``extra_buffer``); rows that do not cost nothing more.

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


def track_plan(pool, slots: list[int], paths: list[list[int]], track: list[int], steps: list[int]):
    """The track copies of one commit, ``[(row, source slot, track slot, path)]``: one per row whose accepted
    path crosses a track boundary (``steps[b] >= 0``: the boundary's draft node, which lies on the accepted
    path ``paths[b]``), the path cut after that node. Padding rows (slot or track slot <= 0) and rows with
    no open verify are skipped."""
    plan = []
    for b, (s, path, d, node) in enumerate(zip(slots, paths, track, steps)):
        if node < 0 or s <= 0 or d <= 0 or not pool.replay.pending(s):
            continue
        if node not in path:
            raise ValueError(f"track step {node} is not on the accepted path {path} of slot {s}")
        plan.append((b, s, d, path[: path.index(node) + 1]))
    return plan


def commit_rows(pool, slots: list[int], accepted: list[int], paths, slots_t=None, accepted_t=None,
                tracks=()) -> None:
    """Commit the open verify of ``slots``; first the track copies ``tracks`` (``track_plan``): forked from
    their live rows with the open verify, and committed there up to the boundary node."""
    pool.settle()
    if tracks:
        dst = [d for _, _, d, _ in tracks]
        pool.replay.cancel_verify(dst)
        pool.replay.fork_verify([s for _, s, _, _ in tracks], dst)
        pool.replay.accept_drafts(dst, [len(p) for *_, p in tracks], [p for *_, p in tracks])
    pool.accept_drafts(slots, accepted, paths, slots_t=slots_t, accepted_t=accepted_t)
    pool.verify_parents = None


def rollback_conv(backend_cls, pool, slots_t: torch.Tensor, last_steps: torch.Tensor, src_rows) -> None:
    """Conv state of ``slots_t[b]`` = SGLang's conv window of draft ``last_steps[b]`` (-1: left as it is)."""
    cache = pool.mamba_cache
    for conv, windows in zip(cache.conv, cache.intermediate_conv_window):
        backend_cls._scatter_speculative_state_with_mask(conv, windows, slots_t, last_steps, src_rows)


def _track_conv(backend_cls, pool, tracks, track_t: torch.Tensor, bs: int, src_rows) -> None:
    """The track slots' conv state: the conv window of the boundary node (rows not in ``tracks``: untouched)."""
    if tracks:
        node = {b: p[-1] for b, _, _, p in tracks}
        steps = torch.tensor([node.get(b, -1) for b in range(bs)], dtype=torch.int64, device=track_t.device)
        rollback_conv(backend_cls, pool, track_t, steps, src_rows)


def _track_inputs(pool, translate, slots, paths, track_t, steps_t, bs: int):
    """(physical track slots [bs] on the device, ``track_plan``) of the first ``bs`` rows; ``(None, ())``
    without tracking (``track_t`` / ``steps_t`` None)."""
    if track_t is None or steps_t is None:
        return None, ()
    track_t = translate(track_t[:bs])
    track, steps = torch.stack([track_t.to(torch.int64), steps_t[:bs].to(track_t.device, torch.int64)]).tolist()
    return track_t, track_plan(pool, slots, paths, track, steps)


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
    src_rows = batch.req_pool_indices[:bs] if pp_spec_stable_rows_enabled() else None

    steps_t = None
    track_t = getattr(batch, "mamba_track_indices", None)
    if track_t is not None and prepared_step_indices is not None:
        steps_t = prepared_step_indices[1]
    elif track_t is not None:
        from sglang.srt.speculative.spec_utils import _verify_commit_step_indices

        steps_t = _verify_commit_step_indices(batch=batch, accept_index=accept_index, accept_lens=accept_lens,
                                              draft_token_num=T)[1]
    track_t, tracks = _track_inputs(pool, req_pool.translate_mamba_indices, slots, paths, track_t, steps_t, bs)
    commit_rows(pool, slots, acc, None if chain else paths, slots_t=slots_t, accepted_t=accept_lens[:bs],
                tracks=tracks)
    last = torch.tensor([p[-1] if p else -1 for p in paths], dtype=torch.int64, device=accept_lens.device)
    rollback_conv(HybridLinearAttnBackend, pool, slots_t, last, src_rows)
    _track_conv(HybridLinearAttnBackend, pool, tracks, track_t, bs, src_rows)
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
    track_t, tracks = _track_inputs(pool, lin._translate_mamba_indices, slots, paths, mamba_track_indices,
                                    mamba_steps_to_track, bs)
    commit_rows(pool, slots, [len(p) for p in paths], None if parents is None else paths, slots_t=slots_t,
                accepted_t=None if parents is not None else last_correct_step_indices + 1, tracks=tracks)
    rollback_conv(type(self), pool, slots_t, last_correct_step_indices, None)
    _track_conv(type(self), pool, tracks, track_t, bs, None)
    return None
