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
from emukit import as_f32, build, run

from zyfa_emulator import EmulatorError, LoadedCode

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
    # scale bytes 0 (op_sel 0); the v_add_f32 shows MODE's fp32 denormal control in effect
    "scale_16x16x128": "v_mfma_scale_f32_16x16x128_f8f6f4 v[0:3], v[4:11], v[12:19], v[0:3], v32, v33\n"
                       "  v_add_f32_e32 v40, v41, v41\n  s_nop 15",
    "scale_32x32x64": "v_mfma_scale_f32_32x32x64_f8f6f4 v[0:15], v[16:23], v[24:31], v[0:15], v32, v33\n"
                      "  v_add_f32_e32 v40, v41, v41\n  s_nop 15",
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


# --------------------------------------------------------------------------------------
# Scaled MFMA: E8M0 scale codes 0x00 / 0xFF, fp32 subnormal results, ABID[0].
#
# ISA §7.2: a scale is an 8-bit exponent with bias 127 whose valid values are -127..127,
# 0xFF being NaN, so 0x00 is 2^-127 (E8M0 has no zero); scales multiply each 32-wide K
# block's dot product before accumulation.  §7.1.5 (F8F6F4 rules): MODE's denormal control
# is ignored and input and output denormals are kept, rounding is RNE; ABID[0] = 0 makes
# every scale 1.0.

SCALED = {16: ("scale_16x16x128", 128, fp8_k_16, 4, 12), 32: ("scale_32x32x64", 64, fp8_k_32, 16, 24)}
FLUSH = 0x300           # MODE: FP_DENORM = 0 (flush fp32 and fp16/64 denormals), IEEE, DX10
KEEP = 0x3F0            # MODE: FP_DENORM = 3 for both
TINY = np.float32(2.0 ** -130)


