"""A trace-driven cycle model of one gfx950 compute unit, and of a whole device from it.

The emulator's observer records every wave's executed instruction stream
(:class:`TraceRecorder`); :func:`simulate` replays those streams on a model CU and
reports, per SIMD, how busy the matrix (MFMA) pipe and the VALU are; :func:`stream`
replays a kernel's workgroups through the CU's resident slots; :func:`loop_figures` cuts
out the steady state of the inner loop; :func:`workgroup_cost` turns streamed runs into
the cost of one workgroup (fixed cycles plus a period per KV tile at each residency) and
:func:`device_run` runs a whole grid of them on the MI355X's CUs.  Nothing here is
measured: every number follows from the assumptions below (all in :class:`Params`),
which docs/emulator.md lists with their sources; docs/gfx950_calibration.md holds them
against published MI355X measurements.  The module runs no kernel itself: bench/
gfx950_model.py traces the project's kernels through the runtime, bench/
gfx950_calibration.py AMD's own.

Model (in-order issue per wave, shared pipes per SIMD):

* 4 SIMDs per CU.  Wave ``i`` of the ``g``-th resident workgroup goes to SIMD ``(i + g *
  waves_per_workgroup) % 4`` (round-robin over the CU in dispatch order; AMD does not
  document the SPI's placement rule -- for 4-wave workgroups any rotation gives every
  SIMD one wave per workgroup).  Resident workgroups per CU: the minimum of the LDS limit
  (160 KiB / the kernel's LDS), the VGPR limit (waves per SIMD = min(8, 512 / VGPRs
  rounded up to 8), ISA §3.6.4) and the wave-slot limit.
* A wave issues in program order, at most one instruction per 4 cycles (``issue``).
* **VALU**: a wave64 instruction occupies its SIMD's VALU for 4 cycles (16 lanes x 4
  cycles).  Packed FP32 (``v_pk_fma_f32`` & co.) also takes 4 cycles -- two results per
  lane, so twice the FP32 work per slot.  Transcendentals (``v_exp_f32``, ``v_log_f32``,
  ``v_rcp_f32``, ...) take ``trans`` cycles: 4 by default (one VALU slot, as LLVM's gfx950
  scheduling model issues them and as the published budget counts ``v_exp_f32``); the
  classic GCN quarter rate is ``trans=16`` and is reported alongside.  FP64 VALU: 8
  (MI355X's FP64 vector rate is half its FP32 rate); 32-bit integer multiplies
  (``v_mul_lo_u32``, ``v_mad_u64_u32`` ...): 16 (quarter rate, as on GCN).
* **MFMA**: occupies its SIMD's matrix pipe for 4 x passes cycles (ISA §7.1 Table 28:
  16x16x32 bf16 4 passes = 16 cycles, 32x32x16 bf16 8, 16x16x128 f8f6f4 8 (FP8) / 4,
  32x32x64 f8f6f4 16 / 8); issuing it takes one 4-cycle VALU issue slot.  An MFMA waits
  for the matrix pipe (the hardware interlocks independent MFMAs); back-to-back
  accumulation into the same C needs no extra wait.  A read of an MFMA result waits until
  the result is written (correct code already has the wait states, so this never binds).
  While one wave's MFMA runs, other waves (or the same wave) issue VALU work: that is the
  overlap the model measures.
* Arbitration when several waves of a SIMD can issue at the same cycle: higher
  ``s_setprio`` first, then the older wave (ISA §12.5 S_SETPRIO: priority = {user
  priority, wave age}).
* **SALU**, branches, ``s_setprio``: 4 cycles; a taken branch adds ``branch_taken``
  cycles (instruction-buffer refill; assumed 8).  ``s_nop N`` idles the wave for N+1
  issue cycles (4 cycles each) without using a pipe; ``s_waitcnt`` takes no issue slot of
  its own (the next instruction issues when the counter allows).
* **Memory** (latencies are assumptions, not measurements): LDS (DS instructions)
  ``lds_latency`` = 64 cycles after the CU's LDS pipe has moved the data at
  ``lds_bytes_per_clk`` = 125 bytes/cycle (fitted to AMD's published figures, see
  docs/gfx950_calibration.md; CDNA4 documents 256 as its peak read rate), each access
  charged its bank conflicts (:func:`lds_conflict_factor`); vector memory
  ``vmem_latency`` = 500 cycles
  after the CU's vector-memory pipe has accepted the request at ``vmem_bytes_per_clk`` =
  64 bytes/cycle; scalar memory ``smem_latency`` = 200 cycles.  Counters complete as the
  ISA says (§4.4): VM_CNT and LDS in order, SMEM out of order; ``s_waitcnt`` stalls the
  wave until enough have completed, and so does issuing a 64th VM_CNT or 16th LGKM_CNT
  operation (the counters' capacity).  Bandwidth beyond the CU (L2, HBM) is not modelled:
  the figures are compute-side.
* ``s_barrier``: a wave waits until every live wave of its workgroup has arrived;
  all leave ``barrier_latency`` (assumed 16) cycles after the last arrival.

MI355X: 256 CUs at a 2.4 GHz peak engine clock (AMD's Hot Chips 2025 MI350 figure; it
also reproduces AMD's published peak rates, e.g. 2.5 PFLOP/s dense BF16 = 256 CUs x 4
SIMDs x 1024 FLOP/cycle x 2.4 GHz); the figures use the sustained clock under load,
``SUSTAINED_GHZ`` = 2.108 GHz.

Whole device (:func:`device_run`): the grid's workgroups in dispatch order, each costing a
fixed part per query segment plus a period per KV tile that depends on how many share its
CU (:class:`WorkgroupCost`, cut out of streamed runs by :func:`workgroup_cost`), go to the
256 CUs breadth first and then to the first slot that frees; the last partial wave, causal
workgroups of unequal length and a CU running faster with fewer residents in the tail all
follow from that.  Not modelled: the XCDs' round-robin dealing, L2/HBM bandwidth, launch
overhead.
"""

