"""merge_attention_states on a real GPU (the device's arch: sm_90a on NVIDIA, gfx950 on AMD),
against the fp64 merge within the bounds of its arithmetic (merge.bounds); outputs poisoned
first, rows with no keys on one side the other side bit for bit, the merge in place equal to a
merge into new tensors.  Skipped (and reported) where no GPU backend is present, as
tests/test_gpu.py."""

import ml_dtypes
import numpy as np
import pytest

from tests.test_gpu import DRIVER, WHY

from zyfa_runtime import merge_attention_states, reference
from zyfa_runtime.memory import to_device, view
from zyfa_runtime.merge import bounds

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DRIVER is None, reason=WHY)]


def inputs(rng, lead, h, d):
    """o_a, o_b bf16 (lead + (h, d)) and LSEs (h-major), some rows without keys on one side or
    both (their O garbage: the empty side is never read), as host arrays."""
    o_a, o_b = (rng.standard_normal(lead + (h, d)).astype(np.float32).astype(ml_dtypes.bfloat16) for _ in "ab")
    lse_shape = lead[:-1] + (h, lead[-1])
    lse_a, lse_b = ((rng.standard_normal(lse_shape) * 4 + 3).astype(np.float32) for _ in "ab")
    rows = np.moveaxis(np.arange(np.prod(lse_shape)).reshape(lse_shape), -2, -1) % 7
    for lse, o, r in ((lse_a, o_a, 1), (lse_b, o_b, 2)):
        empty = (rows == r) | (rows == 3)
        np.moveaxis(lse, -2, -1)[empty] = -np.inf
        o[empty] = np.nan
    return o_a, lse_a, o_b, lse_b


def check(o_a, lse_a, o_b, lse_b, out, out_lse):
    ref_o, ref_lse = reference.merge_attention_states(o_a, lse_a, o_b, lse_b)
    o, lse = np.asarray(out, np.float64), np.asarray(out_lse, np.float64)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    zero = lambda x: np.where(np.isnan(x.astype(np.float32)), 0, x)   # noqa: E731  (the unread garbage)
    o_bound, lse_bound = bounds(zero(o_a), lse_a, zero(o_b), lse_b, ref_o, ref_lse)
    assert np.linalg.norm(o - ref_o) / np.linalg.norm(ref_o) <= o_bound
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    assert (np.abs(lse[finite] - ref_lse[finite]) <= lse_bound[finite]).all()
    one_sided = np.moveaxis(np.isneginf(lse_b) & np.isfinite(lse_a), -2, -1)
    assert np.array_equal(np.asarray(out).view(np.uint16)[one_sided], o_a.view(np.uint16)[one_sided])


@pytest.mark.parametrize("lead,h,d", [((3, 200), 4, 128), ((517,), 8, 64), ((2, 77), 2, 256)],
                         ids=["dense", "packed", "d256"])
def test_merge_matches_fp64_in_views_of_larger_buffers(lead, h, d):
    """out and out_lse are views into poisoned buffers one row and a head larger, 8 columns
    wider: every element of the views is written, not one outside."""
    rng = np.random.default_rng(sum(lead) * h + d)
    o_a, lse_a, o_b, lse_b = inputs(rng, lead, h, d)
    dev = [to_device(DRIVER, 0, x, t) for x, t in ((o_a, "bf16"), (lse_a, "float32"), (o_b, "bf16"),
                                                    (lse_b, "float32"))]
    big = np.full(lead[:-1] + (lead[-1] + 1, h + 1, d + 8), 0xFFFF, np.uint16)
    inside = np.zeros(big.shape, bool)
    inside[..., :lead[-1], 1:, 8:] = True
    out_dev = to_device(DRIVER, 0, big, "bf16")
    out = view(out_dev, big[..., :lead[-1], 1:, 8:], big)
    lse_big = np.full(lead[:-1] + (h, lead[-1] + 5), np.nan, np.float32)
    lse_dev = to_device(DRIVER, 0, lse_big, "float32")
    out_lse = view(lse_dev, lse_big[..., 5:], lse_big)
    merge_attention_states(dev[0], dev[1], dev[2], dev[3], out=out, out_lse=out_lse)
    got = out_dev.numpy().view(np.uint16)
    assert (got[~inside] == 0xFFFF).all(), "written outside out"
    got_lse = lse_dev.numpy()
    assert np.isnan(got_lse[..., :5]).all(), "written outside out_lse"
    check(o_a, lse_a, o_b, lse_b, got[inside].reshape(lead + (h, d)).view(ml_dtypes.bfloat16), got_lse[..., 5:])


def test_merge_in_place_gives_the_bits_of_a_merge_into_new_tensors():
    """out=o_a, out_lse=lse_a over 64k rows (8,192 workgroups in flight together): no thread's
    LSE write lands before another's read of it."""
    rng = np.random.default_rng(5)
    o_a, lse_a, o_b, lse_b = inputs(rng, (65536,), 2, 64)
    a, la, b, lb = (to_device(DRIVER, 0, x, t) for x, t in ((o_a, "bf16"), (lse_a, "float32"), (o_b, "bf16"),
                                                             (lse_b, "float32")))
    fresh, fresh_lse = merge_attention_states(a, la, b, lb)
    merge_attention_states(a, la, b, lb, out=a, out_lse=la)
    assert np.array_equal(a.numpy().view(np.uint16), fresh.numpy().view(np.uint16))
    assert np.array_equal(la.numpy(), fresh_lse.numpy(), equal_nan=True)
    check(o_a, lse_a, o_b, lse_b, fresh.numpy().view(ml_dtypes.bfloat16), fresh_lse.numpy())
