"""Hooks that route SGLang's SSM decode / target-verify kernels to ReplaySSM.

SGLang calls its state kernels with ``ssm_states`` = ``mamba_cache.temporal[layer]``. With the ReplaySSM
pool that tensor is our checkpoint, so each hook looks the tensor up (``pool.lookup_layer``): a hit
means "this layer lives in a ReplayMambaPool" and the call goes to that pool's ``decode / verify``
(``pool.replay.ops``: the Triton kernels or the PyTorch reference, chosen when the pool was built); a
miss (ReplaySSM off, draft models with SGLang's pool, other models) calls SGLang's kernel unchanged.

* Mamba-2 (Nemotron-H, ``MambaMixer2``): ``selective_state_update`` (``ssu_dispatch``), the single
  entry the mixer uses for decode (``x [B, H, P]``) and target verify (``x [B, T, H, P]``).
* GDN (Qwen3-Next): ``GDNKernelDispatcher.decode / packed_decode / target_verify``.
* KDA (Kimi Linear): ``KDAKernelDispatcher.decode / packed_decode / target_verify``.
* Prefill: SGLang's own chunked kernels write the final state straight into the checkpoint; the
  extend hooks then refresh the read copy and mark the ring empty (``ReplayMambaPool.after_prefill``).
* Per-step metadata: ``init_forward_metadata`` (eager) and ``init_forward_metadata_out_graph``
  (CUDA-graph replay) of the three backends note the decode rows (cursor move after the step) or open
  the verify (draft count, tree parents), and note the rows at an extra_buffer track boundary (``track.py``;
  noted here, outside any captured graph, and copied after the step). The kernels read the cursors from the
  pool's device tensor, so a captured graph sees the current cursors without extra metadata buffers.
"""

from __future__ import annotations

import torch

from .pool import lookup_layer
from .sync_check import sync_checked

# ----------------------------------------------------------------------------- helpers


def _slots(pool, indices: torch.Tensor) -> torch.Tensor:
    """SGLang's padding rows (-1) -> our padding slot 0, as int32. Every SSM layer of a step passes the same index
    tensor: the conversion is made once a step (``pool.step_slots``, dropped when the next step is noted) instead
    of two launches a layer, which outside a CUDA graph (a verify, a batch too large for the graphs) cost host time
    on every layer. Not while a CUDA graph is captured (SGLang notes no step at capture; inside a graph the
    conversion costs nothing at replay)."""
    capturing = indices.is_cuda and torch.cuda.is_current_stream_capturing()
    cached = pool.step_slots
    if not capturing and cached is not None and cached[0] is indices:
        return cached[1]
    slots = indices.to(torch.int32).clamp(min=0)
    if not capturing:
        pool.step_slots = (indices, slots)
    return slots


def _c(*ts):
    """Contiguous copies of the small per-head / per-token parameters SGLang may hand out as views (no launch when
    they already are). The token inputs (GDN / KDA q, k, v; Mamba-2 x, dt, B, C, z) go to the kernels as SGLang's views
    of one projection: the kernels read them by token rows (kernels.checks.token_rows), saving a copy per input per
    layer."""
    return tuple(None if t is None else t.contiguous() for t in ts)


def _heads(A_log: torch.Tensor, H: int) -> torch.Tensor:
    return A_log if A_log.dim() == 1 else A_log.reshape(H)


def _direct_out(pool, out: torch.Tensor | None, shape) -> dict:
    """SGLang's output buffer as the kernel's ``out=`` (the kernel writes it in place: no copy after) when the kernels
    run and the buffer is one contiguous block of the output's size; else {} (the result is copied into it)."""
    if (out is None or pool.replay.ops.backend != "triton" or not out.is_contiguous()
            or out.numel() != torch.Size(shape).numel()):
        return {}
    return {"out": out.view(shape)}


