"""Dev: the balanced tail's plans timed against each other in one process, call by call (CUDA
events around each call), the configurations interleaved in random order, so that the card's
clock and power drift fall on all of them alike.  PYTHONPATH=the tree."""
import os
import random
import sys
import numpy as np
import torch
sys.path.insert(0, "bench")
from profile_target import gaussian_qkv
from zyfa_runtime import api, flash_attn_func
from zyfa_runtime.catalogue import Variant

shape = tuple(int(x) for x in os.environ.get("SHAPE", "2,8192,16,256").split(","))
CONFIGS = [("plain 0 0", "off", 0, 0), ("dep 0 0", "on", 0, 0), ("dep 4 0", "on", 4, 0),
           ("dep 4 11", "on", 4, 11), ("dep 4 6", "on", 4, 6), ("dep 4 16", "on", 4, 16), ("dep 2 11", "on", 2, 11)]
if os.environ.get("ONLY"):
    CONFIGS = [c for c in CONFIGS if c[0] in os.environ["ONLY"].split(",")]
qkv = gaussian_qkv(shape, "fp8_e4m3")
out = torch.empty(shape[:3] + (256,), device="cuda", dtype=torch.bfloat16)
stream = torch.cuda.current_stream()
flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream)
torch.cuda.synchronize()
drv = next(iter(api._tables)) if hasattr(api, "_tables") else None
entries = []
for lay in api._layouts.values():
    entries.append(lay.kernel.entry)
v = Variant("sm_90a", "fp8_e4m3", 256, 256, False)
times = {c[0]: [] for c in CONFIGS}
ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(10)]
cycles = int(os.environ.get("CYCLES", "60"))
rng = random.Random(1)
for cyc in range(cycles):
    order = CONFIGS[:]
    rng.shuffle(order)
    for name, dep, gap, ramp in order:
        os.environ["ZYFA_DEPENDENT_LAUNCH"] = dep
        for e in entries:
            if "switch_blocks" in e["split_tail"]:
                e["split_tail"]["switch_blocks"], e["split_tail"]["drain_blocks"] = gap, ramp
        api._layouts.clear()
        api._plans.clear()
        for _ in range(2):
            flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream)
        for a, b in ev:
            a.record(stream)
            flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream)
            b.record(stream)
        torch.cuda.synchronize()
        times[name] += [a.elapsed_time(b) * 1e3 for a, b in ev]
    if cyc == 0:
        lay = next(iter(api._layouts.values()))
        print("last plan:", {k: lay.values.get(k) for k in ("tail_first", "tail_ctas", "tail_gap", "tail_ramp")})
flop = 4 * shape[0] * shape[2] * shape[1] * shape[1] * 256
ref = np.median(times[CONFIGS[0][0]])
print(f"shape {shape}, {cycles} cycles x 10 calls a configuration")
for name, *_ in CONFIGS:
    t = np.array(times[name])
    med = np.median(t)
    print(f"{name:10s} median {med:8.1f} us ({(ref / med - 1) * 100:+.2f} %)  mean {t.mean():8.1f}  p10 {np.percentile(t, 10):8.1f}"
          f"  p90 {np.percentile(t, 90):8.1f}  TFLOP/s {flop / med / 1e6:7.1f}")
