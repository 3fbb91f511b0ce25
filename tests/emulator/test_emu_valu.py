"""Vector ALU instructions, one behaviour at a time.  Expected values are worked out by
hand from the CDNA4 ISA guide's instruction definitions (chapter 12) and operand
modifier rules (chapter 6 / 13), not from running the kernels."""

import numpy as np
import pytest
from emukit import as_f32, build, f32, run

LANE = np.arange(64)

SNIPPETS = {
    "add_mods": "v_add_f32_e64 v2, -v0, |v1|",
    "mul_omod_clamp": "v_mul_f32_e64 v2, v0, v1 clamp mul:2",
    "fma": "v_fma_f32 v3, v0, v1, v2",
    "fmac": "v_fmac_f32_e32 v2, v0, v1",
    "mul_then_add": "v_mul_f32_e32 v3, v0, v1\n  v_add_f32_e32 v3, v3, v2",
    "max": "v_max_f32_e32 v2, v0, v1",
    "max3": "v_max3_f32 v3, v0, v1, v2",
    "exp": "v_exp_f32_e32 v1, v0",
    "log": "v_log_f32_e32 v1, v0",
    "rcp": "v_rcp_f32_e32 v1, v0",
    "cvt_bf16": "v_cvt_pk_bf16_f32 v2, v0, v1",
    "cvt_u32": "v_cvt_u32_f32_e32 v1, v0",
    "cvt_f32_u32": "v_cvt_f32_u32_e32 v1, v0",
    "cndmask_vcc": "v_cndmask_b32_e32 v2, v0, v1, vcc",
    "cndmask_sgpr": "v_cndmask_b32_e64 v2, v0, 1.0, s[4:5]",
    "cmp_gt_i32": "v_cmp_gt_i32_e32 vcc, v0, v1",
    "cmp_e64_neq": "v_cmp_neq_f32_e64 s[6:7], v0, v1",
    "cmpx": "v_cmpx_gt_u32_e32 vcc, v0, v1\n  v_mov_b32_e32 v2, 7",
    "divide": """
  v_div_scale_f32 v2, s[0:1], v1, v1, v0
  v_rcp_f32_e32 v3, v2
  v_fma_f32 v4, -v2, v3, 1.0
  v_fmac_f32_e32 v3, v4, v3
  v_div_scale_f32 v4, vcc, v0, v1, v0
  v_mul_f32_e32 v5, v4, v3
  v_fma_f32 v6, -v2, v5, v4
  v_fmac_f32_e32 v5, v6, v3
  v_fma_f32 v2, -v2, v5, v4
  v_div_fmas_f32 v2, v2, v3, v5
  v_div_fixup_f32 v2, v2, v1, v0""",
    "mad_u64": "v_mad_u64_u32 v[4:5], s[8:9], v0, v1, v[2:3]",
    "lshl_add_u64": "v_lshl_add_u64 v[4:5], v[0:1], 3, v[2:3]",
    "mov_b64": "v_mov_b64_e32 v[2:3], s[4:5]",
    "int_ops": """
  v_bfe_u32 v2, v0, 4, 6
  v_and_or_b32 v3, v0, 48, v1
  v_lshl_or_b32 v4, v0, 8, v1
  v_add3_u32 v5, v0, v1, 7
  v_mul_lo_u32 v6, v0, v1
  v_mul_hi_u32 v7, v0, v1
  v_mul_u32_u24_e32 v8, v0, v1
  v_ashrrev_i32_e32 v9, 4, v0
  v_lshrrev_b32_e32 v10, 4, v0
  v_lshlrev_b32_e32 v11, 36, v0
  v_lshlrev_b64 v[12:13], 40, v[0:1]
  v_xor_b32_e32 v14, 64, v0
  v_sub_u32_e32 v15, v1, v0""",
    "med3_int": "v_med3_i32 v2, v0, 0, 16\n  v_med3_i32 v3, v0, v1, s4\n  v_med3_u32 v4, v0, v1, 16",
    "add_co": "v_add_co_u32_e32 v2, vcc, v0, v1\n  v_addc_co_u32_e32 v3, vcc, 0, v1, vcc",
    "sdwa_or": "v_or_b32_sdwa v2, v0, v1 dst_sel:DWORD dst_unused:UNUSED_PAD src0_sel:DWORD src1_sel:WORD_0",
    "sdwa_byte": "v_add_u32_sdwa v2, v0, v1 dst_sel:BYTE_1 dst_unused:UNUSED_PRESERVE src0_sel:BYTE_2 src1_sel:BYTE_0",
    "sdwa_sext": "v_mov_b32_sdwa v2, v0 dst_sel:DWORD dst_unused:UNUSED_PAD src0_sel:WORD_1",
    "dpp_shr": "v_mov_b32_dpp v2, v0 row_shr:1 row_mask:0xf bank_mask:0xf",
    "dpp_shr_bc": "v_mov_b32_dpp v2, v0 row_shr:1 row_mask:0xf bank_mask:0xf bound_ctrl:1",
    "dpp_quad": "v_add_f32_dpp v2, v0, v1 quad_perm:[3,2,1,0] row_mask:0x5 bank_mask:0xf",
    "pk_mul": "v_pk_mul_f32 v[4:5], v[0:1], v[2:3] op_sel_hi:[0,1]",
    "pk_fma": "v_pk_fma_f32 v[4:5], v[0:1], s[8:9], v[2:3] neg_lo:[0,0,1]",
    "pk_add_sel": "v_pk_add_f32 v[4:5], v[0:1], v[2:3] op_sel:[1,0] op_sel_hi:[0,1]",
    "pk_mov": "v_pk_mov_b32 v[4:5], v[0:1], v[2:3] op_sel:[1,0]",
    "permlane32": "v_permlane32_swap_b32_e32 v2, v3",
    "permlane16": "v_permlane16_swap_b32_e32 v2, v3",
    "readfirstlane": "v_readfirstlane_b32 s10, v0",
    "readlane": "v_readlane_b32 s10, v0, 37\n  v_writelane_b32 v1, s11, 5",
    "mbcnt": "v_mbcnt_lo_u32_b32 v1, -1, 0\n  v_mbcnt_hi_u32_b32 v1, -1, v1",
    "exec_mask": "v_mov_b32_e32 v1, 5",
    "cvt_pk_fp8": "v_cvt_pk_fp8_f32 v2, v0, v1\n  v_cvt_pk_fp8_f32 v3, v0, v1 op_sel:[0,0,1]",
    "cvt_pk_bf8": "v_cvt_pk_bf8_f32 v2, v0, v1",
    "cvt_f32_fp8": "v_cvt_f32_fp8_sdwa v1, v0 src0_sel:BYTE_2\n  v_cvt_pk_f32_fp8_sdwa v[2:3], v0 src0_sel:WORD_1\n  v_cvt_f32_fp8_e32 v4, v0",
    "cvt_scale_fp8": "v_cvt_scalef32_pk_fp8_f32 v2, v0, v1, v3",
    "denorm_add": {"body": "v_add_f32_e32 v2, v0, v1"},
    "accvgpr": "v_accvgpr_write_b32 a3, v0\n  v_accvgpr_mov_b32 a4, a3\n  v_accvgpr_read_b32 v2, a4",
    "bitop3": "v_bitop3_b32 v3, v0, v1, v2 bitop3:0xca",
    "fmamk": "v_fmamk_f32 v2, v0, 0x40400000, v1",
    "ashr_pk": """
  v_ashr_pk_u8_i32 v3, v0, v1, 8
  v_ashr_pk_u8_i32 v3, v1, v0, v2 op_sel:[0,0,0,1]
  v_ashr_pk_i8_i32 v4, v0, v1, v2""",
    # the FP8 kernels' byte: y 2^-141 as an fp32 subnormal (FMA), then its bits >> 8
    "ashr_byte": """
  v_pk_fma_f32 v[4:5], v[0:1], s[6:7], v[2:3] op_sel_hi:[1,0,1] neg_lo:[0,0,1] neg_hi:[0,0,1]
  s_nop 0
  v_ashr_pk_u8_i32 v6, v4, v5, 8""",
    "exp_clamp": "v_exp_f32_e64 v1, v0 clamp",
    "fma_abs_bump": "v_fma_f32 v2, |v0|, s4, v0",
    "cmp_nle": "v_cmp_nle_f32_e64 s[6:7], v0, 2.0",
    "add_sub_i32": """
  v_add_i32 v2, v0, v1
  v_sub_i32 v3, v0, v1
  v_add_i32 v4, v0, v1 clamp
  v_sub_i32 v5, v0, v1 clamp
  v_sub_i32 v6, s4, v0
  v_add_i32 v7, v0, -16""",
}


