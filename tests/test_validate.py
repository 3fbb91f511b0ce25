"""check_dense / check_varlen: one test per rule of the public API.

Inputs are TensorRefs over made-up, well-aligned device addresses: validation only reads
the descriptions, so no memory (and no GPU) is needed.
"""

import math

import ml_dtypes
import numpy as np
import pytest

from zyfa_runtime import catalogue
from zyfa_runtime.tensors import TensorRef, as_tensor
from zyfa_runtime.validate import Problem, check_dense, check_varlen

GPU = ("cuda", 0)
SLOT = 1 << 32  # address distance between the made-up tensors


def contiguous(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def ref(shape, dtype="bf16", slot=0, *, strides=None, device=GPU, offset=0, readonly=False):
    return TensorRef(ptr=(slot + 1) * SLOT + offset, shape=tuple(shape),
                     strides=contiguous(shape) if strides is None else tuple(strides),
                     dtype=dtype, device=device, readonly=readonly)


def restride(t, dim, stride):
    s = list(t.strides)
    s[dim] = stride
    return TensorRef(t.ptr, t.shape, tuple(s), t.dtype, t.device)


def moved(t, **changes):
    fields = dict(ptr=t.ptr, shape=t.shape, strides=t.strides, dtype=t.dtype, device=t.device,
                  readonly=t.readonly)
    fields.update(changes)
    if "shape" in changes and "strides" not in changes:
        fields["strides"] = contiguous(fields["shape"])
    return TensorRef(**fields)


def dense(dtype="bf16", b=2, sq=5, sk=7, hq=4, hkv=2, dims=(128, 128), **over):
    dqk, dv = dims
    args = dict(q=ref((b, sq, hq, dqk), dtype, 0), k=ref((b, sk, hkv, dqk), dtype, 1),
                v=ref((b, sk, hkv, dv), dtype, 2), out=ref((b, sq, hq, dv), "bf16", 3),
                causal=False, softmax_scale=None, descale_q=None, descale_k=None,
                descale_v=None, return_lse=False)
    args.update(over)
    return args


CU_Q, CU_K = np.array([0, 3, 3, 8], np.int32), np.array([0, 4, 6, 10], np.int32)


def varlen(dtype="bf16", hq=4, hkv=2, dims=(128, 128), cu_q=CU_Q, cu_k=CU_K, **over):
    dqk, dv = dims
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    args = dict(q=ref((tq, hq, dqk), dtype, 0), k=ref((tk, hkv, dqk), dtype, 1),
                v=ref((tk, hkv, dv), dtype, 2), out=ref((tq, hq, dv), "bf16", 3),
                cu_seqlens_q=ref(cu_q.shape, "int32", 4), cu_seqlens_k=ref(cu_k.shape, "int32", 5),
                max_seqlen_q=int(np.diff(cu_q).max()), max_seqlen_k=int(np.diff(cu_k).max()),
                cu_values_q=cu_q, cu_values_k=cu_k, causal=False, softmax_scale=None,
                descale_q=None, descale_k=None, descale_v=None, return_lse=False)
    args.update(over)
    return args


def descales(**over):
    d = {f"descale_{t}": ref((), "float32", 6 + i) for i, t in enumerate("qkv")}
    d.update(over)
    return d


def rejects(check, args, exc, *names):
    """``check(**args)`` raises ``exc`` whose message contains every one of ``names``."""
    with pytest.raises(exc) as info:
        check(**args)
    for name in names:
        assert name in str(info.value), f"{name!r} not in {str(info.value)!r}"
    return str(info.value)


# --------------------------------------------------------------------------------------
# Valid problems.


def test_dense_problem():
    p = check_dense(**dense(causal=True, return_lse=True))
    assert p == Problem(dtype="bf16", d_qk=128, d_v=128, causal=True, batch=2, hq=4, hkv=2,
                        seqlen_q=5, seqlen_k=7, varlen=False, total_q=10, total_k=14,
                        softmax_scale=1 / math.sqrt(128), return_lse=True, device=GPU, window=(-1, 0))


def test_varlen_problem():
    p = check_varlen(**varlen("fp8_e4m3", dims=(192, 128)))
    assert p == Problem(dtype="fp8_e4m3", d_qk=192, d_v=128, causal=False, batch=3, hq=4, hkv=2,
                        seqlen_q=5, seqlen_k=4, varlen=True, total_q=8, total_k=10,
                        softmax_scale=1 / math.sqrt(192), return_lse=False, device=GPU)


@pytest.mark.parametrize("dtype", catalogue.DTYPES)
@pytest.mark.parametrize("dims", catalogue.HEAD_DIMS)
def test_every_catalogue_variant_is_accepted(dtype, dims):
    assert check_dense(**dense(dtype, dims=dims)).dtype == dtype
    assert check_varlen(**varlen(dtype, dims=dims)).d_v == dims[1]


@pytest.mark.parametrize("hq, hkv", [(6, 3), (12, 4), (5, 5), (7, 1), (10, 5)])
def test_any_integer_head_ratio_is_accepted(hq, hkv):
    assert check_dense(**dense(hq=hq, hkv=hkv)).hq == hq


def test_out_may_be_omitted():
    assert check_dense(**dense(out=None)).batch == 2
    assert check_varlen(**varlen(out=None)).batch == 3


def test_cu_values_may_be_omitted():
    assert check_varlen(**varlen(cu_values_q=None, cu_values_k=None)).seqlen_q == 5


# --------------------------------------------------------------------------------------
# Argument kinds and flags.


@pytest.mark.parametrize("name", ["q", "k", "v", "out", "descale_q"])
def test_tensor_arguments_must_be_tensorrefs(name):
    args = dense("fp8_e4m3", **{name: np.zeros(4)})
    rejects(check_dense, args, TypeError, name, "TensorRef")


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_must_be_tensorrefs(name):
    rejects(check_varlen, varlen(**{name: [0, 3]}), TypeError, name)


@pytest.mark.parametrize("name, value", [("causal", 1), ("causal", "yes"), ("causal", None),
                                         ("return_lse", 0), ("return_lse", None)])
def test_flags_must_be_bool(name, value):
    rejects(check_dense, dense(**{name: value}), TypeError, name, "bool")


# --------------------------------------------------------------------------------------
# Dtypes.


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("bad", ["float16", "float32", "fp8_e5m2", "uint8"])
def test_input_dtype_must_be_bf16_or_fp8(name, bad):
    args = dense()
    args[name] = moved(args[name], dtype=bad)
    rejects(check_dense, args, TypeError, f"{name} dtype", bad)


@pytest.mark.parametrize("name", ["k", "v"])
def test_input_dtypes_must_match(name):
    args = dense("bf16")
    args[name] = moved(args[name], dtype="fp8_e4m3")
    rejects(check_dense, args, TypeError, f"{name} dtype", "q dtype")


@pytest.mark.parametrize("dtype", catalogue.DTYPES)
@pytest.mark.parametrize("out_dtype", ["float32", "float16", "fp8_e4m3"])
def test_out_dtype_must_be_bf16(dtype, out_dtype):
    args = dense(dtype)
    args["out"] = moved(args["out"], dtype=out_dtype)
    rejects(check_dense, args, TypeError, "out dtype", "bf16")


# --------------------------------------------------------------------------------------
# Shapes.


@pytest.mark.parametrize("name", ["q", "k", "v", "out"])
def test_dense_tensors_must_be_4d(name):
    args = dense()
    args[name] = moved(args[name], shape=args[name].shape[1:])
    rejects(check_dense, args, ValueError, name, "4-D")


@pytest.mark.parametrize("name", ["q", "k", "v", "out"])
def test_varlen_tensors_must_be_3d(name):
    args = varlen()
    args[name] = moved(args[name], shape=(1,) + args[name].shape)
    rejects(check_varlen, args, ValueError, name, "3-D")


@pytest.mark.parametrize("name", ["k", "v"])
def test_batch_sizes_must_match(name):
    args = dense()
    args[name] = moved(args[name], shape=(3,) + args[name].shape[1:])
    rejects(check_dense, args, ValueError, f"{name} batch size", "q batch size")


@pytest.mark.parametrize("check, make", [(check_dense, dense), (check_varlen, varlen)])
def test_k_and_v_lengths_must_match(check, make):
    args = make()
    shape = list(args["v"].shape)
    shape[-3] += 1
    args["v"] = moved(args["v"], shape=tuple(shape))
    rejects(check, args, ValueError, "v ", "k ")


@pytest.mark.parametrize("check, make", [(check_dense, dense), (check_varlen, varlen)])
def test_k_and_v_heads_must_match(check, make):
    args = make()
    shape = list(args["v"].shape)
    shape[-2] += 1
    args["v"] = moved(args["v"], shape=tuple(shape))
    rejects(check, args, ValueError, "v heads", "k heads")


def test_q_and_k_head_dims_must_match():
    args = dense(dims=(128, 128))
    args["k"] = moved(args["k"], shape=args["k"].shape[:-1] + (64,))
    rejects(check_dense, args, ValueError, "k head dim", "q head dim")


@pytest.mark.parametrize("hq, hkv", [(6, 4), (4, 8), (3, 2)])
def test_q_heads_must_be_a_multiple_of_kv_heads(hq, hkv):
    rejects(check_dense, dense(hq=hq, hkv=hkv), ValueError, f"q heads {hq}", f"k/v heads {hkv}")


@pytest.mark.parametrize("hq, hkv", [(4, 0), (0, 2)])
def test_at_least_one_head(hq, hkv):
    rejects(check_dense, dense(hq=hq, hkv=hkv), ValueError, "heads")


@pytest.mark.parametrize("dims", [(96, 96), (128, 64), (64, 128), (256, 128), (192, 192)])
def test_head_dims_must_be_in_the_catalogue(dims):
    rejects(check_dense, dense(dims=dims), ValueError, "head dims", str(dims[0]), str(dims[1]))


@pytest.mark.parametrize("check, make", [(check_dense, dense), (check_varlen, varlen)])
def test_out_shape_must_match(check, make):
    args = make()
    args["out"] = moved(args["out"], shape=args["out"].shape[:-1] + (64,))
    rejects(check, args, ValueError, "out shape")


@pytest.mark.parametrize("over, name", [(dict(b=0), "q batch size"), (dict(sq=0), "q seqlen"),
                                        (dict(sk=0), "k seqlen")])
def test_dense_lengths_must_be_at_least_one(over, name):
    rejects(check_dense, dense(**over), ValueError, name, ">= 1")


def test_varlen_segments_may_be_empty():
    cu = np.array([0, 0, 3, 3], np.int32)
    p = check_varlen(**varlen(cu_q=cu, cu_k=cu))
    assert (p.batch, p.total_q, p.seqlen_q) == (3, 3, 3)


def test_sizes_must_fit_32_bit_kernel_arguments():
    big = 2**31
    args = dense(sq=1)
    args["q"] = moved(args["q"], shape=(2, big, 4, 128))
    args["out"] = moved(args["out"], shape=(2, big, 4, 128))
    rejects(check_dense, args, ValueError, "seqlen_q")
    rejects(check_varlen, varlen(max_seqlen_k=big), ValueError, "max_seqlen_k")


# --------------------------------------------------------------------------------------
# Layout: strides and alignment.


@pytest.mark.parametrize("name", ["q", "k", "v", "out"])
def test_head_dim_must_have_unit_stride(name):
    args = dense()
    t = args[name]
    args[name] = TensorRef(t.ptr, t.shape, tuple(s * 2 for s in t.strides), t.dtype, t.device)
    rejects(check_dense, args, ValueError, name, "unit stride")


@pytest.mark.parametrize("name", ["q", "k", "v", "out"])
def test_strides_must_not_be_negative(name):
    args = dense()
    args[name] = restride(args[name], 1, -args[name].strides[1])
    rejects(check_dense, args, ValueError, name, "negative stride")


@pytest.mark.parametrize("name", ["q", "k", "v", "out"])
def test_data_pointers_must_be_16_byte_aligned(name):
    args = dense()
    args[name] = moved(args[name], ptr=args[name].ptr + 8)
    rejects(check_dense, args, ValueError, f"{name} data pointer", "16-byte aligned")


@pytest.mark.parametrize("name", ["q", "k", "v", "out"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_row_strides_must_be_multiples_of_16_bytes(name, dim):
    args = dense()
    t = args[name]
    args[name] = restride(t, dim, t.strides[dim] + 4)  # +8 bytes
    rejects(check_dense, args, ValueError, name, f"dim {dim}", "multiple of 16")


def test_fp8_row_strides_are_measured_in_bytes():
    args = dense("fp8_e4m3", hq=1, hkv=1)
    args["q"] = restride(args["q"], 1, 144)   # 144 bytes: fine
    args["k"] = restride(args["k"], 1, 136)   # 136 bytes: not
    rejects(check_dense, args, ValueError, "k stride of dim 1", "136 bytes")
    args["k"] = restride(args["k"], 1, 160)
    assert check_dense(**args).dtype == "fp8_e4m3"


def test_strides_of_size_one_dims_are_not_checked():
    args = dense(b=1, hq=1, hkv=1)
    args["q"] = restride(restride(args["q"], 0, 3), 2, -5)
    assert check_dense(**args).batch == 1


def test_out_must_be_writable():
    args = dense()
    args["out"] = moved(args["out"], readonly=True)
    rejects(check_dense, args, ValueError, "out", "read-only")


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_out_must_not_overlap_an_input(name):
    args = dense(dims=(128, 128))
    args["out"] = moved(args["out"], ptr=args[name].ptr + 256)
    rejects(check_dense, args, ValueError, "out", f"overlaps {name}")


def test_out_may_sit_right_after_an_input():
    args = dense()
    q = args["q"]
    args["out"] = moved(args["out"], ptr=q.extent()[1])
    assert check_dense(**args).batch == 2


# --------------------------------------------------------------------------------------
# Devices.


@pytest.mark.parametrize("name", ["q", "k", "v", "out", "descale_v"])
def test_host_memory_is_rejected(name):
    args = dense("fp8_e4m3", **descales())
    args[name] = moved(args[name], device=("cpu", 0))
    rejects(check_dense, args, ValueError, name, "host memory")


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
def test_host_cu_seqlens_are_rejected(name):
    args = varlen()
    args[name] = moved(args[name], device=("cpu", 0))
    rejects(check_varlen, args, ValueError, name, "host memory")


def _host(shape, dtype):
    """A zeroed host array whose data is 64-byte aligned."""
    dt = np.dtype(dtype)
    raw = np.zeros(math.prod(shape) * dt.itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + math.prod(shape) * dt.itemsize].view(dt).reshape(shape)


def test_host_memory_is_accepted_with_host_ok():
    bf16 = ml_dtypes.bfloat16
    q, k, v, out = (as_tensor(_host(s, bf16)) for s in
                    [(1, 3, 2, 64), (1, 4, 1, 64), (1, 4, 1, 64), (1, 3, 2, 64)])
    p = check_dense(q, k, v, out, causal=False, softmax_scale=None, descale_q=None,
                    descale_k=None, descale_v=None, return_lse=False, host_ok=True)
    assert p.device == ("cpu", 0)
    cu = as_tensor(np.array([0, 3], np.int32))
    qv, kv, vv, ov = (as_tensor(_host(s, bf16)) for s in
                      [(3, 2, 64), (3, 1, 64), (3, 1, 64), (3, 2, 64)])
    p = check_varlen(qv, kv, vv, ov, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=3,
                     max_seqlen_k=3, causal=True, softmax_scale=0.1, descale_q=None,
                     descale_k=None, descale_v=None, return_lse=True,
                     cu_values_q=np.array([0, 3]), cu_values_k=np.array([0, 3]), host_ok=True)
    assert p.device == ("cpu", 0)


@pytest.mark.parametrize("name, device", [("k", ("cuda", 1)), ("v", ("rocm", 0)),
                                          ("out", ("cuda", 1)), ("descale_q", ("cuda", 2))])
def test_all_tensors_must_be_on_one_device(name, device):
    args = dense("fp8_e4m3", **descales())
    args[name] = moved(args[name], device=device)
    rejects(check_dense, args, ValueError, name, "one device")


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_must_be_on_the_same_device(name):
    args = varlen()
    args[name] = moved(args[name], device=("cuda", 1))
    rejects(check_varlen, args, ValueError, name, "one device")


def test_unknown_device_ordinal_matches_the_others():
    args = dense()
    args["q"] = moved(args["q"], device=("cuda", -1))
    args["k"] = moved(args["k"], device=("cuda", 3))
    args["v"] = moved(args["v"], device=("cuda", 3))
    args["out"] = moved(args["out"], device=("cuda", 3))
    assert check_dense(**args).device == ("cuda", 3)


def test_non_gpu_device_is_rejected():
    args = dense()
    for name in ("q", "k", "v", "out"):
        args[name] = moved(args[name], device=("metal", 0))
    rejects(check_dense, args, ValueError, "q", "metal")


# --------------------------------------------------------------------------------------
# cu_seqlens and max_seqlen.


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
@pytest.mark.parametrize("dtype", ["int64", "uint32", "float32"])
def test_cu_seqlens_must_be_int32(name, dtype):
    args = varlen()
    args[name] = moved(args[name], dtype=dtype)
    rejects(check_varlen, args, TypeError, name, "int32")


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_must_be_1d(name):
    args = varlen()
    args[name] = moved(args[name], shape=(1, 4))
    rejects(check_varlen, args, ValueError, name, "1-D")


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_need_at_least_two_entries(name):
    args = varlen(cu_values_q=None, cu_values_k=None)
    args[name] = moved(args[name], shape=(1,))
    rejects(check_varlen, args, ValueError, name, ">= 2")


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_must_be_contiguous(name):
    args = varlen()
    args[name] = moved(args[name], strides=(2,))
    rejects(check_varlen, args, ValueError, name, "contiguous")


def test_cu_seqlens_lengths_must_agree():
    cu_k = np.array([0, 4, 10], np.int32)
    rejects(check_varlen, varlen(cu_k=cu_k), ValueError, "cu_seqlens_k", "cu_seqlens_q")


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k", "descale_k"])
def test_scalar_pointers_must_be_naturally_aligned(name):
    args = varlen("fp8_e4m3", **descales())
    args[name] = moved(args[name], ptr=args[name].ptr + 2)
    rejects(check_varlen, args, ValueError, f"{name} data pointer", "4-byte aligned")


@pytest.mark.parametrize("s", ["q", "k"])
def test_cu_values_must_match_the_tensor_length(s):
    args = varlen(**{f"cu_values_{s}": np.array([0, 3, 8], np.int32)})
    rejects(check_varlen, args, ValueError, f"cu_values_{s}", f"cu_seqlens_{s}")


def rejects_cu_values(s, cu_q, cu_k, message):
    """check_varlen refuses packed lengths ``cu_q`` (s "q") or ``cu_k`` (s "k"): a ValueError
    naming cu_seqlens_{s} and ``message``."""
    cu = np.array(cu_q if s == "q" else cu_k, np.int32)
    rejects(check_varlen, varlen(**{f"cu_values_{s}": cu}), ValueError, f"cu_seqlens_{s}", message)


@pytest.mark.parametrize("s", ["q", "k"])
def test_cu_seqlens_must_start_at_zero(s):
    rejects_cu_values(s, [1, 3, 3, 8], [2, 4, 6, 10], "start at 0")


@pytest.mark.parametrize("s", ["q", "k"])
def test_cu_seqlens_must_be_non_decreasing(s):
    rejects_cu_values(s, [0, 5, 3, 8], [0, 7, 6, 10], "not non-decreasing")


@pytest.mark.parametrize("s", ["q", "k"])
def test_cu_seqlens_must_not_run_beyond_the_packed_length(s):
    rejects_cu_values(s, [0, 3, 3, 9], [0, 4, 6, 11], "beyond the packed length")


@pytest.mark.parametrize("s", ["q", "k"])
def test_cu_seqlens_must_cover_the_packed_length(s):
    rejects_cu_values(s, [0, 3, 3, 7], [0, 4, 6, 9], "short of the packed length")


@pytest.mark.parametrize("s", ["q", "k"])
def test_max_seqlen_must_cover_the_longest_sequence(s):
    args = varlen()
    args[f"max_seqlen_{s}"] -= 1
    rejects(check_varlen, args, ValueError, f"max_seqlen_{s}", "longest sequence")


@pytest.mark.parametrize("s", ["q", "k"])
@pytest.mark.parametrize("value", [5.0, "5", True, None])
def test_max_seqlen_must_be_an_int(s, value):
    rejects(check_varlen, varlen(**{f"max_seqlen_{s}": value}), TypeError,
            f"max_seqlen_{s}", "int")


@pytest.mark.parametrize("s", ["q", "k"])
@pytest.mark.parametrize("value", [0, -3])
def test_max_seqlen_must_be_at_least_one(s, value):
    args = varlen(cu_values_q=None, cu_values_k=None, **{f"max_seqlen_{s}": value})
    rejects(check_varlen, args, ValueError, f"max_seqlen_{s}", ">= 1")


def test_max_seqlen_accepts_numpy_integers():
    assert check_varlen(**varlen(max_seqlen_q=np.int64(6))).seqlen_q == 6


# --------------------------------------------------------------------------------------
# FP8 descales.


@pytest.mark.parametrize("shape", [(), (1,)])
def test_fp8_descales_are_optional_and_accept_one_value(shape):
    assert check_dense(**dense("fp8_e4m3")).dtype == "fp8_e4m3"
    args = dense("fp8_e4m3", **descales(descale_k=ref(shape, "float32", 7)))
    assert check_dense(**args).dtype == "fp8_e4m3"


@pytest.mark.parametrize("name", ["descale_q", "descale_k", "descale_v"])
def test_descales_are_rejected_with_bf16_inputs(name):
    args = dense("bf16", **{name: ref((), "float32", 6)})
    rejects(check_dense, args, ValueError, name, "fp8_e4m3")


@pytest.mark.parametrize("name", ["descale_q", "descale_k", "descale_v"])
@pytest.mark.parametrize("dtype", ["bf16", "float16", "float64"])
def test_descales_must_be_float32(name, dtype):
    args = dense("fp8_e4m3", **{name: ref((), dtype, 6)})
    rejects(check_dense, args, TypeError, name, "float32")


@pytest.mark.parametrize("name", ["descale_q", "descale_k", "descale_v"])
@pytest.mark.parametrize("shape", [(2,), (1, 1), (4, 2), (2, 4), (2, 2, 1), (1, 2, 2)])
def test_descales_hold_one_value_or_one_a_sequence_and_kv_head(name, shape):
    args = dense("fp8_e4m3", **{name: ref(shape, "float32", 6)})       # batch 2, heads_kv 2
    rejects(check_dense, args, ValueError, name, "one value", "(batch, heads_kv)", "(2, 2)")


@pytest.mark.parametrize("name", ["descale_q", "descale_k", "descale_v"])
@pytest.mark.parametrize("strides", [(2, 1), (1, 2), (0, 1), (2, 0), (0, 0), (64, 3)])
def test_descales_of_batch_by_kv_heads_take_any_non_negative_strides(name, strides):
    args = dense("fp8_e4m3", **{name: ref((2, 2), "float32", 6, strides=strides)})
    assert check_dense(**args).dtype == "fp8_e4m3"
    args = dense("fp8_e4m3", **{name: ref((2, 2), "float32", 6, strides=(strides[0], -1))})
    rejects(check_dense, args, ValueError, name, "negative stride")


def test_packed_descales_are_one_a_sequence():
    three = ref((3, 2), "float32", 6)          # CU_Q: three sequences; heads_kv 2
    assert check_varlen(**varlen("fp8_e4m3", descale_v=three)).batch == 3
    rejects(check_varlen, varlen("fp8_e4m3", descale_v=ref((2, 2), "float32", 6)), ValueError,
            "descale_v", "(3, 2)")


@pytest.mark.parametrize("name", ["descale_q", "descale_k", "descale_v"])
def test_descales_misaligned_or_elsewhere_are_refused(name):
    rejects(check_dense, dense("fp8_e4m3", **{name: ref((2, 2), "float32", 6, offset=2)}), ValueError,
            name, "4-byte aligned")
    rejects(check_dense, dense("fp8_e4m3", **{name: ref((2, 2), "float32", 6, device=("cuda", 1))}),
            ValueError, name, "one device")


# --------------------------------------------------------------------------------------
# The LSE into the caller's tensor.


def test_lse_given_takes_the_lse_shape_and_any_head_and_batch_strides():
    lse = ref((2, 4, 5), "float32", 8, strides=(64, 8, 1))
    assert check_dense(**dense(lse=lse, return_lse=True)).return_lse
    assert check_varlen(**varlen(lse=ref((4, 8), "float32", 8, strides=(16, 1)), return_lse=True)).return_lse


@pytest.mark.parametrize("lse,exc,words", [
    (ref((2, 4, 5), "float64", 8), TypeError, ("lse", "float32")),
    (ref((2, 5, 4), "float32", 8), ValueError, ("lse shape", "(2, 4, 5)")),
    (ref((2, 4, 5), "float32", 8, strides=(40, 10, 2)), ValueError, ("lse", "unit stride")),
    (ref((2, 4, 5), "float32", 8, strides=(20, -5, 1)), ValueError, ("lse", "negative stride")),
    (ref((2, 4, 5), "float32", 8, readonly=True), ValueError, ("lse is read-only",)),
    (ref((2, 4, 5), "float32", 8, offset=2), ValueError, ("lse", "4-byte aligned")),
    (ref((2, 4, 5), "float32", 3), ValueError, ("lse overlaps out",)),
    (ref((2, 4, 5), "float32", 0, offset=64), ValueError, ("lse overlaps q",)),
    (ref((2, 4, 5), "float32", 8, device=("cuda", 1)), ValueError, ("lse", "one device")),
])
def test_lse_given_is_refused_unless_it_fits(lse, exc, words):
    rejects(check_dense, dense(lse=lse, return_lse=True), exc, *words)


def test_lse_given_needs_return_lse():
    rejects(check_dense, dense(lse=ref((2, 4, 5), "float32", 8)), ValueError, "return_lse must be True")


# --------------------------------------------------------------------------------------
# softmax_scale.


@pytest.mark.parametrize("dims", catalogue.HEAD_DIMS)
def test_softmax_scale_defaults_to_inverse_sqrt_of_qk_head_dim(dims):
    assert check_dense(**dense(dims=dims)).softmax_scale == pytest.approx(1 / math.sqrt(dims[0]))


@pytest.mark.parametrize("value", [0.125, np.float32(0.5), np.float64(0.25), 2])
def test_softmax_scale_accepts_real_numbers(value):
    assert check_dense(**dense(softmax_scale=value)).softmax_scale == float(value)


@pytest.mark.parametrize("value", ["0.1", True, [0.1], 1j])
def test_softmax_scale_must_be_a_number(value):
    rejects(check_dense, dense(softmax_scale=value), TypeError, "softmax_scale")


@pytest.mark.parametrize("value", [0.0, -0.1, math.nan, math.inf, 1e300, 1e-60])
def test_softmax_scale_must_be_finite_and_positive_in_float32(value):
    rejects(check_dense, dense(softmax_scale=value), ValueError, "softmax_scale")


# --------------------------------------------------------------------------------------
# Sliding windows, softcap and sinks.

from zyfa_runtime.validate import features_of  # noqa: E402


@pytest.mark.parametrize("window,exc,words", [
    (5, TypeError, ("window_size", "tuple (left, right)")),
    ((1, 2, 3), TypeError, ("window_size", "two ints")),
    ((True, 0), TypeError, ("left bound", "int")),
    ((0, 1.0), TypeError, ("right bound", "int")),
    ((-2, 0), ValueError, ("left bound", "-1 (unbounded) or >= 0", "-2")),
    ((0, -5), ValueError, ("right bound", "-5")),
    ((2**31, 0), ValueError, ("left bound", "32-bit")),
])
def test_window_size_takes_two_ints_each_minus_one_or_more(window, exc, words):
    rejects(check_dense, dense(window_size=window), exc, *words)
    rejects(check_varlen, varlen(window_size=window), exc, *words)


def test_causal_fixes_the_right_bound_at_zero_and_refuses_another():
    assert check_dense(**dense(causal=True, window_size=(3, -1))).window == (3, 0)
    assert check_dense(**dense(causal=True, window_size=(3, 0))).window == (3, 0)
    rejects(check_dense, dense(causal=True, window_size=(3, 2)), ValueError, "causal=True", "(3, 2)", "right bound")


def test_a_window_is_reduced_to_the_bounds_that_cut_keys():
    """Dense sq 5, sk 7: a left bound >= 6 and a right bound >= 4 cut nothing (window.reduce);
    a right bound of 0 without causal is causal; varlen reduces by max_seqlen."""
    p = check_dense(**dense(window_size=(6, 4)))
    assert p.window == (-1, -1) and not p.causal and features_of(p) == ()
    p = check_dense(**dense(window_size=(5, 3)))
    assert p.window == (5, 3) and not p.causal and features_of(p) == ("window",)
    p = check_dense(**dense(window_size=(-1, 0)))
    assert p.window == (-1, 0) and p.causal and features_of(p) == ()
    p = check_dense(**dense(window_size=(2, 0)))
    assert p.causal and features_of(p) == ("window",)
    # varlen: max_seqlen_q 5, max_seqlen_k 4
    assert check_varlen(**varlen(window_size=(3, 4))).window == (-1, -1)
    assert check_varlen(**varlen(window_size=(2, 3))).window == (2, 3)


@pytest.mark.parametrize("softcap,exc,words", [
    ("30", TypeError, ("softcap", "float")), (True, TypeError, ("softcap",)),
    (-1.0, ValueError, ("softcap", ">= 0")), (math.nan, ValueError, ("softcap", "finite")),
    (math.inf, ValueError, ("softcap", "finite")), (1e-45, ValueError, ("softcap", "2^-115")),
    (2.0 ** -116, ValueError, ("softcap", "2^-115")), (1e-37, ValueError, ("softcap", "2^-115")),
    (1e39, ValueError, ("softcap", "float32")),
])
def test_softcap_is_zero_or_a_finite_positive_float32_normal(softcap, exc, words):
    rejects(check_dense, dense(softcap=softcap), exc, *words)
    rejects(check_varlen, varlen(softcap=softcap), exc, *words)


def test_softcap_of_zero_is_off_and_a_positive_one_is_a_feature():
    assert check_dense(**dense(softcap=0)).softcap == 0.0 and features_of(check_dense(**dense(softcap=0.0))) == ()
    p = check_dense(**dense(softcap=30))
    assert p.softcap == 30.0 and features_of(p) == ("softcap",)
    assert check_dense(**dense(softcap=2.0 ** -115)).softcap == 2.0 ** -115   # the smallest taken
    # the kernels' softmax_scale / softcap must be a float32 normal too
    rejects(check_dense, dense(softcap=1e30, softmax_scale=1e-10), ValueError, "softmax_scale / softcap")


def test_sinks_are_one_float32_logit_a_query_head_on_the_device():
    p = check_dense(**dense(sinks=ref((4,), "float32", 9)))
    assert p.sinks and features_of(p) == ("sinks",)
    assert check_varlen(**varlen(sinks=ref((4,), "float32", 9))).sinks
    rejects(check_dense, dense(sinks=np.zeros(4, np.float32)), TypeError, "sinks", "TensorRef")
    rejects(check_dense, dense(sinks=ref((4,), "bf16", 9)), TypeError, "sinks", "float32")
    for shape in ((2,), (1, 4), (4, 1), ()):
        rejects(check_dense, dense(sinks=ref(shape, "float32", 9)), ValueError, "sinks", "(4,)")
    rejects(check_dense, dense(sinks=ref((4,), "float32", 9, strides=(2,))), ValueError, "sinks", "contiguous")
    rejects(check_dense, dense(sinks=ref((4,), "float32", 9, device=("cpu", 0))), ValueError, "sinks",
            "host memory")
    rejects(check_dense, dense(sinks=ref((4,), "float32", 9, device=("cuda", 1))), ValueError, "sinks",
            "one device")
    rejects(check_dense, dense(sinks=ref((4,), "float32", 9, offset=2)), ValueError, "sinks", "4-byte aligned")
    rejects(check_varlen, varlen(sinks=ref((3,), "float32", 9)), ValueError, "sinks", "(4,)")


def test_features_of_a_call_are_listed_in_one_order():
    p = check_dense(**dense(causal=True, window_size=(2, -1), softcap=5.0, sinks=ref((4,), "float32", 9)))
    assert features_of(p) == ("window", "softcap", "sinks")
