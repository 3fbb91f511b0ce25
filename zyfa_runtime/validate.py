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
* ``window_size`` (left, right): ints >= -1 (-1: no bound); ``causal`` is right = 0, so with
  ``causal`` a right bound other than 0 or -1 is refused (it would be overridden).  Bounds
  that cut no key of any sequence of the call are dropped (window.reduce): such a window is
  no window.  ``softcap``: a finite real >= 0 (0: off) whose fp32 value, and the kernels'
  ``softmax_scale / softcap``, are finite normal numbers.  ``sinks``: fp32 (Hq,) on the
  device, unit stride; the values are never read here.
* A KV cache (:func:`check_kvcache`): paged, pages of a multiple of 16 rows from 16 to 256;
  its ``cache_seqlens`` and ``page_table`` values, where the caller can read them, within the
  cache (every page a sequence uses in range, no sequence longer than its pages).
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from . import catalogue
from . import window as windows
from .tensors import TensorRef

__all__ = ["Problem", "check_addresses", "check_dense", "check_descale", "check_kvcache", "check_varlen",
           "check_window", "check_softcap", "check_sinks", "check_cu_seqlens", "features_of"]

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
    #: (left, right) reduced to the bounds that cut keys (window.reduce); ``causal`` is its
    #: right bound 0 (a window (-1, 0) is plain causal)
    window: tuple[int, int] = windows.NONE
    softcap: float = 0.0                 # 0: off
    sinks: bool = False                  # a sinks tensor is given
    #: a KV cache: "contiguous" (B, max_seqlen_k, Hkv, D) or "paged"; "" for plain K and V
    kvcache: str = ""
    page_size: int = 0                   # rows of a page (paged)
    num_pages: int = 0                   # pages of the cache (paged)
    max_pages: int = 0                   # page_table's pages a sequence (paged)


#: The serving features a call may need beyond plain (causal or full) attention, as the
#: manifest names them (catalogue.features): a kernel runs a call only if it has them all.
FEATURES = {"window": "a sliding window (window_size)", "softcap": "softcap",
            "sinks": "attention sinks (sinks)", "kvcache": "a KV cache (flash_attn_with_kvcache)",
            "paged_kv": "a paged KV cache (page_table)"}


def features_of(problem: Problem) -> tuple[str, ...]:
    """The features of FEATURES that ``problem`` needs, in FEATURES' order: a window that is
    not plain causal (a left bound, or a right bound above 0), a softcap, sinks, a KV cache."""
    need = {"window": problem.window[0] >= 0 or problem.window[1] > 0, "softcap": problem.softcap > 0,
            "sinks": problem.sinks, "kvcache": bool(problem.kvcache), "paged_kv": problem.kvcache == "paged"}
    return tuple(f for f in FEATURES if need[f])


# --------------------------------------------------------------------------------------
# Public entry points.

def check_dense(q, k, v, out, *, causal=False, softmax_scale=None, descale_q=None,
                descale_k=None, descale_v=None, return_lse=False, host_ok=False, lse=None,
                window_size=windows.NONE, softcap=0.0, sinks=None) -> Problem:
    """Validate a fixed-length batch: q (B, Sq, Hq, Dqk), k (B, Sk, Hkv, Dqk),
    v (B, Sk, Hkv, Dv), out (B, Sq, Hq, Dv) or None, lse (B, Hq, Sq) or None; sinks (Hq,) or
    None."""
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
    scale = _check_scale(softmax_scale, dqk)
    window, cap, scalars = _check_features(causal, window_size, softcap, sinks, scale, hq, sq, sk)
    device = _common_end(qkv, out, scalars, descale_q, descale_k, descale_v, host_ok, (b, hkv), lse)
    return Problem(dtype=q.dtype, d_qk=dqk, d_v=dv, causal=window[1] == 0, batch=b, hq=hq,
                   hkv=hkv, seqlen_q=sq, seqlen_k=sk, varlen=False, total_q=b * sq,
                   total_k=b * sk, softmax_scale=scale,
                   return_lse=bool(return_lse), device=device, window=window, softcap=cap,
                   sinks=sinks is not None)


