"""Driver layer on a GPU-less machine: the fake backend, backend choice, and the CUDA/HIP
bindings driven through stand-in libraries (so launch packing, error decoding and struct
reads are exercised without a GPU)."""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import zyfa_runtime.driver as drv
from zyfa_runtime.driver import cuda, fake, hip
from zyfa_runtime.errors import CodeObjectError, ZyfaError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def fresh_drivers(monkeypatch):
    monkeypatch.delenv(drv.BACKEND_ENV, raising=False)
    monkeypatch.delenv("ZYFA_FAKE_ARCH", raising=False)
    drv._reset()
    yield
    drv._reset()


class StubLib:
    """Stands in for a cffi library: every function returns success unless overridden."""

    def __init__(self, **overrides):
        self.overrides = overrides
        self.calls: list[str] = []

    def __getattr__(self, name):
        impl = self.overrides.get(name, lambda *args: 0)

        def call(*args):
            self.calls.append(name)
            return impl(*args)
        return call


def use_stub(monkeypatch, module, lib: StubLib) -> StubLib:
    monkeypatch.setattr(module, "_library", SimpleNamespace(get=lambda: lib))
    return lib


class NoLibFFI:
    def dlopen(self, name):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")


def without_library(monkeypatch, module) -> None:
    monkeypatch.setattr(module._library, "ffi", NoLibFFI())
    monkeypatch.setattr(module._library, "_lib", None)


# -- errors -------------------------------------------------------------------------------

