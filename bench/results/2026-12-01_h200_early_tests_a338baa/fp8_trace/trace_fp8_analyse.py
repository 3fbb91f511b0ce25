"""Phases of the FP8 kernels' blocks from trace_fp8_run.py's files: trace_fp8_analyse.py FILE.npz..."""
import sys, numpy as np
NAMES = {0: "top", 1: "frame", 2: "bytes", 3: "vfull", 4: "turn", 5: "issued", 6: "pv_done", 7: "merged",
         9: "kfull", 8: "s_done"}
def analyse(path):
    z = np.load(path)
    buf = z["buf"].astype(np.int64).reshape(264, 4, 256, 16)
    hdr = z["hdr"].astype(np.int64).reshape(264, 8)
    live = hdr[:, 1] != 0
    print(f"{path}: {live.sum()} CTAs traced, launch {float(z['ms']):.3f} ms")
    serial = (buf[:, 1:, :, 9] != 0).any()
    order = [0, 1, 2, 3, 4, 5, 6, 7, 9, 8] if serial else [0, 1, 2, 3, 4, 5, 6, 7, 8]
    rows = []
    for c in np.where(live)[0]:
        for g in range(1, 4):
            ev = buf[c, g]
            nb = int((ev[:, 0] != 0).sum())
            if nb < 8: continue
            # steady blocks: 2 .. nb-3 (the last block leaves by another path)
            for n in range(2, nb - 2):
                e = ev[n]; e1 = ev[n + 1]
                if (e[order] == 0).any() or e1[0] == 0: continue
                d = [((e[order[i + 1]] - e[order[i]]) & 0xffffffff) for i in range(len(order) - 1)]
                d.append((e1[0] - e[order[-1]]) & 0xffffffff)
                d.append((e1[0] - e[0]) & 0xffffffff)
                rows.append(d)
    a = np.array(rows, dtype=np.float64)
    labels = [f"{NAMES[order[i]]}->{NAMES[order[i + 1]]}" for i in range(len(order) - 1)] + [f"{NAMES[order[-1]]}->top", "period"]
    print(f"  {len(a)} steady blocks (consumer first threads); median / p10 / p90 cycles")
    for i, l in enumerate(labels):
        print(f"  {l:18s} {np.median(a[:, i]):7.0f} {np.percentile(a[:, i], 10):7.0f} {np.percentile(a[:, i], 90):7.0f}")
    # tensor-core view per CTA: products issued (ev 4 or 9) to done (6 / 8)
    # producer waits
    pw = []
    for c in np.where(live)[0]:
        ev = buf[c, 0]
        for m in range(3, 250):
            if ev[m, 0] and ev[m, 1]: pw.append((ev[m, 1] - ev[m, 0]) & 0xffffffff)
    if pw: print(f"  producer wait for a free stage: median {np.median(pw):.0f}, p90 {np.percentile(pw, 90):.0f}")
for p in sys.argv[1:]:
    analyse(p)
