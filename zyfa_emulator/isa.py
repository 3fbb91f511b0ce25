"""Binary decoder for gfx950 machine code, and an LLVM-style rendering of what it decoded.

The microcode formats and their fields are those of AMD's CDNA4 ISA guide, chapter 13
("Microcode Formats"): SOP2, SOPK, SOP1, SOPC, SOPP, SMEM, VOP1, VOP2, VOPC (each with
their SDWA and DPP variants), VOP3 (VOP3A and VOP3B), VOP3P (incl. the MAI matrix
instructions and the two-instruction scaled MFMA), DS, FLAT/GLOBAL/SCRATCH and MUBUF.
Operand codes (9-bit sources, 7-bit scalar destinations) follow §13's "SSRC"/"SRC"
tables: 0..101 SGPRs, 106/107 VCC, 124 M0, 126/127 EXEC, 128..208 integer inline
constants, 240..248 float inline constants, 251 VCCZ, 252 EXECZ, 253 SCC, 255 a 32-bit
literal following the instruction, 256..511 VGPRs.

:func:`decode` returns an :class:`Inst`; the executor binds its semantics by mnemonic.
``Inst.text()`` renders it the way ``llvm-objdump --mcpu=gfx950`` does for the forms the
kernels use, so the decoder can be cross-checked against LLVM's disassembler.
"""

from __future__ import annotations

import struct

from . import opcodes


class DecodeError(ValueError):
    """Bytes that are not an instruction the decoder knows."""


# --------------------------------------------------------------------------------------
# Operand codes

SRC_VCC_LO, SRC_VCC_HI, SRC_M0, SRC_EXEC_LO, SRC_EXEC_HI = 106, 107, 124, 126, 127
SRC_SDWA, SRC_DPP, SRC_VCCZ, SRC_EXECZ, SRC_SCC, SRC_LITERAL = 249, 250, 251, 252, 253, 255

#: Float inline constants: code -> (f32 bits, f64 bits, text).
FLOAT_CONSTS = {
    240: (0x3F000000, 0x3FE0000000000000, "0.5"), 241: (0xBF000000, 0xBFE0000000000000, "-0.5"),
    242: (0x3F800000, 0x3FF0000000000000, "1.0"), 243: (0xBF800000, 0xBFF0000000000000, "-1.0"),
    244: (0x40000000, 0x4000000000000000, "2.0"), 245: (0xC0000000, 0xC000000000000000, "-2.0"),
    246: (0x40800000, 0x4010000000000000, "4.0"), 247: (0xC0800000, 0xC010000000000000, "-4.0"),
    248: (0x3E22F983, 0x3FC45F306DC9C882, "0.15915494"),
}

_SPECIAL_NAMES = {102: "flat_scratch_lo", 103: "flat_scratch_hi", 104: "xnack_mask_lo",
                  105: "xnack_mask_hi", 106: "vcc_lo", 107: "vcc_hi", 124: "m0",
                  126: "exec_lo", 127: "exec_hi", 235: "src_shared_base",
                  236: "src_shared_limit", 237: "src_private_base", 238: "src_private_limit",
                  239: "src_pops_exiting_wave_id", 251: "src_vccz", 252: "src_execz",
                  253: "src_scc", 254: "src_lds_direct"}
_SPECIAL_PAIRS = {102: "flat_scratch", 104: "xnack_mask", 106: "vcc", 126: "exec"}


def inline_int(code: int) -> int | None:
    """Value of an integer inline constant code, or None."""
    if 128 <= code <= 192:
        return code - 128
    if 193 <= code <= 208:
        return 192 - code
    return None


