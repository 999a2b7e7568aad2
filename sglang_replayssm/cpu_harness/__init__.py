"""CPU harness: the real SGLang server (with or without our plugin) on a machine with no GPU.

A development and test harness, not a way to serve real models: tiny checkpoints, slow. It is what
lets CI start ``sglang serve`` with the ReplaySSM plugin on every change. Switched on only by
``python -m sglang_replayssm.launch --engine sglang --device cpu``; with a GPU nothing here runs.

``activate()`` (in the launching process, before SGLang is imported):

* ``SGLANG_USE_CPU_ENGINE=1`` (SGLang's CPU platform; ``--device cpu`` alone still takes CUDA paths),
  ``TRITON_INTERPRET=1`` (SGLang launches a few Triton kernels on CPU tensors) and
  ``TRITON_F32_DEFAULT=ieee`` (the interpreter would round ``tl.dot`` inputs to TF32),
  ``SGLANG_MAMBA_CONV_DTYPE=float32`` (conv states in the model's fp32, not SGLang's default bf16);
* puts ``site/`` first on ``PYTHONPATH``: its ``sitecustomize`` installs ``bridge.install()`` in every
  process SGLang spawns (schedulers, detokenizer), before they import SGLang;
* installs the bridge in this process too (``bridge.py``: the ``sgl_kernel`` stand-in, ``torch.cpu`` as
  the device module, the ``*_cpu`` ops of ``cpu_ops.py``, the interpreter's autotuner).

``cpu_server_args(argv)`` adds the flags the CPU engine needs unless the user gave them (an explicit
flag always wins): see ``CPU_DEFAULTS``. ``tiny_checkpoints.py`` writes the models it serves.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..argparsing import flag_value

SITE_DIR = Path(__file__).resolve().parent / "site"

# flag -> value (None: a switch). Chosen for a 2-core, 24 GB machine serving tiny models.
CPU_DEFAULTS: dict[str, str | None] = {
    "--attention-backend": "torch_native",
    "--sampling-backend": "pytorch",
    # no CUDA graphs (SGLang 0.5.23's spelling: --disable-cuda-graph still works but logs a deprecation warning)
    "--cuda-graph-backend-decode": "disabled",
    "--cuda-graph-backend-prefill": "disabled",
    "--mamba-radix-cache-strategy": "no_buffer",
    "--disable-overlap-schedule": None,
    # the pools are sized by the caps below; on a CPU SGLang takes the machine's free memory, before and after the
    # weights load, as its device memory, so memory other processes take meanwhile counts as the model's: 0.6 leaves
    # ~10 GB of such slack on a 24 GB machine (0.3 failed a TP-2 start beside two starting Ray replicas: "Loaded
    # weights leave no GPU memory for the KV cache")
    "--mem-fraction-static": "0.6",
    "--max-running-requests": "8",
    "--max-total-tokens": "8192",
    "--max-mamba-cache-size": "24",
    "--chunked-prefill-size": "1024",
    # an idle scheduler polls its sockets without pause, a whole core (measured: 1.01 cores over 10 s idle); SGLang's
    # own switch makes it wait on them (zmq poll, woken by the next request)
    "--sleep-on-idle": None,
    # bf16 Triton kernels are wrong under Triton's interpreter, and the Mamba-2 conv and speculative
    # decoding run Triton kernels on CPU tensors: fp32 everywhere (tiny models: it costs nothing).
    "--dtype": "float32",
}
# speculative decoding on CPU: the torch_native backend has no target-verify path, Triton's has; MLA attention
# (Kimi Linear, DeepSeek: a config with kv_lora_rank) neither: torch_native's SDPA cannot read its latent cache
SPECULATIVE_ATTENTION_BACKEND = "triton"
MLA_ATTENTION_BACKEND = "triton"


def _given(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


# SGLang has no flag that turns the overlap scheduler on, only --disable-overlap-schedule: "1" here keeps the
# harness from adding that default (the overlap scheduler then runs, on CPU as on a GPU)
OVERLAP_ENV = "SGLANG_REPLAYSSM_CPU_OVERLAP"


def _uses_mla(argv: list[str]) -> bool:
    """True when ``--model-path`` is a local folder whose config has MLA attention (``kv_lora_rank``)."""
    import json

    path = flag_value(argv, "--model-path") or flag_value(argv, "--model")
    try:
        cfg = json.loads((Path(path) / "config.json").read_text()) if path else {}
    except (OSError, ValueError):
        return False
    return bool(cfg.get("kv_lora_rank") or (cfg.get("text_config") or {}).get("kv_lora_rank"))


def cpu_server_args(argv: list[str]) -> list[str]:
    """``argv`` plus every CPU default it does not set itself."""
    out = list(argv)
    speculative = _given(argv, "--speculative-algorithm")
    for flag, value in CPU_DEFAULTS.items():
        if _given(argv, flag):
            continue
        if flag == "--disable-overlap-schedule" and os.environ.get(OVERLAP_ENV) == "1":
            continue
        if flag == "--attention-backend" and speculative:
            value = SPECULATIVE_ATTENTION_BACKEND
        elif flag == "--attention-backend" and _uses_mla(argv):
            value = MLA_ATTENTION_BACKEND
        out += [flag] if value is None else [flag, value]
    return out


def harness_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's) with the harness's variables; what spawned processes need."""
    env = dict(os.environ if env is None else env)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["TRITON_INTERPRET"] = "1"
    # the interpreter emulates TF32 in tl.dot by default (errors ~1e-3 against fp32 transformers): plain fp32
    env.setdefault("TRITON_F32_DEFAULT", "ieee")
    # SGLang keeps conv states in bf16 unless told: fp32 like the model (--dtype float32); SGLang's extra_buffer
    # prefill writes the model's activations into the conv state with an index_put that needs equal dtypes
    env.setdefault("SGLANG_MAMBA_CONV_DTYPE", "float32")
    return site_first(env, SITE_DIR)


def site_first(env: dict, site_dir) -> dict:
    """``env`` with ``site_dir`` (a harness's ``sitecustomize.py`` folder) first on ``PYTHONPATH``, once."""
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(site_dir)]
    env["PYTHONPATH"] = os.pathsep.join([str(site_dir), *parts])
    return env


def activate() -> None:
    """Switch this process (and every process it starts from now on) to the CPU harness."""
    os.environ.update(harness_env())
    from .bridge import install

    install()


def wants_cpu(argv: list[str]) -> bool:
    """True when ``argv`` asks SGLang for ``--device cpu``."""
    for i, a in enumerate(argv):
        if a == "--device" and i + 1 < len(argv):
            return argv[i + 1] == "cpu"
        if a.startswith("--device="):
            return a.split("=", 1)[1] == "cpu"
    return False
