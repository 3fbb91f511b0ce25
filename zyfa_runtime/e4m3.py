"""OCP e4m3 (``float8_e4m3fn``) in plain numpy, and the byte encodings of softmax P.

The format (OCP 8-bit floating point, E4M3): byte ``s eeee fff``, exponent bias 7.

* ``eeee = 0``:   subnormal, value ``(-1)^s * f * 2^-9``  (steps of 2^-9, up to 7 * 2^-9);
* ``eeee > 0``:   normal, value ``(-1)^s * 2^(eeee-7) * (1 + f/8)``;
* ``0x7F, 0xFF``: NaN (the only NaNs); there is no infinity; the largest finite value is
  ``0x7E = 448``.

Read as an unsigned integer, the code of a positive value is monotone in the value and
grows by 8 per doubling: ``value(8e + f) = 2^(e-7) * (1 + f/8)`` for ``e >= 1``.  That is
the whole idea of the "Lean P" byte below.

Everything here is exact: :func:`decode` and :func:`encode` use only float64 operations
that are exact for these values (``frexp``, ``ldexp``, ``rint``), not ml_dtypes.

P encodings (:func:`p_codes`).  A kernel holds, per score, the fp32 value ``y`` in *code
units*: ``y = 8 u + c0`` where ``u = t - m <= 0`` is the score minus the row's reference
max in log2 units and ``c0`` is the code of the P value that ``u = 0`` maps to (``c0 =
120 = 0x78 = 256.0`` for the usual shift of P by 2^8).  Every variant maps ``y`` to a byte
that decodes to an approximation of ``T(y) = 2^(y/8 - 7)`` (``= 256 * 2^u`` when ``c0 =
120``); values of ``y`` below -1024 (masked keys carry ``-inf``) give code 0.  Each
variant, its fp32 arithmetic (which the model reproduces bit for bit, and a kernel must
too) and its cost per element of P (the row max, ``v_max3_f32`` / FMNMX, and the row sum
are common to all and counted elsewhere):

``"lean"``       ``code = clamp(rint(y), 0, c0)``.
                 gfx950 (wave64 VALU issue slots): ``v_pk_fma_f32`` for ``(y + 1/2)
                 2^-141`` (1/2), an fp32 subnormal whose bits are ``rint(256 (y + 1/2))``,
                 and ``v_ashr_pk_u8_i32`` by 8 (1/2: two scores an instruction, both clamps
                 by its saturation and the sign bit) = 1: ``rint(y)`` with ``y`` held to 1/256
                 code (:func:`ashr_u8_codes`; ``v_pk_fma_f32`` + ``v_cvt_pk_u8_f32``, the
                 earlier form, is 1.5).  sm_90a: FFMA (y) + FMUL (x 2^-149:
                 the subnormal product's bits are ``rint(y)`` as an integer) + 1/2
                 ``I2IP.U8.S32.SAT`` (clamps and packs two) = 2 FMA-pipe + 0.5 ALU-pipe
                 instructions (the FMUL folds into the FFMA when 8c is a power of two).
                 The sm_90a kernels hold y to 1/8 code in f16 instead (:func:`lean_h2_codes`:
                 FFMA + 1/2 F2FP + 1/2 HFMA2 + 1/4 PRMT, two scores an instruction).
``"lean_quad"``  ``w = fp32(y/8 + 16)``, ``x = w - floor(w)`` (exact: the position inside
                 the binade), ``h = fp32(x*x - x)``, ``z = fp32(h * K + y)`` (FMAs, one
                 rounding each), ``code = clamp(rint(z), 0, c0)``: the linear mantissa
                 interpolation corrected by a quadratic.  gfx950: ``v_pk_fma_f32`` (y,
                 1/2), ``v_pk_fma_f32`` (w, 1/2), ``v_fract_f32`` (1), ``v_pk_fma_f32``
                 (h, 1/2), ``v_pk_fma_f32`` (z, 1/2), ``v_cvt_pk_u8_f32`` (1) = 4.
                 sm_90a: FFMA (y), FFMA (w), LOP3 (``w``'s low 19 mantissa bits into the
                 float ``1 + x/16``; w is in [16, 32) for every code that is not 0),
                 FFMA (``x = 16 * that - 16``, exact), FFMA (h), FFMA (z), FMUL (x 2^-149)
                 + 1/2 I2IP = 6 FMA-pipe + 1.5 ALU-pipe.  No transcendental on either.
                 The same byte folded into 4 FMA-pipe instructions (sm_90a's form,
                 :func:`quad_fold_codes`, ``Recipe.byte_form = "quad_fold"``): work in ``w =
                 y/8 + 16`` directly, ``w = fp32(S c + fp32(16 + c0/8 - m))`` (FFMA), ``f = 1 +
                 x/16`` (LOP3, as above), ``g = fp32(f A1 + A0)`` (FFMA), ``z = fp32(f g + w)``
                 (FFMA), ``code = clamp(rint(8 z + C), 0, c0)`` (FFMA ``z 2^-146 + C 2^-149``,
                 exact: the subnormal's bits are the integer).  ``8 z + C = y + K' (x^2 - x)``
                 with ``A1 = 32 K'``, ``A0 = -66 K'``, ``C = 272 K' - 128``; ``C = 621`` makes the
                 constant an integer, ``K' = 749/272`` (0.02 % from the minimax ``K``; the
                 quadratic's error grows by 2e-4 code units).  ``z`` lies near -70 (ulp 2^-17),
                 so the byte sees ~1e-4 code units of fp32 rounding: it is "lean_quad"'s byte but
                 for 1 in 10^4.  = 4 FMA-pipe + 1.5 ALU-pipe.
                 The same correction in half precision, two scores per instruction
                 (sm_90a's form since, :func:`quad_h2_codes`, ``Recipe.byte_form =
                 "quad_h2"``): ``w`` as above (FFMA), ``W = f16(w)`` (1/2 F2FP, two scores),
                 ``F = 1 + x/16`` (1/2 LOP3: ``W``'s low 6 mantissa bits under 1.0's
                 exponent), ``t1 = f16(F A - A) = A x / 16``, ``t2 = f16(F B - 17 B / 16) = B
                 (x - 1) / 16``, ``z = f16(t1 t2 + W)``, and ``code = rint(8 z - 128)`` as
                 the bits of the f16 subnormal ``sat(z 2^-21 - 2^-17)`` (HFMA2s, 1/2 each;
                 ``.sat`` clamps the negative codes to 0); PRMT packs four codes (1/4) =
                 2.5 FMA-pipe + 1.25 other.  ``8 z - 128 = y + K'' (x^2 - x)`` with ``K'' =
                 A B / 32``: ``B = 75/8`` (so that ``17 B / 16`` is an f16) and ``A`` the f16
                 nearest ``32 K / B`` make ``K''`` 0.03 % from the minimax ``K``.  ``W`` holds
                 ``y`` to 1/8 code unit (f16 in [16, 32): 4 bits of binade, 6 of ``x``) and
                 ``z`` rounds to the same grid, so the byte is "lean_quad"'s but for about 5 %
                 of bytes, one code away, where ``y`` lay within 1/8 of a rounding boundary:
                 the relative error of P grows from 2.66 % to 2.72 % RMS ("exact": 2.65 %).
``"exact"``      ``code = encode(T(y))``, nearest-even: what ``exp2`` followed by a hardware
                 FP8 conversion computes (AITER, FA3).  gfx950: ``v_pk_fma_f32`` (1/2) +
                 ``v_exp_f32`` (1, transcendental) + ``v_cvt_pk_fp8_f32`` (1/2) = 2 issue
                 slots, one transcendental.  sm_90a: FFMA + MUFU.EX2 (16 per clock per SM)
                 + 1/2 F2FP.  The model rounds the true ``T(y)``; hardware ``exp2`` is within
                 about 1 ulp of fp32, so a kernel's bytes can differ where ``T(y)`` lies
                 that close to an e4m3 rounding boundary.

Accuracy of "lean" (the bound the tests check).  For ``y >= 7.5`` write ``n = rint(y) =
8e + f`` (``f`` in 0..7).  Then ``value(n) / T(n) = (1 + f/8) / 2^(f/8) =: r_f`` (the
linear interpolation of the mantissa against the true ``2^(f/8)``; ``r_0 = 1``, the
largest is ``r_4 = 1.5 / sqrt 2``) and ``T(n) / T(y) = 2^((n - y)/8)`` with ``|n - y| <=
1/2``.  Hence

    2^(-1/16) <= value(rint(y)) / T(y) <= (1.5 / sqrt 2) * 2^(1/16),

a relative error in ``[-4.240 %, +10.762 %]``.  Both ends are attained: the lower at ``y =
8e + 1/2`` (a tie that rounds to the even code 8e), the upper at ``y = 8e + 3.5`` (a tie
that rounds to the even code 8e + 4).  The error is not zero-mean (about +4 %), which is
why zyfa divides by the sum of the rounded P.  For ``y < 7.5`` (``u < -14.0625`` when
``c0 = 120``) the codes are e4m3 subnormals, linear in the value, and ``|value - T| <
2^-6``, below 2^-14 of the ``u = 0`` value 256.

"exact" has ``|value / T - 1| <= 1/17`` for ``T >= 2^-6`` (the worst case is the tie ``T =
1.0625 * 2^e``) and an absolute error ``<= 2^-10`` below.

"lean_quad": with ``y = 8e + 8x`` the code whose linearly interpolated value is exactly
``T`` is ``8e + 8 (2^x - 1)``, i.e. ``y + 8 (2^x - 1 - x)``.  ``K (x^2 - x)`` with ``K = 8 *
0.34429`` is the minimax quadratic for that correction (which lies in [-0.689, 0]); it is
within 0.031 code units, so the byte is "exact"'s except where ``y`` is that close to a
rounding boundary (about 2 % of bytes, each then off by one code with an error just above
half a step): its error statistics match "exact"'s.
"""

