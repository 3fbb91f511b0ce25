"""The fp64 reference against a direct, unvectorised statement of attention."""

import math

import numpy as np
import pytest

from zyfa_runtime import reference


def naive(q, k, v, causal, scale):
    """softmax(q k^T * scale) v for one (Sq, D) / (Sk, D) pair, written out element by element."""
    sq, sk = q.shape[0], k.shape[0]
    out = np.zeros((sq, v.shape[1]))
    lse = np.full(sq, -np.inf)
    for i in range(sq):
        js = [j for j in range(sk) if not causal or j <= i + sk - sq]
        if not js:
            continue
        s = [float(q[i] @ k[j]) * scale for j in js]
        m = max(s)
        w = [math.exp(x - m) for x in s]
        out[i] = sum(wj * v[j] for wj, j in zip(w, js)) / sum(w)
        lse[i] = m + math.log(sum(w))
    return out, lse


def assert_head_is(out, lse, bi, h, o_naive, lse_naive):
    """Head h of sequence bi of ``out`` and ``lse`` is a naive loop's: to 1e-12, and -inf in the
    LSE exactly where it has -inf."""
    np.testing.assert_allclose(out[bi, :, h], o_naive, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse[bi, h]), np.isneginf(lse_naive))
    fin = np.isfinite(lse_naive)
    np.testing.assert_allclose(lse[bi, h][fin], lse_naive[fin], rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(5, 9), (9, 5), (7, 7)])
def test_dense_gqa_matches_naive(causal, sq, sk):
    rng = np.random.default_rng()
    b, hq, hkv, d, dv = 2, 6, 2, 8, 4
    q = rng.standard_normal((b, sq, hq, d))
    k = rng.standard_normal((b, sk, hkv, d))
    v = rng.standard_normal((b, sk, hkv, dv))
    out, lse = reference.attention(q, k, v, causal=causal, softmax_scale=0.3, return_lse=True)
    assert out.shape == (b, sq, hq, dv) and lse.shape == (b, hq, sq)
    for bi in range(b):
        for h in range(hq):
            o, l = naive(q[bi, :, h], k[bi, :, h // 3], v[bi, :, h // 3], causal, 0.3)
            assert_head_is(out, lse, bi, h, o, l)


def test_rows_that_see_no_key_are_zero_with_lse_minus_inf():
    rng = np.random.default_rng()
    q, k, v = rng.standard_normal((1, 6, 1, 4)), rng.standard_normal((1, 2, 1, 4)), \
        rng.standard_normal((1, 2, 1, 4))
    out, lse = reference.attention(q, k, v, causal=True, return_lse=True)
    # Bottom-right: row i sees keys j <= i - 4, so rows 0..3 see nothing.
    assert np.all(out[0, :4] == 0) and np.all(np.isneginf(lse[0, 0, :4]))
    assert np.all(np.isfinite(lse[0, 0, 4:])) and np.any(out[0, 4:] != 0)


def test_varlen_equals_dense_per_sequence():
    rng = np.random.default_rng()
    seq_q, seq_k = [3, 0, 5], [4, 2, 6]
    cq, ck = np.cumsum([0] + seq_q), np.cumsum([0] + seq_k)
    q = rng.standard_normal((cq[-1], 4, 8))
    k = rng.standard_normal((ck[-1], 2, 8))
    v = rng.standard_normal((ck[-1], 2, 8))
    out, lse = reference.attention(q, k, v, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                   return_lse=True)
    for b in range(3):
        o, l = reference.attention(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]],
                                   v[None, ck[b]:ck[b + 1]], causal=True, return_lse=True)
        np.testing.assert_array_equal(out[cq[b]:cq[b + 1]], o[0])
        np.testing.assert_array_equal(lse[:, cq[b]:cq[b + 1]], l[0])


def test_relative_error_never_passes_nan():
    ref = np.ones(4)
    assert reference.relative_error(ref, ref) == 0
    assert not reference.relative_error(np.array([1, 1, np.nan, 1]), ref) < 1


