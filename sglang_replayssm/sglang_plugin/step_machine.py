"""The step / verify / commit state machine of ``ReplayMambaPool`` (a mixin of it, ``pool.py``): what a decode step,
a verify and its commit do to the ReplaySSM pool around SGLang's forward, in the order SGLang's hooks call them.

* decode: ``note_decode`` before the step's kernels; ``settle`` after ``ModelRunner.forward`` (or at the next step's
  metadata) applies the deferred cursor move over all layers, the flush stagger's early folds and the ``extra_buffer``
  track copies that ``note_track`` (or, for a step replayed in a CUDA graph, ``await_track_mask`` +
  ``take_track_mask``) noted (``track.py``);
* verify: ``open_verify`` / ``open_tree_verify`` keep the draft tree's parents in one persistent buffer; the commit is
  ``commit_verify``, or ``prepare_commit`` + ``commit_prepared`` from SGLang's accepted positions / last nodes
  (``spec.py``);
* prefill: ``flush_rows`` before SGLang's prefill reads a checkpoint, ``after_prefill`` / ``after_prefill_rows`` after it
  wrote one.

Every method works on the device (no host read with the kernels; ``sync_checked``). The pool's fields it uses:
``replay`` (the ``ReplayStatePool``), ``_stagger``, ``_acc`` (the metrics counts, ``step_metrics.py``),
``mamba_cache.conv``, ``size``."""

from __future__ import annotations

import torch

from sglang_replayssm.reference.commit_prep import ACC, COMMIT_PREP_ROWS, ROWS

from .sync_check import sync_checked