from __future__ import annotations

import numpy as np

try:  # only to recognise ml_dtypes arrays in as_codes(); no arithmetic depends on it
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

__all__ = ["MAX", "NAN", "decode", "encode", "as_codes", "fma_f32", "p_codes", "lean_p_codes",
           "quad_fold_codes", "P_ROUNDINGS", "LEAN_BOUND", "LEAN_QUAD_K", "LEAN_CENTRE",
           "QUAD_FOLD_C", "QUAD_FOLD_K", "QUAD_FOLD_A1", "QUAD_FOLD_A0", "quad_h2_codes", "fma_f16",
           "QUAD_H2_A", "QUAD_H2_B", "QUAD_H2_B17", "QUAD_H2_K", "EXP2_U_MAX", "EXP2_U_ZERO",
           "exp2_x", "exp2_f16", "hi_lo_codes", "fma32", "ashr_u8_codes"]

MAX = 448.0  #: largest finite e4m3 value, code 0x7E
NAN = 0x7F   #: the NaN code this module produces

#: Exact relative-error range of the "lean" byte in the normal range (see the docstring).
LEAN_BOUND = (2.0 ** (-1 / 16) - 1.0, 1.5 / np.sqrt(2.0) * 2.0 ** (1 / 16) - 1.0)

#: The mean of value(rint(y)) / T(y) over y uniform (log-uniform P) is ``mean_f(r_f) * 8
#: (2^(1/16) - 2^(-1/16)) / ln 2`` (the average of ``2^(s/8)`` over the rounding
#: residual ``s`` in [-1/2, 1/2]), about 1.0404.  Subtracting ``8 log2`` of it (0.4567
#: code units, below 1/2 so the maximum keeps its code) from the FMA constant gives a
#: block's exact maximum the same bias as the other Lean bytes ("code_offset").
LEAN_CENTRE = float(8 * np.log2(np.mean([(1 + f / 8) / 2 ** (f / 8) for f in range(8)])
                                * 8 * (2 ** (1 / 16) - 2 ** (-1 / 16)) / np.log(2)))

