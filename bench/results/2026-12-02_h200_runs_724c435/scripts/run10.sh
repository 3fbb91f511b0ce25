#!/usr/bin/env bash
# Does the by-blocks call overlap its pre-pass? The launches queued as planned (dependent) and plain, events around the call
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
m="date: $(date -u +%Y-%m-%dT%H:%MZ)
$(nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader)"
d=$OUT/overlap; mkdir -p $d; { echo "$m"; echo "trees: base=724c435 pdl=5d29ae1 blocks=41b74b5 (build/dev/pdl_overlap.py)"; } > $d/machine.txt
for t in base pdl blocks; do
  (cd build/ab/$t && PYTHONPATH=$PWD timeout 90 python3 ../../dev/pdl_overlap.py) > $d/$t.txt 2>&1; echo "== $t rc=$?"; cat $d/$t.txt | grep -v Warning
done
cd $OUT && tar czf r10.tgz overlap && rm -rf overlap
