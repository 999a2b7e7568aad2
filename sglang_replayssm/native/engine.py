"""The native engine: continuous batching of requests over one ReplayStatePool, in-process and synchronous
(`engine_process.py` puts it behind pyzmq, `server.py` behind HTTP).

`Engine.step()` runs one iteration and returns its output events:
  1. admit waiting requests while slots are free (admission.py: a full pool makes requests wait);
  2. one prefill chunk per prefilling request (chunked prefill; step_runner.StepRunner.prefill_chunk);
  3. one step for every decoding request: a decode step, or with speculative decoding one speculative
     step (draft -> verify -> accept -> commit -> emit; StepRunner.speculative_step);
  4. finished requests leave and free their slots.
Requests join and leave between steps. One request's failure stays its own: an exception while
admitting, prefilling, sampling or emitting for one request fails that request alone (an error event,
status 500; output.py); only a failed batched forward fails the rows of that batch.

The parts: `Admission` (queue, slots, prefill chunks, prefix cache), `StepRunner` (the model steps, with an
explicit `ForwardContext`), `Output` (sampling, stop rules, events), `Accounting` (counters, gauges).
"""

from __future__ import annotations

import time

from ..http_front.prefix_hash import BLOCK_CHARS
from ..pool import ReplayStatePool, SSMGeometry
from .step_stats import StepStats
from .admission import Admission
from .engine_args import EMBEDDED_PREFIX, EngineArgs   # noqa: F401 - re-exported: the engine API
from .loader import build_model
from .model import ForwardContext, KVCache
from .output import Output
from .prefix_cache import PrefixCache
from .request import Request
from .sampling import RequestError, SamplingParams  # noqa: F401 - re-exported: the engine API
from .ssm_ops import SSMOps
from .step_runner import StepRunner


