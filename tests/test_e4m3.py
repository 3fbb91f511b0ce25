"""OCP e4m3 in numpy, and the P encodings, against independent statements and proven bounds."""

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from zyfa_runtime import e4m3

ALL = np.arange(256, dtype=np.uint8)


def spec_value(code: int) -> float:
    """The OCP E4M3 definition, bit field by bit field (NaN for S.1111.111)."""
    s, e, f = code >> 7, (code >> 3) & 0xF, code & 7
    if e == 15 and f == 7:
        return math.nan
    mag = math.ldexp(f, -9) if e == 0 else math.ldexp(8 + f, e - 10)
    return -mag if s else mag


FINITE_POSITIVE = [c for c in range(0x7F)]  # 0x00 .. 0x7E, in increasing value


# Decoding.

def test_decode_all_codes_matches_the_format_and_ml_dtypes():
    got = e4m3.decode(ALL)
    spec = np.array([spec_value(c) for c in range(256)])
    np.testing.assert_array_equal(got, spec)  # NaN positions compare equal
    np.testing.assert_array_equal(got, ALL.view(ml_dtypes.float8_e4m3fn).astype(np.float64))
    assert np.signbit(got[0x80]) and got[0x80] == 0 and not np.signbit(got[0])


def test_nan_codes_are_exactly_0x7f_and_0xff_and_the_extremes():
    assert [c for c in range(256) if math.isnan(e4m3.decode(np.uint8(c)))] == [0x7F, 0xFF]
    v = e4m3.decode(ALL)
    assert np.nanmax(v) == e4m3.MAX == 448 and np.nanmin(v) == -448
    assert v[1] == 2.0 ** -9 and v[8] == 2.0 ** -6 and v[0x78] == 256


def test_codes_grow_by_eight_per_doubling():
    v = e4m3.decode(ALL)
    for c in range(8, 0x7F - 8):
        assert v[c + 8] == 2 * v[c]


def test_decode_rejects_other_dtypes():
    with pytest.raises(TypeError):
        e4m3.decode(np.zeros(3, np.int32))


# Encoding.

@pytest.mark.parametrize("saturate", [False, True])
def test_every_finite_code_round_trips(saturate):
    finite = ALL[~np.isnan(e4m3.decode(ALL))]
    np.testing.assert_array_equal(e4m3.encode(e4m3.decode(finite), saturate=saturate), finite)
    assert e4m3.encode(-0.0, saturate=saturate) == 0x80 and e4m3.encode(0.0, saturate=saturate) == 0


@pytest.mark.parametrize("saturate", [False, True])
def test_midpoints_round_to_the_even_code_and_neighbours_to_the_nearest(saturate):
    v = e4m3.decode(np.array(FINITE_POSITIVE, np.uint8))
    mid = (v[:-1] + v[1:]) / 2                  # exact in float64
    lo, hi = np.array(FINITE_POSITIVE[:-1]), np.array(FINITE_POSITIVE[1:])
    even = np.where(lo % 2 == 0, lo, hi)
    for sign, bit in ((1.0, 0), (-1.0, 0x80)):
        np.testing.assert_array_equal(e4m3.encode(sign * mid, saturate=saturate), even | bit)
        below, above = np.nextafter(mid, 0), np.nextafter(mid, np.inf)
        np.testing.assert_array_equal(e4m3.encode(sign * below, saturate=saturate), lo | bit)
        np.testing.assert_array_equal(e4m3.encode(sign * above, saturate=saturate), hi | bit)
    # The same points, as float32, through ml_dtypes' (non-saturating) conversion (which
    # goes through float32, so float64 neighbours of a midpoint would be rounded twice).
    m32 = mid.astype(np.float32)
    pts = np.concatenate([m32, np.nextafter(m32, np.float32(0)), np.nextafter(m32, np.float32(np.inf))])
    pts = np.concatenate([pts, -pts])
    np.testing.assert_array_equal(e4m3.encode(pts, saturate=False),
                                  pts.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))


def test_the_448_boundary_and_saturation():
    # 464 is halfway between 448 (0x7E, even) and the missing 480: a tie to 448.
    big = np.array([448.0, 460.0, 464.0, np.nextafter(464.0, np.inf), 480.0, 1e30, np.inf])
    for sign, bit in ((1.0, 0), (-1.0, 0x80)):
        np.testing.assert_array_equal(e4m3.encode(sign * big, saturate=True), [0x7E | bit] * 7)
        np.testing.assert_array_equal(e4m3.encode(sign * big, saturate=False),
                                      [0x7E | bit] * 3 + [0x7F | bit] * 4)
    for saturate in (False, True):
        assert e4m3.encode(np.nan, saturate=saturate) == 0x7F
        assert e4m3.encode(-np.nan, saturate=saturate) == 0x7F


