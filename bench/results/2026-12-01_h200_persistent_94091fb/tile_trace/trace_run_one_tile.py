"""Per-CTA SM-clock trace of one zyfa launch (experiment)."""
import sys, json
import numpy as np, torch, cupy
from zyfa_runtime import as_tensor, flash_attn_func
from zyfa_runtime import api
from zyfa_runtime.driver import get_driver
from zyfa_runtime.driver.cuda import ffi

def run(dtype, B, H, S, d, causal, out_path):
    torch.manual_seed(0)
    shape = (B, S, H, d)
    xs = [torch.randn(shape, device="cuda") for _ in range(3)]
    if dtype == "fp8_e4m3":
        qkv = [as_tensor((t / (t.abs().max() / 448)).to(torch.float8_e4m3fn).view(torch.uint8), dtype="fp8_e4m3") for t in xs]
    else:
        qkv = [t.to(torch.bfloat16) for t in xs]
    out = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        flash_attn_func(*qkv, out=out, causal=causal, return_lse=True)
    torch.cuda.synchronize()
    drv = get_driver(); table = api.kernel_table(drv)
    mods = {k.function.module.handle: k for k in table._loaded.values()}
    sym = None
    for key, k in table._loaded.items():
        if key[1].dtype == dtype and key[1].causal == causal and key[1].d_qk == d:
            sym = k
    ptr = ffi.new("CUdeviceptr *"); nb = ffi.new("size_t *")
    r = drv.lib.cuModuleGetGlobal_v2(ptr, nb, sym.function.module.handle, b"_ZN4zyfa14zyfa_trace_bufE")
    assert r == 0, r
    mem = cupy.cuda.UnownedMemory(int(ptr[0]), int(nb[0]), None)
    arr = cupy.ndarray((int(nb[0]) // 4,), dtype=cupy.uint32, memptr=cupy.cuda.MemoryPointer(mem, 0))
    arr.fill(0); torch.cuda.synchronize()
    flash_attn_func(*qkv, out=out, causal=causal, return_lse=True)
    torch.cuda.synchronize()
    np.save(out_path, cupy.asnumpy(arr))
    print(out_path, "done", float(out.float().abs().mean()))

if __name__ == "__main__":
    outdir = sys.argv[1]
    for causal in (False, True):
        run("bf16", 4, 32, 4096, 128, causal, f"{outdir}/one_tile_4k_{'c' if causal else 'nc'}.npy")