#: Quadratic correction ``y + K * (x^2 - x)``: minimax fit of ``8 (2^x - 1 - x)`` on [0, 1].
LEAN_QUAD_K = np.float32(8 * 0.34429)

#: The folded quadratic byte (:func:`quad_fold_codes`): ``code = rint(8 z + QUAD_FOLD_C)`` with
#: ``z = w + f (f A1 + A0)``; ``C`` an integer, so ``K' = (128 + C) / 272`` is the K it realises.
QUAD_FOLD_C = 621
QUAD_FOLD_K = (128 + QUAD_FOLD_C) / 272
QUAD_FOLD_A1 = np.float32(32 * QUAD_FOLD_K)
QUAD_FOLD_A0 = np.float32(-66 * QUAD_FOLD_K)

#: The half-precision quadratic byte (:func:`quad_h2_codes`): ``t1 = A x/16``, ``t2 = B (x -
#: 1)/16``, ``K'' = A B / 32``.  ``B`` has 7 significant bits so that ``17 B / 16`` is an f16.
QUAD_H2_B = np.float16(75 / 8)
QUAD_H2_B17 = np.float16(75 / 8 * 17 / 16)
QUAD_H2_A = np.float16(32 * float(LEAN_QUAD_K) / float(QUAD_H2_B))
QUAD_H2_K = float(QUAD_H2_A) * float(QUAD_H2_B) / 32

