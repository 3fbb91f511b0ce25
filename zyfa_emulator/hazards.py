"""Hazard and ordering checker: an observer that flags code the hardware would not run
correctly although the emulator (which is in-order and retires memory operations only
when a wait demands them) may happen to compute the right answer.

Attach it to a :class:`~zyfa_emulator.machine.Machine` (``HazardChecker().attach(m)``),
or set ``ZYFA_EMULATOR_HAZARDS=1`` for the ``emulator`` driver backend.  Every violation
names the rule, the instruction (mnemonic, code-object address, ``<kernel+offset>``), the
wave, the register(s) or LDS bytes, and the source of the rule.  By default the first
violation raises :class:`HazardError`; ``raise_on_error=False`` collects them in
``checker.violations`` instead.

Four families of checks, each tracked per wave in program (issue) order:

1. **Counters** (CDNA4 ISA §4.4 "Data Dependency Resolution", §3.8/§8.3 on VM_CNT and
   LGKM_CNT).  A vector-memory, LDS or scalar-memory load owes its destination registers
   until an ``s_waitcnt`` covers it; reading or overwriting an owed register is an
   error.  VM_CNT operations complete in issue order; LDS operations complete in order
   among themselves; SMEM (and FLAT's LGKM half) may complete out of order, so they are
   only covered by ``lgkmcnt(0)`` -- after ``lgkmcnt(N)``, only the oldest
   ``pending - N - (#SMEM/FLAT pending)`` LDS operations count as done.  EXP_CNT is
   not incremented by anything these kernels can execute (no exports, no GDS) and is
   not tracked.  ``s_endpgm`` waits for everything.  Store data and addresses are read
   at issue (rule 2 covers the store-data overwrite hazard).

2. **Wait states** (CDNA4 ISA §4.5 "Manually Inserted Wait States (NOPs)", Tables 11-12,
   and §7.6 "Dependency Resolution: Required Independent Instructions", Table 38; the
   numbers are those LLVM's ``GCNHazardRecognizer`` uses for gfx950 -- checked pair by
   pair with ``llc -mcpu=gfx950 -run-pass=post-RA-hazard-rec``).  The distance between
   two instructions of one wave is the number of wait states issued between them: 1 per
   instruction, ``N+1`` for ``s_nop N`` (LLVM's ``getNumWaitStates``).  Rules, with ``p``
   the producing MFMA's pass count (:func:`mfma_passes`; 1 pass = 4 cycles):

   ======================  ==============================================  ============
   rule                    producer -> consumer                             wait states
   ======================  ==============================================  ============
   mfma-raw                MFMA writes VGPR/AGPR -> VALU, VMEM, LDS, FLAT    p+3 (+1 if p>2)
                           reads it (5/8/12/20 for p = 2/4/8/16)
   mfma-waw                MFMA writes -> VALU or memory load writes it     same
   mfma-srcab              MFMA writes -> MFMA reads it as SrcA/SrcB        same
   mfma-srcc               MFMA writes -> MFMA reads an overlapping,        p+2
                           not identical range as SrcC (4/6/10/18)
   mfma-srcc-same          identical range as SrcC (accumulation chain)     2 if p=2, else 0
   mfma-war                MFMA reads SrcC -> VALU or load overwrites it    1/3/7/15
   valu-mfma               VALU (not MFMA) writes VGPR -> MFMA reads it     2
   exec-mfma               VALU writes EXEC (v_cmpx) -> MFMA                 4
   valu-permlane           VALU writes VGPR -> v_permlane*_swap reads it    2
   exec-permlane           VALU writes EXEC -> v_permlane*_swap             4
   trans-forward           transcendental VALU writes VGPR -> non-trans     1
                           VALU reads it
   dst-sel-forward         VALU writing part of a VGPR (SDWA dst_sel not    1
                           DWORD, or VOP3 op_sel[3]) -> VALU reads it
   valu-sgpr-valu          VALU writes SGPR/VCC -> VALU reads it            2
   valu-sgpr-vmem          VALU writes SGPR -> VMEM reads it (incl. M0)     5
   valu-sgpr-lanesel       VALU writes SGPR -> v_readlane/v_writelane lane  4
                           select
   exec-lanesel            VALU writes EXEC -> v_readlane/readfirstlane/    4
                           writelane
   valu-vgpr-readlane      VALU writes VGPR -> v_readlane/readfirstlane     1
                           src0
   valu-dpp                VALU writes VGPR -> DPP reads it                 2
   exec-dpp                VALU writes EXEC -> DPP                          5
   m0-lds-dma              SALU writes M0 -> LDS DMA / s_sendmsg /          1
                           ds_*_addtid
   store-data              VMEM store of more than 64 bits (MUBUF only      2
                           without an SGPR soffset) -> VALU overwrites
                           its data VGPRs
   vcc-div-fmas            VALU writes VCC -> v_div_fmas                    4
   setreg                  s_setreg -> s_getreg/s_setreg of that hwreg      2
   ======================  ==============================================  ============

   Every MFMA here is an XDL op (gfx950 has no non-XDL single-precision MFMA; the f64
   "DGEMM" ones are not modelled).  Because the check follows the executed trace, branch
   targets are handled exactly (LLVM takes the minimum over all predecessors).

3. **LDS races** between waves (CDNA4 ISA §4.3 "s_barrier": it synchronises execution,
   not memory -- an LDS access is only ordered by a barrier once the wave has waited for
   it).  Each LDS access is performed at some point between its issue and the wait that
   retires it; accesses of two waves to one byte (at least one a write) race unless the
   earlier one was retired before a barrier that the later one was issued after.  The
   same interval rule applies inside one wave between LDS DMA (``buffer/global_load ...
   lds``, counted by VM_CNT) and DS instructions (LGKM_CNT): the two counters are not
   ordered with respect to each other.  One family has a rule of its own,
   ``lds-dma-unordered``: an LDS DMA write into bytes that a DS read -- of this wave,
   issued before the DMA, or of another wave -- may still be reading because that read
   is waited for only later (or, for another wave, because nothing orders the read
   before the DMA at all), or that another wave's earlier LDS DMA, not waited for before
   the barrier this one follows, may still be writing.  Nothing in the ISA orders these;
   in practice the DMA data lands a global-memory round trip after its issue, which is
   what such code relies on.
4. **Interleavings**: :func:`interleavings_agree` runs one launch under several wave
   orders and quanta (``Config.seed``/``Config.quantum``) and compares the outputs.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from .errors import EmulatorError
from .operands import EXEC, M0, VCC, operands
from .render import _mfma_regs, vop_widths

__all__ = ["HazardChecker", "HazardError", "Violation", "mfma_passes", "mfma_rows",
           "interleavings_agree", "TRANS_OPS"]


class HazardError(EmulatorError):
    """A hazard or ordering violation (the message names instruction, wave and rule)."""


@dataclasses.dataclass
class Violation:
    rule: str
    where: str             # instruction text, code-object address, <kernel+offset>
    wave: str
    detail: str
    source: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.where} ({self.wave}): {self.detail} [{self.source}]"


SRC_TABLE38 = "CDNA4 ISA §7.6 Table 38; LLVM GCNHazardRecognizer (gfx950)"
SRC_TABLE11 = "CDNA4 ISA §4.5 Tables 11-12; LLVM GCNHazardRecognizer (gfx950)"
SRC_COUNTERS = "CDNA4 ISA §4.4 (s_waitcnt), §8.3"
SRC_BARRIER = "CDNA4 ISA §4.3 (s_barrier does not wait on counters), §4.4"

#: Every rule the checker reports (the names of the module docstring's tables).
RULES = ("counter", "mfma-raw", "mfma-waw", "mfma-srcab", "mfma-srcc", "mfma-srcc-same",
         "mfma-war", "valu-mfma", "exec-mfma", "valu-permlane", "exec-permlane",
         "trans-forward", "dst-sel-forward", "valu-sgpr-valu", "valu-sgpr-vmem",
         "valu-sgpr-lanesel", "exec-lanesel", "valu-vgpr-readlane", "valu-dpp", "exec-dpp",
         "m0-lds-dma", "store-data", "vcc-div-fmas", "setreg", "lds-race", "lds-dma-order",
         "lds-dma-unordered")

#: Transcendental VALU ops ("Trans" in ISA §4.5): issue through the transcendental unit.
TRANS_OPS = frozenset(
    f"v_{op}_{t}" for op in ("exp", "log", "rcp", "rsq", "sqrt", "sin", "cos", "rcp_iflag",
                             "exp_legacy", "log_legacy")
    for t in ("f32", "f16", "f64"))

_NEG = -(1 << 40)           # "never" for wait-state stamps


# --------------------------------------------------------------------------------------
# MFMA pass counts

_MFMA_RE = re.compile(r"v_mfma(?:_scale)?_(f32|i32|f64)_(\d+)x(\d+)x(\d+)(?:_(\d+)b)?_?(\w*)")


def mfma_passes(name: str, cbsz: int = 0, blgp: int = 0) -> int:
    """Passes of an MFMA (1 pass = 4 cycles of the matrix pipe), CDNA4 ISA §7.1.2
    Table 28 and §7.1.5 (F8F6F4: FP8/BF8 on either operand takes the full count, FP6 and
    FP4 on both half of it).  These are the counts LLVM's gfx950 scheduling model and
    hazard recognizer use (e.g. 16x16x32 bf16: 4, 32x32x16 bf16: 8, 16x16x128 fp8: 8,
    32x32x64 fp8: 16)."""
    m = _MFMA_RE.match(name)
    if not m:
        raise ValueError(f"{name} is not an MFMA")
    out, mm, _nn, _kk, blocks, typ = m.groups()
    mm = int(mm)
    if mm == 4:
        return 2
    if out == "f64":
        return 16 if mm == 16 else 4
    if typ == "f8f6f4":
        full = 16 if mm == 32 else 8
        return full if (cbsz in (0, 1) or blgp in (0, 1)) else full // 2
    if typ == "f32" and not blocks:          # 32x32x2 f32: 64 cycles, 16x16x4 f32: 32 cycles
        return 16 if mm == 32 else 8
    if typ in ("xf32",):
        return 8 if mm == 32 else 4
    if blocks:                               # multi-block legacy forms (32x32x4_2b, ...)
        return 16 if mm == 32 else 8
    # bf16/f16 (both K sizes), legacy fp8 pairs, i8: 16x16 -> 4 passes, 32x32 -> 8
    return 8 if mm == 32 else 4


def _mfma_raw_ws(p: int) -> int:
    """MFMA (XDL) write -> VALU/VMEM/LDS read or VALU write, or MFMA SrcA/B read."""
    return p + 3 + (1 if p != 2 else 0)


def _mfma_srcc_overlap_ws(p: int) -> int:
    return p + 2


def _mfma_war_ws(p: int) -> int:
    return {2: 1, 4: 3, 8: 7}.get(p, 15)


def is_mfma(inst) -> bool:
    return inst.fmt == "MAI" and inst.name.startswith(("v_mfma", "v_smfmac"))


def _is_valu(inst) -> bool:
    """VALU in LLVM's sense (not MFMA): VOP1/2/C/3/3P and the accvgpr moves."""
    f = inst.fmt
    if f in ("VOP1", "VOP2", "VOPC", "VOP3", "VOP3P"):
        return inst.name not in ("v_nop",)
    return f == "MAI" and not is_mfma(inst)


