"""merge_attention_states without a device: the fp64 merge (reference.py) is the attention over
both key sets; the catalogue's auxiliary kernels (a kind, their own arguments and grid) reach
the manifest, the runtime and the C header; on the fake backend a call packs exactly the
arguments and grid the kernel reads, and every invalid call is refused before a launch.
The kernel's arithmetic is checked on the emulator (tests/emulator/test_emu_merge.py) and on
a GPU (tests/test_gpu_merge.py)."""

import json
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

import build
from tests.backends import using_backend

from generator.c_header import write_header
from zyfa_runtime import merge_attention_states, reference
from zyfa_runtime.catalogue import (AUX_KINDS, MERGE_ROWS, AuxKernel, all_aux, eval_grid, kernarg_size, kernargs)
from zyfa_runtime.launch import unpack_args
from zyfa_runtime.merge import KIND


# ---- the fp64 merge -------------------------------------------------------------------------

def test_the_fp64_merge_of_two_key_sets_is_the_attention_over_both():
    """Dense and packed, GQA, the second key set invisible to the first rows of a causal
    sequence (their LSE -inf there): the merge equals the whole attention to fp64 rounding."""
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 30, 4, 32)), rng.standard_normal((2, 30, 2, 32)), rng.standard_normal((2, 30, 2, 32))
    whole, whole_lse = reference.attention(q, k, v, return_lse=True)
    oa, la = reference.attention(q, k[:, :11], v[:, :11], return_lse=True)
    ob, lb = reference.attention(q, k[:, 11:], v[:, 11:], return_lse=True)
    out, lse = reference.merge_attention_states(oa, la, ob, lb)
    assert np.abs(out - whole).max() < 1e-12 and np.abs(lse - whole_lse).max() < 1e-12
    # packed: (T, H, D) with (H, T), the same rows
    out_p, lse_p = reference.merge_attention_states(oa[0], la[0], ob[0], lb[0])
    assert np.abs(out_p - whole[0]).max() < 1e-12 and np.abs(lse_p - whole_lse[0]).max() < 1e-12


def test_the_fp64_merge_takes_a_side_without_keys_as_it_is_and_both_as_zeros_and_minus_inf():
    o_a = np.arange(12.0).reshape(1, 3, 1, 4)
    o_b = np.full((1, 3, 1, 4), np.nan)            # never read where its weight is 0
    lse_a = np.array([[[1.0, -np.inf, -np.inf]]])
    lse_b = np.array([[[-np.inf, -np.inf, -np.inf]]])
    o_b[0, 1] = 7.0
    lse_b[0, 0, 1] = 2.5
    out, lse = reference.merge_attention_states(o_a, lse_a, o_b, lse_b)
    assert np.array_equal(out[0, 0], o_a[0, 0]) and lse[0, 0, 0] == 1.0
    assert np.array_equal(out[0, 1], o_b[0, 1]) and lse[0, 0, 1] == 2.5
    assert np.array_equal(out[0, 2], np.zeros((1, 4))) and lse[0, 0, 2] == -np.inf


# ---- catalogue, build, header -------------------------------------------------------------

def test_every_auxiliary_kernel_has_a_layout_ending_on_8_bytes_and_a_grid_over_its_arguments():
    for a in all_aux():
        args = kernargs(a)
        names = {x.name for x in args}
        assert len(names) == len(args) and kernarg_size(args) == args[-1].offset + args[-1].size, a.name
        values = {n: 3 for n in names}
        assert all(g >= 1 for g in eval_grid(a.spec.grid, values)), a.name
    assert [a.name for a in all_aux()] == [f"{k}_{arch}" for k in AUX_KINDS for arch in ("sm_90a", "gfx950")]
    with pytest.raises(ValueError, match="unknown auxiliary kernel kind"):
        AuxKernel("transpose", "gfx950")


#: The arch of the fake device: gfx950, whose one attention kernel the fixture builds (the FP8
#: assembly, in a second) so that the installation has kernels for the device's arch at all.
ARCH = "gfx950"
ATTENTION = "fwd_gfx950_fp8_e4m3_d64x64_full"


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    """The merge kernels of both arches (they build in a second) and one gfx950 attention kernel."""
    out = tmp_path_factory.mktemp("prebuilt")
    assert build.main(["--only", f"merge_attention_states,{ATTENTION}", "--out", str(out), "--jobs", "2"]) == 0
    return out


def test_the_manifest_lists_each_auxiliary_kernel_with_its_kind_apart_from_attention(prebuilt):
    m = json.loads((prebuilt / "manifest.json").read_text())
    assert [e["name"] for e in m["kernels"] if e["built"]] == [ATTENTION]
    entries = {e["name"]: e for e in m["aux_kernels"]}
    for a in (x for x in all_aux() if x.kind == KIND):   # the fixture builds the merge kernels
        e = entries[a.name]
        assert e["built"] and e["kind"] == a.kind and e["arch"] == a.arch and e["symbol"] == a.symbol
        assert e["kernargs"] == [x.to_json() for x in kernargs(a)] and e["grid"] == a.spec.grid
        assert e["block_size"] == a.spec.threads and (prebuilt / e["file"]).exists()


