#!/usr/bin/env bash
# the balanced tail's timeline (traced d256 build; build/dev/tail_trace.py), bar shape
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi" || exit 3
m="date: $(date -u +%Y-%m-%dT%H:%MZ)
$(nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader)"
d=$OUT/trace; mkdir -p $d; { echo "$m"; echo "tree: the tail fix (uncommitted), traced d256 cubin"; } > $d/machine.txt
(cd build/ab/trace2 && PYTHONPATH=$PWD timeout 120 python3 ../../dev/tail_trace.py) > $d/tail_trace.txt 2>&1; echo "rc=$?"; cat $d/tail_trace.txt | grep -v Warn | head -80
cd $OUT && tar czf r12b.tgz trace && rm -rf trace
