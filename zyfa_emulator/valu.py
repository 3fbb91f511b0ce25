"""Vector ALU semantics (VOP1, VOP2, VOPC, VOP3, VOP3P without the matrix ops).

Each instruction computes on all 64 lanes at once (numpy) and writes its result under
EXEC.  Definitions are the per-instruction pseudocode of AMD's CDNA4 ISA guide
(chapter 12) together with the operand modifiers of chapter 6/13: VOP3 ``abs``/``neg``/
``omod``/``clamp``, VOP3P ``op_sel``/``op_sel_hi``/``neg_lo``/``neg_hi``, SDWA operand
selects and DPP lane permutations (§6.3), and MODE.FP_DENORM for fp32 denormals.

Numerical choices where the hardware is documented as approximate:

* ``v_exp_f32`` / ``v_log_f32`` (ISA: 1 ULP): computed in float64 and rounded once to
  float32, i.e. the correctly rounded exp2/log2 in almost all cases; ``v_exp_f32``
  flushes denormal results to +0 as the ISA states.
* ``v_rcp_f32``, ``v_rcp_iflag_f32``, ``v_rsq_f32``, ``v_sqrt_f32`` (ISA: 1 ULP): the
  correctly rounded float32 value.
* fused multiply-adds round once (``numerics.fma_f32``).
So emulated results can differ from hardware in the last bit of these operations.
"""

from __future__ import annotations

import os

import numpy as np

from . import numerics as nx
from .errors import EmulatorError, UnsupportedInstruction, registry
from .render import bitop3 as bitop3_table
from .wave import (
    CONST32,
    CONST64,
    CONST64F,
    F32,
    F64,
    I32,
    I64,
    LANES,
    MASK32,
    U32,
    U64,
    bool_to_mask,
    mask_to_bool,
)

HANDLERS, handler = registry()


# --------------------------------------------------------------------------------------
# Operand access

def read32(w, inst, code: int):
    """Raw 32-bit value of a source operand: uint32[64] (VGPR) or a numpy uint32 scalar."""
    if code >= 256:
        return w.v[code - 256]
    if code < 128:
        return U32(w.s[code])
    c = CONST32[code]
    if c is not None:
        return U32(c)
    if code == 255:
        return U32(inst.literal)
    if code == 253:
        return U32(w.scc)
    if code == 252:
        return U32(int(w.exec == 0))
    if code == 251:
        return U32(int(w.vcc == 0))
    raise EmulatorError(f"{inst.where()}: operand code {code} is not supported")


def read64(w, inst, code: int, fp: bool = False):
    """64-bit source: uint64[64] (VGPR pair) or numpy uint64 scalar."""
    if code >= 256:
        r = code - 256
        return w.v[r].astype(U64) | (w.v[r + 1].astype(U64) << U64(32))
    if code < 128:
        return U64(w.s[code] | w.s[code + 1] << 32)
    c = (CONST64F if fp else CONST64)[code]
    if c is not None:
        return U64(c)
    if code == 255:
        return U64(inst.literal << 32 if fp else inst.literal)
    raise EmulatorError(f"{inst.where()}: operand code {code} is not a "
                        "64-bit operand")


def to_u32(r) -> np.ndarray:
    """Low 32 bits of an integer/bool result, or the bits of a 32-bit float."""
    r = np.asarray(r)
    if r.dtype == U32:
        return r
    if r.dtype.itemsize == 4:
        return r.view(U32)
    if r.dtype == np.bool_:
        return r.astype(U32)
    return (r.astype(U64) & U64(MASK32)).astype(U32)


def write32(w, inst, row: int, value, wmask=None) -> None:
    """A 32-bit result (any 32-bit dtype, array or scalar) into VGPR ``row`` under EXEC."""
    value = np.asarray(value)
    if value.dtype != U32:
        value = value.view(U32) if value.dtype.itemsize == 4 else value.astype(U32)
    if wmask is None and w.exec_full():
        w.v[row] = value
    else:
        np.copyto(w.v[row], value, where=w.execmask() if wmask is None else wmask)


def write64(w, inst, row: int, value, wmask=None) -> None:
    value = np.asarray(value)
    if value.dtype != U64:
        value = value.view(U64) if value.dtype.itemsize == 8 else value.astype(U64)
    lo = (value & U64(MASK32)).astype(U32)
    hi = (value >> U64(32)).astype(U32)
    if wmask is None and w.exec_full():
        w.v[row] = lo
        w.v[row + 1] = hi
    else:
        m = w.execmask() if wmask is None else wmask
        np.copyto(w.v[row], lo, where=m)
        np.copyto(w.v[row + 1], hi, where=m)


# --------------------------------------------------------------------------------------
# SDWA and DPP

def _sdwa_select(x, sel: int, sext: int):
    x = np.asarray(x, dtype=U32)
    if sel == 6:
        return x
    if sel <= 3:
        v = (x >> U32(8 * sel)) & U32(0xFF)
        if sext:
            v = ((v ^ U32(0x80)) - U32(0x80)).astype(U32)
        return v
    v = (x >> U32(16 * (sel - 4))) & U32(0xFFFF)
    if sext:
        v = ((v ^ U32(0x8000)) - U32(0x8000)).astype(U32)
    return v


def _sdwa_dst(w, row: int, value, sdwa):
    value = np.asarray(value)
    if value.dtype != U32:
        value = value.view(U32) if value.dtype.itemsize == 4 else value.astype(U32)
    sel, unused = sdwa.dst_sel, sdwa.dst_unused
    if sel == 6:
        return value
    old = w.v[row]
    if sel <= 3:
        shift, width = 8 * sel, 8
    else:
        shift, width = 16 * (sel - 4), 16
    field = (value & U32((1 << width) - 1)) << U32(shift)
    fmask = U32(((1 << width) - 1) << shift)
    if unused == 2:       # UNUSED_PRESERVE
        return (old & ~fmask) | field
    if unused == 1:       # UNUSED_SEXT: sign-extend the field to the bits above it
        top = (value >> U32(width - 1)) & U32(1)
        above = U32((0xFFFFFFFF << (shift + width)) & MASK32)
        return field | np.where(top.astype(bool), above, U32(0)).astype(U32)
    return field          # UNUSED_PAD


def _dpp_sources(ctrl: int) -> np.ndarray:
    lane = LANES
    row = lane & ~15
    if ctrl <= 0xFF:
        sel = np.array([(ctrl >> (2 * i)) & 3 for i in range(4)])
        return (lane & ~3) | sel[lane & 3]
    if 0x101 <= ctrl <= 0x10F:
        n = ctrl & 0xF
        src = lane + n
        return np.where((src & ~15) == row, src, -1)
    if 0x111 <= ctrl <= 0x11F:
        n = ctrl & 0xF
        src = lane - n
        return np.where((src >= 0) & ((src & ~15) == row), src, -1)
    if 0x121 <= ctrl <= 0x12F:
        n = ctrl & 0xF
        return row | ((lane - n) & 15)
    if ctrl == 0x130:
        return np.where(lane < 63, lane + 1, -1)
    if ctrl == 0x134:
        return (lane + 1) % 64
    if ctrl == 0x138:
        return np.where(lane > 0, lane - 1, -1)
    if ctrl == 0x13C:
        return (lane - 1) % 64
    if ctrl == 0x140:
        return row | (15 - (lane & 15))
    if ctrl == 0x141:
        return (lane & ~7) | (7 - (lane & 7))
    if ctrl == 0x142:
        return np.where(lane >= 16, row - 1, -1)
    if ctrl == 0x143:
        return np.where(lane >= 32, 31, -1)
    raise ValueError(f"reserved DPP control 0x{ctrl:x}")


_DPP_CACHE: dict = {}


