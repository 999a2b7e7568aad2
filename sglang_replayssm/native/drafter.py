"""Model-free drafter for speculative decoding: prompt lookup (n-gram matching over the sequence).

The last n tokens (n = max_ngram .. min_ngram) are looked up in the earlier part of the sequence
(prompt + output); the tokens that followed the most recent match are the drafts.
"""

from __future__ import annotations


def propose(tokens: list[int], num_drafts: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    if num_drafts <= 0:
        return []
    L = len(tokens)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        tail = tokens[L - n:]
        for i in range(L - n - 1, -1, -1):   # most recent earlier occurrence first
            if tokens[i:i + n] == tail:
                return tokens[i + n:i + n + num_drafts]
    return []
