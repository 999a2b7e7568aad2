"""A multi-node Ray cluster on one machine, every node on 127.0.0.1: try multi-node serving (and test it).

    python -m sglang_replayssm.scheduler.local_cluster --port 6379 --workers 2

starts a head node (no CPUs: the engine replicas, which reserve CPUs, go to the workers; Serve's
controller, its HTTP proxy and our router need none) and N worker nodes, each with `--worker-cpus`
CPUs and a custom resource naming it (`worker-1`, `worker-2`, ...), as separate raylets with their own
processes, object stores and metrics ports. It prints one line per node (name, raylet PID, metrics
address) and the path of the cluster's Prometheus service-discovery file, then waits; Ctrl-C (or
SIGTERM) stops every node it started. Ray's dashboard writes that file (`prom_metrics_service_discovery.json`
in the session folder: every live node's metrics address, for Prometheus' `file_sd_configs`); without
the dashboard (the default here) this process runs Ray's writer of it,
`ray._private.metrics_agent.PrometheusServiceDiscoveryWriter`, itself. Join it with `python -m sglang_replayssm.launch --replicas N
--ray-address 127.0.0.1:PORT`. Killing one worker's raylet (its PID is printed) is a node loss;
SIGUSR1 to this process (`kill -USR1 PID`, its PID is printed too) brings every lost worker node back:
what is left of it is stopped and a new node starts with the same name, CPUs and resource (a new raylet
PID and metrics port, printed as at the start), as a machine that rebooted and ran `ray start
--address` again would.

Ray's `ray start` cannot do this on 127.0.0.1 alone: it either maps 127.0.0.1 to the machine's interface
address or, in its single-machine mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which keeps everything on
loopback), refuses worker nodes. This uses Ray's own multi-node test harness, `ray.cluster_utils.Cluster`,
in single-machine mode. On real machines use `ray start` (docs/scheduler.md, "Multi-node").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading

from ..argparsing import Parser
from . import loopback

HOST = "127.0.0.1"
# One machine: a dead raylet refuses the GCS' health check at once, so 5 missed checks 1 s apart (Ray's
# default: 3 s apart) declare a node dead; metrics are reported every 2 s (Ray's default: 10 s).
SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5,
                 "metrics_report_interval_ms": 2000}


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m sglang_replayssm.scheduler.local_cluster",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=6379, help="the head's GCS port, the --ray-address to join (default 6379)")
    p.add_argument("--workers", type=int, default=2, help="worker nodes (default 2)")
    p.add_argument("--worker-cpus", type=float, default=2, help="CPUs each worker node offers to replicas (default 2)")
    p.add_argument("--dashboard-port", type=int, default=0,
                   help="serve Ray's dashboard on 127.0.0.1:PORT (default 0: no dashboard, ~0.9 GB less memory)")
    p.add_argument("--temp-dir", default=None,
                   help="Ray's temp folder (default: Ray's, /tmp/ray); the cluster's address file goes there too")
    return p


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
            return True
        except OSError:
            return False


def check_args(ns: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    if not 1024 <= ns.port <= 65535:
        p.error(f"--port: must be in 1024..65535, got {ns.port}")
    if not _free(ns.port):
        p.error(f"--port: {HOST}:{ns.port} is already in use")
    if ns.dashboard_port and (not 1024 <= ns.dashboard_port <= 65535 or not _free(ns.dashboard_port)):
        p.error(f"--dashboard-port: {HOST}:{ns.dashboard_port} is in use or not a port (0 turns the dashboard off)")
    if ns.workers < 1:
        p.error(f"--workers: must be >= 1, got {ns.workers}")
    if not ns.worker_cpus >= 0:
        p.error(f"--worker-cpus: must be >= 0, got {ns.worker_cpus}")


@contextlib.contextmanager
def address_file_in(temp_dir: str):
    """Ray's Cluster writes the head's address to `ray_current_cluster` in Ray's *default* temp folder
    (`$RAY_TMPDIR/ray`, else /tmp/ray), which need not exist when --temp-dir points elsewhere (it then failed with
    FileNotFoundError). Within this block it goes to `temp_dir/ray_current_cluster`, where `ray start --temp-dir`
    writes it too: nothing is written outside the folder the user chose."""
    import ray._private.utils as ray_utils

    write = ray_utils.write_ray_address

    def write_here(address, temp_dir_arg=None):
        write(address, temp_dir_arg or temp_dir)

    ray_utils.write_ray_address = write_here
    try:
        yield
    finally:
        ray_utils.write_ray_address = write


def start(ns: argparse.Namespace):
    """The running Cluster and its nodes: (name, ray._private.node.Node, resources offered) each, the head first."""
    loopback.enable()   # before ray is imported: every node keeps 127.0.0.1
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.cluster_utils import Cluster

    head_args = {"node_ip_address": HOST, "gcs_server_port": ns.port, "num_cpus": 0,
                 "include_dashboard": bool(ns.dashboard_port), "_system_config": SYSTEM_CONFIG}
    if ns.dashboard_port:
        head_args |= {"dashboard_host": HOST, "dashboard_port": ns.dashboard_port}
    if not ns.temp_dir:
        cluster = Cluster(initialize_head=True, head_node_args=head_args)
    else:
        os.makedirs(ns.temp_dir, exist_ok=True)
        head_args["temp_dir"] = ns.temp_dir
        with address_file_in(ns.temp_dir):
            cluster = Cluster(initialize_head=True, head_node_args=head_args)
    nodes = [("head", cluster.head_node, {"CPU": 0})]
    for i in range(1, ns.workers + 1):
        name = f"worker-{i}"
        res = {name: 1}
        nodes.append((name, cluster.add_node(node_ip_address=HOST, num_cpus=ns.worker_cpus, resources=res),
                      {"CPU": ns.worker_cpus, **res}))
    return cluster, nodes


def describe(name: str, node, res: dict) -> dict:
    return {"name": name, "raylet_pid": raylet(node).pid, "metrics": f"{HOST}:{node.metrics_export_port}",
            "resources": res}


def raylet(node):
    return node.all_processes["raylet"][0].process


def node_line(n: dict) -> str:
    return (f"  node {n['name']}: raylet pid {n['raylet_pid']}, metrics {n['metrics']}, "
            f"resources {json.dumps(n['resources'])}")


def rejoin_lost(cluster, nodes: list, ns: argparse.Namespace) -> list[int]:
    """Start every worker node whose raylet exited again, in place (same name, CPUs and custom resource):
    the rest of the lost node's processes are stopped (`Cluster.remove_node`) and a new node joins the
    head's GCS (`Cluster.add_node`, which returns once the GCS lists it alive). Returns the indices in
    `nodes` of the nodes it started."""
    started = []
    for i, (name, node, res) in enumerate(nodes):
        if name == "head" or raylet(node).poll() is None:
            continue
        cluster.remove_node(node, allow_graceful=False)
        custom = {k: v for k, v in res.items() if k != "CPU"}
        nodes[i] = (name, cluster.add_node(node_ip_address=HOST, num_cpus=ns.worker_cpus, resources=custom), res)
        started.append(i)
    return started


def main(argv: list[str] | None = None) -> int:
    p = parser()
    ns = p.parse_args(argv)
    check_args(ns, p)
    cluster, nodes = start(ns)
    session = cluster.head_node.get_session_dir_path()
    print(f"sglang-replayssm local cluster: {len(nodes)} Ray nodes on {HOST}, GCS at {HOST}:{ns.port} "
          f"(join with --ray-address {HOST}:{ns.port}); Ctrl-C stops it, kill -USR1 {os.getpid()} "
          f"restarts lost worker nodes", flush=True)
    for n in nodes:
        print(node_line(describe(*n)), flush=True)
    if ns.dashboard_port:
        print(f"  dashboard: http://{HOST}:{ns.dashboard_port}", flush=True)
    else:   # the dashboard's module that writes the service-discovery file does not run: run it here
        from ray._private.metrics_agent import PrometheusServiceDiscoveryWriter

        writer = PrometheusServiceDiscoveryWriter(cluster.address, cluster.head_node.get_temp_dir_path(), session)
        writer.daemon = True
        writer.start()
    print(f"  Prometheus file_sd: {os.path.join(session, 'prom_metrics_service_discovery.json')}", flush=True)
    stop, rejoin, wake = threading.Event(), threading.Event(), threading.Event()

    def on(event):
        return lambda *_: (event.set(), wake.set())

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on(stop))
    signal.signal(signal.SIGUSR1, on(rejoin))
    while not stop.is_set():
        wake.wait()
        wake.clear()
        if rejoin.is_set() and not stop.is_set():
            rejoin.clear()
            started = rejoin_lost(cluster, nodes, ns)
            for i in started:
                print(node_line(describe(*nodes[i])), flush=True)
            print(f"  rejoined: {len(started)} lost worker node(s)", flush=True)
    cluster.shutdown()
    print("sglang-replayssm local cluster: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
