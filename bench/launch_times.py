"""The time of each launch of one zyfa call (the V^T pre-pass, the kernel, a balanced tail's
kernel), and of the call's launches back to back: CUDA events, warm-up, medians.

    ZYFA_SPLIT_TAIL=off python3 bench/launch_times.py --batch 2 --heads 16 --seqlen 8192 --head-dim 256

Inputs are Gaussian (FP8: scaled into e4m3's range); needs PyTorch with CUDA.
"""
import argparse

import numpy as np
import torch

from profile_target import gaussian_qkv   # bench/, beside this script
from zyfa_runtime import flash_attn_func, plan as planning
from zyfa_runtime.driver import get_driver


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("bf16", "fp8_e4m3"), default="fp8_e4m3")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    shape = (a.batch, a.seqlen, a.heads, a.head_dim)
    qkv = gaussian_qkv(shape, a.dtype)
    out = torch.empty(shape[:3] + (a.head_dim,), device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.current_stream()
    flash_attn_func(*qkv, causal=a.causal, out=out, stream=stream.cuda_stream)   # planned: its plan is kept
    plan = next(reversed(planning._plans.values()))
    driver = get_driver()
    names = [getattr(ln.function, "name", "") or f"launch {i}" for i, ln in enumerate(plan.launches)]
    times = {n: [] for n in names + ["all"]}
    for rep in range(a.reps + 5):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(plan.launches) + 1)]
        ev[0].record(stream)
        for i, ln in enumerate(plan.launches):
            driver.launch(ln.function, ln.grid, ln.block, ln.shared, stream.cuda_stream, ln.args)
            ev[i + 1].record(stream)
        stream.synchronize()
        if rep >= 5:
            for i, n in enumerate(names):
                times[n].append(ev[i].elapsed_time(ev[i + 1]) * 1e3)
            times["all"].append(ev[0].elapsed_time(ev[-1]) * 1e3)
    flops = 4 * a.batch * a.heads * a.seqlen * a.seqlen * a.head_dim / (2 if a.causal else 1)
    for i, n in enumerate(names + ["all"]):
        grid = plan.launches[i].grid if i < len(plan.launches) else ""
        print(f"{n:40s} {str(grid):16s} {np.median(times[n]):9.1f} us")
    print(f"TFLOP/s (all): {flops / np.median(times['all']) / 1e6:.1f}")


if __name__ == "__main__":
    main()
