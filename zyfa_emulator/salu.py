"""Scalar ALU and program-control semantics (SOP1, SOP2, SOPC, SOPK, SOPP).

Per-instruction definitions from the CDNA4 ISA guide, chapter 12 (§12.1-§12.5), on
Python integers: SGPRs hold 32-bit values, 64-bit operands are register pairs (low
word first), SCC is 0/1.
"""

from __future__ import annotations

from .errors import EmulatorError, registry
from .wave import BARRIER, CONST32, CONST64, DONE, MASK32

HANDLERS, handler = registry()
M64 = (1 << 64) - 1


def sread(w, inst, code: int) -> int:
    if code < 128:
        return w.s[code]
    c = CONST32[code]
    if c is not None:
        return c
    if code == 255:
        return inst.literal
    if code == 253:
        return w.scc
    if code == 252:
        return int(w.exec == 0)
    if code == 251:
        return int(w.vcc == 0)
    raise EmulatorError(f"{inst.where()}: scalar operand code {code} is not "
                        "supported")


def sread64(w, inst, code: int) -> int:
    if code < 128:
        return w.s[code] | w.s[code + 1] << 32
    c = CONST64[code]
    if c is not None:
        return c
    if code == 255:
        return inst.literal
    return sread(w, inst, code)


def swrite(w, inst, code: int, value: int) -> None:
    if code >= 128:
        w.fail(inst, f"scalar destination code {code} is not writable")
    w.s[code] = value & MASK32


def swrite64(w, inst, code: int, value: int) -> None:
    if code >= 127:
        w.fail(inst, f"scalar destination code {code} is not writable")
    w.s[code] = value & MASK32
    w.s[code + 1] = (value >> 32) & MASK32


def _i32(x: int) -> int:
    x &= MASK32
    return x - (1 << 32) if x >> 31 else x


def _i64(x: int) -> int:
    x &= M64
    return x - (1 << 64) if x >> 63 else x


# --------------------------------------------------------------------------------------
# SOP2

def _b32(fn):
    def run(w, inst):
        a, b = sread(w, inst, inst.ssrc0), sread(w, inst, inst.ssrc1)
        d = fn(a, b) & MASK32
        swrite(w, inst, inst.sdst, d)
        w.scc = int(d != 0)
    return run


def _b64(fn):
    def run(w, inst):
        a, b = sread64(w, inst, inst.ssrc0), sread64(w, inst, inst.ssrc1)
        d = fn(a, b) & M64
        swrite64(w, inst, inst.sdst, d)
        w.scc = int(d != 0)
    return run


for _n, _f in {"and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
               "andn2": lambda a, b: a & ~b, "orn2": lambda a, b: a | ~b,
               "nand": lambda a, b: ~(a & b), "nor": lambda a, b: ~(a | b),
               "xnor": lambda a, b: ~(a ^ b)}.items():
    HANDLERS[f"s_{_n}_b32"] = _b32(_f)
    HANDLERS[f"s_{_n}_b64"] = _b64(_f)

HANDLERS["s_lshl_b32"] = _b32(lambda a, b: a << (b & 31))
HANDLERS["s_lshr_b32"] = _b32(lambda a, b: a >> (b & 31))
HANDLERS["s_ashr_i32"] = _b32(lambda a, b: _i32(a) >> (b & 31))
HANDLERS["s_bfe_u32"] = _b32(lambda a, b: (a >> (b & 31)) & ((1 << ((b >> 16) & 0x7F)) - 1))
HANDLERS["s_absdiff_i32"] = _b32(lambda a, b: abs(_i32(a) - _i32(b)))


@handler("s_lshl_b64", "s_lshr_b64", "s_ashr_i64", "s_bfe_u64", "s_bfe_i64")
def _s_shift64(w, inst):
    a, b = sread64(w, inst, inst.ssrc0), sread(w, inst, inst.ssrc1)
    n = inst.name
    if n == "s_lshl_b64":
        d = a << (b & 63)
    elif n == "s_lshr_b64":
        d = a >> (b & 63)
    elif n == "s_ashr_i64":
        d = _i64(a) >> (b & 63)
    else:
        off, width = b & 63, (b >> 16) & 0x7F
        d = (a >> off) & ((1 << width) - 1)
        if n == "s_bfe_i64" and width and d >> (width - 1) & 1:
            d -= 1 << width
    d &= M64
    swrite64(w, inst, inst.sdst, d)
    w.scc = int(d != 0)


