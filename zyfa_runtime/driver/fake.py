"""A GPU-less backend that records what it is asked to do, for tests.

Host memory is device memory: allocations are numpy buffers, copies and memsets
are real, and a launch does not run anything -- it appends a :class:`Launch` to
``launches``.  A module's handle is the image bytes it was loaded from.

It speaks for CUDA (an ``sm_*`` arch) or HIP (a ``gfx*`` arch) and reports the versions
of the toolkit zyfa pins, so the version checks pass; ``versions=`` (or
``ZYFA_FAKE_VERSIONS="driver_version=12080"``, comma-separated ``key=value``) replaces
them to simulate another driver: ``driver_version`` (CUDA: 1000 * major + 10 * minor),
``runtime_version`` (HIP: major * 10**7 + minor * 10**5 + patch), ``rocm`` (the text of
ROCm's ``.info/version``; empty: no such file).

``discrete=True`` (``ZYFA_FAKE_DISCRETE=1``) makes its allocations device memory as a GPU's
are (``host_memory_is_device`` False: host tensors are refused where a kernel would read them),
with page-locked host buffers and queued copies (run at once, and recorded in ``htod_async``);
``dtoh`` counts the copies back to the host, each of which would synchronise a GPU.

Stream capture is simulated (``base.SimulatedCapture``): streams added to ``capturing`` are
being captured, and what a capture forbids raises.  ``ops`` records every stream operation in
order -- ``("launch", symbol, stream)``, ``("alloc_async", ptr, nbytes, stream)``,
``("memset_async", ptr, value, nbytes, stream)``, ``("free_async", ptr, stream)`` -- the nodes
a captured call would leave in its graph.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import struct
import threading
import time

import numpy as np

from ..errors import ZyfaError
from .base import ATTRIBUTES, CUDA_MAX_GRID, Driver, Function, Module, SimulatedCapture

#: Attribute values the fake reports per arch (an H200 and an MI355X).
_ARCH_ATTRIBUTES = {
    "sm_90a": {"multiprocessor_count": 132, "max_shared_memory_per_block_optin": 232448,
               "compute_capability_major": 9, "compute_capability_minor": 0,
               "max_threads_per_block": 1024, "warp_size": 32},
    "gfx950": {"multiprocessor_count": 256, "max_shared_memory_per_block_optin": 163840,
               "compute_capability_major": 9, "compute_capability_minor": 5,
               "max_threads_per_block": 1024, "warp_size": 64},
}


#: What the fake reports by default: the drivers zyfa's toolkit pins ask for.
DEFAULT_VERSIONS = {
    "cuda": {"driver_version": 13000},
    "hip": {"driver_version": 70253021, "runtime_version": 70253021, "rocm": "7.2.3"},
}


def parse_versions(text: str) -> dict:
    """``"driver_version=12080,rocm=7.1.0"`` -> ``{"driver_version": 12080, "rocm": "7.1.0"}``."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ZyfaError(f"ZYFA_FAKE_VERSIONS item {item!r} is not key=value")
        value = value.strip()
        out[key.strip()] = int(value) if value.isdigit() else value
    return out


@dataclasses.dataclass(frozen=True)
class Launch:
    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    stream: int
    args: bytes
    device: int
    dependent: bool = False   # queued as a programmatic dependent of the launch before it


def _address(buf, writable: bool = False) -> tuple[int, int]:
    """Address and size in bytes of a contiguous bytes-like object."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    if writable and not arr.flags.writeable:
        raise ZyfaError("destination buffer is read-only")
    return arr.ctypes.data, arr.nbytes


def pack_tensor_map(ptr: int, dims, strides, box, swizzle_bytes: int) -> bytes:
    """The fake driver's tensor map: rank, pointer, dims, strides, box and swizzle in 128 bytes."""
    rank = len(dims)
    out = struct.pack(f"<BQ{rank}Q{rank - 1}Q{rank}IH", rank, ptr, *dims, *strides, *box, swizzle_bytes)
    return out.ljust(128, b"\0")


def unpack_tensor_map(blob: bytes) -> dict:
    rank = blob[0]
    vals = struct.unpack_from(f"<BQ{rank}Q{rank - 1}Q{rank}IH", blob)
    dims = vals[2:2 + rank]
    strides = vals[2 + rank:1 + 2 * rank]
    box = vals[1 + 2 * rank:1 + 3 * rank]
    return {"ptr": vals[1], "dims": dims, "strides": strides, "box": box, "swizzle": vals[-1]}


