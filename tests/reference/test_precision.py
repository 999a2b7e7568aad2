"""Separate precisions: a low-precision read copy beside a high-precision recurrence checkpoint keeps
the error flat with length; quantizing the recurrence state itself (shared) lets it grow."""

import pytest
import torch

from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry
from sglang_replayssm.reference import mamba2, quant
from tests.reference.helpers import relerr


def long_run(configs: dict[str, ReplayConfig], steps: int, seed: int = 0):
    """Mamba-2 with decays close to 1 (long memory) and random inputs; per-step relative output
    error of every configuration against fp64 conventional decoding."""
    gen = torch.Generator().manual_seed(seed)
    geo = SSMGeometry("mamba2", 2, 8, 16, 1)
    A = -torch.full((2,), 1e-4, dtype=torch.float64)
    D = torch.zeros(2, dtype=torch.float64)
    dt_bias = torch.zeros(2, dtype=torch.float64)
    pools = {}
    for name, cfg in configs.items():
        p = ReplayStatePool(geo, 1, 1, cfg)
        pools[name] = (p, torch.tensor(p.alloc(1)))
    state = torch.zeros(1, *geo.state_shape, dtype=torch.float64)
    errs = {name: [] for name in configs}
    for _ in range(steps):
        x = torch.randn(1, 2, 8, dtype=torch.float64, generator=gen)
        dt = torch.zeros(1, 2, dtype=torch.float64)
        B = torch.randn(1, 1, 16, dtype=torch.float64, generator=gen)
        C = torch.randn(1, 1, 16, dtype=torch.float64, generator=gen)
        want, state = mamba2.conventional_step(state, x, dt, A, B, C, D, dt_bias)
        for name, (p, idx) in pools.items():
            got = mamba2.decode(p, 0, idx, x.float(), dt.float(), A.float(), B.float(), C.float(), D.float(), dt_bias.float())
            p.advance(idx)
            errs[name].append(relerr(got, want))
    return {k: torch.tensor(v) for k, v in errs.items()}


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_read_copy_error_flat_shared_error_grows(fmt):
    steps = 1600
    errs = long_run({
        "read_copy": ReplayConfig(window=16, read_copy=fmt),
        "read_copy_fp16sr": ReplayConfig(window=16, read_copy=fmt, ckpt="fp16-sr", sr_seed=1),
        "shared": ReplayConfig(window=16, read_copy=fmt, shared_quant=True),
    }, steps)
    early = slice(100, 400)
    late = slice(steps - 300, steps)
    for name in ("read_copy", "read_copy_fp16sr"):
        e = errs[name]
        assert e[late].mean() < 1.5 * e[early].mean(), (name, e[early].mean(), e[late].mean())
    s = errs["shared"]
    assert s[late].mean() > 2.0 * s[early].mean(), (s[early].mean(), s[late].mean())
    # and at the end the shared checkpoint is clearly worse than the read copy of the same format
    assert s[late].mean() > 2.0 * errs["read_copy"][late].mean()


def test_fp8_rows_roundtrip():
    x = torch.randn(3, 4, 5, 32) * torch.logspace(-3, 3, 32)
    q, scale = quant.quant_fp8_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == x.shape[:-1]
    y = quant.dequant_fp8_rows(q, scale)
    # e4m3 has 3 mantissa bits: relative error of each element <= 2^-4 unless it underflows the row's range
    big = x.abs() > x.abs().amax(-1, keepdim=True) * 2 ** -6
    assert ((y - x).abs() <= x.abs() * 2 ** -4 + 1e-30)[big].all()
    assert torch.equal(quant.dequant_fp8_rows(*quant.quant_fp8_rows(torch.zeros(2, 8))), torch.zeros(2, 8))


def test_nvfp4_roundtrip_and_packing():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 64, generator=gen)
    packed, bs, gs = quant.quant_nvfp4(x)
    assert packed.shape == (2, 3, 4, 32) and packed.dtype == torch.uint8
    assert bs.shape == (2, 3, 4, 4) and bs.dtype == torch.float8_e4m3fn and gs.shape == (2, 3)
    y = quant.dequant_nvfp4(packed, bs, gs)
    # each element within half an e2m1 step (<= 1 at the top of the range) of its block scale, plus e4m3 scale rounding
    blocks = x.unflatten(-1, (-1, 16)).abs().amax(-1, keepdim=True)
    err = (y - x).unflatten(-1, (-1, 16)).abs()
    assert (err <= blocks / 6 * 1.0 * 1.07 + 1e-6).all()
    assert relerr(y, x) < 0.15
    # exact values survive: every e2m1 magnitude times one block scale
    vals = torch.tensor(quant.E2M1_VALUES * 2)
    z = torch.cat([vals, -vals]).view(1, 1, 1, 32)
    assert torch.equal(quant.dequant_nvfp4(*quant.quant_nvfp4(z)), z)


def test_fp16_stochastic_rounding_is_unbiased_and_reproducible():
    x = torch.full((200_000,), 1.0 + 2 ** -12)   # a quarter of the way from 1 to the next fp16 (1 + 2^-10)
    idx = torch.arange(x.numel())
    r1 = quant.round_fp16_sr(x, seed=3, stream=5, idx=idx)
    r2 = quant.round_fp16_sr(x, seed=3, stream=5, idx=idx)
    r3 = quant.round_fp16_sr(x, seed=3, stream=6, idx=idx)
    assert torch.equal(r1, r2) and not torch.equal(r1, r3)
    assert set(r1.float().unique().tolist()) == {1.0, 1.0 + 2 ** -10}
    frac_up = (r1.float() > 1.0).float().mean().item()
    assert abs(frac_up - 0.25) < 0.01
    assert abs(r1.float().mean().item() - (1.0 + 2 ** -12)) < 2e-5
    exact = torch.tensor([0.5, -2.0, 1024.0])
    assert torch.equal(quant.round_fp16_sr(exact, 0, 0, torch.arange(3)).float(), exact)
    u = quant.sr_uniform(1, 2, torch.arange(100_000))
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
