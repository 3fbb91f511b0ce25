"""Host values that kernels read on a device, copied there without synchronising: a packed
batch's cu_seqlens given in host memory.

Each (backend, device, stream) has a ring of ``SLOTS`` slots; a slot is a page-locked host
buffer, a device buffer of the same size and an event.  A call takes the next slot, waits for
its event (the slot's previous copy has read the host buffer: long done unless the host has
run ``SLOTS`` calls ahead of the device), writes its values into the host buffer, queues their
copy to the device buffer on its stream and records the event after it.  The kernels that read
the values are queued behind the copy on the same stream, and the slot's next copy is queued
behind them, so a device buffer is never rewritten while a launch that reads it is pending.
A slot is held (the ring's lock taken) from the moment a call is handed its addresses until
the call's launches are queued, so that no other thread's copy lands in between.

A slot too small for a call gets larger buffers; the old device buffer is kept until
``release()`` (a queued launch may still read it), the old host buffer is freed once its copy
has run.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Iterator, Sequence

import numpy as np

from .memory import DeviceArray

#: Slots a ring holds: calls the host may run ahead of the device before one waits.
SLOTS = 64
#: The smallest slot, in bytes (256 int32 values: cu_seqlens_q and _k of a batch of 127).
MIN_SLOT_BYTES = 1024


class _Slot:
    def __init__(self, driver, device: int, nbytes: int) -> None:
        self.driver, self.device, self.nbytes = driver, device, nbytes
        self.host = driver.host_alloc(device, nbytes)
        self.dev = DeviceArray(driver, device, (nbytes,), "uint8")
        self.event = driver.event_create(device)
        self.recorded = False

    def free_host(self) -> None:
        if self.recorded:
            self.driver.event_synchronize(self.event)
        self.driver.host_free(self.host)
        self.driver.event_destroy(self.event)
        self.host = 0


class _Ring:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slots: list[_Slot | None] = [None] * SLOTS
        self.next = 0


_lock = threading.Lock()
_rings: dict[tuple[str, int, int], _Ring] = {}
_retired: list[DeviceArray] = []


@contextlib.contextmanager
def stage(driver, device: int, stream: int, arrays: Sequence[np.ndarray]) -> Iterator[list[int]]:
    """The device addresses of copies of ``arrays`` (each C-contiguous), queued on ``stream``;
    queue the launches that read them inside the ``with``."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += (a.nbytes + 15) // 16 * 16          # each array 16-byte aligned
    key = (driver.name, int(device), int(stream))
    with _lock:
        ring = _rings.setdefault(key, _Ring())
    with ring.lock:
        i = ring.next
        ring.next = (i + 1) % SLOTS
        slot = ring.slots[i]
        if slot is not None and slot.recorded:
            driver.event_synchronize(slot.event)     # its last copy has read the host buffer
        if slot is None or slot.nbytes < total:
            nbytes = max(MIN_SLOT_BYTES, 1 << (total - 1).bit_length())
            if slot is not None:
                slot.free_host()
                with _lock:
                    _retired.append(slot.dev)
            ring.slots[i] = slot = _Slot(driver, device, nbytes)
        host = np.ctypeslib.as_array((ctypes.c_uint8 * slot.nbytes).from_address(slot.host))
        for a, off in zip(arrays, offsets):
            host[off:off + a.nbytes] = a.reshape(-1).view(np.uint8)
        driver.copy_htod_async(slot.dev.ptr, slot.host, total, stream)
        driver.event_record(slot.event, stream)
        slot.recorded = True
        yield [slot.dev.ptr + off for off in offsets]


def release() -> None:
    """Wait for the devices that have rings and free them (the next call allocates anew).
    Call it only when no launch that reads staged values is still to run."""
    with _lock:
        rings = list(_rings.values())
        _rings.clear()
        retired = list(_retired)
        _retired.clear()
    slots = []
    for ring in rings:
        with ring.lock:
            slots += [s for s in ring.slots if s is not None]
    for driver, device in {(s.driver, s.device) for s in slots} | {(b.driver, b.device) for b in retired}:
        driver.synchronize(device)
    for s in slots:
        s.free_host()
    del slots, retired


def held_bytes() -> int:
    """Device bytes the rings hold (retired buffers included)."""
    with _lock:
        rings = list(_rings.values())
        total = sum(b.nbytes for b in _retired)
    for ring in rings:
        total += sum(s.nbytes for s in ring.slots if s is not None)
    return total
