"""Which requests run, and in which slot: the native engine's waiting queue and running list.

* `new_request`: a checked Request from a prompt (text, token ids, or {"messages": [...]}) and its
  sampling parameters; with `resume`, the output of an answer cut elsewhere, prefilled after the prompt.
* `admit`: waiting requests take free pool slots in arrival order, a request's n samples together
  (prefix-cache entries give their slots up first; a full pool makes requests wait). A prompt that
  extends a cached prefix starts from a fork of that entry's state.
* `next_chunk` / `chunk_done` (chunked prefill): the next span of a prompt to prefill, cut at the
  boundaries whose states the prefix cache wants (`PrefixCache.prompt_cuts`) so each can be kept in a
  spare slot (`keep`); when sample 0's prefill ends, its state is forked into its sibling samples' slots.
* `keep` / `keep_decoded`: a copy of a request's state kept as a prefix-cache entry if no request waits: at
  prefill in a spare slot or in place of the least recently used entry (but its branching point); at decode
  (`keep_decoded`, when a sequence reaches a grid boundary) in a spare slot only, replacing the entry the
  request kept at its previous boundary.
* `abort` / `retire`: a request leaves (aborted, or finished); its slot goes back to the pool.
"""

from __future__ import annotations

import itertools
from collections import deque

from ..http_front.prefix_hash import BLOCK_CHARS, MAX_REPORTED_BLOCKS, block_hashes
from . import sampling
from .prefix_cache import PrefixCache
from .request import Request
from .sampling import RequestError, SamplingParams


