"""OpenAI response bodies, built from an engine's output events (the native server): the choices of one
request (n of them, `index` 0..n-1), their logprobs objects, usage, and the SSE chunks of a stream.

Logprobs are the model's raw log-probabilities (native/sampling.py). Completions: `{"tokens", "token_logprobs",
"top_logprobs" (per token: the top entries and the chosen one, token text -> logprob), "text_offset"
(per token: where its text starts in the choice's text)}`; chat: `{"content": [{"token", "logprob",
"bytes", "top_logprobs": [...]}]}`. A stream carries each step's entries in that step's chunk.
Usage counts the prompt once and every choice's tokens. With `return_token_ids` every choice (and
every stream chunk) also carries the `token_ids` its text came from. `merged_logprobs` joins the
chunks' logprobs objects (the Ray router answers a non-streamed request from a stream).
"""

from __future__ import annotations

import json


def sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


class Choices:
    """The state of one request's n choices while its events arrive."""

    def __init__(self, rid: str, created: int, model: str, chat: bool, n: int, logprobs: bool,
                 token_ids: bool = False):
        self.rid, self.created, self.model, self.chat, self.logprobs = rid, created, model, chat, logprobs
        self.token_ids = token_ids
        self.ids = [[] for _ in range(n)]
        self.obj = ("chat.completion" if chat else "text_completion")
        self.text = [""] * n
        self.entries = [[] for _ in range(n)]
        self.offset = [0] * n              # completions text_offset: characters of token text so far
        self.finish = [None] * n
        self.completion_tokens = [0] * n
        self.prompt_tokens = 0

    def add(self, ev: dict) -> None:
        i = ev.get("index", 0)
        self.text[i] += ev["text"]
        self.ids[i] += ev["token_ids"]
        self.entries[i] += ev.get("logprobs") or []
        self.completion_tokens[i] = ev["completion_tokens"]
        self.prompt_tokens = ev["prompt_tokens"]
        if ev["finished"]:
            self.finish[i] = ev["finish_reason"]

    def usage(self) -> dict:
        done = sum(self.completion_tokens)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": done,
                "total_tokens": self.prompt_tokens + done}

    # ------------------------------------------------------------------ logprobs objects
    def _completion_logprobs(self, i: int, entries: list) -> dict:
        tokens, offsets = [], []
        for e in entries:
            offsets.append(self.offset[i])
            self.offset[i] += len(e["token"])
            tokens.append(e["token"])
        top = [{**{t["token"]: t["logprob"] for t in e["top"]}, e["token"]: e["logprob"]} for e in entries]
        return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries], "top_logprobs": top,
                "text_offset": offsets}

    @staticmethod
    def _chat_logprobs(entries: list) -> dict:
        return {"content": [{"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"],
                             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                                              for t in e["top"]]} for e in entries], "refusal": None}

    def _logprobs(self, i: int, entries: list):
        if not self.logprobs:
            return None
        return self._chat_logprobs(entries) if self.chat else self._completion_logprobs(i, entries)

    # ------------------------------------------------------------------ a whole response
    def response(self) -> dict:
        choices = []
        for i, text in enumerate(self.text):
            c = ({"index": i, "message": {"role": "assistant", "content": text}} if self.chat
                 else {"index": i, "text": text})
            c["logprobs"] = self._logprobs(i, self.entries[i])
            c["finish_reason"] = self.finish[i]
            if self.token_ids:
                c["token_ids"] = self.ids[i]
            choices.append(c)
        return {"id": self.rid, "object": self.obj, "created": self.created, "model": self.model,
                "choices": choices, "usage": self.usage()}

    # ------------------------------------------------------------------ a stream
    def _chunk(self, choice: dict, usage: bool) -> str:
        data = {"id": self.rid, "object": self.obj + (".chunk" if self.chat else ""), "created": self.created,
                "model": self.model, "choices": [choice]}
        if usage:
            data["usage"] = self.usage()
        return sse(data)

    def role_chunks(self) -> list[str]:
        """A chat stream's first chunk per choice: the assistant role."""
        if not self.chat:
            return []
        return [self._chunk({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}, False) for i in range(len(self.text))]

    def chunk(self, ev: dict, continuous_usage: bool) -> str | None:
        """The SSE chunk of one event (after `add(ev)`), or None when it carries nothing."""
        i, entries = ev.get("index", 0), ev.get("logprobs") or []
        if not (ev["text"] or ev["finished"] or entries or (self.token_ids and ev["token_ids"])):
            return None
        finish = ev["finish_reason"] if ev["finished"] else None
        if self.chat:
            choice = {"index": i, "delta": {"content": ev["text"]} if ev["text"] else {}}
        else:
            choice = {"index": i, "text": ev["text"]}
        choice["logprobs"] = self._logprobs(i, entries)
        choice["finish_reason"] = finish
        if self.token_ids:   # the ids this chunk's text came from
            choice["token_ids"] = ev["token_ids"]
        return self._chunk(choice, continuous_usage)

    def usage_chunk(self) -> str:
        return sse({"id": self.rid, "object": self.obj + (".chunk" if self.chat else ""), "created": self.created,
                    "model": self.model, "choices": [], "usage": self.usage()})


def merged_logprobs(chat: bool, parts: list) -> dict:
    """One logprobs object from the stream chunks' ones (the Ray router's non-streamed answer);
    completions' text_offset recomputed over the whole answer."""
    if chat:
        return {"content": [e for p in parts for e in p.get("content") or []], "refusal": None}
    tokens = [t for p in parts for t in p.get("tokens") or []]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [x for p in parts for x in p.get("token_logprobs") or []],
            "top_logprobs": [x for p in parts for x in p.get("top_logprobs") or []], "text_offset": offsets}
