"""The index preparation of a verify's commit and of a flush, in PyTorch (the oracle of ``kernels/commit_prep.py``,
which does each in one Triton launch).

A commit starts from SGLang's device tensors (slots, accept lengths, accepted positions or the last accepted node,
extra_buffer track slots and steps) and needs, per row: the slot clamped to the padding slot, the accepted count
(0 on padding rows), the accepted root-to-node path (tree drafts), the last accepted node (SGLang's conv-window
rollback), and for a row crossing a track boundary the track slot's copy source, destination, accepted count and
node; and the verify's step counts (``replay.count_commit``). A flush needs its rows without repeats nor padding and
the records each holds. Device ops only, no host read.
"""
from __future__ import annotations

import torch

from . import replay

# rows of a commit's prepared [COMMIT_PREP_ROWS, B] int32 tensor
ROWS, ACC, LAST, SRC_ROWS, TRACK_DST, TRACK_SRC, TRACK_UPTO, TRACK_LAST = range(8)
COMMIT_PREP_ROWS = 8


def commit_prep(pool, slots: torch.Tensor, accepted: torch.Tensor, num_drafts: int, counts: torch.Tensor | None,
                out: torch.Tensor, nodes: torch.Tensor | None = None, *, positions: torch.Tensor | None = None,
                parents: torch.Tensor | None = None, from_last: bool = False, track: torch.Tensor | None = None,
                steps: torch.Tensor | None = None) -> None:
    """A commit's indices into ``out`` [COMMIT_PREP_ROWS, B] (int32) and ``nodes`` [B, N] (int32; tree drafts), and
    its step counts added to ``counts`` (``replay.STEP_COUNTS``; None: not counted), before any pointer moves.

    ``slots`` [B]: the rows' slots (<= 0: padding). ``accepted`` [B]: the accepted drafts (bonus included), or with
    ``from_last`` the last accepted draft node (-1: none; the count is its depth in ``parents`` [B, T], the verify's
    draft trees, or node + 1 for chains). ``positions`` [B, N]: SGLang's accepted positions (indices into the
    flattened [B * num_drafts] drafts, -1 padded), made draft node ids per row in ``nodes``; with ``parents`` the
    nodes are the root-to-node paths, -1 padded. ``track`` / ``steps`` [B]: a row's extra_buffer track slot and the
    draft node where its accepted tokens cross a track boundary (-1: none). Rows of ``out``:

    * ``ROWS``: the slot, padding rows made 0; ``ACC``: the accepted count (0 on padding rows); ``LAST``: the last
      accepted node (-1: none accepted, or a padding row); ``SRC_ROWS``: b (SGLang's conv-window row of row b)
    * with ``track``, for the rows crossing a boundary with a live slot and a track slot (0 / -1 elsewhere):
      ``TRACK_DST`` the track slot, ``TRACK_SRC`` the slot, ``TRACK_UPTO`` the accepted count up to the boundary
      node (its position on the path + 1), ``TRACK_LAST`` that node.
    """
    B = slots.shape[0]
    if B == 0:
        return
    dev = slots.device
    s = slots.long()
    live = s > 0
    b = torch.arange(B, device=dev)
    last = None
    if from_last:
        node = accepted.long()
        if parents is not None:   # walk up to the root, then the walk reversed
            T = parents.shape[1]
            par = parents.long()
            up = torch.full((B, T), -1, dtype=torch.long, device=dev)
            last, cur = node, node
            for i in range(T):
                ok = (cur >= 0) & (cur < T)
                up[:, i] = torch.where(ok, cur, -1)
                cur = torch.where(ok, par.gather(1, torch.where(ok, cur, 0).unsqueeze(1)).squeeze(1), -1)
            a = (up >= 0).sum(1)
            j = torch.arange(T, device=dev).unsqueeze(0)
            path = torch.where(j < a.unsqueeze(1), up.gather(1, (a.unsqueeze(1) - 1 - j).clamp(min=0)), -1)
            nodes.copy_(path)
        else:
            a, last = node + 1, node
    else:
        a = accepted.long()
        if positions is not None:
            N = positions.shape[1]
            pos = positions.long()
            nd = torch.where(pos >= 0, pos - b.unsqueeze(1) * num_drafts, -1)
            nodes.copy_(nd)
            at = nd.gather(1, (a - 1).clamp(0, max(N - 1, 0)).unsqueeze(1)).squeeze(1)
            last = torch.where((a > 0) & (a <= N), at, -1)
        else:
            last = a - 1
    acc = torch.where(live, a, 0)
    out[ROWS] = s.clamp(min=0)
    out[ACC] = acc
    out[LAST] = torch.where(live & (acc > 0), last, -1)
    out[SRC_ROWS] = b
    if counts is not None:
        replay.count_commit(pool, s.clamp(min=0), acc, num_drafts, counts)
    if track is None:
        return
    st, tr = steps.long(), track.long()
    on = live & (st >= 0) & (tr > 0)
    if nodes is not None and (positions is not None or parents is not None):
        j = torch.arange(nodes.shape[1], device=dev).unsqueeze(0)
        hit = (nodes.long() == st.unsqueeze(1)) & (j < acc.unsqueeze(1))
        upto = torch.where(hit, j + 1, 0).amax(1)
    else:
        upto = st + 1
    out[TRACK_DST] = torch.where(on, tr, 0)
    out[TRACK_SRC] = torch.where(on, s, 0)
    out[TRACK_UPTO] = torch.where(on, upto, 0)
    out[TRACK_LAST] = torch.where(on, st, -1)


def flush_prep(pool, rows: torch.Tensor, out: torch.Tensor) -> None:
    """A flush's rows into ``out`` [2, B] (int32): ``out[0]`` the slots of ``rows`` [B] with padding rows (<= 0) and
    repeats of a slot listed before made 0, ``out[1]`` the committed records each holds (its cursor; 0 on those
    rows): what the fold takes. Device ops."""
    B = rows.shape[0]
    if B == 0:
        return
    idx = rows.long().clamp(min=0)
    order = torch.arange(B, device=idx.device)
    first = torch.full((pool.cursor.shape[0],), B, dtype=torch.long, device=idx.device)
    first.scatter_reduce_(0, idx, order, reduce="amin")
    keep = (first[idx] == order) & (idx > 0)
    out[0] = torch.where(keep, idx, 0)
    out[1] = torch.where(keep, pool.cursor[idx].long(), 0)


def flush_move(pool, rows: torch.Tensor, counts: torch.Tensor) -> None:
    """After a flush's fold of ``counts`` [B] records of ``rows`` [B] (``flush_prep``'s: distinct where counts > 0):
    ``folded`` += the count and the cursor restarts at 0 on those rows; other rows change nothing. Device ops."""
    if rows.shape[0] == 0:
        return
    idx, c = rows.long(), counts.long()
    on = c > 0
    pool.folded[idx] += torch.where(on, c, 0).to(pool.folded.dtype)
    pool.cursor[idx] = torch.where(on, 0, pool.cursor[idx])