def _per_head(t: torch.Tensor | None, H: int, like: torch.Tensor) -> torch.Tensor:
    """SGLang's Mamba-2 mixer expands A / D / dt_bias over (P, N); take one value per head."""
    if t is None:
        return torch.zeros(H, dtype=torch.float32, device=like.device)
    return t.reshape(H, -1)[:, 0]


# ----------------------------------------------------------------------------- Mamba-2


@sync_checked
def mamba2_selective_state_update(original, state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                                  dt_softplus=False, state_batch_indices=None, pad_slot_id=-1, out=None,
                                  disable_state_update=False, intermediate_states_buffer=None, cache_steps=None,
                                  retrieve_parent_token=None, intermediate_state_indices=None):
    hit = lookup_layer(state) if state_batch_indices is not None else None
    if hit is None:
        return original(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                        state_batch_indices=state_batch_indices, pad_slot_id=pad_slot_id, out=out,
                        disable_state_update=disable_state_update,
                        intermediate_states_buffer=intermediate_states_buffer, cache_steps=cache_steps,
                        retrieve_parent_token=retrieve_parent_token,
                        intermediate_state_indices=intermediate_state_indices)
    pool, layer = hit
    if not dt_softplus:
        raise NotImplementedError("ReplaySSM Mamba-2 expects dt_softplus=True (as MambaMixer2 calls it)")
    H = x.shape[-2]
    slots = _slots(pool, state_batch_indices)
    dt_h = dt[..., 0] if dt.dim() == x.dim() else dt  # the mixer expands dt over P
    # one value per head, in the parameters' own dtype (the kernels and the reference compute in fp32: no casts here)
    A_h, D_h, bias_h = _c(_per_head(A, H, x), _per_head(D, H, x), _per_head(dt_bias, H, x))
    direct = _direct_out(pool, out, x.shape)
    if x.dim() == 3:
        y = pool.replay.ops.decode(pool.replay, layer, slots, x, dt_h, A_h, B, C, D_h, bias_h, z=z, **direct)
    else:
        y = pool.replay.ops.verify(pool.replay, layer, slots, x, dt_h, A_h, B, C, D_h, bias_h, z=z,
                                   parents=pool.verify_parents, **direct)
    if out is None:
        return y.to(x.dtype)
    if not direct:
        out.copy_(y.reshape(out.shape).to(out.dtype))
    return None


# ----------------------------------------------------------------------------- GDN / KDA


@sync_checked
def _delta_decode(family, pool, layer, q, k, v, a, b, A_log, dt_bias, cache_indices, scale=None):
    g = pool.geometry
    Bn = cache_indices.shape[0]
    q = q.reshape(Bn, g.num_k_heads, g.head_k_dim)
    k = k.reshape(Bn, g.num_k_heads, g.head_k_dim)
    v = v.reshape(Bn, g.num_heads, g.head_v_dim)
    a = a.reshape(Bn, g.num_heads, -1) if family == "kda" else a.reshape(Bn, g.num_heads)
    dt_bias = dt_bias.reshape(g.num_heads, -1) if family == "kda" else dt_bias
    a, b, A_log, dt_bias = _c(a, b.reshape(Bn, g.num_heads), _heads(A_log, g.num_heads), dt_bias)
    o = pool.replay.ops.decode(pool.replay, layer, _slots(pool, cache_indices), q, k, v, a, b, A_log, dt_bias, scale=scale)
    return o.to(v.dtype).view(1, Bn, g.num_heads, g.head_v_dim)   # (the reference computes in fp32)


