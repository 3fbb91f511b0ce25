"""Public API, with FlashAttention's names and layouts.

The flow of one call: inputs -> TensorRefs (tensors.py) -> every rule checked
(validate.py) -> variant chosen from the device's arch -> kernel loaded once
(kernels.py) -> its Layout (the arguments, grids and tensor-map geometry that are no
address) -> argument buffer packed from the manifest layout and launched (launch.py).
Nothing reaches the GPU before validation has passed.  Two caches shorten a dense call
that comes again: new tensors of a Layout already made have only their addresses checked;
the same tensors (``out`` given, no LSE) queue their Plan's launches again."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import os
import threading

import numpy as np

from . import launch as _launch
from . import staging, validate, workspace
from .catalogue import Variant, vt_columns
from .driver import get_driver
from .kernels import KernelTable
from .memory import DeviceArray, device_kind
from .tensors import TensorRef, as_tensor, contiguous_strides, stream_handle

_lock = threading.Lock()
_tables: dict[str, KernelTable] = {}
_ones: dict[tuple[str, int], DeviceArray] = {}


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


def _one(driver, device: int) -> int:
    """A device float32 holding 1.0: the descale used when the caller passes none."""
    key = (driver.name, device)
    with _lock:
        buf = _ones.get(key)
        if buf is None:
            buf = DeviceArray(driver, device, (1,), "float32")
            driver.copy_htod(buf.ptr, memoryview(np.ones(1, np.float32).view(np.uint8)))
            _ones[key] = buf
        return buf.ptr


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


#: The gfx950 FP8 kernels address each (sequence, head) slice of a tensor through a buffer
#: resource: 32-bit offsets and range checks, rows past the sequence read as zeros.
BUFFER_SPAN_LIMIT = 2**31


def _check_buffer_spans(problem: validate.Problem, q, k, v, out) -> None:
    """What the buffer addressing of the gfx950 FP8 kernels needs, as a clear error: the rows
    one buffer covers span less than 2 GiB (K and V: a whole sequence of one head; Q and O:
    the 256 rows of a workgroup), and rows do not overlap (a row stride of at least the head
    dim: the range check that ends a sequence relies on it)."""
    b_ = 0 if problem.varlen else 1
    block_m = Variant("gfx950", problem.dtype, problem.d_qk, problem.d_v, problem.causal).tile.block_m
    rows_q = min(problem.seqlen_q, block_m)
    checks = [("q", q, rows_q, problem.d_qk, 1), ("k", k, problem.seqlen_k, problem.d_qk, 1),
              ("v", v, problem.seqlen_k, problem.d_v, 1)]
    if out is not None:
        checks.append(("out", out, rows_q, problem.d_v, 2))
    for name, t, rows, d, elem in checks:
        stride = int(t.strides[b_])
        if rows > 1 and stride < d:
            raise ValueError(f"{name}: a sequence stride of {stride} elements is below the head "
                             f"dim {d}: rows overlap, which the gfx950 FP8 kernels do not support")
        span = ((max(rows, 1) - 1) * stride + d) * elem
        if span >= BUFFER_SPAN_LIMIT:
            raise ValueError(f"{name}: the rows one buffer of the gfx950 FP8 kernels covers span "
                             f"{span} bytes, more than {BUFFER_SPAN_LIMIT - 1} (32-bit offsets): "
                             "use a smaller row stride or shorter key sequences")


@dataclasses.dataclass(frozen=True)
class Layout:
    """A call's launches less its addresses: what every call of one layout shares (the
    tensors' shapes, strides, dtypes and devices, the options, the stream).  Made once such a
    call has passed validation; the next call of that layout checks only its addresses
    (``validate.check_addresses``) before :func:`_instantiate` fills them in."""
    problem: validate.Problem
    kernel: object
    values: dict                      # every argument that is no address
    tensor_maps: dict                 # argument -> (tensor, dims, strides, box, swizzle bytes)
    grids: tuple                      # launch.grids: (the pre-pass's or None, the kernel's, the tail's or None)
    vt_bytes: int                     # of the V^T in the workspace (0: no pre-pass)
    partial_bytes: int                # of a balanced tail's partials in it, after the V^T (0: none)
    counter: tuple                    # (argument, bytes) of a tile counter: a persistent kernel's, a tail's
    lse: tuple                        # (shape, strides) of the LSE
    dependent: bool                   # queued as programmatic dependents (env and manifest allow it)


def _layout_of(problem: validate.Problem, q, k, v, out, driver, lse_shape, lse_strides) -> Layout:
    """The kernel, the arguments that are no address, the tensor maps' geometry and the
    grids of a validated call: every rule that reads sizes or strides is applied here."""
    kind, device = problem.device
    table = kernel_table(driver)
    arch = table.device_arch(device)
    variant = Variant(arch, problem.dtype, problem.d_qk, problem.d_v, problem.causal)
    kernel = table.get(device, variant)
    if variant.built_from == "asm-generator":
        _check_buffer_spans(problem, q, k, v, out)

    b_ = 0 if problem.varlen else 1  # dense tensors have a leading batch dim
    def strides(st: tuple):
        return (st[0] if not problem.varlen else 0, st[b_], st[b_ + 1])
    # out where the call allocates it: contiguous
    o_strides = out.strides if out is not None else contiguous_strides(q.shape[:-1] + (problem.d_v,))

    values = {
        "lse_stride_b": lse_strides[0], "lse_stride_h": lse_strides[1],
        "batch": problem.batch, "hq": problem.hq, "hkv": problem.hkv,
        "seqlen_q": problem.seqlen_q, "seqlen_k": problem.seqlen_k,
        "softmax_scale": problem.softmax_scale,
    }
    for name, st in (("q", q.strides), ("k", k.strides), ("v", v.strides), ("o", o_strides)):
        values[f"{name}_stride_b"], values[f"{name}_stride_s"], values[f"{name}_stride_h"] = strides(st)
    maps = {arg: _tensor_map_geometry(problem, values, spec)
            for arg, spec in kernel.entry.get("tensor_maps", {}).items()}
    sm_count, counter, partial_bytes = None, None, 0
    dependent = (_launch.dependent_launches(os.environ.get("ZYFA_DEPENDENT_LAUNCH", "on"))
                 and bool(kernel.entry.get("dependent_launch")))
    if "persistent" in kernel.entry:
        # One CTA an SM taking tiles from a counter: the tiles, and the counter's size.
        values.update(_launch.persistent_tiles(kernel, values))
        counter = ("tile_counter", kernel.entry["persistent"]["counter_bytes"])
        sm_count = driver.attribute(device, "multiprocessor_count")
    if "split_tail" in kernel.entry:
        # The tiles past the last whole wave cut by keys (launch.tail_plan): their pieces'
        # partials in the workspace after the V^T, a count a cut tile.
        tail = kernel.entry["split_tail"]
        values.update(_launch.persistent_tiles(kernel, values, "split_tail"))
        values.update(_launch.tail_plan(kernel.entry, values, driver.attribute(device, "multiprocessor_count"),
                                        problem.varlen, os.environ.get("ZYFA_SPLIT_TAIL", "auto"),
                                        dependent))
        partial_bytes = 2 * values["tail_ctas"] * tail["slot_bytes"]
        counter = ("tail_counter", max(values["tile_count"] - values["tail_first"], 1) * tail["counter_bytes"])
    vt_bytes = 0
    if "prepass" in kernel.entry:
        # The V^T pre-pass: its workspace, laid out by catalogue.vt_columns.
        values["vt_stride_h"] = problem.d_v * vt_columns(problem.batch, problem.seqlen_k,
                                                         problem.total_k if problem.varlen else None)
        vt_bytes = problem.hkv * values["vt_stride_h"]
    grids = _launch.grids(driver, kernel, values, sm_count)
    return Layout(problem, kernel, values, maps, grids, vt_bytes, partial_bytes, counter, (lse_shape, lse_strides),
                  dependent)


#: Bytes the partials of a balanced tail start at, after the V^T in the workspace.
PARTIALS_ALIGN = 256


def _partials_at(vt_bytes: int) -> int:
    return -(-vt_bytes // PARTIALS_ALIGN) * PARTIALS_ALIGN


def _instantiate(layout: Layout, q, k, v, out, descales, cu_q, cu_k, stream: int, driver):
    """Queue ``layout``'s launches for these tensors (their addresses checked): the outputs
    the call allocates (out where not given, the LSE where asked for), and the Plan that queues
    the same launches again."""
    problem, kernel = layout.problem, layout.kernel
    device = problem.device[1]
    out_arr = None
    if out is None:
        out_arr = DeviceArray(driver, device, q.shape[:-1] + (problem.d_v,), "bf16")
        out = out_arr.ref
    lse_arr = DeviceArray(driver, device, layout.lse[0], "float32") if problem.return_lse else None
    values = dict(layout.values)
    values.update(q=q.ptr, k=k.ptr, v=v.ptr, o=out.ptr, lse=lse_arr.ptr if lse_arr is not None else None,
                  cu_seqlens_q=cu_q.ptr if cu_q is not None else None,
                  cu_seqlens_k=cu_k.ptr if cu_k is not None else None)
    if problem.dtype == "fp8_e4m3":
        for name, d in zip(("descale_q", "descale_k", "descale_v"), descales):
            values[name] = d.ptr if d is not None else _one(driver, device)

    driver.make_current(device)
    tensors = {"q": q, "k": k, "v": v, "out": out, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
               "descale_q": descales[0], "descale_k": descales[1], "descale_v": descales[2]}
    extents = {name: t.extent() for name, t in tensors.items() if t is not None}
    for arg, (tensor, *geometry) in layout.tensor_maps.items():
        values[arg] = driver.tensor_map_u8(values[tensor], *geometry)
    counter = None
    if layout.counter is not None:
        name, nbytes = layout.counter
        values[name] = workspace.counter(driver, device, stream, nbytes)
        counter = (nbytes, values[name])
        extents[name] = (counter[1], counter[1] + counter[0])
    # The workspace: the V^T, then a balanced tail's partials.
    ws_bytes = _partials_at(layout.vt_bytes) + layout.partial_bytes if layout.partial_bytes else layout.vt_bytes
    hold = workspace.hold(driver, device, stream, ws_bytes) if ws_bytes else contextlib.nullcontext()
    with hold as ws:
        if layout.vt_bytes:
            values["vt"] = ws
            extents["vt"] = (ws, ws + layout.vt_bytes)
        if "split_tail" in kernel.entry:
            values["partials"] = ws + _partials_at(layout.vt_bytes) if layout.partial_bytes else None
            if layout.partial_bytes:
                extents["partials"] = (values["partials"], values["partials"] + layout.partial_bytes)
        launches = _launch.assemble(kernel, layout.grids, _launch.pack_args(kernel, values), layout.dependent)
        plan = Plan(device, launches, extents, (ws_bytes, ws) if ws is not None else None, counter)
        plan.queue(driver, stream)
    return out_arr, lse_arr, plan


@dataclasses.dataclass(frozen=True)
class Plan:
    """A call's launches as queued, to queue again for the same call: the same inputs (every
    pointer, shape, stride and dtype), options, stream and backend give the same argument
    buffers, so a repeated call skips validation, tensor maps and packing.  The workspace and
    tile counter addresses the buffers hold are checked on every reuse (a grown or released
    workspace has moved: the call is planned anew).  It holds no reference to the tensors."""
    device: int
    launches: tuple
    extents: dict                     # name -> (lo, hi), for the driver's tensor_extents
    vt: tuple[int, int] | None        # (bytes, address) of the V^T workspace
    counter: tuple[int, int] | None   # (bytes, address) of a persistent kernel's tile counter

    def queue_again(self, driver, stream: int) -> bool:
        """Queue the launches on ``stream`` if the workspace and counter are where they were;
        False (nothing queued) otherwise."""
        if self.counter is not None:
            if workspace.counter(driver, self.device, stream, self.counter[0]) != self.counter[1]:
                return False
        driver.make_current(self.device)
        hold = workspace.hold(driver, self.device, stream, self.vt[0]) if self.vt else contextlib.nullcontext()
        with hold as vt:
            if self.vt is not None and vt != self.vt[1]:
                return False
            self.queue(driver, stream)
        return True

    def queue(self, driver, stream: int) -> None:
        """Queue the launches on ``stream`` (the workspace, where there is one, held)."""
        with driver.tensor_extents(self.extents):
            _launch.queue(driver, self.launches, stream)


#: Plans of recent dense calls that wrote into a given ``out`` without an LSE, by call key; and
#: layouts of recent dense calls, by layout key.
PLAN_CACHE_SIZE = 256
LAYOUT_CACHE_SIZE = 256
_plans: "collections.OrderedDict[tuple, Plan]" = collections.OrderedDict()
_layouts: "collections.OrderedDict[tuple, Layout]" = collections.OrderedDict()


def _options_key(causal, softmax_scale, return_lse) -> tuple | None:
    """The options as a key, or None where they are not plainly bools and a number (such a
    call goes through validation, which names the problem)."""
    if type(causal) is not bool or type(return_lse) is not bool or \
            not (softmax_scale is None or type(softmax_scale) in (int, float)):
        return None
    return causal, None if softmax_scale is None else float(softmax_scale), return_lse


def _plan_key(driver, refs, options, stream: int) -> tuple:
    """Everything a dense call's launches depend on (not the tensors themselves: the cache must
    not keep them alive)."""
    return (id(driver), options, int(stream),
            *(None if r is None else (r.ptr, r.shape, r.strides, r.dtype, r.device, r.readonly) for r in refs))


def _layout_key(driver, refs, options, stream: int) -> tuple:
    """What a dense call's launches depend on but its addresses."""
    return (id(driver), options, int(stream),
            *(None if r is None else (r.shape, r.strides, r.dtype, r.device, r.readonly) for r in refs))


