"""merge_attention_states: two partial attentions of the same queries into one, by their LSEs.

The combine step of attention split over key sets (context parallelism, a KV cache split in
pages, a prefix cached apart from the suffix): each part's O (normalised by its own softmax
sum) and natural-log LSE, as flash_attn_func returns them, give the attention over both

    out = (e^{lse_a} o_a + e^{lse_b} o_b) / (e^{lse_a} + e^{lse_b}),
    out_lse = log(e^{lse_a} + e^{lse_b}),

on the device by the kernel kind ``merge_attention_states`` (catalogue.MERGE_KIND; the
arithmetic in cuda/merge_states.cuh, both arches).  A row whose LSE is -inf on one side (no
keys there) comes out as the other side exactly; -inf on both gives zeros and -inf.

The flow is the attention calls': TensorRefs, every rule checked before anything reaches the
device (``check``), the kernel of the device's arch from the manifest's ``aux_kernels``, its
arguments packed from the manifest's layout, one launch.
"""

from __future__ import annotations

import dataclasses

from . import launch, validate
from .api import _check_backend, _ref, kernel_table
from .driver import get_driver
from .memory import DeviceArray
from .tensors import TensorRef, stream_handle

KIND = "merge_attention_states"
O_DTYPE, LSE_DTYPE = "bf16", "float32"


@dataclasses.dataclass(frozen=True)
class MergeProblem:
    """A checked call: (sequences, rows a sequence, heads, head dim), packed or dense, the
    device; tensors as given (None: allocated by the call)."""
    batch: int
    seqlen: int
    heads: int
    head_dim: int
    packed: bool
    device: tuple[str, int]


def _o_strides(t: TensorRef, packed: bool) -> tuple[int, int, int]:
    """(b, s, h) element strides of an O tensor: packed (T, H, D) is one sequence (stride_b 0)."""
    return (0, *t.strides[:2]) if packed else tuple(t.strides[:3])


def _lse_strides(t: TensorRef, packed: bool) -> tuple[int, int, int]:
    """(b, h, s) element strides of an LSE: packed (H, T) is one sequence (stride_b 0)."""
    return (0, *t.strides) if packed else tuple(t.strides)


def _overlap(x: TensorRef, y: TensorRef) -> bool:
    lo, hi = x.extent()
    ylo, yhi = y.extent()
    return lo < hi and ylo < yhi and lo < yhi and ylo < hi


def _one_to_one(t: TensorRef) -> bool:
    """Whether no two elements of ``t`` share an address: with the dimensions of more than one
    element in order of stride, each stride reaches past everything the smaller ones span."""
    span = 1
    dims = sorted(((st, n) for n, st in zip(t.shape, t.strides) if n > 1))
    for st, n in dims:
        if st < span:
            return False
        span = st * (n - 1) + span
    return True


def _same_view(x: TensorRef, y: TensorRef) -> bool:
    return x.ptr == y.ptr and x.shape == y.shape and x.strides == y.strides and x.dtype == y.dtype


