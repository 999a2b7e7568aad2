"""PyTorch versions of the ``torch.ops.sgl_kernel.*_cpu`` ops SGLang's CPU engine calls.

SGLang's CPU kernels ship only in its CPU build of ``sglang-kernel``, which is not on PyPI. Each op
here is registered under SGLang's name with ``torch.library`` and computes the same result with plain
PyTorch, one sequence and one token at a time (slow and obvious: tiny models only). The schemas are
written from SGLang 0.5.23's call sites (argument names and order as SGLang passes them).

Layouts (SGLang's): conv state ``[slots, dim, width - 1]``, conv weight ``[dim, width]``; linear-attention
state ``[slots, HV, V, K]``; varlen token batches ``[1, tokens, heads, dim]`` with ``cu_seqlens``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_replayssm.reference import gdn as gdn_ref

_LIB: torch.library.Library | None = None


# ----------------------------------------------------------------------------- short convolution
def _conv_window(window: torch.Tensor, weight: torch.Tensor, bias, silu: bool) -> torch.Tensor:
    """``window [dim, width + t - 1]`` -> causal depthwise conv outputs ``[dim, t]``."""
    width = weight.shape[-1]
    out = F.conv1d(window.unsqueeze(0).float(), weight.float().unsqueeze(1), None, groups=weight.shape[0])[0]
    assert out.shape[-1] == window.shape[-1] - width + 1
    if bias is not None:
        out = out + bias.float().unsqueeze(-1)
    return F.silu(out) if silu else out


def causal_conv1d_fwd_cpu(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                          silu_activation, pad_slot_id, is_vnni=True):
    """Prefill: ``x [dim, tokens]`` (sequences given by ``query_start_loc``); returns the outputs and
    leaves each sequence's last ``width - 1`` inputs in ``conv_states[cache_indices[i]]``."""
    width = weight.shape[-1]
    out = torch.empty_like(x)
    starts = query_start_loc.tolist() if query_start_loc is not None else [0, x.shape[-1]]
    for i in range(len(starts) - 1):
        lo, hi = starts[i], starts[i + 1]
        slot = int(cache_indices[i]) if cache_indices is not None else i
        seq = x[:, lo:hi]
        if conv_states is not None and slot != pad_slot_id and has_initial_state is not None and bool(has_initial_state[i]):
            prefix = conv_states[slot].to(x.dtype)
        else:
            prefix = x.new_zeros(x.shape[0], width - 1)
        window = torch.cat([prefix, seq], dim=-1)
        out[:, lo:hi] = _conv_window(window, weight, bias, silu_activation).to(x.dtype)
        if conv_states is not None and slot != pad_slot_id:
            conv_states[slot] = window[:, -(width - 1):].to(conv_states.dtype)
    return out


def causal_conv1d_update_cpu(x, conv_state, weight, bias, silu_activation, cache_seqlens, conv_state_indices,
                             pad_slot_id, is_vnni=True):
    """Decode: ``x [B, dim]`` (or ``[B, dim, t]``): one (or t) new inputs per row; the row's conv state
    slides by as many inputs. Returns the outputs in ``x``'s shape."""
    if cache_seqlens is not None:
        raise NotImplementedError("causal_conv1d_update_cpu: circular conv state (cache_seqlens) is not supported")
    width = weight.shape[-1]
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    out = torch.empty_like(xs)
    for b in range(xs.shape[0]):
        slot = int(conv_state_indices[b]) if conv_state_indices is not None else b
        if slot == pad_slot_id:
            out[b] = 0
            continue
        window = torch.cat([conv_state[slot].to(xs.dtype), xs[b]], dim=-1)
        out[b] = _conv_window(window, weight, bias, silu_activation).to(xs.dtype)
        conv_state[slot] = window[:, -(width - 1):].to(conv_state.dtype)
    return out.squeeze(-1) if squeeze else out


