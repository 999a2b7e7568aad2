"""The native engine's scheduler: continuous batching over one ReplayStatePool.

`Engine.step()` runs one iteration: admit waiting requests while slots are free (a full pool makes
requests wait), one prefill chunk per prefilling request (chunked prefill), then one decode step for
every running request — or, with speculative decoding, one verify step of 1 + k tokens per row
(prompt-lookup drafts), committed by moving the ring pointer. Returns output events.
Requests join and leave between steps. One request's failure stays its own: an exception while
admitting, prefilling, sampling or emitting for one request fails that request alone (an error
event, status 500); only a failed batched forward fails the rows of that batch. Everything here is
synchronous and in-process; `server.py` puts it behind pyzmq and HTTP.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
import traceback
from collections import deque

import torch

from .. import metric_names
from ..flags import ReplaySSMOptions
from ..pool import ReplayStatePool, SSMGeometry
from ..scheduler.prefix_tree import BLOCK_CHARS, MAX_REPORTED_BLOCKS, block_hashes   # pure Python, no ray
from . import drafter, sampling, traffic
from .loader import EMBEDDED_PREFIX, build_model  # noqa: F401 - EMBEDDED_PREFIX: the engine's API too
from .model import KVCache
from .prefix_cache import PrefixCache
from .sampling import RequestError, SamplingParams  # noqa: F401 - re-exported: the engine API
from .ssm_ops import SSMOps



@dataclasses.dataclass
class EngineArgs:
    model_path: str | None = None        # None / "embedded" / "embedded:gdn": the built-in model
    device: str = "cpu"
    dtype: str = "auto"                  # auto: float32 on CPU, bfloat16 on CUDA
    max_running_requests: int = 8        # pool slots
    max_model_len: int = 1024
    chunk_size: int = 256                # prefill tokens per request per step
    speculative_num_draft_tokens: int = 0
    speculative_disable_by_batch_size: int = 0   # no drafts while this many requests decode together (0: never)
    replayssm: ReplaySSMOptions = dataclasses.field(default_factory=ReplaySSMOptions)
    seed: int = 0
    prefix_cache_entries: int = 0        # prompt-prefix states kept in spare slots (0: off)
    kernels: str = "auto"                # auto (Triton on CUDA) | triton | reference
    tokenizer: str = "auto"              # auto: the folder's HF tokenizer if it has one | byte (tokenizer.py)
    served_model_name: str | None = None # the name clients use (`model`); default from the model path

    @property
    def served_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if not self.model_path or self.model_path.startswith(EMBEDDED_PREFIX):
            family = self.model_path.split(":", 1)[1] if self.model_path and ":" in self.model_path else "mamba2"
            return f"replayssm-embedded-{family}"
        return self.model_path.rstrip("/").split("/")[-1]


@dataclasses.dataclass
class Request:
    rid: str
    prompt: list
    params: SamplingParams
    output: list = dataclasses.field(default_factory=list)
    slot: int | None = None
    prefilled: int = 0
    sent: int = 0                        # characters of output text already emitted
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    resumed: int = 0                     # output tokens that came with the request (a resume), prefilled
    index: int = 0                       # which of the request's n samples (choices) this is
    group: list = dataclasses.field(default_factory=list)   # all n samples of the request (this one included)
    awaiting_fork: bool = False          # a sample k > 0 before sample 0's prefill is forked into its slot
    stop_from: int = 0                   # text length when min_tokens was reached (stop strings end after it)

    @property
    def tokens(self) -> list:
        return self.prompt + self.output

    @property
    def prefill_len(self) -> int:
        """Tokens to prefill before decoding: the prompt, and the output a resumed request came with."""
        return len(self.prompt) + self.resumed

    @property
    def in_decode(self) -> bool:
        return self.prefilled == self.prefill_len and bool(self.output) and self.finish_reason is None

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that changes the logits: the batched argmax is its token."""
        return self.params.temperature == 0 and not self.params.processed


