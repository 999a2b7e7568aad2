"""OpenAI-compatible HTTP front end of the native engine (FastAPI + uvicorn).

Routes: POST /v1/completions, POST /v1/chat/completions (both with `stream`: SSE ending in
`data: [DONE]`; n choices, logprobs, every sampling parameter of openai_request.py), GET /v1/models,
GET /health, GET /metrics (Prometheus), GET /v1/replayssm/load (load report for the Ray router: counts
and hashes, never prompt text), GET /v1/replayssm/info (the engine's configuration), and SGLang's
/generate, /get_model_info, /get_server_info, /flush_cache, /health_generate, /v1/tokenize and
/v1/detokenize (sglang_api.py). A request naming another model than the served one is a 404.
At start the banner, a capacity line and then a stats line every --stats-log-interval seconds
(stats_log.py). With `--api-key` every route
but /health and /metrics needs `Authorization: Bearer <key>` (a 401 otherwise; http_front/auth.py). The engine runs in its own process (`engine_process.run_engine`)
reached through pyzmq; `EngineClient` routes its output events to the waiting requests.

Every request body is checked before it reaches the engine: anything malformed (not JSON, NaN /
Infinity or a lone surrogate anywhere, a field of the wrong type or range) is a 400 whose message
starts with the field and whose `error.param` names it. When the engine process dies, the pending
requests get a 503 and the server exits with status 1 (see `EngineClient`).

Limits: a body larger than `--max-request-bytes` is a 413 naming the limit (from Content-Length, or
while a chunked body is read: nothing past the limit is kept; the rest is read and dropped, up to
http_front/body_limit.DISCARD_BYTES / DISCARD_S, so that the client, still sending, gets the answer rather than a
reset connection); a prompt of the context length or more is a 400 before it reaches the engine. Prompts are tokenized by the front end in worker threads
(`EngineClient.encode`), never in the engine loop. A non-streaming request whose client disconnects
is aborted in the engine at once (streams already were). SIGTERM drains (`DrainingServer`): new
requests get a 503 and /health a 503 "draining"; running requests get `--drain-timeout` seconds to
finish, then a 503 (streams: an SSE error event, then `data: [DONE]`); then the server prints
`sglang-replayssm: stopped` and exits 0. SIGINT (Ctrl-C) does the same. Both also reach the engine process
when sent to the process group (a terminal's Ctrl-C, `kill -TERM -PGID`): it ignores SIGINT and serves on
through the drain after a SIGTERM (engine_process.py), so the stop is clean either way. A signal while the
engine is still starting stops it at once.

Request parsing lives in `openai_request.py`, the engine process's client in `engine_client.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..http_front.auth import ApiKeyMiddleware
from ..http_front.body_limit import MAX_REQUEST_BYTES, read_limited, too_large_message
from ..http_front.browser_guard import LOOPBACK_HOSTS, BrowserGuardMiddleware
from ..http_front.json_checks import field_of, find_invalid
from ..http_front.openai_response import Choices
from .engine_args import EngineArgs
from .engine_client import DRAIN_ANSWER_S, DRAINING, EngineClient
from .metrics import ServerMetrics
from .openai_request import (BadRequest, check_model, engine_error, error_response, parse_messages, parse_prompt,
                             parse_sampling, parse_stream)
from .sglang_api import add_sglang_routes
from .stats_log import capacity_line, log_stats

DRAIN_TIMEOUT_S = 30.0        # --drain-timeout default


def _parse_body(raw: bytes) -> dict:
    """The request body as a checked JSON object, or a BadRequest (400) naming the problem."""
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


def parse_token_ids(body: dict) -> bool:
    """`return_token_ids` (vLLM's extension): every choice (every stream chunk) also carries the
    `token_ids` its text came from, so a router can resume a cut answer exactly (scheduler/resume.py)."""
    v = body.get("return_token_ids")
    if v is not None and not isinstance(v, bool):
        raise BadRequest("return_token_ids: expected true or false", "return_token_ids")
    return bool(v)


def parse_resume(body: dict):
    """`replayssm_resume` (our extension): {"token_ids": the output already delivered, "text_chars":
    the characters of its text delivered} -> (ids, chars) for Engine.add_request, or None."""
    v = body.get("replayssm_resume")
    if v is None:
        return None
    ids, chars = (v.get("token_ids"), v.get("text_chars")) if isinstance(v, dict) else (None, None)
    if not (isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
        raise BadRequest("replayssm_resume: expected {\"token_ids\": [ids...], \"text_chars\": n}", "replayssm_resume")
    if isinstance(chars, bool) or not isinstance(chars, int) or chars < 0:
        raise BadRequest("replayssm_resume: text_chars must be an integer >= 0", "replayssm_resume")
    return ids, chars


async def _disconnected(request: Request) -> None:
    """Return when the client of a request whose body was read closes its connection."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# --------------------------------------------------------------------------- the app
def create_app(client: EngineClient, banner: str | None = None, api_key: str | None = None,
               max_request_bytes: int = MAX_REQUEST_BYTES, stats_interval: float = 0.0,
               loopback: bool = True, enable_docs: bool = False) -> FastAPI:
    model_name = client.args.served_name
    metrics = ServerMetrics(lambda: client.stats, model_name)

    async def lifespan(app):
        try:
            info = await client.start()
        except RuntimeError as e:
            if client.stopping:   # stopped (SIGINT / SIGTERM) while the engine started: not a failure
                await client.close()
                yield
                return
            client.failed = str(e)
            print(f"sglang-replayssm: error: the engine failed to start: {e}", file=sys.stderr, flush=True)
            await client.close()
            raise
        if banner:
            print(banner.format(**info), flush=True)
            print(capacity_line(info), flush=True)
        logger = asyncio.create_task(log_stats(lambda: client.stats, stats_interval)) if stats_interval > 0 else None
        yield
        if logger is not None:
            logger.cancel()
        await client.close()

    docs = {} if enable_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="sglang-replayssm native engine", lifespan=lifespan, **docs)
    if api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(BrowserGuardMiddleware, loopback=loopback)   # outermost: before the key check

    too_large = too_large_message(max_request_bytes)

    async def read_json(request: Request) -> dict:
        """The body, never kept past --max-request-bytes (413), parsed in a worker thread."""
        body = await read_limited(request, max_request_bytes)
        if body is None:
            raise BadRequest(too_large, status=413)
        return await asyncio.get_running_loop().run_in_executor(client.threads, _parse_body, body)

    @app.exception_handler(BadRequest)
    async def _bad(request, exc: BadRequest):
        response = error_response(exc.message, exc.status, exc.param)
        if exc.status == 413:   # the body may not have been read to its end: the connection cannot be reused
            response.headers["connection"] = "close"
        return response

    @app.get("/health")
    async def health():
        if client.draining:
            return PlainTextResponse("draining", status_code=503)
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
        # no prompt text: cached prefixes as ids and as the router's chained block hashes (http_front/prefix_hash.py)
        return {k: s.get(k, 0) for k in ("running", "waiting", "free_slots", "total_slots", "batch_size")} | {
            "cached_prefixes": list(s.get("cached_prefixes", [])),
            "cached_prefix_blocks": s.get("cached_prefix_blocks", {"block_chars": 0, "prefixes": []})}

    @app.get("/v1/replayssm/info")
    async def info():
        return client.info

    async def run(prompt, params, stream: bool, chat: bool, include_usage: bool, request: Request,
                  token_ids: bool = False, resume=None, continuous_usage: bool = False):
        t0 = time.monotonic()
        events = client.generate(prompt, params, resume)
        first = await events.__anext__()   # errors before any output become HTTP errors
        if "error" in first:
            raise engine_error(first)
        choices = Choices(("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], int(time.time()), model_name,
                          chat, params["n"], params["logprobs"] is not None, token_ids)
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
            if ev.get("done"):
                metrics.e2e.observe(now - t0)

        if not stream:
            async def collect():
                ev = first
                try:
                    while True:
                        observe(ev)
                        choices.add(ev)
                        if ev.get("done", ev["finished"]):
                            return
                        ev = await events.__anext__()
                        if "error" in ev:
                            raise engine_error(ev)
                finally:
                    await events.aclose()   # before the end (cancelled: the client left): aborts it in the engine

            work, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(_disconnected(request))
            try:
                await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            if not work.done():   # the client disconnected: free its slot now, answer no one
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                return Response(status_code=499)
            work.result()
            return choices.response()

        async def sse():
            ev = first
            try:
                for c in choices.role_chunks():
                    yield c
                while True:
                    if "error" in ev:
                        yield f"data: {json.dumps({'error': {'message': ev['error'], 'code': ev['status']}})}\n\n"
                        break
                    observe(ev)
                    choices.add(ev)
                    c = choices.chunk(ev, continuous_usage)
                    if c is not None:
                        yield c
                    if ev.get("done", ev["finished"]):
                        if include_usage:
                            yield choices.usage_chunk()
                        break
                    ev = await events.__anext__()
                yield "data: [DONE]\n\n"
            finally:
                await events.aclose()

        return StreamingResponse(sse(), media_type="text/event-stream")

    async def answer(request: Request, chat: bool):
        """One completion or chat request: parse and check the body (4xx on bad input), then run it."""
        body = await read_json(request)
        check_model(body, model_name)
        params = parse_sampling(body, chat=chat)
        prompt = parse_messages(body) if chat else parse_prompt(body)
        stream, include_usage, continuous_usage = parse_stream(body)
        if client.draining:   # before the tokenizer's work
            raise BadRequest(DRAINING, status=503)
        token_ids, resume = parse_token_ids(body), parse_resume(body)
        ids = await client.encode(prompt)   # in a worker thread: never in the engine loop
        return await run(ids, params, stream, chat, include_usage, request, token_ids, resume, continuous_usage)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, chat=True)

    add_sglang_routes(app, client, model_name, read_json)
    return app