def test_subnormals_and_underflow():
    x = np.array([2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -11, 2.0 ** -30, 7.5 * 2.0 ** -9, 2.0 ** -6])
    np.testing.assert_array_equal(e4m3.encode(x, saturate=True), [0, 2, 0, 0, 8, 8])
    assert e4m3.encode(-2.0 ** -30, saturate=True) == 0x80


def test_random_values_match_ml_dtypes():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(200_000) * np.exp2(rng.uniform(-16, 10, 200_000))
    np.testing.assert_array_equal(e4m3.encode(x, saturate=False),
                                  x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
    x32 = x.astype(np.float32)
    np.testing.assert_array_equal(e4m3.encode(x32, saturate=False),
                                  x32.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))


def test_as_codes():
    x = np.array([1.0, -2.5, 448.0]).astype(ml_dtypes.float8_e4m3fn)
    c = e4m3.as_codes(x)
    assert c.dtype == np.uint8 and list(c) == [0x38, 0xC2, 0x7E]
    assert e4m3.as_codes(c) is c
    with pytest.raises(TypeError):
        e4m3.as_codes(np.zeros(2, np.float32))


# fp32 fused multiply-add.

def exact_fma32(a, b, c):
    """fp32(a*b + c) from exact rational arithmetic."""
    x = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    r = np.float32(float(x))  # float(Fraction) rounds correctly to float64 ...
    lo, hi = sorted((r, np.nextafter(r, np.float32(np.inf) if Fraction(float(r)) < x else -np.inf)))
    dlo, dhi = abs(x - Fraction(float(lo))), abs(x - Fraction(float(hi)))
    if dlo != dhi:                                # ... so pick the nearer float32 exactly
        return lo if dlo < dhi else hi
    return lo if int(lo.view(np.uint32)) % 2 == 0 else hi


def test_fma_f32_handles_the_double_rounding_tie():
    # a*b = 2^-24 + 2^-60: in float64, 1 + a*b rounds to the float32 midpoint 1 + 2^-24,
    # which a second rounding would send to 1.0; the fused result is 1 + 2^-23.
    a = np.float32(1 + 2.0 ** -12)
    b = np.float32((1 - 2.0 ** -12 + 2.0 ** -24) * 2.0 ** -24)
    one = np.float32(1)
    assert np.float32(np.float64(a) * np.float64(b) + 1.0) == 1.0
    assert e4m3.fma_f32(a, b, one) == np.float32(1 + 2.0 ** -23)
    assert e4m3.fma_f32(-a, b, -one) == -np.float32(1 + 2.0 ** -23)
    assert e4m3.fma_f32(a, -b, one) == np.nextafter(one, np.float32(0))


def test_fma_f32_random_against_exact_arithmetic():
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal(3000).astype(np.float32) * np.float32(2.0) ** rng.integers(-8, 8, 3000)
               .astype(np.float32) for _ in range(3))
    got = e4m3.fma_f32(a, b, c)
    want = np.array([exact_fma32(x, y, z) for x, y, z in zip(a, b, c)], np.float32)
    np.testing.assert_array_equal(got, want)


# P encodings.

def T(y):
    """The value a code-domain y stands for: 2^(y/8 - 7)."""
    return np.exp2(np.asarray(y, np.float64) / 8 - 7)


def dense_y(lo, hi, n=1 << 20):
    return np.linspace(lo, hi, n).astype(np.float32)


def test_lean_is_rint_of_the_code_domain_value():
    y = dense_y(-20, 130, 100_001)
    np.testing.assert_array_equal(e4m3.p_codes(y, variant="lean"), np.clip(np.rint(y), 0, 120))
    u = np.linspace(-16, 0, 4097)
    np.testing.assert_array_equal(e4m3.lean_p_codes(u, variant="lean"),
                                  np.clip(np.rint(8 * u + 120), 0, 120))


def test_lean_error_bound_holds_and_is_attained():
    """value(rint y) / T(y) lies in [2^-1/16, 1.5/sqrt2 * 2^1/16] for y >= 7.5 (see e4m3)."""
    lo, hi = e4m3.LEAN_BOUND
    assert lo == pytest.approx(-0.042397, abs=1e-6) and hi == pytest.approx(0.107620, abs=1e-6)
    y = dense_y(7.5, 120)
    rel = e4m3.decode(e4m3.p_codes(y, variant="lean")) / T(y) - 1
    assert rel.min() >= lo - 1e-12 and rel.max() <= hi + 1e-12
    assert rel.min() <= lo + 1e-4 and rel.max() >= hi - 1e-4   # a dense sweep comes close
    ends = np.array([8 * e + 0.5 for e in range(1, 15)] + [8 * e + 3.5 for e in range(1, 15)],
                    np.float32)                                 # the ties that attain them
    rel = e4m3.decode(e4m3.p_codes(ends, variant="lean")) / T(ends) - 1
    np.testing.assert_allclose(rel[:14], lo, rtol=1e-12)
    np.testing.assert_allclose(rel[14:], hi, rtol=1e-12)