from __future__ import annotations

import dataclasses
import heapq
import re

from .hazards import TRANS_OPS, is_mfma, mfma_passes, mfma_rows
from .operands import operands

__all__ = ["Params", "TraceRecorder", "WaveTrace", "simulate", "SimResult", "loop_figures",
           "LoopFigures", "backedge_tiles", "occupancy", "dispatch_order", "stream",
           "stream_window",
           "group_spans", "WorkgroupCost", "loop_period", "workgroup_cost", "DeviceRun", "device_run",
           "kv_tiles", "attention_flops", "tflops", "MI355X_CUS", "MI355X_GHZ",
           "SUSTAINED_GHZ", "CALIBRATED", "LDS_BAND", "banded"]

MI355X_CUS = 256
MI355X_GHZ = 2.4                   # peak engine clock
#: The engine clock under load the published FP8 design reports for BF16-like activity
#: (1,628 MHz on real FP8 activations); docs/gfx950_calibration.md.  Not fitted.
SUSTAINED_GHZ = 2.108
SIMDS = 4
VM_MAX, LGKM_MAX = 63, 15          # counter capacities (ISA §4.4): issue stalls beyond them


@dataclasses.dataclass
class Params:
    issue: int = 4                 # cycles between two instructions of one wave
    valu: int = 4                  # wave64 VALU instruction (incl. packed FP32)
    trans: int = 4                 # transcendental VALU (16 = quarter rate)
    dp: int = 8                    # FP64 VALU
    imul: int = 16                 # 32-bit integer multiply
    salu: int = 4
    branch_taken: int = 8
    lds_latency: int = 64
    # Fitted: the effective LDS rate at which AMD's AITER FAv3 kernels, modelled at
    # SUSTAINED_GHZ, match their published MI355X figures (docs/gfx950_calibration.md; RMS
    # of log(modelled / published) 0.035 over 12 points).  CDNA4 documents 256 bytes per
    # clock as the LDS read bandwidth; at that rate the model is 1.35-1.52x too fast.
    lds_bytes_per_clk: float = 125
    vmem_latency: int = 500
    vmem_bytes_per_clk: int = 64
    smem_latency: int = 200
    barrier_latency: int = 16
    lds_bank_conflicts: bool = True    # charge DS accesses their bank conflicts (see below)


#: The parameters docs/gfx950_calibration.md holds against AMD's published measurements
#: (the defaults; named for the places that mean "calibrated").
CALIBRATED = Params()

#: Offsets (bytes per clock) of the LDS rate over which a calibrated figure is averaged.  A
#: deterministic model of a ping-pong loop that is LDS-bound at times locks into one
#: schedule or another: the period moves in steps with the rate (the FP8 d128 loop: 1,427,
#: 1,302 and 1,263 cycles at 123, 125 and 127 B/clk); hardware does not hold one phase
#: that exactly across 256 CUs.  The mean over +-4 B/clk (+-3 %) stands for that; the
#: spread is reported with it.
LDS_BAND = (-4, -2, 0, 2, 4)


def banded(params: Params, band=LDS_BAND) -> list:
    """``params`` at each LDS rate of the band."""
    return [dataclasses.replace(params, lds_bytes_per_clk=params.lds_bytes_per_clk + d)
            for d in band]


# --------------------------------------------------------------------------------------
# Recording

@dataclasses.dataclass
class WaveTrace:
    workgroup: tuple
    index: int                     # wave number within its workgroup
    accum_offset: int
    insts: list                    # decoded instructions, in execution order
    lanes: list                    # active lanes at issue (EXEC popcount)
    conflicts: dict = dataclasses.field(default_factory=dict)   # index -> LDS bank-conflict factor


class TraceRecorder:
    """Observer recording each wave's executed instructions (attach with
    ``machine.observers.append(rec)``)."""

    def __init__(self):
        self.traces: list[WaveTrace] = []
        self._by_wave: dict = {}

    def __call__(self, wave, inst) -> None:
        t = self._by_wave.get(wave)
        if t is None:
            t = self._by_wave[wave] = WaveTrace(wave.wg.id, wave.index, wave.accum_offset, [], [])
            self.traces.append(t)
        t.insts.append(inst)
        t.lanes.append((wave.s[126] | wave.s[127] << 32).bit_count())
        if inst.fmt == "DS" and inst.name.startswith(("ds_read", "ds_write")) \
                and "2" not in inst.name.split("_")[1]:
            f = lds_conflict_factor(wave, inst)
            if f > 1:
                t.conflicts[len(t.insts) - 1] = f
        if inst.name == "s_endpgm":
            del self._by_wave[wave]

    def workgroups(self) -> dict:
        out: dict = {}
        for t in self.traces:
            out.setdefault(t.workgroup, []).append(t)
        for ws in out.values():
            ws.sort(key=lambda t: t.index)
        return out


