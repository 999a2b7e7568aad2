"""OpenAI request parsing for the native server: every field of a completions or chat body checked
before it reaches the engine. A bad value is a `BadRequest` (400) whose message starts with the field
and whose `param` names it; `error_response` answers with the one error body (`sglang_replayssm.http_front.errors`)."""

from __future__ import annotations

import math

from fastapi.responses import Response

from ..http_front.errors import error_json

from .sampling import MAX_N, MAX_TOP_LOGPROBS, SEED_RANGE


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


def engine_error(ev: dict) -> BadRequest:
    """The HTTP error of an engine's error event; a refusal ("field: why", status 400) names its field."""
    head = ev["error"].split(":", 1)[0]
    param = head if ev["status"] < 500 and head.replace("_", "").isalnum() and head != "engine error" else None
    return BadRequest(ev["error"], param, status=ev["status"])


def error_response(message: str, status: int = 400, param: str | None = None) -> Response:
    return Response(error_json(status, message, param), status_code=status, media_type="application/json")


SEED_MIN, SEED_MAX = SEED_RANGE   # int64 and uint64 seeds; negative ones are taken mod 2^64
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


# fields of OpenAI's (and SGLang's) API the native engine does not implement: a 400 naming the field
# when a request sets them to anything but their no-op default
REFUSED = {
    "suffix": ("", "insertion (suffix) is not supported by the native engine"),
    "echo": (False, "echoing the prompt is not supported by the native engine"),
    "tools": ([], "tool calling is not supported by the native engine"),
    "tool_choice": ("none", "tool calling is not supported by the native engine"),
    "parallel_tool_calls": (False, "tool calling is not supported by the native engine"),
    "functions": ([], "function calling is not supported by the native engine"),
    "function_call": ("none", "function calling is not supported by the native engine"),
    "response_format": ({"type": "text"}, 'only {"type": "text"} (the default): JSON mode and JSON schemas '
                                          "are not supported by the native engine"),
}
CHAT_ROLES = ("system", "user", "assistant")   # tool messages need tools, which are refused


def _refuse_unsupported(body: dict) -> None:
    for name, (noop, why) in REFUSED.items():
        v = body.get(name)
        if v is not None and not (v == noop and type(v) is type(noop)):
            raise BadRequest(f"{name}: {why}", name)


def _logit_bias(body: dict) -> dict | None:
    v = body.get("logit_bias")
    if v is None:
        return None
    if not isinstance(v, dict):
        raise BadRequest(f"logit_bias: expected an object of token id -> bias, got {_show(v)}", "logit_bias")
    out = {}
    for k, b in v.items():
        if not (isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 12):
            raise BadRequest(f"logit_bias: keys are token ids (decimal strings), got {_show(k)}", "logit_bias")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            raise BadRequest(f"logit_bias: the bias of token {k} must be a number in [-100, 100], got {_show(b)}",
                             "logit_bias")
        out[int(k)] = float(b)
    return out or None


def _token_ids(body: dict, name: str) -> tuple:
    v = body.get(name)
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 31
                                          for t in v):
        raise BadRequest(f"{name}: expected a list of token ids, got {_show(v)}", name)
    return tuple(v)


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many top log-probabilities per token (0: only the chosen token's), or None for none."""
    if not chat:
        return _number(body, "logprobs", None, 0, MAX_TOP_LOGPROBS, int) if body.get("logprobs") is not False else None
    top = _number(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS, int)
    if not _flag(body, "logprobs"):
        if top is not None:
            raise BadRequest("top_logprobs: needs logprobs: true", "top_logprobs")
        return None
    return top or 0


def parse_sampling(body: dict, chat: bool) -> dict:
    """The engine's SamplingParams fields of an OpenAI body (`sampling.SamplingParams`); a 400 naming
    the field for a bad value or a field the engine does not implement."""
    _refuse_unsupported(body)
    n = _number(body, "n", 1, 1, MAX_N, int)
    best_of = _number(body, "best_of", n, 1, MAX_N, int)
    if best_of != n:
        raise BadRequest(f"best_of: only best_of == n ({n}) is supported (no server-side ranking)", "best_of")
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
    # max_tokens first (as the Ray router's resume rewrites it), else max_completion_tokens (chat and completions)
    max_name = "max_completion_tokens" if body.get("max_tokens") is None and body.get(
        "max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, max_name, 128 if chat else 16, 1, 1 << 20, int)
    min_tokens = _number(body, "min_tokens", 0, 0, 1 << 20, int)
    if min_tokens > max_tokens:
        raise BadRequest(f"min_tokens: must be <= {max_name} ({max_tokens}), got {min_tokens}", "min_tokens")
    top_k = _number(body, "top_k", -1, -1, 1 << 31, int)
    return {"max_tokens": max_tokens, "min_tokens": min_tokens,
            "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
            "top_p": _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
            "top_k": -1 if top_k == 0 else top_k,
            "min_p": _number(body, "min_p", 0.0, 0.0, 1.0),
            "repetition_penalty": _number(body, "repetition_penalty", 1.0, 0.0, 2.0, lo_open=True),
            "frequency_penalty": _number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            "presence_penalty": _number(body, "presence_penalty", 0.0, -2.0, 2.0),
            "logit_bias": _logit_bias(body), "stop": tuple(stop),
            "stop_token_ids": _token_ids(body, "stop_token_ids"), "seed": seed,
            "ignore_eos": _flag(body, "ignore_eos"), "n": n, "logprobs": _logprobs(body, chat)}


def check_model(body: dict, served: str) -> None:
    """An absent model is the served one; another name is a 404 (as vLLM answers)."""
    m = body.get("model")
    if m is None:
        return
    if not isinstance(m, str):
        raise BadRequest(f"model: expected a string, got {_show(m)}", "model")
    if m != served:
        raise BadRequest(f"model: the model `{_show(m)[1:-1]}` does not exist (this server serves {served!r})",
                         "model", status=404)


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
        if m["role"] not in CHAT_ROLES:
            raise BadRequest(f"messages[{i}].role: must be one of {', '.join(CHAT_ROLES)}, got {_show(m['role'])} "
                             "(tool messages need tools, which the native engine does not support)", "messages")
        for key in ("name", "tool_calls", "tool_call_id", "function_call"):
            if m.get(key) is not None:
                raise BadRequest(f"messages[{i}].{key}: not supported by the native engine", "messages")
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


def parse_stream(body: dict) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage_stats: usage in every chunk, as vLLM and SGLang send)."""
    stream = _flag(body, "stream")
    opts = body.get("stream_options")
    if opts is None:
        return stream, False, False
    if not isinstance(opts, dict):
        raise BadRequest(f"stream_options: expected an object, got {_show(opts)}", "stream_options")
    return stream, _flag(opts, "include_usage"), _flag(opts, "continuous_usage_stats")
