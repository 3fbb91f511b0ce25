"""Check kernels on the active device against the fp64 reference, at small shapes.

Every case draws fresh random inputs (never zeros), poisons the output with NaN
before the launch, and compares O and LSE with ``reference``.  Error bound: the BF16
kernels round P to bf16 before the PV product and round O to bf16 at the end, two
roundings of unit roundoff u = 2^-9 each; the QK^T and PV sums are fp32 over exact
bf16 products.  ||out-ref||/||ref|| is therefore about 2u ~ 3.9e-3 in
the worst case of aligned rounding errors; the bound is 8e-3 (2u plus margin for
the fp32 accumulation and cancellation in small outputs).  LSE is fp32 from fp32 row
sums: absolute error bound 1e-3.  Where the row sums are those of the rounded P, from the PV
product itself (``Tile.pv_row_sums``: sm_90a BF16 d64 and d128), l is the sum of the bf16 P
that were multiplied, each within a factor 1 +- u of its exact value, so ln l is within
-ln(1 - u) = 1.96e-3 of the exact log-sum-exp: bound 2.5e-3 (O's bound is unchanged: it is
normalised by what it sums).  NaN anywhere fails.

Kernels whose P arithmetic is a recipe of ``fp8_models`` (the FP8 kernels of both targets:
Lean P bytes, rounded sums) are checked against that model, which predicts them bit for
bit in P given the kernel's own fp32 scores.

* gfx950: the MFMA's scores are the model's (products exact, fp32 sums); what remains is
  the fp32 accumulation order of the PV MFMAs (the model sums each block exactly) and the
  final bf16 rounding (u = 2^-9): ||out-model||/||model|| <= 4e-3, LSE within 1e-4.
* sm_90a: Hopper's FP8 WGMMA accumulates the scores with fewer bits than fp32 (measured on
  the H200: up to ~200 units on scores of ~1e5 at d = 128), and a Lean byte whose
  ``y`` lies that close to a rounding boundary moves by one code (2^(1/8), +9 %).  Against
  the model on exact scores that is ~0.3 % of the bytes; in rows of a few dozen keys one
  such byte can be a large share of the row sum.  Bounds 1.5e-2 (O) and 4e-2 (LSE, one
  code step of a P worth up to half the row sum is ln(1 + 0.09/2) ~ 4.4e-2): they catch
  any arithmetic or layout error, which moves O by O(1).  Bit-level agreement is tested
  where the tensor core's own scores can be had: ``tests/test_gpu.py`` feeds the model the
  scores of ``torch._scaled_mm`` (the same FP8 accumulation) and holds the kernel to
  4e-3 / 5e-4.

The f16-math FP8 kernels (``Variant.f16``: e4m3 inputs converted exactly to f16, P in f16 and
normalised by the sum of the rounded P) are checked against fp64 with the BF16 bounds: P's
f16 rounding (2^-11) is finer than bf16's, O's final bf16 rounding the same.

Their error against fp64 is the recipe's own (Lean bytes are within [-4.2 %, +10.8 %] of
the exact weights, normalised by their own sum): it is reported and bounded by 0.05, a
margin over the ~2e-2 the model has on these inputs (FlashAttention-3's recipe: the same).
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from . import fp8_models, reference
from .api import flash_attn_func, flash_attn_varlen_func
from .catalogue import Variant, f16_variant, short_variant
from .plan import forced_variant
from .memory import DeviceArray, host_dtype, to_device, view

O_BOUND = 8e-3
LSE_BOUND = 1e-3
#: LSE against fp64 where l is the sum of the rounded P (module docstring).
ROUNDED_SUM_LSE_BOUND = 2.5e-3
#: Variants whose P arithmetic is a recipe of fp8_models, and their bounds (module docstring).
RECIPE_OF = {("gfx950", "fp8_e4m3"): "gfx950", ("sm_90a", "fp8_e4m3"): "sm_90a"}
MODEL_O_BOUND = 4e-3
MODEL_LSE_BOUND = 1e-4
#: (O, LSE) bounds against the model per recipe (module docstring): sm_90a's scores are the
#: tensor core's, not the model's exact fp32 ones.
MODEL_BOUNDS = {"gfx950": (MODEL_O_BOUND, MODEL_LSE_BOUND), "sm_90a": (1.5e-2, 4e-2)}
RECIPE_FP64_BOUND = 0.05


def recipe_of(v: Variant) -> "str | None":
    """The fp8_models recipe whose P arithmetic variant ``v``'s kernel has (RECIPE_OF), None
    where it has none (BF16, and the f16-math FP8 kernels: Variant.f16)."""
    return None if v.f16 else RECIPE_OF.get((v.arch, v.dtype))


def bounds(v: Variant) -> tuple[float, float]:
    """(O, LSE) bounds of variant ``v`` against the reference it is checked with."""
    if recipe_of(v) is not None:
        return MODEL_BOUNDS[recipe_of(v)]
    return O_BOUND, ROUNDED_SUM_LSE_BOUND if v.tile.pv_row_sums else LSE_BOUND


def _model(v: Variant, q, k, vv, scales, cu_q=None, cu_k=None):
    """The recipe model's out and lse for host e4m3 inputs (dense (B, S, H, D) or packed)."""
    recipe = recipe_of(v)
    scale = float(np.float32(1.0 / np.sqrt(v.d_qk)))   # what the kernel receives
    kw = dict(descale_q=scales[0], descale_k=scales[1], descale_v=scales[2], causal=v.causal,
              softmax_scale=scale)
    if cu_q is None:
        outs = [fp8_models.sequence_forward(q[b], k[b], vv[b], recipe, **kw) for b in range(len(q))]
        return np.stack([o for o, _ in outs]), np.stack([l for _, l in outs])
    outs = [fp8_models.sequence_forward(q[cu_q[i]:cu_q[i + 1]], k[cu_k[i]:cu_k[i + 1]],
                                        vv[cu_k[i]:cu_k[i + 1]], recipe, **kw)
            for i in range(len(cu_q) - 1)]
    return np.concatenate([o for o, _ in outs]), np.concatenate([l for _, l in outs], axis=1)