#: The largest ``u`` :func:`exp2_x` takes (just below 9: x < 512, finite in f16); larger ones
#: are held at it.  Only scores of ``|T| >= 2^18`` can reach it.
EXP2_U_MAX = np.float32(9 - 2.0 ** -19)
#: Below this ``u`` (P under 2^-15 of the block max) :func:`exp2_x` is 0.
EXP2_U_ZERO = np.float32(-7)

#: Every P-rounding variant :func:`p_codes` knows.
P_ROUNDINGS = ("lean", "lean_quad", "exact")

_MAGNITUDES = np.concatenate([np.arange(8) * 2.0 ** -9,
                              [2.0 ** (e - 7) * (1 + f / 8) for e in range(1, 16) for f in range(8)]])
_MAGNITUDES[0x7F] = np.nan
#: float64 value of every code 0..255.
_TABLE = np.concatenate([_MAGNITUDES, -_MAGNITUDES])
_TABLE.setflags(write=False)


def decode(codes) -> np.ndarray:
    """The float64 value of each e4m3 code (uint8 array); NaN for 0x7F and 0xFF."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"decode takes uint8 codes, not {codes.dtype}")
    return _TABLE[codes]


def encode(x, *, saturate: bool) -> np.ndarray:
    """Round each value to e4m3, nearest with ties to even; returns uint8 codes.

    ``x`` is any real array (converted to float64 exactly from float16/32/bfloat16).
    NaN gives 0x7F.  A magnitude that rounds above 448 (anything above 464; 464 itself is
    a tie that rounds to 448) and +-inf give +-448 with ``saturate=True`` (CUDA
    ``satfinite``, AMD ``FP16_OVFL=1``) or the NaN code with the input's sign, 0x7F/0xFF,
    with ``saturate=False`` (the OCP non-saturating conversion).  ``-0.0`` gives 0x80.

    Method: with ``E = max(floor(log2|x|), -6)`` the code of ``|x|`` is
    ``rint(|x| * 2^(3 - E)) + 8 (E + 6)``: the first term is the mantissa including the
    hidden bit in units of the code step (8..16 for normals, 0..8 for subnormals), and a
    mantissa that rounds up to 16 carries into the exponent by the same integer addition.
    """
    x = np.asarray(x, dtype=np.float64)
    mag = np.abs(x)
    finite = np.isfinite(x)
    normalish = finite & (mag > 0)
    _, e2 = np.frexp(np.where(normalish, mag, 1.0))
    e = np.where(normalish, np.maximum(e2 - 1, -6), -6)
    code = np.rint(np.ldexp(np.where(finite, mag, 0.0), 3 - e)) + 8 * (e + 6)
    over = ~finite | (code > 0x7E)
    code = np.where(over, 0x7E if saturate else NAN, code).astype(np.uint8)
    code |= np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(NAN), code)


def as_codes(x) -> np.ndarray:
    """The uint8 codes of an ml_dtypes ``float8_e4m3fn`` array (a view) or of uint8 codes."""
    x = np.asarray(x)
    if x.dtype == np.uint8:
        return x
    if ml_dtypes is not None and x.dtype == ml_dtypes.float8_e4m3fn:
        return x.view(np.uint8)
    raise TypeError(f"expected float8_e4m3fn or uint8 codes, got {x.dtype}")


def fma_f32(a, b, c) -> np.ndarray:
    """``fp32(a * b + c)`` with one rounding (nearest-even), for float32 arrays.

    ``a * b`` is exact in float64 (24 + 24 bits).  ``s = fl64(a*b + c)`` can differ from
    the exact sum, and rounding ``s`` to float32 is then wrong only when ``s`` is exactly
    halfway between two float32 values (a "double rounding" tie); there the exact
    remainder (TwoSum) decides the direction.  Inputs are assumed to stay in the normal
    float32 range (true for scores, code-domain values and their corrections).
    """
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = np.asarray(p + c)
    r = s.astype(np.float32)
    tie = (s.view(np.int64) & 0x1FFFFFFF) == 0x10000000  # 25th significant bit alone
    if tie.any():
        pt, ct, st = np.broadcast_to(p, s.shape)[tie], np.broadcast_to(c, s.shape)[tie], s[tie]
        bb = st - pt
        err = (pt - (st - bb)) + (ct - bb)
        nudged = np.nextafter(st, np.where(err > 0, np.inf, -np.inf)).astype(np.float32)
        r[tie] = np.where(err != 0, nudged, r[tie])
    return r


def fma32(p, c) -> np.ndarray:
    """``fp32(p + c)`` rounded once (nearest-even) for float64 ``p`` holding an exact product
    of two fp32 values (48 bits) and ``c`` an fp32 value: what ``v_fma_f32`` computes, at any
    magnitude, subnormal results included (fp32 denormals kept).  The float64 sum is rounded
    to odd (its last bit set where it was inexact), so the final rounding to fp32 is the
    correctly rounded one (24 + 2 <= 53 bits).  inf and NaN propagate as in IEEE arithmetic.
    """
    p = np.asarray(p, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    with np.errstate(all="ignore"):
        s = np.asarray(p + c)
        bb = s - p
        err = (p - (s - bb)) + (c - bb)
        fix = np.isfinite(s) & np.isfinite(err) & (err != 0) & ((s.view(np.int64) & 1) == 0)
        if fix.any():
            s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


def ashr_u8_codes(p, u) -> np.ndarray:
    """The byte of ``v_ashr_pk_u8_i32`` applied by 8 bits to the fp32 ``z = (p - u) 2^-141``:
    ``p = S 8c`` (float64, exact), ``u`` the FMA's addend in code units (float64, an fp32
    value times 2^141, so ``256 u`` is an integer).  While ``z`` is an fp32 subnormal its bit
    pattern is the integer ``rint(256 (p - u))`` (nearest-even on the exact difference), and
    the byte is that shifted right by 8, saturated to [0, 255]; a negative ``z`` (sign bit
    set: any negative value, -0 and -inf) gives 0.  Callers keep ``p - u < 2^15`` (the
    subnormal range), which the kernel's ``u`` guarantees."""
    p = np.asarray(p, dtype=np.float64) * 256.0
    q = -np.asarray(u, dtype=np.float64) * 256.0
    with np.errstate(all="ignore"):
        s = np.asarray(p + q)
        bb = s - p
        err = (p - (s - bb)) + (q - bb)               # the exact remainder (TwoSum)
        r = np.rint(s)
        tie = np.isfinite(s) & (np.abs(s - np.floor(s) - 0.5) == 0) & (err != 0)
        r = np.where(tie, np.floor(s) + (err > 0), r)
        r = np.nan_to_num(r, nan=-1.0, neginf=-1.0, posinf=-1.0)
    return np.clip(np.floor(r / 256.0), 0, 255).astype(np.uint8)


