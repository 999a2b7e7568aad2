#!/usr/bin/env bash
# Issue 29's serving table on the H200 (device tool, carry [".h200"], the bundle of bench/h200/h200_wheels.sh):
# the full-depth Qwen3-Next-shaped echo checkpoint (48 layers, 16 experts; --echo-cycle 16: greedy outputs
# cycle, so NGRAM drafts are accepted), one phase per call on a warm machine (a phase first stops the servers other
# phases left running, stop_others; the checkpoints and SGLang's install stay). Every
# server runs SGLang's scheduler as SGLang picks it for its flags (gpu_server_args): the overlap scheduler on, NGRAM
# included, except where a server asks for it off (the sync checks) or SGLang needs it off (no_buffer with the
# radix cache); the results before 2026-12-05 (sglang_h200_full_depth_echo, sglang_h200_echo_ngram_c1) ran every
# server with it off:
#   PHASE=nodraft  the checkpoint; stock, SGLang --enable-linear-replayssm and ours (defaults) started together;
#                  greedy tokens + top-5 logprobs of each; (PROF=1: a profile of each at 128 running,
#                  h200_profile.py); bench_serving random 1024/512, rows c1 x 24 and c128 x 512 prompts, twice
#   PHASE=ngram    concurrency 1 of the three; then they stop, and stock + NGRAM, SGLang
#                  --enable-linear-replayssm-spec + NGRAM and ours + NGRAM (4 draft tokens) start; tokens,
#                  logprobs, profiles (ours also with python stacks), bench at 128 and 1
#   PHASE=again    a second round of the NGRAM servers' rows (what the budget allows)
#   (NODRAFT_SET / NGRAM_SET: other servers for those phases, e.g. two on an 80 GB card)
#   PHASE=recheck  CUDA checks of the kernels (pytest, TRITON_INTERPRET=0), the checkpoint, the NGRAM servers alone,
#                  tokens + logprobs, then their rows (FLEET_CONC / FLEET_PROMPTS / FLEET_ROUNDS, default c1 x 24
#                  and c128 x 512 prompts, twice: >= 60 s of traffic a row); PHASE=rows goes on with the rows not
#                  done yet (PROF_CONC=1: first profiles of the NGRAM servers at 1 running,
#                  ours and SGLang's RS-spec also with python stacks)
#   PHASE=chain    the three NGRAM servers with NGRAM drafts as chains (BFS breadth 1), the only
#                  drafts SGLang's RS-spec verify is exact for; tokens, rows as recheck
#   PHASE=radix    the radix cache on (a user's default): stock and ours with extra_buffer and the overlap scheduler,
#                  SGLang --enable-linear-replayssm with no_buffer (it refuses extra_buffer; no_buffer needs the
#                  overlap scheduler off), without drafts, alone, tokens, rows c1 x 24 and c128 x 512 twice
#   PHASE=default  the plugin's defaults (gdn_ours: the read copy auto) and SGLang --enable-linear-replayssm on the
#                  full-depth Qwen3-Next-shaped checkpoint without echo (random weights: a non-echo text); greedy tokens
#                  and top-5 logprobs of ours against SGLang's ReplaySSM (stock does not fit beside them on an 80 GB
#                  card); then c128 x 448 prompts (1024 / 512, DEFAULT_PROMPTS), the servers interleaved, twice
#                  (DEFAULT_SET: other servers)
#   PHASE=shared   issue 46's row sets 1-2: the radix cache on, stock, SGLang --enable-linear-replayssm and ours, each
#                  with SGLang's default strategy (extra_buffer / no_buffer / with the plugin extra_buffer_lazy) and
#                  its pools sized from the same FLEET_MEM_FRACTION (default 0.28: three servers on one card; no fixed
#                  pool sizes, SHARED_SET: other servers, e.g. gdn_ours_sr_eq); tokens; bench_serving's
#                  generated-shared-prefix (FLEET_GSP, default 32 groups x 16 questions, a 2048-token prefix, 128-token
#                  questions, 256 out) at c64 and c128, twice, interleaved; then multi-turn chat (bench/multi_turn.py,
#                  64 conversations x 8 turns, c64) on each; results.json keeps each server's /get_server_info
#   PHASE=m2       the full-depth Nemotron-H-shaped echo checkpoint (52 layers, 24 Mamba-2);
#                  stock, ours (defaults) and ours with the fp8 read copy without drafts, tokens + logprobs,
#                  (PROF=1: a profile of each at 128 running), rows c128 x 512 and c1 x 24 prompts
#                  (M2_SET=m2_stock,m2_ours_fp32 on a card that holds two of them: an H100; m2_ours: the
#                  plugin's defaults, the fp8 read copy for Mamba-2 on such a GPU)
#   PHASE=m2b      after that: ours with the fp8 read copy in ours' place, tokens, rows c128 (stock's a third time
#                  between them) and c1
set -u
source "$(dirname "$0")/h200_site.sh"
export PYTHONPATH=$H/src:/tmp/site PYTHONUNBUFFERED=1
F="python3 $H/src/bench/h200/h200_fleet.py"
P="python3 $H/src/bench/h200/h200_profile.py"
CKPT=/tmp/echo_full
NODRAFT=${NODRAFT_SET:-gdn_stock,gdn_sglang_replayssm,gdn_ours_fp32}   # NODRAFT_SET: others (gdn_ours_fp8)
NGRAM=${NGRAM_SET:-gdn_stock_ngram,gdn_sglang_replayssm_ngram,gdn_ours_fp32_ngram}   # NGRAM_SET: fewer (an H100)
export FLEET_MAX_RUNNING=128 FLEET_TOTAL_TOKENS=${FLEET_TOTAL_TOKENS:-200000} FLEET_IN=1024 FLEET_OUT=512
export FLEET_EXTRA="--disable-prefill-cuda-graph --enable-metrics" FLEET_STAGGER_S=2
CHAIN=gdn_stock_ngram_chain,gdn_sglang_replayssm_ngram_chain,gdn_ours_fp32_ngram_chain
M2=${M2_SET:-m2_stock,m2_ours_fp32,m2_ours_fp8}   # M2_SET: fewer, for a card that holds two (an H100)
RADIX=gdn_stock_radix,gdn_sglang_replayssm_radix,gdn_ours_fp32_radix
DEFAULT=${DEFAULT_SET:-gdn_sglang_replayssm,gdn_ours}
SHARED=${SHARED_SET:-gdn_stock_eq,gdn_sglang_replayssm_eq,gdn_ours_eq}
stop_others() {   # NAMES (comma-separated): stop every server this machine's fleet started but those, to free the card
  [ -f $STATE/servers.json ] || return 0
  $F stop $STATE $(python3 -c "import json,sys;print(' '.join(n for n in json.load(open('$STATE/servers.json')) if n not in sys.argv[1].split(',')))" "$1")
}
serve() {   # SET FAMILY TOKENS_S: the other servers stop, FAMILY's checkpoint, SET starts, greedy tokens + logprobs
  stop_others $1
  echo_ckpt $2
  FLEET_ONLY=$1 $F start $CKPT $STATE
  FLEET_ONLY=$1 $F tokens $STATE $3
  $F report $STATE "$OUT"   # so far (the bench rows report after each row): a call cut by its limit keeps it
}
bench_rows() {   # SET [CONC PROMPTS ROUNDS]: SET's bench_serving rows until the budget (default c1 x 24 and
  # c128 x 512 prompts, twice; FLEET_CONC / FLEET_PROMPTS / FLEET_ROUNDS override)
  FLEET_ONLY=$1 FLEET_ROUNDS=${FLEET_ROUNDS:-${4:-2}} FLEET_CONC=${FLEET_CONC:-${2:-1,128}} \
    FLEET_PROMPTS=${FLEET_PROMPTS:-${3:-1:24,128:512}} $F bench $STATE $(( $(left) - 20 ))
}
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
  serve $NODRAFT qwen3_next 240
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
  if [ -n "${PROF:-}" ]; then profiles ${NODRAFT//,/ }; fi
  bench_rows $NODRAFT
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
  stop_others $NGRAM
  # the CUDA kernel tests run beside the checkpoint's writing and the servers' start (both mostly host work)
  (PYTHONPATH= TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_token_rows.py \
    tests/kernels/test_gdn.py tests/kernels/test_mamba2.py tests/kernels/test_kda.py tests/kernels/test_commit_ops.py \
    > "$OUT/pytest_cuda.txt" 2>&1) &
  echo_ckpt qwen3_next
  FLEET_ONLY=$NGRAM $F start $CKPT $STATE
  wait
  tail -15 "$OUT/pytest_cuda.txt"
  FLEET_ONLY=$NGRAM $F tokens $STATE 240
  ;&
rows)
  if [ -n "${PROF_CONC:-}" ]; then profiles ${NGRAM//,/ }; STACK=1 profiles gdn_ours_fp32_ngram gdn_sglang_replayssm_ngram; fi
  bench_rows $NGRAM
  ;;
chain)
  # NGRAM drafts as chains (BFS breadth 1): the drafts SGLang's RS-spec verify is exact for (h200_fleet.py)
  serve $CHAIN qwen3_next 240
  bench_rows $CHAIN
  ;;
