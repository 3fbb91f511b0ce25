"""as_tensor / stream_handle: reading DLPack, __cuda_array_interface__ and NumPy inputs."""

import ctypes
import gc

import ml_dtypes
import numpy as np
import pytest

from zyfa_runtime.tensors import TensorRef, as_tensor, stream_handle

# --------------------------------------------------------------------------------------
# A DLPack producer built by hand from the dlpack.h layout, independent of the runtime's
# own struct definitions, so that every field can be set.


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


VERSIONED, LEGACY = b"dltensor_versioned", b"dltensor"
capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))


class HandMade:
    """Exports one hand-built capsule; records the keyword arguments of each call."""

    def __init__(self, shape=(2, 3), strides=None, code=2, bits=32, lanes=1, device=(2, 0),
                 data=0x10000, byte_offset=0, version=(1, 0), flags=0, legacy=False):
        n = len(shape)
        self._shape = (ctypes.c_int64 * max(n, 1))(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * max(n, 1))(*strides)
        t = DLTensor(data=data, device=DLDevice(*device), ndim=n,
                     dtype=DLDataType(code, bits, lanes),
                     shape=ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)) if n else None,
                     strides=(ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
                              if strides is not None else None),
                     byte_offset=byte_offset)
        if legacy:
            self._managed, self._name = DLManagedTensor(dl_tensor=t), LEGACY
        else:
            self._managed = DLManagedTensorVersioned(major=version[0], minor=version[1],
                                                     flags=flags, dl_tensor=t)
            self._name = VERSIONED
        self.calls = []

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        return capsule_new(ctypes.addressof(self._managed), self._name, None)


class NumpyExporter:
    """Forwards to NumPy's own __dlpack__ (versioned capsule when asked with max_version)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, *, stream=None, max_version=None):
        return self.a.__dlpack__(max_version=max_version)


class LegacyOnly:
    """A producer that predates DLPack 1.0: no max_version keyword."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()


class CAI:
    """A __cuda_array_interface__ v3 exporter over a NumPy array's memory."""

    def __init__(self, a, typestr=None, strides=True, mask=None, readonly=False):
        self.a = a
        self.__cuda_array_interface__ = {
            "shape": a.shape, "typestr": typestr or a.dtype.str, "version": 3,
            "data": (a.ctypes.data, readonly), "strides": a.strides if strides else None,
            "mask": mask, "stream": 1,
        }


def capsules_in(ref):
    owner = ref.owner if isinstance(ref.owner, tuple) else (ref.owner,)
    return [o for o in owner if type(o).__name__ == "PyCapsule"]


# --------------------------------------------------------------------------------------
# TensorRef


def test_tensorref_owner_is_not_part_of_equality_or_repr():
    a = TensorRef(16, (2,), (1,), "bf16", ("cuda", 0), owner=object())
    b = TensorRef(16, (2,), (1,), "bf16", ("cuda", 0), owner=object())
    assert a == b and hash(a) == hash(b)
    assert "owner" not in repr(a)


def test_tensorref_extent_covers_strided_elements():
    t = TensorRef(1000, (2, 3), (8, 2), "bf16", ("cuda", 0))
    assert t.extent() == (1000, 1000 + (8 + 4 + 1) * 2)
    assert TensorRef(1000, (0, 3), (3, 1), "bf16", ("cuda", 0)).extent() == (1000, 1000)


def test_tensorref_passes_through_unchanged():
    t = TensorRef(16, (2,), (1,), "uint8", ("cuda", 0))
    assert as_tensor(t) is t


# --------------------------------------------------------------------------------------
# NumPy


def test_numpy_array_gives_pointer_shape_element_strides_and_host_device():
    a = np.zeros((4, 6), np.float32)
    view = a[1:, ::2]
    t = as_tensor(view)
    assert t.ptr == a.ctypes.data + 6 * 4
    assert (t.shape, t.strides, t.dtype, t.device) == ((3, 3), (6, 2), "float32", ("cpu", 0))
    assert t.owner is view


@pytest.mark.parametrize("np_dtype, name", [
    (ml_dtypes.bfloat16, "bf16"), (ml_dtypes.float8_e4m3fn, "fp8_e4m3"),
    (np.float16, "float16"), (np.int32, "int32"), (np.uint8, "uint8"), (np.uint16, "uint16"),
])
def test_numpy_dtypes_map_to_runtime_names(np_dtype, name):
    assert as_tensor(np.zeros(4, np_dtype)).dtype == name


def test_numpy_unknown_dtype_is_rejected_by_name():
    with pytest.raises(TypeError, match="complex64"):
        as_tensor(np.zeros(4, np.complex64))


