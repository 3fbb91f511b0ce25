#!/usr/bin/env bash
# On a GPU machine: record the machine, then `info`, `check` (every available variant
# against the fp64 reference), the GPU tests and two benchmark shapes, into $1/.
# Usage: bench/device_check.sh OUTDIR COMMIT
set -uo pipefail
out=${1:?outdir}; commit=${2:-unknown}
mkdir -p "$out"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "commit: $commit"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader \
    | sed 's/^/gpu: /'
  python3 --version
} > "$out/machine.txt"
cat "$out/machine.txt"
python3 -m zyfa_runtime info 2>&1 | tee "$out/info.txt"
python3 -m zyfa_runtime check 2>&1 | tee "$out/check.txt"; check_rc=${PIPESTATUS[0]}
python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py tests/test_driver.py tests/test_api.py 2>&1 \
  | tee "$out/pytest.txt"; test_rc=${PIPESTATUS[0]}
for dt in bf16 fp8_e4m3; do
  for c in "" --causal; do
    python3 -m zyfa_runtime bench --dtype $dt --batch 1 --hq 32 --seqlen 8192 --d-qk 128 $c
  done
done 2>&1 | tee "$out/bench.txt"
echo "check rc=$check_rc pytest rc=$test_rc"
exit $(( check_rc || test_rc ))
