"""Host time of a zyfa call by the path it takes (the host_overhead_<commit>.txt logs under
bench/results/).

Per shape (B, S, H, D, causal[, fp8]): 300 calls of flash_attn_func on one stream, Q = K = V,
``out`` given. "plan": the same tensors each call (the call's plan is queued again);
"layout": the plans forgotten before each call, so each takes the path of new tensors of a
known layout (addresses checked, tensor maps and arguments made anew); "validated": plans and
layouts forgotten, every rule checked.  "host" is the time to queue the calls (no
synchronisation), "wall" the time until the GPU has run them too.  Every tensor is an
as_tensor view built once; "torch" rows pass the PyTorch tensors themselves (DLPack each call).
Then a packed batch (flash_attn_varlen_func, which keeps no plan): its cu_seqlens as device
tensors (read back for validation: each call waits for the GPU) or as host arrays (staged to
the device by a queued copy: no call waits).
Run from the repository root on a GPU machine: PYTHONPATH=$PWD python3 bench/host_overhead.py.
"""
import time

import numpy as np
import torch

import zyfa_runtime as zr
from zyfa_runtime import plan


def forget(plans, layouts):
    def f():
        if plans:
            plan._plans.clear()
        if layouts:
            plan._layouts.clear()
    return f


PATHS = {"plan": forget(False, False), "layout": forget(True, False), "validated": forget(True, True)}


def tensors(B, S, H, D, causal, fp8=True):
    q = torch.randn(B, S, H, D, device="cuda")
    q = q.to(torch.float8_e4m3fn) if fp8 else q.to(torch.bfloat16)
    out = torch.empty(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    qr = zr.as_tensor(q.view(torch.uint8), dtype="fp8_e4m3") if fp8 else zr.as_tensor(q)
    return q, out, qr, zr.as_tensor(out)


def timed(call, n: int, warmup: int = 20) -> tuple[float, float]:
    """(host, wall) seconds a call of ``n`` queued back to back after ``warmup`` calls: the time
    to queue them, and the time until the GPU has run them too."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        call()
    host = (time.perf_counter() - t) / n
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t) / n


def main() -> None:
    for shape in ((16, 1024, 16, 128, True), (16, 1024, 16, 128, False), (16, 1024, 8, 256, True),
                  (1, 128, 1, 128, False), (1, 128, 1, 128, False, False)):
        q, out, qr, o = tensors(*shape)
        fp8, causal = len(shape) == 5, shape[4]
        st = torch.cuda.current_stream()
        for torch_args in (False, True):
            # "torch": out (and BF16's q) passed as PyTorch tensors; FP8's q stays declared once
            qa, oa = (q if torch_args and not fp8 else qr), (out if torch_args else o)
            for path, prep in PATHS.items():
                def call():
                    prep()
                    zr.flash_attn_func(qa, qa, qa, causal=causal, out=oa, stream=st)
                host, wall = timed(call, 300)
                print(f"{shape} {'torch out' if torch_args else 'refs'} {path}: host {host * 1e6:.0f} us/call, "
                      f"wall {wall * 1e6:.0f} us/call", flush=True)


def varlen(seqs=(4096, 1000, 3000, 8192, 2000, 6000, 300, 8000), H=32, D=128, causal=True) -> None:
    """Host and wall time of a packed FP8 call by where its cu_seqlens are (a batch the GPU
    takes longer over than the host: host cu_seqlens let the host run ahead)."""
    cu = np.concatenate([[0], np.cumsum(seqs)]).astype(np.int32)
    q = torch.randn(int(cu[-1]), H, D, device="cuda").to(torch.float8_e4m3fn)
    qr = zr.as_tensor(q.view(torch.uint8), dtype="fp8_e4m3")
    o = zr.as_tensor(torch.empty(int(cu[-1]), H, D, device="cuda", dtype=torch.bfloat16))
    st = torch.cuda.current_stream()
    for where, c in (("device cu_seqlens", torch.from_numpy(cu).cuda()), ("host cu_seqlens", cu)):
        def call():
            zr.flash_attn_varlen_func(qr, qr, qr, cu_seqlens_q=c, cu_seqlens_k=c, max_seqlen_q=max(seqs),
                                      max_seqlen_k=max(seqs), causal=causal, out=o, stream=st)
        # fewer calls than staging.SLOTS: past them the host waits for the slot it comes back
        # to, and so runs at the GPU's pace
        host, wall = timed(call, 48)
        print(f"varlen {len(seqs)} seqs {int(cu[-1])} tokens H{H} d{D} {'causal' if causal else 'full'} fp8, "
              f"{where}: host {host * 1e6:.0f} us/call, wall {wall * 1e6:.0f} us/call", flush=True)


if __name__ == "__main__":
    main()
    varlen()
