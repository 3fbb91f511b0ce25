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
