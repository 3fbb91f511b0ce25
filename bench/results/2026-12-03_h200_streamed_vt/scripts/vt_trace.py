"""Dev: the streamed V^T pre-pass's timeline from a traced build (zyfa_vtrace): per pre-pass
grid, the items' completion over time, the kernel CTAs' waits for their head, the SMs' last
kernel CTA ends and the tail's.  PYTHONPATH=the traced tree."""
import ctypes, os, sys
import numpy as np
import torch
sys.path.insert(0, "bench")
from profile_target import gaussian_qkv
from zyfa_runtime import api, flash_attn_func
from zyfa_runtime.driver.cuda import ffi

shape = (2, 8192, 16, 256)
qkv = gaussian_qkv(shape, "fp8_e4m3")
out = torch.empty(shape[:3] + (256,), device="cuda", dtype=torch.bfloat16)
stream = torch.cuda.current_stream()
flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream)
torch.cuda.synchronize()
entries = [lay.kernel.entry for lay in api._layouts.values()]
cu = ctypes.CDLL("libcuda.so.1")
for gr in os.environ.get("GRIDS", "528,66,33,8").split(","):
    g, ramp = (int(y) for y in gr.split(":")) if ":" in gr else (int(gr), 11)
    for e in entries:
        e["prepass"]["grid"] = {"x": g, "y": 1, "z": 1}
        e["split_tail"]["drain_blocks"] = ramp
    api._layouts.clear(); api._plans.clear()
    for _ in range(3):
        flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream)
    torch.cuda.synchronize()
    plan = next(reversed(api._plans.values()))
    mod = plan.launches[0].function.module.handle
    dptr, size = ctypes.c_uint64(), ctypes.c_size_t()
    assert cu.cuModuleGetGlobal_v2(ctypes.byref(dptr), ctypes.byref(size), ctypes.c_void_p(int(ffi.cast("uintptr_t", mod))), b"zyfa_vtrace") == 0
    vals = next(reversed(api._layouts.values())).values
    for rep in range(2):
        cu.cuMemsetD8_v2(dptr, 0, size); torch.cuda.synchronize(); torch.cuda._sleep(1_000_000)
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        e0.record(stream); flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream); e1.record(stream)
        torch.cuda.synchronize()
        buf = np.zeros(size.value // 8, dtype=np.uint64)
        cu.cuMemcpyDtoH_v2(buf.ctypes.data_as(ctypes.c_void_p), dptr, size)
        t = buf.reshape(8192, 4).astype(np.int64)
        pre_start = t[6000:6000 + min(g, 2000), 0]
        t0 = pre_start[pre_start > 0].min()
        us = lambda x: (x - t0) / 1e3
        items = t[:2048, 0]
        it_us = us(items)
        kern = t[2048:2048 + vals["tail_first"]]
        tail = t[4096:4096 + vals["tail_ctas"]]
        wait = (kern[:, 1] - kern[:, 0]) / 1e3
        print(f"grid {g} ramp {ramp} rep {rep}: call {e0.elapsed_time(e1) * 1e3:.0f} us (events); pre-pass CTAs start over {us(pre_start.max()):.1f} us; "
              f"items done: 10% {np.percentile(it_us, 10):.1f}, 50% {np.percentile(it_us, 50):.1f}, 100% {it_us.max():.1f} us; "
              f"pre-pass SMs {len(set(t[:2048, 1]))}")
        print(f"   heads ready (us): " + " ".join(f"{it_us[h * 64:(h + 1) * 64].max():.0f}" for h in range(0, 32, 4)))
        k0 = kern[kern[:, 0] > 0]
        print(f"   kernel CTAs: first wait start {us(k0[:, 0].min()):.1f} us; waits > 1 us: {int((wait > 1).sum())}, sum {wait.sum():.0f} us, max {wait.max():.1f} us;"
              f" first 132 CTAs' starts: median {np.median(us(k0[:132, 0])):.1f}, max {us(k0[:132, 0]).max():.1f} us")
        ends = {}
        for row in kern:
            ends[row[3]] = max(ends.get(row[3], 0), row[2])
        e = np.array(sorted(ends.values()))
        te = tail[tail[:, 2] > 0, 2]
        print(f"   SMs' last kernel CTA end: min {us(e.min()):.0f} median {us(np.median(e)):.0f} max {us(e.max()):.0f} us (n={len(e)});"
              f" tail CTA ends: min {us(te.min()):.0f} median {us(np.median(te)):.0f} max {us(te.max()):.0f} us")
