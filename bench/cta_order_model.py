"""How long the SMs idle at the end of a causal launch, by the order the CTAs start in.

A list-scheduling model: one CTA per SM at a time (the sm_90a kernels' shared memory and
registers allow one), each SM taking the next CTA in linear-index order when its last one
ends, a CTA lasting `overhead` plus the 128-key blocks its query rows see.  Printed: the
makespan over the ideal (total work / SMs) for the three orders `catalogue.grid_rule` picks
from -- each head in turn (every (sequence, head) after another, its row blocks heaviest
first), heads first (a sequence's heads' heaviest row blocks, then their next, sequence after
sequence) and sequences first (a head's sequences' heaviest row blocks, then their next, head
after head).  No GPU: it models only the order, not the L2 traffic that the last two add.

Then persistent CTAs (one an SM, each taking tile after tile), against the launch as it is,
both over the sequences-first order: tiles taken from a counter as CTAs come free (dynamic),
or dealt in the order's rounds of SMS tiles, every other round in reverse (snake: no counter
to reset between launches).  A tile costs `overhead` blocks' time beside its own: the launch
as it is, 3.6 (traced on the H200 at 4k tokens, bench/results/2026-12-01_h200_q_tma_ab093e0/
cta_trace); persistent, an assumed 1.5 (its next tile's copies and S(0) overlapping this
tile's end; FlashAttention-3's causal 4k rate implies about 1.9).  Non-causal shapes are
balanced either way (equal tiles); what a persistent kernel would gain there is the overhead.
Last, CTAs of two row blocks each (m and M - 1 - m of one sequence and head), the cheaper
variant: no counter, but CTAs of equal weight quantise into waves.

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


def persistent(seqlen: int, rows: int, seqs: int, heads: int, now: float, overlapped: float
               ) -> dict[str, float]:
    """Time of the causal launch as it is (`now` blocks a tile beside its own) over that of
    persistent CTAs (`overlapped`), dynamic and snake, the sequences-first order."""
    blocks = -(-seqlen // rows)
    def duration(m):
        return min(seqlen, (blocks - m) * rows) / 128
    order = [m for h in range(heads) for m in range(blocks) for b in range(seqs)]
    def static_snake(c):
        load = [0.0] * SMS
        for i, m in enumerate(order):
            r, k = divmod(i, SMS)
            load[SMS - 1 - k if r % 2 else k] += duration(m) + c
        return max(load)
    base = makespan(order, lambda m: duration(m) + now)
    return {"dynamic": base / makespan(order, lambda m: duration(m) + overlapped),
            "snake": base / static_snake(overlapped)}


def paired(seqlen: int, rows: int, seqs: int, heads: int, now: float, inner: float) -> dict[str, float]:
    """Time of the launch as it is over that of CTAs that each take two row blocks of one
    (sequence, head), m and M - 1 - m (causal: the heaviest with the lightest, every pair the
    same weight; no counter), the second tile costing `inner` blocks beside its own."""
    blocks = -(-seqlen // rows)
    def duration(m):
        return min(seqlen, (blocks - m) * rows) / 128
    def pair(c):
        return duration(c) + (duration(blocks - 1 - c) + inner if blocks - 1 - c > c else 0.0)
    singles = [m for h in range(heads) for m in range(blocks) for b in range(seqs)]
    pairs = [c for h in range(heads) for c in range((blocks + 1) // 2) for b in range(seqs)]
    full = seqlen / 128
    return {"causal": makespan(singles, lambda m: duration(m) + now) / makespan(pairs, lambda c: pair(c) + now),
            "non-causal": makespan(singles, lambda m: full + now)
            / makespan(pairs, lambda c: full + (full + inner if blocks - 1 - c > c else 0.0) + now)}


def main() -> None:
    for overhead in (0.5, 2.0):
        print(f"CTA overhead = {overhead} blocks' time; makespan / ideal")
        for label, s, rows, seqs, heads in SHAPES:
            r = model(s, rows, seqs, heads, overhead)
            print(f"  {label:30s}" + "  ".join(f"{k}: {v:.3f}" for k, v in r.items()))
    print("causal, persistent CTAs (tile overhead 1.5 blocks) against the launch as it is (3.6): speed-up")
    for label, s, rows, seqs, heads in SHAPES:
        r = persistent(s, rows, seqs, heads, 3.6, 1.5)
        print(f"  {label:30s}" + "  ".join(f"{k}: {v:.3f}" for k, v in r.items()))
    print("two row blocks a CTA (m, M - 1 - m; 1.5 blocks inside the pair) against the launch as it is: speed-up")
    for label, s, rows, seqs, heads in SHAPES:
        r = paired(s, rows, seqs, heads, 3.6, 1.5)
        print(f"  {label:30s}" + "  ".join(f"{k}: {v:.3f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