class Admission:
    def __init__(self, args, vocab_size: int, tokenizer, pool, kv, cache: PrefixCache):
        self.max_model_len, self.chunk_size = args.max_model_len, args.chunk_size
        self.vocab_size, self.tokenizer = vocab_size, tokenizer
        self.pool, self.kv, self.cache = pool, kv, cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._ids = itertools.count()

    # ------------------------------------------------------------------ arrivals
    def new_request(self, prompt, params: SamplingParams, rid: str | None = None, resume=None) -> Request:
        """A checked request, queued; RequestError (HTTP 400) naming the field otherwise."""
        params = sampling.check_params(params, self.vocab_size)
        if params.n > self.pool.num_slots:
            raise RequestError(f"n: at most {self.pool.num_slots} (the engine's slots), got {params.n}")
        if params.n > 1 and resume is not None:
            raise RequestError("n: a resumed request has one sample")
        ids = self._prompt_ids(prompt)
        req = Request(rid or f"r{next(self._ids)}", ids, params, generator=sampling.generator_for(params))
        req.group = [req]
        if resume is not None:
            self._resume(req, *resume)
        self.waiting.append(req)
        return req

    def _prompt_ids(self, prompt) -> list[int]:
        field = "messages" if isinstance(prompt, dict) else "prompt"
        try:
            if isinstance(prompt, dict):
                ids = self.tokenizer.chat_prompt(prompt["messages"], prompt.get("continue_final_message", False))
            elif isinstance(prompt, str):
                ids = self.tokenizer.encode(prompt)
            else:
                ids = [int(t) for t in prompt]
        except Exception as e:   # noqa: BLE001 - whatever the tokenizer makes of this input, it is this input's
            raise RequestError(f"{field}: cannot be tokenized ({type(e).__name__}: {str(e)[:200]})") from None
        if not ids:
            raise RequestError("prompt: must not be empty")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"prompt: token ids {bad[:5]} outside the vocabulary (size {self.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise RequestError(f"prompt: {len(ids)} tokens, the context length is {self.max_model_len}")
        return ids

    def _resume(self, req: Request, out: list, text_chars: int) -> None:
        if not (isinstance(out, list) and out and all(isinstance(t, int) and 0 <= t < self.vocab_size
                                                      for t in out)):
            raise RequestError(f"replayssm_resume.token_ids: expected token ids of the vocabulary (size "
                               f"{self.vocab_size})")
        if len(out) >= req.params.max_tokens or len(req.prompt) + len(out) >= self.max_model_len:
            raise RequestError("replayssm_resume.token_ids: nothing left to generate (max_tokens or the context "
                               "length reached)")
        if not 0 <= text_chars <= len(self.tokenizer.decode(out)):
            raise RequestError("replayssm_resume.text_chars: more characters than the token ids' text")
        req.output, req.resumed, req.sent = list(out), len(out), text_chars

    # ------------------------------------------------------------------ slots
    def admit(self) -> list[tuple[Request, Exception]]:
        """Move waiting requests into free slots while there are enough; returns the requests whose
        admission failed, with the exception (the caller fails them: they are already running)."""
        failed = []
        while self.waiting:
            n = self.waiting[0].params.n            # a request's n samples are admitted together
            while self.pool.num_free < n and len(self.cache):
                self.pool.free([self.cache.evict()])
            if self.pool.num_free < n:
                break                               # the pool is full: requests wait
            req = self.waiting.popleft()
            self.running.append(req)
            try:
                req.slot = self.pool.alloc(1)[0]
                hit = self.cache.lookup(req.prompt)
                if hit is not None:                 # start from the cached prefix state
                    self.fork(hit[0], req.slot)
                    self.pool.force_flush([req.slot])   # an entry kept at decode has ring records: fold this copy's
                    req.prefilled = hit[1]
                req.cache_branch = self.cache.branch_point(req.prompt)
                req.cache_cuts = self.cache.prompt_cuts(req.prompt, req.prefilled, req.cache_branch)
                for i, slot in enumerate(self.pool.alloc(n - 1) if n > 1 else [], 1):
                    kid = Request(req.rid, req.prompt, req.params, slot=slot, index=i, group=req.group,
                                  awaiting_fork=True, generator=sampling.generator_for(req.params, i))
                    req.group.append(kid)           # gets sample 0's state once that is prefilled
                    self.running.append(kid)
            except Exception as e:   # noqa: BLE001 - this request fails, the others go on
                failed.append((req, e))
        return failed

    def fork(self, src: int, dst) -> None:
        """Copy slot src's state (SSM pool and KV cache) into dst, one slot or a list of them."""
        self.pool.fork(src, dst)
        for d in [dst] if isinstance(dst, int) else dst:
            self.kv.copy(src, d)

    def prefilling(self) -> list[Request]:
        return [r for r in self.running if r.in_prefill]

    def decoding(self) -> list[Request]:
        return [r for r in self.running if r.in_decode]

    # ------------------------------------------------------------------ chunked prefill
    def next_chunk(self, req: Request) -> tuple[int, int]:
        """[start, end) of req.tokens to prefill next: at most chunk_size tokens, ending at the next boundary
        whose state the prefix cache wants (req.cache_cuts, set at admission)."""
        start = req.prefilled
        end = min(start + self.chunk_size, req.prefill_len)
        return start, next((b for b in req.cache_cuts if start < b < end), end)

    def chunk_done(self, req: Request, end: int) -> None:
        """req.tokens[:end] are prefilled: keep the state there if the prefix cache wants it, and at the end
        of the prefill fork it into the request's other samples."""
        req.prefilled = end
        if end in req.cache_cuts:
            self.keep(req, req.prompt[:end], evict=True)
        if req.prefilled == req.prefill_len and len(req.group) > 1:   # parallel samples share this prefill
            self.fork(req.slot, [kid.slot for kid in req.group[1:]])
            for kid in req.group[1:]:
                kid.prefilled, kid.awaiting_fork = len(kid.prompt), False

    def keep(self, req: Request, key: list, evict: bool, replaces: tuple | None = None) -> bool:
        """Keep a copy of req's state (the state after the tokens `key`) as a prefix-cache entry, if the cache
        wants it and no request waits, in a spare slot or, with `evict`, in the slot of the least recently used
        entry but req's branching point (when the pool is full or the cache holds max_entries). `replaces`:
        the key of an entry of req's that this one supersedes (dropped first). Whether it was kept."""
        if not self.cache.wants(key) or self.waiting:
            return False
        if replaces is not None and (old := self.cache.remove(replaces)) is not None:
            self.pool.free([old])
        if len(self.cache) >= self.cache.max_entries or self.pool.num_free == 0:
            branch = {tuple(req.prompt[:req.cache_branch])} if req.cache_branch else set()
            slot = self.cache.evict(skip=branch) if evict else None
            if slot is None:
                return False
            self.pool.free([slot])
        dst = self.pool.alloc(1)[0]
        try:
            self.fork(req.slot, dst)
        except Exception:   # noqa: BLE001 - a cache entry is no reason to fail the request
            self.pool.free([dst])
            return False
        self.cache.insert(key, dst, self._prefix_blocks(key))
        return True

    def keep_decoded(self, req: Request, key: list) -> None:
        """A decoding request reached a grid boundary: keep its state there in a spare slot, in place of the one
        it kept at its previous boundary (as SGLang's track slot holds a request's last tracked state)."""
        if self.keep(req, key, False, req.decode_entry):
            req.decode_entry = tuple(key)

    def _prefix_blocks(self, key: list) -> list:
        """The router's name for a cached prefix: chained hashes of its text's blocks (never the text)."""
        try:
            return block_hashes(self.tokenizer.decode(key), BLOCK_CHARS, MAX_REPORTED_BLOCKS)
        except Exception:   # noqa: BLE001 - a report is no reason to fail the request
            return []

    # ------------------------------------------------------------------ departures
    def abort(self, rid: str) -> None:
        for q in (self.waiting, self.running):
            for r in list(q):
                if r.rid == rid:
                    r.finish_reason = "abort"
                    q.remove(r)
                    self._release(r)

    def retire(self) -> int:
        """Remove the finished requests from the running list, freeing their slots; returns how many
        finished without an error."""
        done = 0
        for req in [r for r in self.running if r.finish_reason is not None]:
            self.running.remove(req)
            self._release(req)
            done += req.finish_reason != "error"
        return done

    def _release(self, req: Request) -> None:
        if req.slot is not None:
            self.pool.free([req.slot])
            req.slot = None

    def flush_prefix_cache(self) -> bool:
        """Drop every prefix-cache entry; refused (False) while requests run or wait, as SGLang does."""
        if self.running or self.waiting:
            return False
        while len(self.cache):
            self.pool.free([self.cache.evict()])
        return True