class StepMachine:
    verify_parents: torch.Tensor | None = None  # [B, T] tree parents of the open verify (None: chain)
    _track_awaiting_mask: tuple[torch.Tensor, torch.Tensor] | None = None   # (src, dst) of await_track_mask
    _parents_buf: torch.Tensor | None = None
    _pending_decode: torch.Tensor | None = None
    _pending_track: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def note_decode(self, slots: torch.Tensor) -> None:
        """A decode step over ``slots`` is about to run; its cursor move happens in settle()."""
        self.settle()
        self._pending_decode = slots.clamp(min=0)

    @sync_checked
    def settle(self) -> None:
        """Apply the deferred cursor move of the last decode step. Only once all layers of that step ran:
        called after ``ModelRunner.forward`` and at the start of the next step's metadata, never from the
        slot operations (a HiCache backup thread calling ``get_cpu_copy`` mid-step must not move cursors
        before the step's kernels wrote their records)."""
        slots = self._pending_decode
        if slots is not None:
            self._pending_decode = None
            self.replay.advance(slots, self._acc)   # the move and its counts: one launch with the kernels
            self._stagger.after_decode(slots, self._acc)
            self._count_step()
        if self._pending_track is not None:
            self._copy_tracked(*self._pending_track)
            self._pending_track = None

    def await_track_mask(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """This decode step runs in a CUDA graph, whose metadata view has no track mask: ``src`` / ``dst`` (SGLang's
        static buffers for the step) wait for the real batch's mask after the forward (``take_track_mask``)."""
        self._track_awaiting_mask = (src, dst)

    def take_track_mask(self, mask: torch.Tensor | None, bs: int) -> None:
        """The mask of the step that ``await_track_mask`` noted (None: no row at a track boundary, or not a decode
        step of ours): its rows are noted for the copy after the cursor move."""
        awaiting, self._track_awaiting_mask = self._track_awaiting_mask, None
        if awaiting is not None and mask is not None:
            self.note_track(awaiting[0], mask, awaiting[1], bs)

    @sync_checked
    def note_track(self, src: torch.Tensor, mask: torch.Tensor, dst: torch.Tensor, bs: int) -> None:
        """This decode step's rows ``src`` with ``mask`` set are at a track boundary of the radix cache
        (``--mamba-radix-cache-strategy extra_buffer``): their state after the step goes to ``dst``. Done
        in settle(), after the step's cursor move (``track.py``). Every layer notes the same rows; the
        first note of a step stands."""
        if self._pending_track is None and dst is not None:
            self._pending_track = (src[:bs], mask[:bs], dst[:bs])

    def _copy_tracked(self, src: torch.Tensor, mask: torch.Tensor, dst: torch.Tensor) -> None:
        """Whole-slot copy ``src -> dst`` (checkpoint, read copy, ring, cursor, SR counter, conv) of the
        rows with ``mask``, on the device: rows without it copy nothing (``ops.copy_slots``)."""
        on = mask.to(torch.bool) & (src > 0) & (dst > 0)
        s = torch.where(on, src.to(torch.long), 0)
        d = torch.where(on, dst.to(torch.long), 0)
        self.replay.copy_slots(s, d)
        self.replay.ops.copy_slots(self.mamba_cache.conv, s, d, 1)

    @sync_checked
    def open_verify(self, parents: torch.Tensor | None) -> None:
        """A target verify is about to run (its kernels append the draft records at cursor..): settle the last
        decode step and keep this step's tree ``parents`` [B, T] (int32 on the device; None: chains) in one
        persistent buffer, which the verify kernels read, in a captured CUDA graph too. No host read."""
        self.settle()
        if parents is None:
            self.verify_parents = None
            return
        out = self._parents_out(*parents.shape)
        out.copy_(parents, non_blocking=True)
        self.verify_parents = out

    @sync_checked
    def open_tree_verify(self, next_token: torch.Tensor | None, next_sibling: torch.Tensor | None, bs: int,
                         T: int) -> None:
        """``open_verify`` of a draft tree given as SGLang's first-child / next-sibling arrays ([rows, T] or
        flat, device): the parents are made straight into the persistent buffer (``ops.tree_parents``: one launch
        with the kernels). Absent arrays (CUDA-graph capture dummies) make chains, and so do the rows past the
        arrays' own: a CUDA-graph replay pads ``bs`` up to a captured size (13 requests run as 14) while SGLang's
        arrays keep the real rows only; the padding rows carry slot -1 and commit nothing."""
        self.settle()
        out = self._parents_out(bs, T)
        rows = 0 if next_token is None or next_sibling is None else min(bs, next_token.numel() // T,
                                                                          next_sibling.numel() // T)
        if rows:
            self.replay.ops.tree_parents(next_token.reshape(-1, T)[:rows].contiguous(),
                                         next_sibling.reshape(-1, T)[:rows].contiguous(), out[:rows])
        if rows < bs:
            out[rows:].copy_(torch.arange(-1, T - 1, dtype=torch.int32, device=out.device).expand(bs - rows, T))
        self.verify_parents = out

    def _parents_out(self, bs: int, T: int) -> torch.Tensor:
        buf = self._parents_buf
        if buf is None or buf.shape[0] < bs or buf.shape[1] != T:
            buf = self._parents_buf = torch.full((max(bs, self.size + 1), T), -1, dtype=torch.int32,
                                                 device=self.replay.device)
        return buf[:bs]

    @sync_checked
    def commit_verify(self, slots: torch.Tensor, accepted: torch.Tensor, nodes: torch.Tensor | None,
                      num_drafts: int) -> None:
        """Commit the open verify of ``slots`` [B] (device; padding rows <= 0): ``accepted`` [B] drafts (bonus
        included) along ``nodes`` [B, N] (tree paths, padded; None: chain prefixes) stay, the pointer moves,
        a row reaching the window folds (``ReplayStatePool.commit_rows``), and the accepted records and
        rollbacks are counted on the device. No host read with the kernels. (SGLang's commits, which hand accepted
        positions or last nodes, go through ``prepare_commit`` / ``commit_prepared``: fewer launches.)"""
        slots = slots.to(torch.int32).contiguous()
        accepted = accepted.contiguous()   # padding rows count and commit nothing (both mask them)
        self.replay.count_commit(slots, accepted, num_drafts, self._acc)   # before the pointer moves
        self._count_step()
        self.replay.commit_rows(slots, accepted, nodes)
        self.verify_parents = None

    @sync_checked
    def prepare_commit(self, slots: torch.Tensor, accepted: torch.Tensor, num_drafts: int, *,
                       positions: torch.Tensor | None = None, from_last: bool = False,
                       track: torch.Tensor | None = None, steps: torch.Tensor | None = None):
        """The open verify's commit indices from SGLang's tensors (``ops.commit_prep``: one launch with the kernels),
        its step counts added before any pointer moves: ``slots`` [B] (padding rows <= 0), ``accepted`` [B] the
        accepted counts (bonus included) with ``positions`` [B, N] SGLang's accepted positions of a tree, or with
        ``from_last`` the last accepted draft nodes (the path walked up the open verify's tree parents); ``track`` /
        ``steps`` [B] the extra_buffer track slots and boundary nodes. Returns (the [COMMIT_PREP_ROWS, B] int32 rows of
        ``reference.commit_prep``, the [B, N] int32 tree paths or None). No host read."""
        B = slots.shape[0]
        parents = self.verify_parents[:B] if from_last and self.verify_parents is not None else None
        N = positions.shape[1] if positions is not None else parents.shape[1] if parents is not None else 0
        buf = torch.empty(COMMIT_PREP_ROWS * B + B * N, dtype=torch.int32, device=self.replay.device)
        out = buf[:COMMIT_PREP_ROWS * B].view(COMMIT_PREP_ROWS, B)
        nodes = buf[COMMIT_PREP_ROWS * B:].view(B, N) if N else None
        c = lambda t: None if t is None else t.contiguous()   # noqa: E731
        self.replay.ops.commit_prep(self.replay, c(slots), c(accepted), num_drafts, self._acc, out, nodes,
                                    positions=c(positions), parents=parents, from_last=from_last, track=c(track),
                                    steps=c(steps))
        return out, nodes

    @sync_checked
    def commit_prepared(self, prep: torch.Tensor, nodes: torch.Tensor | None) -> None:
        """Commit the open verify of ``prepare_commit``'s rows (counted there): the accepted paths to cursor.., the
        fold of rows that reach the window, the pointer move (``ReplayStatePool.commit_prepared``)."""
        self._count_step()
        self.replay.commit_prepared(prep[ROWS], prep[ACC], nodes)
        self.verify_parents = None

    @sync_checked
    def flush_rows(self, slots: torch.Tensor) -> None:
        """Fold committed records of ``slots`` into their checkpoints (before SGLang's prefill reads them)."""
        self.settle()
        self.replay.flush_rows(slots)
        self._stagger.after_prefill(slots)

    @sync_checked
    def after_prefill(self, layer: int, slots: torch.Tensor) -> None:
        """SGLang wrote a state into the checkpoint of ``slots`` (device; padding <= 0) from outside a prefill step's
        rows (a prefill-tracked slot, a HiCache load): empty ring, and the read copy (if any) refreshed from it.
        Device ops, no host read; padding rows empty the padding slot's own ring."""
        self.replay.cursor.index_fill_(0, slots.to(torch.long).clamp(min=0), 0)
        self.replay.refresh_read_copy(layer, slots.to(torch.long))

    @sync_checked
    def after_prefill_rows(self, layer: int, slots: torch.Tensor) -> None:
        """SGLang's prefill wrote the final state into the checkpoint of this step's prefill rows ``slots``, whose
        rings the step's metadata hook emptied before (``flush_rows``) and nothing refilled: the read copy (if any)
        refreshed from it, nothing else, so a layer costs no launch without a read copy."""
        self.replay.refresh_read_copy(layer, slots)
