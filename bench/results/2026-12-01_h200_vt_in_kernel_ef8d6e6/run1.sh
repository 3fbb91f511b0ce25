#!/usr/bin/env bash
# The first device run: `check` of the build under test (the repository's prebuilt/), an
# alternating A/B of the two builds in NAME directories (ab.sh), then the FP8 GPU tests.
# lab/ held ab.sh and ab_summary.py (../2026-12-01_h200_ones_vt_4c76b29/) beside the builds.
# SITE: where the wheels the image lacks (cffi, pycparser, platformdirs) were installed.
set -u
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1
{ date -u; git log -1 --format=%h 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } > $OUT/machine.txt
timeout 150 python3 -m zyfa_runtime check 2>&1 | tee $OUT/check.txt | grep -v " ok" | tail -20
echo "check rc=${PIPESTATUS[0]}"
(cd lab && CAUSAL=both bash ab.sh $OUT/ab "$SHAPES" $ROUNDS zyfa_fp8 base ink && python3 ab_summary.py $OUT/ab zyfa_fp8 base ink | tee $OUT/ab_summary.txt)
timeout ${TEST_S:-120} python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py -k "${TESTS:-vt_made or fp8}" 2>&1 | tail -25 | tee $OUT/pytest.txt
