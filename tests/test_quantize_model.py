"""The numpy model of quantize_fp8 (zyfa_runtime/quantize_model.py), the contract its kernels
will be checked against: power-of-two descales from the exact amax, every value within e4m3's
rounding of its input, groups as the attention kernels read them, smooth_k exact under softmax
with the LSE shifted by softmax_scale q . mean, finer groups no worse than coarser ones."""

import ml_dtypes
import numpy as np
import pytest

from zyfa_runtime import reference
from zyfa_runtime.quantize_model import GRANULARITIES, K_BLOCK, Q_BLOCK, dequantize, pow2_descale, quantize_fp8


def bf16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(ml_dtypes.bfloat16)


def test_a_power_of_two_descale_is_the_least_that_keeps_amax_within_448():
    amax = np.array([448.0, np.nextafter(448.0, 0), np.nextafter(448.0, 1e9), 224.0, 1e-30, 3.7e5, 0.0])
    d = pow2_descale(amax).astype(np.float64)
    assert d.tolist()[:4] == [1.0, 1.0, 2.0, 0.5] and d[-1] == 1.0
    live = amax > 0
    assert ((amax / d)[live] <= 448).all() and ((amax / d)[live] > 224).all()
    assert (np.log2(d) == np.round(np.log2(d))).all()


def _cases():
    for g in GRANULARITIES:
        for smooth in (False, True):
            for packed in (False, True):
                yield pytest.param(g, smooth, packed, id=f"{g}-{'smooth' if smooth else 'plain'}-"
                                                        f"{'packed' if packed else 'dense'}")


@pytest.mark.parametrize("granularity,smooth_k,packed", list(_cases()))
def test_every_value_is_its_input_within_e4m3_rounding_under_its_groups_descale(granularity, smooth_k, packed):
    """GQA 4:2, sequences of 200 and 75 rows (blocks cut mid-sequence, a short last one), K
    with a large mean per channel (what smooth_k removes)."""
    rng = np.random.default_rng(48)
    lens = [200, 75]
    if packed:
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        q, k, v = bf16(rng, (275, 4, 64)), bf16(rng, (275, 2, 64)), bf16(rng, (275, 2, 64))
        opts = dict(cu_seqlens_q=cu, cu_seqlens_k=cu)
    else:
        lens = [200, 200]
        q, k, v = bf16(rng, (2, 200, 4, 64)), bf16(rng, (2, 200, 2, 64)), bf16(rng, (2, 200, 2, 64))
        cu, opts = None, {}
    k = (k.astype(np.float32) + rng.standard_normal(64).astype(np.float32) * 8).astype(ml_dtypes.bfloat16)
    r = quantize_fp8(q, k, v, granularity=granularity, smooth_k=smooth_k, **opts)
    blocks = {"q": Q_BLOCK, "k": K_BLOCK, "v": 0} if granularity == "block" else {"q": 0, "k": 0, "v": 0}
    groups = {"q": 2 if granularity == "head" else 1, "k": 1, "v": 1}
    for name, x, codes, ds in (("q", q, r.q, r.descale_q), ("k", k, r.k, r.descale_k), ("v", v, r.v, r.descale_v)):
        x = np.asarray(x, np.float64)
        if name == "k" and smooth_k:
            x = _minus_mean(x, r.mean, cu)
        back = dequantize(codes, ds, granularity=granularity, block=blocks[name], heads_of_group=groups[name],
                          cu_seqlens=cu)
        dsx = dequantize(np.full(codes.shape, 0x38, np.uint8), ds, granularity=granularity, block=blocks[name],
                         heads_of_group=groups[name], cu_seqlens=cu)   # code 0x38 is 1.0: each value's descale
        err = np.abs(back - x)
        assert (err <= np.maximum(2.0 ** -4 * np.abs(x), 2.0 ** -10 * dsx)).all(), name   # half a step
        assert (np.abs(x) / dsx <= 448).all(), name                       # nothing saturates
    assert ((r.descale_q > 0) & (np.log2(r.descale_q) % 1 == 0)).all()
    assert r.descale_q.shape == {"tensor": (), "head": (2, 2), "block": (2, 4, 2)}[granularity]
    assert r.descale_k.shape == {"tensor": (), "head": (2, 2), "block": (2, 2, 4)}[granularity]


