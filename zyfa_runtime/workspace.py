"""Device scratch memory a launch needs beside its tensors: the V^T that the sm_90a FP8 pre-pass
writes (catalogue.has_vt_prepass) and a balanced tail's partials (the workspace), and the tile
counter of a persistent or balanced-tail kernel (zero before each launch, left zero by it).

Two ways to get it, by whether the call's stream is being captured into a graph:

* A call that runs (``hold``, ``counter``): per (backend, device, stream) a workspace kept
  between calls and grown on demand, and a counter zeroed once, by a memset queued on the
  stream before the first launch that uses it (no wait for the device).  Launches on one stream
  run in order, so one buffer serves every call on that stream; calls on different streams get
  different buffers.  A buffer is held (its lock taken) from the moment a call is handed its
  address until the call's launches are queued.  An address once handed out stays valid until
  ``release()``: growing a buffer allocates a larger one and keeps the old one (kernels still
  queued may use it), so growth never has to synchronise the device.
* A call being captured (``captured``): nothing may be allocated, copied synchronously or
  waited for during a capture, and a graph may be replayed on any stream, at any time, beside
  anything else -- so no buffer of the first kind may go into it.  Its scratch is allocated in
  stream order on the capturing stream (cuMemAllocAsync / hipMallocAsync: an allocation node
  the graph owns), its counter zeroed by a queued memset (a memset node), and freed after the
  call's launches (a free node): every replay allocates, zeroes and frees its own, whichever
  stream replays it and whatever else runs.  CUDA's rules for graphs holding memory nodes
  apply to the graph: one executable instance at a time, no cloning, a child graph only by
  moving it into its parent.
  A captured call's counter needs no node where a call ran on the device before it
  (``graph_counter``): it gets zeros of its own in a pool made outside captures, which no
  other call is ever given -- the kernel leaves them zero, and the launches of one graph
  executable run in turn (cuGraphLaunch, hipGraphLaunch) -- so that its graph holds no
  allocation, memset and free beside the kernel where the call needs no other scratch (they
  took 0.6-2.8 us a call at 128-256 keys on an H100).  The same rules hold for such a graph,
  though CUDA no longer enforces them: instantiated twice and replayed side by side, two
  executables would share the counter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Iterator

from .memory import DeviceArray

_lock = threading.Lock()
_buffers: dict[tuple[str, int, int], DeviceArray] = {}
_retired: list[DeviceArray] = []
_holds: dict[tuple[str, int, int], threading.Lock] = {}
_counters: dict[tuple[str, int, int], DeviceArray] = {}


@dataclasses.dataclass
class _Pool:
    """Zeros for captured calls' counters: ``array``, of which the first ``used`` bytes are
    handed out (each to one captured call, for good)."""
    array: DeviceArray
    used: int = 0

    def room(self) -> int:
        return self.array.nbytes - self.used


#: Per (backend, device): the pool captured calls' counters come from; earlier pools, full, stay
#: allocated (graphs use them) until the process ends.
_pools: dict[tuple[str, int], _Pool] = {}
_full_pools: list[DeviceArray] = []

#: Bytes of a pool of captured calls' counters (8 bytes a persistent kernel's call: 8,192 calls).
POOL_BYTES = 1 << 16
#: A call that runs makes a new pool where the current one has fewer bytes left than this.
POOL_REFILL_BYTES = POOL_BYTES // 4

#: Alignment of each part of a captured call's scratch (the driver's allocation alignment).
SCRATCH_ALIGN = 256
#: The bits of fp32 1.0: a captured FP8 call's default descale where the device's constant is
#: not made yet (plan._one makes it outside captures).
ONE_F32_BITS = 0x3F800000


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
    stream, which run in order, share them; they are zeroed once, by a memset queued on
    ``stream`` before the first launch that uses them.  A call that runs asks for it, so it also
    makes sure later captures on ``device`` find a pool for theirs (prepare_graph_counters)."""
    key = (driver.name, int(device), int(stream))
    with _lock:
        buf = _counters.get(key)
        if buf is None or buf.nbytes < nbytes:
            new = DeviceArray(driver, device, (max(int(nbytes), 1),), "uint8")
            driver.memset_d8_async(new.ptr, 0, new.nbytes, stream)
            if buf is not None:
                _retired.append(buf)
            _counters[key] = buf = new
    prepare_graph_counters(driver, device)
    return buf.ptr


def prepare_graph_counters(driver, device: int) -> None:
    """Make sure later captures on ``device`` find room for their counters (graph_counter): a
    pool of POOL_BYTES zeros where there is none or little room is left.  Called by every call
    that runs with a counter (``counter``), never during a capture (it allocates and copies)."""
    key = (driver.name, int(device))
    pool = _pools.get(key)
    if pool is not None and pool.room() >= POOL_REFILL_BYTES:
        return   # (the common case, read without the lock: a pool only ever fills up)
    with _lock:
        pool = _pools.get(key)
        if pool is not None and pool.room() >= POOL_REFILL_BYTES:
            return
        new = DeviceArray(driver, device, (POOL_BYTES,), "uint8")
        driver.copy_htod(new.ptr, memoryview(bytes(POOL_BYTES)))
        if pool is not None:
            _full_pools.append(pool.array)
        _pools[key] = _Pool(new)


def graph_counter(driver, device: int, nbytes: int) -> int | None:
    """The address of ``nbytes`` of zeros no call was given before, for a captured call's
    counter: its graph's own for as long as the process runs.  None where no call ran on the
    device before (no pool) or the pool has no room left: the call then takes zeroed bytes in
    its graph's own allocation (``captured``)."""
    n = -(-int(nbytes) // 8) * 8
    with _lock:
        pool = _pools.get((driver.name, int(device)))
        if pool is None or n > pool.room():
            return None
        at = pool.array.ptr + pool.used
        pool.used += n
        return at


def _aligned(n: int) -> int:
    return -(-n // SCRATCH_ALIGN) * SCRATCH_ALIGN


@contextlib.contextmanager
def captured(driver, device: int, stream: int, counter_bytes: int, workspace_bytes: int,
             one: bool) -> Iterator[tuple[int | None, int | None, int | None]]:
    """Scratch of a call on a stream being captured: (counter, workspace, one) addresses, each
    None where not asked for -- ``counter_bytes`` of zeros, ``workspace_bytes`` and, with
    ``one``, an fp32 1.0.  The counter comes from the pool where it has room (graph_counter);
    the rest in one stream-ordered allocation on ``stream``, zeroed and filled by memsets queued
    there; queue the launches inside the ``with``, after which it is freed on ``stream`` (a
    failure in between frees it too).  Nothing where nothing is asked for."""
    pooled = graph_counter(driver, device, counter_bytes) if counter_bytes else None
    parts = [0 if pooled is not None else counter_bytes, workspace_bytes, 4 if one else 0]
    total = sum(_aligned(n) for n in parts)
    if total == 0:
        yield pooled, None, None
        return
    base = driver.alloc_async(device, total, stream)
    try:
        at, where = base, []
        for n in parts:
            where.append(at if n else None)
            at += _aligned(n)
        if parts[0]:
            driver.memset_d8_async(where[0], 0, counter_bytes, stream)
        if one:
            driver.memset_d32_async(where[2], ONE_F32_BITS, 1, stream)
        yield (pooled if pooled is not None else where[0], where[1], where[2])
    finally:
        driver.free_async(base, stream)


def release() -> None:
    """Synchronise the devices that have workspaces and free them all (the next call allocates
    anew).  Call it only when no launch that used a workspace is still to run (a captured call
    holds none of these: its graph has its own)."""
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
