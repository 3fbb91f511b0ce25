"""The fp64 reference every kernel is checked against.

Plain numpy in float64, written for clarity: one (sequence, head) at a time, the
softmax of the full score matrix.  Semantics (shared by every kernel):

* q (B, Sq, Hq, Dqk), k (B, Sk, Hkv, Dqk), v (B, Sk, Hkv, Dv) -> out (B, Sq, Hq, Dv);
  varlen: packed (T, H, D) with ``cu_seqlens`` offsets.
* grouped-query attention: query head h reads key/value head h // (Hq // Hkv).
* causal is bottom-right aligned: row i sees key j iff j <= i + (Sk - Sq).
* a row that sees no key outputs zeros, and its LSE is -inf.
* LSE is the natural-log logsumexp of the scaled scores, fp32 in the API, (B, Hq, Sq)
  or (Hq, Tq) for varlen.
* FP8 descales: one value each, or one a sequence and key/value head ((B, Hkv)): query head
  h of sequence b reads ``q * descale_q[b, h // group]``, key/value head g ``k * descale_k[b, g]``
  and ``v * descale_v[b, g]``.
"""

from __future__ import annotations

import numpy as np


def _one_sequence(q, k, v, causal: bool, scale: float):
    """q (Sq, Hq, D), k (Sk, Hkv, D), v (Sk, Hkv, Dv) in float64 -> out (Sq, Hq, Dv), lse (Hq, Sq)."""
    sq, hq, _ = q.shape
    sk, hkv, _ = k.shape
    group = hq // hkv
    out = np.zeros((sq, hq, v.shape[2]), dtype=np.float64)
    lse = np.full((hq, sq), -np.inf, dtype=np.float64)
    if sq == 0 or sk == 0:
        return out, lse
    visible = np.ones((sq, sk), dtype=bool)
    if causal:
        visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
    for h in range(hq):
        s = (q[:, h, :] @ k[:, h // group, :].T) * scale
        s = np.where(visible, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        live = np.isfinite(m[:, 0])
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(s - m)
        l = p.sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, h, :] = np.where(live[:, None], (p @ v[:, h // group, :]) / l, 0.0)
            lse[h] = np.where(live, m[:, 0] + np.log(l[:, 0]), -np.inf)
    return out, lse


def attention(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
              cu_seqlens_q=None, cu_seqlens_k=None, return_lse: bool = False,
              descale_q=None, descale_k=None, descale_v=None):
    """Attention in float64 on numpy arrays in the API's layouts.

    Dense: q (B, Sq, Hq, Dqk), k (B, Sk, Hkv, Dqk), v (B, Sk, Hkv, Dv) -> out (B, Sq, Hq, Dv),
    lse (B, Hq, Sq).  With ``cu_seqlens_q`` / ``cu_seqlens_k`` (length B + 1): packed
    q (Tq, Hq, Dqk), k (Tk, Hkv, Dqk), v (Tk, Hkv, Dv) -> out (Tq, Hq, Dv), lse (Hq, Tq).
    ``descale_q/k/v`` (optional): the values attended to are q, k, v times them, each one
    value or (B, Hkv) (module docstring).  Returns out, or (out, lse) with ``return_lse``.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    batch = q.shape[0] if cu_seqlens_q is None else len(cu_seqlens_q) - 1
    hkv = k.shape[-2]
    group = q.shape[-2] // hkv
    dq, dk, dv = (descales_per_head(n, d, batch, hkv)
                  for n, d in (("descale_q", descale_q), ("descale_k", descale_k), ("descale_v", descale_v)))

    def one(b, qs, ks, vs):
        return _one_sequence(qs * np.repeat(dq[b], group)[:, None], ks * dk[b][:, None], vs * dv[b][:, None],
                             causal, scale)
    out, lse = _over_sequences(one, q, k, v, cu_seqlens_q, cu_seqlens_k)
    return (out, lse) if return_lse else out


def descales_per_head(name: str, d, batch: int, hkv: int) -> np.ndarray:
    """A descale (None: 1; one value; or (batch, hkv)) as float64 (batch, hkv), fp32-rounded
    as the kernels read it; any other shape raises ValueError."""
    a = np.ones((batch, hkv), np.float32) if d is None else np.asarray(d, dtype=np.float32)
    if a.size == 1:
        a = np.full((batch, hkv), a.reshape(()), np.float32)
    if a.shape != (batch, hkv):
        raise ValueError(f"{name} has shape {a.shape}: one value or ({batch}, {hkv}) (batch, heads_kv)")
    return a.astype(np.float64)


def _over_sequences(one, q, k, v, cu_seqlens_q, cu_seqlens_k):
    """Apply ``one(b, q_seq, k_seq, v_seq) -> (out (S, H, Dv), lse (H, S))`` to every sequence
    b: the batch entries of dense (B, S, H, D) inputs, or the ``cu_seqlens`` segments of packed
    (T, H, D) ones.  Returns (out, lse) in the API's layouts."""
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k go together")
    if cu_seqlens_q is None:
        outs, lses = zip(*(one(b, q[b], k[b], v[b]) for b in range(q.shape[0])))
        return np.stack(outs), np.stack(lses)
    cq, ck = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]), dtype=np.float64)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf, dtype=np.float64)
    for b in range(len(cq) - 1):
        qs, qe, ks, ke = int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b + 1])
        out[qs:qe], lse[:, qs:qe] = one(b, q[qs:qe], k[ks:ke], v[ks:ke])
    return out, lse


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere gives NaN (which no bound passes)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / den) if den > 0 else float(np.linalg.norm(out))


