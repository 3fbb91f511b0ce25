"""Dev: the balanced tail's timeline from a traced build (zyfa_trace[2][256][16] of globaltimer
stamps), with the plan's shares (launch.tail_units).  Run in a tree whose prebuilt holds the
traced d256 cubin: PYTHONPATH=tree."""
import ctypes
import sys
import numpy as np
import torch
sys.path.insert(0, "bench")
from profile_target import gaussian_qkv
from zyfa_runtime import api, flash_attn_func
from zyfa_runtime.driver.cuda import ffi
from zyfa_runtime.launch import tail_units

shape = (2, 8192, 16, 256)
qkv = gaussian_qkv(shape, "fp8_e4m3")
out = torch.empty(shape[:3] + (256,), device="cuda", dtype=torch.bfloat16)
stream = torch.cuda.current_stream()
for _ in range(5):
    flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream)
torch.cuda.synchronize()
plan = next(reversed(api._plans.values()))
launch = plan.launches[-1]
mod = launch.function.module.handle
cu = ctypes.CDLL("libcuda.so.1")
dptr, size = ctypes.c_uint64(), ctypes.c_size_t()
r = cu.cuModuleGetGlobal_v2(ctypes.byref(dptr), ctypes.byref(size), ctypes.c_void_p(int(ffi.cast("uintptr_t", mod))), b"zyfa_trace")
assert r == 0, r
layout = next(reversed(api._layouts.values()))
vals = layout.values
print("plan:", {k: vals[k] for k in ("tail_first", "tail_ctas", "tail_gap", "tail_ramp")}, "dependent:", [l.dependent for l in plan.launches])
ctas = vals["tail_ctas"]
st = tail_units(vals, vals["tile_count"], 64)
n = size.value // 8
allends = []
for rep in range(6):
    cu.cuMemsetD8_v2(dptr, 0, size)
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000)
    flash_attn_func(*qkv, causal=False, out=out, stream=stream.cuda_stream)
    torch.cuda.synchronize()
    buf = np.zeros(n, dtype=np.uint64)
    cu.cuMemcpyDtoH_v2(buf.ctypes.data_as(ctypes.c_void_p), dptr, size)
    t = buf.reshape(2, 256, 16).astype(np.int64)
    main, tail = t[0], t[1][:ctas]
    m = main[main[:, 1] > 0]
    base = m[:, 1].max()                      # the kernel's last consumer end
    rel = lambda x: (x - base) / 1e3          # us after it
    names = ["entry", "s0 Q", "s0 S0", "s0 loop", "s0 store", "s0 end", "s1 Q", "s1 S0", "s1 loop", "s1 store", "s1 end", "merged"]
    print(f"rep {rep}: kernel's SMs' last CTA: first end {rel(m[:, 1].min()):.1f}, median end {rel(np.median(m[:, 1])):.1f} us")
    for k, nm in enumerate(names):
        col = tail[:, k]
        col = col[col > 0]
        if len(col):
            r_ = rel(col)
            print(f"   {nm:9s} n={len(col):3d} min {r_.min():7.1f} median {np.median(r_):7.1f} max {r_.max():7.1f}")
    ends = np.maximum(tail[:, 5], tail[:, 10])
    e = rel(ends)
    print(f"   tail CTAs' ends: min {e.min():.1f} median {np.median(e):.1f} max {e.max():.1f} us")
    ent = rel(tail[:, 0])
    q = [0, 33, 66, 99, 131]
    print("   entry by j (0,33,66,99,131):", " ".join(f"{ent[j]:.1f}" for j in q),
          "| end by j:", " ".join(f"{e[j]:.1f}" for j in q))
    two = tail[:, 6] > 0
    print(f"   ends: one-segment median {np.median(e[~two]):.1f} max {e[~two].max():.1f}, two-segment median {np.median(e[two]):.1f} max {e[two].max():.1f}")
    one = [j for j in range(ctas) if tail[j, 6] == 0 and tail[j, 3] > 0]
    per = [(tail[j, 3] - tail[j, 2]) / 1e3 / (st[j + 1] - st[j] - 1) for j in one if st[j + 1] - st[j] > 1]
    print(f"   one-segment CTAs {len(one)}: us per block after S0: median {np.median(per):.3f}")
    allends.append(e.max())
print("tail last end over reps:", " ".join(f"{x:.1f}" for x in allends))
