#!/usr/bin/env bash
# Issue 29's serving table on the H200 (device tool, carry [".h200"], the bundle of bench/h200/h200_wheels.sh):
# the full-depth Qwen3-Next-shaped echo checkpoint (48 layers, 16 experts; --echo-cycle 16: greedy outputs
# cycle, so NGRAM drafts are accepted), one phase per call, each going on from the last on the warm machine:
#   PHASE=nodraft  the checkpoint; stock, SGLang --enable-linear-replayssm and ours (defaults) started together;
#                  greedy tokens + top-5 logprobs of each; a profile of each at 128 running (h200_profile.py);
#                  bench_serving random 1024/512 at concurrency 128
#   PHASE=ngram    concurrency 1 of the three; then they stop, and stock + NGRAM, SGLang
#                  --enable-linear-replayssm-spec + NGRAM and ours + NGRAM (4 draft tokens) start; tokens,
#                  logprobs, profiles (ours also with python stacks), bench at 128 and 1
#   PHASE=again    a second round of the NGRAM servers' rows (what the budget allows)
#   PHASE=recheck  CUDA checks of the kernels (pytest, TRITON_INTERPRET=0), the checkpoint, the NGRAM servers alone,
#                  tokens + logprobs, then their rows (FLEET_CONC / FLEET_PROMPTS / FLEET_ROUNDS, default c1 x 24
#                  and c128 x 512 prompts, twice: >= 60 s of traffic a row); PHASE=rows goes on with the rows not
#                  done yet (PROF_CONC=1: first profiles of the NGRAM servers at 1 running,
#                  ours and SGLang's RS-spec also with python stacks)
#   PHASE=overlap  SGLang's own serving defaults (the overlap scheduler on, extra_buffer, radix cache): stock, SGLang
#                  --enable-linear-replayssm and ours without drafts, alone, tokens, rows c1 x 24 and c128 x 512 twice
#   PHASE=m2       the NGRAM servers stop; the full-depth Nemotron-H-shaped echo checkpoint (52 layers, 24 Mamba-2);
#                  stock and ours (defaults) without drafts, tokens + logprobs, rows c128 x 512 and c1 x 24 prompts
set -u
source "$(dirname "$0")/h200_site.sh"
export PYTHONPATH=$H/src:/tmp/site PYTHONUNBUFFERED=1
F="python3 $H/src/bench/h200/h200_fleet.py"
P="python3 $H/src/bench/h200/h200_profile.py"
CKPT=/tmp/echo_full
NODRAFT=gdn_stock,gdn_sglang_replayssm,gdn_ours_fp32
NGRAM=gdn_stock_ngram,gdn_sglang_replayssm_ngram,gdn_ours_fp32_ngram
export FLEET_MAX_RUNNING=128 FLEET_TOTAL_TOKENS=${FLEET_TOTAL_TOKENS:-200000} FLEET_IN=1024 FLEET_OUT=512
export FLEET_EXTRA="--disable-prefill-cuda-graph --enable-metrics" FLEET_STAGGER_S=2
echo_ckpt() {   # FAMILY: the full-depth echo checkpoint of FAMILY under $CKPT, once per machine
  [ -f $CKPT/$1/model.safetensors ] || (cd /tmp && python3 -m sglang_replayssm.gpu_harness.wide_checkpoints \
    "$H/ckpt" $CKPT --depth full --family $1 --echo-cycle 16)
}
profiles() {   # NAME... : a profile of each running server at 128 running requests (STACK=1: with python
  # stacks, named NAME_stack); every summary so far into one file
  for n in "$@"; do
    port=$(python3 -c "import json;print(json.load(open('$STATE/servers.json'))['$n']['port'])")
    $P capture "$port" "$n${STACK:+_stack}${PROF_CONC:+_c$PROF_CONC}" "$STATE/prof" --conc ${PROF_CONC:-128} --steps 6 ${STACK:+--stack}
  done
  python3 - "$STATE/prof" "$OUT/profiles.json" <<'PY'
import glob, json, os, sys
res = {os.path.basename(p)[:-len(".summary.json")]: json.load(open(p)) for p in sorted(glob.glob(sys.argv[1] + "/*.summary.json"))}
json.dump(res, open(sys.argv[2], "w"), indent=1)
PY
}
case ${PHASE:-nodraft} in
nodraft)
  echo_ckpt qwen3_next
  FLEET_ONLY=$NODRAFT $F start $CKPT $STATE
  FLEET_ONLY=$NODRAFT $F tokens $STATE 240
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
  profiles ${NODRAFT//,/ }
  FLEET_ONLY=$NODRAFT FLEET_CONC=128 FLEET_PROMPTS=128:256 $F bench $STATE $(( $(left) - 20 ))
  ;;
ngram)
  FLEET_ONLY=$NODRAFT FLEET_CONC=1 FLEET_PROMPTS=1:4 $F bench $STATE 130
  $F stop $STATE ${NODRAFT//,/ }
  sleep 3
  FLEET_ONLY=$NGRAM $F start $CKPT $STATE
  FLEET_ONLY=$NGRAM $F tokens $STATE 240
  profiles ${NGRAM//,/ }
  STACK=1 profiles gdn_ours_fp32_ngram
  FLEET_ONLY=$NGRAM FLEET_CONC=128,1 FLEET_PROMPTS=128:256,1:4 $F bench $STATE $(( $(left) - 20 ))
  ;;
recheck)
  echo_ckpt qwen3_next &
  (PYTHONPATH= TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_token_rows.py \
    tests/kernels/test_gdn.py tests/kernels/test_mamba2.py tests/kernels/test_kda.py tests/kernels/test_commit_ops.py \
    2>&1 | tee "$OUT/pytest_cuda.txt" | tail -15)
  wait
  FLEET_ONLY=$NGRAM $F start $CKPT $STATE
  FLEET_ONLY=$NGRAM $F tokens $STATE 240
  ;&
rows)
  if [ -n "${PROF_CONC:-}" ]; then profiles ${NGRAM//,/ }; STACK=1 profiles gdn_ours_fp32_ngram gdn_sglang_replayssm_ngram; fi
  FLEET_ONLY=$NGRAM FLEET_ROUNDS=${FLEET_ROUNDS:-2} FLEET_CONC=${FLEET_CONC:-1,128} \
    FLEET_PROMPTS=${FLEET_PROMPTS:-1:24,128:512} $F bench $STATE $(( $(left) - 20 ))
  ;;
overlap)
  OVERLAP=gdn_stock_overlap,gdn_sglang_replayssm_overlap,gdn_ours_fp32_overlap
  echo_ckpt qwen3_next
  FLEET_ONLY=$OVERLAP $F start $CKPT $STATE
  FLEET_ONLY=$OVERLAP $F tokens $STATE 240
  FLEET_ONLY=$OVERLAP FLEET_ROUNDS=2 FLEET_CONC=1,128 FLEET_PROMPTS=1:24,128:512 $F bench $STATE $(( $(left) - 20 ))
  ;;
m2)
  $F stop $STATE ${NGRAM//,/ }
  echo_ckpt nemotron_h
  FLEET_ONLY=m2_stock,m2_ours_fp32 $F start $CKPT $STATE
  FLEET_ONLY=m2_stock,m2_ours_fp32 $F tokens $STATE 200
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
  FLEET_ONLY=m2_stock,m2_ours_fp32 FLEET_CONC=128,1 FLEET_PROMPTS=128:512,1:24 $F bench $STATE $(( $(left) - 20 ))
  ;;
again)
  FLEET_ONLY=$NGRAM FLEET_ROUNDS=2 FLEET_CONC=128,1 FLEET_PROMPTS=128:256,1:4 $F bench $STATE $(( $(left) - 20 ))
  ;;
esac
$F report $STATE "$OUT"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
echo "total $(( $(date +%s) - t0 ))s"
