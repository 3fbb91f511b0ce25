"""One normalised view of any array a caller hands us.

:func:`as_tensor` reads DLPack producers (versioned and legacy capsules), objects
exposing ``__cuda_array_interface__`` and NumPy arrays, and returns a
:class:`TensorRef`: a device address, a shape, strides in elements, a dtype name and a
device.  Nothing is copied and nothing touches a GPU; the producer (and, for DLPack,
the capsule) is kept referenced in ``TensorRef.owner`` so the memory outlives the view.

DLPack capsules are *borrowed*: the capsule is never renamed to ``used_dltensor``, so
the producer's own capsule destructor releases the export once the capsule dies.

Dtype names used throughout the runtime: ``bf16``, ``fp8_e4m3`` (OCP e4m3fn),
``float16``, ``float32``, ``float64``, ``int8`` ... ``int64``, ``uint8`` ... ``uint64``,
``bool``, plus ``fp8_e4m3fnuz`` and ``fp8_e5m2`` (recognised so they can be rejected
by name).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import sys
import threading
import weakref

import numpy as np

try:  # NumPy arrays of bfloat16 / float8 come from ml_dtypes.
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is an optional convenience
    ml_dtypes = None

__all__ = ["TensorRef", "as_tensor", "stream_handle", "ITEMSIZE", "call_view"]

#: Bytes per element of every dtype name the runtime knows.
ITEMSIZE = {
    "bool": 1,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "float16": 2, "float32": 4, "float64": 8,
    "bf16": 2,
    "fp8_e4m3": 1, "fp8_e4m3fnuz": 1, "fp8_e5m2": 1,
}

#: Dtypes whose values are raw storage and may be re-declared as another dtype of the
#: same element size (e.g. FP8 exported as uint8 by frameworks lacking FP8 DLPack).
_RAW = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}


@dataclasses.dataclass(frozen=True)
class TensorRef:
    """A borrowed, strided view of device or host memory."""

    ptr: int                    # address of element [0, ..., 0]; any byte offset is applied
    shape: tuple[int, ...]
    strides: tuple[int, ...]    # in elements
    dtype: str                  # a key of ITEMSIZE
    device: tuple[str, int]     # ("cuda", n), ("rocm", n) or ("cpu", n); n == -1: not known
    owner: object = dataclasses.field(default=None, compare=False, repr=False)
    readonly: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def extent(self) -> tuple[int, int]:
        """Byte range ``[lo, hi)`` covered by the elements; empty (``lo == hi``) if no elements."""
        lo, hi = _span(self.shape, self.strides, self.itemsize)
        return self.ptr + lo, self.ptr + hi


@functools.lru_cache(maxsize=1024)
def _span(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """The byte offsets ``[lo, hi)`` that a layout's elements cover from element [0, ..., 0]
    (a layout recurs call after call: kept)."""
    if math.prod(shape) == 0:
        return 0, 0
    lo = sum(s * (n - 1) for n, s in zip(shape, strides) if s < 0)
    hi = sum(s * (n - 1) for n, s in zip(shape, strides) if s > 0)
    return lo * itemsize, (hi + 1) * itemsize


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, in elements."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


# --------------------------------------------------------------------------------------
# Entry points.

def as_tensor(obj, dtype: str | None = None, stream=None) -> TensorRef:
    """View ``obj`` as a :class:`TensorRef`, optionally re-declaring its dtype.

    ``dtype`` re-declares raw storage: an integer tensor may be declared as any dtype of
    the same element size (uint8 as ``"fp8_e4m3"``, uint16/int16 as ``"bf16"``); a tensor
    that already has that dtype is returned unchanged.  ``stream`` (anything
    :func:`stream_handle` accepts) is passed to ``__dlpack__`` when it is a non-default
    handle, so that the producer orders its pending work before ours.
    """
    if isinstance(obj, TensorRef):
        ref = obj
    elif isinstance(obj, np.ndarray):
        ref = _from_numpy(obj)
    elif hasattr(obj, "__dlpack__"):
        ref = _from_dlpack(obj, stream_handle(stream))
    elif hasattr(obj, "__cuda_array_interface__"):
        ref = _from_cai(obj)
    else:
        raise TypeError(f"cannot read a tensor from {type(obj).__name__}: expected an object "
                        "with __dlpack__ or __cuda_array_interface__, or a NumPy array")
    return ref if dtype is None else _retype(ref, dtype)


# --------------------------------------------------------------------------------------
# A PyTorch tensor passed call after call: its export remembered.

#: Exports remembered at most (a tensor's entry also goes when the tensor does).
EXPORT_CACHE_SIZE = 4096
_exports: dict[int, tuple] = {}    # id(tensor) -> (weakref, ptr, shape, strides, dtype, device, view)
_exports_lock = threading.Lock()


def call_view(obj, stream: int) -> TensorRef:
    """:func:`as_tensor` of ``obj`` for the length of one call on ``stream``, its DLPack export
    remembered where ``obj`` is a PyTorch tensor: a tensor passed again is not exported again
    while what an export yields -- its address (``data_ptr``, the storage offset included),
    shape, strides, dtype and device -- is the same, read from the tensor itself (a tensor
    resized, re-strided, re-pointed by ``set_`` or ``.data =`` misses; values written in place
    change none of it).  Only where the export would order nothing either: ``stream`` is 0 (no
    stream is given to the export), the tensor is in host memory, or ``stream`` is PyTorch's
    current stream on the tensor's device (an export to another stream makes it wait for the
    current one: done again each call).  The view holds no reference to the tensor (the
    caller's argument keeps it alive through the call); the cache holds weak ones."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return as_tensor(obj, stream=stream or None)
    try:
        key = id(obj)
        state = (obj.data_ptr(), obj.shape, obj.stride(), obj.dtype, obj.get_device())
    except Exception:      # anything PyTorch refuses to say: export as usual (it names the problem)
        return as_tensor(obj, stream=stream or None)
    entry = _exports.get(key)
    if (entry is not None and entry[0]() is obj and entry[1:6] == state
            and (stream == 0 or state[4] < 0 or stream == _current_stream(torch, state[4]))):
        return entry[6]
    ref = as_tensor(obj, stream=stream or None)
    if ref.ptr == state[0] and ref.shape == tuple(state[1]) and ref.strides == tuple(state[2]):
        view = dataclasses.replace(ref, owner=None)
        drop = functools.partial(_forget_export, key)
        with _exports_lock:
            if len(_exports) >= EXPORT_CACHE_SIZE:
                _exports.pop(next(iter(_exports)))
            _exports[key] = (weakref.ref(obj, drop), *state, view)
    return ref


def _forget_export(key: int, wr) -> None:
    with _exports_lock:
        entry = _exports.get(key)
        if entry is not None and entry[0] is wr:
            del _exports[key]


def _current_stream(torch, device: int) -> int:
    """PyTorch's current stream on CUDA (or ROCm) device ``device``, as a raw handle."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return int(raw(device)) if raw is not None else int(torch.cuda.current_stream(device).cuda_stream)


def stream_handle(stream) -> int:
    """The raw stream handle of ``stream``: None (0, the default stream), an int,
    an object with ``__cuda_stream__()``, a CuPy stream (``.ptr``) or a PyTorch stream
    (``.cuda_stream``)."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError("stream must be a stream object or an integer handle, got bool")
    if isinstance(stream, (int, np.integer)):
        handle = int(stream)
    elif hasattr(stream, "__cuda_stream__"):
        handle = stream.__cuda_stream__()[1]
    elif hasattr(stream, "cuda_stream"):
        handle = stream.cuda_stream
    elif hasattr(stream, "ptr"):
        handle = stream.ptr
    else:
        raise TypeError(f"stream must be a stream object or an integer handle, "
                        f"got {type(stream).__name__}")
    if isinstance(handle, bool) or not isinstance(handle, (int, np.integer)):
        raise TypeError(f"stream handle of {type(stream).__name__} is not an integer")
    if handle < 0:
        raise ValueError(f"stream handle must be non-negative, got {handle}")
    return int(handle)


def _retype(ref: TensorRef, dtype: str) -> TensorRef:
    if dtype == ref.dtype:
        return ref
    if dtype not in ITEMSIZE:
        raise TypeError(f"unknown dtype {dtype!r}; known: {sorted(ITEMSIZE)}")
    if ref.dtype not in _RAW or ITEMSIZE[ref.dtype] != ITEMSIZE[dtype]:
        raise TypeError(f"cannot declare a {ref.dtype} tensor as {dtype}: only integer tensors "
                        f"of the same element size ({ITEMSIZE[dtype]} bytes) can be re-declared")
    return dataclasses.replace(ref, dtype=dtype)


# --------------------------------------------------------------------------------------
# NumPy and __cuda_array_interface__ (NumPy dtypes, byte strides).

def _numpy_dtype_name(dt: np.dtype) -> str:
    if ml_dtypes is not None:
        special = {np.dtype(ml_dtypes.bfloat16): "bf16",
                   np.dtype(ml_dtypes.float8_e4m3fn): "fp8_e4m3",
                   np.dtype(ml_dtypes.float8_e4m3fnuz): "fp8_e4m3fnuz",
                   np.dtype(ml_dtypes.float8_e5m2): "fp8_e5m2"}
        if dt in special:
            return special[dt]
    if dt.isnative:
        if dt.kind == "b":
            return "bool"
        name = {"i": "int", "u": "uint", "f": "float"}.get(dt.kind, "?") + str(dt.itemsize * 8)
        if name in ITEMSIZE:
            return name
    raise TypeError(f"unsupported dtype {dt.str!r} ({dt})")


def _element_strides(byte_strides, itemsize: int, what: str) -> tuple[int, ...]:
    out = []
    for s in byte_strides:
        if s % itemsize:
            raise ValueError(f"{what} has a stride of {s} bytes, not a multiple of its "
                             f"element size ({itemsize} bytes)")
        out.append(s // itemsize)
    return tuple(out)


def _from_numpy(a: np.ndarray) -> TensorRef:
    dtype = _numpy_dtype_name(a.dtype)
    return TensorRef(ptr=a.__array_interface__["data"][0], shape=tuple(a.shape),
                     strides=_element_strides(a.strides, a.itemsize, "NumPy array"),
                     dtype=dtype, device=("cpu", 0), owner=a, readonly=not a.flags.writeable)


def _from_cai(obj) -> TensorRef:
    cai = obj.__cuda_array_interface__
    if cai.get("mask") is not None:
        raise TypeError("masked arrays (__cuda_array_interface__ 'mask') are not supported")
    typestr = cai["typestr"]
    try:
        dt = np.dtype(typestr)
        dtype = _numpy_dtype_name(dt)
    except TypeError:
        raise TypeError(f"unsupported __cuda_array_interface__ typestr {typestr!r}; export "
                        "bf16/fp8 data as an integer type and declare it with dtype=") from None
    shape = tuple(int(n) for n in cai["shape"])
    strides = cai.get("strides")
    strides = (contiguous_strides(shape) if strides is None else
               _element_strides(strides, dt.itemsize, "__cuda_array_interface__ array"))
    ptr, readonly = cai["data"]
    # CAI names neither the vendor nor the ordinal: the pointer belongs to the current device.
    return TensorRef(ptr=int(ptr or 0), shape=shape, strides=strides, dtype=dtype,
                     device=("cuda", -1), owner=obj, readonly=bool(readonly))


# --------------------------------------------------------------------------------------
# DLPack (dmlc/dlpack include/dlpack/dlpack.h).

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


_FLAG_READ_ONLY = 1 << 0
_LEGACY, _VERSIONED = b"dltensor", b"dltensor_versioned"

#: (code, bits) -> dtype name, for lanes == 1.
_DL_DTYPES = {
    (0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
    (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
    (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
    (4, 16): "bf16", (6, 8): "bool",
    (10, 8): "fp8_e4m3", (11, 8): "fp8_e4m3fnuz", (12, 8): "fp8_e5m2",
}

#: DLPack device type -> our device kind.  Pinned and managed memory count as what
#: the memory is addressable as: host memory, resp. device memory.
_DL_DEVICES = {1: "cpu", 2: "cuda", 3: "cpu", 10: "rocm", 11: "cpu", 13: "cuda"}

# Private prototypes (rather than mutating the shared ctypes.pythonapi function objects).
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi))


def _call_dlpack(obj, handle: int):
    kwargs = {"stream": handle} if handle else {}
    try:
        return obj.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:  # producer predates DLPack 1.0 and has no max_version keyword
        return obj.__dlpack__(**kwargs)


def _from_dlpack(obj, handle: int) -> TensorRef:
    capsule = _call_dlpack(obj, handle)
    if _capsule_is_valid(capsule, _VERSIONED):
        managed = _DLManagedTensorVersioned.from_address(_capsule_get_pointer(capsule, _VERSIONED))
        if managed.version.major != 1:
            raise TypeError(f"DLPack version {managed.version.major}.{managed.version.minor} "
                            "is not supported (need 1.x)")
        readonly = bool(managed.flags & _FLAG_READ_ONLY)
    elif _capsule_is_valid(capsule, _LEGACY):
        managed = _DLManagedTensor.from_address(_capsule_get_pointer(capsule, _LEGACY))
        readonly = False
    else:
        try:
            name = _capsule_get_name(capsule)
        except (TypeError, ValueError):
            name = None
        raise TypeError(f"__dlpack__ of {type(obj).__name__} returned "
                        f"{'capsule ' + repr(name.decode()) if name else type(capsule).__name__}"
                        "; expected an unconsumed 'dltensor' or 'dltensor_versioned' capsule")
    t = managed.dl_tensor

    key = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or key not in _DL_DTYPES:
        raise TypeError(f"unsupported DLPack dtype (code {t.dtype.code}, bits {t.dtype.bits}, "
                        f"lanes {t.dtype.lanes})")
    kind = _DL_DEVICES.get(t.device.device_type)
    if kind is None:
        raise TypeError(f"unsupported DLPack device type {t.device.device_type}")

    ndim = t.ndim
    shape = tuple(t.shape[i] for i in range(ndim)) if ndim else ()
    strides = (tuple(t.strides[i] for i in range(ndim)) if t.strides
               else contiguous_strides(shape))
    ptr = (t.data or 0) + t.byte_offset
    # The capsule stays referenced: its destructor releases the export when the view dies.
    return TensorRef(ptr=ptr, shape=shape, strides=strides, dtype=_DL_DTYPES[key],
                     device=(kind, int(t.device.device_id)), owner=(obj, capsule),
                     readonly=readonly)
