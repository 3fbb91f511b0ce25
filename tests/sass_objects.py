"""The SASS of every sm_90a code object in prebuilt/ (built by build.py), disassembled once
for the tests that read it; they skip where there is no cuobjdump or nothing built."""

import functools
from pathlib import Path

import pytest

from generator import wgmma_hazards as wh

ROOT = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=None)
def _disassembled() -> tuple[tuple[str, str], ...]:
    tool = wh.cuobjdump()
    cubins = sorted((ROOT / "prebuilt").glob("fwd_sm_90a_*.cubin"))
    if tool is None or not cubins:
        return ()
    return tuple((c.name, wh.sass(c, tool)) for c in cubins)


def built_sm90a_sass() -> dict[str, dict[str, list[tuple[int, str]]]]:
    """Each code object's functions (wgmma_hazards.functions), by file name."""
    found = _disassembled()
    if not found:
        pytest.skip("needs cuobjdump (CUDA toolkit or the test extra's nvidia-cuda-cuobjdump) "
                    "and built sm_90a code objects")
    return {name: wh.functions(text) for name, text in found}