def test_numpy_stride_not_a_multiple_of_the_element_size_is_rejected():
    packed = np.zeros(4, dtype=[("a", "<i4"), ("b", "u1")])["a"]  # 5-byte stride
    with pytest.raises(ValueError, match="5 bytes"):
        as_tensor(packed)


def test_numpy_readonly_flag_is_recorded():
    a = np.zeros(4, np.float32)
    a.flags.writeable = False
    assert as_tensor(a).readonly


# --------------------------------------------------------------------------------------
# DLPack


def test_dlpack_versioned_capsule_from_numpy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1:]
    t = as_tensor(NumpyExporter(a))
    assert (t.ptr, t.shape, t.strides) == (a.ctypes.data, (3, 3), (4, 1))
    assert (t.dtype, t.device) == ("float32", ("cpu", 0))
    assert [capsule_is_valid(c, VERSIONED) for c in capsules_in(t)] == [1]


def test_dlpack_falls_back_to_legacy_call_without_max_version():
    a = np.arange(6, dtype=np.int32)
    t = as_tensor(LegacyOnly(a))
    assert (t.ptr, t.shape, t.strides, t.dtype) == (a.ctypes.data, (6,), (1,), "int32")
    assert [capsule_is_valid(c, LEGACY) for c in capsules_in(t)] == [1]


def test_dlpack_capsule_is_borrowed_and_keeps_memory_alive():
    a = np.arange(6, dtype=np.float32)
    t = as_tensor(NumpyExporter(a))
    del a
    gc.collect()
    assert list((ctypes.c_float * 6).from_address(t.ptr)) == [0, 1, 2, 3, 4, 5]
    assert all(capsule_is_valid(c, VERSIONED) for c in capsules_in(t))  # not renamed


def test_dlpack_asks_for_a_versioned_capsule():
    p = HandMade()
    as_tensor(p)
    assert p.calls == [{"stream": None, "max_version": (1, 0)}]


def test_dlpack_legacy_struct_layout():
    t = as_tensor(HandMade(shape=(2, 3), strides=(3, 1), legacy=True, data=0x2000))
    assert (t.ptr, t.shape, t.strides, t.device) == (0x2000, (2, 3), (3, 1), ("cuda", 0))


def test_dlpack_null_strides_mean_c_contiguous():
    assert as_tensor(HandMade(shape=(2, 3, 4))).strides == (12, 4, 1)


def test_dlpack_zero_dim_tensor():
    t = as_tensor(HandMade(shape=()))
    assert (t.shape, t.strides) == ((), ())


def test_dlpack_byte_offset_is_applied_to_the_pointer():
    assert as_tensor(HandMade(data=0x10000, byte_offset=48)).ptr == 0x10030


def test_dlpack_read_only_flag_is_recorded():
    assert as_tensor(HandMade(flags=1)).readonly
    assert not as_tensor(HandMade(flags=0)).readonly


@pytest.mark.parametrize("code, bits, name", [
    (4, 16, "bf16"), (10, 8, "fp8_e4m3"), (2, 32, "float32"), (2, 16, "float16"),
    (0, 32, "int32"), (1, 8, "uint8"), (1, 16, "uint16"), (0, 16, "int16"),
])
def test_dlpack_dtype_codes(code, bits, name):
    assert as_tensor(HandMade(code=code, bits=bits)).dtype == name


@pytest.mark.parametrize("code, bits, lanes", [(5, 64, 1), (17, 4, 1), (2, 32, 4)])
def test_dlpack_unknown_dtype_is_rejected_by_code(code, bits, lanes):
    with pytest.raises(TypeError, match=f"code {code}, bits {bits}, lanes {lanes}"):
        as_tensor(HandMade(code=code, bits=bits, lanes=lanes))


@pytest.mark.parametrize("dl_type, device", [
    (1, ("cpu", 3)), (2, ("cuda", 3)), (3, ("cpu", 3)), (10, ("rocm", 3)),
    (11, ("cpu", 3)), (13, ("cuda", 3)),
])
def test_dlpack_device_types(dl_type, device):
    assert as_tensor(HandMade(device=(dl_type, 3))).device == device


def test_dlpack_unknown_device_type_is_rejected():
    with pytest.raises(TypeError, match="device type 4"):
        as_tensor(HandMade(device=(4, 0)))


def test_dlpack_major_version_other_than_1_is_rejected():
    with pytest.raises(TypeError, match="version 2.0"):
        as_tensor(HandMade(version=(2, 0)))


def test_dlpack_consumed_capsule_is_rejected():
    class Used:
        def __dlpack__(self, **kw):
            return capsule_new(0x1000, b"used_dltensor", None)
    with pytest.raises(TypeError, match="used_dltensor"):
        as_tensor(Used())


