"""Code-object readers, checked on objects compiled here, and the gfx950 BF16 kernels."""

import random
import struct

import pytest

from generator import codeobject, kernel_source
from generator.codeobject import amdgpu_kernels, amdgpu_target, cubin_kernels, msgpack_loads
from tests.test_toolchain import toolchain_or_skip
from zyfa_runtime.catalogue import all_variants, kernarg_size, kernargs

# A kernel whose argument layout is known: (offset, size) by natural alignment.
HIP_PROBE = """
#define __global__ __attribute__((global))
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(128, 128)))
void probe(const void* a, long long b, int c, float d, const void* e, short f, double g) {
  __attribute__((shared)) float tile[300];
  const int i = __builtin_amdgcn_workitem_id_x();
  tile[i] = c * d + f + g;
  __builtin_amdgcn_s_barrier();
  ((float*)e)[i] = tile[299 - i] + b + ((const float*)a)[i];
}
"""
HIP_PROBE_ARGS = [(0, 8), (8, 8), (16, 4), (20, 4), (24, 8), (32, 2), (40, 8)]

CUDA_PROBE = """
extern "C" __global__ void __launch_bounds__(128, 1)
probe(const void* a, char b, long long c, int d, float e, short f, void* g, double h) {
  __shared__ float tile[300];
  const int i = threadIdx.x;
  tile[i] = e * d + b + f;
  __syncthreads();
  ((float*)g)[i] = tile[127 - i] + c + ((const float*)a)[i] + h;
}
extern "C" __global__ void tiny(int n, float* out) { out[threadIdx.x] = n; }
"""
CUDA_PROBE_PARAMS = [(0, 8), (8, 1), (16, 8), (24, 4), (28, 4), (32, 2), (40, 8), (48, 8)]


@pytest.fixture(scope="module")
def hsaco(tmp_path_factory):
    out = tmp_path_factory.mktemp("hip") / "probe.hsaco"
    toolchain_or_skip("gfx950").compile_cxx(HIP_PROBE, out)
    return out.read_bytes()


