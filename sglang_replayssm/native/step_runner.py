"""The native engine's model steps over the state pool: one prefill chunk of a request, one decode step of
a batch, one speculative step of a batch (draft -> verify -> accept -> commit -> emit).

Every forward gets the same explicit `ForwardContext` (pool, KV cache, SSM ops; model.py). A decode
step moves each row's ring cursor (`pool.advance`); a verify step appends 1 + drafts records per row
(`SSMOps.begin_verify`) and keeps the accepted prefix (`SSMOps.accept_drafts`: a pointer move, the conv state).
Each step adds its SSM state traffic to the counters (step_stats.py). When a row's state reaches a grid
boundary of the prefix cache, a copy of its slot is kept (`Admission.keep_decoded`; the live slot untouched), and
a row's drafts stop at the next boundary so that a verify step lands on it rather than past it. A row's
sampling or emission error fails that row alone; an exception out of a step (the batched forward) is the
caller's.
"""

from __future__ import annotations

import torch

from . import drafter, sampling
from .step_stats import StateSizes, StepStats, account_decode, account_verify
from .admission import Admission
from .model import ForwardContext, HybridModel
from .output import Output
from .request import Request


def propose_drafts(rows: list[Request], num_draft_tokens: int, disable_by_batch_size: int,
                   max_model_len: int, room: list[int] | None = None) -> list[list[int]]:
    """Prompt-lookup drafts of each row: none in a batch of `disable_by_batch_size` rows or more (a verify
    then costs more than its drafts buy), none past the context length or the row's max_tokens, nor past
    room[i] (the tokens row i may consume before the prefix cache's next grid boundary, if given)."""
    if not num_draft_tokens or (disable_by_batch_size and len(rows) >= disable_by_batch_size):
        return [[] for _ in rows]
    k = min(num_draft_tokens, max_model_len - max(len(r.tokens) for r in rows))
    room = room or [k] * len(rows)
    return [drafter.propose(r.tokens, min(k, r.params.max_tokens - len(r.output) - 1, room_i)) if k > 0 else []
            for r, room_i in zip(rows, room)]


def accept(row: Request, drafts: list[int], logits: torch.Tensor, argmax: list[int], eos_ids) -> list[int]:
    """The tokens a verified row emits: its accepted drafts, then one more (the replacement of the first
    rejected draft, or the bonus token). logits [T, V] / argmax [T]: position j follows drafts[:j].
    Plain greedy rows accept drafts equal to the argmax; the others by speculative sampling (sampling.py),
    so their tokens are distributed exactly as without drafts."""
    if not row.plain_greedy:
        return sampling.speculate(row.params, logits, row.prompt, row.output, drafts, eos_ids, row.generator)
    n = 0
    while n < len(drafts) and drafts[n] == argmax[n]:
        n += 1
    return drafts[:n] + [argmax[n]]


