"""Keep a single-machine Ray Serve deployment on 127.0.0.1.

Two things make Ray listen beyond loopback on one machine even with a loopback node address:
1. Ray maps a node address of 127.0.0.1 back to the machine's interface address unless its
   single-machine mode is on (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, read when ray is imported and
   inherited by the GCS, raylet and agents): `enable()` sets it.
2. Ray Serve 2.60 starts an inter-deployment gRPC server in every replica bound to the hard-coded
   wildcard `[::]:0` (ray/serve/_private/replica.py, `_on_initialized`). `patch_serve_grpc_bind` is
   a Ray `worker_process_setup_hook` that rebinds it to 127.0.0.1; routing never uses that server
   unless RAY_SERVE_USE_GRPC_BY_DEFAULT=1, and then it is reached at the node address, 127.0.0.1.
"""

from __future__ import annotations

import os
import sys

HOOK = "sglang_replayssm.scheduler.loopback.patch_serve_grpc_bind"


def enable() -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    mod = sys.modules.get("ray._private.ray_constants")
    if mod is not None:
        mod.ENABLE_RAY_CLUSTER = False


def patch_serve_grpc_bind() -> None:
    try:
        from ray.serve._private import replica as serve_replica
    except Exception:
        return
    orig = getattr(serve_replica, "add_port_to_grpc_server", None)
    if orig is None or getattr(orig, "_replayssm_loopback", False):
        return

    def add_port(server, address):
        if isinstance(address, str) and address.startswith("[::]:"):
            address = "127.0.0.1:" + address[len("[::]:"):]
        return orig(server, address)

    add_port._replayssm_loopback = True
    serve_replica.add_port_to_grpc_server = add_port
