"""PyTorch versions of the ``torch.ops.sgl_kernel.*_cpu`` ops SGLang's speculative decoding calls on CPU.

SGLang's NGRAM and EAGLE workers on its CPU engine (``SGLANG_USE_CPU_ENGINE=1``) call these ops, which only
the unpublished CPU build of ``sglang-kernel`` defines: KV-slot bookkeeping (``req_to_token`` scatter /
gather), the draft tree (build, reconstruct from a mask, greedy verify), accept-path compaction, the
multi-layer EAGLE input rotation and the KV-slot move of ``move_kv_cache``. Each op here is registered
under SGLang's name with ``torch.library`` and computes what SGLang's CUDA / Triton kernel for the same
job computes, in plain PyTorch (tree ops one request at a time on Python lists: tiny batches only).
The schemas follow the argument order of ``sgl_kernel/speculative.py`` and ``sgl_kernel/kvcacheio.py``;
the tensors an op writes are marked ``(x!)``.

Layouts (SGLang's): ``req_to_token [max_reqs, pool_len]`` int32 (row ``r`` at flat offset ``r * pool_len``);
KV slot lists int64; per-request draft trees of ``n = draft_token_num`` nodes, node 0 the root (the
bonus / verified token), flat node index ``b * n + i``; ``retrive_next_token`` = first child and
``retrive_next_sibling`` = next sibling, -1 for none. Index tensors may be int32 or int64 (outputs keep
their own dtype). All tensors are contiguous CPU tensors.
"""

from __future__ import annotations

import ctypes

import torch

_LIB: torch.library.Library | None = None


# ----------------------------------------------------------------------------- helpers
def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of ``t`` (raises instead of silently copying a non-contiguous tensor)."""
    return t.view(-1)


def _segments(start: torch.Tensor, end: torch.Tensor):
    """Per-request ranges ``[start[i], end[i])`` -> ``(seg, col, out)`` for every element: its request,
    its column in the range's row and its position in the packed output (an exclusive prefix sum of
    ``end - start``, as the kernels' output offsets)."""
    start, end = start.long().view(-1), end.long().view(-1)
    raw = end - start
    lens = raw.clamp(min=0)
    out_base = torch.cumsum(raw, 0) - raw
    seg = torch.repeat_interleave(torch.arange(lens.numel()), lens)
    first = torch.cumsum(lens, 0) - lens
    rank = torch.arange(int(lens.sum())) - first[seg]
    return seg, start[seg] + rank, out_base[seg] + rank


# ----------------------------------------------------------------------------- req_to_token / KV slots
def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """Scatter new KV slots into the request map: ``req_to_token[req_pool_indices[i], start_offset[i]:
    end_offset[i]] = out_cache_loc[p_i : p_i + len_i]`` with ``p_i`` the sum of the earlier lengths."""
    seg, col, out = _segments(start_offset, end_offset)
    if seg.numel() == 0:
        return
    rows = req_pool_indices.long().view(-1)[seg]
    _flat(req_to_token)[rows * pool_len + col] = _flat(out_cache_loc)[out].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """Gather each request's slots ``req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]``
    into ``out_cache_loc``, packed one request after the other (the tail past the total is left alone)."""
    seg, col, out = _segments(start_offset, end_offset)
    if seg.numel() == 0:
        return
    rows = req_pool_indices.long().view(-1)[seg]
    _flat(out_cache_loc)[out] = _flat(req_to_token)[rows * pool_len + col].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk,
                                           num_steps):
    """Read back the draft slots the allocator reserved: ``out_cache_loc[i * topk * num_steps + j] =
    req_to_token[req_pool_indices[i], seq_lens[i] + j]`` for ``j < topk * num_steps``."""
    bs, width = req_pool_indices.numel(), topk * num_steps
    if bs == 0 or width == 0:
        return
    j = torch.arange(width)
    src = (req_pool_indices.long().view(-1, 1) * pool_len + seq_lens.long().view(-1, 1) + j).view(-1)
    _flat(out_cache_loc)[: bs * width] = _flat(req_to_token)[src].to(out_cache_loc.dtype)


