"""Plan stage: from a validated call to the launches that run it.

A call's :class:`Layout` is everything its launches hold but addresses: the kernel of the
device's arch, the arguments that are no address, the tensor maps' geometry, the grids, the
tile plan of a persistent or balanced-tail kernel and the bytes of its workspace.
:func:`instantiate` fills in a call's addresses and queues its launches as a :class:`Plan`,
which queues them again for the same call.  Recent layouts and plans are kept in two LRU caches
by the keys :func:`layout_key` and :func:`plan_key`."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import threading

import numpy as np

from . import launch, validate, workspace
from .catalogue import Variant, eval_grid, f16_variant, serving_variant, short_variant, vt_columns
from .memory import DeviceArray
from .tensors import contiguous_strides

_lock = threading.Lock()
_ones: dict[tuple[str, int], DeviceArray] = {}


@dataclasses.dataclass(frozen=True)
class Layout:
    """A call's launches less its addresses: what every call of one layout shares (the
    tensors' shapes, strides, dtypes and devices, the options, the stream).  Made once such a
    call has passed validation; the next call of that layout checks only its addresses
    (``validate.check_addresses``) before :func:`instantiate` fills them in."""
    problem: validate.Problem
    kernel: object
    values: dict                      # every argument that is no address
    tensor_maps: dict                 # argument -> (tensor, dims, strides, box, swizzle bytes)
    grids: tuple                      # grids(): (the pre-pass's or None, the kernel's, the tail's or None)
    vt_bytes: int                     # of the V^T in the workspace (0: no pre-pass)
    partial_bytes: int                # of a balanced tail's partials in it, after the V^T (0: none)
    counter: tuple                    # (argument, bytes) of a tile counter: a persistent kernel's, a tail's
    lse: tuple                        # (shape, strides) of the LSE
    dependent: bool                   # queued as programmatic dependents (env and manifest allow it)
    clamps_cu_seqlens: bool           # the kernel clamps packed sequences to the tensors' rows
    kg_bytes: int = 0                 # of a paged cache's K gathered by the pre-pass, after the V^T (0: none)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A call's launches as queued, to queue again for the same call: the same inputs (every
    pointer, shape, stride and dtype), options, stream and backend give the same argument
    buffers, so a repeated call skips validation, tensor maps and packing.  The workspace and
    tile counter addresses the buffers hold are checked on every reuse (a grown or released
    workspace has moved: the call is planned anew).  It holds no reference to the tensors."""
    device: int
    launches: tuple
    extents: dict                       # name -> (lo, hi), for the driver's tensor_extents
    workspace: tuple[int, int] | None   # (bytes, address) of the call's workspace: V^T, then partials
    counter: tuple[int, int] | None     # (bytes, address) of a persistent kernel's or a tail's counter

    def queue_again(self, driver, stream: int) -> bool:
        """Queue the launches on ``stream`` if the workspace and counter are where they were;
        False (nothing queued) otherwise."""
        if self.counter is not None:
            if workspace.counter(driver, self.device, stream, self.counter[0]) != self.counter[1]:
                return False
        driver.make_current(self.device)
        hold = (workspace.hold(driver, self.device, stream, self.workspace[0]) if self.workspace
                else contextlib.nullcontext())
        with hold as ws:
            if self.workspace is not None and ws != self.workspace[1]:
                return False
            self.queue(driver, stream)
        return True

    def queue(self, driver, stream: int) -> None:
        """Queue the launches on ``stream`` (the workspace, where there is one, held)."""
        with driver.tensor_extents(self.extents):
            launch.queue(driver, self.launches, stream)


# --------------------------------------------------------------------------------------
# A call's layout.