def dpp_read(w, inst, row: int):
    """(values, write mask) of a DPP-permuted source VGPR."""
    d = inst.dpp
    src = _DPP_CACHE.get(d.ctrl)
    if src is None:
        try:
            src = _DPP_CACHE[d.ctrl] = _dpp_sources(d.ctrl)
        except ValueError as e:
            w.fail(inst, str(e))
    ex = w.execmask()
    valid = (src >= 0)
    srcc = np.where(valid, src, 0)
    valid = valid & ex[srcc]
    vals = w.v[row][srcc]
    lane = LANES
    enabled = ((d.row_mask >> (lane >> 4)) & 1).astype(bool) & \
        ((d.bank_mask >> ((lane >> 2) & 3)) & 1).astype(bool)
    if d.bound_ctrl:
        vals = np.where(valid, vals, U32(0)).astype(U32)
        wmask = ex & enabled
    else:
        wmask = ex & enabled & valid
    return vals, wmask


# --------------------------------------------------------------------------------------
# Generic VALU executor

class Spec:
    __slots__ = ("ins", "out", "fn", "fp")

    def __init__(self, ins: str, out: str, fn, fp: bool = True):
        self.ins, self.out, self.fn, self.fp = ins, out, fn, fp


SPECS: dict[str, Spec] = {}
CMP_SPECS: dict[str, Spec] = {}


def _mods(inst):
    """(abs bits, neg bits) of the instruction's source modifiers."""
    if inst.sdwa is not None:
        s = inst.sdwa
        return s.src0_abs | s.src1_abs << 1, s.src0_neg | s.src1_neg << 1
    if inst.dpp is not None:
        d = inst.dpp
        return d.src0_abs | d.src1_abs << 1, d.src0_neg | d.src1_neg << 1
    return inst.abs, inst.neg


def _denorm_in(w) -> bool:
    return ((w.mode >> 4) & 3) in (0, 2)


def _denorm_out(w) -> bool:
    return ((w.mode >> 4) & 3) in (0, 1)


def read_typed(w, inst, k: int, t: str, abs_bits: int, neg_bits: int, fp: bool):
    """Source ``k`` as type ``t``; returns (value, write mask from DPP or None)."""
    code = (inst.src0, inst.src1, inst.src2)[k]
    wmask = None
    if t in "UIF":
        x = read64(w, inst, code, fp=(t == "F"))
        if t == "I":
            x = x.view(I64) if isinstance(x, np.ndarray) else I64(np.int64(x.view(I64)))
        elif t == "F":
            x = x.view(F64)
            if abs_bits >> k & 1:
                x = np.abs(x)
            if neg_bits >> k & 1:
                x = -x
        return x, None
    if k == 0 and inst.dpp is not None:
        x, wmask = dpp_read(w, inst, code - 256)
    else:
        x = read32(w, inst, code)
    if inst.sdwa is not None and k < 2:
        s = inst.sdwa
        sel, sext = (s.src0_sel, s.src0_sext) if k == 0 else (s.src1_sel, s.src1_sext)
        if sel != 6:
            if t == "f":
                w.fail(inst, "SDWA sub-dword selects on an fp32 operand are not modelled")
            x = _sdwa_select(x, sel, sext)
    if t == "f":
        x = x.view(F32)
        if abs_bits >> k & 1:
            x = np.abs(x)
        if neg_bits >> k & 1:
            x = -x
        if fp and _denorm_in(w):
            x = nx.flush_f32(x)
    elif t == "i":
        x = x.view(I32)
    return x, wmask


def _finish_float(w, inst, r):
    r = np.asarray(r, dtype=F32)
    if inst.omod:
        r = (r * F32({1: 2.0, 2: 4.0, 3: 0.5}[inst.omod])).astype(F32)
    if inst.clamp:
        r = np.where(np.isnan(r), F32(0), np.clip(r, F32(0), F32(1))).astype(F32)
    return r


def _cvt_pk_u8(a, b, c):
    a = np.asarray(a, F32)
    # ZYFA_EMULATOR_CVT_U8=truncate models the other reading of flt32_to_uint8 (round toward
    # zero), to test code that must work under either until a hardware run settles it
    rnd = np.trunc if os.environ.get("ZYFA_EMULATOR_CVT_U8") == "truncate" else np.rint
    byte = np.where(np.isnan(a), F32(0), np.clip(rnd(a), F32(0), F32(255))).astype(U32)
    shift = (np.asarray(b, U32) & U32(3)) * U32(8)
    return (np.asarray(c, U32) & ~(U32(0xFF) << shift)) | (byte << shift)


def exec_generic(w, inst) -> None:
    spec = SPECS[inst.name]
    if (inst.clamp or inst.omod) and spec.out not in "fdF":
        w.fail(inst, "clamp/omod on an integer result is not modelled")
    abs_bits, neg_bits = _mods(inst)
    args = []
    wmask = None
    for k, t in enumerate(spec.ins):
        x, wm = read_typed(w, inst, k, t, abs_bits, neg_bits, spec.fp)
        if wm is not None:
            wmask = wm
        args.append(x)
    if spec.out == "d":   # accumulate into the destination (v_fmac/v_mac)
        d = w.vf[inst.vdst]
        if spec.fp and _denorm_in(w):
            d = nx.flush_f32(d)
        args.append(d)
    r = spec.fn(*args)
    out = spec.out
    if out in "fd":
        r = _finish_float(w, inst, r)
        if spec.fp and _denorm_out(w):
            r = nx.flush_f32(r)
        r = r.view(U32)
    elif out in "UIF":
        if out == "F":
            r = np.asarray(r, dtype=F64)
        write64(w, inst, inst.vdst, r, wmask)
        return
    else:
        r = to_u32(r)
    if inst.sdwa is not None:
        r = _sdwa_dst(w, inst.vdst, r, inst.sdwa)
    write32(w, inst, inst.vdst, r, wmask)


def exec_cmp(w, inst) -> None:
    spec = CMP_SPECS[inst.name]
    abs_bits, neg_bits = _mods(inst)
    a, _ = read_typed(w, inst, 0, spec.ins[0], abs_bits, neg_bits, spec.fp)
    b, _ = read_typed(w, inst, 1, spec.ins[1], abs_bits, neg_bits, spec.fp)
    res = np.broadcast_to(np.asarray(spec.fn(a, b), dtype=bool), (64,)) & w.execmask()
    m = bool_to_mask(res)
    if inst.name.startswith("v_cmpx_"):
        w.exec = m
    sdst = inst.sdst
    if sdst is not None and sdst < 128:
        w.sset64(sdst, m)


# --------------------------------------------------------------------------------------
# Operation tables

def _fmax(a, b, ieee=True):
    a = np.asarray(a, dtype=F32)
    b = np.asarray(b, dtype=F32)
    an, bn = np.isnan(a), np.isnan(b)
    if not (an.any() or bn.any()):
        r = np.maximum(a, b)
        zero = (a == 0) & (b == 0)
        if zero.any():     # +0 beats -0: the sign bit survives only if both are -0
            r = np.where(zero, (a.view(U32) & b.view(U32)).view(F32), r)
        return r
    r = np.where(a >= b, a, b)
    both_zero = (a == 0) & (b == 0)
    r = np.where(both_zero, np.where(np.signbit(a), b, a), r)
    r = np.where(bn, a, r)
    r = np.where(an, b, r)
    if ieee:
        r = np.where(nx.is_snan_f32(b), nx.quiet_f32(b), r)
        r = np.where(nx.is_snan_f32(a), nx.quiet_f32(a), r)
    return r.astype(F32)


def _fmin(a, b, ieee=True):
    a = np.asarray(a, dtype=F32)
    b = np.asarray(b, dtype=F32)
    an, bn = np.isnan(a), np.isnan(b)
    if not (an.any() or bn.any()):
        r = np.minimum(a, b)
        zero = (a == 0) & (b == 0)
        if zero.any():     # -0 beats +0: the sign bit survives if either is -0
            r = np.where(zero, (a.view(U32) | b.view(U32)).view(F32), r)
        return r
    r = np.where(a <= b, a, b)
    both_zero = (a == 0) & (b == 0)
    r = np.where(both_zero, np.where(np.signbit(a), a, b), r)
    r = np.where(bn, a, r)
    r = np.where(an, b, r)
    if ieee:
        r = np.where(nx.is_snan_f32(b), nx.quiet_f32(b), r)
        r = np.where(nx.is_snan_f32(a), nx.quiet_f32(a), r)
    return r.astype(F32)


