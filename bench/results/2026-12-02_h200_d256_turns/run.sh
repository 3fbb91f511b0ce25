# run.sh WORK OUT: WORK holds one tree per build (base one twob twoa: bench/, zyfa_runtime/,
# prebuilt/ each) with ab.sh and ab_summary.py (../2026-12-01_h200_ones_vt_4c76b29); the
# device needs the cffi, pycparser and platformdirs wheels installed first.
set -o pipefail
WORK=$1; OUT=$2
cd "$WORK"
for n in base one twob twoa; do (cd $n && PYTHONPATH=$PWD timeout 120 python3 -m zyfa_runtime check --only fp8_e4m3_d256 2>&1 | tail -4 | sed "s/^/$n: /"); done | tee $OUT/checks.txt
bash ab.sh $PWD/ab_turns "4,1x16x16x16384x256x256" 3 zyfa_fp8 base one twob twoa
python3 ab_summary.py ab_turns zyfa_fp8 base one twob twoa | tee $OUT/summary.txt
