"""Sliding windows and attention sinks in the gfx950 FP8 assembly (``generator/gfx950_fp8.py``:
stage_window, the masks of both edges, stage_sink) on the emulator, as a specification.

A window's bounds and the sinks pointer are runtime arguments.  Each launch runs through the
runtime, hazard-checked, with only the call's host tensors valid memory, outputs poisoned with
NaN first, and is compared with

* the ``gfx950`` recipe of ``zyfa_runtime.fp8_models`` with the same window and sinks: every P
  byte identical on the kernel's own fp32 scores (a window only turns scores into -inf; the
  left edge's blocks take the plain bytes), O within 4e-3 and the LSE within 1e-4
  (``selfcheck.bounds``: the plain kernels' fp32 accumulation order and bf16 rounding; the
  sink's term adds an fp32 exp2 and two roundings of l, about 2^-22 relative);
* the fp64 reference on the dequantised inputs (``reference.attention`` with the window and
  sinks) within the recipe's own error (0.05);
* the key blocks each wave computes: those from the workgroup's first (the first row's left
  bound) to its own last (its last row's right bound), no other: blocks wholly outside the
  workgroup's windows are never loaded.

Rows that see no key come back as zeros with an LSE of -inf, or with sinks the sink's own LSE,
exactly where the model has them.  The code objects are built from this checkout's sources.
"""

import zlib

import numpy as np
import pytest

from tests.emulator.fp8_traced import (  # noqa: F401  (prebuilt: a fixture)
    call_window, check_against_model, check_packed_call, check_query_blocks, packed_inputs, prebuilt, quantised,
    quantised_per_head, traced_call, traced_head)
from tests.emulator.test_emu_fp8 import PBytes

from zyfa_runtime import flash_attn_func, fp8_models
from zyfa_runtime.catalogue import Variant

DIMS = ((64, 64), (128, 128), (192, 128), (256, 256))


def run_dense(prebuilt, v, seed, sq, sk, window, sink_mean=None, b=1, hq=4, hkv=2, per_head=False):
    """One dense call with ``window`` and sinks of mean ``sink_mean`` (None: no sinks), traced;
    checks outputs, every P byte and the blocks each wave computed."""
    window = call_window(v, window)
    rng = np.random.default_rng(zlib.crc32(f"{v.name} {seed}".encode()))
    if per_head:   # one descale a (sequence, key/value head), magnitudes apart by up to 2^3
        parts = quantised_per_head(rng, b, hkv, ((sq, hq, v.d_qk, 1.0), (sk, hkv, v.d_qk, 1.0),
                                                 (sk, hkv, v.d_v, 1.0)))
    else:
        parts = [quantised(rng, (b, sq, hq, v.d_qk), 2.0), quantised(rng, (b, sk, hkv, v.d_qk), 2.0),
                 quantised(rng, (b, sk, hkv, v.d_v))]
    (q, dq), (k, dk), (vv, dv) = parts
    sinks = None if sink_mean is None else (sink_mean + 2 * rng.standard_normal(hq)).astype(np.float32)
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    rec = PBytes(v)
    out, lse = traced_call(prebuilt, v, rec, flash_attn_func, q, k, vv, causal=v.causal, window_size=window,
                           sinks=sinks, descale_q=np.atleast_1d(dq), descale_k=np.atleast_1d(dk),
                           descale_v=np.atleast_1d(dv))
    check_against_model(v, out, lse, q, k, vv, descale_q=dq, descale_k=dk, descale_v=dv, causal=v.causal,
                        softmax_scale=scale, window_size=window, sinks=sinks, return_lse=True)
    g = hq // hkv
    for i in range(b):
        for h in range(hq):
            one = (lambda d: d[i, h // g]) if per_head else (lambda d: d)
            check_query_blocks(
                v, window, sq, sk, lambda x: traced_head(rec, v, window, x, h, i, sq, sk),
                lambda s: fp8_models.head_forward(q[i, :, h], k[i, :, h // g], vv[i, :, h // g], "gfx950",
                                                  descale_q=one(dq), descale_k=one(dk), descale_v=one(dv),
                                                  causal=v.causal, softmax_scale=scale, scores=s,
                                                  window_size=window).p_codes, (i, h))
    return out, lse


def variants(dims=DIMS):
    """The gfx950 FP8 variants of ``dims``, causal and not."""
    return [Variant("gfx950", "fp8_e4m3", dq, dv, c) for dq, dv in dims for c in (True, False)]


def test_a_causal_window_with_sinks_skips_the_blocks_before_it_and_matches_the_model(prebuilt):
    """d64, causal, window (40, 0) with sinks beside the scores, 80 queries after 220 cached
    keys: the rows' windows start at keys 180..259, so the loop starts at key block 2, the left
    edge cuts blocks 2 to 4, the diagonal blocks 3 and 4, and the sinks join every row."""
    run_dense(prebuilt, Variant("gfx950", "fp8_e4m3", 64, 64, True), 0, 80, 300, (40, 0), sink_mean=0.0,
              hq=2, hkv=1)


#: name: (sq, sk, window, sink mean or None); every case on every variant with -m slow
CASES = {
    "window smaller than the sequence": (300, 330, (40, 25), None),
    "window larger than the sequence (the plain loop)": (150, 130, (500, 400), None),
    "window around the diagonal": (150, 150, (5, 7), None),
    "window leaving rows with no key (sq > sk)": (300, 100, (3, 2), None),
    "left bound only, cutting inside the first block": (120, 200, (10, -1), None),
    "sinks beside the scores": (100, 140, (-1, -1), 0.0),
    "sinks dominating the rows": (100, 140, (-1, -1), 12.0),
    "window and sinks, rows with no key get the sink": (300, 100, (3, 2), 1.0),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("v", variants(), ids=lambda v: v.name)
def test_dense_windows_and_sinks_match_the_model_and_fp64(prebuilt, v, case):
    sq, sk, window, sink = CASES[case]
    run_dense(prebuilt, v, case, sq, sk, window, sink_mean=sink)


@pytest.mark.slow
@pytest.mark.parametrize("v", variants(), ids=lambda v: v.name)
def test_descales_per_sequence_and_head_with_a_window(prebuilt, v):
    """Two sequences x two key/value heads (GQA 2), each (sequence, head) with its own descale,
    under a window and sinks: every P byte is the recipe's for that (sequence, head)."""
    run_dense(prebuilt, v, "descales", 70, 90, (20, 6), sink_mean=0.5, b=2, hq=4, hkv=2, per_head=True)


@pytest.mark.slow
@pytest.mark.parametrize("window", [(30, 0), (30, 10), (-1, 5)])
@pytest.mark.parametrize("v", variants(DIMS[:2]), ids=lambda v: v.name)
def test_packed_windows_and_sinks_are_each_sequences_own(prebuilt, v, window):
    """Packed (cu_seqlens), an empty query sequence among them: each sequence's window is bottom-
    right aligned to its own lengths, the sinks join every row."""
    rng = np.random.default_rng(zlib.crc32(f"packed {v.name} {window}".encode()))
    window = call_window(v, window)
    parts = packed_inputs(rng, v, 2.0)       # two query heads on one key/value head
    check_packed_call(prebuilt, v, parts, window_size=window, sinks=rng.standard_normal(2).astype(np.float32))
