"""The generic linear-state math shared by Mamba-2, GDN and KDA (docs/layout.md).

One head's state is ``S [Dv, Dk]``. A token brings a query ``q [Dk]``, a key ``k [Dk]``, a value-like
vector (``v`` for delta families, ``u = dt*x`` for Mamba-2), a log-decay ``g`` (broadcast to ``[Dk]``:
a scalar decay is the same number in every column) and, for delta families, ``beta``.

Conventional step::

    S' = S * exp(g)            (decay every column k by exp(g[k]))
    d  = beta * (v - S' k)     (delta rule)   or   d = u   (Mamba-2)
    S  = S' + d k^T
    o  = S q

ReplaySSM keeps ``S0`` (the checkpoint) and the records ``(d_j, k_j, g_j)`` of the ``c`` tokens since.
With cumulative log-decays ``G_j = g_1 + ... + g_j``, the current state is never formed::

    S_c x = S0 (exp(G_c) * x) + sum_j d_j ((k_j * exp(G_c - G_j)) . x)

A non-flush step reads ``S0`` from the low-precision read copy, so the ``d_j`` of a delta family carry
the read copy's error. The records of a delta family therefore also keep the raw inputs ``v_j, beta_j``,
and the fold (a flush) replays them through the delta rule from the full-precision checkpoint
(:func:`fold`): no value read from the read copy reaches the recurrence.

Everything below is written for a batch of heads ``[..., H, ...]`` of one sequence, in whatever
float dtype the inputs have (float64 in the equivalence tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The references compute in fp32, or in fp64 for fp64 inputs (the exactness tests)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def step_table_rows(state: torch.Tensor, slots: torch.Tensor, step, *inputs):
    """A conventional decode on a state table: the rows ``state[slots]`` go through ``step(rows, *inputs)``
    (which returns ``(out, new_rows)``) in compute precision and are written back in place. Returns out."""
    idx = slots.long()
    out, new = step(state[idx].to(compute_dtype(state)), *inputs)
    state[idx] = new.to(state.dtype)
    return out


def expand_heads(x: torch.Tensor, num_heads: int, dim: int = -2) -> torch.Tensor:
    """Repeat grouped k-heads / Mamba-2 groups so that value head ``h`` sees group ``h // (H // Hk)``."""
    groups = x.shape[dim]
    if num_heads % groups:
        raise ValueError(f"{num_heads} heads are not a multiple of {groups} groups")
    return x.repeat_interleave(num_heads // groups, dim=dim)


def token_step(S: torch.Tensor, q: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """One token of the plain recurrence: ``(o, S_new, d)`` (``o`` None without a query ``q``); shapes as
    :func:`conventional_step`'s. ``d`` is the token's record value (``u`` itself for Mamba-2)."""
    S1 = S * torch.exp(g).unsqueeze(-2)
    if beta is None:
        d = v
    else:
        d = beta.unsqueeze(-1) * (v - (S1 @ k.unsqueeze(-1)).squeeze(-1))
    S1 = S1 + d.unsqueeze(-1) * k.unsqueeze(-2)
    o = None if q is None else (S1 @ q.unsqueeze(-1)).squeeze(-1)
    return o, S1, d


def conventional_step(S: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      g: torch.Tensor, beta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token, plain recurrence. ``S [.., H, Dv, Dk]``, ``q, k, g [.., H, Dk]``, ``v [.., H, Dv]``,
    ``beta [.., H]`` or None (Mamba-2: ``v`` is ``u``). Returns ``(o [.., H, Dv], S_new)``."""
    o, S1, _d = token_step(S, q, k, v, g, beta)
    return o, S1


@dataclass
class Records:
    """Records of one sequence since its checkpoint: ``d [c, H, Dv]``, ``k [c, H, Dk]`` (expanded to
    value heads), ``g [c, H, Dk]`` (log-decays, broadcast); for delta families also the raw inputs
    ``v [c, H, Dv]`` and ``beta [c, H]`` that the exact fold replays (None: Mamba-2, whose ``d`` is its
    input ``u`` and depends on no state)."""

    d: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    v: torch.Tensor | None = None
    beta: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.d.shape[0]


def apply_state(S0: torch.Tensor, rec: Records, x: torch.Tensor, extra_decay: torch.Tensor | None = None) -> torch.Tensor:
    """``(S_c * exp(extra_decay)) x`` for ``x [.., H, Dk]`` (leading dims broadcast over queries),
    from the checkpoint and the records, without forming ``S_c``.

    ``extra_decay [.., H, Dk]`` is an additional log-decay applied after the records (the decays of
    draft tokens on the path to a query)."""
    c = len(rec)
    total = rec.g.sum(0) if c else x.new_zeros(S0.shape[-3], S0.shape[-1])
    xd = x if extra_decay is None else x * torch.exp(extra_decay)
    out = (S0 @ (torch.exp(total) * xd).unsqueeze(-1)).squeeze(-1)
    if c:
        G = rec.g.cumsum(0)                                   # [c, H, Dk]
        kt = rec.k * torch.exp(total.unsqueeze(0) - G)        # k_j * exp(G_c - G_j)
        w = torch.einsum("jhk,...hk->...jh", kt, xd)          # (k~_j . x) per record and head
        out = out + torch.einsum("...jh,jhv->...hv", w, rec.d)
    return out


def fold(S0: torch.Tensor, rec: Records) -> torch.Tensor:
    """Flush: the state after the records. Records with their raw inputs (delta families) are replayed
    token by token through the delta rule from ``S0`` (:func:`replay_inputs`), so the stored ``d_j`` (read
    from whatever copy their step read) do not enter; the others fold linearly,
    ``S_c = S0 * exp(G_c) + sum_j d_j (k_j * exp(G_c - G_j))^T``."""
    if len(rec) == 0:
        return S0.clone()
    if rec.beta is not None:
        return replay_inputs(S0, rec)
    G = rec.g.cumsum(0)
    total = G[-1]
    kt = rec.k * torch.exp(total.unsqueeze(0) - G)
    return S0 * torch.exp(total).unsqueeze(-2) + torch.einsum("jhv,jhk->hvk", rec.d, kt)


def replay_inputs(S0: torch.Tensor, rec: Records) -> torch.Tensor:
    """The exact fold of a delta family: ``S <- S exp(g_j); d_j = beta_j (v_j - S k_j); S <- S + d_j k_j^T`` for
    each record in order, from ``S0`` (the full-precision checkpoint). Each value row of ``S`` evolves on its
    own given the keys, which is what lets a kernel keep a row tile in registers."""
    S = S0
    for j in range(len(rec)):
        _o, S, _d = token_step(S, None, rec.k[j], rec.v[j], rec.g[j], rec.beta[j])
    return S


def evaluate_tokens(S0: torch.Tensor, rec: Records, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    g: torch.Tensor, beta: torch.Tensor | None,
                    parents: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Output-only evaluation of ``T`` new tokens hanging off the committed state ``(S0, rec)``.

    ``q, k, g [T, H, Dk]``, ``v [T, H, Dv]``, ``beta [T, H]`` or None. ``parents[i] = -1`` attaches token
    ``i`` to the committed state, else to token ``parents[i] < i`` (``None``: a chain). Returns the
    outputs ``o [T, H, Dv]`` and the new records' ``d [T, H, Dv]``. No state is formed: each token's
    state is the checkpoint, the committed records and its ancestors' records, all decayed along its
    path (``W`` in the matrix form is this ancestor mask with decays; ``K^T Q`` the dot products).
    """
    T = q.shape[0]
    if parents is None:
        parents = list(range(-1, T - 1))
    G = torch.empty_like(g)         # cumulative log-decay of each token's path, from the committed state
    d = torch.empty_like(v)
    o = torch.empty_like(v)
    ancestors: list[list[int]] = []
    for i in range(T):
        p = parents[i]
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: must be -1 or an earlier token")
        anc = [] if p < 0 else ancestors[p] + [p]
        ancestors.append(anc)
        G[i] = g[i] if p < 0 else G[p] + g[i]

        def s_prime(x: torch.Tensor) -> torch.Tensor:
            # (state before token i, decayed by token i's own gate) applied to x [H, Dk]
            out = apply_state(S0, rec, x, extra_decay=G[i])
            for l in anc:
                out = out + d[l] * ((k[l] * torch.exp(G[i] - G[l])) * x).sum(-1, keepdim=True)
            return out

        if beta is None:
            d[i] = v[i]
        else:
            d[i] = beta[i].unsqueeze(-1) * (v[i] - s_prime(k[i]))
        o[i] = s_prime(q[i]) + d[i] * (k[i] * q[i]).sum(-1, keepdim=True)
    return o, d


def verify_matrix_form(S0: torch.Tensor, rec: Records, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       g: torch.Tensor, beta: torch.Tensor | None,
                       parents: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as :func:`evaluate_tokens`, written as two small matmuls:
    ``O = S_c (D * Q) + (W * (K^T Q)) d`` with ``W[i, l] = exp(G_i - G_l)`` on ancestors-or-self,
    and, for delta families, the lower-triangular solve ``(I + diag(beta) (W_strict * K^T K)) d = beta (v - S_c(D * K))``.
    Per-channel decays (KDA) enter the dot products channel-wise."""
    T = q.shape[0]
    if parents is None:
        parents = list(range(-1, T - 1))
    G = torch.empty_like(g)
    mask = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        p = parents[i]
        G[i] = g[i] if p < 0 else G[p] + g[i]
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    mask = mask.to(q.device)
    # decayed pair products: A_x[i, l, h] = sum_k x_i[h,k] k_l[h,k] exp(G_i[h,k] - G_l[h,k]), l ancestor-or-self
    def pair(x: torch.Tensor) -> torch.Tensor:
        dec = torch.exp(G.unsqueeze(1) - G.unsqueeze(0))            # [i, l, H, Dk]
        dec = torch.where(mask[:, :, None, None], dec, torch.zeros_like(dec))
        return torch.einsum("ihk,lhk,ilhk->ilh", x, k, dec)
    base_q = apply_state(S0, rec, q, extra_decay=G)                  # [T, H, Dv]
    if beta is None:
        d = v.clone()
    else:
        A = pair(k)                                                  # i's own diagonal is not used
        strict = A * (~torch.eye(T, dtype=torch.bool, device=q.device)).unsqueeze(-1)
        rhs = beta.unsqueeze(-1) * (v - apply_state(S0, rec, k, extra_decay=G))
        # (I + diag(beta) strict) d = rhs, per head: lower triangular in topological order
        M = torch.eye(T, dtype=q.dtype, device=q.device).unsqueeze(-1) + beta.unsqueeze(1) * strict  # [i, l, H]
        d = torch.linalg.solve_triangular(M.permute(2, 0, 1), rhs.permute(1, 0, 2), upper=False).permute(1, 0, 2)
    o = base_q + torch.einsum("ilh,lhv->ihv", pair(q), d)
    return o, d
