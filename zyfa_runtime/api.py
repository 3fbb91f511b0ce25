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
from .tensors import TensorRef, as_tensor, stream_handle

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
                    descale_q=None, descale_k=None, descale_v=None, out=None,
                    return_lse: bool = False, stream=None):
    """Attention forward over a batch of equal-length sequences.

    q (B, Sq, Hq, Dqk), k (B, Sk, Hkv, Dqk), v (B, Sk, Hkv, Dv); returns out (B, Sq, Hq, Dv)
    in bf16 -- ``out`` itself when given, else a :class:`DeviceArray` -- and, with
    ``return_lse``, also the fp32 natural-log LSE (B, Hq, Sq).  FP8 inputs (e4m3) take
    optional fp32 per-tensor descales (device tensors of one element).
    """
    driver = get_driver()
    s = stream_handle(stream)
    qr, kr, vr = _ref(driver, q, s), _ref(driver, k, s), _ref(driver, v, s)
    outr = _ref(driver, out, s)
    dq, dk, dv = (_ref(driver, d, s) for d in (descale_q, descale_k, descale_v))
    refs = (qr, kr, vr, outr, dq, dk, dv)
    options = options_key(causal, softmax_scale, return_lse)
    # A call that repeats one already validated and queued (the same tensors, options and
    # stream) queues its launches again.  Only with ``out`` given and no LSE: otherwise each
    # call allocates, and its outputs' addresses are new.
    key = plan_key(driver, refs, options, s) if options and outr is not None and not return_lse else None
    if key is not None:
        plan = cached_plan(key)
        if plan is not None and plan.queue_again(driver, s):
            return out
    # A call of a layout already validated (new addresses) has only its addresses checked.
    lkey = layout_key(driver, refs, options, s) if options else None
    layout = cached_layout(lkey) if lkey is not None else None
    if layout is not None:
        validate.check_addresses({"q": qr, "k": kr, "v": vr}, outr,
                                 tuple((n, d) for n, d in zip(("descale_q", "descale_k", "descale_v"), refs[4:])
                                       if d is not None))
    else:
        problem = validate.check_dense(qr, kr, vr, outr, causal=causal, softmax_scale=softmax_scale,
                                       descale_q=dq, descale_k=dk, descale_v=dv, return_lse=return_lse,
                                       host_ok=driver.host_memory_is_device)
        _check_backend(driver, problem)
        layout = layout_of(problem, qr, kr, vr, outr, driver, kernel_table(driver),
                           (problem.batch, problem.hq, problem.seqlen_q),
                           (problem.hq * problem.seqlen_q, problem.seqlen_q))
        if lkey is not None:
            keep_layout(lkey, layout)
    out_arr, lse, plan = instantiate(layout, qr, kr, vr, outr, (dq, dk, dv), None, None, s, driver)
    if key is not None:
        keep_plan(key, plan)
    return _result(out, out_arr, lse, return_lse)


