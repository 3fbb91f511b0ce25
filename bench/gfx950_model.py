"""The cycle model (``zyfa_emulator.cycles``) applied to the project's gfx950 kernels (modelled
on the CPU, not measured).

A variant runs on the emulator through the public API (``ZYFA_BACKEND=emulator``) at a small
shape, every wave's executed instructions are recorded, the workgroups are streamed through
one model CU and the cost of a workgroup is cut out of that (a fixed part plus a period per KV
tile at each residency, ``cycles.workgroup_cost``); ``cycles.device_run`` then runs the grid
of any shape on the MI355X's 256 CUs.  The clock and the model's parameters are those
docs/gfx950_calibration.md fits against AMD's published measurements of its own kernels
(``CALIBRATED``, ``SUSTAINED_GHZ``, from ``zyfa_emulator.cycles``).

    python bench/gfx950_model.py             # docs/gfx950_fp8_figures.{md,json}
    python bench/gfx950_model.py --table     # the steady-state table of the BF16 kernels
    python bench/gfx950_model.py --table --dtype fp8_e4m3 --only d128
    python bench/gfx950_model.py --windows   # windows, softcap, sinks beside dense (BF16)
    python bench/gfx950_model.py --windows --dtype fp8_e4m3   # windows, softcap, sinks (FP8)
    python bench/gfx950_model.py --softcap   # the FP8 loop's capped bodies beside the plain one
    python bench/gfx950_model.py --paged     # paged KV caches beside dense (BF16)
    python bench/gfx950_model.py --paged --dtype fp8_e4m3     # paged KV caches (FP8)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("ZYFA_BACKEND", "emulator")

from zyfa_emulator import cycles  # noqa: E402
from zyfa_runtime import window as windows  # noqa: E402
from zyfa_runtime.catalogue import HEAD_DIMS, Variant, dispatch_order, work_of  # noqa: E402
from zyfa_runtime.catalogue import features as features_of  # noqa: E402

#: FP8 shapes of the figures page: name, Hq, Hkv, d_qk, d_v (B = 1).
SHAPES = [
    ("Mistral-7B / Qwen3-8B (32 q / 8 kv heads)", 32, 8, 128, 128),
    ("DeepSeek-V2-Lite MLA (16 heads)", 16, 16, 192, 128),
    ("Gaussian d64 (32 heads)", 32, 32, 64, 64),
    ("Gaussian d256 (16 heads)", 16, 16, 256, 256),
]
#: Published MI355X figures of the design this project follows (B = 1, FP8, TFLOP/s).
PUBLISHED = {("d128", 32768): "headline: 2,672 at 32k tokens (53 % of peak)",
             ("mla", 32768): "MLA 192/128: 2,464 (AITER 1,237)"}
TOKENS = (16384, 32768)


@dataclasses.dataclass(frozen=True)
class Features:
    """A launch's runtime features, as a call passes them: ``window`` (left, right) before
    ``window.normalize`` (-1 no bound), ``softcap`` (0 off), ``sinks`` (one logit a head),
    ``page_size`` (0: K and V tensors; else a paged KV cache of pages of that many rows, the
    sequence's pages in shuffled order, through ``flash_attn_with_kvcache``)."""
    window: tuple = windows.NONE
    softcap: float = 0.0
    sinks: bool = False
    page_size: int = 0


PLAIN = Features()


# --------------------------------------------------------------------------------------
# Tracing a variant

@dataclasses.dataclass
class Traced:
    """One recorded launch: its workgroups in dispatch order and their grid positions."""
    name: str
    kernel: object                 # the code object's kernel (metadata, descriptor)
    workgroups: list               # per workgroup: its wave traces
    keys: list                     # per workgroup: (x, y, z)
    resident: int                  # workgroups per CU (cycles.occupancy)


def trace(variant: Variant, batch=1, seqlen_q=256, seqlen_k=1024, heads=4, heads_k=None,
          seed=0, features: Features = PLAIN) -> Traced:
    """Run ``variant`` once on the emulator through ``flash_attn_func`` and record it, with
    the runtime ``features`` of the call (the kernel picks its loop from them)."""
    import ml_dtypes
    import numpy as np

    from zyfa_runtime import driver as drivers
    from zyfa_runtime import flash_attn_func, flash_attn_with_kvcache
    drv = drivers.get_driver()
    if getattr(drv, "name", "") != "emulator":
        raise RuntimeError("tracing needs ZYFA_BACKEND=emulator")
    rng = np.random.default_rng(seed)
    dq, dv = variant.d_qk, variant.d_v
    fp8 = variant.dtype == "fp8_e4m3"
    hk = heads_k or heads

    def inputs(shape):
        x = rng.standard_normal(shape).astype(np.float32)
        if fp8:   # per-tensor scaled e4m3, as an FP8 user passes them
            return (x * (448.0 / np.abs(x).max())).astype(ml_dtypes.float8_e4m3fn)
        return x.astype(ml_dtypes.bfloat16)
    q, k, v = (inputs((batch, seqlen_q, heads, dq)), inputs((batch, seqlen_k, hk, dq)),
               inputs((batch, seqlen_k, hk, dv)))
    descales = {f"descale_{t}": np.ones(1, np.float32) / 64 for t in "qkv"} if fp8 else {}
    sinks = rng.standard_normal(heads).astype(np.float32) if features.sinks else None
    rec = cycles.TraceRecorder()
    m = drv.machine
    seen = []
    real_launch = drv.launch
    drv.launch = lambda *a, **kw: seen.append(a) or real_launch(*a, **kw)
    m.observers.append(rec)
    call = functools.partial(flash_attn_func, q, k, v)
    if features.page_size:
        # the same keys as a paged cache: the sequences' pages at shuffled places of the cache
        k, v, table = paged_cache(k, v, features.page_size, rng)
        lens = np.full(batch, seqlen_k, np.int32)
        call = functools.partial(flash_attn_with_kvcache, q, k, v, cache_seqlens=lens, page_table=table)
    host = (q, k, v, *descales.values(), *([] if sinks is None else [sinks]),
            *((table, lens) if features.page_size else ()))
    for arr in host:                   # exact bounds (the host fallback needs none)
        drv.register_host(arr)
    try:
        call(causal=variant.causal, window_size=features.window, softcap=features.softcap, sinks=sinks,
             **descales)
    finally:
        m.observers.remove(rec)
        del drv.launch
        for arr in host:
            drv.unregister_host(arr)
    kernel = seen[-1][0].handle
    wgs = rec.workgroups()
    keys = sorted(wgs, key=lambda key: (key[2], key[1], key[0]))
    workgroups = [wgs[key] for key in keys]
    return Traced(variant.name, kernel, workgroups, keys,
                  cycles.occupancy(kernel, len(workgroups[0])))


def paged_cache(k, v, page_size: int, rng) -> tuple:
    """Dense K and V (B, Sk, H, D) as a paged cache: (num_pages, page_size, H, D) caches, whose
    pages hold the sequences' keys in a shuffled order, and the page_table (B, Sk / page_size)."""
    import numpy as np
    b, sk = k.shape[:2]
    per = -(-sk // page_size)
    order = rng.permutation(b * per)
    table = order.reshape(b, per).astype(np.int32)

    def pages(x):
        padded = np.zeros((b, per * page_size, *x.shape[2:]), x.dtype)
        padded[:, :sk] = x
        out = np.empty((b * per, page_size, *x.shape[2:]), x.dtype)
        out[table.reshape(-1)] = padded.reshape(b * per, page_size, *x.shape[2:])
        return out
    return pages(k), pages(v), table


def traced_tiles(variant: Variant, keys: list, seqlen_q: int, seqlen_k: int,
                 window_size=windows.NONE) -> list:
    """KV tiles of each workgroup of one of our launches (``keys``: the traced workgroups' grid
    coordinates, ``catalogue.work_of``) under the call's ``window_size``."""
    blocks = -(-seqlen_q // variant.tile.block_m)
    per_block = [n for _, n in visited_tiles(variant, seqlen_q, seqlen_k, window_size)]
    return [per_block[work_of(variant, *key, blocks)[0]] for key in keys]


# --------------------------------------------------------------------------------------
# Which key tiles a launch visits, and the FLOPs inside its window

def launch_window(variant: Variant, window_size, seqlen_q: int, seqlen_k: int) -> tuple:
    """The window the kernel runs: the call's (``window.normalize``: causal sets right = 0)
    less the bounds that cut no key (``window.reduce``, as the runtime drops them)."""
    return windows.reduce(windows.normalize(variant.causal, window_size), seqlen_q, seqlen_k)


def visited_tiles(variant: Variant, seqlen_q: int, seqlen_k: int,
                  window_size=windows.NONE) -> list:
    """Per query block: (first key tile, tiles) the kernel's loop visits -- those meeting
    ``window.key_range`` of the block's rows, the rule flash_fwd.hip's loop bounds follow
    (``KeyWindow.first`` of its first row to ``end`` of its last; none where they cross)."""
    bm, bn = variant.tile.block_m, variant.tile.block_n
    win = launch_window(variant, window_size, seqlen_q, seqlen_k)
    out = []
    for m0 in range(0, seqlen_q, bm):
        first, end = windows.key_range(m0, min(m0 + bm, seqlen_q), seqlen_q, seqlen_k, win)
        out.append((first // bn, -(-end // bn) - first // bn) if end > first else (0, 0))
    return out


def window_flops(variant: Variant, batch: int, heads_q: int, seqlen_q: int, seqlen_k: int,
                 window_size=windows.NONE) -> float:
    """The FLOPs inside the window (the issue's measure): 2 (d_qk + d_v) a visible pair."""
    pairs = windows.visible_count(seqlen_q, seqlen_k, windows.normalize(variant.causal, window_size))
    return 2.0 * batch * heads_q * pairs * (variant.d_qk + variant.d_v)


# --------------------------------------------------------------------------------------
# Steady-state figures (one shape, one CU)

@dataclasses.dataclass
class KernelFigures:
    name: str
    shape: str
    resident_workgroups: int       # per CU (occupancy)
    workgroups: int                # simulated, streamed through the resident slots
    loop: cycles.LoopFigures | None    # inner loop: per-wave period; busy over the stream window
    tile_flops: int                # FLOPs of one full KV tile of one workgroup
    tflops_loop: float             # MI355X at ``ghz``: G x tile FLOPs / period
    cycles_total: int
    mfma_busy_whole: float
    valu_busy_whole: float
    sim: cycles.SimResult = dataclasses.field(repr=False, default=None)


def kernel_figures(variant, batch=1, seqlen_q=256, seqlen_k=1024, heads=4, params=None,
                   seed=0, ghz=None) -> KernelFigures:
    """Trace ``variant`` and stream all its workgroups through one CU with as many resident
    as the occupancy allows (``cycles.stream``); the loop's steady state over the stream
    window.  ``tflops_loop``: G workgroups each finishing one full KV tile per loop period on
    every one of the 256 CUs at ``ghz`` (default: the sustained clock)."""
    tr = trace(variant, batch, seqlen_q, seqlen_k, heads, seed=seed)
    g = min(tr.resident, len(tr.workgroups))
    res = cycles.stream(tr.workgroups, g, params)
    lf = cycles.loop_figures(res, window=cycles.stream_window(res, g))
    tile = variant.tile
    tile_flops = 2 * tile.block_m * tile.block_n * (variant.d_qk + variant.d_v)
    per_cu = g * tile_flops / lf.cycles_per_iteration if lf else 0.0
    loop = cycles.tflops(per_cu * cycles.MI355X_CUS, 1, ghz or cycles.SUSTAINED_GHZ)
    shape = (f"B={batch} Hq=Hkv={heads} Sq={seqlen_q} Sk={seqlen_k}"
             f"{' causal' if variant.causal else ''}")
    return KernelFigures(variant.name, shape, g, len(tr.workgroups), lf, tile_flops, loop,
                         res.cycles, res.busy("mfma"), res.busy("valu"), res)


# --------------------------------------------------------------------------------------
# The whole device

def cost_shape(variant: Variant) -> dict:
    """The shape a variant's cost is traced at.  The FP8 kernels (one 256-row workgroup per
    CU): one or two workgroups over 4,096 keys, 60-64 KV tiles each: a deterministic
    ping-pong takes tens of iterations to settle into its steady phase (d256 causal: 2,524,
    2,625 and 2,663 cycles per tile over 16, 32 and 64 tiles), so shorter loops give a
    period a few per cent low.  The BF16 kernels (3-5 per CU, streamed): 16 workgroups of
    16 tiles (causal: Sq = Sk, 1 to 16 tiles), whose period is within 1 % of that of 32-tile
    ones."""
    if variant.tile.block_m >= 256:
        if variant.causal:
            return dict(seqlen_q=512, seqlen_k=4096, heads=1)
        return dict(seqlen_q=256, seqlen_k=4096, heads=1)
    if variant.causal:
        return dict(seqlen_q=1024, seqlen_k=1024, heads=1)
    return dict(seqlen_q=512, seqlen_k=1024, heads=2)


def cost_from_trace(tr: Traced, tiles: list, params=None) -> cycles.WorkgroupCost:
    """Stream the traced workgroups with 1 .. occupancy slots and cut out their cost."""
    g_max = min(tr.resident, len(tr.workgroups))
    runs = {g: cycles.stream(tr.workgroups, g, params) for g in range(1, g_max + 1)}
    return cycles.workgroup_cost(runs, tiles)


def has_bound(variant: Variant, window: tuple) -> bool:
    """Whether a (normalized, reduced) window has a bound the plain loop lacks: a left one,
    or a right one of a non-causal kernel (the causal kernels' right = 0 is their own)."""
    return window[0] >= 0 or (not variant.causal and window[1] >= 0)


#: Windowed traces: causal, Sq 512 / Sk 4,096 (two workgroups, both with a left edge and the
#: diagonal) with the left bound at most 2,047 (18 tiles a workgroup); non-causal, Sq = Sk =
#: 2,048 (eight workgroups) with each bound at most 1,023.
WINDOW_SHAPES = {True: (dict(seqlen_q=512, seqlen_k=4096, heads=1), 2047),
                 False: (dict(seqlen_q=2048, seqlen_k=2048, heads=1), 1023)}


def fit_bound(bound: int, cap: int, block_n: int) -> int:
    """A window bound for the trace: itself up to ``cap``, else the largest value <= ``cap``
    congruent to it modulo ``block_n``, so the edge tiles are cut at the same key as in the
    launch (partial edge tiles, hence their masks, are the same) over a shorter loop."""
    return bound if bound <= cap else cap - (cap - bound) % block_n


def trace_setup(variant: Variant, features: Features) -> tuple:
    """(shape, features) to trace ``variant`` at for the cost of a launch with ``features``
    (its window as ``launch_window`` gives it): no bound, ``cost_shape`` and the plain window
    (softcap alone runs the features' loop; sinks alone the plain loop and the sink's
    epilogue); with one, ``WINDOW_SHAPES`` and the bounds fitted into it (``fit_bound``)."""
    win = tuple(features.window)
    if not has_bound(variant, win):
        return cost_shape(variant), dataclasses.replace(features, window=windows.NONE)
    shape, cap = WINDOW_SHAPES[variant.causal]
    bn = variant.tile.block_n
    fitted = (fit_bound(win[0], cap, bn), 0 if variant.causal else fit_bound(win[1], cap, bn))
    return shape, dataclasses.replace(features, window=fitted)


def kernel_cost(variant: Variant, params: cycles.Params | None = None,
                features: Features = PLAIN) -> cycles.WorkgroupCost:
    """The cost of one workgroup of ``variant`` under ``params`` for a launch with ``features``
    (traced as ``trace_setup`` says; the trace is kept for other parameters)."""
    params = params or cycles.Params()
    shape, traced = trace_setup(variant, features)
    key = (variant, traced, dataclasses.astuple(params))
    if key not in _COSTS:
        tr = _trace_cached(variant, traced)
        _COSTS[key] = cost_from_trace(tr, traced_tiles(variant, tr.keys, shape["seqlen_q"],
                                                       shape["seqlen_k"], traced.window), params)
    return _COSTS[key]


_COSTS: dict = {}


@functools.lru_cache(maxsize=None)
def _trace_cached(variant: Variant, features: Features = PLAIN) -> Traced:
    shape, traced = trace_setup(variant, features)
    return trace(variant, **shape, features=traced)


def grid_tiles(variant: Variant, batch: int, heads_q: int, seqlen_q: int, seqlen_k: int,
               window_size=windows.NONE) -> list:
    """KV tiles per workgroup of one of our launches, in dispatch order
    (``catalogue.dispatch_order``: causal launches take their longest query blocks first),
    under the call's ``window_size`` (``visited_tiles``)."""
    per_block = [n for _, n in visited_tiles(variant, seqlen_q, seqlen_k, window_size)]
    return [per_block[block] for block, _, _ in dispatch_order(variant, seqlen_q, heads_q, batch)]


def predict(variant: Variant, batch: int, heads_q: int, seqlen_q: int, seqlen_k: int,
            params: cycles.Params | None = None, ghz: float | None = None,
            band=cycles.LDS_BAND, features: Features = PLAIN) -> dict:
    """Modelled MI355X figures of one launch of ``variant`` with ``features``: the mean over
    the LDS band (``cycles.LDS_BAND``) and its spread.  ``tflops`` counts every (query, key)
    pair (halved when causal, as published figures do); ``tflops_window`` only those inside
    the window (``window_flops``; without a window: the causal diagonal counted exactly).
    GQA does not change the work of a workgroup: K/V bandwidth beyond the CU is not
    modelled."""
    params = params or cycles.CALIBRATED
    ghz = ghz or cycles.SUSTAINED_GHZ
    win = launch_window(variant, features.window, seqlen_q, seqlen_k)
    launch = dataclasses.replace(features, window=win)
    tiles = grid_tiles(variant, batch, heads_q, seqlen_q, seqlen_k, win)
    flops = cycles.attention_flops(batch, heads_q, seqlen_q, seqlen_k, variant.d_qk,
                                   variant.d_v, variant.causal)
    inside = window_flops(variant, batch, heads_q, seqlen_q, seqlen_k, win)
    runs = []
    for p in cycles.banded(params, band):
        cost = kernel_cost(variant, p, launch)
        run = cycles.device_run(tiles, cost)
        runs.append((cycles.tflops(flops, run.cycles, ghz), run, cost))
    out = summarise(runs)
    for key in ("tflops", "tflops_min", "tflops_max"):   # the same cycles, other FLOPs
        out[key.replace("tflops", "tflops_window")] = out[key] * inside / flops
    out.update(flops=flops, flops_window=inside, window=win)
    return out


def summarise(runs: list) -> dict:
    """Mean and spread of (TFLOP/s, DeviceRun, WorkgroupCost) over a band."""
    n = len(runs)
    tf = [r[0] for r in runs]
    return dict(tflops=sum(tf) / n, tflops_min=min(tf), tflops_max=max(tf),
                cycles=sum(r[1].cycles for r in runs) / n, waves=runs[0][1].waves,
                cu_busy=sum(r[1].cu_busy for r in runs) / n, resident=runs[0][2].resident,
                period=sum(r[2].periods[-1] for r in runs) / n,
                fixed=sum(r[2].fixed for r in runs) / n)


# --------------------------------------------------------------------------------------
# docs/gfx950_fp8_figures.{md,json}

def softmax_valu(res) -> float:
    """Mean VALU instructions of a steady-state vector phase (wave 0, one 64-key block)."""
    t = res.traces[0]
    bars = [k for k, i in enumerate(t.insts) if i.name == "s_barrier"]
    counts = []
    for a, b in zip(bars, bars[1:]):
        seg = t.insts[a + 1:b]
        if any(i.name.startswith("v_mfma") for i in seg):
            continue
        n = sum(1 for i in seg if i.name.startswith("v_"))
        if n > 40:
            counts.append(n)
    counts = counts[2:-2] or counts
    return sum(counts) / len(counts) if counts else float("nan")


def fp8_figures() -> int:
    params = dataclasses.replace(cycles.CALIBRATED, lds_bank_conflicts=True)
    ghz = cycles.SUSTAINED_GHZ
    data, preds, spread = {}, {}, {}
    for d_qk, d_v in HEAD_DIMS:
        for causal in (False, True):
            v = Variant("gfx950", "fp8_e4m3", d_qk, d_v, causal)
            # the loop alone: one workgroup of 256 rows x 4,096 keys (cost_shape's length),
            # the window where it iterates (one per CU: the others run on other CUs)
            tr = trace(v, seqlen_q=256, seqlen_k=4096, heads=1)
            band = cycles.banded(params)
            loops = []
            for p in band:             # the steady state over the LDS band (cycles.LDS_BAND)
                res = cycles.stream(tr.workgroups, 1, p)
                window = cycles.stream_window(res, 1)
                lf = cycles.loop_figures(res, window=window)
                loops.append((cycles.loop_period(res, window), lf.mfma_busy, lf.valu_busy, res))
            n = len(loops)
            period = sum(x[0] for x in loops) / n
            sm = softmax_valu(loops[0][3])
            cost = [kernel_cost(v, p) for p in band]
            traces = [t for w in tr.workgroups for t in w]
            data[v.name] = dict(
                variant=v.name, lds_bytes_per_clk=params.lds_bytes_per_clk,
                lds_band=list(cycles.LDS_BAND),
                ds_ops=sum(1 for t in traces for i in t.insts if i.fmt == "DS"),
                ds_ops_with_bank_conflicts=sum(len(t.conflicts) for t in traces),
                period=period, period_min=min(x[0] for x in loops),
                period_max=max(x[0] for x in loops),
                mfma_busy=sum(x[1] for x in loops) / n, valu_busy=sum(x[2] for x in loops) / n,
                softmax_valu_per_block=sm, softmax_cycles_32x128=8 * sm,
                fixed_cycles=sum(c.fixed for c in cost) / n)
            print(f"{v.name}: period {period:.0f}, MFMA {100 * data[v.name]['mfma_busy']:.1f} %, "
                  f"softmax {8 * sm:.0f} cycles/32x128", flush=True)
    for name, hq, hkv, dq, dv in SHAPES:
        for s in TOKENS:
            for causal in (False, True):
                v = Variant("gfx950", "fp8_e4m3", dq, dv, causal)
                p = predict(v, 1, hq, s, s, params, ghz)
                preds[f"{name}|{s}|{'causal' if causal else 'full'}"] = p["tflops"]
                spread[f"{name}|{s}|{'causal' if causal else 'full'}"] = \
                    [p["tflops_min"], p["tflops_max"]]
    lines = ["# gfx950 FP8 kernels: cycle-model figures", "",
             "**Modelled, not measured on an MI355X.**  Generated by "
             "`python bench/gfx950_model.py` "
             "from the real code objects run on the emulator and replayed on the cycle model "
             "(`zyfa_emulator/cycles.py`), with the parameters and the sustained clock "
             "calibrated against AMD's published MI355X measurements of its own kernels "
             f"([gfx950_calibration.md](gfx950_calibration.md)): LDS {params.lds_bytes_per_clk} "
             f"B/clk/CU, {ghz * 1000:,.0f} MHz.  Not modelled: L2/HBM bandwidth, the clock's "
             "dependence on the data.", "",
             "## Steady state of the KV loop (per SIMD; 2 waves in ping-pong)", "",
             "LDS bank conflicts are charged (64 banks of 4 bytes; `zyfa_emulator.cycles."
             "lds_conflict_factor`): the K and V stages are XOR-swizzled and no access conflicts.",
             "",
             "Means over the LDS band (the fitted rate and +-2, +-4 B/clk; the range of the "
             "period in parentheses: the loop locks into different schedules at different "
             "rates, see the calibration page).", "",
             "| kernel | cycles per 64-key block | MFMA busy | VALU busy | softmax VALU cycles per "
             "32x128 block | fixed cycles per workgroup | DS accesses with bank conflicts |",
             "|---|---|---|---|---|---|---|"]
    for e in data.values():
        lines.append(f"| {e['variant']} | {e['period']:,.0f} ({e['period_min']:,.0f}-"
                     f"{e['period_max']:,.0f}) | {100 * e['mfma_busy']:.1f} % | "
                     f"{100 * e['valu_busy']:.1f} % | {e['softmax_cycles_32x128']:.0f} | "
                     f"{e['fixed_cycles']:,.0f} | {e['ds_ops_with_bank_conflicts']} of "
                     f"{e['ds_ops']} |")
    lines += ["", f"## Modelled MI355X TFLOP/s (B = 1, FP8 in, BF16 out, {ghz * 1000:,.0f} MHz)",
              "", "The whole-device model (`cycles.device_run`): one 256-row workgroup per CU, "
              "256 CUs, the grid in dispatch order (non-causal: query block fastest, then head; "
              "causal: every head of the last query block first, longest first, "
              "`catalogue.dispatch_order`), each workgroup its fixed cycles plus its 64-key "
              "blocks (causal: up to its diagonal) at the period above; the band's mean (its range in parentheses).", "",
              "| shape | tokens | non-causal | causal | published (same design, measured) |",
              "|---|---|---|---|---|"]
    for name, hq, hkv, dq, dv in SHAPES:
        for s in TOKENS:
            cells = [f"{preds[f'{name}|{s}|{m}']:,.0f} ({spread[f'{name}|{s}|{m}'][0]:,.0f}-"
                     f"{spread[f'{name}|{s}|{m}'][1]:,.0f})" for m in ("full", "causal")]
            pub = PUBLISHED.get(("d128" if dq == 128 else "mla" if dq == 192 else "", s), "")
            lines.append(f"| {name} | {s // 1024}k | {cells[0]} | {cells[1]} | {pub} |")
    lines += ["", "The published figures are end-to-end measurements of another implementation "
              "of the design on an MI355X (the headline figure's exact layer shape is not "
              "itemised), on real activations, under which the design reports a sustained clock "
              "of 1,628 MHz against 2,108 MHz for BF16-like activity: at 1,628 MHz every "
              f"figure above is {1.628 / ghz:.2f} times as large.  The model does not depend "
              "on the data; the clock on hardware does.", ""]
    (ROOT / "docs" / "gfx950_fp8_figures.md").write_text("\n".join(lines))
    (ROOT / "docs" / "gfx950_fp8_figures.json").write_text(
        json.dumps({"loop": data, "predicted_tflops": preds, "predicted_tflops_range": spread,
                    "params": dataclasses.asdict(params), "ghz": ghz,
                    "note": "modelled on the CPU (zyfa_emulator.cycles, calibrated in "
                            "docs/gfx950_calibration.md), not measured"},
                   indent=1, sort_keys=True) + "\n")
    print("wrote docs/gfx950_fp8_figures.md and .json")
    return 0


# --------------------------------------------------------------------------------------
# The steady-state table (what ``python -m zyfa_emulator.cycles`` printed before)

def table(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/gfx950_model.py --table",
                                 description="cycle-model figures of the gfx950 kernels")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--seqlen-q", type=int, default=256)
    ap.add_argument("--seqlen-k", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--trans", type=int, default=cycles.CALIBRATED.trans,
                    help="cycles per transcendental VALU op")
    ap.add_argument("--only", default="", help="substring of the variant name")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp8_e4m3"),
                    help="the gfx950 kernels of this dtype (fp8_e4m3: the assembly generator's)")
    ap.add_argument("--lds", type=int, default=cycles.CALIBRATED.lds_bytes_per_clk,
                    help="LDS bytes per cycle per CU")
    ap.add_argument("--ghz", type=float, default=cycles.SUSTAINED_GHZ)
    args = ap.parse_args(argv)
    params = dataclasses.replace(cycles.CALIBRATED, trans=args.trans,
                                 lds_bytes_per_clk=args.lds)
    rows = []
    f = None
    for dq, dv in HEAD_DIMS:
        for causal in (False, True):
            v = Variant("gfx950", args.dtype, dq, dv, causal)
            if args.only and args.only not in v.name:
                continue
            f = kernel_figures(v, seqlen_q=args.seqlen_q, seqlen_k=args.seqlen_k,
                               heads=args.heads, params=params, ghz=args.ghz)
            lf = f.loop
            rows.append(f"| {v.name} | {v.tile.block_m} x {v.tile.block_n} | "
                        f"{f.resident_workgroups} | {lf.cycles_per_iteration:.0f} | "
                        f"{100 * lf.mfma_busy:.0f} % | {100 * lf.valu_busy:.0f} % | "
                        f"{f.tflops_loop:,.0f} |")
    if f is None:
        print("no variant matches", file=sys.stderr)
        return 1
    print(f"B=1 Hq=Hkv={args.heads} Sq={args.seqlen_q} Sk={args.seqlen_k}, {f.workgroups} "
          f"workgroups streamed through one CU, trans={args.trans}, LDS {args.lds} B/clk, "
          f"{args.ghz * 1000:,.0f} MHz (modelled)")
    print("| kernel | tile (q x keys) | WGs/CU | cycles per KV tile (per wave) | MFMA busy "
          "| VALU busy | TFLOP/s (loop, modelled) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


# --------------------------------------------------------------------------------------
# Windows, softcap and sinks beside the dense kernels (issue 47's bars, modelled)

#: The rows of the windows table: label, features of a causal launch.
WINDOW_ROWS = [("dense causal", PLAIN),
               ("window 4096 (4095, 0)", Features(window=(4095, 0))),
               ("window 1024 (1023, 0)", Features(window=(1023, 0))),
               ("softcap 30", Features(softcap=30.0)),
               ("sinks", Features(sinks=True))]
WINDOW_DIMS = ((64, 64), (128, 128))
WINDOW_TOKENS = (8192, 16384, 32768)


def window_rows(dims=WINDOW_DIMS, tokens=WINDOW_TOKENS, batch=1, heads_q=32, dtype="bf16") -> list:
    """Per (dims, tokens, row): the causal launch's prediction and its in-window TFLOP/s
    over the dense causal launch's (the issue's measure; for dense rows the same pairs).
    Rows of a feature the ``dtype`` kernels lack are left out."""
    out = []
    for dq, dv in dims:
        v = Variant("gfx950", dtype, dq, dv, True)
        for s in tokens:
            dense = None
            for label, feats in WINDOW_ROWS:
                if feats.softcap and "softcap" not in features_of(v):
                    continue
                p = predict(v, batch, heads_q, s, s, features=feats)
                dense = dense or p
                out.append(dict(kernel=v.name, dims=(dq, dv), tokens=s, row=label, pred=p,
                                ratio=p["tflops_window"] / dense["tflops_window"]))
                print(f"{v.name} {s} {label}: {p['tflops_window']:,.0f} "
                      f"({out[-1]['ratio']:.3f}x dense)", file=sys.stderr, flush=True)
    return out


def window_table(dtype="bf16") -> int:
    """Print the windows table (markdown) of the ``dtype`` kernels and the verdict against the
    issue's bars: window 4096 at the longest length >= 0.9x dense in the window; softcap and
    sinks <= 5 % slower at every length."""
    rows = window_rows(dtype=dtype)
    print(f"B1 Hq 32 (Hkv 8) causal, Sq = Sk; calibrated model, "
          f"{cycles.SUSTAINED_GHZ * 1000:,.0f} MHz (modelled, not measured). TFLOP/s in the "
          "window: only visible (query, key) pairs counted; all pairs: Sq Sk / 2.")
    print("| kernel | tokens | launch | TFLOP/s in the window | TFLOP/s all pairs / 2 "
          "| tiles visited | x dense (in window) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["pred"]
        tiles = sum(grid_tiles(Variant("gfx950", dtype, *r["dims"], True), 1, 32,
                               r["tokens"], r["tokens"], p["window"]))
        print(f"| d{r['dims'][0]} | {r['tokens'] // 1024}k | {r['row']} | "
              f"{p['tflops_window']:,.0f} ({p['tflops_window_min']:,.0f}-"
              f"{p['tflops_window_max']:,.0f}) | {p['tflops']:,.0f} | {tiles:,} | "
              f"{r['ratio']:.3f} |")
    print()
    for dims in WINDOW_DIMS:
        at = {(r["tokens"], r["row"]): r["ratio"] for r in rows if r["dims"] == dims}
        w = at[(WINDOW_TOKENS[-1], WINDOW_ROWS[1][0])]
        slow = {label: 1 - min(at[(s, label)] for s in WINDOW_TOKENS)
                for label in ("softcap 30", "sinks") if (WINDOW_TOKENS[-1], label) in at}
        verdict = "meets" if w >= 0.9 else "misses"
        print(f"d{dims[0]}: window 4096 at {WINDOW_TOKENS[-1] // 1024}k {w:.3f}x dense "
              f"({verdict} >= 0.9x); " + "; ".join(
                  f"{k} at most {100 * x:.1f} % slower ({'meets' if x <= 0.05 else 'misses'}"
                  " <= 5 %)" for k, x in slow.items()))
    return 0


# --------------------------------------------------------------------------------------
# The FP8 assembly's softcap loop beside its plain loop (issue 47's bar, modelled)

SOFTCAP_DIMS = ((128, 128), (64, 64))
SOFTCAP = Features(softcap=30.0)
#: The loops of the softcap table: label, features (a paged cache with a softcap runs the
#: paged and capped body)
SOFTCAP_ROWS = (("plain", PLAIN), ("softcap", SOFTCAP),
                ("paged 16 + softcap", Features(softcap=30.0, page_size=16)))


def loop_alone(v: Variant, features: Features, seqlen_k: int, params) -> dict:
    """The steady state of one 256-row workgroup over ``seqlen_k`` keys, alone on a CU (as the
    figures page takes it): cycles per KV block, MFMA and VALU busy, VALU instructions of a
    vector phase (``softmax_valu``)."""
    tr = trace(v, seqlen_q=256, seqlen_k=seqlen_k, heads=1, features=features)
    res = cycles.stream(tr.workgroups, 1, params)
    window = cycles.stream_window(res, 1)
    lf = cycles.loop_figures(res, window=window)
    return dict(period=cycles.loop_period(res, window), mfma=lf.mfma_busy, valu=lf.valu_busy,
                softmax=softmax_valu(res))


def beside_the_first(rows, measure, key):
    """(label, features, figures, ratio to the first row's) for each (label, features) of
    ``rows``: figures = measure(features), ratio = figures[key] over the first row's (the
    baseline: 1 for itself), measured in order, one row at a time (the tables print as they go)."""
    first = None
    for label, feats in rows:
        figures = measure(feats)
        first = first or figures
        yield label, feats, figures, figures[key] / first[key]


def softcap_table(argv=None) -> int:
    """Print (markdown) the FP8 kernels' plain loop beside its capped bodies (the call's softcap
    and page table select one at run time; ``generator/gfx950_fp8.py``: stage_loops), d128 and
    d64, causal and not, and the verdict against the issue's bar (softcap <= 5 % slower)."""
    ap = argparse.ArgumentParser(prog="python bench/gfx950_model.py --softcap")
    ap.add_argument("--softcap", action="store_true")
    ap.add_argument("--seqlen-k", type=int, default=4096, help="keys of the traced workgroup")
    args = ap.parse_args(argv)
    params = cycles.CALIBRATED
    print(f"One 256-row workgroup over {args.seqlen_k:,} keys alone on a CU, calibrated model "
          f"(trans = {params.trans} cycles; modelled, not measured)")
    print("| kernel | loop | cycles per KV block | MFMA busy | VALU busy | VALU a vector phase | x plain |")
    print("|---|---|---|---|---|---|---|")
    verdicts = []
    for dq, dv in SOFTCAP_DIMS:
        for causal in (False, True):
            v = Variant("gfx950", "fp8_e4m3", dq, dv, causal)
            for label, feats, f, ratio in beside_the_first(
                    SOFTCAP_ROWS, lambda feats: loop_alone(v, feats, args.seqlen_k, params), "period"):
                print(f"| {v.name} | {label} | {f['period']:,.0f} | {100 * f['mfma']:.0f} % | "
                      f"{100 * f['valu']:.0f} % | {f['softmax']:.0f} | {ratio:.2f} |", flush=True)
                if feats == SOFTCAP:
                    verdicts.append(f"{v.name}: softcap {100 * (ratio - 1):.0f} % slower "
                                    f"({'meets' if ratio <= 1.05 else 'misses'} <= 5 %)")
    print()
    print("; ".join(verdicts))
    return 0


# --------------------------------------------------------------------------------------
# Paged KV caches beside the dense kernels (issue 47's bar, modelled)

#: The rows of the paged table: label, features of a causal launch (the keys of each sequence
#: in a paged cache, pages shuffled: ``paged_cache``).
PAGED_ROWS = [("dense causal", PLAIN), ("paged 16", Features(page_size=16)), ("paged 64", Features(page_size=64))]
PAGED_DIMS = ((128, 128), (64, 64))
PAGED_TOKENS = 8192


def paged_table(dims=PAGED_DIMS, tokens=PAGED_TOKENS, batch=1, heads_q=32, dtype="bf16") -> int:
    """Print the paged table (markdown) of the ``dtype`` kernels and the verdict against the
    issue's bar transposed to the model: paged (page 16 and 64) >= 0.95x dense TFLOP/s at the
    same shape.  Each launch's workgroups visit the same key tiles; its cost is traced with its
    cache (``trace``)."""
    print(f"B{batch} Hq {heads_q} (Hkv 8) causal, Sq = Sk = {tokens:,} (cache_seqlens = Sk); calibrated "
          f"model, {cycles.SUSTAINED_GHZ * 1000:,.0f} MHz (modelled, not measured)")
    print("| kernel | launch | TFLOP/s | cycles a KV tile (one workgroup a CU) | x dense |")
    print("|---|---|---|---|---|")
    verdicts = []
    for dq, dv in dims:
        v = Variant("gfx950", dtype, dq, dv, True)
        for label, feats, p, ratio in beside_the_first(
                PAGED_ROWS, lambda feats: predict(v, batch, heads_q, tokens, tokens, features=feats), "tflops"):
            period = kernel_cost(v, cycles.CALIBRATED, feats).periods[0]
            print(f"| d{dq} | {label} | {p['tflops']:,.0f} ({p['tflops_min']:,.0f}-{p['tflops_max']:,.0f}) | "
                  f"{period:,.0f} | {ratio:.3f} |", flush=True)
            if feats.page_size:
                verdicts.append(f"d{dq} {label}: {ratio:.3f}x dense ({'meets' if ratio >= 0.95 else 'misses'} "
                                ">= 0.95x)")
    print()
    print("; ".join(verdicts))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--windows" in argv:   # --dtype fp8_e4m3: the FP8 assembly's
        return window_table(argv[argv.index("--dtype") + 1] if "--dtype" in argv else "bf16")
    if "--table" in argv:
        return table(argv)
    if "--paged" in argv:     # --dtype fp8_e4m3: the FP8 assembly's
        return paged_table(dtype=argv[argv.index("--dtype") + 1] if "--dtype" in argv else "bf16")
    if "--softcap" in argv:
        return softcap_table(argv)
    if argv:   # the figures page takes no options; anything else (--help) gets the usage
        print("usage: python bench/gfx950_model.py            # writes docs/gfx950_fp8_figures.{md,json}\n"
              "       python bench/gfx950_model.py --table -h  # one table, its options\n"
              "       python bench/gfx950_model.py --windows   # windows, softcap, sinks (BF16)\n"
              "       python bench/gfx950_model.py --windows --dtype fp8_e4m3   # windows, softcap, sinks (FP8)\n"
              "       python bench/gfx950_model.py --softcap   # the FP8 capped loops beside the plain one\n"
              "       python bench/gfx950_model.py --paged     # paged KV caches (BF16)\n"
              "       python bench/gfx950_model.py --paged --dtype fp8_e4m3     # paged KV caches (FP8)")
        return 0 if set(argv) <= {"-h", "--help"} else 2
    return fp8_figures()


if __name__ == "__main__":
    raise SystemExit(main())
