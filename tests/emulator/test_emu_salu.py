"""Scalar ALU and program control, with results worked out from the ISA definitions."""

import numpy as np
import pytest
from emukit import build, run

from zyfa_emulator import EmulatorError

SNIPPETS = {
    "add64": "s_add_u32 s4, s0, s2\n  s_addc_u32 s5, s1, s3\n  s_cselect_b32 s6, 1, 0",
    "sub_i32_ovf": "s_sub_i32 s4, s0, s1\n  s_cselect_b32 s5, -1, 0",
    "mul": "s_mul_i32 s4, s0, s1\n  s_mul_hi_u32 s5, s0, s1\n  s_mul_hi_i32 s6, s0, s1",
    "shifts": """
  s_lshl_b64 s[4:5], s[0:1], 36
  s_lshr_b32 s6, s2, 4
  s_ashr_i32 s7, s2, 4
  s_lshl_b32 s8, s2, 33
  s_bfe_u32 s9, s2, 0x80004
  s_bfe_i32 s10, s2, 0x40018""",
    "abs_minmax": "s_abs_i32 s4, s0\n  s_min_i32 s5, s0, s1\n  s_max_u32 s6, s0, s1\n  s_cselect_b32 s7, 1, 0",
    "logic": "s_and_b32 s4, s0, s1\n  s_cselect_b32 s8, 1, 0\n  s_andn2_b64 s[6:7], s[0:1], s[2:3]\n  s_xor_b32 s9, s0, s0\n  s_cselect_b32 s10, 1, 0",
    "cmp": "s_cmp_lt_i32 s0, s1\n  s_cselect_b32 s4, 1, 0\n  s_cmp_lt_u32 s0, s1\n  s_cselect_b32 s5, 1, 0\n  s_cmp_eq_u64 s[0:1], s[2:3]\n  s_cselect_b32 s6, 1, 0\n  s_cmpk_gt_i32 s0, 0xfff0\n  s_cselect_b32 s7, 1, 0",
    "movk": "s_movk_i32 s4, 0x8000\n  s_addk_i32 s4, 0x10",
    "saveexec": """
  s_and_saveexec_b64 s[4:5], s[0:1]
  s_cselect_b32 s6, 1, 0
  v_mov_b32_e32 v1, 3
  s_or_b64 exec, exec, s[4:5]
  v_add_u32_e32 v1, 1, v1""",
    "loop": """
  s_mov_b32 s4, 0
  s_mov_b32 s5, 0
loop_top:
  s_add_u32 s5, s5, s4
  s_add_u32 s4, s4, 1
  s_cmp_lt_u32 s4, 10
  s_cbranch_scc1 loop_top""",
    "vccz_branch": """
  v_cmp_eq_u32_e32 vcc, 5, v0
  s_cbranch_vccz no_lane
  s_mov_b32 s4, 1
  s_branch done
no_lane:
  s_mov_b32 s4, 2
done:""",
    "execz_skip": """
  v_cmp_gt_u32_e32 vcc, 0, v0
  s_and_saveexec_b64 s[2:3], vcc
  s_cbranch_execz skipped
  s_mov_b32 s4, 111
skipped:
  s_or_b64 exec, exec, s[2:3]""",
    "getpc": "s_getpc_b64 s[4:5]",
    "mode": "s_getreg_b32 s4, hwreg(HW_REG_MODE)\n  s_setreg_imm32_b32 hwreg(HW_REG_MODE, 4, 2), 0\n  s_getreg_b32 s5, hwreg(HW_REG_MODE, 4, 4)",
    "bad_round": "s_setreg_imm32_b32 hwreg(HW_REG_MODE, 0, 4), 3",
    "unknown": "s_trap 2",
}


@pytest.fixture(scope="module")
def code():
    return build(SNIPPETS)


def sset(**regs):
    def setup(w):
        for name, val in regs.items():
            if name == "exec":
                w.exec = val
            elif name.startswith("v"):
                w.v[int(name[1:])] = np.asarray(val, np.uint32)
            else:
                w.s[int(name[1:])] = int(val) & 0xFFFFFFFF
    return setup


def test_64bit_add_with_carry(code):
    a, b = 0x00000001_FFFFFFFF, 0x00000002_00000001
    w = run(code, "add64", sset(s0=a, s1=a >> 32, s2=b, s3=b >> 32))
    assert w.s[4] | w.s[5] << 32 == a + b
    assert w.s[6] == 0                    # SCC = carry out of the high word: none


