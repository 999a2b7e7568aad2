"""The ReplaySSM command-line flags, shared by the native launcher and the SGLang plugin.

One definition, one validation, so both engines accept exactly the same spellings:

    --replayssm-window N                      records folded per flush (L), default 16
    --replayssm-ckpt-precision {fp32,fp16-sr} recurrence checkpoint precision
    --replayssm-read-copy {auto,none,fp8,nvfp4}  low-precision copy read by non-flush steps (auto: per family
                                              and device, auto_read_copy)
    --replayssm-decode / --no-replayssm-decode   ReplaySSM decode (off: conventional SSM decode)
    --replayssm-verify / --no-replayssm-verify   ReplaySSM speculative verify (off: conventional)

Usage:
    add_replayssm_args(parser)                 # argparse
    opts = ReplaySSMOptions.from_args(args)    # validates, raises FlagError naming the flag
    cfg = opts.replay_config(max_drafts=4, family="gdn", device=dev)   # -> sglang_replayssm.pool.ReplayConfig
    env = opts.to_env()                        # hand the options to spawned processes
    opts = ReplaySSMOptions.from_env()         # ... and read them back there

This module imports only the standard library and ``state_formats`` (the pool is imported lazily by
replay_config).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Mapping, Sequence

from .state_formats import AUTO, FLAG_CKPT_PRECISIONS, FLAG_READ_COPIES, read_copy_geometry_error

MAX_WINDOW = 1024
ENV_VAR = "SGLANG_REPLAYSSM_OPTIONS"

# flag spelling -> (argparse dest, takes a value)
FLAG_SPELLINGS = {
    "--replayssm-window": ("replayssm_window", True),
    "--replayssm-ckpt-precision": ("replayssm_ckpt_precision", True),
    "--replayssm-read-copy": ("replayssm_read_copy", True),
    "--replayssm-decode": ("replayssm_decode", False),
    "--no-replayssm-decode": ("replayssm_decode", False),
    "--replayssm-verify": ("replayssm_verify", False),
    "--no-replayssm-verify": ("replayssm_verify", False),
}


# What `--replayssm-read-copy auto` (the default) reads on a CUDA GPU with fp8 (compute capability 8.9+, Ada /
# Hopper / Blackwell), per SSM family: fp8 for every family. The read copy never reaches the recurrence (the exact
# flush: docs/layout.md), and its next-token KL to fp32 decoding is 1e-5 to 3e-5 nats and flat over 64K tokens on
# the trained tiny models (Mamba-2: 7.8e-6, 32K-64K / 1K-2K 1.06; GDN: 3.2e-5, 1.20, bench/results/fidelity_gdn_exact.json).
# CPUs and older GPUs read the fp32 checkpoint.
GPU_READ_COPY = {"mamba2": "fp8", "gdn": "fp8", "kda": "fp8"}
FP8_MIN_CAPABILITY = (8, 9)


def auto_read_copy(family: str, device) -> str:
    """The read copy `auto` stands for on `device` (a torch.device or its name) for SSM `family`."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < FP8_MIN_CAPABILITY:
        return "none"
    return GPU_READ_COPY.get(family, "none")


class FlagError(ValueError):
    """A bad ReplaySSM flag value; `flag` is the spelling the user typed."""

    def __init__(self, flag: str, message: str):
        super().__init__(f"{flag}: {message}")
        self.flag = flag


