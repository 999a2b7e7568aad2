# The seventh run's last device call: the library's split-decode defaults against patched copies of the
# package (bench/results/sweep_s7_variants_patch.py): prep kernels in 1 or 2 warps instead of 4, and the
# flush launch capped at 168 or 128 registers (Triton's maxnreg). Run from the repo root, .peer carried.
set -u
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
for V in base prep1 prep2 nreg168 nreg128; do
  D=/tmp/ab_$V; rm -rf $D; mkdir -p $D; cp -r bench sglang_replayssm .peer $D/
  [ $V != base ] && python3 bench/results/sweep_s7_variants_patch.py $D $V
  run() { d=$1; shift; (cd $D && PYTHONPATH=$D:$D/.peer timeout 60 python3 bench/kernels.py --sweep --sweep-verify "" --sweep-decode-methods split "$@" --out $OUT/v_$V/$d 2>&1 | grep -E "sweep_decode" | grep -v "^  " | sed "s/^/$V /"); }
  run g --geos gdn_qwen35_4b,gdn_qwen35_122b --sweep-read-copies fp8 --sweep-decode 32x128x1x0x128x2
  run m32 --geos mamba2_nemotron3_nano4b,mamba2_nemotron3_super --sweep-read-copies none --sweep-decode 16x32x1x0x128x1
  run m8 --geos mamba2_nemotron3_nano4b,mamba2_nemotron3_super --sweep-read-copies fp8 --sweep-decode 32x32x1x0x128x2
  run k --geos kda_32h --sweep-decode 32x64x1x2x128x2
done
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]; res = None
for f in sorted(glob.glob(f"{out}/v_*/*/kernels_sweep.json")):
    d = json.load(open(f)); tag = f.split("/")[-3][2:]
    for r in d["rows"]: r["variant"] = tag
    if res is None: res = d; res["meta"]["parts"] = []
    else: res["rows"] += d["rows"]
    res["meta"]["parts"].append(tag + ": " + d["meta"]["command"])
res["meta"]["variants"] = ("base: the library's split-decode defaults; prepN: the prep kernels in N warps (4 in the "
                           "library); nregN: the flush launch compiled with maxnreg=N")
json.dump(res, open(f"{out}/sweep_s7_variants.json", "w"), indent=1)
PY
rm -rf $OUT/v_*
