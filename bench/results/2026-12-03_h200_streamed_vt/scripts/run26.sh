#!/usr/bin/env bash
# the streamed V^T pre-pass (experiment) with larger tail ramps: call by call, and traced
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi" || exit 3
S=$(date +%s)
d=$OUT/r26; mkdir -p $d
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "trees: cur = 7286ff7; stream = 7286ff7 + streamed V^T pre-pass (experiment, d256 full only); strace = stream traced"; } > $d/machine.txt
(cd build/ab/strace && GRIDS=528:11,66:11,66:45,50:54,40:54 PYTHONPATH=$PWD timeout 100 python3 ../../dev/vt_trace.py) > $d/vt_trace.txt 2>&1; echo "trace rc=$? t=$(( $(date +%s) - S ))"; grep -v Warn $d/vt_trace.txt | grep -v "heads ready"
for r in 1 2; do
  (cd build/ab/stream && GRIDS=528:11,66:11,66:30,66:45,50:40,50:54,40:54 CYCLES=15 PYTHONPATH=$PWD timeout 150 python3 ../../dev/vt_ab.py) > $d/vt_ab_r$r.txt 2>&1; echo "stream r$r rc=$? t=$(( $(date +%s) - S ))"; grep median $d/vt_ab_r$r.txt
  [ $(( $(date +%s) - S )) -gt 400 ] && break
done
cd $OUT && tar czf r26.tgz r26 && rm -rf r26