def flash_attn_varlen_func(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                           max_seqlen_k: int, causal: bool = False,
                           softmax_scale: float | None = None, descale_q=None, descale_k=None,
                           descale_v=None, out=None, return_lse: bool = False, stream=None):
    """Attention forward over packed sequences of different lengths.

    q (Tq, Hq, Dqk), k (Tk, Hkv, Dqk), v (Tk, Hkv, Dv); sequence b owns rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` (int32, length B+1).  Returns out (Tq, Hq, Dv) and,
    with ``return_lse``, the LSE (Hq, Tq).  The cu_seqlens values are checked before launch:

    * given in host memory (a NumPy array, a CPU tensor, a list of ints), they are checked
      there and copied to the device on ``stream`` through page-locked memory, without
      synchronising (``staging.py``); the call has read them when it returns;
    * given as device tensors, they are read back first: a small copy that synchronises.

    A call whose layout (shapes, strides, dtypes, devices, options, stream and max_seqlen) has
    been validated before has only its cu_seqlens values and its addresses checked.  A packed
    call cannot be captured into a graph (its cu_seqlens values are checked before launch): on a
    stream being captured it raises ValueError and queues nothing.
    """
    driver = get_driver()
    s = stream_handle(stream)
    if driver.stream_capturing(s):
        raise ValueError("flash_attn_varlen_func cannot be captured into a graph: its cu_seqlens "
                         "values are checked before launch (device ones are read back, which capture "
                         "forbids; host ones would be replayed from page-locked memory that later calls "
                         "rewrite); call it outside the capture")
    qr, kr, vr = _ref(driver, q, s), _ref(driver, k, s), _ref(driver, v, s)
    outr = _ref(driver, out, s)
    cq = _ref(driver, _int32_sequence(cu_seqlens_q), s)
    ck = _ref(driver, _int32_sequence(cu_seqlens_k), s)
    dq, dk, dv = (_ref(driver, d, s) for d in (descale_q, descale_k, descale_v))
    values_q, values_k = _cu_values(driver, cq), _cu_values(driver, ck)
    refs = (qr, kr, vr, outr, dq, dk, dv)
    options = options_key(causal, softmax_scale, return_lse)
    # A call of a layout already validated (shapes, strides, the cu_seqlens' and max_seqlen
    # included) has its cu_seqlens values and its addresses checked, as each call's may differ.
    lkey = varlen_layout_key(driver, refs, options, s, max_seqlen_q, max_seqlen_k, cq, ck)
    layout = cached_layout(lkey) if lkey is not None else None
    if layout is not None:
        validate.check_cu_values(layout.problem, values_q, values_k)
        scalars = [(n, r) for n, r in (("cu_seqlens_q", cq), ("cu_seqlens_k", ck), ("descale_q", dq),
                                       ("descale_k", dk), ("descale_v", dv))
                   if r is not None and not _staged(driver, r)]
        validate.check_addresses({"q": qr, "k": kr, "v": vr}, outr, tuple(scalars))
        problem = layout.problem
    else:
        problem = validate.check_varlen(
            qr, kr, vr, outr, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k, causal=causal, softmax_scale=softmax_scale,
            descale_q=dq, descale_k=dk, descale_v=dv, return_lse=return_lse,
            cu_values_q=values_q, cu_values_k=values_k,
            host_ok=driver.host_memory_is_device, host_cu=True)
        _check_backend(driver, problem)
        layout = layout_of(problem, qr, kr, vr, outr, driver, kernel_table(driver),
                           (problem.hq, problem.total_q), (0, problem.total_q))
        if lkey is not None:
            keep_layout(lkey, layout)
    # No plan is kept: the cu_seqlens values may change where nothing else does.
    host = [(i, values) for i, (ref, values) in enumerate(((cq, values_q), (ck, values_k))) if _staged(driver, ref)]
    stage = (staging.stage(driver, problem.device[1], s, [values for _, values in host]) if host
             else contextlib.nullcontext([]))
    with stage as ptrs:
        cu = [cq, ck]
        for (i, values), ptr in zip(host, ptrs):
            cu[i] = TensorRef(ptr, values.shape, (1,), "int32", problem.device)
        out_arr, lse, _plan = instantiate(layout, qr, kr, vr, outr, (dq, dk, dv), cu[0], cu[1], s, driver)
    return _result(out, out_arr, lse, return_lse)


# --------------------------------------------------------------------------------------
# Inputs as TensorRefs, and what validation does not see.

def _ref(driver, x, stream: int) -> TensorRef | None:
    """Any accepted input as a TensorRef.  ``__cuda_array_interface__`` does not say which
    device holds the memory (ordinal -1): the driver is asked."""
    if x is None:
        return None
    if isinstance(x, DeviceArray):
        return x.ref
    ref = as_tensor(x, stream=stream or None)
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
