"""Sampling of the native engine: a request's sampling parameters, the target distribution they make of
one position's logits, a token drawn from it, speculative sampling of point-mass drafts, and the raw
log-probabilities a client asked for.

The processed distribution of a position (SGLang's order): the model's logits, plus `logit_bias`;
`repetition_penalty` over prompt and output tokens (a positive logit divided, a negative one
multiplied); `frequency_penalty` x count and `presence_penalty` over the *generated* tokens (OpenAI);
EOS and `stop_token_ids` masked while fewer than `min_tokens` were generated; then / temperature,
softmax, `top_k`, `top_p` (smallest set reaching it), `min_p` (relative to the top probability).
Temperature 0 is the argmax of the processed logits.

Speculative sampling (`speculate`): a draft token x (a point mass, from the n-gram drafter) is accepted
with probability p(x) under the processed distribution p at its position; the first rejected one is
replaced by a sample of p with x removed and renormalised; after all are accepted a bonus token comes
from p at the next position. Each emitted token is then distributed exactly as p, as without drafts.

Log-probabilities (`token_logprobs`) are the model's raw ones: log-softmax of the logits before
bias, penalties, temperature and filtering (vLLM's default `raw_logprobs`; SGLang's
`RETURN_ORIGINAL_LOGPROB`).
"""

from __future__ import annotations

import dataclasses
import math

import torch

# temperatures below this sample greedily: logits / t overflows float32 for t ~ 1e-38 (NaN probabilities),
# and the distribution is one-hot long before that (SGLang and vLLM use the same kind of cut-off)
MIN_TEMPERATURE = 1e-5
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)   # int64 and uint64 seeds; a negative seed is taken mod 2^64
MAX_TOP_LOGPROBS = 20                      # OpenAI's limit for chat top_logprobs (vLLM's default max)
MAX_N = 64                                 # parallel samples of one prompt


class RequestError(ValueError):
    """A request the engine refuses (reported to the client as HTTP 400)."""


@dataclasses.dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1                      # -1 or 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict | None = None       # token id -> bias added to its logit
    stop: tuple = ()
    stop_token_ids: tuple = ()
    min_tokens: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    n: int = 1                           # parallel samples of the prompt (one prefill, forked)
    logprobs: int | None = None          # None: none; k: the chosen token's and the k most likely ones

    @property
    def processed(self) -> bool:
        """Whether anything but temperature/top-p/top-k/min-p changes the logits."""
        return bool(self.logit_bias or self.repetition_penalty != 1.0 or self.frequency_penalty
                    or self.presence_penalty or self.min_tokens)


def _check(cond, field: str, what: str) -> None:
    if not cond:
        raise RequestError(f"{field}: {what}")


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_params(params: SamplingParams, vocab_size: int) -> SamplingParams:
    """The sampling parameters the engine can run, or RequestError naming the field. A temperature
    below MIN_TEMPERATURE becomes 0 (greedy)."""
    p = params
    _check(_num(p.temperature) and p.temperature >= 0, "temperature", f"must be a finite number >= 0, got {p.temperature!r}")
    _check(_num(p.top_p) and 0 < p.top_p <= 1, "top_p", f"must be in (0, 1], got {p.top_p!r}")
    _check(isinstance(p.top_k, int) and (p.top_k == -1 or p.top_k >= 0), "top_k", "must be -1 (off) or >= 0")
    _check(_num(p.min_p) and 0 <= p.min_p <= 1, "min_p", f"must be in [0, 1], got {p.min_p!r}")
    _check(_num(p.repetition_penalty) and 0 < p.repetition_penalty <= 2, "repetition_penalty", "must be in (0, 2]")
    for name in ("frequency_penalty", "presence_penalty"):
        _check(_num(getattr(p, name)) and -2 <= getattr(p, name) <= 2, name, "must be in [-2, 2]")
    for t, b in (p.logit_bias or {}).items():
        _check(isinstance(t, int) and 0 <= t < vocab_size, "logit_bias",
               f"token id {t!r} outside the vocabulary (size {vocab_size})")
        _check(_num(b) and -100 <= b <= 100, "logit_bias", f"bias of token {t} must be in [-100, 100]")
    _check(all(isinstance(t, int) and 0 <= t < vocab_size for t in p.stop_token_ids), "stop_token_ids",
           f"token ids must be in the vocabulary (size {vocab_size})")
    _check(isinstance(p.min_tokens, int) and 0 <= p.min_tokens, "min_tokens", "must be >= 0")
    _check(p.min_tokens <= p.max_tokens, "min_tokens", f"must be <= max_tokens ({p.max_tokens})")
    _check(p.seed is None or (isinstance(p.seed, int) and SEED_RANGE[0] <= p.seed <= SEED_RANGE[1]), "seed",
           f"must be an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]")
    _check(isinstance(p.max_tokens, int) and p.max_tokens >= 1, "max_tokens", "must be >= 1")
    _check(isinstance(p.n, int) and 1 <= p.n <= MAX_N, "n", f"must be in [1, {MAX_N}]")
    _check(p.logprobs is None or (isinstance(p.logprobs, int) and 0 <= p.logprobs <= MAX_TOP_LOGPROBS), "logprobs",
           f"must be in [0, {MAX_TOP_LOGPROBS}]")
    if 0 < p.temperature < MIN_TEMPERATURE:
        p = dataclasses.replace(p, temperature=0.0)
    if p.top_k == 0:
        p = dataclasses.replace(p, top_k=-1)
    return p


