"""`python -m sglang_replayssm.launch`: serve a hybrid SSM model with ReplaySSM. Its flags, their checks and its
--help text are launch_flags.py's (which the Ray front's flag check shares); here: the engine choice and the start."""

from __future__ import annotations

import argparse
import importlib.util
import sys

from .argparsing import Parser, flag_value
from .flags import FlagError, ReplaySSMOptions, add_replayssm_args, split_argv
from .launch_flags import common_parser, native_parser, sglang_flag_problems

EXTRA_SGLANG = "pip install 'sglang-replayssm[sglang]'"


def choose_engine(engine: str) -> tuple[str, str]:
    """The engine to run and why, for the first banner line. Imports neither sglang nor torch unless
    --engine auto has to ask whether CUDA is there."""
    if engine != "auto":
        return engine, f"--engine {engine}"
    if importlib.util.find_spec("sglang") is None:
        return "native", f"--engine auto: sglang is not installed; {EXTRA_SGLANG} on a GPU machine for SGLang"
    import torch

    if not torch.cuda.is_available():
        return "native", ("--engine auto: sglang is installed but no CUDA GPU is visible; "
                          "--engine sglang --device cpu runs SGLang's CPU harness (tiny models, slow)")
    return "sglang", "--engine auto: sglang is installed and a CUDA GPU is present; --engine native for the compact engine"


def resolve_engine(engine: str) -> str:
    return choose_engine(engine)[0]


def engine_line(engine: str, why: str, replicas: int | None) -> str:
    where = f"{replicas} Ray Serve replica(s) of engine {engine}" if replicas is not None else f"engine {engine}"
    return f"sglang-replayssm: {where} ({why})"


def sglang_missing_error() -> str:
    return f"error: --engine sglang needs SGLang, which is not installed: {EXTRA_SGLANG}"


