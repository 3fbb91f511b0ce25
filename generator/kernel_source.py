"""Emit one self-contained C++ translation unit per CUDA / HIP variant.

The unit is: the variant's compile-time configuration, the ``Params`` struct and
the entry point's parameter list -- both generated from ``catalogue.kernargs``, so
the argument layout exists only there -- then, for CUDA, what the bodies share
(``cuda/flash_common.cuh``, and for FP8 ``cuda/flash_fp8_lean.cuh``) with the
variant's WGMMA instructions, then the hand-written kernel body (``BODY``), then the
``extern "C"`` entry that fills ``Params`` and calls the body.
"""

from __future__ import annotations

from pathlib import Path

import math
import re

import numpy as np

from zyfa_runtime import catalogue, e4m3, fp8_models
from zyfa_runtime.catalogue import ARG_TYPES, AuxKernel, Variant, kernargs

ROOT = Path(__file__).resolve().parent.parent
#: The hand-written bodies: gfx950 BF16, and the sm_90a ones by ``catalogue.sm90_body``.
BODY = {"hip": ROOT / "hip" / "flash_fwd.hip",
        "ws": ROOT / "cuda" / "flash_fwd_ws.cuh",
        "fp8-ws": ROOT / "cuda" / "flash_fwd_fp8_ws.cuh"}
#: What the sm_90a bodies share (the CTA's work, copies, WGMMA primitives, barriers), inserted
#: before them.
COMMON = ROOT / "cuda" / "flash_common.cuh"
#: What the sm_90a FP8 body builds on (layouts, the P arithmetic, the epilogue), with the
#: variant's WGMMA wrappers in place of ``ZYFA_WGMMA_WRAPPERS``.
FP8_COMMON = ROOT / "cuda" / "flash_fp8_lean.cuh"


def _wgmma(name: str, shape: str, types: str, n_acc: int, a_in_regs: bool, tail: str,
           accumulate_arg: bool = True, n_array: int | None = None) -> str:
    """One WGMMA wrapper: ``name(d, a, b_desc[, accumulate])`` over ``n_acc`` f32 accumulators
    (one PTX register operand each, which C++ cannot spell generically), the first of the
    ``n_array`` (default ``n_acc``) that ``d`` holds.  A is a descriptor
    or, with ``a_in_regs``, four b32 registers; ``accumulate`` (scale-d: D = A B + D, else
    D = A B) is an argument, or always on without ``accumulate_arg``; ``tail`` holds the
    immediates after the scale-d predicate (scales, transposes)."""
    ops = lambda n, start=0: ", ".join(f"%{i}" for i in range(start, start + n))  # noqa: E731
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n_acc))
    acc = '"r"(static_cast<int>(accumulate))' if accumulate_arg else '"r"(1)'
    if a_in_regs:
        sig, a_ops, pred = "const uint32_t* a, uint64_t db", f"{{{ops(4, n_acc)}}}, %{n_acc + 4}", n_acc + 5
        ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), ' + acc
    else:
        sig, a_ops, pred = "uint64_t da, uint64_t db", f"%{n_acc}, %{n_acc + 1}", n_acc + 2
        ins = '"l"(da), "l"(db), ' + acc
    if accumulate_arg:
        sig += ", bool accumulate"
    return (f'__device__ __forceinline__ void {name}(float (&d)[{n_array or n_acc}], {sig}) {{\n'
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{pred}, 0;\\n"\n'
            f'               "wgmma.mma_async.sync.aligned.{shape}.f32.{types} {{{ops(n_acc)}}}, '
            f'{a_ops}, p, {tail};\\n}}\\n"\n'
            f'               : {outs}\n'
            f'               : {ins} : "memory");\n}}\n')