def _maximum(a, b):
    """IEEE 754-2019 maximum: NaN if either is NaN, +0 > -0."""
    a = np.asarray(a, dtype=F32)
    b = np.asarray(b, dtype=F32)
    r = np.where(a > b, a, b)
    both_zero = (a == 0) & (b == 0)
    r = np.where(both_zero, np.where(np.signbit(a), b, a), r)
    r = np.where(np.isnan(a), nx.quiet_f32(a), np.where(np.isnan(b), nx.quiet_f32(b), r))
    return r.astype(F32)


def _minimum(a, b):
    a = np.asarray(a, dtype=F32)
    b = np.asarray(b, dtype=F32)
    r = np.where(a < b, a, b)
    both_zero = (a == 0) & (b == 0)
    r = np.where(both_zero, np.where(np.signbit(a), a, b), r)
    r = np.where(np.isnan(a), nx.quiet_f32(a), np.where(np.isnan(b), nx.quiet_f32(b), r))
    return r.astype(F32)


def _med3(a, b, c):
    return _fmax(_fmin(a, b), _fmin(_fmax(a, b), c))


def _exp2(x):
    with np.errstate(all="ignore"):
        r = np.exp2(np.asarray(x, dtype=F32).astype(F64)).astype(F32)
    return nx.flush_f32(np.where(r == 0, F32(0), r))


def _log2(x):
    x = nx.flush_f32(np.asarray(x, dtype=F32))
    with np.errstate(all="ignore"):
        return np.log2(x.astype(F64)).astype(F32)


def _rcp(x):
    with np.errstate(all="ignore"):
        return (F32(1) / np.asarray(x, dtype=F32)).astype(F32)


def _rsq(x):
    with np.errstate(all="ignore"):
        return (1.0 / np.sqrt(np.asarray(x, dtype=F32).astype(F64))).astype(F32)


def _sqrt(x):
    with np.errstate(all="ignore"):
        return np.sqrt(np.asarray(x, dtype=F32))


def _cvt_u32_f32(x):
    x = np.asarray(x, dtype=F32).astype(F64)
    with np.errstate(all="ignore"):
        t = np.trunc(np.nan_to_num(x, nan=0.0, posinf=4294967295.0, neginf=0.0))
    return np.clip(t, 0, 4294967295.0).astype(np.int64).astype(U32)


def _cvt_i32_f32(x):
    x = np.asarray(x, dtype=F32).astype(F64)
    with np.errstate(all="ignore"):
        t = np.trunc(np.nan_to_num(x, nan=0.0, posinf=2147483647.0, neginf=-2147483648.0))
    return np.clip(t, -2147483648.0, 2147483647.0).astype(np.int64).astype(I32).view(U32)


def _u24(x):
    return np.asarray(x, dtype=U32) & U32(0xFFFFFF)


def _i24(x):
    v = (np.asarray(x, dtype=U32) & U32(0xFFFFFF)).astype(np.int64)
    return np.where(v >= 0x800000, v - 0x1000000, v)


def _sh(b):
    return np.asarray(b, dtype=U32) & U32(31)


def _u64(x):
    return np.asarray(x, dtype=U32).astype(U64)


def _div_fixup(q, d, n):
    """V_DIV_FIXUP_F32 D = fixup(S0 = quotient, S1 = denominator, S2 = numerator)."""
    q, d, n = (np.asarray(x, dtype=F32) for x in (q, d, n))
    sign = np.signbit(d) ^ np.signbit(n)
    inf = np.where(sign, F32(-np.inf), F32(np.inf))
    zero = np.where(sign, F32(-0.0), F32(0.0))
    ed = (d.view(U32) >> 23) & 0xFF
    en = (n.view(U32) >> 23) & 0xFF
    r = np.where(sign, -np.abs(q), np.abs(q))
    r = np.where(ed == 255, inf, r)                                   # OVERFLOW_F32
    r = np.where(en.astype(np.int64) - ed.astype(np.int64) < -150, zero, r)   # UNDERFLOW_F32
    r = np.where((np.abs(d) == np.inf) | (n == 0), zero, r)
    r = np.where((d == 0) | (np.abs(n) == np.inf), inf, r)
    r = np.where((np.abs(d) == np.inf) & (np.abs(n) == np.inf), F32(np.nan), r)
    r = np.where((d == 0) & (n == 0), U32(0xFFC00000).view(F32), r)
    r = np.where(np.isnan(d), nx.quiet_f32(d), r)
    r = np.where(np.isnan(n), nx.quiet_f32(n), r)
    return r.astype(F32)


def _f32(fn):
    def run(*a):
        with np.errstate(invalid="ignore", over="ignore"):   # IEEE results (inf - inf = NaN)
            return np.asarray(fn(*a), dtype=F32)
    return run


