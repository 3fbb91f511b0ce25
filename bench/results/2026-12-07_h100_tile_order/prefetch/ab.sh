# Next session: check out wip/bf16-prefetch-tmaps (4cc686a: python differs from main by the
# ZYFA_WHOLE_ROUNDS switch), prebuilt = main's build, .ab/pb_pf = the branch's sm_90a build.
# carry: prebuilt .ab/gpu .whl .ab/pb_pf
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
exec > >(tee $OUT/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
SH=16x32x8x512x128x128,32x32x8x256x128x128,64x32x8x128x128x128,128x32x8x128x128x128
for r in 1 2; do for arm in main pf rounds; do
  case $arm in main) pb=prebuilt; wr=off;; pf) pb=.ab/pb_pf; wr=off;; rounds) pb=.ab/pb_pf; wr=on;; esac
  echo "== $arm round $r"
  ZYFA_WHOLE_ROUNDS=$wr ZYFA_PREBUILT_DIR=$pb timeout 100 python3 bench/short_prompts.py --shapes $SH --impls zyfa_bf16,zyfa_fp8 --rounds 1 --out $OUT/r/${arm}_$r.json 2>&1 | tail -11
  [ $arm = rounds ] || ZYFA_PREBUILT_DIR=$pb timeout 100 python3 bench/features.py --no-cudnn --dtypes fp8 --pages --shapes 1x32768x32x8x128 --window 1024 4096 16384 --rounds 1 --min-s 0.25 --warm-s 0.1 --out $OUT/r/f_${arm}_$r 2>&1 | tail -6
done; done
echo "== sdpa"; timeout 100 python3 bench/short_prompts.py --shapes $SH --impls sdpa_cudnn --rounds 2 --out $OUT/r/sdpa.json 2>&1 | tail -8
for f in $OUT/r/f_*/features.json; do echo "-- $f"; python3 bench/window_fit.py $f 2>&1 | tail -2; done
tar czf $OUT/r.tgz -C $OUT r && rm -rf $OUT/r