def _wgmma_wrappers(v: Variant) -> str:
    """The WGMMA instructions of the sm_90a bodies.  BF16 (flash_fwd_ws.cuh): ``wgmma_qk``
    (k16, no transposes) and ``wgmma_pv`` (P in registers, V MN-major: tnspB).  FP8
    (flash_fp8_lean.cuh): k32 e4m3, both K-major, PV in passes of N <= 128.  Each V^T stage
    is followed by 8 rows of ones, and PV's last pass is N = its columns + 8 (``wgmma_pv``):
    the rounded row sum comes out of its last 8 columns.  At d_v = 256 the first pass is
    ``wgmma_pv_bare`` (N = 128)."""
    n = v.tile.block_n
    if body_key(v) == "ws":
        pv_n = v.d_v + (8 if v.tile.pv_row_sums else 0)   # l from a block of ones (kOnesSum)
        if v.f16:   # e4m3 inputs (kFp8In): S an e4m3 product, PV f16 against V converted to f16
            return "\n".join([
                _wgmma("wgmma_qk", f"m64n{n}k32", "e4m3.e4m3", n // 2, False, "1, 1"),
                _wgmma("wgmma_pv", f"m64n{pv_n}k16", "f16.f16", pv_n // 2, True, "1, 1, 1")])
        return "\n".join([
            _wgmma("wgmma_qk", f"m64n{n}k16", "bf16.bf16", n // 2, False, "1, 1, 0, 0"),
            _wgmma("wgmma_pv", f"m64n{pv_n}k16", "bf16.bf16", pv_n // 2, True, "1, 1, 1")])
    pv_n = min(v.d_v, 128)     # one PV pass: kPvN in the body
    ones = 8                   # the rows of ones after each V^T stage: l in the last pass itself
    return "\n".join([
        _wgmma("wgmma_qk", f"m64n{n}k32", "e4m3.e4m3", n // 2, False, "1, 1"),
        _wgmma("wgmma_pv", f"m64n{pv_n + ones}k32", "e4m3.e4m3", (pv_n + ones) // 2, True, "1, 1"),
        _wgmma("wgmma_pv_bare", f"m64n{pv_n}k32", "e4m3.e4m3", pv_n // 2, True, "1, 1")])


def body_key(v: Variant) -> str:
    """Which hand-written body builds ``v`` (a key of ``BODY``)."""
    return catalogue.sm90_body(v) if v.vendor == "cuda" else "hip"


def _recipe_constants(v: Variant) -> list[str]:
    """The P arithmetic of the FP8 WGMMA body, from the model it must match bit for bit (but
    the two-term diagonal's x, MUFU's ex2.approx within 2 ulp of the model's fp32(2^u), and
    the softcap's tanh.approx: e4m3.exp2_x, docs/numerics.md).
    The body implements three byte forms: "lean_h2" (the plain Lean byte held to 1/8 code in
    f16, the target's), "quad_h2" (with the quadratic correction in f16x2) and "quad_fold"
    (the correction in fp32); ``kByteH2`` and ``kByteQuad`` pick one."""
    r = fp8_models.RECIPES["sm_90a"]
    # (the Recipe itself ties each of these forms to its rounding and the exact block max)
    if (r.block_keys, r.max_kind, r.sum_of, r.lse_offset) != (v.tile.block_n, "block_fp32", "rounded", 0.0) or \
            r.byte_form not in ("lean_h2", "quad_h2", "quad_fold") or \
            r.diagonal not in ("same", "hi_lo") or (r.diagonal == "hi_lo" and r.diagonal_rows != CONSUMER_ROWS):
        raise ValueError(f"{v.name}: the FP8 WGMMA body implements lean bytes in the lean_h2 form or "
                         f"lean_quad bytes in the quad_h2 or quad_fold form, the exact fp32 block max "
                         f"and rounded sums over {v.tile.block_n}-key blocks with no LSE offset, and "
                         f"one-byte or two-term diagonals (per consumer warpgroup's {CONSUMER_ROWS} rows), not {r}")

    def f16x2(x) -> str:       # an f16 constant in both halves of a b32, as its bits
        bits = int(np.float16(x).view(np.uint16))
        return f"0x{bits << 16 | bits:08X}u"

    return [f"constexpr float kCode0 = {float(r.c0)!r}f;       // e4m3 code of p_shift",
            f"constexpr float kLog2Shift = {math.log2(r.p_shift)!r}f;",
            f"constexpr float kPShift = {float(r.p_shift)!r}f;   // p_shift: a sink's weight at the frame (serving)",
            f"constexpr bool kByteH2 = {'true' if r.byte_form.endswith('_h2') else 'false'};"
            f"   // byte_form {r.byte_form!r}",
            f"constexpr bool kByteQuad = {'true' if r.p_rounding == 'lean_quad' else 'false'};"
            f"   // p_rounding {r.p_rounding!r}",
            f"constexpr float kWBias = {float(r.w_constant).hex()}f;   // Recipe.w_constant: fp32(16 + (c0 - code_offset) / 8)",
            f"constexpr int kFoldC = {e4m3.QUAD_FOLD_C};             // e4m3.QUAD_FOLD_C",
            f"constexpr float kFoldA1 = {float(e4m3.QUAD_FOLD_A1).hex()}f;   // e4m3.QUAD_FOLD_A1",
            f"constexpr float kFoldA0 = {float(e4m3.QUAD_FOLD_A0).hex()}f;   // e4m3.QUAD_FOLD_A0",
            f"constexpr unsigned kH2A = {f16x2(e4m3.QUAD_H2_A)};   // e4m3.QUAD_H2_A, f16x2",
            f"constexpr unsigned kH2NegA = {f16x2(-e4m3.QUAD_H2_A)};",
            f"constexpr unsigned kH2B = {f16x2(e4m3.QUAD_H2_B)};   // e4m3.QUAD_H2_B",
            f"constexpr unsigned kH2NegB17 = {f16x2(-e4m3.QUAD_H2_B17)};   // -e4m3.QUAD_H2_B17",
            f"constexpr unsigned kH2ZMax = {f16x2((r.c0 + 128) / 8)};   // z of code c0: (c0 + 128) / 8",
            f"constexpr bool kDiagHiLo = {'true' if r.diagonal_at(v.d_v) else 'false'};"
            f"   // diagonal {r.diagonal!r} at d_v <= {r.diagonal_dv}",
            f"constexpr float kExpUMax = {float(e4m3.EXP2_U_MAX).hex()}f;   // e4m3.EXP2_U_MAX",
            f"constexpr float kExpUZero = {float(e4m3.EXP2_U_ZERO)!r}f;   // e4m3.EXP2_U_ZERO"]


#: Query rows of one consumer warpgroup of the sm_90a bodies (the catalogue's, which sizes the tiles).
CONSUMER_ROWS = catalogue.SM90_CONSUMER_ROWS


def register_split(tile) -> tuple[int, int]:
    """setmaxnreg's registers a thread for the producer and for each consumer warpgroup of an
    sm_90a tile (a producer and ``block_m / 64`` consumers).  The CTA is launched with 65,536 /
    threads a thread (in steps of 8) and setmaxnreg never grows that pool: with two consumers
    40 and 232 of 168 (the consumers hold O, a block accumulator, S and P at d128), with three
    32 and 160 of 128 (at d64 O and the block accumulator are half as wide, and BF16 keeps one
    P; at d_v = 128 non-causal the FP8 body keeps the block accumulator and S(n + 1) apart in
    time)."""
    consumers = tile.block_m // CONSUMER_ROWS
    if tile.threads != 128 * (1 + consumers):
        raise ValueError(f"an sm_90a tile is a producer and {consumers} consumer warpgroups, "
                         f"not {tile.threads} threads")
    split = {2: (40, 232), 3: (32, 160)}.get(consumers)
    if split is None:
        raise ValueError(f"no register split for {consumers} consumer warpgroups")
    return split


def config(v: Variant) -> str:
    t = v.tile
    lines = [
        f"// zyfa generated: {v.name}",
        "namespace zyfa_cfg {",
        f"constexpr int kDqk = {v.d_qk};",
        f"constexpr int kDv = {v.d_v};",
        f"constexpr bool kCausal = {'true' if v.causal else 'false'};",
        f"constexpr bool kFp8 = {'true' if v.dtype == 'fp8_e4m3' and not v.f16 else 'false'};   // FP8 tensor math",
        f"constexpr bool kFp8In = {'true' if v.f16 else 'false'};   // e4m3 tiles in f16 tensor math (Variant.f16)",
        f"constexpr int kBlockM = {t.block_m};",
        f"constexpr int kBlockN = {t.block_n};",
        f"constexpr int kThreads = {t.threads};",
        f"constexpr int kDynamicSmem = {t.dynamic_smem};",
        f"constexpr int kStages = {t.stages};",
    ]
    if v.vendor == "cuda":
        prod, cons = register_split(t)
        lines += [f"constexpr int kConsumerRows = {CONSUMER_ROWS};",
                  f"constexpr int kProducerRegs = {prod}, kConsumerRegs = {cons};   // setmaxnreg",
                  f"constexpr bool kPersistent = {'true' if t.persistent else 'false'};"
                  "   // one CTA an SM, taking tiles from a counter",
                  f"constexpr bool kSplitTail = {'true' if t.split_tail else 'false'};"
                  "   // the tiles past the last whole wave cut by keys (catalogue.Tile.split_tail)",
                  f"constexpr bool kTmaO = {'true' if t.tma_o else 'false'};"
                  "   // O by TMA, tmap_o (catalogue.Tile.tma_o)",
                  f"constexpr bool kOnesSum = {'true' if t.pv_row_sums else 'false'};"
                  "   // BF16: the row sums of the rounded P by PV, over a block of ones",
                  f"constexpr bool kServing = {'true' if v.serving else 'false'};"
                  "   // window, softcap and sinks compiled in (catalogue.Variant.serving)"]
    if v.vendor == "hip":
        lines.append(f"constexpr bool kLongestFirst = {'true' if catalogue.longest_first(v) else 'false'};"
                     "   // query blocks longest first (catalogue.work_of)")
    if catalogue.has_vt_prepass(v):
        lines.append(f"constexpr int kVtBlock = {catalogue.VT_BLOCK}, kVtThreads = {catalogue.VT_THREADS};"
                     "   // the V^T pre-pass: keys and threads of a CTA")
    if v.vendor == "cuda" and body_key(v) == "fp8-ws":
        lines += _recipe_constants(v)
    lines.append("}  // namespace zyfa_cfg")
    return "\n".join(lines) + "\n"


#: A TMA tensor map argument: 128 opaque bytes the runtime encodes.  It stays in the parameter
#: space (``__grid_constant__``), where TMA reads it; ``Params`` holds its address.
TMAP_STRUCT = "struct alignas(64) TmaMap { unsigned long long w[16]; };\n"


def _param(a) -> tuple[str, str, str]:
    """An argument's declaration in the entry's parameter list, its ``Params`` field, and the
    value the entry gives the field."""
    ty = ARG_TYPES[a.type][0]
    if a.type == "tmap":
        return f"const __grid_constant__ {ty} {a.name}", f"const {ty}* {a.name}", f"&{a.name}"
    return f"{ty} {a.name}", f"{ty} {a.name}", a.name


def params_struct(v: Variant) -> str:
    args = kernargs(v)
    fields = "".join(f"  {_param(a)[1]};\n" for a in args)
    return (TMAP_STRUCT if any(a.type == "tmap" for a in args) else "") + "struct Params {\n" + fields + "};\n"


def _entry_attrs(vendor: str, threads: int) -> str:
    if vendor == "cuda":
        return f"__global__ void __launch_bounds__({threads}, 1)"
    return f"__global__ __attribute__((amdgpu_flat_work_group_size({threads}, {threads}))) void"


def _entry_point(args, attrs: str, symbol: str, body: str) -> str:
    """An extern "C" entry: the arguments into Params, then ``zyfa::body(p)``."""
    plist = ",\n    ".join(_param(a)[0] for a in args)
    fill = "".join(f"  p.{a.name} = {_param(a)[2]};\n" for a in args)
    return f'extern "C" {attrs} {symbol}(\n    {plist}) {{\n  Params p;\n{fill}  zyfa::{body}(p);\n}}\n'


def entry(v: Variant) -> str:
    args = kernargs(v)
    attrs = _entry_attrs(v.vendor, v.tile.threads)
    entry_point = lambda attrs, symbol, body: _entry_point(args, attrs, symbol, body)  # noqa: E731
    out = entry_point(attrs, v.symbol, "flash_fwd")
    if catalogue.has_vt_prepass(v):
        out += entry_point(f"__global__ void __launch_bounds__({catalogue.VT_THREADS})",
                           catalogue.vt_prepass_symbol(v), "transpose_v")
    if v.tile.split_tail:
        out += entry_point(attrs, catalogue.split_tail_symbol(v), "flash_fwd_tail")
    return out


_INCLUDE = re.compile(r'^#include "([\w.]+)"[ \t]*$', re.M)


def _inline_includes(body: str, folder: Path) -> str:
    """``body`` with its ``#include "x.h"`` lines replaced by the text of ``folder``/x.h, in
    place (the gfx950 BF16 body's headers of hip/, one job each): the unit compiles without
    include paths."""
    return _INCLUDE.sub(lambda m: (folder / m.group(1)).read_text(), body)


def emit(v: Variant) -> str:
    """The complete source of variant ``v`` (assembly for the gfx950 FP8 generator)."""
    if v.built_from == "asm-generator":
        from . import gfx950_fp8
        return gfx950_fp8.emit(v)
    parts = [config(v), params_struct(v)]
    body = BODY[body_key(v)].read_text()
    if v.vendor == "hip":
        body = _inline_includes(body, BODY["hip"].parent)
    if v.vendor == "cuda":
        wrappers = _wgmma_wrappers(v)
        parts.append(COMMON.read_text())
        if body_key(v) == "fp8-ws":
            parts.append(FP8_COMMON.read_text().replace("ZYFA_WGMMA_WRAPPERS", wrappers))
        else:
            body = body.replace("ZYFA_WGMMA_WRAPPERS", wrappers)
    return "\n".join(parts + [body, entry(v)])


# --------------------------------------------------------------------------------------
# Auxiliary kernels (catalogue.AuxKernel): a vendor file per arch spelling what the kind's
# shared arithmetic (in cuda/) uses, the shared header inlined in place of its #include.

#: Per kind: the vendor file of each arch's vendor, the shared headers' folder, the body's
#: function in namespace zyfa.
AUX_SOURCES = {
    "merge_attention_states": {"cuda": ROOT / "cuda" / "merge_states.cu",
                               "hip": ROOT / "hip" / "merge_states.hip",
                               "shared": ROOT / "cuda", "body": "merge_states"},
    **{kind: {"cuda": ROOT / "cuda" / "quantize_fp8.cu", "hip": ROOT / "hip" / "quantize_fp8.hip",
              "shared": ROOT / "cuda", "body": kind.replace("_fp8", "")}
       for kind in catalogue.QUANTIZE_KINDS},
}


def aux_config(a: AuxKernel) -> str:
    spec = a.spec
    return "\n".join([f"// zyfa generated: {a.name}", "namespace zyfa_cfg {",
                      f"constexpr int kThreads = {spec.threads};",
                      f"constexpr int kRows = {spec.rows};   // rows a workgroup: the grid's x",
                      "}  // namespace zyfa_cfg"]) + "\n"


def emit_aux(a: AuxKernel) -> str:
    """The complete source of auxiliary kernel ``a``: configuration, Params, the vendor file
    with the shared arithmetic inlined, the entry."""
    src = AUX_SOURCES[a.kind]
    body = _inline_includes(src[a.vendor].read_text(), src["shared"])
    entry_text = _entry_point(kernargs(a), _entry_attrs(a.vendor, a.spec.threads), a.symbol, src["body"])
    return "\n".join([aux_config(a), params_struct(a), body, entry_text])