@pytest.fixture(scope="module")
def code():
    return build(SNIPPETS)


def setv(**regs):
    """setup(): v<n>=array or scalar, s<n>=int, exec=int, vcc=int."""
    def setup(w):
        for name, val in regs.items():
            if name == "exec":
                w.exec = val
            elif name == "vcc":
                w.vcc = val
            elif name.startswith("v"):
                arr = np.asarray(val)
                w.v[int(name[1:])] = arr.view(np.uint32) if arr.dtype.itemsize == 4 and \
                    arr.dtype != np.uint32 else arr.astype(np.uint32)
            elif name.startswith("s"):
                w.s[int(name[1:])] = int(val) & 0xFFFFFFFF
            elif name == "mode":
                w.mode = val
    return setup


def F(*xs):
    return np.array(xs, np.float32)


def test_vop3_abs_neg(code):
    a = np.linspace(-4, 4, 64).astype(np.float32)
    b = np.linspace(3, -5, 64).astype(np.float32)
    w = run(code, "add_mods", setv(v0=a, v1=b))
    assert np.array_equal(as_f32(w.v[2]), -a + np.abs(b))


def test_omod_then_clamp(code):
    # D = clamp(2 * (a * b)) to [0, 1]
    w = run(code, "mul_omod_clamp", setv(v0=np.full(64, 0.25, np.float32),
                                          v1=np.linspace(-4, 4, 64).astype(np.float32)))
    b = np.linspace(-4, 4, 64).astype(np.float32)
    assert np.array_equal(as_f32(w.v[2]), np.clip(0.5 * b, 0, 1).astype(np.float32))


