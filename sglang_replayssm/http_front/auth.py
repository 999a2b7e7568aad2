"""`--api-key`: the OpenAI convention (`Authorization: Bearer <key>`), as SGLang and vLLM spell it.

With a key set, every route but OPEN_PATHS answers 401 with an OpenAI-style error body unless the
request carries the key; /health and /metrics stay open for supervisors and Prometheus. The key is
compared in constant time. Used by the native server (an ASGI middleware, so it covers every route,
streaming ones included, without touching the response) and by the Ray router's ingress (`authorized`).
Standard library only (and `errors.py` for the error body).
"""

from __future__ import annotations

import hmac
from typing import Optional

from .errors import error_json

OPEN_PATHS = ("/health", "/metrics")
UNAUTHORIZED_BODY = error_json(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                               code="invalid_api_key").encode()
CHALLENGE = (b"www-authenticate", b"Bearer")


def check_key(key: Optional[str]) -> Optional[str]:
    """None when `key` is usable as an API key, else why not (for a `--api-key:` error)."""
    if key is None:
        return None
    if not key or key != key.strip():
        return "must be a non-empty string without surrounding whitespace"
    if not key.isprintable() or not key.isascii():
        return "must be printable ASCII (it travels in an HTTP header)"
    return None


def authorized(header: Optional[str], key: Optional[str]) -> bool:
    """Whether an `Authorization` header value carries `key` (always true without a key)."""
    if key is None:
        return True
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode("utf-8", "replace"), key.encode())


def is_open(path: str) -> bool:
    return path in OPEN_PATHS


class ApiKeyMiddleware:
    """Pure ASGI: a 401 for an HTTP request to a protected path without the key; the rest untouched."""

    def __init__(self, app, api_key: str):
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") == "OPTIONS" or is_open(scope.get("path", "")):
            return await self.app(scope, receive, send)
        header = None
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        if authorized(header, self.api_key):
            return await self.app(scope, receive, send)
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()), CHALLENGE]})
        await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})
