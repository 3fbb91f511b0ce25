"""Every rule of the public attention API, checked before anything reaches a GPU.

:func:`check_dense` and :func:`check_varlen` take :class:`~zyfa_runtime.tensors.TensorRef`
views of the caller's arguments and either return the :class:`Problem` the launcher
needs or raise ``TypeError`` (wrong kind or dtype of argument) or ``ValueError`` (wrong
shape, layout, placement or value); each message names the offending argument.

Choices made here:

* Output is always bf16, for bf16 and fp8_e4m3 inputs alike.
* Dense problems need at least one sequence, one query and one key (``batch``,
  ``seqlen_q``, ``seqlen_k`` >= 1).  Varlen segments may be empty; ``max_seqlen_*``
  must still be integers >= 1.
* ``descale_q/k/v`` are optional and only accepted with fp8_e4m3 inputs; a missing
  descale means 1.0 (the caller supplies it).  Each is fp32 of shape () or (1,) (one value)
  or (B, Hkv) (one a sequence and key/value head, FlashAttention-3's shape), any
  non-negative strides (a broadcast view's zeros included); the values are never read here.
* ``lse`` (optional): where the LSE goes, fp32 (B, Hq, Sq) or (Hq, Tq), unit stride along
  the rows, apart from every input and ``out``.
* Strides of size-1 dimensions are never dereferenced and are not checked.
* The kernels use 16-byte vector loads: q, k, v and out need 16-byte aligned pointers
  and non-head strides that are multiples of 16 bytes.  Scalars read one element at a
  time (cu_seqlens, descales) need natural alignment only.
* Device ordinal -1 (``__cuda_array_interface__`` does not carry one) matches any
  ordinal of the same device kind.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from . import catalogue
from .tensors import TensorRef

__all__ = ["Problem", "check_addresses", "check_dense", "check_descale", "check_varlen"]

INPUT_DTYPES = catalogue.DTYPES
OUTPUT_DTYPE = "bf16"
GPU_DEVICES = ("cuda", "rocm")
VECTOR_BYTES = 16
INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Problem:
    """Everything the launcher needs to know about one call, once it is known valid."""

    dtype: str
    d_qk: int
    d_v: int
    causal: bool
    batch: int
    hq: int
    hkv: int
    seqlen_q: int           # per sequence; max_seqlen_q for varlen
    seqlen_k: int           # per sequence; max_seqlen_k for varlen
    varlen: bool
    total_q: int            # rows of q: batch * seqlen_q, or the packed length
    total_k: int
    softmax_scale: float
    return_lse: bool
    device: tuple[str, int]


# --------------------------------------------------------------------------------------
# Public entry points.

def check_dense(q, k, v, out, *, causal=False, softmax_scale=None, descale_q=None,
                descale_k=None, descale_v=None, return_lse=False, host_ok=False, lse=None) -> Problem:
    """Validate a fixed-length batch: q (B, Sq, Hq, Dqk), k (B, Sk, Hkv, Dqk),
    v (B, Sk, Hkv, Dv), out (B, Sq, Hq, Dv) or None, lse (B, Hq, Sq) or None."""
    qkv = _common_start(q, k, v, out, causal, return_lse, ndim=4,
                        layout="(batch, seqlen, heads, head_dim)")
    (b, sq, hq, dqk), (bk, sk, hkv, _), (bv, skv, _, dv) = (t.shape for t in (q, k, v))
    if bk != b:
        raise ValueError(f"k batch size {bk} does not match q batch size {b}")
    if bv != b:
        raise ValueError(f"v batch size {bv} does not match q batch size {b}")
    if skv != sk:
        raise ValueError(f"v seqlen {skv} does not match k seqlen {sk}")
    for name, n in (("q batch size", b), ("q seqlen", sq), ("k seqlen", sk)):
        if n < 1:
            raise ValueError(f"{name} must be >= 1, got {n}")
    _check_heads(q, k, v, head_axis=2)
    if out is not None and out.shape != (b, sq, hq, dv):
        raise ValueError(f"out shape {out.shape} must be (batch, seqlen_q, heads_q, head_dim_v)"
                         f" = {(b, sq, hq, dv)}")
    _check_int32(batch=b, seqlen_q=sq, seqlen_k=sk)
    _check_lse(lse, (b, hq, sq), return_lse)
    device = _common_end(qkv, out, (), descale_q, descale_k, descale_v, host_ok, (b, hkv), lse)
    return Problem(dtype=q.dtype, d_qk=dqk, d_v=dv, causal=bool(causal), batch=b, hq=hq,
                   hkv=hkv, seqlen_q=sq, seqlen_k=sk, varlen=False, total_q=b * sq,
                   total_k=b * sk, softmax_scale=_check_scale(softmax_scale, dqk),
                   return_lse=bool(return_lse), device=device)


def check_varlen(q, k, v, out, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 causal=False, softmax_scale=None, descale_q=None, descale_k=None,
                 descale_v=None, return_lse=False, cu_values_q=None, cu_values_k=None,
                 host_ok=False, host_cu=False, lse=None) -> Problem:
    """Validate a packed batch: q (Tq, Hq, Dqk), k (Tk, Hkv, Dqk), v (Tk, Hkv, Dv),
    out (Tq, Hq, Dv) or None, lse (Hq, Tq) or None; sequence i spans rows
    cu_seqlens[i]:cu_seqlens[i + 1].

    ``cu_values_q/k`` are host copies of the cu_seqlens values when the caller can read
    them; given, they are checked too (not given, the kernel must clamp them: the caller's
    business).  With ``host_cu`` a cu_seqlens in host memory is accepted beside device
    tensors (the caller copies its values to the device: its values must be given); its
    place and address are not the device's to check.
    """
    qkv = _common_start(q, k, v, out, causal, return_lse, ndim=3,
                        layout="(total, heads, head_dim)")
    (tq, hq, dqk), (tk, hkv, _), (tkv, _, dv) = (t.shape for t in (q, k, v))
    if tkv != tk:
        raise ValueError(f"v packed length {tkv} does not match k packed length {tk}")
    _check_heads(q, k, v, head_axis=1)
    if out is not None and out.shape != (tq, hq, dv):
        raise ValueError(f"out shape {out.shape} must be (total_q, heads_q, head_dim_v)"
                         f" = {(tq, hq, dv)}")

    cu = {"cu_seqlens_q": _check_tensor("cu_seqlens_q", cu_seqlens_q),
          "cu_seqlens_k": _check_tensor("cu_seqlens_k", cu_seqlens_k)}
    for name, t in cu.items():
        if t.dtype != "int32":
            raise TypeError(f"{name} must be int32, got {t.dtype}")
        if t.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {t.shape}")
        if t.shape[0] < 2:
            raise ValueError(f"{name} must have batch + 1 >= 2 entries, got {t.shape[0]}")
        if t.shape[0] > 1 and t.strides[0] != 1:
            raise ValueError(f"{name} must be contiguous, got stride {t.strides[0]}")
    batch = cu["cu_seqlens_q"].shape[0] - 1
    if cu["cu_seqlens_k"].shape[0] != batch + 1:
        raise ValueError(f"cu_seqlens_k has {cu['cu_seqlens_k'].shape[0]} entries but "
                         f"cu_seqlens_q has {batch + 1}; both must have batch + 1")

    max_q = _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_k = _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    for suffix, values, total, maxlen in (("q", cu_values_q, tq, max_q),
                                          ("k", cu_values_k, tk, max_k)):
        if values is not None:
            _check_cu_values(suffix, values, batch + 1, total, maxlen)
    _check_int32(batch=batch, max_seqlen_q=max_q, max_seqlen_k=max_k)

    staged = {name for name, t in cu.items() if host_cu and not host_ok and t.device[0] == "cpu"}
    for name in staged:
        if (cu_values_q, cu_values_k)[name.endswith("_k")] is None:
            raise ValueError(f"{name} is in host memory but its values could not be read")
    scalars = tuple((name, t) for name, t in cu.items() if name not in staged)
    _check_lse(lse, (hq, tq), return_lse)
    device = _common_end(qkv, out, scalars, descale_q, descale_k, descale_v, host_ok, (batch, hkv), lse)
    return Problem(dtype=q.dtype, d_qk=dqk, d_v=dv, causal=bool(causal), batch=batch, hq=hq,
                   hkv=hkv, seqlen_q=max_q, seqlen_k=max_k, varlen=True, total_q=tq,
                   total_k=tk, softmax_scale=_check_scale(softmax_scale, dqk),
                   return_lse=bool(return_lse), device=device)


# --------------------------------------------------------------------------------------
# Rules shared by both layouts.

def _common_start(q, k, v, out, causal, return_lse, *, ndim, layout):
    """Argument kinds, flags, dtypes and ranks of q, k, v and out."""
    qkv = {"q": _check_tensor("q", q), "k": _check_tensor("k", k), "v": _check_tensor("v", v)}
    if out is not None:
        _check_tensor("out", out)
    _check_bool("causal", causal)
    _check_bool("return_lse", return_lse)
    for name, t in qkv.items():
        if t.dtype not in INPUT_DTYPES:
            raise TypeError(f"{name} dtype must be one of {INPUT_DTYPES}, got {t.dtype}")
    for name in ("k", "v"):
        if qkv[name].dtype != q.dtype:
            raise TypeError(f"{name} dtype {qkv[name].dtype} does not match q dtype {q.dtype}")
    if out is not None and out.dtype != OUTPUT_DTYPE:
        raise TypeError(f"out dtype must be {OUTPUT_DTYPE} (the output of every variant), "
                        f"got {out.dtype}")
    for name, t in (*qkv.items(), ("out", out)):
        if t is not None and t.ndim != ndim:
            raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {t.shape}")
    return qkv


def _check_heads(q, k, v, *, head_axis):
    hq, dqk = q.shape[head_axis], q.shape[-1]
    hkv = k.shape[head_axis]
    if k.shape[-1] != dqk:
        raise ValueError(f"k head dim {k.shape[-1]} does not match q head dim {dqk}")
    if v.shape[head_axis] != hkv:
        raise ValueError(f"v heads {v.shape[head_axis]} does not match k heads {hkv}")
    if hkv < 1 or hq < 1:
        raise ValueError(f"q and k/v need at least one head, got q heads {hq}, k heads {hkv}")
    if hq % hkv:
        raise ValueError(f"q heads {hq} must be a multiple of k/v heads {hkv}")
    if (dqk, v.shape[-1]) not in catalogue.HEAD_DIMS:
        raise ValueError(f"head dims (q/k {dqk}, v {v.shape[-1]}) are not supported; "
                         f"supported (q/k, v): {catalogue.HEAD_DIMS}")
    _check_int32(heads_q=hq)


def _common_end(qkv, out, scalars, descale_q, descale_k, descale_v, host_ok, batch_hkv, lse=None):
    """Layout, placement, descales and aliasing; returns the common device.  ``batch_hkv``:
    (sequences, key/value heads), the shape of a descale per sequence and head."""
    big = dict(qkv)
    if out is not None:
        big["out"] = out
        if out.readonly:
            raise ValueError("out is read-only")
    for name, t in big.items():
        _check_layout(name, t)

    descales = {n: _check_tensor(n, d) for n, d in
                (("descale_q", descale_q), ("descale_k", descale_k), ("descale_v", descale_v))
                if d is not None}
    dtype = qkv["q"].dtype
    for name, d in descales.items():
        if dtype != "fp8_e4m3":
            raise ValueError(f"{name} is only accepted with fp8_e4m3 inputs; q is {dtype}")
        check_descale(name, d, batch_hkv)

    outputs = (("lse", lse),) if lse is not None else ()
    device = _check_devices((*big.items(), *scalars, *descales.items(), *outputs), host_ok)
    check_addresses(qkv, out, (*scalars, *descales.items()), lse)
    return device


#: The shapes a descale may have, in words (the messages of check_descale).
DESCALE_SHAPES = "() or (1,) (one value) or (batch, heads_kv)"


def check_descale(name: str, d: TensorRef, batch_hkv: tuple[int, int]) -> None:
    """A descale: fp32, of shape () or (1,), or (B, Hkv) with non-negative strides (a view
    broadcast by zero strides included).  Its values are not read (they are on the device)."""
    if d.dtype != "float32":
        raise TypeError(f"{name} must be float32, got {d.dtype}")
    b, hkv = batch_hkv
    if d.shape not in ((), (1,), (b, hkv)):
        raise ValueError(f"{name} has shape {d.shape}; a descale has shape {DESCALE_SHAPES}, "
                         f"here () or (1,) or ({b}, {hkv})")
    for dim, (n, st) in enumerate(zip(d.shape, d.strides)):
        if n > 1 and st < 0:
            raise ValueError(f"{name} has a negative stride ({st}) in dim {dim}")


def descale_strides(d: TensorRef | None) -> tuple[int, int]:
    """A descale's (sequence, key/value head) strides in elements as the kernels take them: 0
    for one value and along a dimension of one."""
    if d is None or len(d.shape) < 2:
        return 0, 0
    return tuple(st if n > 1 else 0 for n, st in zip(d.shape, d.strides))


def _check_lse(lse, shape: tuple, return_lse) -> None:
    """``lse``, where the caller gives it: fp32 of the LSE's shape, unit stride along its rows
    (the kernels write row after row), non-negative strides, writable."""
    if lse is None:
        return
    _check_tensor("lse", lse)
    if lse.dtype != "float32":
        raise TypeError(f"lse must be float32, got {lse.dtype}")
    if lse.shape != shape:
        raise ValueError(f"lse shape {lse.shape} must be {shape} (the LSE of every query row and head)")
    if shape[-1] > 1 and lse.strides[-1] != 1:
        raise ValueError(f"lse must have unit stride along its rows (last dim), got {lse.strides[-1]}")
    for dim, (n, st) in enumerate(zip(lse.shape, lse.strides)):
        if n > 1 and st < 0:
            raise ValueError(f"lse has a negative stride ({st}) in dim {dim}")
    if lse.readonly:
        raise ValueError("lse is read-only")
    if return_lse is not True:
        raise ValueError("lse is given: return_lse must be True (the call returns (out, lse))")


def check_addresses(qkv: dict, out, scalars, lse=None) -> None:
    """The rules on addresses alone, for tensors whose layouts have passed: q, k, v (``qkv``, by
    name) and out 16-byte aligned, each of ``scalars`` ((name, TensorRef), ...: cu_seqlens,
    descales) and lse aligned to its element, and out and lse apart from q, k, v (and lse from
    out).  A call whose layout has passed before (api's layouts) is checked by this alone."""
    for name, t in (*qkv.items(), ("out", out)):
        if t is not None and t.ptr % VECTOR_BYTES:
            raise ValueError(f"{name} data pointer {t.ptr:#x} is not {VECTOR_BYTES}-byte aligned")
    for name, t in (*scalars, *((("lse", lse),) if lse is not None else ())):
        if t.ptr % t.itemsize:
            raise ValueError(f"{name} data pointer {t.ptr:#x} is not {t.itemsize}-byte aligned")
    written = [(n, t) for n, t in (("out", out), ("lse", lse)) if t is not None]
    for i, (wname, w) in enumerate(written):
        lo, hi = w.extent()
        for name, t in (*qkv.items(), *written[:i]):
            tlo, thi = t.extent()
            if lo < thi and tlo < hi:
                raise ValueError(f"{wname} overlaps {name} in memory; {wname} must not alias an input"
                                 + (" or out" if wname == "lse" else ""))


def check_cu_values(problem: Problem, values_q, values_k) -> None:
    """The cu_seqlens values of a packed batch whose layout has passed before (api's layouts):
    checked on every call, as values may change where addresses and shapes do not."""
    for suffix, values, total, maxlen in (("q", values_q, problem.total_q, problem.seqlen_q),
                                          ("k", values_k, problem.total_k, problem.seqlen_k)):
        if values is None:
            raise ValueError(f"the values of cu_seqlens_{suffix} could not be read")
        _check_cu_values(suffix, values, problem.batch + 1, total, maxlen)


def check_cu_values_of(problem: Problem, suffix: str, values) -> None:
    """The values of one of a packed batch's cu_seqlens (``suffix`` "q" or "k"), as
    :func:`check_cu_values` checks both."""
    total, maxlen = (problem.total_q, problem.seqlen_q) if suffix == "q" else (problem.total_k, problem.seqlen_k)
    _check_cu_values(suffix, values, problem.batch + 1, total, maxlen)


def _check_tensor(name, t) -> TensorRef:
    if not isinstance(t, TensorRef):
        raise TypeError(f"{name} must be a TensorRef, got {type(t).__name__}")
    return t


def _check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _check_int32(**values):
    for name, n in values.items():
        if n > INT32_MAX:
            raise ValueError(f"{name} = {n} does not fit the kernels' 32-bit arguments")


def _check_layout(name, t: TensorRef):
    """Unit head stride, non-negative strides, row strides in 16-byte steps (the pointer's
    alignment: check_addresses)."""
    if t.strides[-1] != 1:
        raise ValueError(f"{name} must have unit stride in the head dim (last dim), "
                         f"got stride {t.strides[-1]}")
    for dim, (n, s) in enumerate(zip(t.shape, t.strides)):
        if n > 1 and s < 0:
            raise ValueError(f"{name} has a negative stride ({s}) in dim {dim}")
    for dim, (n, s) in enumerate(zip(t.shape[:-1], t.strides[:-1])):
        if n > 1 and (s * t.itemsize) % VECTOR_BYTES:
            raise ValueError(f"{name} stride of dim {dim} is {s * t.itemsize} bytes, "
                             f"not a multiple of {VECTOR_BYTES}")


def _check_devices(named, host_ok) -> tuple[str, int]:
    (first, ref), *rest = named
    kind, ordinal = ref.device
    for name, t in named:
        if t.device[0] == "cpu" and not host_ok:
            raise ValueError(f"{name} is in host memory ({t.device[0]}:{t.device[1]}); "
                             "pass device memory")
        if t.device[0] not in (*GPU_DEVICES, "cpu"):
            raise ValueError(f"{name} is on unsupported device {t.device[0]!r}")
    for name, t in rest:
        k, o = t.device
        if k != kind or (o != ordinal and -1 not in (o, ordinal)):
            raise ValueError(f"{name} is on {k}:{o} but {first} is on {kind}:{ordinal}; "
                             "all tensors must be on one device")
        if ordinal == -1:
            ordinal = o
    return kind, ordinal


def _check_max_seqlen(name, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _check_cu_values(suffix, values, length, total, maxlen):
    name, src = f"cu_seqlens_{suffix}", f"cu_values_{suffix}"
    values = np.asarray(values)
    if values.shape != (length,):
        raise ValueError(f"{src} has shape {values.shape} but {name} has {length} entries")
    values = values.astype(np.int64)
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    seg = np.diff(values)
    if (seg < 0).any():
        i = int(np.argmax(seg < 0))
        raise ValueError(f"{name} is not non-decreasing: entry {i + 1} ({values[i + 1]}) "
                         f"< entry {i} ({values[i]})")
    if values[-1] > total:
        raise ValueError(f"{name} ends at {values[-1]}, beyond the packed length {total} "
                         f"of {suffix}")
    if values[-1] < total:
        raise ValueError(f"{name} ends at {values[-1]}, short of the packed length {total} "
                         f"of {suffix}; it must cover every row")
    longest = int(seg.max())
    if maxlen < longest:
        raise ValueError(f"max_seqlen_{suffix} = {maxlen} is less than the longest sequence "
                         f"({longest}) in {name}")


def _check_scale(scale, d_qk) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d_qk)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a float or None, got {type(scale).__name__}")
    with np.errstate(over="ignore", under="ignore"):
        as_f32 = np.float32(scale)
    if not (np.isfinite(as_f32) and as_f32 > 0):
        raise ValueError(f"softmax_scale must be finite and positive in float32, got {scale}")
    return float(scale)
