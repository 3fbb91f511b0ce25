"""Launch stage: pack the argument buffer from the manifest's layout and launch."""

from __future__ import annotations

import dataclasses
import struct

from .catalogue import eval_grid
from .driver.base import Function
from .kernels import Kernel

#: struct code of each manifest argument type (sizes fixed, little-endian overall).
_CODE = {"ptr": "Q", "i64": "q", "i32": "i", "f32": "f", "tmap": "128s"}


def packer(layout: tuple, size: int) -> tuple[struct.Struct, tuple[str, ...], frozenset]:
    """The compiled struct of a manifest layout ((name, type, offset), ...), made once a kernel
    (Kernel.packer): the arguments at their offsets, zero padding between them and up to
    ``size``."""
    fmt, end = "<", 0
    for _, ty, offset in layout:
        fmt += "x" * (offset - end) + _CODE[ty]
        end = offset + struct.calcsize("<" + _CODE[ty])
    fmt += "x" * (size - end)
    names = tuple(n for n, _, _ in layout)
    return struct.Struct(fmt), names, frozenset(n for n, ty, _ in layout if ty == "ptr")


def pack_args(kernel: Kernel, values: dict) -> bytes:
    """The kernel's argument buffer: every manifest argument at its offset; padding zeroed.

    ``values`` must name every argument of the layout (None for a null pointer);
    an unknown or missing name is a programming error and raises KeyError.
    """
    packer, names, pointers = kernel.packer
    if len(values) != len(names):
        extra = set(values) - set(names)
        raise KeyError(f"values for arguments {sorted(extra)} that {kernel.variant.name} does not take"
                       if extra else f"no value for {sorted(set(names) - set(values))}")
    return packer.pack(*(0 if values[n] is None and n in pointers else values[n] for n in names))


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


def grids(driver, kernel: Kernel, values: dict, sm_count: int | None = None) -> tuple:
    """The grids of ``kernel``'s launches for ``values``: (the pre-pass's or None, the
    kernel's, the tail kernel's or None), each evaluated from the manifest's rule and refused
    where too large; they read sizes only, never an address.  ``sm_count``: the device's
    multiprocessors, for the grid of a persistent kernel."""
    grid = _grid(driver, kernel, kernel.entry["grid"],
                 values if sm_count is None else {**values, "sm_count": int(sm_count)})
    pre = _grid(driver, kernel, kernel.entry["prepass"]["grid"], values) if kernel.prepass is not None else None
    tail = _grid(driver, kernel, kernel.entry["split_tail"]["grid"], values) if kernel.tail is not None else None
    return pre, grid, tail


#: ``ZYFA_DEPENDENT_LAUNCH``: ``on`` (the default) queues a kernel after its pre-pass, and a tail
#: kernel after the kernel, as programmatic dependents where the manifest allows it
#: (``dependent_launch``); ``off`` queues every launch to start once the one before has ended.
DEPENDENT_LAUNCH_MODES = ("on", "off")


def dependent_launches(mode: str = "on") -> bool:
    """Whether ``ZYFA_DEPENDENT_LAUNCH=mode`` allows dependent launches; refused
    (ValueError) where it is neither mode."""
    if mode not in DEPENDENT_LAUNCH_MODES:
        raise ValueError(f"ZYFA_DEPENDENT_LAUNCH={mode!r}: one of {', '.join(DEPENDENT_LAUNCH_MODES)}")
    return mode == "on"


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
    grid = _grid(driver, kernel, kernel.entry["prepass"]["grid"], values)
    if 0 not in grid:
        queue(driver, (_prepass(kernel, grid, args),), stream)


def _prepass(kernel: Kernel, grid: tuple[int, int, int], args: bytes) -> Launch:
    return Launch(kernel.prepass, grid, (kernel.entry["prepass"]["block_size"], 1, 1), 0, args)


#: The tiles of a persistent kernel are numbered by a 32-bit int in the kernel.
MAX_TILES = 2**31 - 1


def persistent_tiles(kernel: Kernel, values: dict, key: str = "persistent") -> dict:
    """The tile arguments of a persistent or balanced-tail kernel: ``tiles_x``, ``tiles_y``,
    ``tiles_z`` (its manifest's ``persistent.tiles`` or ``split_tail.tiles`` rule, ``key``) and
    ``tile_count``, their product; refused (ValueError) where the tiles overflow the kernel's
    int.  They are not a launch grid: the device's grid limits do not apply to them."""
    x, y, z = eval_grid(kernel.entry[key]["tiles"], values)
    if x * y * z > MAX_TILES:
        raise ValueError(f"{kernel.variant.name}: this problem has {x * y * z} tiles of "
                         f"{kernel.entry['tile']['block_m']} query rows, more than {MAX_TILES}; split the "
                         f"batch or the sequence")
    return {"tiles_x": x, "tiles_y": y, "tiles_z": z, "tile_count": x * y * z}


