"""quantize_fp8's bandwidth against a device-to-device copy's, in the same run (issue 48's bar:
the quantize call at >= 75 % of the copy's bytes a second).

    python3 bench/quantize_bandwidth.py --batch 1 --seqlen 8192 --heads-q 32 --heads-kv 8 --head-dim 128

Inputs: random bf16 Q, K, V (dense, on the device); the call writes into preallocated outputs
(out=), so each repetition is its launches alone.  Time: the driver's events around each call
on the default stream, after warm-up; medians over --reps.  Bytes a call, two counts:

* ``logical``: what quantisation must move -- the bf16 inputs read once, the e4m3 codes
  written once (3 bytes an element), plus the descales and the mean;
* ``moved``: what the passes move from and to memory (docs/quantize.md): smooth_k's mean pass
  reads K once more; V (and at tensor and head granularity Q and K too) is read by the amax
  pass and again by the codes pass; at block granularity Q's and K's blocks are read once (the
  blocks pass reads a block twice, the second time from the cache); the partial sums and the
  tiles' amax are small.

The copy: cuMemcpyDtoDAsync (hipMemcpyDtoDAsync on ROCm) of a buffer of the inputs' size, read
+ written = 2x its bytes.  Prints both bandwidths and the ratios.  No PyTorch needed.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def copy_fn(driver):
    """A stream-ordered device-to-device copy of the vendor's driver API: (dst, src, nbytes, stream)."""
    if driver.vendor == "cuda":
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuMemcpyDtoDAsync_v2
        fn.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    else:
        lib = ctypes.CDLL("libamdhip64.so")
        fn = lib.hipMemcpyDtoDAsync
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]

    def copy(dst: int, src: int, nbytes: int, stream: int) -> None:
        rc = fn(dst, src, nbytes, stream or None)
        if rc != 0:
            raise RuntimeError(f"device copy failed: error {rc}")
    return copy


def median_ms(driver, call, reps: int, warmup: int) -> float:
    """The median time of ``call()`` on the default stream, an event pair around each."""
    start, end = driver.event_create(0), driver.event_create(0)
    times = []
    try:
        for rep in range(warmup + reps):
            driver.event_record(start, 0)
            call()
            driver.event_record(end, 0)
            driver.event_synchronize(end)
            if rep >= warmup:
                times.append(driver.event_elapsed_ms(start, end))
    finally:
        driver.event_destroy(start)
        driver.event_destroy(end)
    return statistics.median(times)


def traffic(b: int, sq: int, sk: int, hq: int, hkv: int, d: int, dv: int, smooth_k: bool,
            granularity: str) -> tuple[int, int]:
    """(logical bytes, bytes the passes move) of one call (see the module's docstring)."""
    nq, nk, nv = b * sq * hq * d, b * sk * hkv * d, b * sk * hkv * dv
    small = 4 * (b * hq * -(-sq // 128) + b * hkv * -(-sk // 64) + b * hkv + b * hkv * d)
    logical = 3 * (nq + nk + nv) + small
    read_twice = nv if granularity == "block" else nq + nk + nv
    moved = logical + 2 * read_twice + (2 * nk if smooth_k else 0)
    return logical, moved


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seqlen", type=int, default=8192, help="queries and keys a sequence")
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--granularity", choices=("tensor", "head", "block"), default="block")
    ap.add_argument("--no-smooth-k", action="store_true")
    ap.add_argument("--fp32-descales", action="store_true", help="power_of_two=False")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args(argv)

    import ml_dtypes
    import numpy as np

    from zyfa_runtime import quantize_fp8
    from zyfa_runtime.driver import get_driver
    from zyfa_runtime.memory import DeviceArray, to_device

    driver = get_driver()
    driver.make_current(0)
    b, s, hq, hkv, d = a.batch, a.seqlen, a.heads_q, a.heads_kv, a.head_dim
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(shape, np.float32).astype(ml_dtypes.bfloat16)
            for shape in ((b, s, hq, d), (b, s, hkv, d), (b, s, hkv, d))]
    q, k, v = (to_device(driver, 0, x, "bf16") for x in host)
    kwargs = dict(granularity=a.granularity, smooth_k=not a.no_smooth_k, power_of_two=not a.fp32_descales)
    out = quantize_fp8(q, k, v, **kwargs)                 # allocates the outputs once, loads the kernels
    driver.synchronize(0)

    quant_ms = median_ms(driver, lambda: quantize_fp8(q, k, v, out=out, **kwargs), a.reps, a.warmup)

    nbytes = sum(x.nbytes for x in (q, k, v))
    src, dst = DeviceArray(driver, 0, (nbytes,), "uint8"), DeviceArray(driver, 0, (nbytes,), "uint8")
    copy = copy_fn(driver)
    copy_ms = median_ms(driver, lambda: copy(dst.ptr, src.ptr, nbytes, 0), a.reps, a.warmup)

    logical, moved = traffic(b, s, s, hq, hkv, d, d, kwargs["smooth_k"], a.granularity)
    copy_bw = 2 * nbytes / copy_ms / 1e6
    print(f"device: {driver.device_name(0)}")
    print(f"shape (B, S, Hq, Hkv, D) = {(b, s, hq, hkv, d)}, {kwargs}")
    print(f"copy      {copy_ms * 1e3:9.1f} us  {copy_bw:8.1f} GB/s (read + written)")
    for name, n in (("logical", logical), ("moved", moved)):
        bw = n / quant_ms / 1e6
        print(f"quantize  {quant_ms * 1e3:9.1f} us  {bw:8.1f} GB/s {name:8s} {100 * bw / copy_bw:5.1f} % of the copy")


if __name__ == "__main__":
    main()