@sync_checked
def _delta_verify(family, pool, layer, q, k, v, a, b, A_log, dt_bias, cache_indices, scale=None):
    g = pool.geometry
    Bn = cache_indices.shape[0]
    T = v.numel() // max(Bn * g.num_heads * g.head_v_dim, 1)
    q = q.reshape(Bn, T, g.num_k_heads, g.head_k_dim)
    k = k.reshape(Bn, T, g.num_k_heads, g.head_k_dim)
    v = v.reshape(Bn, T, g.num_heads, g.head_v_dim)
    a = a.reshape(Bn, T, g.num_heads, -1) if family == "kda" else a.reshape(Bn, T, g.num_heads)
    dt_bias = dt_bias.reshape(g.num_heads, -1) if family == "kda" else dt_bias
    a, b, A_log, dt_bias = _c(a, b.reshape(Bn, T, g.num_heads), _heads(A_log, g.num_heads), dt_bias)
    o = pool.replay.ops.verify(pool.replay, layer, _slots(pool, cache_indices), q, k, v, a, b, A_log, dt_bias,
                               scale=scale, parents=pool.verify_parents)
    return o.to(v.dtype).view(1, Bn * T, g.num_heads, g.head_v_dim)   # (the reference computes in fp32)


def _split_packed(pool, mixed_qkv):
    g = pool.geometry
    qk = g.num_k_heads * g.head_k_dim
    q, k, v = torch.split(mixed_qkv, [qk, qk, g.num_heads * g.head_v_dim], dim=-1)
    return q, k, v


def _no_safe_gate(kwargs):
    if kwargs.get("lower_bound") is not None:
        raise NotImplementedError("ReplaySSM KDA does not implement the safe-gate (lower_bound) variant; "
                                  "run this model without --replayssm-* flags")


def make_decode_hook(family):
    def decode(original, self, q, k, v, a, b, *, A_log, dt_bias, ssm_states, cache_indices, query_start_loc,
               **kwargs):
        hit = lookup_layer(ssm_states)
        if hit is None:
            return original(self, q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, ssm_states=ssm_states,
                            cache_indices=cache_indices, query_start_loc=query_start_loc, **kwargs)
        if family == "kda":
            _no_safe_gate(kwargs)
        return _delta_decode(family, *hit, q, k, v, a, b, A_log, dt_bias, cache_indices)
    return decode


def make_packed_decode_hook(family):
    def packed_decode(original, self, mixed_qkv, a, b, *, A_log, dt_bias, scale, ssm_states, cache_indices,
                      num_v_heads, head_v_dim, **kwargs):
        hit = lookup_layer(ssm_states)
        if hit is None:
            return original(self, mixed_qkv, a, b, A_log=A_log, dt_bias=dt_bias, scale=scale,
                            ssm_states=ssm_states, cache_indices=cache_indices, num_v_heads=num_v_heads,
                            head_v_dim=head_v_dim, **kwargs)
        if family == "kda":
            _no_safe_gate(kwargs)
        q, k, v = _split_packed(hit[0], mixed_qkv)
        return _delta_decode(family, *hit, q, k, v, a, b, A_log, dt_bias, cache_indices, scale=scale)
    return packed_decode


def make_target_verify_hook(family):
    def target_verify(original, self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices,
                      query_start_loc, **kwargs):
        hit = lookup_layer(ssm_states)
        if hit is None:
            return original(self, A_log, dt_bias, q, k, v, a, b, ssm_states=ssm_states,
                            cache_indices=cache_indices, query_start_loc=query_start_loc, **kwargs)
        if family == "kda":
            _no_safe_gate(kwargs)
        return _delta_verify(family, *hit, q, k, v, a, b, A_log, dt_bias, cache_indices)
    return target_verify


# ----------------------------------------------------------------------------- prefill and per-step metadata


def _replay_pool(backend):
    pool = getattr(getattr(backend, "req_to_token_pool", None), "mamba_pool", None)
    return pool if getattr(pool, "replay", None) is not None else None


def no_prefill_graph_extend(original, self) -> bool:
    """KDAAttnBackend.supports_prefill_graph_extend: False over a ReplaySSM pool. SGLang can run a KDA prefill inside
    its breakable prefill CUDA graph (GLM-5.3 Flash by default, other KDA models when a prefill graph backend is named),
    with metadata from its own prefill-graph methods: the hooks that fold a prefilled row's ring first and refresh its
    read copy after (``note_step``, ``_after_extend``, ``track.track_mamba_state_extend``) would run at capture only,
    leaving replayed prefills with stale rings and read copies. The prefill runs as an eager break instead."""
    return False if _replay_pool(self) is not None else original(self)