def generator_for(params: SamplingParams, index: int = 0) -> torch.Generator | None:
    """The random stream of sample `index` of a request: from its seed (+ index, mod 2^64), else fresh."""
    if params.temperature == 0:
        return None
    seed = (params.seed + index) % (1 << 64) if params.seed is not None else torch.seed() % (2 ** 63)
    return torch.Generator().manual_seed(seed)


def processed_logits(p: SamplingParams, logits: torch.Tensor, prompt: list, output: list, eos_ids) -> torch.Tensor:
    """One position's float32 CPU logits after bias, penalties and the min_tokens mask."""
    x = logits.float().cpu().clone()
    if p.logit_bias:
        ids = torch.tensor(list(p.logit_bias), dtype=torch.long)
        x[ids] += torch.tensor(list(p.logit_bias.values()), dtype=torch.float32)
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt) | set(output)), dtype=torch.long)
        v = x[seen]
        x[seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and output:
        counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=x.numel()).float()
        x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
    if len(output) < p.min_tokens:
        stops = [t for t in (set(eos_ids) | set(p.stop_token_ids)) if 0 <= t < x.numel()]
        if stops:
            x[torch.tensor(stops, dtype=torch.long)] = -math.inf
    return x


def probabilities(p: SamplingParams, x: torch.Tensor) -> torch.Tensor:
    """The sampling distribution (temperature > 0) of processed logits x."""
    probs = torch.softmax(x / p.temperature, dim=-1)
    if p.top_k > 0 and p.top_k < probs.numel():
        kth = probs.topk(p.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if p.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < p.top_p * sorted_p.sum()   # smallest set reaching top_p
        keep[0] = True                                                     # never empty (a tiny top_p is top-1)
        sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
    if p.min_p > 0:
        probs = torch.where(probs >= p.min_p * probs.max(), probs, torch.zeros_like(probs))
    return probs / probs.sum()


def target(p: SamplingParams, logits: torch.Tensor, prompt: list, output: list, eos_ids):
    """(greedy token, None) at temperature 0, else (None, the processed distribution)."""
    x = processed_logits(p, logits, prompt, output, eos_ids) if p.processed else logits.float().cpu()
    if p.temperature == 0:
        return int(x.argmax()), None
    return None, probabilities(p, x)


def sample(p: SamplingParams, logits: torch.Tensor, prompt: list, output: list, eos_ids, generator) -> int:
    """The next token after prompt + output, drawn from the processed distribution."""
    tok, probs = target(p, logits, prompt, output, eos_ids)
    if probs is None:
        return tok
    return int(torch.multinomial(probs, 1, generator=generator))


def speculate(p: SamplingParams, logits: torch.Tensor, prompt: list, output: list, drafts: list, eos_ids,
              generator) -> list[int]:
    """The tokens a verify row emits: the accepted drafts, then one sampled token (a rejected draft's
    replacement, or the bonus token). `logits[j]` is the position after output + drafts[:j]."""
    out, emitted = list(output), []
    for j, x in enumerate(drafts):
        tok, probs = target(p, logits[j], prompt, out, eos_ids)
        if probs is None:
            accept = tok == x
        else:
            accept = float(torch.rand((), generator=generator)) < float(probs[x])
        if not accept:
            if probs is not None:          # sample p with x removed (p(x) < 1 here: u < 1 always accepts 1)
                residual = probs.clone()
                residual[x] = 0.0
                tok = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
            return emitted + [tok]
        out.append(x)
        emitted.append(x)
    return emitted + [sample(p, logits[len(drafts)], prompt, out, eos_ids, generator)]


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int, decode_one) -> list[dict]:
    """Raw log-probabilities of `tokens`, where `logits[j]` is the position that emitted tokens[j]:
    [{"token": text, "bytes": [...], "logprob": lp, "top": [[text, bytes, lp], ...]}, ...]."""
    lp = torch.log_softmax(logits[:len(tokens)].float(), dim=-1).cpu()
    out = []
    for j, t in enumerate(tokens):
        entry = {"id": t, "logprob": float(lp[j, t]), **decode_one(t), "top": []}
        if top:
            vals, ids = lp[j].topk(min(top, lp.shape[-1]))
            entry["top"] = [{**decode_one(int(i)), "id": int(i), "logprob": float(v)} for v, i in zip(vals, ids)]
        out.append(entry)
    return out
