"""The README's performance table from one run of bench/peers.py.

    python bench/readme_table.py bench/results/<run>/full/results.json

Per point and dtype: zyfa's TFLOP/s, the fastest peer of that dtype measured in the same run,
and their ratio. FlashAttention-3's figures come from a separate H200 run (``ANCHORS`` in
bench/peers.py); they stand in their own column, unscaled, and enter no ratio.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SHORT = {"cudnn_fe_fp8": "cuDNN FP8", "triton_fp8": "Triton FP8", "sdpa_cudnn": "SDPA cuDNN",
         "cudnn_fe_bf16": "cuDNN BF16", "sdpa_flash": "SDPA flash"}


def _peers():
    spec = importlib.util.spec_from_file_location("peers", ROOT / "bench" / "peers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod      # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def best_measured(point, impls):
    """(impl, TFLOP/s) of the fastest of ``impls`` that ran in this point, or None."""
    got = [(i, r["tflops"]) for i in impls
           if (r := point["impls"].get(i, {})).get("status") == "ok"]
    return max(got, key=lambda g: g[1]) if got else None


def fa3_figures(peers, point) -> dict:
    """FlashAttention-3's own figures for this point's shape, as its run measured them."""
    shape = tuple(point["shape"][k] for k in ("B", "Hq", "Hkv", "S", "d_qk", "d_v"))
    out = {}
    for a in peers.ANCHORS.get(shape, {}).get(point["causal"], ()):
        if a.peer.startswith("FA3"):
            out[a.dtype] = a.tflops
    return out


def rows(data, peers) -> list[str]:
    head = ("| shape | causal | zyfa FP8 | best FP8 peer | ratio | zyfa BF16 | best BF16 peer | ratio "
            "| FA3 FP8 / BF16 (own run) |")
    lines = [head, "|" + "---|" * 9]
    for p in data["points"]:
        cells = [peers.row_label(p), "yes" if p["causal"] else "no"]
        for zyfa, dtype in (("zyfa_fp8", "fp8"), ("zyfa_bf16", "bf16")):
            z = best_measured(p, (zyfa,))
            b = best_measured(p, peers.PEER_IMPLS[dtype])
            cells.append(f"{z[1]:.0f}" if z else "-")
            cells.append(f"{b[1]:.0f} {SHORT.get(b[0], b[0])}" if b else "-")
            r = z[1] / b[1] if z and b else None   # a win in bold, a loss plain
            cells.append("-" if r is None else f"**{r:.2f}x**" if r >= 1 else f"{r:.2f}x")
        fa3 = fa3_figures(peers, p)
        cells.append(" / ".join(f"{fa3[d]:.0f}" if d in fa3 else "-" for d in ("fp8", "bf16")))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    data = json.loads(Path(args[0]).read_text())
    print("\n".join(rows(data, _peers())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
