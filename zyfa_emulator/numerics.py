"""Number formats and rounding, vectorised over lanes with numpy.

Definitions follow AMD's CDNA4 ISA guide: bf16 conversion with round-to-nearest-even
(§7.3, V_CVT_PK_BF16_F32), OCP FP8 formats E4M3 (bias 7, max 448, NaN = S.1111.111, no
infinity) and E5M2 (bias 15, IEEE-like with infinity) with MODE.FP16_OVFL choosing
saturation (§7.3), fused multiply-add with a single rounding, and the MODE register's
FP_DENORM field (§3.5) for fp32 denormal flushing.

All functions take and return numpy arrays (or numpy scalars); float32 values travel as
their uint32 bit patterns where the exact bits matter.
"""

from __future__ import annotations

import numpy as np

F32, U32, I32, F64, U64 = np.float32, np.uint32, np.int32, np.float64, np.uint64


def bits_f32(x) -> np.ndarray:
    return np.asarray(x, dtype=F32).view(U32)


def f32_bits(u) -> np.ndarray:
    return np.asarray(u, dtype=U32).view(F32)


# --------------------------------------------------------------------------------------
# Denormals

def flush_f32(x):
    """fp32 denormals to a zero of the same sign."""
    x = np.asarray(x, dtype=F32)
    u = x.view(U32)
    den = ((u & 0x7F800000) == 0) & ((u & 0x007FFFFF) != 0)
    if not np.any(den):
        return x
    return np.where(den, (u & 0x80000000).view(F32), x)


def is_snan_f32(x) -> np.ndarray:
    u = np.asarray(x, dtype=F32).view(U32)
    return ((u & 0x7F800000) == 0x7F800000) & ((u & 0x007FFFFF) != 0) & ((u & 0x00400000) == 0)


def quiet_f32(x) -> np.ndarray:
    u = np.asarray(x, dtype=F32).view(U32)
    return (u | U32(0x00400000)).view(F32)


# --------------------------------------------------------------------------------------
# Fused multiply-add (fp32): one rounding.
#
# a*b is exact in float64 (24 + 24 bits < 53), the sum p + c is rounded to float64 with
# round-to-odd (two_sum gives the rounding error; an inexact even result is moved one
# ulp towards the exact value), and round-to-odd at 53 bits followed by
# round-to-nearest-even at 24 bits equals a single correct rounding.

def fma_f32(a, b, c) -> np.ndarray:
    a = np.asarray(a, dtype=F32).astype(F64)
    b = np.asarray(b, dtype=F32).astype(F64)
    c = np.asarray(c, dtype=F32).astype(F64)
    with np.errstate(all="ignore"):
        p = a * b
        s = p + c
        bb = s - p
        err = (p - (s - bb)) + (c - bb)
        finite = np.isfinite(s) & np.isfinite(err)
        su = s.view(U64) if s.ndim else np.asarray(s).view(U64)
        fix = finite & (err != 0) & ((su & U64(1)) == 0)
        if np.any(fix):
            s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return s.astype(F32)


# --------------------------------------------------------------------------------------
# bf16

def f32_to_bf16_bits(x) -> np.ndarray:
    """Round-to-nearest-even; NaN stays NaN (quieted)."""
    u = np.asarray(x, dtype=F32).view(U32)
    rounded = (u + U32(0x7FFF) + ((u >> U32(16)) & U32(1))) >> U32(16)
    nan = (u & U32(0x7FFFFFFF)) > U32(0x7F800000)
    if nan.any():
        rounded = np.where(nan, (u >> U32(16)) | U32(0x0040), rounded)
    return rounded.astype(U32)


def bf16_bits_to_f32(h) -> np.ndarray:
    return (np.asarray(h, dtype=U32) << 16).astype(U32).view(F32)


# --------------------------------------------------------------------------------------
# OCP FP8: E4M3 (fp8) and E5M2 (bf8)

