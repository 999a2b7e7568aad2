"""Gated DeltaNet (Qwen3-Next / Qwen3.5) decode step: reference conventional recurrence and ReplaySSM.

Per value head ``h`` (k-head ``h // (H // Hk)``), with q, k L2-normalized and q scaled::

    g = -exp(A_log) * softplus(a + dt_bias);  alpha = exp(g);  beta = sigmoid(b)
    S' = alpha * S;   d = beta * (v - S' k);   S = S' + d k^T;   o = S q      S: [V, K]

ReplaySSM record per token: ``d [H, V]``, ``k [Hk, K]``, ``g [H]``.
``decode``, ``verify``, ``conventional_decode``, ``fold`` and ``commit`` have the signatures of ``kernels.gdn``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import core, replay

L2_EPS = 1e-6


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Log-decay ``g = -exp(A_log) * softplus(a + dt_bias)``; ``a [.., H]`` (KDA: ``[.., H, K]`` with
    ``dt_bias [H, K]``)."""
    cd = core.compute_dtype(a)
    A = torch.exp(A_log.to(cd))
    if a.dim() >= 2 and dt_bias.dim() == 2:   # per-channel (KDA)
        A = A.unsqueeze(-1)
    return -A * F.softplus(a.to(cd) + dt_bias.to(cd))


def prep(q, k, v, a, b, A_log, dt_bias, scale=None):
    """Raw inputs -> core form ``(q, k, v, g, beta)`` in fp32 (fp64 for fp64 inputs)."""
    cd = core.compute_dtype(v)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    qn = l2norm(q.to(cd)) * scale
    kn = l2norm(k.to(cd))
    return qn, kn, v.to(cd), gate(a.to(cd), A_log, dt_bias), torch.sigmoid(b.to(cd))


def conventional_step(state, q, k, v, a, b, A_log, dt_bias, scale=None):
    """``state [B, H, V, K]``; ``q, k [B, Hk, K]``, ``v [B, H, V]``, ``a, b [B, H]``. Returns ``(o, new_state)``."""
    qn, kn, v, g, beta = prep(q.to(state.dtype), k, v.to(state.dtype), a, b, A_log, dt_bias, scale)
    H = v.shape[-2]
    gf = g if g.dim() == v.dim() else g.unsqueeze(-1).expand(*g.shape, state.shape[-1])  # KDA is per channel already
    return core.conventional_step(state, core.expand_heads(qn, H), core.expand_heads(kn, H), v, gf, beta)


def conventional_decode(state, slots, q, k, v, a, b, A_log, dt_bias, scale=None):
    """Conventional decode on a state table: the rows ``state[slots]`` (``state [S, H, V, K]``, e.g.
    ``pool.ckpt[layer]``) step one token, in place. Returns ``o [B, H, V]`` in compute precision."""
    return core.step_table_rows(state, slots, conventional_step, q, k, v, a, b, A_log, dt_bias, scale)


fold = replay.fold
commit = replay.commit


def decode(pool, layer, slots, q, k, v, a, b, A_log, dt_bias, scale=None):
    """ReplaySSM decode of one token per row on ``pool`` (see ``replay.decode_rows``)."""
    return replay.decode_rows(pool, layer, slots, *prep(q, k, v, a, b, A_log, dt_bias, scale))


def verify(pool, layer, slots, q, k, v, a, b, A_log, dt_bias, scale=None, parents=None):
    """``T`` drafts per row (inputs ``[B, T, ...]``) by output-only evaluation (``replay.verify_rows``)."""
    return replay.verify_rows(pool, layer, slots, *prep(q, k, v, a, b, A_log, dt_bias, scale), parents)