def lds_conflict_factor(wave, inst) -> float:
    """Bank-conflict factor of one DS access (a model, not a documented rule): CDNA4's LDS has
    64 banks of 4 bytes (256 bytes per clock); the active lanes go in phases that move 256
    bytes (16 lanes of a 16-byte access, 32 of an 8-byte one, 64 of a 4-byte one); a phase
    takes as many cycles as the largest number of distinct dwords one bank serves (lanes
    reading the same dword share it).  Factor = cycles / the conflict-free count.

    Phases are runs of consecutive lanes, except for 16-byte reads: CDNA3's documented
    ``ds_read_b128`` phases (32 banks, 8 lanes each: lanes 0-3 + 20-23, 4-7 + 16-19,
    8-11 + 28-31, 12-15 + 24-27, and the same in the upper half; Composable Kernel's
    "Understanding AMD GPU LDS and Bank Conflicts") are taken two to a 64-bank phase,
    0-3 + 20-23 with 8-11 + 28-31: phase = (lane bit 5, bit 2 xor bit 4).  Which two is not
    documented; this pairing is the one of the four combinations under which AMD's
    silicon-tuned AITER FAv3 forward kernels read K without a conflict
    (docs/gfx950_calibration.md), as this project's FP8 kernels do too."""
    import numpy as np
    nbytes = _ds_bytes(inst.name)
    mask = wave.execmask() if hasattr(wave, "execmask") else None
    base = wave.v[inst.addr - 256].astype(np.int64) + inst.offset
    lanes = np.nonzero(mask)[0] if mask is not None else np.arange(64)
    if len(lanes) == 0:
        return 1.0
    words = max(1, nbytes // 4)
    if nbytes == 16 and inst.name.startswith("ds_read"):
        phase = (lanes >> 5) * 2 + (((lanes >> 2) ^ (lanes >> 4)) & 1)
    else:
        phase = lanes // max(1, 256 // max(nbytes, 4))
    cycles = 0
    phases = np.unique(phase)
    for ph in phases:
        addr = base[lanes[phase == ph]]
        dw = np.unique((addr[:, None] // 4 + np.arange(words)[None, :]).ravel())
        cycles += int(np.bincount(dw % 64, minlength=64).max())
    return cycles / len(phases)


# --------------------------------------------------------------------------------------
# Instruction classes

_IMUL = re.compile(r"v_(mul_lo_u32|mul_hi_u32|mul_hi_i32|mul_lo_i32|mad_u64_u32|mad_i64_i32)$")
_DS_BYTES = re.compile(r"_(b|u|i)(8|16|32|64|96|128)")


def _ds_bytes(name: str) -> int:
    if name in ("ds_bpermute_b32", "ds_permute_b32", "ds_swizzle_b32"):
        return 4
    if "_tr_" in name:
        return 12 if "b96" in name else 8
    m = _DS_BYTES.search(name)
    n = int(m.group(2)) // 8 if m else 4
    return 2 * n if ("read2" in name or "write2" in name) else n


def _vmem_bytes(name: str) -> int:
    m = re.search(r"_(dwordx(\d)|dword|short|ushort|sshort|byte|ubyte|sbyte)", name)
    if not m:
        return 4
    if m.group(2):
        return 4 * int(m.group(2))
    return {"dword": 4, "short": 2, "ushort": 2, "sshort": 2}.get(m.group(1), 1)


class _Kind:
    MFMA, VALU, SALU, NOP, WAIT, BARRIER, END, BRANCH, SMEM, VMEM, DS, FLAT, OTHER = range(13)


def _classify(inst, p: Params):
    """(kind, pipe cycles, extra) of an instruction under ``p`` (memoised)."""
    cached = getattr(_classify, "cache", None)
    if cached is None:
        cached = _classify.cache = {}
    key = (id(inst), p.trans, p.valu, p.dp, p.imul)
    hit = cached.get(key)
    if hit is not None and hit[0] is inst:
        return hit[1]
    n, f = inst.name, inst.fmt
    if is_mfma(inst):
        out = (_Kind.MFMA, 4 * mfma_passes(n, inst.cbsz, inst.blgp), None)
    elif f in ("VOP1", "VOP2", "VOPC", "VOP3", "VOP3P", "MAI"):
        if n in TRANS_OPS:
            c = p.trans
        elif n.endswith("_f64") or "_f64_" in n:
            c = p.dp
        elif _IMUL.match(n):
            c = p.imul
        else:
            c = p.valu
        out = (_Kind.VALU, c, None)
    elif n == "s_nop":
        out = (_Kind.NOP, 0, (inst.simm16 & 0xF) + 1)
    elif n == "s_waitcnt":
        s = inst.simm16
        out = (_Kind.WAIT, 0, ((s & 0xF) | ((s >> 14) & 3) << 4, (s >> 8) & 0xF))
    elif n == "s_barrier":
        out = (_Kind.BARRIER, 0, None)
    elif n == "s_endpgm":
        out = (_Kind.END, 0, None)
    elif n.startswith(("s_branch", "s_cbranch")):
        out = (_Kind.BRANCH, p.salu, None)
    elif f == "SMEM":
        out = (_Kind.SMEM, 0, None)
    elif f == "DS":
        out = (_Kind.DS, 0, _ds_bytes(n))
    elif f == "FLAT":
        out = (_Kind.FLAT, 0, _vmem_bytes(n))
    elif f in ("MUBUF", "GLOBAL", "SCRATCH"):
        out = (_Kind.VMEM, 0, _vmem_bytes(n))
    elif f in ("SOP1", "SOP2", "SOPC", "SOPK", "SOPP"):
        out = (_Kind.SALU, p.salu, None)
    else:
        out = (_Kind.OTHER, p.salu, None)
    if len(cached) > 100_000:
        cached.clear()
    cached[key] = (inst, out)
    return out


# --------------------------------------------------------------------------------------
# Simulation

@dataclasses.dataclass
class SimResult:
    cycles: int                                 # last wave's end
    simd_of: list                               # per wave
    mfma_busy: list                             # per SIMD: list of (start, end)
    valu_busy: list                             # per SIMD: list of (start, end), MFMA issue excluded
    issue_times: list                           # per wave: start cycle of each instruction
    end_times: list                             # per wave
    traces: list
    groups: list                                # per wave: its workgroup (barrier group)

    def busy(self, kind: str, lo: int | None = None, hi: int | None = None,
             simds=None) -> float:
        """Fraction of [lo, hi) (default: the whole run) that the pipe ``kind`` ("mfma" or
        "valu") was busy, averaged over ``simds`` (default: those with waves)."""
        lo = 0 if lo is None else lo
        hi = self.cycles if hi is None else hi
        if hi <= lo:
            return 0.0
        lists = self.mfma_busy if kind == "mfma" else self.valu_busy
        simds = sorted(set(self.simd_of)) if simds is None else simds
        tot = 0
        for s in simds:
            for a, b in lists[s]:
                tot += max(0, min(b, hi) - max(a, lo))
        return tot / ((hi - lo) * len(simds))


class _W:
    __slots__ = ("i", "trace", "pos", "ready", "prio", "vm", "lgkm", "done", "simd", "group",
                 "at_barrier", "times", "mfma_ready", "gate")

    def __init__(self, i, trace, simd, group):
        self.i, self.trace, self.simd, self.group = i, trace, simd, group
        self.pos, self.ready, self.prio = 0, 0, 0
        self.vm: list = []                      # completion times, issue order
        self.lgkm: list = []                    # (completion, out_of_order)
        self.done = False
        self.at_barrier = None
        self.times: list = []
        self.mfma_ready: dict = {}              # register row -> cycle its MFMA result lands
        self.gate = None                        # group that must end before this wave starts


class _RowCache:
    """Register rows an instruction reads / writes / reads as MFMA SrcC, per accum_offset."""

    def __init__(self):
        self.d: dict = {}

    def get(self, trace, inst):
        key = (id(inst), trace.accum_offset)
        hit = self.d.get(key)
        if hit is not None and hit[0] is inst:
            return hit[1]
        ops = operands(inst)
        off = trace.accum_offset

        def rows(regs):
            out = []
            for reg in regs:
                if reg.kind == "v":
                    out += range(reg.index, reg.index + reg.count)
                elif reg.kind == "a":
                    out += range(off + reg.index, off + reg.index + reg.count)
            return tuple(out)
        c_rows, d_rows = (), ()
        if is_mfma(inst):
            _, _, c_rows, d_rows = mfma_rows(off, inst)
            d_rows = tuple(d_rows)
        out = (rows(ops.reads) + rows(ops.writes), rows(ops.writes), frozenset(c_rows), d_rows)
        self.d[key] = (inst, out)
        return out


def simulate(traces: list, params: Params | None = None, simd_of=None,
             groups=None, after=None) -> SimResult:
    """Replay wave traces on one CU.  ``simd_of[i]``: SIMD of wave ``i`` (default: the
    round-robin rule of the module docstring, workgroups in the order they appear);
    ``groups[i]``: its workgroup (barrier group; default: the trace's workgroup);
    ``after[i]``: a group that must have ended before wave ``i`` starts (the workgroup
    that held its slot on the CU), or None to start at cycle 0."""
    p = params or Params()
    if groups is None:
        groups = [t.workgroup for t in traces]
    if simd_of is None:
        simd_of, seen = [], {}
        for t in traces:
            g = seen.setdefault(t.workgroup, len(seen))
            per_wg = sum(1 for u in traces if u.workgroup == t.workgroup)
            simd_of.append((t.index + g * per_wg) % SIMDS)
    waves = [_W(i, t, simd_of[i], groups[i]) for i, t in enumerate(traces)]
    gated: dict = {}
    for w in waves:
        if after is not None and after[w.i] is not None:
            w.gate = after[w.i]
            gated.setdefault(w.gate, []).append(w)
    valu_free = [0] * SIMDS
    mfma_free = [0] * SIMDS
    salu_free = [0] * SIMDS
    lds_free = 0
    vmem_free = 0
    mfma_busy: list = [[] for _ in range(SIMDS)]
    valu_busy: list = [[] for _ in range(SIMDS)]
    members: dict = {}
    rowcache = _RowCache()
    for w in waves:
        members.setdefault(w.group, []).append(w)

    def candidate(w: _W) -> int | None:
        """Earliest cycle at which ``w`` can issue its next instruction (None: blocked)."""
        if w.done or w.at_barrier is not None or w.gate is not None:
            return None
        inst = w.trace.insts[w.pos]
        kind, cyc, extra = _classify(inst, p)
        t = w.ready
        if kind == _Kind.MFMA:
            t = max(t, valu_free[w.simd], mfma_free[w.simd])
        elif kind == _Kind.VALU:
            t = max(t, valu_free[w.simd])
        elif kind in (_Kind.SALU, _Kind.BRANCH, _Kind.OTHER):
            t = max(t, salu_free[w.simd])
        elif kind == _Kind.WAIT:
            vm, lgkm = extra
            t = max(t, _vm_wait(w.vm, vm), _lgkm_wait(w.lgkm, lgkm))
        elif kind == _Kind.END:
            t = max(t, _vm_wait(w.vm, 0), _lgkm_wait(w.lgkm, 0))
        elif kind == _Kind.DS:
            t = max(t, lds_free, _lgkm_wait(w.lgkm, LGKM_MAX - 1))
        elif kind == _Kind.SMEM:
            t = max(t, _lgkm_wait(w.lgkm, LGKM_MAX - 1))
        elif kind in (_Kind.VMEM, _Kind.FLAT):
            t = max(t, vmem_free, _vm_wait(w.vm, VM_MAX - 1))
            if kind == _Kind.FLAT:
                t = max(t, _lgkm_wait(w.lgkm, LGKM_MAX - 1))
        if w.mfma_ready and kind not in (_Kind.NOP, _Kind.WAIT, _Kind.BARRIER, _Kind.END):
            touched, _, c_rows, _ = rowcache.get(w.trace, inst)
            for r in touched:
                rt = w.mfma_ready.get(r)
                if rt is not None and rt > t and r not in c_rows:   # SrcC chain: forwarded
                    t = rt
        return t

    heap = []
    for w in waves:
        heapq.heappush(heap, (0, -w.prio, w.i))
    while heap:
        t0, key, i = heapq.heappop(heap)
        w = waves[i]
        t = candidate(w)
        if t is None:
            continue
        if t > t0 or -w.prio != key:          # stale entry: requeue at its real time
            heapq.heappush(heap, (t, -w.prio, i))
            continue
        # commit instruction at cycle t
        inst = w.trace.insts[w.pos]
        kind, cyc, extra = _classify(inst, p)
        w.times.append(t)
        nxt = t + p.issue
        if kind == _Kind.MFMA:
            mfma_free[w.simd] = t + cyc
            valu_free[w.simd] = max(valu_free[w.simd], t + p.issue)
            mfma_busy[w.simd].append((t, t + cyc))
            for r in rowcache.get(w.trace, inst)[3]:
                w.mfma_ready[r] = t + cyc
        elif kind == _Kind.VALU:
            valu_free[w.simd] = t + cyc
            valu_busy[w.simd].append((t, t + cyc))
            if w.mfma_ready:
                for r in rowcache.get(w.trace, inst)[1]:
                    w.mfma_ready.pop(r, None)
        elif kind in (_Kind.SALU, _Kind.BRANCH, _Kind.OTHER):
            salu_free[w.simd] = t + cyc
            if inst.name == "s_setprio":
                w.prio = inst.simm16 & 3
            if kind == _Kind.BRANCH and w.pos + 1 < len(w.trace.insts) and \
                    w.trace.insts[w.pos + 1].pc != inst.pc + inst.size:
                nxt += p.branch_taken
        elif kind == _Kind.NOP:
            nxt = t + p.issue * extra
        elif kind == _Kind.WAIT:              # resolved in the sequencer: no issue slot
            vm, lgkm = extra
            w.vm = _vm_retire(w.vm, vm, t)
            w.lgkm = _lgkm_retire(w.lgkm, lgkm, t)
            nxt = t
        elif kind == _Kind.DS:
            w.lgkm = _lgkm_retire(w.lgkm, LGKM_MAX - 1, t)
            nbytes = extra * max(1, w.trace.lanes[w.pos])
            # a rate, not a whole number of cycles per access: a fitted rate (docs/
            # gfx950_calibration.md) must move the result continuously
            occ = max(1.0, nbytes / p.lds_bytes_per_clk)
            if p.lds_bank_conflicts:
                occ *= w.trace.conflicts.get(w.pos, 1.0)
            lds_free = t + occ
            w.lgkm.append((t + occ + p.lds_latency, False))
            if w.mfma_ready:
                for r in rowcache.get(w.trace, inst)[1]:
                    w.mfma_ready.pop(r, None)
        elif kind in (_Kind.VMEM, _Kind.FLAT):
            w.vm = _vm_retire(w.vm, VM_MAX - 1, t)
            if kind == _Kind.FLAT:
                w.lgkm = _lgkm_retire(w.lgkm, LGKM_MAX - 1, t)
            nbytes = extra * max(1, w.trace.lanes[w.pos])
            occ = max(1, -(-nbytes // p.vmem_bytes_per_clk))
            vmem_free = t + occ
            w.vm.append(t + occ + p.vmem_latency)
            if kind == _Kind.FLAT:
                w.lgkm.append((t + occ + p.vmem_latency, True))
            if w.mfma_ready:
                for r in rowcache.get(w.trace, inst)[1]:
                    w.mfma_ready.pop(r, None)
        elif kind == _Kind.SMEM:
            w.lgkm = _lgkm_retire(w.lgkm, LGKM_MAX - 1, t)
            w.lgkm.append((t + p.smem_latency, True))
        w.ready = nxt
        w.pos += 1
        if kind == _Kind.END or w.pos >= len(w.trace.insts):
            w.done = True
            w.ready = t
        elif kind == _Kind.BARRIER:
            w.at_barrier = t
        else:
            heapq.heappush(heap, (w.ready, -w.prio, i))
            continue
        if _release_barrier(members[w.group], p):
            for m in members[w.group]:
                if not m.done:
                    heapq.heappush(heap, (m.ready, -m.prio, m.i))
        if w.done and all(m.done for m in members[w.group]):
            end = max(m.ready for m in members[w.group])
            for m in gated.pop(w.group, []):           # the next workgroup takes the slot
                m.gate = None
                m.ready = max(m.ready, end)
                heapq.heappush(heap, (m.ready, -m.prio, m.i))
    ends = [w.ready for w in waves]
    return SimResult(max(ends) if ends else 0, list(simd_of), mfma_busy, valu_busy,
                     [w.times for w in waves], ends, list(traces), list(groups))


def _release_barrier(group: list, p: Params) -> bool:
    live = [m for m in group if not m.done]
    if not live or any(m.at_barrier is None for m in live):
        return False
    t = max(m.at_barrier for m in live) + p.barrier_latency
    for m in live:
        m.at_barrier = None
        m.ready = max(m.ready, t)
    return True


def _vm_wait(vm: list, n: int) -> int:
    k = len(vm) - n
    if k <= 0:
        return 0
    return max(vm[:k])          # in-order decrement: the k oldest must all be done


def _vm_retire(vm: list, n: int, t: int) -> list:
    """Drop what has been counted down by cycle ``t`` (in order: an operation leaves the
    counter only after all older ones)."""
    out, run = [], 0
    for c in vm:
        run = max(run, c)
        if run > t:
            out.append(c)
    return out


def _lgkm_effective(lgkm: list) -> list:
    out, run = [], 0
    for c, ooo in lgkm:
        if ooo:
            out.append(c)
        else:
            run = max(run, c)      # LDS returns in order
            out.append(run)
    return out


def _lgkm_wait(lgkm: list, n: int) -> int:
    k = len(lgkm) - n
    if k <= 0:
        return 0
    return sorted(_lgkm_effective(lgkm))[k - 1]


def _lgkm_retire(lgkm: list, n: int, t: int) -> list:
    if len(lgkm) <= n:
        return lgkm
    eff = _lgkm_effective(lgkm)
    return [x for x, e in zip(lgkm, eff) if e > t]


# --------------------------------------------------------------------------------------
# Steady state of an inner loop

@dataclasses.dataclass
class LoopFigures:
    backedge: int                  # pc of the loop's back-edge branch
    window: tuple                  # [lo, hi) cycles where every wave is inside the loop
    iterations: float              # KV tiles per wave inside the window (mean)
    cycles_per_iteration: float    # per wave and KV tile: mean distance between its back-edges
                                   # over the tiles per back-edge (an unrolled loop has several:
                                   # two workgroup barriers per tile)
    mfma_busy: float               # fraction of the window, averaged over SIMDs with waves
    valu_busy: float
    workgroups: int


def _backedge(trace) -> int | None:
    counts: dict = {}
    insts = trace.insts
    for k, inst in enumerate(insts[:-1]):
        if inst.name.startswith(("s_cbranch", "s_branch")) and insts[k + 1].pc < inst.pc:
            counts[inst.pc] = counts.get(inst.pc, 0) + 1
    return max(counts, key=counts.get) if counts else None


def backedge_tiles(traces: list, backedge: int) -> int:
    """KV tiles one taken back-edge stands for, counted as this project's kernels are
    written: two workgroup barriers per tile (an unrolled loop has several tiles per
    back-edge).  Not a rule of other people's kernels: pass the count to
    :func:`loop_period` where it is known otherwise."""
    for t in traces:
        ks = [k for k, inst in enumerate(t.insts[:-1])
              if inst.pc == backedge and t.insts[k + 1].pc < inst.pc]
        if len(ks) >= 2:
            bars = sum(1 for inst in t.insts[ks[0] + 1:ks[1] + 1] if inst.name == "s_barrier")
            return max(1, bars // 2)
    return 1


def loop_figures(res: SimResult, backedge: int | None = None,
                 window: tuple | None = None) -> LoopFigures | None:
    """Steady-state figures of the most-taken backward branch (the KV-tile loop in the
    attention kernels).  Cycles per iteration: each wave's mean distance between two of
    its taken back-edges, averaged over the waves.  Busy fractions and iterations: over
    ``window``, by default from the latest first back-edge to the earliest last one
    (where every wave is iterating)."""
    if backedge is None:
        from collections import Counter
        votes = Counter(_backedge(t) for t in res.traces)
        votes.pop(None, None)
        if not votes:
            return None
        backedge = votes.most_common(1)[0][0]
    firsts, lasts, periods, stamps = [], [], [], []
    tiles = backedge_tiles(res.traces, backedge)
    for t, times in zip(res.traces, res.issue_times):
        st = [times[k] for k, inst in enumerate(t.insts[:-1])
              if inst.pc == backedge and t.insts[k + 1].pc < inst.pc]
        stamps.append(st)
        if len(st) >= 2:
            firsts.append(st[0])
            lasts.append(st[-1])
            periods.append((st[-1] - st[0]) / (len(st) - 1))
    if not periods:
        return None
    lo, hi = window if window is not None else (max(firsts), min(lasts))
    if hi <= lo:
        return None
    counts = [tiles * sum(1 for x in st if lo < x <= hi) for st in stamps]
    return LoopFigures(backedge, (lo, hi), sum(counts) / len(counts),
                       sum(periods) / len(periods) / tiles, res.busy("mfma", lo, hi),
                       res.busy("valu", lo, hi), len(set(res.groups)))


# --------------------------------------------------------------------------------------
# Workgroups on one CU

def occupancy(kernel, waves_per_wg: int) -> int:
    """Workgroups resident on one CU (LDS, VGPR and wave-slot limits)."""
    md = kernel.metadata
    vgprs = int(md.get("vgpr_count", 256))
    agprs = int(md.get("agpr_count", 0))
    total = (kernel.descriptor.accum_offset + agprs) if agprs else vgprs
    total = -(-max(total, 1) // 8) * 8
    per_simd = min(8, 512 // total)
    by_waves = (per_simd * SIMDS) // waves_per_wg
    lds = kernel.group_segment_fixed_size
    by_lds = (160 * 1024) // lds if lds else 32
    return max(1, min(by_waves, by_lds, 32))


def dispatch_order(recorder: TraceRecorder) -> list:
    """The recorded workgroups, each a list of its wave traces, in dispatch order (x fastest,
    then y, then z: the order of a grid's linear index)."""
    wgs = recorder.workgroups()
    return [wgs[key] for key in sorted(wgs, key=lambda k: (k[2], k[1], k[0]))]


def stream(workgroups: list, resident: int, params: Params | None = None) -> SimResult:
    """Stream ``workgroups`` (lists of wave traces, in dispatch order) through one CU with
    ``resident`` slots: workgroup ``j + resident`` takes the slot of workgroup ``j`` when
    that one ends; the waves of slot ``s`` go to SIMDs ``(i + s * waves) % 4``.  The
    barrier group of a wave is its workgroup's position in the list."""
    g = max(1, min(resident, len(workgroups)))
    traces, groups, after, simd_of = [], [], [], []
    for j, waves in enumerate(workgroups):
        slot = j % g
        for t in waves:
            traces.append(t)
            groups.append(j)
            after.append(j - g if j >= g else None)
            simd_of.append((t.index + slot * len(waves)) % SIMDS)
    return simulate(traces, params, simd_of=simd_of, groups=groups, after=after)


def group_spans(res: SimResult) -> dict:
    """Barrier group -> (first issue, last end) cycle."""
    out: dict = {}
    for i, grp in enumerate(res.groups):
        s, e = out.get(grp, (1 << 62, 0))
        out[grp] = (min(s, res.issue_times[i][0] if res.issue_times[i] else s),
                    max(e, res.end_times[i]))
    return out


def stream_window(res: SimResult, resident: int) -> tuple:
    """The steady window of a streamed run: from the first workgroup's end to the last one's
    start (slots refilled continuously).  Where that is under a fifth of the run (too few
    workgroups to stream), where the first ``resident`` workgroups are all inside their
    loop (latest first back-edge to earliest last one); failing that, the whole run."""
    spans = group_spans(res)
    window = (min(e for _, e in spans.values()), max(s for s, _ in spans.values()))
    if window[1] - window[0] >= 0.2 * res.cycles:
        return window
    be = _backedge(res.traces[0])
    first = set(sorted(spans)[:resident])
    firsts, lasts = [], []
    for i, t in enumerate(res.traces):
        if res.groups[i] in first:
            st = [res.issue_times[i][k] for k, inst in enumerate(t.insts[:-1])
                  if inst.pc == be and t.insts[k + 1].pc < inst.pc]
            if st:
                firsts.append(st[0])
                lasts.append(st[-1])
    if firsts and max(firsts) < min(lasts):
        return (max(firsts), min(lasts))
    return (0, res.cycles)


# --------------------------------------------------------------------------------------
# The whole device

@dataclasses.dataclass(frozen=True)
class WorkgroupCost:
    """What one workgroup costs on a CU, from its streamed steady state: ``fixed`` cycles
    per segment (a run of query rows with its own prologue and epilogue: one per workgroup,
    two where a causal workgroup takes two query tiles) at full residency, plus
    ``periods[g - 1]`` cycles per KV tile while ``g`` workgroups share the CU (``g`` = 1 ..
    the occupancy, ``len(periods)``).  ``empty``: cycles of a workgroup with no query rows
    (a grid sized for the longest of a varlen batch), which only starts and leaves."""
    periods: tuple
    fixed: float
    empty: float = 0.0

    @property
    def resident(self) -> int:
        return len(self.periods)


def loop_period(res: SimResult, window: tuple, tiles_per_backedge: int | None = None,
                backedge: int | None = None) -> float | None:
    """Cycles per KV tile of one wave in ``window``: the mean over all waves of the distance
    between two consecutive taken back-edges of the loop, both inside the window, over the
    KV tiles one back-edge stands for (default: :func:`backedge_tiles`).  Intervals that
    execute more than 1.25 times the median number of instructions are left out: they hold
    something besides the loop body (a causal AITER workgroup switches to its second query
    tile between two back-edges).  Selected by instructions, not by time, so that stalls,
    which belong to the period, stay in it: the intervals of a CU shared by several
    workgroups are skewed (many short, a few long), and their median would be too low."""
    lf = loop_figures(res, backedge=backedge, window=window)
    if lf is None:
        return None
    if tiles_per_backedge is None:
        tiles_per_backedge = backedge_tiles(res.traces, lf.backedge)
    lo, hi = window
    gaps = []                                 # (cycles, instructions)
    for t, times in zip(res.traces, res.issue_times):
        ks = [k for k, inst in enumerate(t.insts[:-1])
              if inst.pc == lf.backedge and t.insts[k + 1].pc < inst.pc and lo <= times[k] <= hi]
        gaps += [(times[b] - times[a], b - a) for a, b in zip(ks, ks[1:])]
    if not gaps:
        return lf.cycles_per_iteration
    counts = sorted(n for _, n in gaps)
    limit = 1.25 * counts[len(counts) // 2]
    body = [c for c, n in gaps if n <= limit]
    return sum(body) / len(body) / max(1, tiles_per_backedge)


def workgroup_cost(runs: dict, tiles: list, segments: list | None = None,
                   tiles_per_backedge: int | None = None) -> WorkgroupCost:
    """A :class:`WorkgroupCost` from streamed runs of the same workgroups: ``runs[g]`` is
    :func:`stream` with ``g`` slots (``g`` = 1 .. occupancy, every one present), ``tiles[j]``
    the KV tiles workgroup ``j`` iterates, ``segments[j]`` its query segments (default 1).
    The period at ``g`` is :func:`loop_period` over :func:`stream_window`; the fixed part
    is the mean over the workgroups of the full-residency run of (span - tiles x period) /
    segments: prologue, epilogue and what the diagonal (masked) tiles cost beyond a
    period.  Workgroups of no segment give ``empty``, their mean span."""
    if sorted(runs) != list(range(1, len(runs) + 1)):
        raise ValueError(f"runs for 1 .. occupancy expected, got {sorted(runs)}")
    periods = []
    for g in sorted(runs):
        per = loop_period(runs[g], stream_window(runs[g], g), tiles_per_backedge)
        if per is None:
            raise ValueError(f"no steady loop in the run with {g} resident workgroups")
        periods.append(per)
    segments = [1] * len(tiles) if segments is None else segments
    spans = group_spans(runs[len(runs)])
    fixed = [(e - s - tiles[j] * periods[-1]) / segments[j] for j, (s, e) in spans.items()
             if segments[j]]
    empty = [e - s for j, (s, e) in spans.items() if not segments[j]]
    return WorkgroupCost(tuple(periods), max(0.0, sum(fixed) / len(fixed)),
                         sum(empty) / len(empty) if empty else 0.0)


@dataclasses.dataclass
class DeviceRun:
    cycles: float                  # from the first dispatch to the last workgroup's end
    workgroups: int
    slots: int                     # CUs x resident workgroups per CU
    waves: float                   # workgroups / slots (a fraction: the last wave is partial)
    cu_busy: float                 # mean over the CUs of their time with a resident workgroup,
                                   # over ``cycles`` (1: no CU idles in the tail)


def device_run(tiles: list, cost: WorkgroupCost, cus: int = 0,
               segments: list | None = None) -> DeviceRun:
    """Run a grid of workgroups on a whole device of ``cus`` CUs (MI355X: 256).  ``tiles[j]``:
    the KV tiles of the ``j``-th workgroup in dispatch order (causal workgroups differ),
    ``segments[j]`` its query segments (default 1).

    Each CU holds up to ``cost.resident`` workgroups.  The first ``cus x resident`` go out
    breadth first (workgroup ``j`` to CU ``j % cus``); after that the next workgroup in
    dispatch order takes the slot a finished one leaves.  A workgroup's work is its tiles
    plus its fixed part in tiles (``segments x fixed / periods[-1]``; a workgroup of no
    segment: ``empty / periods[-1]``); while ``g`` share a CU each
    advances one tile per ``periods[g - 1]`` cycles, so a CU left with fewer workgroups in
    the tail runs each faster, as its streamed runs with fewer slots did.  Nothing here
    models the XCDs (eight of 32 CUs, workgroups dealt round robin) or L2/HBM bandwidth."""
    cus = cus or MI355X_CUS
    per = cost.periods
    g_max = cost.resident
    fixed = cost.fixed / per[-1]
    segments = [1] * len(tiles) if segments is None else segments
    work = [t + fixed * m if m else cost.empty / per[-1] for t, m in zip(tiles, segments)]
    n = len(work)
    active: list = [[] for _ in range(cus)]
    last = [0.0] * cus
    busy = [0.0] * cus
    version = [0] * cus
    heap: list = []

    def schedule(c: int) -> None:
        version[c] += 1
        if active[c]:
            heapq.heappush(heap, (last[c] + min(active[c]) * per[len(active[c]) - 1],
                                  c, version[c]))

    nxt = min(n, cus * g_max)
    for j in range(nxt):
        active[j % cus].append(work[j])
    for c in range(cus):
        schedule(c)
    end = 0.0
    while heap:
        t, c, ver = heapq.heappop(heap)
        if ver != version[c]:
            continue
        g = len(active[c])
        done = (t - last[c]) / per[g - 1]
        rest = [w - done for w in active[c]]
        k = min(range(g), key=rest.__getitem__)
        rest.pop(k)                              # the one that finishes now (ties: next event)
        active[c] = [max(w, 0.0) for w in rest]
        busy[c] += t - last[c]
        last[c] = t
        end = max(end, t)
        while len(active[c]) < g_max and nxt < n:
            active[c].append(work[nxt])
            nxt += 1
        schedule(c)
    slots = cus * g_max
    return DeviceRun(end, n, slots, n / slots,
                     sum(busy) / (cus * end) if end else 0.0)


def kv_tiles(row0: int, row1: int, seqlen_q: int, seqlen_k: int, block_n: int,
             causal: bool) -> int:
    """KV tiles that query rows [row0, row1) iterate: all of them, or with bottom-right causal
    masking (row ``r`` sees keys ``<= r + seqlen_k - seqlen_q``) those up to the last row's
    diagonal; rows past ``seqlen_q`` see nothing."""
    row1 = min(row1, seqlen_q)
    if row1 <= row0:
        return 0
    keys = seqlen_k if not causal else max(0, min(seqlen_k, row1 + seqlen_k - seqlen_q))
    return -(-keys // block_n)


def attention_flops(batch: int, heads_q: int, seqlen_q: int, seqlen_k: int, d_qk: int,
                    d_v: int, causal: bool) -> float:
    """FLOPs of an attention forward as the published figures count them:
    2 x B x Hq x Sq x Sk x (d_qk + d_v), halved when causal."""
    return 2.0 * batch * heads_q * seqlen_q * seqlen_k * (d_qk + d_v) / (2 if causal else 1)


def tflops(flops: float, cycles: float, ghz: float) -> float:
    """TFLOP/s of ``flops`` done in ``cycles`` at an engine clock of ``ghz``."""
    return flops / (cycles / (ghz * 1e9)) / 1e12 if cycles else 0.0