needs_cc = pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc here")


@needs_cc
def test_the_c_header_declares_the_merge_kernels_with_the_manifest_layout_and_grid(prebuilt, tmp_path):
    m = json.loads((prebuilt / "manifest.json").read_text())
    (tmp_path / "zyfa_kernels.h").write_text(write_header(m))
    name = AuxKernel(KIND, "sm_90a").name
    src = tmp_path / "t.c"
    fields = "".join(f'  printf("%zu ", offsetof(struct zyfa_{name}_args, {a.name}));\n'
                     for a in kernargs(AuxKernel(KIND, "sm_90a")))
    src.write_text(f'#include <stdio.h>\n#include "zyfa_kernels.h"\nint main(void) {{\n'
                   f'  struct zyfa_{name}_args a = {{0}}; unsigned x, y, z;\n'
                   f'  a.seqlen = 17; a.heads = 3; a.batch = 5;\n{fields}'
                   f'  zyfa_{name}_grid(&a, &x, &y, &z);\n'
                   f'  printf("| %u %u %u %zu %d %s\\n", x, y, z, sizeof a, ZYFA_NUM_AUX_KERNELS, ZYFA_{name.upper()}_KIND);\n'
                   f'  return 0;\n}}\n')
    exe = tmp_path / "t"
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-pedantic", "-I", str(tmp_path), str(src), "-o", str(exe)],
                   check=True)
    offsets, rest = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("|")
    args = kernargs(AuxKernel(KIND, "sm_90a"))
    assert [int(x) for x in offsets.split()] == [a.offset for a in args]
    x, y, z, size, n, kind = rest.split()
    assert (int(x), int(y), int(z)) == (-(-17 // MERGE_ROWS), 3, 5) and int(size) == kernarg_size(args)
    assert int(n) == 2 and kind == KIND


# ---- the runtime on the fake backend ------------------------------------------------------

@pytest.fixture
def fake(prebuilt):
    with using_backend("fake", ZYFA_PREBUILT_DIR=str(prebuilt), ZYFA_FAKE_ARCH=ARCH) as driver:
        yield driver


def bf16(shape, rng=np.random.default_rng(0)):
    return rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.bfloat16)


def f32(shape, rng=np.random.default_rng(0)):
    return rng.standard_normal(shape).astype(np.float32)


def test_a_dense_call_of_strided_views_packs_their_addresses_and_strides(fake):
    o_a = bf16((2, 37, 3, 64))
    o_b_buf = bf16((2, 37, 7, 72))
    o_b = o_b_buf[:, :, 1:7:2, 8:]                 # a head stride of 144, a row stride of 504
    lse_a, lse_b = f32((2, 3, 37)), f32((3, 2, 40)).transpose(1, 0, 2)[:, :, :37]
    out, out_lse = merge_attention_states(o_a, lse_a, o_b, lse_b)
    (launch,) = fake.launches
    entry = {e["name"]: e for e in json.loads((fake_prebuilt(fake) / "manifest.json").read_text())["aux_kernels"]}
    e = entry[AuxKernel(KIND, ARCH).name]
    assert launch.symbol == e["symbol"]
    assert launch.grid == (-(-37 // MERGE_ROWS), 3, 2) and launch.block == (e["block_size"], 1, 1)
    args = unpack_args(e, launch.args)
    assert args["o_a"] == o_a.ctypes.data and args["o_b"] == o_b.ctypes.data
    assert args["out"] == out.ptr and args["out_lse"] == out_lse.ptr
    assert [args[f"o_b_stride_{d}"] for d in "bsh"] == [37 * 7 * 72, 7 * 72, 144]
    assert [args[f"o_a_stride_{d}"] for d in "bsh"] == [37 * 3 * 64, 3 * 64, 64]
    assert [args[f"lse_b_stride_{d}"] for d in "bhs"] == [40, 80, 1]
    assert [args[f"out_lse_stride_{d}"] for d in "bhs"] == [3 * 37, 37, 1]
    assert (args["batch"], args["heads"], args["seqlen"], args["head_dim"]) == (2, 3, 37, 64)
    assert out.shape == (2, 37, 3, 64) and out.dtype == "bf16" and out_lse.shape == (2, 3, 37)


def fake_prebuilt(driver):
    from zyfa_runtime import api
    return api.kernel_table(driver).prebuilt


def test_a_packed_call_is_one_sequence_of_its_rows(fake):
    o_a, o_b = bf16((50, 2, 128)), bf16((50, 2, 128))
    lse_a, lse_b = f32((2, 50)), f32((2, 50))
    out = np.zeros((50, 2, 128), ml_dtypes.bfloat16)
    lse_out = np.zeros((2, 64), np.float32)[:, :50]
    got = merge_attention_states(o_a, lse_a, o_b, lse_b, out=out, out_lse=lse_out)
    assert got[0] is out and got[1] is lse_out
    (launch,) = fake.launches
    args = unpack_args({"kernargs": [a.to_json() for a in kernargs(AuxKernel(KIND, ARCH))]}, launch.args)
    assert launch.grid == (-(-50 // MERGE_ROWS), 2, 1)
    assert [args[f"out_stride_{d}"] for d in "bsh"] == [0, 256, 128]
    assert [args[f"out_lse_stride_{d}"] for d in "bhs"] == [0, 64, 1]
    assert (args["batch"], args["seqlen"]) == (1, 50)


def test_the_merge_in_place_is_accepted(fake):
    o_a, o_b, lse_a, lse_b = bf16((1, 9, 2, 64)), bf16((1, 9, 2, 64)), f32((1, 2, 9)), f32((1, 2, 9))
    merge_attention_states(o_a, lse_a, o_b, lse_b, out=o_b, out_lse=lse_a)
    (launch,) = fake.launches
    args = unpack_args({"kernargs": [a.to_json() for a in kernargs(AuxKernel(KIND, ARCH))]}, launch.args)
    assert args["out"] == o_b.ctypes.data and args["out_lse"] == lse_a.ctypes.data


def test_no_rows_launch_nothing(fake):
    out, out_lse = merge_attention_states(bf16((0, 2, 64)), f32((2, 0)), bf16((0, 2, 64)), f32((2, 0)))
    assert not fake.launches and out.shape == (0, 2, 64) and out_lse.shape == (2, 0)


def _lse_a_inside_out() -> dict:
    """lse_a (2, 3, 9) fp32 on the first bytes of one buffer and out (2, 9, 3, 64) bf16 over all
    of it: the two overlap, and nothing else does (the buffer is theirs alone)."""
    buf = np.zeros(2 * 9 * 3 * 64, ml_dtypes.bfloat16)
    lse_a = buf.view(np.uint8)[:2 * 3 * 9 * 4].view(np.float32).reshape(2, 3, 9)
    return dict(lse_a=lse_a, out=buf.reshape(2, 9, 3, 64))


def _refused(fake, exc, match, **change):
    args = dict(o_a=bf16((2, 9, 3, 64)), lse_a=f32((2, 3, 9)), o_b=bf16((2, 9, 3, 64)), lse_b=f32((2, 3, 9)),
                out=None, out_lse=None)
    args.update({k: (v(args) if callable(v) else v) for k, v in change.items()})
    with pytest.raises(exc, match=match):
        merge_attention_states(args["o_a"], args["lse_a"], args["o_b"], args["lse_b"],
                               out=args["out"], out_lse=args["out_lse"])
    assert not fake.launches


@pytest.mark.parametrize("exc,match,change", [
    (TypeError, "o_b must be bf16", dict(o_b=np.zeros((2, 9, 3, 64), np.float32))),
    (TypeError, "lse_a must be float32", dict(lse_a=np.zeros((2, 3, 9), np.float64))),
    (ValueError, r"o_b has shape \(2, 9, 3, 32\), o_a", dict(o_b=bf16((2, 9, 3, 32)))),
    (ValueError, r"lse_b has shape \(2, 9, 3\); .* is \(2, 3, 9\)", dict(lse_b=f32((2, 9, 3)))),
    (ValueError, "O is \\(batch, seqlen, heads, head_dim\\)", dict(o_a=bf16((9, 64)))),
    (ValueError, "out must be contiguous along the head dim",
     dict(out=np.zeros((2, 9, 3, 128), ml_dtypes.bfloat16)[..., ::2])),
    (ValueError, "out overlaps o_a in memory without being o_a itself",
     dict(out=lambda a: _shifted(a["o_a"], 64))),
    (ValueError, "out_lse overlaps lse_b in memory without being lse_b itself",
     dict(out_lse=lambda a: np.lib.stride_tricks.as_strided(a["lse_b"], (2, 3, 9), (108, 4, 12)))),
    (ValueError, "out overlaps lse_a in memory", _lse_a_inside_out()),
    (ValueError, "out is read-only", dict(out=lambda a: _readonly(bf16((2, 9, 3, 64))))),
    (ValueError, r"out_lse has elements that share an address \(strides \(0, 9, 1\)\)",
     dict(out_lse=lambda a: np.lib.stride_tricks.as_strided(f32((3, 9)), (2, 3, 9), (0, 36, 4)))),
    (ValueError, "out has elements that share an address",
     dict(out=lambda a: np.lib.stride_tricks.as_strided(bf16((2, 9, 2, 64)), (2, 9, 3, 64), (2304, 256, 64, 2)))),
])
def test_an_invalid_call_is_refused_before_any_launch(fake, exc, match, change):
    _refused(fake, exc, match, **change)


def _shifted(x, elements):
    """A view of x's layout starting ``elements`` later: overlapping x, not x (never accessed:
    the call is refused)."""
    return np.lib.stride_tricks.as_strided(x.reshape(-1)[elements:], x.shape, x.strides)


def _readonly(x):
    x.flags.writeable = False
    return x