class FakeDriver(SimulatedCapture, Driver):
    name = "fake"
    host_memory_is_device = True

    def __init__(self, arch: str = "sm_90a", devices: int = 1, versions: dict | None = None,
                 discrete: bool = False) -> None:
        self.host_memory_is_device = not discrete
        self._arch = arch
        self._devices = devices
        self.vendor = "hip" if arch.startswith("gfx") else "cuda"
        self.max_grid = CUDA_MAX_GRID if self.vendor == "cuda" else None
        self._versions = {**DEFAULT_VERSIONS[self.vendor], **(versions or {})}
        self._lock = threading.Lock()
        self._buffers: dict[int, np.ndarray] = {}
        self._host_buffers: dict[int, np.ndarray] = {}
        self.htod_async: list[tuple[int, int, int, int]] = []   # (device ptr, host ptr, bytes, stream)
        self._init_capture()                 # capturing: streams a test declares captured into a graph
        self.ops: list[tuple] = []           # stream operations, in order
        self.dtoh = 0
        self._events: dict[int, float | None] = {}
        self._ids = itertools.count(1)
        self.modules: list[Module] = []
        self.launches: list[Launch] = []
        self.current: int | None = None
        self.max_dynamic_shared: dict[str, int] = {}

    def _valid(self, device: int) -> None:
        if not 0 <= device < self._devices:
            raise ZyfaError(f"invalid device ordinal {device}; the fake has {self._devices}")

    # -- devices -----------------------------------------------------------------------
    def device_count(self) -> int:
        return self._devices

    def arch(self, device: int) -> str:
        self._valid(device)
        return self._arch

    def device_name(self, device: int) -> str:
        self._valid(device)
        return f"zyfa fake device ({self._arch})"

    def versions(self) -> dict:
        """The same keys as the real driver's: each ``*_version`` number, then its text."""
        out = {}
        for key, v in self._versions.items():
            if v == "":
                continue
            out[key] = v
            text = key.removesuffix("_version")
            if text != key and isinstance(v, int) and text not in self._versions:
                out[text] = (f"{v // 1000}.{v % 1000 // 10}" if self.vendor == "cuda"
                             else f"{v // 10**7}.{v // 10**5 % 100}.{v % 10**5}")
        return out

    def attribute(self, device: int, name: str) -> int:
        self._valid(device)
        if name not in ATTRIBUTES:
            raise ZyfaError(f"unknown device attribute {name!r}; known: {sorted(ATTRIBUTES)}")
        return _ARCH_ATTRIBUTES.get(self._arch, _ARCH_ATTRIBUTES["sm_90a"])[name]

    def make_current(self, device: int) -> None:
        self._valid(device)
        self.current = device

    def pointer_info(self, ptr: int) -> tuple[str, int] | None:
        if not ptr:
            return None
        if not self.host_memory_is_device and self._allocation_of(ptr) is not None:
            return ({"cuda": "cuda", "hip": "rocm"}[self.vendor], 0)
        return ("cpu", 0)

    def _allocation_of(self, ptr: int) -> int | None:
        with self._lock:
            for base, buf in self._buffers.items():
                if base <= ptr < base + buf.nbytes:
                    return base
        return None

    # -- code --------------------------------------------------------------------------
    def load_module(self, device: int, image: bytes) -> Module:
        self._valid(device)
        self._unsafe("cuModuleLoadData")
        module = Module(handle=bytes(image), device=device)
        with self._lock:
            self.modules.append(module)
        return module

    def get_function(self, module: Module, symbol: str) -> Function:
        return Function(handle=symbol, module=module, symbol=symbol)

    def set_max_dynamic_shared(self, function: Function, nbytes: int) -> None:
        self.max_dynamic_shared[function.symbol] = int(nbytes)

    def launch(self, function: Function, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, stream: int, args: bytes, dependent: bool = False) -> None:
        record = Launch(symbol=function.symbol, grid=tuple(int(g) for g in grid),
                        block=tuple(int(b) for b in block), shared=int(shared_bytes),
                        stream=int(stream), args=bytes(args), device=function.module.device,
                        dependent=bool(dependent))
        with self._lock:
            self.launches.append(record)
            self.ops.append(("launch", function.symbol, int(stream)))

    def tensor_map_u8(self, ptr: int, dims, strides, box, swizzle_bytes: int) -> bytes:
        """Not CUDA's encoding: the arguments themselves (:func:`unpack_tensor_map`), so that
        tests can read back what a launch was given."""
        return pack_tensor_map(ptr, dims, strides, box, swizzle_bytes)

    # -- memory ------------------------------------------------------------------------
    def alloc(self, device: int, nbytes: int) -> int:
        self._valid(device)
        self._unsafe("cuMemAlloc_v2")
        buf = np.zeros(max(int(nbytes), 1), dtype=np.uint8)
        ptr = buf.ctypes.data
        with self._lock:
            self._buffers[ptr] = buf
        return ptr

    def alloc_async(self, device: int, nbytes: int, stream: int) -> int:
        self._valid(device)
        buf = np.full(max(int(nbytes), 1), 0xFF, dtype=np.uint8)   # undefined contents: not zeros
        ptr = buf.ctypes.data
        with self._lock:
            self._buffers[ptr] = buf
            self.ops.append(("alloc_async", ptr, int(nbytes), int(stream)))
        return ptr

    def free_async(self, ptr: int, stream: int) -> None:
        with self._lock:
            if self._buffers.pop(ptr, None) is None:
                raise ZyfaError(f"free_async of 0x{ptr:x}, which the fake driver did not allocate")
            self.ops.append(("free_async", ptr, int(stream)))

    def memset_d8_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        with self._lock:
            self.ops.append(("memset_async", int(ptr), value & 0xFF, int(nbytes), int(stream)))
        ctypes.memset(ptr, value & 0xFF, nbytes)

    def memset_d32_async(self, ptr: int, value: int, count: int, stream: int) -> None:
        with self._lock:
            self.ops.append(("memset_async", int(ptr), value & 0xFFFFFFFF, 4 * int(count), int(stream)))
        np.ctypeslib.as_array((ctypes.c_uint32 * int(count)).from_address(ptr))[:] = value & 0xFFFFFFFF

    def free(self, ptr: int) -> None:
        self._unsafe("cuMemFree_v2")
        with self._lock:
            if self._buffers.pop(ptr, None) is None:
                raise ZyfaError(f"free of 0x{ptr:x}, which the fake driver did not allocate")

    def buffer(self, ptr: int) -> np.ndarray:
        """The numpy buffer behind an allocation (tests inspect outputs through it)."""
        return self._buffers[ptr]

    def copy_htod(self, ptr: int, host) -> None:
        self._unsafe("cuMemcpyHtoD_v2")
        src, n = _address(host)
        ctypes.memmove(ptr, src, n)

    def copy_dtoh(self, host, ptr: int) -> None:
        self._unsafe("cuMemcpyDtoH_v2")
        dst, n = _address(host, writable=True)
        with self._lock:
            self.dtoh += 1
        ctypes.memmove(dst, ptr, n)

    def host_alloc(self, device: int, nbytes: int) -> int:
        if self.host_memory_is_device:
            return super().host_alloc(device, nbytes)
        self._valid(device)
        self._unsafe("cuMemHostAlloc")
        buf = np.zeros(max(int(nbytes), 1), dtype=np.uint8)
        with self._lock:
            self._host_buffers[buf.ctypes.data] = buf
        return buf.ctypes.data

    def host_free(self, ptr: int) -> None:
        self._unsafe("cuMemFreeHost")
        with self._lock:
            if self._host_buffers.pop(ptr, None) is None:
                raise ZyfaError(f"host_free of 0x{ptr:x}, which the fake driver did not allocate")

    def copy_htod_async(self, ptr: int, host_ptr: int, nbytes: int, stream: int) -> None:
        if self.host_memory_is_device:
            return super().copy_htod_async(ptr, host_ptr, nbytes, stream)
        with self._lock:
            if not any(b <= host_ptr and host_ptr + nbytes <= b + h.nbytes for b, h in self._host_buffers.items()):
                raise ZyfaError("copy_htod_async from memory that host_alloc did not give")
            self.htod_async.append((int(ptr), int(host_ptr), int(nbytes), int(stream)))
            self.ops.append(("copy_htod_async", int(ptr), int(nbytes), int(stream)))
        ctypes.memmove(ptr, host_ptr, nbytes)

    def memset_d8(self, ptr: int, value: int, nbytes: int) -> None:
        self._unsafe("cuMemsetD8_v2")
        ctypes.memset(ptr, value & 0xFF, nbytes)

    def synchronize(self, device: int) -> None:
        self._valid(device)
        self._unsafe("cuCtxSynchronize")

    # -- events ------------------------------------------------------------------------
    def event_create(self, device: int = 0) -> int:
        with self._lock:
            handle = next(self._ids)
            self._events[handle] = None
        return handle

    def event_record(self, event: int, stream: int = 0) -> None:
        self._events[event] = time.perf_counter()

    def event_synchronize(self, event: int) -> None:
        self._unsafe("cuEventSynchronize")
        if event not in self._events:
            raise ZyfaError(f"unknown event {event}")

    def event_elapsed_ms(self, start: int, end: int) -> float:
        t0, t1 = self._events[start], self._events[end]
        if t0 is None or t1 is None:
            raise ZyfaError("event_elapsed_ms on an event that was never recorded")
        return (t1 - t0) * 1e3

    def event_destroy(self, event: int) -> None:
        self._events.pop(event, None)
