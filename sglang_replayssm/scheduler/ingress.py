"""The OpenAI-compatible ingress: routing, streaming pass-through, retries with stream resume.

Routes: POST /v1/completions, POST /v1/chat/completions (stream or not), GET /v1/models,
GET /health (200 only once a request can be routed: an engine replica answered within
HEALTH_TIMEOUT_S; 503 before, e.g. while the replicas still start), GET /metrics. With `--api-key`
the /v1 routes need `Authorization: Bearer <key>` (a 401 otherwise, counted as outcome
`client_error`); /health and /metrics stay open. Every request is streamed from the chosen engine
replica (non-streaming clients get the chunks assembled), which gives one code path for metrics and
failure handling:

* the replica is picked by the ReplaySSM request router (request_router.py, policy.py) from the
  payload's `route_key` (the prompt text);
* when the replica dies or its engine stream is cut, the request is re-sent to another replica
  (the failed ones are excluded) *resuming from what was already delivered* (resume.py): exactly,
  from the delivered token ids, on native engines; from the delivered text on SGLang. The client
  sees one stream: same id, every token once, and `data: [DONE]` only after a complete answer (an
  `error` event otherwise).

A bad request is that request's error, never a replica failure: the router answers what it can
check itself (a body over --max-request-bytes: a 413 naming the limit, before any replica sees it;
a body that is not a JSON object, NaN / Infinity or a lone surrogate anywhere, the type of the fields
it reads) with a 4xx naming the field; what an engine's error answer or a failed
attempt means (this request's final error, or a replica failure retried elsewhere) is failures.py.
"""

import asyncio
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from ray import serve
from ray.exceptions import RayTaskError
from ray.serve.exceptions import RequestCancelledError

from ..http_front.auth import UNAUTHORIZED_BODY, authorized
from ..http_front.body_limit import MAX_REQUEST_BYTES, read_limited, too_large_message
from ..http_front.browser_guard import problem
from ..http_front.errors import error_json
from ..http_front.json_checks import field_of, find_invalid
from ..http_front.openai_response import merged_logprobs
from .failures import FinalError, ReplicaFailure, is_replica_failure, raise_engine_error, short
from .metrics import RouterMetrics
from .policy import PolicyConfig
from .resume import SGLANG_COMPLETION_MAX_TOKENS, max_tokens_of
from . import state as _state  # module reference: Serve pickles the ingress class by value

app = FastAPI(title="sglang-replayssm router", docs_url=None, redoc_url=None, openapi_url=None)
logger = logging.getLogger("ray.serve")

HEALTH_TIMEOUT_S = 3.0   # /health: how long a replica may take to answer `ready`


def routing_key(kind: str, body: dict[str, Any]) -> str:
    """The text the prefix tree is keyed by: the prompt, or the rendered chat messages."""
    if kind == "completions":
        p = body.get("prompt", "")
        if isinstance(p, list):
            if len(p) == 1 and isinstance(p[0], str):
                p = p[0]
            elif all(isinstance(t, int) for t in p):
                return "".join(f"{t}," for t in p)
            else:
                return ""
        return p if isinstance(p, str) else ""
    parts = []
    for m in body.get("messages") or ():
        if not isinstance(m, dict):
            continue
        parts.append(f"<|{m.get('role', '')}|>{_content_text(m.get('content'))}")
    return "".join(parts) + "<|assistant|>"


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _delta_text(kind: str, chunk: dict[str, Any]) -> tuple[str, str | None]:
    text, finish = "", None
    for c in chunk.get("choices") or ():
        if kind == "completions":
            text += c.get("text") or ""
        else:
            text += (c.get("delta") or {}).get("content") or ""
        if c.get("finish_reason"):
            finish = c["finish_reason"]
    return text, finish