def _minus_mean(k, mean, cu):
    out = k.copy()
    if cu is None:
        return out - mean[:, None]
    for b in range(len(cu) - 1):
        out[cu[b]:cu[b + 1]] -= mean[b]
    return out


def test_smooth_k_leaves_attention_unchanged_and_shifts_the_lse_by_scale_q_dot_mean():
    rng = np.random.default_rng(3)
    q, k, v = bf16(rng, (1, 50, 2, 64)), bf16(rng, (1, 60, 2, 64)), bf16(rng, (1, 60, 2, 64))
    k = (k.astype(np.float32) + 5).astype(ml_dtypes.bfloat16)
    r = quantize_fp8(q, k, v, granularity="tensor", smooth_k=True)
    kd = dequantize(r.k, r.descale_k, granularity="tensor")
    q64 = np.asarray(q, np.float64)
    o_s, lse_s = reference.attention(q64, kd, np.asarray(v, np.float64), return_lse=True)
    o, lse = reference.attention(q64, kd + r.mean[:, None].astype(np.float64), np.asarray(v, np.float64),
                                 return_lse=True)
    assert np.abs(o_s - o).max() < 1e-12
    shift = np.einsum("bshd,bhd->bhs", q64, r.mean.astype(np.float64)) / np.sqrt(64)
    assert np.abs(lse_s + shift - lse).max() < 1e-9
    assert np.abs(r.mean - 5).max() < 0.5


def test_block_descales_keep_an_outlier_block_from_costing_the_rest_of_the_sequence():
    """A block of 64 keys 65536x larger than the others: per-tensor, every other key falls to a
    few subnormal codes; per block, their error stays e4m3's."""
    rng = np.random.default_rng(7)
    q, k, v = bf16(rng, (1, 256, 1, 64)), bf16(rng, (1, 256, 1, 64)), bf16(rng, (1, 256, 1, 64))
    k[:, :64] = (k[:, :64].astype(np.float32) * 65536).astype(ml_dtypes.bfloat16)
    errors = {}
    for g in ("tensor", "block"):
        r = quantize_fp8(q, k, v, granularity=g, smooth_k=False)
        back = dequantize(r.k, r.descale_k, granularity=g, block=K_BLOCK)
        rest = np.asarray(k, np.float64)[:, 64:]
        errors[g] = np.linalg.norm(back[:, 64:] - rest) / np.linalg.norm(rest)
    assert errors["block"] < 0.04 < 4 * errors["block"] < errors["tensor"], errors


def test_the_default_granularity_gives_the_descales_every_fp8_kernel_takes():
    """(B, Hkv) for q, k and v: a default call's outputs go straight into flash_attn_func."""
    rng = np.random.default_rng(0)
    q, k, v = bf16(rng, (2, 8, 4, 64)), bf16(rng, (2, 8, 2, 64)), bf16(rng, (2, 8, 2, 64))
    got = quantize_fp8(q, k, v)
    assert got.descale_q.shape == got.descale_k.shape == got.descale_v.shape == (2, 2)


def test_non_finite_inputs_and_unknown_granularities_are_refused():
    rng = np.random.default_rng(0)
    q, k, v = bf16(rng, (1, 8, 1, 64)), bf16(rng, (1, 8, 1, 64)), bf16(rng, (1, 8, 1, 64))
    with pytest.raises(ValueError, match="granularity"):
        quantize_fp8(q, k, v, granularity="channel")
    q[0, 3, 0, 5] = np.inf
    with pytest.raises(ValueError, match="finite"):
        quantize_fp8(q, k, v)
