#!/usr/bin/env bash
# The H200 runs that issues 3 (kernels) and 4 (native engine) wait on, one part per device call
# (each part fits the 10-minute limit of a call; ~30 minutes of device time for all of them).
#
# On the dev box first: SGLang 0.5.23's own kernels into the git-ignored .peer/ (bench/README.md, kernels.py)
# Then, per device call (carry [".peer"]):   PART=<part> OUT=$OUT bash bench/h200/h200_perf.sh
#
# PART:
#   sweep-gdn      bench/kernels.py --sweep for GDN 16/32 (decode configs incl. stages; verify fma/mma/split)
#   sweep-others   the same for Mamba-2 Super and KDA
#   sweep-all      a smaller grid for all three families in one call (G, VER_GDN, VER_M2, G_KDA, VER_KDA; LIM_*)
#   sweep-decode   decode only, one geometry list (GEOS), configs DEC, methods METHODS (default split), read
#                  copies RCS (default none,fp8), ring cursors CURSORS (staggered, the default, or synchronized:
#                  every row flushes in the same step of the window; also for profile)
#   sweep-verify   verify (T = 4, 8; GDN mma, Mamba-2 fma + mma) and commit-fold blocks (VM, FOLD), no decode
#   profile        bench/profile_kernels.py: each kernel's GPU time per decode / verify step (CASES)
#   final          the comparison at B = 256 of all five geometries at the library's defaults (--quick), with
#                  the GPU correctness checks, then bench/read_ceiling.py
#   kernels        the comparison with SGLang's kernels at B = 256 (decode, verify T = 1..8 incl. mma/split)
#   e2e            bench/e2e.py at B = 256 (BATCHES), fused non-SSM kernels on, one model per run (MODELS, both
#                  by default) at the library's kernel defaults; DECODE_METHOD / VERIFY_METHOD / VERIFY_BLOCK_V
#                  override them; VERIFY_TOKENS="" times decode only; PROFILE=N keeps each decode mode's and verify step's N
#                  costliest kernels;
#                  writes e2e_<TAG, default b256>_<model>.json
#   e2e-stages     bench/e2e.py at B = 256, fused on, split decode with a pipelined state loop (STAGES, 2)
# Writes logs and JSON/PNG results under $OUT; copy the ones worth keeping into bench/results/ and stamp them
# (python bench/stamp_meta.py FILE: meta.commit, bench/README.md "Result files").
set -uo pipefail
PY=${PY:-python3}
OUT=${OUT:?set OUT}
PART=${PART:?set PART (sweep-gdn, sweep-others, sweep-all, sweep-decode, sweep-verify, profile, final, kernels, e2e, e2e-stages)}
LIMIT=${LIMIT:-560}
# a focused grid (each config compiles once, ~2-4 s): decode BVxBKxWARPS[xSTAGES[xFLUSH_BK[xFLUSH_WARPS]]],
# verify BVxBKxWARPS
DEC=${DEC:-32x32x1,32x32x2,64x32x2,64x32x4,32x64x1x0x32,32x128x2x0x32,32x32x1x2,32x32x2x3}
VER=${VER:-16x16x2,32x16x2,32x16x4,64x16x4,64x16x8,32x32x8}
export PYTHONPATH=.:.peer PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
 $PY -c "import torch, triton; print(torch.__version__, triton.__version__)") > "$OUT/env_$PART.txt" 2>&1
