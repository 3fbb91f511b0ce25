"""MFMA operand layouts with known matrices.

The packing below is written from the CDNA4 ISA guide's layout tables (§7.1.4 output
layout, §7.1.5.1 per-format input layouts, §7.2.1 scale layout), independently of the
emulator: A (M x K) lane l holds row l % M, B (K x N) lane l column l % N, and item t of
a lane holds the K index given per instruction; C/D hold D[row(l, r)][l % N].  Inputs
are small integers and halves, so every product and sum is exact and D must match
C + A.B exactly.
"""

import ml_dtypes
import numpy as np
import pytest
from emukit import build, run

LANE = np.arange(64)

SNIPPETS = {
    "bf16_16x16x32": "v_mfma_f32_16x16x32_bf16 v[0:3], v[4:7], v[8:11], v[0:3]\n  s_nop 7",
    "bf16_16x16x32_agpr": "v_mfma_f32_16x16x32_bf16 a[0:3], v[4:7], v[8:11], 0\n  s_nop 7",
    "bf16_32x32x16": "v_mfma_f32_32x32x16_bf16 v[0:15], v[16:19], v[20:23], v[0:15]\n  s_nop 15",
    "bf16_16x16x16": "v_mfma_f32_16x16x16_bf16 v[0:3], v[4:5], v[6:7], v[0:3]\n  s_nop 7",
    "fp8_16x16x128": "v_mfma_f32_16x16x128_f8f6f4 v[0:3], v[4:11], v[12:19], v[0:3]\n  s_nop 15",
    "fp8_32x32x64": "v_mfma_f32_32x32x64_f8f6f4 v[0:15], v[16:23], v[24:31], v[0:15]\n  s_nop 15",
    "bf8_fp8_16x16x128": "v_mfma_f32_16x16x128_f8f6f4 v[0:3], v[4:11], v[12:19], v[0:3] cbsz:1\n  s_nop 15",
    "fp4_16x16x128": "v_mfma_f32_16x16x128_f8f6f4 v[0:3], v[4:7], v[12:15], v[0:3] cbsz:4 blgp:4\n  s_nop 15",
    "fp6_32x32x64": "v_mfma_f32_32x32x64_f8f6f4 v[0:15], v[16:21], v[24:29], v[0:15] cbsz:2 blgp:2\n  s_nop 15",
    "scaled_16x16x128": "v_mfma_scale_f32_16x16x128_f8f6f4 v[0:3], v[4:11], v[12:19], v[0:3], v20, v21 op_sel:[1,0,0] op_sel_hi:[0,1,0]\n  s_nop 15",
    "legacy_fp8_16x16x32": "v_mfma_f32_16x16x32_fp8_fp8 v[0:3], v[4:5], v[6:7], v[0:3]\n  s_nop 7",
}


@pytest.fixture(scope="module")
def code():
    return build(SNIPPETS)


def pack_items(items: np.ndarray, bits: int) -> np.ndarray:
    """[64, T] codes of ``bits`` bits -> uint32[regs, 64], item t at bit bits*t."""
    lanes, T = items.shape
    regs = T * bits // 32
    out = np.zeros((regs, lanes), np.uint32)
    for lane in range(lanes):
        word = sum((int(items[lane, t]) & ((1 << bits) - 1)) << (bits * t) for t in range(T))
        for r in range(regs):
            out[r, lane] = (word >> (32 * r)) & 0xFFFFFFFF
    return out


