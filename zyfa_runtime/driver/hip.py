"""HIP backend: the HIP runtime (libamdhip64) through cffi in ABI mode.

The library is opened on first use, so importing this module never fails.  Two
structs are read as raw bytes rather than declared, because their layout is
versioned by ROCm and a misdeclared struct in ABI mode corrupts memory:

* ``hipDeviceProp_tR0600`` (what ``hipGetDeviceProperties`` means since ROCm 6):
  1472 bytes; ``char name[256]`` at offset 0 and ``char gcnArchName[256]`` at
  offset 1160.  It is filled into a 4096-byte buffer, so a later, larger revision
  cannot write past it.
* ``hipPointerAttribute_t`` (ROCm 6 and 7): ``{hipMemoryType type; int device;
  void* devicePointer; void* hostPointer; int isManaged; unsigned allocationFlags;}``
  -- 32 bytes; only ``type`` (offset 0) and ``device`` (offset 4) are read, from a
  zeroed 64-byte buffer.  ``hipMemoryType`` values are the ROCm 6 ones
  (Unregistered 0, Host 1, Device 2, Managed 3, Array 10, Unified 11).
"""

from __future__ import annotations

import contextlib
import threading

import cffi

from ..errors import ZyfaError
from ..versions import rocm_release
from .base import Driver, Function, LazyLibrary, Module, extra_array, first_symbol, handle_int

CDEF = """
typedef int hipError_t;
typedef struct ihipModule_t *hipModule_t;
typedef struct ihipModuleSymbol_t *hipFunction_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipEvent_t *hipEvent_t;

hipError_t hipInit(unsigned int flags);
const char *hipGetErrorName(hipError_t hip_error);
const char *hipGetErrorString(hipError_t hip_error);
hipError_t hipDriverGetVersion(int *driverVersion);
hipError_t hipRuntimeGetVersion(int *runtimeVersion);

hipError_t hipGetDeviceCount(int *count);
hipError_t hipSetDevice(int deviceId);
hipError_t hipDeviceGetAttribute(int *pi, int attr, int deviceId);
hipError_t hipGetDevicePropertiesR0600(void *prop, int deviceId);
hipError_t hipDeviceSynchronize(void);

hipError_t hipModuleLoadData(hipModule_t *module, const void *image);
hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module, const char *kname);
hipError_t hipFuncSetAttribute(const void *func, int attr, int value);
hipError_t hipModuleLaunchKernel(hipFunction_t f,
                                 unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                 unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                 unsigned int sharedMemBytes, hipStream_t stream,
                                 void **kernelParams, void **extra);

hipError_t hipMalloc(void **ptr, size_t size);
hipError_t hipFree(void *ptr);
hipError_t hipMemcpyHtoD(void *dst, const void *src, size_t sizeBytes);
hipError_t hipStreamSynchronize(hipStream_t stream);
hipError_t hipMemcpyDtoH(void *dst, void *src, size_t sizeBytes);
hipError_t hipMemset(void *dst, int value, size_t sizeBytes);
hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags);
hipError_t hipHostAlloc(void **ptr, size_t size, unsigned int flags);
hipError_t hipHostFree(void *ptr);
hipError_t hipFreeHost(void *ptr);
hipError_t hipMemcpyHtoDAsync(void *dst, const void *src, size_t sizeBytes, hipStream_t stream);
hipError_t hipPointerGetAttributes(void *attributes, const void *ptr);

hipError_t hipEventCreate(hipEvent_t *event);
hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream);
hipError_t hipEventSynchronize(hipEvent_t event);
hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop);
hipError_t hipEventDestroy(hipEvent_t event);
hipError_t hipStreamIsCapturing(hipStream_t stream, int *pCaptureStatus);
hipError_t hipThreadExchangeStreamCaptureMode(int *mode);
hipError_t hipMallocAsync(void **dev_ptr, size_t size, hipStream_t stream);
hipError_t hipFreeAsync(void *dev_ptr, hipStream_t stream);
hipError_t hipMemsetD8Async(void *dest, unsigned char value, size_t count, hipStream_t stream);
hipError_t hipMemsetD32Async(void *dst, int value, size_t count, hipStream_t stream);
"""

SONAMES = ("libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so")
INSTALL_HINT = ("Install the ROCm HIP runtime (package hip-runtime-amd, or a ROCm 7 install) and "
                "make sure its lib directory (usually /opt/rocm/lib) is on LD_LIBRARY_PATH.")

#: HIP_LAUNCH_PARAM_BUFFER_POINTER, HIP_LAUNCH_PARAM_BUFFER_SIZE, HIP_LAUNCH_PARAM_END.
EXTRA_MARKERS = (1, 2, 3)