class Fp8Format:
    def __init__(self, name: str, ebits: int, mbits: int, bias: int, has_inf: bool, max_value: float):
        self.name, self.ebits, self.mbits, self.bias = name, ebits, mbits, bias
        self.has_inf, self.max_value = has_inf, max_value
        self.min_exp = 1 - bias                       # exponent of the smallest normal
        self.nan_code = 0x7F if not has_inf else 0x7E  # E5M2 NaN: exponent all ones, mantissa != 0
        self.inf_code = 0x7C if has_inf else None
        self.max_code = self._encode_scalar(max_value)
        self.decode_table = np.array([self._decode_scalar(c) for c in range(256)], dtype=F32)

    def _encode_scalar(self, v: float) -> int:
        e = int(np.floor(np.log2(v)))
        m = int(round((v / 2.0 ** e - 1) * 2 ** self.mbits))
        return ((e + self.bias) << self.mbits) | m

    def _decode_scalar(self, code: int) -> float:
        s = -1.0 if code & 0x80 else 1.0
        e = (code >> self.mbits) & ((1 << self.ebits) - 1)
        m = code & ((1 << self.mbits) - 1)
        if self.has_inf and e == (1 << self.ebits) - 1:
            return s * np.inf if m == 0 else np.nan
        if not self.has_inf and e == (1 << self.ebits) - 1 and m == (1 << self.mbits) - 1:
            return np.nan
        if e == 0:
            return s * m * 2.0 ** (self.min_exp - self.mbits)
        return s * (1 + m / 2 ** self.mbits) * 2.0 ** (e - self.bias)

    def decode(self, codes) -> np.ndarray:
        """fp8 codes (any integer array, low 8 bits used) to float32, exactly."""
        return self.decode_table[np.asarray(codes).astype(np.int64) & 0xFF]

    def encode(self, x, saturate: bool) -> np.ndarray:
        """float32 to fp8 codes (uint32 in 0..255), round-to-nearest-even.

        Overflow (a rounded magnitude above the largest finite value, or an infinite
        input): with ``saturate`` (MODE.FP16_OVFL = 1) the largest finite value of the
        same sign; otherwise NaN for E4M3 and infinity for E5M2.  NaN stays NaN.
        """
        x = np.asarray(x, dtype=F32)
        sign = ((x.view(U32) >> 31) << 7).astype(U32)
        a = np.abs(x.astype(F64))
        nan = np.isnan(a)
        with np.errstate(all="ignore"):
            _, e2 = np.frexp(np.where(nan | np.isinf(a) | (a == 0), 1.0, a))
            exp = np.maximum(e2 - 1, self.min_exp)             # unbiased exponent, >= min normal
            quantum = np.ldexp(1.0, exp - self.mbits)
            r = np.rint(a / quantum) * quantum                   # ties to even
            over = (r > self.max_value) | np.isinf(a)
            _, e3 = np.frexp(np.where((r == 0) | over | nan, 1.0, r))
            rexp = e3 - 1
            normal = (rexp >= self.min_exp) & (r > 0)
            mant_n = np.rint((r / np.ldexp(1.0, rexp) - 1.0) * (1 << self.mbits)).astype(np.int64)
            code_n = ((rexp + self.bias) << self.mbits) | mant_n
            code_s = np.rint(r / np.ldexp(1.0, self.min_exp - self.mbits)).astype(np.int64)
            code = np.where(normal, code_n, code_s)
        if saturate:
            over_code = self.max_code
        else:
            over_code = self.inf_code if self.has_inf else self.nan_code
        code = np.where(over, over_code, code)
        code = np.where(nan, self.nan_code, code)
        return (code.astype(U32) | sign).astype(U32)


E4M3 = Fp8Format("e4m3", 4, 3, 7, has_inf=False, max_value=448.0)
E5M2 = Fp8Format("e5m2", 5, 2, 15, has_inf=True, max_value=57344.0)

#: MFMA F8F6F4 type selector (cbsz / blgp) -> format: 0 E4M3, 1 E5M2 (2..4: FP6/FP4).
FP8_FORMATS = {0: E4M3, 1: E5M2}


# --------------------------------------------------------------------------------------
# Small-float (FP6 / FP4, OCP MX) decoding for the F8F6F4 MFMAs

def _minifloat_table(ebits: int, mbits: int, bias: int) -> np.ndarray:
    out = []
    for code in range(1 << (1 + ebits + mbits)):
        s = -1.0 if code >> (ebits + mbits) else 1.0
        e = (code >> mbits) & ((1 << ebits) - 1)
        m = code & ((1 << mbits) - 1)
        v = m * 2.0 ** (1 - bias - mbits) if e == 0 else (1 + m / 2 ** mbits) * 2.0 ** (e - bias)
        out.append(s * v)
    return np.array(out, dtype=F32)


E2M3_TABLE = _minifloat_table(2, 3, 1)   # FP6 "fp6"
E3M2_TABLE = _minifloat_table(3, 2, 3)   # FP6 "bf6"
E2M1_TABLE = _minifloat_table(2, 1, 1)   # FP4


# --------------------------------------------------------------------------------------
# E8M0 block scales of the scaled MFMAs

def e8m0_to_f64(codes) -> np.ndarray:
    """E8M0 scale codes (low 8 bits used) to float64: 2^(code - 127), and NaN for 0xFF.

    CDNA4 ISA §7.2: the scale is an exponent offset encoded as an 8-bit exponent with
    bias 127, valid values -127..127, 0xFF is NaN.  There is no zero: 0x00 is 2^-127.
    """
    c = np.asarray(codes).astype(np.int64) & 0xFF
    return np.where(c == 0xFF, np.nan, np.ldexp(1.0, c - 127))
