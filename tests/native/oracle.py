"""The oracle of the native-engine sampling tests: the model's logits after a token sequence, by one
fresh prefill of the whole sequence in a conventional (non-ReplaySSM) engine with the server's default
weights, no decode step, no drafts, no cache."""

import torch

from sglang_replayssm.flags import ReplaySSMOptions
from sglang_replayssm.native.engine import Engine, EngineArgs


class Oracle:
    def __init__(self, model_path: str | None = None):
        self.engine = Engine(EngineArgs(model_path=model_path, max_running_requests=1, max_model_len=2048,
                                        replayssm=ReplaySSMOptions(decode=False)))
        self.tokenizer = self.engine.tokenizer
        self._memo: dict = {}

    def logits(self, ids) -> torch.Tensor:
        """float32 logits [V] of the position after `ids`."""
        key = tuple(ids)
        if key not in self._memo:
            e = self.engine
            slot = e.pool.alloc(1)[0]
            try:
                dev = e.model.device
                out = e.model.forward(torch.tensor([list(ids)], device=dev), torch.tensor([0], device=dev),
                                      torch.tensor([slot], device=dev, dtype=torch.int32), "prefill", e.forward_ctx, len(ids))
            finally:
                e.pool.free([slot])
            self._memo[key] = out[0].float().cpu()
        return self._memo[key]

    def logprobs(self, ids) -> torch.Tensor:
        return torch.log_softmax(self.logits(ids), -1)