@handler("s_bfe_i32")
def _s_bfe_i32(w, inst):
    a, b = sread(w, inst, inst.ssrc0), sread(w, inst, inst.ssrc1)
    off, width = b & 31, (b >> 16) & 0x7F
    d = (a >> off) & ((1 << width) - 1)
    if width and d >> (width - 1) & 1:
        d -= 1 << width
    d &= MASK32
    swrite(w, inst, inst.sdst, d)
    w.scc = int(d != 0)


@handler("s_add_u32", "s_sub_u32", "s_addc_u32", "s_subb_u32")
def _s_add_u32(w, inst):
    a, b = sread(w, inst, inst.ssrc0), sread(w, inst, inst.ssrc1)
    n = inst.name
    cin = w.scc if n in ("s_addc_u32", "s_subb_u32") else 0
    if n in ("s_add_u32", "s_addc_u32"):
        r = a + b + cin
        w.scc = int(r >> 32 != 0)
    else:
        r = a - b - cin
        w.scc = int(r < 0)
    swrite(w, inst, inst.sdst, r)


@handler("s_add_i32", "s_sub_i32")
def _s_add_i32(w, inst):
    a, b = _i32(sread(w, inst, inst.ssrc0)), _i32(sread(w, inst, inst.ssrc1))
    r = a + b if inst.name == "s_add_i32" else a - b
    w.scc = int(not -(1 << 31) <= r < (1 << 31))
    swrite(w, inst, inst.sdst, r)


@handler("s_min_i32", "s_max_i32", "s_min_u32", "s_max_u32")
def _s_minmax(w, inst):
    a, b = sread(w, inst, inst.ssrc0), sread(w, inst, inst.ssrc1)
    if inst.name.endswith("i32"):
        a, b = _i32(a), _i32(b)
    pick_a = a < b if "_min_" in inst.name else a > b
    w.scc = int(pick_a)
    swrite(w, inst, inst.sdst, a if pick_a else b)


@handler("s_cselect_b32")
def _s_cselect_b32(w, inst):
    swrite(w, inst, inst.sdst, sread(w, inst, inst.ssrc0 if w.scc else inst.ssrc1))


@handler("s_cselect_b64")
def _s_cselect_b64(w, inst):
    swrite64(w, inst, inst.sdst, sread64(w, inst, inst.ssrc0 if w.scc else inst.ssrc1))


@handler("s_mul_i32")
def _s_mul_i32(w, inst):
    swrite(w, inst, inst.sdst, _i32(sread(w, inst, inst.ssrc0)) * _i32(sread(w, inst, inst.ssrc1)))


@handler("s_mul_hi_u32")
def _s_mul_hi_u32(w, inst):
    swrite(w, inst, inst.sdst, (sread(w, inst, inst.ssrc0) * sread(w, inst, inst.ssrc1)) >> 32)


@handler("s_mul_hi_i32")
def _s_mul_hi_i32(w, inst):
    swrite(w, inst, inst.sdst,
           (_i32(sread(w, inst, inst.ssrc0)) * _i32(sread(w, inst, inst.ssrc1))) >> 32)


@handler("s_bfm_b32")
def _s_bfm_b32(w, inst):
    a, b = sread(w, inst, inst.ssrc0), sread(w, inst, inst.ssrc1)
    swrite(w, inst, inst.sdst, ((1 << (a & 31)) - 1) << (b & 31))


@handler("s_bfm_b64")
def _s_bfm_b64(w, inst):
    a, b = sread(w, inst, inst.ssrc0), sread(w, inst, inst.ssrc1)
    swrite64(w, inst, inst.sdst, ((1 << (a & 63)) - 1) << (b & 63))


@handler("s_lshl1_add_u32", "s_lshl2_add_u32", "s_lshl3_add_u32", "s_lshl4_add_u32")
def _s_lshl_add(w, inst):
    n = int(inst.name[6])
    r = (sread(w, inst, inst.ssrc0) << n) + sread(w, inst, inst.ssrc1)
    w.scc = int(r >> 32 != 0)
    swrite(w, inst, inst.sdst, r)


@handler("s_pack_ll_b32_b16", "s_pack_lh_b32_b16", "s_pack_hh_b32_b16")
def _s_pack(w, inst):
    a, b = sread(w, inst, inst.ssrc0), sread(w, inst, inst.ssrc1)
    lo = a >> 16 if inst.name[7] == "h" else a & 0xFFFF
    hi = b >> 16 if inst.name[8] == "h" else b & 0xFFFF
    swrite(w, inst, inst.sdst, lo | hi << 16)