def test_error_formatting():
    e = ZyfaError("device kernel image is invalid", code=200, name="CUDA_ERROR_INVALID_IMAGE",
                  call="cuModuleLoadData")
    assert str(e) == "cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE (200): device kernel image is invalid"
    assert (e.code, e.name, e.message) == (200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid")
    assert str(ZyfaError("plain")) == "plain"
    assert ZyfaError("plain").code is None and ZyfaError("plain").name is None
    again = pickle.loads(pickle.dumps(e))
    assert str(again) == str(e) and again.code == 200
    assert issubclass(CodeObjectError, ZyfaError) and issubclass(ZyfaError, RuntimeError)


def test_cuda_error_decoding(monkeypatch):
    strings = {}

    def put(p, text):
        strings[text] = cuda.ffi.new("char[]", text)
        p[0] = strings[text]
        return 0
    lib = use_stub(monkeypatch, cuda, StubLib(
        cuGetErrorName=lambda code, p: put(p, b"CUDA_ERROR_INVALID_IMAGE"),
        cuGetErrorString=lambda code, p: put(p, b"device kernel image is invalid"),
        cuModuleLoadData=lambda out, image: 200))
    with pytest.raises(ZyfaError) as info:
        cuda.CudaDriver().load_module(0, b"\x7fELF")
    assert str(info.value) == ("cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE (200): "
                               "device kernel image is invalid")
    assert "cuDevicePrimaryCtxRetain" in lib.calls and "cuCtxSetCurrent" in lib.calls


def test_hip_error_decoding(monkeypatch):
    name, text = hip.ffi.new("char[]", b"hipErrorInvalidImage"), hip.ffi.new("char[]", b"invalid kernel file")
    use_stub(monkeypatch, hip, StubLib(hipGetErrorName=lambda code: name,
                                       hipGetErrorString=lambda code: text,
                                       hipModuleLoadData=lambda out, image: 200))
    with pytest.raises(ZyfaError) as info:
        hip.HipDriver().load_module(0, b"\x7fELF")
    assert str(info.value) == "hipModuleLoadData failed: hipErrorInvalidImage (200): invalid kernel file"
    assert info.value.code == 200


# -- extra-array markers and launches -----------------------------------------------------

def _read_extra(ffi, extra) -> tuple[list[int], bytes]:
    markers = [int(ffi.cast("uintptr_t", extra[i])) for i in (0, 2, 4)]
    size = ffi.cast("size_t *", extra[3])[0]
    return markers, bytes(ffi.buffer(ffi.cast("char *", extra[1]), size))


@pytest.mark.parametrize("module, markers", [(cuda, [1, 2, 0]), (hip, [1, 2, 3])])
def test_extra_array_markers(module, markers):
    args = struct.pack("<QQi", 0xDEADBEEF, 7, -3) + b"\0" * 4
    extra, keep = module._extra_array(args)
    assert _read_extra(module.ffi, extra) == (markers, args)
    assert len(keep) >= 2


@pytest.mark.parametrize("module, cls, fn, markers", [
    (cuda, "CudaDriver", "cuLaunchKernel", [1, 2, 0]),
    (hip, "HipDriver", "hipModuleLaunchKernel", [1, 2, 3]),
])
def test_launch_passes_packed_buffer(monkeypatch, module, cls, fn, markers):
    seen = {}

    def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        seen["dims"] = (gx, gy, gz, bx, by, bz, shared)
        seen["stream"] = int(module.ffi.cast("uintptr_t", stream))
        seen["params_null"] = params == module.ffi.NULL
        seen["extra"] = _read_extra(module.ffi, extra)
        return 0
    use_stub(monkeypatch, module, StubLib(**{fn: launch}))
    driver = getattr(module, cls)()
    function = driver.get_function(driver.load_module(0, b"image"), "zyfa_fwd")
    args = bytes(range(200)) + b"\0" * 8
    driver.launch(function, (3, 4, 5), (128, 1, 1), 4096, 0x1234, args)
    assert seen == {"dims": (3, 4, 5, 128, 1, 1, 4096), "stream": 0x1234, "params_null": True,
                    "extra": (markers, args)}


def test_a_dependent_launch_goes_through_cuLaunchKernelEx_with_programmatic_serialisation(monkeypatch):
    """launch(dependent=True) on CUDA: cuLaunchKernelEx with the grid, block, shared bytes and
    stream in its config and one attribute, PROGRAMMATIC_STREAM_SERIALIZATION (6) = 1, laid out
    as cuda.h lays it out on LP64 (id, 4 bytes of padding, a 64-byte value union: 72 bytes; the
    config 56), and the same packed buffer; a plain launch still goes through cuLaunchKernel."""
    ffi, seen = cuda.ffi, {}

    def launch_ex(config, f, params, extra):
        c = config[0]
        seen["dims"] = (c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ,
                        c.sharedMemBytes)
        seen["stream"] = int(ffi.cast("uintptr_t", c.hStream))
        seen["attrs"] = bytes(ffi.buffer(c.attrs, c.numAttrs * ffi.sizeof("CUlaunchAttribute")))
        seen["params_null"] = params == ffi.NULL
        seen["extra"] = _read_extra(ffi, extra)
        return 0
    lib = use_stub(monkeypatch, cuda, StubLib(cuLaunchKernelEx=launch_ex))
    driver = cuda.CudaDriver()
    function = driver.get_function(driver.load_module(0, b"image"), "zyfa_fwd")
    args = bytes(range(200)) + b"\0" * 8
    driver.launch(function, (3, 4, 5), (384, 1, 1), 4096, 0x1234, args, dependent=True)
    assert (ffi.sizeof("CUlaunchAttribute"), ffi.sizeof("CUlaunchConfig")) == (72, 56)
    assert seen == {"dims": (3, 4, 5, 384, 1, 1, 4096), "stream": 0x1234,
                    "attrs": struct.pack("<i4xi60x", 6, 1), "params_null": True, "extra": ([1, 2, 0], args)}
    assert "cuLaunchKernel" not in lib.calls
    driver.launch(function, (3, 4, 5), (384, 1, 1), 4096, 0x1234, args)
    assert lib.calls[-1] == "cuLaunchKernel"


def test_a_driver_without_cuLaunchKernelEx_launches_a_dependent_launch_in_order(monkeypatch):
    """Before CUDA 12.0 there is no cuLaunchKernelEx: the launch goes through cuLaunchKernel,
    which starts it once the launch before has ended (always correct)."""
    class OldDriver(StubLib):
        def __getattr__(self, name):
            if name == "cuLaunchKernelEx":
                raise AttributeError(name)
            return super().__getattr__(name)
    lib = use_stub(monkeypatch, cuda, OldDriver())
    driver = cuda.CudaDriver()
    function = driver.get_function(driver.load_module(0, b"image"), "zyfa_fwd")
    driver.launch(function, (1, 1, 1), (128, 1, 1), 0, 0, b"\0" * 8, dependent=True)
    assert lib.calls[-1] == "cuLaunchKernel"


@pytest.mark.parametrize("module, cls, names", [
    (cuda, "CudaDriver", ("cuMemHostAlloc", "cuMemFreeHost", "cuMemcpyHtoDAsync_v2", "cuStreamIsCapturing")),
    (hip, "HipDriver", ("hipHostMalloc", "hipHostFree", "hipMemcpyHtoDAsync", "hipStreamIsCapturing")),
])
def test_page_locked_memory_queued_copies_and_capture_status(monkeypatch, module, cls, names):
    """What staging.py asks of a GPU driver: portable page-locked memory, a copy queued on the
    given stream, and whether a stream is being captured."""
    ffi = module.ffi
    as_int = lambda x: x if isinstance(x, int) else int(ffi.cast("uintptr_t", x))  # noqa: E731
    buf, seen = ffi.new("char[64]"), {}

    def alloc(out, size, flags):
        seen["alloc"] = (size, flags)
        out[0] = buf
        return 0

    def free(p):
        seen["free"] = as_int(p)
        return 0

    def copy(dst, src, n, stream):
        seen["copy"] = (as_int(dst), as_int(src), n, as_int(stream))
        return 0

    def capturing(stream, status):
        status[0] = 1 if as_int(stream) == 7 else 0     # ACTIVE on stream 7, NONE elsewhere
        return 0
    use_stub(monkeypatch, module, StubLib(**dict(zip(names, (alloc, free, copy, capturing)))))
    driver = getattr(module, cls)()
    ptr = driver.host_alloc(0, 100)
    assert ptr == as_int(buf) and seen["alloc"] == (100, 1)       # 1: portable to every context
    driver.copy_htod_async(0x5000, ptr, 24, 0x77)
    assert seen["copy"] == (0x5000, ptr, 24, 0x77)
    driver.host_free(ptr)
    assert seen["free"] == ptr
    assert driver.stream_capturing(7) and not driver.stream_capturing(8)


@pytest.mark.parametrize("module, cls, copy, sync", [
    (cuda, "CudaDriver", "cuMemcpyHtoD_v2", "cuStreamSynchronize"),
    (hip, "HipDriver", "hipMemcpyHtoD", "hipStreamSynchronize"),
])
def test_a_plain_copy_to_the_device_has_landed_when_it_returns(monkeypatch, module, cls, copy, sync):
    """From pageable memory a plain copy returns once its bytes are staged, its DMA on the legacy
    stream, which work on a non-blocking stream does not wait for: the one-off constants (the
    default descale, the captured counters' pool) would race the first kernel reading them.  The
    driver waits for the legacy stream before returning."""
    ffi = module.ffi
    streams = []
    lib = use_stub(monkeypatch, module, StubLib(**{
        sync: lambda stream: streams.append(int(ffi.cast("uintptr_t", stream))) or 0}))
    getattr(module, cls)().copy_htod(0x5000, memoryview(bytes(16)))
    assert lib.calls[-2:] == [copy, sync] and streams == [0]


def test_cuda_param_info(monkeypatch):
    def info(f, i, off, size):
        if i >= 3:
            return cuda.CUDA_ERROR_INVALID_VALUE
        off[0], size[0] = 8 * i, 8
        return 0
    use_stub(monkeypatch, cuda, StubLib(cuFuncGetParamInfo=info))
    driver = cuda.CudaDriver()
    function = driver.get_function(driver.load_module(0, b"image"), "k")
    assert driver.param_info(function) == [(0, 8), (8, 8), (16, 8)]


def test_cuda_set_max_dynamic_shared(monkeypatch):
    seen = []
    use_stub(monkeypatch, cuda, StubLib(cuFuncSetAttribute=lambda f, a, v: seen.append((a, v)) or 0))
    driver = cuda.CudaDriver()
    driver.set_max_dynamic_shared(driver.get_function(driver.load_module(0, b"i"), "k"), 100_000)
    assert seen == [(8, 100_000)]


# -- device queries through stand-ins -----------------------------------------------------

def test_cuda_arch_and_attributes(monkeypatch):
    values = {75: 9, 76: 0, 16: 132, 97: 232448}

    def attr(out, a, dev):
        out[0] = values[a]
        return 0
    use_stub(monkeypatch, cuda, StubLib(cuDeviceGetAttribute=attr))
    driver = cuda.CudaDriver()
    assert driver.arch(0) == "sm_90a"
    assert driver.attribute(0, "multiprocessor_count") == 132
    assert driver.attribute(0, "max_shared_memory_per_block_optin") == 232448
    with pytest.raises(ZyfaError, match="unknown device attribute"):
        driver.attribute(0, "bogus")
    assert cuda.arch_name(8, 9) == "sm_89" and cuda.arch_name(10, 0) == "sm_100"


def test_cuda_pointer_info(monkeypatch):
    def get(data, attribute, ptr):
        if ptr == 0x1000:
            return cuda.CUDA_ERROR_INVALID_VALUE
        if attribute == cuda.CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            data[0] = cuda.CU_MEMORYTYPE_HOST if ptr == 0x2000 else cuda.CU_MEMORYTYPE_DEVICE
        else:
            data[0] = 3
        return 0
    lib = use_stub(monkeypatch, cuda, StubLib(cuPointerGetAttribute=get))
    driver = cuda.CudaDriver()
    assert driver.pointer_info(0x1000) == ("cpu", 0)
    assert driver.pointer_info(0x2000) == ("cpu", 0)
    assert driver.pointer_info(0x3000) == ("cuda", 3)
    assert driver.pointer_info(0) is None
    assert "cuCtxSetCurrent" in lib.calls     # a context is made current before the query


def test_hip_arch_name_and_pointer_info(monkeypatch):
    def props(buf, dev):
        hip.ffi.memmove(buf, b"AMD Instinct MI355X\0", 20)
        gcn = b"gfx950:sramecc+:xnack-\0"
        hip.ffi.memmove(buf + 1160, gcn, len(gcn))
        return 0

    def attrs(buf, ptr):
        p = int(hip.ffi.cast("uintptr_t", ptr))
        fields = hip.ffi.cast("int *", buf)
        fields[0], fields[1] = {0x1000: (0, -1), 0x2000: (1, 0), 0x3000: (2, 1), 0x4000: (3, 0)}[p]
        return 0
    use_stub(monkeypatch, hip, StubLib(hipGetDevicePropertiesR0600=props,
                                       hipPointerGetAttributes=attrs))
    driver = hip.HipDriver()
    assert driver.arch(0) == "gfx950"
    assert driver.device_name(0) == "AMD Instinct MI355X"
    assert [driver.pointer_info(p) for p in (0x1000, 0x2000, 0x3000, 0x4000)] == [
        ("cpu", 0), ("cpu", 0), ("rocm", 1), ("rocm", 0)]
    assert hip.decode_version(70253211) == "7.2.53211"


def test_hip_dynamic_shared_zero_is_noop(monkeypatch):
    lib = use_stub(monkeypatch, hip, StubLib())
    driver = hip.HipDriver()
    f = driver.get_function(driver.load_module(0, b"i"), "k")
    driver.set_max_dynamic_shared(f, 0)
    assert "hipFuncSetAttribute" not in lib.calls
    driver.set_max_dynamic_shared(f, 65536)
    assert "hipFuncSetAttribute" in lib.calls


# -- missing libraries --------------------------------------------------------------------

def test_import_does_not_open_libraries():
    code = ("import zyfa_runtime.driver as d, zyfa_runtime.driver.cuda as c, zyfa_runtime.driver.hip as h;"
            "assert c._library._lib is None and h._library._lib is None")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


@pytest.mark.parametrize("module, cls, sonames", [
    (cuda, "CudaDriver", ["libcuda.so.1", "libcuda.so"]),
    (hip, "HipDriver", ["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so"]),
])
def test_missing_library_is_a_zyfa_error(monkeypatch, module, cls, sonames):
    without_library(monkeypatch, module)
    driver = getattr(module, cls)()
    for use in (driver.device_count, lambda: driver.alloc(0, 16)):
        with pytest.raises(ZyfaError) as info:
            use()
        assert not isinstance(info.value, OSError)
        for s in sonames:
            assert s in str(info.value)
        assert "Install" in str(info.value)


def _loadable(module) -> bool:
    for s in module.SONAMES:
        try:
            module.ffi.dlopen(s)
            return True
        except OSError:
            pass
    return False


@pytest.mark.parametrize("module, cls", [(cuda, "CudaDriver"), (hip, "HipDriver")])
def test_real_backends_without_gpu_raise_zyfa_error(module, cls):
    if _loadable(module):
        pytest.skip("the vendor library is installed here")
    with pytest.raises(ZyfaError, match=module.SONAMES[0]):
        getattr(module, cls)().device_count()


# -- backend choice -----------------------------------------------------------------------

def test_get_driver_honours_env(monkeypatch):
    monkeypatch.setenv(drv.BACKEND_ENV, "fake")
    d = drv.get_driver()
    assert isinstance(d, fake.FakeDriver) and d.name == "fake"
    assert drv.get_driver() is d
    monkeypatch.setenv("ZYFA_FAKE_ARCH", "gfx950")
    drv._reset()
    assert drv.get_driver().arch(0) == "gfx950"


def test_get_driver_explicit_name_and_unknown(monkeypatch):
    assert isinstance(drv.get_driver("fake"), fake.FakeDriver)
    assert isinstance(drv.get_driver("cuda"), cuda.CudaDriver)     # lazy: no library needed yet
    with pytest.raises(ZyfaError, match="unknown backend"):
        drv.get_driver("metal")
    monkeypatch.setenv(drv.BACKEND_ENV, "hip")
    assert isinstance(drv.get_driver(), hip.HipDriver)


def test_get_driver_emulator_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "zyfa_emulator", None)
    monkeypatch.setitem(sys.modules, "zyfa_emulator.driver", None)
    with pytest.raises(ZyfaError, match="zyfa_emulator"):
        drv.get_driver("emulator")


