"""Find registers of an in-flight WGMMA that a kernel overwrites, in its SASS.

A WGMMA that takes A from registers (``HGMMA``/``QGMMA ... R<d>, R<a>, gdesc...``) keeps
reading ``R<a> .. R<a+3>`` until a ``WARPGROUP.DEPBAR.LE`` retires it (below). ptxas
protects a WGMMA's accumulators (it injects waits, or serialises the WGMMAs and says so, which
the build refuses), but not this A operand: when the kernel "keeps" P alive only as values,
ptxas may hand the registers themselves to later code. The result is wrong only sometimes
(the read races the write), so this walks the control flow of the SASS instead: from each
such WGMMA, along every path (branches followed, predicated ones both ways), until a wait
that retires it, no instruction may write one of its A registers.

    python -m generator.wgmma_hazards prebuilt/*.cubin   # needs cuobjdump and nvdisasm (the
                                                         # CUDA toolkit's, or the test extra's)

A WGMMA ends at a ``WARPGROUP.DEPBAR.LE gsb0, N`` once its group is committed (the last
WGMMA of a group carries ``gsb0``) and N or more groups have been committed after it on the
path: ``wait_group N`` leaves the N newest in flight. It reads the first operand of an
instruction as its destination, which holds for the ALU, FMA, conversion and move
instructions that could reuse a register; stores, barriers, branches and compares write no
general register.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: Instructions (by opcode prefix) whose first operand is not a general register they write.
_NO_REGISTER_WRITE = ("ST", "BAR", "SYNCS", "RED", "ATOM", "BRA", "WARPGROUP", "HGMMA", "QGMMA", "EXIT",
                      "BSYNC", "BSSY", "NOP", "ISETP", "FSETP", "PLOP3", "UISETP", "MEMBAR", "FENCE",
                      "DEPBAR", "CCTL", "ERRBAR", "YIELD", "WARPSYNC", "VOTEU", "R2UR", "ELECT")
_LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_RS_WGMMA = re.compile(r"\b[HQ]GMMA\S*\s+R\d+,\s+R(\d+),")
_COMMITS = re.compile(r"\b[HQ]GMMA\S*\s.*\bgsb0\s*$")          # the last WGMMA of a group
_WAIT = re.compile(r"^WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)$")
_NEWER_CAP = 8        # commits past the largest N a wait can name make no difference
_PREDICATE = re.compile(r"^@!?U?P\w+\s+")


@dataclasses.dataclass(frozen=True)
class Hazard:
    wgmma_at: int      # SASS address of the WGMMA
    wgmma: str
    write_at: int      # address of the instruction that writes one of its A registers
    write: str

    def __str__(self) -> str:
        return f"{self.wgmma_at:#06x} {self.wgmma}  <-  {self.write_at:#06x} {self.write}"


def parse(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text) of every instruction in cuobjdump -sass output, in order
    (one function's: each function's addresses start at 0, see ``functions``)."""
    return [(int(m.group(1), 16), m.group(2)) for m in map(_LINE.match, sass.splitlines()) if m]


_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """Each function's instructions in cuobjdump -sass output of a code object (its kernels, a
    pre-pass, a tail kernel), by name: walked apart, as their addresses overlap."""
    out: dict[str, list[str]] = {}
    lines = out.setdefault("", [])
    for line in sass.splitlines():
        m = _FUNCTION.match(line)
        if m:
            lines = out.setdefault(m.group(1), [])
        else:
            lines.append(line)
    return {name: parse("\n".join(body)) for name, body in out.items() if parse("\n".join(body))}


def hazards(instructions: list[tuple[int, str]]) -> list[Hazard]:
    """Every (WGMMA, first overwriting instruction) pair, one per WGMMA at most."""
    index = {addr: i for i, (addr, _) in enumerate(instructions)}
    found = []
    for i, (addr, text) in enumerate(instructions):
        m = _RS_WGMMA.search(text)
        if not m:
            continue
        a_regs = {f"R{int(m.group(1)) + k}" for k in range(4)}
        # the walk's state: (instruction, own group committed, groups committed since)
        start = (i + 1, bool(_COMMITS.search(text)), 0)
        seen, todo = set(), [start]
        while todo:
            state = todo.pop()
            j, committed, newer = state
            if state in seen or j >= len(instructions):
                continue
            seen.add(state)
            jaddr, jtext = instructions[j]
            predicated = bool(_PREDICATE.match(jtext))
            body = _PREDICATE.sub("", jtext)
            opcode = body.split()[0]
            wait = _WAIT.match(body)
            if wait and committed and newer >= int(wait.group(1), 16):
                continue                                   # retired on this path
            if _COMMITS.search(body):
                committed, newer = True, min(newer + committed, _NEWER_CAP)
            if opcode == "EXIT" and not predicated:
                continue
            if not opcode.startswith(_NO_REGISTER_WRITE):
                first = body[len(opcode):].split(",")[0].strip()
                if first in a_regs:
                    found.append(Hazard(addr, text, jaddr, jtext))
                    break
            if opcode == "BRA":
                target = re.search(r"0x([0-9a-f]+)", body)
                if target and int(target.group(1), 16) in index:
                    todo.append((index[int(target.group(1), 16)], committed, newer))
                if predicated:
                    todo.append((j + 1, committed, newer))
            else:
                todo.append((j + 1, committed, newer))
    return found


def cuobjdump() -> str | None:
    """cuobjdump: beside nvcc, on PATH, or from the ``nvidia-cuda-cuobjdump`` wheel (the test
    extra, with ``nvidia-cuda-nvdisasm``, which it runs); None if there is none."""
    nvcc = shutil.which("nvcc")
    cands = [str(Path(nvcc).resolve().parent / "cuobjdump")] if nvcc else []
    cands.append(shutil.which("cuobjdump"))
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        cands += sorted(str(p) for p in Path(base).glob("cu*/bin/cuobjdump"))
    for cand in cands:
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def sass(path: Path, tool: str) -> str:
    """cuobjdump -sass of a code object."""
    # cuobjdump -sass runs nvdisasm: look for it beside cuobjdump first (the wheels share a bin/)
    env = dict(os.environ, PATH=str(Path(tool).parent) + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} -sass {path} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def check_cubin(path: Path, tool: str) -> list[Hazard]:
    return [h for body in functions(sass(path, tool)).values() for h in hazards(body)]


def check_paths(argv, check, describe) -> int:
    """A checker's command line: check(path, cuobjdump) on each code object named, a line for
    each (describe(what check found) where it found anything); 1 if any, 2 without cuobjdump."""
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    tool = cuobjdump()
    if tool is None:
        print("no cuobjdump found (it comes with the CUDA toolkit)", file=sys.stderr)
        return 2
    bad = 0
    for p in paths:
        found = check(p, tool)
        bad += bool(found)
        print(f"{p.name}: " + ("ok" if not found else describe(found)))
    return 1 if bad else 0


def main(argv=None) -> int:
    return check_paths(argv, check_cubin, lambda found: f"{len(found)} hazards\n  " + "\n  ".join(map(str, found)))


if __name__ == "__main__":
    sys.exit(main())
