"""CUDA backend: the CUDA driver API (libcuda) through cffi in ABI mode.

The library is opened on first use, so importing this module never fails.  The
cdef names the versioned symbols that ``cuda.h`` maps its plain names to
(``cuMemAlloc`` -> ``cuMemAlloc_v2``), because ABI mode binds exported symbols,
not header macros.  All work happens in each device's *primary* context, the one
CUDA runtime users (CuPy, PyTorch, JAX) allocate in, so their pointers are valid
in our launches.
"""

from __future__ import annotations

import contextlib
import threading

import cffi

from ..errors import ZyfaError
from .base import CUDA_MAX_GRID, Driver, Function, LazyLibrary, Module, extra_array, first_symbol, handle_int

CDEF = """
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

CUresult cuInit(unsigned int Flags);
CUresult cuGetErrorName(CUresult error, const char **pStr);
CUresult cuGetErrorString(CUresult error, const char **pStr);
CUresult cuDriverGetVersion(int *driverVersion);

CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxSynchronize(void);

CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuFuncSetAttribute(CUfunction hfunc, int attrib, int value);
CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                            size_t *paramSize);
CUresult cuLaunchKernel(CUfunction f,
                        unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra);

/* cuLaunchKernelEx (CUDA >= 12.0), for launch attributes: the value is a 64-byte union. */
typedef struct {
    int id;
    char pad[4];
    union { char pad[64]; int programmaticStreamSerializationAllowed; unsigned long long align_; } value;
} CUlaunchAttribute;
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);

CUresult cuTensorMapEncodeTiled(void *tensorMap, int tensorDataType, unsigned int tensorRank,
                                void *globalAddress, const unsigned long long *globalDim,
                                const unsigned long long *globalStrides, const unsigned int *boxDim,
                                const unsigned int *elementStrides, int interleave, int swizzle,
                                int l2Promotion, int oobFill);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                              CUstream hStream);
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr);

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuEventDestroy_v2(CUevent hEvent);
CUresult cuStreamIsCapturing(CUstream hStream, int *captureStatus);
CUresult cuThreadExchangeStreamCaptureMode(int *mode);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
"""

SONAMES = ("libcuda.so.1", "libcuda.so")
INSTALL_HINT = ("Install the NVIDIA driver (libcuda ships with the driver, not with the CUDA "
                "toolkit) or put its directory on LD_LIBRARY_PATH.")

#: CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE, CU_LAUNCH_PARAM_END.
EXTRA_MARKERS = (1, 2, 0)

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NO_DEVICE = 100

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_STREAM_CAPTURE_MODE_RELAXED = 2
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_UNIFIED = 1, 2, 3, 4

#: CUdevice_attribute values for ``Driver.attribute``.
DEVICE_ATTRIBUTES = {
    "max_threads_per_block": 1,
    "warp_size": 10,
    "multiprocessor_count": 16,
    "compute_capability_major": 75,
    "compute_capability_minor": 76,
    "max_shared_memory_per_block_optin": 97,
}

ffi = cffi.FFI()
ffi.cdef(CDEF)
_library = LazyLibrary(ffi, SONAMES, "CUDA driver", INSTALL_HINT)


def _extra_array(args: bytes):
    return extra_array(ffi, args, EXTRA_MARKERS)


def arch_name(major: int, minor: int) -> str:
    """``sm_90a`` for compute capability 9.0: the arch-specific target the kernels use."""
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


