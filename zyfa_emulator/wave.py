"""The architectural state of one wave64 and the helpers every instruction uses to read
and write it.

State (CDNA4 ISA guide §3): SGPRs s0..s101 plus VCC, M0 and EXEC kept in one list
indexed by operand code (so an operand code reads its register directly), SCC, the
MODE register, and a unified 512-entry vector register file per lane (``v``, a numpy
``uint32[512, 64]`` array: row = register, column = lane).  Architectural VGPRs v0..v255
are rows 0..255; AccVGPR ``a<i>`` is row ``accum_offset + i`` (the split point the
kernel descriptor sets, ISA §3.6.4).

Vector memory, LDS and scalar memory instructions complete asynchronously: each one
is queued on its counter (VM_CNT or LGKM_CNT) and performs its access and register or
memory write only when ``s_waitcnt`` (or ``s_endpgm``) retires it, in issue order per
counter (ISA §4.4).  A missing wait therefore shows up as stale data, as it would on
hardware at its worst.
"""

from __future__ import annotations

import collections

import numpy as np

from .errors import EmulatorError

U32, I32, F32, U64, I64, F64 = np.uint32, np.int32, np.float32, np.uint64, np.int64, np.float64
LANES = np.arange(64)
LANES_U64 = np.arange(64, dtype=U64)
FULL = (1 << 64) - 1
MASK32 = 0xFFFFFFFF

#: Wave status.
RUN, BARRIER, DONE = "run", "barrier", "done"

#: Counter limits (ISA §4.4): VM_CNT 6 bits, LGKM_CNT 4 bits.  A wave that would
#: exceed them stalls until the oldest operation completes; modelled by retiring it.
VM_MAX, LGKM_MAX = 63, 15

_mask_cache: dict[int, np.ndarray] = {}


def mask_to_bool(m: int) -> np.ndarray:
    """64-bit lane mask -> bool[64] (read-only, cached)."""
    b = _mask_cache.get(m)
    if b is None:
        b = ((U64(m) >> LANES_U64) & U64(1)).astype(bool)
        b.flags.writeable = False
        if len(_mask_cache) > 4096:
            _mask_cache.clear()
        _mask_cache[m] = b
    return b


def bool_to_mask(b: np.ndarray) -> int:
    return int(np.packbits(np.asarray(b, dtype=bool), bitorder="little").view("<u8")[0])


# Inline constants by operand code, as the 32-bit pattern (integer ops see the same bits).
CONST32: list = [None] * 512
CONST64: list = [None] * 512     # sign-extended integers; float constants as f64 bits
CONST64F: list = [None] * 512    # f64 operand view of the float constants
for _c in range(128, 209):
    _v = _c - 128 if _c <= 192 else 192 - _c
    CONST32[_c] = _v & MASK32
    CONST64[_c] = _v & ((1 << 64) - 1)
    CONST64F[_c] = CONST64[_c]
from .isa import FLOAT_CONSTS  # noqa: E402

for _c, (_b32, _b64, _t) in FLOAT_CONSTS.items():
    CONST32[_c] = _b32
    CONST64[_c] = _b32          # integer 64-bit operand: the 32-bit pattern, zero-extended
    CONST64F[_c] = _b64


class Wave:
    """One wave's registers, program counter and outstanding memory operations."""

    def __init__(self, machine, workgroup, index: int, pc: int, accum_offset: int,
                 vgpr_poison: int = 0xFFFFFFFF, sgpr_poison: int = 0xFFFFFFFF):
        self.machine = machine
        self.wg = workgroup
        self.index = index                  # wave number within its workgroup
        self.pc = pc
        self.s = [sgpr_poison] * 128
        self.s[106] = self.s[107] = 0
        self.scc = 0
        self.mode = 0
        self.prio = 0
        self.v = np.full((512, 64), vgpr_poison, dtype=U32)
        self.vf = self.v.view(F32)
        self.accum_offset = accum_offset
        self.status = RUN
        self.vmq: collections.deque = collections.deque()
        self.lgkmq: collections.deque = collections.deque()
        self.executed = 0
        self.code = None                     # LoadedCode the wave runs
        self._ek = None
        self._em = None

    # -- identification --------------------------------------------------------------
    def name(self) -> str:
        return f"wave {self.index} of workgroup {self.wg.id}"

    def fail(self, inst, message: str):
        raise EmulatorError(f"{inst.where()} ({self.name()}): {message}")

    # -- EXEC / VCC --------------------------------------------------------------------
    @property
    def exec(self) -> int:
        return self.s[126] | self.s[127] << 32

    @exec.setter
    def exec(self, value: int) -> None:
        self.s[126] = value & MASK32
        self.s[127] = (value >> 32) & MASK32

    @property
    def vcc(self) -> int:
        return self.s[106] | self.s[107] << 32

    @vcc.setter
    def vcc(self, value: int) -> None:
        self.s[106] = value & MASK32
        self.s[107] = (value >> 32) & MASK32

    def execmask(self) -> np.ndarray:
        key = self.s[126] | self.s[127] << 32
        if key != self._ek:
            self._ek = key
            self._em = mask_to_bool(key)
        return self._em

    def exec_full(self) -> bool:
        return self.s[126] == MASK32 and self.s[127] == MASK32

    # -- scalar registers -----------------------------------------------------------------
    def sget64(self, code: int) -> int:
        return self.s[code] | self.s[code + 1] << 32

    def sset64(self, code: int, value: int) -> None:
        self.s[code] = value & MASK32
        self.s[code + 1] = (value >> 32) & MASK32

    def lane_mask(self, code: int) -> int:
        """A 64-bit lane mask operand (VCC, EXEC or an SGPR pair, or an inline constant)."""
        if code < 128:
            return self.s[code] | self.s[code + 1] << 32
        c = CONST64[code]
        if c is None:
            raise EmulatorError(f"operand code {code} cannot be a lane mask")
        return c

    # -- vector registers -----------------------------------------------------------------
    def vrow(self, code: int, acc: bool = False) -> int:
        """Row of the register file for a VGPR operand code (256..511), AGPR if ``acc``."""
        r = code - 256
        if acc:
            r += self.accum_offset
            if r >= 512:
                raise EmulatorError(f"a{code - 256} lies beyond the 512-entry register file "
                                    f"(accum_offset {self.accum_offset})")
        return r

    # -- outstanding memory operations ----------------------------------------------------
    def push_vm(self, complete) -> None:
        self.vmq.append(complete)
        if len(self.vmq) > VM_MAX:
            self.vmq.popleft()()

    def push_lgkm(self, complete) -> None:
        self.lgkmq.append(complete)
        if len(self.lgkmq) > LGKM_MAX:
            self.lgkmq.popleft()()

    def wait(self, vm: int, lgkm: int) -> None:
        q = self.vmq
        while len(q) > vm:
            q.popleft()()
        q = self.lgkmq
        while len(q) > lgkm:
            q.popleft()()

    def drain(self) -> None:
        self.wait(0, 0)
