"""Run an engine command and take its whole process group down when the owning process dies.

    python -m sglang_replayssm.scheduler.engine_guard LIFELINE_FD -- CMD...

Started by engine_process.EngineProcess in a new session. The guard detaches first (forks; the
direct child of the Ray replica exits at once), because Ray SIGKILLs a dying worker's direct
children, which would leave the engine and its own children orphaned. The detached guard then runs
CMD in its process group and watches LIFELINE_FD, the read end of a pipe whose write end only the
owner holds: end-of-file means the owner is gone (exited, crashed or killed), and the guard kills
the group. SIGTERM to the group, or the engine exiting, ends it too. Standard library only.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time


def _kill_group(grace_s: float, child: subprocess.Popen) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the engine's own children too; ends this guard


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        print("usage: engine_guard LIFELINE_FD -- CMD...", file=sys.stderr)
        return 2
    lifeline = int(argv[0])
    if os.fork() > 0:
        os._exit(0)  # detach: the owner's direct child ends now, the guard lives on in the group
    stop = {"sig": False}

    def on_term(signum, frame):
        stop["sig"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    child = subprocess.Popen(argv[2:], pass_fds=())
    while True:
        code = child.poll()
        if code is not None:
            _kill_group(2.0, child)  # anything the engine left behind
            return code
        if stop["sig"]:
            break
        ready, _, _ = select.select([lifeline], [], [], 0.2)
        if ready and not os.read(lifeline, 1):
            break  # owner gone
    _kill_group(10.0, child)
    return 1


if __name__ == "__main__":
    sys.exit(main())
