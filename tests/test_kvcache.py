"""flash_attn_with_kvcache: the rules of a KV cache (check_kvcache, one test per rule), and
the runtime's refusal, before anything is loaded or launched, of what a kernel does not
implement (a kernel table without the features, its values checked first); the
gfx950 BF16 kernels run both KV caches (tests/emulator/test_emu_kvcache.py), the gfx950 FP8
kernels both (tests/emulator/test_emu_fp8_kvcache.py, test_emu_fp8_paged.py), the sm_90a serving
kernels both (tests/test_gpu_kvcache.py), and the plan of such a call is checked here (its arguments, its
tensor maps and workspace on sm_90a, the fake driver, with the checkout's manifest)."""

import numpy as np
import pytest

from tests.backends import using_backend
from tests.test_validate import dense, ref, rejects

from zyfa_runtime import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, plan, validate
from zyfa_runtime.api import kernel_table
from zyfa_runtime.catalogue import Variant
from zyfa_runtime.driver.fake import unpack_tensor_map
from zyfa_runtime.launch import unpack_args
from zyfa_runtime.memory import host_dtype
from zyfa_runtime.validate import check_kvcache, features_of

SEQLENS = np.array([40, 0, 33], np.int32)                            # keys of 3 sequences
TABLE = np.array([[4, 1, 0], [-1, -1, -1], [4, 2, 7]], np.int32)   # pages of 16; page 4 shared


def paged(dtype="bf16", page=16, pages=8, b=3, sq=2, hq=4, hkv=2, d=128, **over):
    """A paged call's arguments: q (3, 2, 4, 128), caches of 8 pages of 16 rows, page_table
    (3, 3), the values of cache_seqlens and page_table as read back."""
    args = dict(q=ref((b, sq, hq, d), dtype, 0), k_cache=ref((pages, page, hkv, d), dtype, 1),
                v_cache=ref((pages, page, hkv, d), dtype, 2), out=ref((b, sq, hq, d), "bf16", 3),
                cache_seqlens=ref((b,), "int32", 4), page_table=ref((b, 3), "int32", 5),
                cache_values=SEQLENS[:b], table_values=TABLE[:b])
    args.update(over)
    return args


def contiguous_cache(b=3, sk=48, **over):
    args = paged(b=b, page_table=None, table_values=None, k_cache=ref((b, sk, 2, 128), "bf16", 1),
                 v_cache=ref((b, sk, 2, 128), "bf16", 2))
    args.update(over)
    return args


def test_a_paged_call_is_a_problem_of_pages():
    p = check_kvcache(**paged(causal=True, return_lse=True, lse=ref((3, 4, 2), "float32", 6)))
    assert (p.kvcache, p.page_size, p.num_pages, p.max_pages) == ("paged", 16, 8, 3)
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.total_q, p.total_k, p.causal) == (3, 2, 48, 6, 128, True)
    assert features_of(p) == ("kvcache", "paged_kv")
    c = check_kvcache(**contiguous_cache())
    assert (c.kvcache, c.seqlen_k, c.total_k) == ("contiguous", 48, 144) and features_of(c) == ("kvcache",)


@pytest.mark.parametrize("page", [16, 32, 64, 128, 144, 256])
def test_page_sizes_are_multiples_of_16_from_16_to_256(page):
    assert check_kvcache(**paged(page=page, cache_values=np.array([40, 0, 33], np.int32))).page_size == page


@pytest.mark.parametrize("page", [8, 24, 272, 512])
def test_other_page_sizes_are_refused_naming_the_rule(page):
    rejects(check_kvcache, paged(page=page), ValueError, f"pages of {page} rows", "multiples of 16 from 16 to 256")


def test_pages_of_one_row_are_refused_as_out_of_scope():
    rejects(check_kvcache, paged(page=1), ValueError, "pages of 1 row", "out of scope", "multiples of 16")


def test_a_sequence_longer_than_its_pages_is_refused():
    rejects(check_kvcache, paged(cache_values=np.array([40, 0, 49], np.int32)), ValueError,
            "cache_seqlens[2] = 49", "3 pages of 16 rows", "48 keys")
    rejects(check_kvcache, contiguous_cache(cache_values=np.array([1, 49, 0], np.int32)), ValueError,
            "cache_seqlens[1] = 49", "48 rows a sequence")
    rejects(check_kvcache, paged(cache_values=np.array([40, -1, 3], np.int32)), ValueError,
            "cache_seqlens[1] = -1", "negative")


