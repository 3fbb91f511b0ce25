"""Emit one self-contained C++ translation unit per CUDA / HIP variant.

The unit is: the variant's compile-time configuration, the ``Params`` struct and
the entry point's parameter list -- both generated from ``catalogue.kernargs``, so
the argument layout exists only there -- then the hand-written kernel body
(``cuda/flash_fwd.cuh`` or ``hip/flash_fwd.hip``), then the ``extern "C"`` entry
that fills ``Params`` and calls the body.
"""

from __future__ import annotations

from pathlib import Path

from zyfa_runtime import catalogue
from zyfa_runtime.catalogue import ARG_TYPES, Variant, kernargs

ROOT = Path(__file__).resolve().parent.parent
BODY = {"cuda": ROOT / "cuda" / "flash_fwd.cuh", "hip": ROOT / "hip" / "flash_fwd.hip",
        "cuda-wgmma": ROOT / "cuda" / "flash_fwd_wgmma.cuh"}


def _wgmma_wrappers(v: Variant) -> str:
    """The two WGMMA instructions of the sm_90a WGMMA body, with their operand lists (one
    PTX register operand per accumulator, which C++ cannot spell generically)."""
    def ops(n, start=0):
        return ", ".join(f"%{i}" for i in range(start, start + n))

    def outs(n):
        return ", ".join(f'"+f"(d[{i}])' for i in range(n))
    n_s, n_o = v.tile.block_n // 2, v.d_v // 2
    qk = (f'__device__ __forceinline__ void wgmma_qk(float (&d)[{n_s}], uint64_t da, uint64_t db, '
          f'bool accumulate) {{\n'
          f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n_s + 2}, 0;\\n"\n'
          f'               "wgmma.mma_async.sync.aligned.m64n{v.tile.block_n}k16.f32.bf16.bf16 {{{ops(n_s)}}}, '
          f'%{n_s}, %{n_s + 1}, p, 1, 1, 0, 0;\\n}}\\n"\n'
          f'               : {outs(n_s)}\n'
          f'               : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)) : "memory");\n}}\n')
    pv = (f'__device__ __forceinline__ void wgmma_pv(float (&d)[{n_o}], const uint32_t* a, '
          f'uint64_t db) {{\n'
          f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n_o + 5}, 0;\\n"\n'
          f'               "wgmma.mma_async.sync.aligned.m64n{v.d_v}k16.f32.bf16.bf16 {{{ops(n_o)}}}, '
          f'{{{ops(4, n_o)}}}, %{n_o + 4}, p, 1, 1, 1;\\n}}\\n"\n'
          f'               : {outs(n_o)}\n'
          f'               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1) : "memory");\n}}\n')
    return qk + "\n" + pv


def uses_wgmma(v: Variant) -> bool:
    """The sm_90a variants the WGMMA body serves (``catalogue.uses_wgmma``: every BF16 variant
    but d64 causal, where its 128-row tiles measured 0.83-0.95x the FA2-style body)."""
    return catalogue.uses_wgmma(v)


def config(v: Variant) -> str:
    t = v.tile
    lines = [
        f"// zyfa generated: {v.name}",
        "namespace zyfa_cfg {",
        f"constexpr int kDqk = {v.d_qk};",
        f"constexpr int kDv = {v.d_v};",
        f"constexpr bool kCausal = {'true' if v.causal else 'false'};",
        f"constexpr bool kFp8 = {'true' if v.dtype == 'fp8_e4m3' else 'false'};",
        f"constexpr int kBlockM = {t.block_m};",
        f"constexpr int kBlockN = {t.block_n};",
        f"constexpr int kThreads = {t.threads};",
        f"constexpr int kDynamicSmem = {t.dynamic_smem};",
        "}  // namespace zyfa_cfg",
    ]
    return "\n".join(lines) + "\n"


def params_struct(v: Variant) -> str:
    fields = "".join(f"  {ARG_TYPES[a.type][0]} {a.name};\n" for a in kernargs(v))
    return "struct Params {\n" + fields + "};\n"


def entry(v: Variant) -> str:
    args = kernargs(v)
    plist = ",\n    ".join(f"{ARG_TYPES[a.type][0]} {a.name}" for a in args)
    fill = "".join(f"  p.{a.name} = {a.name};\n" for a in args)
    if v.vendor == "cuda":
        attrs = f"__global__ void __launch_bounds__({v.tile.threads}, 1)"
    else:
        attrs = (f"__global__ __attribute__((amdgpu_flat_work_group_size({v.tile.threads}, "
                 f"{v.tile.threads}))) void")
    return (f'extern "C" {attrs} {v.symbol}(\n    {plist}) {{\n'
            f"  Params p;\n{fill}  zyfa::flash_fwd(p);\n}}\n")


def emit(v: Variant) -> str:
    """The complete source of variant ``v`` (assembly for the gfx950 FP8 generator)."""
    if v.built_from == "asm-generator":
        from . import gfx950_fp8
        return gfx950_fp8.emit(v)
    if uses_wgmma(v):
        body = BODY["cuda-wgmma"].read_text().replace("ZYFA_WGMMA_WRAPPERS", _wgmma_wrappers(v))
    else:
        body = BODY[v.vendor].read_text()
    return "\n".join([config(v), params_struct(v), body, entry(v)])
