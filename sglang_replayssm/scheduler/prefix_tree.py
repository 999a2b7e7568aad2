"""Router-side prefix tree: which replica has served (and so likely caches) which prompt prefix.

ReplaySSM checkpoints (and attention KV) are per replica, so a request whose prompt starts with a
prefix some replica has already processed is cheapest on that replica. The tree is keyed by *block
hashes* of the prompt text, never by the text itself (`http_front/prefix_hash.block_hashes`: one chained
hash per fixed-size character block, standing for the whole prefix up to the end of its block). A node
stands for the prefix on its path and remembers, per replica, when that replica last served it. Matching
walks the hashes of a new prompt and reports, for each replica, how many leading characters it holds.
Engines report the prefixes they hold in the same form (the native engine's `cached_prefix_blocks` in
GET /v1/replayssm/load).

Pure Python (no ray): used by the request router inside the ingress process and unit-tested alone.
"""

from __future__ import annotations

import time
from typing import Iterable, Sequence

from ..http_front.prefix_hash import BLOCK_CHARS, block_hashes


class _Node:
    __slots__ = ("children", "replicas", "parent", "key")

    def __init__(self, parent: "_Node" | None, key: str):
        self.children: dict[str, _Node] = {}
        self.replicas: dict[str, float] = {}  # replica id -> last use (monotonic seconds)
        self.parent = parent
        self.key = key


class PrefixTree:
    """Block-granular prefix tree over the chained block hashes of prompt text.

    block_chars: prefixes are tracked at multiples of this many characters (a prompt shorter than
    one block is not tracked). max_nodes: when exceeded, least recently used leaves are evicted.
    """

    def __init__(self, block_chars: int = BLOCK_CHARS, max_nodes: int = 200_000, clock=time.monotonic):
        if block_chars < 1:
            raise ValueError(f"block_chars must be >= 1, got {block_chars}")
        if max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
        self.block_chars = block_chars
        self.max_nodes = max_nodes
        self._clock = clock
        self._root = _Node(None, "")
        self._num_nodes = 0

    def __len__(self) -> int:
        return self._num_nodes

    def hashes(self, text: str) -> list[str]:
        return block_hashes(text, self.block_chars)

    def insert(self, text: str, replica: str) -> None:
        """Record that `replica` has processed `text` (and so every block prefix of it)."""
        self.insert_hashes(self.hashes(text), replica)

    def insert_hashes(self, hashes: Sequence[str], replica: str) -> None:
        """Record a prefix given as its block hashes (`block_hashes` of its text, as engines report it)."""
        now = self._clock()
        node = self._root
        for h in hashes:
            child = node.children.get(h)
            if child is None:
                child = _Node(node, h)
                node.children[h] = child
                self._num_nodes += 1
            child.replicas[replica] = now
            node = child
        if self._num_nodes > self.max_nodes:
            self._evict(self._num_nodes - int(self.max_nodes * 0.9))

    def match(self, text: str, replicas: Iterable[str] | None = None) -> dict[str, int]:
        """Characters of `text` each replica holds as a prefix: {replica: matched_chars}.

        Only replicas in `replicas` (when given) are reported; replicas with no match are absent.
        """
        return self.match_hashes(self.hashes(text), replicas)

    def match_hashes(self, hashes: Sequence[str], replicas: Iterable[str] | None = None) -> dict[str, int]:
        wanted = None if replicas is None else set(replicas)
        out: dict[str, int] = {}
        node = self._root
        depth = 0
        now = self._clock()
        for h in hashes:
            node = node.children.get(h)
            if node is None:
                break
            depth += self.block_chars
            alive = [r for r in node.replicas if wanted is None or r in wanted]
            if not alive:
                break
            for r in alive:
                out[r] = depth
                node.replicas[r] = now
        return out

    def remove_replica(self, replica: str) -> None:
        """Forget everything `replica` holds (it died or was replaced: its caches are gone)."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            node.replicas.pop(replica, None)
            for key, child in list(node.children.items()):
                stack.append(child)
        self._prune(self._root)

    def replicas(self) -> set:
        seen: set = set()
        stack = [self._root]
        while stack:
            node = stack.pop()
            seen.update(node.replicas)
            stack.extend(node.children.values())
        return seen

    def _prune(self, node: _Node) -> bool:
        """Drop subtrees no replica holds; returns True when `node` itself is empty."""
        for key, child in list(node.children.items()):
            if self._prune(child):
                del node.children[key]
                self._num_nodes -= 1
        return not node.children and not node.replicas and node is not self._root

    def _evict(self, count: int) -> None:
        leaves = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self._root:
                leaves.append((max(node.replicas.values(), default=0.0), id(node), node))
        leaves.sort(key=lambda t: (t[0], t[1]))
        for _, _, leaf in leaves[:max(count, 1)]:
            parent = leaf.parent
            if parent is not None and parent.children.get(leaf.key) is leaf:
                del parent.children[leaf.key]
                self._num_nodes -= 1
