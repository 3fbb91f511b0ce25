"""The whole spine on the fake backend: API -> validation -> manifest -> verified code object
-> module -> packed arguments -> launch.  The fake driver records instead of running, so
these tests read back exactly what a GPU would have been given."""

import ctypes
import threading

import numpy as np
import pytest

from tests.backends import using_backend

from zyfa_runtime import api, flash_attn_func, flash_attn_varlen_func, validate, workspace
from zyfa_runtime import driver as drivers
from zyfa_runtime.catalogue import (SPLIT_TAIL_DRAIN_BLOCKS, SPLIT_TAIL_SWITCH_BLOCKS, Variant, vt_columns,
                                    vt_prepass_symbol)
from zyfa_runtime.errors import CodeObjectError
from zyfa_runtime.driver.fake import unpack_tensor_map
from zyfa_runtime import plan as plan_mod
from zyfa_runtime.launch import unpack_args
from zyfa_runtime.memory import host_dtype


@pytest.fixture
def prebuilt(sm90a_prebuilt):
    return sm90a_prebuilt


@pytest.fixture
def fake(prebuilt):
    with using_backend("fake", ZYFA_PREBUILT_DIR=str(prebuilt)) as driver:
        yield driver


def arrays(shape_q, shape_k, shape_v, dtype="bf16"):
    rng = np.random.default_rng()
    return [rng.standard_normal(s).astype(host_dtype(dtype)) for s in (shape_q, shape_k, shape_v)]


def entry_of(v: Variant) -> dict:
    return api.kernel_table(drivers.get_driver()).entry(v)


