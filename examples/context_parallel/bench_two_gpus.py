"""Context-parallel causal prefill over GPUs against one GPU: issue 49's bar.

One causal sequence (default 262,144 tokens, Hq 32 / Hkv 8, d 128), BF16 and FP8 (per-tensor
e4m3 with fp32 descales):

* ``single``: one flash_attn_func call on GPU 0;
* ``ring``: the zig-zag ring over ``--gpus`` GPUs, K/V moved by NCCL (RCCL on ROCm) through
  CuPy, one process driving all of them (transport.py says why);
* ``sim``: the same ring with ``--sim-ranks`` ranks all on GPU 0 and device copies for NCCL: its
  time over ``single``'s is what the ring machinery (split calls, merges, copies) costs.

Each is timed with events on its streams after ``--warmup`` runs, ``--repeats`` times; the
table and the JSON give medians (ring: the slowest rank's events; also the host's wall clock
around queue and synchronize).  The ring's output, gathered on GPU 0, is compared with the
single call's: relative error in norm and the largest LSE difference.

    python examples/context_parallel/bench_two_gpus.py --json bench/results/context_parallel.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

E4M3_MAX = 448.0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tokens", type=int, default=262144, help="sequence length (a multiple of 2 x ranks)")
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128, help="head dim (Q, K and V)")
    ap.add_argument("--dtypes", default="bf16,fp8_e4m3", help="comma-separated: bf16, fp8_e4m3")
    ap.add_argument("--gpus", type=int, default=2, help="ranks of the NCCL ring, GPUs 0..gpus-1 (0: skip it)")
    ap.add_argument("--sim-ranks", type=int, default=2, help="ranks of the one-GPU simulation (0: skip it)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=49)
    ap.add_argument("--json", type=Path, help="write the results here")
    return ap.parse_args(argv)


# ---- inputs on GPU 0 --------------------------------------------------------------------------

def bf16_bits(cp, x):
    """float32 -> bf16 bits (uint16), round to nearest even (finite inputs; ``cp`` may be numpy)."""
    u = x.view(cp.uint32)
    sixteen = cp.uint32(16)
    return ((u + cp.uint32(0x7FFF) + ((u >> sixteen) & cp.uint32(1))) >> sixteen).astype(cp.uint16)


def as_float(cp, bits):
    """bf16 bits -> float32 (exact)."""
    return (bits.astype(cp.uint32) << cp.uint32(16)).view(cp.float32)


def e4m3_codes(cp, x, scale: float):
    """float32 / scale -> OCP e4m3 codes (uint8), to the nearest finite value: the 127 finite
    non-negative values in code order, searched by their midpoints (a tie goes to the lower
    code, not always the even one: random inputs meet none).  ``cp`` may be numpy."""
    import ml_dtypes
    import numpy as np
    values = np.arange(127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    mids = cp.asarray((values[:-1] + values[1:]) / 2)
    y = x / cp.float32(scale)
    code = cp.searchsorted(mids, cp.abs(y)).astype(cp.uint8)
    return code | (cp.signbit(y).astype(cp.uint8) << cp.uint8(7))


def make_inputs(cp, a, dtype: str):
    """Q, K, V of the whole sequence on GPU 0 as zyfa storage, and the FP8 descales (or None)."""
    rng = cp.random.default_rng(a.seed)
    shapes = [(1, a.tokens, a.hq, a.d), (1, a.tokens, a.hkv, a.d), (1, a.tokens, a.hkv, a.d)]
    out, descales = [], []
    for shape in shapes:
        x = rng.standard_normal(shape, dtype=cp.float32)
        if dtype == "bf16":
            out.append(bf16_bits(cp, x))
        else:
            scale = float(cp.abs(x).max()) / E4M3_MAX
            out.append(e4m3_codes(cp, x, scale))
            descales.append(scale)
        del x
    return out, (descales or None)


# ---- timing -----------------------------------------------------------------------------------

def timed(cp, run, streams: list, warmup: int, repeats: int) -> dict:
    """Median ms of ``run()`` by events: a start event a device (on its first stream of
    ``streams``, (device, stream) pairs, before anything is queued), an end event on each stream;
    the largest start-to-end time.  Also the host's wall clock around ``run()`` and every
    device's synchronize."""
    devices = sorted({dev for dev, _ in streams})

    def sync():
        for dev in devices:
            cp.cuda.Device(dev).synchronize()

    def event(dev, stream):
        with cp.cuda.Device(dev):
            e = cp.cuda.Event()
            e.record(stream)
        return e
    for _ in range(warmup):
        run()
    sync()
    gpu, wall = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        starts = {}
        for dev, s in streams:
            if dev not in starts:
                starts[dev] = event(dev, s)
        run()
        ends = [(dev, event(dev, s)) for dev, s in streams]
        sync()
        wall.append((time.perf_counter() - t0) * 1e3)
        gpu.append(max(cp.cuda.get_elapsed_time(starts[dev], e) for dev, e in ends))
    return {"ms": statistics.median(gpu), "wall_ms": statistics.median(wall), "all_ms": gpu}


# ---- the three runs ---------------------------------------------------------------------------

def run_single(cp, zr, a, dtype, qkv, descales):
    from examples.context_parallel.devices import CupyDevice
    dev = CupyDevice(0)
    stream = dev.stream()
    out, lse = dev.empty((1, a.tokens, a.hq, a.d), "bf16"), dev.empty((1, a.hq, a.tokens), "float32")
    views = [dev.view(x, dtype, stream) for x in qkv]
    ds = [dev.from_host(_one(x), "float32") for x in descales] if descales else [None] * 3
    out_v, lse_v = dev.view(out, "bf16", stream), dev.view(lse, "float32", stream)

    def run():
        zr.flash_attn_func(*views, causal=True, descale_q=ds[0], descale_k=ds[1], descale_v=ds[2],
                           out=out_v, lse=lse_v, return_lse=True, stream=stream)
    return timed(cp, run, [(0, stream)], a.warmup, a.repeats), out, lse


