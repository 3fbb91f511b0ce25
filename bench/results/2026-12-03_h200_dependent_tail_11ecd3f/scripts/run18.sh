#!/usr/bin/env bash
# the tail as the kernel's programmatic dependent, its shares equal in time (gap, ramp):
# checks, then an A/B at the bar's shape: base (66075d0), pdl (0, 0), gap (4, 0), full (4, 11)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi" || exit 3
export PYTHONPATH=$PWD
S=$(date +%s)
d=$OUT/r18; mkdir -p $d
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "tree: 9988d99 + dependent tail with shares equal in time (uncommitted)"; } > $d/machine.txt
ZYFA_SPLIT_TAIL=always timeout 100 python3 -m zyfa_runtime check --only fp8_e4m3_d256x256_full > $d/check_always.txt 2>&1; echo "check rc=$? t=$(( $(date +%s) - S ))"; tail -3 $d/check_always.txt
timeout 150 python3 -m pytest -q tests/test_gpu.py -k "balanced_tail or back_to_back or bit_identical" > $d/pytest_tail.txt 2>&1; echo "pytest rc=$? t=$(( $(date +%s) - S ))"; tail -3 $d/pytest_tail.txt
CAUSAL=noncausal RUN_S=40 bash bench/ab.sh $d/ab "4" 4 zyfa_fp8 build/ab/base build/ab/pdl build/ab/gap build/ab/full; echo "ab t=$(( $(date +%s) - S ))"
python3 bench/ab_summary.py $d/ab zyfa_fp8 base pdl gap full 2>&1 | tee $d/ab_summary.txt | tail -8
cd $OUT && tar czf r18.tgz r18 && rm -rf r18
