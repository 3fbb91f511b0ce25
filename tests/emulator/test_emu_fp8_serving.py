"""Packed FP8 batches whose cu_seqlens are not checked, on the gfx950 FP8 assembly run by the
emulator, as a specification.

With ``check_cu_seqlens=False`` the device cu_seqlens are not read back: the kernel clamps
each sequence to the tensors' rows itself (first row to [0, total], end to [first, total],
length to max_seqlen), as the gfx950 BF16 kernels do.  Values that are no valid batch
(decreasing, negative, past the end, longer than max_seqlen, INT32_MIN / INT32_MAX) run in the
strict emulator (no access outside an allocation passes) into outputs inside guarded
allocations; values whose clamped segments are a batch give, per segment, the ``gfx950``
recipe's output and the fp64 reference's within the recipe's error, and rows of no segment
are not written.

The code objects are built from this checkout's sources into a temporary directory."""

import ml_dtypes
import numpy as np
import pytest

from emukit import emulated

from zyfa_runtime import flash_attn_varlen_func, reference
from zyfa_runtime.memory import DeviceArray, to_device
from zyfa_runtime.selfcheck import MODEL_LSE_BOUND, MODEL_O_BOUND, RECIPE_FP64_BOUND

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
F8 = ml_dtypes.float8_e4m3fn
TOTAL_Q, TOTAL_K, HQ, HKV, D = 70, 90, 2, 1, 64


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    import build
    out = tmp_path_factory.mktemp("prebuilt")
    assert build.main(["--arch", "gfx950", "--only", "fp8_e4m3_d64x64", "--out", str(out), "--jobs", "2"]) == 0
    return out


@pytest.fixture
def emulator(prebuilt, request):
    # strict: only allocations and the call's own tensors are memory a kernel may touch
    with emulated(request, prebuilt, ZYFA_EMULATOR_STRICT_HOST="1") as driver:
        yield driver


def packed(emulator, rng):
    """q, k, v (TOTAL_Q / TOTAL_K rows) as e4m3 host arrays with their descales, and on the
    device."""
    host = []
    for rows, heads in ((TOTAL_Q, HQ), (TOTAL_K, HKV), (TOTAL_K, HKV)):
        x = rng.standard_normal((rows, heads, D)).astype(np.float32)
        d = np.float32(np.abs(x).max() / 448.0)
        host.append(((x / d).astype(F8), d))
    return host, [to_device(emulator, 0, x.view(np.uint8), "fp8_e4m3") for x, _ in host]


def run(emulator, dev, descales, cu_q, cu_k, max_q, max_k, causal=False):
    """One unchecked packed call into poisoned out and LSE allocations of the whole rows."""
    cq, ck = (to_device(emulator, 0, np.array(c, np.int32), "int32") for c in (cu_q, cu_k))
    out = DeviceArray(emulator, 0, (TOTAL_Q, HQ, D), "bf16")
    lse = DeviceArray(emulator, 0, (HQ, TOTAL_Q), "float32")
    emulator.memset_d8(out.ptr, 0xFF, out.nbytes)
    emulator.memset_d8(lse.ptr, 0xFF, lse.nbytes)
    ds = [to_device(emulator, 0, np.array([d], np.float32), "float32") for d in descales]
    flash_attn_varlen_func(*dev, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max_q, max_seqlen_k=max_k,
                           causal=causal, out=out, lse=lse, return_lse=True, check_cu_seqlens=False,
                           descale_q=ds[0], descale_k=ds[1], descale_v=ds[2])
    return out.numpy().astype(np.float64), lse.numpy().astype(np.float64)


#: Values that are no batch, run with max_seqlen 64 / 80: all but the fifth (inside the rows, cut
#: by max_seqlen) reach outside the tensors without the clamp (checked once against the
#: unclamped kernel: the emulator stopped each)
ADVERSARIAL = [
    ([0, 50, 10, 70], [0, 90, 20, 5]),                                # decreasing
    ([0, 50, 10, 200], [0, 90, 20, 500]),                             # decreasing, then past the end
    ([0, 20, 40, 75], [0, 30, 60, 95]),                               # ending 5 rows past the end
    ([-30, 20, 40, 70], [0, 30, 60, 90]),                             # starting before the first row
    ([0, 70, 70, 70], [0, 90, 90, 90]),                               # longer than max_seqlen
    ([-40, 7, 1 << 30, INT32_MAX], [INT32_MIN, -1, 0, INT32_MAX]),     # negative, huge
    ([INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN], [3, INT32_MAX, 2, INT32_MIN]),   # differences overflowing
]


@pytest.mark.parametrize("causal", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("cu_q,cu_k", ADVERSARIAL)
def test_adversarial_cu_seqlens_never_reach_outside_the_tensors(emulator, causal, cu_q, cu_k):
    rng = np.random.default_rng()
    host, dev = packed(emulator, rng)
    before = emulator.launches
    o, lse = run(emulator, dev, [d for _, d in host], cu_q, cu_k, 64, 80, causal)
    assert emulator.launches == before + 1   # ran, every access inside an allocation (strict emulator)
    written = ~np.isnan(o).all(axis=(1, 2))
    assert not np.isnan(o[written]).any() and not np.isnan(lse[:, written]).any()


def test_cu_seqlens_are_clamped_to_the_rows_and_max_seqlen(emulator):
    """A first row below 0 is 0, an end past the rows is the rows, an end before its start
    gives an empty sequence, a sequence longer than max_seqlen is cut to it (keys may overlap:
    they are only read): each segment's output is the recipe's and the fp64 reference's of its
    clamped rows and keys, rows past a cut sequence's max_seqlen_q are not written."""
    rng = np.random.default_rng()
    host, dev = packed(emulator, rng)
    (q, dq), (k, dk), (v, dv) = host
    scale = float(np.float32(1 / np.sqrt(D)))
    cu_q, cu_k = [-7, 25, 25, 1 << 30], [INT32_MIN, 40, 30, INT32_MAX]
    for max_q, max_k, segments in (
            (45, 50, [((0, 25), (0, 40)), ((25, 70), (30, 80))]),     # keys 30 .. 90 cut to 50
            (30, 30, [((0, 25), (0, 30)), ((25, 55), (30, 60))])):    # rows 25 .. 70 cut to 30
        for causal in (False, True):
            o, lse = run(emulator, dev, (dq, dk, dv), cu_q, cu_k, max_q, max_k, causal)
            written = np.zeros(TOTAL_Q, bool)
            for (q0, q1), (k0, k1) in segments:
                args = (q[None, q0:q1], k[None, k0:k1], v[None, k0:k1])
                ds = dict(descale_q=dq, descale_k=dk, descale_v=dv, causal=causal, softmax_scale=scale,
                          return_lse=True)
                mo, ml = reference.fp8_attention(*args, recipe="gfx950", **ds)
                ro, _ = reference.attention(*(x.astype(np.float64) for x in args), **ds)
                seg, seg_lse = o[q0:q1], lse[:, q0:q1]
                assert not np.isnan(seg).any() and not np.isnan(seg_lse).any()
                assert reference.relative_error(seg, mo[0]) <= MODEL_O_BOUND
                assert reference.relative_error(seg, ro[0]) <= RECIPE_FP64_BOUND
                assert np.array_equal(np.isneginf(seg_lse), np.isneginf(ml[0]))
                fin = np.isfinite(ml[0])
                assert not fin.any() or np.abs(seg_lse[fin] - ml[0][fin]).max() <= MODEL_LSE_BOUND
                written[q0:q1] = True
            assert np.isnan(o[~written]).all() and np.isnan(lse[:, ~written]).all()
