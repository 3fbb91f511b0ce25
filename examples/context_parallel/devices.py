"""Memory, streams and events of one rank's device, in the two forms the ring runs on.

* ``HostDevice``: the emulator backend (``ZYFA_BACKEND=emulator``), whose kernels read host
  memory: arrays are NumPy arrays (ml_dtypes bf16 / e4m3), launches run whole when queued, so
  streams and events are nothing (``None``).  New arrays are poisoned with NaN, so that a row the
  ring forgets to write, or a block it forgets to receive, cannot pass a test.
* ``CupyDevice``: a GPU through CuPy (CUDA, or ROCm with CuPy's ROCm build).  CuPy has no bf16 or
  e4m3 dtype: arrays are uint16 / uint8 storage, re-declared for zyfa by
  ``zyfa_runtime.as_tensor(x, "bf16")`` (DLPack; no copy).  Streams are non-blocking CuPy
  streams, events CuPy events without timing.

Both give zyfa ``TensorRef`` views only: every pointer reaches it through its public API.
"""

from __future__ import annotations

import numpy as np

import zyfa_runtime as zr

#: The element types the ring handles.
DTYPES = ("bf16", "fp8_e4m3", "float32")


def host_dtype(dtype: str) -> np.dtype:
    import ml_dtypes
    return np.dtype({"bf16": ml_dtypes.bfloat16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
                     "float32": np.float32}[dtype])


class HostDevice:
    """The emulator's one device: host memory, everything synchronous."""

    name = "host"

    def __init__(self, ordinal: int = 0):
        self.ordinal = ordinal

    def empty(self, shape, dtype: str) -> np.ndarray:
        return np.full(shape, np.nan, host_dtype(dtype))

    def view(self, x, dtype: str, stream=None) -> zr.TensorRef:
        return zr.as_tensor(x)

    def from_host(self, x: np.ndarray, dtype: str) -> np.ndarray:
        return np.ascontiguousarray(x, host_dtype(dtype))

    def to_host(self, x, dtype: str) -> np.ndarray:
        return np.asarray(x)

    def stream(self):
        return None

    def event(self):
        return None

    def record(self, event, stream) -> None:
        pass

    def wait(self, stream, event) -> None:
        pass

    def copy(self, dst, src, stream) -> None:
        np.copyto(dst, src)

    def synchronize(self) -> None:
        pass


class CupyDevice:
    """GPU ``ordinal`` through CuPy (imported here, on first use)."""

    name = "cupy"
    STORAGE = {"bf16": "uint16", "fp8_e4m3": "uint8", "float32": "float32"}

    def __init__(self, ordinal: int):
        import cupy
        self.cp, self.ordinal = cupy, ordinal
        self.device = cupy.cuda.Device(ordinal)

    def empty(self, shape, dtype: str):
        with self.device:
            return self.cp.empty(shape, self.STORAGE[dtype])

    def view(self, x, dtype: str, stream=None) -> zr.TensorRef:
        """zyfa's view of ``x``; with ``stream``, DLPack makes it wait for CuPy's current stream
        (the producer of ``x``), so that the ring reads inputs only once they are written."""
        with self.device:
            return zr.as_tensor(x, dtype, stream=stream)

    def from_host(self, x: np.ndarray, dtype: str):
        host = np.ascontiguousarray(x, host_dtype(dtype))
        with self.device:
            return self.cp.asarray(host.view(self.STORAGE[dtype]))

    def to_host(self, x, dtype: str) -> np.ndarray:
        with self.device:
            return self.cp.asnumpy(x).view(host_dtype(dtype))

    def stream(self):
        with self.device:
            return self.cp.cuda.Stream(non_blocking=True)

    def event(self):
        with self.device:
            return self.cp.cuda.Event(disable_timing=True)

    def record(self, event, stream) -> None:
        with self.device:
            event.record(stream)

    def wait(self, stream, event) -> None:
        with self.device:
            stream.wait_event(event)

    def copy(self, dst, src, stream) -> None:
        """``src`` into ``dst`` (same bytes, both contiguous; either device: unified addressing)."""
        if dst.nbytes != src.nbytes:
            raise ValueError(f"copy of {src.nbytes} bytes into {dst.nbytes}")
        runtime = self.cp.cuda.runtime
        with self.device:
            runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, runtime.memcpyDefault, stream.ptr)

    def synchronize(self) -> None:
        self.device.synchronize()