def _define():
    S = SPECS
    # float arithmetic
    S["v_add_f32"] = Spec("ff", "f", _f32(lambda a, b: a + b))
    S["v_sub_f32"] = Spec("ff", "f", _f32(lambda a, b: a - b))
    S["v_subrev_f32"] = Spec("ff", "f", _f32(lambda a, b: b - a))
    S["v_mul_f32"] = Spec("ff", "f", _f32(lambda a, b: a * b))
    S["v_mul_legacy_f32"] = Spec("ff", "f", _f32(lambda a, b: np.where((a == 0) | (b == 0), F32(0), a * b)))
    S["v_fma_f32"] = Spec("fff", "f", nx.fma_f32)
    S["v_fmac_f32"] = Spec("ff", "d", nx.fma_f32)
    S["v_max_f32"] = Spec("ff", "f", _fmax)
    S["v_min_f32"] = Spec("ff", "f", _fmin)
    S["v_max3_f32"] = Spec("fff", "f", lambda a, b, c: _fmax(_fmax(a, b), c))
    S["v_min3_f32"] = Spec("fff", "f", lambda a, b, c: _fmin(_fmin(a, b), c))
    S["v_med3_f32"] = Spec("fff", "f", _med3)
    S["v_maximum3_f32"] = Spec("fff", "f", lambda a, b, c: _maximum(_maximum(a, b), c))
    S["v_minimum3_f32"] = Spec("fff", "f", lambda a, b, c: _minimum(_minimum(a, b), c))
    S["v_exp_f32"] = Spec("f", "f", _exp2)
    S["v_log_f32"] = Spec("f", "f", _log2)
    S["v_rcp_f32"] = Spec("f", "f", _rcp)
    S["v_rcp_iflag_f32"] = Spec("f", "f", _rcp)
    S["v_rsq_f32"] = Spec("f", "f", _rsq)
    S["v_sqrt_f32"] = Spec("f", "f", _sqrt)
    S["v_trunc_f32"] = Spec("f", "f", _f32(np.trunc))
    S["v_floor_f32"] = Spec("f", "f", _f32(np.floor))
    S["v_ceil_f32"] = Spec("f", "f", _f32(np.ceil))
    S["v_rndne_f32"] = Spec("f", "f", _f32(np.rint))
    S["v_fract_f32"] = Spec("f", "f", _f32(lambda a: np.minimum(a - np.floor(a), F32(0.99999994))))
    S["v_ldexp_f32"] = Spec("fi", "f", _f32(lambda a, e: np.ldexp(a, np.clip(e, -1000, 1000))))
    S["v_div_fixup_f32"] = Spec("fff", "f", _div_fixup)
    # moves and bit ops
    S["v_mov_b32"] = Spec("b", "b", lambda a: a, fp=False)
    S["v_not_b32"] = Spec("u", "u", lambda a: ~np.asarray(a, dtype=U32), fp=False)
    S["v_bfrev_b32"] = Spec("u", "u", lambda a: _bitrev(a), fp=False)
    S["v_and_b32"] = Spec("uu", "u", lambda a, b: a & b, fp=False)
    S["v_or_b32"] = Spec("uu", "u", lambda a, b: a | b, fp=False)
    S["v_xor_b32"] = Spec("uu", "u", lambda a, b: a ^ b, fp=False)
    S["v_xnor_b32"] = Spec("uu", "u", lambda a, b: ~(a ^ b), fp=False)
    S["v_lshlrev_b32"] = Spec("uu", "u", lambda a, b: np.asarray(b, dtype=U32) << _sh(a), fp=False)
    S["v_lshrrev_b32"] = Spec("uu", "u", lambda a, b: np.asarray(b, dtype=U32) >> _sh(a), fp=False)
    S["v_ashrrev_i32"] = Spec("ui", "i", lambda a, b: np.asarray(b, dtype=I32) >> _sh(a).astype(I32), fp=False)
    S["v_add_u32"] = Spec("uu", "u", lambda a, b: a + b, fp=False)
    S["v_sub_u32"] = Spec("uu", "u", lambda a, b: a - b, fp=False)
    S["v_subrev_u32"] = Spec("uu", "u", lambda a, b: b - a, fp=False)
    S["v_mul_lo_u32"] = Spec("uu", "u", lambda a, b: ((_u64(a) * _u64(b)) & U64(MASK32)).astype(U32), fp=False)
    S["v_mul_hi_u32"] = Spec("uu", "u", lambda a, b: ((_u64(a) * _u64(b)) >> U64(32)).astype(U32), fp=False)
    S["v_mul_hi_i32"] = Spec("ii", "u", lambda a, b: ((np.asarray(a, I64) * np.asarray(b, I64)) >> 32).astype(U32), fp=False)
    S["v_mul_u32_u24"] = Spec("uu", "u", lambda a, b: ((_u24(a).astype(U64) * _u24(b).astype(U64)) & U64(MASK32)).astype(U32), fp=False)
    S["v_mul_hi_u32_u24"] = Spec("uu", "u", lambda a, b: ((_u24(a).astype(U64) * _u24(b).astype(U64)) >> U64(32)).astype(U32), fp=False)
    S["v_mul_i32_i24"] = Spec("uu", "u", lambda a, b: ((_i24(a) * _i24(b)) & MASK32).astype(U32), fp=False)
    S["v_mad_u32_u24"] = Spec("uuu", "u", lambda a, b, c: ((_u24(a).astype(U64) * _u24(b).astype(U64) + _u64(c)) & U64(MASK32)).astype(U32), fp=False)
    S["v_mad_i32_i24"] = Spec("uuu", "u", lambda a, b, c: ((_i24(a) * _i24(b) + _u64(c).astype(np.int64)) & MASK32).astype(U32), fp=False)
    S["v_min_i32"] = Spec("ii", "i", np.minimum, fp=False)
    S["v_max_i32"] = Spec("ii", "i", np.maximum, fp=False)
    S["v_min_u32"] = Spec("uu", "u", np.minimum, fp=False)
    S["v_max_u32"] = Spec("uu", "u", np.maximum, fp=False)
    S["v_med3_i32"] = Spec("iii", "i", lambda a, b, c: np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c)), fp=False)
    S["v_med3_u32"] = Spec("uuu", "u", lambda a, b, c: np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c)), fp=False)
    S["v_min3_i32"] = Spec("iii", "i", lambda a, b, c: np.minimum(np.minimum(a, b), c), fp=False)
    S["v_max3_i32"] = Spec("iii", "i", lambda a, b, c: np.maximum(np.maximum(a, b), c), fp=False)
    S["v_min3_u32"] = Spec("uuu", "u", lambda a, b, c: np.minimum(np.minimum(a, b), c), fp=False)
    S["v_max3_u32"] = Spec("uuu", "u", lambda a, b, c: np.maximum(np.maximum(a, b), c), fp=False)
    S["v_bfe_u32"] = Spec("uuu", "u", lambda a, b, c: _bfe_u32(a, b, c), fp=False)
    S["v_bfe_i32"] = Spec("uuu", "u", lambda a, b, c: _bfe_i32(a, b, c), fp=False)
    S["v_bfi_b32"] = Spec("uuu", "u", lambda a, b, c: (a & b) | (~np.asarray(a, U32) & c), fp=False)
    S["v_bfm_b32"] = Spec("uu", "u", lambda a, b: ((U32(1) << _sh(a)) - U32(1)).astype(U32) << _sh(b), fp=False)
    S["v_and_or_b32"] = Spec("uuu", "u", lambda a, b, c: (a & b) | c, fp=False)
    S["v_or3_b32"] = Spec("uuu", "u", lambda a, b, c: a | b | c, fp=False)
    S["v_xad_u32"] = Spec("uuu", "u", lambda a, b, c: (a ^ b) + c, fp=False)
    S["v_lshl_or_b32"] = Spec("uuu", "u", lambda a, b, c: (np.asarray(a, U32) << _sh(b)) | c, fp=False)
    S["v_lshl_add_u32"] = Spec("uuu", "u", lambda a, b, c: (np.asarray(a, U32) << _sh(b)) + c, fp=False)
    S["v_add_lshl_u32"] = Spec("uuu", "u", lambda a, b, c: (np.asarray(a + b, U32)) << _sh(c), fp=False)
    S["v_add3_u32"] = Spec("uuu", "u", lambda a, b, c: a + b + c, fp=False)
    S["v_alignbit_b32"] = Spec("uuu", "u", lambda a, b, c: (((_u64(a) << U64(32)) | _u64(b)) >> (_u64(c) & U64(31))).astype(U32), fp=False)
    S["v_alignbyte_b32"] = Spec("uuu", "u", lambda a, b, c: (((_u64(a) << U64(32)) | _u64(b)) >> ((_u64(c) & U64(3)) * U64(8))).astype(U32), fp=False)
    S["v_perm_b32"] = Spec("uuu", "u", lambda a, b, c: _perm(a, b, c), fp=False)
    S["v_bcnt_u32_b32"] = Spec("uu", "u", lambda a, b: _popcount(a) + b, fp=False)
    # conversions
    S["v_cvt_f32_u32"] = Spec("u", "f", lambda a: np.asarray(a, dtype=U32).astype(F32), fp=False)
    S["v_cvt_f32_i32"] = Spec("i", "f", lambda a: np.asarray(a, dtype=I32).astype(F32), fp=False)
    S["v_cvt_u32_f32"] = Spec("f", "u", _cvt_u32_f32)
    S["v_cvt_i32_f32"] = Spec("f", "u", _cvt_i32_f32)
    S["v_cvt_f32_ubyte0"] = Spec("u", "f", lambda a: (np.asarray(a, U32) & U32(0xFF)).astype(F32), fp=False)
    S["v_cvt_f32_ubyte1"] = Spec("u", "f", lambda a: ((np.asarray(a, U32) >> U32(8)) & U32(0xFF)).astype(F32), fp=False)
    S["v_cvt_f32_ubyte2"] = Spec("u", "f", lambda a: ((np.asarray(a, U32) >> U32(16)) & U32(0xFF)).astype(F32), fp=False)
    S["v_cvt_f32_ubyte3"] = Spec("u", "f", lambda a: (np.asarray(a, U32) >> U32(24)).astype(F32), fp=False)
    S["v_cvt_f32_bf16"] = Spec("u", "f", lambda a: nx.bf16_bits_to_f32(np.asarray(a, U32) & U32(0xFFFF)), fp=False)
    # flt32_to_uint8 (CDNA4 ISA, V_CVT_PK_U8_F32): rounds per MODE.FP_ROUND (nearest-even
    # here) and saturates to [0, 255]; NaN gives 0.  The byte goes to byte S1[1:0] of S2.
    S["v_cvt_pk_u8_f32"] = Spec("fuu", "u", lambda a, b, c: _cvt_pk_u8(a, b, c))
    S["v_cvt_pk_bf16_f32"] = Spec("ff", "u", lambda a, b: nx.f32_to_bf16_bits(a) | (nx.f32_to_bf16_bits(b) << U32(16)), fp=False)
    # 64-bit
    S["v_mov_b64"] = Spec("U", "U", lambda a: a, fp=False)
    S["v_lshl_add_u64"] = Spec("UuU", "U", lambda a, b, c: (np.asarray(a, U64) << (np.asarray(b, U32) & U32(7)).astype(U64)) + c, fp=False)
    S["v_lshlrev_b64"] = Spec("uU", "U", lambda a, b: np.asarray(b, U64) << (np.asarray(a, U32) & U32(63)).astype(U64), fp=False)
    S["v_lshrrev_b64"] = Spec("uU", "U", lambda a, b: np.asarray(b, U64) >> (np.asarray(a, U32) & U32(63)).astype(U64), fp=False)
    S["v_ashrrev_i64"] = Spec("uI", "I", lambda a, b: np.asarray(b, I64) >> (np.asarray(a, U32) & U32(63)).astype(I64), fp=False)
    S["v_add_f64"] = Spec("FF", "F", lambda a, b: a + b)
    S["v_mul_f64"] = Spec("FF", "F", lambda a, b: a * b)
    S["v_cvt_f64_f32"] = Spec("f", "F", lambda a: np.asarray(a, F32).astype(F64))
    S["v_cvt_f32_f64"] = Spec("F", "f", lambda a: np.asarray(a, F64).astype(F32))
    S["v_cvt_f64_i32"] = Spec("i", "F", lambda a: np.asarray(a, I32).astype(F64), fp=False)
    S["v_cvt_f64_u32"] = Spec("u", "F", lambda a: np.asarray(a, U32).astype(F64), fp=False)


