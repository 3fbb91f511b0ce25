#!/usr/bin/env bash
# bar runs of 7286ff7 on this card: one full run, then runs of the d256 shape
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
S=$(date +%s)
C=7286ff7
d=$OUT/r27; mkdir -p $d
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "commit: $C (code objects as 11ecd3f's)"; } > $d/machine.txt
export PYTHONPATH=$PWD
timeout 220 python3 bench/peers.py --commit $C --out $d/full > $d/full.log 2>&1; echo "full rc=$? t=$(( $(date +%s) - S ))"
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
  [ $(( $(date +%s) - S )) -gt 230 ] && break
  timeout 60 python3 bench/peers.py --commit $C --shapes 4 --out $d/d256_r$i > $d/d256_r$i.log 2>&1; echo "d256 r$i rc=$? t=$(( $(date +%s) - S ))"
done
python3 bench/bar_runs.py $d/full/results.json $d/d256_r*/results.json --out $d/bar_runs.md > /dev/null 2>&1; head -60 $d/bar_runs.md
cd $OUT && tar czf r27.tgz r27 && rm -rf r27
