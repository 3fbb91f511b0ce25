"""Public API, with FlashAttention's names and layouts.

The flow of one call: inputs -> TensorRefs (tensors.py) -> every rule checked
(validate.py) -> the kernel table of the installed manifest (kernels.py) -> the call planned
(plan.py: the variant of the device's arch, its Layout, its workspace) -> argument buffer
packed from the manifest layout and launched (launch.py).  Nothing reaches the GPU before
validation has passed.  Two caches of plan.py shorten a dense call that comes again: new
tensors of a Layout already made have only their addresses checked; the same tensors (``out``
given, no LSE) queue their Plan's launches again."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import threading

import numpy as np

from . import staging, validate
from .driver import get_driver
from .kernels import KernelTable
from .memory import DeviceArray, device_kind
from .plan import (cached_layout, cached_plan, instantiate, keep_layout, keep_plan, layout_key, layout_of,
                   options_key, plan_key, varlen_layout_key)
from .tensors import TensorRef, call_view, stream_handle

_lock = threading.Lock()
_tables: dict[str, KernelTable] = {}


def kernel_table(driver) -> KernelTable:
    """The kernel table of the installed manifest for this driver (built once, after the
    manifest and the driver's versions have passed ``versions.py``'s checks)."""
    from . import cache
    with _lock:
        table = _tables.get(driver.name)
        if table is None:
            prebuilt = cache.prebuilt_dir()
            table = KernelTable(driver, cache.load_manifest(prebuilt), prebuilt)
            _tables[driver.name] = table
        return table


def flash_attn_func(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                    window_size=(-1, -1), softcap: float = 0.0, sinks=None,
                    descale_q=None, descale_k=None, descale_v=None, out=None, lse=None,
                    return_lse: bool = False, stream=None):
    """Attention forward over a batch of equal-length sequences.

    q (B, Sq, Hq, Dqk), k (B, Sk, Hkv, Dqk), v (B, Sk, Hkv, Dv); returns out (B, Sq, Hq, Dv)
    in bf16 -- ``out`` itself when given, else a :class:`DeviceArray` -- and, with
    ``return_lse``, also the fp32 natural-log LSE (B, Hq, Sq): ``lse`` itself when given, else
    a DeviceArray.  FP8 inputs (e4m3) take optional fp32 descales: one value each (shape () or
    (1,)) or one a sequence and key/value head (shape (B, Hkv), any strides).

    ``window_size=(left, right)``: query i (at key position i + Sk - Sq) sees keys i + Sk - Sq
    - left .. i + Sk - Sq + right, -1 being no bound (``causal`` sets right = 0); ``softcap``
    > 0: each scaled score s becomes softcap tanh(s / softcap); ``sinks``: fp32 (Hq,) device
    tensor, one logit a query head joining each row's softmax denominator, with no value.  A
    kernel that does not implement one of them refuses the call (ValueError naming what it
    runs); a window that cuts no key is no window.

    On a stream being captured into a graph the call allocates nothing, waits for nothing and
    reads nothing back: give ``out`` (and ``lse`` with ``return_lse``); its scratch, where it
    needs any, is allocated and freed by the graph itself (workspace.py).
    """
    driver = get_driver()
    s = stream_handle(stream)
    captured = driver.stream_capturing(s)
    qr, kr, vr = _ref(driver, q, s), _ref(driver, k, s), _ref(driver, v, s)
    outr, lser = _ref(driver, out, s), _ref(driver, lse, s)
    dq, dk, dv = (_ref(driver, d, s) for d in (descale_q, descale_k, descale_v))
    sr = _ref(driver, sinks, s)
    if captured:
        _capturable("flash_attn_func", outr, lser, return_lse)
    refs = (qr, kr, vr, outr, lser, dq, dk, dv, sr)
    options = options_key(causal, softmax_scale, return_lse, window_size, softcap)
    # A call that repeats one already validated and queued (the same tensors, options and
    # stream) queues its launches again.  Only with ``out`` given, and ``lse`` where the LSE is
    # asked for (otherwise each call allocates, and its outputs' addresses are new), and never
    # inside a capture (the plan's scratch is the stream's; a graph has its own).
    key = (plan_key(driver, refs, options, s)
           if options and outr is not None and (lser is not None or not return_lse) and not captured else None)
    if key is not None:
        plan = cached_plan(key)
        if plan is not None and plan.queue_again(driver, s):
            return _result(out, None, lse, return_lse)
    # A call of a layout already validated (new addresses) has only its addresses checked.
    lkey = layout_key(driver, refs, options, s) if options else None
    layout = cached_layout(lkey) if lkey is not None else None
    if layout is not None:
        validate.check_addresses({"q": qr, "k": kr, "v": vr}, outr,
                                 tuple((n, d) for n, d in zip(("descale_q", "descale_k", "descale_v", "sinks"),
                                                              refs[5:]) if d is not None), lser)
    else:
        problem = validate.check_dense(qr, kr, vr, outr, causal=causal, softmax_scale=softmax_scale,
                                       descale_q=dq, descale_k=dk, descale_v=dv, return_lse=return_lse,
                                       host_ok=driver.host_memory_is_device, lse=lser,
                                       window_size=window_size, softcap=softcap, sinks=sr)
        _check_backend(driver, problem)
        layout = layout_of(problem, qr, kr, vr, outr, driver, kernel_table(driver),
                           (problem.batch, problem.hq, problem.seqlen_q),
                           tuple(lser.strides[:2]) if lser is not None else
                           (problem.hq * problem.seqlen_q, problem.seqlen_q), (dq, dk, dv))
        if lkey is not None:
            keep_layout(lkey, layout)
    out_arr, lse_arr, plan = instantiate(layout, qr, kr, vr, outr, lser, (dq, dk, dv), None, None, s, driver,
                                         captured, sinks=sr)
    if key is not None:
        keep_plan(key, plan)
    return _result(out, out_arr, lse if lse is not None else lse_arr, return_lse)


def flash_attn_varlen_func(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                           max_seqlen_k: int, causal: bool = False,
                           softmax_scale: float | None = None, window_size=(-1, -1), softcap: float = 0.0,
                           sinks=None, descale_q=None, descale_k=None,
                           descale_v=None, out=None, lse=None, return_lse: bool = False, stream=None,
                           check_cu_seqlens: bool = True):
    """Attention forward over packed sequences of different lengths.

    q (Tq, Hq, Dqk), k (Tk, Hkv, Dqk), v (Tk, Hkv, Dv); sequence b owns rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` (int32, length B+1).  Returns out (Tq, Hq, Dv) and,
    with ``return_lse``, the LSE (Hq, Tq) (``lse`` itself where given).  Descales,
    ``window_size``, ``softcap`` and ``sinks`` as :func:`flash_attn_func`'s, (B, Hkv) with B
    the sequences; the window applies in each sequence.  The cu_seqlens values:

    * given in host memory (a NumPy array, a CPU tensor, a list of ints), they are checked
      there and copied to the device on ``stream`` through page-locked memory, without
      synchronising (``staging.py``); the call has read them when it returns;
    * given as device tensors, they are read back to be checked first: a small copy that
      synchronises -- unless ``check_cu_seqlens=False`` (FlashAttention-3's behaviour): then
      they are not read at all, and the kernel clamps each sequence to the tensors' rows (its
      first row to [0, Tq], its end to [first, Tq], its length to max_seqlen; K and V alike),
      so that values that are not a valid batch give wrong output but never an access outside
      q, k, v, out or the LSE (every kernel does; a code object built before its kernel did
      refuses it).

    A call whose layout (shapes, strides, dtypes, devices, options, stream and max_seqlen) has
    been validated before has only its cu_seqlens values (where checked) and its addresses
    checked.  On a stream being captured into a graph only device cu_seqlens with
    ``check_cu_seqlens=False`` are accepted (host ones would be replayed from page-locked
    memory that later calls rewrite; checking device ones reads them back, which capture
    forbids), with ``out`` (and ``lse`` with ``return_lse``) given; anything else raises
    ValueError and queues nothing.
    """
    driver = get_driver()
    s = stream_handle(stream)
    captured = driver.stream_capturing(s)
    if not isinstance(check_cu_seqlens, (bool, np.bool_)):
        raise TypeError(f"check_cu_seqlens must be a bool, got {type(check_cu_seqlens).__name__}")
    qr, kr, vr = _ref(driver, q, s), _ref(driver, k, s), _ref(driver, v, s)
    outr, lser = _ref(driver, out, s), _ref(driver, lse, s)
    cq = _ref(driver, _int32_sequence(cu_seqlens_q), s)
    ck = _ref(driver, _int32_sequence(cu_seqlens_k), s)
    dq, dk, dv = (_ref(driver, d, s) for d in (descale_q, descale_k, descale_v))
    sr = _ref(driver, sinks, s)
    if captured:
        if any(_staged(driver, r) for r in (cq, ck)):
            raise ValueError("flash_attn_varlen_func on a stream being captured into a graph takes device "
                             "cu_seqlens with check_cu_seqlens=False: host ones would be replayed from "
                             "page-locked memory that later calls rewrite")
        if check_cu_seqlens:
            raise ValueError("flash_attn_varlen_func on a stream being captured into a graph cannot check its "
                             "cu_seqlens values (reading them back waits for the device, which capture "
                             "forbids): pass check_cu_seqlens=False (the kernel clamps every sequence to the "
                             "tensors' rows), or call it outside the capture")
        _capturable("flash_attn_varlen_func", outr, lser, return_lse)
    # Host values are read (free); device ones only where checked (a read-back waits for the GPU).
    read = [check_cu_seqlens or _staged(driver, r) for r in (cq, ck)]
    values_q = _cu_values(driver, cq) if read[0] else None
    values_k = _cu_values(driver, ck) if read[1] else None
    refs = (qr, kr, vr, outr, lser, dq, dk, dv, sr)
    options = options_key(causal, softmax_scale, return_lse, window_size, softcap)
    # A call of a layout already validated (shapes, strides, the cu_seqlens' and max_seqlen
    # included) has its cu_seqlens values and its addresses checked, as each call's may differ.
    lkey = varlen_layout_key(driver, refs, options, s, max_seqlen_q, max_seqlen_k, cq, ck)
    layout = cached_layout(lkey) if lkey is not None else None
    if layout is not None:
        if all(read):
            validate.check_cu_values(layout.problem, values_q, values_k)
        else:
            for suffix, values in (("q", values_q), ("k", values_k)):
                if values is not None:
                    validate.check_cu_values_of(layout.problem, suffix, values)
        scalars = [(n, r) for n, r in (("cu_seqlens_q", cq), ("cu_seqlens_k", ck), ("descale_q", dq),
                                       ("descale_k", dk), ("descale_v", dv), ("sinks", sr))
                   if r is not None and not _staged(driver, r)]
        validate.check_addresses({"q": qr, "k": kr, "v": vr}, outr, tuple(scalars), lser)
        problem = layout.problem
    else:
        problem = validate.check_varlen(
            qr, kr, vr, outr, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k, causal=causal, softmax_scale=softmax_scale,
            descale_q=dq, descale_k=dk, descale_v=dv, return_lse=return_lse,
            cu_values_q=values_q, cu_values_k=values_k,
            host_ok=driver.host_memory_is_device, host_cu=True, lse=lser,
            window_size=window_size, softcap=softcap, sinks=sr)
        _check_backend(driver, problem)
        layout = layout_of(problem, qr, kr, vr, outr, driver, kernel_table(driver),
                           (problem.hq, problem.total_q), (0, lser.strides[0] if lser is not None else problem.total_q),
                           (dq, dk, dv))
        if lkey is not None:
            keep_layout(lkey, layout)
    if not all(read) and not layout.clamps_cu_seqlens:
        raise ValueError(f"check_cu_seqlens=False needs a kernel that clamps every sequence to the tensors' rows; "
                         f"this {layout.kernel.variant.name} code object does not (built before its kernel did: "
                         "rebuild it): check the values (check_cu_seqlens=True), or pass them in host memory")
    # No plan is kept: the cu_seqlens values may change where nothing else does.
    host = [(i, values) for i, (ref, values) in enumerate(((cq, values_q), (ck, values_k))) if _staged(driver, ref)]
    stage = (staging.stage(driver, problem.device[1], s, [values for _, values in host]) if host
             else contextlib.nullcontext([]))
    with stage as ptrs:
        cu = [cq, ck]
        for (i, values), ptr in zip(host, ptrs):
            cu[i] = TensorRef(ptr, values.shape, (1,), "int32", problem.device)
        out_arr, lse_arr, _plan = instantiate(layout, qr, kr, vr, outr, lser, (dq, dk, dv), cu[0], cu[1], s,
                                              driver, captured, sinks=sr)
    return _result(out, out_arr, lse if lse is not None else lse_arr, return_lse)


def flash_attn_with_kvcache(q, k_cache, v_cache, *, cache_seqlens, page_table=None, cu_seqlens_q=None,
                            max_seqlen_q: int | None = None, causal: bool = False,
                            softmax_scale: float | None = None, window_size=(-1, -1), softcap: float = 0.0,
                            sinks=None, descale_q=None, descale_k=None, descale_v=None, out=None, lse=None,
                            return_lse: bool = False, stream=None, check_cache_seqlens: bool = True):
    """Attention of new queries over a KV cache: chunked prefill, prefix caching, decode.

    K and V come from a cache: paged, ``k_cache`` (num_pages, page_size, Hkv, Dqk) and
    ``v_cache`` (num_pages, page_size, Hkv, Dv) addressed through ``page_table`` (B, max_pages)
    int32 -- key t of sequence b is row t % page_size of page page_table[b, t // page_size],
    pages may be shared by sequences (a common prefix) --, page sizes multiples of 16 from 16
    to 256; or contiguous, (B, max_seqlen_k, Hkv, D) without a page table.  ``cache_seqlens``
    int32 (B,): each sequence's keys.  ``q`` (B, Sq, Hq, Dqk), or packed (Tq, Hq, Dqk) with
    ``cu_seqlens_q`` and ``max_seqlen_q``: each sequence's queries are its newest positions
    (bottom-right alignment, as flash_attn_func's with Sk = cache_seqlens[b]).  ``causal``,
    ``window_size``, ``softcap``, ``sinks``, descales, ``out``, ``lse``, ``return_lse`` and
    ``stream`` as :func:`flash_attn_func`'s.

    ``cache_seqlens``, ``page_table`` and ``cu_seqlens_q`` are device tensors (host memory
    where the backend's device memory is host memory).  Their values are read back and checked
    (a copy that waits for the GPU) -- every page a sequence uses a page of the cache, no
    sequence longer than its pages -- unless ``check_cache_seqlens=False`` (the choice on a
    stream being captured, with ``out`` given): then they are never read, and the kernel clamps
    every sequence length to its part of the cache and every page index to the cache, so that
    values that are not valid give wrong output but never an access outside the tensors.

    Such an unread call whose layout (shapes, strides, dtypes, devices, options, stream,
    max_seqlen_q) was planned before has only its addresses checked, and one that repeats its
    tensors exactly (``out`` given, and ``lse`` with ``return_lse``) queues its launches again.
    A kernel that does not list the KV cache (the manifest's ``features``: "kvcache", and
    "paged_kv" with ``page_table``) refuses the call (ValueError naming what it runs); an
    invalid call names its problem first.
    """
    driver = get_driver()
    s = stream_handle(stream)
    captured = driver.stream_capturing(s)
    if not isinstance(check_cache_seqlens, (bool, np.bool_)):
        raise TypeError(f"check_cache_seqlens must be a bool, got {type(check_cache_seqlens).__name__}")
    qr, kr, vr = _ref(driver, q, s), _ref(driver, k_cache, s), _ref(driver, v_cache, s)
    outr, lser = _ref(driver, out, s), _ref(driver, lse, s)
    seqr, tabler = _ref(driver, cache_seqlens, s), _ref(driver, page_table, s)
    cq = _ref(driver, cu_seqlens_q, s)
    dq, dk, dv = (_ref(driver, d, s) for d in (descale_q, descale_k, descale_v))
    sr = _ref(driver, sinks, s)
    if captured:
        if check_cache_seqlens:
            raise ValueError("flash_attn_with_kvcache on a stream being captured into a graph cannot check "
                             "cache_seqlens and page_table (reading them back waits for the device, which "
                             "capture forbids): pass check_cache_seqlens=False (the kernel clamps every page "
                             "index and length to the cache), or call it outside the capture")
        _capturable("flash_attn_with_kvcache", outr, lser, return_lse)
    read = check_cache_seqlens
    refs = (qr, kr, vr, outr, lser, dq, dk, dv, sr, seqr, tabler, cq)
    options = options_key(causal, softmax_scale, return_lse, window_size, softcap)
    # Values that are not read leave nothing to check but addresses: such a call of a layout
    # planned before reuses it, and one of the same tensors (out given, lse where asked for,
    # outside a capture) its Plan.  Read values are checked on every call (they may change).
    lkey = (("kvcache", layout_key(driver, refs, options, s), max_seqlen_q)
            if options and not read and type(max_seqlen_q) in (int, type(None)) else None)
    key = (plan_key(driver, refs, options, s) if lkey is not None and outr is not None and
           (lser is not None or not return_lse) and not captured else None)
    if key is not None:
        plan = cached_plan(key)
        if plan is not None and plan.queue_again(driver, s):
            return _result(out, None, lse, return_lse)
    layout = cached_layout(lkey) if lkey is not None else None
    if layout is not None:
        validate.check_addresses({"q": qr, "k_cache": kr, "v_cache": vr}, outr,
                                 tuple((n, r) for n, r in (("cache_seqlens", seqr), ("page_table", tabler),
                                                           ("cu_seqlens_q", cq), ("descale_q", dq),
                                                           ("descale_k", dk), ("descale_v", dv), ("sinks", sr))
                                       if r is not None), lser)
    else:
        problem = validate.check_kvcache(
            qr, kr, vr, outr, cache_seqlens=seqr, page_table=tabler, cu_seqlens_q=cq, max_seqlen_q=max_seqlen_q,
            causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap, sinks=sr,
            descale_q=dq, descale_k=dk, descale_v=dv, return_lse=return_lse,
            cache_values=_int32_values(driver, seqr) if read else None,
            table_values=_int32_values(driver, tabler) if read else None,
            cu_values_q=_int32_values(driver, cq) if read else None,
            host_ok=driver.host_memory_is_device, lse=lser)
        _check_backend(driver, problem)
        # LSE (B, Hq, Sq), or (Hq, Tq) for packed queries, as the other entry points'
        lse_shape, lse_strides = (((problem.hq, problem.total_q),
                                   (0, lser.strides[0] if lser is not None else problem.total_q))
                                  if problem.varlen else
                                  ((problem.batch, problem.hq, problem.seqlen_q),
                                   tuple(lser.strides[:2]) if lser is not None else
                                   (problem.hq * problem.seqlen_q, problem.seqlen_q)))
        layout = layout_of(problem, qr, kr, vr, outr, driver, kernel_table(driver), lse_shape, lse_strides,
                           (dq, dk, dv), page_table=tabler)
        if lkey is not None:
            keep_layout(lkey, layout)
    out_arr, lse_arr, plan = instantiate(layout, qr, kr, vr, outr, lser, (dq, dk, dv), cq, None, s, driver,
                                         captured, sinks=sr, cache=(seqr, tabler))
    if key is not None:
        keep_plan(key, plan)
    return _result(out, out_arr, lse if lse is not None else lse_arr, return_lse)


def _capturable(fn: str, out, lse, return_lse) -> None:
    """What a call on a stream being captured must be given: the outputs it would otherwise
    allocate (a graph may not own memory of the call's, and capture forbids allocating it)."""
    if out is None:
        raise ValueError(f"{fn} on a stream being captured into a graph needs out= (a call that allocates "
                         "its output cannot be captured)")
    if return_lse is True and lse is None:
        raise ValueError(f"{fn} on a stream being captured into a graph with return_lse=True needs lse= (a "
                         "call that allocates its LSE cannot be captured)")


# --------------------------------------------------------------------------------------
# Inputs as TensorRefs, and what validation does not see.

def _ref(driver, x, stream: int) -> TensorRef | None:
    """Any accepted input as a TensorRef.  ``__cuda_array_interface__`` does not say which
    device holds the memory (ordinal -1): the driver is asked."""
    if x is None:
        return None
    if isinstance(x, DeviceArray):
        return x.ref
    ref = call_view(x, stream)
    if ref.device[1] == -1:
        info = driver.pointer_info(ref.ptr)
        if info is not None and info[0] == ref.device[0]:
            ref = dataclasses.replace(ref, device=info)
    return ref


def _cu_values(driver, ref: TensorRef | None) -> np.ndarray | None:
    """A host copy of cu_seqlens, so that its values are validated before launch.

    None when it cannot be read as int32[n]; validation then reports the dtype, shape or
    host-memory problem itself.
    """
    if ref is None or ref.dtype != "int32" or len(ref.shape) != 1:
        return None
    if ref.shape[0] > 1 and ref.strides != (1,):
        return None
    host = np.empty(ref.shape, np.int32)
    if host.size == 0:
        return host
    if ref.device[0] == "cpu":
        ctypes.memmove(host.ctypes.data, ref.ptr, host.nbytes)
    else:
        driver.copy_dtoh(memoryview(host.view(np.uint8)), ref.ptr)
    return host


def _int32_values(driver, ref: TensorRef | None) -> np.ndarray | None:
    """A host copy of a small int32 tensor of the call (cache_seqlens, page_table,
    cu_seqlens_q) in its shape, to be validated before launch; None where it cannot be read
    as int32 of one or two dims with non-negative strides and a unit last one (validation
    then reports the problem itself).  Reading device memory waits for the GPU."""
    if ref is None or ref.dtype != "int32" or ref.ndim not in (1, 2) or any(st < 0 for st in ref.strides):
        return None
    if ref.shape[-1] > 1 and ref.strides[-1] != 1:
        return None
    lo, hi = ref.extent()
    if hi <= lo:
        return np.zeros(ref.shape, np.int32)
    raw = np.empty((hi - lo) // 4, np.int32)
    if ref.device[0] == "cpu" or driver.host_memory_is_device:
        ctypes.memmove(raw.ctypes.data, lo, raw.nbytes)
    else:
        driver.copy_dtoh(memoryview(raw.view(np.uint8)), lo)
    return np.lib.stride_tricks.as_strided(raw, ref.shape, tuple(4 * st for st in ref.strides)).copy()


def _staged(driver, ref: TensorRef | None) -> bool:
    """Whether ``ref`` is host memory that this backend's kernels cannot read: a packed call's
    cu_seqlens then reach them by staging.py's copy."""
    return ref is not None and ref.device[0] == "cpu" and not driver.host_memory_is_device


def _int32_sequence(x):
    """A list or tuple of ints as an int32 array (cu_seqlens given as Python values)."""
    if not isinstance(x, (list, tuple)):
        return x
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in x):
        raise TypeError("cu_seqlens given as a list or tuple must hold ints")
    values = np.array(x, dtype=np.int64)
    if values.size and (values.min() < -2**31 or values.max() >= 2**31):
        raise ValueError("cu_seqlens values must fit in int32")
    return values.astype(np.int32)


def _check_backend(driver, problem: validate.Problem) -> None:
    kind, device = problem.device
    if kind != device_kind(driver):
        raise ValueError(f"the inputs are on a {kind!r} device but the active backend is "
                         f"{driver.name!r} (set ZYFA_BACKEND to choose another)")
    n = driver.device_count()
    if not 0 <= device < n:
        raise ValueError(f"the inputs are on device {device}, but the {driver.name} backend sees {n}")


def _result(out_given, out_arr, lse_arr, return_lse: bool):
    o = out_given if out_given is not None else out_arr
    return (o, lse_arr) if return_lse else o
