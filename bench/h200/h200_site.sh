# Sourced by the fleet scripts (h200_fleet.sh, h200_issue29.sh) on the H200: the bundle's folders, the run's
# budget clock, and SGLang's wheels installed into /tmp/site once per machine.
H=$PWD/.h200
export OUT=${OUT:-/tmp/h200_out}; mkdir -p "$OUT"
STATE=/tmp/fleet
t0=$(date +%s); BUDGET=${BUDGET:-560}
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
if [ ! -f /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$H"/whl/*.whl 2>&1 | tail -3
  tar xJf "$H/sglang_tree.tar.xz" -C /tmp/site && touch /tmp/site/.installed
fi
# a kernel bench's trimmed FlashInfer (bench/README.md, Peers) on the same machine would make SGLang JIT-build
# FlashInfer ops whose sources it lacks (bench/h200/README.md, blocker 16): SGLang runs here without FlashInfer
rm -rf /tmp/site/flashinfer /tmp/site/flashinfer_python-*.dist-info