class Engine:
    def __init__(self, args: EngineArgs, built=None):
        args.check()
        self.args = args
        self.cfg, self.model, self.tokenizer = built or build_model(args)
        if args.kernels != "auto":   # "triton" also on CPU (interpreter, tests); "reference": PyTorch only
            self.model.attn_impl = "triton" if args.kernels == "triton" else "sdpa"
        cfg, opts = self.cfg, args.replayssm
        opts.check_model(cfg.ssm_head_k_dim)
        self.num_draft_tokens = args.speculative_num_draft_tokens
        geo = SSMGeometry(family=cfg.family, num_heads=cfg.ssm_heads, head_v_dim=cfg.ssm_head_v_dim,
                          head_k_dim=cfg.ssm_head_k_dim, num_k_heads=cfg.ssm_k_heads, conv_dim=cfg.conv_dim,
                          conv_kernel=cfg.conv_kernel)
        max_drafts = self.num_draft_tokens + 1 if self.num_draft_tokens else 0
        replay_cfg = opts.replay_config(max_drafts=max_drafts, family=cfg.family, device=self.model.device)
        self.pool = ReplayStatePool(geo, cfg.num_ssm_layers, args.max_running_requests, replay_cfg,
                                    device=self.model.device, act_dtype=self.model.dtype)
        self.kv = KVCache(cfg, args.max_running_requests + 1, args.max_model_len, self.model.device,
                          self.model.dtype)
        self.ops = SSMOps(cfg.family, self.pool, replay_verify=opts.verify, kernels=args.kernels)
        self.forward_ctx = ForwardContext(self.pool, self.kv, self.ops)
        self.cache = PrefixCache(args.prefix_cache_entries, args.prefix_cache_interval)
        self.step_stats = StepStats()
        self.counters = self.step_stats.counters
        self.admission = Admission(args, cfg.vocab_size, self.tokenizer, self.pool, self.kv, self.cache)
        self.output = Output(self.tokenizer, args.max_model_len, self.counters)
        self.runner = StepRunner(self.model, self.forward_ctx, self.admission, self.output, self.step_stats, args)

    @property
    def waiting(self):
        return self.admission.waiting

    @property
    def running(self) -> list[Request]:
        return self.admission.running

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt, params: SamplingParams, rid: str | None = None, resume=None) -> Request:
        """prompt: text, list of token ids, or {"messages": [...]} for chat. resume: (output token ids,
        characters of their text already delivered) of an answer cut elsewhere: they are prefilled
        after the prompt and the request goes on as if it had produced them (max_tokens, stop strings
        and the text emitted next count them), so the continuation is exactly the uncut answer's."""
        return self.admission.new_request(prompt, params, rid, resume)

    def abort(self, rid: str) -> None:
        self.admission.abort(rid)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ one iteration
    def step(self) -> list[dict]:
        events: list[dict] = []
        for req, exc in self.admission.admit():
            self.output.fail(req, exc, events)
        decoding = self.admission.decoding()        # before this step's prefills end
        for req in self.admission.prefilling():
            try:
                self.runner.prefill_chunk(req, events)
            except Exception as e:   # noqa: BLE001 - this request fails, the others go on
                self.output.fail(req, e, events)
        if decoding:
            try:
                if self.num_draft_tokens:
                    self.runner.speculative_step(decoding, events)
                else:
                    self.runner.decode_step(decoding, events)
                self.step_stats.ring_gauge(self.pool, [r.slot for r in self.running if r.slot is not None])
            except Exception as e:   # noqa: BLE001 - the batched forward failed: its rows' state is unknown
                for r in decoding:
                    if r.finish_reason is None:
                        self.output.fail(r, e, events)
            self.counters["steps"] += 1
        self.counters["requests_finished"] += self.admission.retire()
        return events

    def generate(self, prompts, params: SamplingParams) -> list[list[int]]:
        """Run prompts to completion (tests, benchmarks); returns the output token ids of each."""
        reqs = [self.add_request(p, params) for p in prompts]
        while self.has_work():
            self.step()
        return [r.output for r in reqs]

    def flush_cache(self) -> bool:
        """Drop every prefix-cache entry; refused (False) while requests run or wait, as SGLang does."""
        return self.admission.flush_prefix_cache()

    # ------------------------------------------------------------------ introspection
    def throughput(self, window_s: float = 10.0) -> float:
        """Generated tokens per second over the last `window_s` seconds."""
        return self.step_stats.throughput(window_s)

    def stats(self) -> dict:
        total, acc = self.pool.num_slots, self.step_stats
        return {**self.counters,
                "running": len(self.running), "waiting": len(self.waiting),
                "free_slots": self.pool.num_free + len(self.cache),   # cache entries yield to requests
                "total_slots": total, "batch_size": acc.last_batch, "ring_occupancy": acc.ring_occupancy,
                "pool_usage": len(self.running) / total, "cached_prefixes": self.cache.hashes(),
                "cached_prefix_blocks": {"block_chars": BLOCK_CHARS, "prefixes": self.cache.block_lists()},
                "prefix_cache_hits": self.cache.hits, "prefix_cache_hit_tokens": self.cache.hit_tokens,
                "slot_bytes": self.pool.bytes_per_slot(), "gen_throughput": self.throughput(),
                "time": time.time()}

    def info(self) -> dict:
        pool = self.pool
        return {"model": self.args.served_name, "family": self.cfg.family, "arch": self.cfg.arch,
                "ssm_layers": self.cfg.num_ssm_layers, "attention_layers": self.cfg.num_attn_layers,
                "backend": self.ops.backend, "verify_backend": self.ops.verify_backend, "mode": pool.cfg.mode,
                "window": pool.cfg.window,
                "device": str(self.model.device), "dtype": str(self.model.dtype).replace("torch.", ""),
                "max_model_len": self.args.max_model_len, "slots": pool.num_slots,
                "speculative_num_draft_tokens": self.num_draft_tokens,
                "speculative_disable_by_batch_size": self.args.speculative_disable_by_batch_size,
                "speculative_decoding": "off" if not self.num_draft_tokens else (
                    "on at every temperature: greedy rows accept drafts equal to the argmax, sampled rows by "
                    "speculative sampling (a draft x accepted with probability p(x), else a sample of p without "
                    "x), so outputs are distributed exactly as without drafts"),
                "read_copy": pool.cfg.read_copy, "ckpt_precision": pool.cfg.ckpt,
                "state_bytes_per_sequence": pool.bytes_per_slot(),
                "snapshot_state_bytes_per_sequence": ReplayStatePool.capacity(
                    pool.geo, pool.num_layers, pool.cfg, 1, act_dtype=self.model.dtype)["snapshot_bytes_per_slot"],
                "kv_cache_bytes": self.kv.bytes(), "prefix_cache_entries": self.cache.max_entries,
                "prefix_cache_interval": self.cache.interval,
                "tokenizer": self.tokenizer.name, "served_model_name": self.args.served_name}
