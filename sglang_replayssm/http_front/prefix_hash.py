"""Prompt prefixes as chained block hashes: the form in which engines report the prefixes they hold and the
Ray router's prefix tree (`scheduler/prefix_tree.py`) keys them, never the text itself.

The text is cut into fixed-size character blocks and block i is named by a chained hash,
h_i = sha256(h_{i-1} + block_i) (first HASH_HEX hex digits kept), so one hash stands for the whole prefix up to
the end of its block. The native engine reports its cached prefixes so (`cached_prefix_blocks` in
GET /v1/replayssm/load): prompt text never leaves an engine, and a hash identifies a prefix only to someone who
already has its text. Standard library only.
"""

from __future__ import annotations

import hashlib

BLOCK_CHARS = 16          # the default block size (engines report with it; see PolicyConfig.block_chars)
HASH_HEX = 16             # hex digits of a block hash kept (64 bits: collisions only cost a cache miss)
MAX_REPORTED_BLOCKS = 512  # an engine reports at most this many blocks (8192 characters) per prefix


def block_hashes(text: str, block_chars: int = BLOCK_CHARS, max_blocks: int | None = None) -> list[str]:
    """Chained hashes of the full `block_chars`-character blocks of `text` (a shorter tail is dropped):
    entry i is the first HASH_HEX hex digits of sha256(digest_{i-1} + UTF-8 of block i)."""
    out: list[str] = []
    digest = b""
    stop = len(text) - block_chars + 1
    if max_blocks is not None:
        stop = min(stop, max_blocks * block_chars)
    for i in range(0, stop, block_chars):
        digest = hashlib.sha256(digest + text[i:i + block_chars].encode("utf-8", "surrogatepass")).digest()
        out.append(digest.hex()[:HASH_HEX])
    return out
