#!/usr/bin/env bash
# V^T by blocks (41b74b5) diagnosed: launch times serialised (pre-pass on 16 / 32 CTAs alone, the kernel with every tag set), A/B at the bar's shape; racecheck of the balanced tail
set -uo pipefail
python3 -m pip install -q --no-index --no-deps .whl/*.whl .whlfe/*.whl 2>/dev/null; python3 -c "import platformdirs, cffi, cudnn" || exit 3
S=$(date +%s)
m="date: $(date -u +%Y-%m-%dT%H:%MZ)
$(nvidia-smi --query-gpu=name,driver_version,serial,uuid,power.limit --format=csv,noheader)"
d=$OUT/blocks; mkdir -p $d; { echo "$m"; echo "trees: base=724c435 (code objects = 5f57136's), blocks=41b74b5 (VT_CTAS 16), blocks32=41b74b5 with the pre-pass grid's 16 -> 32 in its manifest"; } > $d/machine.txt
for t in base blocks blocks32; do
  (cd build/ab/$t && PYTHONPATH=$PWD timeout 60 python3 bench/launch_times.py --reps 30) > $d/launch_$t.txt 2>&1; echo "launch $t rc=$?"
done
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv -lms 200 > $d/smi.csv 2>&1 &
SMI=$!
CAUSAL=noncausal RUN_S=60 bash bench/ab.sh $d/ab "4" 2 zyfa_fp8 build/ab/base build/ab/blocks build/ab/blocks32
kill $SMI
PYTHONPATH=$PWD python3 bench/ab_summary.py $d/ab zyfa_fp8 base blocks blocks32 > $d/ab_summary.txt 2>&1; cat $d/ab_summary.txt
echo "t: $(( $(date +%s) - S )) s"
export PYTHONPATH=$PWD
( ZYFA_SPLIT_TAIL=always timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 python3 bench/sanitize.py fp8_e4m3_d256x256_full ) > $d/racecheck_tail.txt 2>&1; echo "racecheck rc=$? $(tail -2 $d/racecheck_tail.txt)"
echo "total: $(( $(date +%s) - S )) s"
cd $OUT && tar czf r7.tgz blocks && rm -rf blocks
