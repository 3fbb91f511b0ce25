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

import ml_dtypes
import numpy as np
import pytest

from tests.backends import using_backend
from tests.emulator.test_emu_fp8 import PBytes

from zyfa_runtime import flash_attn_func, flash_attn_varlen_func, fp8_models, reference
from zyfa_runtime import window as windows
from zyfa_runtime.catalogue import Variant
from zyfa_runtime.selfcheck import RECIPE_FP64_BOUND, bounds

F8 = ml_dtypes.float8_e4m3fn
DIMS = ((64, 64), (128, 128), (192, 128), (256, 256))


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    """variant -> a directory holding the code objects of its head dims, causal and not (a
    call without causal whose window's right bound is 0 runs the causal kernel), built once a
    module."""
    import build
    built = {}

    def get(v: Variant):
        dims = f"fwd_gfx950_fp8_e4m3_d{v.d_qk}x{v.d_v}_"
        if dims not in built:
            out = tmp_path_factory.mktemp(dims)
            assert build.main(["--arch", "gfx950", "--only", dims, "--out", str(out), "--jobs", "1"]) == 0
            built[dims] = out
        return built[dims]
    return get


def quantised(rng, shape, spread=1.0):
    x = rng.standard_normal(shape).astype(np.float32) * spread
    d = np.float32(np.abs(x).max() / 448.0)
    return (x / d).astype(F8), d


def call_window(v: Variant, window) -> tuple[int, int]:
    """``window`` as a call to ``v`` passes it: a causal call's right bound is 0 (or -1)."""
    return (window[0], min(window[1], 0)) if v.causal else tuple(window)


def key_bounds(v: Variant, window, sq: int, sk: int, row: int) -> tuple[int, int]:
    """(lo, hi) of query row ``row`` (any row, past the sequence too, as the kernel takes its
    waves' rows): keys lo .. hi - 1, unclamped below."""
    left, right = windows.normalize(v.causal, window)
    off = sk - sq
    hi = min(row + off + right + 1, sk) if right >= 0 else sk
    return (row + off - left if left >= 0 else 0), max(hi, 0)


def first_block(v, window, sq, sk, x) -> int:
    return max(key_bounds(v, window, sq, sk, 256 * x)[0], 0) // 64


def traced_head(rec: PBytes, v, window, x, y, z, sq, sk):
    """(scores, codes) of query head y of sequence z, rows of query block x, as (sq, sk) arrays
    (-inf and 0 where the kernel computed no block), the blocks of each wave counted from the
    workgroup's first; and per wave the number of blocks it computed."""
    s = np.full((sq, sk), -np.inf, np.float32)
    c = np.zeros((sq, sk), np.uint8)
    kb0 = first_block(v, window, sq, sk, x)
    counts = {}
    for (wg, wave, b), sc in rec.scores.items():
        if wg != (x, y, z):
            continue
        counts[wave] = max(counts.get(wave, 0), b + 1)
        r0, k0 = 256 * x + 32 * wave, 64 * (kb0 + b)
        rows, keys = min(32, sq - r0), min(64, sk - k0)
        if rows <= 0 or keys <= 0:
            continue
        s[r0:r0 + rows, k0:k0 + keys] = sc[:rows, :keys]
        c[r0:r0 + rows, k0:k0 + keys] = rec.codes[(wg, wave, b)][:rows, :keys]
    return s, c, counts