def _is_vmem(inst) -> bool:
    return inst.fmt in ("MUBUF", "GLOBAL", "FLAT", "SCRATCH")


def _is_lds_dma(inst) -> bool:
    return (inst.fmt == "MUBUF" and inst.lds) or "_load_lds_" in inst.name


def _is_load(inst) -> bool:
    n = inst.name
    if inst.fmt == "DS":
        return not n.startswith(("ds_write", "ds_nop")) and n != "ds_gws_barrier"
    if _is_vmem(inst):
        return "load" in n and not _is_lds_dma(inst)
    if inst.fmt == "SMEM":
        return n.startswith(("s_load", "s_buffer_load", "s_memtime", "s_memrealtime"))
    return False


def _queues(inst) -> tuple:
    """Counters the emulator (and the hardware) increments for ``inst``."""
    f = inst.fmt
    if f in ("SMEM", "DS"):
        return ("lgkm",)
    if f == "FLAT":
        return ("vm", "lgkm")
    if f in ("MUBUF", "GLOBAL", "SCRATCH"):
        return ("vm",)
    return ()


def _writes_partial(inst) -> bool:
    """VALU writing only part of its 32-bit destination (the forwarding hazard)."""
    if inst.sdwa is not None:
        return inst.sdwa.dst_sel != 6
    if inst.fmt == "VOP3" and inst.info != "VOPC":          # VOP3 op_sel[3]: the high half
        return bool(inst.opsel >> 3 & 1)
    return False


