"""The consumer's block loop of each function of a code object, from cuobjdump -sass: every
backward branch spanning more than 2 KiB of code, its instruction count and the R2UR, local
loads/stores and BRA.DIV in it.  python3 sass_loops.py X.cubin"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from generator import wgmma_hazards as wh  # noqa: E402

for path in sys.argv[1:]:
    for name, ins in wh.functions(wh.sass(Path(path), wh.cuobjdump())).items():
        for addr, text in ins:
            m = re.search(r"\bBRA\s+0x([0-9a-f]+)", text)
            if m and int(m.group(1), 16) < addr and addr - int(m.group(1), 16) > 0x800:
                body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
                count = {k: sum(k in t for t in body) for k in ("R2UR", "LDL", "STL", "BRA.DIV")}
                print(f"{Path(path).parent.parent.name}/{name}: loop {int(m.group(1), 16):#x}..{addr:#x} "
                      f"{len(body)} instructions {count}")
                break
