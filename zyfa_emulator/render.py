"""Text of a decoded instruction, spelled the way LLVM's AMDGPU disassembler spells it.

Used for error messages and traces, and by the tests that cross-check the decoder
against ``llvm-objdump --mcpu=gfx950``.  Covers the operand widths and modifiers of the
instruction subset the emulator executes; anything else still renders, perhaps less
exactly.
"""

from __future__ import annotations

import re

from .isa import Inst, inline_int, operand_text
from .opcodes import HWREG

_SEL = {0: "BYTE_0", 1: "BYTE_1", 2: "BYTE_2", 3: "BYTE_3", 4: "WORD_0", 5: "WORD_1", 6: "DWORD"}
_UNUSED = {0: "UNUSED_PAD", 1: "UNUSED_SEXT", 2: "UNUSED_PRESERVE"}

# Scalar operand widths (dwords) by mnemonic: (dst, src0, src1).
_S64_SHIFTS = {"s_lshl_b64", "s_lshr_b64", "s_ashr_i64", "s_bfe_u64", "s_bfe_i64",
               "s_bitcmp0_b64", "s_bitcmp1_b64"}


def _s_widths(name: str) -> tuple[int, int, int]:
    if name in _S64_SHIFTS:
        return 2, 2, 1
    if name == "s_bfm_b64":
        return 2, 1, 1
    if re.search(r"_(b|i|u)32_b64$", name) or name in ("s_bcnt0_i32_b64", "s_bcnt1_i32_b64",
                                                        "s_ff0_i32_b64", "s_ff1_i32_b64",
                                                        "s_flbit_i32_b64", "s_flbit_i32_i64"):
        return 1, 2, 2
    if name.endswith(("_b64", "_i64", "_u64")):
        return 2, 2, 2
    return 1, 1, 1


