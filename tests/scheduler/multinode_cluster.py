"""The multi-node cluster of test_multinode.py: docs/scheduler.md's quick start, run verbatim.

The two commands of the doc's `<!-- multinode-quickstart -->` block (a head and two worker nodes on
127.0.0.1 from `sglang_replayssm.scheduler.local_cluster`, then the launcher joining them with
`--replicas 2 --autoscale 2:3 ... --ray-address 127.0.0.1:PORT`) run as subprocesses with free ports in place of the
doc's 6379 and 8000, Ray's temp folder in a short private folder (RAY_TMPDIR: Ray's sockets live
there), and a marker in their environment by which every process they start is found and, at the end,
ended by PID if it outlived its parent's shutdown.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from sglang_replayssm.scheduler.engine_process import free_port

from .client import pids_with_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduler.md"
QUICKSTART_MARK = "<!-- multinode-quickstart -->"
DOC_GCS_PORT, DOC_ROUTER_PORT = "6379", "8000"
MARKER = "SGLANG_REPLAYSSM_MULTINODE"
NODE_LINE = re.compile(r"^\s+node (\S+): raylet pid (\d+), metrics (\S+), resources (.*)$")


def quickstart_commands() -> list[list[str]]:
    """The doc's quick-start commands (comments dropped), split as a shell would."""
    text = DOC.read_text()
    assert QUICKSTART_MARK in text, f"{DOC} lost its {QUICKSTART_MARK} block"
    block = text.split(QUICKSTART_MARK, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    block = block.replace("\\\n", " ")   # a command continued on the next line
    cmds = [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]
    assert [c[:3] for c in cmds] == [["python", "-m", "sglang_replayssm.scheduler.local_cluster"],
                                     ["python", "-m", "sglang_replayssm.launch"]], cmds
    return cmds


def _with_ports(cmd: list[str], gcs: int, router: int) -> list[str]:
    out = [sys.executable] + cmd[1:]
    return [a.replace(DOC_GCS_PORT, str(gcs)).replace(DOC_ROUTER_PORT, str(router)) for a in out]


class MultiNodeCluster:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="rmn", dir="/tmp")   # short: Ray's unix sockets live under it
        os.makedirs(os.path.join(self.tmp, "ray"))
        self.session = uuid.uuid4().hex
        self.env = dict(os.environ, RAY_TMPDIR=self.tmp, RAY_USAGE_STATS_ENABLED="0", **{MARKER: self.session})
        self.gcs_port, self.router_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.router_port}"
        self.address = f"127.0.0.1:{self.gcs_port}"
        cluster_cmd, launch_cmd = quickstart_commands()
        self.cluster_cmd = _with_ports(cluster_cmd, self.gcs_port, self.router_port)
        self.launch_cmd = _with_ports(launch_cmd, self.gcs_port, self.router_port)
        self.nodes: dict[str, dict] = {}     # name -> {"raylet_pid", "metrics"}
        self.raylets: dict[int, str] = {}    # every raylet pid seen -> its node ("worker-1 (lost)" once replaced)
        self.lines: queue.Queue = queue.Queue()   # local_cluster's output after its start-up lines
        self.sd_file = None
        self.cluster = self.launcher = None
        self.known: set[int] = set()          # every PID seen carrying the marker
        self.timings: dict[str, float] = {}

    # -- start / stop ----------------------------------------------------------------------------
    def start(self, timeout: float = 300.0) -> "MultiNodeCluster":
        t0 = time.monotonic()
        self.cluster = subprocess.Popen(self.cluster_cmd, env=self.env, stdout=subprocess.PIPE,
                                        stderr=open(os.path.join(self.tmp, "local_cluster.err"), "w"), text=True)
        for line in self.cluster.stdout:
            self._note_node(line)
            if "Prometheus file_sd:" in line:
                self.sd_file = line.split("Prometheus file_sd:", 1)[1].strip()
                break
        assert self.sd_file and set(self.nodes) == {"head", "worker-1", "worker-2"}, \
            (self.nodes, self._tail("local_cluster.err"))
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.cluster.stdout], daemon=True).start()
        self.timings["cluster_start_s"] = time.monotonic() - t0
        self.timings["launch_to_healthy_s"] = self.launch(self.launch_cmd, timeout)
        self.note_pids()
        return self

    def _note_node(self, line: str) -> str | None:
        m = NODE_LINE.match(line)
        if not m:
            return None
        old = self.nodes.get(m[1])
        if old:
            self.raylets[old["raylet_pid"]] = f"{m[1]} (lost)"
        self.nodes[m[1]] = {"raylet_pid": int(m[2]), "metrics": m[3]}
        self.raylets[int(m[2])] = m[1]
        return m[1]

    def rejoin(self, timeout: float = 120.0) -> list[str]:
        """local_cluster's SIGUSR1: every lost worker node starts again (same name, CPUs and resource;
        a new raylet PID and metrics port). The names of the nodes that came back, once the GCS lists
        them alive."""
        self.cluster.send_signal(signal.SIGUSR1)
        back, deadline = [], time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.cluster.poll() is None and time.monotonic() < deadline, \
                    f"local_cluster did not report the rejoin: {self._tail('local_cluster.err')}"
                continue
            name = self._note_node(line)
            if name:
                back.append(name)
            if "rejoined:" in line:
                self.note_pids()
                return back

    def launch(self, cmd: list[str], timeout: float) -> float:
        t1 = time.monotonic()
        self.launcher = subprocess.Popen(cmd, env=self.env, stdout=open(os.path.join(self.tmp, "launch.out"), "a"),
                                         stderr=open(os.path.join(self.tmp, "launch.err"), "a"))
        deadline = t1 + timeout
        while True:
            assert self.launcher.poll() is None, f"the launcher exited {self.launcher.returncode}: {self._tail('launch.err')}"
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"router not healthy after {timeout:.0f} s: {self._tail('launch.err')}"
            time.sleep(0.5)
        self.note_pids()
        return time.monotonic() - t1

    def _tail(self, name: str, n: int = 3000) -> str:
        try:
            return Path(self.tmp, name).read_text()[-n:]
        except OSError:
            return ""

    def serve_log_lines(self, text: str) -> list[str]:
        """Lines of this cluster's Serve logs (every node's) that contain `text`: the router's retries
        and their causes, for an assertion's message."""
        lines = []
        for f in sorted(Path(self.tmp, "ray").glob("session_2*/logs/serve/*.log")):
            try:
                lines += [x for x in f.read_text(errors="replace").splitlines() if text in x]
            except OSError:
                pass
        return lines

    def note_pids(self) -> dict[int, str]:
        pids = pids_with_env(f"{MARKER}={self.session}")
        self.known |= set(pids)
        return pids

    def stop(self) -> list[int]:
        """SIGTERM the launcher (Serve shuts down), then the cluster (every node); PIDs still alive after
        that are SIGKILLed and returned. The temp folder goes too."""
        self.note_pids()
        for proc, grace in ((self.launcher, 60), (self.cluster, 60)):
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self._alive():
            time.sleep(0.5)
        left = self._alive()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)   # Ray's session folders, the logs
        return left

    def _alive(self) -> list[int]:
        pids = set(self.note_pids()) | self.known
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except OSError:
                pass
        return alive

    # -- where things run --------------------------------------------------------------------------
    def node_of_raylet(self, pid: int) -> str:
        return self.raylets[pid]

    def replicas(self) -> dict[str, str]:
        """{engine replica id: node name} of every live engine of this cluster, from each engine's
        environment (SGLANG_REPLAYSSM_REPLICA, and RAY_RAYLET_PID: the raylet of the replica's node)."""
        out = {}
        for pid in self.note_pids():
            env = _environ(pid)
            if "SGLANG_REPLAYSSM_REPLICA" in env and "RAY_RAYLET_PID" in env:
                out[env["SGLANG_REPLAYSSM_REPLICA"]] = self.node_of_raylet(int(env["RAY_RAYLET_PID"]))
        return out

    def engine_groups(self, replica: str) -> set[int]:
        groups = set()
        for pid in self.note_pids():
            if _environ(pid).get("SGLANG_REPLAYSSM_REPLICA") == replica:
                try:
                    groups.add(os.getpgid(pid))
                except ProcessLookupError:
                    pass
        return groups

    def actor_node(self, title: str) -> list[str]:
        """Nodes of this cluster's Ray worker processes whose title starts with `title` (their parent
        is their node's raylet)."""
        raylets = self.raylets
        found = []
        for d in os.listdir("/proc"):   # by title and parent: Ray's process titles hide some environments
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if cmd.startswith(title) and ppid in raylets:
                found.append(raylets[ppid])
        return found


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)