def test_get_driver_auto_none_usable(monkeypatch):
    without_library(monkeypatch, cuda)
    without_library(monkeypatch, hip)
    with pytest.raises(ZyfaError) as info:
        drv.get_driver()
    msg = str(info.value)
    assert "cuda:" in msg and "hip:" in msg and "libcuda.so.1" in msg and "libamdhip64.so.7" in msg


def _count(n):
    def get(out):
        out[0] = n
        return 0
    return get


def test_no_device_counts_zero(monkeypatch):
    use_stub(monkeypatch, cuda, StubLib(cuInit=lambda flags: cuda.CUDA_ERROR_NO_DEVICE))
    use_stub(monkeypatch, hip, StubLib(hipInit=lambda flags: hip.HIP_ERROR_NO_DEVICE))
    assert cuda.CudaDriver().device_count() == 0
    assert hip.HipDriver().device_count() == 0
    with pytest.raises(ZyfaError, match="no GPU backend is usable.*sees no device"):
        drv.get_driver()


def test_get_driver_auto_prefers_cuda_then_hip(monkeypatch):
    use_stub(monkeypatch, cuda, StubLib(cuDeviceGetCount=_count(1)))
    use_stub(monkeypatch, hip, StubLib(hipGetDeviceCount=_count(1)))
    assert isinstance(drv.get_driver(), cuda.CudaDriver)
    drv._reset()
    use_stub(monkeypatch, cuda, StubLib(cuDeviceGetCount=_count(0)))
    assert isinstance(drv.get_driver(), hip.HipDriver)


