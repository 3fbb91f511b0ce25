"""A few launches of one zyfa kernel, for a profiler to attach to (Nsight Compute):

    ncu -k regex:zyfa_fwd --launch-skip 1 --launch-count 1 --set full -o rep \\
        python3 bench/profile_target.py --dtype fp8_e4m3 --head-dim 128 --seqlen 8192

Inputs are Gaussian (scaled into e4m3's range for FP8); needs PyTorch with CUDA.
"""
import argparse

import torch

from zyfa_runtime import as_tensor, flash_attn_func


def gaussian(shape: tuple, dtype: str):
    """A tensor of ``shape`` on the GPU, Gaussian; FP8 scaled so that the largest is e4m3's 448
    (a zyfa tensor over uint8 bytes), else bf16."""
    t = torch.randn(shape, device="cuda")
    if dtype == "fp8_e4m3":
        return as_tensor((t / (t.abs().max() / 448)).to(torch.float8_e4m3fn).view(torch.uint8), dtype="fp8_e4m3")
    return t.to(torch.bfloat16)


def gaussian_qkv(shape: tuple, dtype: str, kv_shape: tuple | None = None) -> list:
    """Q of ``shape``, K and V of ``kv_shape`` (default ``shape``), as ``gaussian``."""
    return [gaussian(shape, dtype)] + [gaussian(kv_shape or shape, dtype) for _ in range(2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("bf16", "fp8_e4m3"), default="fp8_e4m3")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--launches", type=int, default=3)
    a = ap.parse_args()
    shape = (a.batch, a.seqlen, a.heads, a.head_dim)
    qkv = gaussian_qkv(shape, a.dtype, (a.batch, a.seqlen, a.kv_heads or a.heads, a.head_dim))
    out = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
    for _ in range(a.launches):
        flash_attn_func(*qkv, out=out, causal=a.causal)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