@pytest.mark.parametrize("packed", [False, True])
def test_descales_per_sequence_and_kv_head_scale_each_group_of_heads(packed):
    """q of head h in sequence b times descale_q[b, h // group], k and v of head g times
    descale_k[b, g] and descale_v[b, g]: the same as attention over the scaled values."""
    rng = np.random.default_rng()
    b, hq, hkv, d = 3, 6, 2, 8
    dq, dk, dv = (rng.uniform(0.5, 2.0, (b, hkv)).astype(np.float32) for _ in range(3))
    if packed:
        cq, ck = np.array([0, 4, 4, 9]), np.array([0, 3, 8, 14])
        q, k, v = (rng.standard_normal((n, h, d)) for n, h in ((9, hq), (14, hkv), (14, hkv)))
        seq_q = [slice(cq[i], cq[i + 1]) for i in range(b)]
        seq_k = [slice(ck[i], ck[i + 1]) for i in range(b)]
        kw = dict(cu_seqlens_q=cq, cu_seqlens_k=ck)
    else:
        q, k, v = (rng.standard_normal((b, n, h, d)) for n, h in ((5, hq), (7, hkv), (7, hkv)))
        seq_q = seq_k = list(range(b))
        kw = {}
    qs, ks, vs = q.copy(), k.copy(), v.copy()
    for i in range(b):
        qs[seq_q[i]] *= np.repeat(dq[i].astype(np.float64), hq // hkv)[:, None]
        ks[seq_k[i]] *= dk[i].astype(np.float64)[:, None]
        vs[seq_k[i]] *= dv[i].astype(np.float64)[:, None]
    got = reference.attention(q, k, v, causal=True, descale_q=dq, descale_k=dk, descale_v=dv, **kw)
    want = reference.attention(qs, ks, vs, causal=True, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # one value is the same everywhere; any other shape is refused
    one = reference.attention(q, k, v, descale_q=np.float32(2.0), **kw)
    np.testing.assert_allclose(one, reference.attention(q * 2.0, k, v, **kw), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"\(3, 2\) \(batch, heads_kv\)"):
        reference.attention(q, k, v, descale_k=np.ones((hkv, b), np.float32), **kw)


@pytest.mark.parametrize("packed", [False, True])
def test_block_descales_scale_each_block_of_128_queries_and_64_keys_from_each_sequences_start(packed):
    """descale_q (B, Hq, nQ), descale_k (B, Hkv, nK): row i of query head h in sequence b times
    descale_q[b, h, i // 128], key j of head g times descale_k[b, g, j // 64], v per (b, g): the
    same as attention over the values scaled so; blocks that do not cover a sequence are refused."""
    rng = np.random.default_rng()
    b, hq, hkv, d = 2, 4, 2, 8
    lens_q, lens_k = (130, 260), (200, 70)
    dq = rng.uniform(0.5, 2.0, (b, hq, 3)).astype(np.float32)
    dk = rng.uniform(0.5, 2.0, (b, hkv, 4)).astype(np.float32)
    dv = rng.uniform(0.5, 2.0, (b, hkv)).astype(np.float32)
    if packed:
        cq, ck = np.concatenate([[0], np.cumsum(lens_q)]), np.concatenate([[0], np.cumsum(lens_k)])
        q, k, v = (rng.standard_normal((n, h, d)) for n, h in ((cq[-1], hq), (ck[-1], hkv), (ck[-1], hkv)))
        seq_q = [np.arange(cq[i], cq[i + 1]) for i in range(b)]
        seq_k = [np.arange(ck[i], ck[i + 1]) for i in range(b)]
        kw = dict(cu_seqlens_q=cq, cu_seqlens_k=ck)
    else:
        lens_q, lens_k = (260, 260), (200, 200)
        q, k, v = (rng.standard_normal((b, n, h, d)) for n, h in ((260, hq), (200, hkv), (200, hkv)))
        seq_q = [np.arange(260)] * b
        seq_k = [np.arange(200)] * b
        kw = {}
    qs, ks, vs = q.copy(), k.copy(), v.copy()
    for i in range(b):
        rq, rk = seq_q[i], seq_k[i]
        fq = dq[i][:, np.arange(len(rq)) // 128].T.astype(np.float64)      # (rows, hq)
        fk = dk[i][:, np.arange(len(rk)) // 64].T.astype(np.float64)
        if packed:
            qs[rq] *= fq[:, :, None]
            ks[rk] *= fk[:, :, None]
            vs[rk] *= dv[i].astype(np.float64)[None, :, None]
        else:
            qs[i] *= fq[:, :, None]
            ks[i] *= fk[:, :, None]
            vs[i] *= dv[i].astype(np.float64)[None, :, None]
    got = reference.attention(q, k, v, causal=True, descale_q=dq, descale_k=dk, descale_v=dv, **kw)
    want = reference.attention(qs, ks, vs, causal=True, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert reference.relative_error(got, reference.attention(q, k, v, causal=True, **kw)) > 0.1
    with pytest.raises(ValueError, match="do not cover"):
        reference.attention(q, k, v, descale_q=dq[:, :, :2], **kw)
    with pytest.raises(ValueError, match="per block"):
        reference.attention(q, k, v, descale_k=np.ones((b, hq, 4), np.float32), **kw)


def test_fp8_descales_per_sequence_and_kv_head_go_through_the_recipe_one_group_at_a_time():
    """The exact FP8 model with (B, Hkv) descales: each (sequence, key/value head) with its query
    heads through the recipe with its own scalars; values quantised with those scales are
    within the recipe's distance of fp64."""
    import ml_dtypes
    from zyfa_runtime import fp8_models
    rng = np.random.default_rng()
    b, hq, hkv, s, d = 2, 4, 2, 40, 64
    x = {n: rng.standard_normal((b, s, h, d)) * rng.uniform(0.1, 10.0, (b, 1, h, 1))
         for n, h in (("q", hq), ("k", hkv), ("v", hkv))}
    group = hq // hkv
    scales, codes, exact = {}, {}, {}
    for n, a in x.items():
        per = np.abs(a).reshape(b, s, hkv, -1, d).max(axis=(1, 3, 4)) / 448.0          # (b, hkv)
        sc = per.astype(np.float32)
        full = np.repeat(sc, group if n == "q" else 1, axis=1)[:, None, :, None]
        codes[n] = (a / full).astype(ml_dtypes.float8_e4m3fn)
        exact[n] = codes[n].astype(np.float64) * full
        scales[n] = sc
    assert not (scales["q"] == scales["q"].flat[0]).all()
    out = reference.fp8_attention(codes["q"], codes["k"], codes["v"], recipe="sm_90a", descale_q=scales["q"],
                                  descale_k=scales["k"], descale_v=scales["v"], causal=True)
    for bi in range(b):
        for g in range(hkv):
            hs = slice(g * group, (g + 1) * group)
            o, _ = fp8_models.sequence_forward(codes["q"][bi][:, hs], codes["k"][bi][:, g:g + 1],
                                               codes["v"][bi][:, g:g + 1], "sm_90a", descale_q=scales["q"][bi, g],
                                               descale_k=scales["k"][bi, g], descale_v=scales["v"][bi, g],
                                               causal=True)
            np.testing.assert_array_equal(out[bi][:, hs], o)
    ref = reference.attention(exact["q"], exact["k"], exact["v"], causal=True)
    assert reference.relative_error(out, ref) < 0.05


# --------------------------------------------------------------------------------------
# Sliding windows, softcap and sinks: the reference against the formula written out.

def naive_features(q, k, v, scale, window, softcap, sink):
    """One (Sq, D) / (Sk, D) pair: query i at key position p = i + Sk - Sq sees keys j with
    p - left <= j <= p + right (a bound of -1: none); each score s = q.k scale becomes
    softcap tanh(s / softcap) (softcap > 0); the sink z adds e^z to the denominator.  Returns
    out and lse = ln(e^z + sum_j e^s_j), element by element."""
    sq, sk = q.shape[0], k.shape[0]
    left, right = window
    out = np.zeros((sq, v.shape[1]))
    lse = np.full(sq, -np.inf if sink is None else float(sink))
    for i in range(sq):
        p = i + sk - sq
        js = [j for j in range(sk) if (right < 0 or j <= p + right) and (left < 0 or j >= p - left)]
        if not js:
            continue
        s = [float(q[i] @ k[j]) * scale for j in js]
        if softcap:
            s = [softcap * math.tanh(x / softcap) for x in s]
        terms = s + ([] if sink is None else [float(sink)])
        m = max(terms)
        w = [math.exp(x - m) for x in s]
        den = sum(w) + (0.0 if sink is None else math.exp(float(sink) - m))
        out[i] = sum(wj * v[j] for wj, j in zip(w, js)) / den
        lse[i] = m + math.log(den)
    return out, lse


FEATURES = [((-1, -1), 0.0, False), ((2, 1), 0.0, False), ((3, -1), 0.0, False), ((-1, 2), 0.0, False),
            ((0, 0), 0.0, False), ((-1, -1), 2.5, False), ((-1, -1), 0.0, True), ((4, 0), 1.5, True),
            ((1, 3), 0.7, True)]


@pytest.mark.parametrize("window,softcap,sinks", FEATURES)
@pytest.mark.parametrize("sq,sk", [(5, 9), (9, 5), (7, 7)])
def test_windows_softcap_and_sinks_match_the_formula_written_out(window, softcap, sinks, sq, sk):
    rng = np.random.default_rng()
    b, hq, hkv, d, dv = 2, 4, 2, 8, 4
    q = rng.standard_normal((b, sq, hq, d)) * 2
    k = rng.standard_normal((b, sk, hkv, d))
    v = rng.standard_normal((b, sk, hkv, dv))
    z = rng.standard_normal(hq).astype(np.float32) * 2 if sinks else None
    out, lse = reference.attention(q, k, v, softmax_scale=0.4, window_size=window, softcap=softcap, sinks=z,
                                   return_lse=True)
    for bi in range(b):
        for h in range(hq):
            o, l = naive_features(q[bi, :, h], k[bi, :, h // 2], v[bi, :, h // 2], 0.4, window, softcap,
                                  None if z is None else z[h])
            assert_head_is(out, lse, bi, h, o, l)


def test_causal_is_a_window_whose_right_bound_is_zero():
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, n, 2, 8)) for n in (6, 9, 9))
    causal = reference.attention(q, k, v, causal=True, return_lse=True)
    window = reference.attention(q, k, v, window_size=(-1, 0), return_lse=True)
    for a, b in zip(causal, window):
        np.testing.assert_array_equal(a, b)
    # causal with a left bound: both bounds
    both = reference.attention(q, k, v, causal=True, window_size=(2, -1))
    np.testing.assert_array_equal(both, reference.attention(q, k, v, window_size=(2, 0)))


def test_a_sink_dominating_the_row_scales_the_output_down_and_rows_without_keys_get_the_sinks_lse():
    """A sink far above every score takes nearly all of the row's weight: the output shrinks by
    e^(z - lse) and stays the same direction; a row that sees no key outputs zeros with the
    LSE of the sink alone."""
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, n, 1, 8)) for n in (6, 4, 4))
    z = np.array([30.0], np.float32)
    plain, plain_lse = reference.attention(q, k, v, causal=True, return_lse=True)
    out, lse = reference.attention(q, k, v, causal=True, sinks=z, return_lse=True)
    seen = np.isfinite(plain_lse[0, 0])
    assert (~seen).sum() == 2 and np.all(out[0, ~seen] == 0) and np.all(lse[0, 0, ~seen] == 30.0)
    factor = np.exp(plain_lse[0, 0, seen] - lse[0, 0, seen])
    assert np.all(factor < 1e-9) and np.all(factor > 0)
    np.testing.assert_allclose(out[0, seen, 0], plain[0, seen, 0] * factor[:, None], rtol=1e-9)


