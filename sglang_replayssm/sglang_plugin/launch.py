"""Start SGLang's server with the ReplaySSM plugin active.

Same steps as ``python -m sglang.launch_server``: load plugins, parse SGLang's arguments, run the
server, then kill the process tree. Differences: ReplaySSM is on even when no ``--replayssm-*`` flag is
given (defaults of ``sglang_replayssm.flags``), and a plugin excluded by ``SGLANG_PLUGINS`` is an error
(the spawned schedulers would not load it either).
"""

from __future__ import annotations

import os

from sglang_replayssm.flags import ENV_VAR, ReplaySSMOptions, split_argv

from .options import set_active


def prepare(argv: list[str]):
    """Validate the ReplaySSM flags, activate the plugin, and return SGLang's ServerArgs for ``argv``."""
    ours, _rest = split_argv(argv)
    if ours or not os.environ.get(ENV_VAR):
        set_active(ReplaySSMOptions.parse(ours))  # defaults when no flag given; env for spawned processes
    else:
        set_active(ReplaySSMOptions.from_env())  # options handed down by a caller (e.g. a Ray replica)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from . import is_registered

    if not is_registered():
        raise RuntimeError("the sglang-replayssm plugin did not load: SGLANG_PLUGINS="
                           f"{os.environ.get('SGLANG_PLUGINS')!r} must include 'replayssm' (or be unset)")
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(list(argv))


def launch_server(argv: list[str]) -> None:
    server_args = prepare(argv)
    from sglang.launch_server import run_server
    from sglang.srt.utils import kill_process_tree

    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
