"""Build and run the Ray Serve application: N engine replicas behind the ReplaySSM router.

    python -m sglang_replayssm.launch --replicas N [--ray-address auto|HOST:PORT|ray://HOST:PORT] \
        [--host H --port P] [scheduler flags] [engine flags]

`launch_replicas(args)` is what launch.py calls. It is tolerant of how args were parsed: it reads
replicas / ray_address / host / port / engine / engine_argv when present, and pulls the scheduler
flags below out of `engine_argv` itself if launch.py did not define them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Sequence

from ..argparsing import Parser
from ..http_front.body_limit import MAX_REQUEST_BYTES, limit_error
from ..http_front.browser_guard import LOOPBACK_HOSTS
from .engine_process import ENGINES
from .errors import SchedulerError
from .policy import POLICIES, SPILLS, PolicyConfig
from .ray_join import check_capacity, check_port_free, connect_ray
from .serve_stop import Stopped, stop_serving

APP_NAME = "replayssm"
ENGINE_DEPLOYMENT = "ReplaySSMEngine"
ROUTER_DEPLOYMENT = "ReplaySSMRouter"
ROUTER_CLASS = "sglang_replayssm.scheduler.request_router:ReplaySSMRouter"
# a native engine's own --max-request-bytes: the router's limit plus room for what the replica adds to a body
# (stream options, and on a resumed attempt the token ids already delivered)
ENGINE_BODY_HEADROOM = 1 << 20
HEAD_NODE_RESOURCE = "node:__internal_head__"   # the head node's resource (ray._common.constants.HEAD_NODE_RESOURCE_NAME)


@dataclasses.dataclass
class SchedulerOptions:
    replicas: int = 1
    ray_address: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    engine: str = "native"
    engine_argv: list[str] = dataclasses.field(default_factory=list)
    replica_num_cpus: float = 1.0
    replica_num_gpus: float = 0.0
    replica_max_ongoing: int = 256
    router_max_ongoing: int = 4096
    health_check_period_s: float = 2.0
    health_check_timeout_s: float = 30.0
    stats_period_s: float = 1.0
    startup_timeout_s: float = 900.0
    ray_connect_timeout_s: float = 30.0
    # --autoscale MIN:MAX: Serve's autoscaling_config (replicas from MIN to MAX, starting at `replicas`)
    autoscale: tuple[int, int] | None = None
    autoscale_target: int | None = None          # ongoing requests per replica (None: the engine's slots)
    autoscale_delays: tuple[float, float] = (10.0, 60.0)   # seconds above / below target before scaling
    max_retries: int = 3
    log_dir: str | None = None
    ray_metrics_port: int | None = None
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    # Serve request router class; benchmarks swap in Serve's stock power-of-two router as a baseline
    request_router_class: str = ROUTER_CLASS
    # --api-key: the router's /v1 routes need `Authorization: Bearer <key>`; every engine gets --api-key too
    api_key: str | None = dataclasses.field(default=None, repr=False)
    # --max-request-bytes: larger bodies are the router's 413; native engines get this plus ENGINE_BODY_HEADROOM
    max_request_bytes: int = MAX_REQUEST_BYTES

    def validate(self) -> "SchedulerOptions":
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise SchedulerError("--replicas", f"must be an integer >= 1, got {self.replicas!r}")
        if self.engine not in ENGINES:
            raise SchedulerError("--engine", f"must be one of {ENGINES}, got {self.engine!r}")
        if not (0 < int(self.port) < 65536):
            raise SchedulerError("--port", f"must be in 1..65535, got {self.port!r}")
        if self.replica_num_cpus < 0:
            raise SchedulerError("--replica-num-cpus", f"must be >= 0, got {self.replica_num_cpus}")
        if self.replica_num_gpus < 0:
            raise SchedulerError("--replica-num-gpus", f"must be >= 0, got {self.replica_num_gpus}")
        if self.replica_max_ongoing < 1:
            raise SchedulerError("--replica-max-ongoing", f"must be >= 1, got {self.replica_max_ongoing}")
        if not 0 < self.ray_connect_timeout_s < float("inf"):
            raise SchedulerError("--ray-connect-timeout", f"must be a number of seconds > 0, got {self.ray_connect_timeout_s}")
        if self.autoscale is not None:
            lo, hi = self.autoscale
            if not 1 <= lo <= hi:
                raise SchedulerError("--autoscale", f"MIN:MAX needs 1 <= MIN <= MAX, got {lo}:{hi}")
            if not lo <= self.replicas <= hi:
                raise SchedulerError("--replicas", f"the initial replica count {self.replicas} must lie in "
                                     f"--autoscale {lo}:{hi}")
            if self.autoscale_target is not None and self.autoscale_target < 1:
                raise SchedulerError("--autoscale-target", f"must be >= 1, got {self.autoscale_target}")
            if not all(0 <= d < float("inf") for d in self.autoscale_delays):
                raise SchedulerError("--autoscale-delays", f"UP:DOWN must be seconds >= 0, got {self.autoscale_delays}")
        if self.max_retries < 0:
            raise SchedulerError("--max-retries", f"must be >= 0, got {self.max_retries}")
        why = limit_error(self.max_request_bytes)
        if why:
            raise SchedulerError("--max-request-bytes", why)
        from ..http_front.auth import check_key   # standard library only

        why = check_key(self.api_key) if self.api_key is None or isinstance(self.api_key, str) else "must be a string"
        if why:
            raise SchedulerError("--api-key", why)
        try:
            self.policy.validate()
        except ValueError as e:
            flag = str(e).split(" ", 1)[0]
            raise SchedulerError(flag, str(e).split(" ", 1)[1]) from None
        return self


def add_scheduler_args(parser: argparse.ArgumentParser, include_common: bool = False):
    """Scheduler flags. include_common adds --replicas/--ray-address/--host/--port/--engine too."""
    g = parser.add_argument_group("Ray Serve replicas (with --replicas N)")
    if include_common:
        g.add_argument("--replicas", type=int, default=1)
        g.add_argument("--ray-address", default=None)
        g.add_argument("--host", default="127.0.0.1")
        g.add_argument("--port", type=int, default=30000)
        g.add_argument("--engine", choices=ENGINES, default="native")
        g.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer <key>' at the router (and at every engine)")
    g.add_argument("--replica-num-cpus", type=float, default=None,
                   help="CPUs Ray reserves per replica (default 1; 0 lets replicas share CPUs)")
    g.add_argument("--replica-num-gpus", type=float, default=None,
                   help="GPUs per replica (default: 1 for --engine sglang, 0 for native and for --engine sglang --device cpu)")
    g.add_argument("--replica-max-ongoing", type=int, default=256,
                   help="requests Serve lets one replica hold at once (default 256)")
    g.add_argument("--route-policy", choices=POLICIES, default="pack",
                   help="pack: fill a replica up to --route-target-batch before using the next (default); "
                        "spread: least-loaded")
    g.add_argument("--route-target-batch", type=int, default=None,
                   help="requests per replica before spilling to another one (default: each replica's own "
                        "slot count, total_slots in its /v1/replayssm/load report or SGLang's "
                        "max_running_requests; 32 for a replica that reports neither)")
    g.add_argument("--route-imbalance-threshold", type=int, default=8,
                   help="override prefix affinity when the replica holds this many more requests than "
                        "the least loaded one (and is at its target batch) (default 8)")
    g.add_argument("--route-min-prefix-chars", type=int, default=32,
                   help="shortest cached prefix (characters) worth affinity (default 32)")
    g.add_argument("--route-spill", choices=SPILLS, default="least_loaded",
                   help="where a request goes once every replica holds --route-target-batch: least_loaded (the "
                        "replica with the fewest requests; default) or power_of_two (the less loaded of two "
                        "replicas picked at random)")
    g.add_argument("--max-retries", type=int, default=3,
                   help="times a request is re-sent after its replica failed (default 3)")
    g.add_argument("--health-check-period", type=float, default=2.0,
                   help="seconds between replica health checks (default 2)")
    g.add_argument("--replica-log-dir", default=None, help="write each engine's log here")
    g.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                   help="let Serve scale the engine replicas between MIN and MAX on load (starting at --replicas); "
                        "default: a fixed --replicas")
    g.add_argument("--autoscale-target", type=int, default=None,
                   help="with --autoscale: ongoing requests per replica Serve aims at (default: the engine's "
                        "--max-running-requests when given, else --route-target-batch, else 32)")
    g.add_argument("--autoscale-delays", default="10:60", metavar="UP:DOWN",
                   help="with --autoscale: seconds the load must stay above / below the target before a replica "
                        "is added / removed (default 10:60)")
    if "--max-request-bytes" not in parser._option_string_actions:   # launch.py's help has the engine's
        g.add_argument("--max-request-bytes", type=int, default=None,
                       help=f"largest request body the router accepts (larger: a 413 naming the limit, before any "
                            f"replica sees it); native engines get it plus {ENGINE_BODY_HEADROOM} bytes for what the "
                            f"router adds (default {MAX_REQUEST_BYTES}, 8 MiB)")
    g.add_argument("--ray-connect-timeout", type=float, default=30.0,
                   help="seconds joining the --ray-address cluster may take before it is an error (default 30)")
    g.add_argument("--ray-metrics-port", type=int, default=None,
                   help="Ray metrics export port when this command starts the Ray cluster (default: Ray's choice)")
    return g


def options_from_args(args: Any) -> SchedulerOptions:
    engine_argv = list(getattr(args, "engine_argv", None) or [])
    # Scheduler flags launch.py did not define arrive inside engine_argv: take them out (spelled out in full: an
    # abbreviation is the engine's to refuse, never taken for a scheduler flag)
    p = Parser(add_help=False)
    add_scheduler_args(p)
    sched, engine_argv = p.parse_known_args(engine_argv)
    # --api-key (launch.py leaves it in engine_argv): the router's; build_app gives it to the engines again
    keys = Parser(add_help=False)
    keys.add_argument("--api-key", default=None)
    key_ns, engine_argv = keys.parse_known_args(engine_argv)

    def pick(name, default=None):
        v = getattr(args, name, None)
        if v is None:
            v = getattr(sched, name, None)
        return default if v is None else v

    engine = pick("engine", "native")
    from ..cpu_harness import wants_cpu   # standard library only

    on_gpu = engine == "sglang" and not wants_cpu(engine_argv)   # SGLang replicas with --device cpu: the CPU harness
    gpus = pick("replica_num_gpus", 1.0 if on_gpu else 0.0)
    replicas = getattr(args, "replicas", None)
    pol = PolicyConfig(policy=pick("route_policy", "pack"), target_batch=pick("route_target_batch", None),
                       imbalance_threshold=pick("route_imbalance_threshold", 8),
                       min_prefix_chars=pick("route_min_prefix_chars", 32), spill=pick("route_spill", "least_loaded"))
    return SchedulerOptions(
        replicas=replicas, ray_address=getattr(args, "ray_address", None),
        host=getattr(args, "host", None) or "127.0.0.1", port=int(getattr(args, "port", None) or 30000),
        engine=engine, engine_argv=engine_argv, replica_num_cpus=float(pick("replica_num_cpus", 1.0)),
        replica_num_gpus=float(gpus), replica_max_ongoing=int(pick("replica_max_ongoing", 256)),
        max_retries=int(pick("max_retries", 3)), health_check_period_s=float(pick("health_check_period", 2.0)),
        log_dir=pick("replica_log_dir"), ray_metrics_port=pick("ray_metrics_port"), policy=pol,
        ray_connect_timeout_s=float(pick("ray_connect_timeout", 30.0)),
        autoscale=_pair(pick("autoscale"), int, "--autoscale", "MIN:MAX"),
        autoscale_target=_first_given(pick("autoscale_target"), _engine_slots(engine_argv), pol.target_batch),
        autoscale_delays=_pair(pick("autoscale_delays", "10:60"), float, "--autoscale-delays", "UP:DOWN"),
        api_key=key_ns.api_key if getattr(args, "api_key", None) is None else args.api_key,
        max_request_bytes=pick("max_request_bytes", MAX_REQUEST_BYTES),
    ).validate()


def _pair(text: str | None, kind, flag: str, form: str):
    """'A:B' as (kind(A), kind(B)); None stays None; SchedulerError naming the flag otherwise."""
    if text is None:
        return None
    a, sep, b = str(text).partition(":")
    try:
        if not sep:
            raise ValueError
        return kind(a), kind(b)
    except ValueError:
        raise SchedulerError(flag, f"expected {form}, got {text!r}") from None


def _first_given(*values):
    return next((v for v in values if v is not None), None)


def _engine_slots(engine_argv: Sequence[str]) -> int | None:
    """The engine's --max-running-requests (its pool slots) when the engine arguments give it."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--max-running-requests", type=int, default=None)
    try:
        return p.parse_known_args(list(engine_argv))[0].max_running_requests
    except SystemExit:
        return None


