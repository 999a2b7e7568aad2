"""SSM-layer dispatch of the native engine: what runs an SSM layer's prefill, decode and verify.

The operations come from one `family_ops.FamilyOps`, chosen once from the family, the pool's device
and `kernels` (the engine's `--kernels`: auto | triton | reference), and handed to the pool too
(`pool.ops`: the commit's fold and conv roll come from the same backend).

* prefill: the plain recurrence (`conventional_step`) token by token, from the state in the pool
  (`pool.materialize`) to `pool.write_state` (checkpoint + read copy, empty ring).
* decode / verify: the ReplaySSM `decode` / `verify` on the pool. A pool in `mode="conventional"`
  (the baseline) decodes with `conventional_decode` (the state updated in place) and verifies with
  `conventional_verify` (one state snapshot per draft).
* `decode_options` / `verify_options`: keyword arguments for the Triton decode / verify wrappers
  (`method`, `tuning`: a `kernels.tuning.KernelTuning` of block sizes, warps, stages), checked against
  their signatures; unused by the reference path.
* `forward_scope(mode, slots)`: the model wraps each forward in it; a ReplaySSM decode step on the
  kernels then builds the split decode's flush-row list once for all SSM layers.
* `replay_verify=False` (--no-replayssm-verify) with a ReplaySSM pool: verify steps the plain
  recurrence through the drafts keeping one state per draft (the snapshot scheme), and the commit
  writes the accepted state back as a new checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch

from ..family_ops import FamilyOps

# positions of the per-token inputs (those with a T axis) in each family's raw-input tuple
TIMED = {"mamba2": (0, 1, 3, 4), "gdn": (0, 1, 2, 3, 4)}


def _options(fn, options, what: str) -> dict:
    """`options` checked against the keyword-only parameters of the Triton wrapper `fn`."""
    options = dict(options or {})
    if options and fn is not None:
        allowed = {n for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}
        bad = sorted(set(options) - allowed)
        if bad:
            raise ValueError(f"{what} options {bad} are not accepted by {fn.__module__}.{fn.__name__} "
                             f"(it takes {sorted(allowed)})")
    return options


class SSMOps:
    """The SSM layers' operations for the engine's pool (see the module docstring). `backend` /
    `verify_backend`: "triton" or "reference" (the engine's stats)."""

    def __init__(self, family: str, pool, replay_verify: bool = True, kernels: str = "auto",
                 decode_options: dict | None = None, verify_options: dict | None = None):
        if kernels not in ("auto", "triton", "reference"):
            raise ValueError(f"kernels must be auto, triton or reference, got {kernels!r}")
        self.family, self.pool, self.replay_verify = family, pool, replay_verify
        self.family_ops = FamilyOps.select(family, pool.device, kernels)
        pool.ops = self.family_ops   # the commit's fold and conv roll: the same backend
        self.backend = self.verify_backend = self.family_ops.backend
        self.conventional = pool.cfg.mode == "conventional"
        self.decode_kw, self.verify_kw = {}, {}   # the reference takes no tuning options
        if self.backend == "triton":
            self.decode_kw = _options(self.family_ops.decode, decode_options, "decode")
            self.verify_kw = _options(self.family_ops.verify, verify_options, "verify")
        self._snaps = {}   # snapshot verify: layer -> states [B, T, H, Dv, Dk]
        self._flush = None   # (slots, function returning (rows, count)) inside a decode forward_scope

    @property
    def snapshot_verify(self) -> bool:
        return not self.replay_verify and not self.conventional

    @contextlib.contextmanager
    def forward_scope(self, mode: str, slots: torch.Tensor):
        """Around one model forward: a ReplaySSM decode step on the Triton kernels builds the flush-row
        list of `slots` at most once, for all its SSM layers (cursors only move between steps), instead of
        one list launch per layer; run() hands the kernels a function that builds it on the first split
        decode that asks (a fused decode, at small batches, never does), for that same slots tensor, until
        the scope ends."""
        flush_list = self.family_ops.flush_list
        if mode == "decode" and flush_list is not None and not self.conventional and slots.numel():
            build = functools.cache(lambda: flush_list(slots, self.pool.cursor, self.pool.cfg.window)[:2])
            self._flush = (slots, build)
        try:
            yield
        finally:
            self._flush = None

    def _at(self, inputs, t):
        timed = TIMED[self.family]
        return tuple(x[:, t] if i in timed else x for i, x in enumerate(inputs))

    def run(self, layer: int, slots: torch.Tensor, mode: str, inputs: tuple, T: int) -> torch.Tensor:
        """Output [B, T, H, Dv] of one SSM layer for raw inputs with a T axis."""
        ops = self.family_ops
        if mode == "prefill":
            state = self.pool.materialize(layer, slots.tolist()).float()
            outs = []
            for t in range(T):
                o, state = ops.conventional_step(state, *self._at(inputs, t))
                outs.append(o)
            self.pool.write_state(layer, slots.tolist(), state)
            return torch.stack(outs, dim=1)
        # the Triton wrappers want contiguous inputs and int32 slots
        slots = slots if slots.dtype == torch.int32 else slots.int()
        if mode == "decode":
            step = tuple(x.contiguous() for x in self._at(inputs, 0))
            if self.conventional:
                return ops.conventional_decode(self.pool.ckpt[layer], slots, *step).unsqueeze(1)
            kw = self.decode_kw
            if self._flush is not None and self._flush[0] is slots:
                kw = dict(kw, flush_list=self._flush[1])
            return ops.decode(self.pool, layer, slots, *step, **kw).unsqueeze(1)
        if self.snapshot_verify:
            state = self.pool.ckpt[layer, slots].float()     # cursors are 0: see begin_verify
            outs, states = [], []
            for t in range(T):
                o, state = ops.conventional_step(state, *self._at(inputs, t))
                outs.append(o)
                states.append(state)
            self._snaps[layer] = torch.stack(states, dim=1)
            return torch.stack(outs, dim=1)
        if self.conventional:   # the pool keeps one snapshot per draft
            return ops.conventional_verify(self.pool, layer, slots, *inputs)
        return ops.verify(self.pool, layer, slots, *(x.contiguous() for x in inputs), **self.verify_kw)

    # ------------------------------------------------------------------ verify bookkeeping
    def begin_verify(self, slots: list, T: int) -> None:
        if self.snapshot_verify:
            self.pool.force_flush(slots)   # the snapshot scheme starts from a full state
            self._snaps = {}
        else:
            self.pool.begin_verify(slots, T)

    def accept_drafts(self, slots: list, accepted: list) -> None:
        """Keep the first accepted[i] verified tokens of each row (>= 1): the pool accepts the drafts
        (`pool.accept_drafts`: pointer move, fold, conv roll), or, with the snapshot verify, the last
        accepted draft's state becomes the checkpoint and the conv state moves past the accepted inputs."""
        if not self.snapshot_verify:
            self.pool.accept_drafts(slots, accepted)
            return
        dev = self.pool.device
        rows = torch.arange(len(slots), device=dev)
        last = torch.as_tensor(accepted, device=dev) - 1
        for layer, states in self._snaps.items():
            self.pool.write_state(layer, slots, states[rows, last])
        self.pool.note_prefill(slots, accepted)
        self._snaps = {}
        # conv state: the last K-1 columns of [conv state | accepted conv inputs] (the chain's first drafts)
        conv, conv_in = self.pool.conv, self.pool.conv_in
        if conv is None or conv_in is None or conv.shape[-1] == 0 or not slots:
            return
        B, N = len(slots), max(accepted)
        slot_t = torch.as_tensor(slots, dtype=torch.int32, device=dev)
        acc = torch.as_tensor(accepted, dtype=torch.int32, device=dev)
        nodes = torch.arange(N, dtype=torch.int32, device=dev).expand(B, N).contiguous()
        self.family_ops.roll_conv(conv, conv_in, slot_t, acc, nodes)