@sync_checked
def _after_extend(backend, layer_id: int, forward_batch) -> None:
    pool = _replay_pool(backend)
    if pool is None or not forward_batch.forward_mode.is_extend() or forward_batch.forward_mode.is_target_verify():
        return
    md = backend.forward_metadata
    layer = backend.req_to_token_pool.mamba_map[layer_id]
    num_prefills = getattr(md, "num_prefills", None)
    idx = md.mamba_cache_indices if num_prefills is None else md.mamba_cache_indices[:num_prefills]
    pool.after_prefill_rows(layer, idx)   # their rings were emptied once for the step (note_step's flush_rows)


def mamba2_forward(original, self, mixer, hidden_states, output, layer_id, forward_batch, *args, **kwargs):
    out = original(self, mixer, hidden_states, output, layer_id, forward_batch, *args, **kwargs)
    if getattr(self.forward_metadata, "num_prefills", 0):
        _after_extend(self, layer_id, forward_batch)
    return out


def delta_forward_extend(original, self, layer, forward_batch, *args, **kwargs):
    out = original(self, layer, forward_batch, *args, **kwargs)
    _after_extend(self, layer.layer_id, forward_batch)
    return out


@sync_checked
def note_step(backend, forward_batch) -> None:
    """After a backend computed its per-step metadata: note decode rows, or open the verify."""
    pool = _replay_pool(backend)
    if pool is None:
        return
    mode = forward_batch.forward_mode
    md = backend.forward_metadata
    idx = getattr(md, "mamba_cache_indices", None)
    if idx is None or pool.last_metadata is md:
        return  # nothing to do, or already noted (a subclass hook and its super() both ran)
    pool.last_metadata = md
    pool.step_slots = None   # a new step: its layers convert their slot indices afresh (_slots)
    if mode.is_target_verify():
        spec = forward_batch.spec_info
        T = int(spec.draft_token_num)
        bs = int(forward_batch.batch_size)
        if (getattr(backend, "topk", 0) or 0) > 1:   # a draft tree: its parents from SGLang's child / sibling arrays
            pool.open_tree_verify(getattr(spec, "retrieve_next_token", None),
                                  getattr(spec, "retrieve_next_sibling", None), bs, T)
        else:
            pool.open_verify(None)
    elif mode.is_decode():
        bs = int(forward_batch.batch_size)
        pool.note_decode(idx[:bs])
        mask = getattr(forward_batch, "mamba_track_mask", None)
        dst = getattr(md, "mamba_track_indices", None)
        if mask is not None:   # extra_buffer: rows at a track boundary (copied after the step, track.py)
            pool.note_track(idx, mask, forward_batch.mamba_track_indices if dst is None else dst, bs)
        elif dst is not None and not hasattr(forward_batch, "mamba_track_mask"):
            # a CUDA-graph replay: SGLang's replay view of the batch has no track mask (the captured track-save
            # reads its static copy), and the graph holds no copy of ours: the mask comes with the real batch
            # after the forward (pool.settle_all)
            pool.await_track_mask(idx, dst)
    elif mode.is_extend():
        # Prefill (or mixed prefill + decode). SGLang's chunked kernels read the checkpoint as the
        # initial state, so every row they process must have an empty ring: fold any committed
        # records first. Mamba-2 runs the decode rows of a mixed batch through our decode instead.
        # (num_decodes: a host int of SGLang's metadata.)
        n = int(getattr(md, "num_decodes", 0) or 0) if pool.family == "mamba2" else 0
        rows = idx[: len(idx) - n]
        pool.flush_rows(rows)
        if n:
            pool.note_decode(idx[len(idx) - n:])


def init_metadata_after(result, self, forward_batch, *args, **kwargs):
    note_step(self, forward_batch)
    return result
