#!/usr/bin/env python3
"""Time the sm_90a FP8 V^T pre-pass alone (CUDA events over 50 back-to-back launches) and check
the V^T it writes against numpy: keys in P's order within each 16, zeros past the sequence,
each block of 128 keys stored as a shared-memory stage holds it (d_v rows of 128 bytes, the
16-byte chunk g of row r at g ^ (r % 8)).

    python3 bench/vt_prepass_timing.py

Needs PyTorch with CUDA and the prebuilt sm_90a FP8 kernels (ZYFA_PREBUILT_DIR selects others).
"""
import numpy as np
import torch

from zyfa_runtime import api, catalogue
from zyfa_runtime import launch as L
from zyfa_runtime.driver import get_driver

#: P's key order within 16 keys (cuda/flash_fp8_lean.cuh): position 4t + i holds key
#: {2t, 2t + 1, 2t + 8, 2t + 9}[i].
P_ORDER = np.array([2 * (q >> 2) + (q & 1) + 8 * ((q >> 1) & 1) for q in range(16)])

drv = get_driver()
t = api.kernel_table(drv)
print("shape (B, S, Hkv, d_v): pre-pass time, V read + V^T written per second, layout")
for (B, S, H, d) in [(1, 16384, 8, 128), (4, 4096, 32, 128), (8, 4096, 16, 64), (2, 8192, 16, 256)]:
    v = torch.randint(0, 120, (B, S, H, d), dtype=torch.uint8, device="cuda")
    var = catalogue.Variant("sm_90a", "fp8_e4m3", d, d, False)
    k = t.get(0, var)
    cols = catalogue.vt_columns(B, S, None)
    ws = torch.empty(H * d * cols, dtype=torch.uint8, device="cuda")
    vals = {a["name"]: bytes(128) if a["type"] == "tmap" else 0 for a in k.entry["kernargs"]}   # the pre-pass reads no tensor map
    vals.update(v=v.data_ptr(), vt=ws.data_ptr(), v_stride_b=v.stride(0), v_stride_s=v.stride(1), v_stride_h=v.stride(2),
                vt_stride_h=d * cols, batch=B, hkv=H, seqlen_k=S, hq=H, seqlen_q=S)
    vals.update(cu_seqlens_k=None, cu_seqlens_q=None)
    args = L.pack_args(k, vals)
    s = torch.cuda.current_stream().cuda_stream
    for _ in range(10): L.launch_prepass(drv, k, vals, args, s)
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(50): L.launch_prepass(drv, k, vals, args, s)
    e1.record(); torch.cuda.synchronize()
    us = e0.elapsed_time(e1) / 50 * 1000
    nb = v.numel() * 2
    # check against numpy
    vn = v.cpu().numpy()
    blocks = ws.cpu().numpy().reshape(H, cols // catalogue.VT_BLOCK, d, 8, 16)   # head, block, row, chunk, byte
    rows = np.arange(d)[:, None]
    logical = blocks[:, :, rows, np.arange(8)[None, :] ^ (rows % 8), :]           # chunks unswizzled
    wn = logical.transpose(0, 2, 1, 3, 4).reshape(H, d, cols)                       # head, dv row, column
    span = -(-S // catalogue.VT_BLOCK) * catalogue.VT_BLOCK       # a sequence's columns
    kk = (np.arange(span) // 16) * 16 + P_ORDER[np.arange(span) % 16]   # the key of each column
    ok = True
    for b in range(B):
        c0 = catalogue.vt_column0(b, S)
        exp = np.where((kk < S)[None, None, :], vn[b][np.minimum(kk, S - 1)].transpose(1, 2, 0), 0)
        ok &= np.array_equal(wn[:, :, c0:c0 + span], exp)
    print(f"B{B} S{S} H{H} d{d}: prepass {us:.1f} us, {nb / us / 1e6:.2f} TB/s, layout ok={ok}")
