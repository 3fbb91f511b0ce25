# run.sh OUT: checks then an alternating A/B of base v1 v2 v3 (FP8 d256)
set -o pipefail
OUT=$1; mkdir -p $OUT
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps ../../.whl/*.whl 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > $OUT/machine.txt
for n in v1 v2 v3; do (cd $n && PYTHONPATH=$PWD timeout 120 python3 -m zyfa_runtime check --only fp8_e4m3_d256 2>&1 | tail -4 | sed "s/^/$n: /"); done | tee $OUT/checks.txt
bash ab.sh $OUT/ab "4,1x16x16x16384x256x256" ${ROUNDS:-3} zyfa_fp8 base v1 v2 v3
python3 ab_summary.py $OUT/ab zyfa_fp8 base v1 v2 v3 | tee $OUT/summary.txt