def expected_blocks(v, window, sq, sk, x, wave) -> int:
    """The blocks wave ``wave`` of query block x computes: from the workgroup's first to the
    last its rows' windows meet."""
    hi = key_bounds(v, window, sq, sk, 256 * x + 32 * wave + 31)[1]
    return max(-(-hi // 64) - first_block(v, window, sq, sk, x), 0)


def check(v, out, lse, model, ref):
    """O and the LSE against the model (bounds) and the fp64 reference (the recipe's error)."""
    o_bound, lse_bound = bounds(v)
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    (mo, ml), (ro, _) = model, ref
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert np.array_equal(np.isneginf(lse), np.isneginf(ml)), "rows without keys differ"
    assert np.array_equal(np.abs(mo).max(axis=-1) == 0, np.abs(out).max(axis=-1) == 0), "zero rows differ"
    assert reference.relative_error(out, mo) <= o_bound
    fin = np.isfinite(ml)
    assert not fin.any() or np.abs(lse[fin] - ml[fin]).max() <= lse_bound
    assert reference.relative_error(out, ro) <= RECIPE_FP64_BOUND


def run_dense(prebuilt, v, seed, sq, sk, window, sink_mean=None, b=1, hq=4, hkv=2, per_head=False):
    """One dense call with ``window`` and sinks of mean ``sink_mean`` (None: no sinks), traced;
    checks outputs, every P byte and the blocks each wave computed."""
    window = call_window(v, window)
    rng = np.random.default_rng(zlib.crc32(f"{v.name} {seed}".encode()))
    if per_head:   # one descale a (sequence, key/value head), magnitudes apart by up to 2^3
        spread = np.float32([[1.0, 4.0], [0.5, 2.0]])[:b, :hkv]
        parts = []
        for s, h, d in ((sq, hq, v.d_qk), (sk, hkv, v.d_qk), (sk, hkv, v.d_v)):
            g = h // hkv
            x = rng.standard_normal((b, s, h, d)).astype(np.float32) * np.repeat(spread, g, 1)[:, None, :, None]
            ds = (np.abs(x).reshape(b, s, hkv, g, d).max(axis=(1, 3, 4)) / 448.0).astype(np.float32)
            parts.append(((x / np.repeat(ds, g, 1)[:, None, :, None]).astype(F8), ds))
    else:
        parts = [quantised(rng, (b, sq, hq, v.d_qk), 2.0), quantised(rng, (b, sk, hkv, v.d_qk), 2.0),
                 quantised(rng, (b, sk, hkv, v.d_v))]
    (q, dq), (k, dk), (vv, dv) = parts
    sinks = None if sink_mean is None else (sink_mean + 2 * rng.standard_normal(hq)).astype(np.float32)
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    rec = PBytes(v)
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(prebuilt(v)), ZYFA_EMULATOR_HAZARDS="1",
                       ZYFA_EMULATOR_STRICT_HOST="1") as driver:
        driver.machine.observers.append(rec)
        out = np.full((b, sq, hq, v.d_v), np.nan, ml_dtypes.bfloat16)
        _, lse = flash_attn_func(q, k, vv, causal=v.causal, out=out, return_lse=True, window_size=window,
                                 sinks=sinks, descale_q=np.atleast_1d(dq), descale_k=np.atleast_1d(dk),
                                 descale_v=np.atleast_1d(dv))
        lse = lse.numpy()
        assert driver.hazards.instructions > 0 and not driver.hazards.violations   # it raises on one
    ds = dict(descale_q=dq, descale_k=dk, descale_v=dv, causal=v.causal, softmax_scale=scale,
              window_size=window, sinks=sinks, return_lse=True)
    model = reference.fp8_attention(q, k, vv, recipe="gfx950", **ds)
    ref = reference.attention(q.astype(np.float64), k.astype(np.float64), vv.astype(np.float64), **ds)
    check(v, out, lse, model, ref)
    g = hq // hkv
    for i in range(b):
        for h in range(hq):
            one = (lambda d: d[i, h // g]) if per_head else (lambda d: d)
            for x in range(-(-sq // 256)):
                s, codes, counts = traced_head(rec, v, window, x, h, i, sq, sk)
                assert counts == {w: n for w in range(8)
                                  if (n := expected_blocks(v, window, sq, sk, x, w))}, (x, counts)
                res = fp8_models.head_forward(q[i, :, h], k[i, :, h // g], vv[i, :, h // g], "gfx950",
                                              descale_q=one(dq), descale_k=one(dk), descale_v=one(dv),
                                              causal=v.causal, softmax_scale=scale, scores=s,
                                              window_size=window)
                rows = slice(256 * x, min(256 * x + 256, sq))
                assert np.array_equal(codes[rows], res.p_codes[rows]), (i, h, x)
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
    seq_q, seq_k, hq, hkv = [70, 0, 270, 5], [90, 20, 300, 3], 2, 1
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (seq_q, seq_k))
    (q, dq), (k, dk), (vv, dv) = (quantised(rng, (cu_q[-1], hq, v.d_qk), 2.0),
                                  quantised(rng, (cu_k[-1], hkv, v.d_qk), 2.0),
                                  quantised(rng, (cu_k[-1], hkv, v.d_v)))
    sinks = rng.standard_normal(hq).astype(np.float32)
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(prebuilt(v)), ZYFA_EMULATOR_HAZARDS="1",
                       ZYFA_EMULATOR_STRICT_HOST="1"):
        out = np.full((cu_q[-1], hq, v.d_v), np.nan, ml_dtypes.bfloat16)
        _, lse = flash_attn_varlen_func(q, k, vv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(seq_q),
                                        max_seqlen_k=max(seq_k), causal=v.causal, out=out, return_lse=True,
                                        window_size=window, sinks=sinks, descale_q=np.array([dq]),
                                        descale_k=np.array([dk]), descale_v=np.array([dv]))
        lse = lse.numpy()
    ds = dict(descale_q=dq, descale_k=dk, descale_v=dv, causal=v.causal, softmax_scale=scale, window_size=window,
              sinks=sinks, return_lse=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    model = reference.fp8_attention(q, k, vv, recipe="gfx950", **ds)
    ref = reference.attention(q.astype(np.float64), k.astype(np.float64), vv.astype(np.float64), **ds)
    check(v, out, lse, model, ref)
