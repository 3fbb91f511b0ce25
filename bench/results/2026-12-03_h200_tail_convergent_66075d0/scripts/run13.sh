#!/usr/bin/env bash
# the tail kernel's loop made convergent to ptxas (32-bit tail arithmetic, lane-0 broadcasts):
# checks, then an A/B against 724c435's code objects at the bar's shape (d256 non-causal)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
export PYTHONPATH=$PWD
S=$(date +%s)
d=$OUT/tailfix; mkdir -p $d
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "tree: 724c435 + the tail fix (uncommitted)"; } > $d/machine.txt
ZYFA_SPLIT_TAIL=always timeout 120 python3 -m zyfa_runtime check --only fp8_e4m3_d256x256_full > $d/check_always.txt 2>&1; echo "check rc=$? t=$(( $(date +%s) - S ))"; tail -3 $d/check_always.txt
timeout 200 python3 -m pytest -q tests/test_gpu.py -k "balanced_tail or back_to_back" > $d/pytest_tail.txt 2>&1; echo "pytest rc=$? t=$(( $(date +%s) - S ))"; tail -2 $d/pytest_tail.txt
CAUSAL=noncausal RUN_S=60 bash bench/ab.sh $d/ab "4" 3 zyfa_fp8 build/ab/base build/ab/new; echo "ab t=$(( $(date +%s) - S ))"
python3 bench/ab_summary.py $d/ab zyfa_fp8 base new 2>&1 | tee $d/ab_summary.txt | tail -15
cd $OUT && tar czf r13.tgz tailfix && rm -rf tailfix
