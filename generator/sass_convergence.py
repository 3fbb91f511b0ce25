"""Find code among a kernel's WGMMAs that ptxas compiled as possibly divergent, in its SASS.

ptxas keeps WGMMA descriptors, barrier ids and stage addresses in uniform registers only where
it can prove the warp convergent. A branch or loop bound it cannot prove warp-uniform (a value
from a 64-bit division subroutine, a 32-bit min, a load) with a ``return`` under it leaves all
the code after it "maybe divergent": the descriptors are then rebuilt in vector registers and
moved by ``R2UR`` in every block, registers spill, and each shuffle of the row max is guarded
by a ``BRA.DIV`` (the slow path ptxas emits where some lanes may be inactive). The balanced
tail's kernel compiled that way took 118 instructions more a block than the kernel and ran its
blocks 17 % slower. So: no ``BRA.DIV`` between a function's first and last WGMMA.

    python -m generator.sass_convergence prebuilt/*.cubin   # cuobjdump as for wgmma_hazards
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from generator import wgmma_hazards as wh

_WGMMA = re.compile(r"\b[HQ]GMMA\.")


def divergent(instructions: list[tuple[int, str]]) -> list[int]:
    """Addresses of the ``BRA.DIV`` within the span of the function's WGMMAs (none without)."""
    at = [a for a, text in instructions if _WGMMA.search(text)]
    if not at:
        return []
    return [a for a, text in instructions if "BRA.DIV" in text and at[0] <= a <= at[-1]]


_BRANCH = re.compile(r"\bBRA\b.*\b0x([0-9a-f]+)$")
_LOCAL = re.compile(r"\b(LDL|STL)\b")


def block_loop(instructions: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The innermost loop holding a WGMMA (a consumer's block loop): the instructions from a
    backward branch's target to the branch, the shortest such span with a WGMMA in it; none
    where there is no such loop."""
    best: list[tuple[int, str]] = []
    for at, text in instructions:
        m = _BRANCH.search(text)
        if m and int(m.group(1), 16) < at:
            body = [(a, t) for a, t in instructions if int(m.group(1), 16) <= a <= at]
            if any(_WGMMA.search(t) for _, t in body) and (not best or len(body) < len(best)):
                best = body
    return best


def local_memory(instructions: list[tuple[int, str]]) -> list[int]:
    """Addresses of the local-memory loads and stores (spills, a stack frame's records)."""
    return [a for a, text in instructions if _LOCAL.search(text)]


def check_cubin(path: Path, tool: str) -> dict[str, list[int]]:
    """Each function of a code object with such code: its ``BRA.DIV`` addresses."""
    found = {name: divergent(body) for name, body in wh.functions(wh.sass(path, tool)).items()}
    return {name: at for name, at in found.items() if at}


def main(argv=None) -> int:
    return wh.check_paths(argv, check_cubin, lambda found: "divergent among its WGMMAs: " + "; ".join(
        f"{name} at {', '.join(f'{a:#06x}' for a in at)}" for name, at in found.items()))


if __name__ == "__main__":
    sys.exit(main())
