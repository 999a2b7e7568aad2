"""What a failed attempt of a routed request means: this request's final error, or a replica failure that the
ingress (ingress.py) retries on another replica.

A bad request is that request's error, never a replica failure: an engine's 4xx is passed through, and an
engine's 500 for one request is that request's 500; neither is re-sent (`FinalError`). Only a dead replica or
engine (actor died, stream cut, transport error, engine 502/503/504) is retried (`ReplicaFailure`,
`is_replica_failure`). Clients get short messages (`engine_message`); tracebacks and replica details go to the
router's log (`short`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from ray.exceptions import RayActorError, RayTaskError

from ..http_front.errors import error_json

REPLICA_DOWN_STATUSES = (502, 503, 504)   # an engine that is not serving, not a bad request
MESSAGE_CHARS = 300                       # longest engine message passed on to a client


class FinalError(Exception):
    """The request's answer is this error, `status` with the JSON `body`, never retried: its own
    error (an engine 4xx, an engine 500 for it alone, a replica raising on its content) or the
    last of --max-retries replica failures."""

    def __init__(self, status: int, body: str):
        super().__init__(body)
        self.status = status
        self.body = body


class ReplicaFailure(Exception):
    """The replica or its engine is down (answered 502/503/504, cut the stream): retry elsewhere."""


def engine_message(body: Any) -> str:
    """The first line of an engine's error message (a JSON body or an SSE error object), short."""
    err: Any = body
    if isinstance(body, str):
        try:
            err = json.loads(body)
        except ValueError:
            err = body
    if isinstance(err, dict):
        err = err.get("error", err)
        err = err.get("message", "") if isinstance(err, dict) else err
    text = str(err).strip().splitlines()[0] if str(err).strip() else "engine error"
    return text[:MESSAGE_CHARS]


def passed_through(status: int, body: str) -> str:
    """An engine's 4xx body as the client gets it: verbatim when it is a JSON object, else wrapped."""
    try:
        if isinstance(json.loads(body), dict):
            return body
    except ValueError:
        pass
    return error_json(status, engine_message(body))


def raise_engine_error(status: int, body: Any) -> None:
    """Raise what an engine's error answer means: the replica is down (retry) or this request failed."""
    if status in REPLICA_DOWN_STATUSES:
        raise ReplicaFailure(f"engine answered {status}: {engine_message(body)}")
    if status < 500:
        raise FinalError(status, passed_through(status, body) if isinstance(body, str)
                         else error_json(status, engine_message(body)))
    raise FinalError(status, error_json(status, engine_message(body)))


def is_replica_failure(e: BaseException) -> bool:
    """A replica or engine that died or cannot be reached, as opposed to one that raised on this
    request's content (a RayTaskError of any other cause): only the former is retried."""
    if isinstance(e, ReplicaFailure):
        return True
    if isinstance(e, RayTaskError):
        cause = getattr(e, "cause", None)
        down = (httpx.TransportError, ConnectionError, RayActorError, asyncio.CancelledError)
        return isinstance(cause, down) or type(cause).__name__ == "EngineStreamCut"
    return True   # actor died / unavailable, Serve's own errors: the replica, not the request


def short(e: BaseException) -> str:
    """What a log line says about an exception (a RayTaskError's cause, not its traceback)."""
    cause = getattr(e, "cause", None) if isinstance(e, RayTaskError) else None
    e = cause or e
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
