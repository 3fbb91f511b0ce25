#!/usr/bin/env bash
# Alternating A/B of code-object builds: bench/ab.sh OUT SHAPES ROUNDS IMPLS NAME...
# Each NAME is a directory (a "tree") holding bench/ and zyfa_runtime/ (of the commit that
# measures) and prebuilt/ (the build under test); each round runs every tree in turn, each a
# bench/peers.py run of its own into OUT/NAME_rR.  CAUSAL (both, yes, no) picks the masks,
# RUN_S bounds each run (300 s).  A tree's ab.env, where it has one, is sourced first (e.g.
# ZYFA_SPLIT_TAIL=off: one build measured with and without its balanced tail).
# Summarise with bench/ab_summary.py OUT IMPL NAME...
set -uo pipefail
OUT=$1; SHAPES=$2; ROUNDS=$3; IMPLS=$4; shift 4
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do for n in "$@"; do
  (cd "$n" && { [ ! -f ab.env ] || { set -a; . ./ab.env; set +a; }; } && PYTHONPATH=$PWD timeout "${RUN_S:-300}" python3 bench/peers.py --impls "$IMPLS" --ref-heads 1 \
     --shapes "$SHAPES" --causal "${CAUSAL:-both}" --commit lab --out "$OUT/$(basename "$n")_r$r" \
     > "$OUT/$(basename "$n")_r$r.log" 2>&1)
done; done