def test_below_the_normal_range_errors_are_absolute():
    y = dense_y(-40, 7.5, 100_001)
    for variant, bound in (("lean", 2.0 ** -6), ("lean_quad", 2.0 ** -6), ("exact", 2.0 ** -10)):
        err = np.abs(e4m3.decode(e4m3.p_codes(y, variant=variant)) - T(y))
        assert err.max() < bound, variant


def test_exact_is_round_to_nearest_even_with_the_one_seventeenth_bound():
    y = dense_y(8, 120)
    codes = e4m3.p_codes(y, variant="exact")
    np.testing.assert_array_equal(codes, e4m3.encode(T(y), saturate=True))
    rel = e4m3.decode(codes) / T(y) - 1
    assert np.abs(rel).max() <= 1 / 17 + 1e-12 and np.abs(rel).max() > 1 / 17 - 1e-4


def test_lean_quad_matches_exact_statistically_and_differs_by_one_code_at_most():
    y = dense_y(8, 120)
    quad, exact = (e4m3.p_codes(y, variant=v) for v in ("lean_quad", "exact"))
    diff = quad.astype(int) - exact.astype(int)
    assert set(np.unique(diff)) <= {-1, 0, 1} and np.mean(diff != 0) < 0.03
    rq, rx = (e4m3.decode(c) / T(y) - 1 for c in (quad, exact))
    assert abs(rq.std() / rx.std() - 1) < 0.01 and abs(rq.mean()) < 0.002
    assert np.abs(rq).max() < 0.065


def test_quad_fold_is_the_lean_quad_byte_in_four_fmas():
    """The folded form (w = y/8 + 16, 4 FMAs) computes y + K'(x^2 - x) with K' 0.02 % from
    the minimax K: "lean_quad"'s byte but where fp32 rounding of ~1e-4 code units or the
    changed K moves a value across a rounding boundary, then by one code."""
    assert e4m3.QUAD_FOLD_C == 272 * e4m3.QUAD_FOLD_K - 128
    assert abs(e4m3.QUAD_FOLD_K / float(e4m3.LEAN_QUAD_K) - 1) < 3e-4
    y = dense_y(-40, 120)
    w = ((y.astype(np.float64) / 8) + 16).astype(np.float32)        # exact for these y
    fold, quad = e4m3.quad_fold_codes(w), e4m3.p_codes(y, variant="lean_quad")
    diff = fold.astype(int) - quad.astype(int)
    assert set(np.unique(diff)) <= {-1, 0, 1} and 0 < np.mean(diff != 0) < 1e-3


def test_quad_fold_edges():
    """The block max (w = 31, or within 2^-5 of it) is code 120; anything with w below 16
    (y < 0), -inf (a masked key) and NaN give 0; the clamp holds above."""
    w = np.float32([31.0, 31 + 2 ** -5, 31 - 2 ** -5, 16.0, 15.999, 8.5, -1e30, -np.inf, np.nan, 40.0])
    np.testing.assert_array_equal(e4m3.quad_fold_codes(w), [120, 120, 120, 0, 0, 0, 0, 0, 0, 120])
    assert e4m3.quad_fold_codes(np.float32([40.0]), max_code=255)[0] > 120


def test_fma_f16_rounds_once_and_keeps_subnormals():
    """One rounding to nearest-even, also onto the subnormal grid (2^-24), as an HFMA2 lane:
    a sum just past a tie goes up (a float32 detour would round it to the tie, then to even)."""
    one, tiny = np.float16(1.0), np.float16(2.0 ** -24)
    assert e4m3.fma_f16(np.float16(2.0 ** -11), one, np.float16(1 + 2.0 ** -10)) == np.float16(1 + 2 ** -9)
    assert e4m3.fma_f16(np.float16(1 + 2.0 ** -10), np.float16(2.0 ** -11), one) == np.float16(1 + 2 ** -10)
    assert e4m3.fma_f16(np.float16(5.0), tiny, np.float16(0.0)).view(np.uint16) == 5
    assert e4m3.fma_f16(np.float16(2.5), tiny, np.float16(0.0)).view(np.uint16) == 2       # tie: even
    assert e4m3.fma_f16(np.float16(2.5 + 2 ** -8), tiny, np.float16(0.0)).view(np.uint16) == 3