def test_every_page_a_sequence_uses_must_be_a_page_of_the_cache():
    """Only the pages a sequence uses are read: ceil(n / page_size) entries of its row (the
    rest, -1 above, may be anything); a page used by two sequences is fine."""
    for bad, at in ((8, "page_table[2, 2] = 8"), (-1, "page_table[2, 2] = -1")):
        table = TABLE.copy()
        table[2, 2] = bad
        rejects(check_kvcache, paged(table_values=table), ValueError, at, "0 .. 7", "first 3 entries")
    table = TABLE.copy()
    table[0, 2] = 99     # sequence 0 has 40 keys: its third page is used
    rejects(check_kvcache, paged(table_values=table), ValueError, "page_table[0, 2] = 99")
    table = TABLE.copy()
    table[2, 2] = 99
    assert check_kvcache(**paged(table_values=table, cache_values=np.array([40, 0, 32], np.int32))).batch == 3


def test_unread_values_are_not_checked():
    """check_cache_seqlens=False: the values are never read (a kernel clamps them)."""
    assert check_kvcache(**paged(cache_values=None, table_values=None)).kvcache == "paged"


@pytest.mark.parametrize("field,value,exc,words", [
    ("page_table", ref((3, 3), "int64", 5), TypeError, ("page_table", "int32")),
    ("page_table", ref((2, 3), "int32", 5), ValueError, ("page_table", "(batch, max_pages) = (3,")),
    ("page_table", ref((3,), "int32", 5), ValueError, ("page_table", "(batch, max_pages)")),
    ("page_table", ref((3, 3), "int32", 5, strides=(6, 2)), ValueError, ("page_table", "unit stride")),
    ("cache_seqlens", ref((3,), "int64", 4), TypeError, ("cache_seqlens", "int32")),
    ("cache_seqlens", ref((4,), "int32", 4), ValueError, ("cache_seqlens", "(3,)")),
    ("cache_seqlens", ref((3,), "int32", 4, strides=(2,)), ValueError, ("cache_seqlens", "contiguous")),
    ("cache_seqlens", ref((3,), "int32", 4, device=("cpu", 0)), ValueError, ("cache_seqlens", "host memory")),
    ("page_table", ref((3, 3), "int32", 5, device=("cuda", 1)), ValueError, ("page_table", "one device")),
    ("v_cache", ref((8, 32, 2, 128), "bf16", 2), ValueError, ("v_cache shape", "k_cache shape")),
    ("k_cache", ref((8, 16, 2, 128), "fp8_e4m3", 1), TypeError, ("k_cache dtype", "q dtype")),
    ("k_cache", ref((8, 16, 128), "bf16", 1), ValueError, ("k_cache", "4-D", "with page_table")),
    ("q", ref((3, 2, 3, 128), "bf16", 0), ValueError, ("q heads 3", "multiple of k/v heads 2")),
    ("out", ref((3, 2, 4, 64), "bf16", 3), ValueError, ("out shape", "(3, 2, 4, 128)")),
    ("lse", ref((3, 2, 4), "float32", 6), ValueError, ("lse shape", "(3, 4, 2)")),
    ("out", ref((3, 2, 4, 128), "bf16", 1), ValueError, ("out overlaps k_cache",)),
    ("max_seqlen_q", 2, ValueError, ("max_seqlen_q goes with cu_seqlens_q",)),
    ("window_size", (-3, 0), ValueError, ("window_size left bound",)),
    ("softcap", -1.0, ValueError, ("softcap",)),
    ("sinks", ref((2,), "float32", 7), ValueError, ("sinks", "(4,)")),
])
def test_each_rule_of_a_kvcache_call_names_its_argument(field, value, exc, words):
    args = paged(**{field: value})
    if field == "lse":
        args["return_lse"] = True
    rejects(check_kvcache, args, exc, *words)


def test_a_contiguous_cache_has_a_row_of_keys_a_sequence():
    rejects(check_kvcache, contiguous_cache(k_cache=ref((2, 48, 2, 128), "bf16", 1),
                                            v_cache=ref((2, 48, 2, 128), "bf16", 2)),
            ValueError, "k_cache batch size 2", "3 sequences")