@pytest.fixture(scope="module")
def cubin(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda") / "probe.cubin"
    toolchain_or_skip("sm_90a").compile_cxx(CUDA_PROBE, out)
    return out.read_bytes()


# --------------------------------------------------------------------------------------
# msgpack

@pytest.mark.parametrize("raw,value", [
    (b"\x05", 5), (b"\xff", -1), (b"\xcc\xc8", 200), (b"\xcd\x01\x00", 256),
    (b"\xce\x00\x01\x00\x00", 65536), (b"\xcf" + (1 << 40).to_bytes(8, "big"), 1 << 40),
    (b"\xd0\x80", -128), (b"\xd1\xff\x00", -256), (b"\xd2\xff\xff\xff\xfe", -2),
    (b"\xd3" + (-(1 << 40)).to_bytes(8, "big", signed=True), -(1 << 40)),
    (b"\xc0", None), (b"\xc2", False), (b"\xc3", True),
    (b"\xca" + struct.pack(">f", 1.5), 1.5), (b"\xcb" + struct.pack(">d", -2.25), -2.25),
    (b"\xa3abc", "abc"), (b"\xd9\x02hi", "hi"), (b"\xda\x00\x01x", "x"),
    (b"\xc4\x02\x01\x02", b"\x01\x02"),
    (b"\x92\x01\xa1z", [1, "z"]), (b"\xdc\x00\x01\xc3", [True]),
    (b"\x82\xa1a\x01\xa1b\x90", {"a": 1, "b": []}), (b"\xde\x00\x01\x01\x02", {1: 2}),
])
def test_msgpack_values(raw, value):
    assert msgpack_loads(raw) == value


@pytest.mark.parametrize("raw", [b"", b"\xa3ab", b"\x92\x01", b"\xc1", b"\xd4\x00\x00",
                                 b"\x01\x02", b"\x81\x91\x01\x02", b"\xa1\xff",
                                 b"\xdd\xff\xff\xff\xff"])
def test_msgpack_rejects_malformed(raw):
    with pytest.raises(ValueError):
        msgpack_loads(raw)


# --------------------------------------------------------------------------------------
# AMDGPU

def test_hsaco_metadata_matches_the_source(hsaco):
    kernels = amdgpu_kernels(hsaco)
    assert set(kernels) == {"probe"}
    k = kernels["probe"]
    explicit = k["args"][:len(HIP_PROBE_ARGS)]
    assert [(a["offset"], a["size"]) for a in explicit] == HIP_PROBE_ARGS
    assert all(a["value_kind"].startswith("hidden_") for a in k["args"][len(HIP_PROBE_ARGS):])
    kinds = [a["value_kind"] for a in explicit]
    assert kinds == ["global_buffer", "by_value", "by_value", "by_value", "global_buffer",
                     "by_value", "by_value"]
    assert [a["name"] for a in explicit][1:4] == ["b", "c", "d"]
    assert k["kernarg_segment_size"] >= 48
    assert k["group_segment_fixed_size"] == 4 * 300
    assert k["private_segment_fixed_size"] == 0
    assert k["wavefront_size"] == 64 and k["max_flat_workgroup_size"] == 128
    assert k["sgpr_count"] > 0 and k["vgpr_count"] > 0 and k["agpr_count"] == 0
    assert amdgpu_target(hsaco) == "amdgcn-amd-amdhsa--gfx950"


def test_amdgpu_target_checks_the_elf_header(hsaco):
    flags = struct.unpack_from("<I", hsaco, 48)[0]
    as_gfx942 = hsaco[:48] + struct.pack("<I", (flags & ~0xff) | 0x4c) + hsaco[52:]
    with pytest.raises(ValueError, match="disagrees"):
        amdgpu_target(as_gfx942)
    xnack_on = hsaco[:48] + struct.pack("<I", flags | 0x300) + hsaco[52:]
    with pytest.raises(ValueError, match="xnack"):
        amdgpu_target(xnack_on)


def test_readers_reject_the_other_vendor(hsaco, cubin):
    with pytest.raises(ValueError):
        cubin_kernels(hsaco)
    with pytest.raises(ValueError):
        amdgpu_kernels(cubin)


# --------------------------------------------------------------------------------------
# cubin

def test_cubin_params_match_the_source(cubin):
    kernels = cubin_kernels(cubin)
    assert set(kernels) == {"probe", "tiny"}
    k = kernels["probe"]
    assert [(p["offset"], p["size"]) for p in k["params"]] == CUDA_PROBE_PARAMS
    assert [p["ordinal"] for p in k["params"]] == list(range(8))
    assert k["param_size"] == 56
    assert k["shared_static"] == 4 * 300
    assert 0 < k["registers"] <= 255
    assert k["local_bytes"] == 0
    assert k["max_threads"] == [128, 1, 1]
    assert k["arch"] == "sm_90a" and codeobject.cubin_arch(cubin) == "sm_90a"
    t = kernels["tiny"]
    assert [(p["offset"], p["size"]) for p in t["params"]] == [(0, 4), (8, 8)]
    assert t["param_size"] == 16 and t["shared_static"] == 0


# --------------------------------------------------------------------------------------
# Malformed input is a ValueError, whatever is wrong with it

@pytest.mark.parametrize("reader", [amdgpu_kernels, amdgpu_target, cubin_kernels,
                                    codeobject.cubin_arch])
@pytest.mark.parametrize("raw", [b"", b"\x7fELF", b"not an elf at all" * 8, bytes(64)])
def test_garbage_is_a_value_error(reader, raw):
    with pytest.raises(ValueError):
        reader(raw)


@pytest.mark.parametrize("which", ["hsaco", "cubin"])
def test_damaged_objects_raise_value_error_only(which, request):
    data = request.getfixturevalue(which)
    readers = ([amdgpu_kernels, amdgpu_target] if which == "hsaco"
               else [cubin_kernels, codeobject.cubin_arch])
    rng = random.Random(1234)
    cases = [data[:n] for n in (16, 63, 64, 200, len(data) // 2, len(data) - 1)]
    for _ in range(150):
        b = bytearray(data)
        for _ in range(rng.randrange(1, 12)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cases.append(bytes(b))
    for case in cases:
        for reader in readers:
            try:
                reader(case)
            except ValueError:
                pass


# --------------------------------------------------------------------------------------
# The catalogue's gfx950 BF16 kernels: compile, and agree with the catalogue

#: d192/128 and d256 in the slow run (each compiles in about 2 s; their layouts are the same code's).
GFX950_BF16 = [pytest.param(v, marks=pytest.mark.slow) if v.d_qk > 128 else v
               for v in all_variants() if v.arch == "gfx950" and v.dtype == "bf16"]


@pytest.fixture(scope="module")
def gfx950_images(tmp_path_factory):
    """name -> code object, compiled once per module (about 2 s each)."""
    tc = toolchain_or_skip("gfx950")
    out_dir, images = tmp_path_factory.mktemp("gfx950"), {}

    def get(v):
        if v.name not in images:
            out = out_dir / v.filename
            tc.compile_cxx(kernel_source.emit(v), out)
            images[v.name] = out.read_bytes()
        return images[v.name]
    return get


@pytest.mark.parametrize("v", GFX950_BF16, ids=lambda v: v.name)
def test_gfx950_bf16_kernel_matches_the_catalogue(v, gfx950_images):
    image = gfx950_images(v)
    assert amdgpu_target(image) == "amdgcn-amd-amdhsa--gfx950"
    k = amdgpu_kernels(image)[v.symbol]
    expected = kernargs(v)
    got = [(a["offset"], a["size"]) for a in k["args"][:len(expected)]]
    assert got == [(a.offset, a.size) for a in expected]
    assert all(a["value_kind"].startswith("hidden_") for a in k["args"][len(expected):])
    assert k["kernarg_segment_size"] >= kernarg_size(expected)
    assert 0 < k["group_segment_fixed_size"] <= 160 * 1024
    assert k["private_segment_fixed_size"] == 0, "the kernel spills to scratch"
    assert k.get("vgpr_spill_count", 0) == 0 and k.get("sgpr_spill_count", 0) == 0
    assert k["wavefront_size"] == 64
    assert k["max_flat_workgroup_size"] == v.tile.threads == 512     # 8 waves, two a SIMD
    assert k["vgpr_count"] + k["agpr_count"] <= 256                  # two waves share a SIMD's 512


def _wgmma_probe(read_in_flight: bool) -> str:
    """A loop of m64n8k16 WGMMAs, each waited for; with ``read_in_flight`` the first
    iteration also reads the accumulator between the WGMMA and its wait."""
    from generator.kernel_source import _wgmma
    read = "    if (i == 0) out[threadIdx.x + 128] = d[1];\n" if read_in_flight else ""
    return ("#include <stdint.h>\n" + _wgmma("mma", "m64n8k16", "bf16.bf16", 4, False, "1, 1, 0, 0") +
            '\nextern "C" __global__ void probe(float* out, uint64_t da, uint64_t db, int n) {\n'
            "  float d[4] = {0.f, 0.f, 0.f, 0.f};\n"
            "  for (int i = 0; i < n; ++i) {\n"
            '    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");\n'
            "    mma(d, da, db, true);\n"
            '    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");\n'
            + read +
            '    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");\n'
            "  }\n"
            "  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];\n}\n")


def test_a_build_whose_wgmmas_ptxas_serialises_fails(tmp_path):
    """Reading a WGMMA's accumulator before its wait (on any path) makes ptxas serialise the
    kernel's WGMMAs (it still runs, without any overlap): the build refuses it, and builds the
    same loop without that read."""
    from generator.toolchain import CompileError
    tc = toolchain_or_skip("sm_90a")
    tc.compile_cxx(_wgmma_probe(False), tmp_path / "ok.cubin")
    assert (tmp_path / "ok.cubin").stat().st_size > 0
    with pytest.raises(CompileError, match="serialised the WGMMAs"):
        tc.compile_cxx(_wgmma_probe(True), tmp_path / "bad.cubin")