# --------------------------------------------------------------------------------------
# Per-wave and per-workgroup state

class _Op:
    """One outstanding memory operation, in the checker's (strict) model."""
    __slots__ = ("inst", "queues", "ooo", "rows", "srows", "done")

    def __init__(self, inst, queues, ooo, rows, srows):
        self.inst = inst
        self.queues = set(queues)
        self.ooo = ooo            # may complete out of order on LGKM (SMEM, FLAT)
        self.rows = rows          # owed VGPR/AGPR rows
        self.srows = srows        # owed SGPRs
        self.done = False


class _WaveState:
    def __init__(self):
        self.cum = 0                              # wait states issued so far
        n = 512
        self.v_valu = [_NEG] * n                  # stamp (cum after) of the last VALU write
        self.v_trans = [_NEG] * n
        self.v_partial = [_NEG] * n
        self.v_mfma = [_NEG] * n                  # last MFMA write ...
        self.v_mfma_info = [None] * n             # ... (passes, start row, count, inst)
        self.v_srcc = [_NEG] * n                  # last MFMA SrcC read ...
        self.v_srcc_p = [0] * n
        self.v_store = [_NEG] * n                 # last >64-bit store reading it as data
        self.s_valu = [_NEG] * 128                # last VALU write of an SGPR
        self.s_salu = [_NEG] * 128                # last SALU write (M0 rule)
        self.exec_valu = _NEG                     # last VALU write of EXEC
        self.setreg = {}
        # counters
        self.pending: list[_Op] = []
        self.owed_v: dict = {}                    # row -> _Op
        self.owed_s: dict = {}                    # sgpr -> _Op
        # LDS bookkeeping: barrier generation and shadows of the emulator's queues
        self.gen = 0
        self.shadow = {"vm": [], "lgkm": []}      # (pc, issue seq, issue gen) per queued op
        self.facts: dict = {}                     # inst -> _Facts at this wave's accum_offset


class _LdsState:
    """Per-byte history of one workgroup's LDS (for the race check)."""

    def __init__(self, size: int, nwaves: int):
        self.size = size
        self.w_wave = np.full(size, -1, np.int16)
        self.w_queue = np.zeros(size, np.int8)        # 0 DS, 1 LDS DMA
        self.w_iseq = np.zeros(size, np.int32)                 # wave instruction counts
        self.w_rseq = np.zeros(size, np.int32)
        self.w_rgen = np.full(size, -1, np.int32)
        self.w_igen = np.full(size, -1, np.int32)
        self.r_rgen = np.full((nwaves, size), -1, np.int32)   # last read by wave w
        self.r_igen = np.full((nwaves, size), -1, np.int32)   # ... issued in this generation
        self.r_iseq = np.full((nwaves, size), -1, np.int32)
        self.r_rseq = np.full((nwaves, size), -1, np.int32)


