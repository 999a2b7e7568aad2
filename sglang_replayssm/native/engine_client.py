"""The native server's side of the engine process: starts it, sends it requests over pyzmq and routes
its output events to the waiting requests (one asyncio queue per request)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
import uuid

import zmq
import zmq.asyncio

from .engine import EngineArgs
from .engine_process import run_engine
from .openai_request import BadRequest

SEND_TIMEOUT_S = 30.0   # longest a request waits for room in the queue to a live engine (then 503)
SEND_RETRY_S = 0.005


class EngineClient:
    """Owns the engine process and the two zmq sockets; one asyncio queue per request.

    The engine's death (its process sentinel becomes readable) is seen at once: every pending
    request gets a 503, `failed` says why, and `on_engine_exit` (set by `serve`) stops the server,
    which then exits non-zero for a supervisor (or the Ray replica) to restart. Sends to the engine
    never block: they are non-blocking and retried until the engine takes them, dies or
    SEND_TIMEOUT_S passes."""

    def __init__(self, args: EngineArgs):
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
        self.proc = mp.get_context("spawn").Process(target=run_engine, args=(args, self.req_addr, self.out_addr),
                                                    name="replayssm-engine", daemon=True)
        self.queues: dict[str, asyncio.Queue] = {}
        self.info: dict = {}
        self.stats: dict = {}
        self.ready = False
        self.failed: str | None = None   # why the engine did not start, or why it stopped
        self.closing = False
        self.on_engine_exit = None       # called once when the engine process dies while serving
        self._tasks: list[asyncio.Task] = []

    async def start(self, timeout: float = 600.0) -> dict:
        self.proc.start()
        deadline = time.monotonic() + timeout
        while True:
            if await self.pull.poll(200):
                msg = await self.pull.recv_pyobj()
                if msg["type"] == "fatal":
                    raise RuntimeError(msg["error"])
                if msg["type"] == "ready":
                    self.info, self.stats, self.ready = msg["info"], msg["stats"], True
                    break
            if not self.proc.is_alive():
                raise RuntimeError(f"engine process exited with code {self.proc.exitcode} before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine not ready after {timeout:.0f} s")
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._watch())]
        return self.info

    async def _receive(self) -> None:
        while True:
            msg = await self.pull.recv_pyobj()
            if msg["type"] != "out":
                continue
            self.stats = msg["stats"]
            for ev in msg["events"]:
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
            q.put_nowait({"rid": rid, "error": "engine process died", "status": 503})
        if self.on_engine_exit is not None:
            self.on_engine_exit()

    async def _send(self, msg: dict) -> None:
        """Queue one message for the engine without ever blocking on a dead or stuck one."""
        deadline = time.monotonic() + SEND_TIMEOUT_S
        while True:
            if not self.ready:
                raise BadRequest("engine is not running", status=503)
            try:
                await self.push.send_pyobj(msg, flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                if time.monotonic() > deadline:
                    raise BadRequest(f"engine did not take the request in {SEND_TIMEOUT_S:.0f} s", status=503)
                await asyncio.sleep(SEND_RETRY_S)

    async def generate(self, prompt, params: dict):
        """Async iterator over the events of one request."""
        if not self.ready:
            raise BadRequest("engine is not running", status=503)
        rid = uuid.uuid4().hex
        q: asyncio.Queue = asyncio.Queue()
        self.queues[rid] = q
        done = False
        try:
            await self._send({"type": "add", "rid": rid, "prompt": prompt, "params": params})
            while True:
                ev = await q.get()
                done = "error" in ev or ev["finished"]
                yield ev
                if done:
                    return
        finally:
            self.queues.pop(rid, None)
            if not done and self.ready:   # client went away: free the slot
                try:
                    await self.push.send_pyobj({"type": "abort", "rid": rid}, flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass

    async def close(self) -> None:
        self.closing = True
        for t in self._tasks:
            t.cancel()
        if self.proc.is_alive():
            try:   # never wait on an engine that is not reading (e.g. one that failed to start)
                await self.push.send_pyobj({"type": "shutdown"}, flags=zmq.NOBLOCK)
            except zmq.Again:
                pass
            for _ in range(50):
                if not self.proc.is_alive():
                    break
                await asyncio.sleep(0.1)
            if self.proc.is_alive():
                self.proc.terminate()
        self.push.close(linger=0)
        self.pull.close(linger=0)
        shutil.rmtree(self.tmpdir, ignore_errors=True)
