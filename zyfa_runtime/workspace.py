"""Device scratch memory a launch needs beside its tensors, per (backend, device, stream): the
V^T that the sm_90a FP8 pre-pass writes (catalogue.has_vt_prepass), a buffer kept between
calls and grown on demand; and the tile counter of a persistent kernel (``counter``), zeroed
once when it is allocated and left zero by every launch that uses it.

Launches on one stream run in order, so one buffer serves every call on that stream; calls on
different streams get different buffers.  A buffer is held (its lock taken) from the moment a
call is handed its address until the call's launches are queued.  An address once handed out
stays valid until ``release()``: growing a buffer allocates a larger one and keeps the old one
(kernels still queued, or a CUDA graph captured earlier, may use it), so growth never has to
synchronise the device.  A CUDA graph that captured a launch keeps its workspace and counter
addresses: replays of it must not overlap one another (or launches on the stream it was
captured from), as launches on one stream never do.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from .memory import DeviceArray

_lock = threading.Lock()
_buffers: dict[tuple[str, int, int], DeviceArray] = {}
_retired: list[DeviceArray] = []
_holds: dict[tuple[str, int, int], threading.Lock] = {}
_counters: dict[tuple[str, int, int], DeviceArray] = {}


@contextlib.contextmanager
def hold(driver, device: int, stream: int, nbytes: int) -> Iterator[int]:
    """The address of at least ``nbytes`` of device memory for launches on ``stream``; queue
    them inside the ``with``."""
    key = (driver.name, int(device), int(stream))
    with _lock:
        key_lock = _holds.setdefault(key, threading.Lock())
    with key_lock:
        buf = _buffers.get(key)
        if buf is None or buf.nbytes < nbytes:
            new = DeviceArray(driver, device, (max(int(nbytes), 1),), "uint8")
            with _lock:
                if buf is not None:
                    _retired.append(buf)
                _buffers[key] = buf = new
        yield buf.ptr


def counter(driver, device: int, stream: int, nbytes: int) -> int:
    """The address of ``nbytes`` of zeros for a persistent kernel's tile counter on ``stream``.
    The kernel leaves them zero when it ends (its last CTA zeroes them), so launches on one
    stream, which run in order, share them; they are zeroed once, synchronously, before the
    first launch that uses them."""
    key = (driver.name, int(device), int(stream))
    with _lock:
        buf = _counters.get(key)
        if buf is None or buf.nbytes < nbytes:
            new = DeviceArray(driver, device, (max(int(nbytes), 1),), "uint8")
            driver.memset_d8(new.ptr, 0, new.nbytes)
            driver.synchronize(device)
            if buf is not None:
                _retired.append(buf)
            _counters[key] = buf = new
        return buf.ptr


def release() -> None:
    """Synchronise the devices that have workspaces and free them all (the next call allocates
    anew).  Call it only when no launch that used a workspace is still to run (a CUDA graph
    captured with one included)."""
    with _lock:
        keys = list(_holds)
    locks = [_holds[k] for k in keys]
    for lk in locks:
        lk.acquire()
    try:
        with _lock:
            bufs = list(_buffers.values()) + list(_counters.values()) + _retired
            _buffers.clear()
            _counters.clear()
            _retired.clear()
        for driver, device in {(b.driver, b.device) for b in bufs}:
            driver.synchronize(device)
        del bufs
    finally:
        for lk in locks:
            lk.release()


def held_bytes() -> int:
    """Bytes of workspace allocated (retired buffers included), over every backend, device and
    stream."""
    with _lock:
        return sum(b.nbytes for b in list(_buffers.values()) + list(_counters.values()) + _retired)