class StepRunner:
    def __init__(self, model: HybridModel, ctx: ForwardContext, admission: Admission, output: Output,
                 step_stats: StepStats, args):
        self.model, self.ctx, self.admission, self.output = model, ctx, admission, output
        self.step_stats, self.counters = step_stats, step_stats.counters
        self.pool = ctx.pool
        self.cache = admission.cache
        self.conventional = self.pool.cfg.mode == "conventional"
        self.sizes = StateSizes.of(self.pool)
        self.max_model_len = args.max_model_len
        self.num_draft_tokens = args.speculative_num_draft_tokens
        self.disable_by_batch_size = args.speculative_disable_by_batch_size

    # ------------------------------------------------------------------ prefill
    def prefill_chunk(self, req: Request, events: list) -> None:
        """Prefill the request's next chunk (admission.next_chunk); after its last one, every sample of the
        request emits its first token from the prefill's logits."""
        start, end = self.admission.next_chunk(req)
        chunk = req.tokens[start:end]
        dev = self.model.device
        logits = self.model.forward(torch.tensor([chunk], device=dev), torch.tensor([start], device=dev),
                                    torch.tensor([req.slot], device=dev, dtype=torch.int32), "prefill", self.ctx,
                                    end)
        self.pool.note_prefill([req.slot], [len(chunk)])
        self.counters["prompt_tokens"] += len(chunk)
        self.admission.chunk_done(req, end)      # prefix-cache entry; the state forked into the other samples
        if req.prefilled == req.prefill_len:
            for r in req.group:
                self.output.emit(r, [self.output.sample(r, logits[0])], events, logits[:1])

    # ------------------------------------------------------------------ decode
    def decode_step(self, rows: list[Request], events: list) -> None:
        """One token for every row: a batched decode forward, the ring cursors advanced, one token sampled
        (the batched argmax for plain greedy rows) and emitted per row."""
        slots, pos = self._batch(rows)
        cursors = self._cursors(rows)
        tokens = torch.tensor([[r.tokens[-1]] for r in rows], device=self.model.device)
        max_len = max(len(r.tokens) for r in rows)
        logits = self.model.forward(tokens, pos, slots, "decode", self.ctx, max_len)[:, 0]
        self.pool.advance(slots.long())
        account_decode(self.sizes, self.counters, self.conventional, self.pool.cfg.window, cursors)
        greedy = logits.argmax(-1).tolist()
        for r in rows:                              # each slot now holds the state after r.tokens
            if self.cache.on_grid(len(r.prompt) + len(r.output)):
                self.admission.keep_decoded(r, r.tokens)
        for i, r in enumerate(rows):
            try:
                tok = greedy[i] if r.plain_greedy else self.output.sample(r, logits[i])
                self.output.emit(r, [tok], events, logits[i:i + 1])
            except Exception as e:   # noqa: BLE001 - e.g. a numerical failure in this row's sampling
                self.output.fail(r, e, events)
        self.counters["decode_steps"] += 1
        self.step_stats.last_batch = len(rows)

    # ------------------------------------------------------------------ speculative decoding
    def speculative_step(self, rows: list[Request], events: list) -> None:
        """One speculative step of a batch: draft -> verify -> accept -> commit -> emit. A batch without any
        draft takes a plain decode step instead."""
        # draft: prompt lookup over each row's tokens
        room = [self.cache.next_boundary(len(r.tokens) - 1) - len(r.tokens) for r in rows] \
            if self.cache.enabled else None
        drafts = propose_drafts(rows, self.num_draft_tokens, self.disable_by_batch_size, self.max_model_len, room)
        if not any(drafts):
            return self.decode_step(rows, events)
        # verify: one forward over [last token, drafts..., padding]; each position's record goes into the ring
        T = 1 + max(len(d) for d in drafts)
        slots, pos = self._batch(rows)
        cursors = self._cursors(rows)
        slot_list = [r.slot for r in rows]
        self.ctx.ops.begin_verify(slot_list, T)
        tokens = torch.tensor([[r.tokens[-1]] + d + [0] * (T - 1 - len(d)) for r, d in zip(rows, drafts)],
                              device=self.model.device)
        max_len = max(len(r.tokens) for r in rows) + T - 1
        logits = self.model.forward(tokens, pos, slots, "verify", self.ctx, max_len)     # [B, T, V]
        argmax = logits.argmax(-1).tolist()
        # accept: greedy rows by the argmax, sampled rows by the speculative-sampling rule
        emitted = []
        for i, (r, d) in enumerate(zip(rows, drafts)):
            try:
                toks = accept(r, d, logits[i], argmax[i], self.output.tokenizer.eos_ids)
            except Exception as e:   # noqa: BLE001 - this row fails; committing its first record is harmless
                self.output.fail(r, e, events)
                toks = []
            emitted.append(toks)
            n = max(len(toks) - 1, 0)               # accepted drafts
            self.counters["draft_tokens"] += len(d)
            self.counters["accepted_draft_tokens"] += n
            self.counters["rollbacks"] += T - (n + 1)   # rejected draft records (sglang_replayssm.accounting)
        # commit: each row keeps its accepted records (>= 1), the rest of the ring is rolled back
        accepted = [max(len(toks), 1) for toks in emitted]
        self.ctx.ops.accept_drafts(slot_list, accepted)
        mode = "replay" if not (self.conventional or self.ctx.ops.snapshot_verify) else "snapshot"
        account_verify(self.sizes, self.counters, mode, self.pool.cfg.window, cursors, accepted, T)
        for r, toks, a in zip(rows, emitted, accepted):   # each slot holds the state after a more tokens
            n = len(r.tokens) - 1 + a
            if r.finish_reason != "error" and self.cache.on_grid(n):
                self.admission.keep_decoded(r, (r.tokens + toks)[:n])
        # emit: the accepted tokens of each row that did not fail
        for i, (r, toks) in enumerate(zip(rows, emitted)):
            if r.finish_reason == "error":
                continue
            try:
                self.output.emit(r, toks, events, logits[i])
            except Exception as e:   # noqa: BLE001
                self.output.fail(r, e, events)
        self.counters["verify_steps"] += 1
        self.step_stats.last_batch = len(rows)

    # ------------------------------------------------------------------ batch tensors
    def _batch(self, rows: list[Request]):
        """Slots [B] int32 and first positions [B] (the last token's) of a decode / verify batch."""
        dev = self.model.device
        slots = torch.tensor([r.slot for r in rows], device=dev, dtype=torch.int32)
        pos = torch.tensor([len(r.tokens) - 1 for r in rows], device=dev)
        return slots, pos

    def _cursors(self, rows: list[Request]) -> list[int]:
        """Ring cursors of the rows before the step (for the traffic counters)."""
        if self.conventional:
            return [0] * len(rows)
        return self.pool.cursor[torch.tensor([r.slot for r in rows], device=self.pool.device)].tolist()