def _window(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    return value


def add_replayssm_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add the ReplaySSM flags (in their own argument group) to `parser`."""
    group = parser.add_argument_group("ReplaySSM")
    group.add_argument(
        "--replayssm-window", type=_window, default=16, metavar="L",
        help=f"records per sequence folded into the checkpoint at a flush (1..{MAX_WINDOW}, default 16)")
    group.add_argument(
        "--replayssm-ckpt-precision", choices=FLAG_CKPT_PRECISIONS, default="fp32",
        help="precision of the recurrence checkpoint (default fp32)")
    group.add_argument(
        "--replayssm-read-copy", choices=FLAG_READ_COPIES, default=AUTO,
        help="low-precision read copy written at each flush and read by non-flush steps (default auto: fp8 on a GPU "
             "with fp8, compute capability 8.9+; none, the fp32 checkpoint, otherwise)")
    group.add_argument(
        "--replayssm-decode", action=argparse.BooleanOptionalAction, default=True,
        help="decode SSM layers with ReplaySSM (--no-replayssm-decode: conventional state update)")
    group.add_argument(
        "--replayssm-verify", action=argparse.BooleanOptionalAction, default=True,
        help="verify speculative drafts with ReplaySSM output-only verify and pointer commit "
             "(--no-replayssm-verify: conventional per-draft stepping)")
    return group


@dataclasses.dataclass(frozen=True)
class ReplaySSMOptions:
    window: int = 16
    ckpt_precision: str = "fp32"
    read_copy: str = AUTO
    decode: bool = True
    verify: bool = True

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int):
            raise FlagError("--replayssm-window", f"expected an integer, got {self.window!r}")
        if not 1 <= self.window <= MAX_WINDOW:
            raise FlagError("--replayssm-window", f"must be in 1..{MAX_WINDOW}, got {self.window}")
        if self.ckpt_precision not in FLAG_CKPT_PRECISIONS:
            raise FlagError("--replayssm-ckpt-precision",
                            f"must be one of {', '.join(FLAG_CKPT_PRECISIONS)}, got {self.ckpt_precision!r}")
        if self.read_copy not in FLAG_READ_COPIES:
            raise FlagError("--replayssm-read-copy",
                            f"must be one of {', '.join(FLAG_READ_COPIES)}, got {self.read_copy!r}")
        for name, flag in (("decode", "--replayssm-decode"), ("verify", "--replayssm-verify")):
            if not isinstance(getattr(self, name), bool):
                raise FlagError(flag, f"expected true/false, got {getattr(self, name)!r}")
        quantized_read = self.read_copy not in ("none", AUTO)
        if not self.decode and (quantized_read or self.ckpt_precision != "fp32"):
            flag = "--replayssm-read-copy" if quantized_read else "--replayssm-ckpt-precision"
            raise FlagError(flag, "needs ReplaySSM decode (drop --no-replayssm-decode, "
                                  "or keep fp32 / none for the conventional baseline)")

    def check_model(self, head_k_dim: int) -> None:
        """Checks that depend on the model's SSM geometry."""
        error = read_copy_geometry_error(self.read_copy, head_k_dim)
        if error:
            raise FlagError("--replayssm-read-copy", error)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ReplaySSMOptions":
        return cls(window=args.replayssm_window, ckpt_precision=args.replayssm_ckpt_precision,
                   read_copy=args.replayssm_read_copy, decode=args.replayssm_decode,
                   verify=args.replayssm_verify)

    @classmethod
    def parse(cls, argv: Sequence[str]) -> "ReplaySSMOptions":
        """Parse ReplaySSM flags alone (e.g. the part split off by split_argv)."""
        parser = argparse.ArgumentParser(prog="python -m sglang_replayssm.launch", add_help=False, allow_abbrev=False)
        add_replayssm_args(parser)
        return cls.from_args(parser.parse_args(list(argv)))

    def to_argv(self) -> list[str]:
        return ["--replayssm-window", str(self.window),
                "--replayssm-ckpt-precision", self.ckpt_precision,
                "--replayssm-read-copy", self.read_copy,
                "--replayssm-decode" if self.decode else "--no-replayssm-decode",
                "--replayssm-verify" if self.verify else "--no-replayssm-verify"]

    def to_env(self) -> dict[str, str]:
        return {ENV_VAR: json.dumps(dataclasses.asdict(self), sort_keys=True)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ReplaySSMOptions":
        """Options stored by to_env(); defaults when the variable is unset."""
        text = (os.environ if environ is None else environ).get(ENV_VAR)
        if not text:
            return cls()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise FlagError(ENV_VAR, f"not valid JSON: {e}") from None
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise FlagError(ENV_VAR, f"unknown keys {sorted(unknown)}")
        return cls(**data)

    def read_copy_for(self, family: str, device) -> str:
        """The read copy a pool of `family` on `device` keeps: the flag's value, or what `auto` stands for there
        (none with --no-replayssm-decode)."""
        if self.read_copy != AUTO:
            return self.read_copy
        return auto_read_copy(family, device) if self.decode else "none"

    def replay_config(self, max_drafts: int = 0, *, family: str, device, **overrides):
        """The ReplayConfig of a pool of SSM `family` on `device` for these options (lazy import of the pool)."""
        from sglang_replayssm.pool import ReplayConfig

        kwargs = dict(window=self.window, max_drafts=max_drafts, ckpt=self.ckpt_precision,
                      read_copy=self.read_copy_for(family, device), mode="replay" if self.decode else "conventional")
        kwargs.update(overrides)
        return ReplayConfig(**kwargs)


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split argv into (ReplaySSM flags, everything else); accepts `--flag value` and `--flag=value`."""
    ours, rest = [], []
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        spec = FLAG_SPELLINGS.get(name)
        if spec is None:
            rest.append(arg)
        else:
            ours.append(arg)
            if spec[1] and "=" not in arg:
                if i + 1 >= len(argv):
                    raise FlagError(name, "expected a value")
                ours.append(argv[i + 1])
                i += 1
        i += 1
    return ours, rest