def p_codes(y, *, variant: str, max_code: int = 120) -> np.ndarray:
    """The P byte for code-domain values ``y = 8 (t - m) + c0`` (float32), clamped to
    ``[0, max_code]`` (``max_code = c0``, the code of the un-shifted maximum).

    See the module docstring for the variants, their arithmetic and their cost.  The
    "lean" variants reproduce the kernel's fp32 arithmetic exactly (``y`` must be the
    kernel's fp32 value); "exact" rounds the true ``2^(y/8 - 7)``.
    """
    y = np.maximum(np.asarray(y, dtype=np.float32), np.float32(-1024))  # -inf: masked key
    if variant == "exact":
        # encode(2^(w - 7)) with w = y/8, written out: E = max(floor(w), 1) is the e4m3
        # binade (1 also for subnormals) and the mantissa in code steps is 2^(w - E + 3).
        w = y.astype(np.float64) / 8
        e = np.maximum(np.floor(w), 1.0)
        z = 8 * (e - 1) + np.rint(np.exp2(w - e + 3))
    elif variant == "lean":
        z = y
    elif variant == "lean_quad":
        # y/8 + 16 is exact in float64 whenever it could round differently from a fused
        # FMA (|y| >= 2^-22), and x*x - x is exact in float64 (x is a multiple of 2^-19
        # when w >= 16, the only case that can give a nonzero code): one rounding each.
        w = (y.astype(np.float64) / 8 + 16).astype(np.float32)
        x = (w - np.floor(w)).astype(np.float64)
        h = (x * x - x).astype(np.float32)
        z = fma_f32(h, LEAN_QUAD_K, y)
    else:
        raise ValueError(f"unknown P rounding {variant!r}; expected one of {P_ROUNDINGS}")
    return np.clip(np.rint(z), 0, max_code).astype(np.uint8)


