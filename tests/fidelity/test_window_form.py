"""bench/fidelity.py's batched window-form decode equals the reference ReplaySSM decode on a real
ReplayStatePool (token by token, reference/replay.py), for every precision configuration the bench uses."""

import pytest
import torch
import torch.nn.functional as F

from bench.fidelity import CONFIGS, windowed_ssm
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry
from sglang_replayssm.reference import gdn, mamba2

T, LAYER = 48, 1          # three windows; layer 1 of a two-layer pool (stochastic-rounding element index)


def _raw(family, g):
    if family == "mamba2":
        H, P, N, G = 4, 8, 16, 2
        geo = SSMGeometry("mamba2", H, P, N, G)
        raw = dict(x=torch.randn(1, T, H, P, generator=g), dt=torch.randn(1, T, H, generator=g),
                   A=-torch.empty(H).uniform_(0.05, 0.5, generator=g), B=torch.randn(1, T, G, N, generator=g),
                   C=torch.randn(1, T, G, N, generator=g), D=torch.zeros(H), dt_bias=torch.zeros(H))
        dts = F.softplus(raw["dt"] + raw["dt_bias"])
        core = (raw["C"], raw["B"], dts.unsqueeze(-1) * raw["x"], dts * raw["A"], None)
        return geo, raw, core
    H, Hk, K, V = 4, 2, 16, 8
    geo = SSMGeometry("gdn", H, V, K, Hk)
    raw = dict(q=torch.randn(1, T, Hk, K, generator=g), k=torch.randn(1, T, Hk, K, generator=g),
               v=torch.randn(1, T, H, V, generator=g) * 3, a=torch.randn(1, T, H, generator=g),
               b=torch.randn(1, T, H, generator=g), A_log=torch.full((H,), -2.0), dt_bias=torch.zeros(H))
    qn, kn, v, gg, beta = gdn.prep(raw["q"], raw["k"], raw["v"], raw["a"], raw["b"], raw["A_log"], raw["dt_bias"])
    return geo, raw, (qn, kn, v, gg, beta)


def _reference(family, geo, raw, spec):
    ckpt, rc, shared = spec
    pool = ReplayStatePool(geo, 2, 1, ReplayConfig(window=16, max_drafts=0, ckpt=ckpt, read_copy=rc,
                                                   shared_quant=shared))
    slots = torch.tensor(pool.alloc(1), dtype=torch.int32)
    outs = []
    for t in range(T):
        if family == "mamba2":
            o = mamba2.decode(pool, LAYER, slots, raw["x"][:, t], raw["dt"][:, t], raw["A"], raw["B"][:, t],
                              raw["C"][:, t], raw["D"], raw["dt_bias"])
        else:
            o = gdn.decode(pool, LAYER, slots, raw["q"][:, t], raw["k"][:, t], raw["v"][:, t], raw["a"][:, t],
                           raw["b"][:, t], raw["A_log"], raw["dt_bias"])
        pool.advance(slots.long())
        outs.append(o[0])
    return torch.stack(outs)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_window_form_matches_reference_pool(family):
    g = torch.Generator().manual_seed(7)
    geo, raw, core = _raw(family, g)
    names = list(CONFIGS)
    R = len(names)
    batched = tuple(None if t is None else t.repeat(R, *([1] * (t.dim() - 1))) for t in core)
    ours = windowed_ssm(*batched, [CONFIGS[n] for n in names], LAYER)
    exact = _reference(family, geo, raw, CONFIGS["fp32"])
    scale = exact.norm()
    for r, name in enumerate(names):
        ref = _reference(family, geo, raw, CONFIGS[name])
        mismatch = (ours[r] - ref).norm() / scale
        if name == "fp32":
            assert mismatch < 1e-5, (name, mismatch)
            continue
        effect = (ref - exact).norm() / scale          # what the precision does to the outputs
        assert effect > 1e-4, (name, effect)           # the configuration changes something ...
        assert mismatch < 1e-3 * effect, (name, float(mismatch), float(effect))   # ... and we reproduce it