def operand_text(code: int, n: int = 1, literal: int | None = None, acc: bool = False,
                 fp: bool = False) -> str:
    """LLVM's spelling of a source/destination operand of ``n`` dwords."""
    if code >= 256:
        r = code - 256
        p = "a" if acc else "v"
        return f"{p}{r}" if n == 1 else f"{p}[{r}:{r + n - 1}]"
    if code <= 101:
        return f"s{code}" if n == 1 else f"s[{code}:{code + n - 1}]"
    if 108 <= code <= 123:
        r = code - 108
        return f"ttmp{r}" if n == 1 else f"ttmp[{r}:{r + n - 1}]"
    if n == 2 and code in _SPECIAL_PAIRS:
        return _SPECIAL_PAIRS[code]
    if code in _SPECIAL_NAMES:
        return _SPECIAL_NAMES[code]
    v = inline_int(code)
    if v is not None:
        return str(v)
    if code in FLOAT_CONSTS:
        return FLOAT_CONSTS[code][2]
    if code == SRC_LITERAL:
        if literal is None:
            return "lit"
        # A literal an integer inline constant could have encoded is marked as one (LLVM's lit()),
        # so the text reassembles to the same bytes.
        inline = not fp and (literal <= 64 or literal >= 0xFFFFFFF0)
        return f"lit(0x{literal:x})" if inline else f"0x{literal:x}"
    return f"?{code}"


# --------------------------------------------------------------------------------------
# The decoded instruction

class Inst:
    """One decoded instruction.  Fields not used by its format stay at their defaults."""

    __slots__ = (
        "pc", "size", "fmt", "op", "name", "enc", "run", "info", "ops", "loc",
        # scalar
        "sdst", "ssrc0", "ssrc1", "simm16", "literal",
        # vector
        "vdst", "src0", "src1", "src2", "abs", "neg", "neg_hi", "opsel", "opsel_hi", "clamp",
        "omod", "sdwa", "dpp", "acc_cd", "acc", "cbsz", "abid", "blgp", "scale",
        # memory
        "offset", "offset0", "offset1", "gds", "addr", "data0", "data1", "saddr", "seg",
        "sc0", "sc1", "nt", "lds", "offen", "idxen", "srsrc", "soffset", "sbase", "sdata",
        "imm", "soe",
    )

    def __init__(self, pc: int, fmt: str, op: int, name: str):
        self.pc, self.fmt, self.op, self.name = pc, fmt, op, name
        self.size = 4
        self.enc = ""          # encoding suffix the disassembler shows: "_e32", "_e64", "_sdwa", "_dpp"
        self.run = None
        self.info = None
        self.ops = None        # operands.operands() cache
        self.loc = None        # "0x<code object address> <kernel+offset>", set by the loader
        self.sdst = self.ssrc0 = self.ssrc1 = self.simm16 = self.literal = None
        self.vdst = self.src0 = self.src1 = self.src2 = None
        self.abs = self.neg = self.neg_hi = self.opsel = self.clamp = self.omod = 0
        self.opsel_hi = 0
        self.sdwa = self.dpp = None
        self.acc_cd = 0
        self.acc = 0
        self.cbsz = self.abid = self.blgp = 0
        self.scale = None
        self.offset = self.offset0 = self.offset1 = 0
        self.gds = self.sc0 = self.sc1 = self.nt = self.lds = self.offen = self.idxen = 0
        self.addr = self.data0 = self.data1 = self.saddr = self.seg = None
        self.srsrc = self.soffset = self.sbase = self.sdata = None
        self.imm = self.soe = 0

    def __repr__(self) -> str:
        return f"<{self.text()} @0x{self.pc:x}>"

    def where(self) -> str:
        """The instruction and its address, for messages: code-object address (as
        llvm-objdump prints it) and kernel-relative offset when loaded from a code object."""
        return f"{self.text()} at {self.loc or f'0x{self.pc:x}'}"

    def text(self) -> str:
        from .render import render
        return render(self)


