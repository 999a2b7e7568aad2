"""Stopping what `launch --replicas` started (serve_app.launch_replicas): Serve's shutdown without the failure
line Ray prints on every run of it, and Ray's, whatever state a start was left in (a stop signal while it was
still starting, or a SIGTERM to the whole process group that reaches Ray's own processes too)."""
from __future__ import annotations

import logging
import time


def _local_cluster_signalled(wait_s: float) -> bool:
    """True when this process started the Ray cluster and one of Ray's own processes on it has exited, or exits
    within `wait_s`: a SIGTERM to the launcher's whole process group reaches them too (they block only SIGINT),
    and a cluster losing its dashboard and agents is in no state to stop Serve gracefully."""
    try:
        import ray

        node = ray._private.worker._global_node   # the node this driver started, None when it joined one
        procs = [p for ps in node.all_processes.values() for p in ps] if node is not None and node.head else []
        if not procs:
            return False
        deadline = time.monotonic() + wait_s
        while all(p.process.poll() is None for p in procs):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True
    except Exception:   # noqa: BLE001 - Ray internals of another version: assume it is there
        return False


def shutdown_serve(timeout_s: float = 60.0) -> None:
    """`serve.shutdown()`, without the line Ray prints on every run of it: `Task ServeController.graceful_shutdown
    failed. There are infinite retries remaining ... killed by ray.kill`. Serve's shutdown calls the controller's
    `graceful_shutdown` and waits on it while the controller stops every replica and proxy and then kills
    itself, so that call always ends with the controller killed under it, which Ray reports. Here the call
    returns at once (`wait=False`, the same steps in the controller) and the controller's exit is awaited by
    name; Serve's own shutdown is the fallback."""
    import ray
    from ray import serve

    try:
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
        from ray.serve.context import _set_global_client
    except ImportError:   # Serve internals of another version
        serve.shutdown()
        return
    try:
        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:   # Serve is not running: nothing to stop
        _set_global_client(None)
        return
    try:
        ray.get(controller.graceful_shutdown.remote(False), timeout=10)
        del controller
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
            except ValueError:   # gone: every replica and proxy stopped first
                _set_global_client(None)
                return
            time.sleep(0.2)
    except Exception as e:   # noqa: BLE001 - a controller that went away under the call, a timeout
        logging.getLogger(__name__).debug("shutdown_serve: falling back to serve.shutdown (%s)", e)
    serve.shutdown()


class Stopped(Exception):
    """A stop signal while the launcher was still starting."""


def stop_serving(sigterm: bool) -> None:
    """Serve's shutdown (quiet, `shutdown_serve`) and Ray's, whatever state a start was left in. After a SIGTERM
    the Ray cluster this command started may be going down with it (a SIGTERM to the process group): then Serve
    is not asked (it could not answer), and `ray.shutdown` ends what is left of the cluster, the replicas and
    (through their guards) the engines with it."""
    import ray

    if not ray.is_initialized():
        return
    if not _local_cluster_signalled(wait_s=1.0 if sigterm else 0.0):
        shutdown_serve()
    ray.shutdown()
