#!/usr/bin/env bash
# device run: checks of the persistent d256 FP8 build, its GPU tests, then an alternating A/B against the one-tile build
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE_DIR .whl/*.whl || exit 1
export PYTHONPATH=$SITE_DIR:$PWD PYTHONUNBUFFERED=1 SITE=$SITE_DIR
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } > $OUT/machine.txt
if [ "${CHECK:-1}" = 1 ]; then
  timeout 150 python3 -m zyfa_runtime check 2>&1 | tee $OUT/check.txt | grep -v " ok" | tail -20
  echo "check rc=${PIPESTATUS[0]}"
  timeout ${TEST_S:-200} python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py -k "${TESTS:-fp8}" 2>&1 | tail -25 | tee $OUT/pytest.txt
fi
if [ "${ROUNDS:-0}" -gt 0 ]; then
  (cd .lab && RUN_S=${RUN_S:-120} CAUSAL=both bash ab.sh $OUT/ab "$SHAPES" $ROUNDS zyfa_fp8 base pers && python3 ab_summary.py $OUT/ab zyfa_fp8 base pers | tee $OUT/ab_summary.txt)
fi
