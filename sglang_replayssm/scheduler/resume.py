"""The engine request of one attempt of a routed request: the first one, or a retry that resumes an
answer cut on another replica (the ingress's retries, ingress.py). Built by the replica, which knows
its engine; standard library only.

Every attempt is streamed (`stream: true`, usage in every chunk where the engine has it).

* **Exact resume (the native engine).** Every attempt asks for `return_token_ids`, so each chunk
  names the token ids its text came from. A retry sends the original body unchanged plus
  `replayssm_resume: {"token_ids": the ids delivered, "text_chars": the characters delivered}`: the
  engine prefills prompt + those ids and goes on as the uncut request would have, its default
  max_tokens, stop strings, text boundaries (a character split across tokens) and usage included.
  Works for every prompt form (text, token ids, chat).
* **Text resume (engines without token ids: SGLang).** The delivered text is appended to the prompt
  (chat: a final assistant message, continued), and max_tokens reduced by the tokens delivered
  (a completion without max_tokens: SGLang's default of 16; a chat without it runs to the context,
  as the uncut one would). Exact as far as re-tokenizing the text gives back the same tokens (BPE may
  not). A prompt of token ids cannot be extended by text: `ResumeError`.
"""

from __future__ import annotations

import copy
from typing import Any

EXACT_ENGINES = ("native",)          # engines whose chunks carry token ids (return_token_ids)
SGLANG_COMPLETION_MAX_TOKENS = 16    # SGLang's (and OpenAI's) max_tokens of a completion that names none


class ResumeError(ValueError):
    """This request cannot be resumed on this engine (a token-id prompt without exact resume)."""


def max_tokens_of(body: dict[str, Any]) -> int | None:
    """The request's token budget (checked an integer by the ingress), or None."""
    for k in ("max_tokens", "max_completion_tokens"):
        if body.get(k) is not None:
            return int(body[k])
    return None


def attempt_body(kind: str, body: dict[str, Any], engine: str, sent: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body to send to an `engine` replica. kind: "completions" | "chat"; sent: what earlier
    attempts delivered ({"text", "tokens", "token_ids"}), None or empty for the first attempt."""
    b = copy.deepcopy(body)
    b["stream"] = True
    # continuous_usage_stats (SGLang, vLLM): usage in every chunk, so a text resume knows how many
    # tokens were sent even when one chunk carries several (speculative decoding)
    b["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    b.pop("n", None)
    exact = engine in EXACT_ENGINES
    if exact:
        b["return_token_ids"] = True
    if not sent or not (sent.get("tokens") or sent.get("text")):
        return b
    if exact:
        ids: list[int] = list(sent.get("token_ids") or [])
        if len(ids) != sent.get("tokens"):
            raise ResumeError(f"{sent.get('tokens')} tokens delivered but {len(ids)} token ids known")
        b["replayssm_resume"] = {"token_ids": ids, "text_chars": len(sent.get("text") or "")}
        return b
    return _text_resume(kind, body, b, sent.get("text") or "", int(sent.get("tokens") or 0))


def _text_resume(kind: str, body: dict[str, Any], b: dict[str, Any], text: str, tokens: int) -> dict[str, Any]:
    mt = max_tokens_of(body)
    if mt is None and kind == "completions":
        mt = SGLANG_COMPLETION_MAX_TOKENS
    if mt is not None:
        key = "max_completion_tokens" if body.get("max_tokens") is None and "max_completion_tokens" in body else "max_tokens"
        b[key] = mt - tokens
    if kind == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]   # ["text"]: one text prompt
        if not isinstance(prompt, str):
            raise ResumeError("a prompt of token ids cannot be resumed on an engine that gives no token ids")
        b["prompt"] = prompt + text
    else:
        b["messages"] = list(body["messages"]) + [{"role": "assistant", "content": text}]
        b["continue_final_message"] = True
        b["add_generation_prompt"] = False
    return b
