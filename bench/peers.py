#!/usr/bin/env python3
"""zyfa against its peers on one NVIDIA GPU: speed, accuracy, power and clock.

    python bench/peers.py --quick --out OUTDIR --commit SHA   # S/8, a few minutes
    python bench/peers.py                                     # full shapes
    python bench/peers.py --sustained                         # >= 10 s per point
    python bench/peers.py --sweep                             # 1k-16k tokens a sequence, per variant
    python bench/peers.py --dry-run                           # print the plan only (no GPU)

Implementations, all on the same inputs ([B, S, H, D] memory, bf16): Gaussian (torch.randn),
or with ``--inputs real`` SmolLM2-135M's own post-RoPE Q, K, V (``bench/real_inputs.py``
writes them; ``tile_real`` tiles them to each shape: head dim 64 as captured, head dim 128
derived as in the accuracy study, softmax scale 1/8 as the model uses; other head dims have
no real inputs and are reported missing):

* ``zyfa_bf16``   -- zyfa_runtime.flash_attn_func on the bf16 tensors
* ``zyfa_fp8``    -- the same on per-tensor e4m3 codes (descale = amax / 448)
* ``sdpa_cudnn``  -- torch SDPA forced to SDPBackend.CUDNN_ATTENTION (bf16)
* ``sdpa_flash``  -- torch SDPA forced to SDPBackend.FLASH_ATTENTION (bf16)
* ``cudnn_fe_bf16``, ``cudnn_fe_fp8`` -- the cuDNN frontend's SDPA graphs (``bench/cudnn_frontend.py``;
  the ``nvidia-cudnn-frontend`` wheel): bf16, and the FP8 graph on the same e4m3 codes and
  descales, whose output is e4m3 on Hopper (its error is taken on that output dequantised)
* ``triton_fp8``  -- a compact FA2-style Triton FP8 forward written here (online softmax
  in exp2, P scaled by 2^8 and cast to e4m3 for the PV dot, fp32 accumulation, bf16 out,
  per-tensor descales; d_qk == d_v only).  V is laid out [B, Hkv, D, Sk] once, outside
  the timed region, so that the PV dot reads a K-major operand.

An implementation that fails or is unavailable is reported as missing, with the reason.
Each point's bar is the fastest peer measured in the run or carried into it from a measured
H200 run (``ANCHORS``, ``bar``); the report gives zyfa against it, and zyfa's FP8 error against
the most accurate FP8 peer with bf16 output.

Timing: CUDA events around each call, warm-up >= 50 ms, then enough calls for >= 200 ms
(``--sustained``: >= 10 s); the median per call.  Where some implementation of a point calls in
under ``--graph-below-ms`` (1 ms: the short prompts), the events would time the host's launch
gaps beside the kernels, so every implementation of that point is timed in CUDA graphs instead
(about 2 ms of calls captured into one graph, events around each replay, divided by its calls;
the tables mark such points "(graph)").  Every implementation is built and checked
first, then timed in ``--rounds`` rounds (3; 1 with ``--sustained``), each round taking every
implementation in turn, and the median of its rounds is reported (each round's figure kept):
a card at its power cap moves by a few percent over a run, and this way every implementation
sees each phase of it.  FLOPs are
2 * B * Hq * Sq * Sk * (d_qk + d_v), halved for causal.  An NVML thread samples power and
SM clock during the timed window, and reads the board's energy counter at its ends.  The
board's power reading lags by about a second (in a 0.2 s window the samples read a third of
the power its energy counter shows; over 10 s the two agree within 2 %), so W and TFLOP/J =
TFLOP/s / W (W from the energy counter where there is one) are reported only for windows of at
least POWER_MIN_WINDOW_S: use ``--sustained`` (or ``--min-s``) for them.

Accuracy: ||out - ref|| / ||ref|| on a slice (batch 0, the first 2 query heads, the first
and last 128 query rows) against an fp64 reference over all keys (causal bottom-right
aligned), on the dequantised FP8 inputs for FP8 implementations and on the bf16 inputs for
the bf16 ones.  FP8 rows also give the error against the bf16-input reference (input
quantisation included).  NaNs anywhere in the output are counted.

Writes results.json, results.md and PNG plots (TFLOP/s and TFLOP/J per shape; with ``--sweep``
TFLOP/s against sequence length, a panel per variant) into ``--out``
(default bench/results/<date>_peers).  ``bench/peers_plot.py`` redraws the plots.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import re
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: (B, Hq, Hkv, S, d_qk, d_v)
SHAPES = [
    (1, 32, 8, 16384, 128, 128),
    (1, 32, 32, 32768, 128, 128),
    (4, 32, 32, 4096, 128, 128),
    (8, 16, 16, 4096, 64, 64),
    (2, 16, 16, 8192, 256, 256),
    (1, 16, 16, 16384, 192, 128),
]
IMPLS = ["zyfa_bf16", "zyfa_fp8", "sdpa_cudnn", "sdpa_flash", "cudnn_fe_bf16", "cudnn_fe_fp8", "triton_fp8"]
#: The implementations here that are peers, by the bar they join (zyfa's own are not).
PEER_IMPLS = {"fp8": ("cudnn_fe_fp8", "triton_fp8"),
              "bf16": ("sdpa_cudnn", "cudnn_fe_bf16", "sdpa_flash")}
FP8_IMPLS = {"zyfa_fp8", *PEER_IMPLS["fp8"]}
E4M3_MAX = 448.0
REF_ROWS = 128          # first and last REF_ROWS query rows
POWER_MIN_WINDOW_S = 2.0   # shortest timed window whose W and TFLOP/J are reported
REF_HEADS = 2           # query heads of the reference slice (--ref-heads)
GRAPH_BELOW_MS = 1.0    # a point any of whose calls is shorter is timed in CUDA graphs (--graph-below-ms)
GRAPH_REPLAY_S = 2e-3   # calls captured into one graph: about this much eager time of them
GRAPH_MAX_CALLS = 200

#: The bar: the fastest peers of this shape, measured in this run or carried into it.  A peer
#: this harness cannot run is an ``Anchor``: its figure from a measured run on an H200 like ours
#: (Gaussian inputs, the card at its 700 W cap), scaled by the ratio of a harness implementation
#: measured both there and here (the first of its ``bridges`` this run has).  Two runs of
#: 2026-11-30 on one H200:
#:   * the peers run: torch SDPA (cuDNN 9.19), the cuDNN frontend's FP8 graph (e4m3 output: cuDNN
#:     refuses bf16 output from FP8 inputs on Hopper) and a Triton FP8 kernel (a stronger one
#:     than ``triton_fp8`` here, reading a V^T prepared outside its timing);
#:   * the FlashAttention-3 run: FA3 built from its source for sm_90a (FP8 in, bf16 out), with
#:     the cuDNN frontend's FP8 graph timed in the same pass, through which its FP8 figures are
#:     bridged (its best pass of two runs); its BF16 figures go through the peers run's SDPA.
#: Neither FA3 nor the Triton kernel of the peers run ships with zyfa, hence the anchors.


@dataclass(frozen=True)
class Anchor:
    peer: str
    dtype: str                 # "fp8" or "bf16": the bar it joins
    tflops: float
    bridges: tuple             # ((impl, that impl's TFLOP/s in the anchor's run), ...), preferred first
    impl: str | None = None    # the implementation here that measures this same peer, if any


def _anchors(sdpa, cudnn_fp8, triton, fa3_fp8=None, fa3_bf16=None):
    """One point's anchors.  sdpa, cudnn_fp8, triton: the peers run's torch SDPA cuDNN, cuDNN
    frontend FP8 and Triton FP8 figures; fa3_fp8: (FA3 FP8, the cuDNN frontend FP8 of its pass);
    fa3_bf16: FA3 BF16."""
    via_sdpa = (("sdpa_cudnn", sdpa),)
    out = [Anchor("cuDNN FP8", "fp8", cudnn_fp8, via_sdpa, impl="cudnn_fe_fp8"),
           Anchor("Triton FP8", "fp8", triton, via_sdpa)]
    if fa3_fp8:
        out.append(Anchor("FA3 FP8", "fp8", fa3_fp8[0], (("cudnn_fe_fp8", fa3_fp8[1]),) + via_sdpa))
    if fa3_bf16:
        out.append(Anchor("FA3", "bf16", fa3_bf16, via_sdpa))
    return tuple(out)


#: (B, Hq, Hkv, S, d_qk, d_v) -> {causal: anchors}
ANCHORS = {
    (1, 32, 8, 16384, 128, 128): {False: _anchors(613, 933, 718, (916.2, 924.8), 663),
                                  True: _anchors(573, 882, 722, (905.3, 874.4), 658)},
    (1, 32, 32, 32768, 128, 128): {False: _anchors(619, 947, 723, (928.4, 932.5), 675),
                                   True: _anchors(591, 914, 737, (923.1, 909.2), 653)},
    (4, 32, 32, 4096, 128, 128): {False: _anchors(597, 895, 675, (855.9, 894.3), 629),
                                  True: _anchors(521, 661, 619, (776.5, 685.7), 585)},
    (8, 16, 16, 4096, 64, 64): {False: _anchors(446, 542, 463, (606.8, 540.0), 478),
                                True: _anchors(404, 418, 419, (531.2, 426.2), 424)},
    (2, 16, 16, 8192, 256, 256): {False: _anchors(651, 919, 777, (1117.6, 927.3), 697),
                                  True: _anchors(601, 911, 794, (1063.0, 926.3), 663)},
    (1, 16, 16, 16384, 192, 128): {False: _anchors(617, 621, 707),
                                   True: _anchors(564, 643, 694)},
}


# --------------------------------------------------------------------------------------
# Pure helpers (no torch; testable on any machine).

def shape_label(shape) -> str:
    b, hq, hkv, s, dqk, dv = shape
    hd = f"d{dqk}" if dqk == dv else f"d{dqk}/{dv}"
    return f"B{b} H{hq}/{hkv} S{s} {hd}"


def quick_shape(shape, factor: int = 8):
    b, hq, hkv, s, dqk, dv = shape
    return (b, hq, hkv, max(256, s // factor), dqk, dv)


def flops(shape, causal: bool) -> float:
    b, hq, _hkv, s, dqk, dv = shape
    f = 2.0 * b * hq * s * s * (dqk + dv)
    return f / 2 if causal else f


def parse_shapes(text: str | None):
    """``--shapes``: comma-separated 0-based indices into SHAPES and/or BxHqxHkvxSxDqkxDv
    tuples, e.g. "0,3" or "0,1x16x16x4096x64x64"."""
    if not text:
        return list(SHAPES)
    out = []
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if "x" in part:
            vals = tuple(int(v) for v in part.split("x"))
            if len(vals) != 6:
                raise ValueError(f"shape {part!r}: want BxHqxHkvxSxDqkxDv")
            out.append(vals)
        else:
            out.append(SHAPES[int(part)])
    return out


#: ``--sweep``: every head-dim pair of the catalogue over sequence lengths at a constant 16k
#: tokens and a model width of 2,048 (B = 16,384 / S, H = 2,048 / d_qk query and key/value heads;
#: 16 at d192/128, as the MLA-like shape above), the convention of FlashAttention-3's figures.
SWEEP_SEQLENS = (1024, 2048, 4096, 8192, 16384)
SWEEP_HEAD_DIMS = ((64, 64), (128, 128), (192, 128), (256, 256))


def sweep_shapes():
    out = []
    for dqk, dv in SWEEP_HEAD_DIMS:
        h = 16 if dqk != dv else 2048 // dqk
        out += [(16384 // s, h, h, s, dqk, dv) for s in SWEEP_SEQLENS]
    return out


def plan(args):
    shapes = sweep_shapes() if args.sweep else parse_shapes(args.shapes)
    if args.quick:
        shapes = [quick_shape(s) for s in shapes]
    causals = {"both": [False, True], "causal": [True], "noncausal": [False]}[args.causal]
    impls = [i for i in IMPLS if i in set(args.impls.split(","))] if args.impls else list(IMPLS)
    return [(s, c) for s in shapes for c in causals], impls


# --------------------------------------------------------------------------------------
# The Triton FP8 peer.  Defined at import when Triton is present.

try:
    import triton
    import triton.language as tl
    _TRITON_ERR = None
except Exception as e:   # noqa: BLE001
    triton = None
    tl = None
    _TRITON_ERR = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

if triton is not None:
    @triton.jit
    def _tri_inner(acc, l_i, m_i, q, k_base, v_base, sks, svs, start, stop, offs_m, offs_n,
                   offs_d, Sk, causal_shift, qk_scale,
                   MASKED: tl.constexpr, BLOCK_N: tl.constexpr):
        for start_n in range(start, stop, BLOCK_N):
            kn = start_n + offs_n
            k = tl.load(k_base + kn[None, :] * sks + offs_d[:, None],
                        mask=kn[None, :] < Sk, other=0.0)                 # [D, BN]
            s = tl.dot(q, k) * qk_scale                                   # [BM, BN] fp32
            valid = kn[None, :] < Sk
            if MASKED:
                valid = valid & (kn[None, :] <= offs_m[:, None] + causal_shift)
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = tl.load(v_base + kn[:, None] + offs_d[None, :] * svs,
                        mask=kn[:, None] < Sk, other=0.0)                 # [BN, D], K-major
            acc = tl.dot((p * 256.0).to(tl.float8e4nv), v, acc)
            m_i = m_new
        return acc, l_i, m_i

    @triton.jit
    def _tri_fwd(Q, K, Vt, O, DQ, DK, DV, sm_scale,
                 sqb, sqs, sqh, skb, sks, skh, svb, svh, svd, sob, sos, soh,
                 Hq, Hkv, Sq, Sk,
                 CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 D: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // Hq
        h = bh % Hq
        hk = h // (Hq // Hkv)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D)
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :],
                    mask=offs_m[:, None] < Sq, other=0.0)
        dq = tl.load(DQ)
        dk = tl.load(DK)
        dv = tl.load(DV)
        qk_scale = sm_scale * dq * dk * 1.4426950408889634
        k_base = K + b * skb + hk * skh
        v_base = Vt + b * svb + hk * svh
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        if CAUSAL:
            shift = Sk - Sq
            hi = tl.minimum(Sk, (pid_m + 1) * BLOCK_M + shift)
            hi = tl.maximum(hi, 0)
            full = tl.maximum(pid_m * BLOCK_M + shift + 1, 0) // BLOCK_N * BLOCK_N
            full = tl.minimum(full, hi)
            acc, l_i, m_i = _tri_inner(acc, l_i, m_i, q, k_base, v_base, sks, svd, 0, full,
                                       offs_m, offs_n, offs_d, Sk, shift, qk_scale,
                                       False, BLOCK_N)
            acc, l_i, m_i = _tri_inner(acc, l_i, m_i, q, k_base, v_base, sks, svd, full, hi,
                                       offs_m, offs_n, offs_d, Sk, shift, qk_scale,
                                       True, BLOCK_N)
        else:
            acc, l_i, m_i = _tri_inner(acc, l_i, m_i, q, k_base, v_base, sks, svd, 0, Sk,
                                       offs_m, offs_n, offs_d, Sk, 0, qk_scale,
                                       False, BLOCK_N)
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc * (dv / 256.0) / l_safe[:, None]
        tl.store(O + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :],
                 out.to(tl.bfloat16), mask=offs_m[:, None] < Sq)


#: Triton configurations tried in order: (BLOCK_M, BLOCK_N, num_warps, num_stages).
TRITON_CONFIGS = [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 2)]


class TritonFP8:
    """Holds the chosen launch configuration per (D, causal) after the first success."""

    def __init__(self):
        self.chosen: dict = {}
        self.errors: dict = {}

    def make(self, q8, k8, v8, dq, dk, dv, out, causal: bool, sm_scale: float):
        import torch
        if triton is None:
            raise RuntimeError(f"triton not importable: {_TRITON_ERR}")
        B, Sq, Hq, D = q8.shape
        _, Sk, Hkv, Dv = v8.shape
        if D != Dv:
            raise NotImplementedError(f"triton_fp8 supports d_qk == d_v only (got {D}/{Dv})")
        if Hq % Hkv:
            raise ValueError("Hq must be a multiple of Hkv")
        # [B, Sk, Hkv, D] -> memory [B, Hkv, D, Sk] (sequence contiguous), outside timing.
        vt = v8.view(torch.uint8).permute(0, 2, 3, 1).contiguous().view(torch.float8_e4m3fn)
        key = (D, causal)
        configs = [self.chosen[key]] if key in self.chosen else TRITON_CONFIGS

        def launcher(cfg):
            bm, bn, nw, ns = cfg
            grid = (triton.cdiv(Sq, bm), B * Hq)

            def call():
                _tri_fwd[grid](
                    q8, k8, vt, out, dq, dk, dv, sm_scale,
                    q8.stride(0), q8.stride(1), q8.stride(2),
                    k8.stride(0), k8.stride(1), k8.stride(2),
                    vt.stride(0), vt.stride(1), vt.stride(2),
                    out.stride(0), out.stride(1), out.stride(2),
                    Hq, Hkv, Sq, Sk,
                    CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, D=D,
                    num_warps=nw, num_stages=ns)
            return call

        errs = []
        for cfg in configs:
            fn = launcher(cfg)
            try:
                fn()
                torch.cuda.synchronize()
            except Exception as e:   # noqa: BLE001
                first = str(e).strip().splitlines()
                errs.append(_clean(f"{cfg}: {type(e).__name__}: {first[0][:200] if first else ''}"))
                continue
            self.chosen[key] = cfg
            return fn, {"config": {"BLOCK_M": cfg[0], "BLOCK_N": cfg[1], "num_warps": cfg[2],
                                   "num_stages": cfg[3]}, "config_failures": errs}
        raise RuntimeError("no Triton configuration ran: " + " | ".join(errs))


# --------------------------------------------------------------------------------------
# NVML sampling.

class Sampler:
    """Background NVML sampler of power (W) and SM clock (MHz)."""

    def __init__(self, period_s: float = 0.005):
        self.period = period_s
        self.ok = False
        self.err = None
        self.handle = None
        self.nvml = None
        try:
            import pynvml
            pynvml.nvmlInit()
            idx = 0
            vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
            if vis.isdigit():
                idx = int(vis)
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
            self.nvml = pynvml
            self.ok = True
        except Exception as e:   # noqa: BLE001
            self.err = f"{type(e).__name__}: {e}"

    def info(self) -> dict:
        if not self.ok:
            return {"nvml_error": self.err}
        n = self.nvml
        d = {}
        for key, fn in (("driver", lambda: n.nvmlSystemGetDriverVersion()),
                        ("nvml_name", lambda: n.nvmlDeviceGetName(self.handle)),
                        ("power_limit_w", lambda: n.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000),
                        ("max_sm_clock_mhz", lambda: n.nvmlDeviceGetMaxClockInfo(self.handle, n.NVML_CLOCK_SM)),
                        # which physical card: runs on one card and on several tell apart
                        ("uuid", lambda: n.nvmlDeviceGetUUID(self.handle)),
                        ("serial", lambda: n.nvmlDeviceGetSerial(self.handle))):
            try:
                v = fn()
                d[key] = v.decode() if isinstance(v, bytes) else v
            except Exception as e:   # noqa: BLE001
                d[key] = f"error: {e}"
        return d

    def _energy_mj(self):
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except Exception:   # noqa: BLE001
            return None

    def start(self):
        self.samples = []
        self._stop = threading.Event()
        if not self.ok:
            return
        self._e0 = self._energy_mj()
        self._t0 = time.perf_counter()
        self._thr = threading.Thread(target=self._run, daemon=True)
        self._thr.start()

    def _run(self):
        n = self.nvml
        while not self._stop.is_set():
            try:
                p = n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
                c = n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM)
                self.samples.append((p, c))
            except Exception:   # noqa: BLE001
                pass
            self._stop.wait(self.period)

    def stop(self) -> dict:
        if not self.ok:
            return {"power_w": None, "sm_clock_mhz": None, "nvml_samples": 0}
        self._stop.set()
        self._thr.join()
        dt = time.perf_counter() - self._t0
        e1 = self._energy_mj()
        res = {"nvml_samples": len(self.samples)}
        if self.samples:
            ps = [s[0] for s in self.samples]
            cs = [s[1] for s in self.samples]
            res.update(power_w=sum(ps) / len(ps), power_w_max=max(ps),
                       sm_clock_mhz=sum(cs) / len(cs), sm_clock_mhz_min=min(cs))
        else:
            res.update(power_w=None, sm_clock_mhz=None)
        if self._e0 is not None and e1 is not None and dt > 0:
            res["power_w_energy"] = (e1 - self._e0) / 1000.0 / dt
        return res


# --------------------------------------------------------------------------------------
# Timing and accuracy.

def warm_up(fn, warm_s: float) -> float:
    """Seconds a call, eagerly, after calling ``fn`` for at least ``warm_s`` s (and 3 times)."""
    import torch
    t0 = time.perf_counter()
    n_warm = 0
    while True:
        fn()
        n_warm += 1
        if n_warm % 4 == 0 or n_warm == 1:
            torch.cuda.synchronize()
            if time.perf_counter() - t0 >= warm_s and n_warm >= 3:
                break
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n_warm


def graph_timed(call_s: list, below_ms: float) -> bool:
    """Whether a point is timed in CUDA graphs: where any of its calls (eager seconds a call,
    ``call_s``) takes under ``below_ms`` (0: never), events around each eager call would time
    the host's launch gaps beside the kernels, and the implementations would be compared on
    them.  A point's implementations are all timed one way."""
    return below_ms > 0 and bool(call_s) and min(call_s) * 1e3 < below_ms


