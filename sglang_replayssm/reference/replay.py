"""ReplaySSM operations on a :class:`~sglang_replayssm.pool.ReplayStatePool`, in plain PyTorch.

These take the generic form of ``core`` (``q, k`` per k-head, ``v`` or ``u`` per value head, log-decay
``g``, ``beta``); the family modules turn raw model inputs into it. Rows are processed one by one:
slow and obvious, the oracle for the Triton kernels (same effects on the pool's tensors). A pool is
any object with the ``ReplayStatePool`` tensors and configuration: nothing here imports the pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import core
from .quant import (dequant_fp8_rows, dequant_nvfp4, fake_quant, quant_fp8_rows, quant_nvfp4, round_fp16_sr,
                    state_element_index)


def _g_full(pool, g: torch.Tensor) -> torch.Tensor:
    dk = pool.geo.head_k_dim
    return g if pool.geo.per_channel_decay else g.unsqueeze(-1).expand(*g.shape, dk)


def hp_checkpoint(pool, layer: int, slot: int) -> torch.Tensor:
    """The recurrence checkpoint of a slot, in compute precision."""
    return pool.ckpt[layer, slot].to(pool.cfg.compute_dtype)


def read_checkpoint(pool, layer: int, slot: int) -> torch.Tensor:
    """What a non-flush step reads: the dequantized read copy, or the checkpoint itself."""
    kind = pool.cfg.read_copy
    if kind == "fp8":
        return dequant_fp8_rows(pool.rc[layer, slot], pool.rc_scale[layer, slot])
    if kind == "nvfp4":
        return dequant_nvfp4(pool.rc[layer, slot], pool.rc_scale[layer, slot], pool.rc_gscale[layer, slot])
    return hp_checkpoint(pool, layer, slot)


def records(pool, layer: int, slot: int, n: int, start: int = 0) -> core.Records:
    """Records ``start .. start+n-1`` of a slot in core form (k expanded to value heads, g to ``[H, Dk]``; a
    delta family's raw ``v`` and ``beta`` too, which the exact fold replays)."""
    dt = pool.cfg.compute_dtype
    H = pool.geo.num_heads
    span = slice(start, start + n)
    d = pool.rec_d[layer, slot, span].to(dt)
    k = core.expand_heads(pool.rec_k[layer, slot, span].to(dt), H)
    g = _g_full(pool, pool.rec_g[layer, slot, span].to(dt))
    if pool.rec_v is None:
        return core.Records(d, k, g)
    return core.Records(d, k, g, pool.rec_v[layer, slot, span].to(dt), pool.rec_beta[layer, slot, span].to(dt))


def store_checkpoint(pool, layer: int, slots: Sequence[int], states: torch.Tensor,
                     streams: Sequence[int] | None = None) -> None:
    """Write new checkpoints (a flush, or a prefill): the recurrence copy at its precision (stochastic
    rounding for fp16, seeded by the slot's ``folded`` count ``streams``), the read copy, or, in shared
    mode, the quantized value as the recurrence state itself."""
    cfg = pool.cfg
    for i, s in enumerate(slots):
        S = states[i].to(cfg.compute_dtype)
        stream = int(pool.folded[s]) if streams is None else int(streams[i])
        if cfg.shared_quant:
            pool.ckpt[layer, s] = fake_quant(S, cfg.read_copy).to(pool.ckpt.dtype)
        elif cfg.ckpt == "fp16-sr":
            idx = state_element_index(pool.geo.state_shape, layer, device=S.device)
            pool.ckpt[layer, s] = round_fp16_sr(S, cfg.sr_seed, stream, idx)
        else:
            pool.ckpt[layer, s] = S.to(pool.ckpt.dtype)
        if cfg.read_copy == "fp8":
            pool.rc[layer, s], pool.rc_scale[layer, s] = quant_fp8_rows(S)
        elif cfg.read_copy == "nvfp4":
            pool.rc[layer, s], pool.rc_scale[layer, s], pool.rc_gscale[layer, s] = quant_nvfp4(S)


def committed_state(pool, layer: int, slot: int) -> torch.Tensor:
    """The full current state of a slot (checkpoint folded with its committed records)."""
    if pool.cfg.mode != "replay":
        return hp_checkpoint(pool, layer, slot)
    n = int(pool.cursor[slot])
    return core.fold(hp_checkpoint(pool, layer, slot), records(pool, layer, slot, n))


def fold_rows(pool, layer: int, slots: Sequence[int], counts: Sequence[int]) -> None:
    """Flush: fold the first ``counts[i]`` records of each slot into its checkpoint (cursors untouched)."""
    states = [core.fold(hp_checkpoint(pool, layer, s), records(pool, layer, s, n)) for s, n in zip(slots, counts)]
    streams = [int(pool.folded[s]) + n for s, n in zip(slots, counts)]
    store_checkpoint(pool, layer, slots, torch.stack(states), streams)


def fold(pool, layer: int | None, slots, counts) -> None:
    """The kernels' ``fold`` signature: records ``0 .. counts[b]-1`` of ``slots[b]`` into the checkpoint
    (and read copy) of ``layer``, or of every layer (None); rows with count 0 are untouched and cursors
    do not move. ``slots`` / ``counts``: int sequences or tensors (read on the host)."""
    if isinstance(slots, torch.Tensor):
        slots = slots.tolist()
    if isinstance(counts, torch.Tensor):
        counts = counts.tolist()
    rows = [(int(s), int(n)) for s, n in zip(slots, counts) if int(n) > 0]
    if not rows:
        return
    for lay in range(pool.num_layers) if layer is None else (layer,):
        fold_rows(pool, lay, [s for s, _ in rows], [n for _, n in rows])


def copy_slots(tensors, src: torch.Tensor, dst: torch.Tensor, slot_dim: int) -> None:
    """The kernels' ``copy_slots`` signature: slot ``dst[b]`` of each tensor (its dim ``slot_dim``, 0 or 1, is
    the slot) becomes a copy of slot ``src[b]``, for rows with both > 0 and distinct; other rows copy the
    padding slot onto itself (device indexing, no host read; it moves a slot's bytes for every row)."""
    src, dst = src.long(), dst.long()
    on = (src > 0) & (dst > 0) & (src != dst)
    s = torch.where(on, src, torch.zeros_like(src))
    d = torch.where(on, dst, torch.zeros_like(dst))
    for t in tensors:
        if slot_dim == 0:
            t[d] = t[s]
        else:
            t[:, d] = t[:, s]


def compact_paths(pool, slots: torch.Tensor, accepted: torch.Tensor, nodes: torch.Tensor) -> None:
    """The kernels' ``compact_paths`` signature: each row's accepted path records (``nodes[b, :accepted[b]]``,
    draft indices root to node, parents before children) moved to ring positions cursor .. cursor +
    accepted - 1 of every layer, in place, in draft order (position cursor + j is written after every read
    of it). Device ops only, no host read; slot-0 rows (padding) are left alone."""
    idx = slots.long()
    cur = pool.cursor[idx].long()
    live = idx > 0
    for j in range(nodes.shape[1]):
        node = nodes[:, j].long()
        move = live & (j < accepted) & (node != j) & (node >= 0)
        src = cur + torch.where(move, node, torch.full_like(node, j))
        dst = cur + j
        for t in record_tensors(pool):
            t[:, idx, dst] = t[:, idx, src]


def record_tensors(pool) -> list[torch.Tensor]:
    """The ring tensors of a pool, one row per record: d, k, g, and a delta family's v and beta."""
    return [t for t in (pool.rec_d, pool.rec_k, pool.rec_g, pool.rec_v, pool.rec_beta) if t is not None]


def commit(pool, slots: torch.Tensor, accepted: torch.Tensor) -> None:
    """The kernels' ``commit`` signature: a chain commit's device work on the records already at cursor..
    (``slots``, ``accepted``: int32 tensors [B] of distinct slots). Rows whose cursor + accepted reaches the
    window fold those records into every layer's checkpoint; then cursor += accepted, or 0 with folded +=
    the folded count for a folding row."""
    idx = slots.long()
    new_t = pool.cursor[idx].long() + accepted
    flushed = new_t >= pool.cfg.window
    counts = torch.where(flushed, new_t, torch.zeros_like(new_t))
    fold(pool, None, slots, counts.to(torch.int32))
    pool.folded[idx] += counts
    pool.cursor[idx] = torch.where(flushed, torch.zeros_like(new_t), new_t).to(pool.cursor.dtype)


def tree_parents(next_token: torch.Tensor, next_sibling: torch.Tensor, out: torch.Tensor) -> None:
    """The kernels' ``tree_parents`` signature: ``out`` [B, T] (int32) = the parent of every draft node (-1: hangs off
    the committed state) from SGLang's first-child / next-sibling arrays ``next_token`` / ``next_sibling`` [B, T]
    (-1 or out of range: none). Node i's first child c gets parent i; then each next sibling takes its elder
    sibling's parent, one sibling further per pass (T - 1 passes cover the longest sibling list). Device ops."""
    B, T = next_token.shape
    nxt, sib = next_token.long(), next_sibling.long()
    sink = torch.full_like(nxt, T)                 # column T of `par` takes the writes of "no such node"
    par = torch.full((B, T + 1), -1, dtype=torch.long, device=nxt.device)
    par.scatter_(1, torch.where((nxt >= 0) & (nxt < T), nxt, sink), torch.arange(T, device=nxt.device).expand(B, T))
    to_sib = torch.where((sib >= 0) & (sib < T), sib, sink)
    for _ in range(T - 1):
        par.scatter_(1, to_sib, par[:, :T].clone())
    out.copy_(par[:, :T])


# The step counts a caller may ask ``advance`` / ``count_commit`` to add up on the device (an int64 vector, in
# this order; the SGLang plugin's metrics read it once per interval: sglang_plugin/pool.py ``_publish``). The
# first ADDED_COUNTS are added up; the last two are set by each step: the committed records its rows hold after
# it, and those rows (the ring occupancy is their ratio over the window).
STEP_COUNTS = ("decode_rows", "decode_flush_rows", "decode_records", "verify_rows", "verify_tokens",
               "verify_records", "verify_fold_rows", "verify_fold_records", "accepted_records", "rejected_drafts",
               "last_step_records", "last_step_rows")
ADDED_COUNTS = 10


def advance(pool, slots: torch.Tensor, counts: torch.Tensor | None = None) -> None:
    """The kernels' ``advance`` signature: after a decode step over every layer, ``cursor += 1`` of ``slots``
    [B] (device; padding rows <= 0 hit slot 0 harmlessly), a row reaching the window restarting at 0 with
    ``folded`` += its records. ``counts`` (``STEP_COUNTS``, int64, or None): the live rows (slot > 0), those
    that flushed and the records their rings held are added; the last step's records and rows become the live
    rows' committed records after the step and their number (an empty batch counts nothing). Device ops, no
    host read."""
    if slots.numel() == 0:
        return
    idx = slots.long().clamp(min=0)
    cur = pool.cursor[idx]
    nxt = cur + 1
    flushed = nxt >= pool.cfg.window
    zero = torch.zeros_like(nxt)
    pool.folded[idx] += torch.where(flushed, nxt, zero).to(pool.folded.dtype)
    pool.cursor[idx] = torch.where(flushed, zero, nxt)
    if counts is not None:
        live = idx > 0
        rows = live.sum()
        counts[0] += rows
        counts[1] += (flushed & live).sum()
        counts[2] += torch.where(live, cur, zero).sum()
        counts[10] = torch.where(live & ~flushed, nxt, zero).sum()
        counts[11] = rows


def count_commit(pool, slots: torch.Tensor, accepted: torch.Tensor, num_drafts: int, counts: torch.Tensor) -> None:
    """The kernels' ``count_commit`` signature: ``counts`` (``STEP_COUNTS``, int64) of a verify of
    ``num_drafts`` tokens per row about to commit ``accepted`` [B] drafts (bonus included) of ``slots`` [B]
    (padding rows <= 0 count nothing), before the pointer moves: rows, tokens verified, the records their rings
    held, the rows whose commit folds (cursor + accepted reaches the window) and the records those fold, the
    accepted records, the rejected drafts; the last step's records and rows become the committed records after
    the commit and the rows (an empty batch counts nothing). Device ops, no host read."""
    if slots.numel() == 0:
        return
    idx = slots.long()
    live = idx > 0
    cur = torch.where(live, pool.cursor[idx.clamp(min=0)].long(), 0)
    acc = torch.where(live, accepted.long(), 0)
    new = cur + acc
    folds = (new >= pool.cfg.window) & live
    rows = live.sum()
    counts[3] += rows
    counts[4] += rows * num_drafts
    counts[5] += cur.sum()
    counts[6] += folds.sum()
    counts[7] += torch.where(folds, new, 0).sum()
    counts[8] += acc.sum()
    counts[9] += rows * num_drafts - acc.sum()
    counts[10] = torch.where(folds, 0, new).sum()
    counts[11] = rows


def _write_record(pool, layer: int, slot: int, pos: int, d: torch.Tensor, k: torch.Tensor, g: torch.Tensor,
                  v: torch.Tensor, beta: torch.Tensor | None) -> None:
    """One record at ring position ``pos``: d, the token's k (per k-head) and g, and (delta families) its raw
    v and beta."""
    pool.rec_d[layer, slot, pos] = d.to(pool.rec_d.dtype)
    pool.rec_k[layer, slot, pos] = k.to(pool.rec_k.dtype)
    pool.rec_g[layer, slot, pos] = g.to(pool.rec_g.dtype)
    if pool.rec_v is not None:
        pool.rec_v[layer, slot, pos] = v.to(pool.rec_v.dtype)
        pool.rec_beta[layer, slot, pos] = beta.to(pool.rec_beta.dtype)


def _row_inputs(pool, b: int, q, k, g, beta):
    """Row ``b`` of core-form inputs in compute precision, keys expanded to value heads, g to ``[.., H, Dk]``."""
    dt, H = pool.cfg.compute_dtype, pool.geo.num_heads
    return (core.expand_heads(q[b].to(dt), H), core.expand_heads(k[b].to(dt), H), _g_full(pool, g[b].to(dt)),
            None if beta is None else beta[b].to(dt))


def decode_rows(pool, layer: int, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                g: torch.Tensor, beta: torch.Tensor | None) -> torch.Tensor:
    """One decode token per row in core form: ``q, k [B, Hk, Dk]``, ``v [B, H, Dv]``, ``g [B, H]`` (KDA
    ``[B, H, Dk]``), ``beta [B, H]`` or None. Non-flush rows read the read copy (or the checkpoint) and the
    records and append a record; a row whose record fills the window (``cursor + 1 == window``) is a flush
    row: it forms the state from the full-precision checkpoint (``core.fold``: exact for delta families), steps
    its token on it and stores the result as the new checkpoint (and read copy). Cursors are not moved
    (``pool.advance`` does that once per step). Returns ``o [B, H, Dv]`` in compute precision."""
    cfg = pool.cfg
    dt = cfg.compute_dtype
    out = torch.empty(v.shape, dtype=dt, device=v.device)
    for b, s in enumerate(slots.tolist()):
        qb, kb, gb, bb = _row_inputs(pool, b, q, k, g, beta)
        if cfg.mode == "conventional":
            out[b], S = core.conventional_step(hp_checkpoint(pool, layer, s), qb, kb, v[b].to(dt), gb, bb)
            pool.ckpt[layer, s] = S.to(pool.ckpt.dtype)
            continue
        c = int(pool.cursor[s])
        rec = records(pool, layer, s, c)
        if c + 1 >= cfg.window:    # flush row: the state from the checkpoint, this token on it, stored
            out[b], S, d = core.token_step(core.fold(hp_checkpoint(pool, layer, s), rec), qb, kb, v[b].to(dt),
                                           gb, bb)
            _write_record(pool, layer, s, c, d, k[b], g[b], v[b], None if beta is None else beta[b])
            store_checkpoint(pool, layer, [s], S[None], [int(pool.folded[s]) + c + 1])
            continue
        o, d = core.evaluate_tokens(read_checkpoint(pool, layer, s), rec, qb[None], kb[None], v[b:b + 1].to(dt),
                                    gb[None], None if bb is None else bb[None])
        out[b] = o[0]
        _write_record(pool, layer, s, c, d[0], k[b], g[b], v[b], None if beta is None else beta[b])
    return out


def verify_rows(pool, layer: int, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                g: torch.Tensor, beta: torch.Tensor | None,
                parents: torch.Tensor | Sequence[Sequence[int]] | None = None) -> torch.Tensor:
    """``T`` draft tokens per row (``[B, T, ...]`` inputs) by output-only evaluation: outputs for every
    draft, draft records written at ring positions ``cursor .. cursor+T-1``; nothing else changes.
    Conventional mode instead steps the state through the drafts and keeps one snapshot per draft."""
    cfg = pool.cfg
    dt = cfg.compute_dtype
    B, T = v.shape[:2]
    if T > cfg.max_drafts:
        raise ValueError(f"{T} drafts exceed max_drafts={cfg.max_drafts}")
    out = torch.empty(v.shape, dtype=dt, device=v.device)
    for b, s in enumerate(slots.tolist()):
        par = None if parents is None else [int(p) for p in parents[b]]
        qb, kb, gb, bb = _row_inputs(pool, b, q, k, g, beta)
        if cfg.mode == "conventional":
            par = par if par is not None else list(range(-1, T - 1))
            base = hp_checkpoint(pool, layer, s)
            for i in range(T):
                S_in = base if par[i] < 0 else pool.snap[layer, s, par[i]].to(dt)
                out[b, i], S = core.conventional_step(S_in, qb[i], kb[i], v[b, i].to(dt), gb[i],
                                                      None if bb is None else bb[i])
                pool.snap[layer, s, i] = S.to(pool.snap.dtype)
            continue
        c = int(pool.cursor[s])
        o, d = core.evaluate_tokens(read_checkpoint(pool, layer, s), records(pool, layer, s, c), qb, kb,
                                    v[b].to(dt), gb, bb, par)
        out[b] = o
        for i in range(T):
            _write_record(pool, layer, s, c + i, d[i], k[b, i], g[b, i], v[b, i], None if beta is None else beta[b, i])
    return out