radix)
  serve $RADIX qwen3_next 240
  bench_rows $RADIX
  ;;
default)
  stop_others $DEFAULT
  [ -f /tmp/plain_full/qwen3_next/model.safetensors ] || (cd /tmp && python3 -m sglang_replayssm.gpu_harness.wide_checkpoints \
    "$H/ckpt" /tmp/plain_full --depth full --family qwen3_next)
  FLEET_ONLY=$DEFAULT $F start /tmp/plain_full $STATE
  FLEET_ONLY=$DEFAULT $F tokens $STATE 240
  $F report $STATE "$OUT"
  bench_rows $DEFAULT 128 128:${DEFAULT_PROMPTS:-448} 2
  ;;
shared)
  export FLEET_MEM_FRACTION=${FLEET_MEM_FRACTION:-0.28}
  serve $SHARED qwen3_next 240
  FLEET_DATASET=shared-prefix bench_rows $SHARED 64,128 64:512,128:512 2
  for n in ${SHARED//,/ }; do
    port=$(python3 -c "import json;print(json.load(open('$STATE/servers.json'))['$n']['port'])")
    timeout $(( $(left) / 3 )) python3 $H/src/bench/multi_turn.py --url http://127.0.0.1:$port --conversations 64 \
      --turns 8 --concurrency 64 --max-tokens 128 --out "$OUT/multi_turn_$n.json" | tail -12
  done
  ;;
m2)
  serve $M2 nemotron_h 200
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
  if [ -n "${PROF:-}" ]; then profiles ${M2//,/ }; fi
  bench_rows $M2 128,1 128:512,1:24 1
  ;;
m2b)
  # after PHASE=m2 with M2_SET=m2_stock,m2_ours_fp32 on a card that holds two of these servers (an H100: three OOM):
  # ours with the fp8 read copy in ours' place; its rows, and stock's c128 a third time between them
  $F stop $STATE m2_ours_fp32
  FLEET_ONLY=m2_ours_fp8 $F start $CKPT $STATE
  FLEET_ONLY=m2_stock,m2_ours_fp8 $F tokens $STATE 200
  bench_rows m2_ours_fp8 128 128:640 1
  bench_rows m2_stock 128 128:640 3
  bench_rows m2_ours_fp8 1 1:16 1
  ;;
again)
  FLEET_ONLY=$NGRAM FLEET_ROUNDS=2 FLEET_CONC=128,1 FLEET_PROMPTS=128:256,1:4 $F bench $STATE $(( $(left) - 20 ))
  ;;
esac
$F report $STATE "$OUT"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
echo "total $(( $(date +%s) - t0 ))s"
