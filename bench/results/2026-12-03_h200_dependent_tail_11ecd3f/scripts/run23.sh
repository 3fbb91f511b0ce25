#!/usr/bin/env bash
# old (base) against new (full) call by call, processes alternating; then the GPU tests and the
# sanitizers on the new tail
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi" || exit 3
S=$(date +%s)
d=$OUT/r23; mkdir -p $d
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "trees: base = 66075d0's code objects; full = the dependent tail, shares equal in time, last piece from registers (uncommitted; the working tree)"; } > $d/machine.txt
for r in 1 2 3 4; do
  (cd build/ab/base && SHAPE=2,8192,16,256 CYCLES=15 ONLY="plain 0 0" PYTHONPATH=$PWD timeout 60 python3 ../../dev/tail_ab.py) > $d/base_r$r.txt 2>&1
  (cd build/ab/full && SHAPE=2,8192,16,256 CYCLES=15 ONLY="plain 0 0,dep 0 0,dep 4 0,dep 4 11" PYTHONPATH=$PWD timeout 100 python3 ../../dev/tail_ab.py) > $d/full_r$r.txt 2>&1
  echo "r$r t=$(( $(date +%s) - S ))"; grep median $d/base_r$r.txt | sed 's/^/base /'; grep median $d/full_r$r.txt | sed 's/^/full /'
done
export PYTHONPATH=$PWD
timeout 240 python3 -m pytest -q tests/test_gpu.py > $d/pytest_gpu.txt 2>&1; echo "pytest rc=$? t=$(( $(date +%s) - S ))"; tail -2 $d/pytest_gpu.txt
for tool in racecheck memcheck; do
  ZYFA_SPLIT_TAIL=always timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 python3 bench/sanitize.py fp8_e4m3_d256x256_full > $d/sanitize_$tool.txt 2>&1; echo "$tool rc=$? t=$(( $(date +%s) - S ))"; tail -2 $d/sanitize_$tool.txt
done
cd $OUT && tar czf r23.tgz r23 && rm -rf r23
