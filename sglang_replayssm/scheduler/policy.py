"""The routing policy: cache affinity, overload override, and batch packing for ReplaySSM.

A pure function of what the router knows (per-replica load, per-replica matched prefix length) so
it can be read, unit-tested and benchmarked without Ray. In order:

1. **Prefix affinity.** The replica holding the longest cached prefix of the prompt (at least
   `min_prefix_chars`) gets the request: its ReplaySSM checkpoint / KV for that prefix is reused.
2. **Overload override.** ...unless that replica is overloaded compared with the others: its load
   is at or above `target_batch` AND exceeds the least-loaded replica's by `imbalance_threshold`
   or more. Below `target_batch` a replica is still filling its batch, so affinity always wins.
3. **Packing (no usable prefix).** ReplaySSM pays off at large decode batches, so load is not
   spread thinly: the request goes to the *most* loaded replica whose load is still below
   `target_batch` (ties broken by a fixed replica order, so idle replicas stay idle and can be
   scaled down). Only when every replica is at `target_batch` does the policy spill:
4. **Spill.** least loaded replica (or power of two random choices, `spill="power_of_two"`).

`target_batch` None (the default) is each replica's own slot count (`total_slots` in its load
report: the batch it decodes at once; DEFAULT_TARGET_BATCH for a replica that reports none): a
fixed target above a replica's slots would queue requests on a full replica while another idles.

`policy="spread"` replaces step 3 with step 4 (classic least-loaded), for comparison in bench/.
Load = requests on the replica as the router counts them (state.RouterState.loads).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence

POLICIES = ("pack", "spread")
SPILLS = ("least_loaded", "power_of_two")

# decision labels (also the `decision` label of the router's routing metric)
PREFIX_HIT = "prefix_hit"
LOAD_OVERRIDE = "load_override"
PACK = "pack"
SPILL = "spill"
DECISIONS = (PREFIX_HIT, LOAD_OVERRIDE, PACK, SPILL)
DEFAULT_TARGET_BATCH = 32   # target batch of a replica that reports no total_slots (target_batch None)


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    policy: str = "pack"
    target_batch: int | None = None   # pack each replica up to this many requests (None: its slots)
    imbalance_threshold: int = 8    # affinity replica overloaded when load - min_load >= this ...
    min_prefix_chars: int = 32      # ... shorter matches are not worth affinity
    spill: str = "least_loaded"
    block_chars: int = 16           # prefix tree granularity

    def validate(self) -> "PolicyConfig":
        if self.policy not in POLICIES:
            raise ValueError(f"--route-policy must be one of {POLICIES}, got {self.policy!r}")
        if self.spill not in SPILLS:
            raise ValueError(f"--route-spill must be one of {SPILLS}, got {self.spill!r}")
        if self.target_batch is not None and (isinstance(self.target_batch, bool)
                                              or not isinstance(self.target_batch, int) or self.target_batch < 1):
            raise ValueError(f"--route-target-batch must be an integer >= 1, got {self.target_batch!r}")
        if self.imbalance_threshold < 1:
            raise ValueError(f"--route-imbalance-threshold must be >= 1, got {self.imbalance_threshold}")
        if self.min_prefix_chars < 0:
            raise ValueError(f"--route-min-prefix-chars must be >= 0, got {self.min_prefix_chars}")
        if self.block_chars < 1:
            raise ValueError(f"--route-block-chars must be >= 1, got {self.block_chars}")
        return self


@dataclasses.dataclass(frozen=True)
class Choice:
    ranked: list[str]        # replica ids, most preferred first (all candidates appear once)
    decision: str            # one of DECISIONS
    matched_chars: int = 0   # prefix length held by the affinity replica (0: none)
    affinity: str | None = None  # the replica holding the longest prefix, if any


def target_batch(cfg: PolicyConfig, slots: int | None) -> int:
    """A replica's target batch: cfg.target_batch, else its slot count, else DEFAULT_TARGET_BATCH."""
    if cfg.target_batch is not None:
        return cfg.target_batch
    if isinstance(slots, int) and not isinstance(slots, bool) and slots >= 1:
        return slots
    return DEFAULT_TARGET_BATCH


def choose(loads: dict[str, int], matches: dict[str, int], cfg: PolicyConfig,
           order: Sequence[str] | None = None, rng: random.Random | None = None,
           slots: dict[str, int] | None = None) -> Choice:
    """Rank the candidate replicas (keys of `loads`) for one request.

    loads: replica -> requests in flight; matches: replica -> matched prefix characters;
    order: the fixed replica order used to break ties (default: sorted ids);
    slots: replica -> its reported total_slots (the target batch when cfg.target_batch is None).
    """
    if not loads:
        raise ValueError("no candidate replicas")
    target = {r: target_batch(cfg, (slots or {}).get(r)) for r in loads}
    order = list(order) if order is not None else sorted(loads)
    order = [r for r in order if r in loads] + sorted(r for r in loads if r not in set(order))
    pos = {r: i for i, r in enumerate(order)}

    def load_rank(exclude: str | None = None) -> tuple[list[str], str]:
        rest = [r for r in order if r != exclude]
        if not rest:
            return [], SPILL
        filling = [r for r in rest if loads[r] < target[r]]
        if cfg.policy == "pack" and filling:
            # fullest replica that still has room first, then the others by the same rule
            first = sorted(filling, key=lambda r: (-loads[r], pos[r]))
            full = sorted((r for r in rest if r not in filling), key=lambda r: (loads[r], pos[r]))
            return first + full, PACK
        ranked = sorted(rest, key=lambda r: (loads[r], pos[r]))
        if cfg.spill == "power_of_two" and len(ranked) >= 2:
            g = rng or random
            a, b = g.sample(rest, 2)
            pick = min((a, b), key=lambda r: (loads[r], g.random()))  # ties: random, as Serve's default
            ranked = [pick] + [r for r in ranked if r != pick]
        return ranked, SPILL

    best = None
    best_len = 0
    for r, m in matches.items():
        if r not in loads or m < max(cfg.min_prefix_chars, 1):
            continue
        if m > best_len or (m == best_len and (loads[r], pos[r]) < (loads[best], pos[best])):
            best, best_len = r, m
    if best is not None:
        others_min = min((loads[r] for r in loads if r != best), default=loads[best])
        overloaded = (loads[best] >= target[best]
                      and loads[best] - others_min >= cfg.imbalance_threshold)
        if not overloaded:
            rest, _ = load_rank(exclude=best)
            return Choice([best] + rest, PREFIX_HIT, best_len, best)
        ranked, _ = load_rank(exclude=best)
        return Choice(ranked + [best], LOAD_OVERRIDE, best_len, best)
    ranked, decision = load_rank()
    return Choice(ranked, decision, 0, None)