def layout_of(problem: validate.Problem, q, k, v, out, driver, table, lse_shape, lse_strides,
              descales=(None, None, None), page_table=None) -> Layout:
    """The kernel (from ``table``, the kernels.KernelTable of ``driver``), the arguments that are
    no address, the tensor maps' geometry and the grids of a validated call: every rule that
    reads sizes or strides is applied here.  ``descales``: the FP8 descales' TensorRefs (None
    where not given); ``page_table``: a paged KV cache's (its row stride)."""
    kind, device = problem.device
    arch = table.device_arch(device)
    variant = variant_for(problem, table, arch)
    require_features(problem, table, variant)
    kernel = table.get(device, variant)
    if variant.built_from == "asm-generator":
        _check_buffer_spans(problem, q, k, v, out)
    elif arch == "gfx950" and problem.kvcache == "paged":
        _check_paged_strides(k, v, elem=2, row_limit=PAGE_ROW_STRIDE_LIMIT)
    names = {a["name"] for a in kernel.entry["kernargs"]}

    b_ = 0 if problem.varlen else 1  # dense tensors have a leading batch dim
    def strides(st: tuple):
        return (st[0] if not problem.varlen else 0, st[b_], st[b_ + 1])
    def cache_strides(st: tuple):   # a KV cache: (sequences or pages, rows, heads, head dim) whatever q
        return (st[0], st[1], st[2]) if problem.kvcache else strides(st)
    # out where the call allocates it: contiguous
    o_strides = out.strides if out is not None else contiguous_strides(q.shape[:-1] + (problem.d_v,))

    values = {
        "lse_stride_b": lse_strides[0], "lse_stride_h": lse_strides[1],
        "batch": problem.batch, "hq": problem.hq, "hkv": problem.hkv,
        "seqlen_q": problem.seqlen_q, "seqlen_k": problem.seqlen_k,
        "softmax_scale": problem.softmax_scale,
    }
    for name, st in (("q", q.strides), ("k", k.strides), ("v", v.strides), ("o", o_strides)):
        values[f"{name}_stride_b"], values[f"{name}_stride_s"], values[f"{name}_stride_h"] = \
            (cache_strides if name in "kv" else strides)(st)
    clamps = "total_q" in names
    if clamps:
        # the rows a packed sequence is clamped to (cu_seqlens hold int32: no row past 2^31 - 1
        # is any sequence's)
        values["total_q"] = min(problem.total_q, validate.INT32_MAX)
        values["total_k"] = min(problem.total_k, validate.INT32_MAX)
    if problem.dtype == "fp8_e4m3":
        values.update(_descale_values(variant, names, descales))
    values.update(_feature_values(problem, names))
    values.update(kvcache_values(problem, names, page_table))
    # FP8 serving kernels take a paged cache's K as the pre-pass gathers it (catalogue.gathers_k)
    gathered = problem.kvcache == "paged" and "kg" in names
    maps = {arg: _tensor_map_geometry(problem, values, spec, gathered)
            for arg, spec in kernel.entry.get("tensor_maps", {}).items()}
    sm_count, counter, partial_bytes = None, None, 0
    dependent = (dependent_launches(os.environ.get("ZYFA_DEPENDENT_LAUNCH", "on"))
                 and bool(kernel.entry.get("dependent_launch")))
    if "persistent" in kernel.entry:
        # One CTA an SM taking tiles from a counter: the tiles, and the counter's size.
        values.update(persistent_tiles(kernel, values))
        counter = ("tile_counter", kernel.entry["persistent"]["counter_bytes"])
        sm_count = driver.attribute(device, "multiprocessor_count")
    if "split_tail" in kernel.entry:
        # The tiles past the last whole wave cut by keys (tail_plan): their pieces' partials in
        # the workspace after the V^T, a count a cut tile.
        tail = kernel.entry["split_tail"]
        values.update(persistent_tiles(kernel, values, "split_tail"))
        values.update(tail_plan(kernel.entry, values, driver.attribute(device, "multiprocessor_count"),
                                problem.varlen, os.environ.get("ZYFA_SPLIT_TAIL", "auto"), dependent))
        partial_bytes = 2 * values["tail_ctas"] * tail["slot_bytes"]
        counter = ("tail_counter", max(values["tile_count"] - values["tail_first"], 1) * tail["counter_bytes"])
    vt_bytes = 0
    if "prepass" in kernel.entry:
        # The V^T pre-pass: its workspace, laid out by catalogue.vt_columns.
        # A KV cache's V^T is dense whatever the queries: seqlen_k (the cache's rows a sequence)
        # columns a sequence, from shapes only (a captured call's workspace: nothing read back).
        packed_k = problem.varlen and not problem.kvcache
        values["vt_stride_h"] = problem.d_v * vt_columns(problem.batch, problem.seqlen_k,
                                                         problem.total_k if packed_k else None)
        vt_bytes = problem.hkv * values["vt_stride_h"]
    kg_bytes = problem.batch * problem.seqlen_k * problem.hkv * problem.d_qk if gathered else 0
    launch_grids = grids(driver, kernel, values, sm_count)
    return Layout(problem, kernel, values, maps, launch_grids, vt_bytes, partial_bytes, counter,
                  (lse_shape, lse_strides), dependent, clamps, kg_bytes)


