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


# ---------------------------------------------------------------- split KV (flash decoding)

DEV = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"

# Triton's interpreter multiplies the raw bit patterns of bfloat16 tl.dot operands (triton-lang/triton#11584):
# bf16 is checked where the kernels are compiled (a GPU run of this file)
BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                                             reason="bf16 tl.dot is wrong in Triton's interpreter"))


def _ref_attention(q, kc, vc, slots, qpos, length, scale):
    """Masked softmax attention in float64 on gathered K/V; rows that see no key give zeros."""
    K = kc[slots.long(), :length].transpose(1, 2).double()                        # [B, Hkv, L, D]
    V = vc[slots.long(), :length].transpose(1, 2).double()
    s = q.double() @ K.transpose(-1, -2) * scale                                  # [B, Hkv, R, L]
    mask = (torch.arange(length, device=q.device)[None, None, :] <= qpos[:, :, None].long())[:, None]
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
    return p @ V


def _split_case(seed, D, dtype):
    """Random shapes; a padding slot 0 never used, slots a strided (non-contiguous) view; one sequence
    at position 0..3, so that the later chunks see none of its keys."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))   # noqa: E731
    B, Hkv, G, T = rnd(2, 3), rnd(1, 2), rnd(1, 3), rnd(1, 4)
    length = rnd(260, 300)                                                      # 5 chunks of 64 at most
    S = 2 * B + 1
    kc = torch.randn(S, 320, Hkv, D, generator=g).to(dtype)
    vc = torch.randn(S, 320, Hkv, D, generator=g).to(dtype)
    slots = torch.zeros(2 * B, dtype=torch.int64)
    slots[::2] = torch.randperm(S - 1, generator=g)[:B] + 1
    slots = slots[::2]                                                          # stride 2
    pos = torch.randint(0, length - T + 1, (B,), generator=g)
    pos[rnd(0, B - 1)] = rnd(0, 3)
    pos[rnd(0, B - 1)] = length - T                                            # one sees every key
    qpos = (pos[:, None] + torch.arange(T)).repeat_interleave(G, dim=1)         # [B, T * G]
    q = torch.randn(B, Hkv, T * G, D, generator=g).to(dtype)
    assert not slots.is_contiguous() and 0 not in slots.tolist()
    return q.to(DEV), kc.to(DEV), vc.to(DEV), slots.to(DEV), qpos.to(DEV), length


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 5])
@pytest.mark.parametrize("D", [16, 48])
def test_split_kv_matches_reference(D, num_splits, dtype):
    from sglang_replayssm.native.attention import cache_attention
    seed = D * 10 + num_splits + (0 if dtype == torch.float32 else 1000)
    q, kc, vc, slots, qpos, length = _split_case(seed, D, dtype)
    scale = D ** -0.5
    out = cache_attention(q, kc, vc, slots, qpos, length, scale, num_splits=num_splits)
    assert out.dtype == dtype and out.shape == q.shape
    ref = _ref_attention(q, kc, vc, slots, qpos, length, scale)
    tol = 1e-5 if dtype == torch.float32 else 3e-2      # bf16: p is rounded to bf16 before the PV product
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    if num_splits > 1:   # also against the single pass (same rounding of p, different summation order)
        one = cache_attention(q, kc, vc, slots, qpos, length, scale, num_splits=1)
        torch.testing.assert_close(out, one, rtol=tol, atol=tol)


def test_split_partials_of_rows_that_see_no_key():
    """Stage 1 writes m = -1e30, l = 0, acc = 0 for rows whose chunk is past their qpos and for an empty
    chunk; merging the partials (in PyTorch here) gives the reference."""
    from sglang_replayssm.native.attention import _split_partials
    g = torch.Generator().manual_seed(7)
    B, Hkv, R, D, length, chunk, ns = 2, 2, 3, 16, 100, 64, 3                  # split 2: keys [128, 100): none
    kc, vc = torch.randn(3, 128, Hkv, D, generator=g).to(DEV), torch.randn(3, 128, Hkv, D, generator=g).to(DEV)
    q = torch.randn(B, Hkv, R, D, generator=g).to(DEV)
    slots = torch.tensor([2, 1], dtype=torch.int32, device=DEV)
    qpos = torch.tensor([[0, 5, 70], [63, 64, 99]], dtype=torch.int32, device=DEV)
    m, l, acc = _split_partials(q, kc, vc, slots, qpos, length, 0.25, chunk, ns)
    seen = torch.tensor([[[1, 1, 1], [0, 0, 1], [0, 0, 0]], [[1, 1, 1], [0, 1, 1], [0, 0, 0]]], dtype=torch.bool,
                        device=DEV)
    seen = seen[:, None].expand(B, Hkv, ns, R)
    assert (l[seen] > 0).all() and (l[~seen] == 0).all() and (m[~seen] <= -1e30).all()
    assert (acc[~seen] == 0).all() and (acc[seen].abs().sum(-1) > 0).all()
    w = torch.exp(m - m.amax(dim=2, keepdim=True))
    merged = (w[..., None] * acc).sum(2) / (w * l).sum(2)[..., None]
    torch.testing.assert_close(merged.double(), _ref_attention(q, kc, vc, slots, qpos, length, 0.25),
                               rtol=1e-5, atol=1e-5)


def test_num_splits_one_is_the_single_pass():
    """num_splits=1 (and the heuristic at a length too short to split) is the single-pass kernel, unchanged
    (test_cache_attention_matches_sdpa); more splits sum in another order."""
    from sglang_replayssm.native.attention import cache_attention
    q, kc, vc, slots, qpos, length = _split_case(3, 48, torch.float32)
    one = cache_attention(q, kc, vc, slots, qpos, length, 48 ** -0.5, num_splits=1)
    short = 100                                                                 # < MIN_CHUNK: not split
    assert torch.equal(cache_attention(q, kc, vc, slots, qpos, short, 48 ** -0.5),
                       cache_attention(q, kc, vc, slots, qpos, short, 48 ** -0.5, num_splits=1))
    assert not torch.equal(cache_attention(q, kc, vc, slots, qpos, length, 48 ** -0.5, num_splits=5), one)


def test_invalid_num_splits_and_zero_length():
    from sglang_replayssm.native.attention import cache_attention
    q, kc, vc, slots, qpos, length = _split_case(5, 16, torch.float32)
    for bad in (0, -2, 2.0, True, "4"):
        with pytest.raises(ValueError, match="num_splits"):
            cache_attention(q, kc, vc, slots, qpos, length, 1.0, num_splits=bad)
    out = cache_attention(q, kc, vc, slots, qpos, 0, 1.0, num_splits=3)       # no key at all: zeros
    assert torch.equal(out, torch.zeros_like(q))


def test_default_num_splits():
    from sglang_replayssm.native import attention as A
    cpu = torch.device("cpu")
    assert A.sm_count(cpu) == 132
    assert A.default_num_splits(256, 4, 512, cpu) == 1                          # Qwen3.5-4B at B = 256
    assert A.default_num_splits(33, 4, 4096, cpu) == 1                          # 132 programs already
    assert A.default_num_splits(8, 4, 512, cpu) == 4                            # 32 programs: 132 // 32
    assert A.default_num_splits(1, 4, 512, cpu) == 512 // A.MIN_CHUNK           # limited by the chunk size
    assert A.default_num_splits(1, 1, 1 << 20, cpu) == A.MAX_SPLITS
    assert A.default_num_splits(1, 4, A.MIN_CHUNK - 1, cpu) == 1                # too short to split
    for B in (1, 2, 8, 33, 64, 256, 512):
        for Hkv in (1, 4, 8):
            for L in (0, 100, 512, 2048):
                ns = A.default_num_splits(B, Hkv, L, cpu)
                assert 1 <= ns <= A.MAX_SPLITS and (ns == 1 or (L // ns >= A.MIN_CHUNK and B * Hkv * ns <= 132))
