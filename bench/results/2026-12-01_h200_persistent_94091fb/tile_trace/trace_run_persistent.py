"""SM-clock trace of the persistent BF16 d128 kernel's tiles (experiment): trace_run.py OUTDIR."""
import sys
import numpy as np, torch, cupy
from zyfa_runtime import flash_attn_func, api
from zyfa_runtime.driver import get_driver
from zyfa_runtime.driver.cuda import ffi


def run(B, H, S, causal, out_path):
    torch.manual_seed(0)
    qkv = [torch.randn((B, S, H, 128), device="cuda").to(torch.bfloat16) for _ in range(3)]
    out = torch.empty((B, S, H, 128), device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        flash_attn_func(*qkv, out=out, causal=causal, return_lse=True)
    torch.cuda.synchronize()
    drv = get_driver()
    table = api.kernel_table(drv)
    k = [k for key, k in table._loaded.items() if key[1].dtype == "bf16" and key[1].causal == causal
         and key[1].d_qk == 128][0]
    ptr, nb = ffi.new("CUdeviceptr *"), ffi.new("size_t *")
    r = drv.lib.cuModuleGetGlobal_v2(ptr, nb, k.function.module.handle, b"_ZN4zyfa14zyfa_trace_bufE")
    assert r == 0, r
    mem = cupy.cuda.UnownedMemory(int(ptr[0]), int(nb[0]), None)
    arr = cupy.ndarray((int(nb[0]) // 4,), dtype=cupy.uint32, memptr=cupy.cuda.MemoryPointer(mem, 0))
    arr.fill(0)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    flash_attn_func(*qkv, out=out, causal=causal, return_lse=True)
    e1.record()
    torch.cuda.synchronize()
    np.save(out_path, cupy.asnumpy(arr[: 132 << 15]))
    print(out_path, f"{e0.elapsed_time(e1):.3f} ms", float(out.float().abs().mean()))


if __name__ == "__main__":
    d = sys.argv[1]
    run(4, 32, 4096, False, f"{d}/persistent_4k_nc.npy")
    run(4, 32, 4096, True, f"{d}/persistent_4k_c.npy")
