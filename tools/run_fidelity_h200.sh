#!/usr/bin/env bash
# The one H200 run behind sglang_replayssm/native/assets/tiny-*-hybrid and bench/results/fidelity.*:
# trains both tiny models at once (one GPU, two processes), then runs the fidelity bench on each.
#   OUT=/some/dir tools/run_fidelity_h200.sh
# Env: PY (python with torch), TRAIN_ARGS (extra train_tiny.py flags), CORPUS (packed corpus, tools/corpus.py; default: this Python's stdlib), BUDGET (training
# seconds per model), TOKENS / STREAMS / SHORT (bench: long and short run), DEVICE, SIZE (tiny | micro), BENCH_TIMEOUT.
set -uo pipefail
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
OUT=${OUT:?set OUT}; BUDGET=${BUDGET:-90}; TOKENS=${TOKENS:-65536}; STREAMS=${STREAMS:-8}
DEVICE=${DEVICE:-cuda}; SIZE=${SIZE:-tiny}; BENCH_TIMEOUT=${BENCH_TIMEOUT:-150}; SHORT=${SHORT:-8192}
CK=${CK:-/tmp/fidelity_ckpt}; LOGS=/tmp/fidelity_logs
CORPUS_ARG=(); [ -n "${CORPUS:-}" ] && CORPUS_ARG=(--corpus "$CORPUS")
mkdir -p "$CK" "$LOGS" "$OUT"
(nvidia-smi --query-gpu=name,memory.total --format=csv; $PY -c "import torch; print(torch.__version__)") > "$LOGS/env.txt" 2>&1
for f in mamba2 gdn; do
  $PY tools/train_tiny.py --family $f --size "$SIZE" --device "$DEVICE" "${CORPUS_ARG[@]}" --time-budget "$BUDGET" \
    --out "$CK/$f" --log "$LOGS/train_$f.json" ${TRAIN_ARGS:-} > "$LOGS/train_$f.log" 2>&1 &
done
wait
tail -n 3 "$LOGS"/train_*.log
for f in mamba2 gdn; do
  tar cf "$OUT/ckpt_$f.tar" -C "$CK" "$f"
done
# a short run first (kept if the long one does not finish), then the long one
for f in mamba2 gdn; do
  $PY bench/fidelity.py --families $f --model $f="$CK/$f" "${CORPUS_ARG[@]}" --device "$DEVICE" \
    --tokens "$SHORT" --streams "$STREAMS" --no-isolated --out "$LOGS/fid8k_$f" > "$LOGS/fid8k_$f.log" 2>&1 &
done
wait
$PY bench/fidelity.py --merge "$LOGS"/fid8k_mamba2.json "$LOGS"/fid8k_gdn.json --out "$OUT/fidelity_8k"
for f in mamba2 gdn; do
  timeout "$BENCH_TIMEOUT" $PY bench/fidelity.py --families $f --model $f="$CK/$f" "${CORPUS_ARG[@]}" --device "$DEVICE" \
    --tokens "$TOKENS" --streams "$STREAMS" --out "$LOGS/fid_$f" > "$LOGS/fid_$f.log" 2>&1 &
done
wait
$PY bench/fidelity.py --merge "$LOGS"/fid_mamba2.json "$LOGS"/fid_gdn.json --out "$OUT/fidelity"
tail -n 12 "$LOGS"/fid*.log
tar czf "$OUT/logs.tgz" -C "$LOGS" .
