#!/usr/bin/env bash
# The FP8 A/B of a kernel change, from the repository root on a GPU machine:
#   ROUNDS=3 bash bench/ab_fp8.sh TREES OUT
# TREES holds two trees, base/ and new/ (bench/ab.sh), each with its FP8 code objects built by
# `python build.py --arch sm_90a --only fp8_e4m3 --out TREES/NAME/prebuilt`.  Writes the
# machine, `check --only fp8` of the new build, and the medians of ROUNDS alternating rounds
# over every FP8 benchmark shape, both masks (OUT/summary.txt); the runs under TREES/runs.
set -uo pipefail
TREES=$(cd "$1" && pwd); OUT=$2; mkdir -p "$OUT"
BENCH=$(cd "$(dirname "$0")" && pwd)
if compgen -G ".whl/*.whl" > /dev/null; then   # cffi, platformdirs where the image lacks them
  python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -1
fi
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$OUT/machine.txt"
(cd "$TREES/new" && PYTHONPATH=$PWD timeout 200 python3 -m zyfa_runtime check --only fp8 2>&1 | tail -3) \
  | tee "$OUT/check_new.txt"
CAUSAL=both bash "$BENCH/ab.sh" "$TREES/runs" "0,1,2,3,4,5" "${ROUNDS:-3}" zyfa_fp8 "$TREES/base" "$TREES/new"
python3 "$BENCH/ab_summary.py" "$TREES/runs" zyfa_fp8 base new | tee "$OUT/summary.txt"