def test_window_helpers_state_each_rows_keys():
    """window.visible is the rule and visible_count its number of pairs; key_range holds every
    key its rows see and no key block wholly outside them; reduce drops exactly the bounds that
    cut no key."""
    from zyfa_runtime import window as w
    rng = np.random.default_rng()
    for _ in range(200):
        sq, sk = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        win = (int(rng.integers(-1, 12)), int(rng.integers(-1, 12)))
        seen = w.visible(sq, sk, win)
        assert w.visible_count(sq, sk, win) == int(seen.sum())
        lo = int(rng.integers(0, sq))
        hi = int(rng.integers(lo + 1, sq + 1))
        first, end = w.key_range(lo, hi, sq, sk, win)
        cols = np.flatnonzero(seen[lo:hi].any(axis=0))
        if cols.size:
            assert (first, end) == (cols[0], cols[-1] + 1)
        else:
            assert first >= end
        np.testing.assert_array_equal(w.visible(sq, sk, w.reduce(win, sq, sk)), seen)
    assert w.reduce((5, 5), 6, 6) == (-1, -1) and w.reduce((4, 4), 6, 6) == (4, 4)


def test_kvcache_reference_gathers_pages_then_attends_densely():
    """Paged K/V: sequence b's key t lives in page page_table[b, t // P], row t % P; pages may be
    shared (a common prefix).  The reference equals the dense one over the gathered keys, the
    queries being the newest positions."""
    rng = np.random.default_rng()
    page, hkv, hq, d = 4, 2, 4, 8
    lens, sq = [7, 10, 3], 3
    k_cache, v_cache = (rng.standard_normal((9, page, hkv, d)) for _ in range(2))
    table = np.array([[5, 2, 0], [5, 2, 8], [7, 1, 1]], np.int32)   # sequences 0 and 1 share a prefix
    q = rng.standard_normal((3, sq, hq, d))
    out, lse = reference.kvcache_attention(q, k_cache, v_cache, cache_seqlens=lens, page_table=table,
                                           causal=True, window_size=(4, -1), return_lse=True)
    for b, n in enumerate(lens):
        rows = [table[b, t // page] * page + t % page for t in range(n)]
        kb, vb = (c.reshape(-1, hkv, d)[rows][None] for c in (k_cache, v_cache))
        o, l = reference.attention(q[b:b + 1], kb, vb, causal=True, window_size=(4, -1), return_lse=True)
        np.testing.assert_array_equal(out[b], o[0])
        np.testing.assert_array_equal(lse[b], l[0])
    # a contiguous cache (B, max_seqlen_k, Hkv, D) and packed queries
    cache = rng.standard_normal((3, 12, hkv, d))
    cu = np.array([0, 2, 2, 5])
    qp = rng.standard_normal((5, hq, d))
    out = reference.kvcache_attention(qp, cache, cache, cache_seqlens=lens, cu_seqlens_q=cu, causal=True)
    for b, n in enumerate(lens):
        o = reference.attention(qp[None, cu[b]:cu[b + 1]], cache[b:b + 1, :n], cache[b:b + 1, :n], causal=True)
        np.testing.assert_array_equal(out[cu[b]:cu[b + 1]], o[0])


# --------------------------------------------------------------------------------------
# The exact FP8 models with windows, softcap and sinks.

def fp8_problem(rng, sq, sk, hq=2, hkv=1, d=64):
    """Per-tensor quantised gaussian q, k, v: codes, descales and the dequantised values."""
    from zyfa_runtime import e4m3
    codes, scales, exact = [], [], []
    for shape in ((1, sq, hq, d), (1, sk, hkv, d), (1, sk, hkv, d)):
        x = rng.standard_normal(shape)
        s = np.float32(np.abs(x).max() / 448)
        c = e4m3.encode(x / s, saturate=True)
        codes.append(c), scales.append(s), exact.append(e4m3.decode(c) * float(s))
    return codes, dict(zip(("descale_q", "descale_k", "descale_v"), scales)), exact


@pytest.mark.parametrize("recipe", ["sm_90a", "gfx950"])
@pytest.mark.parametrize("causal,window", [(False, (40, 25)), (True, (70, -1)), (False, (-1, 10))])
def test_fp8_model_windows_are_the_masked_scores(recipe, causal, window):
    """A window only masks scores: the model's bytes, block maxima and output equal those of
    the same recipe given the fp32 scores with the keys outside the window at -inf (blocks
    aligned at key 0 either way; causal's diagonal blocks keep their recipe)."""
    from zyfa_runtime import e4m3, fp8_models, window as w
    rng = np.random.default_rng()
    (q, k, v), ds, _ = fp8_problem(rng, 150, 230)
    qd, kd = e4m3.decode(q[0, :, 0]), e4m3.decode(k[0, :, 0])
    s = (qd @ kd.T).astype(np.float32)
    s = np.where(w.visible(150, 230, w.normalize(causal, window)), s, np.float32(-np.inf))
    got = fp8_models.head_forward(q[0, :, 0], k[0, :, 0], v[0, :, 0], recipe, causal=causal, window_size=window, **ds)
    want = fp8_models.head_forward(q[0, :, 0], k[0, :, 0], v[0, :, 0], recipe, causal=causal, scores=s, **ds)
    np.testing.assert_array_equal(got.p_codes, want.p_codes)
    np.testing.assert_array_equal(got.out, want.out)
    np.testing.assert_array_equal(got.lse, want.lse)


def test_fp8_model_sink_far_below_every_score_changes_nothing_and_rows_without_keys_get_its_lse():
    from zyfa_runtime import fp8_models
    rng = np.random.default_rng()
    (q, k, v), ds, _ = fp8_problem(rng, 140, 100)
    plain = fp8_models.sequence_forward(q[0], k[0], v[0], "sm_90a", causal=True, **ds)
    low = fp8_models.sequence_forward(q[0], k[0], v[0], "sm_90a", causal=True, sinks=np.full(2, -1e4, np.float32),
                                      **ds)
    np.testing.assert_array_equal(plain[0], low[0])
    np.testing.assert_array_equal(plain[1][:, 40:], low[1][:, 40:])
    # rows 0..39 see no key: zeros, and the sink's own LSE (its log2 value rounded to fp32)
    assert np.all(low[0][:40] == 0)
    np.testing.assert_allclose(low[1][:, :40], -1e4, rtol=2 ** -23)


@pytest.mark.parametrize("recipe", ["sm_90a", "gfx950"])
@pytest.mark.parametrize("window,softcap,sink_at", [((64, 0), 0.0, None), ((-1, -1), 0.0, 0.0),
                                                    ((-1, 0), 4.0, None), ((96, 30), 3.0, 0.0),
                                                    ((-1, 0), 0.0, 12.0), ((-1, -1), 50.0, -3.0)])
def test_fp8_models_with_features_stay_within_fp8s_distance_of_fp64(recipe, window, softcap, sink_at):
    """Windows (smaller and larger than the sequence), softcap and sinks (beside the scores,
    and dominating the row: at sink_at 12, e^12 is about 100 times a row's sum of weights) through the exact
    model stay within the recipe's usual distance of the fp64 reference (the plain recipes'
    relative error is about 3 %: docs/numerics.md), the LSE within 0.1."""
    rng = np.random.default_rng()
    (q, k, v), ds, exact = fp8_problem(rng, 200, 260, hq=4, hkv=2)
    z = None if sink_at is None else (rng.standard_normal(4) + sink_at).astype(np.float32)
    opts = dict(window_size=window, softcap=softcap, sinks=z, softmax_scale=0.2)
    out, lse = reference.fp8_attention(q, k, v, recipe=recipe, return_lse=True, **opts, **ds)
    ref, ref_lse = reference.attention(*exact, return_lse=True, **opts)
    assert reference.relative_error(out, ref) < 0.05
    fin = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse), fin)
    assert np.abs(lse[fin] - ref_lse[fin]).max() < 0.1