HIP_SUCCESS = 0
HIP_ERROR_INVALID_VALUE = 1
HIP_ERROR_NO_DEVICE = 100

HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_MEMORY_SIZE = 8
HIP_STREAM_CAPTURE_MODE_RELAXED = 2
PROPS_BUFFER_BYTES = 4096
PROPS_NAME_OFFSET = 0
PROPS_GCN_ARCH_NAME_OFFSET = 1160
POINTER_ATTRIBUTE_BUFFER_BYTES = 64
HIP_MEMORY_TYPES_ON_DEVICE = {2, 3, 10, 11}   # Device, Managed, Array, Unified

#: hipDeviceAttribute_t values (ROCm 6/7 numbering, not CUDA's) for ``Driver.attribute``.
DEVICE_ATTRIBUTES = {
    "compute_capability_major": 23,
    "max_threads_per_block": 56,
    "compute_capability_minor": 61,
    "multiprocessor_count": 63,
    "max_shared_memory_per_block_optin": 75,
    "warp_size": 87,
}

ffi = cffi.FFI()
ffi.cdef(CDEF)
_library = LazyLibrary(ffi, SONAMES, "HIP runtime", INSTALL_HINT)


def _extra_array(args: bytes):
    return extra_array(ffi, args, EXTRA_MARKERS)


def decode_version(v: int) -> str:
    """HIP encodes versions as major * 10**7 + minor * 10**5 + patch."""
    return f"{v // 10_000_000}.{v // 100_000 % 100}.{v % 100_000}"