def build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len):
    """Per-candidate request map for the multi-step draft decode: returns ``[bs * topk, pool_len]`` (dtype of
    ``req_to_token``) whose row ``b * topk + k`` holds request ``b``'s committed prefix
    ``req_to_token[r, :seq_lens[b]]`` followed by candidate ``k``'s draft slots ``req_to_token[r,
    seq_lens[b] + k * num_steps :][:num_steps]``; the rest of each row is zero (undefined in SGLang's)."""
    bs = req_pool_indices.numel()
    out = torch.zeros((bs * topk, pool_len), dtype=req_to_token.dtype)
    table = req_to_token.view(-1, pool_len)
    for b, (r, sl) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        for k in range(topk):
            row = out[b * topk + k]
            row[:sl] = table[r, :sl]
            row[sl:sl + num_steps] = table[r, sl + k * num_steps: sl + (k + 1) * num_steps]
    return out


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """Move KV slot rows in every pool buffer: for each buffer ``b`` (base address ``data_ptrs[b]``, uint64;
    row size and row stride ``strides[b]`` bytes) ``row[tgt_loc[i]] = row[src_loc[i]]``. All source rows
    of a buffer are read before any target row is written (as SGLang's tiled Triton copy), so overlapping
    ``tgt_loc`` / ``src_loc`` are safe. The buffers are reached through their addresses (ctypes), because
    that is all the caller (``move_kv_cache``) hands over."""
    tgt, src = tgt_loc.long().view(-1), src_loc.long().view(-1)
    if tgt.numel() != src.numel():
        raise ValueError(f"copy_all_layer_kv_cache_cpu: {tgt.numel()} target slots but {src.numel()} source slots")
    if tgt.numel() == 0 or data_ptrs.numel() == 0:
        return
    if int(tgt.min()) < 0 or int(src.min()) < 0:
        raise ValueError("copy_all_layer_kv_cache_cpu: negative slot index")
    rows = int(max(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.view(torch.int64).tolist(), strides.tolist()):
        ptr &= (1 << 64) - 1
        if stride <= 0:
            continue
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(ptr)
        buf = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        buf[tgt] = buf[src]


# ----------------------------------------------------------------------------- draft trees
def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
                                    retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num,
                                    tree_mask_mode):
    """EAGLE tree from the draft's top-k picks. Node ``i >= 1`` is ``selected_index[b, i - 1]`` (an index into
    the draft's flattened candidates); its parent is the node whose selected index equals
    ``parent_list[b, selected_index[b, i - 1] // topk]`` (the root when that quotient is 0). Writes
    ``retrive_index[b, i] = b * n + i``; the children links, adding nodes from ``n - 1`` down to 1 at the
    head of their parent's list (``retrive_next_token`` / ``retrive_next_sibling`` must come pre-filled with
    -1); ``positions[b * n + i] = seq_len + depth(i)``; and each node's ancestor row (root and itself
    included) of the tree mask: mode 0 (FULL_MASK) ``[sum(seq_len) * n + bs * n * n]`` bool, row ``i`` of
    request ``b`` at ``b * n * n + n * sum(seq_len[:b]) + (seq_len + n) * i``, only its last ``n`` columns
    written (the caller fills the prefix); mode 1 (QLEN_ONLY) ``[bs * n * n]`` bool; mode 2
    (QLEN_ONLY_BITPACKING) one little-endian bit row of 1/2/4 bytes per node (n <= 8/16/32), caller zeroed."""
    n = draft_token_num
    bs = verified_seq_len.numel()
    seq_lens = verified_seq_len.tolist()
    parents = parent_list.tolist()
    selected = selected_index.tolist()
    mask_flat = _flat(tree_mask)
    if tree_mask_mode == 2:
        nbytes = 1 if n <= 8 else (2 if n <= 16 else 4)
        mask_bytes = mask_flat.view(torch.uint8)
    elif tree_mask_mode not in (0, 1):
        raise ValueError(f"build_tree_kernel_efficient_cpu: unknown tree_mask_mode {tree_mask_mode}")
    pos_flat, ri = _flat(positions), retrive_index.view(bs, n)
    rnt, rns = retrive_next_token.view(bs, n), retrive_next_sibling.view(bs, n)
    prefix = 0
    for b in range(bs):
        sel, par, seq_len = selected[b], parents[b], seq_lens[b]

        def parent_node(slot):
            """Node index of the parent of the node at ``selected[slot]`` (0: root, -1: not in the tree)."""
            q = sel[slot] // topk
            if q == 0:
                return 0
            token = par[q]
            return sel.index(token) + 1 if token in sel else -1

        next_token, next_sibling = rnt[b].tolist(), rns[b].tolist()
        for i in range(n - 1, 0, -1):
            p = parent_node(i - 1)
            if p < 0:
                continue    # invalid tree (NaN logprobs): the node is left unlinked, as SGLang's kernel does
            if next_token[p] != -1:
                next_sibling[i] = next_token[p]
            next_token[p] = i
        rnt[b] = torch.tensor(next_token, dtype=rnt.dtype)
        rns[b] = torch.tensor(next_sibling, dtype=rns.dtype)
        ri[b] = torch.arange(b * n, (b + 1) * n, dtype=ri.dtype)

        rows = torch.zeros((n, n), dtype=torch.bool)
        rows[:, 0] = True
        node_pos = [seq_len] * n
        for tid in range(1, n):
            cur, steps = tid - 1, 0
            while steps < depth:
                steps += 1
                rows[tid, cur + 1] = True
                p = parent_node(cur)
                if p <= 0:
                    break
                cur = p - 1
            node_pos[tid] = seq_len + steps
        pos_flat[b * n:(b + 1) * n] = torch.tensor(node_pos, dtype=pos_flat.dtype)

        if tree_mask_mode == 0:
            base = b * n * n + prefix * n
            for tid in range(n):
                lo = base + (seq_len + n) * tid + seq_len
                mask_flat[lo:lo + n] = rows[tid].to(mask_flat.dtype)
        elif tree_mask_mode == 1:
            mask_flat[b * n * n:(b + 1) * n * n] = rows.view(-1).to(mask_flat.dtype)
        else:
            for tid in range(n):
                lo = (b * n + tid) * nbytes
                mask_bytes[lo] = 1
                for col in torch.nonzero(rows[tid]).view(-1).tolist():
                    mask_bytes[lo + col // 8] |= 1 << (col % 8)
        prefix += seq_len


def reconstruct_indices_from_tree_mask_cpu(tree_mask, verified_seq_len, positions, retrive_index, retrive_next_token,
                                           retrive_next_sibling, batch_size, draft_token_num):
    """NGRAM tree from its ``[bs, n, n]`` bool ancestor mask (row ``i`` marks ``i``'s ancestors, column
    ``j < i``): ``positions[b * n + i] = seq_len[b] + #ancestors``; ``retrive_index[b, i] = b * n + i``;
    parent = the nearest ancestor (largest ``j``); first child = smallest ``k > i`` having ``i`` as an
    ancestor; next sibling = smallest ``k > i`` with the same parent (-1 for the root)."""
    bs, n = batch_size, draft_token_num
    if bs == 0:
        return
    m = _flat(tree_mask)[: bs * n * n].view(bs, n, n).bool()
    col = torch.arange(n)
    anc = m & (col.view(1, n) < col.view(n, 1))              # anc[b, i, j]: j < i is an ancestor of i
    depth = anc.sum(-1)
    parent = torch.where(anc, col, -1).amax(-1)             # [bs, n]
    big = torch.full((), n)
    first_child = torch.where(anc, col.view(1, n, 1), big).amin(1)   # over rows k: min k with anc[k, i]
    same_parent = (parent.unsqueeze(2) == parent.unsqueeze(1)) & (col.view(n, 1) > col.view(1, n))
    first_sibling = torch.where(same_parent, col.view(1, n, 1), big).amin(1)
    next_token = torch.where(first_child < n, first_child, -1)
    next_sibling = torch.where((parent >= 0) & (first_sibling < n), first_sibling, -1)
    _flat(positions)[: bs * n] = (depth + verified_seq_len.long().view(-1, 1)).view(-1).to(positions.dtype)
    retrive_index.view(bs, n).copy_(torch.arange(bs * n).view(bs, n))
    retrive_next_token.view(bs, n).copy_(next_token)
    retrive_next_sibling.view(bs, n).copy_(next_sibling)


def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                           retrive_next_sibling, target_predict):
    """Greedy tree verify: from the root, repeatedly take the first child (then its siblings, in list order)
    whose draft token ``candidates[b, c]`` equals the target's argmax at the last accepted node
    (``target_predict`` read flat at that node's ``retrive_index``); at most ``accept_index.shape[1] - 1``
    steps. Writes ``accept_index[b, :1 + k]`` (flat indices of root and accepted nodes; the rest is left as
    the caller filled it, -1), ``accept_token_num[b] = k``, and ``predicts[idx]`` = the target token at
    every accepted node plus the bonus token at the last one."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    nxt, sib = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    target = _flat(target_predict).tolist()
    pred_flat = _flat(predicts)
    for b in range(bs):
        last = ridx[b][0]
        accepted = [last]
        cur = 0
        for _ in range(1, steps):
            cur = nxt[b][cur]
            while cur != -1:
                if cand[b][cur] == target[last]:
                    pred_flat[last] = target[last]
                    last = ridx[b][cur]
                    accepted.append(last)
                    break
                cur = sib[b][cur]
            if cur == -1:
                break
        accept_index[b, :len(accepted)] = torch.tensor(accepted, dtype=accept_index.dtype)
        accept_token_num[b] = len(accepted) - 1
        pred_flat[last] = target[last]


# ----------------------------------------------------------------------------- accept path / inputs
def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """Compact the accepted tokens' KV slots: ``accept_out_cache_loc[:k] = out_cache_loc[a]`` for the
    entries ``a > -1`` of ``accept_index`` (read flat, in order); the rest is left alone."""
    idx = _flat(accept_index).long()
    idx = idx[idx > -1]
    if idx.numel():
        _flat(accept_out_cache_loc)[: idx.numel()] = _flat(out_cache_loc)[idx].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """Each request's last accepted token: ``bonus_tokens[i] = accept_tokens.flat[i * accept_stride +
    accept_lens[i] - 1]`` (``accept_lens`` counts the bonus token)."""
    bs = accept_lens.numel()
    if bs == 0:
        return
    idx = torch.arange(bs) * accept_stride + accept_lens.long().view(-1) - 1
    _flat(bonus_tokens)[:bs] = _flat(accept_tokens)[idx].to(bonus_tokens.dtype)


def rotate_input_ids_cpu(input_ids, extend_start_loc, extend_seq_lens, topk_index, select_index=None):
    """Multi-layer EAGLE: shift each request's extend segment ``input_ids[s:s + len]`` left by one and write
    the new draft token ``topk_index[i]`` at its end, or at ``select_index[i]`` (a flat position) when
    given; a request with ``len == 0`` is left alone."""
    ids = _flat(input_ids)
    starts, lens, tokens = extend_start_loc.tolist(), extend_seq_lens.tolist(), _flat(topk_index).tolist()
    select = select_index.tolist() if select_index is not None else None
    for i, (s, length) in enumerate(zip(starts, lens)):
        if length > 1:
            ids[s:s + length - 1] = ids[s + 1:s + length].clone()
        if length > 0:
            ids[select[i] if select is not None else s + length - 1] = tokens[i]


# ----------------------------------------------------------------------------- registration
_SCHEMAS = {
    "assign_req_to_token_pool_cpu": (
        "assign_req_to_token_pool_cpu(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()", assign_req_to_token_pool_cpu),
    "assign_extend_cache_locs_cpu": (
        "assign_extend_cache_locs_cpu(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor(a!) out_cache_loc, int pool_len) -> ()", assign_extend_cache_locs_cpu),
    "assign_draft_cache_locs_contiguous_cpu": (
        "assign_draft_cache_locs_contiguous_cpu(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, "
        "Tensor(a!) out_cache_loc, int pool_len, int topk, int num_steps) -> ()",
        assign_draft_cache_locs_contiguous_cpu),
    "build_draft_decode_metadata_cpu": (
        "build_draft_decode_metadata_cpu(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, int topk, "
        "int num_steps, int pool_len) -> Tensor", build_draft_decode_metadata_cpu),
    "copy_all_layer_kv_cache_cpu": (
        "copy_all_layer_kv_cache_cpu(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
        copy_all_layer_kv_cache_cpu),
    "build_tree_kernel_efficient_cpu": (
        "build_tree_kernel_efficient_cpu(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, "
        "Tensor(a!) tree_mask, Tensor(b!) positions, Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, "
        "Tensor(e!) retrive_next_sibling, int topk, int depth, int draft_token_num, int tree_mask_mode) -> ()",
        build_tree_kernel_efficient_cpu),
    "reconstruct_indices_from_tree_mask_cpu": (
        "reconstruct_indices_from_tree_mask_cpu(Tensor tree_mask, Tensor verified_seq_len, Tensor(a!) positions, "
        "Tensor(b!) retrive_index, Tensor(c!) retrive_next_token, Tensor(d!) retrive_next_sibling, "
        "int batch_size, int draft_token_num) -> ()", reconstruct_indices_from_tree_mask_cpu),
    "verify_tree_greedy_cpu": (
        "verify_tree_greedy_cpu(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
        "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, "
        "Tensor target_predict) -> ()", verify_tree_greedy_cpu),
    "fill_accept_out_cache_loc_cpu": (
        "fill_accept_out_cache_loc_cpu(Tensor accept_index, Tensor out_cache_loc, "
        "Tensor(a!) accept_out_cache_loc) -> ()", fill_accept_out_cache_loc_cpu),
    "fill_bonus_tokens_cpu": (
        "fill_bonus_tokens_cpu(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, "
        "int accept_stride) -> ()", fill_bonus_tokens_cpu),
    "rotate_input_ids_cpu": (
        "rotate_input_ids_cpu(Tensor(a!) input_ids, Tensor extend_start_loc, Tensor extend_seq_lens, "
        "Tensor topk_index, Tensor? select_index=None) -> ()", rotate_input_ids_cpu),
}


def register() -> None:
    """Every op above (once per process; see ``cpu_ops.register_schemas``)."""
    global _LIB
    if _LIB is None:
        from .cpu_ops import register_schemas

        _LIB = register_schemas(_SCHEMAS)