@serve.ingress(app)
class RouterIngress:
    def __init__(self, engine_handle, policy: dict[str, Any] | None = None, max_retries: int = 3,
                 api_key: str | None = None, loopback: bool = True, max_request_bytes: int = MAX_REQUEST_BYTES):
        self.loopback = loopback   # bound to loopback: refuse Host names that are not (browser_guard.py)
        self.max_request_bytes = max_request_bytes
        _state.STATE.configure(PolicyConfig(**(policy or {})))
        self.engine = engine_handle.options(stream=True)
        self.engine_unary = engine_handle.options(stream=False)
        self.max_retries = max_retries
        self.api_key = api_key
        self.metrics = RouterMetrics(_state.STATE)

    def _refused(self, request: Request, endpoint: str | None = None) -> Response | None:
        """A 421/403/415 for what a browser page may not send (browser_guard.py), a 401 when --api-key is
        set and the request does not carry it (either counted as a client error of `endpoint`), else None."""
        refused = problem(request.method, request.headers.items(), self.loopback)
        if refused is None and authorized(request.headers.get("authorization"), self.api_key):
            return None
        if endpoint:
            self.metrics.requests.labels(endpoint=endpoint, outcome="client_error").inc()
        if refused is not None:
            status, param, message = refused
            return Response(error_json(status, message, param), status_code=status, media_type="application/json")
        return Response(UNAUTHORIZED_BODY, status_code=401, media_type="application/json",
                        headers={"www-authenticate": "Bearer"})

    # -- simple routes ----------------------------------------------------------------------
    @app.get("/health")
    async def health(self):
        """200 when a request sent now would reach a running engine replica, else 503."""
        try:
            ready = await asyncio.wait_for(self.engine_unary.ready.remote(), HEALTH_TIMEOUT_S)
        except Exception as e:   # noqa: BLE001 - no replica yet (timeout), or one that is going away
            logger.info("router: /health: no engine replica answered (%s)", short(e))
            ready = False
        if not ready:
            return Response(json.dumps({"status": "no engine replica is ready"}), status_code=503,
                            media_type="application/json")
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics_route(self):
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(self, request: Request):
        return self._refused(request) or await self.engine_unary.models.remote()

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._serve("completions", request)

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request):
        return await self._serve("chat", request)

    # -- the request path ---------------------------------------------------------------------
    async def _serve(self, kind: str, request: Request):
        endpoint = "completions" if kind == "completions" else "chat"
        denied = self._refused(request, endpoint)
        if denied is not None:
            return denied
        raw = await read_limited(request, self.max_request_bytes)   # before any replica sees it
        if raw is None:
            return self._client_error(endpoint, 413, too_large_message(self.max_request_bytes, "the router's"))
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):   # bad JSON or UTF-8, a >4300-digit integer, nesting
            return self._client_error(endpoint, 400, "request body is not valid JSON")
        err = self._validate(kind, body)
        if err:
            return self._client_error(endpoint, 400, err[1], err[0])
        route_info: dict[str, Any] = {}
        events = self._events(kind, body, route_info)
        try:
            first = await events.__anext__()
        except FinalError as e:
            outcome = "client_error" if e.status < 500 else "error"
            self.metrics.requests.labels(endpoint=endpoint, outcome=outcome).inc()
            return Response(e.body, status_code=e.status, media_type="application/json")
        except StopAsyncIteration:
            first = None
        except Exception as e:   # noqa: BLE001 - _events raises short messages; anything else is a bug
            self.metrics.requests.labels(endpoint=endpoint, outcome="error").inc()
            return Response(self._server_error_body(e), status_code=502, media_type="application/json")
        if body.get("stream"):
            headers = {"x-replayssm-replica": str(route_info.get("replica")),
                       "x-replayssm-route": str(route_info.get("route"))}
            return StreamingResponse(self._sse(kind, body, first, events), media_type="text/event-stream",
                                     headers=headers)
        return await self._collect(kind, body, first, events)

    def _client_error(self, endpoint: str, status: int, message: str, param: str | None = None):
        self.metrics.requests.labels(endpoint=endpoint, outcome="client_error").inc()
        return Response(error_json(status, message, param), status_code=status, media_type="application/json")

    @staticmethod
    def _server_error_body(e: BaseException) -> str:
        """A 502 body for an unexpected exception: logged here, not shown to the client."""
        logger.error("router: request failed unexpectedly", exc_info=e)
        return error_json(502, "the router failed to serve this request (details in the router log)")

    @staticmethod
    def _validate(kind: str, body: Any) -> tuple[str, str] | None:
        """(field, message) of the first problem the router itself can see, or None."""
        if not isinstance(body, dict):
            return None, "request body must be a JSON object"
        bad = find_invalid(body)   # NaN, Infinity, lone surrogates: the replica could not even send them
        if bad is not None:
            return field_of(bad[0]), f"{bad[0]}: {bad[1]}"
        if kind == "completions" and "prompt" not in body:
            return "prompt", "prompt: required"
        if kind == "chat" and not isinstance(body.get("messages"), list):
            return "messages", "messages: must be a list"
        if body.get("n", 1) not in (1, None) or isinstance(body.get("n"), bool):
            return "n", "n: must be 1 (the router streams one choice per request)"
        if body.get("stream") is not None and not isinstance(body.get("stream"), bool):
            return "stream", "stream: expected true or false"
        if not isinstance(body.get("stream_options") or {}, dict):
            return "stream_options", "stream_options: expected an object"
        for k in ("max_tokens", "max_completion_tokens"):
            v = body.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or isinstance(v, float) and not v.is_integer()):
                return k, f"{k}: expected an integer"
            if v is not None and v < 1:
                return k, f"{k}: must be >= 1"
        return None

    async def _events(self, kind: str, body: dict[str, Any], route_info: dict[str, Any]) -> AsyncIterator[tuple[str, Any]]:
        """Yield ('chunk', rewritten_chunk) ... ('end', info); raise FinalError for a final error answer.

        route_info gets the first replica and routing decision as soon as they are known."""
        start = time.monotonic()
        route_key = routing_key(kind, body)
        route_id = uuid.uuid4().hex
        sent_text, sent_tokens, sent_ids = "", 0, []
        exact = False   # the replica resumes from token ids (its usage then counts every attempt)
        exclude: list[str] = []
        replicas: list[str] = []
        decision = None
        stream_id = created = None
        last_tok = None
        retries = 0
        finish = None
        usage = None
        logprobs: list[dict[str, Any]] = []   # each chunk's logprobs object, for a non-streamed answer
        model = body.get("model")
        max_tokens = max_tokens_of(body)
        if max_tokens is None and kind == "completions":   # every engine's default for a completion
            max_tokens = SGLANG_COMPLETION_MAX_TOKENS
        self.metrics.inflight.inc()
        try:
            while True:
                if max_tokens is not None and sent_tokens >= max_tokens:
                    if finish is None:  # cut right after the last token, before its finish chunk
                        finish = "length"
                        choice = ({"index": 0, "text": "", "logprobs": None, "finish_reason": finish}
                                  if kind == "completions" else {"index": 0, "delta": {}, "finish_reason": finish})
                        yield "chunk", {"id": stream_id, "created": created, "model": model,
                                        "object": "text_completion" if kind == "completions" else "chat.completion.chunk",
                                        "choices": [choice]}
                    break
                payload = {"path": "/v1/completions" if kind == "completions" else "/v1/chat/completions",
                           "kind": kind, "body": body,
                           "sent": {"text": sent_text, "tokens": sent_tokens, "token_ids": list(sent_ids)},
                           "route_key": route_key, "route_id": route_id, "exclude": list(exclude)}
                replica = None
                attempt_tokens = 0
                finished = False
                try:
                    gen = self.engine.generate.remote(payload)
                    async for ev in gen:
                        typ = ev["type"]
                        if typ == "meta":
                            replica = ev["replica"]
                            exact = bool(ev.get("exact_resume"))
                            replicas.append(replica)
                            choice, _ = _state.STATE.pop_route(route_id)
                            if choice is not None:
                                self.metrics.decisions.labels(decision=choice.decision).inc()
                                if decision is None:
                                    decision = choice.decision
                            route_info.setdefault("replica", replica)
                            route_info.setdefault("route", decision)
                            _state.STATE.served(route_key, replica)
                        elif typ == "error":   # the engine answered with an HTTP error
                            raise_engine_error(ev["status"], ev["body"])
                        elif typ == "chunk":
                            chunk = ev["data"]
                            if "error" in chunk and not chunk.get("choices"):   # an SSE error event
                                err = chunk["error"]
                                code = err.get("code") if isinstance(err, dict) else None
                                raise_engine_error(code if isinstance(code, int) else 503, err)
                            text, fin = _delta_text(kind, chunk)
                            if chunk.get("usage") and not chunk.get("choices"):
                                usage = chunk["usage"]
                                continue
                            chunk_usage = chunk.pop("usage", None)
                            ids = ev.get("token_ids")
                            if ids is not None:   # the engine names the tokens of each chunk: count them
                                sent_ids += ids
                                sent_tokens += len(ids)
                                attempt_tokens += len(ids)
                                self.metrics.tokens.inc(len(ids))
                            if stream_id is None:
                                stream_id, created = chunk.get("id"), chunk.get("created")
                                model = chunk.get("model")
                            chunk["id"], chunk["created"] = stream_id, created
                            lp = (chunk.get("choices") or [{}])[0].get("logprobs")
                            if lp:
                                logprobs.append(lp)
                            if not text and not fin and not lp and (sent_tokens > 0 or attempt_tokens > 0 or retries):
                                continue  # role-only / empty chunk of a resumed attempt
                            if text:
                                now = time.monotonic()
                                if last_tok is None:
                                    self.metrics.ttft.observe(now - start)
                                else:
                                    self.metrics.itl.observe(now - last_tok)
                                last_tok = now
                                sent_text += text
                                if ids is None:   # no token ids: one token per chunk, or as usage says
                                    n = 1
                                    if isinstance(chunk_usage, dict) and chunk_usage.get("completion_tokens"):
                                        n = max(1, int(chunk_usage["completion_tokens"]) - attempt_tokens)
                                    sent_tokens += n
                                    attempt_tokens += n
                                    self.metrics.tokens.inc(n)
                            if fin:
                                finish = fin
                            yield "chunk", chunk
                        elif typ == "done":
                            finished = True
                    if not finished:
                        raise ReplicaFailure("replica stream ended without an end marker")
                    break
                except FinalError:
                    raise
                except (asyncio.CancelledError, GeneratorExit, RequestCancelledError):
                    raise  # the client went away: nothing to retry
                except Exception as e:  # noqa: BLE001 - replica died / engine cut the stream: go elsewhere
                    cause = getattr(e, "cause", None) if isinstance(e, RayTaskError) else None
                    if type(cause).__name__ == "ResumeError":
                        logger.error("router: request %s cannot be resumed: %s", route_id, cause)
                        raise FinalError(502, error_json(502, "the replica serving this request failed and "
                                                                f"it cannot be resumed elsewhere: {cause}")) from None
                    if not is_replica_failure(e):   # the replica raised on this request's content
                        logger.error("router: replica %s failed request %s; not retried", replica, route_id,
                                     exc_info=e)
                        raise FinalError(500, error_json(500, "the replica failed this request")) from None
                    retries += 1
                    kind_label = "stream_resume" if sent_tokens else "restart"
                    self.metrics.retries.labels(kind=kind_label).inc()
                    logger.warning("router: attempt %d of request %s failed on replica %s (%s)", retries,
                                   route_id, replica, short(e))
                    if replica is not None:
                        exclude.append(replica)
                    if retries > self.max_retries:
                        raise FinalError(502, error_json(
                            502, f"no replica could serve the request ({retries} attempts failed)")) from None
                    usage = None
                    await asyncio.sleep(min(0.05 * retries, 0.5))
            if replicas:
                _state.STATE.served(route_key + sent_text if kind == "completions"
                             else route_key + sent_text + "<|end|>", replicas[-1])
            if usage is not None and retries and not exact:   # text resume: usage of the last attempt
                usage = dict(usage)
                before = sent_tokens - (usage.get("completion_tokens") or 0)
                usage["completion_tokens"] = sent_tokens
                usage["prompt_tokens"] = max(0, (usage.get("prompt_tokens") or 0) - before)
                usage["total_tokens"] = usage["prompt_tokens"] + sent_tokens
            self.metrics.e2e.observe(time.monotonic() - start)
            yield "end", {"id": stream_id or f"cmpl-{route_id}", "created": created or int(time.time()),
                          "text": sent_text, "tokens": sent_tokens, "finish_reason": finish or "stop",
                          "usage": usage, "model": model, "replicas": replicas, "decision": decision, "retries": retries,
                          "logprobs": merged_logprobs(kind == "chat", logprobs) if logprobs else None}
        finally:
            self.metrics.inflight.dec()

    async def _sse(self, kind, body, first, events) -> AsyncIterator[bytes]:
        endpoint = "completions" if kind == "completions" else "chat"
        want_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        outcome = "error"
        try:
            ev = first
            while ev is not None:
                typ, data = ev
                if typ == "chunk":
                    yield b"data: " + json.dumps(data).encode() + b"\n\n"
                elif typ == "end":
                    info = data
                    if want_usage and info["usage"] is not None:
                        u = {"id": info["id"], "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                             "created": info["created"], "model": info["model"], "choices": [], "usage": info["usage"]}
                        yield b"data: " + json.dumps(u).encode() + b"\n\n"
                    meta = {"replicas": info["replicas"], "route": info["decision"], "retries": info["retries"]}
                    yield b": replayssm " + json.dumps(meta).encode() + b"\n\n"  # SSE comment: ignored by clients
                    yield b"data: [DONE]\n\n"
                    outcome = "ok"
                try:
                    ev = await events.__anext__()
                except StopAsyncIteration:
                    ev = None
        except (asyncio.CancelledError, GeneratorExit, RequestCancelledError):
            outcome = "cancelled"
            raise
        except FinalError as e:   # after the stream began: an error event, and no [DONE]
            outcome = "client_error" if e.status < 500 else "error"
            yield b"data: " + e.body.encode() + b"\n\n"
        except Exception as e:   # noqa: BLE001
            yield b"data: " + self._server_error_body(e).encode() + b"\n\n"
        finally:
            self.metrics.requests.labels(endpoint=endpoint, outcome=outcome).inc()

    async def _collect(self, kind, body, first, events):
        endpoint = "completions" if kind == "completions" else "chat"
        info = None
        ev = first
        try:
            while ev is not None:
                if ev[0] == "end":
                    info = ev[1]
                try:
                    ev = await events.__anext__()
                except StopAsyncIteration:
                    ev = None
        except FinalError as e:
            self.metrics.requests.labels(endpoint=endpoint, outcome="client_error" if e.status < 500 else "error").inc()
            return Response(e.body, status_code=e.status, media_type="application/json")
        except Exception as e:   # noqa: BLE001
            self.metrics.requests.labels(endpoint=endpoint, outcome="error").inc()
            return Response(self._server_error_body(e), status_code=502, media_type="application/json")
        self.metrics.requests.labels(endpoint=endpoint, outcome="ok").inc()
        meta = {"replica": info["replicas"][-1] if info["replicas"] else None,
                "replicas": info["replicas"], "route": info["decision"], "retries": info["retries"]}
        usage = info["usage"] or {"prompt_tokens": None, "completion_tokens": info["tokens"],
                                  "total_tokens": None}
        if kind == "completions":
            choice = {"index": 0, "text": info["text"], "logprobs": info["logprobs"], "finish_reason": info["finish_reason"]}
            obj = "text_completion"
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": info["text"]},
                      "logprobs": info["logprobs"], "finish_reason": info["finish_reason"]}
            obj = "chat.completion"
        return {"id": info["id"], "object": obj, "created": info["created"], "model": info["model"],
                "choices": [choice], "usage": usage, "replayssm": meta}
