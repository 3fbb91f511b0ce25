"""zyfa against the bar over several runs of bench/peers.py: for each point and dtype, every
run's ratio (zyfa's TFLOP/s over the bar that run sets, as in its own results.md), and their
minimum and median, so that "at or above the bar" is read over machines and runs rather than
from one.

    python bench/bar_runs.py RUN/results.json [RUN/results.json ...] [--out table.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def ratios(runs: list[dict], peers) -> dict:
    """{(label, causal, dtype): [ratio per run, None where the run lacks zyfa or a bar]}, in the
    order of the first run's points, each run's bar its own (peers.bar)."""
    out: dict = {}
    for i, data in enumerate(runs):
        for p in data["points"]:
            for impl, dtype in (("zyfa_fp8", "fp8"), ("zyfa_bf16", "bf16")):
                key = (p["label"], p["causal"], dtype)
                row = out.setdefault(key, [None] * len(runs))
                b, r = peers.bar(p, dtype), peers._ok(p, impl)
                row[i] = r["tflops"] / b[1] if (b and r) else None
    return out


def table(runs: list[dict], names: list[str], peers) -> str:
    lines = ["| shape | causal | dtype | " + " | ".join(names) + " | min | median |",
             "|---|---|---|" + "---|" * (len(names) + 2)]
    for (label, causal, dtype), row in ratios(runs, peers).items():
        got = [x for x in row if x is not None]
        cells = [f"{x:.3f}" if x is not None else "-" for x in row]
        stats = [f"{min(got):.3f}", f"{statistics.median(got):.3f}"] if got else ["-", "-"]
        lines.append(f"| {label} | {'yes' if causal else 'no'} | {dtype} | " + " | ".join(cells + stats) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="results.json of bench/peers.py runs")
    ap.add_argument("--out", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    runs = [json.loads(f.read_text()) for f in args.results]
    names = [f"run {i + 1}" for i in range(len(runs))]
    sys.path.insert(0, str(Path(__file__).resolve().parent))   # as bench/peers_plot.py does
    import peers  # noqa: E402

    text = "".join(f"- run {i + 1}: {f} (commit {d.get('commit', '?')}, {d.get('date', '?')}, "
                   f"card {peers.card(d)})\n" for i, (f, d) in enumerate(zip(args.results, runs)))

    text += "\n" + table(runs, names, peers)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
