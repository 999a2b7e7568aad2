"""pool.accept_drafts' CUDA-graph path (chain commits of few rows replay a captured graph of the fold, the pointer
moves and the conv roll) against the eager path: bit-identical pools over a sequence of commits with
changing rows, accepted counts and folds, trees in between (eager). CUDA only: there is no graph on CPU."""
import random

import pytest
import torch

import sglang_replayssm.pool.pool as pool_mod
from sglang_replayssm.family_ops import FamilyOps

from .helpers import clone_pool, make_pool

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def test_graphed_commit_matches_eager(monkeypatch):
    g = torch.Generator().manual_seed(11)
    graphed = make_pool("gdn", gen=g, max_drafts=4, window=4, num_slots=6)
    eager = clone_pool(graphed)
    for p in (graphed, eager):
        p.ops = FamilyOps.triton("gdn")
        p.conv = torch.randn(p.num_layers, p.num_slots + 1, 12, 3, generator=g).to(p.device)
        p.conv_in = torch.randn(p.num_layers, p.num_slots + 1, 4, 12, generator=g).to(p.device)
    eager.conv, eager.conv_in = graphed.conv.clone(), graphed.conv_in.clone()
    rng = random.Random(3)
    for step in range(12):
        rows = rng.sample(range(1, 7), 3 if step % 3 else 2)       # two row counts: two graphs
        T = rng.randint(1, 4)
        tree = step == 5
        parents = [[-1, 0, 0, 1][:T] for _ in rows] if tree else None
        acc = [rng.randint(0, T) for _ in rows]
        paths = None
        if tree:
            paths = [[0, 2][:a] if T > 2 and a >= 1 else [0][:a] for a in acc]
            acc = [len(p) for p in paths]
        for p, graph in ((graphed, True), (eager, False)):
            monkeypatch.setattr(pool_mod, "COMMIT_GRAPH_MAX_BATCH", 64 if graph else 0)
            p.begin_verify(rows, T, parents)
            p.accept_drafts(rows, acc, paths)
        for name in ("cursor", "folded", "ckpt", "conv"):
            a, b = getattr(graphed, name), getattr(eager, name)
            assert torch.equal(a.view(torch.uint8) if a.is_floating_point() else a,
                               b.view(torch.uint8) if b.is_floating_point() else b), (step, name)
    assert len(graphed._commit_graphs) == 2 and not eager._commit_graphs
    assert int(graphed.folded.sum()) > 0    # the replays folded rows