def test_quad_h2_is_the_lean_quad_byte_to_an_eighth_of_a_code():
    """The half-precision form: K'' = A B / 32 0.03 % from the minimax K, 17 B / 16 exact in
    f16; its bytes are "lean_quad"'s but where y lay within ~1/8 code of a rounding boundary
    (then one code off), and its relative error of P is within 3 % of "exact"'s RMS."""
    assert float(e4m3.QUAD_H2_B17) == float(e4m3.QUAD_H2_B) * 17 / 16
    assert abs(e4m3.QUAD_H2_K / float(e4m3.LEAN_QUAD_K) - 1) < 5e-4
    y = dense_y(-40, 120)
    w = ((y.astype(np.float64) / 8) + 16).astype(np.float32)
    h2, quad, exact = e4m3.quad_h2_codes(w), e4m3.p_codes(y, variant="lean_quad"), e4m3.p_codes(y, variant="exact")
    diff = h2.astype(int) - quad.astype(int)
    assert set(np.unique(diff)) <= {-1, 0, 1} and 0.01 < np.mean(diff != 0) < 0.1
    big = y > 8
    rh, rx = (e4m3.decode(c[big]) / T(y[big]) - 1 for c in (h2, exact))
    assert 1.0 < np.sqrt(np.mean(rh ** 2)) / np.sqrt(np.mean(rx ** 2)) < 1.03
    assert np.abs(rh).max() < 0.075


def test_quad_h2_edges():
    """As the folded form: the block max (w = 31, or within 2^-5) is code 120; w below 16, a
    w past f16's range (-inf), -inf and NaN give 0; +inf (past the clamp) the max code."""
    w = np.float32([31.0, 31 + 2 ** -5, 31 - 2 ** -5, 16.0, 15.999, 8.5, -1e30, -np.inf, np.nan, np.inf])
    np.testing.assert_array_equal(e4m3.quad_h2_codes(w), [120, 120, 120, 0, 0, 0, 0, 0, 0, 120])
    assert e4m3.quad_h2_codes(np.float32([31.9]), max_code=255)[0] == 127


def test_lean_centre_is_the_mean_lean_bias():
    y = dense_y(8, 120)
    ratio = e4m3.decode(e4m3.p_codes(y, variant="lean")) / T(y)
    assert e4m3.LEAN_CENTRE == pytest.approx(8 * np.log2(ratio.mean()), abs=2e-3)
    assert 0.45 < e4m3.LEAN_CENTRE < 0.5   # below half a code: the maximum keeps code 120


@pytest.mark.parametrize("variant", e4m3.P_ROUNDINGS)
def test_masked_keys_and_the_clamp(variant):
    y = np.array([-np.inf, -1e6, -2000, 120, 120.4], np.float32)
    np.testing.assert_array_equal(e4m3.p_codes(y, variant=variant), [0, 0, 0, 120, 120])
    np.testing.assert_array_equal(e4m3.p_codes(np.float32([56, 60]), variant=variant, max_code=56),
                                  [56, 56])
    with pytest.raises(ValueError):
        e4m3.p_codes(y, variant="nope")


def test_exp2_x_is_two_to_the_u_correctly_rounded_and_zero_below_minus_7():
    """x = fp32(2^u) (256 at the block max, u = 8) over [-7, 9); 0 below -7 (P under 2^-15 of
    the block max), for -inf (masked keys) and NaN; u held below 9, so x stays under 512."""
    u = np.float32(np.linspace(-7, 8.999, 200001))
    x = e4m3.exp2_x(u)
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x, np.exp2(u.astype(np.float64)).astype(np.float32))
    np.testing.assert_array_equal(e4m3.exp2_x(np.float32([-7.0001, -1e30, -np.inf, np.nan])), [0, 0, 0, 0])
    assert e4m3.exp2_x(np.float32([8.0]))[0] == 256 and e4m3.exp2_x(np.float32([-7.0]))[0] == 2.0 ** -7
    assert e4m3.exp2_x(np.float32([100.0, np.inf]))[0] < 512


