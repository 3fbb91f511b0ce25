"""KV caches in the gfx950 BF16 kernels (hip/flash_fwd.hip: cache_seqlens gives each sequence
its key count, clamped to its part of the cache; page_table selects the paged copy, each 16-row
group of keys read from its page, every page index clamped to the cache) through
flash_attn_with_kvcache on the emulator, against the float64 reference
(reference.kvcache_attention: the keys gathered from the cache, bottom-right aligned queries).

Bounds: those of the plain BF16 kernels (``zyfa_runtime.selfcheck``: O relative error <= 8e-3,
LSE absolute error <= 1e-3): a cache changes where keys are read from, not the arithmetic.
Outputs are poisoned with NaN first; rows that see no key (a sequence of 0 keys, causal rows
before a short sequence's first key) must come back as zeros with an LSE of -inf.
"""

import zlib

import ml_dtypes
import numpy as np
import pytest

from emukit import PREBUILT, bf16, built_with, compare, emulator  # noqa: F401 (emulator: a fixture)
from tests.backends import using_backend
from tests.sweeps import sweep

from zyfa_runtime import flash_attn_with_kvcache, reference
from zyfa_runtime.catalogue import Variant

DIMS = ((64, 64), (128, 128), (192, 128), (256, 256))
VARIANTS = [Variant("gfx950", "bf16", dq, dv, causal) for dq, dv in DIMS for causal in (False, True)]
#: The default run's variant per test (every variant with -m slow).
QUICK_ONE = {(64, 64, True)}


pytestmark = pytest.mark.skipif(not built_with(VARIANTS, ("kvcache", "paged_kv")),
                                reason="gfx950 BF16 code objects with KV caches not built "
                                       "(python build.py --arch gfx950 --only bf16)")


def rng_of(v: Variant, seed: int):
    return np.random.default_rng(zlib.crc32(v.name.encode()) + seed)


#: Keys of three sequences: one longer than a 128-key tile (two tiles, a ragged end), one of
#: none (its rows output zeros), one shorter than its 40 queries (causal: its first 10 rows see
#: no key).
SEQLENS = np.array([150, 0, 30], np.int32)
SQ, HQ, HKV = 40, 2, 1   # two query heads on one key/value head (GQA)


def queries(v: Variant, rng, packed_lens=None):
    """q dense (3, SQ, HQ, d), or packed (sum(packed_lens), HQ, d) with cu_seqlens_q."""
    if packed_lens is None:
        return bf16(rng.standard_normal((len(SEQLENS), SQ, HQ, v.d_qk))), None
    cu = np.concatenate([[0], np.cumsum(packed_lens)]).astype(np.int32)
    return bf16(rng.standard_normal((int(cu[-1]), HQ, v.d_qk))), cu


def paged_cache(v: Variant, rng, page: int, max_pages: int, num_pages: int, lens=SEQLENS):
    """Caches of ``num_pages`` pages of ``page`` rows, and a page table whose rows are shuffled
    pages of the cache; sequence 2 shares sequence 0's first page (a common prefix: its first
    keys are sequence 0's)."""
    k = bf16(rng.standard_normal((num_pages, page, HKV, v.d_qk)))
    vv = bf16(rng.standard_normal((num_pages, page, HKV, v.d_v)))
    table = rng.permutation(num_pages)[:len(lens) * max_pages].reshape(len(lens), max_pages).astype(np.int32)
    table[2, 0] = table[0, 0]
    return k, vv, table


def check(v: Variant, q, k_cache, v_cache, cache_seqlens, page_table=None, cu_seqlens_q=None, **kw):
    """flash_attn_with_kvcache into a NaN-poisoned output against the reference; (O, LSE)."""
    out = np.full(q.shape[:-1] + (v_cache.shape[-1],), np.nan, ml_dtypes.bfloat16)
    packed = {} if cu_seqlens_q is None else dict(cu_seqlens_q=cu_seqlens_q,
                                                  max_seqlen_q=int(np.diff(cu_seqlens_q).max()))
    _, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table,
                                     causal=v.causal, out=out, return_lse=True, **packed, **kw)
    ref_o, ref_lse = reference.kvcache_attention(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                                 page_table=page_table, cu_seqlens_q=cu_seqlens_q,
                                                 causal=v.causal, return_lse=True, **kw)
    compare(out, lse.numpy(), ref_o, ref_lse)
    return out.astype(np.float64), np.asarray(lse.numpy(), np.float64)


