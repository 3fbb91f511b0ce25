"""Device scratch memory a launch needs beside its tensors: the V^T that the sm_90a FP8
pre-pass writes (catalogue.has_vt_prepass), one buffer per (backend, device, stream), kept
between calls and grown on demand.

Launches on one stream run in order, so one buffer serves every call on that stream; calls on
different streams get different buffers.  A buffer is held (its lock taken) from the moment a
call is handed its pointer until the call's launches are queued, and growing it synchronises
the device before the old allocation is freed, so no queued kernel reads freed memory.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from .memory import DeviceArray

_lock = threading.Lock()
_buffers: dict[tuple[str, int, int], DeviceArray] = {}
_holds: dict[tuple[str, int, int], threading.Lock] = {}


@contextlib.contextmanager
def hold(driver, device: int, stream: int, nbytes: int) -> Iterator[int]:
    """The address of at least ``nbytes`` of device memory for launches on ``stream``, valid
    until those launches have run; queue them inside the ``with``."""
    key = (driver.name, int(device), int(stream))
    with _lock:
        key_lock = _holds.setdefault(key, threading.Lock())
    with key_lock:
        buf = _buffers.get(key)
        if buf is None or buf.nbytes < nbytes:
            if buf is not None:
                driver.synchronize(device)      # kernels queued on the old buffer have run
                del _buffers[key]
                del buf
            buf = _buffers[key] = DeviceArray(driver, device, (max(int(nbytes), 1),), "uint8")
        yield buf.ptr


def release() -> None:
    """Free every workspace (after synchronising its device); the next call allocates anew."""
    with _lock:
        keys = list(_buffers)
    for key in keys:
        with _lock:
            key_lock = _holds.setdefault(key, threading.Lock())
        with key_lock:
            buf = _buffers.pop(key, None)
            if buf is not None:
                buf.driver.synchronize(buf.device)
                del buf


def held_bytes() -> int:
    """Bytes of workspace currently allocated, over every backend, device and stream."""
    with _lock:
        return sum(b.nbytes for b in _buffers.values())
