# Alternating A/B of code-object builds: ab.sh OUT SHAPES ROUNDS IMPLS NAME...
# Each NAME is a directory holding bench/ (this commit's), zyfa_runtime/ and prebuilt/ (the
# build under test); rounds alternate the builds, each a bench/peers.py run of its own.
OUT=$1; SHAPES=$2; ROUNDS=$3; IMPLS=$4; shift 4
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do for n in "$@"; do
  (cd "$n" && PYTHONPATH=$PWD${SITE:+:$SITE} timeout ${RUN_S:-300} python3 bench/peers.py --impls "$IMPLS" --ref-heads 1 \
     --shapes "$SHAPES" --causal "${CAUSAL:-both}" --commit lab --out "$OUT/${n}_r$r" > "$OUT/${n}_r$r.log" 2>&1)
done; done
