"""Compiler discovery and invocation: versions, failures, byte-identical rebuilds."""

import re

import pytest

from generator import codeobject, toolchain
from generator.toolchain import CompileError, ToolchainError, find_toolchain

HIP_SOURCE = """
#define __global__ __attribute__((global))
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(64, 64)))
void scale(float* x, float a) {
  const int i = __builtin_amdgcn_workitem_id_x();
  x[i] *= a;
}
"""

CUDA_SOURCE = """
extern "C" __global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }
"""

ASM_SOURCE = """
  .amdgcn_target "amdgcn-amd-amdhsa--gfx950"
  .amdhsa_code_object_version 6
  .text
  .globl nop_kernel
  .p2align 8
  .type nop_kernel,@function
nop_kernel:
  s_endpgm
.Lnop_end:
  .size nop_kernel, .Lnop_end-nop_kernel
  .rodata
  .p2align 6
  .amdhsa_kernel nop_kernel
    .amdhsa_user_sgpr_kernarg_segment_ptr 1
    .amdhsa_user_sgpr_count 2
    .amdhsa_kernarg_size 16
    .amdhsa_next_free_vgpr 1
    .amdhsa_next_free_sgpr 8
    .amdhsa_accum_offset 4
  .end_amdhsa_kernel
  .amdgpu_metadata
---
amdhsa.kernels:
  - .name: nop_kernel
    .symbol: nop_kernel.kd
    .kernarg_segment_size: 16
    .kernarg_segment_align: 8
    .group_segment_fixed_size: 0
    .private_segment_fixed_size: 0
    .wavefront_size: 64
    .sgpr_count: 8
    .vgpr_count: 1
    .max_flat_workgroup_size: 256
    .args:
      - { .name: out, .offset: 0, .size: 8, .value_kind: global_buffer, .address_space: global }
      - { .name: n, .offset: 8, .size: 4, .value_kind: by_value }
amdhsa.target: amdgcn-amd-amdhsa--gfx950
amdhsa.version: [ 1, 2 ]
...
  .end_amdgpu_metadata
"""


def toolchain_or_skip(arch):
    """The ``arch`` toolchain, or the test skipped (saying why) where there is none."""
    try:
        return find_toolchain(arch)
    except ToolchainError as e:
        pytest.skip(f"no {arch} toolchain here: {e}")


@pytest.fixture(scope="module")
def gfx950():
    return toolchain_or_skip("gfx950")


@pytest.fixture(scope="module")
def nvcc():
    return toolchain_or_skip("sm_90a")


def test_unknown_arch_is_a_toolchain_error():
    with pytest.raises(ToolchainError):
        find_toolchain("gfx1100")


def test_gfx950_toolchain_reports_what_it_runs(gfx950):
    assert gfx950.arch == "gfx950"
    assert re.search(r"clang version (\d+)\.", gfx950.version)
    assert int(re.search(r"clang version (\d+)\.", gfx950.version).group(1)) >= 20 \
        or gfx950.name == "rocm-llvm"
    ident = gfx950.identity()
    assert gfx950.version in ident and "-target-cpu gfx950" in ident
    assert f"-mcode-object-version={toolchain.CODE_OBJECT_VERSION}" in ident
    assert gfx950.compiler[0] not in ident   # no executable paths


def test_sm90a_toolchain_reports_what_it_runs(nvcc):
    assert nvcc.arch == "sm_90a" and nvcc.name == "nvcc"
    assert re.search(r"V\d+\.\d+\.\d+", nvcc.version)
    assert "compute_90a" in nvcc.identity()
    assert nvcc.compiler[0] not in nvcc.identity()


def test_bad_override_names_the_variable(monkeypatch):
    monkeypatch.setenv("ZYFA_GFX950_CLANG", "zyfa-no-such-clang")
    with pytest.raises(ToolchainError, match="ZYFA_GFX950_CLANG"):
        find_toolchain("gfx950")


def test_hip_compiles_are_byte_identical(gfx950, tmp_path):
    a, b = tmp_path / "a.hsaco", tmp_path / "sub" / "b.hsaco"
    b.parent.mkdir()
    gfx950.compile_cxx(HIP_SOURCE, a)
    gfx950.compile_cxx(HIP_SOURCE, b)
    assert a.read_bytes() == b.read_bytes()
    assert b"zyfa-build" not in a.read_bytes() and str(tmp_path).encode() not in a.read_bytes()
    assert codeobject.amdgpu_code_object_version(a.read_bytes()) == toolchain.CODE_OBJECT_VERSION
    assert "scale" in codeobject.amdgpu_kernels(a.read_bytes())


def test_cuda_compiles_are_byte_identical(nvcc, tmp_path):
    a, b = tmp_path / "a.cubin", tmp_path / "b.cubin"
    nvcc.compile_cxx(CUDA_SOURCE, a)
    nvcc.compile_cxx(CUDA_SOURCE, b)
    assert a.read_bytes() == b.read_bytes()
    assert b"zyfa-build" not in a.read_bytes() and str(tmp_path).encode() not in a.read_bytes()
    assert codeobject.cubin_arch(a.read_bytes()) == "sm_90a"


def test_assembly_is_byte_identical(gfx950, tmp_path):
    a, b = tmp_path / "a.hsaco", tmp_path / "b.hsaco"
    gfx950.assemble(ASM_SOURCE, a)
    gfx950.assemble(ASM_SOURCE, b)
    assert a.read_bytes() == b.read_bytes()
    meta = codeobject.amdgpu_kernels(a.read_bytes())["nop_kernel"]
    assert [(x["offset"], x["size"]) for x in meta["args"]] == [(0, 8), (8, 4)]


def test_nvcc_has_no_assembler_path(nvcc, tmp_path):
    with pytest.raises(NotImplementedError):
        nvcc.assemble("", tmp_path / "x.hsaco")


@pytest.mark.parametrize("arch", ["gfx950", "sm_90a"])
def test_compile_errors_carry_the_compiler_output(arch, tmp_path):
    tc = toolchain_or_skip(arch)
    out = tmp_path / "bad"
    with pytest.raises(CompileError) as e:
        tc.compile_cxx("int broken = ;\n", out)
    assert "kernel." in str(e.value) and "error" in str(e.value)
    assert not out.exists()
