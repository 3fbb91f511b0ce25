"""Launch stage: pack the argument buffer from the manifest's layout and queue the launches."""

from __future__ import annotations

import dataclasses
import struct
import weakref

from .catalogue import KernArg, eval_grid
from .driver.base import Function
from .kernels import Kernel

#: struct code of each manifest argument type (sizes fixed, little-endian overall).
_CODE = {"ptr": "Q", "i64": "q", "i32": "i", "f32": "f", "tmap": "128s"}

#: The packer of each loaded kernel, made at its first launch.
_packers: "weakref.WeakKeyDictionary[Kernel, tuple]" = weakref.WeakKeyDictionary()


def packer(args: list[KernArg], size: int) -> tuple[struct.Struct, tuple[str, ...], frozenset]:
    """The compiled struct of a manifest argument layout (the catalogue's KernArgs, in order),
    with the arguments' names and those of its pointers: the arguments at their offsets, zero
    padding between them and up to ``size``."""
    fmt, end = "<", 0
    for a in args:
        fmt += "x" * (a.offset - end) + _CODE[a.type]
        end = a.offset + struct.calcsize("<" + _CODE[a.type])
    fmt += "x" * (size - end)
    return struct.Struct(fmt), tuple(a.name for a in args), frozenset(a.name for a in args if a.type == "ptr")


def pack_args(kernel: Kernel, values: dict) -> bytes:
    """The kernel's argument buffer: every manifest argument at its offset; padding zeroed.

    ``values`` must name every argument of the layout (None for a null pointer);
    an unknown or missing name is a programming error and raises KeyError.
    """
    made = _packers.get(kernel)
    if made is None:
        made = _packers[kernel] = packer(kernel.kernargs, kernel.entry["kernarg_size"])
    packed, names, pointers = made
    if len(values) != len(names):
        extra = set(values) - set(names)
        raise KeyError(f"values for arguments {sorted(extra)} that {kernel.variant.name} does not take"
                       if extra else f"no value for {sorted(set(names) - set(values))}")
    return packed.pack(*(0 if values[n] is None and n in pointers else values[n] for n in names))


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch, ready to queue: the function, its grid and block, the bytes of
    dynamic shared memory and the packed argument buffer; ``dependent``: queued as a
    programmatic dependent of the launch before it (its CTAs may start while that launch's last
    ones run; the kernel waits for it where it reads what it writes: the manifest's
    ``dependent_launch``)."""
    function: Function
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    args: bytes
    dependent: bool = False


def assemble(kernel: Kernel, grids: tuple, args: bytes, dependent: bool = True) -> tuple[Launch, ...]:
    """The launches of ``kernel`` for its ``grids`` and packed ``args``, in order: its
    pre-pass, the kernel and its tail kernel, with the same argument buffer, each where it has
    it and its grid is not empty (a balanced tail may take every tile: no kernel launch); none
    where neither the kernel nor its tail has a CTA (e.g. zero query rows).  Where ``dependent``
    and the manifest's ``dependent_launch`` allow it, the kernel is its pre-pass's programmatic
    dependent and the tail kernel the kernel's: only after the launch each is written to follow
    (cuda/flash_fp8_lean.cuh, "the launches' order"), never the call's first."""
    pre, grid, tail = grids
    block = (kernel.entry["block_size"], 1, 1)
    after = dependent and bool(kernel.entry.get("dependent_launch"))
    first = _prepass(kernel, pre, args) if pre is not None and 0 not in pre else None
    main = (Launch(kernel.function, grid, block, kernel.entry["dynamic_smem"], args,
                   dependent=after and first is not None) if 0 not in grid else None)
    last = (Launch(kernel.tail, tail, block, kernel.entry["dynamic_smem"], args,
                   dependent=after and main is not None) if tail is not None and 0 not in tail else None)
    if main is None and last is None:
        return ()
    return tuple(ln for ln in (first, main, last) if ln is not None)


def queue(driver, launches: tuple[Launch, ...], stream: int) -> None:
    """Queue prepared launches on ``stream``, in order."""
    for ln in launches:
        driver.launch(ln.function, ln.grid, ln.block, ln.shared, stream, ln.args, dependent=ln.dependent)


def launch_prepass(driver, kernel: Kernel, values: dict, args: bytes, stream: int) -> None:
    """Launch ``kernel``'s pre-pass alone with the packed ``args`` of ``values`` (the grid from
    the manifest's rule; nothing where it is empty)."""
    grid = grid_of(driver, kernel, kernel.entry["prepass"]["grid"], values)
    if 0 not in grid:
        queue(driver, (_prepass(kernel, grid, args),), stream)


def _prepass(kernel: Kernel, grid: tuple[int, int, int], args: bytes) -> Launch:
    return Launch(kernel.prepass, grid, (kernel.entry["prepass"]["block_size"], 1, 1), 0, args)


def grid_of(driver, kernel: Kernel, rule: dict, values: dict) -> tuple[int, int, int]:
    """A manifest grid rule evaluated for one launch, refused (ValueError) where it is larger
    than the driver's device takes: it reads sizes only, never an address."""
    grid = eval_grid(rule, values)
    limit = driver.max_grid
    if limit is not None and any(g > m for g, m in zip(grid, limit)):
        raise ValueError(f"{kernel.variant.name}: this problem needs a launch grid of {grid} CTAs, "
                         f"more than the {driver.name} device takes ({limit}); split the batch or "
                         f"the sequence")
    return grid


def unpack_args(entry: dict, buf: bytes) -> dict:
    """The inverse of :func:`pack_args`: argument values by name, read at the manifest offsets."""
    return {a["name"]: struct.unpack_from("<" + _CODE[a["type"]], buf, a["offset"])[0]
            for a in entry["kernargs"]}