def test_packed_queries_take_cu_seqlens_q_and_max_seqlen_q():
    cu = np.array([0, 3, 3, 5], np.int32)
    args = paged(q=ref((5, 4, 128), "bf16", 0), out=ref((5, 4, 128), "bf16", 3),
                 cu_seqlens_q=ref((4,), "int32", 8), max_seqlen_q=3, cu_values_q=cu)
    p = check_kvcache(**args)
    assert p.varlen and (p.total_q, p.seqlen_q, p.batch) == (5, 3, 3)
    rejects(check_kvcache, {**args, "max_seqlen_q": None}, TypeError, "max_seqlen_q", "int")
    rejects(check_kvcache, {**args, "max_seqlen_q": 2}, ValueError, "max_seqlen_q = 2", "longest")
    rejects(check_kvcache, {**args, "cu_values_q": np.array([0, 3, 2, 5], np.int32)}, ValueError,
            "cu_seqlens_q", "non-decreasing")
    rejects(check_kvcache, {**args, "q": ref((5, 2, 4, 128), "bf16", 0)}, ValueError, "q must be 3-D")


def test_the_window_is_reduced_by_the_caches_length():
    assert check_kvcache(**paged(window_size=(47, -1))).window == (-1, -1)
    assert check_kvcache(**paged(window_size=(46, -1))).window == (46, -1)


# --------------------------------------------------------------------------------------
# The runtime refuses what no kernel implements, before anything is loaded or launched.

class Table:
    """A kernel table's manifest side: entries whose ``features`` are given."""

    def __init__(self, arch, features=()):
        self.entries = {v: {"features": list(features)} for v in
                        (Variant(arch, t, 128, 128, c) for t in ("bf16", "fp8_e4m3") for c in (False, True))}

    def entry(self, variant):
        return self.entries.get(variant)

    def available(self, arch):
        return sorted(v for v in self.entries if v.arch == arch)


def problem(**over):
    return validate.check_dense(**dense(**over))


@pytest.mark.parametrize("arch", ["sm_90a", "gfx950"])
def test_features_no_kernel_lists_are_refused_naming_what_the_kernels_run(arch):
    v = Variant(arch, "bf16", 128, 128, True)
    with pytest.raises(ValueError) as info:
        plan.require_features(problem(causal=True, window_size=(2, 0), sinks=ref((4,), "float32", 9)),
                              Table(arch), v)
    msg = str(info.value)
    assert v.name in msg and "sliding window (window_size) or attention sinks (sinks)" in msg
    assert f"the {arch} bf16 kernels run causal or full attention" in msg and "not implemented yet" in msg
    plan.require_features(problem(causal=True), Table(arch), v)          # plain: nothing needed


def test_a_kernel_that_lists_a_feature_runs_it_and_the_message_names_the_others():
    v = Variant("sm_90a", "bf16", 128, 128, False)
    table = Table("sm_90a", ["window", "sinks"])
    plan.require_features(problem(window_size=(2, 1), sinks=ref((4,), "float32", 9)), table, v)
    with pytest.raises(ValueError, match="does not implement softcap: .* they also take a sliding window"):
        plan.require_features(problem(softcap=5.0), table, v)


def arrays(*shapes, dtype="bf16"):
    rng = np.random.default_rng()
    return [rng.standard_normal(s).astype(host_dtype(dtype)) for s in shapes]


@pytest.fixture(params=["fake", "emulator"])
def backend(request):
    """The fake driver (sm_90a) and the emulator (gfx950), with the checkout's manifest: the
    refusals read it, and load nothing."""
    with using_backend(request.param) as driver:
        yield request.param, driver


