"""What crosses the boundary between the native server's front end (`engine_client.py`) and the engine
process (`engine_process.py`): one dataclass per message, and `encode` / `decode`, the one place they
become bytes (pickle: both ends run this code; the sockets are ipc:// files in a private directory).

Front end -> engine:  AddRequest | Abort | FlushCache | Shutdown
Engine -> front end:  Ready (after the warm-up) | Fatal (the engine could not start)
                      | StepOutput (the events of one loop iteration, and the engine's stats)

An event is a dict with the request's `rid` (it stays a dict: the HTTP layer and the tests read it by
key): a `TokenEvent` (Engine.step's output), an `ErrorEvent` (a request refused: 400, failed: 500, or
ended by the front end: 503), or a `FlushedEvent` answering a FlushCache.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import TypedDict, Union


# ------------------------------------------------------------------ events (dicts, by key)
class TokenEvent(TypedDict, total=False):
    rid: str
    index: int                  # which of the request's n samples
    text: str                   # text that became final with these tokens
    token_ids: list             # the tokens this event adds
    finished: bool              # this sample ended
    finish_reason: str | None   # stop | length | abort | error
    done: bool                  # every sample of the request ended
    prompt_tokens: int
    completion_tokens: int
    logprobs: list              # with SamplingParams.logprobs: sampling.token_logprobs entries


class ErrorEvent(TypedDict, total=False):
    rid: str
    error: str
    status: int                 # 400 refused, 500 failed in the engine, 503 engine gone / draining
    abort: bool                 # put by the front end itself (drain timeout): not the engine's answer


class FlushedEvent(TypedDict):
    rid: str
    flushed: bool
    done: bool


Event = Union[TokenEvent, ErrorEvent, FlushedEvent]


def engine_error(exc: BaseException) -> str:
    """The client's text of an exception inside the engine (status 500)."""
    return f"engine error: {type(exc).__name__}: {str(exc)[:200]}"


def error_event(rid: str, error: str, status: int, abort: bool = False) -> ErrorEvent:
    ev = ErrorEvent(rid=rid, error=error, status=status)
    if abort:
        ev["abort"] = True
    return ev


# ------------------------------------------------------------------ front end -> engine
@dataclasses.dataclass
class AddRequest:
    rid: str
    prompt: object              # token ids (the front end tokenizes), or text / {"messages": [...]}
    params: dict                # SamplingParams fields; built in the engine, so a bad field fails this request only
    resume: tuple | list | None = None   # Engine.add_request's resume: (output token ids, text characters sent)


@dataclasses.dataclass
class Abort:
    rid: str


@dataclasses.dataclass
class FlushCache:
    rid: str                    # the FlushedEvent answering it carries this rid


@dataclasses.dataclass
class Shutdown:
    pass


# ------------------------------------------------------------------ engine -> front end
@dataclasses.dataclass
class Ready:
    info: dict                  # Engine.info() and warmup_s
    stats: dict                 # Engine.stats()


@dataclasses.dataclass
class Fatal:
    error: str


@dataclasses.dataclass
class StepOutput:
    events: list                # Event dicts
    stats: dict


MESSAGES = (AddRequest, Abort, FlushCache, Shutdown, Ready, Fatal, StepOutput)
Message = Union[AddRequest, Abort, FlushCache, Shutdown, Ready, Fatal, StepOutput]
CONTROL = {"flush_cache": FlushCache}   # EngineClient.control(kind): the messages answered by one event


def encode(msg: Message) -> bytes:
    if not isinstance(msg, MESSAGES):
        raise TypeError(f"not an engine message: {type(msg).__name__}")
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def decode(frame: bytes) -> Message:
    msg = pickle.loads(frame)
    if not isinstance(msg, MESSAGES):
        raise TypeError(f"not an engine message: {type(msg).__name__}")
    return msg
