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

Request parsing lives in `openai_request.py`, the engine process's client in `engine_client.py`.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..json_checks import field_of, find_invalid
from .auth import ApiKeyMiddleware
from .engine import EngineArgs
from .engine_client import EngineClient
from .metrics import ServerMetrics
from .openai_request import BadRequest, error_response, parse_messages, parse_prompt, parse_sampling, parse_stream


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
