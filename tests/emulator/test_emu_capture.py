"""Graph capture and unchecked cu_seqlens, on the gfx950 kernels run by the emulator.

* Capture: a call on a stream being captured runs nothing and allocates, copies or waits for
  nothing (the emulator raises on what a capture forbids); the captured graph, replayed after
  the inputs are refilled, writes what the fp64 reference of the new values gives, each
  replay (its stream-ordered scratch poisoned afresh).
* ``check_cu_seqlens=False``: the gfx950 BF16 kernels clamp every sequence to the tensors'
  rows.  Values that are no valid batch (decreasing, negative, past the end, INT32_MIN /
  INT32_MAX) run in the strict emulator (no access outside an allocation passes), into
  outputs inside guarded allocations; values whose clamped segments are a batch give that
  batch's fp64 reference.  The gfx950 FP8 assembly clamps alike: test_emu_fp8_serving.py.

The code objects are built from this checkout's sources into a temporary directory."""

import numpy as np
import pytest

from tests.backends import using_backend

from zyfa_runtime import flash_attn_func, flash_attn_varlen_func, reference
from zyfa_runtime.memory import DeviceArray, host_dtype, to_device
from zyfa_runtime.selfcheck import LSE_BOUND, O_BOUND

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    import build
    out = tmp_path_factory.mktemp("prebuilt")
    assert build.main(["--arch", "gfx950", "--only", "bf16_d64x64", "--out", str(out),
                       "--jobs", "2"]) == 0
    return out


@pytest.fixture
def emulator(prebuilt):
    # strict: only allocations and the call's own tensors are memory a kernel may touch
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(prebuilt), ZYFA_EMULATOR_STRICT_HOST="1") as driver:
        yield driver


def bf16(rng, shape):
    return rng.standard_normal(shape).astype(np.float32).astype(host_dtype("bf16"))


def fill(driver, arr: DeviceArray, host: np.ndarray) -> None:
    driver.copy_htod(arr.ptr, memoryview(np.ascontiguousarray(host).reshape(-1).view(np.uint8)))


def lse_error(lse, ref):
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref)) and not np.isnan(lse).any()
    finite = np.isfinite(ref)
    return float(np.abs(lse[finite] - ref[finite]).max()) if finite.any() else 0.0


def test_a_captured_dense_call_replays_on_new_values(emulator):
    rng = np.random.default_rng()
    shape_q, shape_kv = (2, 70, 3, 64), (2, 90, 1, 64)
    q, k, v = (DeviceArray(emulator, 0, s, "bf16") for s in (shape_q, shape_kv, shape_kv))
    out, lse = DeviceArray(emulator, 0, shape_q, "bf16"), DeviceArray(emulator, 0, (2, 3, 70), "float32")
    emulator.memset_d8(out.ptr, 0xFF, out.nbytes)
    emulator.begin_capture(5)
    try:
        flash_attn_func(q, k, v, causal=True, out=out, lse=lse, return_lse=True, stream=5)
    finally:
        graph = emulator.end_capture(5)
    assert emulator.launches == 0 and np.isnan(out.numpy().astype(np.float32)).all()   # nothing ran
    assert [op[0] for op in graph.ops] == ["launch"]       # the BF16 kernel needs no scratch
    for _ in range(2):
        host = [bf16(rng, s) for s in (shape_q, shape_kv, shape_kv)]
        for arr, h in zip((q, k, v), host):
            fill(emulator, arr, h)
        emulator.memset_d8(out.ptr, 0xFF, out.nbytes)
        graph.replay()
        ref_o, ref_lse = reference.attention(*host, causal=True, return_lse=True)
        o = out.numpy().astype(np.float64)
        assert not np.isnan(o).any() and reference.relative_error(o, ref_o) < O_BOUND
        assert lse_error(lse.numpy().astype(np.float64), ref_lse) < LSE_BOUND
    graph.release()


def test_a_call_under_capture_refuses_what_it_would_allocate_before_anything_is_recorded(emulator):
    q, out = (DeviceArray(emulator, 0, (1, 20, 2, 64), "bf16") for _ in range(2))
    emulator.begin_capture(5)
    try:
        with pytest.raises(ValueError, match="needs out="):
            flash_attn_func(q, q, q, stream=5)
        with pytest.raises(ValueError, match="needs lse="):
            flash_attn_func(q, q, q, out=out, return_lse=True, stream=5)
    finally:
        graph = emulator.end_capture(5)
    assert graph.ops == []