class Sdwa:
    __slots__ = ("dst_sel", "dst_unused", "src0_sel", "src0_sext", "src0_neg", "src0_abs",
                 "src1_sel", "src1_sext", "src1_neg", "src1_abs", "clamp", "omod", "sdst")

    def __init__(self, w: int, vopc: bool):
        self.dst_sel = (w >> 8) & 7
        self.dst_unused = (w >> 11) & 3
        self.clamp = (w >> 13) & 1
        self.omod = (w >> 14) & 3
        self.sdst = None
        if vopc:   # VOPC SDWA: bits 14:8 are SDST when bit 15 (SD) is set, else VCC
            self.sdst = ((w >> 8) & 0x7F) if (w >> 15) & 1 else SRC_VCC_LO
            self.dst_sel, self.dst_unused, self.clamp, self.omod = 6, 0, 0, 0
        self.src0_sel = (w >> 16) & 7
        self.src0_sext = (w >> 19) & 1
        self.src0_neg = (w >> 20) & 1
        self.src0_abs = (w >> 21) & 1
        self.src1_sel = (w >> 24) & 7
        self.src1_sext = (w >> 27) & 1
        self.src1_neg = (w >> 28) & 1
        self.src1_abs = (w >> 29) & 1


class Dpp:
    __slots__ = ("ctrl", "bound_ctrl", "src0_neg", "src0_abs", "src1_neg", "src1_abs",
                 "bank_mask", "row_mask")

    def __init__(self, w: int):
        self.ctrl = (w >> 8) & 0x1FF
        self.bound_ctrl = (w >> 19) & 1
        self.src0_neg = (w >> 20) & 1
        self.src0_abs = (w >> 21) & 1
        self.src1_neg = (w >> 22) & 1
        self.src1_abs = (w >> 23) & 1
        self.bank_mask = (w >> 24) & 0xF
        self.row_mask = (w >> 28) & 0xF


# --------------------------------------------------------------------------------------
# Decoding

