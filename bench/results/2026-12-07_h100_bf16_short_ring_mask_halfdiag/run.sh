# The A/B behind log.txt, on one GPU.  Each build is this commit's cubins with one patch applied
# (git apply PATCH && python build.py --arch sm_90a --out DIR), base the tree as it is; the
# selfcheck is every plain sm_90a variant's, then the builds alternate over two rounds with
# SDPA cuDNN in each.
#   bash run.sh BASE_DIR MASK_DIR RING_MASK_DIR RING_MASK_HALFDIAG_DIR
set -e
base=$1 mask=$2 ring=$3 half=$4 out=$(mktemp -d)
for pb in "$mask" "$ring" "$half"; do
  ZYFA_PREBUILT_DIR=$pb python3 - <<'PY'
import os
from zyfa_runtime.driver import get_driver
from zyfa_runtime.selfcheck import check_variant
from zyfa_runtime.catalogue import all_variants
d = get_driver(); bad = n = 0
for v in all_variants():
    if v.arch == "sm_90a" and not v.serving:
        rs = check_variant(d, 0, v); n += 1
        bad += not all(r.ok for r in rs)
print(os.environ["ZYFA_PREBUILT_DIR"], "selfcheck", n, "variants,", bad, "failed")
PY
done
SH="--shapes 16x32x8x512x128x128,32x32x8x256x128x128,64x32x8x128x128x128,2x32x8x4096x128x128 --rounds 1"
run() { echo "== $1"; ZYFA_PREBUILT_DIR=$2 python3 bench/short_prompts.py $SH --impls $3 --out "$out/$1.json" > /dev/null; tail -n +4 "$out/$1.md"; }
run base_r1 "$base" zyfa_bf16,zyfa_fp8
run ring_mask_r1 "$ring" zyfa_bf16,zyfa_fp8
run ring_mask_halfdiag_r1 "$half" zyfa_bf16,zyfa_fp8
run sdpa_r1 "$ring" sdpa_cudnn
run mask_r1 "$mask" zyfa_bf16,zyfa_fp8
run ring_mask_halfdiag_r2 "$half" zyfa_bf16,zyfa_fp8
run ring_mask_r2 "$ring" zyfa_bf16,zyfa_fp8
run base_r2 "$base" zyfa_bf16,zyfa_fp8
run sdpa_r2 "$ring" sdpa_cudnn
