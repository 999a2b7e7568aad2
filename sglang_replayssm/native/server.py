"""OpenAI-compatible HTTP front end of the native engine (FastAPI + uvicorn).

Routes: POST /v1/completions, POST /v1/chat/completions (both with `stream`: SSE ending in
`data: [DONE]`), GET /v1/models, GET /health, GET /metrics (Prometheus), GET /v1/replayssm/load
(load report for the Ray router: counts and hashes, never prompt text). With `--api-key` every route
but /health and /metrics needs `Authorization: Bearer <key>` (a 401 otherwise; auth.py). The engine runs in its own process (`engine_process.run_engine`)
reached through pyzmq; `EngineClient` routes its output events to the waiting requests.

Every request body is checked before it reaches the engine: anything malformed (not JSON, NaN /
Infinity or a lone surrogate anywhere, a field of the wrong type or range) is a 400 whose message
starts with the field and whose `error.param` names it. When the engine process dies, the pending
requests get a 503 and the server exits with status 1 (see `EngineClient`).
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import uuid

import zmq
import zmq.asyncio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..json_checks import field_of, find_invalid
from .engine import EngineArgs
from .auth import ApiKeyMiddleware
from .engine_process import run_engine
from .metrics import ServerMetrics


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


def error_response(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


# --------------------------------------------------------------------------- engine client
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


# --------------------------------------------------------------------------- request parsing
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1   # int64 and uint64 seeds; negative ones are taken mod 2^64
SHOWN_CHARS = 60


def _show(v) -> str:
    """A client value as it may appear in an error message: repr, at most SHOWN_CHARS characters."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10 ** SHOWN_CHARS:
        return f"an integer of {len(str(abs(v)))} digits"
    s = repr(v)
    return s if len(s) <= SHOWN_CHARS else s[:SHOWN_CHARS] + "..."


def _number(body, name, default, lo, hi, kind=float, lo_open=False):
    v = body.get(name)
    if v is None:
        return default
    integral = isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not integral):
        raise BadRequest(f"{name}: expected {'an integer' if kind is int else 'a number'}, got {_show(v)}", name)
    if isinstance(v, float) and not math.isfinite(v):
        raise BadRequest(f"{name}: must be a finite number, got {v}", name)
    if v < lo or (lo_open and v == lo) or v > hi:
        raise BadRequest(f"{name}: must be in {'(' if lo_open else '['}{lo}, {hi}], got {_show(v)}", name)
    return kind(v)


def _flag(body, name) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise BadRequest(f"{name}: expected true or false, got {_show(v)}", name)
    return v


def parse_sampling(body: dict, chat: bool) -> dict:
    if body.get("n", 1) not in (1, None) or isinstance(body.get("n"), bool):
        raise BadRequest("n: only n=1 is supported", "n")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0) or isinstance(body.get(name), bool):
            raise BadRequest(f"{name}: not supported by the native engine", name)
    if body.get("logprobs") not in (None, False, 0) or body.get("echo"):
        raise BadRequest("logprobs/echo: not supported by the native engine", "logprobs")
    max_name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop: expected a non-empty string or a list of them", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"seed: expected an integer, got {_show(seed)}", "seed")
    if seed is not None and not SEED_MIN <= seed <= SEED_MAX:
        raise BadRequest(f"seed: must be in [{SEED_MIN}, {SEED_MAX}], got {_show(seed)}", "seed")
    return {"max_tokens": _number(body, max_name, 128 if chat else 16, 1, 1 << 20, int),
            "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
            "top_p": _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
            "stop": tuple(stop), "seed": seed, "ignore_eos": _flag(body, "ignore_eos")}


def parse_prompt(body: dict):
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1:
        raise BadRequest("prompt: one prompt per request (batches are not supported)", "prompt")
    raise BadRequest("prompt: expected a non-empty string or a list of token ids", "prompt")