# -- the fake backend ---------------------------------------------------------------------

def test_fake_records_launches():
    d = fake.FakeDriver()
    assert d.host_memory_is_device and d.arch(0) == "sm_90a"
    module = d.load_module(0, b"\x7fELF cubin bytes")
    assert module.handle == b"\x7fELF cubin bytes" and d.modules == [module]
    f = d.get_function(module, "zyfa_fwd_sm_90a_bf16_d128x128_full")
    d.set_max_dynamic_shared(f, 73728)
    args = struct.pack("<7Q12q2q5if", *range(7), *range(12), 0, 0, 2, 16, 4, 512, 512, 0.125)
    d.launch(f, (8, 16, 2), (128, 1, 1), 73728, 0, args)
    rec = d.launches[-1]
    assert rec == fake.Launch(symbol=f.symbol, grid=(8, 16, 2), block=(128, 1, 1), shared=73728,
                              stream=0, args=args, device=0)
    assert d.max_dynamic_shared[f.symbol] == 73728


def test_fake_memory_and_events():
    d = fake.FakeDriver(arch="gfx950", devices=2)
    assert d.arch(1) == "gfx950" and d.attribute(0, "warp_size") == 64
    host = np.arange(64, dtype=np.float32)
    ptr = d.alloc(1, host.nbytes)
    d.copy_htod(ptr, host)
    back = np.empty_like(host)
    d.copy_dtoh(back, ptr)
    assert np.array_equal(back, host)
    d.memset_d8(ptr, 0xFF, 8)
    raw = bytearray(16)
    d.copy_dtoh(raw, ptr)
    assert raw[:8] == b"\xff" * 8 and raw[8:] == host.tobytes()[8:16]
    assert d.pointer_info(ptr) == ("cpu", 0)
    d.free(ptr)
    with pytest.raises(ZyfaError):
        d.free(ptr)
    with pytest.raises(ZyfaError):
        d.copy_dtoh(b"read-only", ptr)
    with pytest.raises(ZyfaError):
        d.arch(2)
    a, b = d.event_create(), d.event_create()
    d.event_record(a)
    d.event_record(b)
    d.event_synchronize(b)
    assert d.event_elapsed_ms(a, b) >= 0.0
    d.event_destroy(a)
    d.event_destroy(b)


