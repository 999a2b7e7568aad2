"""KDA (Kimi Delta Attention, Kimi Linear) on the CPU harness: the two kernels SGLang 0.5.23's
``layers/attention/linear/kernels/kda_triton.py`` imports only off CPU (``chunk_kda``: prefill;
``fused_sigmoid_gating_delta_rule_update``: decode and target verify), in plain PyTorch, one sequence and one
token at a time (slow and obvious: tiny models only). The bridge binds them into that module after its import.

KDA is Gated DeltaNet with a per-channel decay: per value head, with ``g = -exp(A_log) * softplus(a + dt_bias)``
of shape ``[K]`` (or, with SGLang's safe gate, ``g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias))``),
``S' = S Diag(exp(g))``, ``d = beta (v - S' k)``, ``S = S' + d k^T``, ``o = S q``
(``sglang_replayssm/reference/kda.py`` is the fp64 oracle the tests hold these to).

Layouts (SGLang's): state ``[slots, H, V, K]``; varlen token batches ``[1, tokens, H, dim]`` with ``cu_seqlens``;
``A_log`` ``[1, 1, H, 1]`` (any shape with ``H`` elements), ``dt_bias`` ``[H * K]``; raw gates ``a``
``[1, tokens, H, K]`` at prefill, ``[tokens, H * K]`` at decode; raw ``beta`` / ``b`` ``[1, tokens, H]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .cpu_ops import _delta_rule_tokens, _prep_qk

KDA_CHUNK = 64   # FLA's chunk size in chunk_kda: the grid of the per-chunk states ``h``


def kda_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, H: int, lower_bound: float | None = None,
             softplus_beta: float = 1.0, softplus_threshold: float = 20.0) -> torch.Tensor:
    """Per-channel log-decay ``[tokens, H, K]`` (fp32) from raw gates ``a`` (``tokens * H * K`` elements)."""
    K = dt_bias.numel() // H
    x = a.float().reshape(-1, H, K) + dt_bias.float().reshape(H, K)
    A = torch.exp(A_log.float().reshape(H, 1))
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(A * x)
    return -A * F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, initial_state_indices=None,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None, A_log=None, dt_bias=None, lower_bound=None,
              output_intermediate_states=False, track_state=None, track_chunk_idx=None, beta_is_raw=False, **_kernel):
    """Varlen KDA prefill, as SGLang's ``chunk_kda``: ``q, k [1, tokens, H, K]``, ``v [1, tokens, H, V]``,
    ``g`` raw gates (with ``A_log`` / ``dt_bias``) or log-decays ``[1, tokens, H, K]``, ``beta`` raw (``beta_is_raw``)
    or sigmoided ``[1, tokens, H]``. ``initial_state [slots, H, V, K]`` is read at ``initial_state_indices`` and the
    final states written back there. Returns ``o [1, tokens, H, V]``, or ``(o, h)`` with ``h [1, chunks, H, V, K]``
    the state at the start of every 64-token chunk of each sequence (``output_intermediate_states``); with
    ``track_state`` / ``track_chunk_idx`` also ``track_state[n]`` = sequence n's state at the start of its local
    chunk ``track_chunk_idx[n]`` (the radix cache's extra_buffer track snapshot)."""
    H = v.shape[-2]
    if A_log is not None:
        g = kda_gate(g, A_log, dt_bias, H, lower_bound).unsqueeze(0)
    g = g.float().reshape(1, -1, H, q.shape[-1])
    beta = beta.float().reshape(1, -1, H)
    if beta_is_raw:
        beta = torch.sigmoid(beta)
    out = torch.empty(v.shape, dtype=v.dtype)
    starts = cu_seqlens.tolist() if cu_seqlens is not None else [0, v.shape[1]]
    h = []
    for i in range(len(starts) - 1):
        lo, hi = starts[i], starts[i + 1]
        slot = int(initial_state_indices[i]) if initial_state_indices is not None else i
        init = initial_state[slot].float() if initial_state is not None else v.new_zeros(
            H, v.shape[-1], q.shape[-1], dtype=torch.float32)
        qq, kk = _prep_qk(q[0, lo:hi], k[0, lo:hi], H, use_qk_l2norm_in_kernel, scale)
        o, states = _delta_rule_tokens(init, qq, kk, v[0, lo:hi].float(), g[0, lo:hi], beta[0, lo:hi])
        out[0, lo:hi] = o.to(out.dtype)
        chunk_starts = [init if c == 0 else states[c - 1] for c in range(0, max(hi - lo, 1), KDA_CHUNK)]
        h += chunk_starts
        if track_state is not None and 0 <= int(track_chunk_idx[i]) < len(chunk_starts):
            track_state[i] = chunk_starts[int(track_chunk_idx[i])].to(track_state.dtype)
        if initial_state is not None:
            initial_state[slot] = (states[-1] if hi > lo else init).to(initial_state.dtype)
    if output_intermediate_states:
        return out, torch.stack(h).unsqueeze(0)
    return out


def fused_sigmoid_gating_delta_rule_update(A_log, dt_bias, q, k, v, a, b, initial_state_source, initial_state_indices,
                                           cu_seqlens=None, use_qk_l2norm_in_kernel=False, softplus_beta=1.0,
                                           softplus_threshold=20.0, is_kda=False, lower_bound=None,
                                           disable_state_update=False, intermediate_states_buffer=None,
                                           intermediate_state_indices=None, cache_steps=None,
                                           retrieve_parent_token=None, scale=None, cache_ring=False, **_ring):
    """SGLang's ``fused_sigmoid_gating_delta_rule_update`` for KDA (``is_kda``): decode (one token per sequence,
    state updated in place) and target verify (``disable_state_update``: the states after every draft token go
    to ``intermediate_states_buffer``; tree drafts follow ``retrieve_parent_token``). Outputs ``[1, tokens, H, V]``.
    The GDN form (``is_kda=False``) is the ``fused_sigmoid_gating_delta_rule_update_cpu`` op of ``cpu_ops.py``."""
    if not is_kda:
        return torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=initial_state_source,
            initial_state_indices=initial_state_indices, cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, softplus_beta=softplus_beta,
            softplus_threshold=softplus_threshold, disable_state_update=disable_state_update,
            intermediate_states_buffer=intermediate_states_buffer,
            intermediate_state_indices=intermediate_state_indices, cache_steps=cache_steps,
            retrieve_parent_token=retrieve_parent_token, scale=scale)
    if cache_ring:
        raise NotImplementedError("the CPU harness's KDA verify does not write SGLang's own ReplaySSM ring "
                                  "(--enable-linear-replayssm-spec)")
    H = v.shape[-2]
    g_all = kda_gate(a, A_log, dt_bias, H, lower_bound, softplus_beta, softplus_threshold)   # [tokens, H, K]
    beta_all = torch.sigmoid(b.float().reshape(-1, H))
    out = torch.empty(v.shape, dtype=v.dtype)
    starts = cu_seqlens.tolist() if cu_seqlens is not None else list(range(v.shape[1] + 1))
    for i in range(len(starts) - 1):
        lo, hi = starts[i], starts[i + 1]
        slot = int(initial_state_indices[i])
        if slot < 0:
            out[0, lo:hi] = 0
            continue
        qq, kk = _prep_qk(q[0, lo:hi], k[0, lo:hi], H, use_qk_l2norm_in_kernel, scale)
        S0 = initial_state_source[slot].float()
        vv, gg, bb = v[0, lo:hi].float(), g_all[lo:hi], beta_all[lo:hi]
        if retrieve_parent_token is not None:   # tree drafts: token t > 0 starts from its parent's state
            outs, states = [], []
            for t in range(hi - lo):
                S = S0 if t == 0 else states[int(retrieve_parent_token[i, t])]
                o, st = _delta_rule_tokens(S, qq[t:t + 1], kk[t:t + 1], vv[t:t + 1], gg[t:t + 1], bb[t:t + 1])
                outs.append(o[0])
                states.append(st[0])
            o, st = torch.stack(outs), torch.stack(states)
        else:
            o, st = _delta_rule_tokens(S0, qq, kk, vv, gg, bb)
        out[0, lo:hi] = o.to(out.dtype)
        if intermediate_states_buffer is not None:
            dst = int(intermediate_state_indices[i])
            intermediate_states_buffer[dst, : hi - lo] = st.to(intermediate_states_buffer.dtype)
        if not disable_state_update:
            initial_state_source[slot] = st[-1].to(initial_state_source.dtype)
    return out