class _Facts:
    """What the checks need of one instruction in a wave of one ``accum_offset``, derived once
    (the trace runs each instruction many times): its kinds, counters and register rows."""
    __slots__ = ("inst", "name", "mfma", "valu", "vmem", "ds", "load", "queues", "trans",
                 "read_rows", "write_rows", "accesses", "inorder",
                 "mfma_rows", "mfma_p", "explicit_s", "vmem_srows", "partial", "write_srows",
                 "writes_exec", "salu", "store_rows", "m0_reader", "waited")

    def __init__(self, inst, accum_offset: int):
        self.inst, self.name = inst, inst.name
        ops = operands(inst)
        self.mfma, self.valu, self.vmem = is_mfma(inst), _is_valu(inst), _is_vmem(inst)
        self.ds, self.load, self.queues = inst.fmt == "DS", _is_load(inst), _queues(inst)
        self.trans = inst.name in TRANS_OPS
        self.read_rows = tuple(r for reg in ops.reads for r in _rows_at(accum_offset, reg))
        self.write_rows = tuple(r for reg in ops.writes for r in _rows_at(accum_offset, reg))
        # counters: (code, is_write) of each register read, then written, in operand order; a
        # VGPR/AGPR row as itself, SGPR g as -1 - g
        self.accesses = tuple((code, w) for regs, w in ((ops.reads, False), (ops.writes, True))
                              for reg in regs
                              for code in (*_rows_at(accum_offset, reg), *(-1 - g for g in _srows(reg))))
        self.inorder = None
        if self.load:
            self.inorder = "vm" if self.queues == ("vm",) else ("lds" if self.ds else None)
        self.mfma_rows = mfma_rows(accum_offset, inst) if self.mfma else None
        self.mfma_p = mfma_passes(inst.name, inst.cbsz, inst.blgp) if self.mfma else 0
        self.explicit_s = _explicit_sgpr_reads(inst) if self.valu else []
        self.vmem_srows = [g for reg in ops.reads for g in _srows(reg)] if self.vmem else []
        self.partial = self.valu and _writes_partial(inst)
        self.write_srows = [g for reg in ops.writes for g in _srows(reg)]
        self.writes_exec = self.valu and any(
            reg.kind == "s" and reg.index <= EXEC + 1 and reg.index + reg.count > EXEC for reg in ops.writes)
        self.salu = inst.fmt in ("SOP1", "SOP2", "SOPK", "SOPC")
        self.store_rows = ()
        if self.vmem and "store" in inst.name:
            nd = _store_dwords(inst)
            if nd > 2 and not (inst.fmt == "MUBUF" and inst.soffset is not None and inst.soffset < 128):
                base = inst.data0 - 256
                row0 = accum_offset + base if inst.acc else base
                self.store_rows = tuple(range(row0, row0 + nd))
        self.m0_reader = (_is_lds_dma(inst) or inst.name in ("s_sendmsg", "s_sendmsghalt")
                          or inst.name in ("ds_write_addtid_b32", "ds_read_addtid_b32"))
        # whether any wait-state rule has this instruction as its consumer (_check_waitstates)
        self.waited = (self.mfma or self.valu or self.vmem or self.ds or self.m0_reader
                       or inst.name in ("s_getreg_b32", "s_setreg_b32", "s_setreg_imm32_b32"))


def _rows_at(accum_offset: int, reg) -> range:
    """A register's rows of the unified file (v<i> = i, a<i> = accum_offset + i)."""
    if reg.kind == "v":
        return range(reg.index, reg.index + reg.count)
    if reg.kind == "a":
        base = accum_offset + reg.index
        return range(base, base + reg.count)
    return range(0)


def _srows(reg) -> range:
    if reg.kind == "s":
        return range(reg.index, min(reg.index + reg.count, 128))
    return range(0)


def _regname(wave, row: int) -> str:
    return f"v{row}" if row < wave.accum_offset else f"a{row - wave.accum_offset}"


def _sname(i: int) -> str:
    return {106: "vcc_lo", 107: "vcc_hi", 124: "m0", 126: "exec_lo", 127: "exec_hi"}.get(i, f"s{i}")


def _lowest(b: np.ndarray, where: np.ndarray) -> int:
    """The index in ``b`` of the lowest byte address among those ``where`` marks."""
    idx = np.flatnonzero(where)
    return int(idx[np.argmin(b[idx])])


def _code_name(wave, code: int) -> str:
    """A register by its code in the checks: a VGPR/AGPR row as itself, SGPR g as -1 - g."""
    return _sname(-1 - code) if code < 0 else _regname(wave, code)


def _ranges_text(names: list) -> str:
    return ", ".join(dict.fromkeys(names))


