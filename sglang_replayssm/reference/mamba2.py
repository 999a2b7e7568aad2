"""Mamba-2 (Nemotron-H) SSM step: reference conventional recurrence and ReplaySSM on a pool.

Per head ``h`` (group ``h // (H // G)``)::

    dt = softplus(dt_raw + dt_bias);  a = exp(dt * A)
    S  = a * S + (dt * x) B^T          S: [P, N]
    y  = S C + D * x                   (then y * silu(z) when z is given)

ReplaySSM record per token: ``u = dt * x [H, P]``, ``B [G, N]``, ``g = dt * A [H]``.
``decode``, ``verify``, ``conventional_decode``, ``fold`` and ``commit`` have the signatures of ``kernels.mamba2``'s.
"""

from __future__ import annotations

import torch.nn.functional as F

from . import core, replay


def prep(x, dt, A, B, C, dt_bias):
    """Raw inputs -> core form (q = C, k = B, u = dt * x, g = dt * A), in fp32 (fp64 for fp64 inputs)."""
    cd = core.compute_dtype(x)
    dts = F.softplus(dt.to(cd) + dt_bias.to(cd))
    return C.to(cd), B.to(cd), dts.unsqueeze(-1) * x.to(cd), dts * A.to(cd)


def finish(o, x, D, z):
    """Core output -> the mixer output: the skip term D * x, then the z gate (silu) when the model has one."""
    y = o + D.to(o.dtype).unsqueeze(-1) * x.to(o.dtype)
    if z is not None:
        y = y * F.silu(z.to(o.dtype))
    return y


def conventional_step(state, x, dt, A, B, C, D, dt_bias, z=None):
    """``state [Bt, H, P, N]``; ``x [Bt, H, P]``, ``dt [Bt, H]``, ``A, D, dt_bias [H]``, ``B, C [Bt, G, N]``,
    ``z [Bt, H, P]`` or None. Returns ``(y [Bt, H, P], new_state)``; computes in ``state``'s dtype."""
    q, k, u, g = prep(x.to(state.dtype), dt, A, B, C, dt_bias)
    H = x.shape[-2]
    g = g.unsqueeze(-1).expand(*g.shape, state.shape[-1])
    o, S = core.conventional_step(state, core.expand_heads(q, H), core.expand_heads(k, H), u, g, None)
    return finish(o, x, D, z), S


def conventional_decode(state, slots, x, dt, A, B, C, D, dt_bias, z=None):
    """Conventional decode on a state table: the rows ``state[slots]`` (``state [S, H, P, N]``, e.g.
    ``pool.ckpt[layer]``) step one token, in place. Returns ``y [Bt, H, P]`` in compute precision."""
    return core.step_table_rows(state, slots, conventional_step, x, dt, A, B, C, D, dt_bias, z)


fold = replay.fold
commit = replay.commit


def decode(pool, layer, slots, x, dt, A, B, C, D, dt_bias, z=None):
    """ReplaySSM decode of one token per row on ``pool`` (see ``replay.decode_rows``)."""
    q, k, u, g = prep(x, dt, A, B, C, dt_bias)
    o = replay.decode_rows(pool, layer, slots, q, k, u, g, None)
    return finish(o, x, D, z)


def verify(pool, layer, slots, x, dt, A, B, C, D, dt_bias, z=None, parents=None):
    """``T`` drafts per row (inputs ``[Bt, T, ...]``) by output-only evaluation (``replay.verify_rows``)."""
    q, k, u, g = prep(x, dt, A, B, C, dt_bias)
    o = replay.verify_rows(pool, layer, slots, q, k, u, g, None, parents)
    return finish(o, x, D, z)