@pytest.mark.parametrize("module,cls,names", [
    (cuda, "CudaDriver", ("cuMemAllocAsync", "cuMemFreeAsync", "cuMemsetD8Async", "cuMemsetD32Async",
                          "cuThreadExchangeStreamCaptureMode")),
    (hip, "HipDriver", ("hipMallocAsync", "hipFreeAsync", "hipMemsetD8Async", "hipMemsetD32Async",
                        "hipThreadExchangeStreamCaptureMode")),
])
def test_stream_ordered_memory_and_the_relaxed_capture_mode(monkeypatch, module, cls, names):
    """What a captured call asks of a GPU driver: allocation, memsets and free queued on the
    given stream (a graph's memory nodes when captured), and the thread's capture mode relaxed
    around a module load, then put back as it was."""
    ffi = module.ffi
    as_int = lambda x: x if isinstance(x, int) else int(ffi.cast("uintptr_t", x))  # noqa: E731
    seen, modes = [], [1]      # the thread's mode before: thread-local (1)

    def alloc(out, size, stream):
        out[0] = ffi.cast("void *", 0x7000) if module is hip else 0x7000
        seen.append(("alloc", size, as_int(stream)))
        return 0

    def free(p, stream):
        seen.append(("free", as_int(p), as_int(stream)))
        return 0

    def memset8(p, value, n, stream):
        seen.append(("memset8", as_int(p), value, n, as_int(stream)))
        return 0

    def memset32(p, value, n, stream):
        seen.append(("memset32", as_int(p), value & 0xFFFFFFFF, n, as_int(stream)))
        return 0

    def exchange(mode):
        mode[0], modes[0] = modes[0], mode[0]
        seen.append(("mode", modes[0]))
        return 0
    use_stub(monkeypatch, module, StubLib(**dict(zip(names, (alloc, free, memset8, memset32, exchange)))))
    driver = getattr(module, cls)()
    ptr = driver.alloc_async(0, 96, 0x55)
    driver.memset_d8_async(ptr, 0, 8, 0x55)
    driver.memset_d32_async(ptr + 16, 0x3F800000, 1, 0x55)
    driver.free_async(ptr, 0x55)
    with driver.relaxed_capture():
        assert modes[0] == 2                                   # relaxed meanwhile
    assert modes[0] == 1
    assert seen == [("alloc", 96, 0x55), ("memset8", 0x7000, 0, 8, 0x55), ("memset32", 0x7010, 0x3F800000, 1, 0x55),
                    ("free", 0x7000, 0x55), ("mode", 2), ("mode", 1)]


