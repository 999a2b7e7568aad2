"""Prefix cache of the native engine: exact sequence states kept in spare pool slots, on a grid of tokens.

An SSM state is only valid at the exact token it was taken at, so an entry is keyed by a token
sequence and holds a slot with that sequence's whole state: checkpoint, committed record ring, conv
state and KV cache, copied whole (`pool.fork` + `KVCache.copy`; nothing folded, the live slot untouched).
A new prompt that extends a key starts from a fork of the longest such entry and prefills only the rest.

Which states are kept (the SGLang plugin's `--mamba-radix-cache-strategy extra_buffer` semantics, with
`interval` = `--prefix-cache-interval` as SGLang's `--mamba-track-interval`; `admission.py` cuts prefill
chunks at these boundaries, `step_runner.py` copies a decoding slot when it reaches one):
* at prefill, `prompt_cuts`: the last grid boundary of the prompt (few-shot prompts that share their
  examples hit there), the grid boundary at which the prompt leaves the longest cached sequence it
  shares tokens with (`branch_point`: a fork of an earlier request; the next fork of the same prefix
  hits there), and the prompt without its last token (an exact repeat, a retry, a next turn);
* at decode, the last grid boundary a sequence reached (`on_grid`; each boundary's entry replaces the
  previous one of the same sequence, as SGLang's track slot): a multi-turn request that extends an
  earlier answer hits at the last boundary the answer reached.
Entries live in slots no running request needs: they are evicted (least recently used first) as soon
as a request waits. A prefill state takes a spare slot or, when the pool is full or the cache holds
`max_entries`, the slot of the least recently used entry but the request's branching point; a decode
state only a spare slot.

What the engine reports about its entries (GET /v1/replayssm/load) names them without their text:
`hashes()` (an id of each token sequence) and `block_lists()` (the chained block hashes of each
entry's decoded text, `http_front.prefix_hash.block_hashes`, which the Ray router's prefix tree is
keyed by), computed once when the entry is inserted.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict


def prefix_hash(tokens) -> str:
    """Short hex name of a token sequence (what /v1/replayssm/load reports)."""
    return hashlib.sha1(",".join(map(str, tokens)).encode()).hexdigest()[:12]


def common_prefix_len(a: tuple, b: tuple) -> int:
    """How many leading tokens two token tuples share (a bisection of slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:   # a[:lo] == b[:lo], a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo


class PrefixCache:
    def __init__(self, max_entries: int, interval: int = 64, min_tokens: int = 8):
        self.max_entries, self.interval, self.min_tokens = max_entries, interval, min_tokens
        self.entries: OrderedDict[tuple, int] = OrderedDict()   # key -> slot, least recently used first
        self.blocks: dict[tuple, list] = {}                      # key -> block hashes of its text
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def wants(self, key) -> bool:
        return self.enabled and len(key) >= self.min_tokens and tuple(key) not in self.entries

    def on_grid(self, n: int) -> bool:
        """Whether a sequence of n tokens ends on a grid boundary (a decoding slot's state is kept there)."""
        return self.enabled and n > 0 and n % self.interval == 0

    def next_boundary(self, n: int) -> int:
        """The first grid boundary after n tokens."""
        return (n // self.interval + 1) * self.interval

    def lookup(self, prompt: list) -> tuple[int, int] | None:
        """(slot, length) of the longest entry that is a proper prefix of prompt."""
        best = None
        for key, slot in self.entries.items():
            n = len(key)
            if n < len(prompt) and (best is None or n > best[1]) and tuple(prompt[:n]) == key:
                best = (slot, n)
        if best is not None:
            key = tuple(prompt[:best[1]])
            self.entries.move_to_end(key)
            self.hits += 1
            self.hit_tokens += best[1]
        return best

    def branch_point(self, prompt: list) -> int:
        """The grid boundary at which prompt leaves the longest cached sequence it shares tokens with (0: none)."""
        p = tuple(prompt)
        shared = max((common_prefix_len(p, k) for k in self.entries), default=0)
        return min(shared, len(prompt) - 1) // self.interval * self.interval

    def prompt_cuts(self, prompt: list, start: int, branch: int) -> tuple[int, ...]:
        """The prompt lengths past `start` (what a hit gave) whose states the cache wants from the prefill:
        the branching point `branch`, the prompt's last grid boundary, and the prompt without its last token;
        ascending."""
        if not self.enabled:
            return ()
        key = len(prompt) - 1
        cuts = {branch, key // self.interval * self.interval, key}
        return tuple(sorted(b for b in cuts if b > start and self.wants(prompt[:b])))

    def insert(self, key, slot: int, blocks: list | None = None) -> None:
        self.entries[tuple(key)] = slot
        self.blocks[tuple(key)] = list(blocks or ())

    def evict(self, skip=()) -> int | None:
        """Drop the least recently used entry whose key is not in `skip`; returns its slot (for the caller to
        free), None when there is none."""
        key = next((k for k in self.entries if k not in skip), None)
        if key is None:
            return None
        self.blocks.pop(key, None)
        return self.entries.pop(key)

    def remove(self, key) -> int | None:
        """Drop the entry of key if there is one; returns its slot (for the caller to free)."""
        self.blocks.pop(tuple(key), None)
        return self.entries.pop(tuple(key), None)

    def hashes(self) -> list[str]:
        return [prefix_hash(k) for k in self.entries]

    def block_lists(self) -> list[list[str]]:
        return [self.blocks.get(k, []) for k in self.entries]