def _bitrev(a):
    a = np.asarray(a, dtype=U32)
    b = a.view(np.uint8) if a.ndim else np.array([a], U32).view(np.uint8)
    r = np.unpackbits(b, bitorder="little").reshape(-1, 32)[:, ::-1]
    out = np.packbits(r, axis=1, bitorder="little").view(U32).reshape(-1)
    return out if a.ndim else out[0]


def _popcount(a):
    a = np.asarray(a, dtype=U32)
    return np.bitwise_count(a).astype(U32)


def _bfe_u32(a, b, c):
    off, width = _sh(b), _sh(c)
    mask = ((U64(1) << width.astype(U64)) - U64(1)).astype(U32)
    return (np.asarray(a, U32) >> off) & mask


def _bfe_i32(a, b, c):
    off, width = _sh(b).astype(np.int64), _sh(c).astype(np.int64)
    v = (np.asarray(a, U32).astype(np.int64) >> off) & ((np.int64(1) << width) - 1)
    sign = np.where(width > 0, (v >> np.maximum(width - 1, 0)) & 1, 0)
    v = np.where(sign.astype(bool), v - (np.int64(1) << width), v)
    return (v & MASK32).astype(U32)


def _perm(a, b, c):
    data = (_u64(a) << U64(32)) | _u64(b)
    sel = np.asarray(c, dtype=U32)
    out = np.zeros(np.broadcast(data, sel).shape, dtype=U32)
    for i in range(4):
        s = ((sel >> U32(8 * i)) & U32(0xFF)).astype(np.int64)
        byte = ((data >> (np.minimum(s, 7) * 8).astype(U64)) & U64(0xFF)).astype(U32)
        byte = np.where(s == 12, U32(0), np.where(s >= 13, U32(0xFF), byte))
        sign_src = {8: 15, 9: 31, 10: 47, 11: 63}
        for k, bit in sign_src.items():
            sb = ((data >> U64(bit)) & U64(1)).astype(U32) * U32(0xFF)
            byte = np.where(s == k, sb, byte)
        out |= byte.astype(U32) << U32(8 * i)
    return out


_define()


# Comparisons (VOPC and their VOP3 forms).
def _define_cmp():
    fcmp = {
        "f": lambda a, b: np.zeros(np.broadcast(a, b).shape, bool),
        "lt": lambda a, b: a < b, "eq": lambda a, b: a == b, "le": lambda a, b: a <= b,
        "gt": lambda a, b: a > b, "lg": lambda a, b: (a < b) | (a > b),
        "ge": lambda a, b: a >= b, "o": lambda a, b: ~(np.isnan(a) | np.isnan(b)),
        "u": lambda a, b: np.isnan(a) | np.isnan(b), "nge": lambda a, b: ~(a >= b),
        "nlg": lambda a, b: ~((a < b) | (a > b)), "ngt": lambda a, b: ~(a > b),
        "nle": lambda a, b: ~(a <= b), "neq": lambda a, b: ~(a == b),
        "nlt": lambda a, b: ~(a < b), "tru": lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
    }
    icmp = {
        "f": fcmp["f"], "lt": fcmp["lt"], "eq": fcmp["eq"], "le": fcmp["le"], "gt": fcmp["gt"],
        "ne": lambda a, b: a != b, "ge": fcmp["ge"], "t": fcmp["tru"],
    }
    for x in ("cmp", "cmpx"):
        for op, fn in fcmp.items():
            CMP_SPECS[f"v_{x}_{op}_f32"] = Spec("ff", "m", fn)
            CMP_SPECS[f"v_{x}_{op}_f64"] = Spec("FF", "m", fn)
        for op, fn in icmp.items():
            CMP_SPECS[f"v_{x}_{op}_i32"] = Spec("ii", "m", fn, fp=False)
            CMP_SPECS[f"v_{x}_{op}_u32"] = Spec("uu", "m", fn, fp=False)
            CMP_SPECS[f"v_{x}_{op}_i64"] = Spec("II", "m", fn, fp=False)
            CMP_SPECS[f"v_{x}_{op}_u64"] = Spec("UU", "m", fn, fp=False)


_define_cmp()

for _name in SPECS:
    HANDLERS[_name] = exec_generic
for _name in CMP_SPECS:
    HANDLERS[_name] = exec_cmp


# --------------------------------------------------------------------------------------
# Instructions with their own shape

@handler("v_nop")
def _v_nop(w, inst):
    pass


@handler("v_fmamk_f32", "v_fmaak_f32")
def _v_fmamk(w, inst):
    k = U32(inst.literal).view(F32)
    a, _ = read_typed(w, inst, 0, "f", 0, 0, True)
    b, _ = read_typed(w, inst, 1, "f", 0, 0, True)
    r = nx.fma_f32(a, k, b) if inst.name == "v_fmamk_f32" else nx.fma_f32(a, b, k)
    if _denorm_out(w):
        r = nx.flush_f32(r)
    write32(w, inst, inst.vdst, r)


@handler("v_cndmask_b32")
def _v_cndmask(w, inst):
    abs_bits, neg_bits = _mods(inst)
    typ = "f" if (abs_bits | neg_bits) else "b"
    a, wm = read_typed(w, inst, 0, typ, abs_bits, neg_bits, False)
    b, _ = read_typed(w, inst, 1, typ, abs_bits, neg_bits, False)
    m = w.vcc if inst.fmt != "VOP3" else w.lane_mask(inst.src2)
    sel = mask_to_bool(m)
    r = np.where(sel, b, a)
    if inst.sdwa is not None:
        r = _sdwa_dst(w, inst.vdst, np.asarray(r).view(U32) if typ == "f" else r, inst.sdwa)
    write32(w, inst, inst.vdst, r, wm)


@handler("v_readfirstlane_b32")
def _v_readfirstlane(w, inst):
    ex = w.exec
    lane = (ex & -ex).bit_length() - 1 if ex else 0
    val = int(read32(w, inst, inst.src0)[lane]) if inst.src0 >= 256 else int(read32(w, inst, inst.src0))
    w.s[inst.vdst] = val


@handler("v_readlane_b32")
def _v_readlane(w, inst):
    lane = int(read32(w, inst, inst.src1)) & 63
    val = read32(w, inst, inst.src0)
    w.s[inst.vdst] = int(val[lane]) if isinstance(val, np.ndarray) else int(val)


@handler("v_writelane_b32")
def _v_writelane(w, inst):
    lane = int(read32(w, inst, inst.src1)) & 63
    w.v[inst.vdst, lane] = int(read32(w, inst, inst.src0))