class CudaDriver(Driver):
    name = "cuda"
    vendor = "cuda"
    max_grid = CUDA_MAX_GRID
    host_memory_is_device = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._initialised = False
        self._contexts: dict[int, object] = {}   # device ordinal -> retained primary context
        self._allocs: dict[int, int] = {}        # pointer -> device, for our own allocations
        self._events: dict[int, tuple[object, int]] = {}  # handle -> (CUevent, device)
        self._scratch = threading.local()                 # per thread: tensor_map_u8's arrays

    # -- plumbing ----------------------------------------------------------------------
    @property
    def lib(self):
        lib = _library.get()
        if not self._initialised:
            with self._lock:
                if not self._initialised:
                    self._check("cuInit", lib.cuInit(0), lib)
                    self._initialised = True
        return lib

    def _check(self, call: str, result: int, lib=None) -> None:
        if result == CUDA_SUCCESS:
            return
        lib = lib or _library.get()
        p = ffi.new("const char **")
        name = ffi.string(p[0]).decode() if lib.cuGetErrorName(result, p) == 0 else None
        msg = ffi.string(p[0]).decode() if lib.cuGetErrorString(result, p) == 0 else "unknown error"
        raise ZyfaError(msg, code=int(result), name=name or "CUDA_ERROR_UNKNOWN", call=call)

    def _device(self, device: int) -> int:
        out = ffi.new("CUdevice *")
        self._check("cuDeviceGet", self.lib.cuDeviceGet(out, device))
        return out[0]

    def _device_of(self, ptr: int) -> int:
        if ptr in self._allocs:
            return self._allocs[ptr]
        info = self.pointer_info(ptr)
        return info[1] if info and info[0] == "cuda" else 0

    # -- devices -----------------------------------------------------------------------
    def device_count(self) -> int:
        lib = _library.get()
        if not self._initialised:
            res = lib.cuInit(0)
            if res == CUDA_ERROR_NO_DEVICE:
                return 0
            self._check("cuInit", res, lib)
            self._initialised = True
        n = ffi.new("int *")
        self._check("cuDeviceGetCount", lib.cuDeviceGetCount(n))
        return n[0]

    def attribute(self, device: int, name: str) -> int:
        if name not in DEVICE_ATTRIBUTES:
            raise ZyfaError(f"unknown device attribute {name!r}; known: {sorted(DEVICE_ATTRIBUTES)}")
        out = ffi.new("int *")
        self._check("cuDeviceGetAttribute",
                    self.lib.cuDeviceGetAttribute(out, DEVICE_ATTRIBUTES[name], self._device(device)))
        return out[0]

    def arch(self, device: int) -> str:
        return arch_name(self.attribute(device, "compute_capability_major"),
                         self.attribute(device, "compute_capability_minor"))

    def device_name(self, device: int) -> str:
        buf = ffi.new("char[256]")
        self._check("cuDeviceGetName", self.lib.cuDeviceGetName(buf, 256, self._device(device)))
        return ffi.string(buf).decode(errors="replace")

    def versions(self) -> dict:
        v = ffi.new("int *")
        self._check("cuDriverGetVersion", self.lib.cuDriverGetVersion(v))
        return {"driver_version": v[0], "driver": f"{v[0] // 1000}.{v[0] % 1000 // 10}"}

    def make_current(self, device: int) -> None:
        lib, ctx = self.lib, self._contexts.get(device)
        if ctx is None:
            dev = self._device(device)
            with self._lock:
                ctx = self._contexts.get(device)
                if ctx is None:
                    out = ffi.new("CUcontext *")
                    self._check("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(out, dev))
                    ctx = self._contexts[device] = out[0]
        self._check("cuCtxSetCurrent", lib.cuCtxSetCurrent(ctx))

    def pointer_info(self, ptr: int) -> tuple[str, int] | None:
        if not ptr:
            return None
        lib = self.lib
        cur = ffi.new("CUcontext *")
        self._check("cuCtxGetCurrent", lib.cuCtxGetCurrent(cur))
        if cur[0] == ffi.NULL:
            self.make_current(0)
        mtype = ffi.new("unsigned int *")
        res = lib.cuPointerGetAttribute(mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
        if res == CUDA_ERROR_INVALID_VALUE:      # not known to CUDA: ordinary host memory
            return ("cpu", 0)
        self._check("cuPointerGetAttribute", res)
        if mtype[0] not in (CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_UNIFIED):
            return ("cpu", 0)                    # pinned / registered host memory
        ordinal = ffi.new("int *")
        self._check("cuPointerGetAttribute",
                    lib.cuPointerGetAttribute(ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr))
        return ("cuda", ordinal[0])

    # -- code --------------------------------------------------------------------------
    def load_module(self, device: int, image: bytes) -> Module:
        self.make_current(device)
        src = ffi.from_buffer(image)
        out = ffi.new("CUmodule *")
        self._check("cuModuleLoadData", self.lib.cuModuleLoadData(out, src))
        return Module(handle=out[0], device=device)

    def get_function(self, module: Module, symbol: str) -> Function:
        self.make_current(module.device)
        out = ffi.new("CUfunction *")
        self._check(f"cuModuleGetFunction({symbol})",
                    self.lib.cuModuleGetFunction(out, module.handle, symbol.encode()))
        return Function(handle=out[0], module=module, symbol=symbol)

    def set_max_dynamic_shared(self, function: Function, nbytes: int) -> None:
        self.make_current(function.module.device)
        self._check("cuFuncSetAttribute", self.lib.cuFuncSetAttribute(
            function.handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes)))

    def launch(self, function: Function, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, stream: int, args: bytes, dependent: bool = False) -> None:
        self.make_current(function.module.device)
        extra, keep = _extra_array(args)
        launch_ex = first_symbol(self.lib, "cuLaunchKernelEx") if dependent else None
        if launch_ex is not None:
            # Programmatic stream serialisation: the kernel's CTAs may start once every CTA of the
            # launch before it has triggered (griddepcontrol.launch_dependents) or ended.
            attr = ffi.new("CUlaunchAttribute *")
            attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            config = ffi.new("CUlaunchConfig *", {
                "gridDimX": grid[0], "gridDimY": grid[1], "gridDimZ": grid[2],
                "blockDimX": block[0], "blockDimY": block[1], "blockDimZ": block[2],
                "sharedMemBytes": shared_bytes, "hStream": ffi.cast("CUstream", stream),
                "attrs": attr, "numAttrs": 1})
            res = launch_ex(config, function.handle, ffi.NULL, extra)
            call = "cuLaunchKernelEx"
        else:   # a plain launch, or a driver before CUDA 12.0: in order, which is always correct
            res = self.lib.cuLaunchKernel(function.handle, *grid, *block, shared_bytes,
                                          ffi.cast("CUstream", stream), ffi.NULL, extra)
            call = "cuLaunchKernel"
        del keep
        self._check(f"{call}({function.symbol})", res)

    def param_info(self, function: Function) -> list[tuple[int, int]] | None:
        fn = first_symbol(self.lib, "cuFuncGetParamInfo")      # CUDA >= 12.4
        if fn is None:
            return None
        self.make_current(function.module.device)
        off, size, out = ffi.new("size_t *"), ffi.new("size_t *"), []
        while True:
            res = fn(function.handle, len(out), off, size)
            if res == CUDA_ERROR_INVALID_VALUE:    # index past the last parameter
                return out
            self._check("cuFuncGetParamInfo", res)
            out.append((off[0], size[0]))

    # -- memory ------------------------------------------------------------------------
    def tensor_map_u8(self, ptr: int, dims, strides, box, swizzle_bytes: int) -> bytes:
        """A tiled CUtensorMap (128 bytes) of a byte tensor: dims innermost first, strides in
        bytes of dims 1.., the box, zeros out of bounds, L2 promotion of 128 bytes."""
        swz = {0: 0, 32: 1, 64: 2, 128: 3}[swizzle_bytes]
        rank = len(dims)
        scratch = getattr(self._scratch, "tmap", None)
        if scratch is None:   # this thread's argument arrays, made once (cffi allocations cost)
            buf = ffi.new("unsigned char[]", 192)
            addr = int(ffi.cast("uintptr_t", buf))
            scratch = self._scratch.tmap = (buf, ffi.cast("void *", (addr + 63) // 64 * 64),
                                            ffi.new("unsigned long long[5]"), ffi.new("unsigned long long[5]"),
                                            ffi.new("unsigned int[5]"), ffi.new("unsigned int[5]", [1] * 5))
        _, aligned, c_dims, c_strides, c_box, ones = scratch
        c_dims[0:rank], c_strides[0:len(strides)], c_box[0:len(box)] = list(dims), list(strides), list(box)
        self._check("cuTensorMapEncodeTiled", self.lib.cuTensorMapEncodeTiled(
            aligned, 0, rank, ffi.cast("void *", ptr), c_dims, c_strides, c_box, ones, 0, swz, 2, 0))
        return bytes(ffi.buffer(aligned, 128))

    def alloc(self, device: int, nbytes: int) -> int:
        self.make_current(device)
        out = ffi.new("CUdeviceptr *")
        self._check("cuMemAlloc_v2", self.lib.cuMemAlloc_v2(out, max(int(nbytes), 1)))
        self._allocs[out[0]] = device
        return out[0]

    def free(self, ptr: int) -> None:
        self.make_current(self._device_of(ptr))
        self._check("cuMemFree_v2", self.lib.cuMemFree_v2(ptr))
        self._allocs.pop(ptr, None)

    def copy_htod(self, ptr: int, host) -> None:
        src = ffi.from_buffer(host)
        self.make_current(self._device_of(ptr))
        self._check("cuMemcpyHtoD_v2", self.lib.cuMemcpyHtoD_v2(ptr, src, len(src)))
        # From pageable memory the copy returns once its bytes are staged, its DMA queued on the
        # legacy stream, which a non-blocking stream's later work does not wait for: wait here.
        self._check("cuStreamSynchronize", self.lib.cuStreamSynchronize(ffi.NULL))

    def copy_dtoh(self, host, ptr: int) -> None:
        dst = ffi.from_buffer(host, require_writable=True)
        self.make_current(self._device_of(ptr))
        self._check("cuMemcpyDtoH_v2", self.lib.cuMemcpyDtoH_v2(dst, ptr, len(dst)))

    def memset_d8(self, ptr: int, value: int, nbytes: int) -> None:
        self.make_current(self._device_of(ptr))
        self._check("cuMemsetD8_v2", self.lib.cuMemsetD8_v2(ptr, value & 0xFF, nbytes))

    def host_alloc(self, device: int, nbytes: int) -> int:
        self.make_current(device)
        out = ffi.new("void **")
        # CU_MEMHOSTALLOC_PORTABLE: page-locked for every context, not only the current one
        self._check("cuMemHostAlloc", self.lib.cuMemHostAlloc(out, max(int(nbytes), 1), 0x01))
        return handle_int(ffi, out[0])

    def host_free(self, ptr: int) -> None:
        self._check("cuMemFreeHost", self.lib.cuMemFreeHost(ffi.cast("void *", ptr)))

    def stream_capturing(self, stream: int) -> bool:
        status = ffi.new("int *")
        self._check("cuStreamIsCapturing", self.lib.cuStreamIsCapturing(ffi.cast("CUstream", stream), status))
        return status[0] != 0      # CU_STREAM_CAPTURE_STATUS_ACTIVE or _INVALIDATED

    def copy_htod_async(self, ptr: int, host_ptr: int, nbytes: int, stream: int) -> None:
        self.make_current(self._device_of(ptr))
        self._check("cuMemcpyHtoDAsync_v2", self.lib.cuMemcpyHtoDAsync_v2(
            ptr, ffi.cast("void *", host_ptr), int(nbytes), ffi.cast("CUstream", stream)))

    def alloc_async(self, device: int, nbytes: int, stream: int) -> int:
        self.make_current(device)
        out = ffi.new("CUdeviceptr *")
        self._check("cuMemAllocAsync", self.lib.cuMemAllocAsync(out, max(int(nbytes), 1),
                                                                ffi.cast("CUstream", stream)))
        return out[0]

    def free_async(self, ptr: int, stream: int) -> None:
        self._check("cuMemFreeAsync", self.lib.cuMemFreeAsync(ptr, ffi.cast("CUstream", stream)))

    def memset_d8_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        self._check("cuMemsetD8Async", self.lib.cuMemsetD8Async(ptr, value & 0xFF, int(nbytes),
                                                                ffi.cast("CUstream", stream)))

    def memset_d32_async(self, ptr: int, value: int, count: int, stream: int) -> None:
        self._check("cuMemsetD32Async", self.lib.cuMemsetD32Async(ptr, value & 0xFFFFFFFF, int(count),
                                                                  ffi.cast("CUstream", stream)))

    @contextlib.contextmanager
    def relaxed_capture(self):
        mode = ffi.new("int *", CU_STREAM_CAPTURE_MODE_RELAXED)
        self._check("cuThreadExchangeStreamCaptureMode", self.lib.cuThreadExchangeStreamCaptureMode(mode))
        try:
            yield
        finally:     # the thread's own mode back
            self._check("cuThreadExchangeStreamCaptureMode", self.lib.cuThreadExchangeStreamCaptureMode(mode))

    def synchronize(self, device: int) -> None:
        self.make_current(device)
        self._check("cuCtxSynchronize", self.lib.cuCtxSynchronize())

    # -- events ------------------------------------------------------------------------
    def _event(self, handle: int):
        ev, device = self._events[handle]
        self.make_current(device)
        return ev

    def event_create(self, device: int = 0) -> int:
        self.make_current(device)
        out = ffi.new("CUevent *")
        self._check("cuEventCreate", self.lib.cuEventCreate(out, 0))   # CU_EVENT_DEFAULT: timed
        handle = handle_int(ffi, out[0])
        self._events[handle] = (out[0], device)
        return handle

    def event_record(self, event: int, stream: int = 0) -> None:
        ev = self._event(event)
        self._check("cuEventRecord", self.lib.cuEventRecord(ev, ffi.cast("CUstream", stream)))

    def event_synchronize(self, event: int) -> None:
        self._check("cuEventSynchronize", self.lib.cuEventSynchronize(self._event(event)))

    def event_elapsed_ms(self, start: int, end: int) -> float:
        # CUDA 13's cuda.h maps cuEventElapsedTime to the _v2 symbol; older drivers export
        # only the plain one.
        fn = first_symbol(self.lib, "cuEventElapsedTime_v2", "cuEventElapsedTime")
        ms = ffi.new("float *")
        self._check("cuEventElapsedTime", fn(ms, self._event(start), self._event(end)))
        return float(ms[0])

    def event_destroy(self, event: int) -> None:
        ev = self._event(event)
        self._check("cuEventDestroy_v2", self.lib.cuEventDestroy_v2(ev))
        del self._events[event]
