"""Paged KV caches in the gfx950 FP8 assembly (``generator/gfx950_fp8.py``: stage_loops and
_paged_setup, the paged copy of the loop, each buffer->LDS load from its 16-row group's page, paged_chunks)
through ``flash_attn_with_kvcache`` on the emulator, as a specification.

Each launch runs through the runtime with code objects built from this checkout's generator,
hazard-checked, with only the call's host tensors valid memory (the strict emulator), outputs
poisoned with NaN first and every cache row no sequence owns NaN (e4m3 0x7f: a row read there
would poison its output), and is compared with

* the ``gfx950`` recipe of ``zyfa_runtime.fp8_models`` over the keys gathered through the page
  table (``reference.kvcache_attention(recipe=...)``): every P byte identical on the kernel's
  own fp32 scores, O and the LSE within ``selfcheck.bounds`` (pages change where keys are read
  from, not the arithmetic);
* the fp64 reference on the dequantised inputs within the recipe's own error (0.05);
* the key blocks each wave computes: those up to its last row's last key, no other.

Page tables are shuffled pages of the cache; sequence 2's first page is sequence 0's (a shared
prefix); entries past a sequence's pages hold -1 (never read).
"""

import zlib

import ml_dtypes
import numpy as np
import pytest

from tests.backends import using_backend
from tests.emulator.fp8_traced import (  # noqa: F401  (prebuilt: a fixture)
    F8, check, check_cache_against_model, check_query_blocks, prebuilt, traced_cache_call, traced_head)

from zyfa_runtime import TensorRef, flash_attn_with_kvcache, fp8_models, reference
from zyfa_runtime import window as windows
from zyfa_runtime.catalogue import Variant

DIMS = ((64, 64), (128, 128), (192, 128), (256, 256))
VARIANTS = [Variant("gfx950", "fp8_e4m3", dq, dv, c) for dq, dv in DIMS for c in (False, True)]
E4M3_NAN = np.uint8(0x7F).view(ml_dtypes.float8_e4m3fn)

#: Keys of three sequences: one over three 64-key blocks (a ragged end), one of none (its rows
#: output zeros), one shorter than its 40 queries (Sq > Sk: causal, its first 10 rows see none).
SEQLENS = np.array([150, 0, 30], np.int32)
SQ, HQ, HKV = 40, 2, 1          # two query heads on one key/value head (GQA)
#: Page size -> the page table's pages a sequence (max_pages page_size >= 150).
PAGES = {16: 10, 64: 3, 256: 1}