def variant_for(problem: validate.Problem, table, arch: str) -> Variant:
    """The variant that runs ``problem`` on ``arch``: for a call that needs a feature
    (validate.features_of) the serving variant of its (arch, dtype, head dims, causal) where the
    manifest lists one (catalogue.Variant.serving: the plain kernel stays as tuned, without the
    features; with a softcap its softcap specialisation, Variant.softcap), else the plain variant -- which lists its features itself (gfx950) or is refused
    by require_features.  A call without features whose sequences have at most the keys a
    built short-prompt variant's entry names (``short.max_seqlen_k``) takes that variant
    (catalogue.Variant.short), and where a built f16-math variant's entry names at least as many
    (``f16.max_seqlen_k``), that one first (catalogue.Variant.f16).  Within ``forced_variant(v)``
    a call of v's (arch, dtype, head dims, causal) without features takes v (its plain, short or
    f16-math kernel, for the tests of each)."""
    plain = Variant(arch, problem.dtype, problem.d_qk, problem.d_v, problem.causal)
    needed = validate.features_of(problem)
    if needed:
        serving = serving_variant(plain, softcap="softcap" in needed)
        return serving if serving is not None and table.entry(serving) is not None else plain
    if _forced is not None and _forced in (plain, short_variant(plain), f16_variant(plain)):
        return _forced
    for special, key in ((f16_variant(plain), "f16"), (short_variant(plain), "short")):
        entry = table.entry(special) if special is not None else None
        if entry is not None and entry.get("built") and problem.seqlen_k <= entry.get(key, {}).get("max_seqlen_k", -1):
            return special
    return plain


#: The variant forced_variant names (None: variant_for's own choice).
_forced: "Variant | None" = None


@contextlib.contextmanager
def forced_variant(v: Variant):
    """Within it, calls without features of ``v``'s (arch, dtype, head dims, causal) take ``v``,
    plain or short, whatever their length (selfcheck.check_variant: each kernel tested).  The
    cached layouts and plans, which hold their variant's kernel, are dropped as it starts and
    ends."""
    global _forced
    previous, _forced = _forced, v
    _layouts.clear()
    _plans.clear()
    try:
        yield
    finally:
        _forced = previous
        _layouts.clear()
        _plans.clear()


def require_features(problem: validate.Problem, table, variant: Variant) -> None:
    """Refuse (ValueError, before any kernel is loaded) a call that needs a feature
    (validate.features_of: window, softcap, sinks, KV cache) that ``variant``'s manifest entry
    does not list under ``features`` (catalogue.features), naming what the arch's kernels of
    that dtype run."""
    needed = validate.features_of(problem)
    if not needed:
        return
    entry = table.entry(variant) or {}
    missing = [f for f in needed if f not in entry.get("features", ())]
    if not missing:
        return
    listed = {f for v in table.available(variant.arch) if v.dtype == variant.dtype
              for f in (table.entry(v) or {}).get("features", ())}
    runs = [f for f in validate.FEATURES if f in listed]
    offered = ("; they also take " + ", ".join(validate.FEATURES[f] for f in runs)) if runs else \
        " (no window_size, softcap, sinks or KV cache: not implemented yet)"
    raise ValueError(f"{variant.name} does not implement {' or '.join(validate.FEATURES[f] for f in missing)}: "
                     f"the {variant.arch} {variant.dtype} kernels run causal or full attention over K and V "
                     f"tensors{offered}")


def _feature_values(problem: validate.Problem, names: set) -> dict:
    """The feature arguments a kernel has (catalogue._arg_names, by catalogue.features): the
    window's bounds (-1: none; a causal kernel ignores the right one, 0 in the problem) and the
    softcap with fp32(softmax_scale / softcap) (0 and 0: off).  require_features has refused a
    call that needs one its kernel lacks."""
    out = {}
    if "window_left" in names:
        out["window_left"], out["window_right"] = problem.window
    if "softcap" in names:
        cap = problem.softcap
        out["softcap"] = cap
        out["softcap_scale"] = float(np.float32(problem.softmax_scale / cap)) if cap else 0.0
    return out


def kvcache_values(problem: validate.Problem, names: set, page_table=None) -> dict:
    """The paged KV cache's arguments that are no address, where the kernel takes them
    (catalogue._arg_names, "paged_kv"): ``page_table_stride`` (elements between two sequences'
    rows of ``page_table``, its TensorRef), ``page_size``, ``num_pages``, ``max_pages`` and
    ``page_magic``; zeros
    for a call without pages (the kernel reads a null page_table as none).  The pointers ``cache_seqlens``
    and ``page_table`` are the call's addresses (:func:`instantiate`)."""
    if "page_table_stride" not in names:
        return {}
    paged = problem.kvcache == "paged"
    return {"page_table_stride": int(page_table.strides[0]) if paged and problem.batch > 1 else 0,
            "page_size": problem.page_size if paged else 0, "num_pages": problem.num_pages if paged else 0,
            "max_pages": problem.max_pages if paged else 0, "page_magic": page_magic(problem.page_size) if paged else 0}


