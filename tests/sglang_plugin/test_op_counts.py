"""Upper bounds on the plugin's eager device ops per step (bench/plugin_op_counts.py, counted on CPU with the pool's
Triton kernels under the interpreter: aten ops that launch a kernel + Triton launches). Outside a CUDA graph each is
one launch on the host's critical path, so an op that creeps back into a per-layer hook (multiplied by the model's
SSM layers) or into a step's metadata, settle or commit fails here. GDN: the decode, the prefill and the tree verify
(whose metadata hook and commit are the family-independent parts; Mamba-2's per-layer hook differs by one op, the
copy into SGLang's output buffer, and is measured by the bench)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("no_host_reads")


def _bench():
    spec = importlib.util.spec_from_file_location("plugin_op_counts", ROOT / "bench" / "plugin_op_counts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_plugin_step_op_counts_stay_within_bounds(monkeypatch):
    from sglang_replayssm.sglang_plugin.options import OPS_ENV

    monkeypatch.setenv(OPS_ENV, "kernels")   # what runs on a GPU
    counts = _bench().count_family("gdn", steps=("decode", "prefill", "verify_tree"))
    got = {name: (c["per_step"], c["per_layer"], c["host_reads"]) for name, c in counts.items()}
    assert counts["verify_tree"]["by_entry"]["note_step"]["by_op"] == {"triton:_tree_parents_kernel": 1}, counts
    # (per step, per layer, host reads): per layer the q, k, v copies of SGLang's split views + the decode / verify
    # kernel; a prefill layer launches nothing without a read copy; per step: the slot conversion, the note, the
    # advance (decode), the flush (prefill), the tree parents + the commit (tree verify)
    bounds = {"decode": (3, 4, 0), "prefill": (25, 0, 0), "verify_tree": (27, 4, 0)}
    assert all(got[n][i] <= bounds[n][i] for n in bounds for i in range(3)), (got, counts)
