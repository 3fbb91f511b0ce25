"""Dispatch of a kernel grid: code loading, initial wave state, workgroup scheduling.

* Code: the code object's allocatable sections are laid out in one host buffer by
  virtual address (as a loader would); program counters are host addresses inside it,
  so ``s_getpc_b64``-relative data accesses work.  Instructions are decoded on first
  execution and cached per address; branches go by target address.
* Initial state (LLVM AMDGPUUsage "Initial Kernel Execution State", ISA §3.13): the
  user SGPRs the kernel descriptor enables (private segment buffer, dispatch pointer,
  queue pointer, kernarg segment pointer, dispatch id, flat scratch init, private
  segment size, preloaded kernargs) from s0, then the enabled system SGPRs (workgroup
  id x/y/z, workgroup info, private segment wave offset); v0 holds the packed work-item
  id ``x | y << 10 | z << 20`` (y and z only when enabled); EXEC covers the wave's
  work-items; MODE comes from COMPUTE_PGM_RSRC1 (round, denorm, DX10 clamp, IEEE,
  FP16_OVFL).  Registers the ABI does not initialise hold a poison pattern.
* Scheduling: workgroups run one after another; inside one, waves run round-robin,
  ``quantum`` instructions at a time, and ``s_barrier`` holds a wave until every wave
  of its workgroup that has not ended reaches a barrier.
* Observation: every entry of ``observers`` is called as ``observer(wave, inst)``
  before each instruction executes (wave state is pre-instruction); ``operands.py``
  tells which registers the instruction reads and writes.
"""

from __future__ import annotations

import dataclasses
import random
import struct
import time

import numpy as np

from . import mfma, salu, valu, vmem
from .codeobject import CodeObject, KernelInfo
from .errors import EmulatorError
from .isa import DecodeError, decode
from .memory import GlobalMemory
from .wave import BARRIER, DONE, RUN, Wave

LDS_BYTES = 160 * 1024

HANDLERS: dict = {}
for _mod in (salu, valu, vmem, mfma):
    HANDLERS.update(_mod.HANDLERS)


@dataclasses.dataclass
class Config:
    """Knobs of the emulator.  Defaults favour catching kernel bugs."""
    quantum: int = 16                    # instructions a wave runs before the next wave's turn
    strict_lds: bool = True              # LDS access outside the allocation is an error
    vgpr_poison: int = 0xFFFFFFFF        # uninitialised VGPRs (a float NaN)
    sgpr_poison: int = 0xFFFFFFFF
    lds_poison: int = 0xFF               # uninitialised LDS bytes
    max_instructions: int = 200_000_000  # per wave; guards against endless loops
    seed: int | None = None              # random wave order and quanta (1..quantum) per round


