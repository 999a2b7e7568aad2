"""The engine loop in its own process, connected to the HTTP front end by pyzmq (PUSH/PULL both ways).

It receives AddRequest / Abort / FlushCache / Shutdown and sends Ready (after the warm-up, warmup.py,
so the first requests do not pay for first-call costs) or Fatal, then a StepOutput per iteration
(messages.py). A StepOutput carries the step's events — the engine's output events, an ErrorEvent for
a request the engine refused (400) or failed (500), a FlushedEvent answering a FlushCache — and the
engine's stats; it goes out with every step, right after an abort (so a freed slot shows at once), and
at least twice a second when idle.

Nothing one request does ends the loop: an unexpected exception while adding a request fails that
request; `Engine.step` fails only the rows an error touched, and an exception that still escapes a
step fails the running requests (their state is unknown), never the waiting ones or the loop.

Signals: Ctrl-C in a terminal (SIGINT) and `kill -TERM -PGID` reach the server's whole process group, this
process included, while stopping is the front end's job (it drains, then sends Shutdown). So this process
ignores SIGINT, and takes SIGTERM as "stop within `stop_grace_s`" (the front end's drain, plus a margin): it
goes on serving the requests being drained until Shutdown comes, its front end is gone, or the grace ends.
The front end starts it with both signals ignored (a disposition the new process inherits), so that none
ends it before these handlers are in place.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback

import zmq

from .engine import Engine, EngineArgs, RequestError, SamplingParams
from .messages import (Abort, AddRequest, Fatal, FlushCache, FlushedEvent, Ready, Shutdown, StepOutput, decode,
                       encode, engine_error, error_event)
from .warmup import warm_up

IDLE_POLL_MS = 200
STATS_PERIOD_S = 0.5


def _add(engine: Engine, msg: AddRequest, events: list) -> None:
    """Queue one request; a refusal (400) or an unexpected error (500) answers that request alone."""
    try:
        engine.add_request(msg.prompt, SamplingParams(**msg.params), rid=msg.rid, resume=msg.resume)
    except RequestError as e:
        events.append(error_event(msg.rid, str(e), 400))
    except Exception as e:   # noqa: BLE001 - this request fails, the loop goes on
        traceback.print_exc()
        events.append(error_event(msg.rid, engine_error(e), 500))


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def handle_stop_signals(stop_grace_s: float) -> dict:
    """SIGINT ignored, SIGTERM noted as a stop deadline (`["deadline"]`, monotonic). In the engine process's main
    thread only: a loop run in a thread (tests) leaves signals to its process."""
    stop: dict = {"deadline": None}
    if threading.current_thread() is not threading.main_thread():
        return stop

    def on_term(signum, frame):
        if stop["deadline"] is None:
            stop["deadline"] = time.monotonic() + stop_grace_s

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, on_term)
    return stop


def run_engine(args: EngineArgs, req_addr: str, out_addr: str, stop_grace_s: float = 60.0) -> None:
    stop = handle_stop_signals(stop_grace_s)
    ctx = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 0)   # never block exit on messages to a front end that is gone
    pull = ctx.socket(zmq.PULL)
    pull.connect(req_addr)
    push = ctx.socket(zmq.PUSH)
    push.connect(out_addr)
    try:
        engine = Engine(args)
    except Exception as e:   # noqa: BLE001 - reported to the launcher, which exits with the message
        push.send(encode(Fatal(f"{type(e).__name__}: {e}")))
        push.close(linger=2000)
        return
    info = engine.info()
    info["warmup_s"] = warm_up(engine)
    push.send(encode(Ready(info, engine.stats())))
    parent = os.getppid()
    last_stats = 0.0
    while True:
        if os.getppid() != parent:   # the front end died without a shutdown message
            return
        if stop["deadline"] is not None and time.monotonic() > stop["deadline"]:   # SIGTERM, and no Shutdown came
            return
        events: list[dict] = []
        aborted = False
        if pull.poll(0 if engine.has_work() else IDLE_POLL_MS):
            while True:
                try:
                    msg = decode(pull.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if isinstance(msg, Shutdown):
                    push.close(linger=0)
                    pull.close(linger=0)
                    return
                if isinstance(msg, Abort):
                    engine.abort(msg.rid)
                    aborted = True
                elif isinstance(msg, FlushCache):
                    events.append(FlushedEvent(rid=msg.rid, flushed=engine.flush_cache(), done=True))
                elif isinstance(msg, AddRequest):
                    _add(engine, msg, events)
        if engine.has_work():
            try:
                events += engine.step()
            except Exception as e:   # noqa: BLE001 - fail the running requests, keep serving
                traceback.print_exc()
                for req in list(engine.running):
                    events.append(error_event(req.rid, engine_error(e), 500))
                    engine.abort(req.rid)
        now = time.monotonic()
        if events or aborted or now - last_stats > STATS_PERIOD_S:
            push.send(encode(StepOutput(events, engine.stats())))
            last_stats = now
