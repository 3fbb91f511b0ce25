#!/usr/bin/env bash
# 66075d0: the GPU tests (all), then racecheck and memcheck of the balanced tail
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
export PYTHONPATH=$PWD
S=$(date +%s)
d=$OUT/checks; mkdir -p $d
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "commit: 66075d0"; } > $d/machine.txt
timeout 330 python3 -m pytest -q tests/test_gpu.py > $d/pytest_gpu.txt 2>&1; echo "pytest rc=$? t=$(( $(date +%s) - S )) $(tail -1 $d/pytest_gpu.txt)"
( ZYFA_SPLIT_TAIL=always timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 python3 bench/sanitize.py fp8_e4m3_d256x256_full ) > $d/racecheck_tail.txt 2>&1; echo "racecheck rc=$? t=$(( $(date +%s) - S )) $(tail -2 $d/racecheck_tail.txt)"
( ZYFA_SPLIT_TAIL=always timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/sanitize.py fp8_e4m3_d256x256_full ) > $d/memcheck_tail.txt 2>&1; echo "memcheck rc=$? t=$(( $(date +%s) - S )) $(tail -2 $d/memcheck_tail.txt)"
cd $OUT && tar czf r16.tgz checks && rm -rf checks
