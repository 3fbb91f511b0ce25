"""Which registers an instruction reads and writes, for observers (hazard checks, cycle
models, traces) attached to ``Machine.observers``.

``operands(inst)`` returns an :class:`Operands` with ``reads`` and ``writes``: lists of
:class:`Reg` ``(kind, index, count)`` where kind is ``"s"`` (SGPR, by operand code, so
VCC is s106/s107, M0 s124, EXEC s126/s127), ``"v"`` (VGPR), ``"a"`` (AccVGPR) or
``"scc"``.  Implicit operands are included: EXEC for every vector instruction, VCC for
VOPC/carry/``v_div_fmas``, M0 for LDS DMA, SCC for the scalar instructions that use
it.  Results are cached on the instruction.
"""

from __future__ import annotations

import dataclasses
import re

from .isa import Inst
from .render import _mem_width, _mfma_regs, _s_widths, vop_widths

EXEC, VCC, M0 = 126, 106, 124


@dataclasses.dataclass(frozen=True)
class Reg:
    kind: str
    index: int
    count: int = 1

    def __repr__(self) -> str:
        if self.kind == "scc":
            return "scc"
        return f"{self.kind}{self.index}" if self.count == 1 else \
            f"{self.kind}[{self.index}:{self.index + self.count - 1}]"


@dataclasses.dataclass
class Operands:
    reads: list
    writes: list


def _src(code, count: int, acc: bool = False) -> Reg | None:
    if code is None:
        return None
    if code >= 256:
        return Reg("a" if acc else "v", code - 256, count)
    if code < 128:
        return Reg("s", code, count)
    if code == 251:
        return Reg("s", VCC, 2)
    if code == 252:
        return Reg("s", EXEC, 2)
    if code == 253:
        return Reg("scc", 0)
    return None                # constants and literals


_SCC_WRITERS = re.compile(r"s_(add|sub|addc|subb|min|max|and|or|xor|andn2|orn2|nand|nor|xnor|"
                          r"lshl|lshr|ashr|bfe|absdiff|not|abs|bcnt[01]|cmp|cmpk|bitcmp|addk|"
                          r"lshl[1-4]_add)_|s_\w+_saveexec_b64|s_\w+_wrexec_b64")
_SCC_READERS = re.compile(r"s_(addc|subb|cselect|cmov|cmovk)_|s_cbranch_scc")


def operands(inst: Inst) -> Operands:
    if inst.ops is not None:
        return inst.ops
    r, w = [], []
    f, n = inst.fmt, inst.name

    def add(lst, reg):
        if reg is not None:
            lst.append(reg)

    if f in ("SOP1", "SOP2", "SOPC", "SOPK"):
        dw, w0, w1 = _s_widths(n)
        if f == "SOPC":
            w0 = w1 = 2 if n.endswith("_u64") else (2 if n.endswith("_b64") else 1)
            if n.endswith("_b64") and "bitcmp" in n:
                w1 = 1
        if f in ("SOP1", "SOP2", "SOPC"):
            add(r, _src(inst.ssrc0, w0))
        if f in ("SOP2", "SOPC"):
            add(r, _src(inst.ssrc1, w1))
        if f == "SOPK" and n.startswith(("s_cmpk", "s_addk", "s_mulk")):
            add(r, Reg("s", inst.sdst))
        if f == "SOPK" and n == "s_setreg_b32":
            add(r, Reg("s", inst.sdst))
        if f in ("SOP1", "SOP2", "SOPK") and n not in ("s_setpc_b64", "s_setreg_b32",
                                                        "s_setreg_imm32_b32") and \
                not n.startswith(("s_cmpk", "s_cbranch")):
            add(w, Reg("s", inst.sdst, dw))
        if "saveexec" in n or "wrexec" in n:
            r.append(Reg("s", EXEC, 2))
            w.append(Reg("s", EXEC, 2))
        if _SCC_WRITERS.match(n) and n not in ("s_mul_i32",):
            w.append(Reg("scc", 0))
        if _SCC_READERS.match(n):
            r.append(Reg("scc", 0))
    elif f == "SOPP":
        if n in ("s_cbranch_scc0", "s_cbranch_scc1"):
            r.append(Reg("scc", 0))
        elif n in ("s_cbranch_vccz", "s_cbranch_vccnz"):
            r.append(Reg("s", VCC, 2))
        elif n in ("s_cbranch_execz", "s_cbranch_execnz"):
            r.append(Reg("s", EXEC, 2))
    elif f == "SMEM":
        m = re.search(r"x(\d+)$", n)
        count = int(m.group(1)) if m else 1
        add(r, Reg("s", inst.sbase, 4 if n.startswith("s_buffer") else 2))
        if inst.soffset is not None:
            add(r, _src(inst.soffset, 1))
        if n.startswith(("s_load", "s_buffer_load")):
            w.append(Reg("s", inst.sdata, count))
    elif f in ("VOP1", "VOP2", "VOPC", "VOP3", "VOP3P"):
        dw, w0, w1, w2 = vop_widths(inst)
        short = inst.info if f == "VOP3" else f
        nsrc = {"VOP1": 1, "VOP2": 2, "VOPC": 2}.get(short, 3)
        if f == "VOP3P" and n in ("v_pk_mul_f32", "v_pk_add_f32", "v_pk_mov_b32"):
            nsrc = 2
        if f == "VOP3" and short == "VOP3":
            from .render import _vop3_nsrc
            nsrc = _vop3_nsrc(n)
        for code, width in list(zip((inst.src0, inst.src1, inst.src2), (w0, w1, w2)))[:nsrc]:
            add(r, _src(code, width, acc=(n == "v_accvgpr_mov_b32")))
        if n in ("v_cndmask_b32", "v_addc_co_u32", "v_subb_co_u32", "v_subbrev_co_u32",
                 "v_div_fmas_f32") and f != "VOP3" or n == "v_div_fmas_f32":
            r.append(Reg("s", VCC, 2))
        if f == "VOP3" and n in ("v_cndmask_b32", "v_addc_co_u32", "v_subb_co_u32",
                                 "v_subbrev_co_u32"):
            add(r, _src(inst.src2, 2))
        if n in ("v_fmac_f32", "v_mac_f32", "v_cvt_pk_fp8_f32", "v_cvt_pk_bf8_f32",
                 "v_cvt_sr_fp8_f32", "v_cvt_sr_bf8_f32") or n.startswith("v_cvt_scalef32_pk_fp8") \
                or (inst.sdwa is not None and inst.sdwa.dst_unused == 2):
            r.append(Reg("v", inst.vdst, 1))
        r.append(Reg("s", EXEC, 2))
        if n in ("v_readfirstlane_b32", "v_readlane_b32"):
            w.append(Reg("s", inst.vdst))
        elif short == "VOPC":
            w.append(Reg("s", inst.sdst, 2))
            if n.startswith("v_cmpx"):
                w.append(Reg("s", EXEC, 2))
        elif n in ("v_permlane16_swap_b32", "v_permlane32_swap_b32", "v_swap_b32"):
            w.append(Reg("v", inst.vdst))
            w.append(Reg("v", inst.src0 - 256))
            r.append(Reg("v", inst.vdst))
        elif n == "v_accvgpr_mov_b32":
            w.append(Reg("a", inst.vdst))
        elif inst.vdst is not None and n not in ("v_nop",):
            w.append(Reg("v", inst.vdst, dw))
        if f == "VOP3" and inst.sdst is not None and short != "VOPC":
            w.append(Reg("s", inst.sdst, 2))
        if f != "VOP3" and n in ("v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32",
                                 "v_addc_co_u32", "v_subb_co_u32", "v_subbrev_co_u32"):
            w.append(Reg("s", VCC, 2))
    elif f == "MAI":
        if n == "v_accvgpr_read_b32":
            r += [Reg("a", inst.src0 - 256), Reg("s", EXEC, 2)]
            w.append(Reg("v", inst.vdst))
        elif n == "v_accvgpr_write_b32":
            add(r, _src(inst.src0, 1))
            r.append(Reg("s", EXEC, 2))
            w.append(Reg("a", inst.vdst))
        else:
            a, b, cd = _mfma_regs(n, inst.cbsz, inst.blgp)
            add(r, _src(inst.src0, a, bool(inst.acc & 1)))
            add(r, _src(inst.src1, b, bool(inst.acc & 2)))
            add(r, _src(inst.src2, cd, bool(inst.acc_cd)))
            if inst.scale is not None:
                add(r, _src(inst.scale[0], 1))
                add(r, _src(inst.scale[1], 1))
            w.append(Reg("a" if inst.acc_cd else "v", inst.vdst, cd))
    elif f == "DS":
        _ds(inst, r, w)
    elif f in ("GLOBAL", "FLAT", "SCRATCH", "MUBUF"):
        _vmem(inst, r, w)
    inst.ops = Operands(r, w)
    return inst.ops


