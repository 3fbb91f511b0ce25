"""generator/sass_convergence.py: code among a kernel's WGMMAs that ptxas took as divergent.

The SASS below is the shape of what cuobjdump printed for the balanced tail's kernel while a
return under a 64-bit division's result left its consumer loop "maybe divergent": the row
max's shuffle behind a BRA.DIV, the WGMMA descriptor moved in by R2UR."""

import pytest

from generator import sass_convergence as sc
from generator import wgmma_hazards as wh
from tests.sass_objects import built_sm90a_sass

LOOP = """
        /*0100*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ, !UPT, gsb0 ;
        /*0110*/                   VIMNMX3 R90, R86, R87, R90, !PT ;
        /*0120*/                   BRA.DIV UR8, 0x400 ;
        /*0130*/                   SHFL.BFLY PT, R92, R91, 0x1, 0x1f ;
        /*0140*/                   R2UR UR10, R88 ;
        /*0150*/                   QGMMA.64x136x32.F32.E4M3.E4M3 R24, R100, gdesc[UR10], R24, gsb0 ;
        /*0160*/              @!P0 BRA 0x100 ;
        /*0170*/                   BRA.DIV UR6, 0x500 ;
        /*0180*/                   EXIT ;
"""


def test_a_guarded_shuffle_among_the_wgmmas_is_found_and_one_after_them_is_not():
    assert sc.divergent(wh.parse(LOOP)) == [0x120]
    convergent = LOOP.replace("BRA.DIV UR8, 0x400", "NOP")
    assert sc.divergent(wh.parse(convergent)) == []          # 0x170 lies past the last WGMMA
    assert sc.divergent(wh.parse(LOOP.replace("QGMMA", "FFMA"))) == []   # no WGMMA: nothing to hold


def test_the_block_loop_is_the_innermost_loop_with_a_wgmma_and_local_memory_is_found_in_it():
    loop = sc.block_loop(wh.parse(LOOP))
    assert [a for a, _ in loop] == [0x100, 0x110, 0x120, 0x130, 0x140, 0x150, 0x160]
    assert sc.local_memory(loop) == []
    spilled = wh.parse(LOOP.replace("R2UR UR10, R88", "LDL R88, [R1+0x10]"))
    assert sc.local_memory(sc.block_loop(spilled)) == [0x140]
    assert sc.block_loop(wh.parse(LOOP.replace("QGMMA", "FFMA"))) == []   # a loop, but no WGMMA in it


@pytest.mark.slow   # cuobjdump of every sm_90a code object, plain and serving: ~14 s
def test_the_built_sm90a_code_objects_have_none():
    """Every function of every sm_90a code object in prebuilt/ (the kernel, its V^T pre-pass,
    the balanced tail's kernel), where cuobjdump exists."""
    for name, functions in built_sm90a_sass().items():
        assert {f: at for f, body in functions.items() if (at := sc.divergent(body))} == {}, name
