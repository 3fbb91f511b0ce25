"""Emulator instructions and hazard rules the gfx950 BF16 kernels brought up, on edge values
worked out by hand from the CDNA4 ISA guide (chapter 12's definitions, §4.5's wait states)."""

import numpy as np
import pytest
from emukit import build, run

from zyfa_emulator import Machine
from zyfa_emulator.hazards import HazardChecker

SNIPPETS = {
    # D.i32 = S0.i24 * S1.i24 + S2.i32 (the sources' bits 31:24 are ignored)
    "mad_i32_i24": "v_mad_i32_i24 v3, v0, v1, v2",
    # a two-source VOP3 opcode leaves its src2 field at 0 (= s0): no SGPR is read there
    "cvt_pk_bf16_after_sgpr_write": "v_readfirstlane_b32 s0, v4\n  v_cvt_pk_bf16_f32 v2, v0, v1",
    # ... while a real SGPR source two instructions too early is still caught
    "add_reads_fresh_sgpr": "v_readfirstlane_b32 s0, v4\n  v_add_f32_e64 v2, s0, v1",
}


@pytest.fixture(scope="module")
def code():
    return build(SNIPPETS)


def test_mad_i32_i24_sign_extends_24_bits_and_wraps_the_sum(code):
    a = np.array([0x7FFFFF, 0xFF800000, 0xAB000003, 0x00FFFFFF] * 16, np.uint32)   # 2^23-1, -2^23, 3, -1
    b = np.array([0x7FFFFF, 0x00000002, 0x12FFFFFE, 0x00FFFFFF] * 16, np.uint32)   # 2^23-1, 2, -2, -1
    c = np.array([0x00000000, 0x00000005, 0xFFFFFFFF, 0x80000000] * 16, np.uint32)

    def setup(w):
        w.v[0], w.v[1], w.v[2] = a, b, c
    w = run(code, "mad_i32_i24", setup)
    want = np.array([(2**23 - 1) ** 2 % 2**32,             # 0x3FFFFF000001
                     (-(2**23) * 2 + 5) % 2**32,
                     (3 * -2 + 0xFFFFFFFF) % 2**32,
                     (1 + 0x80000000) % 2**32] * 16, np.uint64).astype(np.uint32)
    assert np.array_equal(w.v[3], want)


def _violations(code, name):
    m = Machine()
    chk = HazardChecker(raise_on_error=False).attach(m)

    def setup(w):
        w.v[0] = np.full(64, np.float32(1.5)).view(np.uint32)
        w.v[1] = np.full(64, np.float32(-2.0)).view(np.uint32)
        w.v[4] = 7
    run(code, name, setup, machine=m)
    return [v.rule for v in chk.violations]


def test_two_source_vop3_does_not_read_its_unused_src2_field_as_s0(code):
    assert _violations(code, "cvt_pk_bf16_after_sgpr_write") == []
    assert _violations(code, "add_reads_fresh_sgpr") == ["valu-sgpr-valu"]
