"""Global memory of the emulated device: the process's own memory, in named regions.

Every global/flat/scalar access is checked against the regions the emulator knows:
allocations made through the driver (``alloc``), host arrays registered with
``register_host``, and the kernarg segment of the running dispatch.  An access that
touches no region is an error naming the instruction, the lane and the address
(hardware would fault or silently read other memory).

Host memory the caller never registered (NumPy arrays handed straight to
``flash_attn_func``) is admitted when ``host_fallback`` is on: an address inside a
mapping of the process (``/proc/self/maps``) becomes a region spanning that mapping,
named after the kernel argument that points into it.  That keeps such pointers usable
and still catches wild addresses, but cannot see the array's own bounds; register
the array (or allocate through the driver) for exact bounds.
"""

from __future__ import annotations

import bisect
import ctypes
import os

import numpy as np

from .errors import EmulatorError


class Region:
    __slots__ = ("lo", "hi", "name", "buf", "writable", "kind")

    def __init__(self, lo: int, nbytes: int, name: str, buf: np.ndarray | None,
                 writable: bool, kind: str):
        self.lo, self.hi, self.name = lo, lo + nbytes, name
        if buf is None:
            buf = np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(lo))
        self.buf = buf.reshape(-1).view(np.uint8)
        self.writable, self.kind = writable, kind

    def __repr__(self) -> str:
        return f"{self.name} [0x{self.lo:x}, 0x{self.hi:x})"


def _host_mappings() -> list[tuple[int, int, bool, bool]]:
    """(lo, hi, readable, writable) of the mappings of this process (Linux), with adjacent
    readable mappings merged: one allocation (a large numpy array, say) can span several."""
    out: list[tuple[int, int, bool, bool]] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                readable, writable = parts[1][0] == "r", parts[1][1] == "w"
                if out and out[-1][1] == lo and out[-1][2] and readable:
                    plo, _, _, pw = out[-1]
                    out[-1] = (plo, hi, True, pw and writable)
                else:
                    out.append((lo, hi, readable, writable))
    except OSError:
        return []
    return out


