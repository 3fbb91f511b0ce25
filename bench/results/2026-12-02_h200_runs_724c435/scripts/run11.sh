#!/usr/bin/env bash
# 724c435: eight runs of the d256 shape (bench/peers.py --shapes 4) on one more card
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
export PYTHONPATH=$PWD
S=$(date +%s)
m="date: $(date -u +%Y-%m-%dT%H:%MZ)
$(nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader)"
d=$OUT/runs2; mkdir -p $d; { echo "$m"; echo "commit: 724c435"; } > $d/machine.txt
for i in 1 2 3 4 5 6 7 8; do
  timeout 70 python3 bench/peers.py --commit 724c435 --shapes 4 --out $d/d256_r$i > $d/d256_r$i.log 2>&1; echo "d256 r$i rc=$? t=$(( $(date +%s) - S ))"
  [ $(( $(date +%s) - S )) -gt 300 ] && break
done
cd $OUT && tar czf r11.tgz runs2 && rm -rf runs2
