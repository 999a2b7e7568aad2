"""Random inputs for the three families, and a conventional per-sequence oracle."""

from __future__ import annotations

import torch

from sglang_replayssm.pool import SSMGeometry
from sglang_replayssm.reference import FAMILY_MODULES


def random_inputs(geo: SSMGeometry, batch: int, dtype=torch.float64, drafts: int | None = None, gen=None):
    """Raw per-token inputs of ``geo.family`` (``[batch, ...]``, or ``[batch, drafts, ...]``)."""
    H, V, K, Hk = geo.num_heads, geo.head_v_dim, geo.head_k_dim, geo.num_k_heads
    lead = (batch,) if drafts is None else (batch, drafts)
    r = lambda *s: torch.randn(*lead, *s, dtype=dtype, generator=gen)  # noqa: E731
    if geo.family == "mamba2":
        return dict(x=r(H, V), dt=r(H) - 1.0, B=r(Hk, K) * 0.5, C=r(Hk, K) * 0.5, z=r(H, V))
    a = r(H, K) if geo.family == "kda" else r(H)
    return dict(q=r(Hk, K), k=r(Hk, K), v=r(H, V), a=a, b=r(H))


def random_params(geo: SSMGeometry, dtype=torch.float64, gen=None):
    H, K = geo.num_heads, geo.head_k_dim
    if geo.family == "mamba2":
        return dict(A=-torch.rand(H, dtype=dtype, generator=gen) - 0.1, D=torch.randn(H, dtype=dtype, generator=gen),
                    dt_bias=torch.randn(H, dtype=dtype, generator=gen) * 0.5)
    dtb = torch.randn(H, K, dtype=dtype, generator=gen) if geo.family == "kda" else torch.randn(H, dtype=dtype, generator=gen)
    return dict(A_log=torch.randn(H, dtype=dtype, generator=gen) * 0.5 - 1.0, dt_bias=dtb)


def call(fn, geo: SSMGeometry, inputs: dict, params: dict, *lead, **kw):
    """Call a family function (conventional_step / decode / verify) with raw inputs in its order."""
    if geo.family == "mamba2":
        return fn(*lead, inputs["x"], inputs["dt"], params["A"], inputs["B"], inputs["C"], params["D"],
                  params["dt_bias"], inputs.get("z"), **kw)
    return fn(*lead, inputs["q"], inputs["k"], inputs["v"], inputs["a"], inputs["b"], params["A_log"],
              params["dt_bias"], **kw)


def conventional(geo, state, inputs, params):
    return call(FAMILY_MODULES[geo.family].conventional_step, geo, inputs, params, state)


def index_inputs(inputs: dict, idx) -> dict:
    return {k: v[idx] for k, v in inputs.items()}


def relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-300)).item()
