#!/usr/bin/env bash
# the balanced tail's timeline as the kernel's dependent: (gap, ramp) = (4, 11) and (0, 0)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi" || exit 3
d=$OUT/trace19; mkdir -p $d
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader; echo "tree: dependent tail (uncommitted), traced d256 cubin"; } > $d/machine.txt
for t in tracefull tracepdl; do
  (cd build/ab/$t && PYTHONPATH=$PWD timeout 120 python3 ../../dev/tail_trace2.py) > $d/$t.txt 2>&1; echo "$t rc=$?"; grep -v Warn $d/$t.txt | head -60
done
cd $OUT && tar czf r19.tgz trace19 && rm -rf trace19
