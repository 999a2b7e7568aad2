"""The GPU harness's PyTorch stand-ins for compiled sgl_kernel ops (sglang_replayssm/gpu_harness/gpu_ops.py),
against plain loop/formula references. The ops are device-agnostic PyTorch, so they are checked here on CPU
tensors; on the H200 bench/h200/h200_probe.py checks them against SGLang's own implementations on CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_replayssm.gpu_harness import gpu_ops


def _align_reference(ids: torch.Tensor, buckets: int, bs: int, ignore_invalid: bool):
    flat = (ids.flatten() + 1).tolist()
    sorted_ids, experts = [], []
    for b in range(buckets):
        if b == 0 and ignore_invalid:
            continue
        members = [i for i, x in enumerate(flat) if x == b]
        if not members:
            continue
        pad = (len(members) + bs - 1) // bs * bs
        sorted_ids += members + [len(flat)] * (pad - len(members))
        experts += [b - 1] * (pad // bs)
    return sorted_ids, experts


@pytest.mark.parametrize("tokens,topk,experts,bs", [(5, 2, 4, 16), (7, 4, 64, 16), (3, 10, 512, 64), (300, 8, 128, 64)])
@pytest.mark.parametrize("ignore_invalid", [False, True])
def test_moe_align_block_size(tokens, topk, experts, bs, ignore_invalid):
    g = torch.Generator().manual_seed(tokens * experts)
    ids = torch.randint(-1, experts, (tokens, topk), dtype=torch.int32, generator=g)
    buckets = experts + 1
    cap = (ids.numel() + buckets * (bs - 1) + 3) // 4 * 4
    st = torch.full((cap,), -7, dtype=torch.int32)
    ex = torch.full(((cap + bs - 1) // bs,), -7, dtype=torch.int32)
    n = torch.zeros(1, dtype=torch.int32)
    cs = torch.zeros(buckets + 1, dtype=torch.int32)
    gpu_ops.moe_align_block_size(ids, buckets, bs, st, ex, n, cs, True, ignore_invalid)
    ref_ids, ref_experts = _align_reference(ids, buckets, bs, ignore_invalid)
    assert int(n) == len(ref_ids)
    assert st[: len(ref_ids)].tolist() == ref_ids
    assert ex[: len(ref_experts)].tolist() == ref_experts
    assert (ex[len(ref_experts):] == -1).all()


def test_topk_softmax_renormalized():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 16, generator=g)
    w, i = torch.empty(9, 4), torch.empty(9, 4, dtype=torch.int32)
    gpu_ops.topk_softmax(w, i, logits, True, 0.0, None)
    ref = torch.softmax(logits, -1).topk(4, -1)
    assert torch.equal(i.long(), ref.indices)
    torch.testing.assert_close(w, ref.values / ref.values.sum(-1, keepdim=True))


def test_norms_and_activations():
    g = torch.Generator().manual_seed(2)
    x, r, w = torch.randn(5, 32, generator=g), torch.randn(5, 32, generator=g), torch.randn(32, generator=g)
    out = torch.empty_like(x)
    gpu_ops.gemma_rmsnorm(out, x, w, 1e-6, False)
    torch.testing.assert_close(out, x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * (w + 1))
    xi, ri = x.clone(), r.clone()
    gpu_ops.fused_add_rmsnorm(xi, ri, w, 1e-6, False)
    torch.testing.assert_close(ri, x + r)
    torch.testing.assert_close(xi, (x + r) / ((x + r).pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w)
    a = torch.empty(5, 16)
    gpu_ops.silu_and_mul(a, x)
    torch.testing.assert_close(a, F.silu(x[:, :16]) * x[:, 16:])


@pytest.mark.parametrize("is_neox", [True, False])
def test_partial_rotary_embedding(is_neox):
    g = torch.Generator().manual_seed(3)
    head, rot, T = 16, 8, 4
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    freqs = torch.arange(32).float()[:, None] * inv[None, :]
    cache = torch.cat([freqs.cos(), freqs.sin()], -1)
    pos = torch.tensor([0, 3, 7, 31])
    q = torch.randn(T, 2 * head, generator=g)
    q2 = q.clone()
    gpu_ops.rotary_embedding(pos, q2, None, head, cache, is_neox)
    qv, ov = q.view(T, 2, head), q2.view(T, 2, head)
    assert torch.equal(ov[..., rot:], qv[..., rot:])                   # the un-rotated part passes through
    for t in range(T):
        for j in range(rot // 2):
            c, s = freqs[pos[t], j].cos(), freqs[pos[t], j].sin()
            a, b = (j, j + rot // 2) if is_neox else (2 * j, 2 * j + 1)
            torch.testing.assert_close(ov[t, :, a], qv[t, :, a] * c - qv[t, :, b] * s)
            torch.testing.assert_close(ov[t, :, b], qv[t, :, b] * c + qv[t, :, a] * s)


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_moe_sum_reduce(scale):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 10, 32, generator=g).to(torch.bfloat16)
    out = torch.full((6, 32), float("nan"), dtype=torch.bfloat16)
    gpu_ops.moe_sum_reduce(x, out, scale)
    ref = [[scale * sum(float(x[t, k, h]) for k in range(10)) for h in range(32)] for t in range(6)]
    torch.testing.assert_close(out.float(), torch.tensor(ref), rtol=8e-3, atol=8e-3)
