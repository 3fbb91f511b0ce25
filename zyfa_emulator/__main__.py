"""``python -m zyfa_emulator dis CODE_OBJECT``: the emulator's view of a code object --
kernels and descriptors, then every instruction with its address, the registers it reads
and writes, and whether the emulator implements it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .codeobject import CodeObject
from .isa import decode_all
from .machine import HANDLERS
from .operands import operands


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zyfa_emulator", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dis", help="disassemble a gfx950 code object")
    d.add_argument("path")
    d.add_argument("--operands", action="store_true", help="show registers read and written")
    args = ap.parse_args(argv)
    co = CodeObject(Path(args.path).read_bytes())
    for k in co.kernels.values():
        kd = k.descriptor
        print(f"; kernel {k.name} at 0x{k.entry:x}: LDS {kd.group_segment_fixed_size} B, "
              f"kernarg {k.kernarg_segment_size} B, user SGPRs {kd.enabled_user_sgprs()}, "
              f"workgroup ids {kd.workgroup_id_enable}, accum_offset {kd.accum_offset}, "
              f"MODE denorm32 {kd.float_denorm_mode_32} ieee {int(kd.ieee_mode)} "
              f"fp16_ovfl {int(kd.fp16_overflow)}")
    missing = set()
    for inst in decode_all(co.text, co.text_addr):
        line = f"{inst.pc:8x}:  {inst.text()}"
        if args.operands:
            ops = operands(inst)
            line = f"{line:<80} ; R {ops.reads} W {ops.writes}"
        if inst.name not in HANDLERS:
            missing.add(inst.name)
            line += "   ; NOT IMPLEMENTED"
        print(line)
    if missing:
        print(f"; {len(missing)} mnemonics without semantics: {', '.join(sorted(missing))}",
              file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