# ----------------------------------------------------------------------------- gated delta rule
def fused_gdn_gating_cpu(A_log, a, b, dt_bias, beta=1.0, threshold=20.0):
    """``a, b [tokens, H]`` -> ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``, each
    ``[1, tokens, H]`` fp32 (the layout of SGLang's Triton gating kernel)."""
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), beta=beta, threshold=threshold)
    return g.unsqueeze(0), torch.sigmoid(b.float()).unsqueeze(0)


def _delta_rule_tokens(S, q, k, v, g, beta):
    """Run the gated delta rule over ``t`` tokens of one sequence from state ``S [HV, V, K]`` (fp32):
    ``q, k [t, HV, K]`` (normalized, scaled), ``v [t, HV, V]``, ``beta [t, HV]``, log-decays ``g [t, HV]`` (GDN)
    or ``[t, HV, K]`` (KDA: per key channel). Returns outputs ``[t, HV, V]`` and the states after every token
    ``[t, HV, V, K]``."""
    outs, states = [], []
    for t in range(q.shape[0]):
        S = S * (torch.exp(g[t])[:, None, None] if g.dim() == 2 else torch.exp(g[t])[:, None, :])
        d = beta[t][:, None] * (v[t] - torch.einsum("hvk,hk->hv", S, k[t]))
        S = S + d[:, :, None] * k[t][:, None, :]
        outs.append(torch.einsum("hvk,hk->hv", S, q[t]))
        states.append(S)
    return torch.stack(outs), torch.stack(states)


