"""How long the SMs idle at the end of a causal launch, by the order the CTAs start in.

A list-scheduling model: one CTA per SM at a time (the sm_90a kernels' shared memory and
registers allow one), each SM taking the next CTA in linear-index order when its last one
ends, a CTA lasting `overhead` plus the 128-key blocks its query rows see.  Printed: the
makespan over the ideal (total work / SMs) for the three orders `catalogue.grid_rule` picks
from -- each head in turn (every (sequence, head) after another, its row blocks heaviest
first), heads first (a sequence's heads' heaviest row blocks, then their next, sequence after
sequence) and sequences first (a head's sequences' heaviest row blocks, then their next, head
after head).  No GPU: it models only the order, not the L2 traffic that the last two add.

    python bench/cta_order_model.py
"""
from __future__ import annotations

import heapq

SMS = 132          # H100 / H200 SXM
SHAPES = [         # (label, seqlen, rows a CTA, sequences, heads)
    ("d128 B4 H32 4k", 4096, 128, 4, 32),
    ("d128 B1 H32 16k", 16384, 128, 1, 32),
    ("d128 B1 H32 32k", 32768, 128, 1, 32),
    ("d64 B8 H16 4k (192-row CTAs)", 4096, 192, 8, 16),
    ("d256 B2 H16 8k", 8192, 128, 2, 16),
]


def makespan(order, duration) -> float:
    ends = [0.0] * SMS
    for cta in order:
        heapq.heappush(ends, heapq.heappop(ends) + duration(cta))
    return max(ends)


def model(seqlen: int, rows: int, seqs: int, heads: int, overhead: float) -> dict[str, float]:
    blocks = -(-seqlen // rows)
    def duration(m):   # row block m (0 = the heaviest): the causal keys its rows see, in 128-key blocks
        return overhead + min(seqlen, (blocks - m) * rows) / 128
    orders = {
        "each head in turn": [m for b in range(seqs) for h in range(heads) for m in range(blocks)],
        "heads first": [m for b in range(seqs) for m in range(blocks) for h in range(heads)],
        "sequences first": [m for h in range(heads) for m in range(blocks) for b in range(seqs)],
    }
    ideal = sum(map(duration, orders["each head in turn"])) / SMS
    return {name: makespan(order, duration) / ideal for name, order in orders.items()}


def main() -> None:
    for overhead in (0.5, 2.0):
        print(f"CTA overhead = {overhead} blocks' time; makespan / ideal")
        for label, s, rows, seqs, heads in SHAPES:
            r = model(s, rows, seqs, heads, overhead)
            print(f"  {label:30s}" + "  ".join(f"{k}: {v:.3f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
