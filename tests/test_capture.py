"""Calls on a stream being captured into a graph, FP8 descales per sequence and key/value head,
and the LSE into the caller's tensor: the plumbing, on the fake backend with memory of its own
(``ZYFA_FAKE_DISCRETE=1``).  The fake raises on whatever a capture in the global mode forbids
(a synchronous allocation, copy, memset or free, a wait, a module load outside the relaxed
mode) and records every stream operation in order (``ops``): what a captured call leaves in
its graph."""

import ctypes
import json

import numpy as np
import pytest

from tests.backends import using_backend

from zyfa_runtime import api, cache, flash_attn_func, flash_attn_varlen_func, workspace
from zyfa_runtime import driver as drivers
from zyfa_runtime import plan as plan_mod
from zyfa_runtime.catalogue import Variant, vt_prepass_symbol
from zyfa_runtime.launch import unpack_args
from zyfa_runtime.memory import DeviceArray, to_device, view
from zyfa_runtime.tensors import TensorRef

BF16_PERSISTENT = Variant("sm_90a", "bf16", 128, 128, False)
BF16 = Variant("sm_90a", "bf16", 64, 64, False)
FP8 = Variant("sm_90a", "fp8_e4m3", 64, 64, False)
FP8_TAIL = Variant("sm_90a", "fp8_e4m3", 256, 256, False)


@pytest.fixture
def prebuilt(sm90a_prebuilt):
    return sm90a_prebuilt


@pytest.fixture
def gpu(prebuilt):
    with using_backend("fake", ZYFA_PREBUILT_DIR=str(prebuilt), ZYFA_FAKE_DISCRETE="1") as driver:
        yield driver
        driver.capturing.clear()
        workspace.release()


def entry_of(v: Variant) -> dict:
    return api.kernel_table(drivers.get_driver()).entry(v)


def dense(driver, v: Variant, b=2, sq=100, sk=300, hq=4, hkv=2):
    """q, k, v and out of a dense call in the fake's device memory (uninitialised: the fake
    runs nothing)."""
    dtype = v.dtype
    return (DeviceArray(driver, 0, (b, sq, hq, v.d_qk), dtype), DeviceArray(driver, 0, (b, sk, hkv, v.d_qk), dtype),
            DeviceArray(driver, 0, (b, sk, hkv, v.d_v), dtype), DeviceArray(driver, 0, (b, sq, hq, v.d_v), "bf16"))


def inside(ptr, n, alloc):
    """Whether [ptr, ptr + n) lies inside the allocation alloc = (base, bytes)."""
    return alloc[0] <= ptr and ptr + n <= alloc[0] + alloc[1]


# --------------------------------------------------------------------------------------
# Capture.

def test_a_first_call_under_capture_allocates_its_scratch_in_the_graph_and_nothing_else(gpu):
    """No call before (modules loaded in the relaxed mode): the persistent kernel's counter
    comes from a stream-ordered allocation on the capturing stream, zeroed by a queued memset,
    freed after the launch -- the graph's own, a new one each capture."""
    q, k, v, out = dense(gpu, BF16_PERSISTENT)
    held = workspace.held_bytes()
    gpu.capturing.add(7)
    flash_attn_func(q, k, v, out=out, stream=7)
    (alloc, memset, launch, free) = gpu.ops
    assert alloc[0] == "alloc_async" and alloc[3] == 7
    counter_bytes = entry_of(BF16_PERSISTENT)["persistent"]["counter_bytes"]
    assert memset == ("memset_async", alloc[1], 0, counter_bytes, 7)
    assert launch == ("launch", BF16_PERSISTENT.symbol, 7) and free == ("free_async", alloc[1], 7)
    args = unpack_args(entry_of(BF16_PERSISTENT), gpu.launches[-1].args)
    assert inside(args["tile_counter"], counter_bytes, alloc[1:3])
    assert plan_mod._plans == {} and workspace.held_bytes() == held     # no plan, no stream workspace
    gpu.ops.clear()
    flash_attn_func(q, k, v, out=out, stream=7)                        # captured again: its own scratch
    assert [op[0] for op in gpu.ops] == ["alloc_async", "memset_async", "launch", "free_async"]
    assert plan_mod._plans == {}


