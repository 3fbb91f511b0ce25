"""quantize_fp8: bf16 Q, K, V in the FA layouts into the e4m3 codes and fp32 descales the FP8
attention calls take, on the device (issue 48).

The numbers are quantize_model's, bit for bit (its docstring is the specification: groups,
exact amax, power-of-two or fp32 descales, round-to-nearest-even saturating codes, K's mean
subtracted with ``smooth_k``).  The passes (catalogue.QUANTIZE_KINDS, the arithmetic in
cuda/quantize_fp8.cuh, both arches, docs/quantize.md): K's mean in two (the second writes zeros
without smooth_k); at block granularity q's and k's blocks in one (``passes``); each tile's amax,
each descale from its tiles', the codes (v's alone after the blocks pass).  Their scratch (the
mean's partial sums, the tiles' amax) is a workspace (workspace.hold), or on a stream being
captured into a graph the graph's own (workspace.captured); every scratch element a pass reads
was written by an earlier pass of the same call, so nothing needs zeroing.

The flow is the attention calls': TensorRefs, every rule checked before anything reaches the
device (``check``), the kernels of the device's arch from the manifest's ``aux_kernels``, their
arguments packed from the manifest's layout, the launches queued in order.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from . import launch, plan, validate, workspace
from .api import _check_backend, _ref, kernel_table
from .catalogue import QUANTIZE_KINDS, QUANTIZE_MEAN_ROWS, QUANTIZE_THREADS, QUANTIZE_TILE_ROWS
from .driver import get_driver
from .memory import DeviceArray
from .quantize_model import GRANULARITIES, K_BLOCK, Q_BLOCK
from .tensors import TensorRef, stream_handle

IN_DTYPE, CODE_DTYPES, F32 = "bf16", ("fp8_e4m3", "uint8"), "float32"
#: The mean pass gives a thread each channel of a head.
MAX_HEAD_DIM_QK = QUANTIZE_THREADS
#: mean_of's correctly rounded fp32(S / n) holds for n below this (cuda/quantize_fp8.cuh).
MAX_KEYS = 1 << 28
KINDS = tuple(QUANTIZE_KINDS)   # the passes, in the order a call may queue them
OUT_FIELDS = ("q", "k", "v", "descale_q", "descale_k", "descale_v", "mean")


@dataclasses.dataclass
class QuantizedFP8:
    """What quantize_fp8 returns (DeviceArrays, or the tensors given as ``out``): e4m3 codes in
    the inputs' shapes, fp32 descales ((): tensor; (B, Hkv): head; block: (B, Hq,
    ceil(max_seqlen_q / 128)), (B, Hkv, ceil(max_seqlen_k / 64)), (B, Hkv)), K's subtracted fp32
    mean (B, Hkv, D) (zeros without smooth_k)."""
    q: object
    k: object
    v: object
    descale_q: object
    descale_k: object
    descale_v: object
    mean: object


@dataclasses.dataclass(frozen=True)
class Group:
    """A descale array's shape (batches, groups, blocks) and how tiles map into it: heads
    ``heads_per_group`` a group, ``block_rows`` rows a block (0: the whole sequence)."""
    batches: int
    groups: int
    blocks: int
    heads_per_group: int
    block_rows: int
    shape: tuple          # the array's shape as the API hands it out


@dataclasses.dataclass(frozen=True)
class QuantizeProblem:
    batch: int
    heads_q: int
    heads_k: int
    d_qk: int
    d_v: int
    rows_q: int          # dense: seqlen; packed: the packed length
    rows_k: int
    max_seqlen_q: int
    max_seqlen_k: int
    packed: bool
    granularity: str
    smooth_k: bool
    power_of_two: bool
    groups: tuple         # Group of q, k, v
    device: tuple[str, int]

    @property
    def tile_x(self) -> int:
        return -(-max(self.max_seqlen_q, self.max_seqlen_k) // QUANTIZE_TILE_ROWS)

    @property
    def tile_heads(self) -> int:
        return self.heads_q + 2 * self.heads_k

    @property
    def fused_blocks(self) -> bool:
        """Whether q's and k's groups are whole blocks, each quantised by one workgroup of the
        blocks pass (block granularity); the tile passes then do v alone."""
        return self.granularity == "block"

    def passes(self) -> tuple[str, ...]:
        """The kinds launched, in order."""
        mean = KINDS[:2] if self.smooth_k else KINDS[1:2]
        return mean + (KINDS[2:] if self.fused_blocks else KINDS[3:])

    @property
    def mean_chunks(self) -> int:
        return -(-self.max_seqlen_k // QUANTIZE_MEAN_ROWS)

    def scratch_bytes(self) -> tuple[int, int]:
        """(bytes of the mean's fp64 partial sums, bytes of the tiles' amax)."""
        sums = self.batch * self.heads_k * self.mean_chunks * self.d_qk * 8 if self.smooth_k else 0
        return sums, self.batch * self.tile_heads * self.tile_x * 4


def groups_of(granularity: str, batch: int, hq: int, hkv: int, max_q: int, max_k: int) -> tuple:
    """The Group of q, k and v (quantize_model's groups)."""
    if granularity == "tensor":
        return tuple(Group(1, 1, 1, h, 0, ()) for h in (hq, hkv, hkv))
    if granularity == "head":
        return (Group(batch, hkv, 1, hq // hkv, 0, (batch, hkv)),
                Group(batch, hkv, 1, 1, 0, (batch, hkv)), Group(batch, hkv, 1, 1, 0, (batch, hkv)))
    nq, nk = max(-(-max_q // Q_BLOCK), 1), max(-(-max_k // K_BLOCK), 1)
    return (Group(batch, hq, nq, 1, Q_BLOCK, (batch, hq, nq)), Group(batch, hkv, nk, 1, K_BLOCK, (batch, hkv, nk)),
            Group(batch, hkv, 1, 1, 0, (batch, hkv)))


def _strides(t: TensorRef, packed: bool) -> tuple[int, int, int]:
    """(b, s, h) element strides: packed (T, H, D) is one batch of rows (stride_b 0)."""
    return (0, *t.strides[:2]) if packed else tuple(t.strides[:3])


def _overlap(x: TensorRef, y: TensorRef) -> bool:
    lo, hi = x.extent()
    ylo, yhi = y.extent()
    return lo < hi and ylo < yhi and lo < yhi and ylo < hi


def _check_flag(name, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check(q, k, v, out: dict, *, granularity, smooth_k, power_of_two, cu_seqlens_q, cu_seqlens_k,
          max_seqlen_q, max_seqlen_k, cu_values_q=None, cu_values_k=None, host_ok=False) -> QuantizeProblem:
    """Every rule of a call, on TensorRefs (``out``: field -> TensorRef, empty where the call
    allocates); raises TypeError / ValueError naming the argument.

    * q, k, v bf16: dense (B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, Dv), or packed (Tq, Hq, D),
      (Tk, Hkv, D), (Tk, Hkv, Dv) with int32 cu_seqlens_q / cu_seqlens_k (B + 1 entries each,
      contiguous) and max_seqlen_q / max_seqlen_k; Hq a multiple of Hkv, 1 <= D <= 256; the head
      dim contiguous, other strides non-negative, 2-byte aligned;
    * granularity one of GRANULARITIES; smooth_k, power_of_two bools;
    * out (given): all seven, codes e4m3 (or uint8) of the inputs' shapes (strides as the
      inputs'), descales and mean float32, contiguous, of the shapes QuantizedFP8 states (a
      tensor descale () or (1,), as flash_attn_func takes it);
      writable, apart from the inputs and from each other;
    * one device for all; cu_seqlens values, where readable (host arrays), checked as the
      attention calls check them.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity {granularity!r}; one of {GRANULARITIES}")
    smooth_k = _check_flag("smooth_k", smooth_k)
    power_of_two = _check_flag("power_of_two", power_of_two)
    named = (("q", q), ("k", k), ("v", v))
    for name, t in named:
        validate._check_tensor(name, t)
        if t.dtype != IN_DTYPE:
            raise TypeError(f"{name} must be bf16, got {t.dtype}")
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    if packed and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k come together (packed) or not at all (dense)")
    ndim = 3 if packed else 4
    layout = "(total, heads, head_dim) with cu_seqlens" if packed else "(batch, seqlen, heads, head_dim)"
    for name, t in named:
        if t.ndim != ndim:
            raise ValueError(f"{name} has shape {t.shape}; {'packed' if packed else 'dense'} tensors are {layout}")
    lead = 1 if packed else 2
    (hq, dqk), (hkv, dk), (hv, dv) = (t.shape[lead:] for _, t in named)
    if k.shape[:lead] != v.shape[:lead] or hv != hkv:
        raise ValueError(f"k {k.shape} and v {v.shape} must agree in all but the head dim")
    if not packed and q.shape[0] != k.shape[0]:
        raise ValueError(f"q has batch {q.shape[0]}, k {k.shape[0]}")
    if dk != dqk:
        raise ValueError(f"q has head dim {dqk}, k {dk}: they must agree")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"q's heads ({hq}) must be a multiple of k's ({hkv})")
    if not 1 <= dqk <= MAX_HEAD_DIM_QK or dv < 1:
        raise ValueError(f"head dims ({dqk}, {dv}): q and k's must be 1..{MAX_HEAD_DIM_QK}, v's >= 1")
    for name, t in named:
        _check_rows(name, t)
    if packed:
        cus = {"cu_seqlens_q": validate.check_cu_seqlens("cu_seqlens_q", cu_seqlens_q),
               "cu_seqlens_k": validate.check_cu_seqlens("cu_seqlens_k", cu_seqlens_k)}
        for name, t in cus.items():
            if t.ptr % 4:
                raise ValueError(f"{name} data pointer {t.ptr:#x} is not 4-byte aligned")
        batch = cus["cu_seqlens_q"].shape[0] - 1
        if cus["cu_seqlens_k"].shape[0] != batch + 1:
            raise ValueError(f"cu_seqlens_k has {cus['cu_seqlens_k'].shape[0]} entries, cu_seqlens_q {batch + 1}")
        if max_seqlen_q is None or max_seqlen_k is None:
            raise ValueError("packed tensors need max_seqlen_q and max_seqlen_k")
        max_q = validate._check_max_seqlen("max_seqlen_q", max_seqlen_q)
        max_k = validate._check_max_seqlen("max_seqlen_k", max_seqlen_k)
        rows_q, rows_k = q.shape[0], k.shape[0]
        for suffix, values, total, maxlen in (("q", cu_values_q, rows_q, max_q), ("k", cu_values_k, rows_k, max_k)):
            if values is not None:
                validate._check_cu_values(suffix, values, batch + 1, total, maxlen)
        scalars = tuple(cus.items())
    else:
        if max_seqlen_q is not None or max_seqlen_k is not None:
            raise ValueError("max_seqlen_q / max_seqlen_k go with cu_seqlens (packed tensors)")
        batch, rows_q, rows_k = q.shape[0], q.shape[1], k.shape[1]
        max_q, max_k = rows_q, rows_k
        scalars = ()
    if max_k >= MAX_KEYS:
        raise ValueError(f"max_seqlen_k = {max_k}: sequences of up to {MAX_KEYS - 1} keys")
    groups = groups_of(granularity, batch, hq, hkv, max_q, max_k)
    validate._check_int32(batch=batch, seqlen_q=rows_q, seqlen_k=rows_k,
                          descales_q=int(np.prod(groups[0].shape, dtype=np.int64)),
                          heads=hq + 2 * hkv)
    out_named = _check_out(out, named, groups, (batch, hkv, dqk))
    device = validate._check_devices((*named, *scalars, *out_named), host_ok)
    return QuantizeProblem(batch, hq, hkv, dqk, dv, rows_q, rows_k, max_q, max_k, packed, granularity,
                           smooth_k, power_of_two, groups, device)


def _check_rows(name: str, t: TensorRef) -> None:
    for dim, (n, st) in enumerate(zip(t.shape, t.strides)):
        if n > 1 and st < 0:
            raise ValueError(f"{name} has a negative stride ({st}) in dim {dim}")
    if t.shape[-1] > 1 and t.numel and t.strides[-1] != 1:
        raise ValueError(f"{name} must be contiguous along the head dim (stride 1), got {t.strides[-1]}")
    if t.ptr % t.itemsize:
        raise ValueError(f"{name} data pointer {t.ptr:#x} is not {t.itemsize}-byte aligned")


def _contiguous(t: TensorRef) -> bool:
    acc = 1
    for n, st in zip(reversed(t.shape), reversed(t.strides)):
        if n > 1 and st != acc:
            return False
        acc *= n
    return True


def _check_out(out: dict, named, groups, mean_shape) -> tuple:
    """The given outputs as (name, TensorRef) pairs, each checked (see ``check``)."""
    if not out:
        return ()
    missing = [f for f in OUT_FIELDS if out.get(f) is None]
    if missing:
        raise ValueError(f"out lacks {', '.join(missing)}: give all of {', '.join(OUT_FIELDS)} or none")
    outs = tuple((f"out.{f}", validate._check_tensor(f"out.{f}", out[f])) for f in OUT_FIELDS)
    for (name, t), (_, x) in zip(outs[:3], named):
        if t.dtype not in CODE_DTYPES:
            raise TypeError(f"{name} must be fp8_e4m3 (or uint8 codes), got {t.dtype}")
        if t.shape != x.shape:
            raise ValueError(f"{name} has shape {t.shape}; it is the shape of its input, {x.shape}")
        _check_rows(name, t)
    shapes = (*(g.shape for g in groups), mean_shape)
    for (name, t), shape in zip(outs[3:], shapes):
        if t.dtype != F32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
        if t.shape != shape and not (shape == () and t.shape == (1,)):     # one value: () or (1,)
            raise ValueError(f"{name} has shape {t.shape}; here it is {shape}")
        if not _contiguous(t) or t.ptr % 4:
            raise ValueError(f"{name} must be contiguous and 4-byte aligned")
    for i, (name, t) in enumerate(outs):
        if t.readonly:
            raise ValueError(f"{name} is read-only")
        for other, x in (*named, *outs[i + 1:]):
            if _overlap(t, x):
                raise ValueError(f"{name} overlaps {other} in memory")
    return outs


def argument_values(p: QuantizeProblem, q, k, v, out: dict, cu_q, cu_k, sums: int, amax: int) -> dict:
    """The kernels' arguments (catalogue.QUANTIZE_ARGS) by name."""
    values = {"q": q.ptr, "k": k.ptr, "v": v.ptr, "q8": out["q"].ptr, "k8": out["k"].ptr, "v8": out["v"].ptr,
              "descale_q": out["descale_q"].ptr, "descale_k": out["descale_k"].ptr,
              "descale_v": out["descale_v"].ptr, "mean": out["mean"].ptr,
              "cu_seqlens_q": cu_q.ptr if cu_q is not None else 0,
              "cu_seqlens_k": cu_k.ptr if cu_k is not None else 0, "sums": sums, "amax": amax,
              "batch": p.batch, "heads_q": p.heads_q, "heads_k": p.heads_k, "d_qk": p.d_qk, "d_v": p.d_v,
              "seqlen_q": p.rows_q, "seqlen_k": p.rows_k, "max_seqlen_q": p.max_seqlen_q,
              "max_seqlen_k": p.max_seqlen_k, "tile_x": p.tile_x, "tile_heads": p.tile_heads,
              "mean_chunks": p.mean_chunks, "smooth_k": int(p.smooth_k), "power_of_two": int(p.power_of_two)}
    counts = [g.batches * g.groups * g.blocks for g in p.groups]
    if p.fused_blocks:     # the tile passes do v alone: its heads, its descales
        values.update(tile_y0=p.heads_q + p.heads_k, tile_heads=p.heads_k, descale_e0=counts[0] + counts[1],
                      n_descales=counts[2], block_x=max(p.groups[0].blocks, p.groups[1].blocks),
                      block_heads=p.heads_q + p.heads_k)
    else:
        values.update(tile_y0=0, n_descales=sum(counts), descale_e0=0, block_x=0, block_heads=0)
    for name, t in (("q", q), ("k", k), ("v", v), ("q8", out["q"]), ("k8", out["k"]), ("v8", out["v"])):
        values.update(zip((f"{name}_stride_{d}" for d in "bsh"), _strides(t, p.packed)))
    for name, g in zip("qkv", p.groups):
        values.update({f"{name}_ds_batches": g.batches, f"{name}_ds_groups": g.groups,
                       f"{name}_ds_blocks": g.blocks, f"{name}_heads_per_group": g.heads_per_group,
                       f"{name}_block_rows": g.block_rows})
    return values


def _host_values(t: TensorRef | None, x):
    """The values of a cu_seqlens the host can read (a numpy array), else None."""
    return np.asarray(x) if t is not None and isinstance(x, np.ndarray) else None


def quantize_fp8(q, k, v, *, granularity: str = "head", smooth_k: bool = True, power_of_two: bool = True,
                 cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                 out=None, stream=None) -> QuantizedFP8:
    """Quantise bf16 q, k, v to e4m3 with their descales, as quantize_model.quantize_fp8
    computes them, bit for bit.

    q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv), or packed (T, H, D) with
    ``cu_seqlens_q`` / ``cu_seqlens_k`` (int32, B + 1) and ``max_seqlen_q`` / ``max_seqlen_k``
    (the block descales have ceil(max_seqlen / block) blocks a sequence: give the longest
    sequence's length to get the model's shapes).  ``granularity``: "tensor", "head" (the
    default: (B, Hkv) descales, which every FP8 attention kernel takes) or "block" (not taken
    by the attention kernels yet; quantize_model's groups); ``smooth_k``: subtract K's mean over each sequence
    first (returned as ``mean``); ``power_of_two``: descales 2^e (free to apply), else fp32
    amax / 448.  Returns a QuantizedFP8 of DeviceArrays, or ``out`` itself where given (an
    object with the seven fields, e.g. a QuantizedFP8 of tensors, filled in place).  Inputs
    are finite (an inf or NaN has no scale: its group's codes and descale are unspecified).
    K's mean is the model's where each channel's fp64 sum over a sequence is exact (bf16
    values whose magnitudes and ulps span fewer than 53 - log2(n) bits: any realistic K).
    On a stream being captured into a graph, give ``out`` (the call then allocates nothing
    but its scratch, which is the graph's own).
    """
    driver = get_driver()
    s = stream_handle(stream)
    rq, rk, rv = (_ref(driver, x, s) for x in (q, k, v))
    rcq, rck = _ref(driver, cu_seqlens_q, s), _ref(driver, cu_seqlens_k, s)
    given = {f: _ref(driver, getattr(out, f, None), s) for f in OUT_FIELDS} if out is not None else {}
    capturing = driver.stream_capturing(s)
    if capturing and out is None:
        raise ValueError("quantize_fp8 on a stream being captured into a graph needs out= (a call that "
                         "allocates cannot be captured)")
    # A repeated dense call into the same outputs queues its launches again (plan.Plan: every
    # pointer, shape, stride and dtype, the options and the stream the same, and the scratch
    # where it was); validation, kernel lookup and argument packing are its host time.
    key = _plan_key(driver, (rq, rk, rv, *(given.get(f) for f in OUT_FIELDS)), s, granularity, smooth_k,
                    power_of_two, max_seqlen_q, max_seqlen_k) if given and rcq is None and rck is None \
        and not capturing else None
    if key is not None:
        cached = plan.cached_plan(key)
        if cached is not None and cached.queue_again(driver, s):
            return out
    p = check(rq, rk, rv, given, granularity=granularity, smooth_k=smooth_k, power_of_two=power_of_two,
              cu_seqlens_q=rcq, cu_seqlens_k=rck, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
              cu_values_q=_host_values(rcq, cu_seqlens_q), cu_values_k=_host_values(rck, cu_seqlens_k),
              host_ok=driver.host_memory_is_device)
    _check_backend(driver, p)
    table = kernel_table(driver)
    device = p.device[1]
    kernels = {kind: table.aux(device, kind) for kind in p.passes()}
    arrays = {}
    if not given:
        shapes = (rq.shape, rk.shape, rv.shape, *(g.shape for g in p.groups), (p.batch, p.heads_k, p.d_qk))
        arrays = {f: DeviceArray(driver, device, shape, "fp8_e4m3" if i < 3 else F32)
                  for i, (f, shape) in enumerate(zip(OUT_FIELDS, shapes))}
        given = {f: a.ref for f, a in arrays.items()}
    sums_bytes, amax_bytes = p.scratch_bytes()
    sums_at = -(-sums_bytes // workspace.SCRATCH_ALIGN) * workspace.SCRATCH_ALIGN
    driver.make_current(device)
    scratch = (workspace.captured(driver, device, s, 0, sums_at + amax_bytes, False) if capturing
               else _held(driver, device, s, sums_at + amax_bytes))
    with scratch as (_, base, _):
        values = argument_values(p, rq, rk, rv, given, rcq, rck, base, base + sums_at)
        launches = []
        for kind in p.passes():
            kernel = kernels[kind]
            grid = launch.grid_of(driver, kernel, kernel.entry["grid"], values)
            if 0 not in grid:
                launches.append(launch.Launch(kernel.function, grid, (kernel.entry["block_size"], 1, 1), 0,
                                              launch.pack_args(kernel, values)))
        launch.queue(driver, tuple(launches), s)
        if key is not None:
            plan.keep_plan(key, plan.Plan(device, tuple(launches), {}, (sums_at + amax_bytes, base), None))
    if out is not None:
        return out
    return QuantizedFP8(**arrays)


def _plan_key(driver, refs, stream: int, granularity, smooth_k, power_of_two, max_seqlen_q, max_seqlen_k):
    """A dense call's plan key (plan.plan_key), or None where an option is not plainly what
    validation accepts (such a call is validated, which names the problem)."""
    if type(granularity) is not str or type(smooth_k) is not bool or type(power_of_two) is not bool or \
            max_seqlen_q is not None or max_seqlen_k is not None:
        return None
    return plan.plan_key(driver, refs, ("quantize_fp8", granularity, smooth_k, power_of_two), stream)


@contextlib.contextmanager
def _held(driver, device: int, stream: int, nbytes: int):
    """A running call's scratch: the stream's workspace, held until the launches are queued."""
    with workspace.hold(driver, device, stream, nbytes) as ws:
        yield None, ws, None
