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
            np.testing.assert_allclose(out[bi, :, h], o, rtol=1e-12, atol=1e-12)
            np.testing.assert_array_equal(np.isneginf(lse[bi, h]), np.isneginf(l))
            fin = np.isfinite(l)
            np.testing.assert_allclose(lse[bi, h][fin], l[fin], rtol=1e-12)


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
