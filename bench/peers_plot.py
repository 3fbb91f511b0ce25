#!/usr/bin/env python3
"""Redraw the plots and the markdown table of a bench/peers.py run from its results.json.

    python bench/peers_plot.py RESULTS_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import markdown, plot  # noqa: E402


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    d = Path(argv[0])
    data = json.loads((d / "results.json").read_text())
    (d / "results.md").write_text(markdown(data))
    print("\n".join(plot(data, d)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