class LoadedCode:
    """A code object placed in host memory, with its decoded-instruction cache."""

    def __init__(self, co: CodeObject | None, image: bytes | None = None):
        self.co = co
        if co is not None:
            secs = [s for s in co.elf.sections if s.addr and s.type not in (0, 8)]
            size = max(s.addr + s.size for s in secs)
            self.buf = np.zeros(size + 64, np.uint8)
            for s in secs:
                self.buf[s.addr:s.addr + s.size] = np.frombuffer(co.elf.section_bytes(s), np.uint8)
            text_addr, text_len = co.text_addr, len(co.text)
        else:
            self.buf = np.zeros(len(image) + 64, np.uint8)
            self.buf[:len(image)] = np.frombuffer(image, np.uint8)
            text_addr, text_len = 0, len(image)
        self.image = self.buf.tobytes()
        self.base = self.buf.ctypes.data
        self.text_lo = self.base + text_addr
        self.text_hi = self.text_lo + text_len
        self.cache: dict = {}
        self._kernels = sorted((self.base + k.entry, name) for name, k in co.kernels.items()) \
            if co is not None else []

    def location(self, pc: int) -> str:
        """``0x<address in the code object> <kernel+0xoffset>`` of a program counter."""
        text = f"0x{pc - self.base:x}"
        owner = None
        for start, name in self._kernels:
            if start <= pc:
                owner = (name, pc - start)
        if owner:
            text += f" <{owner[0]}+0x{owner[1]:x}>"
        return text

    @classmethod
    def from_bytes(cls, code: bytes) -> LoadedCode:
        """Raw machine code without an ELF wrapper (tests, snippets)."""
        return cls(None, bytes(code))

    def entry(self, kernel: KernelInfo) -> int:
        return self.base + kernel.entry

    def fetch(self, pc: int):
        inst = self.cache.get(pc)
        if inst is not None:
            return inst
        if not self.text_lo <= pc < self.text_hi:
            raise EmulatorError(f"program counter 0x{pc:x} (code object address "
                                f"0x{pc - self.base:x}) left the code object's text")
        try:
            inst = decode(self.image, pc - self.base, pc)
        except DecodeError as e:
            raise EmulatorError(str(e)) from None
        inst.loc = self.location(pc)
        inst.run = HANDLERS.get(inst.name, valu.unsupported)
        fast = valu.specialize(inst)
        if fast is not None:
            inst.run = fast
        self.cache[pc] = inst
        return inst

    def check_all(self) -> list:
        """Decode the whole text section; return the instructions without semantics."""
        out, pc = [], self.text_lo
        while pc < self.text_hi:
            inst = self.fetch(pc)
            if inst.run is valu.unsupported:
                out.append(inst)
            pc += inst.size
        return out


_STEPS = {n: np.arange(n, dtype=np.int64) for n in range(1, 17)}
_TRUE = {n: np.ones(n, bool) for n in range(65)}


class Workgroup:
    def __init__(self, machine, wg_id: tuple[int, int, int], flat_index: int, lds_size: int):
        self.machine = machine
        self.id = wg_id
        self.flat_index = flat_index
        self.lds_size = lds_size
        self.lds = np.full(lds_size, machine.config.lds_poison, np.uint8)
        self.waves: list[Wave] = []

    # LDS access with range checks (ISA §11: out-of-range reads give 0, writes are dropped).
    def _check(self, w, inst, addr: np.ndarray, nbytes: int):
        if len(addr) and addr.min() >= 0 and addr.max() + nbytes <= self.lds_size:
            return _TRUE[len(addr)]
        ok = (addr >= 0) & (addr + nbytes <= self.lds_size)
        if not ok.all() and self.machine.config.strict_lds:
            bad = int(np.nonzero(~ok)[0][0])
            w.fail(inst, f"LDS address 0x{int(addr[bad]):x}+{nbytes} (lane index {bad} of the "
                         f"active lanes) is outside the workgroup's {self.lds_size} bytes of LDS")
        return ok

    def lds_read(self, w, inst, addr: np.ndarray, nbytes: int) -> np.ndarray:
        addr = np.asarray(addr, np.int64)
        ok = self._check(w, inst, addr, nbytes)
        if self.machine.lds_observers:
            self._lds_observe(w, inst, addr, ok, nbytes, False)
        if ok.all():
            return self.lds[addr[:, None] + _STEPS[nbytes]]
        data = self.lds[np.where(ok, addr, 0)[:, None] + _STEPS[nbytes]]
        data[~ok] = 0
        return data

    def _lds_observe(self, w, inst, addr, ok, nbytes, write) -> None:
        for ob in self.machine.lds_observers:
            ob(w, inst, addr if ok.all() else addr[ok], nbytes, write)

    def lds_write(self, w, inst, addr: np.ndarray, data: np.ndarray) -> None:
        addr = np.asarray(addr, np.int64)
        nbytes = data.shape[1]
        ok = self._check(w, inst, addr, nbytes)
        if self.machine.lds_observers:
            self._lds_observe(w, inst, addr, ok, nbytes, True)
        if not ok.all():
            addr, data = addr[ok], data[ok]
        self.lds[addr[:, None] + _STEPS[nbytes]] = data