# --------------------------------------------------------------------------------------
# SOP1

@handler("s_mov_b32")
def _s_mov_b32(w, inst):
    swrite(w, inst, inst.sdst, sread(w, inst, inst.ssrc0))


@handler("s_mov_b64")
def _s_mov_b64(w, inst):
    swrite64(w, inst, inst.sdst, sread64(w, inst, inst.ssrc0))


@handler("s_cmov_b32")
def _s_cmov_b32(w, inst):
    if w.scc:
        swrite(w, inst, inst.sdst, sread(w, inst, inst.ssrc0))


@handler("s_cmov_b64")
def _s_cmov_b64(w, inst):
    if w.scc:
        swrite64(w, inst, inst.sdst, sread64(w, inst, inst.ssrc0))


@handler("s_not_b32")
def _s_not_b32(w, inst):
    d = ~sread(w, inst, inst.ssrc0) & MASK32
    swrite(w, inst, inst.sdst, d)
    w.scc = int(d != 0)


@handler("s_not_b64")
def _s_not_b64(w, inst):
    d = ~sread64(w, inst, inst.ssrc0) & M64
    swrite64(w, inst, inst.sdst, d)
    w.scc = int(d != 0)


@handler("s_abs_i32")
def _s_abs_i32(w, inst):
    d = abs(_i32(sread(w, inst, inst.ssrc0))) & MASK32
    swrite(w, inst, inst.sdst, d)
    w.scc = int(d != 0)


@handler("s_brev_b32")
def _s_brev_b32(w, inst):
    swrite(w, inst, inst.sdst, int(f"{sread(w, inst, inst.ssrc0):032b}"[::-1], 2))


@handler("s_bcnt1_i32_b32", "s_bcnt0_i32_b32", "s_bcnt1_i32_b64", "s_bcnt0_i32_b64")
def _s_bcnt(w, inst):
    wide = inst.name.endswith("b64")
    x = sread64(w, inst, inst.ssrc0) if wide else sread(w, inst, inst.ssrc0)
    n = bin(x).count("1")
    if "bcnt0" in inst.name:
        n = (64 if wide else 32) - n
    swrite(w, inst, inst.sdst, n)
    w.scc = int(n != 0)


@handler("s_ff1_i32_b32", "s_ff1_i32_b64", "s_ff0_i32_b32", "s_ff0_i32_b64")
def _s_ff(w, inst):
    wide = inst.name.endswith("b64")
    bits = 64 if wide else 32
    x = sread64(w, inst, inst.ssrc0) if wide else sread(w, inst, inst.ssrc0)
    if "ff0" in inst.name:
        x = ~x & ((1 << bits) - 1)
    swrite(w, inst, inst.sdst, (x & -x).bit_length() - 1 if x else MASK32)


@handler("s_flbit_i32_b32", "s_flbit_i32_b64")
def _s_flbit(w, inst):
    wide = inst.name.endswith("b64")
    bits = 64 if wide else 32
    x = sread64(w, inst, inst.ssrc0) if wide else sread(w, inst, inst.ssrc0)
    swrite(w, inst, inst.sdst, bits - x.bit_length() if x else MASK32)


@handler("s_sext_i32_i8", "s_sext_i32_i16")
def _s_sext(w, inst):
    bits = 8 if inst.name.endswith("i8") else 16
    x = sread(w, inst, inst.ssrc0) & ((1 << bits) - 1)
    if x >> (bits - 1):
        x -= 1 << bits
    swrite(w, inst, inst.sdst, x)


@handler("s_bitset0_b32", "s_bitset1_b32")
def _s_bitset(w, inst):
    bit = sread(w, inst, inst.ssrc0) & 31
    d = w.s[inst.sdst]
    d = d | (1 << bit) if inst.name == "s_bitset1_b32" else d & ~(1 << bit)
    swrite(w, inst, inst.sdst, d)


_SAVEEXEC = {
    "s_and_saveexec_b64": lambda s, e: s & e, "s_or_saveexec_b64": lambda s, e: s | e,
    "s_xor_saveexec_b64": lambda s, e: s ^ e, "s_andn2_saveexec_b64": lambda s, e: s & ~e,
    "s_orn2_saveexec_b64": lambda s, e: s | ~e, "s_nand_saveexec_b64": lambda s, e: ~(s & e),
    "s_nor_saveexec_b64": lambda s, e: ~(s | e), "s_xnor_saveexec_b64": lambda s, e: ~(s ^ e),
    "s_andn1_saveexec_b64": lambda s, e: ~s & e, "s_orn1_saveexec_b64": lambda s, e: ~s | e,
}


