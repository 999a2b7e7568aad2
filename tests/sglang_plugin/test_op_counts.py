"""Upper bounds on the plugin's eager device ops per step (bench/plugin_op_counts.py, counted on CPU with the pool's
Triton kernels under the interpreter: aten ops that launch a kernel + Triton launches). Outside a CUDA graph each is
one launch on the host's critical path, so an op that creeps back into a per-layer hook (multiplied by the model's
SSM layers) or into a step's metadata, settle or commit fails here. GDN: the decode, the prefill, the chain and tree
verify and the tree verify with extra_buffer track slots (whose metadata hook and commit are the family-independent
parts); Mamba-2: the per-layer hook of a decode and a tree verify (the kernel alone: it reads the mixer's split views
and writes SGLang's output buffer)."""
from __future__ import annotations

import pytest

from tests.bench_scripts import load_bench

pytestmark = pytest.mark.usefixtures("no_host_reads")


def _bench():
    return load_bench("plugin_op_counts.py")


def test_plugin_step_op_counts_stay_within_bounds(monkeypatch):
    from sglang_replayssm.sglang_plugin.options import OPS_ENV

    monkeypatch.setenv(OPS_ENV, "kernels")   # what runs on a GPU
    counts = _bench().count_family("gdn", steps=("decode", "prefill", "verify_chain", "verify_tree",
                                                  "verify_tree_track"))
    got = {name: (c["per_step"], c["per_layer"], c["host_reads"]) for name, c in counts.items()}
    by_op = {name: {e: c["by_entry"][e]["by_op"] for e in c["by_entry"]} for name, c in counts.items()}
    assert by_op["verify_tree"]["note_step"] == {"triton:_tree_parents_kernel": 1}, counts
    # a prefill's flush: its rows, the fold, the pointer move, and the rows' early folds noted (flush_stagger.py); a
    # commit: its indices + counts, (the tree path's records to the cursor,) the fold, the pointer move, SGLang's conv
    # rollback, and SGLang's slot lookup (one index op)
    assert by_op["prefill"]["note_step"] == {"triton:_flush_prep_kernel": 1, "triton:_delta_fold_kernel": 1,
                                             "triton:_flush_move_kernel": 1, "_to_copy": 1, "clamp": 1,
                                             "remainder": 1, "index_copy_": 1}, counts
    assert by_op["verify_tree"]["commit"] == {
        "index": 1, "triton:_commit_prep_kernel": 1, "triton:_compact_kernel": 1, "triton:_delta_fold_kernel": 1,
        "triton:_advance_kernel": 1, "triton:sglang:fused_mamba_state_scatter_with_mask": 1}, counts
    # (per step, per layer, host reads): per layer the decode / verify kernel alone (it reads SGLang's split views of
    # q, k, v by token rows: no copies); a prefill layer launches nothing without a read copy; per step: the slot
    # conversion, the note, the advance (decode), the flush (prefill), the tree parents + the commit (verify); with
    # track slots the commit adds
    # the slot copy (one launch per pool tensor: a delta family has two more, its raw v and beta), the track slot's commit and conv rollback, and SGLang's own boundary
    # steps (_verify_commit_step_indices, ~20 ops)
    bounds = {"decode": (3, 1, 0), "prefill": (7, 0, 0), "verify_chain": (6, 1, 0), "verify_tree": (8, 1, 0),
              "verify_tree_track": (39, 1, 0)}
    assert all(got[n][i] <= bounds[n][i] for n in bounds for i in range(3)), (got, counts)


def test_mamba2_layer_hook_is_one_launch(monkeypatch):
    from sglang_replayssm.sglang_plugin.options import OPS_ENV

    monkeypatch.setenv(OPS_ENV, "kernels")
    counts = _bench().count_family("mamba2", steps=("decode", "verify_tree"))
    layer = {name: c["by_entry"]["layer"]["by_op"] for name, c in counts.items()}
    assert layer == {"decode": {"triton:_m2_decode_kernel": 1}, "verify_tree": {"triton:_m2_verify_mma_kernel": 1}}, counts
    assert all(c["per_layer"] == 1 and c["host_reads"] == 0 for c in counts.values()), counts
