#!/usr/bin/env bash
# V^T by blocks with one check of a segment's tags (scan: 41b74b5 + vt_blocks_ready, vt_by_blocks/scan/scan.patch), 16 / 32 pre-pass CTAs, against base
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
S=$(date +%s)
m="date: $(date -u +%Y-%m-%dT%H:%MZ)
$(nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader)"
d=$OUT/scan; mkdir -p $d; { echo "$m"; echo "trees: base=724c435, blocks=41b74b5, scan=41b74b5 + one tag check a segment (16 CTAs), scan32 (32 CTAs)"; } > $d/machine.txt
for t in scan scan32; do
  (cd build/ab/$t && PYTHONPATH=$PWD timeout 100 python3 -m zyfa_runtime check --only fp8_e4m3_d256x256_full && ZYFA_SPLIT_TAIL=always PYTHONPATH=$PWD timeout 100 python3 -m zyfa_runtime check --only fp8_e4m3_d256x256_full) > $d/check_$t.txt 2>&1; echo "check $t rc=$? $(tail -1 $d/check_$t.txt)"
done
for t in base scan scan32; do
  (cd build/ab/$t && PYTHONPATH=$PWD timeout 60 python3 bench/launch_times.py --reps 30) > $d/launch_$t.txt 2>&1; echo "launch $t rc=$?"
done
CAUSAL=noncausal RUN_S=60 bash bench/ab.sh $d/ab "4" 3 zyfa_fp8 build/ab/base build/ab/scan build/ab/scan32
PYTHONPATH=$PWD python3 bench/ab_summary.py $d/ab zyfa_fp8 base scan scan32 > $d/ab_summary.txt 2>&1; cat $d/ab_summary.txt
echo "total: $(( $(date +%s) - S )) s"
cd $OUT && tar czf r8.tgz scan && rm -rf scan
