import sys, numpy as np
SL = {2: "entry", 3: "sync", 4: "q_issued", 5: "q_landed", 6: "c0_qfull", 7: "c0_s0", 8: "c0_loop", 9: "c0_epi",
      10: "c1_qfull", 11: "c1_s0", 12: "c1_loop", 13: "c1_epi", 14: "prod_end"}
def analyse(path):
    a = np.load(path).astype(np.int64).reshape(-1, 32)
    a = a[a[:, 2] != 0]
    n = a[:, 1]; sm = a[:, 0]
    rel = lambda s: ((a[:, s] - a[:, 2]) & 0xffffffff)
    end = np.maximum(rel(9), rel(13))
    print(path, "CTAs", len(a), "SMs", len(np.unique(sm)))
    # per-SM sequence: gap between one CTA's end and next entry
    gaps = []; spans = []
    for s in np.unique(sm):
        idx = np.where(sm == s)[0]
        t0 = a[idx, 2]
        base = t0.min()
        order = idx[np.argsort((t0 - base) & 0xffffffff)]
        st = (a[order, 2] - base) & 0xffffffff
        en = st + end[order]
        gaps += list(st[1:] - en[:-1])
        spans.append(en[-1] - st[0])
    gaps = np.array(gaps)
    print(f"  gap end->next entry: median {np.median(gaps):.0f} cycles, p10 {np.percentile(gaps,10):.0f} p90 {np.percentile(gaps,90):.0f}")
    spans = np.array(spans); print(f"  SM span: max {spans.max()} min {spans.min()} median {np.median(spans):.0f}")
    SL.update({16: "c0_lse", 17: "c0_stm", 18: "c0_st", 19: "c1_lse", 20: "c1_stm", 21: "c1_st", 22: "p_regs", 23: "p_qiss"})
    for s in (3, 22, 23, 4, 5, 6, 7, 10, 11, 14):
        print(f"  {SL[s]:9s} median {np.median(rel(s)):7.0f}")
    for base, lst in ((8, (16, 17, 18, 9)), (12, (19, 20, 21, 13))):
        print("  epilogue from", SL[base], " ".join(f"{SL[x]} +{np.median((rel(x) - rel(base)) & 0xffffffff):.0f}" for x in lst))
    # steady block time: fit end ~ n
    c0loop = rel(8) - rel(7); c1loop = rel(12) - rel(11)
    for nb in sorted(set(n.tolist()))[:: max(1, len(set(n.tolist())) // 8)]:
        m = n == nb
        print(f"  n={nb:4d}: total {np.median(end[m]):8.0f}  c0 s0 {np.median(rel(7)[m]):6.0f} c1 s0 {np.median(rel(11)[m]):6.0f}"
              f" c0 loop {np.median(c0loop[m]):8.0f} c1 loop end {np.median(rel(12)[m]):8.0f} c0 epi {np.median((rel(9)-rel(8))[m]):6.0f}"
              f" c1 epi {np.median((rel(13)-rel(12))[m]):6.0f}  per-block {np.median(end[m])/nb:7.0f}")
    A = np.vstack([n, np.ones_like(n)]).T
    coef, *_ = np.linalg.lstsq(A.astype(float), end.astype(float), rcond=None)
    print(f"  fit: CTA time = {coef[0]:.0f} n + {coef[1]:.0f} cycles; with gap {np.median(gaps):.0f}: overhead {(coef[1]+np.median(gaps))/coef[0]:.2f} blocks")
for p in sys.argv[1:]:
    analyse(p)