class HazardChecker:
    """Observer implementing the checks described in the module docstring.

    ``counters``, ``waitstates`` and ``lds`` switch the three families on and off.
    ``record_tight=True`` collects ``(pc, rule)`` of every wait-state rule met with no
    slack (exactly the required distance) in ``checker.tight``: where removing one NOP
    must create a violation (the tests mutate real kernels that way)."""

    def __init__(self, raise_on_error: bool = True, counters: bool = True,
                 waitstates: bool = True, lds: bool = True, record_tight: bool = False,
                 report_only: frozenset | set | tuple = ()):
        self.raise_on_error = raise_on_error
        # rules whose violations are recorded in ``violations`` but never raise (for code
        # nobody here can change, e.g. AMD's own kernels: their sites are findings)
        self.report_only = frozenset(report_only)
        unknown = self.report_only - set(RULES)
        if unknown:
            raise ValueError(f"unknown hazard rule(s) {sorted(unknown)}")
        self.record_tight = record_tight
        self.tight: set = set()
        self.counters = counters
        self.waitstates = waitstates
        self.lds = lds
        self.violations: list[Violation] = []
        self.instructions = 0
        self._waves: dict = {}
        self._wgs: dict = {}
        self._facts: dict = {}       # accum_offset -> {inst: _Facts}
        self.machine = None

    # -- wiring --------------------------------------------------------------------------
    def attach(self, machine) -> HazardChecker:
        self.machine = machine
        machine.observers.append(self)
        if self.lds:
            machine.lds_observers.append(self.lds_access)
        return self

    def detach(self) -> None:
        m = self.machine
        if m is None:
            return
        if self in m.observers:
            m.observers.remove(self)
        if self.lds_access in m.lds_observers:
            m.lds_observers.remove(self.lds_access)
        self.machine = None

    def _state(self, wave) -> _WaveState:
        st = self._waves.get(wave)
        if st is None:
            st = self._waves[wave] = _WaveState()
            st.facts = self._facts.setdefault(wave.accum_offset, {})
        return st

    def _report(self, rule, inst, wave, detail, source):
        v = Violation(rule, inst.where(), wave.name(), detail, source)
        self.violations.append(v)
        if self.raise_on_error and rule not in self.report_only:
            raise HazardError(str(v))

    # -- the observer ----------------------------------------------------------------------
    def __call__(self, wave, inst) -> None:
        self.instructions += 1
        st = self._state(wave)
        fx = st.facts.get(inst)
        if fx is None:
            fx = st.facts[inst] = _Facts(inst, wave.accum_offset)
        if self.lds:
            self._track_queues(wave, st, inst, fx)
        if self.counters:
            self._check_counters(wave, st, inst, fx)
        if self.waitstates:
            if fx.waited:
                self._check_waitstates(wave, st, inst, fx)
            self._record_waitstates(wave, st, inst, fx)
        if inst.name == "s_barrier":
            st.gen += 1
        elif inst.name == "s_endpgm":
            self._wave_ended(wave)

    def _wave_ended(self, wave) -> None:
        self._waves.pop(wave, None)
        wg = wave.wg
        if all(w is wave or w.status == "done" for w in wg.waves):
            self._wgs.pop(wg, None)           # the workgroup's last wave: forget its LDS

    # -- 1. counters -----------------------------------------------------------------------
    def _retire(self, st: _WaveState, vm: int | None, lgkm: int | None) -> None:
        pend = [op for op in st.pending if not op.done]
        if vm is not None:
            vq = [op for op in pend if "vm" in op.queues]
            for op in vq[:max(0, len(vq) - vm)]:
                op.queues.discard("vm")
        if lgkm is not None:
            lq = [op for op in pend if "lgkm" in op.queues]
            if lgkm == 0:
                for op in lq:
                    op.queues.discard("lgkm")
            else:
                ooo = sum(1 for op in lq if op.ooo)
                n_done = max(0, len(lq) - lgkm - ooo)
                for op in [op for op in lq if not op.ooo][:n_done]:
                    op.queues.discard("lgkm")
        for op in pend:
            if not op.queues:
                op.done = True
                for r in op.rows:
                    if st.owed_v.get(r) is op:
                        del st.owed_v[r]
                for r in op.srows:
                    if st.owed_s.get(r) is op:
                        del st.owed_s[r]
        st.pending = [op for op in st.pending if not op.done]

    def _check_counters(self, wave, st: _WaveState, inst, fx: _Facts) -> None:
        name = fx.name
        if name == "s_waitcnt":
            s = inst.simm16
            self._retire(st, (s & 0xF) | ((s >> 14) & 3) << 4, (s >> 8) & 0xF)
            return
        if name == "s_endpgm":
            self._retire(st, 0, 0)
            return
        queues = fx.queues
        if not st.owed_v and not st.owed_s and not queues:
            return
        inorder_class = fx.inorder
        bad = []
        for code, is_write in fx.accesses:
            if code >= 0:
                op = st.owed_v.get(code)
                if op is None:
                    continue
                if is_write and inorder_class is not None and \
                        inorder_class == ("vm" if op.queues == {"vm"} else
                                          ("lds" if op.inst.fmt == "DS" else None)):
                    continue              # same in-order counter: the later write wins
            else:
                op = st.owed_s.get(-1 - code)
                if op is None:
                    continue
            bad.append((code, op, is_write))
        if bad:
            row, op, is_write = bad[0]
            names = [_code_name(wave, r) for r, o, _ in bad if o is op]
            counter = "/".join(sorted(op.queues)) + "cnt"
            verb = "overwrites" if is_write else "reads"
            self._report("counter", inst, wave,
                         f"{verb} {_ranges_text(names)} still owed by '{op.inst.text()}' at "
                         f"{op.inst.loc or hex(op.inst.pc)} (no s_waitcnt {counter} covers it)",
                         SRC_COUNTERS)
            for r, _op, _ in bad:        # report once, then forget these registers
                if r < 0:
                    st.owed_s.pop(-1 - r, None)
                else:
                    st.owed_v.pop(r, None)
        if fx.load and queues:
            # a load owes what it writes
            op = _Op(inst, queues, inst.fmt in ("SMEM", "FLAT"), fx.write_rows, fx.write_srows)
            st.pending.append(op)
            for r in fx.write_rows:
                st.owed_v[r] = op
            for r in fx.write_srows:
                st.owed_s[r] = op
        elif queues:
            st.pending.append(_Op(inst, queues, inst.fmt in ("SMEM", "FLAT"), [], []))
        else:
            return
        # counter capacity (VM_CNT 6 bits, LGKM_CNT 4 bits): issue stalls until the oldest
        # completes, which the model takes as a retirement
        for q, cap in (("vm", 63), ("lgkm", 15)):
            live = [op for op in st.pending if q in op.queues]
            if len(live) > cap:
                if q == "vm":
                    self._retire(st, cap, None)
                else:
                    self._retire(st, None, cap)

    # -- 2. wait states --------------------------------------------------------------------
    def _check_waitstates(self, wave, st: _WaveState, inst, fx: _Facts) -> None:
        cum = st.cum
        name = fx.name
        mfma, valu, vmem = fx.mfma, fx.valu, fx.vmem
        found = []       # (needed, since, rule, register: a code (_code_name) or a name, source)
        tight = self.tight if self.record_tight else None

        def need(rule, have_stamp, needed, what, source=SRC_TABLE11):
            since = cum - have_stamp
            if since < needed:
                found.append((needed, since, rule, what, source))
            elif since == needed and needed and tight is not None:
                tight.add((inst.pc, rule))

        def need_rows(rule, stamps, rows, needed, source=SRC_TABLE11):
            # need() for each row's stamp in ``stamps`` (the common case, inlined)
            for row in rows:
                since = cum - stamps[row]
                if since < needed:
                    found.append((needed, since, rule, row, source))
                elif since == needed and needed and tight is not None:
                    tight.add((inst.pc, rule))

        read_rows, write_rows = fx.read_rows, fx.write_rows
        if mfma:
            a_rows, b_rows, c_rows, _ = fx.mfma_rows
            for row in c_rows:
                info = st.v_mfma_info[row]
                stamp = st.v_mfma[row]
                if info is None or cum - stamp >= 20:
                    continue
                p, start, cnt, _src = info
                if c_rows and start == c_rows[0] and cnt == len(c_rows):
                    need("mfma-srcc-same", stamp, 2 if p == 2 else 0, row, SRC_TABLE38)
                else:
                    need("mfma-srcc", stamp, _mfma_srcc_overlap_ws(p), row, SRC_TABLE38)
            for row in a_rows + b_rows:
                info = st.v_mfma_info[row]
                if info is not None:
                    need("mfma-srcab", st.v_mfma[row], _mfma_raw_ws(info[0]), row, SRC_TABLE38)
            need_rows("valu-mfma", st.v_valu, a_rows + b_rows + c_rows, 2, SRC_TABLE38)
            need("exec-mfma", st.exec_valu, 4, "exec", SRC_TABLE38)
        elif valu or vmem or fx.ds:
            # MFMA results: reads (RAW) and overwrites (WAW); SrcC reads (WAR)
            for row in read_rows:
                info = st.v_mfma_info[row]
                if info is not None:
                    need("mfma-raw", st.v_mfma[row], _mfma_raw_ws(info[0]), row, SRC_TABLE38)
            if valu or fx.load:
                for row in write_rows:
                    info = st.v_mfma_info[row]
                    if info is not None:
                        need("mfma-waw", st.v_mfma[row], _mfma_raw_ws(info[0]), row, SRC_TABLE38)
                    if st.v_srcc[row] > _NEG:
                        need("mfma-war", st.v_srcc[row], _mfma_war_ws(st.v_srcc_p[row]), row, SRC_TABLE38)
        if valu:
            if not fx.trans:
                need_rows("trans-forward", st.v_trans, read_rows, 1)
            need_rows("dst-sel-forward", st.v_partial, read_rows, 1)
            for sg in fx.explicit_s:
                need("valu-sgpr-valu", st.s_valu[sg], 2, -1 - sg)
            if name.startswith("v_permlane"):
                need_rows("valu-permlane", st.v_valu, read_rows, 2)
                need("exec-permlane", st.exec_valu, 4, "exec")
            if name in ("v_readlane_b32", "v_writelane_b32") and inst.src1 is not None \
                    and inst.src1 < 128:
                need("valu-sgpr-lanesel", st.s_valu[inst.src1], 4, -1 - inst.src1)
            if name in ("v_readlane_b32", "v_readfirstlane_b32", "v_writelane_b32"):
                need("exec-lanesel", st.exec_valu, 4, "exec")
            if name in ("v_readlane_b32", "v_readfirstlane_b32") and inst.src0 >= 256:
                row = inst.src0 - 256
                need("valu-vgpr-readlane", st.v_valu[row], 1, row)
            if inst.dpp is not None:
                need_rows("valu-dpp", st.v_valu, read_rows, 2)
                need("exec-dpp", st.exec_valu, 5, "exec")
            if name == "v_div_fmas_f32" or name == "v_div_fmas_f64":
                need("vcc-div-fmas", max(st.s_valu[VCC], st.s_valu[VCC + 1]), 4, "vcc")
        if valu or mfma:
            need_rows("store-data", st.v_store, write_rows, 2)
        for sg in fx.vmem_srows:
            need("valu-sgpr-vmem", st.s_valu[sg], 5, -1 - sg)
        if fx.m0_reader:
            need("m0-lds-dma", st.s_salu[M0], 1, "m0")
        if name in ("s_getreg_b32", "s_setreg_b32", "s_setreg_imm32_b32"):
            hw = inst.simm16 & 0x3F
            need("setreg", st.setreg.get(hw, _NEG), 2, f"hwreg {hw}")
        if found:
            found.sort(key=lambda f: f[1] - f[0])
            needed, since, rule, _, source = found[0]
            regs = [_code_name(wave, f[3]) if isinstance(f[3], int) else f[3] for f in found if f[2] == rule]
            self._report(rule, inst, wave,
                         f"{_ranges_text(regs)}: {since} wait state(s) since the producer, "
                         f"{needed} required (insert s_nop {needed - since - 1} or independent "
                         "instructions)", source)

    def _record_waitstates(self, wave, st: _WaveState, inst, fx: _Facts) -> None:
        name = fx.name
        if name == "s_nop":
            st.cum += (inst.simm16 & 0xF) + 1
            return
        st.cum += 1
        after = st.cum
        if fx.mfma:
            p = fx.mfma_p
            _, _, c_rows, d = fx.mfma_rows
            for row in c_rows:
                st.v_srcc[row] = after
                st.v_srcc_p[row] = p
            info = (p, d[0], len(d), inst)
            for row in d:
                st.v_mfma[row] = after
                st.v_mfma_info[row] = info
                st.v_valu[row] = _NEG
            return
        valu = fx.valu
        if fx.write_rows:
            # a later plain write supersedes the MFMA result as the producer
            t = after if valu else _NEG
            trans = after if valu and fx.trans else _NEG
            partial = after if fx.partial else _NEG
            for row in fx.write_rows:
                st.v_mfma_info[row] = None
                st.v_srcc[row] = _NEG
                st.v_valu[row] = t
                st.v_trans[row] = trans
                st.v_partial[row] = partial
        if valu:
            for sg in fx.write_srows:
                st.s_valu[sg] = after
        elif fx.salu:
            for sg in fx.write_srows:
                st.s_salu[sg] = after
        if fx.writes_exec:
            st.exec_valu = after
        for row in fx.store_rows:
            st.v_store[row] = after
        if name in ("s_setreg_b32", "s_setreg_imm32_b32"):
            st.setreg[inst.simm16 & 0x3F] = after

    # -- 3. LDS ----------------------------------------------------------------------------
    def _track_queues(self, wave, st: _WaveState, inst, fx: _Facts) -> None:
        # keep the shadows aligned with the emulator's queues (completions leave from the
        # front), then add this instruction's entries
        shadow = st.shadow
        for q, real in (("vm", wave.vmq), ("lgkm", wave.lgkmq)):
            sh = shadow[q]
            if len(sh) > len(real):
                del sh[:len(sh) - len(real)]
        for q in fx.queues:
            st.shadow[q].append((inst.pc, wave.executed, st.gen))

    def lds_access(self, wave, inst, addr: np.ndarray, nbytes: int, write: bool) -> None:
        """Called by the workgroup for every LDS read/write when it is performed."""
        if len(addr) == 0:
            return
        st = self._state(wave)
        q = "lgkm" if inst.fmt == "DS" else "vm"
        real = wave.vmq if q == "vm" else wave.lgkmq
        sh = st.shadow[q]
        idx = len(sh) - len(real) - 1
        if 0 <= idx < len(sh) and sh[idx][0] == inst.pc:
            _, iseq, igen = sh[idx]
        else:                                  # not an asynchronous access: now
            iseq, igen = wave.executed, st.gen
        rseq, rgen = wave.executed, st.gen
        wg = wave.wg
        ls = self._wgs.get(wg)
        if ls is None or ls.size != wg.lds_size:
            ls = self._wgs[wg] = _LdsState(wg.lds_size, len(wg.waves))
        # the bytes touched, a lane's as often as lanes share them (every check and update below
        # holds per byte, so repeats change nothing; a report names each byte once)
        b = (np.asarray(addr, np.int64)[:, None] + np.arange(nbytes)).ravel()
        b = b[(b >= 0) & (b < ls.size)]
        if len(b) == 0:
            return
        me = wave.index
        queue = 0 if q == "lgkm" else 1
        problems = []
        # the last write by another wave must have been retired before a barrier this
        # access was issued after
        ww = ls.w_wave[b]
        other = (ww >= 0) & (ww != me)
        bad = other & (ls.w_rgen[b] >= igen)
        if bad.any():
            # unordered only against an LDS DMA's memory round trip (lds-dma-unordered):
            # this LDS DMA over another wave's LDS DMA issued before a barrier this one was
            # issued after (write-after-write), or a read issued before a barrier another
            # wave's LDS DMA was issued after, performed after that DMA (write-after-read)
            if write:
                war = bad & (ls.w_queue[b] == 1) & (ls.w_igen[b] < igen) if queue == 1 \
                    else np.zeros_like(bad)
            else:
                war = bad & (ls.w_queue[b] == 1) & (ls.w_igen[b] > igen)
            race = bad & ~war
            if race.any():
                i = _lowest(b, race)
                problems.append(("lds-race", b[race], f"written by wave {int(ww[i])} of the "
                                 "workgroup without an s_barrier (after its s_waitcnt) in "
                                 "between"))
            if war.any():
                i = _lowest(b, war)
                if write:
                    why = (f"written by an LDS DMA of wave {int(ww[i])} not waited for before "
                           "an s_barrier this LDS DMA was issued after")
                else:
                    why = (f"overwritten by an LDS DMA of wave {int(ww[i])} issued after an "
                           "s_barrier that this read was issued before but not waited for "
                           "before")
                problems.append(("lds-dma-unordered", b[war], why))
        # same wave, other counter (LDS DMA vs DS): program order must be enforced by waits
        same = (ww == me) & (ls.w_queue[b] != queue)
        if same.any():
            wi, wr = ls.w_iseq[b], ls.w_rseq[b]
            bad = same & (wi < iseq) & (wr > iseq)
            later = same & (wi > iseq) & (rseq > wi)
            war = later if not write else np.zeros_like(later)
            bad |= later & ~war
            if bad.any():
                problems.append(("lds-dma-order", b[bad],
                                 "written by this wave's " + ("DS" if queue else "LDS DMA") +
                                 " operation on the other counter without an s_waitcnt "
                                 "in between"))
            if war.any():
                problems.append(("lds-dma-unordered", b[war], "overwritten by this wave's LDS DMA "
                                 "issued after this read but before the s_waitcnt that "
                                 "retires the read"))
        if write:
            for w2 in range(ls.r_rgen.shape[0]):
                if w2 == me:
                    continue
                bad = ls.r_rgen[w2, b] >= igen
                if bad.any():
                    if queue == 0:
                        problems.append(("lds-race", b[bad], f"read by wave {w2} of the "
                                         "workgroup without an s_barrier (after its s_waitcnt) "
                                         "in between"))
                        break
                    # an LDS DMA overwriting what another wave read: write-after-read
                    # (lds-dma-unordered), its read issued before a barrier this DMA was
                    # issued after, or without any barrier in between
                    early = bad & (ls.r_igen[w2, b] < igen)
                    how = ("issued before an s_barrier this LDS DMA was issued after, but not "
                           "waited for before it") if early.all() else \
                        ("without an s_barrier between that read and this LDS DMA (it holds "
                         "only if the other wave reads within the DMA's memory round trip)")
                    problems.append(("lds-dma-unordered", b[bad], f"read by wave {w2} of the "
                                     f"workgroup, {how}"))
                    break
            if queue == 1:           # DMA write vs this wave's DS reads
                ri, rr = ls.r_iseq[me, b], ls.r_rseq[me, b]
                has = ri >= 0
                war = has & (ri < iseq) & (rr > iseq)
                bad = has & (ri > iseq) & (rseq > ri)
                if bad.any():
                    problems.append(("lds-dma-order", b[bad], "read by this wave's DS "
                                     "operation without an s_waitcnt in between"))
                if war.any():
                    problems.append(("lds-dma-unordered", b[war], "still being read by this wave's "
                                     "earlier DS operation (no s_waitcnt lgkmcnt before this "
                                     "LDS DMA was issued)"))
            ls.w_wave[b] = me
            ls.w_queue[b] = queue
            ls.w_iseq[b] = iseq
            ls.w_rseq[b] = rseq
            ls.w_rgen[b] = rgen
            ls.w_igen[b] = igen
        else:
            ls.r_rgen[me, b] = np.maximum(ls.r_rgen[me, b], rgen)
            ls.r_igen[me, b] = np.maximum(ls.r_igen[me, b], igen)
            if queue == 0:
                ls.r_iseq[me, b] = iseq
                ls.r_rseq[me, b] = rseq
        for rule, bytes_, why in problems:
            bytes_ = np.unique(bytes_)
            lo, hi = int(bytes_.min()), int(bytes_.max())
            self._report(rule, inst, wave,
                         f"LDS bytes 0x{lo:x}..0x{hi:x} ({len(bytes_)} bytes) "
                         f"{'written' if write else 'read'} here were {why}", SRC_BARRIER)


