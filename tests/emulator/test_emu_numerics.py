"""Number formats: OCP FP8 (E4M3, E5M2) per the CDNA4 ISA guide §7.3, bf16 and fma.

Every E4M3/E5M2 code is decoded by the format's definition written out here and by
ml_dtypes; encoding is checked on a sweep against ml_dtypes (non-saturating, i.e.
MODE.FP16_OVFL = 0) and on hand-worked rounding and saturation cases.
"""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from zyfa_emulator import numerics as nx


def e4m3_value(code: int) -> float:
    """OCP E4M3: bias 7, no infinities, S.1111.111 is NaN, subnormals 2^-6 * m/8."""
    s = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return s * 2.0 ** -6 * m / 8
    return s * 2.0 ** (e - 7) * (1 + m / 8)


def e5m2_value(code: int) -> float:
    """OCP E5M2: bias 15, IEEE-style infinities and NaNs."""
    s = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 2) & 0x1F, code & 3
    if e == 31:
        return s * float("inf") if m == 0 else float("nan")
    if e == 0:
        return s * 2.0 ** -14 * m / 4
    return s * 2.0 ** (e - 15) * (1 + m / 4)


@pytest.mark.parametrize("fmt,value,dt", [(nx.E4M3, e4m3_value, ml_dtypes.float8_e4m3fn),
                                          (nx.E5M2, e5m2_value, ml_dtypes.float8_e5m2)])
def test_all_256_codes_decode(fmt, value, dt):
    codes = np.arange(256)
    got = fmt.decode(codes)
    by_definition = np.array([value(c) for c in codes], np.float32)
    by_ml_dtypes = codes.astype(np.uint8).view(dt).astype(np.float32)
    for ref in (by_definition, by_ml_dtypes):
        assert np.array_equal(np.isnan(got), np.isnan(ref))
        ok = ~np.isnan(ref)
        assert np.array_equal(got[ok], ref[ok])
        assert np.array_equal(np.signbit(got[ok]), np.signbit(ref[ok]))


@pytest.mark.parametrize("fmt", [nx.E4M3, nx.E5M2])
def test_every_finite_code_round_trips(fmt):
    codes = np.arange(256)
    vals = fmt.decode(codes)
    finite = np.isfinite(vals)
    assert np.array_equal(fmt.encode(vals[finite], saturate=False), codes[finite])
    assert np.array_equal(fmt.encode(vals[finite], saturate=True), codes[finite])


@pytest.mark.parametrize("fmt,dt", [(nx.E4M3, ml_dtypes.float8_e4m3fn),
                                    (nx.E5M2, ml_dtypes.float8_e5m2)])
def test_encode_sweep_matches_ml_dtypes(fmt, dt):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200_000) * 2.0 ** rng.integers(-24, 20, 200_000)).astype(np.float32)
    # every midpoint between neighbouring codes, and just either side of it
    vals = np.sort(np.unique(fmt.decode(np.arange(256))[np.isfinite(fmt.decode(np.arange(256)))]))
    mids = ((vals[1:].astype(np.float64) + vals[:-1]) / 2).astype(np.float32)
    x = np.concatenate([x, mids, np.nextafter(mids, np.float32(np.inf)),
                        np.nextafter(mids, np.float32(-np.inf)),
                        np.array([0, -0.0, np.inf, -np.inf, np.nan], np.float32)])
    got = fmt.encode(x, saturate=False)
    ref = x.astype(dt).view(np.uint8).astype(np.uint32)
    both_nan = np.isnan(fmt.decode(got)) & np.isnan(ref.astype(np.uint8).view(dt).astype(np.float32))
    assert np.array_equal(got[~both_nan], ref[~both_nan])


def test_e4m3_rounding_and_saturation_by_hand():
    enc = nx.E4M3.encode
    x = np.array([464.0, 464.5, -470.0, np.inf, 2.0 ** -10, 3 * 2.0 ** -11, 1.0625, 1.1875],
                 np.float32)
    # 464 is the tie between 448 (0x7e) and the would-be 480: even -> 448.  Anything
    # above rounds past 448: NaN (0x7f) without FP16_OVFL, 448 with it.  2^-10 is the
    # tie between 0 and the smallest subnormal 2^-9: even -> 0.  3 * 2^-11 = 0.75 * 2^-9
    # is above that tie: 2^-9 (0x01).  1.0625 ties 1.0/1.125 -> 1.0 (0x38); 1.1875 ties
    # 1.125/1.25 -> 1.25 (0x3a).
    assert list(enc(x, saturate=False)) == [0x7E, 0x7F, 0xFF, 0x7F, 0x00, 0x01, 0x38, 0x3A]
    assert list(enc(x, saturate=True)) == [0x7E, 0x7E, 0xFE, 0x7E, 0x00, 0x01, 0x38, 0x3A]


def test_e5m2_overflow():
    x = np.array([57344.0, 61440.0, 1e6, -np.inf], np.float32)
    assert list(nx.E5M2.encode(x, saturate=False)) == [0x7B, 0x7C, 0x7C, 0xFC]
    assert list(nx.E5M2.encode(x, saturate=True)) == [0x7B, 0x7B, 0x7B, 0xFB]


def test_bf16_round_to_nearest_even():
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -23, -0.0, np.inf],
                 np.float32)
    assert list(nx.f32_to_bf16_bits(x)) == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x8000, 0x7F80]
    ref = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert list(nx.f32_to_bf16_bits(x)) == list(ref)


def test_fma_is_correctly_rounded():
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal(3000).astype(np.float32) for _ in range(3))
    c[:1000] = -(a[:1000].astype(np.float64) * b[:1000]).astype(np.float32)   # cancellation
    got = nx.fma_f32(a, b, c)
    for i in range(0, 3000, 7):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        g = Fraction(float(got[i]))
        for n in (np.nextafter(got[i], np.float32(-np.inf)), np.nextafter(got[i], np.float32(np.inf))):
            assert abs(g - exact) <= abs(Fraction(float(n)) - exact)
