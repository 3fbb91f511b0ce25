#!/usr/bin/env bash
# 66075d0 (the tail kernel convergent): six more runs of the d256 shape
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
export PYTHONPATH=$PWD
S=$(date +%s)
d=$OUT/r17; mkdir -p $d
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "commit: 66075d0"; } > $d/machine.txt



for i in 1 2 3 4 5 6; do
  timeout 70 python3 bench/peers.py --commit 66075d0 --shapes 4 --out $d/d256_r$i > $d/d256_r$i.log 2>&1; echo "d256 r$i rc=$? t=$(( $(date +%s) - S ))"
  [ $(( $(date +%s) - S )) -gt 200 ] && break
done
cd $OUT && tar czf r17.tgz r17 && rm -rf r17