def test_fma_rounds_once(code):
    # a = b = 1 + 2^-12: a*b = 1 + 2^-11 + 2^-24 exactly, a tie between two floats.
    # With c = 2^-60 the exact sum lies just above the tie: one rounding gives
    # 1 + 2^-11 + 2^-23; rounding the product first (to the even 1 + 2^-11) loses it.
    a = np.float32(1 + 2 ** -12)
    c = np.float32(2.0 ** -60)
    setup = setv(v0=np.full(64, a), v1=np.full(64, a), v2=np.full(64, c))
    fused = run(code, "fma", setup)
    assert as_f32(fused.v[3][0]) == np.float32(1 + 2 ** -11 + 2 ** -23)
    unfused = run(code, "mul_then_add", setup)
    assert as_f32(unfused.v[3][0]) == np.float32(1 + 2 ** -11)
    acc = run(code, "fmac", setup)            # v2 = v0 * v1 + v2
    assert as_f32(acc.v[2][0]) == np.float32(1 + 2 ** -11 + 2 ** -23)


def test_max_ieee_nan_and_zero_rules(code):
    qnan, snan = 0x7FC00000, 0x7F800001
    a = np.zeros(64, np.uint32)
    b = np.zeros(64, np.uint32)
    a[0], b[0] = qnan, f32(1.0)          # quiet NaN operand: the other one
    a[1], b[1] = f32(2.0), qnan
    a[2], b[2] = f32(-0.0), f32(0.0)     # +0 beats -0
    a[3], b[3] = f32(0.0), f32(-0.0)
    a[4], b[4] = snan, f32(1.0)          # IEEE mode: signalling NaN -> quiet NaN
    a[5], b[5] = f32(-3.0), f32(-2.0)
    w = run(code, "max", setv(v0=a, v1=b))
    r = w.v[2]
    assert r[0] == f32(1.0) and r[1] == f32(2.0)
    assert r[2] == f32(0.0) and r[3] == f32(0.0)
    assert r[4] == 0x7FC00001
    assert r[5] == f32(-2.0)


def test_max3(code):
    w = run(code, "max3", setv(v0=np.full(64, -1, np.float32), v1=LANE.astype(np.float32),
                                  v2=np.full(64, 10.5, np.float32)))
    assert np.array_equal(as_f32(w.v[3]), np.maximum(LANE, 10.5).astype(np.float32))


def test_exp_is_base_two(code):
    x = np.zeros(64, np.float32)
    x[:6] = [3.0, 0.5, -np.inf, np.inf, -130.0, -0.0]
    w = run(code, "exp", setv(v0=x))
    r = as_f32(w.v[1])
    assert r[0] == 8.0
    assert r[1] == np.float32(1.4142135)      # sqrt(2) rounded to float32
    assert r[2] == 0.0 and r[3] == np.inf
    assert r[4] == 0.0                        # 2^-130 is an fp32 denormal: flushed
    assert r[5] == 1.0


def test_log_is_base_two(code):
    x = np.ones(64, np.float32)
    x[:4] = [8.0, 0.0, -1.0, np.inf]
    w = run(code, "log", setv(v0=x))
    r = as_f32(w.v[1])
    assert r[0] == 3.0 and r[1] == -np.inf and np.isnan(r[2]) and r[3] == np.inf


def test_rcp(code):
    x = np.ones(64, np.float32)
    x[:3] = [4.0, 0.0, -0.5]
    r = as_f32(run(code, "rcp", setv(v0=x)).v[1])
    assert r[0] == 0.25 and r[1] == np.inf and r[2] == -2.0


def test_cvt_pk_bf16_rounds_to_nearest_even(code):
    lo = np.full(64, 1.0, np.float32)
    hi = np.full(64, 1.0, np.float32)
    lo[0] = 1 + 2 ** -8            # halfway between bf16 1.0 and 1 + 2^-7: even -> 1.0
    hi[0] = 1 + 3 * 2 ** -8        # halfway between 1 + 2^-7 and 1 + 2^-6: even -> 1 + 2^-6
    lo[1] = 1 + 2 ** -8 + 2 ** -20  # above halfway -> 1 + 2^-7
    hi[1] = -2.0
    lo[2] = np.nan
    w = run(code, "cvt_bf16", setv(v0=lo, v1=hi))
    r = w.v[2]
    assert r[0] == 0x3F82_3F80
    assert r[1] == 0xC000_3F81
    assert (r[2] & 0x7F80) == 0x7F80 and (r[2] & 0x7F) != 0     # NaN stays NaN


def test_cvt_u32_f32_truncates_and_clamps(code):
    x = np.zeros(64, np.float32)
    x[:5] = [3.7, -1.5, np.nan, 5e9, np.inf]
    r = run(code, "cvt_u32", setv(v0=x)).v[1]
    assert list(r[:5]) == [3, 0, 0, 0xFFFFFFFF, 0xFFFFFFFF]


def test_cvt_f32_u32(code):
    x = np.zeros(64, np.uint32)
    x[:3] = [7, 0xFFFFFFFF, (1 << 24) + 1]
    r = as_f32(run(code, "cvt_f32_u32", setv(v0=x)).v[1])
    assert r[0] == 7.0 and r[1] == np.float32(4294967296.0) and r[2] == 16777216.0


