"""Contiguous KV caches in the gfx950 FP8 assembly (``generator/gfx950_fp8.py``: stage_cache,
sequence b's key count ``clamp(cache_seqlens[b], 0, seqlen_k)`` where the pointer is not null)
through ``flash_attn_with_kvcache`` on the emulator, as a specification.

Each launch runs through the runtime with code objects built from this checkout's generator,
hazard-checked, with only the call's host tensors valid memory (the strict emulator), outputs
poisoned with NaN first, the cache's rows past each sequence's count NaN (e4m3 0x7f: a row read
there would poison its output), and is compared with

* the ``gfx950`` recipe of ``zyfa_runtime.fp8_models`` over the keys gathered from the cache
  (``reference.kvcache_attention(recipe=...)``): every P byte identical on the kernel's own
  fp32 scores, O and the LSE within ``selfcheck.bounds`` (a cache changes where keys are read
  from and how many, not the arithmetic);
* the fp64 reference on the dequantised inputs within the recipe's own error (0.05);
* the key blocks each wave computes: those up to its last row's last key, no other.

Rows that see no key (a sequence of 0 keys; causal rows before a short sequence's first key)
come back as zeros with an LSE of -inf, exactly where the model has them.
"""

import zlib

import ml_dtypes
import numpy as np
import pytest

from tests.emulator.fp8_traced import (  # noqa: F401  (prebuilt: a fixture)
    check_cache_against_model, check_query_blocks, prebuilt, quantised, traced_cache_call, traced_head)
from tests.sweeps import sweep

from zyfa_runtime import fp8_models
from zyfa_runtime import window as windows
from zyfa_runtime.catalogue import Variant

DIMS = ((64, 64), (128, 128), (192, 128), (256, 256))
VARIANTS = [Variant("gfx950", "fp8_e4m3", dq, dv, c) for dq, dv in DIMS for c in (False, True)]
E4M3_NAN = np.uint8(0x7F).view(ml_dtypes.float8_e4m3fn)

#: Keys of three sequences in a cache of 160 rows each: one over two 64-key blocks (a ragged
#: third), one of none (its rows output zeros), one shorter than its 40 queries (Sq > Sk:
#: causal, its first 10 rows see no key).
SEQLENS = np.array([150, 0, 30], np.int32)
CACHE_ROWS, SQ, HQ, HKV = 160, 40, 2, 1     # two query heads on one key/value head (GQA)


def inputs(v: Variant, seed: str, q_rows=None, poison=True):
    """q (3, SQ, HQ, d) dense, or packed (q_rows, HQ, d); contiguous caches (3, CACHE_ROWS, HKV, d),
    with ``poison`` NaN past each sequence's count; one descale each."""
    rng = np.random.default_rng(zlib.crc32(f"{v.name} {seed}".encode()))
    qshape = (len(SEQLENS), SQ, HQ, v.d_qk) if q_rows is None else (q_rows, HQ, v.d_qk)
    (q, dq), (k, dk), (vv, dv) = (quantised(rng, qshape, 2.0),
                                  quantised(rng, (len(SEQLENS), CACHE_ROWS, HKV, v.d_qk), 2.0),
                                  quantised(rng, (len(SEQLENS), CACHE_ROWS, HKV, v.d_v)))
    for b, n in enumerate(SEQLENS if poison else ()):
        k[b, n:], vv[b, n:] = E4M3_NAN, E4M3_NAN
    return q, k, vv, dict(descale_q=np.array([dq]), descale_k=np.array([dk]), descale_v=np.array([dv]))


