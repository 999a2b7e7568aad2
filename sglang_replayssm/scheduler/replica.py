"""The engine replica: a Ray Serve deployment whose every replica owns one engine process.

Engine-agnostic: the replica starts `python -m sglang_replayssm.launch --engine {native,sglang}
--host 127.0.0.1 --port P [engine args]` (engine_process.py), waits for GET /health, then

* `generate(payload)`   streams one OpenAI request through the engine (payload: path, kind, the
                        client's body, what earlier attempts delivered; the engine's body is built
                        by resume.attempt_body for this replica's engine): first a `meta` event
                        naming the replica (and whether it resumes exactly), then one `chunk` event
                        per SSE data object (with the chunk's token ids when the engine gives them),
                        then `done`; an engine 4xx/5xx answer becomes an `error` event; a cut
                        stream raises.
* `record_routing_stats` (called by Serve every stats period) returns the engine's GET
                        /v1/replayssm/load JSON (running, waiting,
                        free_slots, total_slots, batch_size, cached_prefixes) plus the engine's
                        `replayssm:` / `sglang:` Prometheus samples, fetched on each call. An
                        engine without that route (SGLang answers 404) is asked SGLang's GET
                        /v1/loads instead (running, waiting and total_slots from its
                        max_running_requests; `sglang_load`); one with neither is not polled again.
* `ready`               whether the engine process runs (the router's /health).
* `check_health`        fails when the engine process died or stops answering /health, so Serve
                        replaces the replica (and the engine with it).

A replica whose node's raylet dies (a node lost while its machine runs on) is dead to Ray, but Ray
2.60 leaves its worker process running: `watch_raylet` stops the engine and ends the process, so the
engine's GPU memory and port are not held by an orphan.

Replica-side metrics go through `ray.serve.metrics` (exported on Ray's metrics port).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, AsyncIterator

import httpx
from ray import serve
from ray.serve import metrics as serve_metrics

from .engine_http import open_engine_stream
from .engine_process import EngineProcess
from .resume import EXACT_ENGINES, attempt_body

LOAD_FIELDS = ("running", "waiting", "free_slots", "total_slots", "batch_size")
LOAD_ROUTES = ("/v1/replayssm/load", "/v1/loads")   # ours, then SGLang's (sglang_load reads it)
ENGINE_METRIC_PREFIXES = ("replayssm:", "replayssm_", "sglang:")


class EngineStreamCut(RuntimeError):
    """The engine closed a stream without its end marker (it died or was killed)."""


class EngineReplica:
    def __init__(self, engine: str = "native", engine_argv: list[str] | None = None,
                 startup_timeout_s: float = 600.0, log_dir: str | None = None, health_timeout_s: float = 24.0):
        ctx = serve.get_replica_context()
        # how long a health check waits for the engine's /health: a busy or briefly stalled engine whose process
        # runs is not dead (serve_app passes most of the deployment's health_check_timeout_s)
        self.health_timeout_s = float(health_timeout_s)
        self.replica_id = ctx.replica_id.unique_id
        log_path = None
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            log_path = os.path.join(log_dir, f"engine-{self.replica_id}.log")
        env = dict(os.environ, SGLANG_REPLAYSSM_REPLICA=self.replica_id)  # names the engine's processes
        self.engine = EngineProcess(engine, engine_argv or [], startup_timeout_s, log_path, env=env).start()
        self._client: httpx.AsyncClient | None = None
        self._load: dict[str, Any] = {}
        self._engine_samples: list[list] = []
        self._seq = 0
        self._load_routes = list(LOAD_ROUTES)   # those the engine has not answered 404 to
        self._inflight = 0
        self._m_requests = serve_metrics.Counter(
            "replayssm_replica_requests", description="requests finished by this replica",
            tag_keys=("outcome",))
        self._m_tokens = serve_metrics.Counter(
            "replayssm_replica_generated_tokens", description="tokens streamed by this replica")
        self._m_reconnects = serve_metrics.Counter(
            "replayssm_replica_engine_reconnects",
            description="requests sent again on a new connection: the engine had closed the kept-alive one")
        self._m_load = {f: serve_metrics.Gauge(f"replayssm_replica_engine_{f}",
                                               description=f"engine-reported {f}") for f in LOAD_FIELDS}
        self._m_inflight = serve_metrics.Gauge(
            "replayssm_replica_inflight", description="requests being served by this replica")
        self._m_engine_up = serve_metrics.Gauge(
            "replayssm_replica_engine_up", description="1 while the engine process answers /health")
        self._m_engine_up.set(1)
        watch_raylet(self.engine)


    # -- plumbing -------------------------------------------------------------------------
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.engine.url, timeout=httpx.Timeout(None, connect=10.0),
                limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256))
        return self._client

    async def _poll_engine(self) -> None:
        """Refresh the engine's load report and its Prometheus samples."""
        client = self._http()
        load: dict[str, Any] = {}
        for route in list(self._load_routes):
            try:
                r = await client.get(route, params={"include": "core"} if route == "/v1/loads" else None,
                                     timeout=5.0)
                if r.status_code == 404:   # not this engine's route: never asked again
                    self._load_routes.remove(route)
                    continue
                if r.status_code == 200:
                    load = r.json() if route == LOAD_ROUTES[0] else sglang_load(r.json())
            except (httpx.HTTPError, ValueError, TypeError, KeyError):
                load = {}
            break
        if not load:  # no answer (a busy or stopped engine, or none of the routes): what this replica sees,
            # keeping the slot count last reported (the policy's target batch would jump to its default)
            load = {"running": self._inflight, "waiting": 0}
            if "total_slots" in self._load:
                load["total_slots"] = self._load["total_slots"]
        self._load = load
        for f in LOAD_FIELDS:
            v = load.get(f)
            if isinstance(v, (int, float)):
                self._m_load[f].set(v)
        self._m_inflight.set(self._inflight)
        try:
            r = await client.get("/metrics", timeout=5.0)
            if r.status_code == 200:
                self._engine_samples = parse_engine_metrics(r.text)
        except (httpx.HTTPError, ValueError):
            pass
        self._seq += 1

    # -- Serve hooks ------------------------------------------------------------------------
    async def record_routing_stats(self) -> dict[str, Any]:
        """Called by the Serve controller every request_routing_stats_period_s."""
        await self._poll_engine()
        stats = dict(self._load)
        stats["replica"] = self.replica_id
        stats["inflight"] = self._inflight
        stats["seq"] = self._seq
        stats["engine_metrics"] = self._engine_samples
        stats["time"] = time.time()
        return stats

    async def check_health(self):
        if not self.engine.alive():
            self._m_engine_up.set(0)
            raise RuntimeError(f"engine process of replica {self.replica_id} exited")
        try:
            r = await self._http().get("/health", timeout=self.health_timeout_s)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        self._m_engine_up.set(1 if ok else 0)
        if not ok:
            raise RuntimeError(f"engine of replica {self.replica_id} does not answer /health")

    async def ready(self) -> bool:
        """Whether this replica's engine process runs (the router's /health asks one replica)."""
        return self.engine.alive()

    async def models(self) -> dict[str, Any]:
        r = await self._http().get("/v1/models", timeout=30.0)
        r.raise_for_status()
        return r.json()

    async def generate(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream one OpenAI request (payload: path, kind, body, sent) through the engine."""
        client = self._http()
        body = attempt_body(payload["kind"], payload["body"], self.engine.engine, payload.get("sent"))
        keep_ids = bool(payload["body"].get("return_token_ids"))   # the client asked for them too
        yield {"type": "meta", "replica": self.replica_id, "exact_resume": self.engine.engine in EXACT_ENGINES}
        self._inflight += 1
        outcome = "cut"
        try:
            async with contextlib.AsyncExitStack() as stack:
                resp, reconnects = await open_engine_stream(stack, client, payload["path"], body, self.engine.alive)
                if reconnects:
                    self._m_reconnects.inc(reconnects)
                if resp.status_code != 200:
                    body = (await resp.aread()).decode("utf-8", "replace")
                    outcome = "error"
                    yield {"type": "error", "status": resp.status_code, "body": body}
                    return
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        outcome = "ok"
                        yield {"type": "done"}
                        return
                    chunk = json.loads(data)
                    ids = None
                    for c in chunk.get("choices") or ():
                        if isinstance(c, dict) and "token_ids" in c:
                            ids = (ids or []) + list(c["token_ids"] if keep_ids else c.pop("token_ids"))
                    if _chunk_text(chunk):
                        self._m_tokens.inc()
                    yield {"type": "chunk", "data": chunk, "token_ids": ids}
            raise EngineStreamCut(f"engine of replica {self.replica_id} ended the stream without [DONE]")
        finally:
            self._inflight -= 1
            self._m_requests.inc(tags={"outcome": outcome})

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()


def _start_time(pid: int) -> str | None:
    """The start time of a live process (None: gone, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]
    except (OSError, IndexError):
        return None


def watch_raylet(engine: EngineProcess, period_s: float = 1.0) -> None:
    """A daemon thread: once this node's raylet (RAY_RAYLET_PID, which Ray sets in its workers) is gone,
    stop the engine and exit this worker process. Linux only (/proc); a no-op elsewhere."""
    import threading

    pid = os.environ.get("RAY_RAYLET_PID", "")
    started = _start_time(int(pid)) if pid.isdigit() else None
    if started is None:
        return

    def run():
        while _start_time(int(pid)) == started:
            time.sleep(period_s)
        try:
            engine.stop(timeout=5.0)
        finally:
            os._exit(1)

    threading.Thread(target=run, name="raylet-watch", daemon=True).start()


def sglang_load(report: dict[str, Any]) -> dict[str, Any]:
    """SGLang's GET /v1/loads answer ({"loads": [{"num_running_reqs", "num_waiting_reqs",
    "max_running_requests", ...} per data-parallel rank]}) as our load report's fields."""
    ranks = [d for d in report.get("loads") or () if isinstance(d, dict)]
    running = sum(int(d.get("num_running_reqs") or 0) for d in ranks)
    total = sum(int(d.get("max_running_requests") or 0) for d in ranks)
    out = {"running": running, "waiting": sum(int(d.get("num_waiting_reqs") or 0) for d in ranks)}
    if total > 0:
        out |= {"total_slots": total, "free_slots": max(0, total - running)}
    return out


def _chunk_text(chunk: dict[str, Any]) -> str:
    for c in chunk.get("choices") or ():
        if "text" in c and c["text"]:
            return c["text"]
        delta = c.get("delta") or {}
        if delta.get("content"):
            return delta["content"]
    return ""


def parse_engine_metrics(text: str) -> list[list]:
    """The engine's `replayssm:` samples as [name, labels, value, type] rows (JSON-friendly)."""
    from prometheus_client.parser import text_string_to_metric_families

    rows: list[list] = []
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith(ENGINE_METRIC_PREFIXES):
            continue
        for s in fam.samples:
            rows.append([s.name, dict(s.labels), float(s.value), fam.type, fam.name])
    return rows