def test_cndmask_reads_vcc_or_an_sgpr_pair(code):
    mask = 0xF0F0_0000_0000_00FF
    sel = np.array([(mask >> i) & 1 for i in range(64)], bool)
    w = run(code, "cndmask_vcc", setv(v0=np.full(64, 1, np.uint32), v1=np.full(64, 2, np.uint32),
                                       vcc=mask))
    assert np.array_equal(w.v[2], np.where(sel, 2, 1))
    w = run(code, "cndmask_sgpr", setv(v0=np.full(64, 9, np.uint32), s4=mask & 0xFFFFFFFF,
                                        s5=mask >> 32))
    assert np.array_equal(w.v[2], np.where(sel, f32(1.0), 9))


def test_cmp_writes_zero_for_inactive_lanes(code):
    a = LANE.astype(np.int32) - 32
    b = np.zeros(64, np.int32)
    ex = (1 << 64) - 1 - (1 << 40)
    w = run(code, "cmp_gt_i32", setv(v0=a, v1=b, exec=ex))
    expect = sum(1 << i for i in range(33, 64)) & ex
    assert w.vcc == expect


def test_cmp_neq_is_true_for_nan(code):
    a = np.zeros(64, np.float32)
    a[3] = np.nan
    w = run(code, "cmp_e64_neq", setv(v0=a, v1=np.zeros(64, np.float32)))
    assert w.s[6] == 1 << 3 and w.s[7] == 0


def test_cmpx_writes_exec(code):
    w = run(code, "cmpx", setv(v0=LANE.astype(np.uint32), v1=np.full(64, 60, np.uint32),
                               v2=np.zeros(64, np.uint32)))
    assert w.exec == sum(1 << i for i in range(61, 64))
    assert np.array_equal(w.v[2], np.where(LANE > 60, 7, 0))


def test_division_sequence_is_correctly_rounded(code):
    rng = np.random.default_rng(1)
    n = rng.standard_normal(64).astype(np.float32)
    d = (rng.standard_normal(64) * 10).astype(np.float32)
    d[0], n[0] = 3.0, 1.0
    d[1], n[1] = 0.0, 1.0
    w = run(code, "divide", setv(v0=n, v1=d))
    q = as_f32(w.v[2])
    with np.errstate(divide="ignore"):
        assert np.array_equal(q, (n / d).astype(np.float32))


def test_mad_u64_u32_carry(code):
    a = np.full(64, 0xFFFFFFFF, np.uint32)
    b = np.full(64, 0xFFFFFFFF, np.uint32)
    c_lo = np.zeros(64, np.uint32)
    c_hi = np.zeros(64, np.uint32)
    c_lo[1], c_hi[1] = 0xFFFFFFFF, 0xFFFFFFFF     # lane 1 overflows 64 bits
    w = run(code, "mad_u64", setv(v0=a, v1=b, v2=c_lo, v3=c_hi))
    # (2^32-1)^2 = 0xFFFFFFFE_00000001
    assert w.v[4][0] == 0x00000001 and w.v[5][0] == 0xFFFFFFFE
    assert w.v[4][1] == 0x00000000 and w.v[5][1] == 0xFFFFFFFE   # + 2^64 - 1, wrapped
    assert w.s[8] == 0b10 and w.s[9] == 0


def test_lshl_add_u64_and_mov_b64(code):
    base = (np.arange(64, dtype=np.uint64) << 32) + 0xFFFFFFF0
    add = np.full(64, 0x10, np.uint64)
    w = run(code, "lshl_add_u64", setv(v0=(base & 0xFFFFFFFF).astype(np.uint32),
                                        v1=(base >> 32).astype(np.uint32),
                                        v2=(add & 0xFFFFFFFF).astype(np.uint32),
                                        v3=np.zeros(64, np.uint32)))
    got = w.v[4].astype(np.uint64) | (w.v[5].astype(np.uint64) << 32)
    assert np.array_equal(got, (base << 3) + add)
    w = run(code, "mov_b64", setv(s4=0x12345678, s5=0x9ABCDEF0))
    assert (w.v[2] == 0x12345678).all() and (w.v[3] == 0x9ABCDEF0).all()


def test_integer_ops(code):
    a = (LANE.astype(np.uint32) * np.uint32(0x01010101)) ^ np.uint32(0x80000000)
    b = np.full(64, 0xF00F, np.uint32)
    w = run(code, "int_ops", setv(v0=a, v1=b))
    a64, b64 = a.astype(np.uint64), b.astype(np.uint64)
    assert np.array_equal(w.v[2], (a >> 4) & 0x3F)
    assert np.array_equal(w.v[3], (a & 48) | b)
    assert np.array_equal(w.v[4], (a << 8) | b)
    assert np.array_equal(w.v[5], a + b + 7)
    assert np.array_equal(w.v[6], ((a64 * b64) & 0xFFFFFFFF).astype(np.uint32))
    assert np.array_equal(w.v[7], ((a64 * b64) >> 32).astype(np.uint32))
    assert np.array_equal(w.v[8], (a & 0xFFFFFF) * (b & 0xFFFFFF))
    assert np.array_equal(w.v[9], (a.view(np.int32) >> 4).view(np.uint32))
    assert np.array_equal(w.v[10], a >> 4)
    assert np.array_equal(w.v[11], a << 4)                       # shift count is S0[4:0]
    pair = a64 | (b64 << 32)
    got = w.v[12].astype(np.uint64) | (w.v[13].astype(np.uint64) << 32)
    assert np.array_equal(got, pair << 40)
    assert np.array_equal(w.v[14], a ^ 64)
    assert np.array_equal(w.v[15], b - a)


