"""Host time of a repeated zyfa call (what produced host_overhead_01258a9.txt).

Per shape (B, S, H, D, causal[, fp8]): 300 identical calls of flash_attn_func on one stream,
Q = K = V; "host" is the time to queue them (no synchronisation), "wall" the time until the
GPU has run them too.  "refs": every tensor an as_tensor view built once; "torch out": the
output passed as the PyTorch tensor itself (exported through DLPack on every call).
Run from the repository root on a GPU machine: PYTHONPATH=$PWD python3 <this file>.
"""
import time

import torch

import zyfa_runtime as zr


def calls(B, S, H, D, causal, fp8=True):
    q = torch.randn(B, S, H, D, device="cuda")
    q = q.to(torch.float8_e4m3fn) if fp8 else q.to(torch.bfloat16)
    out = torch.empty(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    st = torch.cuda.current_stream()
    qr = zr.as_tensor(q.view(torch.uint8), dtype="fp8_e4m3") if fp8 else zr.as_tensor(q)
    o = zr.as_tensor(out)
    return {"refs": lambda: zr.flash_attn_func(qr, qr, qr, causal=causal, out=o, stream=st),
            "torch out": lambda: zr.flash_attn_func(qr, qr, qr, causal=causal, out=out, stream=st)}


for shape in ((16, 1024, 16, 128, True), (16, 1024, 16, 128, False), (16, 1024, 8, 256, True),
              (1, 128, 1, 128, False), (1, 128, 1, 128, False, False)):
    for name, call in calls(*shape).items():
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        n = 300
        t = time.perf_counter()
        for _ in range(n):
            call()
        host = (time.perf_counter() - t) / n
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / n
        print(f"{shape} {name}: host {host * 1e6:.0f} us/call, wall {wall * 1e6:.0f} us/call", flush=True)
