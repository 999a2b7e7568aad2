# The eighth run's A/B of fmin, the least listed flush rows one flush-launch row program folds (common.flush_rows_min,
# here patched to return F for every family and batch; F = 1: every one of the NFP row programs works, the
# seventh run's behaviour), timed in
# one device call on copies of the package, each with its own bench/, with staggered ring cursors (B / L
# rows flush every step) and synchronized ones (all B rows flush in the same step of the window).
# Run from the repo root with .peer carried; writes $OUT/sweep_s8_fmin.json (NAME: another name). BATCH (default
# 256); FS: the variants (default "1 8 16 4"; "lib": the library's common.flush_rows_min, unpatched); CURS: the
# cursor modes (default "staggered synchronized"); RUNS: the geometry groups (default "g m8 m32 k").
set -u
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
B=${BATCH:-256}; T0=$(date +%s); LIMIT=${LIMIT:-500}
for F in ${FS:-1 8 16 4}; do
  D=/tmp/ab_$F; rm -rf $D; mkdir -p $D; cp -r bench sglang_replayssm .peer $D/
  [ $F != lib ] && sed -i "s/^    return 1 if a is None else max(1, triton.cdiv(triton.cdiv(B, window), a))$/    return $F/" \
    $D/sglang_replayssm/kernels/common.py
  [ $F != lib ] && { grep -q "^    return $F$" $D/sglang_replayssm/kernels/common.py || exit 3; }
  for C in ${CURS:-staggered synchronized}; do
    run() { d=$1; shift; [ $(( $(date +%s) - T0 )) -gt $LIMIT ] && { echo "skip F=$F $C $d (time)"; return; }
            (cd $D && PYTHONPATH=$D:$D/.peer timeout 60 python3 bench/kernels.py --sweep --sweep-verify "" --sweep-batch $B \
               --sweep-decode-methods split --cursors $C "$@" --out $OUT/f_${F}_$C/$d 2>&1 | grep -E "sweep_decode" \
               | grep -v "^  " | sed "s/^/F=$F $C /"); }
    want() { case " ${RUNS:-g m8 m32 k} " in *" $1 "*) return 0;; esac; return 1; }
    want g && run g --geos gdn_qwen35_4b,gdn_qwen35_122b --sweep-read-copies fp8 --sweep-decode 32x128x1x0x128x2
    want m8 && run m8 --geos mamba2_nemotron3_nano4b,mamba2_nemotron3_super --sweep-read-copies fp8 --sweep-decode 32x32x1x0x128x2
    want m32 && run m32 --geos mamba2_nemotron3_nano4b,mamba2_nemotron3_super --sweep-read-copies none --sweep-decode 16x32x1x0x128x1
    want k && run k --geos kda_32h --sweep-decode 32x64x1x2x128x2
  done
done
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]; res = None
for f in sorted(glob.glob(f"{out}/f_*/*/kernels_sweep.json")):
    d = json.load(open(f)); _, F, cur = f.split("/")[-3].split("_")
    for r in d["rows"]: r["variant"] = f"FMIN={F} {cur}"
    if res is None: res = d; res["meta"]["parts"] = []
    else: res["rows"] += d["rows"]
    res["meta"]["parts"].append(f"FMIN={F} {cur}: " + d["meta"]["command"])
res["meta"]["variants"] = ("FMIN=F: fmin = F for every family (1: every flush-launch row program works, the seventh "
                           "run's behaviour); staggered / synchronized: bench/kernels.py --cursors")
json.dump(res, open(f"{out}/{os.environ.get('NAME', 'sweep_s8_fmin')}.json", "w"), indent=1)
PY
rm -rf $OUT/f_*