def test_the_fake_refuses_what_a_capture_forbids_and_records_stream_operations():
    f = fake.FakeDriver(discrete=True)
    a = f.alloc(0, 64)
    f.capturing.add(3)
    for call in (lambda: f.alloc(0, 8), lambda: f.free(a), lambda: f.memset_d8(a, 0, 8), lambda: f.synchronize(0),
                 lambda: f.copy_htod(a, bytes(8)), lambda: f.copy_dtoh(bytearray(8), a),
                 lambda: f.load_module(0, b"x"), lambda: f.host_alloc(0, 8)):
        with pytest.raises(ZyfaError, match="CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"):
            call()
    with f.relaxed_capture():
        f.load_module(0, b"x")
    b = f.alloc_async(0, 32, 3)
    f.memset_d8_async(b, 0, 8, 3)
    f.memset_d32_async(b + 8, 0x3F800000, 2, 3)
    assert np.frombuffer(f.buffer(b)[8:16].tobytes(), np.float32).tolist() == [1.0, 1.0]
    f.free_async(b, 3)
    assert f.ops == [("alloc_async", b, 32, 3), ("memset_async", b, 0, 8, 3), ("memset_async", b + 8, 0x3F800000, 8, 3),
                     ("free_async", b, 3)]
    f.capture_mode = "relaxed"
    f.free(f.alloc(0, 8))
