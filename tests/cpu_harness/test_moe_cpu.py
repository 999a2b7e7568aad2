"""SGLang's MoE experts on CPU (``sglang.srt.layers.moe.fused_moe_native.moe_forward_native``, the path its CPU engine
takes without AMX) with the harness's completion (``bridge._moe_routed_scaling_on_cpu``): the weighted sum of the
chosen experts' SwiGLU outputs scaled by the layer's ``routed_scaling_factor``, as SGLang's GPU runner computes it,
against a loop over tokens and experts. Served: tests/sglang_server/test_kda_server.py (Kimi Linear's MoE blocks,
``routed_scaling_factor`` 2.446, against an fp64 forward)."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from sglang_replayssm.cpu_harness.bridge import install

pytest.importorskip("sglang", reason="SGLang's MoE path needs the sglang package")
install()   # `import sgl_kernel` needs the stand-in on a machine without a CUDA driver

from sglang.srt.layers.moe import fused_moe_native  # noqa: E402
from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig  # noqa: E402

E, D, I, TOPK, TOKENS = 4, 16, 8, 2, 5


def _loop(x, w13, w2, weights, ids, factor):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate, up = (x[t] @ w13[e].T).split(I)
            out[t] += weights[t, k] * ((F.silu(gate) * up) @ w2[e].T)
    return out * (1.0 if factor is None else factor)


@pytest.mark.parametrize("factor", [2.446, 1.0, None])
def test_cpu_experts_apply_the_routed_scaling_factor(factor):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(TOKENS, D, generator=g, dtype=torch.float64)
    w13 = torch.randn(E, 2 * I, D, generator=g, dtype=torch.float64)
    w2 = torch.randn(E, D, I, generator=g, dtype=torch.float64)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(TOKENS)]).to(torch.int32)
    weights = torch.rand(TOKENS, TOPK, generator=g, dtype=torch.float64)
    layer = types.SimpleNamespace(w13_weight=w13, w2_weight=w2, num_experts=E,
                                  should_fuse_routed_scaling_factor_in_topk=False)
    cfg = MoeRunnerConfig(activation="silu", routed_scaling_factor=factor)
    got = fused_moe_native.moe_forward_native(layer, x, (weights, ids, None), cfg)
    want = _loop(x, w13, w2, weights, ids, factor)
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-10), (got - want).abs().max()


def test_a_factor_the_router_already_applied_is_not_applied_twice():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(TOKENS, D, generator=g, dtype=torch.float64)
    w13 = torch.randn(E, 2 * I, D, generator=g, dtype=torch.float64)
    w2 = torch.randn(E, D, I, generator=g, dtype=torch.float64)
    ids = torch.zeros(TOKENS, 1, dtype=torch.int32)
    weights = torch.ones(TOKENS, 1, dtype=torch.float64)
    layer = types.SimpleNamespace(w13_weight=w13, w2_weight=w2, num_experts=E,
                                  should_fuse_routed_scaling_factor_in_topk=True)
    got = fused_moe_native.moe_forward_native(layer, x, (weights, ids, None),
                                              MoeRunnerConfig(activation="silu", routed_scaling_factor=3.0))
    assert torch.allclose(got, _loop(x, w13, w2, weights, ids, None), rtol=1e-10, atol=1e-10)