def check_varlen(q, k, v, out, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 causal=False, softmax_scale=None, descale_q=None, descale_k=None,
                 descale_v=None, return_lse=False, cu_values_q=None, cu_values_k=None,
                 host_ok=False, host_cu=False, lse=None, window_size=windows.NONE, softcap=0.0,
                 sinks=None) -> Problem:
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

    cu = {"cu_seqlens_q": check_cu_seqlens("cu_seqlens_q", cu_seqlens_q),
          "cu_seqlens_k": check_cu_seqlens("cu_seqlens_k", cu_seqlens_k)}
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
    scale = _check_scale(softmax_scale, dqk)
    window, cap, named = _check_features(causal, window_size, softcap, sinks, scale, hq, max_q, max_k)
    device = _common_end(qkv, out, scalars + named, descale_q, descale_k, descale_v, host_ok, (batch, hkv), lse)
    return Problem(dtype=q.dtype, d_qk=dqk, d_v=dv, causal=window[1] == 0, batch=batch, hq=hq,
                   hkv=hkv, seqlen_q=max_q, seqlen_k=max_k, varlen=True, total_q=tq,
                   total_k=tk, softmax_scale=scale,
                   return_lse=bool(return_lse), device=device, window=window, softcap=cap,
                   sinks=sinks is not None)


# --------------------------------------------------------------------------------------
# A KV cache.

#: Rows of a page a paged KV cache may have: multiples of PAGE_STEP from PAGE_MIN to PAGE_MAX
#: (vLLM's 16 up to 256: a page holds whole 16-row groups, the unit of the kernels' K/V copies).
PAGE_MIN, PAGE_MAX, PAGE_STEP = 16, 256, 16


def check_page_size(page_size: int) -> None:
    """A paged cache's rows a page: a multiple of 16 from 16 to 256; a page of one row
    (SGLang's token-granular pool) is out of scope, and said so."""
    if page_size == 1:
        raise ValueError(f"k_cache has pages of 1 row: token-granular pages are out of scope; "
                         f"page sizes are multiples of {PAGE_STEP} from {PAGE_MIN} to {PAGE_MAX}")
    if not (PAGE_MIN <= page_size <= PAGE_MAX and page_size % PAGE_STEP == 0):
        raise ValueError(f"k_cache has pages of {page_size} rows; page sizes are multiples of {PAGE_STEP} "
                         f"from {PAGE_MIN} to {PAGE_MAX}")


