"""A packed batch's cu_seqlens given in host memory reach the kernels by a copy queued on the
call's stream through page-locked memory, and are never read back (zyfa_runtime/staging.py).
On the fake backend with memory of its own (``ZYFA_FAKE_DISCRETE=1``: host memory is not
device memory, as on a GPU), which records the queued copies and counts the read-backs."""

import numpy as np
import pytest

from tests.backends import using_backend

from zyfa_runtime import api, flash_attn_varlen_func, staging, validate
from zyfa_runtime import driver as drivers
from zyfa_runtime.catalogue import Variant, vt_prepass_symbol
from zyfa_runtime.launch import unpack_args
from zyfa_runtime.memory import DeviceArray, host_dtype, to_device
from zyfa_runtime.tensors import as_tensor

BF16 = Variant("sm_90a", "bf16", 128, 128, False)
FP8 = Variant("sm_90a", "fp8_e4m3", 64, 64, False)


@pytest.fixture
def prebuilt(sm90a_prebuilt):
    return sm90a_prebuilt


@pytest.fixture
def gpu_like(prebuilt):
    with using_backend("fake", ZYFA_PREBUILT_DIR=str(prebuilt), ZYFA_FAKE_DISCRETE="1") as driver:
        assert not driver.host_memory_is_device
        yield driver
        staging.release()