# --------------------------------------------------------------------------------------
# helpers

def mfma_rows(accum_offset: int, inst) -> tuple:
    """Unified register-file rows (v<i> = i, a<i> = accum_offset + i) of an MFMA's SrcA,
    SrcB, SrcC (empty for an inline constant) and destination."""
    a, b, cd = _mfma_regs(inst.name, inst.cbsz, inst.blgp)

    def rows(code, n, acc):
        if code is None or code < 256:
            return []
        base = code - 256 + (accum_offset if acc else 0)
        return list(range(base, base + n))
    d = inst.vdst + (accum_offset if inst.acc_cd else 0)
    return (rows(inst.src0, a, inst.acc & 1), rows(inst.src1, b, inst.acc & 2),
            rows(inst.src2, cd, inst.acc_cd), list(range(d, d + cd)))


def _explicit_sgpr_reads(inst) -> list:
    """SGPRs a VALU instruction reads as operands (not the implicit EXEC), plus VCC when
    it is read implicitly as a carry-in or mask."""
    out = []
    if inst.fmt in ("VOP1", "VOP2", "VOPC", "VOP3", "VOP3P"):
        dw, w0, w1, w2 = vop_widths(inst)
        nsrc = 3
        if inst.fmt == "VOP3" and inst.info == "VOP3":   # a VOP3-only opcode: its own count
            from .render import _vop3_nsrc                # (a two-source one leaves src2 at 0)
            nsrc = _vop3_nsrc(inst.name)
        for code, width in list(((inst.src0, w0), (inst.src1, w1), (inst.src2, w2)))[:nsrc]:
            if code is not None and code < 128:
                out += list(range(code, min(code + width, 128)))
    for reg in operands(inst).reads:
        if reg.kind == "s" and reg.index == VCC:
            out += [VCC, VCC + 1]
    return sorted(set(r for r in out if r not in (EXEC, EXEC + 1) or
                      EXEC in (inst.src0, inst.src1, inst.src2)))