def autoscaling_config(opts: SchedulerOptions) -> dict[str, Any] | None:
    """Serve's autoscaling_config for --autoscale, or None (a fixed --replicas)."""
    if opts.autoscale is None:
        return None
    from .policy import DEFAULT_TARGET_BATCH

    up, down = opts.autoscale_delays
    return {"min_replicas": opts.autoscale[0], "max_replicas": opts.autoscale[1], "initial_replicas": opts.replicas,
            "target_ongoing_requests": opts.autoscale_target or DEFAULT_TARGET_BATCH,
            "upscale_delay_s": up, "downscale_delay_s": down, "metrics_interval_s": 1.0, "look_back_period_s": 5.0}


# -- the application -----------------------------------------------------------------------------
def build_app(opts: SchedulerOptions):
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from .ingress import RouterIngress
    from .replica import EngineReplica

    from .engine_process import api_key_from_argv

    engine_argv = list(opts.engine_argv)
    if opts.api_key is not None:   # the engines get the router's key too
        engine_argv += ["--api-key", opts.api_key]
    if opts.engine == "native" and not any(a.split("=", 1)[0] == "--max-request-bytes" for a in engine_argv):
        engine_argv += ["--max-request-bytes", str(opts.max_request_bytes + ENGINE_BODY_HEADROOM)]
    replica_cls = EngineReplica
    if api_key_from_argv(engine_argv) is not None:   # and their replicas send it (auth.py)
        from .auth import KeyedEngineReplica

        replica_cls = KeyedEngineReplica
    autoscale = autoscaling_config(opts)
    scale = {"num_replicas": opts.replicas} if autoscale is None else {"autoscaling_config": autoscale}
    engine = serve.deployment(replica_cls).options(
        name=ENGINE_DEPLOYMENT,
        **scale,
        max_ongoing_requests=opts.replica_max_ongoing,
        health_check_period_s=opts.health_check_period_s,
        health_check_timeout_s=opts.health_check_timeout_s,
        # a replica scaled down gets this long to finish its streams (the router resumes what is left)
        graceful_shutdown_timeout_s=5 if autoscale is None else 30,
        ray_actor_options={"num_cpus": opts.replica_num_cpus, "num_gpus": opts.replica_num_gpus},
        request_router_config=RequestRouterConfig(
            request_router_class=opts.request_router_class,
            request_router_kwargs=dataclasses.asdict(opts.policy) if opts.request_router_class == ROUTER_CLASS else {},
            request_routing_stats_period_s=opts.stats_period_s,
            request_routing_stats_timeout_s=10.0,
        ),
    ).bind(opts.engine, engine_argv, opts.startup_timeout_s, opts.log_dir, engine_health_timeout(opts))
    # The router runs on the head node, beside Serve's controller and its HTTP proxy (HeadOnly): losing a
    # worker node then loses engine replicas only, whose requests the router resumes elsewhere.
    router = serve.deployment(RouterIngress).options(
        name=ROUTER_DEPLOYMENT, num_replicas=1, max_ongoing_requests=opts.router_max_ongoing,
        ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE_RESOURCE: 0.001}},
    ).bind(engine, dataclasses.asdict(opts.policy), opts.max_retries, opts.api_key,
            opts.host in LOOPBACK_HOSTS, opts.max_request_bytes)
    return router


