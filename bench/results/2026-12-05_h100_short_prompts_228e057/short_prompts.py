"""Where an FP8 call's time goes at short prompts: the whole call, the V^T pre-pass alone, BF16."""
import torch
import zyfa_runtime as zr
from zyfa_runtime import api, catalogue
from zyfa_runtime import launch as L
from zyfa_runtime.driver import get_driver

drv = get_driver(); table = api.kernel_table(drv)
s = torch.cuda.current_stream()

def timed(fn, n=300):
    for _ in range(30): fn()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    torch.cuda.synchronize(); e0.record()
    for _ in range(n): fn()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / n * 1000

for B, S in [(16, 512), (32, 256), (64, 128), (4, 2048)]:
    for causal in (False, True):
        Hq, Hkv, d = 32, 8, 128
        q = torch.randn(B, S, Hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, S, Hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, S, Hkv, d, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(q); o = zr.as_tensor(out)
        qb, kb, vb = zr.as_tensor(q), zr.as_tensor(k), zr.as_tensor(v)
        tb = timed(lambda: zr.flash_attn_func(qb, kb, vb, causal=causal, out=o, stream=s))
        f8 = [(t / 4).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8) for t in (q, k, v)]
        q8, k8, v8 = (zr.as_tensor(t, dtype="fp8_e4m3") for t in f8)
        one = torch.full((1,), 4.0, device="cuda"); dd = zr.as_tensor(one)
        tf = timed(lambda: zr.flash_attn_func(q8, k8, v8, causal=causal, out=o, stream=s,
                                              descale_q=dd, descale_k=dd, descale_v=dd))
        var = catalogue.Variant("sm_90a", "fp8_e4m3", d, d, causal)
        kern = table.get(0, var)
        cols = catalogue.vt_columns(B, S, None)
        ws = torch.empty(Hkv * d * cols, dtype=torch.uint8, device="cuda")
        vt = f8[2]
        vals = {a["name"]: bytes(128) if a["type"] == "tmap" else 0 for a in kern.entry["kernargs"]}
        vals.update(v=vt.data_ptr(), vt=ws.data_ptr(), v_stride_b=vt.stride(0), v_stride_s=vt.stride(1),
                    v_stride_h=vt.stride(2), vt_stride_h=d * cols, batch=B, hkv=Hkv, seqlen_k=S, hq=Hq, seqlen_q=S)
        vals.update(cu_seqlens_k=None, cu_seqlens_q=None)
        args = L.pack_args(kern, vals)
        tp = timed(lambda: L.launch_prepass(drv, kern, vals, args, s.cuda_stream))
        fl = 2 * B * Hq * S * S * 2 * d / (2 if causal else 1)
        print(f"B{B} S{S} causal={causal}: bf16 {tb:.1f} us ({fl/tb/1e6:.0f} TF/s) | fp8 {tf:.1f} us "
              f"({fl/tf/1e6:.0f} TF/s), pre-pass alone {tp:.1f} us ({100*tp/tf:.0f} %)", flush=True)