@handler(*_SAVEEXEC)
def _s_saveexec(w, inst):
    s = sread64(w, inst, inst.ssrc0)
    e = w.exec
    new = _SAVEEXEC[inst.name](s, e) & M64
    swrite64(w, inst, inst.sdst, e)
    w.exec = new
    w.scc = int(new != 0)


@handler("s_andn1_wrexec_b64", "s_andn2_wrexec_b64")
def _s_wrexec(w, inst):
    s = sread64(w, inst, inst.ssrc0)
    e = w.exec
    new = (~s & e if inst.name == "s_andn1_wrexec_b64" else s & ~e) & M64
    w.exec = new
    swrite64(w, inst, inst.sdst, new)
    w.scc = int(new != 0)


@handler("s_getpc_b64")
def _s_getpc(w, inst):
    swrite64(w, inst, inst.sdst, inst.pc + 4)


@handler("s_setpc_b64")
def _s_setpc(w, inst):
    w.pc = sread64(w, inst, inst.ssrc0)


@handler("s_swappc_b64")
def _s_swappc(w, inst):
    target = sread64(w, inst, inst.ssrc0)
    swrite64(w, inst, inst.sdst, inst.pc + 4)
    w.pc = target


# --------------------------------------------------------------------------------------
# SOPC

_CMP = {"eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}


def _cmp32(op, signed):
    fn = _CMP[op]

    def run(w, inst):
        a, b = sread(w, inst, inst.ssrc0), sread(w, inst, inst.ssrc1)
        if signed:
            a, b = _i32(a), _i32(b)
        w.scc = int(fn(a, b))
    return run


for _op in _CMP:
    HANDLERS[f"s_cmp_{_op}_i32"] = _cmp32(_op, True)
    HANDLERS[f"s_cmp_{_op}_u32"] = _cmp32(_op, False)


@handler("s_cmp_eq_u64", "s_cmp_lg_u64")
def _s_cmp64(w, inst):
    a, b = sread64(w, inst, inst.ssrc0), sread64(w, inst, inst.ssrc1)
    w.scc = int((a == b) if inst.name == "s_cmp_eq_u64" else (a != b))


@handler("s_bitcmp0_b32", "s_bitcmp1_b32", "s_bitcmp0_b64", "s_bitcmp1_b64")
def _s_bitcmp(w, inst):
    wide = inst.name.endswith("b64")
    a = sread64(w, inst, inst.ssrc0) if wide else sread(w, inst, inst.ssrc0)
    bit = sread(w, inst, inst.ssrc1) & (63 if wide else 31)
    v = a >> bit & 1
    w.scc = int(v == (1 if "bitcmp1" in inst.name else 0))


# --------------------------------------------------------------------------------------
# SOPK

def _simm(inst) -> int:
    v = inst.simm16
    return v - 0x10000 if v & 0x8000 else v


@handler("s_movk_i32")
def _s_movk(w, inst):
    swrite(w, inst, inst.sdst, _simm(inst))


@handler("s_cmovk_i32")
def _s_cmovk(w, inst):
    if w.scc:
        swrite(w, inst, inst.sdst, _simm(inst))


def _cmpk(op, signed):
    fn = _CMP[op]

    def run(w, inst):
        a = w.s[inst.sdst]
        if signed:
            a, b = _i32(a), _simm(inst)
        else:
            b = inst.simm16
        w.scc = int(fn(a, b))
    return run


for _op in _CMP:
    HANDLERS[f"s_cmpk_{_op}_i32"] = _cmpk(_op, True)
    HANDLERS[f"s_cmpk_{_op}_u32"] = _cmpk(_op, False)


@handler("s_addk_i32")
def _s_addk(w, inst):
    a = _i32(w.s[inst.sdst])
    r = a + _simm(inst)
    w.scc = int(not -(1 << 31) <= r < (1 << 31))
    swrite(w, inst, inst.sdst, r)


@handler("s_mulk_i32")
def _s_mulk(w, inst):
    swrite(w, inst, inst.sdst, _i32(w.s[inst.sdst]) * _simm(inst))


@handler("s_call_b64")
def _s_call(w, inst):
    swrite64(w, inst, inst.sdst, inst.pc + 4)
    w.pc = inst.pc + 4 + 4 * _simm(inst)


# Hardware registers (ISA §3.5 MODE, §3.? HW_ID).
HW_REG_MODE, HW_REG_STATUS, HW_REG_HW_ID = 1, 2, 4


def _hwreg_fields(simm: int) -> tuple[int, int, int]:
    return simm & 0x3F, (simm >> 6) & 0x1F, ((simm >> 11) & 0x1F) + 1


def _read_hwreg(w, inst, reg: int) -> int:
    if reg == HW_REG_MODE:
        return w.mode
    if reg == HW_REG_STATUS:
        return w.scc | (int(w.vcc == 0) << 1) | (int(w.exec == 0) << 9) | (w.prio & 3) << 3
    if reg == HW_REG_HW_ID:
        return (w.index & 0xF) | (w.wg.flat_index & 0xFFFF) << 16
    w.fail(inst, f"hardware register {reg} is not modelled")


@handler("s_getreg_b32")
def _s_getreg(w, inst):
    reg, off, size = _hwreg_fields(inst.simm16)
    val = (_read_hwreg(w, inst, reg) >> off) & ((1 << size) - 1)
    swrite(w, inst, inst.sdst, val)


def _set_hwreg(w, inst, value: int) -> None:
    reg, off, size = _hwreg_fields(inst.simm16)
    if reg != HW_REG_MODE:
        w.fail(inst, f"writes to hardware register {reg} are not modelled")
    mask = ((1 << size) - 1) << off
    mode = (w.mode & ~mask) | ((value << off) & mask)
    if mode & 0xF:
        w.fail(inst, "MODE.FP_ROUND other than round-to-nearest-even is not modelled")
    w.mode = mode & MASK32


@handler("s_setreg_b32")
def _s_setreg(w, inst):
    _set_hwreg(w, inst, w.s[inst.sdst])


@handler("s_setreg_imm32_b32")
def _s_setreg_imm(w, inst):
    _set_hwreg(w, inst, inst.literal)


# --------------------------------------------------------------------------------------
# SOPP

@handler("s_nop", "s_setprio", "s_sleep", "s_icache_inv", "s_incperflevel", "s_decperflevel",
         "s_ttracedata", "s_set_gpr_idx_off", "s_wakeup", "s_set_valu_coexec_mode")
def _s_nop(w, inst):
    if inst.name == "s_setprio":
        w.prio = inst.simm16 & 3


@handler("s_endpgm")
def _s_endpgm(w, inst):
    w.drain()          # s_endpgm implies s_waitcnt 0 (ISA §3.7)
    w.status = DONE


def _target(inst) -> int:
    return inst.pc + 4 + 4 * _simm(inst)


@handler("s_branch")
def _s_branch(w, inst):
    w.pc = _target(inst)


@handler("s_cbranch_scc0")
def _s_cbranch_scc0(w, inst):
    if not w.scc:
        w.pc = _target(inst)


@handler("s_cbranch_scc1")
def _s_cbranch_scc1(w, inst):
    if w.scc:
        w.pc = _target(inst)


@handler("s_cbranch_vccz")
def _s_cbranch_vccz(w, inst):
    if w.s[106] == 0 and w.s[107] == 0:
        w.pc = _target(inst)


@handler("s_cbranch_vccnz")
def _s_cbranch_vccnz(w, inst):
    if w.s[106] or w.s[107]:
        w.pc = _target(inst)


@handler("s_cbranch_execz")
def _s_cbranch_execz(w, inst):
    if w.s[126] == 0 and w.s[127] == 0:
        w.pc = _target(inst)


@handler("s_cbranch_execnz")
def _s_cbranch_execnz(w, inst):
    if w.s[126] or w.s[127]:
        w.pc = _target(inst)


@handler("s_barrier")
def _s_barrier(w, inst):
    # Waits for every wave of the workgroup that has not ended; waits on no counter.
    w.status = BARRIER


@handler("s_waitcnt")
def _s_waitcnt(w, inst):
    s = inst.simm16
    vm = (s & 0xF) | ((s >> 14) & 3) << 4
    lgkm = (s >> 8) & 0xF
    w.wait(vm, lgkm)


@handler("s_sethalt", "s_trap", "s_sendmsg", "s_sendmsghalt", "s_setkill")
def _s_unmodelled(w, inst):
    w.fail(inst, f"'{inst.name}' is not modelled (no trap handler, message or halt support)")
