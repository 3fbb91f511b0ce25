"""Emit one self-contained C++ translation unit per CUDA / HIP variant.

The unit is: the variant's compile-time configuration, the ``Params`` struct and
the entry point's parameter list -- both generated from ``catalogue.kernargs``, so
the argument layout exists only there -- then the hand-written kernel body
(``cuda/flash_fwd.cuh`` or ``hip/flash_fwd.hip``), then the ``extern "C"`` entry
that fills ``Params`` and calls the body.
"""

from __future__ import annotations

from pathlib import Path

from zyfa_runtime.catalogue import ARG_TYPES, Variant, kernargs

ROOT = Path(__file__).resolve().parent.parent
BODY = {"cuda": ROOT / "cuda" / "flash_fwd.cuh", "hip": ROOT / "hip" / "flash_fwd.hip"}


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
    body = BODY[v.vendor].read_text()
    return "\n".join([config(v), params_struct(v), body, entry(v)])
