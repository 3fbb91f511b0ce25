"""A windowed serving kernel's time split into its key blocks and a cost per tile, from
``bench/features.py``'s rows at several windows of one shape and dtype (``--window W1 W2 ...``):

    time x SMs = blocks x t_block + tiles x F

fitted by least squares over the windowed rows.  ``blocks`` and ``tiles`` are what the kernel
visits: its tiles of ``block_m`` query rows (the catalogue's tile of the sm_90a serving
variant) and, for each, the ``block_n``-key blocks that ``window.key_range`` gives it -- the
blocks its scheduler narrows the tile to.  F is what a tile costs beyond its blocks (its first
products before any PV, its last ones and the epilogue, a CTA's start and end), and anything
that does not grow with the window (a pre-pass, the launch); in block-times it does not depend
on the SM count.  A window tile of b blocks, e of them beyond its in-window pairs, can reach at
most (b - e) / (b + F) of its blocks' rate.

    python bench/window_fit.py bench/results/RUN/window_sweep/features.json [--sms 132]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zyfa_runtime import window as windows  # noqa: E402
from zyfa_runtime.catalogue import Variant  # noqa: E402

DTYPES = {"bf16": "bf16", "fp8": "fp8_e4m3"}


def visits(shape, causal: bool, dtype: str, window_size) -> tuple[int, int]:
    """(key blocks, tiles) the sm_90a serving kernel of ``dtype`` visits for one call of
    ``shape`` (B, S, Hq, Hkv, D; Sq = Sk = S) with ``window_size``."""
    b, s, hq, _hkv, d = shape
    tile = Variant("sm_90a", DTYPES[dtype], d, d, causal, serving=True).tile
    win = windows.normalize(causal, window_size)
    blocks = 0
    for r0 in range(0, s, tile.block_m):
        first, end = windows.key_range(r0, min(r0 + tile.block_m, s), s, s, win)
        if end > first:
            blocks += (end - 1) // tile.block_n - first // tile.block_n + 1
    tiles = -(-s // tile.block_m)
    return b * hq * blocks, b * hq * tiles


def fit(rows: list, sms: int) -> dict:
    """t_block and F (us) by least squares over windowed rows of one shape and dtype (each with
    ``shape``, ``causal``, ``features.window_size``, ``median_ms``), F also in block-times."""
    dtype = rows[0]["impl"].split()[1]
    counts = [visits(r["shape"], r["causal"], dtype, r["features"]["window_size"]) for r in rows]
    a = np.array([[nb / sms, nt / sms] for nb, nt in counts])
    y = np.array([r["median_ms"] * 1e3 for r in rows])
    (t_block, f), *_ = np.linalg.lstsq(a, y, rcond=None)
    worst = float(np.max(np.abs(a @ np.array([t_block, f]) - y) / y))
    return {"shape": rows[0]["shape"], "dtype": dtype, "windows": len(rows), "t_block_us": float(t_block),
            "f_us": float(f), "f_blocks": float(f / t_block), "worst_residual": worst}


def fits(data: dict, sms: int) -> list[dict]:
    """A fit for each (shape, zyfa dtype) with two windowed rows or more (timed, not wrong)."""
    groups: dict = {}
    for r in data["rows"]:
        parts = r["impl"].split()
        if parts[0] != "zyfa" or parts[2] != "window" or "median_ms" not in r or r.get("wrong"):
            continue
        groups.setdefault((tuple(r["shape"]), parts[1]), []).append(r)
    return [fit(rows, sms) for rows in groups.values() if len(rows) >= 2]


def markdown(results: list[dict], sms: int) -> str:
    lines = [f"time x {sms} SMs = blocks x t_block + tiles x F, least squares over the windowed rows", "",
             "| shape (B, S, Hq, Hkv, D) | dtype | windows | t_block (us) | F (us) | F (blocks) | worst residual |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {'x'.join(map(str, r['shape']))} | {r['dtype']} | {r['windows']} | {r['t_block_us']:.3f} | "
                     f"{r['f_us']:.2f} | {r['f_blocks']:.2f} | {100 * r['worst_residual']:.1f} % |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("features", type=Path, help="a features.json of bench/features.py")
    ap.add_argument("--sms", type=int, default=132, help="the card's SMs (F in us; in blocks it does not matter)")
    args = ap.parse_args(argv)
    print(markdown(fits(json.loads(args.features.read_text()), args.sms), args.sms), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
