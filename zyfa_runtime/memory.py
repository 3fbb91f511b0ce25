"""Device buffers the runtime allocates itself (outputs when none is given, LSE, constants)."""

from __future__ import annotations

import numpy as np

from .tensors import TensorRef

#: Host numpy dtype of each element type the runtime hands back.
_HOST_DTYPES = {"float32": np.dtype(np.float32), "int32": np.dtype(np.int32),
                "uint8": np.dtype(np.uint8)}


def host_dtype(dtype: str) -> np.dtype:
    if dtype in _HOST_DTYPES:
        return _HOST_DTYPES[dtype]
    import ml_dtypes
    return np.dtype({"bf16": ml_dtypes.bfloat16, "fp8_e4m3": ml_dtypes.float8_e4m3fn}[dtype])


def device_kind(driver) -> str:
    """The TensorRef device kind of memory this driver allocates."""
    if driver.host_memory_is_device:
        return "cpu"
    return {"cuda": "cuda", "hip": "rocm"}[driver.vendor]


class DeviceArray:
    """A C-contiguous device allocation owned by zyfa; freed when garbage-collected.

    ``ref`` describes it to the launcher; ``numpy()`` copies it to the host (a
    synchronising copy); ``__cuda_array_interface__`` lets CuPy, Numba or PyTorch wrap
    it without a copy where NumPy has a type string for the element type.
    """

    def __init__(self, driver, device: int, shape: tuple[int, ...], dtype: str):
        self.driver, self.device = driver, device
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype
        self.itemsize = host_dtype(dtype).itemsize
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.itemsize
        self.ptr = driver.alloc(device, max(self.nbytes, 16))
        strides, acc = [], 1
        for s in reversed(self.shape):
            strides.append(acc)
            acc *= s
        self.strides = tuple(reversed(strides))

    @property
    def ref(self) -> TensorRef:
        kind = device_kind(self.driver)
        return TensorRef(self.ptr, self.shape, self.strides, self.dtype, (kind, self.device), owner=self)

    def numpy(self) -> np.ndarray:
        host = np.empty(self.shape, dtype=host_dtype(self.dtype))
        if self.nbytes:
            self.driver.copy_dtoh(memoryview(host.reshape(-1).view(np.uint8)), self.ptr)
        return host

    @property
    def __cuda_array_interface__(self) -> dict:
        if self.driver.name != "cuda" or self.dtype not in _HOST_DTYPES:
            raise AttributeError("__cuda_array_interface__ has no type string for " + self.dtype)
        return {"shape": self.shape, "typestr": _HOST_DTYPES[self.dtype].str, "data": (self.ptr, False),
                "strides": None, "version": 3}

    def __del__(self):
        ptr, self.ptr = getattr(self, "ptr", 0), 0
        if ptr:
            try:
                self.driver.free(ptr)
            except Exception:  # interpreter shutdown: the driver may already be gone
                pass

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device})"


def to_device(driver, device: int, host: np.ndarray, dtype: str) -> DeviceArray:
    """Copy a C-contiguous host array to a new device array of element type ``dtype``."""
    host = np.ascontiguousarray(host)
    arr = DeviceArray(driver, device, host.shape, dtype)
    if arr.itemsize != host.itemsize:
        raise TypeError(f"host array of {host.dtype} cannot be stored as {dtype}")
    if arr.nbytes:
        driver.copy_htod(arr.ptr, memoryview(host.reshape(-1).view(np.uint8)))
    return arr


def view(arr: DeviceArray, host_like: np.ndarray, base: np.ndarray) -> TensorRef:
    """The TensorRef of ``host_like`` -- a numpy view into ``base`` -- mapped onto ``arr``,
    the device copy of ``base``: same byte offset, shape and strides."""
    offset = host_like.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    strides = tuple(s // host_like.itemsize for s in host_like.strides)
    return TensorRef(arr.ptr + offset, host_like.shape, strides, arr.dtype, arr.ref.device, owner=arr)
