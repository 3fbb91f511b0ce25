#!/usr/bin/env bash
# On a GPU machine, the serving contract's evidence into $1/: the machine, `check` of every
# variant, the GPU and capture tests, memcheck over adversarial cu_seqlens and the edge-case
# shapes, the host-overhead comparison with SDPA (1,000 calls, one synchronisation) and the
# short-prompt shapes against the same-run peers.
# Usage: [STEPS="check pytest_gpu ..."] bench/serving_check.sh OUTDIR [COMMIT]  (all steps by default)
set -uo pipefail
out=${1:?outdir}; commit=${2:-unknown}
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then   # cffi, platformdirs where the image lacks them
  python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -1
fi
. "$(dirname "$0")/machine.sh"
machine_txt "$out/machine.txt" "$commit"
export PYTHONPATH=$PWD
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  case " ${STEPS:-$name} " in *" $name "*) ;; *) return 0;; esac
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s" | tee -a "$out/steps.txt"; tail -2 "$out/$name.txt"; }
step check 150 python3 -m zyfa_runtime check
step pytest_gpu 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py tests/test_capture.py
step memcheck_adversarial 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
  python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k adversarial
step memcheck_edges 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/sanitize.py
step host_overhead 120 python3 bench/host_overhead.py --serving
step short_prompts 200 python3 bench/peers.py --impls zyfa_bf16,zyfa_fp8,sdpa_cudnn,cudnn_fe_bf16,cudnn_fe_fp8 \
  --shapes 16x32x8x512x128x128,32x32x8x256x128x128,64x32x8x128x128x128 --causal both --commit "$commit" \
  --out "$out/short_prompts"