def _one(x: float):
    import numpy as np
    return np.array([x], np.float32)


def run_ring(cp, a, dtype, qkv, descales, transport):
    """The ring over ``transport``; its output gathered on GPU 0 in sequence order."""
    from examples.context_parallel import ring, zigzag
    n = transport.n_ranks
    chunk = a.tokens // (2 * n)
    r = ring.Ring(transport, ring.Shape(chunk, a.hq, a.hkv, a.d, a.d), dtype)
    home = transport.device(0)
    args = {name: {} for name in ("q", "k", "v")}
    out, lse, ds = {}, {}, {}
    for rank in transport.local_ranks:
        dev = transport.device(rank)
        for name, x in zip(args, qkv):
            with home.device:
                part = x[:, cp.asarray(zigzag.positions(rank, n, chunk))]
            args[name][rank] = dev.empty(part.shape, dtype)
            _copy(cp, home, args[name][rank], part)
        out[rank] = dev.empty((1, 2 * chunk, a.hq, a.d), "bf16")
        lse[rank] = dev.empty((1, a.hq, 2 * chunk), "float32")
        ds[rank] = tuple(dev.from_host(_one(x), "float32") for x in descales) if descales else None
    streams = [(transport.device(rank).ordinal, r.ranks[rank].compute) for rank in transport.local_ranks]

    def run():
        r(args["q"], args["k"], args["v"], out, lse, descales=ds if descales else None)
    times = timed(cp, run, streams, a.warmup, a.repeats)
    with home.device:
        full_o = cp.empty((1, a.tokens, a.hq, a.d), cp.uint16)
        full_lse = cp.empty((1, a.hq, a.tokens), cp.float32)
    for rank in transport.local_ranks:
        o_here, l_here = home.empty(out[rank].shape, "bf16"), home.empty(lse[rank].shape, "float32")
        _copy(cp, home, o_here, out[rank])
        _copy(cp, home, l_here, lse[rank])
        with home.device:
            idx = cp.asarray(zigzag.positions(rank, n, chunk))
            full_o[:, idx] = o_here
            full_lse[:, :, idx] = l_here
    return times, full_o, full_lse


def _copy(cp, home, dst, src):
    """A synchronous copy between devices (setup and gathering, outside any timing)."""
    stream = home.stream()
    home.copy(dst, src, stream)
    stream.synchronize()


def compare(cp, o, lse, ref_o, ref_lse) -> dict:
    with cp.cuda.Device(0):
        x, y = as_float(cp, o), as_float(cp, ref_o)
        err = float(cp.linalg.norm((x - y).ravel()) / cp.linalg.norm(y.ravel()))
        finite = cp.isfinite(ref_lse)
        lse_err = float(cp.abs(cp.where(finite, lse - ref_lse, 0)).max())
        nan = bool(cp.isnan(x).any() or cp.isnan(lse).any())
    return {"rel_error_vs_single": err, "max_lse_diff_vs_single": lse_err, "nan": nan}


def main(argv=None) -> int:
    a = parse_args(argv)
    import cupy as cp

    import zyfa_runtime as zr
    from examples.context_parallel.devices import CupyDevice
    from examples.context_parallel.transport import LocalTransport, NcclTransport
    dtypes = [x.strip() for x in a.dtypes.split(",") if x.strip()]
    names = [cp.cuda.runtime.getDeviceProperties(i)["name"] for i in range(cp.cuda.runtime.getDeviceCount())]
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    nccl_ring = NcclTransport.single_process(list(range(a.gpus))) if a.gpus > 0 else None
    sim = LocalTransport([CupyDevice(0)] * a.sim_ranks) if a.sim_ranks > 0 else None
    results = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
               "devices": names, "zyfa": zr.__version__, "runs": {}}
    print(f"causal prefill, {a.tokens} tokens, Hq {a.hq} / Hkv {a.hkv}, d {a.d}; GPUs: {', '.join(names)}")
    print(f"{'dtype':<10}{'run':<14}{'median ms':>11}{'wall ms':>10}{'speedup':>9}  vs single call")
    for dtype in dtypes:
        with cp.cuda.Device(0):     # zyfa makes each call's device current: CuPy's work names its own
            qkv, descales = make_inputs(cp, a, dtype)
        single, ref_o, ref_lse = run_single(cp, zr, a, dtype, qkv, descales)
        runs = {"single": single}
        for label, t in ((f"ring x{a.gpus}", nccl_ring), (f"sim x{a.sim_ranks}", sim)):
            if t is None:
                continue
            times, o, lse = run_ring(cp, a, dtype, qkv, descales, t)
            runs[label] = {**times, **compare(cp, o, lse, ref_o, ref_lse), "speedup": single["ms"] / times["ms"]}
            del o, lse
        for label, r in runs.items():
            check = (f"rel err {r['rel_error_vs_single']:.2e}, |dLSE| {r['max_lse_diff_vs_single']:.1e}"
                     + (", NaN!" if r["nan"] else "")) if "speedup" in r else ""
            speed = f"{r['speedup']:.2f}x" if "speedup" in r else ""
            print(f"{dtype:<10}{label:<14}{r['ms']:>11.2f}{r['wall_ms']:>10.2f}{speed:>9}  {check}")
        results["runs"][dtype] = runs
        del qkv, ref_o, ref_lse
        cp.get_default_memory_pool().free_all_blocks()
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
