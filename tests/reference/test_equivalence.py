"""Reference ReplaySSM (checkpoint + records, flushes) == the plain conventional recurrence."""

import pytest
import torch

from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry
from sglang_replayssm.reference import FAMILY_MODULES, core
from tests.reference.helpers import call, conventional, random_inputs, random_params, relerr

GEOMETRIES = [
    ("mamba2", 4, 6, 8, 2),
    ("mamba2", 3, 5, 7, 1),
    ("gdn", 4, 8, 16, 2),
    ("gdn", 2, 5, 12, 2),
    ("kda", 4, 8, 16, 4),
    ("kda", 2, 6, 9, 1),
]


def run_decode(geo, window, steps, dtype, ckpt, seed, batch=3):
    """Decode ``steps`` tokens for ``batch`` sequences (started at different offsets so their flushes
    fall on different steps) and return the worst output and final-state errors vs conventional."""
    gen = torch.Generator().manual_seed(seed)
    params = random_params(geo, dtype, gen)
    pool = ReplayStatePool(geo, 1, batch + 1, ReplayConfig(window=window, max_drafts=2, ckpt=ckpt, record_dtype=dtype))
    slots = pool.alloc(batch)
    idx = torch.tensor(slots)
    state = torch.zeros(batch, *geo.state_shape, dtype=dtype)
    fam = FAMILY_MODULES[geo.family]
    worst = 0.0
    active = torch.zeros(batch, dtype=torch.bool)
    for t in range(steps):
        active |= torch.arange(batch) <= t   # row b joins at step b
        rows = active.nonzero().flatten()
        inp = {k: v[rows] for k, v in random_inputs(geo, batch, dtype, gen=gen).items()}
        want, new_state = conventional(geo, state[rows], inp, params)
        state[rows] = new_state
        got = call(fam.decode, geo, inp, params, pool, 0, idx[rows])
        pool.advance(idx[rows])
        worst = max(worst, relerr(got, want))
        assert int(pool.cursor[idx].max()) < window
    final = relerr(pool.materialize(0, slots), state)
    return worst, final


@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: f"{g[0]}-{g[1]}x{g[2]}x{g[3]}-g{g[4]}")
@pytest.mark.parametrize("window", [1, 2, 3, 8, 16, 32])
def test_float64_matches_conventional(geom, window):
    geo = SSMGeometry(geom[0], geom[1], geom[2], geom[3], geom[4])
    worst, final = run_decode(geo, window, steps=70, dtype=torch.float64, ckpt="fp64", seed=window)
    assert worst < 1e-10, worst
    assert final < 1e-10, final


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_thousands_of_steps(family):
    geo = SSMGeometry(family, 2, 4, 8, 1)
    worst64, final64 = run_decode(geo, 16, steps=2000, dtype=torch.float64, ckpt="fp64", seed=7, batch=2)
    worst32, final32 = run_decode(geo, 16, steps=2000, dtype=torch.float32, ckpt="fp32", seed=7, batch=2)
    assert worst64 < 1e-10 and final64 < 1e-10, (worst64, final64)
    assert worst32 < 2e-4 and final32 < 2e-4, (worst32, final32)


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_window_one_is_conventional(family):
    """L = 1: every step is a flush, the ring never holds a committed record, and the checkpoint is the
    conventional state after every step."""
    geo = SSMGeometry(family, 2, 4, 8, 2)
    gen = torch.Generator().manual_seed(3)
    params = random_params(geo, torch.float64, gen)
    pool = ReplayStatePool(geo, 1, 2, ReplayConfig(window=1, max_drafts=1, ckpt="fp64", record_dtype=torch.float64))
    slots = pool.alloc(1)
    idx = torch.tensor(slots)
    state = torch.zeros(1, *geo.state_shape, dtype=torch.float64)
    for _ in range(30):
        inp = random_inputs(geo, 1, gen=gen)
        want, state = conventional(geo, state, inp, params)
        got = call(FAMILY_MODULES[family].decode, geo, inp, params, pool, 0, idx)
        pool.advance(idx)
        assert int(pool.cursor[slots[0]]) == 0
        assert relerr(got, want) < 1e-12
        assert relerr(pool.ckpt[0, slots[0]], state[0]) < 1e-12


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_float32_pool_matches_float32_conventional(family):
    geo = SSMGeometry(family, 4, 8, 16, 2)
    worst, final = run_decode(geo, 8, steps=100, dtype=torch.float32, ckpt="fp32", seed=11)
    assert worst < 1e-4 and final < 1e-4, (worst, final)


def test_matrix_form_equals_token_loop():
    """The two-matmul verify (W * K^T Q, triangular delta solve) == the per-token unrolled loop."""
    gen = torch.Generator().manual_seed(5)
    dt = torch.float64
    H, V, K, T, c = 3, 5, 8, 6, 4
    for delta in (False, True):
        for per_channel in (False, True):
            kd = K if per_channel else 1
            S0 = torch.randn(H, V, K, dtype=dt, generator=gen)
            rec = core.Records(torch.randn(c, H, V, dtype=dt, generator=gen), torch.randn(c, H, K, dtype=dt, generator=gen),
                               -torch.rand(c, H, kd, dtype=dt, generator=gen).expand(c, H, K))
            q, k = torch.randn(T, H, K, dtype=dt, generator=gen), torch.randn(T, H, K, dtype=dt, generator=gen) * 0.3
            v = torch.randn(T, H, V, dtype=dt, generator=gen)
            g = -torch.rand(T, H, kd, dtype=dt, generator=gen).expand(T, H, K).clone()
            beta = torch.rand(T, H, dtype=dt, generator=gen) if delta else None
            for parents in (None, [-1, 0, 0, 1, -1, 3]):
                o1, d1 = core.evaluate_tokens(S0, rec, q, k, v, g, beta, parents)
                o2, d2 = core.verify_matrix_form(S0, rec, q, k, v, g, beta, parents)
                assert relerr(o2, o1) < 1e-12 and relerr(d2, d1) < 1e-12
                # and both equal stepping the conventional recurrence along each node's path
                S = core.fold(S0, rec)
                par = parents or list(range(-1, T - 1))
                states = {}
                for i in range(T):
                    o, states[i] = core.conventional_step(S if par[i] < 0 else states[par[i]], q[i], k[i], v[i], g[i],
                                                          None if beta is None else beta[i])
                    assert relerr(o1[i], o) < 1e-12