def test_after_a_warm_up_on_another_stream_the_capture_uses_none_of_its_memory(gpu):
    """torch's pattern: the call run on a side stream first, then captured on another: the
    capture takes none of the side stream's workspace or counter (a replay may run beside
    anything), and the warm-up left no wait for the device behind (its counter is zeroed by a
    memset queued on its stream)."""
    q, k, v, out = dense(gpu, FP8_TAIL, b=1, sq=2000, sk=3000, hq=16, hkv=16)
    syncs = []
    gpu.synchronize = lambda device: syncs.append(device)
    import os
    os.environ["ZYFA_SPLIT_TAIL"] = "always"
    try:
        flash_attn_func(q, k, v, out=out, stream=3)
        eager = unpack_args(entry_of(FP8_TAIL), gpu.launches[-1].args)
        assert syncs == [] and ("memset_async", eager["tail_counter"]) == gpu.ops[0][:2] and gpu.ops[0][-1] == 3
        gpu.ops.clear()
        gpu.capturing.add(5)
        flash_attn_func(q, k, v, out=out, stream=5)
    finally:
        del os.environ["ZYFA_SPLIT_TAIL"]
    names = [op[0] if op[0] != "launch" else op[1] for op in gpu.ops]
    assert names == ["alloc_async", vt_prepass_symbol(FP8_TAIL), FP8_TAIL.symbol,
                     entry_of(FP8_TAIL)["split_tail"]["symbol"], "free_async"]
    alloc = gpu.ops[0][1:3]
    args = unpack_args(entry_of(FP8_TAIL), gpu.launches[-1].args)
    layout = next(iter(plan_mod._layouts.values()))
    assert args["tail_ctas"] > 0 and layout.partial_bytes > 0
    parts = [(args["vt"], layout.vt_bytes), (args["partials"], layout.partial_bytes)]
    assert all(inside(p, n, alloc) for p, n in parts)
    assert args["vt"] + layout.vt_bytes <= args["partials"]                 # apart
    # the counter: zeros of the pool the warm-up made, no memset in the graph
    counter = (args["tail_counter"], layout.counter[1])
    assert not inside(*counter, alloc) and ctypes.string_at(*counter) == bytes(counter[1])
    assert {args[n] for n in ("tail_counter", "vt", "partials")}.isdisjoint(
        {eager[n] for n in ("tail_counter", "vt", "partials")})


def test_captured_calls_after_a_call_ran_take_counters_of_their_own_from_a_pool_and_no_node(gpu, monkeypatch):
    """Once a call has run on the device, a captured persistent call's counter is zeros no
    other call was given, from a pool made outside captures: its graph is its kernel alone.
    Where the pool has no room the captured call zeroes a counter of its graph's own, and the
    next call that runs makes a new pool, the old one kept."""
    q, k, v, out = dense(gpu, BF16_PERSISTENT)
    flash_attn_func(q, k, v, out=out, stream=3)
    eager = unpack_args(entry_of(BF16_PERSISTENT), gpu.launches[-1].args)["tile_counter"]
    gpu.capturing.add(7)
    counters = []
    for _ in range(3):
        gpu.ops.clear()
        flash_attn_func(q, k, v, out=out, stream=7)
        assert gpu.ops == [("launch", BF16_PERSISTENT.symbol, 7)]
        counters.append(unpack_args(entry_of(BF16_PERSISTENT), gpu.launches[-1].args)["tile_counter"])
    n = entry_of(BF16_PERSISTENT)["persistent"]["counter_bytes"]
    assert len({eager, *counters}) == 4 and all(ctypes.string_at(c, n) == bytes(n) for c in counters)
    pool = workspace._pools[(gpu.name, 0)]
    pool.used = pool.array.nbytes                                        # no room left
    gpu.ops.clear()
    flash_attn_func(q, k, v, out=out, stream=7)
    assert [op[0] for op in gpu.ops] == ["alloc_async", "memset_async", "launch", "free_async"]
    gpu.capturing.discard(7)
    flash_attn_func(q, k, v, out=out, stream=3)             # runs: a new pool
    assert workspace._pools[(gpu.name, 0)].array is not pool.array and pool.array in workspace._full_pools
    gpu.capturing.add(7)
    gpu.ops.clear()
    flash_attn_func(q, k, v, out=out, stream=7)
    assert gpu.ops == [("launch", BF16_PERSISTENT.symbol, 7)]


