"""The Triton decode/verify attention (reads the per-slot KV cache in place) against PyTorch SDPA on
gathered K/V, for grouped queries, several tokens per row and shuffled slots."""

import os

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="Triton needs a GPU or TRITON_INTERPRET=1 (tests/conftest.py)")


@pytest.mark.parametrize("B, Hkv, G, T, D, L", [(3, 2, 2, 1, 16, 40), (2, 2, 3, 3, 32, 70), (1, 1, 1, 1, 24, 5),
                                                (2, 1, 4, 5, 16, 130)])
def test_cache_attention_matches_sdpa(B, Hkv, G, T, D, L):
    from sglang_replayssm.native.attention import cache_attention
    dev = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    g = torch.Generator().manual_seed(B * 100 + T)
    S = B + 3
    kc, vc = torch.randn(S, 160, Hkv, D, generator=g).to(dev), torch.randn(S, 160, Hkv, D, generator=g).to(dev)
    slots = torch.randperm(S, generator=g)[:B].to(dev)
    pos = torch.randint(0, L - T + 1, (B,), generator=g).to(dev)
    positions = pos[:, None] + torch.arange(T, device=dev)
    q = torch.randn(B, Hkv, T * G, D, generator=g).to(dev)
    qpos = positions.repeat_interleave(G, dim=1)
    length = int(positions.max()) + 1
    out = cache_attention(q, kc, vc, slots, qpos, length, D ** -0.5)
    K, V = kc[slots, :length].transpose(1, 2), vc[slots, :length].transpose(1, 2)
    mask = (torch.arange(length, device=dev)[None, None, :] <= qpos[:, :, None])[:, None]
    ref = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=D ** -0.5)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="dtype"):
        cache_attention(q.double(), kc, vc, slots, qpos, length, 1.0)
