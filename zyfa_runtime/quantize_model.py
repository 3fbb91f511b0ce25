"""The numpy model of quantize_fp8 (issue 48): bf16 Q, K, V in the FA layouts -> e4m3 codes and
the fp32 descales the attention API takes, at three granularities.  No device kernel yet: this
is the contract the kernels are to be checked against, bit for bit.

Groups (one amax, one descale each):

* ``"tensor"``: all of Q, all of K, all of V: descales of shape ().
* ``"head"``: a (sequence, key/value head): Q's query heads h with h // (Hq // Hkv) = g share
  K's head g's group, as the attention kernels read ``descale_q[b, h // group]``: (B, Hkv) each.
* ``"block"``: Q per (sequence, query head, block of Q_BLOCK queries), K per (sequence, key/value
  head, block of K_BLOCK keys), blocks counted from each sequence's first row (packed: from
  cu_seqlens): (B, Hq, ceil(max_seqlen_q / Q_BLOCK)) and (B, Hkv, ceil(max_seqlen_k / K_BLOCK));
  V per (sequence, key/value head), (B, Hkv).  A block past a sequence's end has descale 1.

Arithmetic, as a kernel does it:

* amax exact (the largest |x| of the group; of K - mean with smooth_k, in fp32);
* ``power_of_two=True``: descale = 2^e, the least e with amax <= 448 2^e (amax / descale in
  (224, 448]; dequantisation is an exponent add, E8M0 on gfx950's scaled MFMA); else the fp32
  amax / 448.  An all-zero group has descale 1;
* codes = e4m3(x / descale), round to nearest even, saturating (x / descale is exact for a power
  of two; fp32 division otherwise);
* ``smooth_k``: K's fp32 mean over each sequence's keys, per (sequence, key/value head,
  channel), subtracted (fp32) before K's amax.  Exact under softmax: every score of a row
  shifts by softmax_scale q . mean.  The LSE shifts by the same amount: it is returned (``mean``)
  so that a caller merging partial attentions whose K means differ (merge_attention_states)
  can restore it -- lse + softmax_scale q . mean.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import e4m3

GRANULARITIES = ("tensor", "head", "block")
#: Rows of a block of ``"block"`` granularity: the attention kernels' query and key tiles.
Q_BLOCK, K_BLOCK = 128, 64


@dataclasses.dataclass
class Quantized:
    """e4m3 codes (uint8, the inputs' shapes) and fp32 descales; ``mean``: K's subtracted fp32
    mean (B, Hkv, D), zeros without smooth_k."""
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    descale_q: np.ndarray
    descale_k: np.ndarray
    descale_v: np.ndarray
    mean: np.ndarray


def descale_rows(d, n: int, block: int) -> np.ndarray:
    """(heads, n): the descale of each of a sequence's n rows from its (heads, blocks) block
    descales, blocks counted from the sequence's first row as quantize_fp8 makes them (the fp64
    reference and the FP8 models read them so); ValueError when the blocks do not cover the rows."""
    d = np.asarray(d)
    if d.shape[-1] * block < n:
        raise ValueError(f"{d.shape[-1]} descale blocks of {block} rows do not cover {n} rows")
    return d[:, np.arange(n) // block]


def pow2_descale(amax) -> np.ndarray:
    """2^e with e the least integer such that amax <= 448 2^e (exact: frexp, no logarithm);
    1 where amax is 0."""
    amax = np.asarray(amax, np.float64)
    m, x = np.frexp(np.where(amax > 0, amax, 1.0))    # amax = m 2^x, m in [0.5, 1); 448 = 0.875 2^9
    e = np.where(m <= 0.875, x - 9, x - 8)
    return np.where(amax > 0, np.ldexp(1.0, e), 1.0).astype(np.float32)


def fp32_descale(amax) -> np.ndarray:
    amax = np.asarray(amax, np.float32)
    return np.where(amax > 0, amax / np.float32(448.0), np.float32(1.0)).astype(np.float32)


def _sequences(n_rows: int, batch_lead, cu_seqlens) -> list[tuple[int, slice]]:
    """(sequence, rows) of a (rows, H, D) view of a tensor: dense (B, S, ...) flattened, or packed."""
    if cu_seqlens is None:
        b, s = batch_lead
        return [(i, slice(i * s, (i + 1) * s)) for i in range(b)]
    cu = np.asarray(cu_seqlens, np.int64)
    return [(i, slice(int(cu[i]), int(cu[i + 1]))) for i in range(len(cu) - 1)]


def _encode(x32: np.ndarray, descale: np.ndarray, power_of_two: bool) -> np.ndarray:
    y = x32.astype(np.float64) / descale if power_of_two else (x32 / descale).astype(np.float32)
    return e4m3.encode(y, saturate=True)


def quantize_fp8(q, k, v, *, granularity: str = "head", smooth_k: bool = True, power_of_two: bool = True,
                 cu_seqlens_q=None, cu_seqlens_k=None) -> Quantized:
    """The model of quantize_fp8 on host arrays: dense q (B, Sq, Hq, D), k (B, Sk, Hkv, D),
    v (B, Sk, Hkv, Dv), or packed (T, H, D) with ``cu_seqlens_q`` / ``cu_seqlens_k``."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity {granularity!r}; one of {GRANULARITIES}")
    packed = cu_seqlens_q is not None
    if packed != (cu_seqlens_k is not None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k come together (packed) or not at all (dense)")
    q32, k32, v32 = (np.asarray(x).astype(np.float32) for x in (q, k, v))
    if not all(np.isfinite(x).all() for x in (q32, k32, v32)):
        raise ValueError("quantize_fp8 takes finite inputs (an inf or NaN has no scale)")
    flat = (lambda x: x) if packed else (lambda x: x.reshape((-1,) + x.shape[2:]))   # noqa: E731
    fq, fk, fv = flat(q32), flat(k32), flat(v32)
    seq_q = _sequences(len(fq), q32.shape[:2], cu_seqlens_q)
    seq_k = _sequences(len(fk), k32.shape[:2], cu_seqlens_k)
    batch, hq, hkv, d = len(seq_q), fq.shape[1], fk.shape[1], fk.shape[2]
    group = hq // hkv
    descale = pow2_descale if power_of_two else fp32_descale

    mean = np.zeros((batch, hkv, d), np.float32)
    if smooth_k:
        fk = fk.copy()
        for b, rows in seq_k:
            if rows.stop > rows.start:
                mean[b] = fk[rows].astype(np.float64).mean(axis=0).astype(np.float32)
                fk[rows] = fk[rows] - mean[b][None]          # fp32 subtraction, as a kernel's

    def per_rows(x, seqs, heads_of_group, block):
        """Descales over (sequence, group of heads, block of rows) and the codes."""
        groups = x.shape[1] // heads_of_group
        n_blocks = max((-(-(r.stop - r.start) // block) for _, r in seqs), default=0) if block else 1
        ds = np.ones((len(seqs), groups, max(n_blocks, 1)), np.float32)
        codes = np.zeros(x.shape, np.uint8)
        for b, rows in seqs:
            for g in range(groups):
                heads = slice(g * heads_of_group, (g + 1) * heads_of_group)
                length = rows.stop - rows.start
                for j, lo in enumerate(range(0, length, block or max(length, 1))):
                    hi = min(length, lo + block) if block else length
                    part = x[rows.start + lo:rows.start + hi, heads]
                    ds[b, g, j] = descale(np.abs(part).max(initial=0.0))
                    codes[rows.start + lo:rows.start + hi, heads] = _encode(part, ds[b, g, j], power_of_two)
        return ds, codes

    if granularity == "tensor":
        out = []
        for x in (fq, fk, fv):
            s = descale(np.abs(x).max(initial=0.0))
            out.append((np.asarray(s, np.float32).reshape(()), _encode(x, s, power_of_two)))
        (dq, cq), (dk, ck), (dv, cv) = out
    elif granularity == "head":
        (dq, cq), (dk, ck), (dv, cv) = (per_rows(x, s, n, 0) for x, s, n in
                                         ((fq, seq_q, group), (fk, seq_k, 1), (fv, seq_k, 1)))
        dq, dk, dv = dq[..., 0], dk[..., 0], dv[..., 0]
    else:
        (dq, cq), (dk, ck) = per_rows(fq, seq_q, 1, Q_BLOCK), per_rows(fk, seq_k, 1, K_BLOCK)
        dv, cv = per_rows(fv, seq_k, 1, 0)
        dv = dv[..., 0]
    shape = (lambda c, x: c) if packed else (lambda c, x: c.reshape(x.shape))   # noqa: E731
    return Quantized(shape(cq, q32), shape(ck, k32), shape(cv, v32), dq, dk, dv, mean)


def dequantize(codes, descale, *, granularity: str, block: int = 0, heads_of_group: int = 1,
               cu_seqlens=None) -> np.ndarray:
    """float64 values of codes (dense (B, S, H, D) or packed (T, H, D)) under their descales
    (a model's output): what the attention kernels multiply back."""
    x = e4m3.decode(np.asarray(codes, np.uint8))
    descale = np.asarray(descale, np.float64)
    if granularity == "tensor":
        return x * descale
    packed = cu_seqlens is not None
    flat = x if packed else x.reshape((-1,) + x.shape[2:])
    seqs = _sequences(len(flat), x.shape[:2], cu_seqlens)
    out = np.empty_like(flat)
    for b, rows in seqs:
        for h in range(flat.shape[1]):
            g = h // heads_of_group
            if block and granularity == "block":
                j = np.arange(rows.stop - rows.start) // block
                out[rows, h] = flat[rows, h] * descale[b, g, j][:, None]
            else:
                out[rows, h] = flat[rows, h] * descale[b, g]
    return out if packed else out.reshape(x.shape)