def _store_dwords(inst) -> int:
    m = re.search(r"_(dwordx(\d)|dword|short|byte)", inst.name)
    if not m:
        return 1
    return int(m.group(2)) if m.group(2) else 1


# --------------------------------------------------------------------------------------
# 4. interleavings

def interleavings_agree(run, schedules=((16, None), (1, None), (7, 1), (3, 2), (64, 3))):
    """Call ``run(quantum, seed)`` (it must launch with ``Config.quantum = quantum`` and
    ``Config.seed = seed`` and return a tuple/list of numpy arrays) once per schedule and
    return ``(True, [])`` if all outputs are bit-identical, else ``(False, [(schedule,
    index of the first differing output), ...])``."""
    ref = None
    diffs = []
    for sched in schedules:
        outs = [np.asarray(o) for o in run(*sched)]
        if ref is None:
            ref = outs
            continue
        for i, (a, b) in enumerate(zip(ref, outs)):
            if a.shape != b.shape or not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
                diffs.append((sched, i))
                break
    return not diffs, diffs


def install_from_env(machine) -> HazardChecker | None:
    """``ZYFA_EMULATOR_HAZARDS=1``: attach a raising checker (used by the driver)."""
    import os
    if os.environ.get("ZYFA_EMULATOR_HAZARDS", "") in ("", "0"):
        return None
    return HazardChecker().attach(machine)

