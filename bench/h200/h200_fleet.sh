#!/usr/bin/env bash
# Issue 21, steps 2-3 on the H200 (device tool, carry [".h200"]; bench/h200/README.md):
#   BUDGET=560 bash .h200/src/bench/h200/h200_fleet.sh
# installs the wheels (once per machine), writes the wide checkpoints (gpu_harness.wide_checkpoints, once),
# starts every server of bench/h200/h200_fleet.py (left running: a next call on the warm machine goes on),
# takes greedy tokens, runs bench_serving for the rows not yet done, and writes results.json + servers.log to
# $OUT. A second call continues where the first stopped (state in /tmp/fleet).
set -u
source "$(dirname "$0")/h200_site.sh"
export PYTHONPATH=$H/src:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
# FLEET_DEPTH=full: every layer of the real models (gpu_harness.wide_checkpoints --depth full) in /tmp/wide_full;
# FLEET_FAMILY limits the checkpoints written (qwen3_next, nemotron_h or all)
DEPTH=${FLEET_DEPTH:-short}; WIDE=/tmp/wide; [ "$DEPTH" = full ] && WIDE=/tmp/wide_full
FAM=${FLEET_FAMILY:-all}
if [ ! -f "$WIDE/${FAM/all/nemotron_h}/model.safetensors" ]; then
  (cd /tmp && python3 -m sglang_replayssm.gpu_harness.wide_checkpoints "$H/ckpt" "$WIDE" --depth "$DEPTH" --family "$FAM") || exit 1   # cwd off the path: the checkout's own package
fi
echo "ready in $(( $(date +%s) - t0 ))s"
F="python3 $H/src/bench/h200/h200_fleet.py"
[ -n "${FLEET_STOP:-}" ] && $F stop $STATE ${FLEET_STOP//,/ }
$F start "$WIDE" $STATE
$F tokens $STATE $(( $(left) - ${BENCH_RESERVE:-150} ))
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
$F bench $STATE $(( $(left) - 20 ))
$F report $STATE "$OUT"
echo "total $(( $(date +%s) - t0 ))s"
