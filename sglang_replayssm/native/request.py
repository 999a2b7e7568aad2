"""One sequence the native engine generates: its prompt, sampling parameters, slot, output so far.

A request with `n` samples is `n` Requests sharing one `group` (sample 0 first): sample 0 prefills the
prompt, the others wait (`awaiting_fork`) and then start from a fork of its state.
"""

from __future__ import annotations

import dataclasses

import torch

from .sampling import SamplingParams


@dataclasses.dataclass
class Request:
    rid: str
    prompt: list
    params: SamplingParams
    output: list = dataclasses.field(default_factory=list)
    slot: int | None = None
    prefilled: int = 0
    sent: int = 0                        # characters of output text already emitted
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    resumed: int = 0                     # output tokens that came with the request (a resume), prefilled
    index: int = 0                       # which of the request's n samples (choices) this is
    group: list = dataclasses.field(default_factory=list)   # all n samples of the request (this one included)
    awaiting_fork: bool = False          # a sample k > 0 before sample 0's prefill is forked into its slot
    stop_from: int = 0                   # text length when min_tokens was reached (stop strings end after it)
    cache_cuts: tuple = ()               # prompt lengths whose states the prefix cache keeps (admission.py)
    cache_branch: int = 0                # where the prompt leaves the cached sequences (a grid boundary; 0: none)
    decode_entry: tuple | None = None    # the key of the prefix-cache entry kept at its last decode boundary

    @property
    def tokens(self) -> list:
        return self.prompt + self.output

    @property
    def prefill_len(self) -> int:
        """Tokens to prefill before decoding: the prompt, and the output a resumed request came with."""
        return len(self.prompt) + self.resumed

    @property
    def in_prefill(self) -> bool:
        """Has prompt left to prefill, and its own state to prefill it into (not a sample awaiting a fork)."""
        return self.prefilled < self.prefill_len and self.finish_reason is None and not self.awaiting_fork

    @property
    def in_decode(self) -> bool:
        return self.prefilled == self.prefill_len and bool(self.output) and self.finish_reason is None

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that changes the logits: the batched argmax is its token."""
        return self.params.temperature == 0 and not self.params.processed