def d_row(M: int, l: np.ndarray, r: int) -> np.ndarray:
    g = l // M
    return 4 * g + r if M == 16 else 8 * (r // 4) + 4 * g + (r % 4)


def unpack_d(w, M: int, row0: int = 0) -> np.ndarray:
    regs = M * M // 64
    D = np.full((M, M), np.nan)
    for r in range(regs):
        D[d_row(M, LANE, r), LANE % M] = w.v[row0 + r].view(np.float32)
    return D


def pack_c(C: np.ndarray, M: int) -> np.ndarray:
    regs = M * M // 64
    return np.stack([C[d_row(M, LANE, r), LANE % M].astype(np.float32).view(np.uint32)
                     for r in range(regs)])


def operand(X: np.ndarray, M: int, kmap, T: int, codes) -> np.ndarray:
    """Per-lane item codes of an A operand X[M x K] (or B^T) for a K index map."""
    rows = LANE % M
    g = LANE // M
    k = np.stack([kmap(g, t) for t in range(T)], axis=1)          # [64, T]
    return codes(X[rows[:, None], k])


def bf16_codes(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def fp8_codes(x, dt=ml_dtypes.float8_e4m3fn):
    return np.asarray(x, np.float32).astype(dt).view(np.uint8)


FP4 = {0.0: 0, 0.5: 1, 1.0: 2, 1.5: 3, 2.0: 4, 3.0: 5, 4.0: 6, 6.0: 7}


def fp4_codes(x):
    x = np.asarray(x, np.float64)
    return np.vectorize(lambda v: FP4[abs(v)] | (8 if v < 0 else 0))(x).astype(np.uint8)


def rand_ints(rng, shape, lo=-3, hi=4, halves=False):
    x = rng.integers(lo, hi, shape).astype(np.float64)
    return x / 2 if halves else x


def check(code, name, M, K, kmap_a, kmap_b, T, bits, codes_a, codes_b, a_reg, b_reg, c_reg=0,
          rng_seed=0, codes_kw=None, A=None, B=None):
    rng = np.random.default_rng(rng_seed)
    A = rand_ints(rng, (M, K)) if A is None else A
    B = rand_ints(rng, (K, M)) if B is None else B
    C = rand_ints(rng, (M, M), -50, 50)
    a = pack_items(operand(A, M, kmap_a, T, codes_a), bits)
    b = pack_items(operand(B.T, M, kmap_b, T, codes_b), bits)
    c = pack_c(C, M)

    def setup(w):
        w.v[a_reg:a_reg + len(a)] = a
        w.v[b_reg:b_reg + len(b)] = b
        w.v[c_reg:c_reg + len(c)] = c
    w = run(code, name, setup)
    return w, A @ B + C


def test_bf16_16x16x32(code):
    # k of item t = 8 * (l // 16) + t; items 2 per VGPR
    w, expect = check(code, "bf16_16x16x32", 16, 32, lambda g, t: 8 * g + t, lambda g, t: 8 * g + t,
                      8, 16, bf16_codes, bf16_codes, 4, 8)
    assert np.array_equal(unpack_d(w, 16), expect)


def test_bf16_16x16x32_into_agprs_with_zero_c(code):
    rng = np.random.default_rng(5)
    A, B = rand_ints(rng, (16, 32)), rand_ints(rng, (32, 16))
    a = pack_items(operand(A, 16, lambda g, t: 8 * g + t, 8, bf16_codes), 16)
    b = pack_items(operand(B.T, 16, lambda g, t: 8 * g + t, 8, bf16_codes), 16)

    def setup(w):
        w.v[4:8], w.v[8:12] = a, b
    w = run(code, "bf16_16x16x32_agpr", setup)
    assert np.array_equal(unpack_d(w, 16, row0=w.accum_offset), A @ B)


def test_bf16_32x32x16(code):
    # k = 8 * (l // 32) + t; D row = 8 * (r // 4) + 4 * (l // 32) + r % 4
    w, expect = check(code, "bf16_32x32x16", 32, 16, lambda g, t: 8 * g + t, lambda g, t: 8 * g + t,
                      8, 16, bf16_codes, bf16_codes, 16, 20)
    assert np.array_equal(unpack_d(w, 32), expect)


def test_bf16_16x16x16_legacy(code):
    w, expect = check(code, "bf16_16x16x16", 16, 16, lambda g, t: 4 * g + t, lambda g, t: 4 * g + t,
                      4, 16, bf16_codes, bf16_codes, 4, 6)
    assert np.array_equal(unpack_d(w, 16), expect)


def fp8_k_16(g, t):
    # 16x16x128 FP8: items 0..15 -> k = 16 g + t, items 16..31 -> k = 64 + 16 g + (t - 16)
    return 16 * g + t if t < 16 else 64 + 16 * g + (t - 16)


def fp8_k_32(g, t):
    return 16 * g + t if t < 16 else 32 + 16 * g + (t - 16)


def test_fp8_16x16x128(code):
    w, expect = check(code, "fp8_16x16x128", 16, 128, fp8_k_16, fp8_k_16, 32, 8, fp8_codes,
                      fp8_codes, 4, 12)
    assert np.array_equal(unpack_d(w, 16), expect)


def test_fp8_32x32x64(code):
    w, expect = check(code, "fp8_32x32x64", 32, 64, fp8_k_32, fp8_k_32, 32, 8, fp8_codes,
                      fp8_codes, 16, 24)
    assert np.array_equal(unpack_d(w, 32), expect)


def test_bf8_times_fp8(code):
    w, expect = check(code, "bf8_fp8_16x16x128", 16, 128, fp8_k_16, fp8_k_16, 32, 8,
                      lambda x: fp8_codes(x, ml_dtypes.float8_e5m2), fp8_codes, 4, 12)
    assert np.array_equal(unpack_d(w, 16), expect)


def test_fp4_16x16x128_is_contiguous_in_k(code):
    rng = np.random.default_rng(3)
    vals = np.array(sorted(FP4)) * rng.choice([-1, 1], 8)
    A = rng.choice(vals, (16, 128))
    B = rng.choice(vals, (128, 16))
    w, expect = check(code, "fp4_16x16x128", 16, 128, lambda g, t: 32 * g + t,
                      lambda g, t: 32 * g + t, 32, 4, fp4_codes, fp4_codes, 4, 12, A=A, B=B)
    assert np.array_equal(unpack_d(w, 16), expect)


def e2m3_table():
    """OCP FP6 E2M3 (bias 1, no inf/NaN): value -> 6-bit code, from the definition."""
    out = {}
    for code in range(64):
        s, e, m = code >> 5, (code >> 3) & 3, code & 7
        v = m / 8 if e == 0 else (1 + m / 8) * 2.0 ** (e - 1)
        out.setdefault(-v if s else v, code)
    return out


def test_fp6_32x32x64_is_contiguous_in_k(code):
    table = e2m3_table()
    rng = np.random.default_rng(9)
    vals = np.array([-7.5, -3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 1.875, 4.0, 6.0])
    A, B = rng.choice(vals, (32, 64)), rng.choice(vals, (64, 32))
    codes = np.vectorize(lambda v: table[v])
    w, expect = check(code, "fp6_32x32x64", 32, 64, lambda g, t: 32 * g + t,
                      lambda g, t: 32 * g + t, 32, 6, codes, codes, 16, 24, A=A, B=B)
    assert np.array_equal(unpack_d(w, 32), expect)


def test_legacy_fp8_16x16x32(code):
    w, expect = check(code, "legacy_fp8_16x16x32", 16, 32, lambda g, t: 8 * g + t,
                      lambda g, t: 8 * g + t, 8, 8, fp8_codes, fp8_codes, 4, 6)
    assert np.array_equal(unpack_d(w, 16), expect)


def test_scaled_mfma_applies_block_scales(code):
    # Lane l supplies the E8M0 scale of row (A) / column (B) l % 16 for K block l // 16.
    # op_sel:[1,0] op_sel_hi:[0,1]: A's scale is byte {hi=0, lo=1} = 1, B's {1, 0} = 2.
    rng = np.random.default_rng(7)
    A, B = rand_ints(rng, (16, 128)), rand_ints(rng, (128, 16))
    C = rand_ints(rng, (16, 16), -50, 50)
    ea = rng.integers(124, 131, (16, 4))        # exponents 2^-3 .. 2^3
    eb = rng.integers(124, 131, (16, 4))
    sa = np.zeros(64, np.uint32)
    sb = np.zeros(64, np.uint32)
    for l in range(64):
        sa[l] = 0x11 | (int(ea[l % 16, l // 16]) << 8) | 0x33 << 16 | 0x44 << 24
        sb[l] = 0x11 | 0x22 << 8 | (int(eb[l % 16, l // 16]) << 16) | 0x44 << 24
    a = pack_items(operand(A, 16, fp8_k_16, 32, fp8_codes), 8)
    b = pack_items(operand(B.T, 16, fp8_k_16, 32, fp8_codes), 8)

    def setup(w):
        w.v[4:12], w.v[12:20], w.v[0:4] = a, b, pack_c(C, 16)
        w.v[20], w.v[21] = sa, sb
    w = run(code, "scaled_16x16x128", setup)
    expect = C.copy()
    for blk in range(4):
        ks = slice(32 * blk, 32 * blk + 32)
        scale = np.outer(2.0 ** (ea[:, blk] - 127), 2.0 ** (eb[:, blk] - 127))
        expect += scale * (A[:, ks] @ B[ks, :])
    assert np.array_equal(unpack_d(w, 16), expect)
