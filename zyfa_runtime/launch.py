"""Launch stage: pack the argument buffer from the manifest's layout and launch."""

from __future__ import annotations

import struct

from .catalogue import eval_grid
from .kernels import Kernel

#: struct format of each manifest argument type (little-endian, sizes fixed).
_FORMAT = {"ptr": "<Q", "i64": "<q", "i32": "<i", "f32": "<f"}


def pack_args(kernel: Kernel, values: dict) -> bytes:
    """The kernel's argument buffer: every manifest argument at its offset; padding zeroed.

    ``values`` must name every argument of the layout (None for a null pointer);
    an unknown or missing name is a programming error and raises KeyError.
    """
    buf = bytearray(kernel.entry["kernarg_size"])
    names = set()
    for a in kernel.kernargs:
        value = values[a.name]
        if a.type == "ptr" and value is None:
            value = 0
        struct.pack_into(_FORMAT[a.type], buf, a.offset, value)
        names.add(a.name)
    extra = set(values) - names
    if extra:
        raise KeyError(f"values for arguments {sorted(extra)} that {kernel.variant.name} does not take")
    return bytes(buf)


def launch(driver, kernel: Kernel, values: dict, stream: int) -> tuple[int, int, int]:
    """Launch ``kernel`` with ``values`` on ``stream``; returns the grid it used."""
    grid = eval_grid(kernel.entry["grid"], values)
    if 0 in grid:
        return grid  # nothing to do (e.g. zero query rows)
    args = pack_args(kernel, values)
    block = (kernel.entry["block_size"], 1, 1)
    driver.launch(kernel.function, grid, block, kernel.entry["dynamic_smem"], stream, args)
    return grid


def unpack_args(entry: dict, buf: bytes) -> dict:
    """The inverse of :func:`pack_args`: argument values by name, read at the manifest offsets."""
    return {a["name"]: struct.unpack_from(_FORMAT[a["type"]], buf, a["offset"])[0]
            for a in entry["kernargs"]}
