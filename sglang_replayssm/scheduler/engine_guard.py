"""Run an engine command and take its whole process group down when the parent process dies.

    python -m sglang_replayssm.scheduler.engine_guard PARENT_PID -- CMD...

Started by engine_process.EngineProcess in a new session, so this guard leads the process group
the engine (and anything the engine spawns) belongs to. SIGTERM to the guard, the engine exiting,
or PARENT_PID disappearing (the Ray replica was killed) all end the group. Standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def _parent_alive(pid: int) -> bool:
    if os.getppid() != pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        print("usage: engine_guard PARENT_PID -- CMD...", file=sys.stderr)
        return 2
    parent = int(argv[0])
    child = subprocess.Popen(argv[2:])
    stopping = {"sig": None}

    def on_term(signum, frame):
        stopping["sig"] = signum

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    while True:
        code = child.poll()
        if code is not None:
            return code
        if stopping["sig"] is not None:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                pass
            break  # then clear out anything the engine left in the group
        if not _parent_alive(parent):
            break
        time.sleep(0.2)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(os.getpgrp(), signal.SIGKILL)
    return 1


if __name__ == "__main__":
    sys.exit(main())