def app_builder(args: dict[str, Any]):
    """Serve application builder for config files (`import_path:
    sglang_replayssm.scheduler.serve_app:app_builder`, e.g. KubeRay's serveConfigV2). `args` are the
    SchedulerOptions fields (replicas, engine, engine_argv, replica_num_gpus, ...) plus the policy
    fields prefixed `route_` (route_policy, route_target_batch, route_imbalance_threshold,
    route_min_prefix_chars, route_spill, route_block_chars). `api_key_env: NAME` takes the router's
    API key from the environment variable NAME (e.g. set from a Kubernetes Secret) instead of the
    config file."""
    args = dict(args or {})
    key_env = args.pop("api_key_env", None)
    if key_env is not None:
        if not isinstance(key_env, str) or not os.environ.get(key_env):
            raise SchedulerError("api_key_env", f"the environment variable {key_env!r} is not set")
        args["api_key"] = os.environ[key_env]
    pol = {k[len("route_"):]: v for k, v in list(args.items()) if k.startswith("route_")}
    for k in list(args):
        if k.startswith("route_"):
            del args[k]
    fields = {f.name for f in dataclasses.fields(SchedulerOptions)}
    bad_pol = sorted(set(pol) - {f.name for f in dataclasses.fields(PolicyConfig)})
    if bad_pol:
        raise SchedulerError("route_" + bad_pol[0], "unknown routing argument")
    unknown = sorted(set(args) - fields)
    if unknown:
        raise SchedulerError(unknown[0], f"unknown argument; known: {sorted(fields - {'policy'})}")
    if isinstance(args.get("engine_argv"), str):
        args["engine_argv"] = args["engine_argv"].split()
    if "replica_num_gpus" not in args:
        args["replica_num_gpus"] = 1.0 if args.get("engine") == "sglang" else 0.0
    opts = SchedulerOptions(**args, policy=PolicyConfig(**pol)).validate()
    return build_app(opts)