def test_signed_overflow_sets_scc(code):
    w = run(code, "sub_i32_ovf", sset(s0=0x80000000, s1=1))
    assert w.s[4] == 0x7FFFFFFF and w.s[5] == 0xFFFFFFFF
    w = run(code, "sub_i32_ovf", sset(s0=5, s1=7))
    assert w.s[4] == 0xFFFFFFFE and w.s[5] == 0


def test_multiplies(code):
    w = run(code, "mul", sset(s0=0xFFFFFFFE, s1=3))
    assert w.s[4] == (0xFFFFFFFE * 3) & 0xFFFFFFFF
    assert w.s[5] == (0xFFFFFFFE * 3) >> 32                 # 2
    assert w.s[6] == 0xFFFFFFFF                              # -2 * 3 = -6: high word -1


def test_shifts_and_bitfields(code):
    w = run(code, "shifts", sset(s0=0x1, s1=0x80000000, s2=0xF234_5678))
    assert w.s[4] | w.s[5] << 32 == ((0x80000000_00000001 << 36) & ((1 << 64) - 1))
    assert w.s[6] == 0x0F23_4567
    assert w.s[7] == 0xFF23_4567
    assert w.s[8] == 0xE468_ACF0                              # shift count S1[4:0] = 1
    assert w.s[9] == 0x67                                     # offset 4, width 8
    assert w.s[10] == 0x2                                     # bits 27:24 = 0x2: positive
    w = run(code, "shifts", sset(s0=0, s1=0, s2=0x0A00_0000))
    assert w.s[10] == 0xFFFFFFFA


def test_abs_min_max(code):
    w = run(code, "abs_minmax", sset(s0=0xFFFFFFFB, s1=3))     # -5, 3
    assert w.s[4] == 5
    assert w.s[5] == 0xFFFFFFFB
    assert w.s[6] == 0xFFFFFFFB and w.s[7] == 1               # unsigned max picks S0: SCC=1


def test_logic_scc_is_result_nonzero(code):
    w = run(code, "logic", sset(s0=0xF0, s1=0x0F, s2=0xFFFF0000, s3=0))
    assert w.s[4] == 0 and w.s[8] == 0
    assert w.s[6] == 0xF0 & ~0xFFFF0000 & 0xFFFFFFFF and w.s[7] == 0x0F
    assert w.s[9] == 0 and w.s[10] == 0


def test_compares(code):
    w = run(code, "cmp", sset(s0=0xFFFFFFFF, s1=1, s2=0xFFFFFFFF, s3=1))
    assert w.s[4] == 1        # -1 < 1 signed
    assert w.s[5] == 0        # 0xffffffff < 1 unsigned: no
    assert w.s[6] == 1        # 64-bit equal
    assert w.s[7] == 1        # -1 > sext(0xfff0) = -16


def test_movk_sign_extends(code):
    w = run(code, "movk")
    assert w.s[4] == 0xFFFF8010


def test_saveexec_and_restore(code):
    w = run(code, "saveexec", sset(s0=0xFF, s1=0, v1=np.zeros(64)))
    assert w.s[4] == 0xFFFFFFFF and w.s[5] == 0xFFFFFFFF
    assert w.s[6] == 1
    assert w.exec == (1 << 64) - 1
    expect = np.where(np.arange(64) < 8, 4, 1)
    assert np.array_equal(w.v[1], expect)


def test_backward_branch_loop(code):
    w = run(code, "loop")
    assert w.s[4] == 10 and w.s[5] == sum(range(10))


def test_vccz_branch(code):
    assert run(code, "vccz_branch").s[4] == 1       # lane 5 has v0 == 5
    w = run(code, "vccz_branch", sset(exec=0xF))   # lanes 0..3 only: vcc = 0
    assert w.s[4] == 2


def test_execz_skips_the_block(code):
    w = run(code, "execz_skip", sset(s4=7))
    assert w.s[4] == 7                               # no lane has v0 < 0
    assert w.exec == (1 << 64) - 1


def test_getpc_is_the_next_instruction(code):
    w = run(code, "getpc")
    pc = w.s[4] | w.s[5] << 32
    assert pc == code.entry(code.co.kernel("getpc")) + 4


def test_mode_register(code):
    w = run(code, "mode", mode=0x2F0)
    assert w.s[4] == 0x2F0
    assert w.s[5] == 0xC                    # FP_DENORM bits 5:4 cleared, 7:6 kept
    with pytest.raises(EmulatorError, match="FP_ROUND"):
        run(code, "bad_round")


def test_unmodelled_instruction_fails_loudly(code):
    with pytest.raises(EmulatorError, match=r"s_trap 2 at 0x[0-9a-f]+ <unknown\+0x0> \(wave 0"):
        run(code, "unknown")
