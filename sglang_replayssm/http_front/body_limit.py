"""The request body limit of both HTTP front ends, the native server and the Ray router (`--max-request-bytes`).

A body over the limit is answered 413, naming the limit and the flag. Nothing past the limit is kept, but the
rest of the body is read and dropped before the answer, while it keeps coming (up to DISCARD_BYTES more, for at
most DISCARD_S seconds, and until DISCARD_IDLE_S pass without data): a server that answers while the client is
still sending and then closes the connection leaves unread data behind, the kernel resets the connection, and
clients such as httpx's async client (the OpenAI SDK's, the Ray replicas') report a broken connection instead of
the 413. A body declared (Content-Length) larger than the limit plus DISCARD_BYTES is answered at once, unread.

Needs only what Starlette's Request offers (`headers`, `stream()`); no imports beyond the standard library.
"""

from __future__ import annotations

import asyncio
import time

MAX_REQUEST_BYTES = 8 << 20    # --max-request-bytes default: 8 MiB (a prompt of millions of characters)
MIN_REQUEST_BYTES = 1024       # a smaller limit would refuse ordinary requests
DISCARD_BYTES = 1 << 30        # how much of a refused body is read and dropped, at most...
DISCARD_S = 30.0               # ...and for how long
DISCARD_IDLE_S = 1.0           # a client that stops sending (a Content-Length it does not keep) is answered then


def limit_error(value) -> str | None:
    """Why `value` cannot be a --max-request-bytes, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_REQUEST_BYTES:
        return f"must be an integer >= {MIN_REQUEST_BYTES} (bytes), got {value!r}"
    return None


def too_large_message(limit: int, who: str = "this server's") -> str:
    return f"request body: larger than {who} limit of {limit} bytes (--max-request-bytes)"


async def read_limited(request, limit: int) -> bytes | None:
    """The request's body, or None when it is larger than `limit` bytes (the rest read and dropped, as above)."""
    declared = request.headers.get("content-length", "")
    over = declared.isdigit() and int(declared) > limit
    if over and int(declared) > limit + DISCARD_BYTES:
        return None
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + DISCARD_S
    body = request.stream().__aiter__()   # a chunked body has no Content-Length: count it
    while True:
        try:
            chunk = await (asyncio.wait_for(body.__anext__(), DISCARD_IDLE_S) if over else body.__anext__())
        except (StopAsyncIteration, asyncio.TimeoutError):
            break
        size += len(chunk)
        if not over and size > limit:
            over, chunks = True, []
        if not over:
            chunks.append(chunk)
        elif size > limit + DISCARD_BYTES or time.monotonic() > deadline:
            break
    return None if over else b"".join(chunks)
