"""Ray Serve scale-out: engine replicas behind a cache- and load-aware OpenAI router.

Importing this package does not import ray (launch.py imports it on every start); the Ray parts
load when `launch_replicas` runs. See docs/scheduler.md ("Distributed serving").
"""

from __future__ import annotations


def launch_replicas(args) -> int:
    """Start (or join) a Ray cluster and serve N engine replicas behind the router. Blocks."""
    from .serve_app import launch_replicas as _launch

    return _launch(args)


def add_scheduler_args(parser, include_common: bool = False):
    from .serve_app import add_scheduler_args as _add

    return _add(parser, include_common)


def __getattr__(name):
    if name in ("SchedulerError", "SchedulerOptions", "options_from_args", "start", "build_app", "connect_ray"):
        from . import serve_app

        return getattr(serve_app, name)
    raise AttributeError(name)