BANNER = ("sglang-replayssm native engine: {model} ({arch}, {ssm_layers} SSM + {attention_layers} attention layers, "
          "{mode} window {window}, checkpoint {ckpt_precision}, read copy {read_copy}, {backend} kernels, "
          "{device}/{dtype}, {slots} slots, speculative decoding {speculative_num_draft_tokens} drafts) at {url}")


class DrainingServer(uvicorn.Server):
    """uvicorn's Server whose SIGTERM / SIGINT drains (`EngineClient.drain`) before it stops, then
    exits 0 (uvicorn would re-raise the signal); a second signal stops at once."""

    def __init__(self, config: uvicorn.Config, client: EngineClient, drain_timeout: float):
        super().__init__(config)
        self.client, self.drain_timeout = client, drain_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    def handle_exit(self, sig, frame) -> None:   # a signal handler: runs between the loop's callbacks
        if not self.client.ready and not self.client.stopping and self.client.proc.is_alive():
            # still starting (the engine ignores these signals, engine_process.py): stop it now, not after its
            # start-up; its model is all it holds
            self.client.stopping = True
            self.client.proc.kill()
        if self.client.draining or not self.client.ready or self._loop is None:
            self.force_exit = self.client.draining   # a second signal while draining: stop now
            self.should_exit = True
            return
        self.client.draining = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self.client.drain(self.drain_timeout)
        finally:
            self.should_exit = True

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)


