"""PyTorch versions, on CUDA tensors, of the compiled ``torch.ops.sgl_kernel.*`` ops SGLang calls on our paths.

On a GPU machine without SGLang's 373 MB ``sglang-kernel`` wheel (the H200 lent to this project: its
torch is 2.11, the wheel's ops are built for 2.14), the wheel's pure-Python wrappers are kept (they are
what SGLang imports) and the ops they call are registered here under the same names and schemas with
``torch.library``, computed with plain PyTorch (no host syncs, fixed output sizes, so CUDA-graph capture
works). Only the ops the hybrid models we serve reach (Qwen3-Next: GDN + MoE; Nemotron-H: Mamba-2) with
``--attention-backend triton --sampling-backend pytorch --grammar-backend none``; any other compiled op
still fails with the bridge's clear error when called.

Schemas follow the wrappers in ``sgl_kernel/{elementwise,moe,memory}.py`` of sglang-kernel 0.4.10.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_replayssm.cpu_harness.cpu_ops import register_schemas

_LIB: torch.library.Library | None = None


# ----------------------------------------------------------------------------- norms
def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.float() + 1.0 if gemma else weight.float()
    return (y * w).to(x.dtype)


def rmsnorm(out, input, weight, eps, enable_pdl):
    out.copy_(_rms(input, weight, eps, False))


def gemma_rmsnorm(out, input, weight, eps, enable_pdl):
    out.copy_(_rms(input, weight, eps, True))


def fused_add_rmsnorm(input, residual, weight, eps, enable_pdl):
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, False))


def gemma_fused_add_rmsnorm(input, residual, weight, eps, enable_pdl):
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, True))


# ----------------------------------------------------------------------------- gated activations
def _halves(input: torch.Tensor):
    d = input.shape[-1] // 2
    return input[..., :d].float(), input[..., d:].float()


def silu_and_mul(out, input):
    a, b = _halves(input)
    out.copy_((F.silu(a) * b).to(out.dtype))


def gelu_and_mul(out, input):
    a, b = _halves(input)
    out.copy_((F.gelu(a) * b).to(out.dtype))


def gelu_tanh_and_mul(out, input):
    a, b = _halves(input)
    out.copy_((F.gelu(a, approximate="tanh") * b).to(out.dtype))


# ----------------------------------------------------------------------------- rotary embedding
def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    """In place on ``query [T, heads * head_size]`` (and ``key``); the first ``cos_sin_cache.shape[-1]``
    dims of each head rotate (partial rotary), the rest pass through."""
    cs = cos_sin_cache.index_select(0, positions.flatten().long()).float()
    cos, sin = cs.chunk(2, dim=-1)
    rot = cs.shape[-1]
    for t in (query, key):
        if t is None:
            continue
        v = t.view(positions.numel(), -1, head_size)
        r = v[..., :rot].float()
        v[..., :rot] = _rotate(r, cos.unsqueeze(1), sin.unsqueeze(1), is_neox).to(t.dtype)


# ----------------------------------------------------------------------------- MoE routing
def topk_softmax(topk_weights, topk_ids, gating_output, renormalize, moe_softcapping, correction_bias):
    """Softmax over experts (after optional tanh soft-capping); the top-k (selected on
    ``scores + correction_bias`` when a bias is given) with their softmax weights, in place."""
    logits = gating_output.float()
    if moe_softcapping:
        logits = torch.tanh(logits / moe_softcapping) * moe_softcapping
    scores = torch.softmax(logits, dim=-1)
    k = topk_ids.shape[-1]
    choose = scores if correction_bias is None else scores + correction_bias.float()
    ids = torch.topk(choose, k, dim=-1).indices
    w = scores.gather(-1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    topk_weights.copy_(w)
    topk_ids.copy_(ids.to(topk_ids.dtype))


def moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad,
                         cumsum_buffer, pad_sorted_token_ids, ignore_invalid_expert):
    """SGLang's "+1 offset" align: ``num_experts`` buckets, pair ``i`` with expert ``e`` goes to bucket
    ``e + 1`` (``e = -1``, an expert filtered out, to bucket 0, whose blocks get expert id -1); every bucket
    is padded to a multiple of ``block_size``, buckets in order; pad slots hold ``numel``; within a bucket,
    pairs keep their order. ``experts_ids[b]`` = the expert of block ``b`` (-1 past the used blocks).
    Fixed sizes only (no host sync)."""
    numel = topk_ids.numel()
    dev = topk_ids.device
    bucket = topk_ids.flatten().long() + 1
    # counts by scatter-add into a fixed-size tensor: torch.bincount reads the max back to the host, which
    # CUDA-graph capture refuses
    ones = torch.ones_like(bucket)
    if ignore_invalid_expert:   # invalid pairs are dropped, not bucketed
        bucket = torch.where(bucket > 0, bucket, torch.full_like(bucket, num_experts))   # an extra, dropped bucket
        counts = torch.zeros(num_experts + 1, dtype=torch.long, device=dev).scatter_add_(0, bucket, ones)
    else:
        counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(
            0, bucket.clamp(0, num_experts - 1), ones)
    counts = counts[:num_experts]
    padded = (counts + block_size - 1) // block_size * block_size
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    ustarts = torch.cumsum(counts, 0) - counts
    order = torch.sort(bucket, stable=True).indices
    sb = bucket[order]
    keep = sb < num_experts
    sbc = sb.clamp(max=num_experts - 1)
    rank = torch.arange(numel, device=dev) - ustarts[sbc]
    pos = torch.where(keep, starts[sbc] + rank, torch.full_like(rank, sorted_token_ids.numel()))
    buf = torch.full((sorted_token_ids.numel() + 1,), numel, dtype=torch.int32, device=dev)
    buf.scatter_(0, pos, order.to(torch.int32))
    sorted_token_ids.copy_(buf[:-1])
    total = ends[-1]
    block_start = torch.arange(experts_ids.numel(), device=dev) * block_size
    blk_bucket = torch.searchsorted(ends, block_start, right=True).clamp(max=num_experts - 1)
    experts_ids.copy_(torch.where(block_start < total, blk_bucket - 1, -1).to(experts_ids.dtype))
    num_tokens_post_pad[:1].copy_(total.reshape(1).to(num_tokens_post_pad.dtype))
    cumsum_buffer.zero_()
    cumsum_buffer[1:num_experts + 1].copy_(ends.to(cumsum_buffer.dtype))


def moe_sum_reduce(input, output, routed_scaling_factor):
    """``output[t] = routed_scaling_factor * sum_k input[t, k]`` (the top-k combine of the Triton fused MoE
    for more than 2 experts per token), accumulated in fp32."""
    output.copy_((input.float().sum(1) * routed_scaling_factor).to(output.dtype))


# ----------------------------------------------------------------------------- CUDA graphs
def weak_ref_tensor(t):
    """sgl_kernel returns a non-owning alias of ``t``; a view is an owning alias (the memory lives as long
    as the graph's output does, which is what SGLang keeps it for)."""
    return t.view(t.shape)


_SCHEMAS = {
    "rmsnorm": ("rmsnorm(Tensor(a!) out, Tensor input, Tensor weight, float eps, bool enable_pdl) -> ()", rmsnorm),
    "gemma_rmsnorm": ("gemma_rmsnorm(Tensor(a!) out, Tensor input, Tensor weight, float eps, bool enable_pdl) -> ()",
                      gemma_rmsnorm),
    "fused_add_rmsnorm": ("fused_add_rmsnorm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps, "
                          "bool enable_pdl) -> ()", fused_add_rmsnorm),
    "gemma_fused_add_rmsnorm": ("gemma_fused_add_rmsnorm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, "
                                "float eps, bool enable_pdl) -> ()", gemma_fused_add_rmsnorm),
    "silu_and_mul": ("silu_and_mul(Tensor(a!) out, Tensor input) -> ()", silu_and_mul),
    "gelu_and_mul": ("gelu_and_mul(Tensor(a!) out, Tensor input) -> ()", gelu_and_mul),
    "gelu_tanh_and_mul": ("gelu_tanh_and_mul(Tensor(a!) out, Tensor input) -> ()", gelu_tanh_and_mul),
    "rotary_embedding": ("rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
                         "Tensor cos_sin_cache, bool is_neox) -> ()", rotary_embedding),
    "topk_softmax": ("topk_softmax(Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor gating_output, "
                     "bool renormalize, float moe_softcapping, Tensor? correction_bias) -> ()", topk_softmax),
    "moe_align_block_size": ("moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, "
                             "Tensor(a!) sorted_token_ids, Tensor(b!) experts_ids, Tensor(c!) num_tokens_post_pad, "
                             "Tensor(d!) cumsum_buffer, bool pad_sorted_token_ids, bool ignore_invalid_expert) -> ()",
                             moe_align_block_size),
    "moe_sum_reduce": ("moe_sum_reduce(Tensor input, Tensor(a!) output, float routed_scaling_factor) -> ()",
                       moe_sum_reduce),
    "weak_ref_tensor": ("weak_ref_tensor(Tensor(a) t) -> Tensor(a)", weak_ref_tensor),
}
OPS = tuple(_SCHEMAS)


def register() -> None:
    """Every op above (once per process); an op a real sgl_kernel build already defines is left alone."""
    global _LIB
    if _LIB is None:
        _LIB = register_schemas(_SCHEMAS)