#: ``ZYFA_SPLIT_TAIL``: ``auto`` (the default) cuts the tail where tail_plan's model gains,
#: ``off`` never, ``always`` wherever there is a partial last wave (for tests and A/B runs).
SPLIT_TAIL_MODES = ("auto", "off", "always")


def tail_plan(entry: dict, values: dict, sm_count: int, packed: bool, mode: str = "auto",
              dependent: bool = True) -> dict:
    """A balanced-tail kernel's ``tail_first``, ``tail_ctas``, ``tail_gap`` and ``tail_ramp``
    (catalogue.Tile.split_tail; the kernel's TailRun reads them): the R = tile_count mod sm_count
    tiles past the last whole wave, nb key blocks each, cut among min(sm_count, R nb) CTAs.

    Cut where each CTA's share, ceil(R nb / sm_count), plus the manifest's ``overhead_blocks``
    (a second tile's start, the partial's store and the merge) is below nb, the blocks the last
    wave takes whole; never for packed batches (their tiles differ in length) nor past 2^31
    units or 2^12 SMs (the tail kernel's 32-bit arithmetic).  The shares are planned equal in
    time: the tiles lie end to end with ``tail_gap`` = the manifest's ``switch_blocks`` units
    after each (a CTA that goes on to the next tile has that many blocks fewer), and where the
    tail is launched as the kernel's ``dependent`` (its CTAs start as the kernel's last ones end,
    j-th CTA on the j-th SM to come free) the shares fall by ``tail_ramp`` = ``drain_blocks``
    units from the first CTA to the last.  Both are dropped (plain equal blocks) where a CTA's
    units could exceed a tile's blocks (a third segment) or fall to its gap.  ``entry``: the
    kernel's manifest entry; ``values``: the tile arguments and ``seqlen_k``."""
    if mode not in SPLIT_TAIL_MODES:
        raise ValueError(f"ZYFA_SPLIT_TAIL={mode!r}: one of {', '.join(SPLIT_TAIL_MODES)}")
    tiles = values["tile_count"]
    whole = {"tail_first": tiles, "tail_ctas": 0, "tail_gap": 0, "tail_ramp": 0}
    nb = -(-values["seqlen_k"] // entry["tile"]["block_n"])
    rest = tiles % sm_count
    if packed or mode == "off" or rest == 0 or nb < 2 or sm_count >= 2**12:
        return whole
    st = entry["split_tail"]
    share = -(-rest * nb // sm_count)
    if mode == "auto" and share + st["overhead_blocks"] >= nb:
        return whole
    ctas = min(sm_count, rest * nb)
    ramp = st["drain_blocks"] if dependent and tiles > rest else 0   # tiles == rest: no kernel to follow
    for gap, ramp in ((st["switch_blocks"], ramp), (0, 0)):
        cost = rest * (nb + gap) - gap
        q, half = cost // ctas, -(-ramp // 2)
        if cost >= 2**31:
            continue
        if (gap, ramp) == (0, 0) or (q + 2 + half <= nb and q - half - 1 > gap):
            return {"tail_first": tiles - rest, "tail_ctas": ctas, "tail_gap": gap, "tail_ramp": ramp}
    return whole


def tail_units(plan: dict, tiles: int, nb: int) -> list[int]:
    """The first block of each tail CTA and the run's end (len tail_ctas + 1) for ``plan``, as
    the tail kernel's TailRun computes them (exactly, in Python's integers)."""
    ctas, gap, ramp = plan["tail_ctas"], plan["tail_gap"], plan["tail_ramp"]
    cost = (tiles - plan["tail_first"]) * (nb + gap) - gap
    q, r = divmod(cost, ctas)
    starts = []
    for j in range(ctas + 1):
        s = j * q + (2 * j * r + ramp * j * (ctas - j)) // (2 * ctas)
        u = s // (nb + gap)
        starts.append(u * nb + min(s - u * (nb + gap), nb))
    return starts


def _grid(driver, kernel: Kernel, rule: dict, values: dict) -> tuple[int, int, int]:
    """A manifest grid rule evaluated for one launch, refused (ValueError) where it is larger
    than the driver's device takes."""
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
