"""Prompt-prefix cache of the native engine: whole sequence states kept in spare pool slots.

An SSM state is only valid at the exact token it was taken at, so an entry is keyed by a token
sequence (a prompt without its last token) and holds a slot with that sequence's checkpoint
(flushed, empty ring), conv state and KV cache (`pool.fork` + `KVCache.copy`). A new prompt that
extends a key starts from a fork of the entry and prefills only the rest. Entries live in slots no
running request needs: they are evicted (least recently used first) as soon as a request waits.

What the engine reports about its entries (GET /v1/replayssm/load) names them without their text:
`hashes()` (an id of each token sequence) and `block_lists()` (the chained block hashes of each
entry's decoded text, `scheduler.prefix_tree.block_hashes`, which the Ray router's prefix tree is
keyed by), computed once when the entry is inserted.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict


def prefix_hash(tokens) -> str:
    """Short hex name of a token sequence (what /v1/replayssm/load reports)."""
    return hashlib.sha1(",".join(map(str, tokens)).encode()).hexdigest()[:12]


class PrefixCache:
    def __init__(self, max_entries: int, min_tokens: int = 8):
        self.max_entries, self.min_tokens = max_entries, min_tokens
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

    def insert(self, key, slot: int, blocks: list | None = None) -> None:
        self.entries[tuple(key)] = slot
        self.blocks[tuple(key)] = list(blocks or ())

    def evict(self) -> int:
        """Drop the least recently used entry; returns its slot (for the caller to free)."""
        key, slot = self.entries.popitem(last=False)
        self.blocks.pop(key, None)
        return slot

    def hashes(self) -> list[str]:
        return [prefix_hash(k) for k in self.entries]

    def block_lists(self) -> list[list[str]]:
        return [self.blocks.get(k, []) for k in self.entries]
