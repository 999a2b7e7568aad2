"""ReplayStatePool: per-slot checkpoint (+ read copy), record ring, cursors and conv state for a set
of SSM layers of one family. Layout: docs/layout.md. Engine-agnostic: the native engine and the
SGLang plugin both keep their SSM states here.

The pool owns storage, slot bookkeeping and the pointer moves (``advance`` after a decode step,
``accept_drafts`` after a verify). The arithmetic that reads and writes states (decode, verify, the
fold of a flush, the conv roll, a prefill's checkpoint store) is the ``ops`` it is given: a
``family_ops.FamilyOps`` of ``reference/`` (PyTorch, the default) or ``kernels/`` (Triton).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from ..family_ops import FamilyOps
from ..reference.quant import fake_quant, quant_fp8_rows, quant_nvfp4
from .config import ReplayConfig, SSMGeometry
from .errors import BadSlotError, CommitError, ConfigError, DoubleFreeError, DraftOverflowError, PoolExhaustedError

logger = logging.getLogger(__name__)

PADDING_SLOT = 0
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# chain commits of up to this many rows replay a captured CUDA graph on CUDA (one graph per row count, at
# most this many kept): below it a commit's ~15 launches cost more host time than device time
COMMIT_GRAPH_MAX_BATCH = 64


class SlotAllocator:
    """Free-list allocator over slots ``1..num_slots``; slot 0 is the padding slot and never handed out."""

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise PoolExhaustedError(f"a pool needs at least one usable slot, got num_slots={num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots, 0, -1))  # pop() hands out the lowest slot first
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"cannot allocate {n} slots")
        if n > len(self._free):
            raise PoolExhaustedError(f"requested {n} slots but only {len(self._free)} of {self.num_slots} are free")
        out = [self._free.pop() for _ in range(n)]
        self._used.update(out)
        return out

    def check(self, slot: int) -> None:
        if not isinstance(slot, int) or not 1 <= slot <= self.num_slots:
            raise BadSlotError(f"slot {slot!r} is out of range 1..{self.num_slots} (0 is the padding slot)")
        if slot not in self._used:
            raise BadSlotError(f"slot {slot} is not allocated")

    def free(self, slots: Sequence[int]) -> None:
        slots = list(slots)
        if len(set(slots)) != len(slots):
            raise DoubleFreeError(f"slots {slots} freed twice in one call")
        for s in slots:
            if not isinstance(s, int) or not 1 <= s <= self.num_slots:
                raise BadSlotError(f"slot {s!r} is out of range 1..{self.num_slots} (0 is the padding slot)")
            if s not in self._used:
                raise DoubleFreeError(f"slot {s} is not allocated (double free?)")
        for s in slots:
            self._used.remove(s)
            self._free.append(s)
        self._free.sort(reverse=True)

    def is_allocated(self, slot: int) -> bool:
        return slot in self._used


class ReplayStatePool:
    """See module docstring and docs/layout.md for the tensors. ``ops``: the ``FamilyOps`` whose fold,
    conv roll, checkpoint store and committed state the pool calls (default: the PyTorch reference of
    the geometry's family); an engine that owns the pool may set ``pool.ops`` before its first step."""

    def __init__(self, geometry: SSMGeometry, num_layers: int, num_slots: int, config: ReplayConfig | None = None,
                 device: str | torch.device = "cpu", act_dtype: torch.dtype = torch.float32,
                 ops: FamilyOps | None = None):
        if num_layers < 1:
            raise ConfigError(f"num_layers must be >= 1, got {num_layers}")
        self.geo = geometry
        self.cfg = config or ReplayConfig()
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.device = torch.device(device)
        self.act_dtype = act_dtype
        self.ops = ops if ops is not None else FamilyOps.reference(geometry.family)
        self.allocator = SlotAllocator(num_slots)
        g, c = geometry, self.cfg
        nl, S = num_layers, num_slots + 1
        H, Dv, Dk, Hk = g.num_heads, g.head_v_dim, g.head_k_dim, g.num_k_heads
        c.check_geometry(geometry)
        z = dict(device=self.device)
        self.ckpt = torch.zeros(nl, S, H, Dv, Dk, dtype=c.ckpt_dtype, **z)
        self.rc = self.rc_scale = self.rc_gscale = None
        if c.read_copy == "fp8":
            self.rc = torch.zeros(nl, S, H, Dv, Dk, dtype=torch.float8_e4m3fn, **z)
            self.rc_scale = torch.ones(nl, S, H, Dv, dtype=torch.float32, **z)
        elif c.read_copy == "nvfp4":
            self.rc = torch.zeros(nl, S, H, Dv, Dk // 2, dtype=torch.uint8, **z)
            self.rc_scale = torch.zeros(nl, S, H, Dv, Dk // 16, dtype=torch.float8_e4m3fn, **z)
            self.rc_gscale = torch.ones(nl, S, H, dtype=torch.float32, **z)
        self.rec_d = self.rec_k = self.rec_g = self.rec_v = self.rec_beta = self.snap = None
        if c.mode == "replay":
            R = c.ring_capacity
            scalar_dtype = torch.float32 if c.ckpt != "fp64" else torch.float64
            self.rec_d = torch.zeros(nl, S, R, H, Dv, dtype=c.record_dtype, **z)
            self.rec_k = torch.zeros(nl, S, R, Hk, Dk, dtype=c.record_dtype, **z)
            gshape = (nl, S, R, H, Dk) if g.per_channel_decay else (nl, S, R, H)
            self.rec_g = torch.zeros(*gshape, dtype=scalar_dtype, **z)
            if g.delta_rule and c.folds_exactly:   # the raw inputs the exact fold replays (docs/layout.md)
                self.rec_v = torch.zeros(nl, S, R, H, Dv, dtype=c.value_record_dtype(act_dtype), **z)
                self.rec_beta = torch.zeros(nl, S, R, H, dtype=scalar_dtype, **z)
        elif c.max_drafts:
            self.snap = torch.zeros(nl, S, c.max_drafts, H, Dv, Dk, dtype=c.ckpt_dtype, **z)
        self.conv = self.conv_in = None
        if g.conv_dim:
            self.conv = torch.zeros(nl, S, g.conv_dim, max(g.conv_kernel - 1, 0), dtype=act_dtype, **z)
            if c.max_drafts:
                self.conv_in = torch.zeros(nl, S, c.max_drafts, g.conv_dim, dtype=act_dtype, **z)
        self.cursor = torch.zeros(S, dtype=torch.int32, **z)
        self.folded = torch.zeros(S, dtype=torch.int64, **z)
        self._pending: dict[int, tuple[int, list[int] | None]] = {}
        self._staging = self._staged = None   # commit's pinned upload buffer and the event of its last copy
        self._commit_graphs: dict = {}          # (rows, fold) -> (CUDA graph of a chain commit, its input buffer)

    # ------------------------------------------------------------------ views and sizes
    def _per_slot_tensors(self) -> list[torch.Tensor]:
        ts = [self.ckpt, self.rc, self.rc_scale, self.rc_gscale, self.rec_d, self.rec_k, self.rec_g, self.rec_v,
              self.rec_beta, self.snap, self.conv, self.conv_in]
        return [t for t in ts if t is not None]

    def bytes_per_slot(self) -> int:
        """Exact device bytes one slot occupies (all layers), cursors included."""
        per = sum(t[:, 0].numel() * t.element_size() for t in self._per_slot_tensors())
        return per + self.cursor.element_size() + self.folded.element_size()

    @staticmethod
    def slot_bytes(geometry: SSMGeometry, num_layers: int, config: ReplayConfig,
                   act_dtype: torch.dtype = torch.float32) -> int:
        """``bytes_per_slot`` of a pool of this configuration, without allocating one."""
        probe = ReplayStatePool(geometry, num_layers, 1, config, device="meta", act_dtype=act_dtype)
        return probe.bytes_per_slot()

    @staticmethod
    def capacity(geometry: SSMGeometry, num_layers: int, config: ReplayConfig, budget_bytes: int,
                 act_dtype: torch.dtype = torch.float32) -> dict:
        """How many sequences fit in ``budget_bytes``: this configuration vs the snapshot-per-draft scheme
        (a full-precision state per sequence plus one state and conv window snapshot per draft token)."""
        ours = ReplayStatePool.slot_bytes(geometry, num_layers, config, act_dtype)
        snap_cfg = ReplayConfig(window=1, max_drafts=config.max_drafts, mode="conventional",
                                ckpt="fp64" if config.ckpt == "fp64" else "fp32")
        theirs = ReplayStatePool.slot_bytes(geometry, num_layers, snap_cfg, act_dtype)
        return {"bytes_per_slot": ours, "snapshot_bytes_per_slot": theirs,
                "sequences": budget_bytes // ours, "snapshot_sequences": budget_bytes // theirs}

    # ------------------------------------------------------------------ slots
    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def alloc(self, n: int = 1) -> list[int]:
        slots = self.allocator.alloc(n)
        self.reset(slots)
        return slots

    def free(self, slots: Sequence[int]) -> None:
        self.allocator.free(slots)
        for s in slots:
            self._pending.pop(s, None)

    def check_slots(self, slots: Sequence[int]) -> list[int]:
        slots = [int(s) for s in slots]
        for s in slots:
            self.allocator.check(s)
        return slots

    def _index(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.as_tensor(list(slots), dtype=torch.long, device=self.device)

    def reset(self, slots: Sequence[int]) -> None:
        """Zero every tensor of the slots (a fresh sequence: empty state, empty ring)."""
        self.reset_rows(self._index(self.check_slots(slots)))
        for s in slots:
            self._pending.pop(int(s), None)

    def fork(self, src: int, dst: int | Sequence[int]) -> None:
        """Copy everything of slot ``src`` into ``dst`` (prefix-cache copy-on-write, parallel sampling)."""
        dsts = [dst] if isinstance(dst, int) else list(dst)
        self.check_slots([src, *dsts])
        if src in dsts:
            raise BadSlotError(f"cannot fork slot {src} onto itself")
        if src in self._pending:
            raise CommitError(f"slot {src} has an uncommitted verify: commit before forking it")
        idx = self._index(dsts)
        for t in self._per_slot_tensors():
            t[:, idx] = t[:, src].unsqueeze(1).clone()
        self.cursor[idx] = self.cursor[src].clone()
        self.folded[idx] = self.folded[src].clone()

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Everything of slot ``src[i]`` into slot ``dst[i]`` (tensors of slot indices on the pool's device) for
        the rows with both > 0 and distinct; other rows copy nothing (``ops.copy_slots``). A device op, no
        checks and no host sync (``fork`` is the checked copy of one slot)."""
        self.ops.copy_slots(self._per_slot_tensors(), src, dst, 1)
        self.ops.copy_slots([self.cursor, self.folded], src, dst, 0)

    # ------------------------------------------------------------------ pointer moves
    def advance(self, slots: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """After a decode step over all layers: ``cursor += 1``; rows that flushed (``cursor + 1 ==
        window``) restart at 0. A device op with no host sync (padding rows <= 0 hit slot 0 harmlessly);
        ``counts``: the step's counts added on the device (``reference.replay.STEP_COUNTS``; ``ops.advance``:
        one launch with the kernels)."""
        if self.cfg.mode != "replay":
            self.folded[slots] += 1
            return
        self.ops.advance(self, slots, counts)

    def count_commit(self, slots: torch.Tensor, accepted: torch.Tensor, num_drafts: int,
                     counts: torch.Tensor) -> None:
        """Add a verify's counts to ``counts`` before its commit (``ops.count_commit``; device, no host read)."""
        self.ops.count_commit(self, slots, accepted, num_drafts, counts)

    def begin_verify(self, slots: Sequence[int], num_drafts: int, parents: Sequence[Sequence[int]] | None = None) -> None:
        """Record that ``num_drafts`` draft tokens are about to be appended to each slot's ring."""
        slots = self.check_slots(slots)
        if not 1 <= num_drafts <= self.cfg.max_drafts:
            raise DraftOverflowError(f"{num_drafts} draft tokens requested; this pool holds 1..{self.cfg.max_drafts} "
                                     f"(ring capacity {self.cfg.ring_capacity} = window {self.cfg.window} + max_drafts)")
        for i, s in enumerate(slots):
            if s in self._pending:
                raise CommitError(f"slot {s} already has a verify pending: commit it first")
            self._pending[s] = (num_drafts, None if parents is None else list(parents[i]))

    def pending(self, slot: int) -> int:
        """Draft tokens of the slot's open verify (0: none open)."""
        return self._pending.get(slot, (0, None))[0]

    def cancel_verify(self, slots: Sequence[int]) -> None:
        """Close the open verify of ``slots`` without accepting anything (a verify whose acceptance never
        came): its draft records stay behind the cursor, like rejected ones."""
        for s in slots:
            self._pending.pop(int(s), None)

    def accept_drafts(self, slots: Sequence[int], accepted: Sequence[int],
                      paths: Sequence[Sequence[int]] | None = None) -> None:
        """Accept, per slot, ``accepted[i]`` of its pending drafts: the chain prefix, or (tree drafts)
        the nodes ``paths[i]`` from root to leaf. The ring pointer moves; rejected records are simply
        left behind. Rows that reach the window fold their records into the checkpoint:
        ``ops.commit(pool, slots, accepted)`` is called once with every accepted row as int32 device
        tensors (it folds every layer where cursor + accepted reaches the window and moves the pointers;
        the Triton commit waits on no device result); then ``ops.roll_conv`` moves the conv states. On
        CUDA, with a fold on the device, a chain commit of up to COMMIT_GRAPH_MAX_BATCH rows replays a
        CUDA graph of that device work (_commit_graphed)."""
        slots = self.check_slots(slots)
        accepted = [int(a) for a in accepted]
        if len(accepted) != len(slots) or (paths is not None and len(paths) != len(slots)):
            raise CommitError("commit needs one accepted count (and one path) per slot")
        node_paths: list[list[int]] = []
        for i, s in enumerate(slots):
            if s not in self._pending:
                raise CommitError(f"slot {s} has no pending verify to commit")
            T, parents = self._pending[s]
            a = accepted[i]
            if not 0 <= a <= T:
                raise CommitError(f"slot {s}: accepted {a} of {T} pending drafts")
            path = list(range(a)) if paths is None else [int(n) for n in paths[i]]
            if len(path) != a:
                raise CommitError(f"slot {s}: path {path} has {len(path)} nodes but accepted={a}")
            tree = parents if parents is not None else list(range(-1, T - 1))
            prev = -1
            for n in path:
                if not 0 <= n < T or tree[n] != prev:
                    raise CommitError(f"slot {s}: path {path} is not a root-to-node path of the draft tree {tree}")
                prev = n
            node_paths.append(path)
        for s in slots:
            del self._pending[s]
        # every index the commit needs, in one host -> device copy: slots, accepted counts, padded paths
        B = len(slots)
        chain = all(p == list(range(len(p))) for p in node_paths)
        graph = (self.cfg.mode != "conventional" and chain and self.ops.fold_on_device and self.device.type == "cuda"
                 and B <= COMMIT_GRAPH_MAX_BATCH and not torch.cuda.is_current_stream_capturing())
        N = self.cfg.max_drafts if graph else max([len(p) for p in node_paths] + [1])
        values = slots + [len(p) for p in node_paths] + [n for p in node_paths for n in p + [0] * (N - len(p))]
        if graph:
            self._commit_graphed(values, B, N)
            return
        buf = self._staged_copy(None, values)
        if self.cfg.mode == "conventional":
            self._commit_snapshots(slots, node_paths)
            self._roll_conv(*self._commit_indices(buf, B, N))
            return
        if not chain:   # tree: the accepted nodes' records to the front first
            rows, acc, nodes = self._commit_indices(buf, B, N)
            self.ops.compact_paths(self, rows, acc, nodes.contiguous())
        self._commit_chain(buf, B, N)

    def _stage(self, values: list[int]) -> torch.Tensor:
        """values in a reused pinned host buffer (int32), for one queued copy to the device (a copy from
        pageable memory may make the host wait for the launches queued before it: the H200 commits at batch
        256 waited on their own fold)."""
        n = len(values)
        if self._staging is None or self._staging.numel() < n:
            self._staging = torch.empty(max(n, 4096), dtype=torch.int32, pin_memory=True)
        elif self._staged is not None:
            self._staged.synchronize()   # the previous copy out of the buffer is done (long since, in practice)
        self._staging[:n] = torch.tensor(values, dtype=torch.int32)
        return self._staging[:n]

    def _staged_copy(self, dst: torch.Tensor | None, values: list[int]) -> torch.Tensor:
        """values on the pool's device (into dst, or a new tensor): one copy, queued like a launch on CUDA."""
        if self.device.type != "cuda":
            return torch.tensor(values, dtype=torch.int32, device=self.device)
        host = self._stage(values)
        out = host.to(self.device, non_blocking=True) if dst is None else dst.copy_(host, non_blocking=True)
        self._staged = torch.cuda.Event()
        self._staged.record()
        return out

    def _commit_graphed(self, values: list[int], B: int, N: int) -> None:
        """A chain commit of B rows as a replay of a CUDA graph of its device work (_commit_chain): the
        indices go into the graph's input buffer (one copy) and one replay launches the fold, the pointer
        moves and the conv roll, instead of ~15 eager launches (their host time is most of a small batch's
        commit). The first commit of B rows runs eagerly, then captures."""
        key = (B, id(self.ops.commit))
        hit = self._commit_graphs.get(key)
        if hit:
            graph, static = hit
            self._staged_copy(static, values)
            graph.replay()
            return
        if key in self._commit_graphs:                  # capture failed before: eager for good
            self._commit_chain(self._staged_copy(None, values), B, N)
            return
        static = self._staged_copy(torch.empty(len(values), dtype=torch.int32, device=self.device), values)
        self._commit_chain(static, B, N)               # this commit (and every kernel compiled)
        if len(self._commit_graphs) >= COMMIT_GRAPH_MAX_BATCH:
            self._commit_graphs.pop(next(iter(self._commit_graphs)))
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):   # recorded, not run
                self._commit_chain(static, B, N)
        except RuntimeError as e:   # e.g. another thread's launch broke the capture: this commit is done
            logger.warning("pool.accept_drafts: CUDA graph capture for %d rows failed (%s); committing eagerly", B, e)
            self._commit_graphs[key] = None
            return
        self._commit_graphs[key] = (graph, static)

    def _commit_chain(self, buf: torch.Tensor, B: int, N: int) -> None:
        """A commit's device work, from buf = [slots (B) | accepted counts (B) | paths (B x N)] (int32,
        the accepted records already at cursor..): rows that reach the window fold every layer and the
        pointers move (``ops.commit``: two launches with the kernels), then the conv states roll. No host
        sync with a fold on the device."""
        rows, acc, nodes = self._commit_indices(buf, B, N)
        self.ops.commit(self, rows, acc)
        self._roll_conv(rows, acc, nodes)

    def _commit_snapshots(self, slots: list[int], paths: list[list[int]]) -> None:
        rows = [(s, p[-1], len(p)) for s, p in zip(slots, paths) if p]
        if not rows:
            return
        idx = self._index([s for s, _, _ in rows])
        last = self._index([n for _, n, _ in rows])
        self.ckpt[:, idx] = self.snap[:, idx, last]
        self.folded[idx] += self._index([a for _, _, a in rows])

    @staticmethod
    def _commit_indices(buf: torch.Tensor, B: int, N: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The views of a commit's uploaded indices: slots [B], accepted counts [B], padded paths [B, N]."""
        return buf[:B], buf[B:2 * B], buf[2 * B:].view(B, N)

    def _roll_conv(self, rows: torch.Tensor, acc: torch.Tensor, nodes: torch.Tensor) -> None:
        """Conv state after the accepted tokens (rows [B] slots, acc [B] accepted counts, nodes [B, N] their
        paths, padded; acc 0 leaves a row as it is): column j of the new state is column a + j of (old
        state, the a accepted drafts' conv inputs along their path), every layer in place
        (``ops.roll_conv``: one Triton launch, or the reference's gathers)."""
        if self.conv is None or self.conv_in is None or self.conv.shape[-1] == 0:
            return
        self.ops.roll_conv(self.conv, self.conv_in, rows, acc, nodes)

    # ------------------------------------------------------------------ unchecked device-side steps
    # The SGLang plugin's hot path: SGLang owns the slots and the draft trees, so these take device tensors,
    # check nothing on the host and read nothing back (the checked methods above are the native engine's).
    def commit_rows(self, rows: torch.Tensor, acc: torch.Tensor, nodes: torch.Tensor | None = None) -> None:
        """Commit a verify whose draft records sit at ring positions cursor.. of ``rows`` [B] (slots on the
        device; slot 0 rows are padding): ``acc`` [B] accepted drafts, ``nodes`` [B, N] their root-to-node
        paths (tree drafts, padded; None: the chain prefix). Tree paths are compacted to cursor.. first
        (``ops.compact_paths``); then ``ops.commit`` folds the rows that reach the window and moves the
        pointers, and the pool's own conv states (if any) roll. With the kernels: device work only."""
        if self.cfg.mode != "replay":
            raise CommitError("commit_rows needs a ReplaySSM pool (mode='replay')")
        rows = rows.to(torch.int32).clamp(min=0).contiguous()
        acc = torch.where(rows > 0, acc.to(torch.int32), torch.zeros_like(rows))
        self.commit_prepared(rows, acc, None if nodes is None else nodes.to(torch.int32).contiguous())

    def commit_prepared(self, rows: torch.Tensor, acc: torch.Tensor, nodes: torch.Tensor | None = None) -> None:
        """``commit_rows`` of indices already in the kernels' form (``ops.commit_prep``'s): ``rows`` [B] int32 slots
        >= 0, ``acc`` [B] int32 (0 on slot-0 rows), ``nodes`` [B, N] int32 or None; all contiguous. Tree paths to
        cursor.. (``ops.compact_paths``), the fold of the rows that reach the window and the pointer move
        (``ops.commit``), and the pool's own conv states (if any): three launches of a tree commit with the kernels."""
        if nodes is not None:
            self.ops.compact_paths(self, rows, acc, nodes)
        self.ops.commit(self, rows, acc)
        if self.conv is not None and self.conv_in is not None and self.conv.shape[-1]:
            if nodes is None:
                T = self.conv_in.shape[2]
                nodes = torch.arange(T, dtype=torch.int32, device=rows.device).expand(rows.shape[0], T).contiguous()
            self.ops.roll_conv(self.conv, self.conv_in, rows, acc, nodes)

    def flush_rows(self, rows: torch.Tensor) -> None:
        """``force_flush`` of ``rows`` [B] (slots on the device; padding rows <= 0 and repeats of a slot are
        skipped; no verify open): every layer folds the committed records, cursors restart at 0. The rows and
        their record counts (``ops.flush_prep``), the fold (``ops.fold``), the pointer move (``ops.flush_move``):
        three launches with the kernels, no host read; the reference folds through the host."""
        if self.cfg.mode != "replay" or rows.shape[0] == 0:
            return
        prep = torch.empty((2, rows.shape[0]), dtype=torch.int32, device=self.device)
        self.ops.flush_prep(self, rows.reshape(-1).contiguous(), prep)
        self.ops.fold(self, None, prep[0], prep[1])
        self.ops.flush_move(self, prep[0], prep[1])

    def reset_rows(self, rows: torch.Tensor) -> None:
        """``reset`` of ``rows`` (slots on the device, unchecked; padding slot 0 may be listed and is zeroed too):
        empty state, empty ring. Device ops, no host read."""
        idx = rows.long().clamp(min=0)
        # index_fill_, not t[:, idx] = 0: a Python scalar set through an index tensor is copied to the device
        # first (a host sync on CUDA); zero bits through an integer view (CUDA has no fp8 index_fill_)
        for t in self._per_slot_tensors():
            t.view(_SAME_SIZE_INT[t.element_size()]).index_fill_(1, idx, 0)
        for t in (self.rc_scale, self.rc_gscale):
            if t is not None and t.dtype == torch.float32:
                t.index_fill_(1, idx, 1)
        self.cursor.index_fill_(0, idx, 0)
        self.folded.index_fill_(0, idx, 0)

    def refresh_read_copy(self, layer: int, slots: torch.Tensor) -> None:
        """The checkpoint of ``slots`` (device tensor) in ``layer`` was written from outside (a prefill): make the
        read copy (or, with ``shared_quant``, the quantized checkpoint itself) match it. Device ops, no host
        read; padding-slot rows rewrite slot 0's own copy."""
        c = self.cfg
        if c.read_copy == "none":
            return
        idx = slots.long()
        state = self.ckpt[layer, idx].float()
        if c.shared_quant:
            self.ckpt[layer, idx] = fake_quant(state, c.read_copy).to(self.ckpt.dtype)
        if c.read_copy == "fp8":
            self.rc[layer, idx], self.rc_scale[layer, idx] = quant_fp8_rows(state)
        else:
            self.rc[layer, idx], self.rc_scale[layer, idx], self.rc_gscale[layer, idx] = quant_nvfp4(state)

    # ------------------------------------------------------------------ whole-state access
    def write_state(self, layer: int, slots: Sequence[int], state: torch.Tensor) -> None:
        """Prefill result: ``state [B, H, Dv, Dk]`` becomes the checkpoint (and read copy); ring empty."""
        slots = self.check_slots(slots)
        if self.cfg.mode == "replay" and (self.cursor[self._index(slots)] != 0).any():
            raise CommitError("write_state on a slot with uncommitted records: it would drop them")
        self.ops.store_checkpoint(self, layer, slots, state)

    def note_prefill(self, slots: Sequence[int], num_tokens: Sequence[int]) -> None:
        """Count prefilled tokens as folded (the stochastic-rounding stream advances with them)."""
        for s, n in zip(self.check_slots(slots), num_tokens):
            self.folded[s] += int(n)

    def materialize(self, layer: int, slots: Sequence[int]) -> torch.Tensor:
        """The current full state ``[B, H, Dv, Dk]`` of each slot (checkpoint + committed records)."""
        return torch.stack([self.ops.committed_state(self, layer, s) for s in self.check_slots(slots)])

    def force_flush(self, slots: Sequence[int]) -> None:
        """Fold committed records into the checkpoint now (e.g. at a prefix-cache boundary)."""
        slots = self.check_slots(slots)
        if self.cfg.mode != "replay":
            return
        for s in slots:
            if s in self._pending:
                raise CommitError(f"slot {s} has a verify pending: commit before flushing")
        cur = self.cursor[self._index(slots)].tolist()
        rows = [(s, c) for s, c in zip(slots, cur) if c > 0]
        if not rows:
            return
        for layer in range(self.num_layers):
            self.ops.fold(self, layer, [s for s, _ in rows], [c for _, c in rows])
        for s, c in rows:
            self.folded[s] += c
            self.cursor[s] = 0