def serve(args: EngineArgs, host: str = "127.0.0.1", port: int = 30000, log_level: str = "warning",
          api_key: str | None = None, sock=None, max_request_bytes: int = MAX_REQUEST_BYTES,
          drain_timeout: float = DRAIN_TIMEOUT_S, stats_interval: float = 10.0, enable_docs: bool = False) -> None:
    """Serve until stopped (SIGTERM / SIGINT: drain, then exit 0). `sock`: a socket already bound to
    (host, port) (launch.py binds it before the engine is built, so a port in use is a flag error at
    once, not after the model has loaded)."""
    import uvicorn

    # the engine serves on after a SIGTERM to the process group for as long as the drain may take (engine_process.py)
    client = EngineClient(args, stop_grace_s=drain_timeout + DRAIN_ANSWER_S + 10.0)
    url = f"http://{host}:{port}"
    banner = BANNER.replace("{url}", url)
    app = create_app(client, banner, api_key, max_request_bytes, stats_interval,
                     loopback=host in LOOPBACK_HOSTS, enable_docs=enable_docs)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=2)
    server = DrainingServer(config, client, drain_timeout)
    client.on_engine_exit = lambda: setattr(server, "should_exit", True)   # answer what is pending, then exit
    server.run(sockets=[sock] if sock is not None else None)
    if client.failed:
        sys.exit(1)
    print("sglang-replayssm: stopped", flush=True)