@dataclasses.dataclass
class DispatchStats:
    workgroups: int = 0
    waves: int = 0
    instructions: int = 0
    seconds: float = 0.0


class Machine:
    """One emulated gfx950 device: global memory plus the dispatcher."""

    def __init__(self, memory: GlobalMemory | None = None, config: Config | None = None):
        self.memory = memory if memory is not None else GlobalMemory()
        self.config = config or Config()
        self.observers: list = []
        self.lds_observers: list = []  # fn(wave, inst, byte addresses, nbytes, is_write)
        self.instructions = 0          # executed, all dispatches
        self.dispatches = 0
        self.last = DispatchStats()
        self._keep: list = []          # buffers that must outlive a dispatch

    def clock(self) -> int:
        return self.instructions

    # -- dispatch --------------------------------------------------------------------------
    def dispatch(self, code: LoadedCode, kernel: KernelInfo, grid, block, kernarg: bytes,
                 dynamic_lds: int = 0, workgroups=None) -> DispatchStats:
        """Run the whole grid (or only the listed workgroup ids) to completion."""
        grid = tuple(int(g) for g in grid)
        block = tuple(int(b) for b in block)
        if len(grid) != 3 or len(block) != 3 or min(grid) < 1 or min(block) < 1:
            raise EmulatorError(f"invalid launch configuration grid={grid} block={block}")
        threads = block[0] * block[1] * block[2]
        limit = int(kernel.metadata.get("max_flat_workgroup_size", 1024))
        if threads > min(limit, 1024):
            raise EmulatorError(f"{kernel.name}: block of {threads} work-items exceeds the "
                                f"kernel's max_flat_workgroup_size {limit}")
        if max(block) > 1024:
            raise EmulatorError(f"block dimension {max(block)} exceeds 1024")
        reqd = kernel.metadata.get("reqd_workgroup_size")
        if reqd and tuple(reqd) != block:
            raise EmulatorError(f"{kernel.name} requires workgroup size {tuple(reqd)}, got {block}")
        kd = kernel.descriptor
        if kd.float_round_mode_32 or kd.float_round_mode_16_64:
            raise EmulatorError(f"{kernel.name}: rounding modes other than nearest-even are "
                                "not modelled")
        lds_size = kd.group_segment_fixed_size + int(dynamic_lds)
        if lds_size > LDS_BYTES:
            raise EmulatorError(f"{kernel.name}: {lds_size} bytes of LDS exceed the "
                                f"{LDS_BYTES} bytes of a gfx950 workgroup")
        if kd.private_segment_fixed_size or kernel.metadata.get("uses_dynamic_stack"):
            raise EmulatorError(f"{kernel.name}: kernels with scratch memory are not modelled")
        size = kernel.kernarg_segment_size
        if len(kernarg) != size:
            raise EmulatorError(f"{kernel.name}: {len(kernarg)} bytes of kernel arguments, "
                                f"the code object expects {size}")

        mem = self.memory
        karg = _aligned(max(size, 16), 64)
        karg[:size] = np.frombuffer(bytes(kernarg), np.uint8)
        kaddr = karg.ctypes.data
        packet = self._dispatch_packet(code, kernel, grid, block, lds_size, kaddr)
        regions = [mem.add(kaddr, max(size, 1), f"kernarg segment of {kernel.name}", karg[:max(size, 1)],
                           writable=False, kind="kernarg"),
                   mem.add(packet.ctypes.data, 64, "dispatch packet", packet, writable=False,
                           kind="packet")]
        if mem.find(code.base) is None or mem.find(code.base).kind != "code":
            regions.append(mem.add(code.base, len(code.buf), f"code object ({kernel.name})",
                                   code.buf, writable=False, kind="code"))
        pointers = {}
        for a in kernel.args:
            if a.get("value_kind") == "global_buffer" and a.get("size") == 8 and \
                    a["offset"] + 8 <= size:
                ptr = struct.unpack_from("<Q", karg, a["offset"])[0]
                if ptr:
                    name = str(a.get("name", f"arg@{a['offset']}")).replace(".coerce", "")
                    pointers[ptr] = f"{pointers[ptr]}/{name}" if ptr in pointers else name
        mem.begin_dispatch(pointers)
        stats = DispatchStats()
        t0 = time.perf_counter()
        try:
            nx, ny, nz = grid
            ids = workgroups if workgroups is not None else \
                [(x, y, z) for z in range(nz) for y in range(ny) for x in range(nx)]
            for wg_id in ids:
                x, y, z = wg_id
                flat = x + nx * (y + ny * z)
                wg = self._make_workgroup(code, kernel, wg_id, flat, block, lds_size, kaddr,
                                          packet.ctypes.data)
                self._run_workgroup(wg)
                stats.workgroups += 1
                stats.waves += len(wg.waves)
                n = sum(w.executed for w in wg.waves)
                stats.instructions += n
                self.instructions += n
        finally:
            mem.end_dispatch()
            for r in regions:
                mem.remove(r.lo)
            self.dispatches += 1
        stats.seconds = time.perf_counter() - t0
        self.last = stats
        return stats

    def run_snippet(self, code: LoadedCode, waves: int = 1, lds_size: int = 0, setup=None,
                    mode: int = 0x2F0, entry: int | None = None) -> Workgroup:
        """Run raw code as one workgroup of ``waves`` full waves starting at ``entry``
        (default: the first byte of the text).  ``setup(wave)`` may initialise registers first (by default every register
        holds the poison pattern, EXEC is all ones, v0 the work-item id, MODE ``mode``:
        denormals kept, IEEE and DX10 clamp on).  Returns the finished workgroup."""
        wg = Workgroup(self, (0, 0, 0), 0, lds_size)
        cfg = self.config
        for wi in range(waves):
            w = Wave(self, wg, wi, code.text_lo if entry is None else entry, 256,
                     cfg.vgpr_poison, cfg.sgpr_poison)
            w.code = code
            w.v[0] = np.arange(64 * wi, 64 * wi + 64, dtype=np.uint32)
            w.exec = (1 << 64) - 1
            w.mode = mode
            if setup is not None:
                setup(w)
            wg.waves.append(w)
        self._run_workgroup(wg)
        self.instructions += sum(w.executed for w in wg.waves)
        return wg

    def _dispatch_packet(self, code, kernel, grid, block, lds_size, kaddr) -> np.ndarray:
        """An hsa_kernel_dispatch_packet_t for kernels that read the dispatch pointer."""
        p = _aligned(64, 64)
        setup = 3  # dimensions
        struct.pack_into("<HHHHHHIIIIIQQQQ", p, 0, 2, setup, block[0], block[1], block[2], 0,
                         grid[0] * block[0], grid[1] * block[1], grid[2] * block[2], 0,
                         lds_size, code.base + kernel.entry, kaddr, 0, 0)
        return p

    def _make_workgroup(self, code, kernel, wg_id, flat, block, lds_size, kaddr, packet_addr):
        wg = Workgroup(self, wg_id, flat, lds_size)
        kd = kernel.descriptor
        cfg = self.config
        bx, by, bz = block
        threads = bx * by * bz
        tid = np.arange(threads)
        tx, ty, tz = tid % bx, (tid // bx) % by, tid // (bx * by)
        packed = tx.copy()
        if kd.workitem_id_enable >= 1:
            packed |= ty << 10
        if kd.workitem_id_enable >= 2:
            packed |= tz << 20
        mode = (kd.float_round_mode_32 | kd.float_round_mode_16_64 << 2 |
                kd.float_denorm_mode_32 << 4 | kd.float_denorm_mode_16_64 << 6 |
                int(kd.dx10_clamp) << 8 | int(kd.ieee_mode) << 9 | int(kd.fp16_overflow) << 23)
        user = []
        for name, n in kd.enabled_user_sgprs():
            if name == "kernarg_segment_ptr":
                user += [kaddr & 0xFFFFFFFF, kaddr >> 32]
            elif name == "dispatch_ptr":
                user += [packet_addr & 0xFFFFFFFF, packet_addr >> 32]
            elif name == "dispatch_id":
                user += [self.dispatches & 0xFFFFFFFF, self.dispatches >> 32]
            else:
                user += [0] * n
        if kd.kernarg_preload_length:
            start = 4 * kd.kernarg_preload_offset
            words = struct.unpack_from(f"<{kd.kernarg_preload_length}I",
                                       bytes(kernel_args(kaddr, start + 4 * kd.kernarg_preload_length)),
                                       start)
            user += list(words)
        if len(user) > kd.user_sgpr_count:
            raise EmulatorError(f"{kernel.name}: descriptor enables {len(user)} user SGPRs but "
                                f"USER_SGPR_COUNT is {kd.user_sgpr_count}")
        system = []
        for enabled, value in zip(kd.workgroup_id_enable, wg_id):
            if enabled:
                system.append(value)
        if kd.workgroup_info_enable:
            system.append(0)
        if kd.enable_private_segment:
            system.append(0)
        nwaves = (threads + 63) // 64
        for wi in range(nwaves):
            w = Wave(self, wg, wi, code.entry(kernel), kd.accum_offset, cfg.vgpr_poison,
                     cfg.sgpr_poison)
            w.code = code
            for i, v in enumerate(user):
                w.s[i] = v & 0xFFFFFFFF
            for i, v in enumerate(system):
                w.s[kd.user_sgpr_count + i] = v & 0xFFFFFFFF
            lanes = packed[64 * wi:64 * wi + 64]
            w.v[0, :len(lanes)] = lanes.astype(np.uint32)
            n = len(lanes)
            w.exec = (1 << n) - 1
            w.mode = mode
            wg.waves.append(w)
        return wg

    def _run_workgroup(self, wg: Workgroup) -> None:
        waves = wg.waves
        quantum = self.config.quantum
        rng = random.Random(self.config.seed) if self.config.seed is not None else None
        while True:
            for w in (waves if rng is None else rng.sample(waves, len(waves))):
                if w.status is RUN:
                    self._run_wave(w, quantum if rng is None else rng.randint(1, quantum))
            live = [w for w in waves if w.status is not DONE]
            if not live:
                return
            if all(w.status is BARRIER for w in live):
                for w in live:
                    w.status = RUN

    def _run_wave(self, w: Wave, quantum: int) -> None:
        code = w.code
        cache = code.cache
        observers = self.observers
        inst = None
        try:
            for _ in range(quantum):
                pc = w.pc
                inst = cache.get(pc)
                if inst is None:
                    inst = code.fetch(pc)
                w.pc = pc + inst.size
                if observers:
                    w.pc = pc
                    for ob in observers:
                        ob(w, inst)
                    w.pc = pc + inst.size
                inst.run(w, inst)
                w.executed += 1
                if w.status is not RUN:
                    break
        except EmulatorError:
            raise
        except Exception as e:  # a numpy error inside an instruction: name the instruction
            where = inst.where() if inst is not None else f"pc 0x{w.pc:x}"
            raise EmulatorError(f"{where} ({w.name()}): internal error "
                                f"{type(e).__name__}: {e}") from e
        if w.executed > self.config.max_instructions:
            raise EmulatorError(f"{w.name()} executed more than {self.config.max_instructions} "
                                "instructions; endless loop?")


def _aligned(nbytes: int, align: int) -> np.ndarray:
    raw = np.zeros(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes]


def kernel_args(kaddr: int, nbytes: int) -> bytes:
    import ctypes
    return ctypes.string_at(kaddr, nbytes)
