"""The native server's side of the engine process: starts it, sends it requests over pyzmq and routes
its output events to the waiting requests (one asyncio queue per request). What crosses to the engine
process and back is messages.py's dataclasses.

Prompts are tokenized here, in the front end, in a thread pool (`encode`): the engine gets token ids
only, so a large prompt never stalls the engine loop (every other request's decoding) nor the event
loop (every other request's streaming); and a prompt longer than the context is refused (400)
before the engine sees it. `tokenizer` is the model's tokenizer (the one the engine decodes with).

Draining (`drain`, on SIGTERM): new requests get a 503, running ones may finish for a bounded time,
then the rest are ended with a 503 error (an SSE error event, or a JSON error)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing as mp
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid

import zmq
import zmq.asyncio

from .engine_args import EngineArgs
from .engine_process import STOP_SIGNALS, run_engine
from .messages import (CONTROL, Abort, AddRequest, Fatal, Message, Ready, Shutdown, StepOutput, decode, encode,
                       error_event)
from .openai_request import BadRequest
from .tokenizer import ByteTokenizer, load_tokenizer

SEND_TIMEOUT_S = 30.0   # longest a request waits for room in the queue to a live engine (then 503)
SEND_RETRY_S = 0.005
TOKENIZE_THREADS = 2    # prompts tokenized at once, beside the event loop
DRAIN_ANSWER_S = 5.0    # after the drain timeout: how long the aborted requests get to receive their 503
DRAINING = "the server is shutting down (draining): it accepts no new requests"
STOP_GRACE_S = 60.0     # how long the engine process serves on after a SIGTERM of its own (engine_process.py)


def front_end_tokenizer(args: EngineArgs):
    """(tokenizer, the model's vocabulary size): the tokenizer the engine process builds for `args`
    (engine.build_model), without the model."""
    from .config import HybridConfig, embedded_config

    if args.embedded_family is not None:
        vocab = embedded_config(args.embedded_family).vocab_size
        return ByteTokenizer(vocab), vocab
    cfg = HybridConfig.from_file(f"{args.model_path}/config.json")
    return load_tokenizer(args.model_path, cfg.vocab_size, cfg.eos_token_id, mode=args.tokenizer), cfg.vocab_size


def _tokenize(tokenizer, prompt, vocab_size: int, limit: int) -> list[int]:
    """Checked token ids of a prompt: text, token ids, or {"messages": [...]} (chat); a BadRequest
    naming the field otherwise. Runs in a worker thread, so no single step here may hold the GIL
    long (a long C call would stall the event loop): a prompt over the context is refused from its
    length before its ids are built where the tokenizer can count them (`count`)."""
    field = "messages" if isinstance(prompt, dict) else "prompt"

    def check_length(n: int) -> None:
        if n >= limit:
            raise BadRequest(f"{field}: {n} tokens, the context length is {limit}", field)

    try:
        if isinstance(prompt, dict):
            ids = tokenizer.chat_prompt(prompt["messages"], prompt.get("continue_final_message", False))
        elif isinstance(prompt, str):
            if hasattr(tokenizer, "count"):
                check_length(tokenizer.count(prompt))
            ids = tokenizer.encode(prompt)
        else:
            check_length(len(prompt))
            bad = [t for t in prompt if not 0 <= t < vocab_size][:5]
            if bad:
                raise BadRequest(f"prompt: token ids {bad} outside the vocabulary (size {vocab_size})", "prompt")
            ids = list(prompt)
    except BadRequest:
        raise
    except Exception as e:   # noqa: BLE001 - whatever the tokenizer makes of this input, it is this input's
        raise BadRequest(f"{field}: cannot be tokenized ({type(e).__name__}: {str(e)[:200]})", field) from None
    if not ids:
        raise BadRequest("prompt: must not be empty", "prompt")
    check_length(len(ids))
    return ids


class EngineClient:
    """Owns the engine process and the two zmq sockets; one asyncio queue per request.

    The engine's death (its process sentinel becomes readable) is seen at once: every pending
    request gets a 503, `failed` says why, and `on_engine_exit` (set by `serve`) stops the server,
    which then exits non-zero for a supervisor (or the Ray replica) to restart. Sends to the engine
    never block: they are non-blocking and retried until the engine takes them, dies or
    SEND_TIMEOUT_S passes."""

    def __init__(self, args: EngineArgs, stop_grace_s: float = STOP_GRACE_S):
        self.args = args
        self.tmpdir = tempfile.mkdtemp(prefix="replayssm-zmq-")
        self.req_addr = f"ipc://{self.tmpdir}/requests"
        self.out_addr = f"ipc://{self.tmpdir}/outputs"
        self.ctx = zmq.asyncio.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.bind(self.req_addr)
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.bind(self.out_addr)
        self.proc = mp.get_context("spawn").Process(target=run_engine,
                                                    args=(args, self.req_addr, self.out_addr, stop_grace_s),
                                                    name="replayssm-engine", daemon=True)
        self.queues: dict[str, asyncio.Queue] = {}
        self.info: dict = {}
        self.stats: dict = {}
        self.ready = False
        self.draining = False            # SIGTERM: no new requests (drain)
        self.failed: str | None = None   # why the engine did not start, or why it stopped
        self.closing = False
        self.stopping = False            # a stop signal came while the engine was starting (server.py)
        self.on_engine_exit = None       # called once when the engine process dies while serving
        self._tasks: list[asyncio.Task] = []
        self.tokenizer, self.vocab_size = front_end_tokenizer(args)
        self.threads = concurrent.futures.ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="tokenize")

    async def encode(self, prompt) -> list[int]:
        """The prompt's token ids, tokenized and checked in a worker thread (`_tokenize`)."""
        return await asyncio.get_running_loop().run_in_executor(
            self.threads, _tokenize, self.tokenizer, prompt, self.vocab_size, self.args.max_model_len)

    async def start(self, timeout: float = 600.0) -> dict:
        # started with SIGINT / SIGTERM ignored, which the new process inherits until its own handlers are in place
        # (engine_process.handle_stop_signals): a Ctrl-C during its start-up does not end it half-way
        main = threading.current_thread() is threading.main_thread()
        saved = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS} if main else {}
        try:
            self.proc.start()
        finally:
            for s, handler in saved.items():
                signal.signal(s, handler)
        deadline = time.monotonic() + timeout
        while True:
            if await self.pull.poll(200):
                msg = decode(await self.pull.recv())
                if isinstance(msg, Fatal):
                    raise RuntimeError(msg.error)
                if isinstance(msg, Ready):
                    self.info, self.stats, self.ready = msg.info, msg.stats, True
                    break
            if not self.proc.is_alive():
                raise RuntimeError(f"engine process exited with code {self.proc.exitcode} before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine not ready after {timeout:.0f} s")
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._watch())]
        return self.info

    async def _receive(self) -> None:
        while True:
            msg = decode(await self.pull.recv())
            if not isinstance(msg, StepOutput):
                continue
            self.stats = msg.stats
            for ev in msg.events:
                q = self.queues.get(ev["rid"])
                if q is not None:
                    q.put_nowait(ev)

    async def _watch(self) -> None:
        """Wait for the engine process to end (its sentinel fd becomes readable), then answer every
        pending request with a 503 and stop the server."""
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        loop.add_reader(self.proc.sentinel, lambda: ended.done() or ended.set_result(None))
        try:
            await ended
        finally:
            loop.remove_reader(self.proc.sentinel)
        self.proc.join(1.0)
        self.ready = False
        if self.closing:
            return
        self.failed = f"the engine process died (exit code {self.proc.exitcode})"
        print(f"sglang-replayssm: error: {self.failed}; failing {len(self.queues)} pending request(s) "
              "and exiting", file=sys.stderr, flush=True)
        for rid, q in list(self.queues.items()):
            q.put_nowait(error_event(rid, "engine process died", 503))
        if self.on_engine_exit is not None:
            self.on_engine_exit()

    async def _send(self, msg: Message) -> None:
        """Queue one message for the engine without ever blocking on a dead or stuck one."""
        deadline = time.monotonic() + SEND_TIMEOUT_S
        while True:
            if not self.ready:
                raise BadRequest("engine is not running", status=503)
            try:
                await self.push.send(encode(msg), flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                if time.monotonic() > deadline:
                    raise BadRequest(f"engine did not take the request in {SEND_TIMEOUT_S:.0f} s", status=503)
                await asyncio.sleep(SEND_RETRY_S)

    async def generate(self, prompt, params: dict, resume=None):
        """Async iterator over the events of one request (resume: Engine.add_request's)."""
        if self.draining:
            raise BadRequest(DRAINING, status=503)
        if not self.ready:
            raise BadRequest("engine is not running", status=503)
        rid = uuid.uuid4().hex
        q: asyncio.Queue = asyncio.Queue()
        self.queues[rid] = q
        done = False
        try:
            await self._send(AddRequest(rid, prompt, params, resume))
            while True:
                ev = await q.get()
                # the engine is done with it (an error it sent, or the end of all n samples); not a 503
                # put here by drain()
                done = ev.get("done", ev.get("finished", False)) or ("error" in ev and not ev.get("abort"))
                yield ev
                if done or "error" in ev:
                    return
        finally:
            self.queues.pop(rid, None)
            if not done and self.ready:   # client went away: free the slot
                try:
                    await self.push.send(encode(Abort(rid)), flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass

    async def drain(self, timeout: float) -> None:
        """Stop admitting requests, wait up to `timeout` s for the running ones, then end the rest with
        a 503 (and abort them in the engine) and give them DRAIN_ANSWER_S to receive it."""
        self.draining = True
        n = len(self.queues)
        print(f"sglang-replayssm: draining: {n} request(s) in flight, waiting up to {timeout:g} s "
              "(--drain-timeout)", file=sys.stderr, flush=True)
        deadline = time.monotonic() + timeout
        while self.queues and time.monotonic() < deadline and self.ready:
            await asyncio.sleep(0.05)
        if self.queues:
            print(f"sglang-replayssm: drain timeout: ending {len(self.queues)} request(s) with a 503",
                  file=sys.stderr, flush=True)
            for rid, q in list(self.queues.items()):
                q.put_nowait(error_event(rid, "the server is shutting down: the request was ended before it "
                                              "finished (drain timeout)", 503, abort=True))
            deadline = time.monotonic() + DRAIN_ANSWER_S
            while self.queues and time.monotonic() < deadline:
                await asyncio.sleep(0.05)

    async def control(self, kind: str, timeout: float = 30.0) -> dict:
        """Send the engine a control message (messages.CONTROL[kind], e.g. flush_cache) and await its answer."""
        rid = uuid.uuid4().hex
        q: asyncio.Queue = asyncio.Queue()
        self.queues[rid] = q
        try:
            await self._send(CONTROL[kind](rid))
            try:
                return await asyncio.wait_for(q.get(), timeout)
            except asyncio.TimeoutError:
                raise BadRequest(f"the engine did not answer {kind} in {timeout:.0f} s", status=503) from None
        finally:
            self.queues.pop(rid, None)

    async def close(self) -> None:
        self.closing = True
        self.threads.shutdown(wait=False, cancel_futures=True)
        for t in self._tasks:
            t.cancel()
        if self.proc.is_alive():
            try:   # never wait on an engine that is not reading (e.g. one that failed to start)
                await self.push.send(encode(Shutdown()), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass
            for _ in range(50):
                if not self.proc.is_alive():
                    break
                await asyncio.sleep(0.1)
            if self.proc.is_alive():   # stuck in a step: SIGTERM only sets its stop deadline, so SIGKILL
                self.proc.kill()
                self.proc.join(5.0)
        self.push.close(linger=0)
        self.pull.close(linger=0)
        shutil.rmtree(self.tmpdir, ignore_errors=True)