def test_a_captured_fp8_call_without_descales_reads_a_one_of_its_scratch_until_the_constant_exists(gpu):
    q, k, v, out = dense(gpu, FP8)
    gpu.capturing.add(5)
    flash_attn_func(q, k, v, out=out, stream=5)
    alloc, one = gpu.ops[0], gpu.ops[1]
    args = unpack_args(entry_of(FP8), gpu.launches[-1].args)
    assert one == ("memset_async", args["descale_q"], 0x3F800000, 4, 5) and inside(args["descale_q"], 4, alloc[1:3])
    assert args["descale_q"] == args["descale_k"] == args["descale_v"]
    gpu.capturing.clear()
    flash_attn_func(q, k, v, out=out, stream=5)                   # makes the device's constant 1.0
    constant = unpack_args(entry_of(FP8), gpu.launches[-1].args)["descale_q"]
    gpu.capturing.add(5)
    gpu.ops.clear()
    flash_attn_func(q, k, v, out=out, stream=5)
    args = unpack_args(entry_of(FP8), gpu.launches[-1].args)
    assert args["descale_q"] == constant and all(op[2] != 0x3F800000 for op in gpu.ops if op[0] == "memset_async")


def test_what_a_captured_call_would_allocate_is_refused_before_anything_is_queued(gpu):
    q, k, v, out = dense(gpu, BF16)
    lse = DeviceArray(gpu, 0, (2, 4, 100), "float32")
    gpu.capturing.add(9)
    with pytest.raises(ValueError, match="needs out="):
        flash_attn_func(q, k, v, stream=9)
    with pytest.raises(ValueError, match="return_lse=True needs lse="):
        flash_attn_func(q, k, v, out=out, return_lse=True, stream=9)
    assert gpu.ops == []
    o, l = flash_attn_func(q, k, v, out=out, lse=lse, return_lse=True, stream=9)
    args = unpack_args(entry_of(BF16), gpu.launches[-1].args)
    assert o is out and l is lse and args["lse"] == lse.ptr and [op[0] for op in gpu.ops] == ["launch"]


def test_a_plan_made_outside_a_capture_is_not_queued_inside_one(gpu):
    """The same call (tensors, options, stream) captured after it ran: its plan holds the
    stream's workspace, which a graph must not: planned for the capture instead."""
    q, k, v, out = dense(gpu, FP8)
    flash_attn_func(q, k, v, out=out, stream=4)
    flash_attn_func(q, k, v, out=out, stream=4)
    eager_vt = unpack_args(entry_of(FP8), gpu.launches[-1].args)["vt"]
    gpu.capturing.add(4)
    gpu.ops.clear()
    flash_attn_func(q, k, v, out=out, stream=4)
    args = unpack_args(entry_of(FP8), gpu.launches[-1].args)
    assert args["vt"] != eager_vt and inside(args["vt"], 1, gpu.ops[0][1:3])


# --------------------------------------------------------------------------------------
# The LSE into the caller's tensor.

def test_lse_given_is_written_where_it_lies_and_a_repeated_call_reuses_its_plan(gpu, monkeypatch):
    q, k, v, out = dense(gpu, BF16)
    big = DeviceArray(gpu, 0, (2, 5, 128), "float32")       # (B, Hq + 1, Sq + 28): a strided view
    lse = TensorRef(big.ptr + 4 * 128, (2, 4, 100), (5 * 128, 128, 1), "float32", big.ref.device, owner=big)
    _, got = flash_attn_func(q, k, v, out=out, lse=lse, return_lse=True)
    args = unpack_args(entry_of(BF16), gpu.launches[-1].args)
    assert got is lse and args["lse"] == lse.ptr and (args["lse_stride_b"], args["lse_stride_h"]) == (640, 128)
    monkeypatch.setattr(plan_mod, "instantiate", lambda *a, **kw: pytest.fail("planned again"))
    flash_attn_func(q, k, v, out=out, lse=lse, return_lse=True)
    assert gpu.launches[-1].args == gpu.launches[-2].args
    monkeypatch.undo()
    with pytest.raises(ValueError, match="return_lse must be True"):
        flash_attn_func(q, k, v, out=out, lse=lse)
    packed_q = DeviceArray(gpu, 0, (70, 4, 64), "bf16")
    packed_lse = DeviceArray(gpu, 0, (4, 70), "float32")
    cu = to_device(gpu, 0, np.array([0, 30, 70], np.int32), "int32")
    flash_attn_varlen_func(packed_q, packed_q, packed_q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=40,
                           max_seqlen_k=40, out=DeviceArray(gpu, 0, (70, 4, 64), "bf16"), lse=packed_lse,
                           return_lse=True)
    args = unpack_args(entry_of(BF16), gpu.launches[-1].args)
    assert args["lse"] == packed_lse.ptr and (args["lse_stride_b"], args["lse_stride_h"]) == (0, 70)