@dataclasses.dataclass
class CaseResult:
    variant: Variant
    case: str
    o_error: float
    lse_error: float
    ok: bool
    note: str = ""


def _quantise(x: np.ndarray, dtype: str):
    """Host input in the kernel's dtype and its exact float64 value, with descale (fp8)."""
    if dtype == "bf16":
        xq = x.astype(host_dtype("bf16"))
        return xq, xq.astype(np.float64), None
    scale = float(np.abs(x).max()) / 448.0
    xq = (x / scale).astype(host_dtype("fp8_e4m3"))
    return xq, xq.astype(np.float64) * np.float32(scale), np.float32(scale)


def _poisoned_out(driver, device, shape):
    out = DeviceArray(driver, device, shape, "bf16")
    driver.memset_d8(out.ptr, 0xFF, out.nbytes)  # 0xFFFF is a bf16 NaN
    return out


def _errors(out: DeviceArray, lse: DeviceArray, ref_o, ref_lse):
    o = out.numpy().astype(np.float64)
    l = lse.numpy().astype(np.float64)
    o_err = reference.relative_error(o, ref_o) if not np.isnan(o).any() else float("nan")
    both_inf = np.isneginf(l) & np.isneginf(ref_lse)
    finite = np.isfinite(ref_lse)
    bad_inf = (np.isneginf(l) != np.isneginf(ref_lse)).any() or np.isnan(l).any()
    lse_err = float(np.abs(l[finite] - ref_lse[finite]).max()) if finite.any() else 0.0
    if bad_inf or not (both_inf | finite).all():
        lse_err = float("nan")
    return o_err, lse_err


def _descales(driver, device, scales):
    if scales[0] is None:
        return {}
    return {name: to_device(driver, device, np.array([s], np.float32), "float32")
            for name, s in zip(("descale_q", "descale_k", "descale_v"), scales)}


def dense_case(driver, device: int, v: Variant, rng, *, b, sq, sk, hq, hkv, strided=False):
    """One dense call; returns (o_error, lse_error)."""
    def make(s, h, d):
        x = rng.standard_normal((b, s, h, d)).astype(np.float32)
        return _quantise(x, v.dtype)
    (q, q64, dq), (k, k64, dk), (vv, v64, dv) = make(sq, hq, v.d_qk), make(sk, hkv, v.d_qk), \
        make(sk, hkv, v.d_v)
    refs = []
    for host in (q, k, vv):
        if strided:   # a view into a larger buffer: padded rows, heads and sequences
            big = np.zeros((host.shape[0], host.shape[1] + 3, host.shape[2] + 1, host.shape[3] + 16),
                           dtype=host.dtype)
            sub = big[:, 1:1 + host.shape[1], 1:, :host.shape[3]]
            sub[...] = host
            refs.append(view(to_device(driver, device, big, v.dtype), sub, big))
        else:
            refs.append(to_device(driver, device, host, v.dtype))
    out = _poisoned_out(driver, device, (b, sq, hq, v.d_v))
    _, lse = flash_attn_func(*refs, causal=v.causal, out=out, return_lse=True,
                             **_descales(driver, device, (dq, dk, dv)))
    ref_o, ref_lse = reference.attention(q64, k64, v64, causal=v.causal, return_lse=True)
    if recipe_of(v) is not None:
        return _errors(out, lse, *_model(v, q, k, vv, (dq, dk, dv))), _errors(out, lse, ref_o, ref_lse)
    return _errors(out, lse, ref_o, ref_lse), None