class Engine:
    def __init__(self, args: EngineArgs, built=None):
        self.args = args
        self.cfg, self.model, self.tokenizer = built or build_model(args)
        if args.kernels != "auto":   # "triton" also on CPU (interpreter, tests); "reference": PyTorch only
            self.model.attn_impl = "triton" if args.kernels == "triton" else "sdpa"
        cfg, opts = self.cfg, args.replayssm
        opts.check_model(cfg.ssm_head_k_dim)
        if args.max_running_requests < 1:
            raise ValueError("--max-running-requests must be >= 1")
        if args.speculative_num_draft_tokens < 0:
            raise ValueError("--speculative-num-draft-tokens must be >= 0")
        if args.speculative_disable_by_batch_size < 0:
            raise ValueError("--speculative-disable-by-batch-size must be >= 0")
        self.k = args.speculative_num_draft_tokens
        geo = SSMGeometry(family=cfg.family, num_heads=cfg.ssm_heads, head_v_dim=cfg.ssm_head_v_dim,
                          head_k_dim=cfg.ssm_head_k_dim, num_k_heads=cfg.ssm_k_heads, conv_dim=cfg.conv_dim,
                          conv_kernel=cfg.conv_kernel)
        max_drafts = self.k + 1 if self.k else 0
        self.pool = ReplayStatePool(geo, cfg.num_ssm_layers, args.max_running_requests,
                                    opts.replay_config(max_drafts=max_drafts), device=self.model.device,
                                    act_dtype=self.model.dtype)
        self.kv = KVCache(cfg, args.max_running_requests + 1, args.max_model_len, self.model.device,
                          self.model.dtype)
        self.ops = SSMOps(cfg.family, self.pool, replay_verify=opts.verify, kernels=args.kernels)
        self.conventional = self.pool.cfg.mode == "conventional"
        self.sizes = traffic.StateSizes.of(self.pool)
        self.cache = PrefixCache(args.prefix_cache_entries)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._ids = itertools.count()
        self.counters = dict.fromkeys(
            ["prompt_tokens", "generation_tokens", "requests_finished", "steps", "decode_steps", "verify_steps",
             "flushes", "nonflush_steps", "state_bytes_read", "state_bytes_written", "conventional_state_bytes",
             "accepted_records", "rollbacks", "draft_tokens", "accepted_draft_tokens"], 0)
        self.last_batch = 0
        self.ring_occupancy = 0.0
        self._history = deque(maxlen=64)   # (time, generation_tokens) for the throughput gauge

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt, params: SamplingParams, rid: str | None = None, resume=None) -> Request:
        """prompt: text, list of token ids, or {"messages": [...]} for chat. resume: (output token ids,
        characters of their text already delivered) of an answer cut elsewhere: they are prefilled
        after the prompt and the request goes on as if it had produced them (max_tokens, stop strings
        and the text emitted next count them), so the continuation is exactly the uncut answer's."""
        params = sampling.check_params(params, self.cfg.vocab_size)
        if params.n > self.pool.num_slots:
            raise RequestError(f"n: at most {self.pool.num_slots} (the engine's slots), got {params.n}")
        if params.n > 1 and resume is not None:
            raise RequestError("n: a resumed request has one sample")
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
        bad = [t for t in ids if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise RequestError(f"prompt: token ids {bad[:5]} outside the vocabulary (size {self.cfg.vocab_size})")
        if len(ids) >= self.args.max_model_len:
            raise RequestError(f"prompt: {len(ids)} tokens, the context length is {self.args.max_model_len}")
        req = Request(rid or f"r{next(self._ids)}", ids, params, generator=sampling.generator_for(params))
        req.group = [req]
        if resume is not None:
            self._resume(req, *resume)
        self.waiting.append(req)
        return req

    def _resume(self, req: Request, out: list, text_chars: int) -> None:
        if not (isinstance(out, list) and out and all(isinstance(t, int) and 0 <= t < self.cfg.vocab_size
                                                      for t in out)):
            raise RequestError(f"replayssm_resume.token_ids: expected token ids of the vocabulary (size "
                               f"{self.cfg.vocab_size})")
        if len(out) >= req.params.max_tokens or len(req.prompt) + len(out) >= self.args.max_model_len:
            raise RequestError("replayssm_resume.token_ids: nothing left to generate (max_tokens or the context "
                               "length reached)")
        if not 0 <= text_chars <= len(self.tokenizer.decode(out)):
            raise RequestError("replayssm_resume.text_chars: more characters than the token ids' text")
        req.output, req.resumed, req.sent = list(out), len(out), text_chars

    def abort(self, rid: str) -> None:
        for q in (self.waiting, self.running):
            for r in list(q):
                if r.rid == rid:
                    r.finish_reason = "abort"
                    q.remove(r)
                    if r.slot is not None:
                        self.pool.free([r.slot])
                        r.slot = None

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ one iteration
    def step(self) -> list[dict]:
        events: list[dict] = []
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
                    self._fork(hit[0], req.slot)
                    req.prefilled = hit[1]
                for i, slot in enumerate(self.pool.alloc(n - 1) if n > 1 else [], 1):
                    kid = Request(req.rid, req.prompt, req.params, slot=slot, index=i, group=req.group,
                                  awaiting_fork=True, generator=sampling.generator_for(req.params, i))
                    req.group.append(kid)           # gets sample 0's state once that is prefilled
                    self.running.append(kid)
            except Exception as e:   # noqa: BLE001 - this request fails, the others go on
                self._fail(req, e, events)
        decoding = [r for r in self.running if r.in_decode]
        for req in [r for r in self.running
                    if r.prefilled < r.prefill_len and r.finish_reason is None and not r.awaiting_fork]:
            try:
                self._prefill_chunk(req, events)
            except Exception as e:   # noqa: BLE001
                self._fail(req, e, events)
        if decoding:
            try:
                drafts = self._drafts(decoding)
                if any(drafts):
                    self._verify(decoding, drafts, events)
                else:
                    self._decode(decoding, events)
            except Exception as e:   # noqa: BLE001 - the batched forward failed: its rows' state is unknown
                for r in decoding:
                    if r.finish_reason is None:
                        self._fail(r, e, events)
            self.counters["steps"] += 1
        for req in [r for r in self.running if r.finish_reason is not None]:
            self.running.remove(req)
            if req.slot is not None:
                self.pool.free([req.slot])
                req.slot = None
            if req.finish_reason != "error":
                self.counters["requests_finished"] += 1
        return events

    def _fail(self, req: Request, exc: Exception, events: list) -> None:
        """Fail one request: an error event for its client (status 500), the traceback in the log."""
        print(f"replayssm engine: request {req.rid} failed:", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)
        for r in req.group or [req]:   # its other samples end with it (one error answers the request)
            r.finish_reason = "error"
        events.append({"rid": req.rid, "error": f"engine error: {type(exc).__name__}: {str(exc)[:200]}",
                       "status": 500})

    def _fork(self, src: int, dst) -> None:
        """Copy slot src's state (SSM pool and KV cache) into dst, one slot or a list of them."""
        self.pool.fork(src, dst)
        for d in [dst] if isinstance(dst, int) else dst:
            self.kv.copy(src, d)

    def _prefix_blocks(self, key: list) -> list:
        """The router's name for a cached prefix: chained hashes of its text's blocks (never the text)."""
        try:
            return block_hashes(self.tokenizer.decode(key), BLOCK_CHARS, MAX_REPORTED_BLOCKS)
        except Exception:   # noqa: BLE001 - a report is no reason to fail the request
            return []

    def _prefill_chunk(self, req: Request, events: list) -> None:
        start = req.prefilled
        end = min(start + self.args.chunk_size, req.prefill_len)
        boundary = len(req.prompt) - 1         # prefix-cache key: the prompt without its last token
        caching = self.cache.wants(req.prompt[:boundary])
        if caching and start < boundary < end:
            end = boundary
        chunk = req.tokens[start:end]
        dev = self.model.device
        tokens = torch.tensor([chunk], device=dev)
        logits = self.model.forward(tokens, torch.tensor([start], device=dev),
                                    torch.tensor([req.slot], device=dev, dtype=torch.int32), "prefill", self,
                                    start + len(chunk))
        self.pool.note_prefill([req.slot], [len(chunk)])
        req.prefilled += len(chunk)
        self.counters["prompt_tokens"] += len(chunk)
        if caching and req.prefilled == boundary and self.pool.num_free > 0 and not self.waiting:
            if len(self.cache) >= self.cache.max_entries:
                self.pool.free([self.cache.evict()])
            dst = self.pool.alloc(1)[0]
            self._fork(req.slot, dst)
            key = req.prompt[:boundary]
            self.cache.insert(key, dst, self._prefix_blocks(key))
        if req.prefilled == req.prefill_len:
            if len(req.group) > 1:             # parallel samples share this prefill: fork its state
                self._fork(req.slot, [kid.slot for kid in req.group[1:]])
            for kid in req.group[1:]:
                kid.prefilled, kid.awaiting_fork = len(kid.prompt), False
            for r in req.group:
                self._emit(r, [self._sample(r, logits[0])], events, logits[:1])

    def _drafts(self, rows: list[Request]) -> list[list[int]]:
        off = self.args.speculative_disable_by_batch_size
        if not self.k or (off and len(rows) >= off):   # a large batch: a verify costs more than its drafts buy
            return [[] for _ in rows]
        room = self.args.max_model_len - max(len(r.tokens) for r in rows)
        k = min(self.k, room)
        out = []
        for r in rows:
            left = r.params.max_tokens - len(r.output)
            out.append(drafter.propose(r.tokens, min(k, left - 1)) if k > 0 else [])
        return out

    def _batch(self, rows: list[Request]):
        dev = self.model.device
        slots = torch.tensor([r.slot for r in rows], device=dev, dtype=torch.int32)
        pos = torch.tensor([len(r.tokens) - 1 for r in rows], device=dev)
        return slots, pos

    def _cursors(self, rows) -> list[int]:
        if self.conventional:
            return [0] * len(rows)
        return self.pool.cursor[torch.tensor([r.slot for r in rows], device=self.pool.device)].tolist()

    def _decode(self, rows: list[Request], events: list) -> None:
        slots, pos = self._batch(rows)
        cursors = self._cursors(rows)
        tokens = torch.tensor([[r.tokens[-1]] for r in rows], device=self.model.device)
        max_len = max(len(r.tokens) for r in rows)
        logits = self.model.forward(tokens, pos, slots, "decode", self, max_len)[:, 0]
        self.pool.advance(slots.long())
        traffic.account_decode(self.sizes, self.counters, self.conventional, self.pool.cfg.window, cursors)
        self._ring_gauge()
        greedy = logits.argmax(-1).tolist()
        for i, r in enumerate(rows):
            try:
                tok = greedy[i] if r.plain_greedy else self._sample(r, logits[i])
                self._emit(r, [tok], events, logits[i:i + 1])
            except Exception as e:   # noqa: BLE001 - e.g. a numerical failure in this row's sampling
                self._fail(r, e, events)
        self.counters["decode_steps"] += 1
        self.last_batch = len(rows)

    def _verify(self, rows: list[Request], drafts: list[list[int]], events: list) -> None:
        T = 1 + max(len(d) for d in drafts)
        slots, pos = self._batch(rows)
        cursors = self._cursors(rows)
        slot_list = [r.slot for r in rows]
        self.ops.begin_verify(slot_list, T)
        tokens = torch.tensor([[r.tokens[-1]] + d + [0] * (T - 1 - len(d)) for r, d in zip(rows, drafts)],
                              device=self.model.device)
        max_len = max(len(r.tokens) for r in rows) + T - 1
        logits = self.model.forward(tokens, pos, slots, "verify", self, max_len)     # [B, T, V]
        targets = logits.argmax(-1).tolist()
        accepted, new_tokens = [], []
        for i, (r, d) in enumerate(zip(rows, drafts)):
            if not r.plain_greedy:   # speculative sampling from the processed distribution (sampling.py)
                try:
                    toks = sampling.speculate(r.params, logits[i], r.prompt, r.output, d, self.tokenizer.eos_ids,
                                              r.generator)
                    n = len(toks) - 1
                except Exception as e:   # noqa: BLE001 - this row fails; its commit is harmless
                    self._fail(r, e, events)
                    n, toks = 0, []
            else:
                n = 0
                while n < len(d) and d[n] == targets[i][n]:
                    n += 1
                toks = d[:n] + [targets[i][n]]
            accepted.append(n + 1)
            new_tokens.append(toks)
            self.counters["draft_tokens"] += len(d)
            self.counters["accepted_draft_tokens"] += n
            self.counters["rollbacks"] += T - (n + 1)   # rejected draft records (metric_names)
        self.ops.commit(slot_list, accepted)
        mode = "replay" if not (self.conventional or self.ops.snapshot_verify) else "snapshot"
        traffic.account_verify(self.sizes, self.counters, mode, self.pool.cfg.window, cursors, accepted, T)
        self._ring_gauge()
        for i, (r, toks) in enumerate(zip(rows, new_tokens)):
            if r.finish_reason == "error":
                continue
            try:
                self._emit(r, toks, events, logits[i])
            except Exception as e:   # noqa: BLE001
                self._fail(r, e, events)
        self.counters["verify_steps"] += 1
        self.last_batch = len(rows)

    # ------------------------------------------------------------------ accounting
    def _ring_gauge(self) -> None:
        live = [r.slot for r in self.running if r.slot is not None]
        if self.conventional or not live:
            self.ring_occupancy = 0.0
            return
        cur = self.pool.cursor[torch.tensor(live, device=self.pool.device)]
        self.ring_occupancy = metric_names.ring_occupancy(cur.tolist(), self.pool.cfg.window)

    # ------------------------------------------------------------------ sampling and output
    def _sample(self, req: Request, logits: torch.Tensor) -> int:
        return sampling.sample(req.params, logits, req.prompt, req.output, self.tokenizer.eos_ids, req.generator)

    def _emit(self, req: Request, toks: list[int], events: list, logits: torch.Tensor | None = None) -> None:
        """Append sampled tokens (logits[j]: the position toks[j] came from, for logprobs), apply the
        stop rules (EOS, stop_token_ids, stop strings, max_tokens; none before min_tokens) and queue
        the output event with the text that is final so far."""
        p, new = req.params, []
        for t in toks:
            if req.finish_reason is not None:
                break
            if (t in self.tokenizer.eos_ids and not p.ignore_eos) or t in p.stop_token_ids:
                req.finish_reason = "stop"
                break
            req.output.append(t)
            new.append(t)
            if len(req.output) >= p.max_tokens or len(req.tokens) >= self.args.max_model_len:
                req.finish_reason = "length"
        self.counters["generation_tokens"] += len(new)
        text = self.tokenizer.decode(req.output)
        if len(req.output) < p.min_tokens:
            req.stop_from = len(text)
        elif p.stop:
            start = max(0, req.sent - max(len(s) for s in p.stop))
            hits = [i for i in (text.find(s, max(start, req.stop_from - len(s) + 1)) for s in p.stop) if i >= 0]
            if hits:
                text = text[:min(hits)]
                req.finish_reason = "stop"
        if req.finish_reason is None:   # hold back a possible stop-string prefix / an incomplete character
            hold = max((len(s) for s in p.stop), default=1) - 1
            upto = len(text) - hold
            while upto > req.sent and text[upto - 1] == "\ufffd":
                upto -= 1
        else:
            upto = len(text)
        delta = text[req.sent:max(upto, req.sent)]
        req.sent = max(upto, req.sent)
        ev = {"rid": req.rid, "index": req.index, "text": delta, "token_ids": new,
              "finished": req.finish_reason is not None, "finish_reason": req.finish_reason,
              "done": all(r.finish_reason is not None for r in req.group),   # every sample of the request
              "prompt_tokens": len(req.prompt), "completion_tokens": len(req.output)}
        if p.logprobs is not None:
            ev["logprobs"] = sampling.token_logprobs(logits, new, p.logprobs, self.tokenizer.token_entry) if new else []
        events.append(ev)

    # ------------------------------------------------------------------ introspection
    def throughput(self, window_s: float = 10.0) -> float:
        """Generated tokens per second over the last `window_s` seconds."""
        now = time.monotonic()
        self._history.append((now, self.counters["generation_tokens"]))
        old = [(t, n) for t, n in self._history if now - t <= window_s]
        if len(old) < 2 or old[-1][0] - old[0][0] <= 0:
            return 0.0
        return (old[-1][1] - old[0][1]) / (old[-1][0] - old[0][0])

    def stats(self) -> dict:
        total = self.pool.num_slots
        return {**{k: v for k, v in self.counters.items()},
                "running": len(self.running), "waiting": len(self.waiting),
                "free_slots": self.pool.num_free + len(self.cache),   # cache entries yield to requests
                "total_slots": total, "batch_size": self.last_batch, "ring_occupancy": self.ring_occupancy,
                "pool_usage": len(self.running) / total, "cached_prefixes": self.cache.hashes(),
                "cached_prefix_blocks": {"block_chars": BLOCK_CHARS, "prefixes": self.cache.block_lists()},
                "prefix_cache_hits": self.cache.hits, "prefix_cache_hit_tokens": self.cache.hit_tokens,
                "gen_throughput": self.throughput(),
                "time": time.time()}

    def info(self) -> dict:
        return {"model": self.args.served_name, "family": self.cfg.family, "arch": self.cfg.arch,
                "ssm_layers": self.cfg.num_ssm_layers, "attention_layers": self.cfg.num_attn_layers,
                "backend": self.ops.backend, "verify_backend": self.ops.verify_backend, "mode": self.pool.cfg.mode, "window": self.pool.cfg.window,
                "device": str(self.model.device), "dtype": str(self.model.dtype).replace("torch.", ""),
                "max_model_len": self.args.max_model_len, "slots": self.pool.num_slots,
                "speculative_num_draft_tokens": self.k,
                "speculative_disable_by_batch_size": self.args.speculative_disable_by_batch_size,
                "speculative_decoding": "off" if not self.k else (
                    "on at every temperature: greedy rows accept drafts equal to the argmax, sampled rows by "
                    "speculative sampling (a draft x accepted with probability p(x), else a sample of p without "
                    "x), so outputs are distributed exactly as without drafts"),
                "read_copy": self.pool.cfg.read_copy, "ckpt_precision": self.pool.cfg.ckpt,
                "state_bytes_per_sequence": self.pool.bytes_per_slot(),
                "snapshot_state_bytes_per_sequence": ReplayStatePool.capacity(
                    self.pool.geo, self.pool.num_layers, self.pool.cfg, 1, act_dtype=self.model.dtype)[
                        "snapshot_bytes_per_slot"],
                "kv_cache_bytes": self.kv.bytes(), "prefix_cache_entries": self.cache.max_entries,
                "tokenizer": self.tokenizer.name, "served_model_name": self.args.served_name}

    def flush_cache(self) -> bool:
        """Drop every prefix-cache entry; refused (False) while requests run or wait, as SGLang does."""
        if self.running or self.waiting:
            return False
        while len(self.cache):
            self.pool.free([self.cache.evict()])
        return True

    def generate(self, prompts, params: SamplingParams) -> list[list[int]]:
        """Run prompts to completion (tests, benchmarks); returns the output token ids of each."""
        reqs = [self.add_request(p, params) for p in prompts]
        while self.has_work():
            self.step()
        return [r.output for r in reqs]
