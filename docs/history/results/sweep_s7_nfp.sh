set -u
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
for F in cur 1 2 8; do
  D=/tmp/ab_$F; rm -rf $D; mkdir -p $D; cp -r bench sglang_replayssm .peer $D/
  if [ $F != cur ]; then sed -i "s/max(1, 2 \* triton.cdiv(B, window))/max(1, triton.cdiv(B, window * $F))/" $D/sglang_replayssm/kernels/common.py; fi
  grep -c "window \* $F" $D/sglang_replayssm/kernels/common.py
  run() { d=$1; shift; (cd $D && PYTHONPATH=$D:$D/.peer timeout 60 python3 bench/kernels.py --sweep --sweep-verify "" --sweep-decode-methods split "$@" --out $OUT/nfp_$F/$d 2>&1 | grep -E "sweep_decode" | grep -v "^  " | sed "s/^/F=$F /"); }
  run g --geos gdn_qwen35_4b,gdn_qwen35_122b --sweep-read-copies fp8 --sweep-decode 32x128x1x0x128x2
  run m32 --geos mamba2_nemotron3_nano4b,mamba2_nemotron3_super --sweep-read-copies none --sweep-decode 16x32x1x0x128x1
  run m8 --geos mamba2_nemotron3_nano4b,mamba2_nemotron3_super --sweep-read-copies fp8 --sweep-decode 32x32x1x0x128x2
  run k --geos kda_32h --sweep-read-copies fp8 --sweep-decode 32x64x1x2x128x2
done
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]; res = None
for f in sorted(glob.glob(f"{out}/nfp_*/*/kernels_sweep.json")):
    d = json.load(open(f)); tag = f.split("/")[-3]
    for r in d["rows"]: r["variant"] = tag
    if res is None: res = d; res["meta"]["parts"] = []
    else: res["rows"] += d["rows"]
    res["meta"]["parts"].append(tag + ": " + d["meta"]["command"])
res["meta"]["variants"] = "nfp_cur: flush launch row programs NFP = 2*ceil(B/L) (the library's); nfp_F: ceil(B/(L*F))"
json.dump(res, open(f"{out}/sweep_s7_nfp.json", "w"), indent=1)
PY
rm -rf $OUT/nfp_*
