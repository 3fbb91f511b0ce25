"""The emulator as a driver backend: the Driver interface, code-object loading, the
initial wave state of a dispatch (checked with HIP kernels compiled here), and errors
that name the faulting instruction."""

import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from emukit import toolchain

import zyfa_runtime.driver as drv
from zyfa_emulator import EmulatorError
from zyfa_emulator.driver import EmulatorDriver
from zyfa_runtime.errors import CodeObjectError, ZyfaError

PROBES = r"""
#define __global__ __attribute__((global))
typedef unsigned short u16;

extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 1024)))
void ids(int* out, int gx, int gy, int bdx, int bdy, int bdz) {
  const int tx = __builtin_amdgcn_workitem_id_x(), ty = __builtin_amdgcn_workitem_id_y(),
            tz = __builtin_amdgcn_workitem_id_z();
  const int bx = __builtin_amdgcn_workgroup_id_x(), by = __builtin_amdgcn_workgroup_id_y(),
            bz = __builtin_amdgcn_workgroup_id_z();
  const long i = ((long)((bz * gy + by) * gx + bx) * (bdx * bdy * bdz) + (tz * bdy + ty) * bdx + tx) * 4;
  out[i] = tx; out[i + 1] = ty; out[i + 2] = tz; out[i + 3] = bx | by << 8 | bz << 16;
}

extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 256)))
void packet(int* out) {
  const u16* p = (const u16*)__builtin_amdgcn_dispatch_ptr();
  if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0) {
    out[0] = p[2]; out[1] = p[3]; out[2] = p[4];
    out[3] = ((const unsigned*)p)[3]; out[4] = ((const unsigned*)p)[4];
  }
}

extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 256)))
void reverse(const float* in, float* out, int n) {
  __attribute__((shared)) float tile[256];
  const int t = __builtin_amdgcn_workitem_id_x();
  const int base = __builtin_amdgcn_workgroup_id_x() * 256;
  tile[t] = base + t < n ? in[base + t] : 0.f;
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
  if (base + t < n) out[base + t] = tile[255 - t] * 2.f;
}

extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, 64)))
void wild(float* out, long offset) {
  out[offset + __builtin_amdgcn_workitem_id_x()] = 1.f;
}
"""


@pytest.fixture(scope="module")
def probes():
    tc = toolchain()
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "probes.hsaco"
        tc.compile_cxx(PROBES, out)
        return out.read_bytes()


@pytest.fixture
def driver():
    return EmulatorDriver()


def args(*vals) -> bytes:
    out = b""
    for v in vals:
        if isinstance(v, tuple):        # (format, value)
            fmt, v = v
        else:
            fmt = "<Q"
        if len(out) % struct.calcsize(fmt):
            out += b"\0" * (-len(out) % struct.calcsize(fmt))
        out += struct.pack(fmt, v)
    return out


def kernarg(fn, driver, *vals) -> bytes:
    size = fn.handle.kernarg_segment_size
    raw = args(*vals)
    return raw + b"\0" * (size - len(raw))


def test_backend_selection(monkeypatch):
    monkeypatch.setenv(drv.BACKEND_ENV, "emulator")
    drv._reset()
    try:
        d = drv.get_driver()
        assert isinstance(d, EmulatorDriver) and d.name == "emulator"
    finally:
        drv._reset()


def test_device_queries(driver):
    assert driver.device_count() == 1 and driver.arch(0) == "gfx950"
    assert driver.device_name(0) == "zyfa gfx950 emulator"
    assert driver.host_memory_is_device
    assert driver.attribute(0, "warp_size") == 64
    assert driver.attribute(0, "max_shared_memory_per_block_optin") == 160 * 1024
    assert driver.pointer_info(1234) == ("cpu", 0)
    assert "zyfa emulator" in driver.versions()["driver"]
    with pytest.raises(ZyfaError):
        driver.arch(1)
    with pytest.raises(ZyfaError):
        driver.attribute(0, "nonsense")


