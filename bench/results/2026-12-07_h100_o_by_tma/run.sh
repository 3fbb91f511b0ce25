# From the repository root on a machine with one H100 (or H200), the package installed with its
# test extra, torch, and for the cuDNN FP8 peer `pip install --no-deps nvidia-cudnn-frontend
# apache-tvm-ffi`.  BUILD_BASE, BUILD_TMA, ...: prebuilt directories of the commits named in
# README.md (python build.py --arch sm_90a --out DIR at each commit).
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
# the table (short_prompts.md): the code objects of 04cb438
python3 -m zyfa_runtime check --only d128x128
python3 bench/short_prompts.py --shapes 16x32x8x512x128x128,32x32x8x256x128x128,64x32x8x128x128x128 \
    --rounds 5 --out short_prompts.json
# the A/Bs (log.txt): builds in turn, each a round
SH="--shapes 16x32x8x512x128x128,32x32x8x256x128x128,64x32x8x128x128x128,2x32x8x4096x128x128 --rounds 1"
for b in "$BUILD_BASE" "$BUILD_TMA" "$BUILD_CANDIDATE"; do
  ZYFA_PREBUILT_DIR=$b python3 bench/short_prompts.py $SH --impls zyfa_bf16,zyfa_fp8 --out ab.json; tail -n +4 ab.md
done
python3 bench/short_prompts.py $SH --impls sdpa_cudnn --out sdpa.json; tail -n +4 sdpa.md
# every GPU test file
python3 -m pytest -q -rs tests/test_gpu.py tests/test_capture.py tests/test_gpu_kvcache.py tests/test_gpu_merge.py \
    tests/test_gpu_quantize.py tests/test_gpu_serving_features.py
# Nsight Compute of the BF16 kernel
ncu --clock-control none --set full --import-source no --launch-skip 1 --launch-count 1 -k regex:zyfa_fwd \
    python3 bench/profile_target.py --dtype bf16 --seqlen 128 --batch 64 --heads 32 --kv-heads 8
