"""Dev: a call's launches queued back to back, as the runtime queues them (dependent flags) and
all plain; events only around the whole call; medians.  Run inside a tree (PYTHONPATH=tree)."""
import sys
import numpy as np
import torch
sys.path.insert(0, "bench")
from profile_target import gaussian_qkv
from zyfa_runtime import api, flash_attn_func
from zyfa_runtime.driver import get_driver

shape = (2, 8192, 16, 256)
qkv = gaussian_qkv(shape, "fp8_e4m3")
out = torch.empty(shape[:3] + (256,), device="cuda", dtype=torch.bfloat16)
stream = torch.cuda.current_stream()
flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream)
plan = next(reversed(api._plans.values()))
driver = get_driver()
print("launches:", [(ln.grid, getattr(ln, "dependent", None)) for ln in plan.launches])
for mode in ("as planned", "plain", "as planned", "plain"):
    ts = []
    for rep in range(35):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # a busy kernel first, so that the queue is ahead of the GPU (no host gaps)
        torch.cuda._sleep(2_000_000)
        e0.record(stream)
        for ln in plan.launches:
            dep = getattr(ln, "dependent", False) and mode == "as planned"
            if dep:
                driver.launch(ln.function, ln.grid, ln.block, ln.shared, stream.cuda_stream, ln.args, dependent=True)
            else:
                driver.launch(ln.function, ln.grid, ln.block, ln.shared, stream.cuda_stream, ln.args)
        e1.record(stream)
        stream.synchronize()
        if rep >= 5:
            ts.append(e0.elapsed_time(e1) * 1e3)
    flops = 4 * 2 * 16 * 8192 * 8192 * 256
    print(f"{mode:12s} {np.median(ts):8.1f} us  {flops / np.median(ts) / 1e6:7.1f} TFLOP/s")
