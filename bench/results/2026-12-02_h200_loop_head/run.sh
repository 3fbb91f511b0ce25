# run.sh OUT: check of the new build, then an alternating A/B of base and new (all FP8 shapes)
set -o pipefail
OUT=$1; mkdir -p $OUT
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps ../../.whl/*.whl 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > $OUT/machine.txt
(cd new && PYTHONPATH=$PWD timeout 200 python3 -m zyfa_runtime check --only fp8 2>&1 | tail -3) | tee $OUT/check_new.txt
CAUSAL=both bash ab.sh $PWD/abx "0,1,2,3,4,5" ${ROUNDS:-3} zyfa_fp8 base new
python3 ab_summary.py abx zyfa_fp8 base new | tee $OUT/summary.txt