def _prep_qk(q, k, HV, use_l2norm, scale=None):
    """``q, k [t, Hk, K]`` -> fp32, L2-normalized when asked, q scaled, heads repeated to ``HV``."""
    q, k = q.float(), k.float()
    if use_l2norm:
        q, k = gdn_ref.l2norm(q), gdn_ref.l2norm(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    rep = HV // q.shape[-2]
    return q.repeat_interleave(rep, dim=-2), k.repeat_interleave(rep, dim=-2)


def _chunked_prefill(query, key, value, g, beta, initial_state, cu_seqlens, use_qk_l2norm_in_kernel,
                     initial_state_indices, chunk: int | None):
    """The varlen prefill of ``chunk_gated_delta_rule_cpu``; also the states at the start of every ``chunk``
    tokens of each sequence (what FLA's chunk kernel returns as ``h``), when ``chunk`` is given."""
    HV = value.shape[-2]
    out = torch.empty(value.shape, dtype=value.dtype)
    starts = cu_seqlens.tolist()
    finals, h = [], []
    for i in range(len(starts) - 1):
        lo, hi = starts[i], starts[i + 1]
        slot = int(initial_state_indices[i]) if initial_state_indices is not None else i
        init = initial_state[slot].float()
        q, k = _prep_qk(query[0, lo:hi], key[0, lo:hi], HV, use_qk_l2norm_in_kernel)
        o, states = _delta_rule_tokens(init, q, k, value[0, lo:hi].float(), g[0, lo:hi].float(),
                                       beta[0, lo:hi].float())
        out[0, lo:hi] = o.to(out.dtype)
        final = states[-1] if hi > lo else init
        if chunk:
            h += [init if c == 0 else states[c - 1] for c in range(0, max(hi - lo, 1), chunk)]
        initial_state[slot] = final.to(initial_state.dtype)
        finals.append(final)
    final_states = torch.stack(finals).to(initial_state.dtype) if finals else initial_state[:0]
    return out, final_states, (torch.stack(h).unsqueeze(0) if h else None)


def chunk_gated_delta_rule_cpu(query, key, value, g, beta, initial_state, output_final_state, cu_seqlens,
                               head_first, use_qk_l2norm_in_kernel, initial_state_indices=None, eps=1e-5):
    """Prefill of varlen sequences: ``query, key [1, tokens, Hk, K]``, ``value [1, tokens, HV, V]``,
    ``g, beta [1, tokens, HV]``; ``initial_state [slots, HV, V, K]`` is read at ``initial_state_indices``
    and the final states written back there. Returns ``(out [1, tokens, HV, V], final states)``."""
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule_cpu: head_first layout is not supported")
    out, final_states, _ = _chunked_prefill(query, key, value, g, beta, initial_state, cu_seqlens,
                                            use_qk_l2norm_in_kernel, initial_state_indices, None)
    return out, final_states


GDN_CHUNK = 64   # FLA's chunk size, SGLang's mamba_chunk_size for GDN: the grid of ``h``


def chunk_gated_delta_rule_with_h(q, k, v, g, beta, initial_state, cu_seqlens, head_first, use_qk_l2norm_in_kernel,
                                  initial_state_indices):
    """What ``gdn_triton.chunk_gated_delta_rule`` is on a GPU (FLA's chunk kernel): ``(out, final states,
    h)`` with ``h [1, chunks, HV, V, K]`` the state at the start of every 64-token chunk of each sequence
    (``sgl_kernel.mamba.chunk_gated_delta_rule_cpu`` returns ``h = None``). The extra_buffer radix cache
    tracks interior chunk states from ``h``."""
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule_with_h: head_first layout is not supported")
    return _chunked_prefill(q, k, v, g, beta, initial_state, cu_seqlens, use_qk_l2norm_in_kernel,
                            initial_state_indices, GDN_CHUNK)


def fused_sigmoid_gating_delta_rule_update_cpu(A_log, dt_bias, q, k, v, a, b, initial_state_source,
                                               initial_state_indices, cu_seqlens, use_qk_l2norm_in_kernel,
                                               softplus_beta=1.0, softplus_threshold=20.0, is_kda=False,
                                               disable_state_update=False, intermediate_states_buffer=None,
                                               intermediate_state_indices=None, cache_steps=None,
                                               retrieve_parent_token=None, scale=None):
    """Decode (one token per sequence) and target verify (``cache_steps`` tokens per sequence, states
    after each token stored in ``intermediate_states_buffer``, the pool's state left alone): gating,
    delta rule and outputs ``[1, tokens, HV, V]``. KDA (per-channel gates) is not supported here."""
    if is_kda:
        raise NotImplementedError("fused_sigmoid_gating_delta_rule_update_cpu: KDA is not supported by the CPU harness")
    HV = v.shape[-2]
    g_all, beta_all = fused_gdn_gating_cpu(A_log, a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]), dt_bias,
                                           softplus_beta, softplus_threshold)
    out = torch.empty(v.shape, dtype=v.dtype)
    starts = cu_seqlens.tolist() if cu_seqlens is not None else list(range(v.shape[1] + 1))
    for i in range(len(starts) - 1):
        lo, hi = starts[i], starts[i + 1]
        slot = int(initial_state_indices[i])
        if slot < 0:
            out[0, lo:hi] = 0
            continue
        qq, kk = _prep_qk(q[0, lo:hi], k[0, lo:hi], HV, use_qk_l2norm_in_kernel, scale)
        S0 = initial_state_source[slot].float()
        if retrieve_parent_token is not None:
            # tree drafts: token 0 starts from the sequence's state, token t > 0 from the state after its
            # parent token retrieve_parent_token[i, t] (< t)
            outs = []
            states = []
            for t in range(hi - lo):
                S = S0 if t == 0 else states[int(retrieve_parent_token[i, t])]
                o, st = _delta_rule_tokens(S, qq[t:t + 1], kk[t:t + 1], v[0, lo + t:lo + t + 1].float(),
                                           g_all[0, lo + t:lo + t + 1], beta_all[0, lo + t:lo + t + 1])
                outs.append(o[0])
                states.append(st[0])
            o, st = torch.stack(outs), torch.stack(states)
        else:
            o, st = _delta_rule_tokens(S0, qq, kk, v[0, lo:hi].float(), g_all[0, lo:hi], beta_all[0, lo:hi])
        out[0, lo:hi] = o.to(out.dtype)
        if intermediate_states_buffer is not None:
            dst = int(intermediate_state_indices[i])
            intermediate_states_buffer[dst, : hi - lo] = st.to(intermediate_states_buffer.dtype)
        if not disable_state_update:
            initial_state_source[slot] = st[-1].to(initial_state_source.dtype)
    return out