def test_dense_call_launches_the_right_kernel_with_the_manifest_layout(fake):
    q, k, v = arrays((2, 100, 6, 128), (2, 130, 2, 128), (2, 130, 2, 128))
    out = np.empty((2, 100, 6, 128), host_dtype("bf16"))
    _, lse = flash_attn_func(q, k, v, causal=True, out=out, return_lse=True)
    (launch,) = fake.launches
    variant = Variant("sm_90a", "bf16", 128, 128, True)
    entry = entry_of(variant)
    assert launch.symbol == variant.symbol
    tile = variant.tile
    args = unpack_args(entry, launch.args)
    # persistent: causal, and the keys and values of the sequence's heads fit in L2, so tiles
    # heads first; one CTA a tile where there are fewer tiles than SMs
    tiles = (6, -(-100 // tile.block_m), 2)
    assert (args["tiles_x"], args["tiles_y"], args["tiles_z"], args["tile_count"]) == (*tiles, np.prod(tiles))
    assert launch.grid == (np.prod(tiles), 1, 1) and launch.block == (tile.threads, 1, 1)
    assert launch.shared == entry["dynamic_smem"] == fake.max_dynamic_shared[variant.symbol]
    assert args["q"] == q.ctypes.data and args["k"] == k.ctypes.data and args["v"] == v.ctypes.data
    assert args["o"] == out.ctypes.data and args["lse"] == lse.ptr
    assert (args["q_stride_b"], args["q_stride_s"], args["q_stride_h"]) == (100 * 6 * 128, 6 * 128, 128)
    assert (args["k_stride_b"], args["k_stride_s"], args["k_stride_h"]) == (130 * 2 * 128, 2 * 128, 128)
    assert (args["batch"], args["hq"], args["hkv"], args["seqlen_q"], args["seqlen_k"]) == (2, 6, 2, 100, 130)
    assert args["cu_seqlens_q"] == 0 and args["cu_seqlens_k"] == 0
    assert (args["lse_stride_b"], args["lse_stride_h"]) == (6 * 100, 100) and lse.shape == (2, 6, 100)
    assert args["softmax_scale"] == pytest.approx(1 / np.sqrt(128), rel=1e-7)


def test_strided_views_pass_their_strides(fake):
    big = np.random.default_rng().standard_normal((2, 50, 3, 4, 128)).astype(host_dtype("bf16"))
    q, k, v = big[:, :, 0], big[:, :, 1], big[:, :, 2]     # a packed qkv tensor
    flash_attn_func(q, k, v, softmax_scale=0.25)
    args = unpack_args(entry_of(Variant("sm_90a", "bf16", 128, 128, False)), fake.launches[-1].args)
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert args[f"{name}_stride_s"] == 3 * 4 * 128 and args[f"{name}_stride_h"] == 128
        assert args[name] == t.ctypes.data
    assert args["softmax_scale"] == 0.25


def test_varlen_call_passes_offsets_and_packed_lse_layout(fake):
    cu_q = np.array([0, 5, 5, 70], np.int32)
    cu_k = np.array([0, 9, 30, 100], np.int32)
    q, k, v = arrays((70, 4, 128), (100, 4, 128), (100, 4, 128))
    out, lse = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=65,
                                      max_seqlen_k=70, return_lse=True)
    (launch,) = fake.launches
    variant = Variant("sm_90a", "bf16", 128, 128, False)
    args = unpack_args(entry_of(variant), launch.args)
    tiles = (-(-65 // variant.tile.block_m), 4, 3)                # query blocks of max_seqlen_q
    assert (args["tiles_x"], args["tiles_y"], args["tiles_z"], args["tile_count"]) == (*tiles, 12)
    assert launch.grid == (12, 1, 1)
    assert args["cu_seqlens_q"] == cu_q.ctypes.data and args["cu_seqlens_k"] == cu_k.ctypes.data
    assert (args["batch"], args["seqlen_q"], args["seqlen_k"]) == (3, 65, 70)
    assert args["q_stride_b"] == 0 and args["q_stride_s"] == 4 * 128
    assert (args["lse_stride_b"], args["lse_stride_h"]) == (0, 70) and lse.shape == (4, 70)
    assert out.shape == (70, 4, 128) and args["o"] == out.ptr


def packed_pair(dtype, d_qk, d_v):
    """A packed batch of two sequences (5 and 65 queries, 9 and 291 keys; hq 4, hkv 2), run
    once; its q, k, v."""
    q, k, v = arrays((70, 4, d_qk), (300, 2, d_qk), (300, 2, d_v), dtype=dtype)
    flash_attn_varlen_func(q, k, v, cu_seqlens_q=np.array([0, 5, 70], np.int32),
                           cu_seqlens_k=np.array([0, 9, 300], np.int32), max_seqlen_q=65, max_seqlen_k=291)
    return q, k, v


def refused_before_any_launch(fake, match, *tensors):
    n = len(fake.launches)
    with pytest.raises(ValueError, match=match):
        flash_attn_func(*tensors)
    assert len(fake.launches) == n


def dense_map(x, dims, strides, box):
    """A tensor map as the fake driver decodes it: over x's bytes, swizzled by the box's width."""
    return {"ptr": x.ctypes.data, "dims": dims, "strides": strides, "box": box, "swizzle": box[0]}


def packed_map(args, name):
    """A packed batch's tensor map argument: its pointer, dims and strides."""
    tm = unpack_tensor_map(args[name])
    return tm["ptr"], tm["dims"], tm["strides"]


def test_fp8_reads_q_and_k_through_tensor_maps_of_their_own_layouts(fake):
    """sm_90a FP8: Q and K go to the kernel as TMA tensor maps (the fake driver's encoding is its
    arguments): d_qk x heads x rows x sequences bytes at their strides, 64 x 1 x block_m (Q: 192
    rows at d64) or 128 (K) x 1 boxes in the 64B swizzle; a packed batch is one sequence;
    strides TMA cannot take are refused first."""
    entry = entry_of(Variant("sm_90a", "fp8_e4m3", 64, 64, False))
    q, k, v = arrays((2, 100, 4, 64), (2, 300, 2, 64), (2, 300, 2, 64), dtype="fp8_e4m3")
    flash_attn_func(q, k, v)
    args = unpack_args(entry, fake.launches[-1].args)
    assert unpack_tensor_map(args["tmap_k"]) == dense_map(k, (64, 2, 300, 2), (64, 128, 300 * 128), (64, 1, 128, 1))
    assert unpack_tensor_map(args["tmap_q"]) == dense_map(q, (64, 4, 100, 2), (64, 256, 100 * 256), (64, 1, 192, 1))
    qp, kp, vp = packed_pair("fp8_e4m3", 64, 64)
    args = unpack_args(entry, fake.launches[-1].args)
    assert packed_map(args, "tmap_k") == (kp.ctypes.data, (64, 2, 300, 1), (64, 128, 300 * 128))
    assert packed_map(args, "tmap_q") == (qp.ctypes.data, (64, 4, 70, 1), (64, 256, 70 * 256))
    k_shared = np.broadcast_to(k[:1], k.shape)          # one K for both sequences: batch stride 0
    refused_before_any_launch(fake, "positive multiples of 16 bytes", q, k_shared, v)
    q_shared = np.broadcast_to(q[:, :, :1], q.shape)    # one query head for all four: head stride 0
    refused_before_any_launch(fake, "q: the sm_90a kernels read Q by TMA", q_shared, k, v)


def test_sm90a_bf16_reads_q_k_and_v_through_tensor_maps_of_their_own_layouts(fake):
    """sm_90a BF16: Q, K and V go to the kernel as TMA tensor maps over their bytes -- 2 d x
    heads x rows x sequences at the tensors' strides in bytes, boxes of 128 bytes (a K-block of
    the 128B swizzle) x 1 x 128 rows (Q: the CTA's; K, V: 64 keys at d256) x 1; a packed batch
    is one sequence; a stride TMA cannot take (a batch stride of 0) is refused, naming the
    tensor, before anything is launched."""
    entry = entry_of(Variant("sm_90a", "bf16", 192, 128, False))
    q, k, v = arrays((2, 100, 4, 192), (2, 300, 2, 192), (2, 300, 2, 128), dtype="bf16")
    flash_attn_func(q, k, v)
    args = unpack_args(entry, fake.launches[-1].args)
    box = (128, 1, 128, 1)
    assert unpack_tensor_map(args["tmap_q"]) == dense_map(q, (384, 4, 100, 2), (384, 1536, 100 * 1536), box)
    assert unpack_tensor_map(args["tmap_k"]) == dense_map(k, (384, 2, 300, 2), (384, 768, 300 * 768), box)
    assert unpack_tensor_map(args["tmap_v"]) == dense_map(v, (256, 2, 300, 2), (256, 512, 300 * 512), box)
    wide = entry_of(Variant("sm_90a", "bf16", 256, 256, True))
    qw, kw, vw = arrays((1, 70, 2, 256), (1, 70, 1, 256), (1, 70, 1, 256), dtype="bf16")
    flash_attn_func(qw, kw, vw, causal=True)
    tm = unpack_tensor_map(unpack_args(wide, fake.launches[-1].args)["tmap_v"])
    assert tm["dims"] == (512, 1, 70, 1) and tm["box"] == (128, 1, 64, 1)
    qp, kp, vp = packed_pair("bf16", 192, 128)
    args = unpack_args(entry, fake.launches[-1].args)
    assert packed_map(args, "tmap_v") == (vp.ctypes.data, (256, 2, 300, 1), (256, 512, 300 * 512))
    assert packed_map(args, "tmap_q") == (qp.ctypes.data, (384, 4, 70, 1), (384, 1536, 70 * 1536))
    v_shared = np.broadcast_to(v[:1], v.shape)          # one V for both sequences: batch stride 0
    refused_before_any_launch(fake, "v: the sm_90a kernels read V by TMA", q, k, v_shared)


def test_persistent_bf16_writes_o_through_a_tensor_map_of_its_layout(fake):
    """The persistent sm_90a BF16-body kernels (d128) write O by TMA: a map of out's bytes, bf16
    whatever the inputs -- 2 d_v x heads x rows x sequences at out's strides, boxes of 128 bytes
    x 1 x 64 rows (a consumer's) x 1 in the 128B swizzle; a packed batch one sequence."""
    entry = entry_of(Variant("sm_90a", "bf16", 128, 128, True))
    q, k, v = arrays((2, 100, 4, 128), (2, 300, 2, 128), (2, 300, 2, 128), dtype="bf16")
    wide = np.empty((2, 100, 6, 128), host_dtype("bf16"))
    out = wide[:, :, 1:5]                               # strided: rows 6 heads apart
    flash_attn_func(q, k, v, causal=True, out=out)
    args = unpack_args(entry, fake.launches[-1].args)
    tm = unpack_tensor_map(args["tmap_o"])
    assert tm == {"ptr": out.ctypes.data, "dims": (256, 4, 100, 2), "strides": (256, 1536, 100 * 1536),
                  "box": (128, 1, 64, 1), "swizzle": 128}
    assert args["o"] == out.ctypes.data
    qp, kp, vp = arrays((70, 4, 128), (300, 2, 128), (300, 2, 128), dtype="bf16")
    op = np.empty((70, 4, 128), host_dtype("bf16"))
    flash_attn_varlen_func(qp, kp, vp, cu_seqlens_q=np.array([0, 5, 70], np.int32),
                           cu_seqlens_k=np.array([0, 9, 300], np.int32), max_seqlen_q=65, max_seqlen_k=291,
                           causal=True, out=op)
    assert packed_map(unpack_args(entry, fake.launches[-1].args), "tmap_o") == \
        (op.ctypes.data, (256, 4, 70, 1), (256, 1024, 70 * 1024))
    # heads 129 elements apart (258 bytes), a layout TMA cannot write: validation already refuses
    # it (every stride of out a multiple of 16 bytes), before any launch
    buf = np.empty(2 * 100 * 520 + 8, host_dtype("bf16"))
    odd = np.lib.stride_tricks.as_strided(buf, shape=(2, 100, 4, 128), strides=(100 * 1040, 1040, 258, 2))
    n = len(fake.launches)
    with pytest.raises(ValueError, match="out stride of dim 2 is 258 bytes, not a multiple of 16"):
        flash_attn_func(q, k, v, causal=True, out=odd)
    assert len(fake.launches) == n


def test_fp8_without_descales_reads_ones(fake):
    q, k, v = arrays((1, 64, 2, 64), (1, 64, 2, 64), (1, 64, 2, 64), dtype="fp8_e4m3")
    flash_attn_func(q, k, v)
    args = unpack_args(entry_of(Variant("sm_90a", "fp8_e4m3", 64, 64, False)), fake.launches[-1].args)
    for name in ("descale_q", "descale_k", "descale_v"):
        assert np.frombuffer(ctypes.string_at(args[name], 4), np.float32)[0] == 1.0


def test_fp8_prepass_runs_first_with_the_same_arguments_and_a_workspace(fake):
    """sm_90a FP8: the V^T pre-pass, then the kernel, on one stream with one argument buffer;
    vt points into a workspace of hkv * d_v * vt_columns bytes (dense and packed)."""
    variant = Variant("sm_90a", "fp8_e4m3", 64, 64, False)
    entry = entry_of(variant)
    q, k, v = arrays((2, 100, 4, 64), (2, 300, 2, 64), (2, 300, 2, 64), dtype="fp8_e4m3")
    flash_attn_func(q, k, v, stream=7)
    cu_q, cu_k = np.array([0, 5, 5, 70], np.int32), np.array([0, 9, 9, 300], np.int32)
    qp, kp, vp = arrays((70, 4, 64), (300, 2, 64), (300, 2, 64), dtype="fp8_e4m3")
    flash_attn_varlen_func(qp, kp, vp, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=65,
                           max_seqlen_k=291, stream=7)
    assert [x.symbol for x in fake.launches] == [vt_prepass_symbol(variant), variant.symbol] * 2
    for (pre, main), (batch, sk, total) in zip(zip(fake.launches[::2], fake.launches[1::2]),
                                               ((2, 300, None), (3, 291, 300))):
        assert pre.args == main.args and pre.stream == main.stream == 7
        assert pre.grid == (-(-sk // 128), 2, batch) and pre.block == (entry["prepass"]["block_size"], 1, 1)
        assert pre.shared == 0
        args = unpack_args(entry, main.args)
        cols = vt_columns(batch, sk, total)
        assert args["vt_stride_h"] == 64 * cols
        buf = fake.buffer(args["vt"])
        assert buf.ctypes.data == args["vt"] and buf.nbytes >= 2 * 64 * cols
    # one workspace per stream, reused by the calls on it and grown when one needs more
    a1 = unpack_args(entry, fake.launches[1].args)["vt"]
    a2 = unpack_args(entry, fake.launches[3].args)["vt"]
    assert a1 == a2
    flash_attn_func(q, k, v, stream=8)
    assert unpack_args(entry, fake.launches[-1].args)["vt"] != a1
    big = arrays((2, 100, 4, 64), (2, 3000, 2, 64), (2, 3000, 2, 64), dtype="fp8_e4m3")
    held = workspace.held_bytes()
    flash_attn_func(*big, stream=7)
    grown = unpack_args(entry, fake.launches[-1].args)["vt"]
    assert grown != a1 and workspace.held_bytes() > held
    assert fake.buffer(grown).nbytes >= 2 * 64 * vt_columns(2, 3000, None)
    assert fake.buffer(a1).nbytes > 0     # the old buffer stays allocated (queued kernels, graphs)
    workspace.release()
    assert workspace.held_bytes() == 0
    with pytest.raises(KeyError):         # freed now
        fake.buffer(a1)


def _no_validation(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("validated again")
    monkeypatch.setattr(validate, "check_dense", refuse)


def test_a_repeated_call_queues_its_plan_again_without_validating(fake, monkeypatch):
    """The same tensors, options and stream with ``out`` given: the launches of the first call
    are queued again (the same functions, grids and argument bytes), with no validation; a
    change of options, stream or layout is validated anew."""
    q, k, v = arrays((1, 200, 4, 64), (1, 300, 2, 64), (1, 300, 2, 64), dtype="fp8_e4m3")
    out = np.empty((1, 200, 4, 64), host_dtype("bf16"))
    flash_attn_func(q, k, v, causal=False, out=out, stream=5)
    first = fake.launches[:]
    _no_validation(monkeypatch)
    flash_attn_func(q, k, v, causal=False, out=out, stream=5)
    assert fake.launches[len(first):] == first
    for changed in (dict(causal=True, out=out, stream=5), dict(out=out, stream=6),
                    dict(out=out, stream=5, softmax_scale=0.1), dict(out=out, stream=5, return_lse=True),
                    dict(out=out[:, :, :, :], stream=5, causal=1),    # 1 is no bool: validation says so
                    dict(out=out, stream=5, return_lse=0)):
        with pytest.raises(AssertionError, match="validated again"):
            flash_attn_func(q, k, v, **changed)
    with pytest.raises(AssertionError, match="validated again"):
        flash_attn_func(q, k, v[:, :, ::-1], out=out, stream=5)   # other strides


@pytest.mark.parametrize("dtype,dims,causal", [("fp8_e4m3", 64, False), ("bf16", 128, False),
                                               ("bf16", 128, True)])
def test_new_tensors_of_a_known_layout_launch_as_if_validated(fake, monkeypatch, dtype, dims, causal):
    """Tensors at new addresses in a layout already validated (the same shapes, strides,
    dtypes, options and stream) are not validated again: the launches, tensor maps and argument
    bytes are those a validated call on them queues."""
    shapes = ((2, 100, 4, dims), (2, 130, 2, dims), (2, 130, 2, dims))
    flash_attn_func(*arrays(*shapes, dtype=dtype), causal=causal, out=np.empty(shapes[0], host_dtype("bf16")))
    q, k, v = arrays(*shapes, dtype=dtype)
    out = np.empty(shapes[0], host_dtype("bf16"))
    validated = fake.launches[:]
    with monkeypatch.context() as m:
        _no_validation(m)
        flash_attn_func(q, k, v, causal=causal, out=out)
    from_layout = fake.launches[len(validated):]
    plan_mod._layouts.clear()
    plan_mod._plans.clear()
    flash_attn_func(q, k, v, causal=causal, out=out)
    assert from_layout and fake.launches[len(validated) + len(from_layout):] == from_layout


@pytest.mark.parametrize("dtype,dims", [("bf16", 128), ("fp8_e4m3", 64)])
def test_a_packed_call_of_a_known_layout_checks_its_values_and_addresses_only(fake, monkeypatch, dtype, dims):
    """A packed call whose layout (shapes, strides, dtypes, options, stream, max_seqlen and the
    cu_seqlens' shapes) has been validated is not validated again: its launches are a validated
    call's, byte for byte.  Its cu_seqlens values are checked on every call; a change of batch
    size or max_seqlen is validated anew."""
    shapes = ((70, 4, dims), (100, 2, dims), (100, 2, dims))
    kw = dict(max_seqlen_q=65, max_seqlen_k=70)
    flash_attn_varlen_func(*arrays(*shapes, dtype=dtype), cu_seqlens_q=np.array([0, 5, 5, 70], np.int32),
                           cu_seqlens_k=np.array([0, 9, 30, 100], np.int32),
                           out=np.empty((70, 4, dims), host_dtype("bf16")), **kw)
    q, k, v = arrays(*shapes, dtype=dtype)
    out = np.empty((70, 4, dims), host_dtype("bf16"))
    cu_q, cu_k = np.array([0, 30, 35, 70], np.int32), np.array([0, 70, 70, 100], np.int32)
    n = len(fake.launches)
    monkeypatch.setattr(validate, "check_varlen", lambda *a, **k: pytest.fail("validated again"))
    flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out, **kw)
    from_layout = fake.launches[n:]
    for bad_q, bad_k, match in (([0, 30, 20, 70], cu_k, "cu_seqlens_q is not non-decreasing"),
                                (cu_q, [0, 71, 71, 100], r"max_seqlen_k = 70 is less than the longest sequence \(71\)"),
                                ([0, 5, 5, 69], cu_k, "short of the packed length 70")):
        with pytest.raises(ValueError, match=match):
            flash_attn_varlen_func(q, k, v, cu_seqlens_q=np.array(bad_q, np.int32),
                                   cu_seqlens_k=np.array(bad_k, np.int32), out=out, **kw)
    if dtype == "bf16":                      # an address rule: out apart from the inputs
        with pytest.raises(ValueError, match="out overlaps q"):
            flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=q, **kw)
    for changed in (dict(max_seqlen_q=66, max_seqlen_k=70), dict(max_seqlen_q=65, max_seqlen_k=70, causal=True)):
        with pytest.raises(pytest.fail.Exception, match="validated again"):
            flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out, **changed)
    with pytest.raises(pytest.fail.Exception, match="validated again"):     # another batch size
        flash_attn_varlen_func(q, k, v, cu_seqlens_q=np.array([0, 70], np.int32),
                               cu_seqlens_k=np.array([0, 100], np.int32), out=out, **kw)
    assert len(fake.launches) == n + len(from_layout)
    monkeypatch.undo()
    plan_mod._layouts.clear()
    flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out, **kw)
    assert from_layout and fake.launches[n + len(from_layout):] == from_layout


def _misaligned(a: np.ndarray, by: int) -> np.ndarray:
    """A copy of ``a`` whose data starts ``by`` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + by
    b = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    b[...] = a
    return b


def test_new_addresses_of_a_known_layout_are_checked(fake, monkeypatch):
    """A known layout skips validation, not the rules on addresses: a misaligned tensor and an
    out that overlaps an input are refused as validation refuses them, before any launch."""
    shapes = ((1, 64, 2, 64), (1, 64, 2, 64), (1, 64, 2, 64))
    q, k, v = arrays(*shapes, dtype="fp8_e4m3")
    flash_attn_func(q, k, v, out=np.empty(shapes[0], host_dtype("bf16")))
    out_over_v = np.empty(shapes[0], host_dtype("bf16"))    # v's layout in out's first bytes
    v_in_out = out_over_v.view(np.uint8).reshape(-1)[:v.nbytes].view(v.dtype).reshape(v.shape)
    v_in_out[...] = v
    cases = [(dict(q=_misaligned(q, 8), k=k, v=v, out=np.empty(shapes[0], host_dtype("bf16"))),
              "q data pointer 0x[0-9a-f]+ is not 16-byte aligned"),
             (dict(q=q, k=k, v=v_in_out, out=out_over_v), "out overlaps v")]
    for call, message in cases:
        n = len(fake.launches)
        with monkeypatch.context() as m:
            _no_validation(m)
            with pytest.raises(ValueError, match=message):
                flash_attn_func(**call)
        plan_mod._layouts.clear()
        with pytest.raises(ValueError, match=message):
            flash_attn_func(**call)
        assert len(fake.launches) == n
        # The layout known again.  Its plans go too: a new out may land where a freed one was,
        # and a call whose plan is cached is queued without keeping its layout.
        plan_mod._plans.clear()
        flash_attn_func(q, k, v, out=np.empty(shapes[0], host_dtype("bf16")))
        assert len(plan_mod._layouts) == 1


def test_a_call_without_out_allocates_each_time(fake, monkeypatch):
    """No plan without ``out`` (each call's output is new), but its layout is known: the second
    call is not validated again, and writes to an output of its own."""
    q, k, v = arrays((1, 64, 2, 64), (1, 64, 2, 64), (1, 64, 2, 64), dtype="fp8_e4m3")
    entry = entry_of(Variant("sm_90a", "fp8_e4m3", 64, 64, False))
    first = flash_attn_func(q, k, v)
    _no_validation(monkeypatch)
    second = flash_attn_func(q, k, v)
    o1, o2 = (unpack_args(entry, fake.launches[i].args)["o"] for i in (1, 3))
    assert first.ptr == o1 and second.ptr == o2 and o1 != o2 and len(plan_mod._plans) == 0


def test_a_plan_is_not_reused_once_its_workspace_moved(fake):
    """A plan's argument buffers hold the V^T workspace's address: once the stream's workspace
    has grown (or been released), the repeated call is planned anew onto the new one."""
    variant = Variant("sm_90a", "fp8_e4m3", 64, 64, False)
    entry = entry_of(variant)
    q, k, v = arrays((1, 100, 4, 64), (1, 300, 2, 64), (1, 300, 2, 64), dtype="fp8_e4m3")
    out = np.empty((1, 100, 4, 64), host_dtype("bf16"))
    flash_attn_func(q, k, v, out=out, stream=9)
    old = unpack_args(entry, fake.launches[-1].args)["vt"]
    flash_attn_func(*arrays((1, 100, 4, 64), (1, 5000, 2, 64), (1, 5000, 2, 64), dtype="fp8_e4m3"), stream=9)
    flash_attn_func(q, k, v, out=out, stream=9)
    new = unpack_args(entry, fake.launches[-1].args)["vt"]
    assert new != old and new == unpack_args(entry, fake.launches[-3].args)["vt"]
    workspace.release()
    flash_attn_func(q, k, v, out=out, stream=9)
    vt = unpack_args(entry, fake.launches[-1].args)["vt"]
    assert fake.buffer(vt).nbytes >= 2 * 64 * vt_columns(1, 300, None)


def test_a_persistent_kernels_plan_follows_its_tile_counter(fake):
    q, k, v = arrays((1, 300, 4, 128), (1, 300, 4, 128), (1, 300, 4, 128))
    out = np.empty((1, 300, 4, 128), host_dtype("bf16"))
    entry = entry_of(Variant("sm_90a", "bf16", 128, 128, False))
    flash_attn_func(q, k, v, out=out, stream=3)
    workspace.release()
    flash_attn_func(q, k, v, out=out, stream=3)
    counter = unpack_args(entry, fake.launches[-1].args)["tile_counter"]
    assert len(fake.launches) == 2 and fake.buffer(counter).nbytes > 0   # a live counter, not the freed one


def test_plans_keep_no_tensor_alive(fake):
    """The plan cache keys calls by their tensors' addresses and layouts, not the tensors."""
    import gc
    import weakref
    q, k, v = arrays((1, 64, 2, 64), (1, 64, 2, 64), (1, 64, 2, 64), dtype="fp8_e4m3")
    out = np.empty((1, 64, 2, 64), host_dtype("bf16"))
    flash_attn_func(q, k, v, out=out)
    refs = [weakref.ref(x) for x in (q, k, v, out)]
    del q, k, v, out
    gc.collect()
    assert all(r() is None for r in refs)


def test_a_grid_larger_than_the_device_takes_is_refused_before_any_launch(fake, monkeypatch):
    q, k, v = arrays((1, 300, 2, 256), (1, 300, 2, 256), (1, 300, 2, 256))
    flash_attn_func(q, k, v, causal=True)          # heads first: (2 heads, 3 row blocks, 1)
    assert fake.launches[-1].grid == (2, 3, 1)
    n = len(fake.launches)
    monkeypatch.setattr(fake, "max_grid", (2**31 - 1, 2, 65535))
    plan_mod._layouts.clear()     # a device's limits do not change: the layouts known hold its grids
    with pytest.raises(ValueError, match="launch grid of \\(2, 3, 1\\)"):
        flash_attn_func(q, k, v, causal=True)
    q8, k8, v8 = arrays((1, 300, 3, 64), (1, 300, 3, 64), (1, 300, 3, 64), "fp8_e4m3")
    with pytest.raises(ValueError, match="launch grid of \\(2, 3, 1\\)"):
        flash_attn_func(q8, k8, v8)                  # the FP8 pre-pass is not launched either
    assert len(fake.launches) == n
    # a persistent kernel's tiles are no launch grid: (2, 3, 1) tiles, 6 CTAs
    q, k, v = arrays((1, 300, 2, 128), (1, 300, 2, 128), (1, 300, 2, 128))
    flash_attn_func(q, k, v, causal=True)
    assert fake.launches[-1].grid == (6, 1, 1)


def test_persistent_kernels_take_a_cta_an_sm_and_a_zeroed_tile_counter_per_stream(fake, monkeypatch):
    """sm_90a BF16 d128 is persistent: one CTA an SM (the device's count, fewer where there
    are fewer tiles), the tiles' grid and count in its arguments, and tile_counter pointing at
    zeroed bytes kept per stream (the kernel leaves them zero); more tiles than a 32-bit int
    are refused before anything is launched."""
    entry = entry_of(Variant("sm_90a", "bf16", 128, 128, False))
    assert entry["persistent"]["counter_bytes"] == 8
    q, k, v = arrays((3, 1000, 64, 128), (3, 1000, 64, 128), (3, 1000, 64, 128))
    flash_attn_func(q, k, v)
    args = unpack_args(entry, fake.launches[-1].args)
    assert (args["tiles_x"], args["tiles_y"], args["tiles_z"], args["tile_count"]) == (8, 64, 3, 8 * 64 * 3)
    assert fake.launches[-1].grid == (fake.attribute(0, "multiprocessor_count"), 1, 1) == (132, 1, 1)
    counter = args["tile_counter"]
    assert counter != 0 and ctypes.string_at(counter, 8) == bytes(8)
    flash_attn_func(q[:1, :100], k[:1], v[:1])
    assert unpack_args(entry, fake.launches[-1].args)["tile_counter"] == counter   # the same stream's
    assert fake.launches[-1].grid == (64, 1, 1)                                     # 64 tiles
    flash_attn_func(q[:1, :100], k[:1], v[:1], stream=7)
    assert unpack_args(entry, fake.launches[-1].args)["tile_counter"] not in (0, counter)
    monkeypatch.setattr(plan_mod, "MAX_TILES", 8 * 64 * 3 - 1)
    plan_mod._layouts.clear()
    refused_before_any_launch(fake, "tiles of 128 query rows", q, k, v)


def test_fp8_d128_takes_its_short_prompt_variant_up_to_its_keys(fake):
    """sm_90a FP8 d128 has a short-prompt variant (persistent CTAs) and an f16-math one beside
    the plain kernel (a CTA a tile): a call without features of at most the f16-math entry's
    f16.max_seqlen_k keys a sequence (dense seqlen_k, packed max_seqlen_k) takes that one, of at
    most the short entry's short.max_seqlen_k the short one, one CTA an SM over its tiles;
    longer ones take the plain kernel, and a call with a feature the serving one.  Within
    plan.forced_variant each kernel takes any length (selfcheck tests each so)."""
    from zyfa_runtime.catalogue import F16_KEYS, SHORT_KEYS, f16_variant, serving_variant, short_variant
    for causal in (False,):   # the causal pair follows the same rule (conftest builds the full one)
        plain = Variant("sm_90a", "fp8_e4m3", 128, 128, causal)
        short, f16 = short_variant(plain), f16_variant(plain)
        limit, f16_limit = entry_of(short)["short"]["max_seqlen_k"], entry_of(f16)["f16"]["max_seqlen_k"]
        assert limit == SHORT_KEYS and "short" not in entry_of(plain) and "persistent" not in entry_of(plain)
        assert f16_limit == F16_KEYS < limit and "prepass" not in entry_of(f16)
        for sk, want in ((128, f16), (f16_limit, f16), (f16_limit + 1, short), (limit, short), (limit + 1, plain)):
            q, k, v = arrays((2, 128, 4, 128), (2, sk, 2, 128), (2, sk, 2, 128), dtype="fp8_e4m3")
            flash_attn_func(q, k, v, causal=causal)
            assert fake.launches[-1].symbol == want.symbol, (sk, want.name)
        q, k, v = arrays((2, 300, 4, 128), (2, 300, 2, 128), (2, 300, 2, 128), dtype="fp8_e4m3")
        flash_attn_func(q, k, v, causal=causal)
        args = unpack_args(entry_of(short), fake.launches[-1].args)
        assert args["tile_count"] == 3 * 4 * 2 if causal else 2 * 4 * 2   # 128- or 192-row tiles
        assert fake.launches[-1].grid == (args["tile_count"], 1, 1)       # fewer tiles than SMs
        flash_attn_func(q, k, v, causal=causal, sinks=np.zeros(4, np.float32))
        assert fake.launches[-1].symbol == serving_variant(plain).symbol
        for n, want in ((f16_limit, f16), (limit, short), (limit + 1, plain)):
            cu = np.array([0, 100, 100 + n], np.int32)
            qp, kp, vp = arrays((100 + n, 4, 128), (100 + n, 2, 128), (100 + n, 2, 128), dtype="fp8_e4m3")
            flash_attn_varlen_func(qp, kp, vp, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n, max_seqlen_k=n,
                                   causal=causal)
            assert fake.launches[-1].symbol == want.symbol, (n, want.name)
        with plan_mod.forced_variant(plain):
            flash_attn_func(q, k, v, causal=causal)
            assert fake.launches[-1].symbol == plain.symbol
        for forced in (short, f16):
            with plan_mod.forced_variant(forced):
                q, k, v = arrays((1, 128, 4, 128), (1, 4096, 2, 128), (1, 4096, 2, 128), dtype="fp8_e4m3")
                flash_attn_func(q, k, v, causal=causal)
                assert fake.launches[-1].symbol == forced.symbol
        flash_attn_func(q, k, v, causal=causal)
        assert fake.launches[-1].symbol == plain.symbol


def test_fp8_d256_cuts_its_last_wave_where_the_model_gains(fake, monkeypatch):
    """sm_90a FP8 d256 non-causal (split_tail): 192 tiles of 64 key blocks on 132 SMs leave 60
    tiles past the last whole wave, 30 blocks a CTA once cut (+ the manifest's overhead, below
    64): the pre-pass, the kernel over the first 132 tiles, then the tail kernel's 132 CTAs, one
    argument buffer, the kernel and the tail each the launch before's programmatic dependent
    (none with ZYFA_DEPENDENT_LAUNCH=off); the partials in the workspace after the V^T, two
    slots a tail CTA, and a zeroed counter a cut tile and consumer.  128 tiles of 32 blocks (32 a
    CTA cut) stay whole unless ZYFA_SPLIT_TAIL=always, which gives the tail every tile (no kernel
    launch; the tail follows the pre-pass in order); ``off`` and packed batches never cut (no
    tail launch); an unknown mode is refused before any launch."""
    variant = Variant("sm_90a", "fp8_e4m3", 256, 256, False)
    entry = entry_of(variant)
    tail = entry["split_tail"]
    q, k, v = arrays((1, 8192, 3, 256), (1, 8192, 3, 256), (1, 8192, 3, 256), dtype="fp8_e4m3")
    flash_attn_func(q, k, v)
    pre, main, cut = fake.launches[-3:]
    assert [x.symbol for x in (pre, main, cut)] == [vt_prepass_symbol(variant), variant.symbol,
                                                     entry["split_tail"]["symbol"]]
    assert pre.args == main.args == cut.args and main.block == cut.block and main.shared == cut.shared
    args = unpack_args(entry, main.args)
    assert main.grid == (132, 1, 1) and cut.grid == (132, 1, 1)
    assert [x.dependent for x in (pre, main, cut)] == [False, True, True]
    assert (args["tail_first"], args["tail_ctas"], args["tile_count"]) == (132, 132, 192)
    assert (args["tail_gap"], args["tail_ramp"]) == (SPLIT_TAIL_SWITCH_BLOCKS, SPLIT_TAIL_DRAIN_BLOCKS)
    offset = args["partials"] - args["vt"]   # after the V^T, at a multiple of 256 bytes
    assert 3 * args["vt_stride_h"] <= offset < 3 * args["vt_stride_h"] + 256 and offset % 256 == 0
    assert fake.buffer(args["vt"]).nbytes >= args["partials"] - args["vt"] + 2 * 132 * tail["slot_bytes"]
    assert ctypes.string_at(args["tail_counter"], 60 * tail["counter_bytes"]) == bytes(60 * tail["counter_bytes"])

    def plan(mode, *shapes, varlen=False):
        monkeypatch.setenv("ZYFA_SPLIT_TAIL", mode)
        plan_mod._layouts.clear()
        plan_mod._plans.clear()
        q, k, v = arrays(*shapes, dtype="fp8_e4m3")
        n = len(fake.launches)
        if varlen:
            cu = np.array([0, 4000, shapes[0][0]], np.int32)
            flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=4192, max_seqlen_k=4192)
        else:
            flash_attn_func(q, k, v)
        a = unpack_args(entry, fake.launches[-1].args)
        tail = fake.launches[-1].grid if fake.launches[-1].symbol == entry["split_tail"]["symbol"] else None
        plan.launched = [(x.symbol, x.dependent) for x in fake.launches[n:]]
        plan.shares = (a["tail_gap"], a["tail_ramp"])
        return tail, a["tail_first"], a["tail_ctas"], a["partials"]

    assert plan("off", (1, 8192, 3, 256), (1, 8192, 3, 256), (1, 8192, 3, 256)) == (None, 192, 0, 0)
    assert plan("auto", (1, 4096, 4, 256), (1, 4096, 4, 256), (1, 4096, 4, 256)) == (None, 128, 0, 0)
    assert plan.launched == [(vt_prepass_symbol(variant), False), (variant.symbol, True)]
    grid, first, ctas, partials = plan("always", (1, 4096, 4, 256), (1, 4096, 4, 256), (1, 4096, 4, 256))
    assert (grid, first, ctas) == ((132, 1, 1), 0, 132) and partials != 0
    assert plan.launched == [(vt_prepass_symbol(variant), False), (tail["symbol"], False)]
    assert plan.shares == (0, 0)   # 128 tiles of 32 blocks on 132 SMs: shares too long for the gap
    monkeypatch.setenv("ZYFA_DEPENDENT_LAUNCH", "off")
    plan("auto", (1, 8192, 3, 256), (1, 8192, 3, 256), (1, 8192, 3, 256))
    assert plan.launched == [(vt_prepass_symbol(variant), False), (variant.symbol, False), (tail["symbol"], False)]
    assert plan.shares == (SPLIT_TAIL_SWITCH_BLOCKS, 0)
    monkeypatch.setenv("ZYFA_DEPENDENT_LAUNCH", "sometimes")
    plan_mod._layouts.clear()
    plan_mod._plans.clear()
    refused_before_any_launch(fake, "ZYFA_DEPENDENT_LAUNCH", q, k, v)
    monkeypatch.delenv("ZYFA_DEPENDENT_LAUNCH")
    assert plan("always", (8192, 3, 256), (8192, 3, 256), (8192, 3, 256), varlen=True)[:3] == (None, 198, 0)
    monkeypatch.setenv("ZYFA_SPLIT_TAIL", "sometimes")
    plan_mod._layouts.clear()
    refused_before_any_launch(fake, "ZYFA_SPLIT_TAIL", q, k, v)


def test_a_pre_pass_grid_larger_than_the_device_takes_is_refused_before_either_launch(fake, monkeypatch):
    # FP8 d64 non-causal: the kernel's grid (2, 3, 1), the pre-pass's (3 key blocks, 3, 1)
    q8, k8, v8 = arrays((1, 300, 3, 64), (1, 300, 3, 64), (1, 300, 3, 64), "fp8_e4m3")
    n = len(fake.launches)
    monkeypatch.setattr(fake, "max_grid", (2, 65535, 65535))
    with pytest.raises(ValueError, match="launch grid of \\(3, 3, 1\\)"):
        flash_attn_func(q8, k8, v8)
    assert len(fake.launches) == n


def test_bad_input_reaches_no_driver_call(fake):
    q, k, v = arrays((1, 64, 6, 128), (1, 64, 4, 128), (1, 64, 4, 128))   # 6 % 4 != 0
    with pytest.raises(ValueError, match="hkv|Hkv|heads"):
        flash_attn_func(q, k, v)
    assert fake.launches == [] and fake.modules == []


def test_tampered_code_object_is_never_loaded(fake, prebuilt, tmp_path, monkeypatch):
    import shutil
    copy = tmp_path / "prebuilt"
    shutil.copytree(prebuilt, copy)
    name = Variant("sm_90a", "bf16", 128, 128, False).filename
    data = bytearray((copy / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / name).write_bytes(bytes(data))
    monkeypatch.setenv("ZYFA_PREBUILT_DIR", str(copy))
    monkeypatch.setenv("ZYFA_CACHE_DIR", str(tmp_path / "cache"))
    api._tables.clear()
    q, k, v = arrays((1, 64, 2, 128), (1, 64, 2, 128), (1, 64, 2, 128))
    with pytest.raises(CodeObjectError, match="sha256"):
        flash_attn_func(q, k, v)
    assert fake.modules == [] and fake.launches == []


def test_module_loads_once_under_concurrent_calls(fake):
    q, k, v = arrays((1, 64, 2, 128), (1, 64, 2, 128), (1, 64, 2, 128))
    errors = []

    def call():
        try:
            for _ in range(5):
                flash_attn_func(q, k, v)
        except Exception as e:  # surfaced below
            errors.append(e)
    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(fake.modules) == 1 and len(fake.launches) == 40


def test_unbuilt_variant_is_a_clear_error(fake):
    q, k, v = arrays((1, 64, 2, 256), (1, 64, 2, 256), (1, 64, 2, 256))
    with pytest.raises(Exception, match="not built"):
        flash_attn_func(q, k, v)