def _sext(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _name(table: dict, fmt: str, op: int, word: int, pc: int) -> str:
    try:
        return table[op]
    except KeyError:
        raise DecodeError(f"no {fmt} instruction with opcode {op} (word 0x{word:08x} at "
                          f"0x{pc:x})") from None


#: VOP3 opcodes that use the VOP3B layout (a scalar destination in bits 14:8).
VOP3B_OPS = frozenset({281, 282, 283, 284, 285, 286, 480, 481, 488, 489})


def decode(code: bytes, offset: int, pc: int) -> Inst:
    """Decode the instruction at byte ``offset`` of ``code``; ``pc`` is its address."""
    def dword(i: int) -> int:
        start = offset + 4 * i
        if start + 4 > len(code):
            raise DecodeError(f"instruction at 0x{pc:x} runs past the end of the code")
        return struct.unpack_from("<I", code, start)[0]

    w = dword(0)
    top = w >> 23
    if top == 0x17D:                                             # SOP1  10111110 1
        op = (w >> 8) & 0xFF
        inst = Inst(pc, "SOP1", op, _name(opcodes.SOP1, "SOP1", op, w, pc))
        inst.sdst, inst.ssrc0 = (w >> 16) & 0x7F, w & 0xFF
        _scalar_literal(inst, dword, (inst.ssrc0,))
        return inst
    if top == 0x17E:                                             # SOPC  10111111 0
        op = (w >> 16) & 0x7F
        inst = Inst(pc, "SOPC", op, _name(opcodes.SOPC, "SOPC", op, w, pc))
        inst.ssrc0, inst.ssrc1 = w & 0xFF, (w >> 8) & 0xFF
        _scalar_literal(inst, dword, (inst.ssrc0, inst.ssrc1))
        return inst
    if top == 0x17F:                                             # SOPP  10111111 1
        op = (w >> 16) & 0x7F
        inst = Inst(pc, "SOPP", op, _name(opcodes.SOPP, "SOPP", op, w, pc))
        inst.simm16 = w & 0xFFFF
        return inst
    if w >> 28 == 0xB:                                           # SOPK  1011
        op = (w >> 23) & 0x1F
        inst = Inst(pc, "SOPK", op, _name(opcodes.SOPK, "SOPK", op, w, pc))
        inst.sdst, inst.simm16 = (w >> 16) & 0x7F, w & 0xFFFF
        if inst.name == "s_setreg_imm32_b32":
            inst.literal, inst.size = dword(1), 8
        return inst
    if w >> 30 == 0x2:                                           # SOP2  10
        op = (w >> 23) & 0x7F
        inst = Inst(pc, "SOP2", op, _name(opcodes.SOP2, "SOP2", op, w, pc))
        inst.sdst, inst.ssrc0, inst.ssrc1 = (w >> 16) & 0x7F, w & 0xFF, (w >> 8) & 0xFF
        _scalar_literal(inst, dword, (inst.ssrc0, inst.ssrc1))
        return inst
    if w >> 31 == 0:                                             # VOP1 / VOPC / VOP2
        return _decode_vop_short(w, dword, pc)
    enc = w >> 26
    if enc == 0x30:                                              # SMEM  110000
        return _decode_smem(w, dword(1), pc)
    if enc == 0x34:                                              # VOP3 / VOP3P  110100
        return _decode_vop3(w, dword, pc)
    if enc == 0x36:                                              # DS  110110
        return _decode_ds(w, dword(1), pc)
    if enc == 0x37:                                              # FLAT  110111
        return _decode_flat(w, dword(1), pc)
    if enc == 0x38:                                              # MUBUF  111000
        return _decode_mubuf(w, dword(1), pc)
    raise DecodeError(f"unsupported instruction encoding (word 0x{w:08x} at 0x{pc:x})")


def _scalar_literal(inst: Inst, dword, srcs) -> None:
    if SRC_LITERAL in srcs:
        inst.literal, inst.size = dword(1), 8


def _decode_vop_short(w: int, dword, pc: int) -> Inst:
    if w >> 25 == 0x3F:
        op = (w >> 9) & 0xFF
        inst = Inst(pc, "VOP1", op, _name(opcodes.VOP1, "VOP1", op, w, pc))
        inst.vdst, inst.src0 = (w >> 17) & 0xFF, w & 0x1FF
    elif w >> 25 == 0x3E:
        op = (w >> 17) & 0xFF
        inst = Inst(pc, "VOPC", op, _name(opcodes.VOPC, "VOPC", op, w, pc))
        inst.src0, inst.src1 = w & 0x1FF, 256 + ((w >> 9) & 0xFF)
        inst.sdst = SRC_VCC_LO
    else:
        op = (w >> 25) & 0x3F
        inst = Inst(pc, "VOP2", op, _name(opcodes.VOP2, "VOP2", op, w, pc))
        inst.vdst, inst.src0, inst.src1 = (w >> 17) & 0xFF, w & 0x1FF, 256 + ((w >> 9) & 0xFF)
    inst.enc = "_e32"
    if inst.src0 == SRC_SDWA:
        w1 = dword(1)
        inst.size = 8
        inst.enc = "_sdwa"
        inst.sdwa = s = Sdwa(w1, inst.fmt == "VOPC")
        inst.src0 = (w1 & 0xFF) + (0 if (w1 >> 23) & 1 else 256)
        if inst.fmt != "VOP1" and (w1 >> 31) & 1:
            inst.src1 -= 256               # S1: src1 is an SGPR
        if inst.fmt == "VOPC":
            inst.sdst = s.sdst
        inst.clamp, inst.omod = s.clamp, s.omod
    elif inst.src0 == SRC_DPP:
        w1 = dword(1)
        inst.size = 8
        inst.enc = "_dpp"
        inst.dpp = Dpp(w1)
        inst.src0 = 256 + (w1 & 0xFF)
    elif inst.src0 == SRC_LITERAL:
        inst.literal, inst.size = dword(1), 8
    if inst.name in ("v_fmamk_f32", "v_fmaak_f32", "v_madmk_f16", "v_madak_f16"):
        if inst.size == 4:
            inst.literal, inst.size = dword(1), 8
    return inst


def _decode_smem(w: int, w1: int, pc: int) -> Inst:
    op = (w >> 18) & 0xFF
    inst = Inst(pc, "SMEM", op, _name(opcodes.SMEM, "SMEM", op, w, pc))
    inst.size = 8
    inst.sbase = (w & 0x3F) << 1
    inst.sdata = (w >> 6) & 0x7F
    inst.soe = (w >> 14) & 1
    inst.sc0 = (w >> 16) & 1              # GLC
    inst.imm = (w >> 17) & 1
    if inst.imm:
        inst.offset = _sext(w1 & 0x1FFFFF, 21)
    else:
        inst.offset = 0
        inst.soffset = w1 & 0x7F          # offset in an SGPR
    if inst.soe:
        inst.soffset = (w1 >> 25) & 0x7F
    return inst


def _decode_vop3(w: int, dword, pc: int) -> Inst:
    w1 = dword(1)
    if w >> 23 == 0x1A7:                                         # VOP3P (incl. MAI)
        op = (w >> 16) & 0x7F
        inst = Inst(pc, "VOP3P", op, _name(opcodes.VOP3P, "VOP3P", op, w, pc))
        inst.size = 8
        inst.vdst = w & 0xFF
        inst.src0, inst.src1, inst.src2 = w1 & 0x1FF, (w1 >> 9) & 0x1FF, (w1 >> 18) & 0x1FF
        name = inst.name
        if name.startswith(("v_mfma", "v_smfmac", "v_accvgpr")):
            inst.fmt = "MAI"
            inst.cbsz = (w >> 8) & 7
            inst.abid = (w >> 11) & 0xF
            inst.acc_cd = (w >> 15) & 1
            inst.acc = (w1 >> 27) & 3
            inst.blgp = (w1 >> 29) & 7
            if name == "v_mfma_ld_scale_b32":
                # Scaled MFMA: this 8-byte prefix carries the scale operands and their
                # byte selects; the MFMA it applies to follows immediately.
                nxt = _decode_vop3(dword(2), lambda i: dword(2 + i), pc)
                if not nxt.name.startswith("v_mfma") or "f8f6f4" not in nxt.name:
                    raise DecodeError(f"v_mfma_ld_scale_b32 at 0x{pc:x} is not followed by an "
                                      "F8F6F4 MFMA")
                nxt.scale = (inst.src0, inst.src1, (w >> 11) & 7, ((w >> 14) & 1) << 2 | (w1 >> 27) & 3)
                nxt.pc, nxt.size = pc, 16
                nxt.name = nxt.name.replace("v_mfma_", "v_mfma_scale_", 1)
                return nxt
        else:
            inst.neg_hi = (w >> 8) & 7
            inst.opsel = (w >> 11) & 7
            inst.opsel_hi = ((w >> 14) & 1) << 2 | (w1 >> 27) & 3
            inst.clamp = (w >> 15) & 1
            inst.neg = (w1 >> 29) & 7
        if SRC_LITERAL in (inst.src0, inst.src1, inst.src2):
            raise DecodeError(f"VOP3P instruction at 0x{pc:x} uses a literal, which gfx950 "
                              "does not encode")
        return inst
    op = (w >> 16) & 0x3FF
    if op < 256:
        fmt_name, name = "VOPC", opcodes.VOPC.get(op)
    elif op < 320:
        fmt_name, name = "VOP2", opcodes.VOP2.get(op - 256)
    elif op < 448:
        fmt_name, name = "VOP1", opcodes.VOP1.get(op - 320)
    else:
        fmt_name, name = "VOP3", opcodes.VOP3.get(op)
    if name is None:
        raise DecodeError(f"no VOP3 instruction with opcode {op} (word 0x{w:08x} at 0x{pc:x})")
    inst = Inst(pc, "VOP3", op, name)
    inst.info = fmt_name                        # which short format the opcode comes from
    inst.size = 8
    inst.enc = "_e64" if fmt_name != "VOP3" else ""
    inst.vdst = w & 0xFF
    inst.src0, inst.src1, inst.src2 = w1 & 0x1FF, (w1 >> 9) & 0x1FF, (w1 >> 18) & 0x1FF
    inst.omod = (w1 >> 27) & 3
    inst.neg = (w1 >> 29) & 7
    inst.clamp = (w >> 15) & 1
    if op in VOP3B_OPS:
        inst.sdst = (w >> 8) & 0x7F
    else:
        inst.abs = (w >> 8) & 7
        inst.opsel = (w >> 11) & 0xF
    if fmt_name == "VOPC":
        inst.sdst = inst.vdst                    # VOPC in VOP3: the lane mask goes to SDST
        inst.vdst = None
    if SRC_LITERAL in (inst.src0, inst.src1, inst.src2):
        raise DecodeError(f"VOP3 instruction at 0x{pc:x} uses a literal, which gfx950 "
                          "does not encode")
    return inst


def _decode_ds(w: int, w1: int, pc: int) -> Inst:
    op = (w >> 17) & 0xFF
    inst = Inst(pc, "DS", op, _name(opcodes.DS, "DS", op, w, pc))
    inst.size = 8
    inst.offset0, inst.offset1 = w & 0xFF, (w >> 8) & 0xFF
    inst.offset = w & 0xFFFF
    inst.gds = (w >> 16) & 1
    inst.acc = (w >> 25) & 1
    inst.addr, inst.data0 = 256 + (w1 & 0xFF), 256 + ((w1 >> 8) & 0xFF)
    inst.data1, inst.vdst = 256 + ((w1 >> 16) & 0xFF), 256 + ((w1 >> 24) & 0xFF)
    return inst


def _decode_flat(w: int, w1: int, pc: int) -> Inst:
    op = (w >> 18) & 0x7F
    seg = (w >> 14) & 3
    fmt, table = {0: ("FLAT", opcodes.FLAT), 1: ("SCRATCH", opcodes.SCRATCH),
                  2: ("GLOBAL", opcodes.GLOBAL)}.get(seg, (None, None))
    if fmt is None:
        raise DecodeError(f"FLAT instruction at 0x{pc:x} has reserved segment 3")
    inst = Inst(pc, fmt, op, _name(table, fmt, op, w, pc))
    inst.size = 8
    inst.seg = seg
    inst.offset = _sext(w & 0x1FFF, 13) if seg else w & 0xFFF
    inst.lds = (w >> 13) & 1
    inst.sc0 = (w >> 16) & 1
    inst.nt = (w >> 17) & 1
    inst.sc1 = (w >> 25) & 1
    inst.addr = 256 + (w1 & 0xFF)
    inst.data0 = 256 + ((w1 >> 8) & 0xFF)
    inst.saddr = (w1 >> 16) & 0x7F
    inst.acc = (w1 >> 23) & 1
    inst.vdst = 256 + ((w1 >> 24) & 0xFF)
    return inst


def _decode_mubuf(w: int, w1: int, pc: int) -> Inst:
    op = (w >> 18) & 0x7F
    inst = Inst(pc, "MUBUF", op, _name(opcodes.MUBUF, "MUBUF", op, w, pc))
    inst.size = 8
    inst.offset = w & 0xFFF
    inst.offen = (w >> 12) & 1
    inst.idxen = (w >> 13) & 1
    inst.sc0 = (w >> 14) & 1
    inst.sc1 = (w >> 15) & 1
    inst.lds = (w >> 16) & 1
    inst.nt = (w >> 17) & 1
    inst.addr = 256 + (w1 & 0xFF)
    inst.data0 = 256 + ((w1 >> 8) & 0xFF)
    inst.srsrc = ((w1 >> 16) & 0x1F) << 2
    inst.acc = (w1 >> 23) & 1
    inst.soffset = (w1 >> 24) & 0xFF
    return inst


def decode_all(code: bytes, base: int) -> list[Inst]:
    """Linear sweep over ``code`` (addresses start at ``base``)."""
    out, off = [], 0
    while off < len(code):
        inst = decode(code, off, base + off)
        out.append(inst)
        off += inst.size
    return out
