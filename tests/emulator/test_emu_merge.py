"""gfx950's merge_attention_states kernel, executed by the emulator through the runtime
(``ZYFA_BACKEND=emulator``), against the fp64 merge (reference.merge_attention_states) within
the bounds of its arithmetic (merge.bounds): O within 2^-8 plus the fp32 terms in norm, the LSE
within a few fp32 ulps.  Rows with no keys on one side are the other side bit for bit; on both,
zeros and -inf.  Outputs are poisoned with NaN first; a NaN never passes."""


import ml_dtypes
import numpy as np
import pytest

from emukit import PREBUILT, emulated

from zyfa_runtime import reference
from zyfa_runtime.catalogue import AuxKernel
from zyfa_runtime.merge import bounds, merge_attention_states

KERNEL = AuxKernel("merge_attention_states", "gfx950")
pytestmark = pytest.mark.skipif(not (PREBUILT / KERNEL.filename).exists(),
                                reason=f"{KERNEL.filename} not built (python build.py --arch gfx950)")


@pytest.fixture(scope="module")
def emulator(request):
    with emulated(request) as driver:
        yield driver


def bf16(rng, shape):
    return rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.bfloat16)


def lses(rng, shape, spread=4.0):
    """LSEs of partial attentions: a few units apart from side to side, as key sets of
    different sizes and scores give them."""
    return (rng.standard_normal(shape) * spread + 3.0).astype(np.float32)


def check_merge(o_a, lse_a, o_b, lse_b, out, out_lse):
    """out, out_lse (numpy, as written) against the fp64 merge of the same inputs."""
    ref_o, ref_lse = reference.merge_attention_states(o_a, lse_a, o_b, lse_b)
    o = np.asarray(out, np.float64)
    lse = np.asarray(out_lse, np.float64)
    assert not np.isnan(o).any() and not np.isnan(lse).any(), "NaN (poison left, or computed)"
    o_bound, lse_bound = bounds(o_a, lse_a, o_b, lse_b, ref_o, ref_lse)
    error = np.linalg.norm(o - ref_o) / np.linalg.norm(ref_o)
    assert error <= o_bound, (error, o_bound)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), "rows without keys differ"
    finite = np.isfinite(ref_lse)
    assert (np.abs(lse[finite] - ref_lse[finite]) <= lse_bound[finite]).all(), \
        float(np.abs(lse[finite] - ref_lse[finite]).max())
    return error


def test_dense_merge_matches_fp64_with_rows_empty_on_one_side_or_both(emulator):
    """(B, S, H, D) = (2, 19, 3, 64), 19 rows: two workgroups of 8 and a partial third, 16
    bytes a thread.  Row (b=0, s=0, h=0) has no keys in A, (0, 2, 1) none in B, (1, 3, 2) none
    in either; the empty side's O holds NaN there, which must not leak."""
    rng = np.random.default_rng(20261205)
    shape = (2, 19, 3, 64)
    o_a, o_b = bf16(rng, shape), bf16(rng, shape)
    lse_a, lse_b = lses(rng, (2, 3, 19)), lses(rng, (2, 3, 19))
    for (b, s, h), sides in (((0, 0, 0), "a"), ((0, 2, 1), "b"), ((1, 3, 2), "ab")):
        for side in sides:
            (lse_a if side == "a" else lse_b)[b, h, s] = -np.inf
            (o_a if side == "a" else o_b)[b, s, h] = np.nan
    o_b[0, 0, 0, :3] = -0.0          # kept as -0.0 where o_b is taken as it is
    out = np.full(shape, np.nan, ml_dtypes.bfloat16)
    out_lse = np.full((2, 3, 19), np.nan, np.float32)
    got = merge_attention_states(o_a, lse_a, o_b, lse_b, out=out, out_lse=out_lse)
    assert got[0] is out and got[1] is out_lse
    o_a[0, 0, 0] = o_b[0, 2, 1] = 0   # the reference reads no weight-0 side either; keep the norms finite
    o_a[1, 3, 2] = o_b[1, 3, 2] = 0
    check_merge(o_a, lse_a, o_b, lse_b, out, out_lse)
    assert np.array_equal(out[0, 0, 0].view(np.uint16), o_b[0, 0, 0].view(np.uint16))
    assert out_lse[0, 0, 0] == lse_b[0, 0, 0]
    assert np.array_equal(out[0, 2, 1].view(np.uint16), o_a[0, 2, 1].view(np.uint16))
    assert out_lse[0, 1, 2] == lse_a[0, 1, 2]
    assert (out[1, 3, 2].astype(np.float32) == 0).all() and out_lse[1, 2, 3] == -np.inf


