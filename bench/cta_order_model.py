"""How long the SMs idle at the end of a causal launch, by the order the CTAs start in.

A list-scheduling model: one CTA per SM at a time (the sm_90a kernels' shared memory and
registers allow one), each SM taking the next CTA in linear-index order when its last one
ends, a CTA lasting `overhead` plus the 128-key blocks its query rows see.  Printed: the
makespan over the ideal (total work / SMs) for each-head-in-turn order (the heads one after
another, each head's row blocks heaviest first) and heads-first order (every head's heaviest
row block, then every head's next; what `catalogue.grid_rule` picks where the keys fit in L2).
No GPU: it models only the order, not the L2 traffic that heads-first order adds.

    python bench/cta_order_model.py
"""
from __future__ import annotations

import heapq

SMS = 132          # H100 / H200 SXM
SHAPES = [         # (label, seqlen, rows a CTA, (sequence, head) pairs)
    ("d128 B4 H32 4k", 4096, 128, 128),
    ("d128 H32 16k", 16384, 128, 32),
    ("d128 H32 32k", 32768, 128, 32),
    ("d64 B8 H16 4k (192-row CTAs)", 4096, 192, 128),
    ("d64 B8 H16 4k (128-row CTAs)", 4096, 128, 128),
    ("d256 B2 H16 8k", 8192, 128, 32),
]


def makespan(order, duration) -> float:
    ends = [0.0] * SMS
    for cta in order:
        heapq.heappush(ends, heapq.heappop(ends) + duration(cta))
    return max(ends)


def model(seqlen: int, rows: int, pairs: int, overhead: float) -> dict[str, float]:
    blocks = -(-seqlen // rows)
    def duration(cta):   # (row block, pair): the causal keys its rows see, in 128-key blocks
        return overhead + min(seqlen, (cta[0] + 1) * rows) / 128
    in_turn = [(blocks - 1 - m, h) for h in range(pairs) for m in range(blocks)]
    heads_first = [(blocks - 1 - m, h) for m in range(blocks) for h in range(pairs)]
    ideal = sum(map(duration, in_turn)) / SMS
    return {"each head in turn": makespan(in_turn, duration) / ideal,
            "heads first": makespan(heads_first, duration) / ideal}


def main() -> None:
    for overhead in (0.5, 2.0):
        print(f"CTA overhead = {overhead} blocks' time; makespan / ideal")
        for label, s, rows, pairs in SHAPES:
            r = model(s, rows, pairs, overhead)
            print(f"  {label:32s}" + "  ".join(f"{k}: {v:.3f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