def test_med3_integer_is_the_middle_value(code):
    a = (LANE.astype(np.int64) * 7 - 200).astype(np.int32)          # -200 .. 241, signed
    b = (LANE.astype(np.int64) * -3 + 90).astype(np.int32)
    w = run(code, "med3_int", setv(v0=a.view(np.uint32), v1=b.view(np.uint32), s4=5))
    mid = lambda x, y, z: np.maximum(np.minimum(x, y), np.minimum(np.maximum(x, y), z))
    assert np.array_equal(w.v[2].view(np.int32), np.clip(a, 0, 16))
    assert np.array_equal(w.v[3].view(np.int32), mid(a.astype(np.int64), b, 5))
    ua, ub = a.view(np.uint32).astype(np.uint64), b.view(np.uint32).astype(np.uint64)
    assert np.array_equal(w.v[4].astype(np.uint64), mid(ua, ub, 16))    # unsigned: negatives are large


def test_add_with_carry_chain(code):
    a = np.full(64, 0xFFFFFFFF, np.uint32)
    b = LANE.astype(np.uint32)
    w = run(code, "add_co", setv(v0=a, v1=b))
    assert np.array_equal(w.v[2], b - 1)                         # wrapped
    assert np.array_equal(w.v[3], b + (LANE > 0))                # carry-in from lane's first add
    assert w.vcc == 0


def test_sdwa_word_select_like_the_kernels(code):
    a = np.full(64, 0xABCD0000, np.uint32)
    b = np.full(64, 0x1234_5678, np.uint32)
    w = run(code, "sdwa_or", setv(v0=a, v1=b))
    assert (w.v[2] == 0xABCD5678).all()


def test_sdwa_byte_selects_and_preserve(code):
    a = np.full(64, 0x00_7F_00_00, np.uint32)     # byte 2 = 0x7F
    b = np.full(64, 0x00_00_00_02, np.uint32)     # byte 0 = 2
    old = np.full(64, 0xDEADBEEF, np.uint32)
    w = run(code, "sdwa_byte", setv(v0=a, v1=b, v2=old))
    assert (w.v[2] == 0xDEAD81EF).all()           # 0x7F + 2 = 0x81 into byte 1


def test_sdwa_source_word_is_zero_extended(code):
    w = run(code, "sdwa_sext", setv(v0=np.full(64, 0x8001_1234, np.uint32)))
    assert (w.v[2] == 0x8001).all()


def test_dpp_row_shift_and_bound_ctrl(code):
    src = LANE.astype(np.uint32) + 100
    old = np.full(64, 7, np.uint32)
    w = run(code, "dpp_shr", setv(v0=src, v2=old))
    first_of_row = (LANE % 16) == 0
    assert np.array_equal(w.v[2], np.where(first_of_row, 7, src - 1))   # invalid lane: not written
    w = run(code, "dpp_shr_bc", setv(v0=src, v2=old))
    assert np.array_equal(w.v[2], np.where(first_of_row, 0, src - 1))   # bound_ctrl: reads 0


