"""analyse.py NPY...: per-tile boundaries of the persistent BF16 d128 kernel's trace (medians)."""
import sys
import numpy as np

EV = {0: "enter", 1: "ready", 2: "s0_turn", 3: "s0_done", 4: "block0_turn", 5: "last_turn", 6: "last_pv_done",
      7: "written", 8: "n_blocks"}


def d(a, b):
    return (b.astype(np.int64) - a.astype(np.int64)) & 0xFFFFFFFF


def analyse(path):
    buf = np.load(path).reshape(132, 4, 512, 16)
    rows = {k: [] for k in ("epilogue", "enter_to_ready", "ready_to_s0turn", "s0", "s0_to_block0", "boundary",
                            "period", "overhead_blocks", "lastturn_to_pvdone", "c1_lag")}
    prod = {k: [] for k in ("k_loop", "take_next", "qempty_wait")}
    for cta in range(132):
        c = buf[cta]
        tiles = int(np.count_nonzero(c[1, :, 1]))
        for j in range(tiles):
            p = c[0, j]
            if p[1] and p[0]:
                prod["k_loop"].append(d(p[0], p[1]))
                prod["take_next"].append(d(p[1], p[2]))
                prod["qempty_wait"].append(d(p[2], p[3]))
            for cw in (1, 2):
                t, nxt = c[cw, j], c[cw, j + 1]
                nb = int(t[8])
                if nb < 3 or not t[5] or not t[4]:
                    continue
                period = d(t[4], t[5]) / (nb - 1)
                rows["period"].append(period)
                rows["epilogue"].append(d(t[6], t[7]))
                rows["lastturn_to_pvdone"].append(d(t[5], t[6]))
                if nxt[4] and nxt[0]:
                    rows["enter_to_ready"].append(d(nxt[0], nxt[1]))
                    rows["ready_to_s0turn"].append(d(nxt[1], nxt[2]))
                    rows["s0"].append(d(nxt[2], nxt[3]))
                    rows["s0_to_block0"].append(d(nxt[3], nxt[4]))
                    b = d(t[5], nxt[4])
                    rows["boundary"].append(b)
                    rows["overhead_blocks"].append((b - period) / period)
            if c[1, j, 5] and c[2, j, 5]:
                rows["c1_lag"].append(d(c[1, j, 5], c[2, j, 5]))
    print(path, "tiles/CTA", np.median([np.count_nonzero(buf[i, 1, :, 1]) for i in range(132)]))
    for k, v in rows.items():
        if v:
            print(f"  {k:22s} median {np.median(v):9.1f}  p10 {np.percentile(v, 10):9.1f}  p90 {np.percentile(v, 90):9.1f}  n {len(v)}")
    for k, v in prod.items():
        if v:
            print(f"  producer {k:13s} median {np.median(v):9.1f}  p90 {np.percentile(v, 90):9.1f}")


for path in sys.argv[1:]:
    analyse(path)