def check(o_a, lse_a, o_b, lse_b, out, out_lse, host_ok: bool) -> MergeProblem:
    """Every rule of a call, on TensorRefs (``out`` and ``out_lse`` may be None); raises
    TypeError / ValueError naming the tensor.

    * o_a, o_b (and out): bf16, all of one shape, (B, S, H, D) or packed (T, H, D), the head
      dim contiguous, other strides any non-negative values;
    * lse_a, lse_b (and out_lse): float32 (B, H, S) (dense) or (H, T) (packed), strides any
      non-negative values;
    * one device for all; each element aligned (2 bytes for O, 4 for an LSE);
    * out is o_a or o_b itself (the same view: the merge in place, each element read before it
      is written) or apart from every input; out_lse likewise with lse_a and lse_b; out and
      out_lse apart; outputs writable, no two of their elements at one address.  A partial
      overlap is refused.
    """
    named_o = (("o_a", o_a), ("o_b", o_b)) + ((("out", out),) if out is not None else ())
    named_l = (("lse_a", lse_a), ("lse_b", lse_b)) + ((("out_lse", out_lse),) if out_lse is not None else ())
    for name, t in (*named_o, *named_l):
        validate._check_tensor(name, t)
    for name, t in named_o:
        if t.dtype != O_DTYPE:
            raise TypeError(f"{name} must be bf16, got {t.dtype}")
    for name, t in named_l:
        if t.dtype != LSE_DTYPE:
            raise TypeError(f"{name} must be float32 (the LSE as flash_attn_func returns it), got {t.dtype}")
    shape = o_a.shape
    if len(shape) not in (3, 4):
        raise ValueError(f"o_a has shape {shape}; O is (batch, seqlen, heads, head_dim) or packed "
                         "(total, heads, head_dim)")
    for name, t in named_o[1:]:
        if t.shape != shape:
            raise ValueError(f"{name} has shape {t.shape}, o_a {shape}: the two parts and out must agree")
    packed = len(shape) == 3
    if packed:
        (total, heads, head_dim), batch, seqlen = shape, 1, shape[0]
        lse_shape = (heads, total)
    else:
        batch, seqlen, heads, head_dim = shape
        lse_shape = (batch, heads, seqlen)
    for name, t in named_l:
        if t.shape != lse_shape:
            raise ValueError(f"{name} has shape {t.shape}; for O of shape {shape} the LSE is {lse_shape} "
                             f"({'(heads, total)' if packed else '(batch, heads, seqlen)'})")
    for name, t in (*named_o, *named_l):
        for dim, (n, st) in enumerate(zip(t.shape, t.strides)):
            if n > 1 and st < 0:
                raise ValueError(f"{name} has a negative stride ({st}) in dim {dim}")
        if t.ptr % t.itemsize:
            raise ValueError(f"{name} data pointer {t.ptr:#x} is not {t.itemsize}-byte aligned")
    for name, t in named_o:
        if head_dim > 1 and t.numel and t.strides[-1] != 1:
            raise ValueError(f"{name} must be contiguous along the head dim (stride 1), got {t.strides[-1]}")
    validate._check_int32(batch=batch, seqlen=seqlen, heads=heads, head_dim=head_dim)
    device = validate._check_devices((*named_o, *named_l), host_ok)
    for wname, w, ins in (("out", out, named_o[:2]), ("out_lse", out_lse, named_l[:2])):
        if w is None:
            continue
        if w.readonly:
            raise ValueError(f"{wname} is read-only")
        if not _one_to_one(w):
            raise ValueError(f"{wname} has elements that share an address (strides {w.strides}): each "
                             "output element needs its own")
        for name, t in ins:
            if _overlap(w, t) and not _same_view(w, t):
                raise ValueError(f"{wname} overlaps {name} in memory without being {name} itself; "
                                 f"{wname} is either {name} (the merge in place) or apart from it")
    for wname, w, ins in (("out", out, named_l), ("out_lse", out_lse, named_o)):
        for name, t in ins if w is not None else ():
            if _overlap(w, t):
                raise ValueError(f"{wname} overlaps {name} in memory")
    return MergeProblem(batch, seqlen, heads, head_dim, packed, device)


def argument_values(p: MergeProblem, o_a, lse_a, o_b, lse_b, out, out_lse) -> dict:
    """The kernel's arguments (catalogue.MERGE_KIND's list) by name."""
    values = {"o_a": o_a.ptr, "o_b": o_b.ptr, "out": out.ptr,
              "lse_a": lse_a.ptr, "lse_b": lse_b.ptr, "out_lse": out_lse.ptr,
              "batch": p.batch, "heads": p.heads, "seqlen": p.seqlen, "head_dim": p.head_dim}
    for name, t in (("o_a", o_a), ("o_b", o_b), ("out", out)):
        values.update(zip((f"{name}_stride_{d}" for d in "bsh"), _o_strides(t, p.packed)))
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b), ("out_lse", out_lse)):
        values.update(zip((f"{name}_stride_{d}" for d in "bhs"), _lse_strides(t, p.packed)))
    return values