def parse_messages(body: dict) -> dict:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages: expected a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}]: expected an object with a 'role'", "messages")
        content = m.get("content")
        if isinstance(content, list):   # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text", ""), str)
                       for p in content):
                raise BadRequest(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(p.get("text", "") for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content: expected a string", "messages")
        out.append({"role": m["role"], "content": content})
    cont = _flag(body, "continue_final_message")
    if cont and out[-1]["role"] != "assistant":
        raise BadRequest("continue_final_message: the last message must be the assistant's", "continue_final_message")
    return {"messages": out, "continue_final_message": cont}


def parse_stream(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = _flag(body, "stream")
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not isinstance(opts, dict):
        raise BadRequest(f"stream_options: expected an object, got {_show(opts)}", "stream_options")
    return stream, _flag(opts, "include_usage")


# --------------------------------------------------------------------------- the app
def create_app(client: EngineClient, banner: str | None = None, api_key: str | None = None) -> FastAPI:
    model_name = client.args.served_name
    metrics = ServerMetrics(lambda: client.stats, model_name)

    async def lifespan(app):
        try:
            info = await client.start()
        except RuntimeError as e:
            client.failed = str(e)
            print(f"sglang-replayssm: error: the engine failed to start: {e}", file=sys.stderr, flush=True)
            await client.close()
            raise
        if banner:
            print(banner.format(**info), flush=True)
        yield
        await client.close()

    app = FastAPI(title="sglang-replayssm native engine", lifespan=lifespan)
    if api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)

    async def read_json(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:   # JSONDecodeError, bad UTF-8, a >4300-digit integer, nesting
            raise BadRequest(f"request body is not valid JSON: {str(e)[:200] or type(e).__name__}")
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        bad = find_invalid(body)
        if bad is not None:
            raise BadRequest(f"{bad[0]}: {bad[1]}", field_of(bad[0]))
        return body

    @app.exception_handler(BadRequest)
    async def _bad(request, exc: BadRequest):
        return error_response(exc.message, exc.status, exc.param)

    @app.get("/health")
    async def health():
        if client.ready and client.proc.is_alive():
            return PlainTextResponse("ok")
        return PlainTextResponse("engine not running", status_code=503)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "sglang-replayssm", "max_model_len": client.args.max_model_len}]}

    @app.get("/metrics")
    async def prom():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/replayssm/load")
    async def load():
        s = client.stats
        # no prompt text: cached prefixes as ids and as the router's chained block hashes (prefix_tree.py)
        return {k: s.get(k, 0) for k in ("running", "waiting", "free_slots", "total_slots", "batch_size")} | {
            "cached_prefixes": list(s.get("cached_prefixes", [])),
            "cached_prefix_blocks": s.get("cached_prefix_blocks", {"block_chars": 0, "prefixes": []})}

    @app.get("/v1/replayssm/info")
    async def info():
        return client.info

    async def run(prompt, params, stream: bool, chat: bool, include_usage: bool):
        t0 = time.monotonic()
        events = client.generate(prompt, params)
        first = await events.__anext__()   # errors before any output become HTTP errors
        if "error" in first:
            raise BadRequest(first["error"], status=first["status"])
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        timing = {"last": None}

        def observe(ev):
            now = time.monotonic()
            if ev.get("token_ids"):
                if timing["last"] is None:
                    metrics.ttft.observe(now - t0)
                else:
                    per = (now - timing["last"]) / len(ev["token_ids"])
                    for _ in ev["token_ids"]:
                        metrics.itl.observe(per)
                timing["last"] = now
            if ev.get("finished"):
                metrics.e2e.observe(now - t0)

        def usage(ev):
            return {"prompt_tokens": ev["prompt_tokens"], "completion_tokens": ev["completion_tokens"],
                    "total_tokens": ev["prompt_tokens"] + ev["completion_tokens"]}

        if not stream:
            text, ev = [], first
            observe(ev)
            text.append(ev["text"])
            try:
                while not ev["finished"]:
                    ev = await events.__anext__()
                    if "error" in ev:
                        raise BadRequest(ev["error"], status=ev["status"])
                    observe(ev)
                    text.append(ev["text"])
            finally:
                await events.aclose()
            body = "".join(text)
            choice = ({"index": 0, "message": {"role": "assistant", "content": body}} if chat
                      else {"index": 0, "text": body, "logprobs": None})
            choice["finish_reason"] = ev["finish_reason"]
            return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                    "model": model_name, "choices": [choice], "usage": usage(ev)}

        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_text, finish, ev=None, role=False):
            if chat:
                delta = {"role": "assistant", "content": ""} if role else ({"content": delta_text} if delta_text else {})
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta_text, "logprobs": None, "finish_reason": finish}
            data = {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice]}
            return f"data: {json.dumps(data)}\n\n"

        async def sse():
            ev = first
            try:
                if chat:
                    yield chunk("", None, role=True)
                while True:
                    if "error" in ev:
                        yield f"data: {json.dumps({'error': {'message': ev['error'], 'code': ev['status']}})}\n\n"
                        break
                    observe(ev)
                    if ev["text"] or ev["finished"]:
                        yield chunk(ev["text"], ev["finish_reason"] if ev["finished"] else None)
                    if ev["finished"]:
                        if include_usage:
                            data = {"id": rid, "object": obj, "created": created, "model": model_name,
                                    "choices": [], "usage": usage(ev)}
                            yield f"data: {json.dumps(data)}\n\n"
                        break
                    ev = await events.__anext__()
                yield "data: [DONE]\n\n"
            finally:
                await events.aclose()

        return StreamingResponse(sse(), media_type="text/event-stream")

    async def answer(request: Request, chat: bool):
        """One completion or chat request: parse and check the body (4xx on bad input), then run it."""
        body = await read_json(request)
        params = parse_sampling(body, chat=chat)
        prompt = parse_messages(body) if chat else parse_prompt(body)
        stream, include_usage = parse_stream(body)
        return await run(prompt, params, stream, chat, include_usage)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, chat=True)

    return app


BANNER = ("sglang-replayssm native engine: {model} ({arch}, {ssm_layers} SSM + {attention_layers} attention layers, "
          "{mode} window {window}, {backend} kernels, {device}/{dtype}, {slots} slots) at {url}")


def serve(args: EngineArgs, host: str = "127.0.0.1", port: int = 30000, log_level: str = "warning",
          api_key: str | None = None, sock=None) -> None:
    """Serve until stopped. `sock`: a socket already bound to (host, port) (launch.py binds it before the
    engine is built, so a port in use is a flag error at once, not after the model has loaded)."""
    import uvicorn

    client = EngineClient(args)
    url = f"http://{host}:{port}"
    banner = BANNER.replace("{url}", url)
    app = create_app(client, banner, api_key)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           timeout_graceful_shutdown=2))
    client.on_engine_exit = lambda: setattr(server, "should_exit", True)   # answer what is pending, then exit
    server.run(sockets=[sock] if sock is not None else None)
    if client.failed:
        sys.exit(1)
