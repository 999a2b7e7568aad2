#!/usr/bin/env bash
# Issue 21 on the H200 (device tool): install what bench/h200/h200_wheels.sh built, probe SGLang's imports and
# the bridge's ops (bench/h200/h200_probe.py), then start the real server, stock and with our plugin, on the tiny
# Qwen3-Next and Nemotron-H checkpoints and compare greedy tokens (bench/h200/h200_query.py).
#   bash .h200/src/bench/h200/h200_device.sh "RUNS" [EXTRA SGLang FLAGS...]
# RUNS: space-separated NAME:MODE:MODEL[:FLAGSET], MODE stock|plugin, MODEL qwen3_next|nemotron_h,
# FLAGSET (optional) one of the names below. Writes at most 8 files to $OUT (the device tool's limit).
set -u
H=$PWD/.h200
OUT=${OUT:-/tmp/h200_out}; mkdir -p "$OUT"
RUNS=$1; shift
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$H"/whl/*.whl 2>&1 | tail -3
tar xJf "$H/sglang_tree.tar.xz" -C /tmp/site
export PYTHONPATH=$H/src:/tmp/site PYTHONUNBUFFERED=1
echo "installed in $(( $(date +%s) - t0 ))s"
if [ "${PROBE:-1}" = 1 ]; then
  python3 -m pip list 2>/dev/null > "$OUT/pip_list.txt" timeout 240 python3 "$H/src/bench/h200/h200_probe.py" > "$OUT/probe.txt" 2>&1; cat "$OUT/probe.txt"; fi
declare -A FLAGSETS=(
  [nograph]="--disable-cuda-graph"
  [graph]="--cuda-graph-max-bs-decode 16"   # 0.5.23: --cuda-graph-max-bs is ambiguous (-decode, -prefill)
  [w4]="--disable-cuda-graph --replayssm-window 4"
  [fp8]="--disable-cuda-graph --replayssm-read-copy fp8"
)
port=30000
for run in $RUNS; do
  IFS=: read -r name mode model fs <<< "$run"
  flags=${FLAGSETS[${fs:-nograph}]}
  echo "=== $name: $mode $model $flags $*" | tee -a "$OUT/servers.log"
  s=$(date +%s)
  setsid python3 "$H/src/bench/h200/h200_serve.py" "$mode" --model-path "$H/ckpt/$model" --host 127.0.0.1 \
      --port $port --dtype bfloat16 --mem-fraction-static 0.6 --max-running-requests 32 $flags "$@" \
      > "$OUT/server_$name.log" 2>&1 &
  pid=$!
  if timeout "${SERVE_TIMEOUT:-180}" python3 "$H/src/bench/h200/h200_query.py" $port "$OUT/res_$name.json" $pid; then
    echo "RESULT $name ok in $(( $(date +%s) - s ))s" | tee -a "$OUT/servers.log"
  else
    echo "RESULT $name FAILED after $(( $(date +%s) - s ))s" | tee -a "$OUT/servers.log"
  fi
  kill -- -$pid 2>/dev/null; sleep 3; kill -9 -- -$pid 2>/dev/null; wait $pid 2>/dev/null
  grep -E "replayssm gpu-harness|Error|error|Traceback|WARNING.*(fall|missing)" "$OUT/server_$name.log" | sort | uniq -c | sort -rn | head -40 >> "$OUT/servers.log"
  echo "--- tail" >> "$OUT/servers.log"; tail -${LOG_TAIL:-60} "$OUT/server_$name.log" | tee -a "$OUT/servers.log" | tail -${SHOW_TAIL:-0}
  rm -f "$OUT/server_$name.log"
  port=$((port + 1))
done
for m in qwen3_next nemotron_h; do
  for a in "$OUT"/res_stock_$m*.json; do
    [ -f "$a" ] || continue
    for b in "$OUT"/res_plugin_$m*.json; do
      [ -f "$b" ] && { echo "compare $(basename $a) vs $(basename $b)"; python3 "$H/src/bench/h200/h200_query.py" --compare "$a" "$b"; }
    done
  done
done | tee "$OUT/compare.txt"
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]; res = {}
for p in sorted(glob.glob(os.path.join(out, "res_*.json"))):
    res[os.path.basename(p)[4:-5]] = json.load(open(p)); os.remove(p)
json.dump(res, open(os.path.join(out, "results.json"), "w"), indent=1)
PY
echo "total $(( $(date +%s) - t0 ))s"