def merge_attention_states(o_a, lse_a, o_b, lse_b, *, out=None, out_lse=None, stream=None):
    """Merge two partial attentions of the same queries over disjoint key sets.

    o_a, o_b: bf16 (B, S, H, D) or packed (T, H, D), each normalised by its own softmax sum;
    lse_a, lse_b: their float32 natural-log LSEs, (B, H, S) or (H, T), as flash_attn_func /
    flash_attn_varlen_func return them (``return_lse=True``).  Returns (out, out_lse): the
    attention over both key sets and its LSE -- ``out`` / ``out_lse`` themselves where given
    (any strides, the head dim contiguous; ``out`` may be ``o_a`` or ``o_b`` and ``out_lse``
    ``lse_a`` or ``lse_b``, the merge in place), else new DeviceArrays.  A row whose LSE is
    -inf on one side (no keys there) is the other side's row exactly, whatever the empty
    side's O holds; -inf on both gives zeros and -inf; a NaN LSE gives a NaN row.

    Error (fp32 arithmetic, one bf16 rounding; ``bounds``, docs/api.md): ||out - ref|| / ||ref||
    <= 2^-8 + (6 d + 14) 2^-24 ||c_a |o_a| + c_b |o_b| || / ||ref||, |out_lse - ref| <= 2^-23
    (|ref| + 3 d + 8), d = |lse_a - lse_b|.  On a stream being captured into a graph, give
    ``out`` and ``out_lse`` (the call then allocates nothing).
    """
    driver = get_driver()
    s = stream_handle(stream)
    refs = [_ref(driver, x, s) for x in (o_a, lse_a, o_b, lse_b, out, out_lse)]
    ra, rla, rb, rlb, rout, rlse = refs
    if driver.stream_capturing(s) and (rout is None or rlse is None):
        raise ValueError("merge_attention_states on a stream being captured into a graph needs out= and "
                         "out_lse= (a call that allocates cannot be captured)")
    p = check(ra, rla, rb, rlb, rout, rlse, host_ok=driver.host_memory_is_device)
    _check_backend(driver, p)
    table = kernel_table(driver)
    kernel = table.aux(p.device[1], KIND)
    out_arr = lse_arr = None
    if rout is None:
        out_arr = DeviceArray(driver, p.device[1], ra.shape, O_DTYPE)
        rout = out_arr.ref
    if rlse is None:
        lse_arr = DeviceArray(driver, p.device[1], rla.shape, LSE_DTYPE)
        rlse = lse_arr.ref
    values = argument_values(p, ra, rla, rb, rlb, rout, rlse)
    grid = launch.grid_of(driver, kernel, kernel.entry["grid"], values)
    if 0 not in grid:
        driver.make_current(p.device[1])
        block = (kernel.entry["block_size"], 1, 1)
        launch.queue(driver, (launch.Launch(kernel.function, grid, block, 0, launch.pack_args(kernel, values)),), s)
    return (out if out is not None else out_arr), (out_lse if out_lse is not None else lse_arr)


# --------------------------------------------------------------------------------------
# The error bound, from the kernel's arithmetic (docs/api.md, "merge_attention_states").
#
# With d = -|lse_a - lse_b| (the smaller side's exponent; the larger side's weight is exactly
# 1): d rounded once, times log2(e) (the constant and the product: 3 fp32 roundings in all),
# exp2 to 2 ulps, so a weight is off by |d| 3u + 4u (u = 2^-24), the sum and division add 2u
# each: each c = w / s within (6|d| + 12) u, its product and the sum 2u more.  Then the one
# bf16 rounding, 2^-8 relative.  The LSE: m + ln 2 log2(s), s = 1 + w_b within (3|d| + 4) u,
# log2 to 1 ulp (<= u on [1, 2)), the product and the sum a rounding each.

U32 = 2.0 ** -24
BF16_ROUNDING = 2.0 ** -8


def bounds(o_a, lse_a, o_b, lse_b, ref_out, ref_lse) -> tuple[float, object]:
    """(bound on ||out - ref|| / ||ref||, bound on |out_lse - ref_lse| element-wise) for a merge
    of these inputs (numpy, the API's layouts) whose fp64 result is (ref_out, ref_lse):
    2^-8 + (6 d_max + 14) u ||c_a |o_a| + c_b |o_b| || / ||ref||, and
    2u (|ref_lse| + 3 |d| + 8) (twice the derivation's u terms, for the slack of the ulp
    definitions)."""
    import numpy as np
    la, lb = (np.asarray(x, np.float64) for x in (lse_a, lse_b))
    live = np.isfinite(la) & np.isfinite(lb)
    m = np.maximum(la, lb)
    m0 = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = np.where(live, np.abs(la - lb), 0.0)
        wa, wb = np.exp(la - m0), np.exp(lb - m0)
        ca = np.where(np.isfinite(m), wa / (wa + wb), 0.0)
        cb = np.where(np.isfinite(m), wb / (wa + wb), 0.0)
    row = lambda c: np.swapaxes(c, -1, -2)[..., None]   # noqa: E731
    mag = row(ca) * np.abs(np.asarray(o_a, np.float64)) + row(cb) * np.abs(np.asarray(o_b, np.float64))
    ref_norm = float(np.linalg.norm(np.asarray(ref_out, np.float64)))
    fp32 = (6 * float(d.max(initial=0.0)) + 14) * U32 * float(np.linalg.norm(mag))
    o_bound = BF16_ROUNDING + (fp32 / ref_norm if ref_norm else 0.0)
    lse_bound = 2 * U32 * (np.where(np.isfinite(ref_lse), np.abs(ref_lse), 0.0) + 3 * d + 8)
    return o_bound, lse_bound