@handler("v_mbcnt_lo_u32_b32", "v_mbcnt_hi_u32_b32")
def _v_mbcnt(w, inst):
    mask = int(read32(w, inst, inst.src0))
    bits = mask_to_bool(mask if inst.name.endswith("lo_u32_b32") else mask << 32)
    below = np.concatenate([[0], np.cumsum(bits)[:-1]]).astype(U32)
    if inst.name == "v_mbcnt_hi_u32_b32":
        below = np.where(LANES >= 32, below, 0).astype(U32)
    else:
        below = np.where(LANES < 32, below, np.sum(bits[:32])).astype(U32)
    write32(w, inst, inst.vdst, below + read32(w, inst, inst.src1))


@handler("v_swap_b32")
def _v_swap(w, inst):
    a, b = inst.vdst, inst.src0 - 256
    va, vb = w.v[a].copy(), w.v[b].copy()
    write32(w, inst, a, vb)
    write32(w, inst, b, va)


@handler("v_permlane16_swap_b32", "v_permlane32_swap_b32")
def _v_permlane_swap(w, inst):
    # ISA: swap src0's rows with vdst's other rows; ignores EXEC (whole rows move).
    d, s = inst.vdst, inst.src0 - 256
    if inst.src0 < 256:
        w.fail(inst, "permlane swap source must be a VGPR")
    vd, vs = w.v[d].copy(), w.v[s].copy()
    if inst.name == "v_permlane32_swap_b32":
        w.v[s, 0:32] = vd[32:64]
        w.v[d, 32:64] = vs[0:32]
    else:
        for p in (0, 32):
            w.v[s, p:p + 16] = vd[p + 16:p + 32]
            w.v[d, p + 16:p + 32] = vs[p:p + 16]


def _carry_dst(inst):
    return 106 if inst.fmt != "VOP3" else inst.sdst


@handler("v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32")
def _v_add_co(w, inst):
    a = _u64(read32(w, inst, inst.src0))
    b = _u64(read32(w, inst, inst.src1))
    if inst.name == "v_subrev_co_u32":
        a, b = b, a
    if inst.name == "v_add_co_u32":
        r = a + b
        carry = r >> U64(32)
    else:
        r = a - b
        carry = (a < b).astype(U64)
    write32(w, inst, inst.vdst, (r & U64(MASK32)).astype(U32))
    m = bool_to_mask(np.broadcast_to(carry.astype(bool), (64,)) & w.execmask())
    w.sset64(_carry_dst(inst), m)


@handler("v_addc_co_u32", "v_subb_co_u32", "v_subbrev_co_u32")
def _v_addc_co(w, inst):
    a = _u64(read32(w, inst, inst.src0))
    b = _u64(read32(w, inst, inst.src1))
    cin_mask = w.vcc if inst.fmt != "VOP3" else w.lane_mask(inst.src2)
    cin = mask_to_bool(cin_mask).astype(U64)
    if inst.name == "v_subbrev_co_u32":
        a, b = b, a
    if inst.name == "v_addc_co_u32":
        r = a + b + cin
        carry = r >> U64(32)
    else:
        r = a - b - cin
        carry = (a < b + cin).astype(U64)
    write32(w, inst, inst.vdst, (r & U64(MASK32)).astype(U32))
    m = bool_to_mask(np.broadcast_to(carry.astype(bool), (64,)) & w.execmask())
    w.sset64(_carry_dst(inst), m)


@handler("v_mad_u64_u32", "v_mad_i64_i32")
def _v_mad64(w, inst):
    # {carry, D} = S0 * S1 + S2 with 32-bit factors and a 64-bit addend (65-bit result).
    a = read32(w, inst, inst.src0)
    b = read32(w, inst, inst.src1)
    c = np.broadcast_to(read64(w, inst, inst.src2), (64,))
    if inst.name == "v_mad_u64_u32":
        p = np.broadcast_to(_u64(a) * _u64(b), (64,))      # exact: < 2**64
        r = p + c
        carry = r < p
    else:
        p = np.broadcast_to(np.asarray(a, U32).view(I32).astype(I64) *
                            np.asarray(b, U32).view(I32).astype(I64), (64,))
        ci = c.view(I64)
        with np.errstate(over="ignore"):
            r = (p.view(U64) + c).view(I64)
        carry = ((p >= 0) == (ci >= 0)) & ((r >= 0) != (p >= 0))   # signed overflow
        r = r.view(U64)
    write64(w, inst, inst.vdst, r)
    w.sset64(inst.sdst, bool_to_mask(carry & w.execmask()))


def _signed64(x) -> np.ndarray:
    x = np.broadcast_to(np.asarray(x, U32), (64,)).astype(I64)
    return np.where(x >= 1 << 31, x - (1 << 32), x)


@handler("v_add_i32", "v_sub_i32")
def _v_addsub_i32(w, inst):
    # VOP3A opcodes 668/669 (CDNA4 ISA chapter 12): D.i32 = S0.i32 + S1.i32 (resp. -),
    # no carry out.  Without clamp the result wraps (two's complement); with the VOP3
    # clamp bit it saturates to [-2**31, 2**31 - 1] -- LLVM selects exactly these with
    # clamp for llvm.sadd.sat / llvm.ssub.sat on gfx9 targets.
    if inst.omod:
        w.fail(inst, "omod on an integer result is not modelled")
    a = _signed64(read32(w, inst, inst.src0))
    b = _signed64(read32(w, inst, inst.src1))
    r = a + b if inst.name == "v_add_i32" else a - b
    if inst.clamp:
        r = np.clip(r, -(1 << 31), (1 << 31) - 1)
    write32(w, inst, inst.vdst, (r & MASK32).astype(U32))


def _exponent(x):
    return ((np.asarray(x, F32).view(U32) >> U32(23)) & U32(0xFF)).astype(np.int64)


def _is_denorm(x):
    u = np.asarray(x, F32).view(U32)
    return ((u & U32(0x7F800000)) == 0) & ((u & U32(0x7FFFFF)) != 0)


@handler("v_div_scale_f32")
def _v_div_scale(w, inst):
    abs_bits, neg_bits = _mods(inst)
    s0, _ = read_typed(w, inst, 0, "f", abs_bits, neg_bits, False)
    s1, _ = read_typed(w, inst, 1, "f", abs_bits, neg_bits, False)
    s2, _ = read_typed(w, inst, 2, "f", abs_bits, neg_bits, False)
    s0, s1, s2 = (np.broadcast_to(np.asarray(x, F32), (64,)) for x in (s0, s1, s2))
    with np.errstate(all="ignore"):
        d = s0.copy()
        vcc = np.zeros(64, bool)
        e1, e2 = _exponent(s1), _exponent(s2)
        quot = (s2 / s1).astype(F32)
        up = np.ldexp(s0, 64).astype(F32)
        down = np.ldexp(s0, -64).astype(F32)
        rcp_denorm = np.zeros(64, bool)   # 1/S1 as f64 denormal: impossible for an f32 S1
        c_nan = (s2 == 0) | (s1 == 0)
        c1 = ~c_nan & (e2 - e1 >= 96)
        c2 = ~c_nan & ~c1 & _is_denorm(s1)
        c3 = ~c_nan & ~c1 & ~c2 & rcp_denorm & _is_denorm(quot)
        c4 = ~c_nan & ~c1 & ~c2 & ~c3 & rcp_denorm
        c5 = ~c_nan & ~c1 & ~c2 & ~c3 & ~c4 & _is_denorm(quot)
        c6 = ~c_nan & ~c1 & ~c2 & ~c3 & ~c4 & ~c5 & (e2 <= 23)
        d = np.where(c_nan, F32(np.nan), d)
        vcc |= c1 | c3 | c5
        d = np.where((c1 | c3) & (s0 == s1), up, d)
        d = np.where(c2, up, d)
        d = np.where(c4, down, d)
        d = np.where(c5 & (s0 == s2), up, d)
        d = np.where(c6, up, d)
    write32(w, inst, inst.vdst, d.astype(F32))
    w.sset64(inst.sdst, bool_to_mask(vcc & w.execmask()))


