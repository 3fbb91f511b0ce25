python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
exec > >(tee $OUT/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
ROOT=$PWD; mkdir -p $OUT/r
rm -rf /tmp/m && mkdir /tmp/m && cp -r .ab/main_py/zyfa_runtime .ab/main_py/bench /tmp/m/
echo "== gpu capture tests, pool"
PYTHONPATH=$ROOT:/tmp/site timeout 80 python3 -m pytest -q -p no:cacheprovider -rf tests/test_gpu.py -k "not gfx950 and (captur or graph or first_call or persistent)" 2>&1 | tail -4
SH=64x32x8x128x128x128,32x32x8x256x128x128
for arm in main pool sdpa; do
  echo "== $arm"
  if [ $arm = main ]; then D=/tmp/m; else D=$ROOT; fi
  I=zyfa_bf16,zyfa_fp8; [ $arm = sdpa ] && I=sdpa_cudnn
  (cd $D; PYTHONPATH=$D:/tmp/site ZYFA_PREBUILT_DIR=$ROOT/prebuilt timeout 40 python3 bench/short_prompts.py --shapes $SH --impls $I --rounds 1 --out $OUT/r/${arm}.json 2>&1 | tail -6)
done
tar czf $OUT/r.tgz -C $OUT r; rm -rf $OUT/r