def page_magic(page_size: int) -> int:
    """ceil(2^31 / u), u = page_size / 16 (1 .. 16): with it a kernel divides a 16-row group's
    index g < 2^27 (keys < 2^31) by u as mul_hi(2 g, magic), exactly (the error magic u - 2^31 <
    u <= 16, and g x 15 < 2^31); as an int32 argument, its bits (2^31 for u = 1)."""
    u = page_size // 16
    magic = -(-2**31 // u)
    return magic - 2**32 if magic >= 2**31 else magic


#: The gfx950 FP8 kernels read descale element b stride_b + g stride_h at a 32-bit byte offset.
DESCALE_OFFSET_LIMIT = 2**30


def _descale_values(variant: Variant, names: set, descales) -> dict:
    """The descales' stride arguments of a kernel that takes them (catalogue.per_head_descales:
    every FP8 kernel; 0 and 0 for one value or none; the gfx950 FP8 kernels' offsets below
    DESCALE_OFFSET_LIMIT elements, else ValueError).  A code object built before its kernel
    took them (a manifest without the strides) reads one value each: it takes one value or a
    view that holds one (every stride along a dimension of more than one 0), else ValueError."""
    out = {}
    for t, d in zip("qkv", descales):
        sb, sh = validate.descale_strides(d)
        if f"descale_{t}_stride_b" in names:
            out[f"descale_{t}_stride_b"], out[f"descale_{t}_stride_h"] = sb, sh
            if variant.built_from == "asm-generator" and (sb or sh) and \
                    (d.shape[0] - 1) * sb + (d.shape[1] - 1) * sh >= DESCALE_OFFSET_LIMIT:
                raise ValueError(f"descale_{t} of shape {d.shape} and strides {d.strides} spans "
                                 f"{DESCALE_OFFSET_LIMIT} elements or more: the {variant.arch} FP8 kernels "
                                 "address a descale by 32-bit byte offsets; pass a compact (batch, heads_kv) array")
        elif sb or sh:
            raise ValueError(f"descale_{t} of shape {d.shape} and strides {d.strides}: this {variant.name} "
                             f"code object takes one descale a tensor (built before the kernel read them per "
                             f"sequence and key/value head: rebuild it); pass shape () or (1,), or a "
                             f"(batch, heads_kv) view of one value (zero strides)")
    return out


#: The gfx950 FP8 kernels address each (sequence, head) slice of a tensor through a buffer
#: resource: 32-bit offsets and range checks, rows past the sequence read as zeros.
BUFFER_SPAN_LIMIT = 2**31
#: The gfx950 kernels' paged loads address page n of a cache at ``n stride_b`` as a 32 x 32
#: -> 64-bit product (generator/gfx950_fp8.py paged_chunks; BF16: hip/bf16_lds.h
#: CopyCore::tile): a page stride below 4 GiB.
PAGE_STRIDE_LIMIT = 2**32
#: The gfx950 BF16 kernels' paged copies size a 16-row group's buffer as its rows x the row
#: stride by a 24-bit multiply (v_mul_u32_u24): a row stride (stride_s) below 16 MiB.
PAGE_ROW_STRIDE_LIMIT = 2**24


def _check_buffer_spans(problem: validate.Problem, q, k, v, out) -> None:
    """What the buffer addressing of the gfx950 FP8 kernels needs, as a clear error: the rows
    one buffer covers span less than 2 GiB (K and V: a whole sequence of one head, which the
    kernel cuts to seqlen_k / max_seqlen_k whatever cu_seqlens holds; Q and O: the 256 rows of a
    workgroup), and rows do not overlap (a row stride of at least the head
    dim: the range check that ends a sequence relies on it); a paged cache's page stride is
    below 4 GiB (PAGE_STRIDE_LIMIT)."""
    b_ = 0 if problem.varlen else 1
    block_m = Variant("gfx950", problem.dtype, problem.d_qk, problem.d_v, problem.causal).tile.block_m
    rows_q = min(problem.seqlen_q, block_m)
    checks = [("q", q, rows_q, problem.d_qk, 1), ("k", k, problem.seqlen_k, problem.d_qk, 1),
              ("v", v, problem.seqlen_k, problem.d_v, 1)]
    if out is not None:
        checks.append(("out", out, rows_q, problem.d_v, 2))
    for name, t, rows, d, elem in checks:
        stride = int(t.strides[b_])
        if rows > 1 and stride < d:
            raise ValueError(f"{name}: a sequence stride of {stride} elements is below the head "
                             f"dim {d}: rows overlap, which the gfx950 FP8 kernels do not support")
        span = ((max(rows, 1) - 1) * stride + d) * elem
        if span >= BUFFER_SPAN_LIMIT:
            raise ValueError(f"{name}: the rows one buffer of the gfx950 FP8 kernels covers span "
                             f"{span} bytes, more than {BUFFER_SPAN_LIMIT - 1} (32-bit offsets): "
                             "use a smaller row stride or shorter key sequences")
    if problem.kvcache == "paged":
        _check_paged_strides(k, v, elem=1)


def _check_paged_strides(k, v, elem: int, row_limit: int | None = None) -> None:
    """What the paged loads of the gfx950 kernels need, as a clear error before launch: a page
    stride below 4 GiB (PAGE_STRIDE_LIMIT) and, where ``row_limit`` (the BF16 kernels'
    PAGE_ROW_STRIDE_LIMIT), a row stride below it; in bytes, ``elem`` bytes an element."""
    for name, t in (("k", k), ("v", v)):
        page, row = int(t.strides[0]) * elem, int(t.strides[1]) * elem
        if page >= PAGE_STRIDE_LIMIT:
            raise ValueError(f"{name}: a page stride of {page} bytes, more than {PAGE_STRIDE_LIMIT - 1}: the "
                             "gfx950 kernels multiply a page by its stride in 32 bits; pass a cache of smaller "
                             "pages")
        if row_limit is not None and row >= row_limit:
            raise ValueError(f"{name}: a row stride of {row} bytes, more than {row_limit - 1}: the "
                             "gfx950 BF16 kernels size a page's rows by a 24-bit multiply; pass a cache with "
                             "rows closer together")


def _tensor_map_geometry(problem: validate.Problem, values: dict, spec: dict, gathered: bool = False) -> tuple:
    """Where the sm_90a kernels' TMA tensor map of Q, K, V or O (``spec["tensor"]``) comes from,
    all but its address: (the tensor's argument, dims, strides, box, swizzle bytes); dims in bytes of (head
    dim, heads, rows, sequences), a packed batch as one sequence of all its rows; box and
    swizzle as the manifest's ``spec`` (catalogue.tensor_maps).  A KV cache's K and V whatever
    the queries: contiguous, (head dim, heads, max_seqlen_k rows, sequences); paged, the whole
    cache, (head dim, heads, page_size rows, num_pages pages) in boxes of
    :func:`page_box_rows` rows (the kernels' page_piece: a tile is whole boxes, one page each);
    with ``gathered`` (catalogue.gathers_k) a paged K is the pre-pass's contiguous copy, "kg",
    (head dim, heads, seqlen_k rows, sequences) packed.  TMA takes strides in multiples of 16 bytes."""
    t = spec["tensor"]
    elem = 1 if problem.dtype == "fp8_e4m3" and t != "o" else 2   # O: bf16
    row_bytes = elem * (problem.d_v if t in ("v", "o") else problem.d_qk)
    heads = problem.hq if t in ("q", "o") else problem.hkv
    box = tuple(spec["box"])
    if t == "k" and gathered:
        row = heads * row_bytes
        return "kg", (row_bytes, heads, problem.seqlen_k, problem.batch), (row_bytes, row, problem.seqlen_k * row), \
            box, spec["swizzle_bytes"]
    if t in ("k", "v") and problem.kvcache:
        paged = problem.kvcache == "paged"
        rows, seqs = (problem.page_size, problem.num_pages) if paged else (problem.seqlen_k, problem.batch)
        if paged:
            box = (box[0], box[1], page_box_rows(problem.page_size, box[2]), box[3])
        return _tensor_map_dims(t, values, elem, row_bytes, heads, rows, seqs, box, spec["swizzle_bytes"])
    total, seqlen = (problem.total_q, problem.seqlen_q) if t in ("q", "o") else (problem.total_k, problem.seqlen_k)
    rows = max(total if problem.varlen else seqlen, 1)
    return _tensor_map_dims(t, values, elem, row_bytes, heads, rows, 1 if problem.varlen else problem.batch, box,
                            spec["swizzle_bytes"])


def page_box_rows(page_size: int, tile_rows: int) -> int:
    """Rows of a paged cache's TMA box: the largest power of two that divides the page, at most a
    tile's rows (cuda/flash_common.cuh page_piece, the same rule): a tile, whose first key is a
    multiple of its rows, is whole boxes, none across a page (page sizes are multiples of 16)."""
    return min(page_size & -page_size, tile_rows)


def _tensor_map_dims(t: str, values: dict, elem: int, row_bytes: int, heads: int, rows: int, seqs: int,
                     box: tuple, swizzle: int) -> tuple:
    """The geometry of a tensor map of (row_bytes, heads, rows, seqs), its strides from ``values``
    (``{t}_stride_h``, ``_s``, ``_b``, in elements of ``elem`` bytes)."""
    one_sequence = seqs == 1
    # a dimension of one element: its stride is never used, so any valid one stands in
    row = elem * values[f"{t}_stride_s"] if rows > 1 else heads * row_bytes
    strides = (elem * values[f"{t}_stride_h"] if heads > 1 else row_bytes, row,
               rows * row if one_sequence else elem * values[f"{t}_stride_b"])
    bad = [s for s in strides if s <= 0 or s % 16]
    if bad:
        name, verb = ("out", "write") if t == "o" else (t, "read")
        raise ValueError(f"{name}: the sm_90a kernels {verb} {t.upper()} by TMA, which needs its head, row and batch "
                         f"strides to be positive multiples of 16 bytes; got {strides[0]}, {strides[1]}, "
                         f"{strides[2]} bytes")
    return t, (row_bytes, heads, rows, seqs), strides, box, swizzle


#: The tiles of a persistent kernel are numbered by a 32-bit int in the kernel.
MAX_TILES = 2**31 - 1


def persistent_tiles(kernel, values: dict, key: str = "persistent") -> dict:
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


#: ``ZYFA_SPLIT_TAIL``: ``auto`` (the default) cuts the tail where tail_plan's rule says it pays,
#: ``off`` never, ``always`` wherever there is a partial last wave (for tests and A/B runs).
SPLIT_TAIL_MODES = ("auto", "off", "always")


def tail_plan(entry: dict, values: dict, sm_count: int, packed: bool, mode: str = "auto",
              dependent: bool = True) -> dict:
    """A balanced-tail kernel's ``tail_first``, ``tail_ctas``, ``tail_gap`` and ``tail_ramp``
    (catalogue.Tile.split_tail; the tail kernel's TailRun reads them, :func:`tail_units` as it
    does): the R = tile_count mod sm_count tiles past the last whole wave, nb key blocks each,
    cut among min(sm_count, R nb) CTAs.  None is cut (``tail_first`` = tile_count) for packed
    batches (tiles of unequal length), tiles of one block, past the tail kernel's 32-bit
    arithmetic (2^31 units, 2^12 SMs), nor, in ``auto`` mode, unless a CTA's share plus the
    manifest's ``overhead_blocks`` is below nb.  Shares are equal in time: ``tail_gap`` =
    ``switch_blocks`` units follow each tile, and a ``dependent`` tail's shares fall by
    ``tail_ramp`` = ``drain_blocks`` units from its first CTA to its last; both are dropped
    where a share could span three tiles or fall to the gap.  ``entry``: the kernel's manifest
    entry; ``values``: the tile arguments and ``seqlen_k``."""
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


def grids(driver, kernel, values: dict, sm_count: int | None = None) -> tuple:
    """The grids of ``kernel``'s launches for ``values``: (the pre-pass's or None, the
    kernel's, the tail kernel's or None), each evaluated from the manifest's rule and refused
    where too large (launch.grid_of); they read sizes only, never an address.  ``sm_count``: the
    device's multiprocessors, for the grid of a persistent kernel."""
    entry = kernel.entry
    grid = launch.grid_of(driver, kernel, entry["grid"],
                          values if sm_count is None else {**values, "sm_count": int(sm_count)})
    pre = launch.grid_of(driver, kernel, entry["prepass"]["grid"], values) if kernel.prepass is not None else None
    tail = launch.grid_of(driver, kernel, entry["split_tail"]["grid"], values) if kernel.tail is not None else None
    return pre, grid, tail


# --------------------------------------------------------------------------------------
# A call's addresses, its workspace and its launches.

#: Bytes the partials of a balanced tail start at, after the V^T in the workspace.
PARTIALS_ALIGN = 256


def _partials_at(vt_bytes: int) -> int:
    return -(-vt_bytes // PARTIALS_ALIGN) * PARTIALS_ALIGN


def workspace_bytes(layout: Layout) -> int:
    """Bytes of a call's workspace: the V^T, then (from _partials_at) a balanced tail's
    partials or a paged cache's gathered K; 0 where it needs none."""
    after = layout.partial_bytes + layout.kg_bytes   # never both: a tail's kernels take no cache
    return _partials_at(layout.vt_bytes) + after if after else layout.vt_bytes


def instantiate(layout: Layout, q, k, v, out, lse, descales, cu_q, cu_k, stream: int, driver,
                captured: bool = False, sinks=None, cache=(None, None)):
    """Queue ``layout``'s launches for these tensors (their addresses checked): the outputs
    the call allocates (out where not given, the LSE where asked for and not given), and the
    Plan that queues the same launches again (None for a ``captured`` call: one on a stream
    being captured into a graph, whose scratch is the graph's own -- workspace.captured -- and
    which allocates nothing else: the caller gives out, and lse where the LSE is asked for).
    ``sinks``: the sinks' TensorRef (None: none; a kernel that takes them reads a null pointer
    as none); ``cache``: a KV cache's (cache_seqlens, page_table) TensorRefs (None: none, as
    sinks')."""
    problem, kernel = layout.problem, layout.kernel
    device = problem.device[1]
    out_arr = lse_arr = None
    if out is None:
        out_arr = DeviceArray(driver, device, q.shape[:-1] + (problem.d_v,), "bf16")
        out = out_arr.ref
    if problem.return_lse and lse is None:
        lse_arr = DeviceArray(driver, device, layout.lse[0], "float32")
        lse = lse_arr.ref
    values = dict(layout.values)
    values.update(q=q.ptr, k=k.ptr, v=v.ptr, o=out.ptr, lse=lse.ptr if lse is not None else None,
                  cu_seqlens_q=cu_q.ptr if cu_q is not None else None,
                  cu_seqlens_k=cu_k.ptr if cu_k is not None else None)
    taken = {a["name"] for a in kernel.entry["kernargs"]}   # catalogue.features
    for name, ref in (("sinks", sinks), ("cache_seqlens", cache[0]), ("page_table", cache[1])):
        if name in taken:
            values[name] = ref.ptr if ref is not None else None
    one = None
    needs_one = problem.dtype == "fp8_e4m3" and any(d is None for d in descales)
    if needs_one:
        one = _one(driver, device, make=not captured)   # under capture: only where made before

    driver.make_current(device)
    tensors = {"q": q, "k": k, "v": v, "out": out, "lse": lse, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
               "descale_q": descales[0], "descale_k": descales[1], "descale_v": descales[2], "sinks": sinks,
               "cache_seqlens": cache[0], "page_table": cache[1]}
    extents = {name: t.extent() for name, t in tensors.items() if t is not None}
    for arg, (tensor, *geometry) in layout.tensor_maps.items():
        if tensor != "kg":   # the gathered K's: once the workspace is known, below
            values[arg] = driver.tensor_map_u8(values[tensor], *geometry)
    counter_bytes = layout.counter[1] if layout.counter is not None else 0
    ws_bytes = workspace_bytes(layout)
    scratch = (workspace.captured(driver, device, stream, counter_bytes, ws_bytes, needs_one and one is None)
               if captured else _scratch(driver, device, stream, counter_bytes, ws_bytes))
    with scratch as (counter_at, ws, one_at):
        if needs_one:
            for name, d in zip(("descale_q", "descale_k", "descale_v"), descales):
                values[name] = d.ptr if d is not None else one if one is not None else one_at
        elif problem.dtype == "fp8_e4m3":
            values.update(descale_q=descales[0].ptr, descale_k=descales[1].ptr, descale_v=descales[2].ptr)
        counter = None
        if layout.counter is not None:
            name = layout.counter[0]
            values[name] = counter_at
            counter = (counter_bytes, counter_at)
            extents[name] = (counter_at, counter_at + counter_bytes)
        if layout.vt_bytes:
            values["vt"] = ws
            extents["vt"] = (ws, ws + layout.vt_bytes)
        if "kg" in taken:
            values["kg"] = ws + _partials_at(layout.vt_bytes) if layout.kg_bytes else None
            if layout.kg_bytes:
                extents["kg"] = (values["kg"], values["kg"] + layout.kg_bytes)
                for arg, (tensor, *geometry) in layout.tensor_maps.items():
                    if tensor == "kg":
                        values[arg] = driver.tensor_map_u8(values["kg"], *geometry)
        if "split_tail" in kernel.entry:
            values["partials"] = ws + _partials_at(layout.vt_bytes) if layout.partial_bytes else None
            if layout.partial_bytes:
                extents["partials"] = (values["partials"], values["partials"] + layout.partial_bytes)
        launches = launch.assemble(kernel, layout.grids, launch.pack_args(kernel, values), layout.dependent)
        plan = Plan(device, launches, extents, (ws_bytes, ws) if ws is not None else None, counter)
        plan.queue(driver, stream)
    return out_arr, lse_arr, (None if captured else plan)


@contextlib.contextmanager
def _scratch(driver, device: int, stream: int, counter_bytes: int, ws_bytes: int):
    """A running call's (counter, workspace, None): the stream's own (workspace.counter and
    workspace.hold, the workspace held until the launches are queued)."""
    counter = workspace.counter(driver, device, stream, counter_bytes) if counter_bytes else None
    hold = workspace.hold(driver, device, stream, ws_bytes) if ws_bytes else contextlib.nullcontext()
    with hold as ws:
        yield counter, ws, None


def _one(driver, device: int, make: bool = True) -> int | None:
    """A device float32 holding 1.0: the descale used when the caller passes none; made once a
    device, never written again (any stream and graph may read it).  None where not made yet
    and not ``make`` (a captured call, which may not allocate or copy: its scratch holds one)."""
    key = (driver.name, device)
    with _lock:
        buf = _ones.get(key)
        if buf is None:
            if not make:
                return None
            buf = DeviceArray(driver, device, (1,), "float32")
            driver.copy_htod(buf.ptr, memoryview(np.ones(1, np.float32).view(np.uint8)))
            _ones[key] = buf
        return buf.ptr


# --------------------------------------------------------------------------------------
# The caches: plans of recent dense calls that wrote into a given ``out`` without an LSE, by
# plan key; layouts of recent calls, by layout key.  Keys hold no tensor: the caches must not
# keep them alive.

PLAN_CACHE_SIZE = 256
LAYOUT_CACHE_SIZE = 256
_plans: "collections.OrderedDict[tuple, Plan]" = collections.OrderedDict()
_layouts: "collections.OrderedDict[tuple, Layout]" = collections.OrderedDict()


def options_key(causal, softmax_scale, return_lse, window_size=(-1, -1), softcap=0.0) -> tuple | None:
    """The options as a key, or None where they are not plainly bools, numbers and a tuple of
    two ints (such a call goes through validation, which names the problem)."""
    if type(causal) is not bool or type(return_lse) is not bool or \
            not (softmax_scale is None or type(softmax_scale) in (int, float)) or \
            type(window_size) is not tuple or len(window_size) != 2 or \
            any(type(x) is not int for x in window_size) or type(softcap) not in (int, float):
        return None
    return (causal, None if softmax_scale is None else float(softmax_scale), return_lse, window_size,
            float(softcap))


def plan_key(driver, refs, options, stream: int) -> tuple:
    """Everything a dense call's launches depend on."""
    return (id(driver), options, int(stream),
            *(None if r is None else (r.ptr, r.shape, r.strides, r.dtype, r.device, r.readonly) for r in refs))


def layout_key(driver, refs, options, stream: int) -> tuple:
    """What a dense call's launches depend on but its addresses."""
    return (id(driver), options, int(stream),
            *(None if r is None else (r.shape, r.strides, r.dtype, r.device, r.readonly) for r in refs))


def varlen_layout_key(driver, refs, options, stream: int, max_seqlen_q, max_seqlen_k, cu_q, cu_k) -> tuple | None:
    """What a packed call's launches depend on but its addresses and cu_seqlens values (the
    cu_seqlens' shapes, strides, dtypes and devices, and max_seqlen, included); None where the
    call is not so keyed (it goes through validation)."""
    if not (options and type(max_seqlen_q) is int and type(max_seqlen_k) is int and None not in (cu_q, cu_k)):
        return None
    return ("varlen", layout_key(driver, refs, options, stream), max_seqlen_q, max_seqlen_k,
            *((r.shape, r.strides, r.dtype, r.device) for r in (cu_q, cu_k)))


def cached_plan(key) -> Plan | None:
    return _cached(_plans, key)


def keep_plan(key, plan: Plan) -> None:
    _keep(_plans, key, plan, PLAN_CACHE_SIZE)


def cached_layout(key) -> Layout | None:
    return _cached(_layouts, key)


def keep_layout(key, layout: Layout) -> None:
    _keep(_layouts, key, layout, LAYOUT_CACHE_SIZE)


def _cached(cache: collections.OrderedDict, key):
    with _lock:
        found = cache.get(key)
        if found is not None:
            cache.move_to_end(key)
        return found


def _keep(cache: collections.OrderedDict, key, value, size: int) -> None:
    with _lock:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > size:
            cache.popitem(last=False)