def test_packed_strided_views_are_read_and_written_where_they_lie(emulator):
    """Packed (T, H, D) = (13, 2, 128) with LSEs (H, T): o_b and out are views into larger
    buffers (a padded head stride and a row gap; o_b's rows 8 bytes off 16: a column a
    thread), out_lse a view with a padded row stride; every element outside the views keeps
    its poison."""
    rng = np.random.default_rng(49)
    t, h, d = 13, 2, 128
    o_a = bf16(rng, (t, h, d))
    o_b_buf = bf16(rng, (t, 2 * h + 1, d + 8))
    o_b = o_b_buf[:, 1:2 * h + 1:2, 4:4 + d]
    lse_a, lse_b = lses(rng, (h, t)), lses(rng, (h, t))
    lse_b[1, 5] = -np.inf
    o_a[5, 1, :3] = -0.0
    out_buf = np.full((t + 2, h, d + 16), np.nan, ml_dtypes.bfloat16)
    out = out_buf[1:t + 1, :, 8:8 + d]
    lse_buf = np.full((h, t + 3), np.nan, np.float32)
    out_lse = lse_buf[:, 2:2 + t]
    merge_attention_states(o_a, lse_a, o_b, lse_b, out=out, out_lse=out_lse)
    check_merge(o_a, lse_a, o_b, lse_b, out, out_lse)
    assert np.array_equal(out[5, 1].view(np.uint16), o_a[5, 1].view(np.uint16))
    written = np.zeros(out_buf.shape, bool)
    written[1:t + 1, :, 8:8 + d] = True
    assert np.isnan(out_buf[~written].astype(np.float32)).all(), "a byte outside out was written"
    assert np.isnan(lse_buf[:, :2]).all() and np.isnan(lse_buf[:, 2 + t:]).all()


def test_merge_in_place_into_o_a_and_lse_a_gives_the_bits_of_a_merge_into_new_tensors(emulator):
    """out=o_a and out_lse=lse_a (the accumulator of a ring over key blocks): each element is
    read before it is written, each LSE of the workgroup before any is written."""
    rng = np.random.default_rng(7)
    shape = (1, 21, 4, 128)
    o_a, o_b = bf16(rng, shape), bf16(rng, shape)
    lse_a, lse_b = lses(rng, (1, 4, 21)), lses(rng, (1, 4, 21))
    lse_b[0, 2, :4] = -np.inf
    fresh, fresh_lse = merge_attention_states(o_a, lse_a, o_b, lse_b, out=np.full(shape, np.nan, ml_dtypes.bfloat16),
                                              out_lse=np.full((1, 4, 21), np.nan, np.float32))
    acc, acc_lse = o_a.copy(), lse_a.copy()
    merge_attention_states(acc, acc_lse, o_b, lse_b, out=acc, out_lse=acc_lse)
    assert np.array_equal(acc.view(np.uint16), fresh.view(np.uint16))
    assert np.array_equal(acc_lse, fresh_lse)
    check_merge(o_a, lse_a, o_b, lse_b, acc, acc_lse)