def test_dpp_quad_perm_and_row_mask(code):
    a = LANE.astype(np.float32)
    w = run(code, "dpp_quad", setv(v0=a, v1=np.full(64, 0.5, np.float32),
                                   v2=np.full(64, -1, np.float32)))
    perm = (LANE & ~3) | (3 - (LANE & 3))
    rows_on = ((LANE // 16) % 2) == 0                 # row_mask 0x5: rows 0 and 2
    assert np.array_equal(as_f32(w.v[2]), np.where(rows_on, perm + 0.5, -1).astype(np.float32))


def test_pk_mul_broadcasts_the_low_half(code):
    s = np.full(64, 3.0, np.float32)
    x = LANE.astype(np.float32)
    y = -LANE.astype(np.float32)
    w = run(code, "pk_mul", setv(v0=s, v1=np.full(64, 99.0, np.float32), v2=x, v3=y))
    assert np.array_equal(as_f32(w.v[4]), 3 * x) and np.array_equal(as_f32(w.v[5]), 3 * y)


def test_pk_fma_with_sgpr_pair_and_neg(code):
    a_lo, a_hi = LANE.astype(np.float32), np.full(64, 2.0, np.float32)
    c_lo, c_hi = np.full(64, 1.0, np.float32), np.full(64, 5.0, np.float32)
    w = run(code, "pk_fma", setv(v0=a_lo, v1=a_hi, v2=c_lo, v3=c_hi, s8=f32(0.5), s9=f32(4.0)))
    assert np.array_equal(as_f32(w.v[4]), a_lo * 0.5 - 1.0)       # neg_lo on src2
    assert np.array_equal(as_f32(w.v[5]), a_hi * 4.0 + 5.0)


def test_pk_add_op_sel(code):
    # lo = src0.hi + src1.lo, hi = src0.lo + src1.hi
    w = run(code, "pk_add_sel", setv(v0=np.full(64, 1.0, np.float32), v1=np.full(64, 10.0, np.float32),
                                     v2=np.full(64, 100.0, np.float32), v3=np.full(64, 1000.0, np.float32)))
    assert (as_f32(w.v[4]) == 110.0).all() and (as_f32(w.v[5]) == 1001.0).all()


def test_pk_mov(code):
    # D.lo = S0[op_sel[0]] (the high half), D.hi = S1[op_sel[1]] (the low half)
    w = run(code, "pk_mov", setv(v0=np.full(64, 1, np.uint32), v1=np.full(64, 2, np.uint32),
                                 v2=np.full(64, 3, np.uint32), v3=np.full(64, 4, np.uint32)))
    assert (w.v[4] == 2).all() and (w.v[5] == 3).all()


def test_permlane32_swap(code):
    d, s = LANE.astype(np.uint32), LANE.astype(np.uint32) + 1000
    w = run(code, "permlane32", setv(v2=d, v3=s))
    # src lanes 0..31 <-> vdst lanes 32..63
    assert np.array_equal(w.v[3][:32], d[32:]) and np.array_equal(w.v[3][32:], s[32:])
    assert np.array_equal(w.v[2][32:], s[:32]) and np.array_equal(w.v[2][:32], d[:32])


def test_permlane16_swap(code):
    d, s = LANE.astype(np.uint32), LANE.astype(np.uint32) + 1000
    w = run(code, "permlane16", setv(v2=d, v3=s))
    odd_row = (LANE // 16) % 2 == 1
    # src even rows <-> vdst odd rows
    assert np.array_equal(w.v[3], np.where(odd_row, s, d[np.minimum(LANE + 16, 63)]))
    assert np.array_equal(w.v[2], np.where(odd_row, s[LANE - 16], d))


def test_readfirstlane_uses_the_lowest_active_lane(code):
    w = run(code, "readfirstlane", setv(v0=LANE.astype(np.uint32) * 3, exec=0xFFFF_0000_0000_0000))
    assert w.s[10] == 48 * 3
    w = run(code, "readfirstlane", setv(v0=LANE.astype(np.uint32) * 3, exec=0))
    assert w.s[10] == 0


def test_readlane_writelane_ignore_exec(code):
    w = run(code, "readlane", setv(v0=LANE.astype(np.uint32), v1=np.zeros(64, np.uint32), s11=99,
                                   exec=1))
    assert w.s[10] == 37
    assert w.v[1][5] == 99 and w.v[1].sum() == 99


def test_mbcnt_counts_lower_lanes(code):
    w = run(code, "mbcnt", setv(exec=(1 << 64) - 1))
    assert np.array_equal(w.v[1], LANE)


def test_exec_masks_vector_writes(code):
    ex = 0x0000_FFFF_0000_0001
    w = run(code, "exec_mask", setv(v1=np.full(64, 9, np.uint32), exec=ex))
    on = np.array([(ex >> i) & 1 for i in range(64)], bool)
    assert np.array_equal(w.v[1], np.where(on, 5, 9))


def test_cvt_pk_fp8_packs_and_preserves_the_other_half(code):
    a = np.full(64, 1.0, np.float32)
    b = np.full(64, -448.0, np.float32)
    a[1], b[1] = 0.0625, 2 ** -9        # e4m3: 0x18 (2^-4), 0x01 (smallest subnormal)
    a[2], b[2] = 500.0, np.nan          # overflow without FP16_OVFL: NaN (0x7f)
    old = np.full(64, 0xAABBCCDD, np.uint32)
    w = run(code, "cvt_pk_fp8", setv(v0=a, v1=b, v2=old, v3=old))
    assert w.v[2][0] == 0xAABB_FE38                 # 1.0 = 0x38, -448 = 0xfe in bits 15:0
    assert w.v[3][0] == 0xFE38_CCDD                 # op_sel[3]: bits 31:16
    assert w.v[2][1] == 0xAABB_0118
    assert (w.v[2][2] & 0x7F) == 0x7F and ((w.v[2][2] >> 8) & 0x7F) == 0x7F
    # FP16_OVFL (MODE bit 23) saturates to +-448 instead
    w = run(code, "cvt_pk_fp8", setv(v0=a, v1=b, v2=old, v3=old, mode=0x2F0 | 1 << 23))
    assert w.v[2][2] & 0xFF == 0x7E


def test_cvt_pk_bf8(code):
    a = np.full(64, 1.0, np.float32)          # e5m2 1.0 = 0x3c
    b = np.full(64, 65536.0, np.float32)      # above 57344: infinity without saturation
    w = run(code, "cvt_pk_bf8", setv(v0=a, v1=b, v2=np.zeros(64, np.uint32)))
    assert w.v[2][0] == 0x7C3C


def test_cvt_from_fp8_selects_bytes_and_words(code):
    x = np.full(64, 0x40_B8_30_08, np.uint32)  # e4m3 bytes: 0x08, 0x30, 0xb8, 0x40
    w = run(code, "cvt_f32_fp8", setv(v0=x))
    assert (as_f32(w.v[1]) == -1.0).all()                 # byte 2: 0xb8 = -1.0
    assert (as_f32(w.v[2]) == -1.0).all() and (as_f32(w.v[3]) == 2.0).all()   # word 1
    assert (as_f32(w.v[4]) == 2.0 ** -6).all()            # byte 0: 0x08 = 2^-6


def test_cvt_scalef32_divides_by_the_scale(code):
    a = np.full(64, 8.0, np.float32)
    b = np.full(64, -2.0, np.float32)
    w = run(code, "cvt_scale_fp8", setv(v0=a, v1=b, v3=np.full(64, 4.0, np.float32),
                                         v2=np.zeros(64, np.uint32)))
    assert w.v[2][0] == 0xB0_40                  # 8/4 = 2.0 -> 0x40, -2/4 = -0.5 -> 0xb0


def test_denormals_flushed_when_mode_says_so(code):
    tiny = np.full(64, 2 ** -130, np.float32)
    w = run(code, "denorm_add", setv(v0=tiny, v1=tiny), mode=0x3F0)    # FP_DENORM 3: keep
    assert (as_f32(w.v[2]) == np.float32(2 ** -129)).all()
    w = run(code, "denorm_add", setv(v0=tiny, v1=tiny), mode=0x300)    # FP_DENORM 0: flush
    assert (as_f32(w.v[2]) == 0).all()


def test_accvgprs_live_at_accum_offset(code):
    w = run(code, "accvgpr", setv(v0=LANE.astype(np.uint32)))
    assert np.array_equal(w.v[2], LANE)
    assert np.array_equal(w.v[256 + 4], LANE)          # a4 = row accum_offset + 4


def test_bitop3_truth_table(code):
    # 0xca = (a & b) | (~a & c): the bit-select of b and c by a
    a = np.full(64, 0xFF00FF00, np.uint32)
    b = np.full(64, 0x12345678, np.uint32)
    c = np.full(64, 0x9ABCDEF0, np.uint32)
    w = run(code, "bitop3", setv(v0=a, v1=b, v2=c))
    assert (w.v[3] == ((a & b) | (~a & c))).all()


def test_fmamk_literal(code):
    w = run(code, "fmamk", setv(v0=np.full(64, 2.0, np.float32), v1=np.full(64, 1.0, np.float32)))
    assert (as_f32(w.v[2]) == 7.0).all()


def test_add_sub_i32_wrap_and_clamp_saturates(code):
    # VOP3A v_add_i32 / v_sub_i32 (CDNA4 ISA chapter 12): D.i32 = S0.i32 +/- S1.i32, no
    # carry out; wraps without clamp, saturates to the signed 32-bit range with clamp.
    i32max, i32min = 2**31 - 1, -2**31
    a = np.array([5, -7, i32max, i32min, i32max - 3, i32min + 3, 0, -1] * 8, np.int64)
    b = np.array([3, 9, 1, -1, -5, 5, i32min, i32max] * 8, np.int64)
    w = run(code, "add_sub_i32", setv(v0=a.astype(np.int32), v1=b.astype(np.int32),
                                      s4=-100))

    def wrap(x):
        return ((x + 2**31) % 2**32 - 2**31).astype(np.int32)

    def sat(x):
        return np.clip(x, i32min, i32max).astype(np.int32)

    got = {r: w.v[r].view(np.int32) for r in range(2, 8)}
    assert np.array_equal(got[2], wrap(a + b))
    assert np.array_equal(got[3], wrap(a - b))
    assert np.array_equal(got[4], sat(a + b))
    assert np.array_equal(got[5], sat(a - b))
    assert got[4][2] == i32max and got[5][6] == i32max and got[3][6] == i32min   # saturated / wrapped
    assert np.array_equal(got[6], wrap(-100 - a))
    assert np.array_equal(got[7], wrap(a - 16))


def test_ashr_pk_shifts_saturates_and_writes_the_selected_half(code):
    # CDNA4 ISA chapter 12, V_ASHR_PK_U8_I32 / V_ASHR_PK_I8_I32: byte 0 = SAT8(S0.i32 >>
    # S2[4:0]), byte 1 = SAT8(S1.i32 >> S2[4:0]) (arithmetic shift), D[15:0] = the pair;
    # op_sel[3] writes D[31:16] instead, the other half keeps its value.
    vals = np.array([120 * 256 + 255, 256 * 256, -1, -2**31, 2**31 - 1, 0x7FC00000,
                     0xFF800000 - 2**32, 127 * 256, 0, 255, 1], np.int64)
    a = np.resize(vals, 64)
    b = np.resize(vals[::-1], 64)
    shift = np.resize([8, 40], 64)                   # only S2[4:0] counts: 40 shifts by 8
    w = run(code, "ashr_pk", setv(v0=a.astype(np.int32), v1=b.astype(np.int32),
                                  v2=shift.astype(np.uint32), v3=np.full(64, 0xAABBCCDD, np.uint32)))

    def sat(x, lo, hi):
        return np.clip(x >> 8, lo, hi) & 0xFF

    u_lo = sat(a, 0, 255) | sat(b, 0, 255) << 8
    u_hi = sat(b, 0, 255) | sat(a, 0, 255) << 8
    assert np.array_equal(w.v[3], (u_hi << 16 | u_lo).astype(np.uint32))
    i_lo = sat(a, -128, 127) | sat(b, -128, 127) << 8
    assert np.array_equal(w.v[4] & 0xFFFF, i_lo.astype(np.uint32))
    # by hand: 120 * 256 + 255 -> 120; 65536 -> 255 (saturated); -1 -> 0 (u8) / 0xFF (i8,
    # -1); -2^31 -> 0 / 0x80 (-128); a positive NaN's bits -> 255; -inf's bits -> 0
    assert [int(x) for x in sat(vals, 0, 255)] == [120, 255, 0, 0, 255, 255, 0, 127, 0, 0, 0]
    assert [int(x) for x in sat(vals[:4], -128, 127)] == [120, 127, 0xFF, 0x80]


def test_ashr_byte_of_a_subnormal_fma_rounds_and_clamps(code):
    """The FP8 kernels' P byte: v_pk_fma_f32 writes z = S a - U with a = 2^-120 and U = u
    2^-141, so z = (2^21 S - u) 2^-141: while it is an fp32 subnormal (denormals kept) its
    bits are rint(256 (2^21 S - u)) (nearest-even on the exact value), and >> 8 with u8
    saturation gives floor(y + 1/2) for u = -1/2.  Negative z (any size, -0, -inf) is 0."""
    u = -0.5                                            # code units: the byte is floor(y + 1/2)
    # y values (code units) as S = y / 2^21, exact in fp32
    ys = np.array([119.5, 119.5 - 2**-9, 119.0 + 255 / 256, 120.0 + 1 / 512, 120.0 + 3 / 512,
                   0.0, -0.5, -0.5 - 2**-9, -300.0, -2.0**40, -np.inf, 200.0, 119.5 - 2**-8], np.float64)
    want = [120, 120, 120, 120, 120, 0, 0, 0, 0, 0, 0, 200, 119]
    # 256 (y + 1/2): 119.5 - 2^-9 -> 30719.5, a tie, to the even 30720 -> 120; 119 + 255/256 ->
    # 30847 -> 120; 120 + 1/512 -> 30848.5 -> 30848 (even) -> 120; 120 + 3/512 -> 30849.5 ->
    # 30850 -> 120; -0.5 - 2^-9 -> -0.5 -> -0 -> 0; 119.5 - 2^-8 -> 30719 -> 119
    s = np.resize(ys / 2.0**21, 64).astype(np.float32)
    pairs = s.reshape(32, 2)
    regs = {"v0": np.resize(pairs[:, 0], 64), "v1": np.resize(pairs[:, 1], 64)}
    ub = np.float32(np.ldexp(u, -141))
    w = run(code, "ashr_byte", setv(**regs, v2=np.full(64, ub), v3=np.full(64, ub),
                                    s6=int(np.float32(2.0**-120).view(np.uint32)), s7=0))
    got = [(int(w.v[6][lane]) >> (8 * h)) & 0xFF for lane in range(7) for h in (0, 1)]
    assert got[:len(want)] == want
    # the subnormal z is what carries the byte: flushing fp32 denormals zeroes every byte
    w = run(code, "ashr_byte", setv(**regs, v2=np.full(64, ub), v3=np.full(64, ub),
                                    s6=int(np.float32(2.0**-120).view(np.uint32)), s7=0), mode=0x2C0)
    assert (w.v[6] & 0xFFFF == 0).all()


def test_exp_clamp_caps_at_one(code):
    # VOP3 clamp on v_exp_f32: min(2^x, 1) over [0, 1]; -inf -> 0, +inf -> 1
    x = np.resize(np.array([0.5, 0.0, -1.0, -0.25, np.inf, -np.inf, 3.0, -200.0], np.float32), 64)
    w = run(code, "exp_clamp", setv(v0=x))
    want = np.resize(np.array([1, 1, 0.5, 2.0**-0.25, 1, 0, 1, 0], np.float32), 64)
    assert np.array_equal(as_f32(w.v[1]), want)


def test_fma_abs_moves_up_by_at_least_an_ulp(code):
    # fma(|u|, 2^-23, u): u + |u| 2^-23 rounded once; for a normal u at least one ulp up,
    # whatever its sign; a subnormal u stays (its ulp is 2^-149); 0 stays 0; -inf gives NaN
    x = np.array([1.0, -1.0, 3.0, -3.0, 1.9999999, 2.0**-130, -2.0**-130, 0.0, -2.0**40, np.inf, -np.inf],
                 np.float32)
    w = run(code, "fma_abs_bump", setv(v0=np.resize(x, 64), s4=int(np.float32(2.0**-23).view(np.uint32))))
    got = as_f32(w.v[2])[:len(x)]
    normal = np.isfinite(x) & (np.abs(x) >= 2.0**-126)
    assert (got[normal] >= np.nextafter(x[normal], np.float32(np.inf))).all()
    assert got[0] == np.float32(1 + 2.0**-23) and got[1] == np.float32(-1 + 2.0**-23)
    assert got[5] == x[5] and got[6] == x[6] and got[7] == 0 and got[9] == np.inf
    assert np.isnan(got[10])


def test_cmp_nle_is_true_for_nan(code):
    # not (a <= b): NaN compares true
    x = np.resize(np.array([np.nan, 2.0, np.nextafter(np.float32(2), np.float32(3)), -np.inf, np.inf, 1.0],
                           np.float32), 64)
    w = run(code, "cmp_nle", setv(v0=x))
    m = w.s[6] | w.s[7] << 32
    assert [(m >> i) & 1 for i in range(6)] == [1, 0, 1, 0, 1, 0]
