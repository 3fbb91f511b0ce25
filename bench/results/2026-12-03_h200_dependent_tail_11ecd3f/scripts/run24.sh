#!/usr/bin/env bash
# the working tree (11ecd3f) against 66075d0's code objects (build/ab/base) in peers.py, rounds
# alternating; then a full bar run and bar runs of the d256 shape, all on this card
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
S=$(date +%s)
C=11ecd3f
d=$OUT/r24; mkdir -p $d/ab
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "commit: $C; base tree: 66075d0's code objects (= 9988d99's)"; } > $d/machine.txt
for r in 1 2 3 4; do
  PYTHONPATH=$PWD timeout 60 python3 bench/peers.py --impls zyfa_fp8,cudnn_fe_fp8 --causal noncausal --shapes 4 --commit $C --out $d/ab/new_r$r > $d/ab/new_r$r.log 2>&1
  (cd build/ab/base && PYTHONPATH=$PWD timeout 60 python3 bench/peers.py --impls zyfa_fp8,cudnn_fe_fp8 --causal noncausal --shapes 4 --commit 66075d0 --out $d/ab/base_r$r > $d/ab/base_r$r.log 2>&1)
  echo "r$r t=$(( $(date +%s) - S ))"
done
python3 bench/ab_summary.py $d/ab zyfa_fp8 base new 2>&1 | tee $d/ab_summary.txt | tail -3
export PYTHONPATH=$PWD
timeout 200 python3 bench/peers.py --commit $C --out $d/full > $d/full.log 2>&1; echo "full rc=$? t=$(( $(date +%s) - S ))"
for i in 1 2 3 4 5 6 7 8; do
  [ $(( $(date +%s) - S )) -gt 360 ] && break
  timeout 60 python3 bench/peers.py --commit $C --shapes 4 --out $d/d256_r$i > $d/d256_r$i.log 2>&1; echo "d256 r$i rc=$? t=$(( $(date +%s) - S ))"
done
python3 bench/bar_runs.py $d/full/results.json $d/d256_r*/results.json --out $d/bar_runs.md > /dev/null 2>&1; head -40 $d/bar_runs.md
cd $OUT && tar czf r24.tgz r24 && rm -rf r24