def check_cache(prebuilt, v: Variant, packed_lens=None):
    """One call over the contiguous cache (dense queries, or packed ones of ``packed_lens``):
    outputs against the model and fp64; per sequence, head and query block, the blocks each wave
    computed and every P byte against the model on the kernel's own scores."""
    cu = None if packed_lens is None else np.concatenate([[0], np.cumsum(packed_lens)]).astype(np.int32)
    q, k, vv, ds = inputs(v, "dense" if cu is None else "packed", None if cu is None else int(cu[-1]))
    out, lse, rec = traced_cache_call(prebuilt, v, q, k, vv, ds, SEQLENS, cu_seqlens_q=cu)
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    check_cache_against_model(v, out, lse, q, k, vv, cache_seqlens=SEQLENS, cu_seqlens_q=cu, causal=v.causal,
                              softmax_scale=scale, return_lse=True, **{n: d[0] for n, d in ds.items()})
    for b, sk in enumerate(int(n) for n in SEQLENS):
        qb = q[b] if cu is None else q[cu[b]:cu[b + 1]]
        sq = len(qb)
        for h in range(HQ):
            # no key: no block computed (the blocks), zeros and -inf (check), no byte to compare
            model_codes = None if not sk else (
                lambda s: fp8_models.head_forward(qb[:, h], k[b, :sk, h // (HQ // HKV)], vv[b, :sk, h // (HQ // HKV)],
                                                  "gfx950", causal=v.causal, softmax_scale=scale, scores=s,
                                                  **{n: d[0] for n, d in ds.items()}).p_codes)
            check_query_blocks(v, windows.NONE, sq, sk, lambda x: traced_head(rec, v, windows.NONE, x, h, b, sq, sk),
                               model_codes, (b, h))
    out = np.asarray(out, np.float64)
    rows_of = (lambda b: out[b]) if cu is None else (lambda b: out[cu[b]:cu[b + 1]])
    assert (rows_of(1) == 0).all()                                    # no keys: zeros
    if v.causal and rows_of(2).shape[0] > 30:                         # Sq > Sk: rows before the first key
        assert (rows_of(2)[:rows_of(2).shape[0] - 30] == 0).all()


@pytest.mark.parametrize("v", sweep(VARIANTS, quick={(64, 64, True)}))
def test_a_contiguous_cache_gives_each_sequence_its_first_cache_seqlens_keys(prebuilt, v):
    check_cache(prebuilt, v)


@pytest.mark.slow
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_packed_queries_over_a_contiguous_cache_are_each_sequences_newest_positions(prebuilt, v):
    """Query lengths 7, 3 and 40 (the last longer than its 30 keys)."""
    check_cache(prebuilt, v, packed_lens=[7, 3, 40])


@pytest.mark.slow
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_a_window_and_sinks_over_a_contiguous_cache(prebuilt, v):
    """The window's bounds follow each sequence's own count (bottom-right aligned to it)."""
    q, k, vv, ds = inputs(v, "window")
    window = (20, 0 if v.causal else 9)
    sinks = np.array([0.5, 3.0], np.float32)
    out, lse, _ = traced_cache_call(prebuilt, v, q, k, vv, ds, SEQLENS, window_size=window, sinks=sinks)
    check_cache_against_model(v, out, lse, q, k, vv, cache_seqlens=SEQLENS, causal=v.causal,
                              softmax_scale=float(np.float32(1 / np.sqrt(v.d_qk))), window_size=window,
                              sinks=sinks, return_lse=True, **{n: d[0] for n, d in ds.items()})


@pytest.mark.slow
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_unread_cache_seqlens_are_clamped_to_the_cache(prebuilt, v):
    """check_cache_seqlens=False: the counts are never read back; garbage (below 0, past the
    cache) must not take an access outside the tensors (the strict emulator) and gives what the
    counts clamped to [0, CACHE_ROWS] give."""
    q, k, vv, ds = inputs(v, "garbage", poison=False)
    seqlens = np.array([1 << 30, -5, 30], np.int32)
    out, lse, _ = traced_cache_call(prebuilt, v, q, k, vv, ds, seqlens, check_cache_seqlens=False)
    check_cache_against_model(v, out, lse, q, k, vv, cache_seqlens=np.clip(seqlens, 0, CACHE_ROWS), causal=v.causal,
                              return_lse=True, softmax_scale=float(np.float32(1 / np.sqrt(v.d_qk))),
                              **{n: d[0] for n, d in ds.items()})
