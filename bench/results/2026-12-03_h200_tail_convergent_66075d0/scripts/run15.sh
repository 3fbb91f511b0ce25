#!/usr/bin/env bash
# 66075d0 (the tail kernel convergent): more A/B rounds at the bar's shape, then bar runs
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
export PYTHONPATH=$PWD
S=$(date +%s)
d=$OUT/r15; mkdir -p $d
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "commit: 66075d0"; } > $d/machine.txt
CAUSAL=noncausal RUN_S=60 bash bench/ab.sh $d/ab2 "4" 6 zyfa_fp8 build/ab/base build/ab/new; echo "ab t=$(( $(date +%s) - S ))"
python3 bench/ab_summary.py $d/ab2 zyfa_fp8 base new 2>&1 | tee $d/ab2_summary.txt | tail -3
timeout 200 python3 bench/peers.py --commit 66075d0 --out $d/full > $d/full.log 2>&1; echo "full rc=$? t=$(( $(date +%s) - S ))"
for i in 1 2 3 4; do
  timeout 70 python3 bench/peers.py --commit 66075d0 --shapes 4 --out $d/d256_r$i > $d/d256_r$i.log 2>&1; echo "d256 r$i rc=$? t=$(( $(date +%s) - S ))"
  [ $(( $(date +%s) - S )) -gt 420 ] && break
done
cd $OUT && tar czf r15.tgz r15 && rm -rf r15