def owned(table, page: int, lens=SEQLENS) -> set:
    """The (page, row) pairs some sequence's keys occupy."""
    return {(int(table[b, t // page]), t % page) for b, n in enumerate(lens) for t in range(int(n))}


def inputs(v: Variant, seed: str, page: int, q_rows=None, per_head=False, poison=True):
    """q (3, SQ, HQ, d) dense, or packed (q_rows, HQ, d); caches of 3 max_pages + 2 pages of
    ``page`` rows, a shuffled page table (sequence 2 sharing sequence 0's first page, -1 past
    each sequence's pages); with ``poison`` NaN in every row no sequence owns.  Descales: one
    each, or (``per_head``) one a (sequence, kv head), a few powers of two apart."""
    rng = np.random.default_rng(zlib.crc32(f"{v.name} {seed} {page}".encode()))
    max_pages = PAGES[page]
    num_pages = 3 * max_pages + 2
    qshape = (len(SEQLENS), SQ, HQ, v.d_qk) if q_rows is None else (q_rows, HQ, v.d_qk)
    table = rng.permutation(num_pages)[:3 * max_pages].reshape(3, max_pages).astype(np.int32)
    table[2, 0] = table[0, 0]
    for b, n in enumerate(SEQLENS):
        table[b, -(-int(n) // page):] = -1
    x = [rng.standard_normal(s).astype(np.float32) for s in
         (qshape, (num_pages, page, HKV, v.d_qk), (num_pages, page, HKV, v.d_v))]
    x[0] *= 2.0
    x[1] *= 2.0
    if per_head:
        # q: each sequence's rows scaled by 1, 4, 1/2 and quantised with their own descale; the
        # cache (its pages shared) quantised once, each sequence dequantising it with its own
        # descale, the cache's times 1, 2, 1/2
        x[0] *= np.float32([1.0, 4.0, 0.5])[:, None, None, None]
        dq = np.abs(x[0]).max(axis=(1, 2, 3)) / np.float32(448.0)
        q = (x[0] / dq[:, None, None, None]).astype(F8)
        dk, dv = (np.float32(np.abs(y).max() / 448.0) for y in x[1:])
        k, vv = (x[1] / dk).astype(F8), (x[2] / dv).astype(F8)
        ds = [np.ascontiguousarray(np.broadcast_to((d * np.float32(f))[:, None], (3, HKV)), np.float32)
              for d, f in ((dq, 1.0), (dk, [1.0, 2.0, 0.5]), (dv, [1.0, 2.0, 0.5]))]
    else:
        ds = [np.array([np.abs(y).max() / 448.0], np.float32) for y in x]
        q, k, vv = ((y / d[0]).astype(F8) for y, d in zip(x, ds))
    if poison:
        keep = owned(table, page)
        for pg in range(num_pages):
            for r in range(page):
                if (pg, r) not in keep:
                    k[pg, r], vv[pg, r] = E4M3_NAN, E4M3_NAN
    return q, k, vv, table, dict(zip(("descale_q", "descale_k", "descale_v"), ds))


def check_paged(prebuilt, v: Variant, page: int, packed_lens=None, per_head=False, **call):
    """One call over a paged cache: outputs against the model and fp64; per sequence, head and
    query block, the blocks each wave computed and (without a window) every P byte against the
    model on the kernel's own scores."""
    cu = None if packed_lens is None else np.concatenate([[0], np.cumsum(packed_lens)]).astype(np.int32)
    q, k, vv, table, ds = inputs(v, "dense" if cu is None else "packed", page,
                                 None if cu is None else int(cu[-1]), per_head=per_head)
    out, lse, rec = traced_cache_call(prebuilt, v, q, k, vv, ds, SEQLENS, cu_seqlens_q=cu, page_table=table, **call)
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    one = (lambda d, b: d[b, 0]) if per_head else (lambda d, b: d[0])
    opts = dict(cache_seqlens=SEQLENS, page_table=table, cu_seqlens_q=cu, causal=v.causal,
                softmax_scale=scale, return_lse=True, **call)
    if per_head:   # the model and fp64 per sequence, each with its own descales
        outs = [[], []]
        for b in range(3):
            qb = q[b:b + 1] if cu is None else q[cu[b]:cu[b + 1]]
            o = dict(opts, cache_seqlens=SEQLENS[b:b + 1], page_table=table[b:b + 1],
                     cu_seqlens_q=None if cu is None else np.array([0, len(qb)], np.int32),
                     **{n: one(d, b) for n, d in ds.items()})
            outs[0].append(reference.kvcache_attention(qb, k, vv, recipe="gfx950", **o))
            outs[1].append(reference.kvcache_attention(*(x.astype(np.float64) for x in (qb, k, vv)), **o))
        model, ref = ((np.concatenate([m[0] for m in r]), np.concatenate([m[1] for m in r]))
                      for r in outs)
    else:
        opts.update({n: d[0] for n, d in ds.items()})
        model = reference.kvcache_attention(q, k, vv, recipe="gfx950", **opts)
        ref = reference.kvcache_attention(*(x.astype(np.float64) for x in (q, k, vv)), **opts)
    check(v, out, lse, model, ref)
    window = call.get("window_size", windows.NONE)
    kg, _ = reference.gather_cache(k, SEQLENS, table)
    vg, cu_k = reference.gather_cache(vv, SEQLENS, table)
    for b, sk in enumerate(int(n) for n in SEQLENS):
        qb = q[b] if cu is None else q[cu[b]:cu[b + 1]]
        sq = len(qb)
        keys = slice(int(cu_k[b]), int(cu_k[b + 1]))
        for h in range(HQ):
            # no key: no block computed (the blocks); the window's bytes: features' tests
            model_codes = None if not sk or "sinks" in call or "window_size" in call else (
                lambda s: fp8_models.head_forward(qb[:, h], kg[keys, h // (HQ // HKV)], vg[keys, h // (HQ // HKV)],
                                                  "gfx950", causal=v.causal, softmax_scale=scale, scores=s,
                                                  **{n: one(d, b) for n, d in ds.items()}).p_codes)
            check_query_blocks(v, window, sq, sk, lambda x: traced_head(rec, v, window, x, h, b, sq, sk),
                               model_codes, (b, h))
    out = np.asarray(out, np.float64)
    rows_of = (lambda b: out[b]) if cu is None else (lambda b: out[cu[b]:cu[b + 1]])
    if "sinks" not in call:
        assert (rows_of(1) == 0).all()                                # no keys: zeros
        if v.causal and rows_of(2).shape[0] > 30:                     # Sq > Sk: rows before the first key
            assert (rows_of(2)[:rows_of(2).shape[0] - 30] == 0).all()


def _slow_unless(quick: bool):
    return () if quick else pytest.mark.slow


#: The default run's case: d64 causal, pages of 16 (a 64-key block over four pages).
QUICK = (64, 64, True, 16)


@pytest.mark.parametrize("v,page", [pytest.param(v, page, id=f"{v.name}-page{page}",
                                                 marks=_slow_unless((v.d_qk, v.d_v, v.causal, page) == QUICK))
                                    for v in VARIANTS for page in PAGES])
def test_a_paged_cache_reads_each_key_from_its_page_through_a_shuffled_table(prebuilt, v, page):
    check_paged(prebuilt, v, page)


@pytest.mark.slow
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_packed_queries_over_a_paged_cache_are_each_sequences_newest_positions(prebuilt, v, page):
    """Query lengths 7, 3 and 40 (the last longer than its 30 keys)."""
    check_paged(prebuilt, v, page, packed_lens=[7, 3, 40])


@pytest.mark.slow
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_a_window_and_sinks_over_a_paged_cache(prebuilt, v):
    """The window's first block (kb0 > 0 for sequence 0's rows) is found in its page like any
    other; the window's bounds follow each sequence's own count."""
    check_paged(prebuilt, v, 16, window_size=(70, 0 if v.causal else 9), sinks=np.array([0.5, 3.0], np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_descales_per_sequence_over_a_paged_cache(prebuilt, v):
    """descale_q/k/v (B, Hkv), a different value for each sequence (its queries' magnitudes and
    the factors 1, 2, 0.5 on the shared cache's): every P byte is the recipe's for that sequence."""
    check_paged(prebuilt, v, 64, per_head=True)


@pytest.mark.slow
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_unread_cache_seqlens_and_page_table_are_clamped_to_the_cache(prebuilt, v, page):
    """check_cache_seqlens=False: counts and pages are never read back; garbage (counts below 0
    and past the pages, page indices below 0 and past the cache) must not take an access outside
    the tensors (the strict emulator) and gives what the values clamped to [0, max_pages
    page_size] and [0, num_pages - 1] give."""
    q, k, vv, table, ds = inputs(v, "garbage", page, poison=False)
    num_pages = k.shape[0]
    seqlens = np.array([1 << 30, -5, 30], np.int32)
    table[0, :] = np.arange(PAGES[page]) % num_pages
    table[0, 0], table[0, -1], table[2, 0] = -(1 << 30), 1 << 30, num_pages
    out, lse, _ = traced_cache_call(prebuilt, v, q, k, vv, ds, seqlens, page_table=table, check_cache_seqlens=False)
    check_cache_against_model(v, out, lse, q, k, vv, cache_seqlens=np.clip(seqlens, 0, PAGES[page] * page),
                              page_table=np.clip(table, 0, num_pages - 1), causal=v.causal, return_lse=True,
                              softmax_scale=float(np.float32(1 / np.sqrt(v.d_qk))), **{n: d[0] for n, d in ds.items()})


def test_a_cache_whose_pages_lie_4_gib_apart_or_more_is_refused_before_launch(prebuilt):
    """The paged loads multiply a page by a 32-bit page stride (plan.PAGE_STRIDE_LIMIT):
    a cache viewed with pages 2^32 bytes apart gives a clear ValueError and launches nothing."""
    v = Variant("gfx950", "fp8_e4m3", 64, 64, True)
    q, k, vv, table, ds = inputs(v, "page stride", 16, poison=False)
    apart = TensorRef(ptr=k.ctypes.data, shape=k.shape, strides=(2**32,) + k.strides[1:],
                      dtype="fp8_e4m3", device=("cpu", 0))
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(prebuilt(v))) as driver:
        launched = driver.machine.instructions
        with pytest.raises(ValueError, match="page stride of 4294967296 bytes"):
            flash_attn_with_kvcache(q, apart, vv, cache_seqlens=SEQLENS, page_table=table, causal=True, **ds)
        assert driver.machine.instructions == launched
