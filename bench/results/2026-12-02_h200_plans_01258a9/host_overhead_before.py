"""Host and GPU time of a zyfa call before the plans (what produced host_overhead_d9858e1.txt):
per FP8 shape, 200 calls queued without synchronising ("host enqueue"), until the GPU ran them
("wall"), and 20 calls captured in a CUDA graph and replayed ("graph": the GPU alone); then a
cProfile of 300 calls.  Run from the repository root: PYTHONPATH=$PWD python3 <this file>."""
import cProfile
import io
import pstats
import time

import torch

import zyfa_runtime as zr
torch.manual_seed(0)
def mk(B, S, H, D, causal):
    q = torch.randn(B, S, H, D, device='cuda').to(torch.float8_e4m3fn)
    out = torch.empty(B, S, H, D, device='cuda', dtype=torch.bfloat16)
    st = torch.cuda.current_stream()
    qr = zr.as_tensor(q.view(torch.uint8), dtype="fp8_e4m3"); o = zr.as_tensor(out)
    return lambda: zr.flash_attn_func(qr, qr, qr, causal=causal, out=o, stream=st)
for shape in ((16, 1024, 16, 128, True), (16, 1024, 16, 128, False), (8, 2048, 16, 128, True), (16, 1024, 8, 256, True), (1, 128, 1, 128, False)):
    f = mk(*shape)
    for _ in range(20): f()
    torch.cuda.synchronize()
    n = 200
    t = time.perf_counter()
    for _ in range(n): f()
    host = (time.perf_counter() - t) / n
    torch.cuda.synchronize(); wall = (time.perf_counter() - t) / n
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        f2 = mk(*shape)
        f2(); torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            for _ in range(20): f2()
    torch.cuda.synchronize()
    g.replay(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); 
    for _ in range(10): g.replay()
    e1.record(); torch.cuda.synchronize()
    gpu = e0.elapsed_time(e1) / 200 / 1e3
    print(f"{shape}: host enqueue {host*1e6:.0f} us/call, wall {wall*1e6:.0f} us/call, graph (GPU only) {gpu*1e6:.0f} us/call", flush=True)
f = mk(16, 1024, 16, 128, True)
pr = cProfile.Profile(); pr.enable()
for _ in range(300): f()
pr.disable(); torch.cuda.synchronize()
sio = io.StringIO(); pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(18); print(sio.getvalue()[-4000:])
