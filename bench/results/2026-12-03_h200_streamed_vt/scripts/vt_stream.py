import glob, numpy as np, cupy as cp
B, S, H, D = 2, 8192, 16, 256
P_ORDER = np.array([2 * (q >> 2) + (q & 1) + 8 * ((q >> 1) & 1) for q in range(16)])
rng = np.random.default_rng(1)
vh = rng.integers(0, 120, (B, S, H, D), dtype=np.uint8)
v = cp.asarray(vh)
nblk = -(-S // 128)
vt = cp.zeros(H * D * nblk * 128 * B, dtype=cp.uint8)
def ref():
    cols = B * nblk * 128
    kk = (np.arange(nblk * 128) // 16) * 16 + P_ORDER[np.arange(nblk * 128) % 16]
    out = np.zeros((H, D, cols), np.uint8)
    for b in range(B):
        out[:, :, b * nblk * 128:(b + 1) * nblk * 128] = vh[b][kk].transpose(1, 2, 0)
    return out
def unswz(buf):
    blocks = buf.reshape(H, B * nblk, D, 8, 16)
    rows = np.arange(D)[:, None]
    logical = blocks[:, :, rows, np.arange(8)[None, :] ^ (rows % 8), :]
    return logical.transpose(0, 2, 1, 3, 4).reshape(H, D, B * nblk * 128)
R = ref()
tile = 128 * (D + 16) + 16 * 7 + 16
for path in sorted(glob.glob("v*.cubin")):
    mod = cp.RawModule(path=path)
    if path.startswith("vg"):
        st = w = int(path[4:-6]); f = mod.get_function("vt_groups"); smem = st * tile; threads = 128 * st
    else:
        st, w = int(path.split("_")[1][1:]), int(path.split("_")[2][1:].split(".")[0]); f = mod.get_function("vt_stream"); smem = st * tile + 16 * st; threads = 32 * (w + 1)
    f.max_dynamic_shared_size_bytes = smem
    args = lambda first, ef: (v, vt, np.int64(S * H * D), np.int64(H * D), np.int64(D), np.int64(D * nblk * 128 * B),
                              np.int32(B), np.int32(H), np.int32(S), np.int32(first), np.int32(ef))
    for ef in (1,):
        for k in (1, 4, 16, 132):
            vt.fill(0)
            f((k,), (threads,), args(0, ef), shared_mem=smem)
            cp.cuda.runtime.deviceSynchronize()
            ok = np.array_equal(unswz(vt.get()), R) if k in (1, 132) else None
            ts = []
            for rep in range(7):
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(); f((k,), (threads,), args(0, ef), shared_mem=smem); e1.record(); e1.synchronize()
                ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1000)
            us = float(np.median(ts))
            gbs = B * S * H * D / us / 1e3
            print(f"{path:24s} ctas {k:3d}: {us:9.1f} us  read {gbs:7.1f} GB/s total, "
                  f"{gbs / k:6.1f} GB/s a CTA, SM-us {us * k:8.0f}  ok={ok}", flush=True)