def test_calls_with_features_take_the_serving_kernel_even_after_a_plain_call_was_planned():
    """A plain call's plan and layout are kept; the same tensors with a window, softcap or
    sinks must not reuse them: each runs the serving variant (sm_90a: the features live in
    kernels of their own, catalogue.SERVING_FEATURES_OF; a softcap in its softcap
    specialisation), dense and packed; a window that cuts
    no key runs the plain kernel again."""
    with using_backend("fake") as driver:
        q, k, v = arrays((1, 64, 2, 64), (1, 64, 2, 64), (1, 64, 2, 64))
        out = np.empty_like(q)
        sinks = np.zeros(2, np.float32)
        flash_attn_func(q, k, v, causal=True, out=out)                     # planned, kept
        plain = driver.launches[-1].symbol
        assert plain == Variant("sm_90a", "bf16", 64, 64, True).symbol
        for kw in (dict(window_size=(8, 0)), dict(softcap=20.0), dict(sinks=sinks), dict(window_size=(8, 3))):
            causal = "window_size" not in kw or kw["window_size"][1] == 0
            serving = Variant("sm_90a", "bf16", 64, 64, causal, serving=True, softcap="softcap" in kw).symbol
            flash_attn_func(q, k, v, causal=causal, out=out, **kw)
            assert driver.launches[-1].symbol == serving, kw
            flash_attn_varlen_func(q[0], k[0], v[0], cu_seqlens_q=np.array([0, 64], np.int32),
                                   cu_seqlens_k=np.array([0, 64], np.int32), max_seqlen_q=64, max_seqlen_k=64,
                                   causal=causal, out=out[0], **kw)
            assert driver.launches[-1].symbol == serving, kw
        # a window that cuts no key is no window: the plain kernel runs
        flash_attn_func(q, k, v, causal=True, out=out, window_size=(63, 0))
        assert driver.launches[-1].symbol == plain


def test_a_kvcache_call_is_refused_by_kernels_that_do_not_list_it_naming_what_they_run():
    """A KV cache needs "kvcache", a paged one "paged_kv" too, in the kernel's manifest entry."""
    v = Variant("sm_90a", "bf16", 128, 128, True)
    paged_call = check_kvcache(**paged(causal=True))
    with pytest.raises(ValueError, match=r"does not implement a KV cache \(flash_attn_with_kvcache\) or a paged "
                                         r"KV cache \(page_table\): .* they also take a sliding window"):
        plan.require_features(paged_call, Table("sm_90a", ["window"]), v)
    with pytest.raises(ValueError, match=r"does not implement a paged KV cache \(page_table\)"):
        plan.require_features(paged_call, Table("sm_90a", ["kvcache"]), v)
    plan.require_features(check_kvcache(**contiguous_cache(causal=True)), Table("sm_90a", ["kvcache"]), v)
    plan.require_features(paged_call, Table("sm_90a", ["kvcache", "paged_kv"]), v)


def test_a_kvcache_calls_values_are_checked_before_anything_is_planned():
    """Read back, a page outside the cache is refused first; check_cache_seqlens is a bool."""
    with using_backend("fake") as driver:
        q, k_cache, v_cache = arrays((3, 2, 4, 64), (8, 16, 2, 64), (8, 16, 2, 64))
        out = np.empty(q.shape, host_dtype("bf16"))
        table = TABLE.copy()
        table[2, 2] = 8
        with pytest.raises(ValueError, match=r"page_table\[2, 2\] = 8 is not a page of k_cache"):
            flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=SEQLENS.copy(), page_table=table, out=out)
        with pytest.raises(TypeError, match="check_cache_seqlens must be a bool"):
            flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=SEQLENS.copy(), page_table=table,
                                    check_cache_seqlens=1)
        assert driver.launches == []