def packed(driver, seqs_q, seqs_k, hq=4, hkv=2, d=128, dtype="bf16"):
    """q, k, v of a packed batch in the fake's device memory, and its cu_seqlens on the host."""
    rng = np.random.default_rng()
    cu_q = np.concatenate([[0], np.cumsum(seqs_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(seqs_k)]).astype(np.int32)
    host = [rng.standard_normal(s).astype(host_dtype(dtype))
            for s in ((cu_q[-1], hq, d), (cu_k[-1], hkv, d), (cu_k[-1], hkv, d))]
    return [to_device(driver, 0, x, dtype) for x in host], cu_q, cu_k


def entry_of(v: Variant) -> dict:
    return api.kernel_table(drivers.get_driver()).entry(v)


def staged_values(driver, args, name, n):
    """The n int32 values at the address a launch was given for ``name``."""
    ptr = args[name]
    for base, buf in driver._buffers.items():
        if base <= ptr < base + buf.nbytes:
            return buf[ptr - base:ptr - base + 4 * n].view(np.int32).copy()
    raise AssertionError(f"{name} = 0x{ptr:x} is not in the fake's device memory")


def call(qkv, cu_q, cu_k, lengths_from=None, **kw):
    """The packed call; max_seqlen from cu_q and cu_k (or the host arrays ``lengths_from``)."""
    hq, hk = lengths_from or (cu_q, cu_k)
    return flash_attn_varlen_func(*qkv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                  max_seqlen_q=int(np.diff(np.asarray(hq)).max()),
                                  max_seqlen_k=int(np.diff(np.asarray(hk)).max()), **kw)


def test_host_cu_seqlens_are_copied_on_the_stream_and_never_read_back(gpu_like):
    qkv, cu_q, cu_k = packed(gpu_like, [5, 0, 65], [9, 30, 61])
    reads = gpu_like.dtoh
    call(qkv, cu_q, cu_k, stream=5)
    assert gpu_like.dtoh == reads                        # nothing read back: no synchronisation
    (copy,) = gpu_like.htod_async
    (launch,) = gpu_like.launches
    assert copy[3] == launch.stream == 5
    args = unpack_args(entry_of(BF16), launch.args)
    assert args["cu_seqlens_q"] == copy[0] and args["cu_seqlens_k"] == copy[0] + 16
    assert copy[2] == 32                                 # both arrays, each 16-byte aligned
    sent_q, sent_k = staged_values(gpu_like, args, "cu_seqlens_q", 4), staged_values(gpu_like, args, "cu_seqlens_k", 4)
    np.testing.assert_array_equal(sent_q, cu_q)
    np.testing.assert_array_equal(sent_k, cu_k)
    cu_q[1] = 3                                          # the call read them when it returned
    np.testing.assert_array_equal(staged_values(gpu_like, args, "cu_seqlens_q", 4), sent_q)


def test_the_fp8_pre_pass_reads_the_same_staged_copy(gpu_like):
    qkv, cu_q, cu_k = packed(gpu_like, [5, 65], [9, 291], d=64, dtype="fp8_e4m3")
    call(qkv, cu_q, cu_k, stream=3)
    pre, main = gpu_like.launches
    assert [pre.symbol, main.symbol] == [vt_prepass_symbol(FP8), FP8.symbol] and pre.args == main.args
    args = unpack_args(entry_of(FP8), main.args)
    np.testing.assert_array_equal(staged_values(gpu_like, args, "cu_seqlens_k", 3), cu_k)
    assert len(gpu_like.htod_async) == 1


def test_lists_of_ints_are_accepted_and_anything_else_refused(gpu_like):
    qkv, cu_q, cu_k = packed(gpu_like, [5, 65], [9, 61])
    call(qkv, cu_q.tolist(), tuple(int(x) for x in cu_k))
    args = unpack_args(entry_of(BF16), gpu_like.launches[-1].args)
    np.testing.assert_array_equal(staged_values(gpu_like, args, "cu_seqlens_k", 3), cu_k)
    with pytest.raises(TypeError, match="must hold ints"):
        call(qkv, [0.0, 5.0, 70.0], cu_k)
    with pytest.raises(ValueError, match="fit in int32"):
        call(qkv, [0, 5, 2**31], cu_k)
    assert len(gpu_like.launches) == 1


@pytest.mark.parametrize("cu_q, cu_k, match", [
    ([0, 50, 30, 70], [0, 9, 30, 70], "cu_seqlens_q is not non-decreasing"),
    ([0, 5, 70], [1, 5, 70], "cu_seqlens_k must start at 0"),
    ([0, 5, 70], [0, 5, 69], "cu_seqlens_k ends at 69, short of the packed length 70")])
def test_bad_host_values_are_refused_before_any_copy_or_launch(gpu_like, cu_q, cu_k, match):
    qkv, _, _ = packed(gpu_like, [5, 65], [9, 61])
    with pytest.raises(ValueError, match=match):
        flash_attn_varlen_func(*qkv, cu_seqlens_q=np.array(cu_q, np.int32), cu_seqlens_k=np.array(cu_k, np.int32),
                               max_seqlen_q=65, max_seqlen_k=65)
    assert gpu_like.htod_async == [] and gpu_like.launches == []


def test_device_cu_seqlens_are_still_read_back_and_passed_as_they_are(gpu_like):
    qkv, cu_q, cu_k = packed(gpu_like, [5, 65], [9, 61])
    dq, dk = to_device(gpu_like, 0, cu_q, "int32"), to_device(gpu_like, 0, cu_k, "int32")
    reads = gpu_like.dtoh
    call(qkv, dq, dk, lengths_from=(cu_q, cu_k))
    assert gpu_like.dtoh == reads + 2 and gpu_like.htod_async == []
    args = unpack_args(entry_of(BF16), gpu_like.launches[-1].args)
    assert (args["cu_seqlens_q"], args["cu_seqlens_k"]) == (dq.ptr, dk.ptr)
    # one on the host, one on the device: only the host one is staged
    call(qkv, cu_q, dk, lengths_from=(cu_q, cu_k))
    (copy,) = gpu_like.htod_async
    args = unpack_args(entry_of(BF16), gpu_like.launches[-1].args)
    assert args["cu_seqlens_q"] == copy[0] and args["cu_seqlens_k"] == dk.ptr and copy[2] == 16


def test_a_slot_is_written_again_only_after_its_copy_has_run(gpu_like, monkeypatch):
    """The ring's slots in turn, one a call; the call that comes back to a slot first waits for
    the event recorded after that slot's last copy (its host buffer is free again)."""
    qkv, cu_q, cu_k = packed(gpu_like, [5, 65], [9, 61])
    recorded, waited = [], []
    record, wait = gpu_like.event_record, gpu_like.event_synchronize
    monkeypatch.setattr(gpu_like, "event_record", lambda e, s=0: (recorded.append(e), record(e, s))[1])
    monkeypatch.setattr(gpu_like, "event_synchronize", lambda e: (waited.append(e), wait(e))[1])
    for _ in range(staging.SLOTS):
        call(qkv, cu_q, cu_k, stream=9)
    dsts = [c[0] for c in gpu_like.htod_async]
    assert len(set(dsts)) == staging.SLOTS and waited == []     # every slot once, no wait
    call(qkv, cu_q, cu_k, stream=9)
    assert gpu_like.htod_async[-1][0] == dsts[0] and waited == [recorded[0]]
    call(qkv, cu_q, cu_k, stream=10)                             # another stream: a ring of its own
    assert gpu_like.htod_async[-1][0] not in dsts and waited == [recorded[0]]


def test_a_slot_grows_for_a_large_batch_and_keeps_the_old_device_buffer(gpu_like):
    qkv, cu_q, cu_k = packed(gpu_like, [5, 65], [9, 61])
    for _ in range(staging.SLOTS):
        call(qkv, cu_q, cu_k)
    first = gpu_like.htod_async[0][0]
    held = staging.held_bytes()
    seqs = [1] * 600
    big, bq, bk = packed(gpu_like, seqs, seqs)
    call(big, bq, bk)                                    # slot 0 again, now too small
    copy = gpu_like.htod_async[-1]
    assert copy[2] == 2 * ((601 * 4 + 15) // 16 * 16) and copy[0] != first
    args = unpack_args(entry_of(BF16), gpu_like.launches[-1].args)
    np.testing.assert_array_equal(staged_values(gpu_like, args, "cu_seqlens_k", 601), bk)
    assert staging.held_bytes() > held
    gpu_like.buffer(first)                              # kept: a queued launch may read it
    staging.release()
    assert staging.held_bytes() == 0 and gpu_like._host_buffers == {}
    with pytest.raises(KeyError):
        gpu_like.buffer(first)


def test_validation_takes_host_cu_seqlens_only_with_their_values():
    rng = np.random.default_rng()
    q, k, v = (as_tensor(rng.standard_normal(s).astype(host_dtype("bf16")))
               for s in ((70, 4, 128), (70, 2, 128), (70, 2, 128)))
    on_gpu = [t.__class__(t.ptr, t.shape, t.strides, t.dtype, ("cuda", 0)) for t in (q, k, v)]
    cu = np.array([0, 5, 70], np.int32)
    kw = dict(max_seqlen_q=65, max_seqlen_k=65, cu_seqlens_q=as_tensor(cu), cu_seqlens_k=as_tensor(cu))
    p = validate.check_varlen(*on_gpu, None, **kw, cu_values_q=cu, cu_values_k=cu, host_cu=True)
    assert p.device == ("cuda", 0) and p.batch == 2
    with pytest.raises(ValueError, match="cu_seqlens_k is in host memory but its values could not be read"):
        validate.check_varlen(*on_gpu, None, **kw, cu_values_q=cu, host_cu=True)
    with pytest.raises(ValueError, match="cu_seqlens_q is in host memory"):
        validate.check_varlen(*on_gpu, None, **kw, cu_values_q=cu, cu_values_k=cu)


def test_device_arrays_of_the_fake_are_device_memory(gpu_like):
    a = DeviceArray(gpu_like, 0, (4,), "int32")
    assert a.ref.device == ("cuda", 0) and gpu_like.pointer_info(a.ptr) == ("cuda", 0)
    assert gpu_like.pointer_info(np.zeros(4).ctypes.data) == ("cpu", 0)


def test_a_packed_call_on_a_stream_being_captured_takes_unchecked_device_cu_seqlens_only(gpu_like):
    """Host cu_seqlens would be replayed from a slot that later calls rewrite, and checking
    device ones reads them back, which capture forbids: both refused, nothing staged, read or
    launched.  Device ones with check_cu_seqlens=False: launched as they are, nothing read back,
    nothing allocated but in stream order (the fake raises on anything a capture refuses)."""
    qkv, cu_q, cu_k = packed(gpu_like, [5, 65], [9, 61])
    dq, dk = to_device(gpu_like, 0, cu_q, "int32"), to_device(gpu_like, 0, cu_k, "int32")
    out = DeviceArray(gpu_like, 0, (70, 4, 128), "bf16")
    gpu_like.capturing.add(4)
    for cus, match in (((cu_q, cu_k), "takes device cu_seqlens with check_cu_seqlens=False"),
                       ((dq, cu_k), "takes device cu_seqlens with check_cu_seqlens=False"),
                       ((dq, dk), "pass check_cu_seqlens=False")):
        with pytest.raises(ValueError, match=match):
            call(qkv, *cus, lengths_from=(cu_q, cu_k), out=out, stream=4)
    with pytest.raises(ValueError, match="needs out="):
        call(qkv, dq, dk, lengths_from=(cu_q, cu_k), stream=4, check_cu_seqlens=False)
    assert gpu_like.htod_async == [] and gpu_like.launches == [] and gpu_like.dtoh == 0
    call(qkv, dq, dk, lengths_from=(cu_q, cu_k), out=out, stream=4, check_cu_seqlens=False)
    (launch,) = gpu_like.launches
    args = unpack_args(entry_of(BF16), launch.args)
    assert (args["cu_seqlens_q"], args["cu_seqlens_k"]) == (dq.ptr, dk.ptr) and launch.stream == 4
    assert (args["total_q"], args["total_k"]) == (70, 70) and gpu_like.dtoh == 0
    gpu_like.capture_mode = "relaxed"                   # other streams then are not affected
    call(qkv, cu_q, cu_k, stream=5)
    assert len(gpu_like.launches) == 2 and len(gpu_like.htod_async) == 1


def test_unchecked_device_cu_seqlens_are_never_read_and_a_known_layout_is_not_revalidated(gpu_like,
                                                                                       monkeypatch):
    """check_cu_seqlens=False outside a capture: no read-back (no wait for the GPU), values that
    are no valid batch passed to the kernel as they are (it clamps them); shapes, dtypes and
    addresses still checked; host values still checked (reading them costs nothing)."""
    qkv, cu_q, cu_k = packed(gpu_like, [5, 65], [9, 61])
    bad = to_device(gpu_like, 0, np.array([7, -3, 1 << 30], np.int32), "int32")
    call(qkv, bad, bad, lengths_from=(cu_q, cu_k), check_cu_seqlens=False)
    assert gpu_like.dtoh == 0 and len(gpu_like.launches) == 1
    monkeypatch.setattr(validate, "check_varlen", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("again")))
    call(qkv, bad, bad, lengths_from=(cu_q, cu_k), check_cu_seqlens=False)
    assert gpu_like.dtoh == 0 and len(gpu_like.launches) == 2
    monkeypatch.undo()
    short = to_device(gpu_like, 0, np.array([0, 5], np.int32), "int32")
    with pytest.raises(ValueError, match="cu_seqlens_k has 2 entries"):
        call(qkv, bad, short, lengths_from=(cu_q, cu_k), check_cu_seqlens=False)
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0, got 7"):
        call(qkv, np.array([7, -3, 1 << 30], np.int32), bad, lengths_from=(cu_q, cu_k), check_cu_seqlens=False)
    with pytest.raises(TypeError, match="check_cu_seqlens must be a bool"):
        call(qkv, bad, bad, lengths_from=(cu_q, cu_k), check_cu_seqlens="no")
    assert len(gpu_like.launches) == 2
