"""gfx950's quantize_fp8 kernels (their passes), executed by the emulator through the runtime
(``ZYFA_BACKEND=emulator``, the hazard checker on), against quantize_model bit for bit: every
e4m3 code, every descale and K's mean the same bits, at each granularity, with and without
smooth_k and power-of-two descales, dense and packed (ragged lengths, an empty sequence),
strided views.  Outputs are poisoned first (codes 0x7F, the NaN code; descales and mean NaN):
equality with the model leaves no poison.  Inputs are random bf16 with outlier channels, a K
channel offset (what smooth_k removes), an all-zero group and a constant K head (zero after
smoothing): descale 1."""


import numpy as np
import pytest

from emukit import PREBUILT, bf16, emulator  # noqa: F401 (emulator: a fixture)

from zyfa_runtime import quantize_model
from zyfa_runtime.catalogue import AuxKernel
from zyfa_runtime.quantize import KINDS, QuantizedFP8, quantize_fp8

pytestmark = pytest.mark.skipif(not all((PREBUILT / AuxKernel(k, "gfx950").filename).exists() for k in KINDS),
                                reason="quantize_fp8 gfx950 kernels not built (python build.py --arch gfx950)")


def qkv(rng, q_shape, k_shape, dv):
    """q, k, v (float32, to be rounded to bf16) with the features the groups meet: an outlier
    channel in each, K's channel 7 offset by +25 (the same for every key: smooth_k's case)."""
    q = rng.standard_normal(q_shape)
    k = rng.standard_normal(k_shape)
    v = rng.standard_normal(k_shape[:-1] + (dv,))
    q[..., 5] *= 40
    k[..., 9] *= 30
    k[..., 7] += 25
    v[..., 2] *= 20
    return q, k, v


def poisoned_out(q, k, v, ref) -> QuantizedFP8:
    """Outputs of the model's shapes, every byte poison."""
    codes = lambda x: np.full(x.shape, 0x7F, np.uint8)   # noqa: E731
    nan = lambda a: np.full(np.shape(a), np.nan, np.float32)   # noqa: E731
    return QuantizedFP8(codes(q), codes(k), codes(v), nan(ref.descale_q), nan(ref.descale_k), nan(ref.descale_v),
                        nan(ref.mean))


def assert_same_bits(got: QuantizedFP8, ref):
    for name in ("q", "k", "v"):
        a, b = np.asarray(getattr(got, name)).view(np.uint8), getattr(ref, name)
        assert a.shape == b.shape, name
        diff = np.argwhere(a != b)
        assert not len(diff), f"{name}: {len(diff)} codes differ, first at {diff[0].tolist()}"
    for name in ("descale_q", "descale_k", "descale_v", "mean"):
        a, b = np.asarray(getattr(got, name), np.float32), np.asarray(getattr(ref, name), np.float32)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert not np.isnan(a).any(), f"{name}: NaN (poison left)"
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (name, a, b)


@pytest.mark.parametrize("power_of_two", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["pow2", "fp32"])
@pytest.mark.parametrize("smooth_k", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["smooth", "plain"])
@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
def test_dense_codes_descales_and_mean_are_the_models_bits(emulator, granularity, smooth_k, power_of_two):
    """(B, Sq, Hq, D) = (2, 37, 4, 64), (B, Sk, Hkv, D) = (2, 70, 2, 64), Dv 64: Q in one block,
    K in two (the second partial), two tiles a sequence.  Sequence 1's query heads 2, 3 (its
    head group 1) are zeros, K head 0 of sequence 0 is one constant row repeated."""
    rng = np.random.default_rng(4800 + 10 * GRANS.index(granularity) + 2 * smooth_k + power_of_two)
    q, k, v = qkv(rng, (2, 37, 4, 64), (2, 70, 2, 64), 64)
    q[1, :, 2:] = 0
    k[0, :, 0] = k[0, 0, 0]
    q, k, v = bf16(q), bf16(k), bf16(v)
    ref = quantize_model.quantize_fp8(q, k, v, granularity=granularity, smooth_k=smooth_k,
                                      power_of_two=power_of_two)
    out = poisoned_out(q, k, v, ref)
    got = quantize_fp8(q, k, v, granularity=granularity, smooth_k=smooth_k, power_of_two=power_of_two, out=out)
    assert got is out
    assert_same_bits(got, ref)
    if granularity == "head":
        assert ref.descale_q[1, 1] == 1.0 and (ref.descale_k[0, 0] == 1.0) == smooth_k


GRANS = ("tensor", "head", "block")


@pytest.mark.parametrize("granularity,smooth_k,power_of_two",
                         [pytest.param("block", True, True, marks=pytest.mark.slow),   # with -m slow
                          pytest.param("head", True, False, marks=pytest.mark.slow),
                          pytest.param("tensor", False, True, marks=pytest.mark.slow)])