def fused_rmsnorm_gated_cpu(input, weight, gate, eps):
    """``rmsnorm(x) * weight * silu(gate)`` (norm before gate, per last dim)."""
    x = input.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (y * F.silu(gate.float())).to(input.dtype)


# ----------------------------------------------------------------------------- registration
_SCHEMAS = {
    "causal_conv1d_fwd_cpu": (
        "causal_conv1d_fwd_cpu(Tensor x, Tensor weight, Tensor? bias, Tensor(a!)? conv_states, "
        "Tensor? query_start_loc, Tensor? cache_indices, Tensor? has_initial_state, bool silu_activation, "
        "int pad_slot_id, bool is_vnni=True) -> Tensor", causal_conv1d_fwd_cpu),
    "causal_conv1d_update_cpu": (
        "causal_conv1d_update_cpu(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, "
        "bool silu_activation, Tensor? cache_seqlens, Tensor? conv_state_indices, int pad_slot_id, "
        "bool is_vnni=True) -> Tensor", causal_conv1d_update_cpu),
    "fused_gdn_gating_cpu": (
        "fused_gdn_gating_cpu(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias, float beta=1.0, "
        "float threshold=20.0) -> (Tensor, Tensor)", fused_gdn_gating_cpu),
    "chunk_gated_delta_rule_cpu": (
        "chunk_gated_delta_rule_cpu(Tensor query, Tensor key, Tensor value, Tensor g, Tensor beta, "
        "Tensor(a!) initial_state, bool output_final_state, Tensor cu_seqlens, bool head_first, "
        "bool use_qk_l2norm_in_kernel, Tensor? initial_state_indices=None, float eps=1e-5) -> (Tensor, Tensor)",
        chunk_gated_delta_rule_cpu),
    "fused_sigmoid_gating_delta_rule_update_cpu": (
        "fused_sigmoid_gating_delta_rule_update_cpu(Tensor A_log, Tensor dt_bias, Tensor q, Tensor k, Tensor v, "
        "Tensor a, Tensor b, Tensor(a!) initial_state_source, Tensor initial_state_indices, Tensor? cu_seqlens, "
        "bool use_qk_l2norm_in_kernel, float softplus_beta=1.0, float softplus_threshold=20.0, bool is_kda=False, "
        "bool disable_state_update=False, Tensor(b!)? intermediate_states_buffer=None, "
        "Tensor? intermediate_state_indices=None, int? cache_steps=None, Tensor? retrieve_parent_token=None, "
        "float? scale=None) -> Tensor", fused_sigmoid_gating_delta_rule_update_cpu),
    "fused_rmsnorm_gated_cpu": (
        "fused_rmsnorm_gated_cpu(Tensor input, Tensor weight, Tensor gate, float eps) -> Tensor",
        fused_rmsnorm_gated_cpu),
}


def register_schemas(schemas: dict) -> torch.library.Library:
    """Define and implement ``{name: (schema, fn)}`` in the ``sgl_kernel`` namespace; an op that a real CPU
    build of sgl_kernel already defines is left alone. Returns the library (keep it alive)."""
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name, (schema, fn) in schemas.items():
        if hasattr(torch.ops.sgl_kernel, name):
            continue
        lib.define(schema)
        lib.impl(name, fn, "CompositeExplicitAutograd")
    return lib


def register() -> None:
    """Every op above (once per process)."""
    global _LIB
    if _LIB is None:
        _LIB = register_schemas(_SCHEMAS)
