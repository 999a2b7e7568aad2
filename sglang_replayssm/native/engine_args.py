"""The native engine's arguments (`EngineArgs`) and their one check (`EngineArgs.check`).

`launch.py` builds EngineArgs from the command line and reports a failed check as an error naming the
flag (exit 2); `Engine` runs the same check and refuses to start. Pure Python: no torch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..flags import ReplaySSMOptions

EMBEDDED_PREFIX = "embedded"   # --model-path of the built-in random-weight model: embedded[:mamba2|:gdn]
ASSETS = Path(__file__).resolve().parent / "assets"   # the trained tiny models that ship in the package
DEFAULT_MODEL = "tiny-gdn-hybrid"                     # what the launcher serves without --model-path


def default_model_path() -> str:
    """The folder of the model the launcher serves without --model-path (a trained model, readable answers)."""
    return str(ASSETS / DEFAULT_MODEL)
MAX_DRAFT_TOKENS = 64          # --speculative-num-draft-tokens at most


@dataclasses.dataclass
class EngineArgs:
    model_path: str | None = None        # None / "embedded" / "embedded:gdn": the built-in model (random weights;
                                         # the launcher's default is default_model_path(), a trained one)
    device: str = "cpu"
    dtype: str = "auto"                  # auto: float32 on CPU, bfloat16 on CUDA
    max_running_requests: int = 8        # pool slots
    max_model_len: int = 1024
    chunk_size: int = 256                # prefill tokens per request per step
    speculative_num_draft_tokens: int = 0
    speculative_disable_by_batch_size: int = 0   # no drafts while this many requests decode together (0: never)
    replayssm: ReplaySSMOptions = dataclasses.field(default_factory=ReplaySSMOptions)
    seed: int = 0
    prefix_cache_entries: int = 0        # prefix states kept in spare slots (0: off)
    prefix_cache_interval: int = 64      # the grid (tokens) of the states kept (prefix_cache.py)
    kernels: str = "auto"                # auto (Triton on CUDA) | triton | reference
    tokenizer: str = "auto"              # auto: the folder's HF tokenizer if it has one | byte (tokenizer.py)
    served_model_name: str | None = None # the name clients use (`model`); default from the model path

    @property
    def embedded_family(self) -> str | None:
        """The built-in model's family ("mamba2" or "gdn"), or None for a model folder."""
        if self.model_path and not self.model_path.startswith(EMBEDDED_PREFIX):
            return None
        return self.model_path.split(":", 1)[1] if self.model_path and ":" in self.model_path else "mamba2"

    @property
    def served_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.embedded_family is not None:
            return f"replayssm-embedded-{self.embedded_family}"
        return self.model_path.rstrip("/").split("/")[-1]

    def check(self) -> None:
        """ValueError('--flag: why') for the first value the engine cannot run with (the flag is the
        launcher's name of the field)."""
        for flag, value, lo in (("--max-running-requests", self.max_running_requests, 1),
                                ("--context-length", self.max_model_len, 2),
                                ("--chunked-prefill-size", self.chunk_size, 1),
                                ("--speculative-num-draft-tokens", self.speculative_num_draft_tokens, 0),
                                ("--speculative-disable-by-batch-size", self.speculative_disable_by_batch_size, 0),
                                ("--prefix-cache-entries", self.prefix_cache_entries, 0),
                                ("--prefix-cache-interval", self.prefix_cache_interval, 1)):
            if value < lo:
                raise ValueError(f"{flag}: must be >= {lo}, got {value}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("--served-model-name: must not be empty")
        if self.speculative_num_draft_tokens > MAX_DRAFT_TOKENS:
            raise ValueError(f"--speculative-num-draft-tokens: at most {MAX_DRAFT_TOKENS}")
        if self.speculative_disable_by_batch_size and not self.speculative_num_draft_tokens:
            raise ValueError("--speculative-disable-by-batch-size: needs --speculative-num-draft-tokens > 0")
