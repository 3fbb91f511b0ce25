#!/usr/bin/env bash
# On a GPU machine: record the machine, then `info`, `check` (every available variant
# against the fp64 reference), the GPU tests, the C example, the fresh-venv wheel check (when
# a wheel and its dependency wheels are given) and four benchmark shapes, into $1/.
# Usage: bench/device_check.sh OUTDIR COMMIT [WHEEL DEPS_DIR]
set -uo pipefail
out=${1:?outdir}; commit=${2:-unknown}
mkdir -p "$out"
. "$(dirname "$0")/machine.sh"
machine_txt "$out/machine.txt" "$commit"
cat "$out/machine.txt"
python3 -m zyfa_runtime info 2>&1 | tee "$out/info.txt"
python3 -m zyfa_runtime check 2>&1 | tee "$out/check.txt"; check_rc=${PIPESTATUS[0]}
python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py tests/test_driver.py tests/test_api.py \
  tests/test_versions.py 2>&1 | tee "$out/pytest.txt"; test_rc=${PIPESTATUS[0]}
make -s -C examples/c run-cuda 2>&1 | tee "$out/c_example.txt"; c_rc=${PIPESTATUS[0]}
wheel_rc=0
if [ $# -ge 4 ]; then
  bench/wheel_check.sh "$3" "$4" "$out/wheel" 2>&1 | tee "$out/wheel_check.txt"; wheel_rc=${PIPESTATUS[0]}
fi
for dt in bf16 fp8_e4m3; do
  for c in "" --causal; do
    python3 -m zyfa_runtime bench --dtype $dt --batch 1 --hq 32 --seqlen 8192 --d-qk 128 $c
  done
done 2>&1 | tee "$out/bench.txt"
echo "check rc=$check_rc pytest rc=$test_rc c_example rc=$c_rc wheel rc=$wheel_rc"
exit $(( check_rc || test_rc || c_rc || wheel_rc ))