def kvcache_launch(driver, dtype, d=64, causal=False):
    """The last launch's variant, arguments and tensor maps (the fake driver's encoding: their
    geometry) of a KV cache call, which runs the serving variant (catalogue.SERVING_FEATURES_OF)."""
    v = Variant("sm_90a", dtype, d, d, causal, serving=True)
    launch = driver.launches[-1]
    assert launch.symbol == v.symbol
    args = unpack_args(kernel_table(driver).entry(v), launch.args)
    return v, args, {name: unpack_tensor_map(args[name]) for name in ("tmap_q", "tmap_k", "tmap_v") if name in args}


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_a_paged_call_on_sm90a_reads_the_whole_cache_in_boxes_of_a_page_piece(dtype):
    """K (and BF16's V) by TMA over the whole cache, (head dim, heads, page_size rows, num_pages)
    bytes at its strides, in boxes of min(lowbit(page_size), block_n) rows (plan.page_box_rows:
    the kernel's page_piece); the cache's arguments are the table's row stride, its pages and the
    magic of its division; cache_seqlens and page_table by address.  FP8's V^T workspace is dense,
    max_pages page_size columns a sequence, from shapes alone, and its K is the pre-pass's
    contiguous copy after it (catalogue.gathers_k): (head dim, heads, max_pages page_size rows,
    sequences), packed, read in whole tiles."""
    elem = 1 if dtype == "fp8_e4m3" else 2
    with using_backend("fake") as driver:
        for page, pages, width in ((16, 8, 3), (48, 4, 3), (64, 6, 2), (256, 3, 1)):
            q, k_cache, v_cache = arrays((3, 2, 4, 64), (pages, page, 2, 64), (pages, page, 2, 64), dtype=dtype)
            table = np.zeros((3, width), np.int32)
            seqlens = np.array([page * width, 0, 17], np.int32)
            flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, page_table=table, causal=True,
                                    out=np.empty(q.shape, host_dtype("bf16")))
            v, args, maps = kvcache_launch(driver, dtype, causal=True)
            rows = min(page & -page, v.tile.block_n)
            assert rows == plan.page_box_rows(page, v.tile.block_n) and page % rows == 0
            for name, t in (("tmap_k", k_cache), ("tmap_v", v_cache)):
                if name == "tmap_k" and dtype == "fp8_e4m3":
                    row, rows_k = 2 * 64, page * width
                    assert maps[name]["ptr"] == args["kg"] == args["vt"] + plan._partials_at(2 * args["vt_stride_h"])
                    assert maps[name]["dims"] == (64, 2, rows_k, 3)
                    assert maps[name]["strides"] == (64, row, rows_k * row) and maps[name]["box"][2] == v.tile.block_n
                elif name in maps:
                    row = 2 * 64 * elem
                    assert maps[name]["ptr"] == t.ctypes.data and maps[name]["dims"] == (64 * elem, 2, page, pages)
                    assert maps[name]["strides"] == (64 * elem, row, page * row)
                    assert maps[name]["box"][2] == rows
            assert args["cache_seqlens"] == seqlens.ctypes.data and args["page_table"] == table.ctypes.data
            assert (args["page_size"], args["num_pages"], args["max_pages"], args["seqlen_k"]) == \
                (page, pages, width, page * width)
            assert args["page_magic"] == plan.page_magic(page) and args["page_table_stride"] == width
            if dtype == "fp8_e4m3":
                assert args["vt_stride_h"] == 64 * 3 * -(-page * width // 128) * 128


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_a_contiguous_cache_on_sm90a_is_a_tensor_of_max_seqlen_k_rows_a_sequence_whatever_the_queries(dtype):
    """Dense or packed queries, K (and BF16's V) as (head dim, heads, max_seqlen_k rows, batch),
    boxes of block_n rows; no page table (a null page_table, zeros for its arguments); FP8's V^T
    per sequence max_seqlen_k columns (not the packed rule: the keys are not packed)."""
    elem = 1 if dtype == "fp8_e4m3" else 2
    with using_backend("fake") as driver:
        q, k_cache, v_cache = arrays((3, 2, 4, 64), (3, 200, 2, 64), (3, 200, 2, 64), dtype=dtype)
        seqlens = np.array([200, 0, 33], np.int32)
        for packed in (False, True):
            kw = dict(cu_seqlens_q=np.array([0, 2, 3, 6], np.int32), max_seqlen_q=3) if packed else {}
            qq = q.reshape(6, 4, 64) if packed else q
            flash_attn_with_kvcache(qq, k_cache, v_cache, cache_seqlens=seqlens,
                                    out=np.empty(qq.shape, host_dtype("bf16")), **kw)
            v, args, maps = kvcache_launch(driver, dtype)
            for name in ("tmap_k", "tmap_v"):
                if name in maps:
                    assert maps[name]["dims"] == (64 * elem, 2, 200, 3) and maps[name]["box"][2] == v.tile.block_n
                    assert maps[name]["strides"][2] == 200 * 2 * 64 * elem
            assert args["page_table"] == 0 and args["page_size"] == args["num_pages"] == 0   # null: no pages
            assert args["cu_seqlens_k"] == 0 and (args["cu_seqlens_q"] != 0) == packed
            if dtype == "fp8_e4m3":
                assert args["vt_stride_h"] == 64 * 3 * 256
                assert args["kg"] == 0   # no pages: the kernel reads K from the cache, nothing gathered


def test_a_captured_fp8_paged_call_gathers_k_into_its_own_scratch_beside_the_vt():
    """A paged FP8 call under capture (nothing read back): its pre-pass's V^T and gathered K
    (catalogue.gathers_k, sized from shapes: batch x max_pages page_size x hkv x d bytes) both
    lie in the call's one stream-ordered allocation, apart, and K's tensor map is over the
    gathered copy; the allocation is freed after the launches."""
    with using_backend("fake") as driver:
        q, k_cache, v_cache = arrays((3, 2, 4, 64), (8, 16, 2, 64), (8, 16, 2, 64), dtype="fp8_e4m3")
        driver.capturing.add(9)
        flash_attn_with_kvcache(q, k_cache, v_cache, out=np.empty(q.shape, host_dtype("bf16")), causal=True,
                                cache_seqlens=SEQLENS.copy(), page_table=TABLE.copy(), check_cache_seqlens=False,
                                stream=9)
        driver.capturing.clear()
        v, args, maps = kvcache_launch(driver, "fp8_e4m3", causal=True)
        ops = [op[0] if op[0] != "launch" else op[1] for op in driver.ops]
        assert ops[0] == "alloc_async" and ops[-1] == "free_async" and ops[-2] == v.symbol
        base, size = driver.ops[0][1:3]
        kg_bytes = 3 * (3 * 16) * 2 * 64
        parts = sorted([(args["vt"], 2 * args["vt_stride_h"]), (args["kg"], kg_bytes)])
        assert all(base <= p and p + n <= base + size for p, n in parts)
        assert parts[0][0] + parts[0][1] <= parts[1][0]
        assert maps["tmap_k"]["ptr"] == args["kg"] and maps["tmap_k"]["dims"] == (64, 2, 48, 3)


def test_unread_values_on_a_captured_stream_plan_the_call_with_nothing_read_back():
    """check_cache_seqlens=False with out given: the sm_90a kernels clamp every length and page
    index, so the call is queued on the capture with no copy and no allocation of its own."""
    with using_backend("fake") as driver:
        q, k_cache, v_cache = arrays((3, 2, 4, 64), (8, 16, 2, 64), (8, 16, 2, 64))
        table = TABLE.copy()
        table[2, 2] = 1000                                   # unread: not refused (the kernel clamps it)
        kw = dict(cache_seqlens=SEQLENS.copy(), page_table=table, stream=9)
        driver.capturing.add(9)
        flash_attn_with_kvcache(q, k_cache, v_cache, out=np.empty_like(q), check_cache_seqlens=False, **kw)
        assert [op[0] for op in driver.ops] == ["launch"]
        driver.capturing.clear()


def test_the_manifest_words_and_the_validation_words_name_the_same_features():
    """catalogue.FEATURES (the manifest's ``features``) and validate.FEATURES (the messages) are
    one list; the gfx950 BF16 kernels list them all (window, softcap, sinks and both KV caches),
    every plain kernel those of its (arch, dtype) in FEATURES_OF, and the checkout's manifest
    agrees for every kernel it has built."""
    import json
    from pathlib import Path
    from zyfa_runtime import catalogue
    assert tuple(validate.FEATURES) == catalogue.FEATURES
    for v in catalogue.all_variants():
        if getattr(v, "serving", False):     # a serving variant lists its own (SERVING_FEATURES_OF)
            continue
        assert catalogue.features(v) == catalogue.FEATURES_OF.get((v.arch, v.dtype), ()), v.name
    assert catalogue.FEATURES_OF[("gfx950", "bf16")] == catalogue.FEATURES
    manifest = json.loads((Path(__file__).parents[1] / "prebuilt" / "manifest.json").read_text())
    by_name = {v.name: v for v in catalogue.all_variants()}
    for e in manifest["kernels"]:
        if e.get("built") and e["name"] in by_name:
            assert e.get("features", []) == list(catalogue.features(by_name[e["name"]])), e["name"]


def test_values_are_read_through_the_tables_strides_and_only_the_used_pages_checked():
    """page_table as a view of a wider array (row stride 5): read through its strides; entries
    past the view (here 99) and past each sequence's pages are never read or checked."""
    with using_backend("fake") as driver:
        q, k_cache, v_cache = arrays((3, 2, 4, 64), (8, 16, 2, 64), (8, 16, 2, 64))
        wide = np.full((3, 5), 99, np.int32)
        wide[:, :3] = TABLE
        flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=SEQLENS.copy(), page_table=wide[:, :3],
                                out=np.empty_like(q))
        assert kvcache_launch(driver, "bf16")[1]["page_table_stride"] == 5
        wide[0, 1] = 8
        with pytest.raises(ValueError, match=r"page_table\[0, 1\] = 8"):
            flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=SEQLENS.copy(), page_table=wide[:, :3],
                                    out=np.empty_like(q))
        assert len(driver.launches) == 1


