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
Then the serving comparison (``serving``): 1,000 calls queued back to back with one
synchronisation at the end, zyfa with the PyTorch tensors passed themselves (their DLPack
exports remembered: tensors.call_view) beside PyTorch's SDPA on its cuDNN backend in the same
run on the same tensors: dense BF16 and FP8, and packed with host cu_seqlens, device ones
checked (a read-back each call) and device ones unchecked (check_cu_seqlens=False).
Run from the repository root on a GPU machine: PYTHONPATH=$PWD python3 bench/host_overhead.py
(``--serving`` for the comparison alone).
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


def queued(call, n: int = 1000, warmup: int = 50) -> tuple[float, float]:
    """(host, wall) microseconds a call: ``n`` calls queued back to back, one synchronisation
    after the last (``timed`` in microseconds)."""
    host, wall = timed(call, n, warmup)
    return host * 1e6, wall * 1e6


def serving(shapes=((1, 128, 8, 2, 128), (1, 1024, 32, 8, 128), (4, 2048, 32, 8, 128)), n: int = 1000) -> None:
    """zyfa beside SDPA (cuDNN) per shape (B, S, Hq, Hkv, D), causal: dense BF16 and FP8 with
    PyTorch tensors passed directly, then the same rows packed (B sequences of S)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    st = torch.cuda.current_stream()
    for B, S, Hq, Hkv, D in shapes:
        tag = f"B{B} S{S} H{Hq}/{Hkv} d{D} causal"
        q = torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(q)
        rows = [("zyfa bf16 dense, torch tensors", lambda: zr.flash_attn_func(q, k, v, causal=True, out=out,
                                                                              stream=st))]
        fp8 = [x.to(torch.float8_e4m3fn) for x in (q, k, v)]
        one = torch.ones(B, Hkv, device="cuda")
        try:     # PyTorch exports float8 by DLPack in recent versions
            zr.flash_attn_func(*fp8, causal=True, out=out, stream=st, descale_q=one, descale_k=one, descale_v=one)
            rows.append(("zyfa fp8 dense, torch tensors, (B, Hkv) descales",
                         lambda: zr.flash_attn_func(*fp8, causal=True, out=out, stream=st, descale_q=one,
                                                    descale_k=one, descale_v=one)))
        except (TypeError, RuntimeError, BufferError) as e:
            print(f"{tag}: fp8 torch tensors not exported by this PyTorch ({e})")
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))   # SDPA's (B, H, S, D), views
        kt, vt = (x.repeat_interleave(Hq // Hkv, dim=1) for x in (kt, vt))
        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                sdpa(qt, kt, vt, is_causal=True)
        rows.append(("torch SDPA cudnn (allocates its output)", cudnn))
        cu = torch.arange(0, (B + 1) * S, S, device="cuda", dtype=torch.int32)
        cu_host = cu.cpu().numpy()
        pq, pk, pv = (x.reshape(B * S, *x.shape[2:]) for x in (q, k, v))
        pout = out.view(B * S, Hq, D)
        for where, c, check in (("host cu_seqlens", cu_host, True), ("device cu_seqlens, checked", cu, True),
                                ("device cu_seqlens, check_cu_seqlens=False", cu, False)):
            rows.append((f"zyfa bf16 packed, {where}",
                         lambda c=c, check=check: zr.flash_attn_varlen_func(
                             pq, pk, pv, cu_seqlens_q=c, cu_seqlens_k=c, max_seqlen_q=S, max_seqlen_k=S, causal=True,
                             out=pout, stream=st, check_cu_seqlens=check)))
        for name, call in rows:
            host, wall = queued(call, n)
            # host cu_seqlens: past staging.SLOTS calls ahead the host waits for the GPU (its pace)
            print(f"{tag}: {name}: host {host:.1f} us/call, wall {wall:.1f} us/call ({n} calls, one sync)",
                  flush=True)


if __name__ == "__main__":
    import sys
    if "--serving" not in sys.argv:
        main()
        varlen()
    serving()
