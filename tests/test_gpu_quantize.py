"""quantize_fp8 on a real GPU (the device's arch: sm_90a on NVIDIA, gfx950 on AMD): every code,
descale and K mean the bits of quantize_model, at each granularity, dense and packed, into
poisoned outputs; the codes and descales fed to flash_attn_func give the attention of the
dequantised inputs within the FP8 recipe's bound.  Skipped (and reported) where no GPU backend
is present, as tests/test_gpu.py."""

import ml_dtypes
import numpy as np
import pytest

from tests.test_gpu import DRIVER, WHY

from zyfa_runtime import flash_attn_func, quantize_fp8, quantize_model, reference
from zyfa_runtime.memory import to_device
from zyfa_runtime.quantize import OUT_FIELDS, QuantizedFP8

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DRIVER is None, reason=WHY)]


def inputs(rng, q_shape, k_shape, dv):
    """bf16 q, k, v with an outlier channel each and K's channel 7 offset (smooth_k's case)."""
    q, k = rng.standard_normal(q_shape), rng.standard_normal(k_shape)
    v = rng.standard_normal(k_shape[:-1] + (dv,))
    q[..., 5] *= 40
    k[..., 9] *= 30
    k[..., 7] += 25
    v[..., 2] *= 20
    return tuple(x.astype(np.float32).astype(ml_dtypes.bfloat16) for x in (q, k, v))


def poisoned(ref) -> QuantizedFP8:
    """Device outputs of the model's shapes: codes 0x7F (the NaN code), descales and mean NaN."""
    arrays = []
    for f in OUT_FIELDS:
        x = getattr(ref, f)
        if f in ("q", "k", "v"):
            arrays.append(to_device(DRIVER, 0, np.full(x.shape, 0x7F, np.uint8), "fp8_e4m3"))
        else:
            arrays.append(to_device(DRIVER, 0, np.full(np.shape(x), np.nan, np.float32), "float32"))
    return QuantizedFP8(*arrays)


def assert_model_bits(out: QuantizedFP8, ref):
    for f in OUT_FIELDS:
        got, want = out.__dict__[f].numpy(), np.asarray(getattr(ref, f))
        if f in ("q", "k", "v"):
            assert np.array_equal(got.view(np.uint8), want), f"{f}: {int((got.view(np.uint8) != want).sum())} codes"
        else:
            # a tensor descale comes back (1,) (a 0-d host array reaches the device as one value)
            got = got.reshape(want.shape)
            assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32)), f


@pytest.mark.parametrize("power_of_two", [True, False], ids=["pow2", "fp32"])
@pytest.mark.parametrize("smooth_k", [True, False], ids=["smooth", "plain"])
@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
def test_dense_outputs_are_the_models_bits(granularity, smooth_k, power_of_two):
    """(B, S, Hq, Hkv, D) = (2, 1000, 8, 2, 128): 32-row tiles and 128/64-row blocks, the last
    partial; sequence 1's head group 0 zeros (descale 1)."""
    rng = np.random.default_rng(48)
    q, k, v = inputs(rng, (2, 1000, 8, 128), (2, 1000, 2, 128), 128)
    q[1, :, :4] = 0
    ref = quantize_model.quantize_fp8(q, k, v, granularity=granularity, smooth_k=smooth_k, power_of_two=power_of_two)
    out = poisoned(ref)
    dev = [to_device(DRIVER, 0, x, "bf16") for x in (q, k, v)]
    assert quantize_fp8(*dev, granularity=granularity, smooth_k=smooth_k, power_of_two=power_of_two, out=out) is out
    assert_model_bits(out, ref)


@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
def test_packed_ragged_outputs_are_the_models_bits(granularity):
    """Query lengths (1, 0, 3000, 129), key lengths (4097, 0, 1, 200), D 64, Dv 128."""
    rng = np.random.default_rng(49)
    lq, lk = np.array([1, 0, 3000, 129]), np.array([4097, 0, 1, 200])
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q, k, v = inputs(rng, (int(cu_q[-1]), 4, 64), (int(cu_k[-1]), 4, 64), 128)
    ref = quantize_model.quantize_fp8(q, k, v, granularity=granularity, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out = poisoned(ref)
    dev = [to_device(DRIVER, 0, x, "bf16") for x in (q, k, v)]
    quantize_fp8(*dev, granularity=granularity, cu_seqlens_q=to_device(DRIVER, 0, cu_q, "int32"),
                 cu_seqlens_k=to_device(DRIVER, 0, cu_k, "int32"), max_seqlen_q=int(lq.max()),
                 max_seqlen_k=int(lk.max()), out=out)
    assert_model_bits(out, ref)


@pytest.mark.parametrize("granularity", ["tensor", "head"])
def test_quantized_outputs_feed_flash_attn_func(granularity):
    """The codes and descales (shapes () and (B, Hkv): what flash_attn_func takes) give the
    attention of the dequantised Q, K - mean, V within the recipe's fp64 bound; smoothing K
    shifts each row's scores by one amount, which softmax ignores."""
    from zyfa_runtime.selfcheck import RECIPE_FP64_BOUND
    rng = np.random.default_rng(50)
    q, k, v = inputs(rng, (2, 300, 4, 128), (2, 500, 2, 128), 128)
    dev = [to_device(DRIVER, 0, x, "bf16") for x in (q, k, v)]
    got = quantize_fp8(*dev, granularity=granularity, smooth_k=True)
    out = flash_attn_func(got.q, got.k, got.v, descale_q=got.descale_q, descale_k=got.descale_k,
                          descale_v=got.descale_v)
    ref = quantize_model.quantize_fp8(q, k, v, granularity=granularity, smooth_k=True)
    gran, group = ("tensor", 1) if granularity == "tensor" else ("head", 2)
    deq_q = quantize_model.dequantize(ref.q, ref.descale_q, granularity=gran, heads_of_group=group)
    deq_k = quantize_model.dequantize(ref.k, ref.descale_k, granularity=gran)
    deq_v = quantize_model.dequantize(ref.v, ref.descale_v, granularity=gran)
    o = out.numpy().astype(np.float64)
    assert not np.isnan(o).any()
    assert reference.relative_error(o, reference.attention(deq_q, deq_k, deq_v)) < RECIPE_FP64_BOUND