# --------------------------------------------------------------------------------------
# FP8 descales per sequence and key/value head.

def descale_args(v: Variant, launch) -> dict:
    args = unpack_args(entry_of(v), launch.args)
    return {t: (args[f"descale_{t}"], args[f"descale_{t}_stride_b"], args[f"descale_{t}_stride_h"]) for t in "qkv"}


def test_descales_per_sequence_and_head_pass_their_address_and_strides(gpu):
    """(B, Hkv) contiguous, a transposed view, a view broadcast by zero strides, one value:
    each descale's address and (sequence, head) strides, 0 for one value."""
    q, k, v, out = dense(gpu, FP8)               # B 2, Hkv 2
    base = DeviceArray(gpu, 0, (8,), "float32")
    dev = base.ref.device
    per_head = TensorRef(base.ptr, (2, 2), (2, 1), "float32", dev, owner=base)
    transposed = TensorRef(base.ptr, (2, 2), (1, 2), "float32", dev, owner=base)
    broadcast = TensorRef(base.ptr + 16, (2, 2), (0, 0), "float32", dev, owner=base)
    one = TensorRef(base.ptr + 20, (1,), (1,), "float32", dev, owner=base)
    flash_attn_func(q, k, v, out=out, descale_q=per_head, descale_k=transposed, descale_v=broadcast)
    assert descale_args(FP8, gpu.launches[-1]) == {"q": (base.ptr, 2, 1), "k": (base.ptr, 1, 2),
                                                   "v": (base.ptr + 16, 0, 0)}
    flash_attn_func(q, k, v, out=out, descale_q=one, descale_k=one, descale_v=one)
    assert descale_args(FP8, gpu.launches[-1]) == {t: (base.ptr + 20, 0, 0) for t in "qkv"}
    # packed: one a sequence (len(cu_seqlens) - 1 of them)
    qp = DeviceArray(gpu, 0, (70, 4, 64), "fp8_e4m3")
    kp = DeviceArray(gpu, 0, (70, 2, 64), "fp8_e4m3")
    three = TensorRef(base.ptr, (3, 2), (2, 1), "float32", dev, owner=base)
    cu = to_device(gpu, 0, np.array([0, 30, 30, 70], np.int32), "int32")
    flash_attn_varlen_func(qp, kp, kp, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=40, max_seqlen_k=40,
                           descale_q=three, descale_k=three, descale_v=three)
    assert descale_args(FP8, gpu.launches[-1]) == {t: (base.ptr, 2, 1) for t in "qkv"}
    with pytest.raises(ValueError, match=r"here \(\) or \(1,\) or \(3, 2\)"):
        flash_attn_varlen_func(qp, kp, kp, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=40, max_seqlen_k=40,
                               descale_q=per_head)


@pytest.mark.parametrize("shape,strides,dtype,match", [
    ((2,), (1,), "float32", r"shape \(2,\); a descale has shape"),
    ((2, 2, 1), (2, 1, 1), "float32", "a descale has shape"),
    ((2, 3), (3, 1), "float32", r"here \(\) or \(1,\) or \(2, 2\)"),
    ((1, 2), (2, 1), "float32", "a descale has shape"),
    ((2, 2), (-2, 1), "float32", "negative stride"),
    ((2, 2), (2, 1), "float16", "must be float32"),
])
def test_every_other_descale_is_refused_before_any_launch(gpu, shape, strides, dtype, match):
    q, k, v, out = dense(gpu, FP8)
    base = DeviceArray(gpu, 0, (16,), "float32")
    d = TensorRef(base.ptr + 16, shape, strides, dtype, base.ref.device, owner=base)
    n = len(gpu.launches)
    with pytest.raises((ValueError, TypeError), match=match):
        flash_attn_func(q, k, v, out=out, descale_k=d)
    assert len(gpu.launches) == n


def test_descales_in_host_memory_or_with_bf16_inputs_are_refused(gpu):
    q, k, v, out = dense(gpu, FP8)
    host = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="descale_q is in host memory"):
        flash_attn_func(q, k, v, out=out, descale_q=host)
    qb, kb, vb, ob = dense(gpu, BF16)
    with pytest.raises(ValueError, match="only accepted with fp8_e4m3"):
        flash_attn_func(qb, kb, vb, out=ob, descale_v=DeviceArray(gpu, 0, (2, 2), "float32"))
    assert gpu.launches == []