def time_call(fn, min_s: float, warm_s: float, sampler: Sampler, graph: bool = False) -> dict:
    """One timed window of ``fn`` (>= ``min_s`` s after a warm-up): the median per-call ms.

    Eager (``graph`` False): events around each call, host launch gaps included where the call
    is shorter than its launch.  ``graph``: GRAPH_REPLAY_S worth of calls captured into one CUDA
    graph on the current stream (which must not be the legacy default stream), events around
    each replay, each replay's time divided by its calls: the GPU's time alone."""
    import torch
    est = warm_up(fn, warm_s)
    per = 1
    if graph:
        per = int(min(max(1, round(GRAPH_REPLAY_S / max(est, 1e-6))), GRAPH_MAX_CALLS))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=torch.cuda.current_stream()):
            for _ in range(per):
                fn()
        run = g.replay
        for _ in range(3):
            run()
    else:
        run = fn
    torch.cuda.synchronize()
    n = int(min(max(10, math.ceil(min_s / max(est * per, 1e-6))), 500000))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    sampler.start()
    w0 = time.perf_counter()
    for i in range(n):
        starts[i].record()
        run()
        ends[i].record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - w0
    nv = sampler.stop()
    ms = sorted(s.elapsed_time(e) / per for s, e in zip(starts, ends))
    res = {"calls": n * per, "median_ms": ms[n // 2], "min_ms": ms[0], "max_ms": ms[-1],
           "window_s": wall, "timing": "graph" if graph else "eager"}
    if graph:
        res["calls_per_graph"] = per
    res.update(nv)
    return res


def combine_rounds(ts: list[dict]) -> dict:
    """One implementation's timed rounds (time_call's results) as one: the median of each
    round's figures (per-call median ms, clock, power, window), the calls summed."""
    import statistics
    out = {"rounds": len(ts), "calls": sum(t["calls"] for t in ts),
           "min_ms": min(t["min_ms"] for t in ts), "max_ms": max(t["max_ms"] for t in ts)}
    for key in sorted({k for t in ts for k, v in t.items() if isinstance(v, (int, float))} - set(out)):
        vals = [t[key] for t in ts if isinstance(t.get(key), (int, float))]
        if vals:
            out[key] = statistics.median(vals)
    return out


def tile_real(real, shape):
    """Q, K, V (float32 numpy, [B, S, H, D]) for ``shape`` from captured SmolLM2 activations
    ``real`` (q (L, T, 9, 64), k and v (L, T, 3, 64)).  Key/value head j of batch b is captured
    head j % 3 of layer (j // 3 + b) % L; each query head keeps its captured pairing (query
    head c * 3 + i attends key/value head c).  Sequences repeat the T captured tokens.  Head dim
    128: the derived heads of the accuracy study (key/value heads 0 and 1 concatenated, their
    query heads likewise), one key/value head per layer."""
    B, Hq, Hkv, S, dqk, dv = shape
    if (dqk, dv) not in ((64, 64), (128, 128)):
        raise ValueError(f"no real inputs for head dims {dqk}/{dv} (SmolLM2 has 64; 128 is derived)")
    q, k, v = (np.asarray(real[n], dtype=np.float32) for n in ("q", "k", "v"))
    group = q.shape[2] // k.shape[2]
    if dqk == 128:
        q = np.concatenate([q[:, :, 0:group], q[:, :, group:2 * group]], axis=3)
        k, v = (np.concatenate([x[:, :, 0:1], x[:, :, 1:2]], axis=3) for x in (k, v))
    n_layers, t, hkv0 = q.shape[0], q.shape[1], k.shape[2]
    reps = -(-S // t)
    seq = lambda x: np.tile(x, (reps, 1))[:S]   # noqa: E731  (T, D) -> (S, D)
    qo = np.empty((B, S, Hq, dqk), np.float32)
    ko = np.empty((B, S, Hkv, dqk), np.float32)
    vo = np.empty((B, S, Hkv, dv), np.float32)
    for b in range(B):
        for j in range(Hkv):
            layer, c = (j // hkv0 + b) % n_layers, j % hkv0
            ko[b, :, j], vo[b, :, j] = seq(k[layer, :, c]), seq(v[layer, :, c])
        for h in range(Hq):
            j = h // (Hq // Hkv)
            layer, c = (j // hkv0 + b) % n_layers, j % hkv0
            qo[b, :, h] = seq(q[layer, :, c * group + h % group])
    return qo, ko, vo


def ref_slice(q, k, v, causal: bool, sm_scale: float, heads: int = REF_HEADS):
    """fp64 reference on batch 0, the first ``heads`` query heads, the first and last
    REF_ROWS query rows, over all keys.  q [B,Sq,Hq,D], k/v [B,Sk,Hkv,D]; returns
    (rows index tensor, ref [rows, heads, Dv])."""
    import torch
    Sq, Hq = q.shape[1], q.shape[2]
    Sk, Hkv = k.shape[1], k.shape[2]
    rows = sorted(set(range(min(REF_ROWS, Sq))) | set(range(max(0, Sq - REF_ROWS), Sq)))
    rows_t = torch.tensor(rows, device=q.device)
    outs = []
    for h in range(min(heads, Hq)):
        hk = h // (Hq // Hkv)
        qs = q[0, rows_t, h, :].double()
        ks = k[0, :, hk, :].double()
        vs = v[0, :, hk, :].double()
        s = (qs @ ks.T) * sm_scale
        if causal:
            j = torch.arange(Sk, device=q.device)[None, :]
            i = rows_t[:, None]
            s = s.masked_fill(j > i + (Sk - Sq), float("-inf"))
        p = torch.softmax(s, dim=-1)
        outs.append(p @ vs)
    return rows_t, torch.stack(outs, dim=1)


def rel_err(out, rows_t, ref) -> float:
    o = out[0, rows_t, : ref.shape[1], :].double()
    return float(torch_norm(o - ref) / torch_norm(ref))


def poison(out):
    """NaN in every element of an output buffer (bf16, or e4m3 as the cuDNN FP8 graph writes)."""
    import torch
    if out.dtype == torch.float8_e4m3fn:
        out.view(torch.uint8).fill_(0x7F)    # e4m3fn's NaN
    else:
        out.fill_(float("nan"))


def dequantised(out, out_scale):
    """An output as fp32 values: e4m3 output divided by the scale the graph applied."""
    import torch
    if out.dtype == torch.float8_e4m3fn:
        return out.float() / out_scale
    return out


def torch_norm(x):
    import torch
    return torch.linalg.vector_norm(x)


def quantise(x):
    """Per-tensor e4m3: (codes as float8_e4m3fn, descale fp32 cuda tensor of one element)."""
    import torch
    amax = x.float().abs().amax().clamp_min(1e-30)
    descale = (amax / E4M3_MAX).reshape(1).to(torch.float32)
    codes = (x.float() / descale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, descale


# --------------------------------------------------------------------------------------
# Implementations: each returns (call, out tensor [B,Sq,Hq,Dv] torch view, notes dict).

def build_impl(name, ctx, causal, tri: TritonFP8):
    import torch
    q, k, v = ctx["q"], ctx["k"], ctx["v"]
    B, Sq, Hq, _ = q.shape
    Dv = v.shape[3]
    sm = ctx["sm_scale"]
    if name in ("zyfa_bf16", "zyfa_fp8"):
        import zyfa_runtime as zr
        out = torch.empty(B, Sq, Hq, Dv, dtype=torch.bfloat16, device=q.device)
        stream = torch.cuda.current_stream()
        o_ref = zr.as_tensor(out)
        if name == "zyfa_bf16":
            qr, kr, vr = zr.as_tensor(q), zr.as_tensor(k), zr.as_tensor(v)
            kw = {}
        else:
            qr, kr, vr = (zr.as_tensor(t.view(torch.uint8), dtype="fp8_e4m3")
                          for t in (ctx["q8"], ctx["k8"], ctx["v8"]))
            kw = dict(descale_q=zr.as_tensor(ctx["dq"]), descale_k=zr.as_tensor(ctx["dk"]),
                      descale_v=zr.as_tensor(ctx["dv"]))

        def call():
            zr.flash_attn_func(qr, kr, vr, causal=causal, softmax_scale=sm, out=o_ref,
                               stream=stream, **kw)
        return call, out, {}
    if name in ("sdpa_cudnn", "sdpa_flash"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
        backend = SDPBackend.CUDNN_ATTENTION if name == "sdpa_cudnn" else SDPBackend.FLASH_ATTENTION
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        gqa = q.shape[2] != k.shape[2]
        holder = {}

        def call():
            with sdpa_kernel(backends=[backend]):
                holder["o"] = F.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=causal, scale=sm, enable_gqa=gqa)
        call()
        torch.cuda.synchronize()
        return call, holder["o"].transpose(1, 2), {"enable_gqa": gqa}
    if name in ("cudnn_fe_bf16", "cudnn_fe_fp8"):
        from bench import cudnn_frontend
        if name == "cudnn_fe_bf16":
            g = cudnn_frontend.Graph(q, k, v, causal, sm)
        else:
            g = cudnn_frontend.Graph(ctx["q8"], ctx["k8"], ctx["v8"], causal, sm,
                                     descales=(ctx["dq"], ctx["dk"], ctx["dv"]))
        return g.run, g.out, g.notes()
    if name == "triton_fp8":
        out = torch.empty(B, Sq, Hq, Dv, dtype=torch.bfloat16, device=q.device)
        call, notes = tri.make(ctx["q8"], ctx["k8"], ctx["v8"], ctx["dq"], ctx["dk"], ctx["dv"],
                               out, causal, sm)
        notes["v_layout"] = "[B,Hkv,D,Sk] prepared outside the timed region"
        return call, out, notes
    raise ValueError(name)


def point_context(shape, seed: int, real=None) -> dict:
    """One point's tensors: bf16 Q, K, V (Gaussian from ``seed``, or tiled from captured
    activations ``real``), their e4m3 codes with per-tensor descales, and the softmax scale."""
    import torch
    B, Hq, Hkv, S, dqk, dv = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    if real is not None:
        q, k, v = (torch.from_numpy(x).to(dev).to(torch.bfloat16) for x in tile_real(real, shape))
        sm = 0.125   # the model's own scale (the derived d128 heads too, as in the study)
    else:
        q = torch.randn(B, S, Hq, dqk, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
        k = torch.randn(B, S, Hkv, dqk, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
        v = torch.randn(B, S, Hkv, dv, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
        sm = 1.0 / math.sqrt(dqk)
    (q8, dq), (k8, dk), (v8, dvs) = (quantise(t) for t in (q, k, v))
    return dict(q=q, k=k, v=v, q8=q8, k8=k8, v8=v8, dq=dq, dk=dk, dv=dvs, sm_scale=sm)


def run_point(shape, causal, impls, args, sampler, tri):
    import torch
    dqk, dv = shape[4:]
    ctx = point_context(shape, args.seed, args.real)
    q, k, v, sm = ctx["q"], ctx["k"], ctx["v"], ctx["sm_scale"]
    q8, dq_, k8, dk_, v8, dv_ = (ctx[n] for n in ("q8", "dq", "k8", "dk", "v8", "dv"))
    rows_t, ref_bf = ref_slice(q, k, v, causal, sm, args.ref_heads)
    deq = [c.float() * d for c, d in ((q8, dq_), (k8, dk_), (v8, dv_))]
    _, ref_fp8 = ref_slice(*deq, causal, sm, args.ref_heads)
    del deq
    fl = flops(shape, causal)
    results, calls = {}, {}

    def missing(name, e):
        msg = str(e).strip().splitlines()
        results[name] = {"status": "missing",
                         "reason": _clean(f"{type(e).__name__}: {msg[0][:300] if msg else ''}")}
        print(_clean(traceback.format_exc()[-3000:]), file=sys.stderr, flush=True)
        try:
            torch.cuda.synchronize()
        except Exception as e2:   # noqa: BLE001
            results[name]["after_error"] = f"{type(e2).__name__}: {e2}"

    # Each implementation built and checked once (its output poisoned first)...
    for name in impls:
        r = results[name] = {"status": "ok"}
        try:
            if name == "triton_fp8" and dqk != dv:
                raise NotImplementedError(f"unsupported: triton_fp8 needs d_qk == d_v (got {dqk}/{dv})")
            call, out, notes = build_impl(name, ctx, causal, tri)
            r.update(notes)
            if name not in ("sdpa_cudnn", "sdpa_flash"):   # SDPA allocates its own output
                poison(out)                                 # unwritten elements show as NaN
                call()
            torch.cuda.synchronize()
            out = dequantised(out, notes.get("out_scale"))
            r["nan_count"] = int(torch.isnan(out).sum().item())
            if name in FP8_IMPLS:
                r["rel_err"] = rel_err(out, rows_t, ref_fp8)
                r["rel_err_vs_bf16_ref"] = rel_err(out, rows_t, ref_bf)
            else:
                r["rel_err"] = rel_err(out, rows_t, ref_bf)
            del out
            calls[name] = call
        except Exception as e:   # noqa: BLE001
            missing(name, e)
    # ... then timed in rounds, each round every implementation in turn, so that each sees the
    # card's clocks and temperature of every phase of the point alike.  Where one of them
    # calls in under --graph-below-ms, eager events would time host launch gaps beside the
    # kernels (short prompts), so every implementation of the point is timed in CUDA graphs.
    graph = graph_timed([warm_up(c, args.warm_s) for c in calls.values()], args.graph_below_ms)
    timings = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name in list(timings):
            try:
                timings[name].append(time_call(calls[name], args.min_s, args.warm_s, sampler,
                                               graph=graph))
            except Exception as e:   # noqa: BLE001
                missing(name, e)
                del timings[name]
    for name, ts in timings.items():
        r = results[name]
        r.update(combine_rounds(ts))
        tflops = lambda ms: fl / (ms * 1e-3) / 1e12   # noqa: E731
        r["tflops"] = tflops(r["median_ms"])
        r["round_tflops"] = [round(tflops(t["median_ms"]), 1) for t in ts]
        r.update(energy_metrics(r["tflops"], r))
    for name in impls:
        r = results[name]
        status = (f"{r['tflops']:7.1f} TFLOP/s err {r['rel_err']:.2e} "
                  f"{_fmt(r.get('watts'), '.0f')} W {_fmt(r.get('sm_clock_mhz'), '.0f')} MHz"
                  + (f"  rounds {' '.join(f'{t:.0f}' for t in r['round_tflops'])}" if len(r["round_tflops"]) > 1 else "")
                  if r["status"] == "ok" else f"MISSING ({r['reason']})")
        print(f"  {name:11s} {status}", flush=True)
    del ctx, q, k, v, q8, k8, v8
    torch.cuda.empty_cache()
    return {"shape": dict(zip(("B", "Hq", "Hkv", "S", "d_qk", "d_v"), shape)),
            "label": shape_label(shape), "causal": causal, "flop": fl,
            "timing": "graph" if graph else "eager", "impls": results}


def code_objects(arch: str = "sm_90a") -> dict:
    """sha256 of each built zyfa code object the runtime would load for ``arch`` (the manifest
    of ``ZYFA_PREBUILT_DIR`` or the package's): which kernels a run measured, whatever commit
    its label names."""
    try:
        from zyfa_runtime import cache
        manifest = cache.load_manifest()
    except Exception as e:   # noqa: BLE001
        return {"error": _clean(f"{type(e).__name__}: {e}")}
    return {k["name"]: k["sha256"] for k in manifest["kernels"]
            if k.get("built") and k["variant"]["arch"] == arch}


def _clean(text: str) -> str:
    """Error text without directory names (results may be kept in the repository)."""
    return re.sub(r"(?<![\w.])/(?:[\w.+-]+/)+", ".../", text)


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


# --------------------------------------------------------------------------------------
# Reports.

def row_label(point: dict) -> str:
    """A point's shape label in a table, marked "(graph)" where it was timed in CUDA graphs."""
    return point["label"] + (" (graph)" if point.get("timing") == "graph" else "")


def card(data: dict) -> str:
    """The physical GPU a run was on (NVML's serial, else its UUID; runs before these were
    recorded: unknown), so that runs on one card and on several can be told apart."""
    g = data.get("gpu", {})
    for key in ("serial", "uuid"):
        v = g.get(key)
        if v and not str(v).startswith("error"):
            return str(v)
    return "unknown"


def markdown(data) -> str:
    impls = data["impls"]
    lines = [f"# zyfa vs peers -- {data['gpu'].get('name', '?')}", "",
             f"commit {data.get('commit')}, {data['date']}, torch {data['versions'].get('torch')}, "
             f"triton {data['versions'].get('triton')}, driver {data['gpu'].get('driver')}, "
             f"card {card(data)}, "
             f"mode {data['mode']}, {data.get('rounds', 1)} round(s) a point, inputs {data.get('inputs', 'gaussian')}", "",
             "Each cell: TFLOP/s / rel. error / mean W / mean SM MHz "
             "(FP8 errors against the dequantised-input fp64 reference; W only for timed windows "
             f"of {POWER_MIN_WINDOW_S:g} s or more, see --sustained). Points marked (graph): "
             f"some call took under {data.get('graph_below_ms', GRAPH_BELOW_MS):g} ms, so every "
             "implementation there was timed in CUDA graphs (events around each replay, divided "
             "by its calls); the others eagerly, events around each call.", ""]
    lines.append("| shape | causal | " + " | ".join(impls) + " |")
    lines.append("|---|---|" + "---|" * len(impls))
    for p in data["points"]:
        cells = []
        for name in impls:
            r = p["impls"].get(name, {"status": "missing", "reason": "not run"})
            if r["status"] == "ok":
                cells.append(f"{r['tflops']:.0f} / {r['rel_err']:.1e}"
                             f"{' NaN' if r.get('nan_count') else ''} / "
                             f"{_fmt(r.get('watts'), '.0f')} / {_fmt(r.get('sm_clock_mhz'), '.0f')}")
            else:
                cells.append("missing")
        lines.append(f"| {row_label(p)} | {'yes' if p['causal'] else 'no'} | " + " | ".join(cells) + " |")
    missing = [(p["label"], p["causal"], n, r["reason"]) for p in data["points"]
               for n, r in p["impls"].items() if r["status"] != "ok"]
    if missing:
        lines += ["", "Missing:", ""]
        for lab, c, n, why in missing:
            lines.append(f"- {n}, {lab}, {'causal' if c else 'non-causal'}: {why}")
    lines += bar_table(data)
    lines += accuracy_table(data)
    lines += ["", f"TFLOP/J (TFLOP/s per mean W; only for timed windows of {POWER_MIN_WINDOW_S:g} s or more, "
              "as with --sustained):", "",
              "| shape | causal | " + " | ".join(impls) + " |", "|---|---|" + "---|" * len(impls)]
    for p in data["points"]:
        cells = [_fmt(p["impls"].get(n, {}).get("tflop_per_j"), ".3f") for n in impls]
        lines.append(f"| {p['label']} | {'yes' if p['causal'] else 'no'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def energy_metrics(tflops: float, t: dict) -> dict:
    """``watts`` and ``tflop_per_j`` of one timed point ``t`` (time_call's result), or None for
    both when its window is shorter than POWER_MIN_WINDOW_S (the board's power reading would
    not yet have followed the load).  W is the energy counter's mean over the window where the
    board has one, else the mean of the samples."""
    if t.get("window_s", 0.0) < POWER_MIN_WINDOW_S:
        return {"watts": None, "tflop_per_j": None}
    w = t.get("power_w_energy") or t.get("power_w")
    return {"watts": w, "tflop_per_j": tflops / w if w else None}


def _ok(point, impl):
    r = point["impls"].get(impl, {})
    return r if r.get("status") == "ok" else None


def bar(point, dtype: str):
    """The bar of one point for ``dtype`` ("fp8" or "bf16"): (peer, TFLOP/s, how) of the fastest
    of the peers measured in this run and the anchors carried into it (each anchor whose own
    peer this run measured is replaced by that measurement), or None where there is neither."""
    shape = tuple(point["shape"][k] for k in ("B", "Hq", "Hkv", "S", "d_qk", "d_v"))
    cands = [(impl, r["tflops"], "measured") for impl in PEER_IMPLS[dtype]
             if (r := _ok(point, impl))]
    for a in ANCHORS.get(shape, {}).get(point["causal"], ()):
        if a.dtype != dtype or (a.impl and _ok(point, a.impl)):
            continue
        for impl, there in a.bridges:
            if r := _ok(point, impl):
                k = r["tflops"] / there
                cands.append((a.peer, a.tflops * k, f"{a.tflops:.0f} x {k:.3f} ({impl})"))
                break
    return max(cands, key=lambda c: c[1]) if cands else None


def bar_table(data) -> list[str]:
    """zyfa against the bar of each point (``bar``), FP8 and BF16."""
    rows = []
    for p in data["points"]:
        cells = []
        for impl, dtype in (("zyfa_fp8", "fp8"), ("zyfa_bf16", "bf16")):
            b = bar(p, dtype)
            r = _ok(p, impl)
            got = f"{r['tflops']:.0f} ({r['tflops'] / b[1]:.2f}x)" if (r and b) else ("missing" if not r else "-")
            cells.append(f"{b[0]} {b[1]:.0f} ({b[2]}) | {got}" if b else f"- | {got}")
        rows.append(f"| {p['label']} | {'yes' if p['causal'] else 'no'} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", "Against the bar: the fastest peer measured in this run, or of the H200 anchors carried "
            "into it (anchor x this run's / the anchor run's figure of the implementation named):", "",
            "| shape | causal | FP8 bar | zyfa_fp8 | BF16 bar | zyfa_bf16 |",
            "|---|---|---|---|---|---|"] + rows


def accuracy_table(data) -> list[str]:
    """zyfa_fp8's error against that of the most accurate FP8 peer of this run whose output is
    bf16 (zyfa's own output type; the cuDNN FP8 graph's e4m3 output on Hopper does not count)."""
    rows = []
    for p in data["points"]:
        z = _ok(p, "zyfa_fp8")
        peers = [(impl, r["rel_err"]) for impl in PEER_IMPLS["fp8"]
                 if (r := _ok(p, impl)) and r.get("output", "bf16") == "bf16" and not r.get("nan_count")]
        if not z or not peers:
            continue
        impl, err = min(peers, key=lambda c: c[1])
        rows.append(f"| {p['label']} | {'yes' if p['causal'] else 'no'} | {z['rel_err']:.2e} | {impl} "
                    f"{err:.2e} | {z['rel_err'] / err:.2f} |")
    if not rows:
        return []
    return ["", "FP8 accuracy against the most accurate FP8 peer with bf16 output in this run "
            "(errors against fp64 on the same dequantised inputs):", "",
            "| shape | causal | zyfa_fp8 | best peer | ratio |", "|---|---|---|---|---|"] + rows


def seqlen_series(data) -> dict:
    """TFLOP/s against sequence length: {(d_qk, d_v, causal): {impl: [(S, TFLOP/s), ...]}} for
    every variant measured at two or more sequence lengths (the points ordered by S)."""
    series: dict = {}
    for p in data["points"]:
        key = (p["shape"]["d_qk"], p["shape"]["d_v"], p["causal"])
        for impl, r in p["impls"].items():
            if r.get("status") == "ok":
                series.setdefault(key, {}).setdefault(impl, []).append((p["shape"]["S"], r["tflops"]))
    out = {}
    for key, impls in series.items():
        if len({s for pts in impls.values() for s, _ in pts}) >= 2:
            out[key] = {impl: sorted(pts) for impl, pts in impls.items()}
    return out


def plot_seqlen(data, out_dir: Path) -> list[str]:
    """One panel per variant (head dims x causal), a line per implementation: TFLOP/s against
    sequence length (``--sweep``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    series = seqlen_series(data)
    if not series:
        return []
    dims = sorted({(k[0], k[1]) for k in series})
    fig, axes = plt.subplots(len(dims), 2, figsize=(11, 3.3 * len(dims)), squeeze=False)
    for i, (dqk, dv) in enumerate(dims):
        for j, causal in enumerate((False, True)):
            ax = axes[i][j]
            for n, impl in enumerate(data["impls"]):    # one colour an implementation in every panel
                pts = series.get((dqk, dv, causal), {}).get(impl)
                if pts:
                    ax.plot([s for s, _ in pts], [t for _, t in pts], marker="o", label=impl, color=f"C{n}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"d {dqk}/{dv}, {'causal' if causal else 'non-causal'}", fontsize=9)
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
    fig.suptitle(f"TFLOP/s against sequence length -- {data['gpu'].get('name', '')} ({data['mode']})")
    fig.tight_layout()
    f = out_dir / "tflops_vs_seqlen.png"
    fig.savefig(f, dpi=110)
    plt.close(fig)
    return [f.name]


def plot(data, out_dir: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    impls = data["impls"]
    for metric, ylabel in (("tflops", "TFLOP/s"), ("tflop_per_j", "TFLOP/J")):
        for causal in (False, True):
            pts = [p for p in data["points"] if p["causal"] == causal]
            if not pts or not any(r.get(metric) for p in pts for r in p["impls"].values()):
                continue
            fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(pts) + 2), 4.5))
            width = 0.8 / len(impls)
            for i, name in enumerate(impls):
                ys = [p["impls"].get(name, {}).get(metric) or 0.0 for p in pts]
                xs = [j + (i - (len(impls) - 1) / 2) * width for j in range(len(pts))]
                ax.bar(xs, ys, width, label=name)
            ax.set_xticks(range(len(pts)))
            ax.set_xticklabels([p["label"] for p in pts], rotation=20, ha="right", fontsize=8)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{ylabel}, {'causal' if causal else 'non-causal'} -- "
                         f"{data['gpu'].get('name', '')} ({data['mode']})")
            ax.legend(fontsize=8)
            ax.grid(axis="y", alpha=0.3)
            fig.tight_layout()
            f = out_dir / f"{metric}_{'causal' if causal else 'noncausal'}.png"
            fig.savefig(f, dpi=120)
            plt.close(fig)
            written.append(f.name)
    return written + plot_seqlen(data, out_dir)


# --------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", help="indices into the shape list (0-based, comma-separated) "
                    "or BxHqxHkvxSxDqkxDv tuples")
    ap.add_argument("--quick", action="store_true", help="S/8 for every shape")
    ap.add_argument("--sweep", action="store_true",
                    help="every head-dim pair over sequence lengths 1k-16k at 16k tokens (SWEEP_*): "
                         "TFLOP/s against sequence length, plotted per variant")
    ap.add_argument("--sustained", action="store_true", help=">= 10 s timed per point")
    ap.add_argument("--causal", choices=["both", "causal", "noncausal"], default="both")
    ap.add_argument("--impls", help="comma-separated subset of " + ",".join(IMPLS))
    ap.add_argument("--min-s", type=float, default=None, help="timed window per point and round (s)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="timed rounds per point, the implementations in turn in each, the median "
                         "reported (default 3; 1 with --sustained)")
    ap.add_argument("--warm-s", type=float, default=0.05)
    ap.add_argument("--graph-below-ms", type=float, default=GRAPH_BELOW_MS,
                    help="time a point in CUDA graphs where any implementation calls in less "
                         "(eager events would count host launch gaps); 0: always eager")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--inputs", choices=["gaussian", "real"], default="gaussian")
    ap.add_argument("--real-npz", type=Path, default=ROOT / "build" / "smollm2_qkv.npz",
                    help="captured activations for --inputs real (bench/real_inputs.py)")
    ap.add_argument("--ref-heads", type=int, default=REF_HEADS,
                    help="query heads in the fp64 reference slice")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    args.real = None
    if args.inputs == "real" and not args.dry_run:
        if not args.real_npz.exists():
            print(f"{args.real_npz} is missing: python bench/real_inputs.py writes it", file=sys.stderr)
            return 2
        with np.load(args.real_npz) as f:
            args.real = {n: f[n] for n in ("q", "k", "v")}
    if args.min_s is None:
        args.min_s = 10.0 if args.sustained else 0.2
    if args.rounds is None:
        args.rounds = 1 if args.sustained else 3
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    mode = ("sweep" if args.sweep else "full") if not args.quick else ("quick sweep" if args.sweep else "quick")
    if args.sustained:
        mode += "+sustained"
    date = _dt.date.today().isoformat()
    out_dir = Path(args.out) if args.out else ROOT / "bench" / "results" / f"{date}_peers"
    points, impls = plan(args)

    print(f"mode {mode}; {args.rounds} round(s) a point, each timed >= {args.min_s} s after a warm-up "
          f">= {args.warm_s} s; out {out_dir}")
    for shape, causal in points:
        notes = []
        if "triton_fp8" in impls and shape[4] != shape[5]:
            notes.append("triton_fp8 unsupported (d_qk != d_v)")
        print(f"  {shape_label(shape):28s} {'causal' if causal else 'non-causal':10s} "
              f"{flops(shape, causal) / 1e12:8.2f} TFLOP  {', '.join(impls)}"
              + (f"  [{'; '.join(notes)}]" if notes else ""))
    if args.dry_run:
        return 0

    import torch
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    sampler = Sampler()
    tri = TritonFP8()
    props = torch.cuda.get_device_properties(0)
    gpu = {"name": props.name, "sm_count": props.multi_processor_count,
           "memory_gib": round(props.total_memory / 2**30, 1),
           "capability": f"{props.major}.{props.minor}"}
    gpu.update(sampler.info())
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "cuda_torch": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                "triton": getattr(triton, "__version__", None) if triton else None,
                "triton_error": _TRITON_ERR}
    try:
        import zyfa_runtime
        versions["zyfa_runtime"] = getattr(zyfa_runtime, "__version__", "present")
    except Exception as e:   # noqa: BLE001
        versions["zyfa_runtime"] = _clean(f"import failed: {type(e).__name__}: {e}")
    versions["zyfa_code_objects"] = code_objects()
    if any(i.startswith("cudnn_fe") for i in impls):
        from bench import cudnn_frontend
        versions.update(cudnn_frontend.versions())
    data = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "commit": args.commit,
            "mode": mode, "min_s": args.min_s, "warm_s": args.warm_s, "rounds": args.rounds, "seed": args.seed,
            "graph_below_ms": args.graph_below_ms,
            "inputs": args.inputs, "softmax_scale": "0.125 (SmolLM2's)" if args.real is not None
            else "1/sqrt(d_qk)",
            "gpu": gpu, "versions": versions, "impls": impls,
            "ref_slice": f"batch 0, query heads 0..{args.ref_heads - 1}, first and last "
                         f"{REF_ROWS} query rows, all keys, fp64",
            "points": []}
    print(json.dumps({"gpu": gpu, "versions": versions}))

    def save():
        (out_dir / "results.json").write_text(json.dumps(data, indent=1))
        (out_dir / "results.md").write_text(markdown(data))

    t_start = time.perf_counter()
    # Everything on one side stream: a CUDA graph is captured on the stream each call was
    # built for (zyfa's calls and the cuDNN frontend's handle keep it), never the legacy one.
    side = torch.cuda.Stream()
    torch.cuda.set_stream(side)
    for shape, causal in points:
        print(f"{shape_label(shape)} {'causal' if causal else 'non-causal'}", flush=True)
        try:
            data["points"].append(run_point(shape, causal, impls, args, sampler, tri))
        except Exception as e:   # noqa: BLE001  (input creation / reference failed)
            data["points"].append({
                "shape": dict(zip(("B", "Hq", "Hkv", "S", "d_qk", "d_v"), shape)),
                "label": shape_label(shape), "causal": causal, "flop": flops(shape, causal),
                "impls": {n: {"status": "missing",
                              "reason": _clean(f"point failed: {type(e).__name__}: {e}")}
                          for n in impls}})
            print(f"  point failed: {e}", flush=True)
            try:
                torch.cuda.empty_cache()
            except Exception:   # noqa: BLE001
                pass
        save()
    data["elapsed_s"] = time.perf_counter() - t_start
    data["triton_configs_chosen"] = {f"d{k[0]}{'_causal' if k[1] else ''}": v
                                     for k, v in tri.chosen.items()}
    save()
    try:
        data["plots"] = plot(data, out_dir)
        save()
    except Exception as e:   # noqa: BLE001
        print(f"plotting failed: {type(e).__name__}: {e}", file=sys.stderr)
    print(markdown(data))
    print(f"wrote {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
