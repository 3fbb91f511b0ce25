"""Dev: the streamed V^T pre-pass's CTA counts timed against each other in one process, call by
call (CUDA events around each call), configurations in random order.  PYTHONPATH=the tree.
GRIDS: pre-pass CTAs a configuration (0: the tree's manifest as it is)."""
import os, random, sys
import numpy as np
import torch
sys.path.insert(0, "bench")
from profile_target import gaussian_qkv
from zyfa_runtime import api, flash_attn_func

shape = tuple(int(x) for x in os.environ.get("SHAPE", "2,8192,16,256").split(","))
grids = [tuple(int(y) for y in x.split(":")) if ":" in x else (int(x), 11) for x in os.environ.get("GRIDS", "0").split(",")]
qkv = gaussian_qkv(shape, "fp8_e4m3")
out = torch.empty(shape[:3] + (shape[3],), device="cuda", dtype=torch.bfloat16)
stream = torch.cuda.current_stream()
flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream)
torch.cuda.synchronize()
entries = [lay.kernel.entry for lay in api._layouts.values()]
first = None
times = {g: [] for g in grids}
ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(10)]
cycles = int(os.environ.get("CYCLES", "30"))
rng = random.Random(1)
for cyc in range(cycles):
    order = grids[:]
    rng.shuffle(order)
    for g in order:
        for e in entries:
            if g[0]:
                e["prepass"]["grid"] = {"x": g[0], "y": 1, "z": 1}
            e["split_tail"]["drain_blocks"] = g[1]
        api._layouts.clear()
        api._plans.clear()
        out.fill_(float("nan"))
        for _ in range(2):
            flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream)
        for a, b in ev:
            a.record(stream)
            flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream)
            b.record(stream)
        torch.cuda.synchronize()
        if cyc == 0:
            o = out.float().cpu()
            if first is None:
                first = o
            print(f"grid {g}: finite {bool(torch.isfinite(o).all())}, identical to the first {bool(torch.equal(o, first))}", flush=True)
        times[g] += [a.elapsed_time(b) * 1e3 for a, b in ev]
flop = 4 * shape[0] * shape[2] * shape[1] * shape[1] * shape[3]
ref = np.median(times[grids[0]])
print(f"shape {shape}, {cycles} cycles x 10 calls a configuration")
for g in grids:
    t = np.array(times[g])
    med = np.median(t)
    print(f"grid {g[0]:4d} ramp {g[1]:3d} median {med:8.1f} us ({(ref / med - 1) * 100:+.2f} %)  p10 {np.percentile(t, 10):8.1f}"
          f"  p90 {np.percentile(t, 90):8.1f}  TFLOP/s {flop / med / 1e6:7.1f}")
