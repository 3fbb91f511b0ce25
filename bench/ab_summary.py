"""Medians of an A/B (bench/ab.sh): bench/ab_summary.py DIR IMPL NAME... -> per point, each
build's median TFLOP/s, % against the first name, the rounds, the error and the SM clock (MHz)."""
import json, sys, statistics, glob
d, impl, names = sys.argv[1], sys.argv[2], sys.argv[3:]
res = {}
for n in names:
    for f in sorted(glob.glob(f"{d}/{n}_r*/results.json")):
        for p in json.load(open(f))["points"]:
            i = p["impls"].get(impl, {})
            if i.get("status") != "ok": continue
            res.setdefault((p["label"], p["causal"]), {}).setdefault(n, []).append((i["tflops"], i["rel_err"], i.get("sm_clock_mhz")))
for k, v in res.items():
    base = statistics.median(t for t, _, _ in v[names[0]])
    row = [f"{k[0]} {'causal' if k[1] else 'full'}"]
    for n in names:
        ts = [t for t, _, _ in v.get(n, [])]
        if not ts: row.append(f"{n}: -"); continue
        m = statistics.median(ts)
        row.append(f"{n}: {m:.1f} ({100*(m/base-1):+.1f}%) [{' '.join(f'{t:.0f}' for t in ts)}] err {statistics.median(e for _, e, _ in v[n]):.2e} clk {statistics.median(c for _, _, c in v[n] if c):.0f}")
    print(" | ".join(row))