@pytest.mark.parametrize("stream, passed", [(None, None), (0, None), (7, 7)])
def test_dlpack_stream_is_passed_only_when_nonzero(stream, passed):
    p = HandMade()
    as_tensor(p, stream=stream)
    assert p.calls[-1]["stream"] == passed


def test_dlpack_stream_object_is_passed_as_its_handle():
    class Stream:
        def __cuda_stream__(self):
            return (0, 0xBEEF)
    p = HandMade()
    as_tensor(p, stream=Stream())
    assert p.calls[-1]["stream"] == 0xBEEF


# --------------------------------------------------------------------------------------
# __cuda_array_interface__


def test_cai_strides_in_bytes_become_element_strides():
    a = np.zeros((4, 6), np.float32)[:, ::3]
    t = as_tensor(CAI(a))
    assert (t.ptr, t.shape, t.strides, t.dtype) == (a.ctypes.data, (4, 2), (6, 3), "float32")


def test_cai_no_strides_mean_c_contiguous():
    t = as_tensor(CAI(np.zeros((2, 3, 4), np.int32), strides=False))
    assert (t.strides, t.dtype) == ((12, 4, 1), "int32")


def test_cai_device_ordinal_is_unknown_and_readonly_is_recorded():
    t = as_tensor(CAI(np.zeros(4, np.uint8), readonly=True))
    assert t.device == ("cuda", -1) and t.readonly


@pytest.mark.parametrize("typestr", ["<c8", "|V2"])
def test_cai_unknown_typestr_is_rejected_by_name(typestr):
    with pytest.raises(TypeError, match=typestr.replace("|", r"\|")):
        as_tensor(CAI(np.zeros(4, np.uint16), typestr=typestr))


def test_cai_masked_arrays_are_rejected():
    with pytest.raises(TypeError, match="mask"):
        as_tensor(CAI(np.zeros(4, np.uint8), mask=object()))


def test_unreadable_object_is_rejected_by_type_name():
    with pytest.raises(TypeError, match="list"):
        as_tensor([1, 2, 3])


# --------------------------------------------------------------------------------------
# dtype= re-declaration


@pytest.mark.parametrize("source, target", [
    (np.uint8, "fp8_e4m3"), (np.uint16, "bf16"), (np.int16, "bf16"),
])
def test_integer_storage_can_be_redeclared(source, target):
    a = np.zeros(8, source)
    t = as_tensor(a, dtype=target)
    assert (t.dtype, t.ptr, t.shape, t.strides) == (target, a.ctypes.data, (8,), (1,))


def test_redeclaring_a_dlpack_export():
    assert as_tensor(HandMade(code=1, bits=8), dtype="fp8_e4m3").dtype == "fp8_e4m3"
    assert as_tensor(CAI(np.zeros(4, np.uint16)), dtype="bf16").dtype == "bf16"


def test_redeclaring_a_tensorref_and_same_dtype_is_a_no_op():
    t = TensorRef(16, (2,), (1,), "uint16", ("cuda", 0))
    assert as_tensor(t, dtype="bf16") == TensorRef(16, (2,), (1,), "bf16", ("cuda", 0))
    assert as_tensor(t, dtype="uint16") is t


@pytest.mark.parametrize("source, target", [
    (np.uint8, "bf16"),       # element sizes differ
    (np.float32, "bf16"),     # not raw storage, and sizes differ
    (np.float16, "bf16"),     # same size, but float16 values are not bf16 bits
])
def test_redeclaring_is_rejected_naming_both_dtypes(source, target):
    src_name = as_tensor(np.zeros(1, source)).dtype
    with pytest.raises(TypeError, match=f"{src_name}.*{target}"):
        as_tensor(np.zeros(4, source), dtype=target)


def test_redeclaring_as_unknown_dtype_is_rejected_by_name():
    with pytest.raises(TypeError, match="fp4"):
        as_tensor(np.zeros(4, np.uint8), dtype="fp4")


# --------------------------------------------------------------------------------------
# stream_handle


class CupyLikeStream:
    ptr = 0x1234


class TorchLikeStream:
    cuda_stream = 0x5678


class ProtocolStream:
    def __cuda_stream__(self):
        return (0, 0x9ABC)


@pytest.mark.parametrize("stream, handle", [
    (None, 0), (0, 0), (42, 42), (np.uint64(43), 43), (CupyLikeStream(), 0x1234),
    (TorchLikeStream(), 0x5678), (ProtocolStream(), 0x9ABC),
])
def test_stream_handle_accepts_known_stream_kinds(stream, handle):
    assert stream_handle(stream) == handle