def quad_fold_codes(w, *, max_code: int = 120) -> np.ndarray:
    """The "lean_quad" byte in its folded form (module docstring) for ``w = y/8 + 16``
    (float32, the kernel's value), clamped to ``[0, max_code]``.

    ``f`` is ``1 + x/16`` built from the low 19 mantissa bits of ``w``: ``x = w - floor(w)``
    while ``w`` is in [16, 32), the binade of every code above 0 (below it the correction
    is some value in [-K'/4, 0] and the code stays below 0; -inf stays -inf).
    """
    w = np.asarray(w, dtype=np.float32)
    f = ((w.view(np.uint32) & np.uint32(0x7FFFF)) | np.uint32(0x3F800000)).view(np.float32)
    with np.errstate(invalid="ignore"):
        g = fma_f32(f, QUAD_FOLD_A1, QUAD_FOLD_A0)
        z = fma_f32(f, g, w)
        code = np.rint(8.0 * z.astype(np.float64) + QUAD_FOLD_C)   # exact in float64
    return np.clip(np.nan_to_num(code, nan=0.0, neginf=-1.0), 0, max_code).astype(np.uint8)


def fma_f16(a, b, c) -> np.ndarray:
    """``f16(a * b + c)`` with one rounding (nearest-even, subnormals kept), for float16
    arrays: what an HFMA2 lane computes.  ``a * b`` (11 + 11 bits) and its sum with ``c``
    are exact in float64 whenever the exponents of the two addends are within 30 of each
    other (always for the byte's operands), and numpy rounds float64 to float16 directly.
    """
    a, b, c = (np.asarray(v, dtype=np.float16).astype(np.float64) for v in (a, b, c))
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(a * b + c).astype(np.float16)


def quad_h2_codes(w, *, max_code: int = 120) -> np.ndarray:
    """The "lean_quad" byte in half precision (module docstring) for ``w = y/8 + 16``
    (float32, the kernel's value), clamped to ``[0, max_code]``.

    ``W = f16(w)`` (an overflow is -inf: the code is 0); ``F`` is ``1 + x/16`` from ``W``'s
    low 6 mantissa bits, ``x = W - floor(W)`` while ``W`` is in [16, 32), the binade of
    every code above 0 (below it the correction is some value in [-K''/4, 0] and the code
    stays at 0).  The code is ``rint(8 z - 128)``, the bits of an f16 subnormal, saturated
    below at 0 (NaN gives 0, as ``.sat`` does).
    """
    big_w = _f16_w(w)
    f = ((big_w.view(np.uint16) & np.uint16(0x3F)) | np.uint16(0x3C00)).view(np.float16)
    t1 = fma_f16(f, QUAD_H2_A, -QUAD_H2_A)
    t2 = fma_f16(f, QUAD_H2_B, -QUAD_H2_B17)
    return _subnormal_code(fma_f16(t1, t2, big_w), max_code)


def _f16_w(w) -> np.ndarray:
    """``W = f16(w)`` of the kernel's fp32 ``w`` (F2FP; an overflow is -inf)."""
    with np.errstate(over="ignore"):
        return np.asarray(w, dtype=np.float32).astype(np.float16)


def _subnormal_code(z, max_code: int) -> np.ndarray:
    """The code ``rint(8z - 128)`` (ties to even) as the bits of the f16 subnormal ``sat(z
    2^-21 - 2^-17)`` (one HFMA2.SAT), negative codes, -inf and NaN saturated to 0, clamped to
    ``[0, max_code]``."""
    r = fma_f16(z, np.float16(2.0 ** -21), np.float16(-2.0 ** -17)).astype(np.float64)
    code = np.nan_to_num(r, nan=0.0, neginf=0.0, posinf=1.0) * 2.0 ** 24   # exact integers
    return np.clip(code, 0, max_code).astype(np.uint8)


