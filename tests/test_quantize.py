"""quantize_fp8 without a device: its kernel kinds (passes: one argument list, a grid each) reach
the manifest; on the fake backend a call queues exactly the passes, grids and arguments the
kernels read (scratch from the stream's workspace, or under a graph capture the graph's own);
every invalid call is refused before a launch.  The arithmetic is checked bit for bit against
quantize_model on the emulator (tests/emulator/test_emu_quantize.py) and on a GPU
(tests/test_gpu_quantize.py)."""

import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import build
from tests.backends import using_backend

from zyfa_runtime import quantize_fp8, quantize_model, workspace
from zyfa_runtime.catalogue import (AUX_KINDS, QUANTIZE_ARGS, QUANTIZE_FINISH_CHANNELS, QUANTIZE_MEAN_ROWS,
                                    QUANTIZE_TILE_ROWS, AuxKernel, kernargs)
from zyfa_runtime.launch import unpack_args
from zyfa_runtime.quantize import KINDS, QuantizedFP8

ROOT = Path(__file__).resolve().parents[1]
ARCH = "gfx950"
ATTENTION = "fwd_gfx950_fp8_e4m3_d64x64_full"


def test_the_passes_share_one_argument_list_and_the_headers_tile_constants():
    assert set(KINDS) <= set(AUX_KINDS)
    for kind in KINDS:
        assert AUX_KINDS[kind].args == QUANTIZE_ARGS and AUX_KINDS[kind].threads == 256
    header = (ROOT / "cuda" / "quantize_fp8.cuh").read_text()
    assert int(re.search(r"kTileRows = (\d+);", header).group(1)) == QUANTIZE_TILE_ROWS
    assert int(re.search(r"kMeanRows = (\d+);", header).group(1)) == QUANTIZE_MEAN_ROWS
    assert int(re.search(r"kFinishChannels = (\d+);", header).group(1)) == QUANTIZE_FINISH_CHANNELS
    # a tile lies inside one block of either tensor: the amax of a block is a max over whole tiles
    assert quantize_model.Q_BLOCK % QUANTIZE_TILE_ROWS == 0 and quantize_model.K_BLOCK % QUANTIZE_TILE_ROWS == 0


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    """The quantize kernels of both arches and one gfx950 attention kernel (the installation
    then has kernels for the fake device's arch)."""
    out = tmp_path_factory.mktemp("prebuilt")
    assert build.main(["--only", f"quantize_fp8,{ATTENTION}", "--out", str(out), "--jobs", "2"]) == 0
    return out


def test_the_manifest_lists_each_pass_of_each_arch_with_its_kind_grid_and_arguments(prebuilt):
    m = json.loads((prebuilt / "manifest.json").read_text())
    entries = {e["name"]: e for e in m["aux_kernels"]}
    for kind in KINDS:
        for arch in ("sm_90a", "gfx950"):
            a = AuxKernel(kind, arch)
            e = entries[a.name]
            assert e["built"] and e["kind"] == kind and e["symbol"] == a.symbol, a.name
            assert e["kernargs"] == [x.to_json() for x in kernargs(a)] and e["grid"] == a.spec.grid
            assert e["block_size"] == 256 and (prebuilt / e["file"]).exists()


@pytest.fixture
def fake(prebuilt):
    with using_backend("fake", ZYFA_PREBUILT_DIR=str(prebuilt), ZYFA_FAKE_ARCH=ARCH) as driver:
        yield driver


def bf16(shape, rng=np.random.default_rng(0)):
    return rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.bfloat16)


def args_of(launch):
    return unpack_args({"kernargs": [a.to_json() for a in kernargs(AuxKernel(KINDS[0], ARCH))]}, launch.args)


def symbols(fake):
    return [ln.symbol for ln in fake.launches]