def check_model_path(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--model-path (config.json and tokenizer) and --tokenizer; parser.error naming the flag."""
    from pathlib import Path

    from .native.config import HybridConfig, ModelConfigError
    from .native.tokenizer import BYTE_MARKER, TOKENIZER_FILES, ByteTokenizer, tokenizer_kind

    if ns.model_path and not ns.model_path.startswith("embedded"):
        if not Path(ns.model_path).is_dir():
            parser.error(f"--model-path: {ns.model_path} is not a directory")
        if not (Path(ns.model_path) / "config.json").is_file():
            parser.error(f"--model-path: {ns.model_path} has no config.json")
        try:   # fail fast on a config the engine cannot serve (weights are checked by the engine)
            cfg = HybridConfig.from_file(Path(ns.model_path) / "config.json")
        except ModelConfigError as e:
            parser.error(f"--model-path: {e}")
        kind = tokenizer_kind(ns.model_path)
        if ns.tokenizer == "auto" and kind == "hf" and importlib.util.find_spec("transformers") is None:
            parser.error(f"--model-path: reading the tokenizer of {ns.model_path} needs the `transformers` "
                         "package, which is not installed: pip install 'transformers>=5.0' (or pass "
                         "--tokenizer byte for a byte-level model)")
        if ns.tokenizer == "auto" and kind is None:
            parser.error(f"--model-path: {ns.model_path} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); "
                         f"add the model's tokenizer, or serve it with the byte-level tokenizer by passing "
                         f"--tokenizer byte (or a {BYTE_MARKER} with {{\"tokenizer\": \"byte\"}} in the folder)")
        if (ns.tokenizer == "byte" or kind == "byte") and cfg.vocab_size < ByteTokenizer.EOS + 1:
            parser.error(f"--tokenizer: the byte-level tokenizer needs vocab_size >= {ByteTokenizer.EOS + 1}, "
                         f"the model has {cfg.vocab_size}")
    elif ns.model_path and ns.model_path not in ("embedded", "embedded:mamba2", "embedded:gdn"):
        parser.error(f"--model-path: built-in models are 'embedded:mamba2' and 'embedded:gdn', got {ns.model_path!r}")


def bind_port(host: str, port: int, parser: argparse.ArgumentParser):
    """The listening socket, bound before the engine is built: a port in use is a `--port:` error at
    once (exit 2), not a failure after the model loaded and the banner printed its URL."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET   # as uvicorn binds
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        if e.errno == errno.EADDRINUSE:
            parser.error(f"--port: {shown} is already in use")
        if e.errno == errno.EACCES:
            parser.error(f"--port: {shown}: permission denied (ports below 1024 need privileges)")
        parser.error(f"--host: cannot listen on {shown} ({e.strerror or e})")
    sock.set_inheritable(False)
    return sock


def engine_args_from(ns: argparse.Namespace, parser: argparse.ArgumentParser):
    """Validated EngineArgs; parser.error (exit 2, names the flag) on a bad value. The checks that
    need no torch come first, so a bad flag fails before torch is imported."""
    from .http_front.auth import check_key

    if not 1 <= ns.port <= 65535:
        parser.error(f"--port: must be in 1..65535, got {ns.port}")
    why = check_key(getattr(ns, "api_key", None))
    if why:
        parser.error(f"--api-key: {why}")
    from .http_front.body_limit import limit_error

    why = limit_error(ns.max_request_bytes)
    if why:
        parser.error(f"--max-request-bytes: {why}")
    if not (0 <= ns.drain_timeout < float("inf")):
        parser.error(f"--drain-timeout: must be a number of seconds >= 0, got {ns.drain_timeout}")
    if not (ns.stats_log_interval >= 0 and ns.stats_log_interval < float("inf")):
        parser.error(f"--stats-log-interval: must be a number of seconds >= 0, got {ns.stats_log_interval}")
    if ns.model_path is None:   # the trained tiny model that ships in the package
        from .native.engine_args import default_model_path

        ns.model_path = default_model_path()
    check_model_path(ns, parser)
    import torch

    from .native.engine_args import EngineArgs

    device = ns.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        parser.error(f"--device: not a device: {device!r}")
    if dev.type not in ("cpu", "cuda"):
        parser.error(f"--device: must be cpu or cuda[:N], got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device: CUDA requested but torch.cuda.is_available() is False")
    slots = ns.max_running_requests
    if slots is None:
        slots = 256 if dev.type == "cuda" else 8
    cache = slots // 4 if ns.prefix_cache_entries is None else ns.prefix_cache_entries
    args = EngineArgs(model_path=ns.model_path, device=device, dtype=ns.dtype, max_running_requests=slots,
                      max_model_len=ns.context_length, chunk_size=ns.chunked_prefill_size,
                      speculative_num_draft_tokens=ns.speculative_num_draft_tokens,
                      speculative_disable_by_batch_size=ns.speculative_disable_by_batch_size, seed=ns.seed,
                      prefix_cache_entries=cache, prefix_cache_interval=ns.prefix_cache_interval,
                      tokenizer=ns.tokenizer, served_model_name=ns.served_model_name)
    try:
        args.check()   # the engine's own check of its arguments (engine_args.py)
    except ValueError as e:
        parser.error(str(e))
    try:
        args.replayssm = ReplaySSMOptions.from_args(ns)
    except FlagError as e:
        parser.error(str(e))
    return args


def check_replayssm_flags(argv: list[str], parser: Parser) -> None:
    """The --replayssm-* flags of an SGLang command line, checked before SGLang is imported: a bad value is one
    error line naming the flag (exit 2), as with the native engine."""
    try:
        ours, _ = split_argv(argv)
        p = Parser(prog=parser.prog, add_help=False)
        add_replayssm_args(p)
        ReplaySSMOptions.from_args(p.parse_args(ours))
    except FlagError as e:
        parser.error(str(e))


def sglang_device_error(argv: list[str]) -> str | None:
    """Why SGLang cannot start here, before it spends its start-up finding out: no --device cpu (the CPU harness)
    and no GPU visible. None when it can (a GPU, --device cpu, or a --device that SGLang itself must judge)."""
    device = flag_value(argv, "--device")
    if device == "cpu" or (device is not None and not device.startswith("cuda")):
        return None
    import torch

    if torch.cuda.is_available():
        return None
    if device is None and ((hasattr(torch, "xpu") and torch.xpu.is_available())
                           or torch.backends.mps.is_available()):
        return None
    return ("--engine sglang: no GPU is visible (torch.cuda.is_available() is False); add --device cpu for "
            "SGLang's CPU harness (tiny models, slow), or serve with --engine native")


def serve_sglang(common: argparse.Namespace, rest: list[str], parser: Parser, why: str) -> int:
    """`--engine sglang` on one machine: SGLang's server with the plugin (the CPU harness with --device cpu)."""
    check_replayssm_flags(rest, parser)
    error = sglang_device_error(rest)
    if error:
        parser.error(error)
    print(engine_line("sglang", why, None), flush=True)
    from .checkpoint_names import CheckpointNameError, sglang_model_argv

    try:   # a folder saved by transformers 5: served through an overlay with SGLang's config names
        rest = sglang_model_argv(rest)
    except CheckpointNameError as e:
        parser.error(str(e))
    from . import cpu_harness

    if cpu_harness.wants_cpu(rest):   # a machine without a GPU: the CPU harness (tiny models, slow)
        cpu_harness.activate()
    error, notes = sglang_flag_problems(rest)
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    if error:
        parser.error(error)
    if cpu_harness.wants_cpu(rest):
        rest = cpu_harness.cpu_server_args(rest)
    from . import sglang_plugin

    try:
        sglang_plugin.launch_server(rest + ["--host", common.host, "--port", str(common.port)])
    except FlagError as e:   # a --replayssm-* flag SGLang's own arguments rule out (sglang_plugin/options.py)
        parser.error(str(e))
    return 0


def default_model_line() -> str:
    from .native.engine_args import DEFAULT_MODEL

    return (f"sglang-replayssm: model {DEFAULT_MODEL} (the default without --model-path: a tiny byte-level model "
            "trained on Python's standard library, shipped in the package; --model-path DIR serves yours)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = common_parser()
    common, rest = pre.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        from .scheduler import add_scheduler_args   # imports neither ray nor sglang

        parser = native_parser()
        add_scheduler_args(parser)
        parser.print_help()
        return 0
    if common.replicas is not None and common.replicas < 1:
        pre.error(f"--replicas: must be >= 1, got {common.replicas}")
    engine, why = choose_engine(common.engine)
    if common.replicas is not None:
        from .scheduler.serve_app import ray_missing_error   # imports no ray

        error = ray_missing_error()
        if error is not None:
            print(error, file=sys.stderr)
            return 2
    elif engine == "sglang" and importlib.util.find_spec("sglang") is None:
        print(sglang_missing_error(), file=sys.stderr)
        return 2
    if common.replicas is not None:
        print(engine_line(engine, why, common.replicas), flush=True)
        from . import scheduler

        common.engine, common.engine_argv = engine, rest
        return scheduler.launch_replicas(common) or 0
    if engine == "sglang":
        return serve_sglang(common, rest, pre, why)
    print(engine_line(engine, why, None), flush=True)
    parser = native_parser()
    ns = parser.parse_args(argv)
    if ns.model_path is None:
        print(default_model_line(), flush=True)
    sock = bind_port(ns.host, ns.port, parser) if 1 <= ns.port <= 65535 else None   # else a --port error below
    args = engine_args_from(ns, parser)
    from .native.server import serve

    serve(args, host=ns.host, port=ns.port, log_level=ns.log_level, api_key=ns.api_key, sock=sock,
          max_request_bytes=ns.max_request_bytes, drain_timeout=ns.drain_timeout, stats_interval=ns.stats_log_interval,
          enable_docs=ns.enable_docs)
    return 0


def run() -> int:
    """main(), and a Ctrl-C before the server took over its signals (imports, the model's load) ends quietly."""
    try:
        return main()
    except KeyboardInterrupt:
        print("sglang-replayssm: stopped", flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(run())
