#!/usr/bin/env bash
# 724c435 (code objects = 5f57136's): back-to-back GPU test on the final code; bar runs of the d256 shape; one full run
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
export PYTHONPATH=$PWD
S=$(date +%s)
m="date: $(date -u +%Y-%m-%dT%H:%MZ)
$(nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader)"
d=$OUT/runs; mkdir -p $d; { echo "$m"; echo "commit: 724c435"; } > $d/machine.txt
timeout 240 python3 -m pytest -q -x tests/test_gpu.py -k "back_to_back or balanced_tail" > $d/pytest.txt 2>&1; echo "pytest rc=$? $(tail -1 $d/pytest.txt)"
echo "t: $(( $(date +%s) - S )) s"
timeout 200 python3 bench/peers.py --commit 724c435 --out $d/full > $d/full.log 2>&1; echo "full rc=$?"
for i in 1 2 3 4 5 6; do
  timeout 70 python3 bench/peers.py --commit 724c435 --shapes 4 --out $d/d256_r$i > $d/d256_r$i.log 2>&1; echo "d256 r$i rc=$? t=$(( $(date +%s) - S ))"
  [ $(( $(date +%s) - S )) -gt 480 ] && break
done
echo "total: $(( $(date +%s) - S )) s"
cd $OUT && tar czf r6.tgz runs && rm -rf runs
