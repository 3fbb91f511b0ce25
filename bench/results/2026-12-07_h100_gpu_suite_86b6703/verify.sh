# From the repository root, with the package and its test extra installed
# (python -m pip install -e ".[test]") and torch for the capture tests.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 - <<'PY'
from zyfa_runtime.driver import get_driver
from zyfa_runtime.selfcheck import check_variant
from zyfa_runtime.catalogue import all_variants
d = get_driver()
for v in all_variants():
    if v.f16:
        for r in check_variant(d, 0, v):
            print(v.name, r.case, f"{r.o_error:.3e} {r.lse_error:.3e}", r.ok, r.note, flush=True)
PY
timeout 420 python3 -m pytest -q -rs -p no:cacheprovider --durations=15 tests/test_gpu.py tests/test_capture.py tests/test_gpu_kvcache.py tests/test_gpu_merge.py tests/test_gpu_quantize.py tests/test_gpu_serving_features.py 2>&1 | tail -40
