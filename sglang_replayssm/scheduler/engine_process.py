"""Start one engine (native or SGLang) as a child process on 127.0.0.1 and a free port.

The engine is whatever `python -m sglang_replayssm.launch --engine ENGINE --host 127.0.0.1
--port P [engine args]` starts; this module only knows its HTTP surface (GET /health,
GET /v1/replayssm/load, GET /metrics, the OpenAI routes). The engine runs under a small guard
process (`engine_guard.py`, its own process group) that kills the whole group as soon as the parent
(the Ray replica) is gone, so a killed replica never leaves an orphan engine behind.
Pure standard library.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Sequence

ENGINES = ("native", "sglang")


class EngineStartError(RuntimeError):
    pass


# Where free_port looks: above Ray's worker ports (10002-19999 by default) and below the kernel's ephemeral range
PORT_FLOOR = 20000
RESERVED_PORTS = frozenset({30000})   # the launcher's and SGLang's default server port


def _ephemeral_floor() -> int:
    """The first port of the kernel's ephemeral range (outgoing connections and bind(0) take ports from it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port for a server that binds it later (an engine binds its port seconds after this, once its
    imports are done). It is drawn at random below the kernel's ephemeral range and above Ray's worker ports: a port
    from the ephemeral range (what bind(0) returns) could meanwhile become one end of any process's outgoing
    connection or another bind(0), and Ray's processes open many. The engine would then fail to bind its port, or
    this replica would find another server answering on it."""
    floor = _ephemeral_floor()
    rng = random.SystemRandom()
    for _ in range(200 if floor - PORT_FLOOR > 1000 else 0):
        port = rng.randrange(PORT_FLOOR, floor)
        if port in RESERVED_PORTS:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:   # no free port there: the kernel's choice
        s.bind((host, 0))
        return s.getsockname()[1]


def api_key_from_argv(argv: Sequence[str]) -> str | None:
    """The value of the last `--api-key K` / `--api-key=K` in an engine's arguments, or None."""
    key = None
    for i, a in enumerate(argv):
        if a == "--api-key" and i + 1 < len(argv):
            key = argv[i + 1]
        elif a.startswith("--api-key="):
            key = a[len("--api-key="):]
    return key


def engine_command(engine: str, port: int, engine_argv: Sequence[str], host: str = "127.0.0.1") -> list[str]:
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {ENGINES}, got {engine!r}")
    for flag in ("--host", "--port", "--engine", "--replicas", "--ray-address"):
        if any(a == flag or a.startswith(flag + "=") for a in engine_argv):
            raise ValueError(f"engine arguments must not contain {flag} (the replica sets it)")
    extra = []
    if engine == "native" and not any(a == "--drain-timeout" or a.startswith("--drain-timeout=") for a in engine_argv):
        # the guard stops the engine when its replica goes (SIGTERM): its streams then end at once with a 503, which
        # the router resumes on another replica, instead of draining through a replica that is going away (Serve
        # itself lets a replica it stops finish its requests first, graceful_shutdown_timeout_s)
        extra = ["--drain-timeout", "0"]
    return [sys.executable, "-m", "sglang_replayssm.launch", "--engine", engine,
            "--host", host, "--port", str(port), *engine_argv, *extra]


class EngineProcess:
    """One engine (in its own process group, under engine_guard); `url` once `start()` returned."""

    def __init__(self, engine: str, engine_argv: Sequence[str], startup_timeout_s: float = 600.0,
                 log_path: str | None = None, env: dict | None = None):
        self.engine = engine
        self.engine_argv = list(engine_argv)
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path
        self.env = env
        self.port: int | None = None
        self.pgid: int | None = None
        self._lifeline: int | None = None  # write end of the guard's lifeline pipe

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "EngineProcess":
        self.port = free_port()
        cmd = engine_command(self.engine, self.port, self.engine_argv)
        read_end, self._lifeline = os.pipe()
        guard = [sys.executable, "-m", "sglang_replayssm.scheduler.engine_guard", str(read_end), "--", *cmd]
        log = open(self.log_path, "ab") if self.log_path else None
        try:
            launcher = subprocess.Popen(guard, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, pass_fds=(read_end,),
                                        start_new_session=True, env=self.env)
        finally:
            os.close(read_end)
            if log is not None:
                log.close()
        self.pgid = launcher.pid  # session leader; the detached guard and the engine stay in its group
        launcher.wait()           # the guard detaches at once
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if not self.alive():
                raise EngineStartError(
                    f"engine exited before becoming healthy: {' '.join(cmd)}"
                    + (f" (log: {self.log_path}; last lines:\n{self._tail()})" if self.log_path else ""))
            if self.healthy(timeout=2.0):
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise EngineStartError(f"engine not healthy after {self.startup_timeout_s:.0f}s: {' '.join(cmd)}")
            time.sleep(0.2)

    def _tail(self, n: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        """True while the engine's process group (guard + engine) exists."""
        if self.pgid is None:
            return False
        try:
            os.killpg(self.pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def healthy(self, timeout: float = 5.0) -> bool:
        if not self.alive():
            return False
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=timeout) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self, timeout: float = 15.0) -> None:
        """Close the lifeline (the guard stops the engine), then make sure the group is gone."""
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self.pgid is None:
            return
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.alive():
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
