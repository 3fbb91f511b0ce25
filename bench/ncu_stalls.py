"""Where a kernel's warps stall, from Nsight Compute's source page: the warp-state samples of
every SASS instruction summed per opcode, then the instructions that hold the most samples.

    ncu -k regex:zyfa_fwd --launch-skip 1 --launch-count 1 --section WarpStateStats \\
        --section SourceCounters -o rep python3 bench/profile_target.py --dtype bf16 ...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > source.csv
    python3 bench/ncu_stalls.py source.csv [TOP]

The samples are every warp's, the producer's waits included (an mbarrier wait shows as the
branch after SYNCS.PHASECHK, a named barrier's as the instruction after BAR.SYNC).
"""
import collections
import csv
import re
import sys


def main(path: str, top: int = 20) -> None:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    hdr = next(r for r in rows if "Address" in r and "Source" in r)
    ix = {h: i for i, h in enumerate(hdr)}
    data = [r for r in rows[rows.index(hdr) + 1:] if len(r) >= len(hdr)]
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, h):
        return float(r[ix[h]] or 0)

    by_op, executed = collections.defaultdict(collections.Counter), collections.Counter()
    per_ins = []
    for r in data:
        src = r[ix["Source"]]
        op = re.sub(r"^@!?U?P\w+\s+", "", src).split()[0].split(".")[0] if src.strip() else "?"
        stalls = collections.Counter({h[6:]: num(r, h) for h in reasons})
        by_op[op].update(stalls)
        executed[op] += int(num(r, "Instructions Executed"))
        per_ins.append((sum(stalls.values()), r[ix["Address"]], src, stalls))
    total = sum(sum(c.values()) for c in by_op.values())
    everything = sum((c for c in by_op.values()), collections.Counter())
    print(f"{path}: {total:.0f} samples;",
          ", ".join(f"{k} {v / total:.3f}" for k, v in everything.most_common(10)))
    print("\nper opcode: share of all samples, instructions executed, the main reasons")
    for op, c in sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
        print(f"  {op:12s} {sum(c.values()) / total:6.3f} {executed[op]:11d}  "
              + " ".join(f"{k} {v / total:.3f}" for k, v in c.most_common(3)))
    print("\nper instruction")
    for s, addr, src, c in sorted(per_ins, key=lambda x: -x[0])[:top]:
        print(f"  {s / total:6.3f} {addr[-5:]} {src[:56]:56s} "
              + " ".join(f"{k} {v / max(s, 1):.2f}" for k, v in c.most_common(2)))


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
