"""The one backend switch: a family's state arithmetic, from the PyTorch reference or the Triton kernels.

``FamilyOps.select(family, device, backend)`` chooses once, and the native engine (``native/ssm_ops.py``),
the SGLang plugin (``sglang_plugin/``) and the state pool (``pool.ReplayStatePool.ops``) all call what it
holds. ``backend``: ``"auto"`` (the Triton kernels on CUDA when they import, else the reference),
``"reference"``, or ``"triton"`` (also on CPU, where Triton runs under ``TRITON_INTERPRET=1``: tests);
``"kernels"`` is the plugin's spelling of ``"triton"`` (``SGLANG_REPLAYSSM_OPS``).

Both backends have the same signatures (docs/layout.md; the kernels add keyword-only ``method=`` /
``tuning=``):

    decode(pool, layer, slots, <raw inputs>) -> out                 ReplaySSM decode, one token per row
    verify(pool, layer, slots, <raw inputs [B, T, ...]>, parents=None) -> out   output-only draft verify
    fold(pool, layer | None, slots, counts)            records into the checkpoint (None: every layer)
    commit(pool, slots, accepted)                      a chain commit: fold where the window is reached, move pointers
    compact_paths(pool, slots, accepted, nodes)        a tree commit's accepted path records to cursor.. (before commit)
    copy_slots(tensors, src, dst, slot_dim)            whole-slot copies src[b] -> dst[b] of rows with both > 0
    advance(pool, slots, counts=None)                  a decode step's pointer move (+ its counts on the device)
    count_commit(pool, slots, accepted, T, counts)     a verify's counts before its commit
    tree_parents(next_token, next_sibling, out)        a verify's draft-tree parents from SGLang's child / sibling arrays
    commit_prep(pool, slots, accepted, T, counts, out, nodes=None, *, positions=None, parents=None,
                from_last=False, track=None, steps=None)
                                                       a verify commit's indices (rows, accepted counts, paths, last
                                                       nodes, track rows) and its counts, from SGLang's tensors
    flush_prep(pool, rows, out)                        a flush's rows (repeats and padding dropped) and record counts
    flush_move(pool, rows, counts)                     a flush's pointer move after its fold
    conventional_decode(state, slots, <raw inputs>) -> out           plain recurrence on state[slots]
    roll_conv(conv, conv_in, rows, acc, nodes)         the conv state past the accepted drafts

and, the reference's for both backends: ``conventional_step`` (prefill, snapshot verify),
``conventional_verify`` (one state snapshot per draft, a pool in ``mode="conventional"``),
``store_checkpoint`` and ``committed_state`` (a prefill's state in, the full state out).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
from collections.abc import Callable

import torch

from .reference import FAMILY_MODULES
from .reference import commit_prep as reference_commit_prep
from .reference import conv_state as reference_conv_state
from .reference import replay as reference_replay

logger = logging.getLogger(__name__)

BACKENDS = ("reference", "triton")
BACKEND_CHOICES = ("auto", "reference", "triton", "kernels")


@dataclasses.dataclass(frozen=True)
class FamilyOps:
    """One family's operations from one backend (see the module docstring for the signatures)."""

    family: str
    backend: str                      # "reference" | "triton"
    decode: Callable
    verify: Callable
    fold: Callable
    commit: Callable
    compact_paths: Callable
    copy_slots: Callable
    advance: Callable
    count_commit: Callable
    tree_parents: Callable
    commit_prep: Callable
    flush_prep: Callable
    flush_move: Callable
    conventional_decode: Callable
    roll_conv: Callable
    conventional_step: Callable
    conventional_verify: Callable
    store_checkpoint: Callable
    committed_state: Callable
    # the split decode's flush-row list builder, when the decode takes one (``flush_list=``), else None
    flush_list: Callable | None = None

    @property
    def package(self) -> str:
        """Where decode / verify / fold come from: ``sglang_replayssm.<package>.<family>``."""
        return "kernels" if self.backend == "triton" else "reference"

    @property
    def fold_on_device(self) -> bool:
        """The fold waits on no device result (a chain commit can be captured in a CUDA graph)."""
        return self.backend == "triton"

    @staticmethod
    def resolve(backend: str, device) -> str:
        """``backend`` (one of BACKEND_CHOICES) as one of BACKENDS, for tensors on ``device``."""
        if backend not in BACKEND_CHOICES:
            raise ValueError(f"backend must be one of {', '.join(BACKEND_CHOICES)}, got {backend!r}")
        if backend == "auto":
            return "triton" if torch.device(device).type == "cuda" else "reference"
        return "triton" if backend == "kernels" else backend

    @classmethod
    def select(cls, family: str, device, backend: str = "auto") -> "FamilyOps":
        """The operations of ``family`` for a pool on ``device`` (see the module docstring). With
        ``"auto"``, kernels that fail to import fall back to the reference, with a warning."""
        if family not in FAMILY_MODULES:
            raise ValueError(f"family must be one of {tuple(FAMILY_MODULES)}, got {family!r}")
        chosen = cls.resolve(backend, device)
        if chosen == "reference":
            return cls.reference(family)
        try:
            return cls.triton(family)
        except Exception as e:   # noqa: BLE001 - the kernels are optional; the reference is always there
            if backend != "auto":
                raise
            logger.warning("sglang_replayssm.kernels.%s does not import (%s): using the PyTorch reference", family, e)
            return cls.reference(family)

    @classmethod
    def reference(cls, family: str) -> "FamilyOps":
        """The PyTorch reference (``reference.<family>``): any device, the oracle."""
        ref = FAMILY_MODULES[family]
        return cls(family, "reference", decode=ref.decode, verify=ref.verify, fold=ref.fold, commit=ref.commit,
                   compact_paths=reference_replay.compact_paths, copy_slots=reference_replay.copy_slots,
                   advance=reference_replay.advance, count_commit=reference_replay.count_commit,
                   tree_parents=reference_replay.tree_parents, commit_prep=reference_commit_prep.commit_prep,
                   flush_prep=reference_commit_prep.flush_prep, flush_move=reference_commit_prep.flush_move,
                   conventional_decode=ref.conventional_decode,
                   roll_conv=reference_conv_state.roll_conv_state,
                   **cls._shared(ref))

    @classmethod
    def triton(cls, family: str) -> "FamilyOps":
        """The Triton kernels (``kernels.<family>``); imports them (and Triton)."""
        kern = importlib.import_module(f"sglang_replayssm.kernels.{family}")
        conv_state = importlib.import_module("sglang_replayssm.kernels.conv_state")
        compact = importlib.import_module("sglang_replayssm.kernels.compact_paths")
        slot_copy = importlib.import_module("sglang_replayssm.kernels.slot_copy")
        step_counts = importlib.import_module("sglang_replayssm.kernels.step_counts")
        draft_tree = importlib.import_module("sglang_replayssm.kernels.draft_tree")
        prep = importlib.import_module("sglang_replayssm.kernels.commit_prep")
        flush_list = None
        if "flush_list" in inspect.signature(kern.decode).parameters:
            flush_list = importlib.import_module("sglang_replayssm.kernels.split_decode").flush_list
        return cls(family, "triton", decode=kern.decode, verify=kern.verify, fold=kern.fold, commit=kern.commit,
                   compact_paths=compact.compact_paths, copy_slots=slot_copy.copy_slots,
                   advance=step_counts.advance, count_commit=step_counts.count_commit,
                   tree_parents=draft_tree.tree_parents, commit_prep=prep.commit_prep, flush_prep=prep.flush_prep,
                   flush_move=prep.flush_move, conventional_decode=kern.conventional_decode,
                   roll_conv=conv_state.roll_conv_state,
                   flush_list=flush_list, **cls._shared(FAMILY_MODULES[family]))

    @staticmethod
    def _shared(ref) -> dict:
        return dict(conventional_step=ref.conventional_step, conventional_verify=ref.verify,
                    store_checkpoint=reference_replay.store_checkpoint,
                    committed_state=reference_replay.committed_state)
