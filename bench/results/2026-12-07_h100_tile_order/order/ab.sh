# A/B: main; main with captured calls given the stream's counter (no alloc/memset/free nodes);
# static tile order (wip/static-tiles python + .ab/pb_st); the same build with the counter.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
exec > >(tee $OUT/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
ROOT=$PWD; mkdir -p $OUT/r
rm -rf /tmp/st && mkdir /tmp/st && tar cf - --exclude=./prebuilt --exclude=./.ab --exclude=./.git --exclude=./.whl . | tar xf - -C /tmp/st && rm -rf /tmp/st/zyfa_runtime /tmp/st/tests && cp -r .ab/st_py/zyfa_runtime .ab/st_py/tests /tmp/st/
SH=64x32x8x128x128x128,32x32x8x256x128x128,16x32x8x512x128x128
LONG=1x32x8x16384x128x128,4x32x32x4096x128x128,8x16x16x4096x64x64
for r in 1 2; do for arm in main stream static counter; do
  echo "== $arm round $r"
  case $arm in
    main) (cd $ROOT; PYTHONPATH=$ROOT:/tmp/site AB_ARM=graph timeout 120 python3 .ab/gpu/memset_ab.py --shapes $SH --impls zyfa_bf16,zyfa_fp8 --rounds 1 --out $OUT/r/${arm}_$r.json 2>&1 | tail -8) ;;
    stream) (cd $ROOT; PYTHONPATH=$ROOT:/tmp/site AB_ARM=stream timeout 120 python3 .ab/gpu/memset_ab.py --shapes $SH --impls zyfa_bf16,zyfa_fp8 --rounds 1 --out $OUT/r/${arm}_$r.json 2>&1 | tail -8) ;;
    static) (cd /tmp/st; PYTHONPATH=/tmp/st:/tmp/site ZYFA_PREBUILT_DIR=$ROOT/.ab/pb_st timeout 120 python3 bench/short_prompts.py --shapes $SH --impls zyfa_bf16,zyfa_fp8 --rounds 1 --out $OUT/r/${arm}_$r.json 2>&1 | tail -8) ;;
    counter) (cd /tmp/st; PYTHONPATH=/tmp/st:/tmp/site ZYFA_TILE_ORDER=counter ZYFA_PREBUILT_DIR=$ROOT/.ab/pb_st timeout 120 python3 bench/short_prompts.py --shapes $SH --impls zyfa_bf16,zyfa_fp8 --rounds 1 --out $OUT/r/${arm}_$r.json 2>&1 | tail -8) ;;
  esac
done
for arm in main static counter; do
  echo "== long $arm round $r"
  case $arm in
    main) (cd $ROOT; PYTHONPATH=$ROOT:/tmp/site timeout 150 python3 bench/short_prompts.py --shapes $LONG --causal noncausal --impls zyfa_bf16 --rounds 1 --out $OUT/r/long_${arm}_$r.json 2>&1 | tail -4) ;;
    static) (cd /tmp/st; PYTHONPATH=/tmp/st:/tmp/site ZYFA_PREBUILT_DIR=$ROOT/.ab/pb_st timeout 150 python3 bench/short_prompts.py --shapes $LONG --causal noncausal --impls zyfa_bf16 --rounds 1 --out $OUT/r/long_${arm}_$r.json 2>&1 | tail -4) ;;
    counter) (cd /tmp/st; PYTHONPATH=/tmp/st:/tmp/site ZYFA_TILE_ORDER=counter ZYFA_PREBUILT_DIR=$ROOT/.ab/pb_st timeout 150 python3 bench/short_prompts.py --shapes $LONG --causal noncausal --impls zyfa_bf16 --rounds 1 --out $OUT/r/long_${arm}_$r.json 2>&1 | tail -4) ;;
  esac
done; done
echo "== sdpa"; (cd $ROOT; PYTHONPATH=$ROOT:/tmp/site timeout 100 python3 bench/short_prompts.py --shapes $SH --impls sdpa_cudnn,cudnn_fe_fp8 --rounds 2 --out $OUT/r/sdpa.json 2>&1 | tail -8)
tar czf $OUT/r.tgz -C $OUT r
echo "== gpu tests, static build"
(cd /tmp/st; PYTHONPATH=/tmp/st:/tmp/site ZYFA_PREBUILT_DIR=$ROOT/.ab/pb_st timeout 250 python3 -m pytest -q -p no:cacheprovider -rf tests/test_gpu.py tests/test_gpu_serving_features.py -k "not gfx950 and (d128 or captur or persistent or graph or first_call) and not d64 and not d192 and not d256" 2>&1 | tail -6)
(cd /tmp/st; PYTHONPATH=/tmp/st:/tmp/site ZYFA_PREBUILT_DIR=$ROOT/.ab/pb_st timeout 60 python3 -m zyfa_runtime check --only d128x128 2>&1 | tail -3)
rm -rf $OUT/r
