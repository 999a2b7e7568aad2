"""Joining (or starting) the Ray cluster for `launch --replicas N`, with clear errors.

`connect_ray(opts)` (opts: serve_app.SchedulerOptions): no --ray-address starts a local cluster (on
127.0.0.1 when --host is loopback, loopback.py); HOST:PORT / ray://HOST:PORT must answer TCP first;
a loopback address of a cluster listening on loopback only is joined with the driver's node IP kept
at 127.0.0.1 (`loopback_join_ip`); joining is given up after --ray-connect-timeout. `check_capacity`
compares the replicas' CPUs/GPUs with the cluster's. Importing this module does not import ray.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Any

from ..http_front.browser_guard import LOOPBACK_HOSTS
from . import loopback as loopback_mod
from .errors import SchedulerError


def check_port_free(host: str, port: int) -> None:
    """SchedulerError naming --port (or --host) when the router could not listen on host:port."""
    import errno

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise SchedulerError("--port", f"{host}:{port} is already in use") from None
            raise SchedulerError("--host", f"cannot listen on {host}:{port} ({e.strerror or e})") from None


def _tcp_reachable(host: str, port: int, timeout: float = 3.0) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return str(e) or type(e).__name__


def _split_host_port(addr: str, flag: str):
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise SchedulerError(flag, f"expected auto, HOST:PORT or ray://HOST:PORT, got {addr!r}")
    return host.strip("[]"), int(port)


def _interface_ip() -> str | None:
    """The address this machine reaches other hosts from (what Ray advertises by default); no packet
    is sent. None without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("8.8.8.8", 53))
            return s.getsockname()[0]
        except OSError:
            return None


def loopback_join_ip(host: str, port: int, iface: str | None = None) -> str | None:
    """The node IP a driver must announce to join the cluster whose GCS is at loopback host:port, or
    None when Ray's own address resolution works.

    Ray rewrites a loopback bootstrap address (127.0.0.1, localhost, ::1) to the machine's interface
    address (`iface`, default: found here) before connecting. A cluster whose nodes were started on
    127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, e.g. local_cluster.py) listens on loopback only, so
    the rewritten address is never answered (GCS time-outs for minutes). Such a cluster is recognised by
    its GCS answering on loopback but not on the interface address; its driver then keeps the loopback
    address and announces it as its node IP."""
    if host not in LOOPBACK_HOSTS:
        return None
    join = "::1" if host == "::1" else "127.0.0.1"
    iface = _interface_ip() if iface is None else iface
    if iface and iface != join and _tcp_reachable(iface, port, timeout=1.0) is None:
        return None   # the GCS listens beyond loopback: its nodes advertise the interface address
    return join


def _init_with_deadline(kw: dict[str, Any], timeout_s: float, addr: str) -> None:
    """ray.init(**kw) with a deadline: Ray retries a GCS that does not answer for minutes. Past the
    deadline a watchdog prints the --ray-address error and ends the process (exit 2); ray.init itself
    stays in the main thread (Ray installs its signal handlers there)."""
    import ray

    def give_up():
        err = SchedulerError("--ray-address", f"no Ray cluster answered at {addr} within {timeout_s:g} s "
                             "(--ray-connect-timeout); HOST:PORT must be the GCS of a cluster this machine is a "
                             "node of (`ray start --address=...` here first), ray://HOST:10001 connects from outside")
        print(f"error: {err}", file=sys.stderr, flush=True)
        os._exit(2)   # ray.init still retries in the main thread, and Ray's exit hooks would wait for it

    watchdog = threading.Timer(timeout_s, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        ray.init(**kw)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SchedulerError("--ray-address", f"cannot connect to the Ray cluster at {addr!r}: {first}") from None
    finally:
        watchdog.cancel()


def connect_ray(opts) -> None:
    """Join the cluster named by --ray-address, or start a local one; clear errors otherwise (within
    --ray-connect-timeout seconds when the address answers but no cluster joins)."""
    addr = opts.ray_address
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    loopback = opts.host in LOOPBACK_HOSTS
    local = addr in (None, "", "local")
    join_ip = None
    if not local and addr != "auto":
        client = addr.startswith("ray://")
        target = addr[len("ray://"):] if client else addr
        host, port = _split_host_port(target, "--ray-address")
        why = _tcp_reachable(host, port)
        if why is not None:
            raise SchedulerError("--ray-address", f"cannot reach the Ray cluster at {addr} ({why}); "
                                 "start it with `ray start --head` or fix the address")
        join_ip = None if client else loopback_join_ip(host, port)
    if (local and loopback) or join_ip:
        loopback_mod.enable()   # Ray keeps 127.0.0.1 as the node address (before ray is imported)
    import ray

    if ray.is_initialized():
        return
    if local:
        kw: dict[str, Any] = dict(address="local", include_dashboard=False, log_to_driver=False)
        if loopback:
            kw["_node_ip_address"] = "127.0.0.1"
            kw["runtime_env"] = {"worker_process_setup_hook": loopback_mod.HOOK}
        if opts.ray_metrics_port:
            kw["_metrics_export_port"] = int(opts.ray_metrics_port)
        ray.init(**kw)
        return
    kw = dict(address=addr, log_to_driver=False)
    if join_ip:
        kw["_node_ip_address"] = join_ip
        kw["runtime_env"] = {"worker_process_setup_hook": loopback_mod.HOOK}
    _init_with_deadline(kw, opts.ray_connect_timeout_s, addr)


def check_capacity(opts) -> None:
    import ray

    res = ray.cluster_resources()
    for key, per, flag in (("GPU", opts.replica_num_gpus, "--replica-num-gpus"),
                           ("CPU", opts.replica_num_cpus, "--replica-num-cpus")):
        need = per * opts.replicas
        have = float(res.get(key, 0.0))
        if need > have:
            raise SchedulerError("--replicas", f"{opts.replicas} replicas x {per:g} {key} ({flag}) need {need:g} "
                                 f"{key}, the Ray cluster has {have:g}")