def test_packed_ragged_sequences_with_an_empty_one_are_the_models_bits(emulator, granularity, smooth_k,
                                                                          power_of_two):
    """Packed (T, H, D) with D 128, Dv 64, Hq 4, Hkv 2: query lengths (1, 0, 300, 45), key
    lengths (300, 0, 1, 129): Q blocks of 128 and K blocks of 64 counted from each sequence's
    first row, a sequence without rows (its descales 1, its mean 0), one of one key (smoothed
    to zeros: descale 1)."""
    rng = np.random.default_rng(300 + GRANS.index(granularity))
    lq, lk = np.array([1, 0, 300, 45]), np.array([300, 0, 1, 129])
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q, k, v = (bf16(x) for x in qkv(rng, (int(cu_q[-1]), 4, 128), (int(cu_k[-1]), 2, 128), 64))
    ref = quantize_model.quantize_fp8(q, k, v, granularity=granularity, smooth_k=smooth_k,
                                      power_of_two=power_of_two, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out = poisoned_out(q, k, v, ref)
    quantize_fp8(q, k, v, granularity=granularity, smooth_k=smooth_k, power_of_two=power_of_two,
                 cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=int(lq.max()), max_seqlen_k=int(lk.max()),
                 out=out)
    assert_same_bits(out, ref)


def test_strided_views_are_read_and_written_where_they_lie_and_nothing_else(emulator):
    """q a view with a padded head stride, k and v views of one interleaved buffer (as a fused
    KV projection lays them out), q's codes written into a view of a larger buffer whose other
    bytes keep their poison; D 40 (not a multiple of 8: a column a thread)."""
    rng = np.random.default_rng(11)
    qf, kf, vf = qkv(rng, (1, 50, 2, 40), (1, 33, 1, 40), 40)
    q_buf = bf16(rng.standard_normal((1, 50, 3, 48)))
    q_buf[:, :, 1:, 4:44] = bf16(qf)
    q = q_buf[:, :, 1:, 4:44]
    kv = bf16(np.stack([kf, vf], axis=2)[:, :, :, 0])       # (1, 33, 2, 40): k at head 0, v at head 1
    k, v = kv[:, :, 0:1], kv[:, :, 1:2]
    ref = quantize_model.quantize_fp8(q, k, v, granularity="block", smooth_k=True)
    q8_buf = np.full((1, 52, 2, 48), 0x7F, np.uint8)
    q8 = q8_buf[:, 1:51, :, 8:48]
    k8, v8 = np.full((1, 33, 1, 40), 0x7F, np.uint8), np.full((1, 33, 1, 40), 0x7F, np.uint8)
    out = QuantizedFP8(q8, k8, v8, *(np.full(np.shape(x), np.nan, np.float32)
                       for x in (ref.descale_q, ref.descale_k, ref.descale_v, ref.mean)))
    quantize_fp8(q, k, v, granularity="block", out=out)
    assert_same_bits(out, ref)
    mask = np.ones(q8_buf.shape, bool)
    mask[:, 1:51, :, 8:48] = False
    assert (q8_buf[mask] == 0x7F).all(), "a byte outside q8 was written"


def test_allocated_outputs_are_device_arrays_of_the_attention_apis_shapes(emulator):
    """Without out=: DeviceArrays, codes fp8_e4m3 in the inputs' shapes, head descales
    (B, Hkv) as descale_q / descale_k / descale_v of flash_attn_func take them."""
    rng = np.random.default_rng(5)
    q, k, v = (bf16(x) for x in qkv(rng, (1, 20, 4, 64), (1, 24, 2, 64), 64))
    got = quantize_fp8(q, k, v, granularity="head")
    assert got.q.dtype == "fp8_e4m3" and got.q.shape == q.shape and got.descale_k.shape == (1, 2)
    host = QuantizedFP8(*(getattr(got, f).numpy() for f in ("q", "k", "v", "descale_q", "descale_k",
                                                             "descale_v", "mean")))
    assert_same_bits(host, quantize_model.quantize_fp8(q, k, v, granularity="head"))


def test_means_at_fp32_ties_round_to_even_and_codes_at_e4m3_ties_too(emulator):
    """K of two keys: channel 0 (2^10, 2^-14) has mean 2^9 + 2^-15, halfway between 2^9 and its
    fp32 neighbour up: it stays 2^9 (even); channel 1 (2^10, 1.5 2^-13) has mean 2^9 + 1.5
    2^-14, halfway between an odd and an even neighbour: up to 2^9 + 2^-13; channel 2 (-0, -0)
    has mean +0 (the model's sum starts from +0).  Q (descale 1: amax 448) holds e4m3 ties: 1 + 2^-4 (between 1 and 1 + 2^-3:
    down to 1) and 1 + 3 2^-4 (between 1 + 2^-3 and 1 + 2^-2: up), 2^-10 (half the least
    subnormal: 0) and -3 2^-10 (-2^-9 and -2^-8: to -2^-8), 464 (between 448 and 480, not a
    code: 448), as the model rounds them."""
    k = np.zeros((1, 2, 1, 64), np.float32)
    k[0, :, 0, 0] = (2.0 ** 10, 2.0 ** -14)
    k[0, :, 0, 1] = (2.0 ** 10, 1.5 * 2.0 ** -13)
    k[0, :, 0, 2] = -0.0
    k[0, :, 0, 3:] = np.random.default_rng(3).standard_normal((2, 61))
    q = np.zeros((1, 8, 1, 64), np.float32)
    q[0, 0, 0, :6] = (448.0, 1 + 2.0 ** -4, 1 + 3 * 2.0 ** -4, 2.0 ** -10, -3 * 2.0 ** -10, -0.0)
    q, k, v = bf16(q), bf16(k), bf16(k)
    ref = quantize_model.quantize_fp8(q, k, v, granularity="tensor", smooth_k=True)
    assert ref.mean[0, 0, 0] == 2.0 ** 9 and ref.mean[0, 0, 1] == 2.0 ** 9 + 2.0 ** -13
    assert ref.mean[0, 0, 2] == 0 and not np.signbit(ref.mean[0, 0, 2]) and ref.descale_q == 1.0
    assert ref.q[0, 0, 0, :6].tolist() == [0x7E, 0x38, 0x3A, 0x00, 0x82, 0x80]
    out = poisoned_out(q, k, v, ref)
    quantize_fp8(q, k, v, granularity="tensor", smooth_k=True, out=out)
    assert_same_bits(out, ref)