def test_partial_attentions_merged_are_the_attention_over_all_keys(emulator):
    """The use the kernel is for: attention over keys [0, 40) and [40, 96) of one causal
    sequence (the first part's later queries see all of it, the second part's rows 0..39 see
    none of it: LSE -inf), each rounded as a kernel writes it (bf16 O, fp32 LSE), merged on the
    device: within the merge's bound of the fp64 merge of those parts, and within the bf16
    rounding of the parts themselves (2 x 2^-8, plus the merge's) of the whole attention."""
    rng = np.random.default_rng(96)
    q, k, v = (rng.standard_normal((1, 96, 2, 64)) for _ in range(3))
    scale = 1 / np.sqrt(64)

    def part(lo, hi):
        """Causal attention of every query over keys [lo, hi) only (query i sees key j <= i)."""
        s = np.einsum("bqhd,bkhd->bhqk", q, k[:, lo:hi]) * scale
        s = np.where(np.arange(lo, hi)[None, None, None, :] <= np.arange(96)[None, None, :, None], s, -np.inf)
        m = s.max(-1, keepdims=True)
        live = np.isfinite(m)
        p = np.exp(s - np.where(live, m, 0))
        l = p.sum(-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            o = np.where(live, np.einsum("bhqk,bkhd->bhqd", p, v[:, lo:hi]) / l, 0).transpose(0, 2, 1, 3)
            lse = np.where(live[..., 0], m[..., 0] + np.log(l[..., 0]), -np.inf)
        return o.astype(np.float32).astype(ml_dtypes.bfloat16), lse.astype(np.float32)
    (o_a, lse_a), (o_b, lse_b) = part(0, 40), part(40, 96)
    assert np.isneginf(lse_b[:, :, :40]).all() and np.isfinite(lse_a).all()
    out, out_lse = merge_attention_states(o_a, lse_a, o_b, lse_b,
                                          out=np.full(o_a.shape, np.nan, ml_dtypes.bfloat16),
                                          out_lse=np.full(lse_a.shape, np.nan, np.float32))
    merge_error = check_merge(o_a, lse_a, o_b, lse_b, out, out_lse)
    assert np.array_equal(out[:, :40].view(np.uint16), o_a[:, :40].view(np.uint16))
    whole, whole_lse = reference.attention(q, k, v, causal=True, return_lse=True)
    error = np.linalg.norm(np.asarray(out, np.float64) - whole) / np.linalg.norm(whole)
    assert error <= 2 * 2.0 ** -8 + merge_error, error
    assert np.abs(out_lse - whole_lse).max() <= 1e-5


def test_ties_round_to_even_and_a_nan_lse_gives_a_nan_row(emulator):
    """Equal LSEs weigh both sides 1/2 exactly, so (1 + (1 + 2^-7)) / 2 = 1 + 2^-8 is an exact
    tie between two bf16 neighbours: it rounds to the even one, 1.0 (and 1 + 3 2^-8 to
    1 + 2^-6).  A NaN LSE on either side is not taken for a row without keys."""
    shape = (1, 3, 1, 2)
    o_a = np.array([1.0, 1.0 + 2.0 ** -7] * 3, np.float32).reshape(shape).astype(ml_dtypes.bfloat16)
    o_b = np.array([1.0 + 2.0 ** -7, 1.0 + 2.0 ** -6] * 3, np.float32).reshape(shape).astype(ml_dtypes.bfloat16)
    lse_a = np.array([[[0.5, np.nan, 0.5]]], np.float32)
    lse_b = np.array([[[0.5, 0.5, np.nan]]], np.float32)
    out, out_lse = merge_attention_states(o_a, lse_a, o_b, lse_b, out=np.zeros(shape, ml_dtypes.bfloat16),
                                          out_lse=np.zeros((1, 1, 3), np.float32))
    assert out[0, 0, 0].astype(np.float32).tolist() == [1.0, 1.0 + 2.0 ** -6]
    assert out_lse[0, 0, 0] == np.float32(0.5 + np.log(2.0))
    assert np.isnan(out[0, 1:].astype(np.float32)).all() and np.isnan(out_lse[0, 0, 1:]).all()
    ref_o, ref_lse = reference.merge_attention_states(o_a, lse_a, o_b, lse_b)
    assert np.isnan(ref_o[0, 1:]).all() and np.isnan(ref_lse[0, 0, 1:]).all()
