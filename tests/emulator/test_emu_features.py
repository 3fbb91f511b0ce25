"""Sliding windows, attention sinks and softcap in the gfx950 BF16 kernels (hip/flash_fwd.hip:
runtime window bounds that pick the key tiles a workgroup loads and the masks of the tiles that
cross an edge; the sink folded into each row's denominator after the loop; tanh from v_exp_f32
and v_rcp_f32) on the emulator, against the float64 reference (zyfa_runtime/reference.py).

Bounds: those of the plain BF16 kernels (``zyfa_runtime.selfcheck``: O relative error <= 8e-3,
LSE absolute error <= 1e-3).  The features add no rounding of their own beyond fp32 noise: the
masks are exact; the sink's term is one fp32 exp2 and fma (relative 2^-22 on the denominator);
the capped logit carries softcap x 5e-7 absolute from the tanh (docs/gfx950_bf16.md), at most
2.5e-5 here (softcap 50), against P rounded to bf16 (2^-9 relative) that sets the plain bound.
Outputs are poisoned with NaN first; rows that see no key must come back as zeros with an LSE of
-inf (with sinks: the sink), exactly where the reference has them.
"""

import zlib

import ml_dtypes
import numpy as np
import pytest

from emukit import O_BOUND, PREBUILT, bf16, built_with, compare, emulator  # noqa: F401 (emulator: a fixture)
from tests.sweeps import sweep

from zyfa_runtime import catalogue, flash_attn_func, flash_attn_varlen_func, reference
from zyfa_runtime.catalogue import Variant
from zyfa_runtime.selfcheck import LSE_BOUND

DIMS = ((64, 64), (128, 128), (192, 128), (256, 256))
VARIANTS = [Variant("gfx950", "bf16", dq, dv, causal) for dq, dv in DIMS for causal in (False, True)]


pytestmark = pytest.mark.skipif(not built_with(VARIANTS, ("window", "softcap", "sinks")),
                                reason="gfx950 BF16 code objects with window, softcap and sinks not built "
                                       "(python build.py --arch gfx950 --only bf16)")


def inputs(v: Variant, seed: int, sq: int, sk: int, batch=1, hq=4, hkv=2):
    rng = np.random.default_rng(zlib.crc32(v.name.encode()) + seed)
    return (bf16(rng.standard_normal((batch, sq, hq, v.d_qk))), bf16(rng.standard_normal((batch, sk, hkv, v.d_qk))),
            bf16(rng.standard_normal((batch, sk, hkv, v.d_v))))


def check(v: Variant, q, k, vv, **kw):
    """The dense call into a NaN-poisoned output, against the reference; returns (O, LSE)."""
    out = np.full(q.shape[:-1] + (vv.shape[-1],), np.nan, ml_dtypes.bfloat16)
    _, lse = flash_attn_func(q, k, vv, causal=v.causal, out=out, return_lse=True, **kw)
    ref_o, ref_lse = reference.attention(q, k, vv, causal=v.causal, return_lse=True, **kw)
    lse = lse.numpy()
    compare(out, lse, ref_o, ref_lse)
    return out.astype(np.float64), np.asarray(lse, np.float64)


def sinks(*values):
    return np.array(values, np.float32)


#: Windows (left, right) per case, on Sq = 300 queries and Sk = 420 keys (two query blocks,
#: keys in 4 / 7 / 14 tiles): smaller than the sequence on each side, larger than it (kept as a
#: window: it still cuts keys of the first rows), left only, right only, both, (0, 0).  The
#: causal variants take the right bound 0 (their window is (left, 0)).
WINDOWS = {
    "left only, smaller than the sequence": (37, -1),
    "left only, across several tiles per workgroup": (150, -1),
    "right only": (-1, 21),
    "both bounds": (64, 5),
    "the diagonal alone (0, 0)": (0, 0),
    "larger than the sequence on the left": (400, 3),
}
#: The default run's (the others with -m slow; the packed test below runs a window, softcap
#: and sinks together in the default run too).
QUICK_WINDOWS = ("both bounds",)
#: The default run's variant (all of them with -m slow).
QUICK_ONE = {(64, 64, True)}


@pytest.mark.parametrize("v", sweep(VARIANTS, quick=QUICK_ONE))
@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c in QUICK_WINDOWS else pytest.mark.slow)
                                  for c in WINDOWS])
def test_a_window_limits_each_row_to_its_keys(emulator, v, case):
    left, right = WINDOWS[case]
    if v.causal:
        right = 0
    q, k, vv = inputs(v, 1, 300, 420)
    check(v, q, k, vv, window_size=(left, right))


