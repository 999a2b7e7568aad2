#!/usr/bin/env bash
# Build what SGLang 0.5.23 needs on the H200 machine (Python 3.12, torch 2.11, no internet), for the GPU
# harness of issue 21 (bench/h200/README.md). Run here, from the repo root of the checkout the device tool
# sends (/work/main): ./bench/h200/h200_wheels.sh [DEST] (default .h200, which must be git-ignored).
#   DEST/whl/*.whl          the wheels of bench/h200/h200_wheels.txt (cp312 manylinux x86_64, or pure Python)
#   DEST/sglang_tree.tar.xz sglang 0.5.23 (its cp312 wheel without the optional Rust extensions *.so and
#                           without sglang/multimodal_gen), sgl_kernel's pure-Python wrappers (no *.so; the
#                           harness stands in for the compiled ops) and an entry-point record for our plugin
#   DEST/src                this checkout's sglang_replayssm/ and bench/h200/
#   DEST/ckpt               the tiny Qwen3-Next and Nemotron-H checkpoints (cpu_harness/tiny_checkpoints.py)
# Nothing here is committed. Needs pip (network) and the project's .venv (sglang-kernel's wrappers).
set -euo pipefail
DEST=${1:-.h200}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-/work/main/.venv/bin/python}
CACHE=${CACHE:-/tmp/h200_download}
mkdir -p "$DEST/whl" "$CACHE"
rm -f "$DEST"/whl/*.whl
PLAT=(--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_26_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux1_x86_64 --platform any)
grep -v '^#' "$SRC/bench/h200/h200_wheels.txt" | grep . | while read -r req; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none "${PLAT[@]}" -d "$CACHE" "$req"
  name=${req%%==*}; ver=${req##*==}
  f=$(ls "$CACHE" | grep -i "^$(echo "$name" | tr '-' '_')-$ver-" | head -1)
  cp "$CACHE/$f" "$DEST/whl/"
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 -d "$CACHE" sglang==0.5.23
"$PY" - "$CACHE" "$DEST" <<'PY'
import glob, io, os, sys, tarfile, zipfile
import importlib.util
cache, dest = sys.argv[1:3]
whl = glob.glob(os.path.join(cache, "sglang-0.5.23-cp312-*.whl"))[0]
tar = tarfile.open(os.path.join(dest, "sglang_tree.tar.xz"), "w:xz")
def add(name, data):
    ti = tarfile.TarInfo(name); ti.size = len(data); ti.mode = 0o644; tar.addfile(ti, io.BytesIO(data))
z = zipfile.ZipFile(whl)
for n in z.namelist():
    if n.endswith(".so") or n.startswith("sglang/multimodal_gen/") or n.endswith("/RECORD"):
        continue
    add(n, z.read(n))
sk = os.path.dirname(importlib.util.find_spec("sgl_kernel").origin)   # sglang-kernel 0.4.10's wrappers
for root, dirs, files in os.walk(sk):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for f in files:
        if f.endswith(".py"):
            p = os.path.join(root, f)
            add("sgl_kernel/" + os.path.relpath(p, sk), open(p, "rb").read())
di = "sglang_replayssm-0.1.0.dist-info/"
add(di + "METADATA", b"Metadata-Version: 2.1\nName: sglang-replayssm\nVersion: 0.1.0\n")
add(di + "entry_points.txt", b"[sglang.srt.plugins]\nreplayssm = sglang_replayssm.sglang_plugin:register\n")
tar.close()
PY
rm -rf "$DEST/src"; mkdir -p "$DEST/src"
(cd "$SRC" && tar cf - --exclude=__pycache__ sglang_replayssm bench/h200) | tar xf - -C "$DEST/src"
rm -rf "$DEST/src/sglang_replayssm/native/assets"
if [ ! -d "$DEST/ckpt/qwen3_next" ]; then
  PYTHONPATH="$SRC" "$PY" -m sglang_replayssm.cpu_harness.tiny_checkpoints "$DEST/ckpt" >/dev/null
fi
# the device's transformers 5.17 rejects Nemotron-H's legacy layer names (mamba / attention) in
# layers_block_type (5.19, which SGLang pins, remaps them): keep only hybrid_override_pattern, which both
# versions (and SGLang) read
"$PY" - "$DEST/ckpt/nemotron_h/config.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
for key in ("layers_block_type", "mtp_layers_block_type"):
    cfg.pop(key, None)
json.dump(cfg, open(sys.argv[1], "w"), indent=1, sort_keys=True)
PY
du -sh "$DEST"/* | sort -h
