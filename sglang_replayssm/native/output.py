"""The native engine's output side: a row's next token, the stop rules, and the events a step emits.

* `sample`: a request's next token from one position's logits (sampling.py's processed distribution).
* `emit`: append tokens to a request, apply the stop rules (EOS, stop_token_ids, stop strings,
  max_tokens, the context length; none before min_tokens) and queue its output event (`TokenEvent`,
  messages.py) with the text that is final so far: a possible stop-string prefix or an incomplete
  UTF-8 character is held back until the next tokens decide it.
* `fail`: end a request (all its samples) with an error event (status 500); the traceback goes to stderr.
"""

from __future__ import annotations

import sys
import traceback

import torch

from . import sampling
from .messages import TokenEvent, engine_error, error_event
from .request import Request


class Output:
    def __init__(self, tokenizer, max_model_len: int, counters: dict):
        self.tokenizer, self.max_model_len, self.counters = tokenizer, max_model_len, counters

    def sample(self, req: Request, logits: torch.Tensor) -> int:
        return sampling.sample(req.params, logits, req.prompt, req.output, self.tokenizer.eos_ids, req.generator)

    def emit(self, req: Request, toks: list[int], events: list, logits: torch.Tensor | None = None) -> None:
        """Append sampled tokens (logits[j]: the position toks[j] came from, for logprobs), apply the
        stop rules and queue the output event."""
        p, new = req.params, []
        for t in toks:
            if req.finish_reason is not None:
                break
            if (t in self.tokenizer.eos_ids and not p.ignore_eos) or t in p.stop_token_ids:
                req.finish_reason = "stop"
                break
            req.output.append(t)
            new.append(t)
            if len(req.output) >= p.max_tokens or len(req.tokens) >= self.max_model_len:
                req.finish_reason = "length"
        self.counters["generation_tokens"] += len(new)
        text = self.tokenizer.decode(req.output)
        if len(req.output) < p.min_tokens:
            req.stop_from = len(text)
        elif p.stop:
            start = max(0, req.sent - max(len(s) for s in p.stop))
            hits = [i for i in (text.find(s, max(start, req.stop_from - len(s) + 1)) for s in p.stop) if i >= 0]
            if hits:
                text = text[:min(hits)]
                req.finish_reason = "stop"
        if req.finish_reason is None:   # hold back a possible stop-string prefix / an incomplete character
            hold = max((len(s) for s in p.stop), default=1) - 1
            upto = len(text) - hold
            while upto > req.sent and text[upto - 1] == "\ufffd":
                upto -= 1
        else:
            upto = len(text)
        delta = text[req.sent:max(upto, req.sent)]
        req.sent = max(upto, req.sent)
        ev = TokenEvent(rid=req.rid, index=req.index, text=delta, token_ids=new,
                        finished=req.finish_reason is not None, finish_reason=req.finish_reason,
                        done=all(r.finish_reason is not None for r in req.group),   # every sample of the request
                        prompt_tokens=len(req.prompt), completion_tokens=len(req.output))
        if p.logprobs is not None:
            ev["logprobs"] = sampling.token_logprobs(logits, new, p.logprobs, self.tokenizer.token_entry) if new else []
        events.append(ev)

    def fail(self, req: Request, exc: Exception, events: list) -> None:
        """Fail one request: an error event for its client (status 500), the traceback in the log."""
        print(f"replayssm engine: request {req.rid} failed:", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)
        for r in req.group or [req]:   # its other samples end with it (one error answers the request)
            r.finish_reason = "error"
        events.append(error_event(req.rid, engine_error(exc), 500))