@pytest.mark.parametrize("v", sweep(VARIANTS, quick=QUICK_ONE))
def test_a_contiguous_cache_gives_each_sequence_its_first_cache_seqlens_keys(emulator, v):
    rng = rng_of(v, 1)
    q, _ = queries(v, rng)
    k = bf16(rng.standard_normal((3, 160, HKV, v.d_qk)))
    vv = bf16(rng.standard_normal((3, 160, HKV, v.d_v)))
    # the rows past cache_seqlens are never read: NaN and inf there change nothing
    k[0, 150:], vv[0, 150:], k[1], k[2, 30:] = np.nan, np.nan, np.nan, np.inf
    o, lse = check(v, q, k, vv, SEQLENS)
    assert (o[1] == 0).all() and np.isneginf(lse[1]).all()          # no keys: zeros, -inf
    if v.causal:                                                     # 40 queries over 30 keys
        assert (o[2, :10] == 0).all() and np.isfinite(lse[2, :, 10:]).all()


#: Page sizes per case: 16 (a 128-key tile spans 8 pages), 64, 256 (a page spans tiles).
PAGES = {16: 10, 64: 3, 256: 1}


@pytest.mark.parametrize("v", sweep(VARIANTS, quick=QUICK_ONE))
@pytest.mark.parametrize("page", [pytest.param(p, marks=() if p == 16 else pytest.mark.slow) for p in PAGES])
def test_a_paged_cache_reads_each_key_from_its_page_through_a_shuffled_table(emulator, v, page):
    rng = rng_of(v, 2)
    q, _ = queries(v, rng)
    max_pages = PAGES[page]
    k, vv, table = paged_cache(v, rng, page, max_pages, num_pages=3 * max_pages + 2)
    # entries past a sequence's pages are never read (-1 there)
    table[0, -(-150 // page):] = -1
    table[1, :] = -1
    table[2, -(-30 // page):] = -1
    o, lse = check(v, q, k, vv, SEQLENS, table)
    assert (o[1] == 0).all() and np.isneginf(lse[1]).all()
    assert np.array_equal(table[2, 0], table[0, 0])                 # a shared first page


@pytest.mark.parametrize("v", sweep(VARIANTS, quick={(128, 128, False)}))
@pytest.mark.parametrize("cache", ["paged", pytest.param("contiguous", marks=pytest.mark.slow)])
def test_packed_queries_over_a_cache_are_each_sequences_newest_positions(emulator, v, cache):
    # query lengths 7, 3 and 40 (the last longer than its 30 keys); pages of 64
    rng = rng_of(v, 3)
    q, cu = queries(v, rng, packed_lens=[7, 3, 40])
    k, vv, table = paged_cache(v, rng, 64, 3, num_pages=11)
    if cache == "contiguous":
        k, vv, table = k[:9].reshape(3, 192, HKV, -1), vv[:9].reshape(3, 192, HKV, -1), None
    check(v, q, k, vv, SEQLENS, table, cu_seqlens_q=cu)


@pytest.mark.slow
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_a_window_and_sinks_over_a_paged_cache(emulator, v):
    rng = rng_of(v, 4)
    q, _ = queries(v, rng)
    k, vv, table = paged_cache(v, rng, 16, 10, num_pages=33)
    check(v, q, k, vv, SEQLENS, table, window_size=(60, 0 if v.causal else 9), softcap=12.0,
          sinks=np.array([0.5, 3.0], np.float32))


@pytest.mark.parametrize("v", sweep(VARIANTS, quick=QUICK_ONE))
def test_unread_cache_seqlens_and_page_table_are_clamped_to_the_cache(v):
    """check_cache_seqlens=False: the values are never read back; garbage (counts below 0 and
    past the cache, page indices below 0 and past it) must not take an access outside the
    tensors (the strict emulator: no fallback to the process's memory), and gives what the
    clamped values give: counts to [0, max_pages page_size], pages to [0, num_pages - 1]."""
    rng = rng_of(v, 5)
    q, _ = queries(v, rng)
    k, vv, table = paged_cache(v, rng, 16, 10, num_pages=31)
    seqlens = np.array([1 << 30, -5, 77], np.int32)
    table[0, 3], table[0, 7], table[2, 2] = -(1 << 30), 1 << 30, 31
    clamped = np.clip(table, 0, 30)
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(PREBUILT), ZYFA_EMULATOR_STRICT_HOST="1"):
        out = np.full(q.shape[:-1] + (v.d_v,), np.nan, ml_dtypes.bfloat16)
        _, lse = flash_attn_with_kvcache(q, k, vv, cache_seqlens=seqlens, page_table=table, causal=v.causal,
                                         out=out, return_lse=True, check_cache_seqlens=False)
    ref_o, ref_lse = reference.kvcache_attention(q, k, vv, cache_seqlens=np.clip(seqlens, 0, 160),
                                                 page_table=clamped, causal=v.causal, return_lse=True)
    compare(out, lse.numpy(), ref_o, ref_lse)


@pytest.mark.slow
def test_a_captured_paged_call_reads_the_cache_seqlens_and_page_table_of_each_replay():
    """On a stream being captured nothing is read back (check_cache_seqlens=False): each replay
    takes the counts and pages the device buffers hold then, and is right for them; the same
    call outside a capture, of the same tensors, is planned once and queued again."""
    from zyfa_runtime import plan
    from zyfa_runtime.memory import DeviceArray, to_device
    v = Variant("gfx950", "bf16", 64, 64, True)
    rng = rng_of(v, 6)
    q, _ = queries(v, rng)
    k, vv, table = paged_cache(v, rng, 16, 10, num_pages=33)
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(PREBUILT), ZYFA_EMULATOR_STRICT_HOST="1") as drv:
        dq, dk, dv = (to_device(drv, 0, x, "bf16") for x in (q, k, vv))
        lens, pages = DeviceArray(drv, 0, (3,), "int32"), DeviceArray(drv, 0, table.shape, "int32")
        out, lse = DeviceArray(drv, 0, q.shape, "bf16"), DeviceArray(drv, 0, (3, HQ, SQ), "float32")
        kw = dict(cache_seqlens=lens, page_table=pages, causal=True, out=out, lse=lse, return_lse=True,
                  check_cache_seqlens=False)
        drv.begin_capture(4)
        try:
            flash_attn_with_kvcache(dq, dk, dv, stream=4, **kw)
        finally:
            graph = drv.end_capture(4)
        assert drv.launches == 0 and [op[0] for op in graph.ops] == ["launch"]

        def fill(arr, host):
            drv.copy_htod(arr.ptr, memoryview(np.ascontiguousarray(host).reshape(-1).view(np.uint8)))
        for n, t in ((SEQLENS, table), (np.array([7, 160, 99], np.int32), table[::-1].copy())):
            fill(lens, n)
            fill(pages, t)
            drv.memset_d8(out.ptr, 0xFF, out.nbytes)
            graph.replay()
            ref = reference.kvcache_attention(q, k, vv, cache_seqlens=n, page_table=t, causal=True, return_lse=True)
            compare(out.numpy(), lse.numpy(), *ref)
        graph.release()
        before = len(plan._plans)
        for _ in range(2):
            drv.memset_d8(out.ptr, 0xFF, out.nbytes)
            flash_attn_with_kvcache(dq, dk, dv, **kw)
            compare(out.numpy(), lse.numpy(), *ref)
        assert len(plan._plans) == before + 1                        # kept once, queued again