def test_a_captured_kvcache_call_must_leave_the_values_unread():
    """On a stream being captured the values cannot be read back (that waits for the device):
    check_cache_seqlens=False is required, with out given; nothing is queued before that."""
    with using_backend("fake") as driver:
        q, k_cache, v_cache = arrays((3, 2, 4, 64), (8, 16, 2, 64), (8, 16, 2, 64))
        kw = dict(cache_seqlens=SEQLENS.copy(), page_table=TABLE.copy(), stream=9)
        driver.capturing.add(9)
        with pytest.raises(ValueError, match="cannot check cache_seqlens and page_table"):
            flash_attn_with_kvcache(q, k_cache, v_cache, out=np.empty_like(q), **kw)
        with pytest.raises(ValueError, match="needs out="):
            flash_attn_with_kvcache(q, k_cache, v_cache, check_cache_seqlens=False, **kw)
        assert driver.ops == [] and driver.launches == []
        driver.capturing.clear()


# --------------------------------------------------------------------------------------
# A KV cache call's arguments (plan.kvcache_values): what a kernel that lists "paged_kv" gets.

@pytest.mark.parametrize("page", range(16, 257, 16))
def test_the_page_magic_divides_every_group_index_by_the_pages_groups_exactly(page):
    """The kernels' slot of 16-row group g is mul_hi(2 g, page_magic) (hip/bf16_lds.h PageMap):
    g // (page / 16) for every g < 2^27 (keys < 2^31), the edges and a random sample checked."""
    magic = plan.page_magic(page) & 0xFFFFFFFF
    units = page // 16
    g = np.concatenate([np.arange(4096), 2**27 - 1 - np.arange(4096),
                        np.random.default_rng(page).integers(0, 2**27, 100_000)]).astype(object)
    assert all((2 * x * magic) >> 32 == x // units for x in g)
    assert -2**31 <= plan.page_magic(page) < 2**31


def test_a_paged_calls_arguments_are_its_tables_row_stride_and_its_pages():
    names = {"page_table_stride", "page_size", "num_pages", "max_pages", "page_magic"}
    args = paged(page_table=ref((3, 3), "int32", 5, strides=(5, 1)))
    values = plan.kvcache_values(check_kvcache(**args), names, args["page_table"])
    assert values == {"page_table_stride": 5, "page_size": 16, "num_pages": 8, "max_pages": 3, "page_magic": -2**31}
    assert plan.kvcache_values(check_kvcache(**contiguous_cache()), names) == dict.fromkeys(names, 0)
    assert plan.kvcache_values(check_kvcache(**contiguous_cache()), {"window_left"}) == {}


@pytest.mark.parametrize("tile_rows", [64, 128])
def test_a_paged_tiles_lanes_issue_every_16_row_group_once_each_box_within_its_page(tile_rows):
    """The sm_90a producers' lanes (cuda/flash_common.cuh tile_page, tma_tile_lanes): lane i issues
    the box of plan.page_box_rows rows at the tile's 16-row group j = i x box / 16, at row
    16 (g0 + j) - slot x page_size of the page in table slot mul_hi(2 (g0 + j), page_magic); so
    the boxes tile the tile's rows once, each inside one page at the key it stands for, a lane
    each within the warp's 32."""
    for page in range(16, 257, 16):
        box = plan.page_box_rows(page, tile_rows)
        magic = plan.page_magic(page) & 0xFFFFFFFF
        for key0 in range(0, 4 * 256 + 1, tile_rows):
            covered = []
            for lane in range(32):
                j = lane * (box // 16)
                if j >= tile_rows // 16:
                    continue
                g = key0 // 16 + j
                slot = (2 * g * magic) >> 32
                row = 16 * g - slot * page
                assert 0 <= row and row + box <= page, (page, key0, lane)
                assert slot * page + row == key0 + 16 * j
                covered += range(16 * j, 16 * j + box)
            assert sorted(covered) == list(range(tile_rows)), (page, key0)
