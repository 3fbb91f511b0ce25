#!/usr/bin/env bash
# the streamed V^T pre-pass (experiment): correctness, then CTA counts call by call, and the current tree's default beside it
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi" || exit 3
S=$(date +%s)
d=$OUT/r25; mkdir -p $d
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "trees: cur = 7286ff7; stream = 7286ff7 + streamed V^T pre-pass (experiment, d256 full only)"; } > $d/machine.txt
(cd build/ab/stream && PYTHONPATH=$PWD timeout 100 python3 -m zyfa_runtime check --only fp8_e4m3_d256x256_full) > $d/check_stream.txt 2>&1; echo "check rc=$? t=$(( $(date +%s) - S ))"; tail -3 $d/check_stream.txt
(cd build/ab/stream && GRIDS=528,132,66,33,16,8,4 CYCLES=2 PYTHONPATH=$PWD timeout 100 python3 ../../dev/vt_ab.py) > $d/vt_ab_probe.txt 2>&1; echo "probe rc=$? t=$(( $(date +%s) - S ))"; grep -v Warn $d/vt_ab_probe.txt
for r in 1 2 3; do
  (cd build/ab/stream && GRIDS=528,132,66,33,16,8 CYCLES=12 PYTHONPATH=$PWD timeout 120 python3 ../../dev/vt_ab.py) > $d/vt_ab_r$r.txt 2>&1; echo "stream r$r rc=$? t=$(( $(date +%s) - S ))"; grep median $d/vt_ab_r$r.txt
  (cd build/ab/cur && SHAPE=2,8192,16,256 CYCLES=12 ONLY="dep 4 11" PYTHONPATH=$PWD timeout 60 python3 ../../dev/tail_ab.py) > $d/cur_r$r.txt 2>&1; grep median $d/cur_r$r.txt | sed 's/^/cur /'
  [ $(( $(date +%s) - S )) -gt 420 ] && break
done
cd $OUT && tar czf r25.tgz r25 && rm -rf r25