def test_memory(driver):
    p = driver.alloc(0, 100)
    assert p % 256 == 0
    host = np.arange(100, dtype=np.uint8)
    driver.copy_htod(p, memoryview(host))
    back = np.zeros(100, np.uint8)
    driver.copy_dtoh(memoryview(back), p)
    assert np.array_equal(back, host)
    driver.memset_d8(p, 7, 10)
    driver.copy_dtoh(memoryview(back), p)
    assert (back[:10] == 7).all() and back[10] == 10
    with pytest.raises(ZyfaError, match="not inside an allocation"):
        driver.copy_htod(p + 90, memoryview(host[:20]))
    driver.free(p)
    with pytest.raises(ZyfaError):
        driver.free(p)


def test_events(driver):
    a, b = driver.event_create(), driver.event_create()
    driver.event_record(a)
    driver.event_record(b)
    driver.event_synchronize(b)
    assert driver.event_elapsed_ms(a, b) >= 0
    assert driver.instructions_between(a, b) == 0
    driver.event_destroy(a)
    with pytest.raises(ZyfaError):
        driver.event_elapsed_ms(a, b)


def test_load_module_rejects_bad_images(driver, probes):
    with pytest.raises(CodeObjectError):
        driver.load_module(0, b"not an elf")
    flags = struct.unpack_from("<I", probes, 48)[0]
    as_gfx942 = probes[:48] + struct.pack("<I", (flags & ~0xFF) | 0x4C) + probes[52:]
    with pytest.raises(CodeObjectError, match="not gfx950"):
        driver.load_module(0, as_gfx942)
    with pytest.raises(CodeObjectError):
        driver.load_module(0, probes[:len(probes) // 2])
    module = driver.load_module(0, probes)
    with pytest.raises(ZyfaError, match="no kernel"):
        driver.get_function(module, "missing")


@pytest.mark.parametrize("grid,block", [((2, 3, 1), (5, 3, 2)), ((1, 1, 2), (20, 4, 1)),
                                        ((3, 1, 1), (64, 1, 1))])
def test_initial_ids(driver, probes, grid, block):
    fn = driver.get_function(driver.load_module(0, probes), "ids")
    nthreads = np.prod(grid) * np.prod(block)
    out = driver.alloc(0, 16 * nthreads)
    driver.launch(fn, grid, block, 0, 0, kernarg(fn, driver, out, ("<i", grid[0]), ("<i", grid[1]),
                                                 ("<i", block[0]), ("<i", block[1]),
                                                 ("<i", block[2])))
    got = np.zeros((nthreads, 4), np.int32)
    driver.copy_dtoh(memoryview(got.view(np.uint8).reshape(-1)), out)
    expect = []
    for bz in range(grid[2]):
        for by in range(grid[1]):
            for bx in range(grid[0]):
                for tz in range(block[2]):
                    for ty in range(block[1]):
                        for tx in range(block[0]):
                            expect.append((tx, ty, tz, bx | by << 8 | bz << 16))
    assert np.array_equal(got, np.array(expect))


def test_dispatch_packet(driver, probes):
    fn = driver.get_function(driver.load_module(0, probes), "packet")
    out = driver.alloc(0, 20)
    driver.launch(fn, (3, 1, 1), (32, 1, 1), 0, 0, kernarg(fn, driver, out))
    got = np.zeros(5, np.uint32)
    driver.copy_dtoh(memoryview(got.view(np.uint8)), out)
    assert list(got) == [32, 1, 1, 96, 1]        # workgroup size x/y/z, grid size x/y


def test_lds_and_barrier(driver, probes):
    fn = driver.get_function(driver.load_module(0, probes), "reverse")
    n = 600
    x = np.arange(n, dtype=np.float32)
    src, dst = driver.alloc(0, 4 * n), driver.alloc(0, 4 * n)
    driver.copy_htod(src, memoryview(x.view(np.uint8)))
    a, b = driver.event_create(), driver.event_create()
    driver.event_record(a)
    driver.launch(fn, (3, 1, 1), (256, 1, 1), 0, 0, kernarg(fn, driver, src, dst, ("<i", n)))
    driver.event_record(b)
    assert driver.instructions_between(a, b) > 3 * 4 * 5
    got = np.zeros(n, np.float32)
    driver.copy_dtoh(memoryview(got.view(np.uint8)), dst)
    idx = np.arange(n)
    base, t = idx // 256 * 256, idx % 256
    partner = base + 255 - t
    assert np.array_equal(got, np.where(partner < n, 2 * partner, 0).astype(np.float32))


def test_wild_store_names_the_instruction(driver, probes):
    fn = driver.get_function(driver.load_module(0, probes), "wild")
    out = driver.alloc(0, 256)
    driver.launch(fn, (1, 1, 1), (64, 1, 1), 0, 0, kernarg(fn, driver, out, ("<q", 0)))
    # the address is the code object's (as llvm-objdump prints it) and the kernel offset
    with pytest.raises(EmulatorError, match=r"global_store_dword .* at 0x[0-9a-f]+ <wild\+0x[0-9a-f]+> "
                                            r"\(wave 0 of workgroup \(0, 0, 0\)\): lane \d+, "
                                            r"address .*\(out \+ \d+\)"):
        driver.launch(fn, (1, 1, 1), (64, 1, 1), 0, 0, kernarg(fn, driver, out, ("<q", 1000)))


def test_launch_checks(driver, probes):
    fn = driver.get_function(driver.load_module(0, probes), "wild")
    out = driver.alloc(0, 256)
    good = kernarg(fn, driver, out, ("<q", 0))
    with pytest.raises(ZyfaError, match="exceeds"):
        driver.launch(fn, (1, 1, 1), (128, 1, 1), 0, 0, good)
    with pytest.raises(ZyfaError, match="bytes of kernel arguments"):
        driver.launch(fn, (1, 1, 1), (64, 1, 1), 0, 0, good[:8])
    with pytest.raises(ZyfaError):
        driver.launch(fn, (0, 1, 1), (64, 1, 1), 0, 0, good)


def test_registered_host_arrays_have_exact_bounds(probes):
    d = EmulatorDriver(host_fallback=False)
    fn = d.get_function(d.load_module(0, probes), "wild")
    host = np.zeros(64, np.float32)
    with pytest.raises(EmulatorError, match="outside every known allocation"):
        d.launch(fn, (1, 1, 1), (64, 1, 1), 0, 0, kernarg(fn, d, host.ctypes.data, ("<q", 0)))
    d.register_host(host, "host out")
    d.launch(fn, (1, 1, 1), (64, 1, 1), 0, 0, kernarg(fn, d, host.ctypes.data, ("<q", 0)))
    assert (host == 1).all()
    with pytest.raises(EmulatorError, match="host out"):
        d.launch(fn, (1, 1, 1), (64, 1, 1), 0, 0, kernarg(fn, d, host.ctypes.data, ("<q", 8)))
    d.unregister_host(host)


def test_unregistered_host_memory_through_a_kernel_argument(driver, probes):
    fn = driver.get_function(driver.load_module(0, probes), "wild")
    host = np.zeros(64, np.float32)
    driver.launch(fn, (1, 1, 1), (64, 1, 1), 0, 0, kernarg(fn, driver, host.ctypes.data, ("<q", 0)))
    assert (host == 1).all()
    with pytest.raises(EmulatorError, match="outside every known allocation"):
        driver.launch(fn, (1, 1, 1), (64, 1, 1), 0, 0,
                      kernarg(fn, driver, host.ctypes.data, ("<q", -64)))


def test_param_info(driver, probes):
    fn = driver.get_function(driver.load_module(0, probes), "ids")
    assert driver.param_info(fn) == [(0, 8), (8, 4), (12, 4), (16, 4), (20, 4), (24, 4)]