def _cached(cache: collections.OrderedDict, key):
    with _lock:
        found = cache.get(key)
        if found is not None:
            cache.move_to_end(key)
        return found


def _keep(cache: collections.OrderedDict, key, value, size: int) -> None:
    with _lock:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > size:
            cache.popitem(last=False)


def _tensor_map_geometry(problem: validate.Problem, values: dict, spec: dict) -> tuple:
    """Where the sm_90a kernels' TMA tensor map of Q, K or V (``spec["tensor"]``) comes from,
    all but its address: (the tensor's argument, dims, strides, box, swizzle bytes); dims in bytes of (head
    dim, heads, rows, sequences), a packed batch as one sequence of all its rows; box and
    swizzle as the manifest's ``spec`` (catalogue.tensor_maps).  TMA takes strides in multiples
    of 16 bytes."""
    t = spec["tensor"]
    elem = 1 if problem.dtype == "fp8_e4m3" else 2
    row_bytes = elem * (problem.d_v if t == "v" else problem.d_qk)
    heads = problem.hq if t == "q" else problem.hkv
    total, seqlen = (problem.total_q, problem.seqlen_q) if t == "q" else (problem.total_k, problem.seqlen_k)
    rows = max(total if problem.varlen else seqlen, 1)
    one_sequence = problem.varlen or problem.batch == 1
    # a dimension of one element: its stride is never used, so any valid one stands in
    row = elem * values[f"{t}_stride_s"] if rows > 1 else heads * row_bytes
    strides = (elem * values[f"{t}_stride_h"] if heads > 1 else row_bytes, row,
               rows * row if one_sequence else elem * values[f"{t}_stride_b"])
    bad = [s for s in strides if s <= 0 or s % 16]
    if bad:
        raise ValueError(f"{t}: the sm_90a kernels read {t.upper()} by TMA, which needs its head, row and batch "
                         f"strides to be positive multiples of 16 bytes; got {strides[0]}, {strides[1]}, "
                         f"{strides[2]} bytes")
    dims = (row_bytes, heads, rows, 1 if problem.varlen else problem.batch)
    return t, dims, strides, tuple(spec["box"]), spec["swizzle_bytes"]


