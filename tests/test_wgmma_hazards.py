"""generator/wgmma_hazards.py: an in-flight WGMMA's A registers overwritten before its wait.

The SASS below is the shape of what cuobjdump printed for a BF16 body that overlapped its
softmax with its own PV (P from registers) and was wrong under compute-sanitizer: the next
block's F2FP wrote R180 on the path back to the loop head, before the wait."""

import pytest

from generator import wgmma_hazards as wh
from tests.sass_objects import built_sm90a_sass

LOOP = """
        /*0100*/                   F2FP.BF16.F32.PACK_AB R180, R25, R24 ;
        /*0110*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0120*/                   FMUL R88, R88, R7 ;
        /*0130*/                   WARPGROUP.ARRIVE ;
        /*0140*/                   HGMMA.64x128x16.F32.BF16 R88, R180, gdesc[UR12].tnspB, R88, gsb0 ;
        /*0150*/                   BAR.ARV R11, 0x100 ;
        /*0160*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0170*/              @!P0 BRA 0x100 ;
        /*0180*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0190*/                   EXIT ;
"""


def test_a_write_on_the_path_back_to_the_loop_head_is_found():
    found = wh.hazards(wh.parse(LOOP))
    assert len(found) == 1
    assert found[0].wgmma_at == 0x140 and found[0].write_at == 0x100 and "R180" in found[0].write


def test_a_wait_that_retires_everything_first_clears_it():
    # the wait moved before the F2FP: the write comes after the WGMMA is retired
    fixed = LOOP.replace("F2FP.BF16.F32.PACK_AB R180, R25, R24", "WARPGROUP.DEPBAR.LE gsb0, 0x0") \
                .replace("/*0110*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0",
                         "/*0110*/                   F2FP.BF16.F32.PACK_AB R180, R25, R24")
    assert wh.hazards(wh.parse(fixed)) == []


def test_writes_to_other_registers_reads_and_a_wait_leaving_one_group_are_not_enough():
    other = LOOP.replace("PACK_AB R180,", "PACK_AB R176,")
    assert wh.hazards(wh.parse(other)) == []                  # R176 is not one of R180..R183
    reads = LOOP.replace("F2FP.BF16.F32.PACK_AB R180, R25, R24", "FADD R24, R180, R181")
    assert wh.hazards(wh.parse(reads)) == []
    last = LOOP.replace("F2FP.BF16.F32.PACK_AB R180, R25, R24", "NOP").replace(
        "/*0180*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0", "/*0180*/                   MOV R183, RZ")
    assert [h.write_at for h in wh.hazards(wh.parse(last))] == [0x180]   # 0x1 did not retire it


# PV (P from R156) and then S(n + 1) as two groups; `wait_group 1` retires PV, and only then
# may R157 take a new value (the shape of a merge moved after the PV's wait).
TWO_GROUPS = """
        /*0200*/                   WARPGROUP.ARRIVE ;
        /*0210*/                   QGMMA.64x136x32.F32.E4M3.E4M3 R24, R156, gdesc[UR16], RZ, !UPT ;
        /*0220*/                   QGMMA.64x136x32.F32.E4M3.E4M3 R24, R160, gdesc[UR16], R24, gsb0 ;
        /*0230*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R92, gdesc[UR32], RZ, !UPT ;
        /*0240*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R92, gdesc[UR16], R92, gsb0 ;
        /*0250*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0260*/                   IMAD.MOV.U32 R157, RZ, RZ, R221 ;
        /*0270*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0280*/                   EXIT ;
"""


def test_a_wait_that_leaves_only_newer_groups_retires_the_wgmma():
    assert wh.hazards(wh.parse(TWO_GROUPS)) == []
    # without the newer group, `wait_group 1` may leave the PV itself in flight
    alone = TWO_GROUPS.replace("R92, gdesc[UR16], R92, gsb0", "R92, gdesc[UR16], R92")
    assert [(h.wgmma_at, h.write_at) for h in wh.hazards(wh.parse(alone))] == [(0x210, 0x260)]
    # nor does a wait retire a WGMMA whose group is not yet committed
    open_group = TWO_GROUPS.replace("R24, R160, gdesc[UR16], R24, gsb0", "R24, R160, gdesc[UR16], R24") \
                           .replace("R92, gdesc[UR16], R92, gsb0", "R92, gdesc[UR16], R92")
    assert [h.write_at for h in wh.hazards(wh.parse(open_group))] == [0x260]


@pytest.mark.slow   # cuobjdump of every sm_90a code object, plain and serving: ~14 s
def test_the_built_sm90a_code_objects_have_none():
    """Every function of every sm_90a code object in prebuilt/ (built by build.py), where
    cuobjdump exists."""
    for name, functions in built_sm90a_sass().items():
        assert [h for body in functions.values() for h in wh.hazards(body)] == [], name


def test_each_function_of_a_code_object_is_walked_on_its_own():
    """A code object holds several kernels (the attention kernel, its pre-pass, its tail
    kernel), each with addresses from 0: a branch of one never lands in another."""
    first = """
        Function : zyfa_a
        /*0000*/                   WARPGROUP.ARRIVE ;
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R88, R180, gdesc[UR12].tnspB, R88, gsb0 ;
        /*0020*/                   BRA 0x40 ;
        /*0030*/                   EXIT ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/                   F2FP.BF16.F32.PACK_AB R180, R25, R24 ;
        /*0060*/                   EXIT ;
"""
    second = """
        Function : zyfa_b
        /*0000*/                   FMUL R88, R88, R7 ;
        /*0010*/                   FMUL R88, R88, R7 ;
        /*0020*/                   FMUL R88, R88, R7 ;
        /*0030*/                   FMUL R88, R88, R7 ;
        /*0040*/                   F2FP.BF16.F32.PACK_AB R181, R25, R24 ;
        /*0050*/                   EXIT ;
"""
    both = first + second
    assert [h.write_at for h in wh.hazards(wh.parse(both))] == [0x40]   # the two mixed: a false hazard
    split = wh.functions(both)
    assert set(split) == {"zyfa_a", "zyfa_b"} and [len(v) for v in split.values()] == [7, 6]
    assert [h for body in split.values() for h in wh.hazards(body)] == []