def _ds(inst: Inst, r: list, w: list) -> None:
    n = inst.name
    acc = "a" if inst.acc else "v"
    r.append(Reg("v", inst.addr - 256))
    r.append(Reg("s", EXEC, 2))
    m = re.search(r"_b(\d+)(?:_tr_b\d+)?$", n)
    bits = int(m.group(1)) if m else 32
    count = max(1, bits // 32)
    if n in ("ds_bpermute_b32", "ds_permute_b32"):
        r.append(Reg("v", inst.data0 - 256))
        w.append(Reg("v", inst.vdst - 256))
    elif n == "ds_swizzle_b32":
        w.append(Reg("v", inst.vdst - 256))
    elif n.startswith("ds_read"):
        if "read2" in n:
            count *= 2
        if n.startswith(("ds_read_u8", "ds_read_i8", "ds_read_u16", "ds_read_i16")):
            count = 1
        w.append(Reg(acc, inst.vdst - 256, count))
    elif n.startswith("ds_write"):
        if n.startswith(("ds_write_b8", "ds_write_b16")):
            count = 1
        r.append(Reg(acc, inst.data0 - 256, count))
        if "write2" in n:
            r.append(Reg(acc, inst.data1 - 256, count))


def _vmem(inst: Inst, r: list, w: list) -> None:
    n = inst.name
    acc = "a" if inst.acc else "v"
    count = _mem_width(n)
    r.append(Reg("s", EXEC, 2))
    if inst.fmt == "MUBUF":
        r.append(Reg("s", inst.srsrc, 4))
        add = _src(inst.soffset, 1)
        if add is not None:
            r.append(add)
        nv = (1 if inst.offen or inst.idxen else 0) + (1 if inst.offen and inst.idxen else 0)
        if nv:
            r.append(Reg("v", inst.addr - 256, nv))
    else:
        uses_saddr = inst.saddr != 0x7F and inst.seg != 0
        r.append(Reg("v", inst.addr - 256, 1 if uses_saddr else 2))
        if uses_saddr:
            r.append(Reg("s", inst.saddr, 2))
    if inst.lds or "_lds_" in n:
        r.append(Reg("s", M0))
        return
    if "store" in n:
        r.append(Reg(acc, inst.data0 - 256, count))
    elif "load" in n:
        w.append(Reg(acc, inst.vdst - 256 if inst.fmt != "MUBUF" else inst.data0 - 256, count))
