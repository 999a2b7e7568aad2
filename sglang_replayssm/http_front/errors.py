"""The one error body every HTTP front end answers with (the native server's routes and middlewares, the Ray
router): OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``. Standard library only, so both
``native`` and ``scheduler`` import it.
"""

from __future__ import annotations

import json


def error_json(status: int, message: str, param: str | None = None, code: str | int | None = None) -> str:
    """The body of an error answer with HTTP ``status``: ``type`` is ``invalid_request_error`` below 500,
    ``server_error`` from 500; ``param`` names the offending field or header; ``code`` is the status unless
    given (e.g. ``invalid_api_key``)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": param,
                                 "code": status if code is None else code}})