def _result(out_given, out_arr, lse_arr, return_lse: bool):
    o = out_given if out_given is not None else out_arr
    return (o, lse_arr) if return_lse else o


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
    options = _options_key(causal, softmax_scale, return_lse)
    # A call that repeats one already validated and queued (the same tensors, options and
    # stream) queues its launches again.  Only with ``out`` given and no LSE: otherwise each
    # call allocates, and its outputs' addresses are new.
    key = _plan_key(driver, refs, options, s) if options and outr is not None and not return_lse else None
    if key is not None:
        plan = _cached(_plans, key)
        if plan is not None and plan.queue_again(driver, s):
            return out
    # A call of a layout already validated (new addresses) has only its addresses checked.
    lkey = _layout_key(driver, refs, options, s) if options else None
    layout = _cached(_layouts, lkey) if lkey is not None else None
    if layout is not None:
        validate.check_addresses({"q": qr, "k": kr, "v": vr}, outr,
                                 tuple((n, d) for n, d in zip(("descale_q", "descale_k", "descale_v"), refs[4:])
                                       if d is not None))
    else:
        problem = validate.check_dense(qr, kr, vr, outr, causal=causal, softmax_scale=softmax_scale,
                                       descale_q=dq, descale_k=dk, descale_v=dv, return_lse=return_lse,
                                       host_ok=driver.host_memory_is_device)
        _check_backend(driver, problem)
        layout = _layout_of(problem, qr, kr, vr, outr, driver, (problem.batch, problem.hq, problem.seqlen_q),
                            (problem.hq * problem.seqlen_q, problem.seqlen_q))
        if lkey is not None:
            _keep(_layouts, lkey, layout, LAYOUT_CACHE_SIZE)
    out_arr, lse, plan = _instantiate(layout, qr, kr, vr, outr, (dq, dk, dv), None, None, s, driver)
    if key is not None:
        _keep(_plans, key, plan, PLAN_CACHE_SIZE)
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
    options = _options_key(causal, softmax_scale, return_lse)
    # A call of a layout already validated (shapes, strides, the cu_seqlens' and max_seqlen
    # included) has its cu_seqlens values and its addresses checked, as each call's may differ.
    lkey = None
    if options and type(max_seqlen_q) is int and type(max_seqlen_k) is int and None not in (cq, ck):
        lkey = ("varlen", _layout_key(driver, refs, options, s), max_seqlen_q, max_seqlen_k,
                *((r.shape, r.strides, r.dtype, r.device) for r in (cq, ck)))
    layout = _cached(_layouts, lkey) if lkey is not None else None
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
        layout = _layout_of(problem, qr, kr, vr, outr, driver, (problem.hq, problem.total_q), (0, problem.total_q))
        if lkey is not None:
            _keep(_layouts, lkey, layout, LAYOUT_CACHE_SIZE)
    # No plan is kept: the cu_seqlens values may change where nothing else does.
    host = [(i, values) for i, (ref, values) in enumerate(((cq, values_q), (ck, values_k))) if _staged(driver, ref)]
    stage = (staging.stage(driver, problem.device[1], s, [values for _, values in host]) if host
             else contextlib.nullcontext([]))
    with stage as ptrs:
        cu = [cq, ck]
        for (i, values), ptr in zip(host, ptrs):
            cu[i] = TensorRef(ptr, values.shape, (1,), "int32", problem.device)
        out_arr, lse, _plan = _instantiate(layout, qr, kr, vr, outr, (dq, dk, dv), cu[0], cu[1], s, driver)
    return _result(out, out_arr, lse, return_lse)


def _check_backend(driver, problem: validate.Problem) -> None:
    kind, device = problem.device
    if kind != device_kind(driver):
        raise ValueError(f"the inputs are on a {kind!r} device but the active backend is "
                         f"{driver.name!r} (set ZYFA_BACKEND to choose another)")
    n = driver.device_count()
    if not 0 <= device < n:
        raise ValueError(f"the inputs are on device {device}, but the {driver.name} backend sees {n}")