case $PART in
  sweep-gdn)
    timeout "$LIMIT" $PY bench/kernels.py --sweep --geos gdn_qwen35_4b --sweep-decode "$DEC" --sweep-verify "$VER" \
      --out "$OUT" ;;
  sweep-others)
    timeout "$LIMIT" $PY bench/kernels.py --sweep --geos mamba2_nemotron3_super,kda_32h --sweep-decode "$DEC" \
      --sweep-verify "$VER" --out "$OUT" ;;
  sweep-all)   # the three families in one call, each cut at its share of the limit (partial results kept)
    G=${G:-32x32x1,32x32x2,16x128x2x0x32,16x128x2x0x128,32x128x4x0x128,32x64x2x0x128,64x128x4x0x128,32x32x1x2,32x32x2x3}
    mkdir -p "$OUT/gdn" "$OUT/mamba2" "$OUT/kda"
    timeout "${LIM_GDN:-270}" $PY bench/kernels.py --sweep --geos gdn_qwen35_4b --sweep-decode "$G" \
      --sweep-verify "${VER_GDN:-16x16x2,32x16x2,32x16x4,64x16x4}" --out "$OUT/gdn"
    timeout "${LIM_M2:-170}" $PY bench/kernels.py --sweep --geos mamba2_nemotron3_super --sweep-decode "$G" \
      --sweep-verify "${VER_M2:-32x16x4,64x16x4,32x32x4}" --out "$OUT/mamba2"
    timeout "${LIM_KDA:-110}" $PY bench/kernels.py --sweep --geos kda_32h \
      --sweep-decode "${G_KDA:-32x32x1,32x32x2,16x128x2x0x128,32x128x4x0x128,32x32x1x2}" \
      --sweep-verify "${VER_KDA:-32x16x4,16x16x2}" --out "$OUT/kda" ;;
  sweep-decode)   # decode alone (fp32 checkpoint read and fp8 read copy), no verify or fold
    timeout "$LIMIT" $PY bench/kernels.py --sweep --geos "${GEOS:?set GEOS}" --sweep-decode "$DEC" \
      --sweep-decode-methods "${METHODS:-split}" --sweep-read-copies "${RCS:-none,fp8}" --sweep-verify "" \
      --cursors "${CURSORS:-staggered}" --out "$OUT" ;;
  sweep-verify)   # verify (T = 4, 8) and commit-fold blocks only, no decode: GDN mma, Mamba-2 fma + mma
    VM=${VM:-32x16x2,32x16x4,16x16x2,64x16x4,32x32x2,32x32x4,64x32x4,32x64x4,32x128x4,32x16x4x1,32x16x4x2,32x32x4x2}
    FOLD=${FOLD:-16x32x4,32x32x4,16x64x4,32x64x4,32x128x4,64x128x4,16x128x2,64x128x8,16x32x2,32x32x2}
    mkdir -p "$OUT/gdn" "$OUT/mamba2" "$OUT/mamba2_fma"
    timeout "${LIM_GDN:-230}" $PY bench/kernels.py --sweep --geos gdn_qwen35_4b --sweep-decode "" \
      --sweep-verify "$VM" --sweep-verify-methods mma --sweep-fold "$FOLD" --out "$OUT/gdn"
    timeout "${LIM_M2:-230}" $PY bench/kernels.py --sweep --geos mamba2_nemotron3_super --sweep-decode "" \
      --sweep-verify "$VM" --sweep-verify-methods mma --sweep-fold "$FOLD" --out "$OUT/mamba2"
    timeout "${LIM_M2F:-60}" $PY bench/kernels.py --sweep --geos mamba2_nemotron3_super --sweep-decode "" \
      --sweep-verify "64x16x4" --sweep-verify-methods fma --out "$OUT/mamba2_fma" ;;
  profile)
    timeout "$LIMIT" $PY bench/profile_kernels.py --out "$OUT" ${CASES:+--cases "$CASES"} --cursors "${CURSORS:-staggered}" ;;
  final)
    timeout "${LIM_FINAL:-215}" $PY bench/kernels.py --quick --batches 256 --out "$OUT" \
      --geos gdn_qwen35_4b,mamba2_nemotron3_super,gdn_qwen35_122b,mamba2_nemotron3_nano4b,kda_32h
    timeout 40 $PY bench/read_ceiling.py --out "$OUT" ;;
  kernels)
    timeout "$LIMIT" $PY bench/kernels.py --geos gdn_qwen35_4b,mamba2_nemotron3_super,kda_32h --batches 256 \
      --out "$OUT" ;;
  e2e)
    for m in ${MODELS:-qwen3.5-4b nemotron-3-nano-4b}; do
      timeout "${LIM_E2E:-250}" $PY bench/e2e.py --models "$m" --batches ${BATCHES:-256} --fused on \
        ${DECODE_METHOD:+--decode-method "$DECODE_METHOD"} ${VERIFY_METHOD:+--verify-method "$VERIFY_METHOD"} \
        ${VERIFY_BLOCK_V:+--verify-block-v "$VERIFY_BLOCK_V"} ${VERIFY_TOKENS+--verify-tokens $VERIFY_TOKENS} ${PROFILE:+--profile "$PROFILE"} \
        --out "$OUT/e2e_${TAG:-b256}_$m.json"
    done ;;
  e2e-stages)
    timeout "$LIMIT" $PY bench/e2e.py --batches 256 --fused on --modes conventional replay replay-fp8 \
      --decode-stages "${STAGES:-2}" --decode-method split --verify-method split --out "$OUT/e2e_stages.json" ;;
  *)
    echo "unknown PART=$PART" >&2; exit 2 ;;
esac 2>&1 | tee "$OUT/${PART}_log.txt"