def varlen_case(driver, device: int, v: Variant, rng, *, seq_q, seq_k, hq, hkv, host_cu=False):
    """One packed call; cu_seqlens as device tensors, or with ``host_cu`` the host arrays (a
    GPU backend stages them: staging.py)."""
    cu_q = np.concatenate([[0], np.cumsum(seq_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(seq_k)]).astype(np.int32)
    def make(t, h, d):
        return _quantise(rng.standard_normal((t, h, d)).astype(np.float32), v.dtype)
    (q, q64, dq), (k, k64, dk), (vv, v64, dv) = make(cu_q[-1], hq, v.d_qk), \
        make(cu_k[-1], hkv, v.d_qk), make(cu_k[-1], hkv, v.d_v)
    qd, kd, vd = (to_device(driver, device, x, v.dtype) for x in (q, k, vv))
    cqd, ckd = (c.copy() if host_cu else to_device(driver, device, c, "int32") for c in (cu_q, cu_k))
    out = _poisoned_out(driver, device, (cu_q[-1], hq, v.d_v))
    _, lse = flash_attn_varlen_func(qd, kd, vd, cu_seqlens_q=cqd, cu_seqlens_k=ckd,
                                    max_seqlen_q=int(max(seq_q)), max_seqlen_k=int(max(seq_k)),
                                    causal=v.causal, out=out, return_lse=True,
                                    **_descales(driver, device, (dq, dk, dv)))
    ref_o, ref_lse = reference.attention(q64, k64, v64, causal=v.causal, cu_seqlens_q=cu_q,
                                         cu_seqlens_k=cu_k, return_lse=True)
    if recipe_of(v) is not None:
        return (_errors(out, lse, *_model(v, q, k, vv, (dq, dk, dv), cu_q, cu_k)),
                _errors(out, lse, ref_o, ref_lse))
    return _errors(out, lse, ref_o, ref_lse), None


#: The cases every variant must pass: GQA with a ratio that is not a power of two,
#: lengths that are not multiples of any tile, Sq < Sk and Sq > Sk (bottom-right causal
#: then leaves rows with no key), strided views, and varlen with an empty sequence.
CASES = {
    "gqa3 b2 sq77 sk131": lambda d, dev, v, r: dense_case(d, dev, v, r, b=2, sq=77, sk=131, hq=6, hkv=2),
    "mha b1 sq130 sk45": lambda d, dev, v, r: dense_case(d, dev, v, r, b=1, sq=130, sk=45, hq=2, hkv=2),
    "strided gqa2 b2 s96": lambda d, dev, v, r: dense_case(d, dev, v, r, b=2, sq=96, sk=96, hq=4, hkv=2,
                                                           strided=True),
    "varlen gqa5 4 seqs": lambda d, dev, v, r: varlen_case(d, dev, v, r, seq_q=[17, 0, 113, 65],
                                                           seq_k=[40, 33, 67, 160], hq=5, hkv=1),
}


def check_variant(driver, device: int, v: Variant, seed: int | None = None,
                  cases: tuple[str, ...] | None = None) -> list[CaseResult]:
    """``v`` on every case of ``CASES`` (or the ones named in ``cases``), fresh inputs each.
    Plain calls only: a serving variant (window, softcap, sinks, KV cache) is refused, as no
    plain call runs its kernel (tests/test_gpu_serving_features.py checks those through the
    calls that take them)."""
    if v.serving:
        raise ValueError(f"{v.name} is a serving variant: a plain call runs the plain kernel, so check_variant "
                         "cannot reach it; its kernels are checked through calls with a window, softcap, sinks "
                         "or a KV cache (tests/test_gpu_serving_features.py)")
    rng = np.random.default_rng(seed)
    results = []
    o_bound, lse_bound = bounds(v)
    # A variant with a short-prompt or f16-math sibling (catalogue.Variant.short, .f16): the
    # kernel named, whatever the case's length would take.
    paired = short_variant(v) is not None or f16_variant(v) is not None   # v itself where v is one
    for name in cases or tuple(CASES):
        with forced_variant(v) if paired else contextlib.nullcontext():
            (o_err, lse_err), fp64 = CASES[name](driver, device, v, rng)
        ok = bool(o_err <= o_bound and lse_err <= lse_bound)  # NaN compares False
        note = ""
        if fp64 is not None:   # a recipe kernel: also within the recipe's distance to fp64
            ok = ok and bool(fp64[0] <= RECIPE_FP64_BOUND)
            note = f"vs model; fp64 O {fp64[0]:.2e}"
        results.append(CaseResult(v, name, o_err, lse_err, ok, note))
    return results
