#!/usr/bin/env bash
# the last piece merging from its registers; checks, trace, and the tail's plans call by call
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi" || exit 3
export PYTHONPATH=$PWD
S=$(date +%s)
d=$OUT/r21; mkdir -p $d
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "tree: 9988d99 + dependent tail, shares equal in time, last piece from registers (uncommitted)"; } > $d/machine.txt
ZYFA_SPLIT_TAIL=always timeout 100 python3 -m zyfa_runtime check --only fp8_e4m3_d256x256_full > $d/check_always.txt 2>&1; echo "check rc=$? t=$(( $(date +%s) - S ))"; tail -1 $d/check_always.txt
timeout 150 python3 -m pytest -q tests/test_gpu.py -k "balanced_tail or back_to_back or bit_identical" > $d/pytest_tail.txt 2>&1; echo "pytest rc=$? t=$(( $(date +%s) - S ))"; tail -2 $d/pytest_tail.txt
(cd build/ab/tracefull && PYTHONPATH=$PWD timeout 100 python3 ../../dev/tail_trace2.py) > $d/trace_full.txt 2>&1; echo "trace rc=$?"; grep -v Warn $d/trace_full.txt | head -22; tail -1 $d/trace_full.txt
for s in 2,8192,16,256; do
  (cd build/ab/full && SHAPE=$s CYCLES=60 PYTHONPATH=$PWD timeout 150 python3 ../../dev/tail_ab.py) > $d/tail_ab_$s.txt 2>&1; echo "$s rc=$? t=$(( $(date +%s) - S ))"; grep -v Warn $d/tail_ab_$s.txt
  (cd build/ab/base && SHAPE=$s CYCLES=60 ONLY="plain 0 0" PYTHONPATH=$PWD timeout 100 python3 ../../dev/tail_ab.py) > $d/tail_ab_base_$s.txt 2>&1; echo "base $s rc=$?"; grep -v Warn $d/tail_ab_base_$s.txt | tail -1
done
cd $OUT && tar czf r21.tgz r21 && rm -rf r21