def test_a_captured_packed_call_reads_the_cu_seqlens_of_each_replay(emulator):
    """Device cu_seqlens, unchecked (a captured call cannot read them back): each replay takes
    the values the buffer holds then, and is right for them."""
    rng = np.random.default_rng()
    total_q, total_k, hq, hkv = 120, 150, 2, 1
    q, k, v = (to_device(emulator, 0, bf16(rng, s), "bf16") for s in
               ((total_q, hq, 64), (total_k, hkv, 64), (total_k, hkv, 64)))
    cu_q, cu_k = (DeviceArray(emulator, 0, (4,), "int32") for _ in range(2))
    out = DeviceArray(emulator, 0, (total_q, hq, 64), "bf16")
    emulator.begin_capture(3)
    try:
        flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=80, max_seqlen_k=100,
                               out=out, stream=3, check_cu_seqlens=False)
    finally:
        graph = emulator.end_capture(3)
    for lq, lk in (([40, 0, 80], [30, 20, 100]), ([80, 40, 0], [100, 50, 0])):
        cq, ck = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lq, lk))
        fill(emulator, cu_q, cq)
        fill(emulator, cu_k, ck)
        emulator.memset_d8(out.ptr, 0xFF, out.nbytes)
        graph.replay()
        ref = reference.attention(*(x.numpy() for x in (q, k, v)), cu_seqlens_q=cq, cu_seqlens_k=ck)
        o = out.numpy().astype(np.float64)
        assert not np.isnan(o).any() and reference.relative_error(o, ref) < O_BOUND


def packed(emulator, rng, total_q, total_k, hq=2, hkv=1, d=64):
    host = [bf16(rng, s) for s in ((total_q, hq, d), (total_k, hkv, d), (total_k, hkv, d))]
    return host, [to_device(emulator, 0, h, "bf16") for h in host]


#: Values that are no batch; all but the first take the kernel without clamping outside its
#: tensors (checked once against the kernel before the clamp: the emulator stopped each).
ADVERSARIAL = [
    ([0, 50, 10, 70], [0, 90, 20, 5]),                                # decreasing
    ([0, 50, 10, 200], [0, 90, 20, 500]),                             # decreasing, then past the end
    ([0, 20, 40, 75], [0, 30, 60, 95]),                               # ending 5 rows past the end
    ([-30, 20, 40, 70], [0, 30, 60, 90]),                             # starting before the first row
    ([-40, 7, 1 << 30, INT32_MAX], [INT32_MIN, -1, 0, INT32_MAX]),     # negative, huge
    ([INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN], [3, INT32_MAX, 2, INT32_MIN]),   # differences overflowing
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cu_q,cu_k", ADVERSARIAL)
def test_adversarial_cu_seqlens_never_reach_outside_the_tensors(emulator, causal, cu_q, cu_k):
    rng = np.random.default_rng()
    total_q, total_k = 70, 90
    _, (q, k, v) = packed(emulator, rng, total_q, total_k)
    cq, ck = (to_device(emulator, 0, np.array(c, np.int32), "int32") for c in (cu_q, cu_k))
    out = DeviceArray(emulator, 0, (total_q, 2, 64), "bf16")
    lse = DeviceArray(emulator, 0, (2, total_q), "float32")
    flash_attn_varlen_func(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=64, max_seqlen_k=80,
                           causal=causal, out=out, lse=lse, return_lse=True, check_cu_seqlens=False)
    assert emulator.launches == 1      # ran, every access inside an allocation (strict emulator)


def test_cu_seqlens_are_clamped_to_the_rows_and_max_seqlen(emulator):
    """A first row below 0 is 0, an end past the rows is the rows, an end before its start
    gives an empty sequence, a sequence longer than max_seqlen is cut to it (keys may overlap:
    they are only read): each sequence's output is the fp64 reference of its clamped rows and
    keys, rows past a cut sequence's max_seqlen_q are not written."""
    rng = np.random.default_rng()
    total_q, total_k = 70, 90
    host, (q, k, v) = packed(emulator, rng, total_q, total_k)
    cq = to_device(emulator, 0, np.array([-7, 25, 25, 1 << 30], np.int32), "int32")
    ck = to_device(emulator, 0, np.array([INT32_MIN, 40, 30, INT32_MAX], np.int32), "int32")
    for max_q, max_k, segments in (
            (45, 50, [((0, 25), (0, 40)), ((25, 70), (30, 80))]),     # keys 30 .. 90 cut to 50
            (30, 30, [((0, 25), (0, 30)), ((25, 55), (30, 60))])):    # rows 25 .. 70 cut to 30
        out = DeviceArray(emulator, 0, (total_q, 2, 64), "bf16")
        lse = DeviceArray(emulator, 0, (2, total_q), "float32")
        emulator.memset_d8(out.ptr, 0xFF, out.nbytes)
        flash_attn_varlen_func(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max_q, max_seqlen_k=max_k,
                               out=out, lse=lse, return_lse=True, check_cu_seqlens=False)
        o, l = out.numpy().astype(np.float64), lse.numpy().astype(np.float64)
        written = np.zeros(total_q, bool)
        for (q0, q1), (k0, k1) in segments:
            ref_o, ref_lse = reference.attention(host[0][None, q0:q1], host[1][None, k0:k1], host[2][None, k0:k1],
                                                 return_lse=True)
            assert not np.isnan(o[q0:q1]).any() and reference.relative_error(o[q0:q1], ref_o[0]) < O_BOUND
            assert lse_error(l[:, q0:q1], ref_lse[0]) < LSE_BOUND
            written[q0:q1] = True
        assert np.isnan(o[~written]).all()