#: Left bounds of the edge test below, on Sq = 256, Sk = 512 (row r's window starts at key
#: r + 256 - left): where the first rows' windows start in their 32-key subtile -- 193: 31 keys
#: into one (each wave's rows cut two subtiles), 224: at a subtile's start, 250: 6 keys in.
EDGE_LEFTS = (193, 224, 250)


@pytest.mark.parametrize("v", sweep(VARIANTS, quick=QUICK_ONE))
@pytest.mark.parametrize("left", [pytest.param(x, marks=() if x == EDGE_LEFTS[0] else pytest.mark.slow)
                                  for x in EDGE_LEFTS])
def test_each_row_starts_its_window_exactly_at_its_first_key(emulator, v, left):
    # Scores fall by 2 (scaled, natural log) from each key to the next (q = e0, key j = -16 j
    # e0, bf16-rounded, at softmax_scale 0.125), so each row puts 0.86 of its weight on its own
    # first key: a key masked one early or late moves that row's O by about V's size, far past
    # the bound.  The 8 waves' rows start their windows 32 keys apart: the left-edge tiles hold
    # subtiles wholly before a wave's rows, cut by them, and past them, and whole tiles before
    # the later waves' rows (hip/bf16_softmax.h, mask_before).
    _, _, vv = inputs(v, 7, 256, 512, hq=1, hkv=1)
    q = np.zeros((1, 256, 1, v.d_qk), np.float32)
    q[..., 0] = 1.0
    k = np.zeros((1, 512, 1, v.d_qk), np.float32)
    k[:, :, :, 0] = -16.0 * np.arange(512)[:, None]
    q, k = bf16(q), bf16(k)
    right = 0 if v.causal else -1
    o, _ = check(v, q, k, vv, window_size=(left, right), softmax_scale=0.125)
    for off_by_one in (left - 1, left + 1):   # the same call with the edge one key off: far out
        near = reference.attention(q, k, vv, causal=v.causal, window_size=(off_by_one, right), softmax_scale=0.125)
        assert reference.relative_error(o, near) > 10 * O_BOUND


@pytest.mark.parametrize("v", sweep(VARIANTS, quick=QUICK_ONE))
def test_rows_whose_window_holds_no_key_output_zeros_and_an_lse_of_minus_infinity_or_the_sink(emulator, v):
    # 600 queries over 40 keys: row r sits at key r - 560, so rows below 560 - right see no key
    # (the first two query blocks entirely: their workgroups load no tile).  With sinks their
    # LSE is the sink, their output still zeros.
    q, k, vv = inputs(v, 2, 600, 40)
    window = (10, 0 if v.causal else 7)
    o, lse = check(v, q, k, vv, window_size=window)
    assert np.isneginf(lse[0, :, :550]).all() and np.isfinite(lse[0, :, 570:]).all()
    assert (o[0, :550] == 0).all()
    s = sinks(0.5, -2.0, 3.0, 1.0)
    o, lse = check(v, q, k, vv, window_size=window, sinks=s)
    assert np.array_equal(lse[0, :, :550], np.broadcast_to(s[:, None], (4, 550)))
    assert (o[0, :550] == 0).all()


@pytest.mark.parametrize("v", sweep(VARIANTS, quick=QUICK_ONE))
def test_sinks_join_each_rows_denominator_and_may_dominate_it(emulator, v):
    # Head 0's sink sits 30 above any scaled score (the keys' weight is e^-30 of the sink's:
    # O shrinks by that factor and must keep its relative accuracy); the others beside the
    # scores, below them, and -inf (no sink at all).
    q, k, vv = inputs(v, 3, 130, 260)
    o, lse = check(v, q, k, vv, sinks=sinks(40.0, 0.5, -3.0, -np.inf), softmax_scale=0.125)
    assert np.abs(o[..., 0, :]).max() < 1e-9 < np.abs(o[..., 1, :]).max()
    plain = reference.attention(q, k, vv, causal=v.causal, return_lse=True, softmax_scale=0.125)[1]
    assert np.abs(lse[:, 3] - plain[:, 3]).max() <= LSE_BOUND        # -inf: as if none


@pytest.mark.parametrize("v", sweep(VARIANTS, quick=QUICK_ONE))
@pytest.mark.parametrize("softcap", [5.0, pytest.param(50.0, marks=pytest.mark.slow),
                                     pytest.param(200.0, marks=pytest.mark.slow)])
