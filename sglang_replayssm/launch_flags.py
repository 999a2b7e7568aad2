"""`python -m sglang_replayssm.launch`: serve a hybrid SSM model with ReplaySSM.

    --engine native   the compact engine of sglang_replayssm.native (CPU or GPU); with no --model-path
                      it serves tiny-gdn-hybrid, a small byte-level model trained on Python's standard
                      library that ships in the package, within seconds
    --engine sglang   SGLang's server with the ReplaySSM plugin (pip install 'sglang-replayssm[sglang]');
                      a GPU, or --device cpu for the CPU harness: tiny models, slow, defaults of
                      sglang_replayssm.cpu_harness
    --engine auto     sglang when it is importable and CUDA is available, else native (default); the first
                      line printed names the engine chosen and why
    --replicas N      N engine replicas on Ray Serve behind a cache- and load-aware router
                      (pip install 'sglang-replayssm[ray]'; --ray-address joins a cluster; every other
                      flag goes to the replicas).
                      --engine auto is resolved on the launching host: from a CPU-only head node
                      pass --engine sglang for GPU replicas.

The ReplaySSM flags (--replayssm-*) are shared with the SGLang plugin (sglang_replayssm.flags).
With --engine sglang every flag not listed below goes to SGLang unchanged (--enable-metrics, --tp 2,
--mem-fraction-static, --speculative-algorithm, ...: `python -m sglang.launch_server --help` lists them);
with --replicas N, to each replica's engine. Our flags are spelled out in full: an abbreviation is an unknown
flag (SGLang's parser takes a unique prefix of its own flags: such a flag is passed on, with a note).
"""

from __future__ import annotations

import argparse

from .argparsing import LAUNCH_PROG, Parser, unknown_flags_message
from .flags import add_replayssm_args

ENGINES = ("auto", "native", "sglang")


def common_parser() -> argparse.ArgumentParser:
    p = Parser(add_help=False)
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="auto: sglang when importable and a GPU is present, else native (default)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port to listen on (default 30000)")
    p.add_argument("--replicas", type=int, default=None, help="serve N replicas on Ray Serve")
    p.add_argument("--ray-address", default=None, help="Ray cluster to join with --replicas (default: start one)")
    return p


def native_parser() -> argparse.ArgumentParser:
    p = Parser(prog=LAUNCH_PROG, parents=[common_parser()], description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=None,
                   help="HF folder with config.json + *.safetensors (NemotronH / Qwen3-Next / Qwen3.5); default: "
                        "tiny-gdn-hybrid, shipped in the package (sglang_replayssm/native/assets: byte-level, trained "
                        "on Python's standard library; tiny-mamba2-hybrid beside it); 'embedded' / 'embedded:gdn': "
                        "built-in models with random weights (fast, for tests; their answers are noise)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="dtype of the weights and activations (default auto: float32 on CPU, bfloat16 on CUDA; "
                        "the SSM checkpoint's precision is --replayssm-ckpt-precision)")
    p.add_argument("--max-running-requests", type=int, default=None,
                   help="pool slots = sequences decoded together (default 8 on CPU, 256 on GPU)")
    p.add_argument("--context-length", type=int, default=2048, help="longest prompt + output (default 2048)")
    p.add_argument("--chunked-prefill-size", type=int, default=256, help="prefill tokens per request per step")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=0,
                   help="prompt-lookup draft tokens verified per step (0: no speculative decoding)")
    p.add_argument("--speculative-disable-by-batch-size", type=int, default=0,
                   help="decode without drafts while this many requests or more decode together (0: never); "
                        "drafts pay at small batches and lose at large ones (bench/README.md, speculative "
                        "decoding on real text)")
    p.add_argument("--prefix-cache-entries", type=int, default=None,
                   help="prefix states kept in idle pool slots (default: a quarter of the slots; 0: off)")
    p.add_argument("--prefix-cache-interval", type=int, default=64,
                   help="the prefix cache keeps states every N tokens of a sequence, at prefill and decode (and "
                        "at a prompt's branching point and its last token but one), like SGLang's "
                        "--mamba-track-interval (default 64)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the built-in random-weight model's weights (--model-path embedded)")
    p.add_argument("--tokenizer", choices=("auto", "byte"), default="auto",
                   help="auto: the model folder's HuggingFace tokenizer (a folder without tokenizer files is "
                        "refused unless it declares a byte-level model in replayssm_tokenizer.json); byte: the "
                        "byte-level tokenizer (token i < 256 is byte i, 256 BOS, 257 EOS). Default auto")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer <key>' on every route but /health and /metrics "
                        "(401 otherwise); default: no key")
    p.add_argument("--enable-docs", action="store_true",
                   help="serve FastAPI's /docs, /redoc and /openapi.json (default: not served)")
    p.add_argument("--max-request-bytes", type=int, default=8 << 20,
                   help="largest request body accepted (larger: a 413 naming the limit; nothing past it is kept); "
                        "with --replicas the router's limit, and native engines get it plus 1 MiB for what the "
                        "router adds; default 8388608 (8 MiB)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM: seconds running requests get to finish (new ones get a 503) before the "
                        "rest are ended with a 503 and the server exits 0 (default 30)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name of the API (/v1/models; a request naming another model gets a 404); "
                        "default: the model folder's name, or replayssm-embedded-<family>")
    p.add_argument("--stats-log-interval", type=float, default=10.0,
                   help="seconds between stats lines (running, waiting, tokens/s) while the engine works; 0: off "
                        "(default 10)")
    p.add_argument("--log-level", default="warning", help="uvicorn log level")
    add_replayssm_args(p)
    return p


def sglang_flag_problems(argv: list[str]) -> tuple[str | None, list[str]]:
    """(error, notes) for the flags of an SGLang command line. SGLang's own parser takes a unique prefix of one of
    its flags for that flag (`--tp 2` for `--tp-size 2`, as SGLang's docs write it): such a flag is passed on
    unchanged, with a note saying what SGLang will read it as. A prefix of one of our --replayssm-* flags, and a
    flag neither knows, is the error (with a "did you mean"). Imports SGLang's server arguments (the CPU harness,
    if wanted, must be active already)."""
    if any(a == "--config" or a.startswith("--config=") for a in argv):   # SGLang merges a config file's flags
        return None, []
    from sglang.srt.server_args import ServerArgs

    from .flags import FLAG_SPELLINGS

    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ServerArgs.add_cli_args(p)
    sglang = {s for action in p._actions for s in action.option_strings if s.startswith("--")}
    ours = set(FLAG_SPELLINGS)
    unknown, notes = [], []
    for word in argv:
        name = word.split("=", 1)[0]
        if not name.startswith("--") or name in sglang or name in ours:
            continue
        expands = sorted(f for f in sglang if f.startswith(name))
        if len(expands) == 1 and not any(f.startswith(name) for f in ours):
            notes.append(f"sglang-replayssm: note: SGLang reads {name} as {expands[0]} (its parser takes a unique "
                         "prefix of a flag; spell it out to be sure)")
        else:
            unknown.append(name)
    return (unknown_flags_message(unknown, sorted(sglang | ours)) if unknown else None), notes
