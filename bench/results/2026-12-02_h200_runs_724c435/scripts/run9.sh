#!/usr/bin/env bash
# Where the V^T-by-blocks kernel's time goes, launches serialised (bench/launch_times.py), two alternating rounds:
# base 724c435, pdl 5d29ae1, blocks 41b74b5, scan (+ one tag check a segment), notag (scan, no tag read or wait: timing only), noend (notag, no griddepcontrol at all)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
S=$(date +%s)
m="date: $(date -u +%Y-%m-%dT%H:%MZ)
$(nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader)"
d=$OUT/iso; mkdir -p $d; { echo "$m"; echo "trees: base=724c435 pdl=5d29ae1 blocks=41b74b5 scan notag noend (see run script)"; } > $d/machine.txt
for r in 1 2; do for t in base pdl blocks scan notag noend; do
  (cd build/ab/$t && PYTHONPATH=$PWD timeout 60 python3 bench/launch_times.py --reps 30) > $d/launch_${t}_r$r.txt 2>&1; echo "$t r$r: $(grep -E 'launch 1|all' $d/launch_${t}_r$r.txt | awk '{print $NF=="us" ? $(NF-1) : $NF}' | tr '\n' ' ')"
done; done
echo "total: $(( $(date +%s) - S )) s"
cd $OUT && tar czf r9.tgz iso && rm -rf iso