def test_softcap_caps_the_scaled_scores_where_tanh_saturates_and_where_it_barely_bends(emulator, v, softcap):
    # softmax_scale 1 on unit-variance bf16 inputs: scores of tens (d 64-256), so a softcap of
    # 5 saturates tanh for most keys and one of 50 bends only the largest.  Up to a softcap of
    # 50 (OnlineSoftmax::kFixedCap, d <= 192) the softmax runs against a fixed max; 200 takes
    # the running max of the features' loop.
    q, k, vv = inputs(v, 4, 130, 260)
    check(v, q, k, vv, softcap=softcap, softmax_scale=1.0)


@pytest.mark.parametrize("v", sweep(VARIANTS, quick=QUICK_ONE))
def test_capped_logits_far_below_the_fixed_max_keep_their_precision(emulator, v):
    # Every score of a row strongly negative (q and k of opposite signs): with softcap 50 every
    # logit lies near -50 (down to e^-50 = 2^-72 against the fixed max of 0), and the softmax
    # over them must be as exact as over logits near the max.  Half the rows the other way
    # (logits near +50: the top of the fixed range).  With sinks, folded in against the fixed m
    # (one of them above every logit).
    rng = np.random.default_rng(zlib.crc32(v.name.encode()) + 11)
    sign = np.where(np.arange(130) % 2 == 0, 1.0, -1.0)[None, :, None, None]
    q = bf16(np.abs(rng.standard_normal((1, 130, 4, v.d_qk))) * sign)
    k = bf16(-np.abs(rng.standard_normal((1, 260, 2, v.d_qk))))
    vv = bf16(rng.standard_normal((1, 260, 2, v.d_v)))
    check(v, q, k, vv, softcap=50.0, softmax_scale=1.0, sinks=sinks(0.5, -30.0, 3.0, 60.0))


@pytest.mark.slow
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_window_softcap_and_sinks_together(emulator, v):
    q, k, vv = inputs(v, 5, 280, 520, batch=2)
    check(v, q, k, vv, window_size=(90, 0 if v.causal else 40), softcap=8.0, sinks=sinks(1.0, 2.0, -1.0, 4.0))


# every variant in the full run only (the default run keeps dense windows above and packed
# queries over a cache in test_emu_kvcache.py)
@pytest.mark.parametrize("v", sweep(VARIANTS, quick=set()))
def test_packed_sequences_each_take_the_window_in_their_own_positions(emulator, v):
    # Three sequences (query lengths 70, 0 and 260 over 150, 90 and 200 keys), packed: the
    # window is bottom-right aligned in each (the last's first rows see no key); LSE (Hq, Tq)
    # checked with the sinks folded in.
    lens_q, lens_k = [70, 0, 260], [150, 90, 200]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    rng = np.random.default_rng(zlib.crc32(v.name.encode()) + 6)
    q = bf16(rng.standard_normal((cu_q[-1], 4, v.d_qk)))
    k = bf16(rng.standard_normal((cu_k[-1], 2, v.d_qk)))
    vv = bf16(rng.standard_normal((cu_k[-1], 2, v.d_v)))
    kw = dict(window_size=(45, 0 if v.causal else 12), sinks=sinks(0.0, 1.0, 2.0, -0.5), softcap=20.0)
    out = np.full((cu_q[-1], 4, v.d_v), np.nan, ml_dtypes.bfloat16)
    _, lse = flash_attn_varlen_func(q, k, vv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                                    max_seqlen_k=max(lens_k), causal=v.causal, out=out, return_lse=True, **kw)
    ref_o, ref_lse = reference.attention(q, k, vv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=v.causal,
                                         return_lse=True, **kw)
    compare(out, lse.numpy(), ref_o, ref_lse)


def test_the_manifest_lists_the_features_and_their_arguments():
    """What plan.require_features reads (``features``) and what plan.layout_of fills (the
    arguments), for every gfx950 BF16 kernel of the build."""
    import json
    entries = {e["name"]: e for e in json.loads((PREBUILT / "manifest.json").read_text())["kernels"]}
    for v in VARIANTS:
        e = entries[v.name]
        assert e["features"] == list(catalogue.features(v))
        assert {"window", "softcap", "sinks"} <= set(e["features"])
        names = [a["name"] for a in e["kernargs"]]
        assert {"sinks", "window_left", "window_right", "softcap", "softcap_scale"} <= set(names)
        assert e["kernarg_size"] % 8 == 0 and e["scratch_bytes"] == 0