def test_exp2_f16_is_x_in_f16_with_no_cut_below_minus_7():
    """X = f16(fp32(2^u)), the f16 diagonal's P: exp2_x's x rounded to f16 over [-7, 9); below
    -7 the f16 subnormals carry it (2^-20 exactly) until it rounds to 0; -inf (masked keys) is
    0, NaN stays NaN; u held below 9, so X is at most x(EXP2_U_MAX) rounded to f16 (512)."""
    u = np.float32(np.linspace(-7, 8.999, 200001))
    x16 = e4m3.exp2_f16(u)
    assert x16.dtype == np.float16
    np.testing.assert_array_equal(x16, e4m3.exp2_x(u).astype(np.float16))
    top = np.float16(np.float32(np.exp2(np.float64(e4m3.EXP2_U_MAX))))
    got = e4m3.exp2_f16(np.float32([8.0, -np.inf, -20.0, -24.0, -25.0, -30.0, 9.5, np.inf, np.nan]))
    np.testing.assert_array_equal(got[:8], [256, 0, 2.0 ** -20, 2.0 ** -24, 0, 0, top, top])
    assert top == 512 and np.isnan(got[8])
    deep = np.float32(np.linspace(-24, -7, 100001))     # the subnormals and the lowest binades
    want = np.array([float(np.float16(np.float32(2.0 ** float(v)))) for v in deep[::97]])
    np.testing.assert_array_equal(e4m3.exp2_f16(deep[::97]), want)
    assert (e4m3.exp2_f16(deep) > 0).all() and (np.diff(e4m3.exp2_f16(deep).astype(np.float64)) >= 0).all()


def test_hi_lo_codes_carry_p_to_a_twentieth_of_one_bytes_error():
    """hi + lo (both e4m3, lo signed) is x to about 2^-10 RMS where one RNE byte is 2^-5;
    the block max is hi = 120 (256) and lo = 0; masked keys give 0 and 0."""
    u = np.float32(np.linspace(0, 8, 100001))            # P >= 2^-8 of the block max
    t = 2.0 ** u.astype(np.float64)
    hi, lo = e4m3.hi_lo_codes(u)
    two = e4m3.decode(hi) + e4m3.decode(lo)
    one = e4m3.decode(e4m3.encode(t, saturate=True))
    rms = lambda a: np.sqrt(np.mean((a / t - 1) ** 2))   # noqa: E731
    assert rms(two) < rms(one) / 20 and np.abs(two / t - 1).max() < 3e-3
    np.testing.assert_array_equal(hi, e4m3.encode(e4m3.exp2_x(u).astype(np.float16), saturate=True))
    assert not np.isnan(two).any()
    h, l = e4m3.hi_lo_codes(np.float32([8.0, -np.inf, -8.0, 1e9]))
    np.testing.assert_array_equal(h, [120, 0, 0, 126])
    np.testing.assert_array_equal(l, [0, 0, 0, e4m3.encode(np.float64(float(np.float16(e4m3.exp2_x(np.float32([1e9]))[0])) - 448), saturate=True)])


def test_lean_h2_is_the_lean_byte_but_near_ties():
    """sm_90a's byte: y held to 1/8 code in f16, then rint onto the f16 subnormals.  It is the
    fp32 "lean" byte rint(y) but where y lay within 1/16 code of a tie (one code off, about
    1/8 of those ties' neighbourhoods), so its error of P is "lean"'s to within a few %."""
    y = dense_y(-40, 120)
    w = ((y.astype(np.float64) / 8) + 16).astype(np.float32)
    h2, lean = e4m3.lean_h2_codes(w), e4m3.p_codes(y, variant="lean")
    diff = h2.astype(int) - lean.astype(int)
    assert set(np.unique(diff)) <= {-1, 0, 1} and 0.01 < np.mean(diff != 0) < 0.1
    near_tie = np.abs(y - np.floor(y) - 0.5) <= 1 / 16 + 1e-4     # and w's own fp32 rounding
    assert not (diff != 0)[~near_tie].any()
    big = y > 8
    rh, rl = (e4m3.decode(c[big]) / T(y[big]) - 1 for c in (h2, lean))
    assert 0.97 < np.sqrt(np.mean(rh ** 2)) / np.sqrt(np.mean(rl ** 2)) < 1.03


def test_lean_h2_edges():
    """The centred block max (y = 119.54, w = 30.943) is code 120; w below 16, a w past f16's
    range (-inf), -inf and NaN give 0; +inf the max code."""
    top = np.float32(16 + (120 - e4m3.LEAN_CENTRE) / 8)
    w = np.float32([top, 31.0, 16.0, 15.999, 8.5, -1e30, -np.inf, np.nan, np.inf])
    np.testing.assert_array_equal(e4m3.lean_h2_codes(w), [120, 120, 0, 0, 0, 0, 0, 0, 120])
    assert e4m3.lean_h2_codes(np.float32([31.9]), max_code=255)[0] == 127
