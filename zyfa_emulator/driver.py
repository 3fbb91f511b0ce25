"""``ZYFA_BACKEND=emulator``: the runtime's driver interface over the CPU emulator.

Host memory is device memory (as in the ``fake`` backend): ``alloc`` returns the
address of a numpy buffer the driver keeps alive, copies are ``memmove``s.  Every
allocation is also a named region of the emulator's global memory, so a kernel access
outside all of them is reported with the instruction that made it.  Arrays the caller
passes in directly (NumPy inputs of ``flash_attn_func``) are reached through the
host-memory fallback of ``memory.GlobalMemory``; ``register_host`` gives one exact
bounds.

``launch`` runs the whole grid synchronously, from the packed argument bytes exactly
as the HIP backend would hand them to ``hipModuleLaunchKernel``.  Events record the
host's wall-clock time, so ``event_elapsed_ms`` is the emulation time;
``instructions_between(a, b)`` gives the number of instructions executed between two
recorded events.

Environment: ``ZYFA_EMULATOR_STRICT_HOST=1`` turns the host-memory fallback off (only
allocations and registered arrays are valid), ``ZYFA_EMULATOR_QUANTUM`` sets the
round-robin quantum, ``ZYFA_EMULATOR_SEED`` a seeded random wave order (and quanta) per
round, ``ZYFA_EMULATOR_HAZARDS=1`` attaches the hazard and ordering checker
(``hazards.py``; the first violation raises).

Stream capture is simulated (``zyfa_runtime.driver.base.SimulatedCapture``):
``begin_capture(stream)`` starts recording that stream's operations instead of running them,
``end_capture(stream)`` returns them as a :class:`CapturedGraph`, whose ``replay()`` runs
them as a graph would -- its stream-ordered allocations poisoned afresh (their contents are
undefined at each replay), its memsets and launches run again -- and meanwhile whatever a
capture forbids (a synchronous allocation, copy or memset, a wait) raises.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import threading
import time

import numpy as np

from zyfa_runtime.driver.base import ATTRIBUTES, Driver, Function, Module, SimulatedCapture
from zyfa_runtime.errors import CodeObjectError, ZyfaError

from .codeobject import CodeObject, CodeObjectFormatError
from .errors import EmulatorError
from .hazards import install_from_env
from .machine import LDS_BYTES, Config, LoadedCode, Machine
from .memory import GlobalMemory

#: What the emulator reports for device attributes (an MI355X).
_ATTRIBUTES = {"multiprocessor_count": 256, "max_shared_memory_per_block_optin": LDS_BYTES,
               "compute_capability_major": 9, "compute_capability_minor": 5,
               "max_threads_per_block": 1024, "warp_size": 64}

#: Fresh allocations are filled with this byte (0xFF: NaN in fp32, bf16 and e4m3), so
#: output a kernel forgets to write does not pass for zeros.
ALLOC_FILL = 0xFF


def _address(buf, writable: bool = False) -> tuple[int, int]:
    arr = np.frombuffer(buf, dtype=np.uint8)
    if writable and not arr.flags.writeable:
        raise ZyfaError("destination buffer is read-only")
    return arr.ctypes.data, arr.nbytes


class CapturedGraph:
    """The operations a captured stream recorded, in order: ``("alloc", ptr, nbytes)``,
    ``("memset", ptr, value, width, count)``, ``("launch", function, grid, block, shared, args,
    extents)``, ``("free", ptr)``.  ``replay()`` runs them; ``release()`` frees the graph's
    allocations (a freed one is kept until then: the next replay allocates it again)."""

    def __init__(self, driver: "EmulatorDriver", ops: list):
        self.driver, self.ops = driver, ops

    def replay(self) -> None:
        d = self.driver
        for op in self.ops:
            if op[0] == "alloc":
                ctypes.memset(op[1], ALLOC_FILL, op[2])
            elif op[0] == "memset":
                d._memset(*op[1:])
            elif op[0] == "launch":
                with d.tensor_extents(op[6]):
                    d._dispatch(*op[1:6])

    def release(self) -> None:
        for op in self.ops:
            if op[0] == "alloc":
                self.driver._free(op[1])
        self.ops = []


class EmulatorDriver(SimulatedCapture, Driver):
    name = "emulator"
    host_memory_is_device = True

    def __init__(self, config: Config | None = None, host_fallback: bool | None = None):
        if host_fallback is None:
            host_fallback = os.environ.get("ZYFA_EMULATOR_STRICT_HOST", "") in ("", "0")
        config = config or Config()
        if os.environ.get("ZYFA_EMULATOR_QUANTUM"):
            config.quantum = max(1, int(os.environ["ZYFA_EMULATOR_QUANTUM"]))
        if os.environ.get("ZYFA_EMULATOR_SEED"):
            config.seed = int(os.environ["ZYFA_EMULATOR_SEED"])
        self.machine = Machine(GlobalMemory(host_fallback=host_fallback), config)
        self.hazards = install_from_env(self.machine)      # ZYFA_EMULATOR_HAZARDS=1
        self._lock = threading.RLock()
        self._buffers: dict[int, np.ndarray] = {}
        self._host: dict[int, object] = {}
        self._events: dict[int, tuple[float, int] | None] = {}
        self._ids = itertools.count(1)
        self._alloc_ids = itertools.count(1)
        self.max_dynamic_shared: dict[str, int] = {}
        self.launches = 0
        self._init_capture()
        self._captures: dict[int, list] = {}           # capturing stream -> its operations
        self._extents = threading.local()              # the launch's tensor_extents, for a capture

    # -- capture ---------------------------------------------------------------------------
    def begin_capture(self, stream: int) -> None:
        if not stream or stream in self.capturing:
            raise ZyfaError(f"stream {stream} cannot begin a capture (the default stream, or capturing)")
        self.capturing.add(int(stream))
        self._captures[int(stream)] = []

    def end_capture(self, stream: int) -> CapturedGraph:
        self.capturing.discard(int(stream))
        return CapturedGraph(self, self._captures.pop(int(stream)))

    def _record(self, stream: int, op: tuple) -> bool:
        ops = self._captures.get(int(stream))
        if ops is None:
            return False
        ops.append(op)
        return True

    @staticmethod
    def _valid(device: int) -> None:
        if device != 0:
            raise ZyfaError(f"invalid device ordinal {device}; the emulator has one device")

    # -- devices ---------------------------------------------------------------------------
    def device_count(self) -> int:
        return 1

    def arch(self, device: int) -> str:
        self._valid(device)
        return "gfx950"

    def device_name(self, device: int) -> str:
        self._valid(device)
        return "zyfa gfx950 emulator"

    def versions(self) -> dict:
        from . import __version__
        return {"driver_version": __version__, "driver": f"zyfa emulator {__version__} "
                f"(numpy {np.__version__})"}

    def attribute(self, device: int, name: str) -> int:
        self._valid(device)
        if name not in ATTRIBUTES:
            raise ZyfaError(f"unknown device attribute {name!r}; known: {sorted(ATTRIBUTES)}")
        return _ATTRIBUTES[name]

    def make_current(self, device: int) -> None:
        self._valid(device)

    def pointer_info(self, ptr: int) -> tuple[str, int] | None:
        return ("cpu", 0) if ptr else None

    # -- code ------------------------------------------------------------------------------
    def load_module(self, device: int, image: bytes) -> Module:
        self._valid(device)
        self._unsafe("hipModuleLoadData")
        try:
            co = CodeObject(bytes(image))
        except CodeObjectFormatError as e:
            raise CodeObjectError(f"the emulator cannot load this code object: {e}") from None
        return Module(handle=LoadedCode(co), device=device)

    def get_function(self, module: Module, symbol: str) -> Function:
        code: LoadedCode = module.handle
        try:
            kernel = code.co.kernel(symbol)
        except KeyError as e:
            raise ZyfaError(str(e.args[0])) from None
        return Function(handle=kernel, module=module, symbol=symbol)

    def set_max_dynamic_shared(self, function: Function, nbytes: int) -> None:
        static = function.handle.group_segment_fixed_size
        if static + int(nbytes) > LDS_BYTES:
            raise ZyfaError(f"{function.symbol}: {static} + {nbytes} bytes of LDS exceed "
                            f"{LDS_BYTES}")
        self.max_dynamic_shared[function.symbol] = int(nbytes)

    def param_info(self, function: Function) -> list[tuple[int, int]] | None:
        return [(a["offset"], a["size"]) for a in function.handle.args
                if not str(a.get("value_kind", "")).startswith("hidden_")]

    def launch(self, function: Function, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, stream: int, args: bytes, dependent: bool = False) -> None:
        # Launches run one after another, whole: a dependent one too.
        limit = self.max_dynamic_shared.get(function.symbol, 0)
        if shared_bytes > max(limit, 0) and shared_bytes + function.handle.group_segment_fixed_size \
                > LDS_BYTES:
            raise ZyfaError(f"{function.symbol}: {shared_bytes} bytes of dynamic LDS requested")
        if self._record(stream, ("launch", function, tuple(grid), tuple(block), shared_bytes, bytes(args),
                                 dict(getattr(self._extents, "now", {})))):
            return
        self._dispatch(function, grid, block, shared_bytes, args)

    def _dispatch(self, function: Function, grid, block, shared_bytes: int, args: bytes) -> None:
        with self._lock:
            self.machine.dispatch(function.module.handle, function.handle, grid, block,
                                  bytes(args), dynamic_lds=shared_bytes)
            self.launches += 1

    # -- memory ----------------------------------------------------------------------------
    def alloc(self, device: int, nbytes: int) -> int:
        self._unsafe("hipMalloc")
        return self._alloc(device, nbytes)

    def alloc_async(self, device: int, nbytes: int, stream: int) -> int:
        ptr = self._alloc(device, nbytes)
        self._record(stream, ("alloc", ptr, max(int(nbytes), 1)))
        return ptr

    def free_async(self, ptr: int, stream: int) -> None:
        if not self._record(stream, ("free", ptr)):
            self._free(ptr)

    def memset_d8_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        self._check_range(ptr, nbytes, "memset")
        if not self._record(stream, ("memset", ptr, value, 1, nbytes)):
            self._memset(ptr, value, 1, nbytes)

    def memset_d32_async(self, ptr: int, value: int, count: int, stream: int) -> None:
        self._check_range(ptr, 4 * count, "memset")
        if not self._record(stream, ("memset", ptr, value, 4, count)):
            self._memset(ptr, value, 4, count)

    @staticmethod
    def _memset(ptr: int, value: int, width: int, count: int) -> None:
        if width == 1:
            ctypes.memset(ptr, value & 0xFF, count)
        else:
            np.ctypeslib.as_array((ctypes.c_uint32 * count).from_address(ptr))[:] = value & 0xFFFFFFFF

    def _alloc(self, device: int, nbytes: int) -> int:
        self._valid(device)
        n = max(int(nbytes), 1)
        buf = np.full(n + 256, ALLOC_FILL, dtype=np.uint8)
        off = (-buf.ctypes.data) % 256          # device allocations are 256-byte aligned
        view = buf[off:off + n]
        ptr = view.ctypes.data
        with self._lock:
            self._buffers[ptr] = buf
            self.machine.memory.add(ptr, n, f"allocation #{next(self._alloc_ids)} ({n} bytes)",
                                    view)
        return ptr

    def free(self, ptr: int) -> None:
        self._unsafe("hipFree")
        self._free(ptr)

    def _free(self, ptr: int) -> None:
        with self._lock:
            if self._buffers.pop(ptr, None) is None:
                raise ZyfaError(f"free of 0x{ptr:x}, which the emulator did not allocate")
            self.machine.memory.remove(ptr)

    @contextlib.contextmanager
    def tensor_extents(self, extents: dict[str, tuple[int, int]]):
        """Exact bounds for the caller's host tensors during one launch: each extent that is
        not already inside a known region (a driver allocation, a registered array) becomes
        a named host region -- read-only unless it is the output -- and is removed again
        afterwards.  Overlapping extents (views of one buffer) are merged."""
        before = getattr(self._extents, "now", {})
        self._extents.now = extents            # what a launch recorded by a capture replays with
        spans = sorted((lo, hi, name) for name, (lo, hi) in extents.items() if hi > lo)
        merged: list[list] = []
        for lo, hi, name in spans:
            if merged and lo < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
                merged[-1][2].append(name)
            else:
                merged.append([lo, hi, [name]])
        added = []
        with self._lock:
            for lo, hi, names in merged:
                view = np.ctypeslib.as_array((ctypes.c_uint8 * (hi - lo)).from_address(lo))
                try:
                    self.machine.memory.add(lo, hi - lo, f"host tensor {'+'.join(names)} "
                                            f"({hi - lo} bytes)", view,
                                            writable="out" in names or "lse" in names, kind="host")
                except EmulatorError:
                    continue            # inside (or across) a known region: that one bounds it
                added.append(lo)
        try:
            yield
        finally:
            self._extents.now = before
            with self._lock:
                for lo in added:
                    self.machine.memory.remove(lo)

    def register_host(self, array: np.ndarray, name: str | None = None) -> int:
        """Make a host array a named region with exact bounds; returns its address."""
        arr = np.asarray(array)
        if not arr.flags.c_contiguous and not arr.flags.f_contiguous:
            raise ZyfaError("register_host needs a contiguous array")
        ptr = arr.ctypes.data
        with self._lock:
            self.machine.memory.add(ptr, max(arr.nbytes, 1), name or f"host array ({arr.nbytes} "
                                    "bytes)", arr.reshape(-1).view(np.uint8),
                                    writable=arr.flags.writeable, kind="host")
            self._host[ptr] = arr
        return ptr

    def unregister_host(self, array_or_ptr) -> None:
        ptr = array_or_ptr if isinstance(array_or_ptr, int) else np.asarray(array_or_ptr).ctypes.data
        with self._lock:
            if self._host.pop(ptr, None) is None:
                raise ZyfaError(f"0x{ptr:x} is not a registered host array")
            self.machine.memory.remove(ptr)

    def _check_range(self, ptr: int, n: int, what: str) -> None:
        if n == 0:
            return
        region = self.machine.memory.find(ptr)
        if region is None or region.kind not in ("alloc", "host") or ptr + n > region.hi:
            raise ZyfaError(f"{what} of {n} bytes at 0x{ptr:x} is not inside an allocation of "
                            "the emulator")

    def copy_htod(self, ptr: int, host) -> None:
        self._unsafe("hipMemcpyHtoD")
        src, n = _address(host)
        self._check_range(ptr, n, "copy to device")
        ctypes.memmove(ptr, src, n)

    def copy_dtoh(self, host, ptr: int) -> None:
        self._unsafe("hipMemcpyDtoH")
        dst, n = _address(host, writable=True)
        self._check_range(ptr, n, "copy from device")
        ctypes.memmove(dst, ptr, n)

    def memset_d8(self, ptr: int, value: int, nbytes: int) -> None:
        self._unsafe("hipMemset")
        self._check_range(ptr, nbytes, "memset")
        ctypes.memset(ptr, value & 0xFF, nbytes)

    def synchronize(self, device: int) -> None:
        self._valid(device)       # launches are synchronous
        self._unsafe("hipDeviceSynchronize")

    # -- events ----------------------------------------------------------------------------
    def event_create(self, device: int = 0) -> int:
        self._valid(device)
        with self._lock:
            handle = next(self._ids)
            self._events[handle] = None
        return handle

    def event_record(self, event: int, stream: int = 0) -> None:
        if event not in self._events:
            raise ZyfaError(f"unknown event {event}")
        self._events[event] = (time.perf_counter(), self.machine.instructions)

    def event_synchronize(self, event: int) -> None:
        self._unsafe("hipEventSynchronize")
        if event not in self._events:
            raise ZyfaError(f"unknown event {event}")

    def _recorded(self, event: int) -> tuple[float, int]:
        rec = self._events.get(event)
        if rec is None:
            raise ZyfaError(f"event {event} is unknown or was never recorded")
        return rec

    def event_elapsed_ms(self, start: int, end: int) -> float:
        return (self._recorded(end)[0] - self._recorded(start)[0]) * 1e3

    def instructions_between(self, start: int, end: int) -> int:
        return self._recorded(end)[1] - self._recorded(start)[1]

    def event_destroy(self, event: int) -> None:
        self._events.pop(event, None)