def check_kvcache(q, k_cache, v_cache, out, *, cache_seqlens, page_table=None, cu_seqlens_q=None,
                  max_seqlen_q=None, causal=False, softmax_scale=None, window_size=windows.NONE,
                  softcap=0.0, sinks=None, descale_q=None, descale_k=None, descale_v=None,
                  return_lse=False, cache_values=None, table_values=None, cu_values_q=None,
                  host_ok=False, lse=None) -> Problem:
    """Validate attention over a KV cache (``flash_attn_with_kvcache``).

    Queries: q (B, Sq, Hq, Dqk) with out (B, Sq, Hq, Dv) and lse (B, Hq, Sq); or packed
    q (Tq, Hq, Dqk) with ``cu_seqlens_q`` int32 (B + 1,) and ``max_seqlen_q``, out (Tq, Hq,
    Dv), lse (Hq, Tq).  Each sequence's queries are its newest positions.  The cache: paged,
    k_cache (num_pages, page_size, Hkv, Dqk) and v_cache (num_pages, page_size, Hkv, Dv)
    addressed through ``page_table`` int32 (B, max_pages) (unit stride along a row); or
    contiguous, (B, max_seqlen_k, Hkv, D).  ``cache_seqlens`` int32 (B,): each sequence's keys.

    ``cache_values`` / ``table_values`` / ``cu_values_q``: host copies of cache_seqlens,
    page_table and cu_seqlens_q where the caller read them; given, they are checked: each
    sequence's keys fit its pages (``cache_seqlens[b] <= max_pages * page_size``, contiguous
    ``<= max_seqlen_k``) and every page it uses (``page_table[b, :ceil(n_b / page_size)]``) is a
    page of the cache.  Not given, the kernel must clamp them (the caller's business)."""
    paged = page_table is not None
    packed = cu_seqlens_q is not None
    q = _check_tensor("q", q)
    caches = {"k_cache": _check_tensor("k_cache", k_cache), "v_cache": _check_tensor("v_cache", v_cache)}
    if out is not None:
        _check_tensor("out", out)
    _check_bool("causal", causal)
    _check_bool("return_lse", return_lse)
    if q.dtype not in INPUT_DTYPES:
        raise TypeError(f"q dtype must be one of {INPUT_DTYPES}, got {q.dtype}")
    for name, t in caches.items():
        if t.dtype != q.dtype:
            raise TypeError(f"{name} dtype {t.dtype} does not match q dtype {q.dtype}")
    if out is not None and out.dtype != OUTPUT_DTYPE:
        raise TypeError(f"out dtype must be {OUTPUT_DTYPE} (the output of every variant), got {out.dtype}")
    q_layout = "(total_q, heads, head_dim) with cu_seqlens_q" if packed else "(batch, seqlen_q, heads, head_dim)"
    for name, t in (("q", q), ("out", out)):
        if t is not None and t.ndim != (3 if packed else 4):
            raise ValueError(f"{name} must be {3 if packed else 4}-D {q_layout}, got shape {t.shape}")
    cache_layout = ("(num_pages, page_size, heads_kv, head_dim) with page_table" if paged
                    else "(batch, max_seqlen_k, heads_kv, head_dim)")
    for name, t in caches.items():
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D {cache_layout}, got shape {t.shape}")
    kc, vc = caches["k_cache"], caches["v_cache"]
    if vc.shape[:3] != kc.shape[:3]:
        raise ValueError(f"v_cache shape {vc.shape} does not match k_cache shape {kc.shape} "
                         "(all but the head dim must match)")
    _check_heads(q, kc, vc, head_axis=-2)
    hq, dqk, dv, hkv = q.shape[-2], q.shape[-1], vc.shape[-1], kc.shape[-2]

    # the sequences and their queries
    scalars = []
    if packed:
        cu = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q)
        batch, tq = cu.shape[0] - 1, q.shape[0]
        max_q = _check_max_seqlen("max_seqlen_q", max_seqlen_q)
        if cu_values_q is not None:
            _check_cu_values("q", cu_values_q, batch + 1, tq, max_q)
        scalars.append(("cu_seqlens_q", cu))
        out_shape, lse_shape = (tq, hq, dv), (hq, tq)
    else:
        if max_seqlen_q is not None:
            raise ValueError("max_seqlen_q goes with cu_seqlens_q (packed queries); q of shape (batch, seqlen_q, "
                             "heads, head_dim) gives it")
        batch, max_q = q.shape[0], q.shape[1]
        for name, n in (("q batch size", batch), ("q seqlen", max_q)):
            if n < 1:
                raise ValueError(f"{name} must be >= 1, got {n}")
        tq = batch * max_q
        out_shape, lse_shape = (batch, max_q, hq, dv), (batch, hq, max_q)
    if out is not None and out.shape != out_shape:
        raise ValueError(f"out shape {out.shape} must be {out_shape} (q's rows and heads, head_dim_v)")

    # the cache
    if paged:
        num_pages, page_size = kc.shape[:2]
        check_page_size(page_size)
        if num_pages < 1:
            raise ValueError("k_cache has no pages")
        table = _check_tensor("page_table", page_table)
        if table.dtype != "int32":
            raise TypeError(f"page_table must be int32, got {table.dtype}")
        if table.ndim != 2 or table.shape[0] != batch or table.shape[1] < 1:
            raise ValueError(f"page_table must be (batch, max_pages) = ({batch}, >= 1), got shape {table.shape}")
        if table.shape[1] > 1 and table.strides[1] != 1:
            raise ValueError(f"page_table must have unit stride along a sequence's pages, got {table.strides[1]}")
        if batch > 1 and table.strides[0] < 0:
            raise ValueError(f"page_table has a negative stride ({table.strides[0]}) in dim 0")
        max_pages = table.shape[1]
        capacity = max_pages * page_size
        _check_int32(num_pages=num_pages, max_pages=max_pages, **{"max_pages * page_size": capacity})
        scalars.append(("page_table", table))
    else:
        if kc.shape[0] != batch:
            raise ValueError(f"k_cache batch size {kc.shape[0]} does not match the {batch} sequences of q")
        num_pages = page_size = max_pages = 0
        capacity = kc.shape[1]
        if capacity < 1:
            raise ValueError("k_cache must have max_seqlen_k >= 1 rows a sequence")
    seqlens = _check_tensor("cache_seqlens", cache_seqlens)
    if seqlens.dtype != "int32":
        raise TypeError(f"cache_seqlens must be int32, got {seqlens.dtype}")
    if seqlens.shape != (batch,):
        raise ValueError(f"cache_seqlens must have shape (batch,) = ({batch},), got {seqlens.shape}")
    if batch > 1 and seqlens.strides[0] != 1:
        raise ValueError(f"cache_seqlens must be contiguous, got stride {seqlens.strides[0]}")
    scalars.insert(0, ("cache_seqlens", seqlens))
    if cache_values is not None:
        _check_cache_values(cache_values, table_values, batch, capacity, page_size, num_pages)
    _check_int32(batch=batch, max_seqlen_q=max_q, max_seqlen_k=capacity, heads_q=hq)

    _check_lse(lse, lse_shape, return_lse)
    scale = _check_scale(softmax_scale, dqk)
    window, cap, named = _check_features(causal, window_size, softcap, sinks, scale, hq, max_q, capacity)
    device = _common_end({"q": q, **caches}, out, tuple(scalars) + named, descale_q, descale_k, descale_v,
                         host_ok, (batch, hkv), lse)
    rows = num_pages * page_size if paged else batch * capacity
    return Problem(dtype=q.dtype, d_qk=dqk, d_v=dv, causal=window[1] == 0, batch=batch, hq=hq, hkv=hkv,
                   seqlen_q=max_q, seqlen_k=capacity, varlen=packed, total_q=tq, total_k=rows,
                   softmax_scale=scale, return_lse=bool(return_lse), device=device, window=window,
                   softcap=cap, sinks=sinks is not None, kvcache="paged" if paged else "contiguous",
                   page_size=page_size, num_pages=num_pages, max_pages=max_pages)