def scale_words(e: np.ndarray, M: int) -> np.ndarray:
    """Per lane: byte 0 = e[l % M][l // M] (row / column l % M, K block l // M); the other
    bytes 0xFF so that a wrong byte select shows up as NaN."""
    return np.array([0xFFFFFF00 | int(e[l % M, l // M]) for l in range(64)], np.uint32)


def run_scaled(code, M, A, B, C, ea, eb, mode=0x2F0, loaded=None):
    name, K, kmap, a_reg, b_reg = SCALED[M]
    a = pack_items(operand(A, M, kmap, 32, fp8_codes), 8)
    b = pack_items(operand(B.T, M, kmap, 32, fp8_codes), 8)

    def setup(w):
        w.v[a_reg:a_reg + 8], w.v[b_reg:b_reg + 8], w.v[0:M * M // 64] = a, b, pack_c(C, M)
        w.v[32], w.v[33] = scale_words(ea, M), scale_words(eb, M)
        w.v[41] = np.full(64, TINY).view(np.uint32)
    return run(loaded or code, name, setup, mode=mode)


def block_sum(A, B, C, sa, sb):
    """C + sum_blk sa[:, blk] sb[:, blk]^T * (A_blk . B_blk) in float64 (exact for the
    small integers and power-of-two scales used here)."""
    out = C.astype(np.float64).copy()
    for blk in range(sa.shape[1]):
        ks = slice(32 * blk, 32 * blk + 32)
        out += np.outer(sa[:, blk], sb[:, blk]) * (A[:, ks] @ B[ks, :])
    return out


@pytest.mark.parametrize("M", [16, 32])
def test_e8m0_zero_is_two_to_the_minus_127(code, M):
    K = SCALED[M][1]
    rng = np.random.default_rng(11)
    A, B = rand_ints(rng, (M, K)), rand_ints(rng, (K, M))
    C = rand_ints(rng, (M, M), -50, 50)
    zero = np.zeros((M, K // 32), np.int64)
    # 0x00 with 0xFE: 2^-127 * 2^127 = 1 (zero would leave C, NaN would poison D)
    D = unpack_d(run_scaled(code, M, A, B, C, zero, zero + 0xFE), M)
    assert np.array_equal(D, A @ B + C)
    # 0x00 with 0x7F: 2^-127 exactly (normal fp32 results: |A.B| * 2^-127 >= 2^-127)
    D = unpack_d(run_scaled(code, M, A, B, 0 * C, zero, zero + 0x7F), M)
    assert np.array_equal(D, (A @ B) * 2.0 ** -127)
    assert np.any(D != 0)


@pytest.mark.parametrize("M", [16, 32])
def test_e8m0_ff_makes_its_row_or_column_nan(code, M):
    K = SCALED[M][1]
    nblk = K // 32
    rng = np.random.default_rng(12)
    A, B = rand_ints(rng, (M, K)), rand_ints(rng, (K, M))
    C = rand_ints(rng, (M, M), -50, 50)
    ea = rng.integers(0x7C, 0x83, (M, nblk))
    eb = rng.integers(0x7C, 0x83, (M, nblk))
    ra, ba, cb, bb = 5, nblk - 1, 9, 0
    ea[ra, ba] = 0xFF                  # A row 5, last K block
    eb[cb, bb] = 0xFF                  # B column 9, first K block
    A[ra, 32 * ba:32 * ba + 32] = 0    # a NaN scale poisons the block even with zero data
    D = unpack_d(run_scaled(code, M, A, B, C, ea, eb), M)
    nan = np.zeros((M, M), bool)
    nan[ra, :] = True
    nan[:, cb] = True
    assert np.array_equal(np.isnan(D), nan)
    sa, sb = 2.0 ** (ea - 127.0), 2.0 ** (eb - 127.0)
    assert np.array_equal(D[~nan], block_sum(A, B, C, sa, sb)[~nan])


@pytest.mark.parametrize("M", [16, 32])
@pytest.mark.parametrize("mode", [FLUSH, KEEP])
def test_scaled_mfma_keeps_subnormal_results_whatever_mode(code, M, mode):
    K = SCALED[M][1]
    rng = np.random.default_rng(13)
    A, B = rand_ints(rng, (M, K)), rand_ints(rng, (K, M))
    zero = np.zeros((M, K // 32), np.int64)
    S = A @ B
    # 2^-127 * 2^-20: D = S * 2^-147 = 4 S quanta of the fp32 subnormal range, exact
    w = run_scaled(code, M, A, B, np.zeros((M, M)), zero, zero + 107, mode=mode)
    assert (as_f32(w.v[40]) == (0 if mode == FLUSH else 2 * TINY)).all()   # MODE in effect
    D = unpack_d(w, M)
    assert np.array_equal(D, S * 2.0 ** -147)
    assert np.any((D != 0) & (np.abs(D) < 2.0 ** -126))
    # 2^-127 * 2^-24: D = S / 4 quanta, rounded to nearest even at subnormal precision
    D = unpack_d(run_scaled(code, M, A, B, np.zeros((M, M)), zero, zero + 103, mode=mode), M)
    assert np.array_equal(D, np.rint(S / 4) * 2.0 ** -149)
    assert np.any(S % 4 == 2) and np.any(S % 4 == 1)      # ties and non-ties were rounded


@pytest.mark.parametrize("M", [16, 32])
def test_scaled_mfma_keeps_subnormal_accumulator(code, M):
    # C subnormal, A.B = 0: D = C bit for bit although MODE flushes fp32 denormals
    K = SCALED[M][1]
    rng = np.random.default_rng(14)
    A = np.zeros((M, K))
    B = rand_ints(rng, (K, M))
    C = rng.integers(-(1 << 23) + 1, 1 << 23, (M, M)) * 2.0 ** -149
    e = np.full((M, K // 32), 0x7F)
    w = run_scaled(code, M, A, B, C, e, e, mode=FLUSH)
    assert (as_f32(w.v[40]) == 0).all()
    assert np.array_equal(unpack_d(w, M), C)
    # and a subnormal C plus a subnormal product: one exact sum, still subnormal
    A = rand_ints(rng, (M, K))
    zero = np.zeros((M, K // 32), np.int64)
    D = unpack_d(run_scaled(code, M, A, B, C, zero, zero + 107, mode=FLUSH), M)
    assert np.array_equal(D, C + (A @ B) * 2.0 ** -147)


def test_abid0_forces_unit_scales(code):
    # ABID[0] = 0 in the MFMA half of the 16-byte instruction (bit 11 of its first
    # dword): the scales are 1.0 whatever the scale VGPRs hold (here 0xFF, NaN).
    assert code.fetch(code.entry(code.co.kernel("scale_16x16x128"))).abid & 1  # LLVM sets it
    loaded, entry = patched(code, "scale_16x16x128", 8, lambda w: w & ~(1 << 11))
    assert loaded.fetch(entry).abid & 1 == 0
    rng = np.random.default_rng(15)
    A, B = rand_ints(rng, (16, 128)), rand_ints(rng, (128, 16))
    C = rand_ints(rng, (16, 16), -50, 50)
    nan = np.full((16, 4), 0xFF)
    D = unpack_d(run_scaled(code, 16, A, B, C, nan, nan, loaded=loaded), 16)
    assert np.array_equal(D, A @ B + C)


def patched(code, name: str, offset: int, edit) -> tuple:
    """A private copy of the loaded code with the dword at ``offset`` bytes into kernel
    ``name`` replaced by ``edit(dword)``; returns (copy, entry address)."""
    loaded = LoadedCode(code.co)
    entry = loaded.entry(code.co.kernel(name))
    off = entry - loaded.base + offset
    word = int(loaded.buf[off:off + 4].view(np.uint32)[0])
    loaded.buf[off:off + 4] = np.array([edit(word)], np.uint32).view(np.uint8)
    loaded.image = loaded.buf.tobytes()
    return loaded, entry


def test_scale_operand_other_than_a_vgpr_is_refused(code):
    # SRC0 of the scale prefix (bits 8:0 of its second dword) set to 242, the inline
    # constant 1.0: the guide would take its exponent field, which is not modelled
    loaded, entry = patched(code, "scale_16x16x128", 4, lambda w: (w & ~0x1FF) | 242)
    assert loaded.fetch(entry).scale[0] == 242
    e = np.full((16, 4), 0x7F)
    with pytest.raises(EmulatorError, match="scale operands other than VGPRs"):
        run_scaled(code, 16, np.zeros((16, 128)), np.zeros((128, 16)), np.zeros((16, 16)), e, e,
                   loaded=loaded)
