"""Verify (output-only, chain and tree) + commit by pointer == conventional decoding of the accepted tokens."""

import random

import pytest
import torch

from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry
from sglang_replayssm.reference import FAMILY_MODULES
from tests.reference.helpers import call, conventional, index_inputs, random_inputs, random_params, relerr


def random_tree(rng: random.Random, T: int) -> list[int]:
    return [-1] + [rng.randrange(-1, i) for i in range(1, T)]


def random_path(rng: random.Random, parents: list[int]) -> list[int]:
    """A random root-to-node path of the tree (possibly empty)."""
    node = rng.randrange(-1, len(parents))
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("window", [1, 3, 8])
def test_verify_commit_matches_conventional(family, tree, window):
    rng = random.Random(f"{family}{tree}{window}")
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    geo = SSMGeometry(family, 4, 5, 8, 2)
    Tmax = 5
    params = random_params(geo, torch.float64, gen)
    fam = FAMILY_MODULES[family]
    pool = ReplayStatePool(geo, 1, 3, ReplayConfig(window=window, max_drafts=Tmax, ckpt="fp64", record_dtype=torch.float64))
    slots = pool.alloc(2)
    idx = torch.tensor(slots)
    state = torch.zeros(2, *geo.state_shape, dtype=torch.float64)
    for _round in range(25):
        if rng.random() < 0.4:  # an ordinary decode step in between
            inp = random_inputs(geo, 2, gen=gen)
            want, state = conventional(geo, state, inp, params)
            got = call(fam.decode, geo, inp, params, pool, 0, idx)
            pool.advance(idx)
            assert relerr(got, want) < 1e-10
            continue
        T = rng.randint(1, Tmax)
        parents = [random_tree(rng, T) for _ in slots] if tree else None
        inp = random_inputs(geo, 2, drafts=T, gen=gen)
        pool.begin_verify(slots, T, parents)
        out = call(fam.verify, geo, inp, params, pool, 0, idx, parents=None if parents is None else torch.tensor(parents))
        accepted, paths = [], []
        for b in range(2):
            par = parents[b] if tree else list(range(-1, T - 1))
            # every draft's output equals the conventional recurrence along its path
            node_states = {}
            for i in range(T):
                src = state[b:b + 1] if par[i] < 0 else node_states[par[i]]
                o, node_states[i] = conventional(geo, src, index_inputs(inp, (slice(b, b + 1), i)), params)
                assert relerr(out[b, i], o[0]) < 1e-10
            path = random_path(rng, par) if tree else list(range(rng.randint(0, T)))
            accepted.append(len(path))
            paths.append(path)
            if path:
                state[b] = node_states[path[-1]][0]
        pool.accept_drafts(slots, accepted, paths if tree else None)
        assert relerr(pool.materialize(0, slots), state) < 1e-10
        assert int(pool.cursor[idx].max()) < window


@pytest.mark.parametrize("family", ["gdn", "mamba2"])
def test_conventional_mode_snapshots_match(family):
    """The baseline scheme (one state snapshot per draft, restore on commit) gives the same results."""
    rng = random.Random(1)
    gen = torch.Generator().manual_seed(2)
    geo = SSMGeometry(family, 2, 4, 8, 1)
    params = random_params(geo, torch.float64, gen)
    fam = FAMILY_MODULES[family]
    replay = ReplayStatePool(geo, 1, 1, ReplayConfig(window=4, max_drafts=4, ckpt="fp64", record_dtype=torch.float64))
    conv = ReplayStatePool(geo, 1, 1, ReplayConfig(window=1, max_drafts=4, ckpt="fp64", mode="conventional"))
    s1, s2 = replay.alloc(1), conv.alloc(1)
    for _ in range(12):
        T = rng.randint(1, 4)
        parents = [random_tree(rng, T)]
        inp = random_inputs(geo, 1, drafts=T, gen=gen)
        outs = []
        for pool, s in ((replay, s1), (conv, s2)):
            pool.begin_verify(s, T, parents)
            outs.append(call(fam.verify, geo, inp, params, pool, 0, torch.tensor(s), parents=parents))
        assert relerr(outs[0], outs[1]) < 1e-10
        path = random_path(rng, parents[0])
        replay.accept_drafts(s1, [len(path)], [path])
        conv.accept_drafts(s2, [len(path)], [path])
        assert relerr(replay.materialize(0, s1), conv.materialize(0, s2)) < 1e-10
