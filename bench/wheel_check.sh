#!/usr/bin/env bash
# Install a zyfa wheel into a fresh venv and run it with no compiler on PATH: `info`, then
# `check` (every kernel the wheel has against the fp64 reference, on this machine's GPU).
#
# Usage: bench/wheel_check.sh WHEEL [DEPS_DIR] [OUTDIR]
#   WHEEL     e.g. zyfa_cuda13-0.1.0-py3-none-manylinux_2_28_x86_64.whl
#   DEPS_DIR  a directory of dependency wheels (numpy, cffi, pycparser, platformdirs,
#             ml_dtypes) for a machine without a package index: pip then installs with
#             --no-index --find-links DEPS_DIR; without it, from the index.
#   OUTDIR    where info.txt / check.txt go (default: a temporary directory, removed)
# Exit status: 0 when install, info and check all succeed.
set -uo pipefail
wheel=$(realpath "${1:?usage: bench/wheel_check.sh WHEEL [DEPS_DIR] [OUTDIR]}")
deps=${2:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${3:-$work/out}
mkdir -p "$out"
out=$(realpath "$out")

python3 -m venv "$work/venv" || exit 1          # no system site-packages
pip_args=()
[ -n "$deps" ] && pip_args=(--no-index --find-links "$(realpath "$deps")")
env -u PYTHONPATH "$work/venv/bin/python" -m pip install -q --disable-pip-version-check "${pip_args[@]}" "$wheel" \
  || { echo "wheel_check: installing $wheel failed" >&2; exit 1; }

# Only the venv on PATH, an empty working directory, nothing pointing at a source tree.
path="$work/venv/bin"
for c in nvcc clang clang++ hipcc amdclang zig cc gcc; do
  if PATH=$path command -v "$c" >/dev/null; then echo "wheel_check: $c is on PATH" >&2; exit 1; fi
done
mkdir -p "$work/run"
zyfa() {
  (cd "$work/run" && env -u PYTHONPATH -u ZYFA_PREBUILT_DIR -u ZYFA_BACKEND -u ZYFA_SKIP_VERSION_CHECK \
     PATH="$path" ZYFA_CACHE_DIR="$work/cache" "$work/venv/bin/python" "$@")
}

echo "wheel: $(basename "$wheel") ($(sha256sum "$wheel" | cut -c1-16)...), $(python3 --version)"
zyfa -c 'import sys, zyfa_runtime.cache as c; p = c.prebuilt_dir(); assert str(p).startswith(sys.prefix), p; print("prebuilt in the venv:", p)' \
  || exit 1
zyfa -m zyfa_runtime info 2>&1 | tee "$out/info.txt"; info_rc=${PIPESTATUS[0]}
zyfa -m zyfa_runtime check 2>&1 | tee "$out/check.txt"; check_rc=${PIPESTATUS[0]}
echo "wheel_check: info rc=$info_rc check rc=$check_rc"
exit $(( info_rc || check_rc ))
