"""OpenAI request parsing for the native server: every field of a completions or chat body checked
before it reaches the engine. A bad value is a `BadRequest` (400) whose message starts with the field
and whose `param` names it; `error_response` is the one JSON error shape every route answers with."""

from __future__ import annotations

import math

from fastapi.responses import JSONResponse


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


def error_response(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


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