class GlobalMemory:
    def __init__(self, host_fallback: bool = True):
        self.host_fallback = host_fallback and os.path.exists("/proc/self/maps")
        self._starts: list[int] = []
        self._regions: list[Region] = []
        self._host_regions: list[Region] = []
        self._mappings: list | None = None
        self.pointer_names: dict[int, str] = {}   # kernel pointer arguments of the dispatch

    # -- regions ------------------------------------------------------------------------
    def add(self, lo: int, nbytes: int, name: str, buf: np.ndarray | None = None,
            writable: bool = True, kind: str = "alloc") -> Region:
        region = Region(lo, nbytes, name, buf, writable, kind)
        i = bisect.bisect_left(self._starts, lo)
        if (i < len(self._regions) and self._regions[i].lo < region.hi) or \
                (i > 0 and self._regions[i - 1].hi > lo):
            raise EmulatorError(f"region {region} overlaps a known region")
        self._starts.insert(i, lo)
        self._regions.insert(i, region)
        return region

    def remove(self, lo: int) -> Region | None:
        i = bisect.bisect_left(self._starts, lo)
        if i < len(self._starts) and self._starts[i] == lo:
            self._starts.pop(i)
            return self._regions.pop(i)
        return None

    def regions(self) -> list[Region]:
        return list(self._regions)

    def begin_dispatch(self, pointer_names: dict[int, str]) -> None:
        self.pointer_names = dict(pointer_names)
        self._host_regions = []
        self._mappings = None

    def end_dispatch(self) -> None:
        self.pointer_names = {}
        self._host_regions = []
        self._mappings = None

    def find(self, addr: int) -> Region | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self._regions[i].hi:
            return self._regions[i]
        for r in self._host_regions:
            if r.lo <= addr < r.hi:
                return r
        if self.host_fallback:
            return self._host_region(addr)
        return None

    def _host_region(self, addr: int) -> Region | None:
        """A region for host memory reached through a kernel pointer argument.

        It starts at the argument's pointer (nothing below it is admitted) and ends at
        the end of the process mapping that holds it or at the next known region,
        whichever comes first.  Addresses not reachable that way stay errors.
        """
        base = max((p for p in self.pointer_names if p <= addr), default=None)
        if base is None:
            return None
        j = bisect.bisect_right(self._starts, base) - 1
        if j >= 0 and base < self._regions[j].hi:
            return None          # the pointer is into a known region; addr lies beyond it
        if self._mappings is None:
            self._mappings = _host_mappings()
        for lo, hi, readable, writable in self._mappings:
            if lo <= base < hi and readable:
                i = bisect.bisect_right(self._starts, base)
                if i < len(self._starts):
                    hi = min(hi, self._starts[i])
                if addr >= hi:
                    return None
                region = Region(base, hi - base, f"host memory of argument "
                                f"'{self.pointer_names[base]}' (not allocated through the "
                                "driver; its extent is unknown)", None, writable, "host")
                self._host_regions.append(region)
                return region
        return None

    # -- descriptions for messages ------------------------------------------------------------
    def describe(self, addr: int) -> str:
        near = [(addr - p, n) for p, n in self.pointer_names.items() if p <= addr]
        text = f"0x{addr:x}"
        if near:
            off, name = min(near)
            text += f" ({name} + {off})"
        i = bisect.bisect_right(self._starts, addr) - 1
        cands = []
        if i >= 0:
            cands.append(self._regions[i])
        if i + 1 < len(self._regions):
            cands.append(self._regions[i + 1])
        if cands:
            text += "; nearest known: " + ", ".join(repr(r) for r in cands)
        return text

    # -- access -------------------------------------------------------------------------------
    def _locate(self, addrs: np.ndarray, nbytes: int, write: bool, what) -> list:
        """[(region, lane indices)] for the byte ranges [addr, addr + nbytes)."""
        lo = int(addrs.min())
        hi = int(addrs.max()) + nbytes
        r = self.find(lo)
        if r is not None and hi <= r.hi:
            groups = [(r, None)]
        else:
            groups = []
            order = {}
            for lane, a in enumerate(addrs.tolist()):
                reg = self.find(a)
                if reg is None or a + nbytes > reg.hi:
                    raise what(lane, a, "outside every known allocation: " + self.describe(a))
                order.setdefault(id(reg), (reg, []))[1].append(lane)
            groups = [(reg, np.array(lanes)) for reg, lanes in order.values()]
        if write:
            for reg, _ in groups:
                if not reg.writable:
                    raise what(0, int(addrs[0]), f"write to read-only {reg!r}")
        return groups

    def read(self, addrs: np.ndarray, nbytes: int, what) -> np.ndarray:
        """uint8[len(addrs), nbytes] from the given byte addresses (uint64 array)."""
        if len(addrs) == 0:
            return np.zeros((0, nbytes), np.uint8)
        out = np.empty((len(addrs), nbytes), np.uint8)
        steps = np.arange(nbytes, dtype=np.int64)
        for reg, lanes in self._locate(addrs, nbytes, False, what):
            if lanes is None:
                off = (addrs - np.uint64(reg.lo)).astype(np.int64)
                out[:] = reg.buf[off[:, None] + steps]
            else:
                off = (addrs[lanes] - np.uint64(reg.lo)).astype(np.int64)
                out[lanes] = reg.buf[off[:, None] + steps]
        return out

    def write(self, addrs: np.ndarray, data: np.ndarray, what) -> None:
        """data: uint8[len(addrs), nbytes]; later lanes win where addresses overlap."""
        if len(addrs) == 0:
            return
        nbytes = data.shape[1]
        steps = np.arange(nbytes, dtype=np.int64)
        for reg, lanes in self._locate(addrs, nbytes, True, what):
            if lanes is None:
                off = (addrs - np.uint64(reg.lo)).astype(np.int64)
                reg.buf[off[:, None] + steps] = data
            else:
                off = (addrs[lanes] - np.uint64(reg.lo)).astype(np.int64)
                reg.buf[off[:, None] + steps] = data[lanes]

    def read_scalar(self, addr: int, nbytes: int, what) -> bytes:
        return self.read(np.array([addr], np.uint64), nbytes, what)[0].tobytes()
