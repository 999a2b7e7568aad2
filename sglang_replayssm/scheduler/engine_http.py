"""A replica's HTTP streams to its engine, safe against connections the engine closed while it stalled.

The replica keeps connections to its engine open between requests (HTTP keep-alive), and the engine's
server closes one that has been idle for its keep-alive time (uvicorn: 5 s, in SGLang's server and the
native one). When the engine's event loop stalls (a garbage collection, a long step, a machine short of
CPU) past that time, a request the replica sent meanwhile on such a connection reaches the engine
together with the expired timer, and the server closes the connection without reading it: the replica
gets a read error before any response header. That request never reached the engine's handler, so it
is sent once more, on a new connection, when the engine process still runs: a stall then costs latency,
not a failed attempt (which the router would retry on another replica, losing the prefix it routed by).
A failure after the response began, or of an engine that exited, is a replica failure as before.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable

import httpx

logger = logging.getLogger("ray.serve")

# raised by httpx when the server closed the connection before the response (or refused the write)
CLOSED_BEFORE_RESPONSE = (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)


async def open_engine_stream(stack: contextlib.AsyncExitStack, client: httpx.AsyncClient, path: str,
                             body: dict[str, Any], engine_alive: Callable[[], bool]) -> tuple[httpx.Response, int]:
    """POST `body` to `path` as a stream; the response (its headers read) is closed with `stack`. Returns
    (response, reconnects): 1 when the first connection was closed before the response and the request went
    again on a new one (its client closed with `stack` too), else 0."""
    try:
        return await stack.enter_async_context(client.stream("POST", path, json=body)), 0
    except CLOSED_BEFORE_RESPONSE as e:
        if not engine_alive():
            raise
        logger.warning("engine closed a kept-alive connection before answering (%s); sent again on a new one",
                       type(e).__name__)
    fresh = await stack.enter_async_context(httpx.AsyncClient(
        base_url=client.base_url, headers=client.headers, timeout=client.timeout,
        limits=httpx.Limits(max_keepalive_connections=0)))
    return await stack.enter_async_context(fresh.stream("POST", path, json=body)), 1
