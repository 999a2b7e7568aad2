"""Start the real SGLang 0.5.23 server on a CUDA machine through the GPU harness (issue 21).

    python3 bench/h200/h200_serve.py stock  --model-path DIR [SGLang flags]   # python -m sglang.launch_server
    python3 bench/h200/h200_serve.py plugin --model-path DIR [--replayssm-* flags] [SGLang flags]

Both add ``sglang_replayssm.gpu_harness.GPU_DEFAULTS`` unless given. ``plugin`` goes through
``sglang_replayssm.sglang_plugin.launch_server`` (ReplaySSM on, defaults when no ``--replayssm-*`` flag).
"""

from __future__ import annotations

import runpy
import sys

from sglang_replayssm import gpu_harness


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("stock", "plugin"):
        sys.exit("usage: h200_serve.py stock|plugin --model-path DIR [flags]")
    gpu_harness.activate()
    rest = gpu_harness.gpu_server_args(argv[1:])
    if argv[0] == "plugin":
        from sglang_replayssm import sglang_plugin

        sglang_plugin.launch_server(rest)
    else:
        sys.argv = ["sglang.launch_server", *rest]
        runpy.run_module("sglang.launch_server", run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
