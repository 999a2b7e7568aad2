"""SGLang's own HTTP endpoints, as far as the native engine serves them honestly (`add_sglang_routes`):

POST /generate           SGLang's native body: `text` or `input_ids` (one prompt), `sampling_params`
                         {max_new_tokens, min_new_tokens, temperature, top_p, top_k, min_p,
                         frequency/presence/repetition_penalty, stop, stop_token_ids, ignore_eos, n,
                         logit_bias}, `stream`, `return_logprob` + `top_logprobs_num`. Answer:
                         {"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
                         "completion_tokens", logprobs as [logprob, token id, None]}}; n > 1: a list of
                         them. A stream sends each step's cumulative answer (SGLang's default), then [DONE].
GET  /get_model_info     model path, served name, tokenizer, architecture.
GET  /get_server_info    the engine's configuration and live counters.
GET|POST /flush_cache    drops the prefix cache; 400 while requests run or wait (as SGLang answers).
GET  /health_generate    200 once the engine generated one token (503 if it cannot).
POST /v1/tokenize        {"prompt": text | [texts] | "messages", "add_special_tokens"} -> {"tokens", "count", "max_model_len"}
POST /v1/detokenize      {"tokens": ids | [ids]} -> {"text"}.
Fields SGLang has and the native engine does not implement (constrained decoding, LoRA, images,
hidden states, prompt logprobs, ...) are a 400 naming them. All routes sit behind --api-key (http_front/auth.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

from fastapi import Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from ..http_front.openai_response import sse
from .openai_request import (BadRequest, _flag, _number, _show, check_model, engine_error, parse_messages,
                             parse_prompt, parse_sampling)

# sampling_params key -> the OpenAI field parse_sampling reads it as
SAMPLING_KEYS = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "temperature": "temperature",
                 "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "frequency_penalty": "frequency_penalty",
                 "presence_penalty": "presence_penalty", "repetition_penalty": "repetition_penalty", "stop": "stop",
                 "stop_token_ids": "stop_token_ids", "ignore_eos": "ignore_eos", "n": "n", "logit_bias": "logit_bias",
                 "seed": "seed", "sampling_seed": "seed"}
NO_OP_SAMPLING = {"skip_special_tokens": True, "spaces_between_special_tokens": True, "no_stop_trim": False}
TOP_LEVEL = {"text", "input_ids", "sampling_params", "stream", "return_logprob", "top_logprobs_num",
             "logprob_start_len", "return_text_in_logprobs", "rid", "model"}
HEALTH_TIMEOUT_S = 20.0


def _generate_params(body: dict) -> dict:
    """SamplingParams fields of a /generate body; a 400 naming `sampling_params.<key>` or the field."""
    for k, v in body.items():
        if k not in TOP_LEVEL and v is not None:
            raise BadRequest(f"{k}: not supported by the native engine", k)
    if body.get("logprob_start_len") not in (None, -1):
        raise BadRequest("logprob_start_len: prompt logprobs are not supported by the native engine",
                         "logprob_start_len")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise BadRequest(f"sampling_params: expected an object, got {_show(sp)}", "sampling_params")
    as_openai = {}
    for k, v in sp.items():
        if k in NO_OP_SAMPLING:
            if v is not None and v != NO_OP_SAMPLING[k]:
                raise BadRequest(f"sampling_params.{k}: only {NO_OP_SAMPLING[k]} is supported", "sampling_params")
        elif k in SAMPLING_KEYS:
            as_openai[SAMPLING_KEYS[k]] = v
        elif v is not None:
            raise BadRequest(f"sampling_params.{k}: not supported by the native engine", "sampling_params")
    as_openai.setdefault("max_tokens", 128)            # SGLang's default max_new_tokens
    if _flag(body, "return_logprob"):
        as_openai["logprobs"] = _number(body, "top_logprobs_num", 0, 0, 20, int)
    try:
        return parse_sampling(as_openai, chat=False)
    except BadRequest as e:
        name = {v: k for k, v in SAMPLING_KEYS.items() if k != "sampling_seed"}.get(e.param, e.param)
        raise BadRequest(f"sampling_params.{name}{e.message[len(e.param or ''):]}", "sampling_params") from None


def _finish(ev: dict) -> dict | None:
    if not ev["finished"]:
        return None
    if ev["finish_reason"] == "length":
        return {"type": "length", "length": ev["completion_tokens"]}
    return {"type": ev["finish_reason"], "matched": None}


def _lp(entries: list) -> tuple[list, list]:
    return ([[e["logprob"], e["id"], None] for e in entries],
            [[[t["logprob"], t["id"], None] for t in e["top"]] for e in entries])


class _Sample:
    """One of the n outputs of a /generate request, as SGLang shapes it."""

    def __init__(self, rid: str, index: int, logprobs: bool):
        self.rid, self.index, self.logprobs = rid, index, logprobs
        self.text, self.ids, self.entries, self.ev = "", [], [], None

    def add(self, ev: dict) -> None:
        self.text += ev["text"]
        self.ids += ev["token_ids"]
        self.entries += ev.get("logprobs") or []
        self.ev = ev

    def body(self, t0: float) -> dict:
        meta = {"id": self.rid, "finish_reason": _finish(self.ev), "prompt_tokens": self.ev["prompt_tokens"],
                "completion_tokens": self.ev["completion_tokens"], "e2e_latency": time.monotonic() - t0}
        if self.logprobs:
            meta["output_token_logprobs"], meta["output_top_logprobs"] = _lp(self.entries)
        out = {"text": self.text, "output_ids": list(self.ids), "meta_info": meta}
        return {**out, "index": self.index} if self.index is not None else out


def add_sglang_routes(app, client, model_name: str, body_of) -> None:
    """Register SGLang's endpoints on the native server's app (see the module docstring); `body_of`:
    the server's checked JSON body of a request. Tokenizing runs in the client's worker threads."""
    tokenizer = client.tokenizer

    async def in_thread(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(client.threads, fn, *args)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        body = await body_of(request)
        check_model(body, model_name)
        params = _generate_params(body)
        if (body.get("text") is None) == (body.get("input_ids") is None):
            raise BadRequest("text: give exactly one of text and input_ids", "text")
        field = "text" if body.get("text") is not None else "input_ids"
        try:
            prompt = await client.encode(parse_prompt({"prompt": body[field]}))   # a worker thread
        except BadRequest as e:
            raise BadRequest(field + e.message[len("prompt"):], field) from None
        stream = _flag(body, "stream")
        t0 = time.monotonic()
        events = client.generate(prompt, params)
        first = await events.__anext__()
        if "error" in first:
            raise engine_error(first)
        n, rid = params["n"], uuid.uuid4().hex
        samples = [_Sample(rid, i if n > 1 else None, params["logprobs"] is not None) for i in range(n)]

        async def each():
            ev = first
            while True:
                if "error" in ev:
                    raise engine_error(ev)
                samples[ev.get("index", 0)].add(ev)
                yield ev
                if ev.get("done", ev["finished"]):
                    return
                ev = await events.__anext__()

        if not stream:
            try:
                async for _ in each():
                    pass
            finally:
                await events.aclose()
            out = [s.body(t0) for s in samples]
            return out if n > 1 else out[0]

        async def chunks():
            try:
                async for ev in each():
                    if ev["text"] or ev["token_ids"] or ev["finished"]:
                        yield sse(samples[ev.get("index", 0)].body(t0))
            except BadRequest as e:
                yield sse({"error": {"message": e.message, "code": e.status}})
                return
            finally:
                await events.aclose()
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.get("/get_model_info")
    async def get_model_info():
        info = client.info
        return {"model_path": client.args.model_path or "embedded", "served_model_name": model_name,
                "tokenizer_path": client.args.model_path if info.get("tokenizer") == "hf" else None,
                "tokenizer": info.get("tokenizer"), "is_generation": True, "preferred_sampling_params": None,
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": info.get("family"), "architectures": [info.get("arch")]}

    @app.get("/get_server_info")
    async def get_server_info():
        args = dataclasses.asdict(client.args)
        s = client.stats
        return {**args, **client.info, "internal_states": [{
            "last_gen_throughput": s.get("gen_throughput", 0.0), "running": s.get("running", 0),
            "waiting": s.get("waiting", 0), "free_slots": s.get("free_slots", 0)}]}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        ans = await client.control("flush_cache")
        if not ans.get("flushed"):
            return PlainTextResponse("Cache not flushed: requests are running or waiting.\n", status_code=400)
        return PlainTextResponse("Cache flushed.\n")

    @app.get("/health_generate")
    async def health_generate():
        async def one():
            events = client.generate([0], {"max_tokens": 1, "temperature": 0.0})
            try:
                ev = await events.__anext__()
                return "error" not in ev
            finally:
                await events.aclose()
        try:
            ok = await asyncio.wait_for(one(), HEALTH_TIMEOUT_S)
        except (asyncio.TimeoutError, BadRequest):
            ok = False
        return PlainTextResponse("ok" if ok else "engine did not generate", status_code=200 if ok else 503)

    @app.post("/v1/tokenize")
    async def tokenize(request: Request):
        body = await body_of(request)
        check_model(body, model_name)
        special = body.get("add_special_tokens", True)
        if not isinstance(special, bool):
            raise BadRequest(f"add_special_tokens: expected true or false, got {_show(special)}", "add_special_tokens")
        if body.get("messages") is not None:
            m = parse_messages(body)
            prompts, batch = [("chat", m)], False
        else:
            p = body.get("prompt")
            batch = isinstance(p, list)
            prompts = [("text", t) for t in (p if batch else [p])]
            if not prompts or not all(isinstance(t, str) for _, t in prompts):
                raise BadRequest("prompt: expected a string or a list of strings (or messages)", "prompt")
        def encode_all():
            return [tokenizer.chat_prompt(v["messages"], v["continue_final_message"]) if k == "chat"
                    else tokenizer.encode(v, add_special_tokens=special) for k, v in prompts]
        try:
            ids = await in_thread(encode_all)
        except Exception as e:   # noqa: BLE001 - whatever the tokenizer makes of this input
            raise BadRequest(f"prompt: cannot be tokenized ({type(e).__name__})", "prompt") from None
        limit = client.args.max_model_len
        if batch:
            return {"tokens": ids, "count": [len(i) for i in ids], "max_model_len": limit}
        return {"tokens": ids[0], "count": len(ids[0]), "max_model_len": limit}

    @app.post("/v1/detokenize")
    async def detokenize(request: Request):
        body = await body_of(request)
        check_model(body, model_name)
        toks = body.get("tokens")
        batch = isinstance(toks, list) and bool(toks) and all(isinstance(t, list) for t in toks)
        seqs = toks if batch else [toks]
        vocab = client.vocab_size
        if not all(isinstance(s, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                                for t in s) for s in seqs):
            raise BadRequest(f"tokens: expected a list of token ids in [0, {vocab}) or a list of such lists", "tokens")
        texts = await in_thread(lambda: [tokenizer.decode(s) for s in seqs])
        return {"text": texts if batch else texts[0]}