def _check_cache_values(cache_values, table_values, batch, capacity, page_size, num_pages):
    """Each sequence's key count within its part of the cache, and (paged) every page it uses
    a page of the cache."""
    n = np.asarray(cache_values).astype(np.int64).reshape(-1)
    if n.shape != (batch,):
        raise ValueError(f"the values of cache_seqlens have shape {n.shape}, not ({batch},)")
    if (n < 0).any():
        b = int(np.argmax(n < 0))
        raise ValueError(f"cache_seqlens[{b}] = {n[b]} is negative")
    if (n > capacity).any():
        b = int(np.argmax(n > capacity))
        where = (f"its page_table row holds {capacity // page_size} pages of {page_size} rows "
                 f"({capacity} keys)" if page_size else f"k_cache holds {capacity} rows a sequence")
        raise ValueError(f"cache_seqlens[{b}] = {n[b]} is more keys than the cache has for it: {where}")
    if not page_size:
        return
    if table_values is None:
        raise ValueError("the values of page_table could not be read")
    table = np.asarray(table_values).astype(np.int64)
    for b in range(batch):
        used = table[b, :-(-int(n[b]) // page_size)]
        bad = (used < 0) | (used >= num_pages)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"page_table[{b}, {i}] = {used[i]} is not a page of k_cache (0 .. {num_pages - 1}); "
                             f"sequence {b} uses its first {used.size} entries for {n[b]} keys")


def check_cu_seqlens(name: str, x) -> TensorRef:
    """A cu_seqlens tensor: int32, 1-D with batch + 1 >= 2 entries, contiguous."""
    t = _check_tensor(name, x)
    if t.dtype != "int32":
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.ndim != 1 or t.shape[0] < 2:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 entries, got shape {t.shape}")
    if t.strides[0] != 1:
        raise ValueError(f"{name} must be contiguous, got stride {t.strides[0]}")
    return t


# --------------------------------------------------------------------------------------
# Windows, softcap and sinks.

def check_window(causal, window_size) -> tuple[int, int]:
    """``window_size``: a tuple or list of two ints, each -1 (no bound) or >= 0 and within
    int32; with ``causal`` (the right bound 0) the right one must be 0 or -1.  Returns the
    window meant (window.normalize)."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a tuple (left, right) of two ints, got {window_size!r}")
    for side, x in zip(("left", "right"), window_size):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"window_size {side} bound must be an int, got {type(x).__name__}")
        if x < -1:
            raise ValueError(f"window_size {side} bound must be -1 (unbounded) or >= 0, got {x}")
        _check_int32(**{f"window_size {side} bound": int(x)})
    if causal and int(window_size[1]) not in (-1, 0):
        raise ValueError(f"causal=True sets the window's right bound to 0, but window_size={tuple(window_size)} "
                         "asks for another: pass causal=False with that window, or a right bound of 0 or -1")
    return windows.normalize(causal, window_size)


#: The smallest softcap: the gfx950 FP8 kernels scale capped scores by fp32(softcap log2 e),
#: which their byte arithmetic needs at 2^-115 or more (docs/gfx950_fp8.md, the Lean byte).
SOFTCAP_MIN = 2.0 ** -115


def check_softcap(softcap, softmax_scale: float) -> float:
    """``softcap``: 0 (off) or a finite real of at least SOFTCAP_MIN whose fp32 value and the
    kernels' fp32 ``softmax_scale / softcap`` are finite normal numbers."""
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    cap = float(softcap)
    if not (math.isfinite(cap) and cap >= 0):
        raise ValueError(f"softcap must be finite and >= 0 (0: off), got {softcap}")
    if cap == 0:
        return 0.0
    if cap < SOFTCAP_MIN:
        raise ValueError(f"softcap = {softcap} is below 2^-115, the smallest the kernels take (0: off); "
                         "softcaps are the logits' scale, 30 or 50 in Gemma 2")
    tiny = float(np.finfo(np.float32).tiny)
    with np.errstate(over="ignore", under="ignore"):
        f32, ratio = np.float32(cap), np.float32(softmax_scale / cap)
    if not (np.isfinite(f32) and f32 >= tiny and np.isfinite(ratio) and ratio >= tiny):
        raise ValueError(f"softcap = {softcap} with softmax_scale = {softmax_scale}: both softcap and "
                         "softmax_scale / softcap must be finite normal numbers in float32")
    return cap


def check_sinks(sinks, hq: int) -> TensorRef:
    """``sinks``: fp32 (Hq,) (one logit a query head), unit stride, writable or not; its place
    is checked with the other tensors (on the call's device)."""
    _check_tensor("sinks", sinks)
    if sinks.dtype != "float32":
        raise TypeError(f"sinks must be float32, got {sinks.dtype}")
    if sinks.shape != (hq,):
        raise ValueError(f"sinks has shape {sinks.shape}; it holds one logit a query head: ({hq},)")
    if hq > 1 and sinks.strides[0] != 1:
        raise ValueError(f"sinks must be contiguous (unit stride), got stride {sinks.strides[0]}")
    return sinks


def _check_features(causal, window_size, softcap, sinks, scale, hq, max_q, max_k):
    """The window (reduced to the bounds that cut keys of sequences up to max_q queries and
    max_k keys), the softcap and the sinks, as (window, softcap, named tensors)."""
    _check_bool("causal", causal)
    window = check_window(causal, window_size)
    window = windows.reduce(window, max_q, max_k)
    cap = check_softcap(softcap, scale)
    named = (("sinks", check_sinks(sinks, hq)),) if sinks is not None else ()
    return window, cap, named


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