def fp8_attention(q, k, v, *, recipe, descale_q=1.0, descale_k=1.0, descale_v=1.0,
                  causal: bool = False, softmax_scale: float | None = None,
                  cu_seqlens_q=None, cu_seqlens_k=None, return_lse: bool = False):
    """An FP8 attention forward, exactly as a recipe computes it, in the API's layouts.

    ``q``, ``k``, ``v`` hold OCP e4m3 values (ml_dtypes ``float8_e4m3fn`` arrays or their
    uint8 codes) with fp32 descales, each one value (a number or a one-element array) or one
    a sequence and key/value head ((B, Hkv)): the values attended to are ``q * descale_q``
    and so on, each (sequence, key/value head) through the recipe with its own (the kernels
    fold them into each CTA's score scale and output factor).  Layouts, grouped-query heads,
    bottom-right causal masking, rows without keys and the LSE are those of
    :func:`attention`.  ``recipe`` is a name of ``fp8_models.RECIPES`` ("aiter", "fa3",
    "gfx950", "sm_90a" or an ablation) or an ``fp8_models.Recipe``; its docstring states
    the arithmetic.  Returns ``out`` in float64, the value a kernel holds before its final
    bf16 rounding, or ``(out, lse)`` with ``return_lse`` (natural-log LSE from the recipe's
    own row state).
    """
    from . import e4m3, fp8_models  # here, so that importing the reference stays light

    q, k, v = (e4m3.as_codes(x) for x in (q, k, v))
    batch = q.shape[0] if cu_seqlens_q is None else len(cu_seqlens_q) - 1
    hkv = k.shape[-2]
    group = q.shape[-2] // hkv
    ds = [descales_per_head(n, d, batch, hkv)
          for n, d in (("descale_q", descale_q), ("descale_k", descale_k), ("descale_v", descale_v))]
    uniform = all((d == d.flat[0]).all() for d in ds)
    scale = 1.0 / np.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)

    def one(b, qs, ks, vs):
        if uniform:
            return fp8_models.sequence_forward(qs, ks, vs, recipe, descale_q=ds[0].flat[0], descale_k=ds[1].flat[0],
                                               descale_v=ds[2].flat[0], causal=causal, softmax_scale=scale)
        # each key/value head with its query heads, through the recipe with its own descales
        parts = [fp8_models.sequence_forward(qs[:, g * group:(g + 1) * group], ks[:, g:g + 1], vs[:, g:g + 1], recipe,
                                             descale_q=ds[0][b, g], descale_k=ds[1][b, g], descale_v=ds[2][b, g],
                                             causal=causal, softmax_scale=scale) for g in range(hkv)]
        return np.concatenate([o for o, _ in parts], axis=1), np.concatenate([lse for _, lse in parts], axis=0)
    out, lse = _over_sequences(one, q, k, v, cu_seqlens_q, cu_seqlens_k)
    return (out, lse) if return_lse else out
