# The eighth run's last device call: Qwen3.5-shaped batch-256 decode steps with the flush-row list built
# per layer (commit 7de382e) against once per step (774de68, SSMOps.forward_scope), in one call, twice each,
# alternating; each variant runs from its own copy of the package and bench/. Writes
# $OUT/e2e_s8_flushlist.json (the four runs' rows) and prints the lines of each run.
set -u
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
# ab_per_layer/: `git archive 7de382e sglang_replayssm bench | tar -x -C ab_per_layer` (made before the call,
# carried as an untracked folder, deleted after)
rm -rf /tmp/ab_per_layer; cp -r ab_per_layer /tmp/ab_per_layer
D=/tmp/ab_once; rm -rf $D; mkdir -p $D; cp -r bench sglang_replayssm $D/
for i in 1 2; do
  for V in per_layer once; do
    (cd /tmp/ab_$V && PYTHONPATH=/tmp/ab_$V timeout 100 python3 bench/e2e.py --models qwen3.5-4b --batches 256 \
      --fused on --verify-tokens --out $OUT/r_${V}_$i.json 2>&1 | grep -E "speedup|floor|ms/step" | sed "s/^/$V $i /")
  done
done
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]; res = {"runs": []}
for f in sorted(glob.glob(f"{out}/r_*.json")):
    d = json.load(open(f)); tag = os.path.basename(f)[2:-5]
    res["runs"].append({"variant": tag, "command": d["command"], "time": d["time"],
                        "batch_256": d["models"]["qwen3.5-4b"]["batches_fused"]["256"]})
res["meta"] = {"variants": "per_layer: commit 7de382e (flush list per SSM layer); once: 774de68 (once per step)",
               "script": "bench/results/e2e_s8_flushlist.sh"}
json.dump(res, open(f"{out}/e2e_s8_flushlist.json", "w"), indent=1)
PY
rm -f $OUT/r_*.json $OUT/*.png
