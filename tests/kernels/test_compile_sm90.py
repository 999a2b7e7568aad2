"""Every Triton kernel compiles for Hopper (sm_90), with no register spills (but the few pinned below).

The rest of the suite runs the kernels under TRITON_INTERPRET=1, which accepts code the real
compiler refuses (it let a non-constexpr global reach the attention kernel). This compiles each
kernel through its real wrapper for sm_90 with Triton's own pipeline and ptxas, without a GPU
(tests/kernels/kernel_resources.py), in a subprocess without the interpreter.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {"_m2_decode_kernel", "_m2_decode_prep_kernel", "_m2_decode_read_kernel", "_m2_verify_mma_kernel",
            "_gdn_decode_prep_kernel", "_gdn_decode_read_kernel", "_m2_verify_kernel", "_m2_conventional_kernel", "_fold_kernel",
            "_gdn_decode_kernel", "_gdn_verify_kernel", "_gdn_verify_mma_kernel", "_gdn_conventional_kernel",
            "_gdn_draft_gram_kernel", "_gdn_verify_split_kernel",
            "_kda_decode_kernel", "_kda_decode_prep_kernel", "_kda_decode_read_kernel", "_kda_verify_kernel", "_kda_verify_mma_kernel", "_kda_conventional_kernel", "_kda_fold_kernel", "_delta_fold_kernel", "_attn_kernel", "_combine_kernel",
            # the native engine's fused non-SSM kernels
            "_add_rms_norm_kernel", "_group_norm_kernel", "_act_mul_kernel", "_norm_rope_kernel", "_conv_kernel",
            # the pool's conv-state roll at commit (kernels/conv_state.py), a decode step's pointer move and a
            # verify's counts (kernels/step_counts.py), a tree verify's parents (kernels/draft_tree.py), a commit's
            # and a flush's index preparation and a flush's pointer move (kernels/commit_prep.py)
            "_conv_roll_kernel", "_decode_advance_kernel", "_count_commit_kernel", "_tree_parents_kernel",
            "_commit_prep_kernel", "_flush_prep_kernel", "_flush_move_kernel"}


# Bytes of per-thread stack frame (cuobjdump's STACK: register spills or local arrays) that these quick
# configurations have with the CI's Triton (3.8); every other kernel must have none. (LOCAL, checked
# below too, stays 0 even when ptxas spills: the spills live in the stack frame.)
STACK_ALLOWED = {("_fold_kernel", "fold nvfp4"): 8, ("_delta_fold_kernel", "fold nvfp4"): 8,
                 # the delta families' exact fold (the window's d's solved from the checkpoint with tensor-core dots,
                 # kernels/delta_fold.py, kda/token.py) beside the read pass in one-warp programs, and KDA's
                 # per-channel Gram sums: a few words each with Triton 3.8
                 ("_gdn_decode_kernel", "decode fp8"): 8, ("_gdn_decode_kernel", "decode fp16-sr"): 16,
                 ("_kda_decode_kernel", "decode fp32 split defaults"): 16,
                 ("_kda_decode_kernel", "decode fp16-sr"): 8, ("_kda_fold_kernel", "fold fp32"): 40,
                 ("_kda_fold_kernel", "fold nvfp4"): 8, ("_kda_fold_kernel", "fold fp16-sr"): 8,
                 # The library's tuned split decode (tuning.SPLIT_TUNED): its flush launch folds whole 128-column
                 # rows in 1-2 warps and spills to the stack (Triton 3.6 on the H200: Mamba-2 Nano 208 / 232
                 # bytes). It runs for the 1/16 of the rows that flush, beside the read pass, and measured faster
                 # than the spill-free launches with more warps (docs/history/runs.md, Kernels, fourth, sixth and
                 # seventh runs); these pin the amounts so that a change which spills more shows here.
                 ("_m2_decode_kernel", "decode fp32 split defaults"): 176,
                 ("_m2_decode_kernel", "decode fp8 split defaults"): 200,
                 # GDN's tensor-core verify in 32-column chunks, the library's choice for a one-wave grid
                 # (tuning.ONE_WAVE_BLOCK_K): its finish's registers spill (376 bytes here), and it measured 5-9 %
                 # faster than the spill-free 16-column chunks there (H200, bench/results/verify_block_k_s11.json)
                 ("_gdn_verify_mma_kernel", "verify T4 mma one-wave"): 376}


def test_every_kernel_compiles_for_sm90_without_spills(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    geos = "mamba2_nemotron3_nano4b,gdn_qwen35_4b,kda_32h"
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels" / "kernel_resources.py"), "--quick", "--geos", geos,
                        "--out", str(tmp_path), "--sass-dir", str(tmp_path / "sass")], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads((tmp_path / "kernel_resources.json").read_text())["rows"]
    errors = [(row["geo"], row["launch"], row["error"][:300]) for row in rows if "error" in row]
    assert not errors, errors
    compiled = {row["kernel"] for row in rows}
    assert EXPECTED <= compiled, f"not compiled: {sorted(EXPECTED - compiled)}"
    for row in rows:
        assert row["local"] == 0, f"{row['kernel']} ({row['geo']}, {row['launch']}) spills {row['local']} bytes"
        allowed = STACK_ALLOWED.get((row["kernel"], row["launch"].split(" bv")[0]), 0)
        assert row["stack"] <= allowed, f"{row['kernel']} ({row['geo']}, {row['launch']}): {row['stack']} bytes of stack"
        assert 0 < row["regs"] <= 255 and row["blocks_per_sm"] >= 1, row
        # every read-copy format and checkpoint precision of every family compiles
    # all the math is fp32: an fp64 instruction means a Python float constant outside the fp32 range
    # (or an fp64 tensor) leaked into a kernel, which also changes results against the reference
    fp64 = re.compile(r"\b(DADD|DMUL|DFMA|DSETP|DMNMX|DSET|MUFU\.RCP64H|MUFU\.RSQ64H|F2F\.F64\.F32|F2F\.F32\.F64)\b")
    sass = sorted((tmp_path / "sass").glob("*.sass"))
    assert len(sass) == len(rows)
    for f in sass:
        hits = [ln for ln in f.read_text().splitlines() if fp64.search(ln)]
        assert not hits, f"{f.name}: fp64 instructions, e.g. {hits[:3]}"
    labels = {(row["geo"], row["launch"].split(" bv")[0]) for row in rows}
    for geo in geos.split(","):
        for v in ("fp32", "fp8", "nvfp4", "fp16-sr"):
            assert (geo, f"decode {v}") in labels and (geo, f"fold {v}") in labels, (geo, v)
