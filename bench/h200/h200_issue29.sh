#!/usr/bin/env bash
# Issue 29 on the H200 (device tool, carry [".h200"], the bundle of bench/h200/h200_wheels.sh): one phase per call,
# every call going on from the last on the warm machine (state in /tmp/fleet):
#   PHASE=check  CUDA checks of the commit's kernels and of the decode / verify kernels reading SGLang's split
#                views by token rows (pytest, TRITON_INTERPRET=0); two plugin servers with
#                SGLANG_REPLAYSSM_SYNC_CHECK=1 (GDN and Mamba-2, 4-layer wide models, NGRAM tree drafts,
#                extra_buffer, radix cache) answer greedy requests solo and batched (their logs must hold no
#                sync error); then the full-depth Qwen3-Next-shaped checkpoint and the NGRAM servers start
#   PHASE=bench  bench_serving rows of the servers up (FLEET_ONLY), FLEET_CONC / FLEET_IN / FLEET_OUT
#   PHASE=swap   stop FLEET_STOP, start FLEET_ONLY on the full-depth checkpoint, then bench
set -u
source "$(dirname "$0")/h200_site.sh"
F="python3 $H/src/bench/h200/h200_fleet.py"
WAVE1=gdn_stock_ngram,gdn_sglang_replayssm_ngram,gdn_ours_fp32_ngram
export FLEET_MAX_RUNNING=${FLEET_MAX_RUNNING:-128} FLEET_TOTAL_TOKENS=${FLEET_TOTAL_TOKENS:-196608}
wide() {   # wide checkpoints (DEPTH FAMILY DIR), once per machine
  [ -f "$3/$2/model.safetensors" ] || (cd /tmp && PYTHONPATH=$H/src:/tmp/site python3 -m \
    sglang_replayssm.gpu_harness.wide_checkpoints "$H/ckpt" "$3" --depth "$1" --family "$2")
}
case ${PHASE:-check} in
check)
  TRITON_INTERPRET=0 timeout 420 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_commit_ops.py \
    tests/kernels/test_commit_graph.py tests/kernels/test_conv_state.py tests/kernels/test_token_rows.py \
    tests/kernels/test_gdn.py tests/kernels/test_mamba2.py tests/kernels/test_kda.py 2>&1 | tee "$OUT/pytest_cuda.txt" | tail -4
  export PYTHONPATH=$H/src:/tmp/site PYTHONUNBUFFERED=1
  wide short all /tmp/wide
  FLEET_ONLY=gdn_ours_synccheck,m2_ours_synccheck FLEET_MAX_RUNNING=64 $F start /tmp/wide $STATE
  wide full qwen3_next /tmp/wide_full &
  FLEET_ONLY=gdn_ours_synccheck,m2_ours_synccheck $F tokens $STATE 200
  for n in gdn_ours_synccheck m2_ours_synccheck; do
    echo "== $n: $(grep -c -i 'synchroniz' $STATE/$n.log) sync lines, $(grep -c Traceback $STATE/$n.log) tracebacks"
    grep -i -m3 -B2 -A8 'synchroniz\|Traceback' $STATE/$n.log | tail -30
    grep -m2 'ReplaySSM mamba pool' $STATE/$n.log
    cp $STATE/$n.log "$OUT/"
  done
  wait
  $F stop $STATE gdn_ours_synccheck m2_ours_synccheck
  FLEET_ONLY=$WAVE1 FLEET_STAGGER_S=2 FLEET_EXTRA=--disable-prefill-cuda-graph $F start /tmp/wide_full $STATE
  ;;
bench)
  export PYTHONPATH=$H/src:/tmp/site PYTHONUNBUFFERED=1
  $F tokens $STATE $(( $(left) - ${BENCH_RESERVE:-420} ))
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
  $F bench $STATE $(( $(left) - 15 ))
  ;;
swap)
  export PYTHONPATH=$H/src:/tmp/site PYTHONUNBUFFERED=1
  $F stop $STATE ${FLEET_STOP//,/ }
  FLEET_EXTRA=--disable-prefill-cuda-graph $F start /tmp/wide_full $STATE
  $F tokens $STATE $(( $(left) - ${BENCH_RESERVE:-240} ))
  $F bench $STATE $(( $(left) - 15 ))
  ;;
esac
$F report $STATE "$OUT"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
echo "total $(( $(date +%s) - t0 ))s"
