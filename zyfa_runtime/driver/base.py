"""The driver interface every backend implements, and helpers shared by the cffi backends.

A driver is a thin, stateless-looking wrapper over one vendor API (CUDA driver API,
HIP) or a stand-in (``fake``, the emulator).  Device pointers, streams and events
cross this interface as plain integers; modules and functions as the small
records below.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import threading
from typing import Any

from ..errors import ZyfaError

#: CUDA's largest launch grid (x, y, z), every compute capability since 3.0.
CUDA_MAX_GRID = (2**31 - 1, 65535, 65535)

#: Device attributes ``Driver.attribute`` understands.
ATTRIBUTES = (
    "multiprocessor_count",
    "max_shared_memory_per_block_optin",
    "compute_capability_major",
    "compute_capability_minor",
    "max_threads_per_block",
    "warp_size",
)


@dataclasses.dataclass(frozen=True, eq=False)
class Module:
    """A code object loaded onto one device."""
    handle: Any
    device: int


@dataclasses.dataclass(frozen=True, eq=False)
class Function:
    """One kernel entry point of a loaded module."""
    handle: Any
    module: Module
    symbol: str


class Driver(abc.ABC):
    name: str = ""
    #: Whose toolkit pins apply to this driver (``versions.py``): "cuda", "hip", or None
    #: where no toolkit is involved (the emulator).
    vendor: str | None = None
    #: True where kernels read host memory directly (fake, emulator): inputs stay on the host.
    host_memory_is_device: bool = False
    #: The largest launch grid (x, y, z) the driver takes, where it has one: a larger grid is
    #: refused before anything is launched.
    max_grid: tuple[int, int, int] | None = None

    # -- devices ---------------------------------------------------------------------
    @abc.abstractmethod
    def device_count(self) -> int: ...

    @abc.abstractmethod
    def arch(self, device: int) -> str:
        """Target name of the device: ``sm_90a``, ``gfx950``."""

    @abc.abstractmethod
    def device_name(self, device: int) -> str: ...

    @abc.abstractmethod
    def versions(self) -> dict:
        """Driver (and runtime, where there is one) versions, raw and as text."""

    @abc.abstractmethod
    def attribute(self, device: int, name: str) -> int:
        """One of :data:`ATTRIBUTES`."""

    @abc.abstractmethod
    def make_current(self, device: int) -> None:
        """Make ``device`` current on the calling thread (CUDA: its primary context)."""

    @abc.abstractmethod
    def pointer_info(self, ptr: int) -> tuple[str, int] | None:
        """``("cuda"|"rocm", ordinal)`` for device memory, ``("cpu", 0)`` for host memory."""

    # -- code ------------------------------------------------------------------------
    @abc.abstractmethod
    def load_module(self, device: int, image: bytes) -> Module: ...

    @abc.abstractmethod
    def get_function(self, module: Module, symbol: str) -> Function: ...

    @abc.abstractmethod
    def set_max_dynamic_shared(self, function: Function, nbytes: int) -> None: ...

    @abc.abstractmethod
    def launch(self, function: Function, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, stream: int, args: bytes, dependent: bool = False) -> None:
        """Launch with ``args`` as the one packed kernel-argument buffer.  ``dependent``: as a
        programmatic dependent of the launch before it on ``stream`` (CUDA's programmatic stream
        serialisation: its CTAs may start before that launch has ended; the kernel waits for it
        where it must).  A driver without the feature launches it in order, which is always
        correct."""

    def param_info(self, function: Function) -> list[tuple[int, int]] | None:
        """(offset, size) of each kernel parameter as the driver sees it, or None if unknown."""
        return None

    def tensor_extents(self, extents: dict[str, tuple[int, int]]):
        """A context manager around a launch: the byte extents [lo, hi) of the caller's
        tensors by name.  GPU drivers know their allocations and ignore it; a backend whose
        device memory is host memory (the emulator) bounds-checks accesses with it."""
        return contextlib.nullcontext()

    def tensor_map_u8(self, ptr: int, dims, strides, box, swizzle_bytes: int) -> bytes:
        """A tiled TMA tensor map (CUtensorMap, 128 bytes) of a tensor of bytes at ``ptr``:
        ``dims`` innermost first, ``strides`` in bytes of dims 1.., boxes of ``box`` elements
        in the ``swizzle_bytes`` swizzle (0, 32, 64 or 128), zeros out of bounds."""
        raise ZyfaError(f"{self.name}: tensor maps are a CUDA feature (sm_90a FP8 kernels)")

    # -- memory ----------------------------------------------------------------------
    @abc.abstractmethod
    def alloc(self, device: int, nbytes: int) -> int: ...

    @abc.abstractmethod
    def free(self, ptr: int) -> None: ...

    @abc.abstractmethod
    def copy_htod(self, ptr: int, host) -> None:
        """Copy the whole of the bytes-like ``host`` to device address ``ptr``, landed on return:
        work queued afterwards on any stream (a non-blocking one, a graph's replay) reads it."""

    @abc.abstractmethod
    def copy_dtoh(self, host, ptr: int) -> None:
        """Fill the whole of the writable buffer ``host`` from device address ``ptr``."""

    @abc.abstractmethod
    def memset_d8(self, ptr: int, value: int, nbytes: int) -> None: ...

    # Page-locked host memory and copies queued on a stream: how host values a launch reads
    # (a packed batch's cu_seqlens) reach a device without synchronising (``staging.py``).
    # Drivers whose kernels read host memory (host_memory_is_device) need none of it.
    def host_alloc(self, device: int, nbytes: int) -> int:
        """``nbytes`` of page-locked host memory that copies to ``device`` may read
        asynchronously; its address."""
        raise ZyfaError(f"{self.name}: no page-locked host memory")

    def host_free(self, ptr: int) -> None:
        raise ZyfaError(f"{self.name}: no page-locked host memory")

    def stream_capturing(self, stream: int) -> bool:
        """Whether ``stream`` is being captured into a graph (its work recorded, not run)."""
        return False

    # Stream-ordered memory: what a call captured into a graph uses for its scratch, as nothing
    # else may allocate, copy synchronously or wait inside a capture.  Captured, each of these
    # becomes a node of the graph (an allocation node owned by the graph, a memset node, a
    # free node): the graph allocates and frees its own scratch at every replay.
    def alloc_async(self, device: int, nbytes: int, stream: int) -> int:
        """``nbytes`` of device memory allocated in stream order on ``stream``: usable by work
        queued on it after this call (CUDA's cuMemAllocAsync, HIP's hipMallocAsync); its
        contents are undefined."""
        raise ZyfaError(f"{self.name}: no stream-ordered allocation")

    def free_async(self, ptr: int, stream: int) -> None:
        """Free ``ptr`` (from :meth:`alloc_async`) once the work queued on ``stream`` before
        this call has run."""
        raise ZyfaError(f"{self.name}: no stream-ordered allocation")

    def memset_d8_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """Queue on ``stream`` the setting of ``nbytes`` bytes at ``ptr`` to ``value``."""
        raise ZyfaError(f"{self.name}: no queued memset")

    def memset_d32_async(self, ptr: int, value: int, count: int, stream: int) -> None:
        """Queue on ``stream`` the setting of ``count`` 32-bit words at ``ptr`` to ``value``."""
        raise ZyfaError(f"{self.name}: no queued memset")

    def relaxed_capture(self):
        """A context manager: the calling thread's capture mode relaxed meanwhile, so that work
        that is no stream operation but which a capture in the global mode would refuse
        (loading a module) may run while a stream is being captured (CUDA's and HIP's
        ``ThreadExchangeStreamCaptureMode``).  A no-op for drivers without capture."""
        return contextlib.nullcontext()

    def copy_htod_async(self, ptr: int, host_ptr: int, nbytes: int, stream: int) -> None:
        """Queue on ``stream`` a copy of ``nbytes`` from page-locked ``host_ptr`` to device
        address ``ptr``; the host memory must stay unchanged until the copy has run."""
        raise ZyfaError(f"{self.name}: no queued host-to-device copies")

    @abc.abstractmethod
    def synchronize(self, device: int) -> None: ...

    # -- events ----------------------------------------------------------------------
    @abc.abstractmethod
    def event_create(self, device: int = 0) -> int: ...

    @abc.abstractmethod
    def event_record(self, event: int, stream: int = 0) -> None: ...

    @abc.abstractmethod
    def event_synchronize(self, event: int) -> None: ...

    @abc.abstractmethod
    def event_elapsed_ms(self, start: int, end: int) -> float: ...

    @abc.abstractmethod
    def event_destroy(self, event: int) -> None: ...

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


# --------------------------------------------------------------------------------------
# Stream capture as the backends without a GPU simulate it.

#: The error CUDA returns for a call a capture forbids (cudaErrorStreamCaptureUnsupported).
CAPTURE_UNSUPPORTED = (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")


class SimulatedCapture:
    """Stream capture for the fake and emulator drivers.  ``capturing`` holds the streams a test
    declares captured; while any is, a call that a GPU driver refuses during a capture in the
    global mode (the default of ``torch.cuda.graph``: a synchronous allocation, copy, memset or
    free, a wait for the device or an event, a module load) raises as CUDA's would, unless
    ``capture_mode`` is ``"relaxed"`` or the calling thread is inside :meth:`relaxed_capture`
    (stream operations -- launches, queued copies and memsets, stream-ordered allocations --
    are what a capture records)."""

    capture_mode = "global"

    def _init_capture(self) -> None:
        self.capturing: set[int] = set()
        self._relaxed = threading.local()

    def stream_capturing(self, stream: int) -> bool:
        return int(stream) in self.capturing

    @contextlib.contextmanager
    def relaxed_capture(self):
        before = getattr(self._relaxed, "on", False)
        self._relaxed.on = True
        try:
            yield
        finally:
            self._relaxed.on = before

    def _unsafe(self, call: str) -> None:
        """Raise where ``call`` (not a stream operation) is what a capture forbids now."""
        if self.capturing and self.capture_mode == "global" and not getattr(self._relaxed, "on", False):
            code, name = CAPTURE_UNSUPPORTED
            raise ZyfaError(f"operation not permitted when stream is capturing (streams {sorted(self.capturing)})",
                            code=code, name=name, call=call)


# --------------------------------------------------------------------------------------
# Helpers for the cffi backends.

class LazyLibrary:
    """A shared library opened with ``ffi.dlopen`` on first use, by the first soname that loads."""

    def __init__(self, ffi, sonames: tuple[str, ...], what: str, install_hint: str) -> None:
        self.ffi = ffi
        self.sonames = sonames
        self.what = what
        self.install_hint = install_hint
        self._lib = None
        self._lock = threading.Lock()

    def get(self):
        if self._lib is None:
            with self._lock:
                if self._lib is None:
                    self._lib = self._open()
        return self._lib

    def _open(self):
        failures = []
        for soname in self.sonames:
            try:
                return self.ffi.dlopen(soname)
            except OSError as e:
                # cffi appends a long find_library() note; the loader's own reason is the first line.
                reason = str(e).split(".  Additionally")[0].rsplit(": ", 1)[-1]
                failures.append(f"{soname} ({reason})")
        raise ZyfaError(f"cannot load the {self.what} library: tried {', '.join(failures)}. "
                        f"{self.install_hint}")


def first_symbol(lib, *names: str):
    """The first of ``names`` that ``lib`` exports, or None."""
    for n in names:
        try:
            return getattr(lib, n)
        except AttributeError:
            continue
    return None


def extra_array(ffi, args: bytes, markers: tuple[int, int, int]):
    """The ``extra`` launch array for one packed argument buffer.

    ``markers`` is the vendor's ``(BUFFER_POINTER, BUFFER_SIZE, END)``.  Returns the
    ``void*[5]`` array and the list of cffi objects it points into; the caller keeps
    that list alive until the launch call has returned.
    """
    buf_ptr, buf_size, end = markers
    buf = ffi.new("char[]", max(len(args), 1))
    ffi.memmove(buf, args, len(args))
    size = ffi.new("size_t *", len(args))
    extra = ffi.new("void *[5]", [ffi.cast("void *", buf_ptr), buf,
                                  ffi.cast("void *", buf_size), size,
                                  ffi.cast("void *", end)])
    return extra, [buf, size, extra]


def handle_int(ffi, cdata) -> int:
    return int(ffi.cast("uintptr_t", cdata))