@pytest.fixture(scope="module")
def gfx950_prebuilt(tmp_path_factory):
    """A prebuilt/ holding fwd_gfx950_fp8_e4m3_d64x64_full: the checkout's where it has it built
    (a GPU machine's image may have no gfx950 compiler), else a build of that one kernel."""
    name = Variant("gfx950", "fp8_e4m3", 64, 64, False).name
    shipped = cache.prebuilt_dir()
    manifest = shipped / "manifest.json"
    if manifest.exists() and any(e["name"] == name and e.get("built")
                                 for e in json.loads(manifest.read_text())["kernels"]):
        return shipped
    import build
    out = tmp_path_factory.mktemp("prebuilt_gfx950")
    assert build.main(["--arch", "gfx950", "--only", "fp8_e4m3_d64x64_full", "--out", str(out), "--jobs", "1"]) == 0
    return out


def test_gfx950_fp8_takes_descales_per_sequence_and_head_too(gfx950_prebuilt):
    """The gfx950 FP8 assembly takes the (sequence, head) strides as the sm_90a kernels do,
    0 and 0 for one value or a view of one; its values are never read on the host."""
    with using_backend("fake", ZYFA_PREBUILT_DIR=str(gfx950_prebuilt), ZYFA_FAKE_ARCH="gfx950",
                       ZYFA_FAKE_DISCRETE="1") as amd:
        variant = Variant("gfx950", "fp8_e4m3", 64, 64, False)
        q, k, v, out = dense(amd, variant)
        base = DeviceArray(amd, 0, (8,), "float32")
        dev = base.ref.device
        flash_attn_func(q, k, v, out=out, descale_q=TensorRef(base.ptr, (2, 2), (2, 1), "float32", dev, owner=base),
                        descale_k=TensorRef(base.ptr + 4, (2, 2), (0, 0), "float32", dev, owner=base),
                        descale_v=TensorRef(base.ptr + 8, (1,), (1,), "float32", dev, owner=base))
        args = unpack_args(api.kernel_table(amd).entry(variant), amd.launches[-1].args)
        got = {t: (args[f"descale_{t}"], args[f"descale_{t}_stride_b"], args[f"descale_{t}_stride_h"]) for t in "qkv"}
        assert got == {"q": (base.ptr, 2, 1), "k": (base.ptr + 4, 0, 0), "v": (base.ptr + 8, 0, 0)}
        assert amd.dtoh == 0


def test_a_code_object_built_before_per_head_descales_refuses_them():
    """A manifest whose kernel has no descale strides (built before they existed) reads one
    value each: a (B, Hkv) descale of more than one value is refused, asking for a rebuild; a
    view of one value passes."""
    variant = Variant("gfx950", "fp8_e4m3", 64, 64, False)
    old = {"descale_q", "descale_k", "descale_v"}
    per_head = TensorRef(4096, (2, 2), (2, 1), "float32", ("cuda", 0))
    one = TensorRef(4096, (2, 2), (0, 0), "float32", ("cuda", 0))
    with pytest.raises(ValueError, match="rebuild it"):
        plan_mod._descale_values(variant, old, (per_head, None, None))
    assert plan_mod._descale_values(variant, old, (one, one, None)) == {}


def test_gfx950_fp8_refuses_a_descale_view_its_32_bit_offsets_cannot_reach():
    """The gfx950 FP8 assembly reads element b stride_b + g stride_h at a 32-bit byte offset:
    a (B, Hkv) view whose last element lies 2^30 elements or more from its first is refused
    (a stride along a dimension of one counts for nothing)."""
    variant = Variant("gfx950", "fp8_e4m3", 64, 64, False)
    names = {f"descale_{t}_stride_{d}" for t in "qkv" for d in "bh"}
    far = TensorRef(4096, (2, 3), (2**30 - 2, 1), "float32", ("cuda", 0))
    near = TensorRef(4096, (2, 3), (2**30 - 3, 1), "float32", ("cuda", 0))
    one_sequence = TensorRef(4096, (1, 3), (2**40, 1), "float32", ("cuda", 0))
    with pytest.raises(ValueError, match="32-bit byte offsets"):
        plan_mod._descale_values(variant, names, (None, far, None))
    got = plan_mod._descale_values(variant, names, (near, one_sequence, None))
    assert (got["descale_q_stride_b"], got["descale_k_stride_b"], got["descale_k_stride_h"]) == (2**30 - 3, 0, 1)
    # the sm_90a kernels take 64-bit offsets
    assert plan_mod._descale_values(Variant("sm_90a", "fp8_e4m3", 64, 64, False), names, (far, None, None))