def _mfma_regs(name: str, cbsz: int, blgp: int) -> tuple[int, int, int]:
    """(A, B, C/D) register counts of an MFMA."""
    m = re.match(r"v_mfma(?:_scale)?_(?:f32|i32|f64)_(\d+)x(\d+)x(\d+)(?:_(\d+)b)?_?(\w*)", name)
    if not m:
        return 4, 4, 4
    mm, nn, kk = int(m.group(1)), int(m.group(2)), int(m.group(3))
    blocks = int(m.group(4) or 1)
    typ = m.group(5)
    cd = mm * nn * blocks // 64
    if "f64" in name.split("_")[2]:
        cd *= 2
    if typ == "f8f6f4":
        per = {0: 8, 1: 8, 2: 6, 3: 6, 4: 4}
        return per.get(cbsz, 8), per.get(blgp, 8), cd
    bits = {"bf16": 16, "f16": 16, "bf16_1k": 16, "i8": 8, "fp8_fp8": 8, "fp8_bf8": 8,
            "bf8_fp8": 8, "bf8_bf8": 8, "xf32": 32, "f32": 32, "f64": 64}.get(typ, 16)
    ab = max(1, mm * kk * blocks * bits // 32 // 64) if typ != "f64" else 2
    return ab, ab, cd


def vop_widths(inst: Inst) -> tuple[int, int, int, int]:
    """(dst, src0, src1, src2) widths in dwords of a VALU instruction."""
    n = inst.name
    if n in ("v_mov_b64", "v_pk_mov_b32"):
        return 2, 2, 2, 2
    if n.startswith("v_pk_") and n.endswith("_f32"):
        return 2, 2, 2, 2
    if n == "v_lshl_add_u64":
        return 2, 2, 1, 2
    if n in ("v_mad_u64_u32", "v_mad_i64_i32"):
        return 2, 1, 1, 2
    if n in ("v_lshlrev_b64", "v_lshrrev_b64", "v_ashrrev_i64"):
        return 2, 1, 2, 1
    if n in ("v_cvt_pk_f32_fp8", "v_cvt_pk_f32_bf8", "v_cvt_scalef32_pk_f32_fp8",
             "v_cvt_scalef32_pk_f32_bf8"):
        return 2, 1, 1, 1
    if n.startswith(("v_cmp_", "v_cmpx_")):
        w = 2 if re.search(r"_(f|i|u)64$", n) else 1
        return 2, w, w, 1
    if re.search(r"_f64$", n) and not n.startswith("v_cvt_"):
        return 2, 2, 2, 2
    if n.startswith("v_cvt_f64_"):
        return 2, 1, 1, 1
    if n.startswith("v_cvt_") and n.endswith("_f64"):
        return 1, 2, 2, 2
    return 1, 1, 1, 1


def _src(inst: Inst, code: int, width: int, idx: int, neg: int = 0, abs_: int = 0,
         fp: bool = True) -> str:
    t = operand_text(code, width, inst.literal)
    if abs_ >> idx & 1:
        t = f"|{t}|"
    if neg >> idx & 1:
        t = f"-{t}"
    return t


def _lit_hex(v: int) -> str:
    return f"0x{v:x}"


def render(inst: Inst) -> str:
    f = inst.fmt
    n = inst.name
    if f == "SOPP":
        return _render_sopp(inst)
    if f in ("SOP1", "SOP2", "SOPC"):
        dw, w0, w1 = _s_widths(n)
        if f == "SOPC":
            if n.endswith("_u64"):
                w0 = w1 = 2
            elif n.endswith("_b64"):
                w0, w1 = 2, 1
            else:
                w0 = w1 = 1
            return f"{n} {operand_text(inst.ssrc0, w0, inst.literal)}, " \
                   f"{operand_text(inst.ssrc1, w1, inst.literal)}"
        if f == "SOP1":
            if n == "s_getpc_b64":
                return f"{n} {operand_text(inst.sdst, 2)}"
            if n in ("s_setpc_b64", "s_rfe_b64"):
                return f"{n} {operand_text(inst.ssrc0, 2)}"
            return f"{n} {operand_text(inst.sdst, dw)}, {operand_text(inst.ssrc0, w0, inst.literal)}"
        return f"{n} {operand_text(inst.sdst, dw)}, {operand_text(inst.ssrc0, w0, inst.literal)}, " \
               f"{operand_text(inst.ssrc1, w1, inst.literal)}"
    if f == "SOPK":
        if n in ("s_getreg_b32", "s_setreg_b32", "s_setreg_imm32_b32"):
            hw = _hwreg(inst.simm16)
            if n == "s_getreg_b32":
                return f"{n} {operand_text(inst.sdst)}, {hw}"
            if n == "s_setreg_b32":
                return f"{n} {hw}, {operand_text(inst.sdst)}"
            return f"{n} {hw}, {inst.literal}"
        return f"{n} {operand_text(inst.sdst)}, {_lit_hex(inst.simm16)}"
    if f == "SMEM":
        dw = {"s_load_dword": 1, "s_load_dwordx2": 2, "s_load_dwordx4": 4, "s_load_dwordx8": 8,
              "s_load_dwordx16": 16, "s_buffer_load_dword": 1, "s_buffer_load_dwordx2": 2,
              "s_buffer_load_dwordx4": 4, "s_buffer_load_dwordx8": 8,
              "s_buffer_load_dwordx16": 16}.get(n)
        if dw is None:
            return n
        base_w = 4 if n.startswith("s_buffer") else 2
        off = _lit_hex(inst.offset) if inst.imm else operand_text(inst.soffset)
        return f"{n} {operand_text(inst.sdata, dw)}, {operand_text(inst.sbase, base_w)}, {off}"
    if f in ("VOP1", "VOP2", "VOPC", "VOP3"):
        return _render_vop(inst)
    if f == "VOP3P":
        return _render_vop3p(inst)
    if f == "MAI":
        return _render_mai(inst)
    if f == "DS":
        return _render_ds(inst)
    if f in ("GLOBAL", "FLAT", "SCRATCH"):
        return _render_flat(inst)
    if f == "MUBUF":
        return _render_mubuf(inst)
    return n


def _hwreg(simm: int) -> str:
    reg, off, size = simm & 0x3F, (simm >> 6) & 0x1F, ((simm >> 11) & 0x1F) + 1
    name = HWREG.get(reg, str(reg))
    return f"hwreg({name})" if off == 0 and size == 32 else f"hwreg({name}, {off}, {size})"


def _render_sopp(inst: Inst) -> str:
    n, s = inst.name, inst.simm16
    if n in ("s_endpgm", "s_barrier", "s_icache_inv", "s_wakeup", "s_endpgm_saved",
             "s_set_gpr_idx_off", "s_ttracedata"):
        return n
    if n == "s_waitcnt":
        vm = (s & 0xF) | ((s >> 14) & 3) << 4
        exp = (s >> 4) & 7
        lgkm = (s >> 8) & 0xF
        # The counters left at their maximum (no wait on them) are omitted, unless all are: then
        # all are printed (a wait on nothing, which "s_waitcnt 0", a wait on everything, is not).
        counters = ((f"vmcnt({vm})", vm != 63), (f"expcnt({exp})", exp != 7), (f"lgkmcnt({lgkm})", lgkm != 15))
        parts = [text for text, waits in counters if waits] or [text for text, _ in counters]
        return f"{n} " + " ".join(parts)
    return f"{n} {s}"


_NO_DST_SEL = {"v_cvt_f32_fp8", "v_cvt_f32_bf8", "v_cvt_pk_f32_fp8", "v_cvt_pk_f32_bf8"}


def bitop3(inst: Inst) -> int:
    """The 8-bit truth table of V_BITOP3_B16/B32, spread over the ABS, OMOD and NEG fields."""
    return inst.omod << 6 | inst.abs << 3 | inst.neg


def _render_vop(inst: Inst) -> str:
    n = inst.name
    short = inst.info if inst.fmt == "VOP3" else inst.fmt
    dw, w0, w1, w2 = vop_widths(inst)
    name = n + ("" if n == "v_readfirstlane_b32" and inst.enc == "_e32" else inst.enc)
    ops = []
    nsrc = 1 if short == "VOP1" else 2 if short in ("VOP2", "VOPC") else 3
    if inst.fmt == "VOP3" and short == "VOP3":
        nsrc = _vop3_nsrc(n)
    if inst.fmt == "VOP3" and short == "VOP2" and n in ("v_cndmask_b32", "v_addc_co_u32",
                                                         "v_subb_co_u32", "v_subbrev_co_u32"):
        nsrc = 3
        w2 = 2
    if n == "v_readfirstlane_b32":
        ops.append(operand_text(inst.vdst))
    elif short == "VOPC":
        ops.append(operand_text(inst.sdst, 2))
    elif inst.vdst is not None and n not in ("v_nop", "v_clrexcp"):
        ops.append(operand_text(256 + inst.vdst, dw))
    if inst.fmt == "VOP3" and inst.sdst is not None and short != "VOPC":
        ops.append(operand_text(inst.sdst, 2))
    if inst.fmt == "VOP3" and n == "v_readlane_b32":
        ops = [operand_text(inst.vdst)]
    if inst.fmt == "VOP3" and n == "v_writelane_b32":
        pass
    if n in ("v_nop", "v_clrexcp"):
        nsrc = 0
    neg, abs_ = inst.neg, inst.abs
    if n in ("v_bitop3_b32", "v_bitop3_b16"):
        neg = abs_ = 0
    if inst.sdwa is not None:
        s = inst.sdwa
        neg = s.src0_neg | s.src1_neg << 1
        abs_ = s.src0_abs | s.src1_abs << 1
    if inst.dpp is not None:
        d = inst.dpp
        neg = d.src0_neg | d.src1_neg << 1
        abs_ = d.src0_abs | d.src1_abs << 1
    widths = (w0, w1, w2)
    srcs = (inst.src0, inst.src1, inst.src2)
    for i in range(nsrc):
        ops.append(_src(inst, srcs[i], widths[i], i, neg, abs_))
    if inst.fmt == "VOP2" and n in ("v_cndmask_b32", "v_addc_co_u32", "v_subb_co_u32",
                                    "v_subbrev_co_u32") and inst.sdwa is None:
        ops.append("vcc")
    if inst.fmt == "VOP2" and n in ("v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32",
                                    "v_addc_co_u32", "v_subb_co_u32", "v_subbrev_co_u32"):
        ops.insert(1, "vcc")
    if n == "v_fmamk_f32":
        ops.insert(2, _lit_hex(inst.literal))
    if n == "v_fmaak_f32":
        ops.append(_lit_hex(inst.literal))
    if n == "v_accvgpr_mov_b32":
        ops = [operand_text(256 + inst.vdst, acc=True), operand_text(inst.src0, acc=True)]
    text = f"{name} " + ", ".join(ops) if ops else name
    mods = []
    if inst.fmt == "VOP3":
        if inst.opsel:
            if n in ("v_permlane16_swap_b32", "v_permlane32_swap_b32"):
                if inst.opsel & 2:
                    mods.append("bound_ctrl:1")
                if inst.opsel & 1:
                    mods.append("fi:1")
            elif n.startswith("v_cvt_sr_"):
                mods.append("op_sel:[" + ",".join(str(inst.opsel >> i & 1) for i in range(4)) + "]")
            else:
                bits = [inst.opsel >> i & 1 for i in range(nsrc)] + [inst.opsel >> 3 & 1]
                mods.append("op_sel:[" + ",".join(map(str, bits)) + "]")
        if inst.clamp:
            mods.append("clamp")
        if n in ("v_bitop3_b32", "v_bitop3_b16"):
            mods.append(f"bitop3:0x{bitop3(inst):x}")
        elif inst.omod:
            mods.append({1: "mul:2", 2: "mul:4", 3: "div:2"}[inst.omod])
    if inst.sdwa is not None:
        s = inst.sdwa
        if inst.clamp:
            mods.append("clamp")
        if inst.omod:
            mods.append({1: "mul:2", 2: "mul:4", 3: "div:2"}[inst.omod])
        if short != "VOPC" and n not in _NO_DST_SEL:
            mods.append(f"dst_sel:{_SEL[s.dst_sel]}")
            mods.append(f"dst_unused:{_UNUSED.get(s.dst_unused, '?')}")
        mods.append(f"src0_sel:{_SEL[s.src0_sel]}")
        if nsrc > 1:
            mods.append(f"src1_sel:{_SEL[s.src1_sel]}")
    if inst.dpp is not None:
        mods.append(_dpp_text(inst.dpp))
    return text + (" " + " ".join(mods) if mods else "")


def _vop3_nsrc(name: str) -> int:
    two = {"v_add_f64", "v_mul_f64", "v_min_f64", "v_max_f64", "v_ldexp_f64", "v_mul_lo_u32",
           "v_mul_hi_u32", "v_mul_hi_i32", "v_ldexp_f32", "v_readlane_b32", "v_writelane_b32",
           "v_bcnt_u32_b32", "v_mbcnt_lo_u32_b32", "v_mbcnt_hi_u32_b32", "v_lshlrev_b64",
           "v_lshrrev_b64", "v_ashrrev_i64", "v_trig_preop_f64", "v_bfm_b32",
           "v_cvt_pknorm_i16_f32", "v_cvt_pknorm_u16_f32", "v_cvt_pkrtz_f16_f32",
           "v_cvt_pk_u16_u32", "v_cvt_pk_i16_i32", "v_cvt_pknorm_i16_f16",
           "v_cvt_pknorm_u16_f16", "v_add_i32", "v_sub_i32", "v_add_i16", "v_sub_i16",
           "v_pack_b32_f16", "v_mul_legacy_f32", "v_cvt_pk_fp8_f32", "v_cvt_pk_bf8_f32",
           "v_cvt_sr_fp8_f32", "v_cvt_sr_bf8_f32", "v_cvt_sr_f16_f32", "v_cvt_sr_bf16_f32",
           "v_cvt_pk_f16_f32", "v_cvt_pk_bf16_f32",
           "v_cvt_scalef32_pk_f32_fp8", "v_cvt_scalef32_pk_f32_bf8",
           "v_cvt_scalef32_f32_fp8", "v_cvt_scalef32_f32_bf8", "v_cvt_scalef32_pk_fp8_bf16",
           "v_cvt_scalef32_pk_bf8_bf16", "v_cvt_scalef32_pk_fp8_f16",
           "v_cvt_scalef32_pk_bf8_f16", "v_cvt_scalef32_pk_f16_fp8",
           "v_cvt_scalef32_pk_bf16_fp8"}
    return 2 if name in two else 3


def _dpp_text(d) -> str:
    c = d.ctrl
    if c <= 0xFF:
        s = "quad_perm:[" + ",".join(str(c >> (2 * i) & 3) for i in range(4)) + "]"
    elif 0x101 <= c <= 0x10F:
        s = f"row_shl:{c & 0xF}"
    elif 0x111 <= c <= 0x11F:
        s = f"row_shr:{c & 0xF}"
    elif 0x121 <= c <= 0x12F:
        s = f"row_ror:{c & 0xF}"
    else:
        s = {0x130: "wave_shl:1", 0x134: "wave_rol:1", 0x138: "wave_shr:1", 0x13C: "wave_ror:1",
             0x140: "row_mirror", 0x141: "row_half_mirror", 0x142: "row_bcast:15",
             0x143: "row_bcast:31"}.get(c, f"dpp_ctrl:0x{c:x}")
    s += f" row_mask:0x{d.row_mask:x} bank_mask:0x{d.bank_mask:x}"
    if d.bound_ctrl:
        s += " bound_ctrl:1"
    return s


def _render_vop3p(inst: Inst) -> str:
    n = inst.name
    dw, w0, w1, w2 = vop_widths(inst)
    nsrc = 2 if n in ("v_pk_mul_f32", "v_pk_add_f32", "v_pk_mov_b32", "v_pk_add_f16",
                      "v_pk_mul_f16", "v_pk_max_f16", "v_pk_min_f16", "v_pk_add_u16",
                      "v_pk_sub_u16", "v_pk_lshlrev_b16", "v_pk_lshrrev_b16",
                      "v_pk_ashrrev_i16", "v_pk_max_i16", "v_pk_min_i16", "v_pk_mul_lo_u16",
                      "v_pk_add_i16", "v_pk_sub_i16", "v_pk_max_u16", "v_pk_min_u16") else 3
    srcs = (inst.src0, inst.src1, inst.src2)
    widths = (w0, w1, w2)
    ops = [operand_text(256 + inst.vdst, dw)]
    for i in range(nsrc):
        ops.append(operand_text(srcs[i], widths[i], inst.literal))
    mods = []
    if inst.opsel:
        mods.append("op_sel:[" + ",".join(str(inst.opsel >> i & 1) for i in range(nsrc)) + "]")
    default_hi = (1 << nsrc) - 1
    if (inst.opsel_hi & default_hi) != default_hi:
        mods.append("op_sel_hi:[" + ",".join(str(inst.opsel_hi >> i & 1) for i in range(nsrc)) + "]")
    if inst.neg:
        mods.append("neg_lo:[" + ",".join(str(inst.neg >> i & 1) for i in range(nsrc)) + "]")
    if inst.neg_hi:
        mods.append("neg_hi:[" + ",".join(str(inst.neg_hi >> i & 1) for i in range(nsrc)) + "]")
    if inst.clamp:
        mods.append("clamp")
    return f"{n} " + ", ".join(ops) + (" " + " ".join(mods) if mods else "")


def _render_mai(inst: Inst) -> str:
    n = inst.name
    if n == "v_accvgpr_read_b32":
        return f"{n} {operand_text(256 + inst.vdst)}, {operand_text(inst.src0, 1, acc=True)}"
    if n == "v_accvgpr_write_b32":
        return f"{n} {operand_text(256 + inst.vdst, acc=True)}, {operand_text(inst.src0)}"
    a, b, cd = _mfma_regs(n, inst.cbsz, inst.blgp)
    ops = [operand_text(256 + inst.vdst, cd, acc=bool(inst.acc_cd)),
           operand_text(inst.src0, a, acc=bool(inst.acc & 1)),
           operand_text(inst.src1, b, acc=bool(inst.acc >> 1 & 1)),
           operand_text(inst.src2, cd, acc=bool(inst.acc_cd))]
    mods = []
    if inst.scale is not None:
        ops += [operand_text(inst.scale[0]), operand_text(inst.scale[1])]
        sel, sel_hi = inst.scale[2], inst.scale[3]
        if sel:
            mods.append("op_sel:[" + ",".join(str(sel >> i & 1) for i in range(3)) + "]")
        if sel_hi != 7:
            mods.append("op_sel_hi:[" + ",".join(str(sel_hi >> i & 1) for i in range(3)) + "]")
    if inst.cbsz:
        mods.append(f"cbsz:{inst.cbsz}")
    if inst.abid and inst.scale is None:
        mods.append(f"abid:{inst.abid}")
    if inst.blgp:
        mods.append(f"blgp:{inst.blgp}")
    return f"{n} " + ", ".join(ops) + (" " + " ".join(mods) if mods else "")


_DS_DATA_W = {"b32": 1, "b64": 2, "b96": 3, "b128": 4, "u8": 1, "i8": 1, "u16": 1, "i16": 1,
              "b8": 1, "b16": 1, "u32": 1, "i32": 1, "f32": 1, "u64": 2, "i64": 2, "f64": 2}


def _render_ds(inst: Inst) -> str:
    n = inst.name
    acc = bool(inst.acc)
    m = re.match(r"ds_(read|write)(2)?(st64)?_(\w+?)(_d16(_hi)?)?$", n)
    off2 = (f" offset0:{inst.offset0}" if inst.offset0 else "") + \
        (f" offset1:{inst.offset1}" if inst.offset1 else "")
    off = f" offset:{inst.offset}" if inst.offset else ""
    if n.startswith("ds_read_b64_tr") or n == "ds_read_b96_tr_b6":
        w = 3 if "b96" in n else 2
        return f"{n} {operand_text(inst.vdst, w, acc=acc)}, {operand_text(inst.addr)}{off}"
    if n in ("ds_bpermute_b32", "ds_permute_b32"):
        return f"{n} {operand_text(inst.vdst)}, {operand_text(inst.addr)}, " \
               f"{operand_text(inst.data0)}{off}"
    if n == "ds_swizzle_b32":
        return f"{n} {operand_text(inst.vdst)}, {operand_text(inst.addr)} offset:" \
               + _swizzle_text(inst.offset)
    if m:
        kind, two, _st, typ = m.group(1), m.group(2), m.group(3), m.group(4)
        w = _DS_DATA_W.get(typ, 1)
        if kind == "read":
            w = w * 2 if two else w
            o = off2 if two else off
            return f"{n} {operand_text(inst.vdst, w, acc=acc)}, {operand_text(inst.addr)}{o}"
        if two:
            return f"{n} {operand_text(inst.addr)}, {operand_text(inst.data0, w, acc=acc)}, " \
                   f"{operand_text(inst.data1, w, acc=acc)}{off2}"
        return f"{n} {operand_text(inst.addr)}, {operand_text(inst.data0, w, acc=acc)}{off}"
    return f"{n} {operand_text(inst.vdst)}, {operand_text(inst.addr)}, {operand_text(inst.data0)}{off}"


def _swizzle_text(off: int) -> str:
    if off & 0x8000:
        return "swizzle(QUAD_PERM," + ",".join(str(off >> (2 * i) & 3) for i in range(4)) + ")"
    and_m, or_m, xor_m = off & 0x1F, (off >> 5) & 0x1F, (off >> 10) & 0x1F
    if and_m == 0x1F and or_m == 0 and xor_m and xor_m & (xor_m - 1) == 0:
        return f"swizzle(SWAP,{xor_m})"
    if and_m == 0x1F and or_m == 0 and xor_m and (xor_m + 1) & xor_m == 0:
        return f"swizzle(REVERSE,{xor_m + 1})"
    mask = ""
    for bit in range(4, -1, -1):
        a, o, x = and_m >> bit & 1, or_m >> bit & 1, xor_m >> bit & 1
        mask += "p" if a and not x else "i" if a and x else "1" if o else "0"
    return f'swizzle(BITMASK_PERM,"{mask}")'


_MEM_W = {"dword": 1, "dwordx2": 2, "dwordx3": 3, "dwordx4": 4, "ubyte": 1, "sbyte": 1,
          "ushort": 1, "sshort": 1, "byte": 1, "short": 1, "format_x": 1}


def _mem_width(n: str) -> int:
    m = re.search(r"_(dwordx[234]|dword|ubyte|sbyte|ushort|sshort|byte|short|format_x)"
                  r"(_d16(_hi)?)?$", n)
    return _MEM_W.get(m.group(1), 1) if m else 1


def _render_flat(inst: Inst) -> str:
    n = inst.name
    w = _mem_width(n)
    acc = bool(inst.acc)
    saddr_off = inst.saddr == 0x7F or inst.seg == 0
    vaddr = operand_text(inst.addr, 2 if (saddr_off and inst.seg != 1) else 1)
    saddr = "" if inst.seg == 0 else (", off" if inst.saddr == 0x7F else
                                      f", {operand_text(inst.saddr, 2)}")
    mods = ""
    if inst.offset:
        mods += f" offset:{inst.offset}"
    mods += "".join(f" {k}" for k, v in (("sc0", inst.sc0), ("nt", inst.nt), ("sc1", inst.sc1)) if v)
    if "_lds_" in n:
        return f"{n} {vaddr}{saddr}{mods}"
    if "store" in n or "atomic" in n and not inst.sc0:
        return f"{n} {vaddr}, {operand_text(inst.data0, w, acc=acc)}{saddr}{mods}"
    return f"{n} {operand_text(inst.vdst, w, acc=acc)}, {vaddr}{saddr}{mods}"


def _render_mubuf(inst: Inst) -> str:
    n = inst.name
    w = _mem_width(n)
    acc = bool(inst.acc)
    if n in ("buffer_wbl2", "buffer_inv"):
        return n + "".join(f" {k}" for k, v in (("sc0", inst.sc0), ("sc1", inst.sc1)) if v)
    nv = (1 if inst.offen or inst.idxen else 0) + (1 if inst.offen and inst.idxen else 0)
    addr = (operand_text(inst.addr, nv) + ", ") if nv else "off, "
    soff = operand_text(inst.soffset)
    mods = ""
    if inst.idxen:
        mods += " idxen"
    if inst.offen:
        mods += " offen"
    if inst.offset:
        mods += f" offset:{inst.offset}"
    mods += "".join(f" {k}" for k, v in (("sc0", inst.sc0), ("nt", inst.nt), ("sc1", inst.sc1)) if v)
    if inst.lds:
        return f"{n} {addr}{operand_text(inst.srsrc, 4)}, {soff}{mods} lds"
    return f"{n} {operand_text(inst.data0, w, acc=acc)}, {addr}{operand_text(inst.srsrc, 4)}, {soff}{mods}"


__all__ = ["render", "vop_widths", "inline_int"]