def test_a_dense_block_call_queues_the_mean_the_blocks_and_vs_tile_passes_with_their_grids(fake):
    """(B, Sq, Hq, D) = (2, 200, 8, 128), Sk 100, Hkv 2, Dv 64, block granularity: Q blocks of
    128 (2) and K blocks of 64 (2) a workgroup each (heads q | k); v's tiles of QUANTIZE_TILE_ROWS rows over
    max(Sq, Sk) (its heads alone: from 8 + 2), its descales after q's 32 and k's 8."""
    q, k, v = bf16((2, 200, 8, 128)), bf16((2, 100, 2, 128)), bf16((2, 100, 2, 64))
    got = quantize_fp8(q, k, v, granularity="block")
    assert symbols(fake) == [AuxKernel(kind, ARCH).symbol for kind in KINDS]
    grids = [ln.grid for ln in fake.launches]
    tiles = -(-200 // QUANTIZE_TILE_ROWS)
    assert grids == [(2, 2, 2), (2 * 128 // QUANTIZE_FINISH_CHANNELS, 2, 1), (2, 10, 2), (tiles, 2, 2), (2 * 2, 1, 1),
                     (tiles, 2, 2)]
    args = args_of(fake.launches[0])
    assert all(args_of(ln) == args for ln in fake.launches)     # one argument buffer for every pass
    assert args["q"] == q.ctypes.data and args["q8"] == got.q.ptr and args["mean"] == got.mean.ptr
    assert [args[f"q_stride_{d}"] for d in "bsh"] == [200 * 8 * 128, 8 * 128, 128]
    assert [args[f"v8_stride_{d}"] for d in "bsh"] == [100 * 2 * 64, 2 * 64, 64]
    assert (args["cu_seqlens_q"], args["cu_seqlens_k"], args["smooth_k"], args["power_of_two"]) == (0, 0, 1, 1)
    assert (args["tile_y0"], args["descale_e0"]) == (10, 2 * 8 * 2 + 2 * 2 * 2)
    assert [args[f"q_{f}"] for f in ("ds_batches", "ds_groups", "ds_blocks", "heads_per_group", "block_rows")] \
        == [2, 8, 2, 1, 128]
    assert [args[f"k_{f}"] for f in ("ds_batches", "ds_groups", "ds_blocks", "heads_per_group", "block_rows")] \
        == [2, 2, 2, 1, 64]
    assert [args[f"v_{f}"] for f in ("ds_batches", "ds_groups", "ds_blocks", "heads_per_group", "block_rows")] \
        == [2, 2, 1, 1, 0]
    # scratch: the mean's fp64 sums, then (256-aligned) the tiles' amax, in the stream's workspace
    assert args["amax"] - args["sums"] == -(-2 * 2 * 2 * 128 * 8 // 256) * 256
    assert got.q.dtype == "fp8_e4m3" and got.q.shape == q.shape
    assert (got.descale_q.shape, got.descale_k.shape, got.descale_v.shape, got.mean.shape) == \
        ((2, 8, 2), (2, 2, 2), (2, 2), (2, 2, 128))


@pytest.mark.parametrize("granularity,groups_q,groups_k,shapes", [
    ("tensor", [1, 1, 1, 8, 0], [1, 1, 1, 2, 0], ((), (), ())),
    ("head", [3, 2, 1, 4, 0], [3, 2, 1, 1, 0], ((3, 2), (3, 2), (3, 2))),
])
def test_tensor_and_head_groups_are_whole_sequences_and_head_groups(fake, granularity, groups_q, groups_k, shapes):
    q, k, v = bf16((3, 40, 8, 64)), bf16((3, 50, 2, 64)), bf16((3, 50, 2, 64))
    got = quantize_fp8(q, k, v, granularity=granularity, smooth_k=False, power_of_two=False)
    # no sums without smooth_k (mean_finish writes the zeros); every head's tiles, every descale
    assert symbols(fake) == [AuxKernel(kind, ARCH).symbol for kind in KINDS[1:2] + KINDS[3:]]
    assert fake.launches[1].grid == (-(-50 // QUANTIZE_TILE_ROWS), 12, 3) and fake.launches[2].grid == (sum(int(np.prod(x)) for x in shapes), 1, 1)
    args = args_of(fake.launches[0])
    fields = ("ds_batches", "ds_groups", "ds_blocks", "heads_per_group", "block_rows")
    assert [args[f"q_{f}"] for f in fields] == groups_q and [args[f"k_{f}"] for f in fields] == groups_k
    assert (args["smooth_k"], args["power_of_two"]) == (0, 0)
    assert (got.descale_q.shape, got.descale_k.shape, got.descale_v.shape) == shapes


def test_a_packed_call_reads_its_sequences_from_cu_seqlens(fake):
    cu_q, cu_k = np.array([0, 5, 5, 300], np.int32), np.array([0, 70, 71, 100], np.int32)
    q, k, v = bf16((300, 4, 64)), bf16((100, 2, 64)), bf16((100, 2, 64))
    got = quantize_fp8(q, k, v, granularity="block", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=295,
                       max_seqlen_k=70)
    args = args_of(fake.launches[0])
    assert (args["cu_seqlens_q"], args["cu_seqlens_k"]) == (cu_q.ctypes.data, cu_k.ctypes.data)
    assert [args[f"k_stride_{d}"] for d in "bsh"] == [0, 128, 64]
    assert (args["batch"], args["seqlen_q"], args["seqlen_k"], args["max_seqlen_q"], args["max_seqlen_k"]) == \
        (3, 300, 100, 295, 70)
    assert fake.launches[2].grid == (3, 6, 3) and fake.launches[3].grid == (-(-295 // QUANTIZE_TILE_ROWS), 2, 3)
    assert got.descale_q.shape == (3, 4, 3) and got.descale_k.shape == (3, 2, 2)


def test_under_a_graph_capture_the_scratch_is_the_graphs_own_and_out_is_required(prebuilt):
    """A captured call allocates nothing but its scratch, stream-ordered on the capturing
    stream (freed after the launches); without out= it is refused before anything is queued."""
    with using_backend("fake", ZYFA_PREBUILT_DIR=str(prebuilt), ZYFA_FAKE_ARCH=ARCH, ZYFA_FAKE_DISCRETE="1") as gpu:
        from zyfa_runtime.memory import DeviceArray
        shapes = {"q": (1, 64, 4, 64), "k": (1, 64, 2, 64), "v": (1, 64, 2, 64)}
        q, k, v = (DeviceArray(gpu, 0, s, "bf16") for s in shapes.values())
        out = QuantizedFP8(*(DeviceArray(gpu, 0, s, "fp8_e4m3") for s in shapes.values()),
                           *(DeviceArray(gpu, 0, s, "float32") for s in ((1, 4, 1), (1, 2, 1), (1, 2), (1, 2, 64))))
        quantize_fp8(q, k, v, granularity="block", out=out, stream=3)        # a warm-up: modules loaded, the stream's workspace
        held = workspace.held_bytes()
        gpu.ops.clear()
        gpu.launches.clear()
        gpu.capturing.add(5)
        assert quantize_fp8(q, k, v, granularity="block", out=out, stream=5) is out
        ops = gpu.ops
        assert ops[0][0] == "alloc_async" and ops[0][3] == 5 and ops[-1] == ("free_async", ops[0][1], 5)
        assert [op[0] for op in ops[1:-1]] == ["launch"] * 6
        args = args_of(gpu.launches[-1])
        base, size = ops[0][1], ops[0][2]
        assert base <= args["sums"] < args["amax"] < base + size and workspace.held_bytes() == held
        gpu.ops.clear()
        with pytest.raises(ValueError, match="being captured into a graph needs out="):
            quantize_fp8(q, k, v, stream=5)
        assert gpu.ops == []
        gpu.capturing.clear()


def _out(q, k, v, /, groups=((2, 4, 1), (2, 2, 1), (2, 2)), mean_shape=(2, 2, 64), **change):
    """Outputs of a block call's shapes (_refused's), fields replaced by ``change``."""
    out = QuantizedFP8(np.zeros(q.shape, np.uint8), np.zeros(k.shape, np.uint8), np.zeros(v.shape, np.uint8),
                       *(np.zeros(s, np.float32) for s in (*groups, mean_shape)))
    for name, value in change.items():
        setattr(out, name, value)
    return out


def _refused(fake, exc, match, **change):
    args = dict(q=bf16((2, 9, 4, 64)), k=bf16((2, 11, 2, 64)), v=bf16((2, 11, 2, 64)), granularity="block")
    args.update({key: (val(args) if callable(val) else val) for key, val in change.items()})
    with pytest.raises(exc, match=match):
        quantize_fp8(**args)
    assert not fake.launches


def _overlapping_out(a):
    out = _out(a["q"], a["k"], a["v"])
    out.k = a["k"].view(np.uint8)[..., :64]
    return out


PACKED = dict(q=bf16((20, 4, 64)), k=bf16((30, 2, 64)), v=bf16((30, 2, 64)))


@pytest.mark.parametrize("exc,match,change", [
    (TypeError, "q must be bf16", dict(q=np.zeros((2, 9, 4, 64), np.float32))),
    (TypeError, "v must be bf16", dict(v=np.zeros((2, 11, 2, 64), np.float16))),
    (ValueError, r"granularity 'channel'; one of", dict(granularity="channel")),
    (TypeError, "smooth_k must be a bool", dict(smooth_k=1)),
    (ValueError, r"q has shape \(9, 4, 64\); dense tensors are", dict(q=bf16((9, 4, 64)))),
    (ValueError, r"q's heads \(3\) must be a multiple of k's \(2\)", dict(q=bf16((2, 9, 3, 64)))),
    (ValueError, "q has head dim 64, k 32", dict(k=bf16((2, 11, 2, 32)), v=bf16((2, 11, 2, 32)))),
    (ValueError, r"k \(2, 11, 2, 64\) and v \(2, 12, 2, 64\) must agree", dict(v=bf16((2, 12, 2, 64)))),
    (ValueError, "q has batch 3, k 2", dict(q=bf16((3, 9, 4, 64)))),
    (ValueError, "must be 1..256", dict(q=bf16((1, 9, 2, 320)), k=bf16((1, 9, 1, 320)), v=bf16((1, 9, 1, 64)))),
    (ValueError, "q must be contiguous along the head dim",
     dict(q=lambda a: bf16((2, 9, 4, 128))[..., ::2])),
    (ValueError, "max_seqlen_q / max_seqlen_k go with cu_seqlens", dict(max_seqlen_q=9)),
    (ValueError, "come together", dict(**PACKED, cu_seqlens_q=np.array([0, 20], np.int32))),
    (TypeError, "cu_seqlens_k must be int32", dict(**PACKED, cu_seqlens_q=np.array([0, 20], np.int32),
                                                   cu_seqlens_k=np.array([0, 30], np.int64),
                                                   max_seqlen_q=20, max_seqlen_k=30)),
    (ValueError, "packed tensors need max_seqlen_q", dict(**PACKED, cu_seqlens_q=np.array([0, 20], np.int32),
                                                          cu_seqlens_k=np.array([0, 30], np.int32))),
    (ValueError, "cu_seqlens_q is not non-decreasing", dict(**PACKED, cu_seqlens_q=np.array([0, 12, 9, 20], np.int32),
                                                            cu_seqlens_k=np.array([0, 10, 20, 30], np.int32),
                                                            max_seqlen_q=20, max_seqlen_k=30)),
    (ValueError, "cu_seqlens_k ends at 29, short of the packed length 30",
     dict(**PACKED, cu_seqlens_q=np.array([0, 20], np.int32), cu_seqlens_k=np.array([0, 29], np.int32),
          max_seqlen_q=20, max_seqlen_k=30)),
    (ValueError, r"max_seqlen_q = 10 is less than the longest sequence \(20\)",
     dict(**PACKED, cu_seqlens_q=np.array([0, 20], np.int32), cu_seqlens_k=np.array([0, 30], np.int32),
          max_seqlen_q=10, max_seqlen_k=30)),
    (ValueError, "out lacks mean", dict(out=lambda a: _out(a["q"], a["k"], a["v"], mean=None))),
    (TypeError, "out.q must be fp8_e4m3",
     dict(out=lambda a: _out(a["q"], a["k"], a["v"], **{"q": np.zeros(a["q"].shape, np.int16)}))),
    (ValueError, r"out.descale_q has shape \(2, 4, 1\); here it is \(\)",
     dict(granularity="tensor", out=lambda a: _out(a["q"], a["k"], a["v"]))),
    (ValueError, "out.k overlaps k in memory", dict(out=_overlapping_out)),
])
def test_an_invalid_call_is_refused_before_any_launch(fake, exc, match, change):
    _refused(fake, exc, match, **change)


def test_a_tensor_descale_may_be_given_as_shape_one_as_flash_attn_func_takes_it(fake):
    q, k, v = bf16((2, 9, 4, 64)), bf16((2, 11, 2, 64)), bf16((2, 11, 2, 64))
    out = _out(q, k, v, groups=((1,), (), (1,)))
    assert quantize_fp8(q, k, v, granularity="tensor", out=out) is out
    args = args_of(fake.launches[0])
    assert (args["descale_q"], args["descale_k"]) == (out.descale_q.ctypes.data, out.descale_k.ctypes.data)


def test_a_repeated_dense_call_into_the_same_outputs_queues_its_launches_again_unplanned(fake, monkeypatch):
    """The same tensors, options and stream: the launches as before, with no validation; other
    options or another output: planned (validated) anew."""
    from zyfa_runtime import quantize
    q, k, v = bf16((1, 64, 4, 64)), bf16((1, 64, 2, 64)), bf16((1, 64, 2, 64))
    out = quantize_fp8(q, k, v)
    assert quantize_fp8(q, k, v, out=out) is out
    fake.launches.clear()
    assert quantize_fp8(q, k, v, out=out) is out
    first = [(ln.symbol, ln.grid, args_of(ln)) for ln in fake.launches]
    fake.launches.clear()

    def planned(*a, **kw):
        raise AssertionError("planned again")
    monkeypatch.setattr(quantize, "check", planned)
    assert quantize_fp8(q, k, v, out=out) is out
    assert [(ln.symbol, ln.grid, args_of(ln)) for ln in fake.launches] == first
    for change in (dict(granularity="tensor"), dict(smooth_k=False),
                   dict(out=_out(q, k, v, groups=((1, 2),) * 3, mean_shape=(1, 2, 64)))):
        with pytest.raises(AssertionError, match="planned again"):
            quantize_fp8(q, k, v, **{"out": out, **change})