@handler("v_div_fmas_f32")
def _v_div_fmas(w, inst):
    abs_bits, neg_bits = _mods(inst)
    a, _ = read_typed(w, inst, 0, "f", abs_bits, neg_bits, True)
    b, _ = read_typed(w, inst, 1, "f", abs_bits, neg_bits, True)
    c, _ = read_typed(w, inst, 2, "f", abs_bits, neg_bits, True)
    r = nx.fma_f32(a, b, c)
    scale = mask_to_bool(w.vcc)
    with np.errstate(all="ignore"):
        r = np.where(scale, (r.astype(F64) * 2.0 ** 32).astype(F32), r).astype(F32)
    r = _finish_float(w, inst, r)
    write32(w, inst, inst.vdst, r)


@handler("v_bitop3_b32")
def _v_bitop3(w, inst):
    table = bitop3_table(inst)
    a = np.asarray(read32(w, inst, inst.src0), U32)
    b = np.asarray(read32(w, inst, inst.src1), U32)
    c = np.asarray(read32(w, inst, inst.src2), U32)
    r = np.zeros(np.broadcast(a, b, c).shape, U32)
    for idx in range(8):
        if table >> idx & 1:
            ta = a if idx & 4 else ~a
            tb = b if idx & 2 else ~b
            tc = c if idx & 1 else ~c
            r |= ta & tb & tc
    write32(w, inst, inst.vdst, r)


# FP8 / BF8 conversions (CDNA4 ISA §7.3): OCP formats, RNE, MODE.FP16_OVFL saturation.

def _ovfl(w) -> bool:
    return bool(w.mode >> 23 & 1)


def _fp8_fmt(name: str):
    return nx.E5M2 if "bf8" in name else nx.E4M3


def _write_half(w, inst, pair):
    """Write a 16-bit pair of bytes into the half of vdst that opsel[3] selects (the other
    half keeps its value), as the packed FP8/BF8 conversions do."""
    old = w.v[inst.vdst]
    if inst.opsel >> 3 & 1:
        r = (old & U32(0x0000FFFF)) | (pair << U32(16))
    else:
        r = (old & U32(0xFFFF0000)) | pair
    write32(w, inst, inst.vdst, r)


@handler("v_ashr_pk_u8_i32", "v_ashr_pk_i8_i32")
def _v_ashr_pk(w, inst):
    # CDNA4 ISA chapter 12 (VOP3 opcodes 614 / 613): byte 0 = SAT8(S0.i32 >> S2[4:0]), byte 1 =
    # SAT8(S1.i32 >> S2[4:0]), an arithmetic shift; SAT8 saturates to [0, 255] (u8) or
    # [-128, 127] (i8).  The 16-bit result goes to the half of vdst that op_sel[3] selects.
    if inst.clamp or inst.omod or inst.opsel & 7 or inst.abs or inst.neg:
        w.fail(inst, "modifiers other than op_sel[3] are not modelled")
    lo_sat, hi_sat = (0, 255) if inst.name == "v_ashr_pk_u8_i32" else (-128, 127)
    shift = (np.asarray(read32(w, inst, inst.src2), U32) & U32(31)).astype(I64)

    def sat8(code):
        x = np.asarray(read32(w, inst, code), U32).view(I32).astype(I64) >> shift
        return (np.clip(x, lo_sat, hi_sat) & 0xFF).astype(U32)
    pair = np.broadcast_to(sat8(inst.src0) | (sat8(inst.src1) << U32(8)), (64,))
    _write_half(w, inst, pair)


@handler("v_cvt_pk_fp8_f32", "v_cvt_pk_bf8_f32")
def _v_cvt_pk_fp8(w, inst):
    abs_bits, neg_bits = _mods(inst)
    a, _ = read_typed(w, inst, 0, "f", abs_bits, neg_bits, False)
    b, _ = read_typed(w, inst, 1, "f", abs_bits, neg_bits, False)
    fmt = _fp8_fmt(inst.name)
    pair = fmt.encode(a, _ovfl(w)) | (fmt.encode(b, _ovfl(w)) << U32(8))
    _write_half(w, inst, pair)


@handler("v_cvt_sr_fp8_f32", "v_cvt_sr_bf8_f32")
def _v_cvt_sr_fp8(w, inst):
    abs_bits, neg_bits = _mods(inst)
    a, _ = read_typed(w, inst, 0, "f", abs_bits, neg_bits, False)
    rnd = np.asarray(read32(w, inst, inst.src1), U32)
    u = np.asarray(a, F32).view(U32)
    # Add the stochastic value to the mantissa (wrapping within it), then round.
    mant = ((u & U32(0x7FFFFF)) + (rnd >> U32(12))) & U32(0x7FFFFF)
    t = ((u & U32(0xFF800000)) | mant).view(F32)
    fmt = _fp8_fmt(inst.name)
    code = fmt.encode(t, _ovfl(w))
    byte = (inst.opsel >> 2) & 3
    old = w.v[inst.vdst]
    r = (old & U32(~(0xFF << (8 * byte)) & MASK32)) | (code << U32(8 * byte))
    write32(w, inst, inst.vdst, r)


@handler("v_cvt_f32_fp8", "v_cvt_f32_bf8")
def _v_cvt_f32_fp8(w, inst):
    x = np.asarray(read32(w, inst, inst.src0), U32)
    sel = 0
    if inst.sdwa is not None:
        sel = inst.sdwa.src0_sel & 3
    elif inst.fmt == "VOP3":
        sel = inst.opsel & 3
    code = (x >> U32(8 * sel)) & U32(0xFF)
    write32(w, inst, inst.vdst, _fp8_fmt(inst.name).decode(code))


@handler("v_cvt_pk_f32_fp8", "v_cvt_pk_f32_bf8")
def _v_cvt_pk_f32_fp8(w, inst):
    x = np.asarray(read32(w, inst, inst.src0), U32)
    word = 0
    if inst.sdwa is not None:
        word = 1 if inst.sdwa.src0_sel == 5 else 0
    elif inst.fmt == "VOP3":
        word = inst.opsel & 1
    half = (x >> U32(16 * word)) & U32(0xFFFF)
    fmt = _fp8_fmt(inst.name)
    write32(w, inst, inst.vdst, fmt.decode(half & U32(0xFF)))
    write32(w, inst, inst.vdst + 1, fmt.decode(half >> U32(8)))


def _scale_exp(w, inst, code):
    s = np.asarray(read32(w, inst, code), U32)
    return ((s >> U32(23)) & U32(0xFF)).astype(np.int64)


@handler("v_cvt_scalef32_pk_fp8_f32", "v_cvt_scalef32_pk_bf8_f32")
def _v_cvt_scalef32_pk_fp8(w, inst):
    # The scale operand's exponent field is an E8M0 scale; the conversion divides by it
    # (see the module notes in numerics; the direction follows the MX conversion rule).
    a, _ = read_typed(w, inst, 0, "f", 0, 0, False)
    b, _ = read_typed(w, inst, 1, "f", 0, 0, False)
    e = _scale_exp(w, inst, inst.src2)
    with np.errstate(all="ignore"):
        sa = np.ldexp(np.asarray(a, F32).astype(F64), 127 - e).astype(F32)
        sb = np.ldexp(np.asarray(b, F32).astype(F64), 127 - e).astype(F32)
    fmt = _fp8_fmt(inst.name)
    pair = fmt.encode(sa, _ovfl(w)) | (fmt.encode(sb, _ovfl(w)) << U32(8))
    _write_half(w, inst, pair)