class HipDriver(Driver):
    name = "hip"
    vendor = "hip"
    host_memory_is_device = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._initialised = False
        self._props: dict[int, tuple[str, str]] = {}   # device -> (name, gcnArchName)
        self._allocs: dict[int, int] = {}
        self._events: dict[int, tuple[object, int]] = {}

    # -- plumbing ----------------------------------------------------------------------
    @property
    def lib(self):
        lib = _library.get()
        if not self._initialised:
            with self._lock:
                if not self._initialised:
                    self._check("hipInit", lib.hipInit(0), lib)
                    self._initialised = True
        return lib

    def _check(self, call: str, result: int, lib=None) -> None:
        if result == HIP_SUCCESS:
            return
        lib = lib or _library.get()
        name = ffi.string(lib.hipGetErrorName(result)).decode()
        msg = ffi.string(lib.hipGetErrorString(result)).decode()
        raise ZyfaError(msg, code=int(result), name=name, call=call)

    def _device_of(self, ptr: int) -> int:
        if ptr in self._allocs:
            return self._allocs[ptr]
        info = self.pointer_info(ptr)
        return info[1] if info and info[0] == "rocm" else 0

    def _properties(self, device: int) -> tuple[str, str]:
        if device not in self._props:
            buf = ffi.new(f"char[{PROPS_BUFFER_BYTES}]")
            self._check("hipGetDevicePropertiesR0600",
                        self.lib.hipGetDevicePropertiesR0600(buf, device))
            name = ffi.string(buf + PROPS_NAME_OFFSET, 256).decode(errors="replace")
            gcn = ffi.string(buf + PROPS_GCN_ARCH_NAME_OFFSET, 256).decode(errors="replace")
            self._props[device] = (name, gcn)
        return self._props[device]

    # -- devices -----------------------------------------------------------------------
    def device_count(self) -> int:
        lib = _library.get()
        if not self._initialised:
            res = lib.hipInit(0)
            if res == HIP_ERROR_NO_DEVICE:
                return 0
            self._check("hipInit", res, lib)
            self._initialised = True
        n = ffi.new("int *")
        res = lib.hipGetDeviceCount(n)
        if res == HIP_ERROR_NO_DEVICE:
            return 0
        self._check("hipGetDeviceCount", res)
        return n[0]

    def attribute(self, device: int, name: str) -> int:
        if name not in DEVICE_ATTRIBUTES:
            raise ZyfaError(f"unknown device attribute {name!r}; known: {sorted(DEVICE_ATTRIBUTES)}")
        out = ffi.new("int *")
        self._check("hipDeviceGetAttribute",
                    self.lib.hipDeviceGetAttribute(out, DEVICE_ATTRIBUTES[name], device))
        return out[0]

    def arch(self, device: int) -> str:
        """``gfx950`` from ``gfx950:sramecc+:xnack-``: the target without its feature flags."""
        return self._properties(device)[1].split(":", 1)[0]

    def device_name(self, device: int) -> str:
        return self._properties(device)[0]

    def versions(self) -> dict:
        d, r = ffi.new("int *"), ffi.new("int *")
        self._check("hipDriverGetVersion", self.lib.hipDriverGetVersion(d))
        self._check("hipRuntimeGetVersion", self.lib.hipRuntimeGetVersion(r))
        out = {"driver_version": d[0], "driver": decode_version(d[0]),
               "runtime_version": r[0], "runtime": decode_version(r[0])}
        release = rocm_release()     # $ROCM_PATH/.info/version, else /opt/rocm's
        if release:
            out["rocm"] = release
        return out

    def make_current(self, device: int) -> None:
        self._check("hipSetDevice", self.lib.hipSetDevice(device))

    def pointer_info(self, ptr: int) -> tuple[str, int] | None:
        if not ptr:
            return None
        attrs = ffi.new(f"char[{POINTER_ATTRIBUTE_BUFFER_BYTES}]")
        res = self.lib.hipPointerGetAttributes(attrs, ffi.cast("void *", ptr))
        if res == HIP_ERROR_INVALID_VALUE:     # older runtimes: unknown host pointer
            return ("cpu", 0)
        self._check("hipPointerGetAttributes", res)
        fields = ffi.cast("int *", attrs)
        mem_type, device = fields[0], fields[1]
        if mem_type in HIP_MEMORY_TYPES_ON_DEVICE and device >= 0:
            return ("rocm", device)
        return ("cpu", 0)

    # -- code --------------------------------------------------------------------------
    def load_module(self, device: int, image: bytes) -> Module:
        self.make_current(device)
        src = ffi.from_buffer(image)
        out = ffi.new("hipModule_t *")
        self._check("hipModuleLoadData", self.lib.hipModuleLoadData(out, src))
        return Module(handle=out[0], device=device)

    def get_function(self, module: Module, symbol: str) -> Function:
        self.make_current(module.device)
        out = ffi.new("hipFunction_t *")
        self._check(f"hipModuleGetFunction({symbol})",
                    self.lib.hipModuleGetFunction(out, module.handle, symbol.encode()))
        return Function(handle=out[0], module=module, symbol=symbol)

    def set_max_dynamic_shared(self, function: Function, nbytes: int) -> None:
        # The HIP kernels keep LDS static; only a kernel that asks for dynamic LDS needs the
        # attribute (ROCm 7 accepts module functions here; ROCm 6 answers hipErrorInvalidSymbol).
        if nbytes <= 0:
            return
        self.make_current(function.module.device)
        self._check("hipFuncSetAttribute", self.lib.hipFuncSetAttribute(
            function.handle, HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_MEMORY_SIZE, int(nbytes)))

    def launch(self, function: Function, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, stream: int, args: bytes, dependent: bool = False) -> None:
        # No dependent launches here: every launch starts once the one before it has ended.
        self.make_current(function.module.device)
        extra, keep = _extra_array(args)
        res = self.lib.hipModuleLaunchKernel(function.handle, *grid, *block, shared_bytes,
                                             ffi.cast("hipStream_t", stream), ffi.NULL, extra)
        del keep
        self._check(f"hipModuleLaunchKernel({function.symbol})", res)

    # -- memory ------------------------------------------------------------------------
    def alloc(self, device: int, nbytes: int) -> int:
        self.make_current(device)
        out = ffi.new("void **")
        self._check("hipMalloc", self.lib.hipMalloc(out, max(int(nbytes), 1)))
        ptr = handle_int(ffi, out[0])
        self._allocs[ptr] = device
        return ptr

    def free(self, ptr: int) -> None:
        self.make_current(self._device_of(ptr))
        self._check("hipFree", self.lib.hipFree(ffi.cast("void *", ptr)))
        self._allocs.pop(ptr, None)

    def copy_htod(self, ptr: int, host) -> None:
        src = ffi.from_buffer(host)
        self.make_current(self._device_of(ptr))
        self._check("hipMemcpyHtoD",
                    self.lib.hipMemcpyHtoD(ffi.cast("void *", ptr), src, len(src)))
        # As CUDA's: a copy from pageable memory may return before its DMA lands.
        self._check("hipStreamSynchronize", self.lib.hipStreamSynchronize(ffi.NULL))

    def copy_dtoh(self, host, ptr: int) -> None:
        dst = ffi.from_buffer(host, require_writable=True)
        self.make_current(self._device_of(ptr))
        self._check("hipMemcpyDtoH",
                    self.lib.hipMemcpyDtoH(dst, ffi.cast("void *", ptr), len(dst)))

    def memset_d8(self, ptr: int, value: int, nbytes: int) -> None:
        self.make_current(self._device_of(ptr))
        self._check("hipMemset", self.lib.hipMemset(ffi.cast("void *", ptr), value & 0xFF, nbytes))

    def host_alloc(self, device: int, nbytes: int) -> int:
        self.make_current(device)
        out = ffi.new("void **")
        # hipHostMallocPortable: page-locked for every device's context.  ROCm has moved between
        # the two names (one deprecated in favour of the other and back): either will do.
        fn = first_symbol(self.lib, "hipHostMalloc", "hipHostAlloc")
        if fn is None:
            raise ZyfaError("the HIP runtime exports neither hipHostMalloc nor hipHostAlloc")
        self._check("hipHostMalloc", fn(out, max(int(nbytes), 1), 0x1))
        return handle_int(ffi, out[0])

    def host_free(self, ptr: int) -> None:
        fn = first_symbol(self.lib, "hipHostFree", "hipFreeHost")
        if fn is None:
            raise ZyfaError("the HIP runtime exports neither hipHostFree nor hipFreeHost")
        self._check("hipHostFree", fn(ffi.cast("void *", ptr)))

    def stream_capturing(self, stream: int) -> bool:
        status = ffi.new("int *")
        self._check("hipStreamIsCapturing",
                    self.lib.hipStreamIsCapturing(ffi.cast("hipStream_t", stream), status))
        return status[0] != 0      # hipStreamCaptureStatusActive or _Invalidated

    def copy_htod_async(self, ptr: int, host_ptr: int, nbytes: int, stream: int) -> None:
        self.make_current(self._device_of(ptr))
        self._check("hipMemcpyHtoDAsync", self.lib.hipMemcpyHtoDAsync(
            ffi.cast("void *", ptr), ffi.cast("void *", host_ptr), int(nbytes),
            ffi.cast("hipStream_t", stream)))

    def alloc_async(self, device: int, nbytes: int, stream: int) -> int:
        self.make_current(device)
        out = ffi.new("void **")
        self._check("hipMallocAsync", self.lib.hipMallocAsync(out, max(int(nbytes), 1),
                                                              ffi.cast("hipStream_t", stream)))
        return handle_int(ffi, out[0])

    def free_async(self, ptr: int, stream: int) -> None:
        self._check("hipFreeAsync", self.lib.hipFreeAsync(ffi.cast("void *", ptr), ffi.cast("hipStream_t", stream)))

    def memset_d8_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        self._check("hipMemsetD8Async", self.lib.hipMemsetD8Async(
            ffi.cast("void *", ptr), value & 0xFF, int(nbytes), ffi.cast("hipStream_t", stream)))

    def memset_d32_async(self, ptr: int, value: int, count: int, stream: int) -> None:
        word = (value & 0xFFFFFFFF) - ((value & 0x80000000) << 1)     # the same bits as a C int
        self._check("hipMemsetD32Async", self.lib.hipMemsetD32Async(
            ffi.cast("void *", ptr), word, int(count), ffi.cast("hipStream_t", stream)))

    @contextlib.contextmanager
    def relaxed_capture(self):
        mode = ffi.new("int *", HIP_STREAM_CAPTURE_MODE_RELAXED)
        self._check("hipThreadExchangeStreamCaptureMode", self.lib.hipThreadExchangeStreamCaptureMode(mode))
        try:
            yield
        finally:     # the thread's own mode back
            self._check("hipThreadExchangeStreamCaptureMode", self.lib.hipThreadExchangeStreamCaptureMode(mode))

    def synchronize(self, device: int) -> None:
        self.make_current(device)
        self._check("hipDeviceSynchronize", self.lib.hipDeviceSynchronize())

    # -- events ------------------------------------------------------------------------
    def _event(self, handle: int):
        ev, device = self._events[handle]
        self.make_current(device)
        return ev

    def event_create(self, device: int = 0) -> int:
        self.make_current(device)
        out = ffi.new("hipEvent_t *")
        self._check("hipEventCreate", self.lib.hipEventCreate(out))
        handle = handle_int(ffi, out[0])
        self._events[handle] = (out[0], device)
        return handle

    def event_record(self, event: int, stream: int = 0) -> None:
        ev = self._event(event)
        self._check("hipEventRecord", self.lib.hipEventRecord(ev, ffi.cast("hipStream_t", stream)))

    def event_synchronize(self, event: int) -> None:
        self._check("hipEventSynchronize", self.lib.hipEventSynchronize(self._event(event)))

    def event_elapsed_ms(self, start: int, end: int) -> float:
        ms = ffi.new("float *")
        self._check("hipEventElapsedTime",
                    self.lib.hipEventElapsedTime(ms, self._event(start), self._event(end)))
        return float(ms[0])

    def event_destroy(self, event: int) -> None:
        ev = self._event(event)
        self._check("hipEventDestroy", self.lib.hipEventDestroy(ev))
        del self._events[event]
