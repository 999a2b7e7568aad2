#!/usr/bin/env bash
# Issue 45's GPU rows, one device call (carry [".peer", ".fid"]; from the repo root), PART=kernels,fidelity by default,
# each cut by what is left of BUDGET seconds:
#   PART=kernels   (TESTS, GEOS, BATCHES: other tests, geometries, batches) the CUDA kernel tests of the exact flush and the families' kernels; then the decode step (a full
#                  window, flushes included, the library's default blocks and method) of GDN 16/32, GDN 16/64 and
#                  KDA at batch 64 / 256 / 512, fp32 read and fp8 read copy, beside SGLang's ReplaySSM decode, for
#                  this tree and for the tree before the exact flush (.fid/old: that commit's sglang_replayssm with
#                  this tree's bench/ and tools/); merged into $OUT/decode_exact_flush.json
#   PART=fidelity  bench/fidelity.py for GDN, 64K tokens x 8 streams, with the exact flush (this tree) and before it
#                  (.fid/fidelity_before.py: the window form that folded the read-copy d's), on .fid/corpus.npz (the
#                  held-out text of the committed fidelity run)
# Prepare here: ../shared/tools/peer_kernels.sh .peer; mkdir .fid; git archive BEFORE sglang_replayssm | tar x -C
# .fid/old (then cp -r bench tools .fid/old/ and drop .fid/old/sglang_replayssm/native/assets);
# git show BEFORE:bench/fidelity.py > .fid/fidelity_before.py; the held-out corpus (tools/corpus.py) in .fid/corpus.npz.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
OUT=${OUT:?set OUT}
ROOT=$PWD
t0=$(date +%s); BUDGET=${BUDGET:-570}
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
for part in $(echo "${PART:-kernels,fidelity}" | tr , ' '); do
case $part in
kernels)
  TRITON_INTERPRET=0 timeout 240 python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/kernels/test_exact_flush.py \
    tests/kernels/test_gdn.py tests/kernels/test_kda.py tests/kernels/test_split_flush.py tests/kernels/test_fold_blocks.py \
    tests/kernels/test_commit_ops.py tests/kernels/test_commit_graph.py} > "$OUT/pytest_cuda.txt" 2>&1
  tail -3 "$OUT/pytest_cuda.txt"
  for tree in . .fid/old; do
    for B in ${BATCHES:-64 256 512}; do
      (cd "$tree" && PYTHONPATH="$ROOT/.peer" timeout "${LIM:-70}" python3 bench/kernels.py --sweep --sweep-batch "$B" \
        --geos "${GEOS:-gdn_qwen35_4b,gdn_qwen35_122b,kda_32h}" --sweep-decode default --sweep-decode-methods default \
        --sweep-read-copies none,fp8 --sweep-verify "" $([ "$tree" = . ] && echo --sweep-peer) \
        --out "/tmp/dec/$([ "$tree" = . ] && echo exact || echo before)_b$B") 2>&1 | grep -v Warning
    done
  done
  python3 - "$OUT/decode_exact_flush.json" <<'PY'
import glob, json, os, sys
out = {"meta": {"calls": []}, "rows": []}
for f in sorted(glob.glob("/tmp/dec/*/kernels_sweep.json")):
    tree = "exact flush" if os.path.basename(os.path.dirname(f)).startswith("exact") else "before"
    r = json.load(open(f))
    out["meta"]["calls"].append(dict(r["meta"], tree=tree))
    out["meta"].setdefault("device", r["meta"]["device"])
    for row in r["rows"]:
        row["tree"] = tree
        out["rows"].append(row)
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(len(out["rows"]), "rows")
PY
  ;;
fidelity)
  timeout "$(left)" python3 bench/fidelity.py --families gdn --corpus .fid/corpus.npz --device cuda --tokens 65536 \
    --streams 8 --out "$OUT/fidelity_gdn_exact"
  timeout "$(left)" python3 .fid/fidelity_before.py --families gdn --corpus .fid/corpus.npz --device cuda \
    --tokens 65536 --streams 8 --out "$OUT/fidelity_gdn_before"
  ;;
esac
done
echo "total $(( $(date +%s) - t0 ))s"
