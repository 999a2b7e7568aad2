"""A verify's draft-tree parents from SGLang's first-child / next-sibling arrays in one Triton launch
(kernels/draft_tree.py), against the PyTorch reference (reference.replay.tree_parents), and the reference against
the trees the arrays were made from."""
import random

import pytest
import torch

from sglang_replayssm.kernels import draft_tree
from sglang_replayssm.reference import replay as ref

from .helpers import DEV


def _sglang_arrays(parents):
    """SGLang's retrieve_next_token / retrieve_next_sibling of a tree (nodes in draft order, parents first)."""
    T = len(parents)
    nxt, sib, last_child = [-1] * T, [-1] * T, {}
    for n, p in enumerate(parents):
        if p >= 0:
            if p in last_child:
                sib[last_child[p]] = n
            else:
                nxt[p] = n
            last_child[p] = n
    return nxt, sib


def _random_tree(rng, T):
    """Node 0 the root; every later node hangs off an earlier one (chains, stars and bushes)."""
    shape = rng.choice(["chain", "star", "any"])
    return [-1] + [n - 1 if shape == "chain" else 0 if shape == "star" else rng.randrange(n) for n in range(1, T)]


@pytest.mark.parametrize("T", [1, 2, 4, 7, 16, 33])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_tree_parents_match_reference_and_the_trees(T, dtype):
    rng = random.Random(T)
    trees = [_random_tree(rng, T) for _ in range(5)]
    arrays = [_sglang_arrays(p) for p in trees]
    nxt = torch.tensor([a[0] for a in arrays], dtype=dtype, device=DEV)
    sib = torch.tensor([a[1] for a in arrays], dtype=dtype, device=DEV)
    if T > 1:   # out-of-range entries count as "none" (SGLang pads with -1; the reference sinks any other value)
        sib[0, -1] = T
    want = torch.full((5, T), 7, dtype=torch.int32, device=DEV)
    got = torch.full((5, T), 7, dtype=torch.int32, device=DEV)
    ref.tree_parents(nxt, sib, want)
    draft_tree.tree_parents(nxt, sib, got)
    assert want.tolist() == trees
    assert torch.equal(got, want)


def test_tree_parents_checks_and_empty_batch():
    out = torch.zeros(0, 4, dtype=torch.int32, device=DEV)
    draft_tree.tree_parents(torch.zeros(0, 4, dtype=torch.int64, device=DEV),
                            torch.zeros(0, 4, dtype=torch.int64, device=DEV), out)
    with pytest.raises(ValueError, match="out must have dtype"):
        draft_tree.tree_parents(torch.zeros(2, 4, dtype=torch.int64, device=DEV),
                                torch.zeros(2, 4, dtype=torch.int64, device=DEV), torch.zeros(2, 4, device=DEV))
