"""Geometry of one family's SSM layers and the ReplaySSM configuration of a pool."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..state_formats import CKPT_PRECISIONS, READ_COPIES, read_copy_geometry_error
from .errors import ConfigError

FAMILIES = ("mamba2", "gdn", "kda")
CKPT_DTYPES = {"fp32": torch.float32, "fp16-sr": torch.float16, "fp64": torch.float64}   # by CKPT_PRECISIONS
MODES = ("replay", "conventional")
RECORD_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass(frozen=True)
class SSMGeometry:
    """Per-layer shapes. ``num_heads`` value heads of state ``[head_v_dim, head_k_dim]``; keys (GDN/KDA
    k-heads, Mamba-2 groups) come in ``num_k_heads`` groups. Mamba-2: ``head_v_dim`` = headdim P,
    ``head_k_dim`` = d_state N. ``conv_dim`` / ``conv_kernel`` size the short-convolution state."""

    family: str
    num_heads: int
    head_v_dim: int
    head_k_dim: int
    num_k_heads: int
    conv_dim: int = 0
    conv_kernel: int = 4

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ConfigError(f"family must be one of {FAMILIES}, got {self.family!r}")
        for name in ("num_heads", "head_v_dim", "head_k_dim", "num_k_heads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_k_heads:
            raise ConfigError(f"num_heads ({self.num_heads}) must be a multiple of num_k_heads ({self.num_k_heads})")
        if self.conv_dim < 0 or self.conv_kernel < 1:
            raise ConfigError("conv_dim must be >= 0 and conv_kernel >= 1")

    @property
    def state_shape(self) -> tuple[int, int, int]:
        return (self.num_heads, self.head_v_dim, self.head_k_dim)

    @property
    def per_channel_decay(self) -> bool:
        return self.family == "kda"

    @property
    def delta_rule(self) -> bool:
        """GDN and KDA: a token's record value ``d = beta (v - S' k)`` depends on the state."""
        return self.family in ("gdn", "kda")


@dataclass(frozen=True)
class ReplayConfig:
    """How states are kept.

    * ``window``: records per checkpoint (L); a flush folds them. ``window=1`` is conventional decoding.
    * ``max_drafts``: most draft tokens one verify may append; the ring holds ``window + max_drafts``.
    * ``ckpt``: recurrence checkpoint precision, ``fp32`` / ``fp16-sr`` (fp16, stochastic rounding at
      each flush) / ``fp64`` (tests).
    * ``read_copy``: low-precision copy written at each flush and read by non-flush steps.
    * ``shared_quant``: the checkpoint itself is quantized like the read copy (the scheme we compare
      against; error then accumulates).
    * ``mode``: ``replay``, or ``conventional`` (state rewritten every token; verify keeps one state
      snapshot per draft, as SGLang does) for baselines.
    """

    window: int = 16
    max_drafts: int = 8
    ckpt: str = "fp32"
    read_copy: str = "none"
    shared_quant: bool = False
    record_dtype: torch.dtype = torch.float32
    sr_seed: int = 0
    mode: str = "replay"

    def __post_init__(self):
        if not isinstance(self.window, int) or self.window < 1:
            raise ConfigError(f"window must be an integer >= 1, got {self.window!r}")
        if not isinstance(self.max_drafts, int) or self.max_drafts < 0:
            raise ConfigError(f"max_drafts must be an integer >= 0, got {self.max_drafts!r}")
        if self.ckpt not in CKPT_PRECISIONS:
            raise ConfigError(f"ckpt precision must be one of {CKPT_PRECISIONS}, got {self.ckpt!r}")
        if self.read_copy not in READ_COPIES:
            raise ConfigError(f"read_copy must be one of {READ_COPIES}, got {self.read_copy!r}")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.record_dtype not in RECORD_DTYPES:
            raise ConfigError(f"record_dtype must be one of {RECORD_DTYPES}, got {self.record_dtype}")
        if self.shared_quant and self.read_copy == "none":
            raise ConfigError("shared_quant needs a read_copy format (fp8 or nvfp4) to quantize the checkpoint to")
        if self.shared_quant and self.ckpt == "fp16-sr":
            raise ConfigError("shared_quant replaces the checkpoint by the read copy: combine it with ckpt='fp32', not 'fp16-sr'")
        if self.mode == "conventional" and (self.read_copy != "none" or self.ckpt == "fp16-sr"):
            raise ConfigError("mode='conventional' keeps one full-precision state: read_copy must be 'none' and ckpt fp32/fp64")
        if self.ckpt == "fp64" and self.read_copy != "none":
            raise ConfigError("ckpt='fp64' is for exactness tests: it cannot be combined with a quantized read copy")

    def check_geometry(self, geometry: SSMGeometry) -> None:
        """The checks that need the states' shape (``state_formats.read_copy_geometry_error``)."""
        error = read_copy_geometry_error(self.read_copy, geometry.head_k_dim)
        if error:
            raise ConfigError(f"read_copy={self.read_copy!r}: {error}")

    def value_record_dtype(self, act_dtype: torch.dtype) -> torch.dtype:
        """The dtype of a delta family's raw ``v`` records (``rec_v``): the activations' dtype where it is a 16-bit
        float (``v`` arrives in it, so the copy is exact, at half the bytes of an fp32 record), else the record
        dtype (fp64 with an fp64 checkpoint)."""
        if self.ckpt == "fp64":
            return torch.float64
        return act_dtype if act_dtype in (torch.bfloat16, torch.float16) else self.record_dtype

    @property
    def folds_exactly(self) -> bool:
        """Whether a delta family's folds solve the window's d's again from the checkpoint (its records then keep the
        raw v and beta too): only beside a read copy. Without one every stored d was computed from the checkpoint
        itself, so the linear fold of the stored d's is already exact (and cheaper)."""
        return self.read_copy != "none"

    @property
    def ring_capacity(self) -> int:
        return self.window + self.max_drafts

    @property
    def ckpt_dtype(self) -> torch.dtype:
        return CKPT_DTYPES[self.ckpt]

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.float64 if self.ckpt == "fp64" else torch.float32
