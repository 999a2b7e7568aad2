"""What a web page in the user's browser must not be able to do to a server on 127.0.0.1.

A page from any site can make the browser send "simple" cross-site POSTs (`text/plain`, form encodings)
without a CORS preflight, and a DNS-rebinding page can even read the answers of a server bound to
loopback, because its own host name now resolves to 127.0.0.1. So, for every HTTP request:

* **Host**: when the server is bound to a loopback address, the Host header must name a loopback host
  (`127.0.0.1`, `localhost`, `[::1]`, any port); anything else is a 421 naming the header.
* **Origin**: a POST that carries an `Origin` header must come from the server's own origin (the same
  host and port as its Host header); a cross-site one (or `Origin: null`) is a 403 naming the header.
* **Content-Type**: a POST whose body is declared `text/plain`, `application/x-www-form-urlencoded` or
  `multipart/form-data` (the encodings a browser sends cross-site without asking) is a 415; JSON
  clients send `application/json` or nothing.

`problem(method, headers, loopback)` is the check; `BrowserGuardMiddleware` applies it to every route of
the native server; the Ray router calls `problem` on its request routes. Standard library only (and
`errors.py` for the error body).
"""

from __future__ import annotations

from typing import Iterable, Optional, Tuple
from urllib.parse import urlsplit

from .errors import error_json

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
BROWSER_FORM_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")


def _host_name(host_header: str) -> str:
    """The host part of a Host header value: `[::1]:8000` -> `::1`, `localhost:80` -> `localhost`."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def problem(method: str, headers: Iterable[Tuple[str, str]], loopback: bool) -> Optional[Tuple[int, str, str]]:
    """(status, header name, message) when the request must be refused, else None. `headers`: (name,
    value) pairs, names in lower case (as ASGI and Starlette give them)."""
    found = {}
    for name, value in headers:
        found.setdefault(name, value)
    host = found.get("host", "")
    if loopback and _host_name(host) not in LOOPBACK_HOSTS:
        return (421, "host", f"Host: {host[:60]!r} is not a loopback name; this server listens on loopback "
                             "only and answers requests addressed to 127.0.0.1, localhost or [::1]")
    if method != "POST":
        return None
    origin = found.get("origin")
    if origin is not None:
        parts = urlsplit(origin.strip())
        if origin.strip() == "null" or not parts.netloc or parts.netloc.lower() != host.strip().lower():
            return (403, "origin", f"Origin: {origin[:60]!r} is another site; cross-site requests are refused")
    ctype = found.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype in BROWSER_FORM_TYPES:
        return (415, "content-type", f"Content-Type: {ctype} is refused; send the body as application/json")
    return None


class BrowserGuardMiddleware:
    """Pure ASGI: the `problem` check on every HTTP request, before any route or body is read."""

    def __init__(self, app, loopback: bool):
        self.app, self.loopback = app, loopback

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in scope.get("headers") or ()]
        refused = problem(scope.get("method", ""), headers, self.loopback)
        if refused is None:
            return await self.app(scope, receive, send)
        status, param, message = refused
        body = error_json(status, message, param).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