@handler("v_cvt_scalef32_pk_f32_fp8", "v_cvt_scalef32_pk_f32_bf8")
def _v_cvt_scalef32_pk_f32_fp8(w, inst):
    x = np.asarray(read32(w, inst, inst.src0), U32)
    e = _scale_exp(w, inst, inst.src1)
    half = (x >> U32(16 * (inst.opsel & 1))) & U32(0xFFFF)
    fmt = _fp8_fmt(inst.name)
    with np.errstate(all="ignore"):
        lo = np.ldexp(fmt.decode(half & U32(0xFF)).astype(F64), e - 127).astype(F32)
        hi = np.ldexp(fmt.decode(half >> U32(8)).astype(F64), e - 127).astype(F32)
    write32(w, inst, inst.vdst, lo)
    write32(w, inst, inst.vdst + 1, hi)


# --------------------------------------------------------------------------------------
# VOP3P packed fp32 (CDNA4 ISA §12.10): op_sel picks the half of each 64-bit source
# feeding the low result, op_sel_hi the half feeding the high result; neg_lo/neg_hi
# negate the respective inputs.

def _pk_src(w, inst, k: int):
    code = (inst.src0, inst.src1, inst.src2)[k]
    if 128 <= code < 256 and code != 255:
        c = CONST32[code]
        if c is None:
            w.fail(inst, f"operand code {code} is not valid for a packed fp32 operation")
        lo = hi = U32(c)
        return lo, hi
    if code >= 256:
        r = code - 256
        return w.v[r], w.v[r + 1]
    return U32(w.s[code]), U32(w.s[code + 1])


def _pk_operands(w, inst, n: int, flt: bool = True):
    los, his = [], []
    for k in range(n):
        lo, hi = _pk_src(w, inst, k)
        sel_lo = hi if inst.opsel >> k & 1 else lo
        sel_hi = hi if inst.opsel_hi >> k & 1 else lo
        if flt:
            sel_lo = np.asarray(sel_lo).view(F32)
            sel_hi = np.asarray(sel_hi).view(F32)
            if inst.neg >> k & 1:
                sel_lo = -sel_lo
            if inst.neg_hi >> k & 1:
                sel_hi = -sel_hi
            if _denorm_in(w):
                sel_lo, sel_hi = nx.flush_f32(sel_lo), nx.flush_f32(sel_hi)
        los.append(sel_lo)
        his.append(sel_hi)
    return los, his


def _pk_write(w, inst, lo, hi):
    lo, hi = np.asarray(lo, F32), np.asarray(hi, F32)
    if inst.clamp:
        lo = np.where(np.isnan(lo), F32(0), np.clip(lo, F32(0), F32(1))).astype(F32)
        hi = np.where(np.isnan(hi), F32(0), np.clip(hi, F32(0), F32(1))).astype(F32)
    if _denorm_out(w):
        lo, hi = nx.flush_f32(lo), nx.flush_f32(hi)
    write32(w, inst, inst.vdst, lo)
    write32(w, inst, inst.vdst + 1, hi)


@handler("v_pk_fma_f32")
def _v_pk_fma(w, inst):
    lo, hi = _pk_operands(w, inst, 3)
    _pk_write(w, inst, nx.fma_f32(*lo), nx.fma_f32(*hi))


@handler("v_pk_mul_f32")
def _v_pk_mul(w, inst):
    lo, hi = _pk_operands(w, inst, 2)
    _pk_write(w, inst, lo[0] * lo[1], hi[0] * hi[1])


@handler("v_pk_add_f32")
def _v_pk_add(w, inst):
    lo, hi = _pk_operands(w, inst, 2)
    _pk_write(w, inst, lo[0] + lo[1], hi[0] + hi[1])


@handler("v_pk_mov_b32")
def _v_pk_mov(w, inst):
    # D.lo = S0[op_sel[0]], D.hi = S1[op_sel[1]] (ISA pseudocode).
    s0 = _pk_src(w, inst, 0)
    s1 = _pk_src(w, inst, 1)
    lo = s0[inst.opsel & 1]
    hi = s1[inst.opsel >> 1 & 1]
    lo, hi = np.array(lo, copy=True), np.array(hi, copy=True)
    write32(w, inst, inst.vdst, lo)
    write32(w, inst, inst.vdst + 1, hi)


def unsupported(w, inst):
    raise UnsupportedInstruction(f"{inst.where()} ({w.name()}): instruction "
                                 f"'{inst.name}' is not implemented by the emulator")


# --------------------------------------------------------------------------------------
# Fast paths: the plain forms (no SDWA/DPP, no VOP3 modifiers, 32-bit operands) of the
# generic and compare instructions get a closure with their operands resolved once.
# Same results as exec_generic / exec_cmp; modes that need denormal flushing fall back.

def _reader(inst, code: int, t: str):
    """A function w -> operand value of type t, or None when not a plain 32-bit operand."""
    if code >= 256:
        row = code - 256
        if t == "f":
            return lambda w: w.vf[row]
        if t == "i":
            return lambda w: w.v[row].view(I32)
        return lambda w: w.v[row]
    if code < 128:
        if t == "f":
            return lambda w: U32(w.s[code]).view(F32)
        if t == "i":
            return lambda w: U32(w.s[code]).view(I32)
        return lambda w: U32(w.s[code])
    c = CONST32[code]
    if code == 255:
        c = inst.literal
    if c is None:
        return None
    val = U32(c)
    val = val.view(F32) if t == "f" else val.view(I32) if t == "i" else val
    return lambda w: val


def _fast_generic(inst, spec):
    if inst.sdwa is not None or inst.dpp is not None or inst.abs or inst.neg or inst.omod \
            or inst.clamp or inst.vdst is None:
        return None
    if any(t not in "fuib" for t in spec.ins) or spec.out not in "fuibd":
        return None
    readers = [_reader(inst, code, t) for code, t in zip((inst.src0, inst.src1, inst.src2), spec.ins)]
    if any(r is None for r in readers):
        return None
    fn, dst, fp, out = spec.fn, inst.vdst, spec.fp, spec.out
    floaty = out in "fd"
    n = len(readers)
    r0 = readers[0]
    r1 = readers[1] if n > 1 else None
    r2 = readers[2] if n > 2 else None
    fallback = exec_generic

    def run(w, inst):
        if fp and (w.mode & 0x30) != 0x30:
            return fallback(w, inst)
        if n == 1:
            r = fn(r0(w))
        elif out == "d":
            r = fn(r0(w), r1(w), w.vf[dst])
        elif n == 2:
            r = fn(r0(w), r1(w))
        else:
            r = fn(r0(w), r1(w), r2(w))
        if floaty:
            if w.exec_full():
                w.vf[dst] = r
            else:
                np.copyto(w.vf[dst], r, where=w.execmask(), casting="unsafe")
        else:
            r = to_u32(r)
            if w.exec_full():
                w.v[dst] = r
            else:
                np.copyto(w.v[dst], r, where=w.execmask())
    return run


def _fast_cmp(inst, spec):
    if inst.sdwa is not None or inst.dpp is not None or inst.abs or inst.neg:
        return None
    if any(t not in "fuib" for t in spec.ins):
        return None
    r0 = _reader(inst, inst.src0, spec.ins[0])
    r1 = _reader(inst, inst.src1, spec.ins[1])
    sdst = inst.sdst
    if r0 is None or r1 is None or sdst is None or sdst >= 127:
        return None
    fn, fp, cmpx = spec.fn, spec.fp, inst.name.startswith("v_cmpx_")

    def run(w, inst):
        if fp and (w.mode & 0x30) != 0x30:
            return exec_cmp(w, inst)
        res = np.asarray(fn(r0(w), r1(w)))
        if res.ndim == 0:
            res = np.full(64, bool(res))
        m = bool_to_mask(res & w.execmask())
        if cmpx:
            w.exec = m
        w.s[sdst] = m & MASK32
        w.s[sdst + 1] = m >> 32
    return run


def specialize(inst):
    """A faster equivalent of ``inst.run`` for plain operand forms, or None."""
    if inst.run is exec_generic and inst.fmt in ("VOP1", "VOP2", "VOP3"):
        spec = SPECS.get(inst.name)
        if spec is not None:
            return _fast_generic(inst, spec)
    if inst.run is exec_cmp:
        return _fast_cmp(inst, CMP_SPECS[inst.name])
    return None