def lean_h2_codes(w, *, max_code: int = 120) -> np.ndarray:
    """The "lean" byte as sm_90a forms it, two scores an instruction, for ``w = y/8 + 16``
    (float32, the kernel's value), clamped to ``[0, max_code]``.

    ``W = f16(w)`` holds ``y`` to 1/8 code (an overflow is -inf: the code is 0); the code is
    ``rint(8 W - 128)`` (ties to even), the bits of the f16 subnormal ``sat(W 2^-21 -
    2^-17)``, saturated below at 0 (NaN gives 0, as ``.sat`` does).  Against the fp32
    ``rint(y)`` of :func:`p_codes` the code moves only where ``y`` lies within 1/16 code of a
    rounding boundary (the first rounding then lands on the tie).
    """
    return _subnormal_code(_f16_w(w), max_code)


def lean_p_codes(u, *, variant: str) -> np.ndarray:
    """The P byte for ``u = t - m <= 0`` (log2 units) with P shifted by 2^8 (code 120 =
    256.0 stands for 2^0): :func:`p_codes` of ``y = fp32(8u + 120)``, as a kernel holds it.
    """
    y = (8.0 * np.asarray(u, dtype=np.float64) + 120.0).astype(np.float32)
    return p_codes(y, variant=variant, max_code=120)


def exp2_x(u) -> np.ndarray:
    """``x = 2^u`` in fp32 for ``u = log2(p_shift P)`` (float32, the kernel's value: 8 at the
    block max, where x = 256), correctly rounded, for every ``u`` in [-7, 9); 0 below -7 (P
    under 2^-15 of the block max, and the masked keys' -inf, and NaN).  ``u`` is first held
    below 9 (``min(u, EXP2_U_MAX)``).  The kernel takes x from MUFU's ``ex2.approx.ftz.f32``,
    within 2 ulp of this over [-7, 9) (measured: docs/numerics.md); x is then rounded to f16
    (:func:`hi_lo_codes`), whose ulp is 2^13 times larger, so the two meet but near f16 ties.
    """
    u, x = _exp2_fp32(u)
    return np.where(u >= EXP2_U_ZERO, x, np.float32(0))


def exp2_f16(u) -> np.ndarray:
    """``X = f16(fp32(2^u))`` for ``u = log2(p_shift P)`` (float32; 8 at the block max, where X =
    256), each step correctly rounded (nearest even), for every ``u``: ``u`` is first held below 9
    (``min(u, EXP2_U_MAX)``, so X <= 512), and there is no cut at :data:`EXP2_U_ZERO`: the f16
    subnormals carry P down to 2^-24, x up to half that (2^-25) rounds to 0, -inf gives 0 and
    NaN stays NaN.  Equals ``exp2_x(u).astype(float16)`` for ``u`` in [-7, 9).  The f16
    diagonal's kernel (built, not kept: bench/results/2026-12-06_h100_fp8_f16_diagonal) took x
    from MUFU's ``ex2.approx.ftz.f32``, within 2 ulp of fp32(2^u) over [-7, 9) (measured:
    docs/numerics.md; its flush of fp32 subnormals changes no X), and X by ``cvt.rn.f16x2.f32``,
    whose ulp is at least 2^13 times x's, so the two meet but near f16 ties.  Returns float16.
    """
    return _exp2_fp32(u)[1].astype(np.float16)


def _exp2_fp32(u) -> tuple[np.ndarray, np.ndarray]:
    """``u`` (float32) held below 9 (``min(u, EXP2_U_MAX)``; NaN stays NaN) and fp32(2^u),
    correctly rounded (float64 exp2, one rounding to fp32): what :func:`exp2_x` and
    :func:`exp2_f16` share."""
    u = np.minimum(np.asarray(u, dtype=np.float32), EXP2_U_MAX)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        return u, np.exp2(u.astype(np.float64)).astype(np.float32)


def hi_lo_codes(u) -> tuple[np.ndarray, np.ndarray]:
    """P in two e4m3 terms for ``u = log2(p_shift P)`` (float32): ``hi + lo`` approximates ``x =``
    :func:`exp2_x` to about 2^-8 relative instead of one byte's 2^-4.  ``X = f16(x)`` (nearest
    even), ``hi = e4m3(X)``, ``lo = e4m3(X - hi)`` (the difference is exact in f16), both
    nearest even and saturating, as ``cvt.rn.satfinite.e4m3x2.f16x2`` rounds.  Returns the two
    uint8 code arrays; ``lo`` is signed.
    """
    x16 = exp2_x(u).astype(np.float16)
    hi = encode(x16, saturate=True)
    return hi, encode(x16.astype(np.float64) - decode(hi), saturate=True)