class _ServeReconnectNote(logging.Filter):
    """Drops Serve's `Connecting to existing Serve app ... New http_options/controller_options will not be
    applied.`, which `serve.run` logs every time: it reconnects to the Serve instance that `start` has just
    started with our options (`serve.start`'s own line, for a Serve instance already on a joined cluster, is kept:
    there the options are indeed not applied, and Serve warns which differ)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Connecting to existing Serve app")


def start(opts: SchedulerOptions, blocking_timeout_s: float = 900.0) -> str:
    """Deploy the application on the connected Ray cluster; returns the router URL."""
    from ray import serve

    opts.validate()
    check_capacity(opts)
    serve.start(http_options={"host": opts.host, "port": opts.port}, proxy_location="HeadOnly")
    quiet = _ServeReconnectNote()
    serve_logger = logging.getLogger("ray.serve")
    serve_logger.addFilter(quiet)
    try:
        serve.run(build_app(opts), name=APP_NAME, route_prefix="/", blocking=False)
    finally:
        serve_logger.removeFilter(quiet)
    deadline = time.monotonic() + blocking_timeout_s
    while True:
        st = serve.status().applications.get(APP_NAME)
        status = str(getattr(st, "status", ""))
        if status.endswith("RUNNING"):
            break
        if status.endswith("DEPLOY_FAILED") or status.endswith("UNHEALTHY"):
            raise RuntimeError(f"Serve application failed to deploy: {getattr(st, 'message', '')}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"Serve application not running after {blocking_timeout_s:.0f}s ({status})")
        time.sleep(0.5)
    host = "127.0.0.1" if opts.host in ("0.0.0.0", "::") else opts.host
    return f"http://{host}:{opts.port}"


def ray_missing_error(e: ImportError | None = None) -> str | None:
    """The one-line error naming the extra to install when Ray Serve is missing (`e`: an ImportError met
    while importing it), else None. Without `e` it only looks for the `ray` package, importing nothing
    (connect_ray sets Ray's loopback mode before ray is first imported)."""
    import importlib.util

    if e is None and importlib.util.find_spec("ray") is not None:
        return None
    why = (str(e).splitlines()[0] if str(e) else type(e).__name__) if e is not None else "No module named 'ray'"
    return f"error: --replicas needs Ray Serve, which is not installed ({why}): pip install 'sglang-replayssm[ray]'"


def engine_health_timeout(opts: SchedulerOptions) -> float:
    """How long a replica's health check waits for its engine's /health: 80 % of Serve's health_check_timeout_s, so
    that an engine that is alive but busy or briefly stalled (a long prefill on a starved CPU) is not taken for dead
    and its streams cut, while a hung one still fails the check with our message before Serve's own timeout."""
    return 0.8 * opts.health_check_timeout_s


def engine_argv_error(opts: SchedulerOptions) -> str | None:
    """What is wrong with the replicas' engine flags, found here rather than by every replica's engine failing
    to start: a flag the engine does not know (spelled out in full: no abbreviations) or, for the native engine,
    a bad value (that one exits at once, one line). SGLang's flags are checked where SGLang is installed."""
    import importlib.util

    from ..argparsing import unknown_flags_message

    argv = list(opts.engine_argv)
    if opts.engine == "native":
        from ..launch_flags import native_parser

        parser = native_parser()
        unknown = parser.parse_known_args(argv)[1]
        add_scheduler_args(parser)   # for "did you mean": a misspelled scheduler flag lands in the engine's flags
        return unknown_flags_message(unknown, parser.known_flags()) if unknown else None
    if importlib.util.find_spec("sglang") is None:
        return None
    from ..launch_flags import sglang_flag_problems

    error, notes = sglang_flag_problems(argv)
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    return error


def launch_replicas(args: Any) -> int:
    """Entry point for `python -m sglang_replayssm.launch --replicas N ...`; blocks until SIGINT/SIGTERM.

    A bad flag or an unreachable Ray cluster prints `error: --flag: reason` and returns 2; so does a
    machine without Ray Serve (the message names the extra to install)."""
    error = ray_missing_error()
    if error is not None:
        print(error, file=sys.stderr)
        return 2
    try:
        opts = options_from_args(args)
        error = engine_argv_error(opts)
        if error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if opts.ray_address in (None, "", "local"):   # the Serve proxy will listen on this host
            check_port_free(opts.host, opts.port)
    except SchedulerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # Ctrl-C (SIGINT, to the whole process group in a terminal: Ray's own processes block it) or SIGTERM: stop
    # Serve and, if this command started it, Ray; while still starting, that start is abandoned at once
    stop, started = threading.Event(), threading.Event()
    signals: list[int] = []

    def on_signal(signum, frame):
        signals.append(signum)
        stop.set()
        if not started.is_set():
            raise Stopped()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            connect_ray(opts)
            for sig in previous:   # ray.init installs its own SIGTERM handler (a stack dump, then abort)
                signal.signal(sig, on_signal)
            check_capacity(opts)
            from ray import serve  # noqa: F401 - ray without its [serve] extra fails here
        except SchedulerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except ImportError as e:   # ray without its [serve] extra
            print(ray_missing_error(e), file=sys.stderr)
            return 2
        url = start(opts)
        started.set()
        scaling = "" if opts.autoscale is None else f" (autoscaling {opts.autoscale[0]}..{opts.autoscale[1]})"
        print(f"sglang-replayssm: {opts.replicas} {opts.engine} replica(s){scaling} behind the router at {url} "
              f"(OpenAI API under /v1, metrics at /metrics)", flush=True)
        while not stop.wait(0.5):   # (a timed wait: a signal may land on one of Ray's threads)
            pass
    except Stopped:
        started.set()   # a second signal now only sets `stop`
    finally:
        started.set()
        stop_serving(signal.SIGTERM in signals)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("sglang-replayssm: stopped", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (`python -m sglang_replayssm.scheduler`): same flags as launch.py --replicas."""
    p = Parser(prog="python -m sglang_replayssm.scheduler")
    add_scheduler_args(p, include_common=True)
    args, rest = p.parse_known_args(argv)
    args.engine_argv = rest
    return launch_replicas(args)
