"""The engine loop in its own process, connected to the HTTP front end by pyzmq.

Front end -> engine (PUSH/PULL):  {"type": "add", "rid", "prompt", "params", "resume"} | {"type": "abort", "rid"}
                                  | {"type": "flush_cache", "rid"} | {"type": "shutdown"}
Engine -> front end (PUSH/PULL):  {"type": "ready", "info", "stats"} | {"type": "fatal", "error"}
                                  | {"type": "out", "events": [...], "stats": {...}}
An event is the engine's output event (engine.Engine._emit), or {"rid", "error", "status"} for a
request the engine refused (400) or failed (500), or {"rid", "flushed": bool, "done": True} answering a
flush_cache. Stats go out with every step, right after an abort (so a freed slot shows at once), and
at least twice a second when idle. Before "ready" the engine is warmed up (warmup.py), so the first
requests do not pay for first-call costs.

Nothing one request does ends the loop: an unexpected exception while adding a request fails that
request; `Engine.step` fails only the rows an error touched, and an exception that still escapes a
step fails the running requests (their state is unknown), never the waiting ones or the loop.
"""

from __future__ import annotations

import os
import time
import traceback

import zmq

from .engine import Engine, EngineArgs, RequestError, SamplingParams
from .warmup import warm_up

IDLE_POLL_MS = 200
STATS_PERIOD_S = 0.5


def _engine_error(e: Exception) -> str:
    return f"engine error: {type(e).__name__}: {str(e)[:200]}"


def run_engine(args: EngineArgs, req_addr: str, out_addr: str) -> None:
    ctx = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 0)   # never block exit on messages to a front end that is gone
    pull = ctx.socket(zmq.PULL)
    pull.connect(req_addr)
    push = ctx.socket(zmq.PUSH)
    push.connect(out_addr)
    try:
        engine = Engine(args)
    except Exception as e:   # noqa: BLE001 - reported to the launcher, which exits with the message
        push.send_pyobj({"type": "fatal", "error": f"{type(e).__name__}: {e}"})
        push.close(linger=2000)
        return
    info = engine.info()
    info["warmup_s"] = warm_up(engine)
    push.send_pyobj({"type": "ready", "info": info, "stats": engine.stats()})
    parent = os.getppid()
    last_stats = 0.0
    while True:
        if os.getppid() != parent:   # the front end died without a shutdown message
            return
        events: list[dict] = []
        aborted = False
        if pull.poll(0 if engine.has_work() else IDLE_POLL_MS):
            while True:
                try:
                    msg = pull.recv_pyobj(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if msg["type"] == "shutdown":
                    push.close(linger=0)
                    pull.close(linger=0)
                    return
                if msg["type"] == "abort":
                    engine.abort(msg["rid"])
                    aborted = True
                elif msg["type"] == "flush_cache":
                    events.append({"rid": msg["rid"], "flushed": engine.flush_cache(), "done": True})
                elif msg["type"] == "add":
                    try:
                        engine.add_request(msg["prompt"], SamplingParams(**msg["params"]), rid=msg["rid"],
                                           resume=msg.get("resume"))
                    except RequestError as e:
                        events.append({"rid": msg["rid"], "error": str(e), "status": 400})
                    except Exception as e:   # noqa: BLE001 - this request fails, the loop goes on
                        traceback.print_exc()
                        events.append({"rid": msg["rid"], "error": _engine_error(e), "status": 500})
        if engine.has_work():
            try:
                events += engine.step()
            except Exception as e:   # noqa: BLE001 - fail the running requests, keep serving
                traceback.print_exc()
                for req in list(engine.running):
                    events.append({"rid": req.rid, "error": _engine_error(e), "status": 500})
                    engine.abort(req.rid)
        now = time.monotonic()
        if events or aborted or now - last_stats > STATS_PERIOD_S:
            push.send_pyobj({"type": "out", "events": events, "stats": engine.stats()})
            last_stats = now