@pytest.mark.parametrize("stream", ["0x10", 1.5, True, object()])
def test_stream_handle_rejects_other_objects(stream):
    with pytest.raises(TypeError, match="stream"):
        stream_handle(stream)


def test_stream_handle_rejects_negative_handles():
    with pytest.raises(ValueError, match="stream"):
        stream_handle(-1)


# --------------------------------------------------------------------------------------
# A PyTorch tensor passed call after call: its export remembered (tensors.call_view).  A
# stand-in "torch" module: a Tensor over a NumPy array that counts its exports and answers
# what call_view reads of a PyTorch tensor.


class FakeTorchTensor:
    def __init__(self, a: np.ndarray, device: int = -1):
        self.a, self.device_index, self.exports, self.streams = a, device, 0, []

    def __dlpack__(self, stream=None, **kw):
        self.exports += 1
        self.streams.append(stream)
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def data_ptr(self):
        return self.a.__array_interface__["data"][0]

    @property
    def shape(self):
        return self.a.shape

    def stride(self):
        return tuple(s // self.a.itemsize for s in self.a.strides)

    @property
    def dtype(self):
        return self.a.dtype

    def get_device(self):
        return self.device_index


@pytest.fixture
def fake_torch(monkeypatch):
    import sys
    import types
    from zyfa_runtime import tensors
    torch = types.ModuleType("torch")
    torch.Tensor = FakeTorchTensor
    torch.current = 0
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: torch.current)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(tensors, "_exports", {})
    return torch


def test_a_tensor_passed_again_is_not_exported_again(fake_torch):
    from zyfa_runtime import tensors
    t = FakeTorchTensor(np.zeros((2, 3, 4), np.float32))
    first = tensors.call_view(t, 0)
    assert first == as_tensor(FakeTorchTensor(t.a), None) and t.exports == 1
    again = tensors.call_view(t, 0)
    assert again == first and again.owner is None and t.exports == 1     # no reference to the tensor kept
    # values written in place change nothing an export yields
    t.a[...] = 7
    assert tensors.call_view(t, 0) == first and t.exports == 1


@pytest.mark.parametrize("change", ["resize", "restride", "repoint", "retype"])
def test_a_tensor_whose_export_would_differ_is_exported_again(fake_torch, change):
    from zyfa_runtime import tensors
    base = np.zeros((4, 6), np.float32)
    t = FakeTorchTensor(base[:2])
    old = tensors.call_view(t, 0)
    t.a = {"resize": base[:3], "restride": base[:2, ::2], "repoint": base[1:3],
           "retype": base[:2].view(np.int32)}[change]
    new = tensors.call_view(t, 0)
    assert t.exports == 2 and new != old and new == as_tensor(FakeTorchTensor(t.a), None)
    assert tensors.call_view(t, 0) == new and t.exports == 2


def test_an_export_to_a_stream_is_remembered_only_where_it_would_order_nothing(fake_torch):
    """To stream 5 while PyTorch's current stream is 5: remembered.  While it is another, the
    export makes stream 5 wait for it: done every call."""
    from zyfa_runtime import tensors
    t = FakeTorchTensor(np.zeros(8, np.float32), device=0)
    fake_torch.current = 5
    tensors.call_view(t, 5)
    tensors.call_view(t, 5)
    assert t.exports == 1 and t.streams == [5]
    fake_torch.current = 6
    tensors.call_view(t, 5)
    tensors.call_view(t, 5)
    assert t.exports == 3 and t.streams == [5, 5, 5]
    tensors.call_view(t, 0)          # no stream given to the export: nothing to order
    assert t.exports == 3


def test_the_cache_keeps_no_tensor_alive_and_a_new_tensor_at_an_old_id_is_exported(fake_torch):
    from zyfa_runtime import tensors
    t = FakeTorchTensor(np.zeros(8, np.float32))
    tensors.call_view(t, 0)
    assert len(tensors._exports) == 1
    del t
    gc.collect()
    assert tensors._exports == {}
    kept = []
    for i in range(tensors.EXPORT_CACHE_SIZE + 10):
        x = FakeTorchTensor(np.zeros(2 + i % 3, np.float32))    # ids of dead ones come back
        assert tensors.call_view(x, 0).shape == x.shape and x.exports == 1
        if i % 2:
            kept.append(x)
    assert len(tensors._exports) <= tensors.EXPORT_CACHE_SIZE


def test_other_objects_are_read_as_as_tensor_reads_them(fake_torch):
    from zyfa_runtime import tensors
    a = np.zeros((3, 4), np.float32)
    assert tensors.call_view(a, 0) == as_tensor(a) and tensors._exports == {}
