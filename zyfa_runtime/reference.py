"""The fp64 reference every kernel is checked against.

Plain numpy in float64, written for clarity: one (sequence, head) at a time, the
softmax of the full score matrix.  Semantics (shared by every kernel):

* q (B, Sq, Hq, Dqk), k (B, Sk, Hkv, Dqk), v (B, Sk, Hkv, Dv) -> out (B, Sq, Hq, Dv);
  varlen: packed (T, H, D) with ``cu_seqlens`` offsets.
* grouped-query attention: query head h reads key/value head h // (Hq // Hkv).
* causal is bottom-right aligned: row i sees key j iff j <= i + (Sk - Sq); a sliding
  window ``(left, right)`` (-1: unbounded; causal sets right = 0) limits it to
  ``i + Sk - Sq - left <= j <= i + Sk - Sq + right`` (window.py states the rule).
* softcap (0: off): each scaled score s becomes ``softcap * tanh(s / softcap)`` before the
  softmax (Gemma 2's logit cap).
* sinks (None: off; fp32 (Hq,)): query head h's logit ``sinks[h]`` joins every row's softmax
  denominator beside the scores, and contributes no value (gpt-oss): ``out = sum_j e^{s_j}
  v_j / (e^{sinks[h]} + sum_j e^{s_j})``.
* a row that sees no key outputs zeros, and its LSE is -inf (with sinks: ``sinks[h]``, the
  logsumexp of the sink alone).
* LSE is the natural-log logsumexp of the scaled (capped) scores and the sink, fp32 in the
  API, (B, Hq, Sq) or (Hq, Tq) for varlen: ``out * exp(lse)`` is the row's weighted sum.
* FP8 descales: one value each, or one a sequence and key/value head ((B, Hkv)): query head
  h of sequence b reads ``q * descale_q[b, h // group]``, key/value head g ``k * descale_k[b, g]``
  and ``v * descale_v[b, g]``.  Or per block (quantize_model's ``"block"`` granularity):
  descale_q (B, Hq, nQ), one a block of ``Q_BLOCK`` = 128 queries of query head h, and
  descale_k (B, Hkv, nK), one a block of ``K_BLOCK`` = 64 keys, blocks counted from each
  sequence's first row: row i of sequence b reads ``q * descale_q[b, h, i // 128]``, key j
  ``k * descale_k[b, g, j // 64]`` (blocks past a sequence's end are not read); V stays one
  value or (B, Hkv).
"""

from __future__ import annotations

import functools

import numpy as np

from . import window as windows
from .quantize_model import K_BLOCK, Q_BLOCK, descale_rows


def _one_sequence(q, k, v, scale: float, window=windows.NONE, softcap: float = 0.0, sinks=None):
    """q (Sq, Hq, D), k (Sk, Hkv, D), v (Sk, Hkv, Dv) in float64 -> out (Sq, Hq, Dv), lse (Hq, Sq).
    ``window``: (left, right) as window.normalize gives it; ``sinks``: float64 (Hq,) or None."""
    sq, hq, _ = q.shape
    sk, hkv, _ = k.shape
    group = hq // hkv
    out = np.zeros((sq, hq, v.shape[2]), dtype=np.float64)
    lse = np.full((hq, sq), -np.inf, dtype=np.float64)
    if sinks is not None:
        lse[:] = np.asarray(sinks, np.float64)[:, None]
    if sq == 0 or sk == 0:
        return out, lse
    visible = windows.visible(sq, sk, window)
    for h in range(hq):
        s = (q[:, h, :] @ k[:, h // group, :].T) * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        s = np.where(visible, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sinks[h])     # the sink is one more logit of every row
        live = np.isfinite(m[:, 0])
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(s - m)
        l = p.sum(axis=1, keepdims=True)
        if sinks is not None:
            l = l + np.exp(sinks[h] - m)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, h, :] = np.where(live[:, None], (p @ v[:, h // group, :]) / l, 0.0)
            lse[h] = np.where(live, m[:, 0] + np.log(l[:, 0]), -np.inf)
    return out, lse


def attention(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
              cu_seqlens_q=None, cu_seqlens_k=None, return_lse: bool = False,
              descale_q=None, descale_k=None, descale_v=None, window_size=windows.NONE,
              softcap: float = 0.0, sinks=None):
    """Attention in float64 on numpy arrays in the API's layouts.

    Dense: q (B, Sq, Hq, Dqk), k (B, Sk, Hkv, Dqk), v (B, Sk, Hkv, Dv) -> out (B, Sq, Hq, Dv),
    lse (B, Hq, Sq).  With ``cu_seqlens_q`` / ``cu_seqlens_k`` (length B + 1): packed
    q (Tq, Hq, Dqk), k (Tk, Hkv, Dqk), v (Tk, Hkv, Dv) -> out (Tq, Hq, Dv), lse (Hq, Tq).
    ``descale_q/k/v`` (optional): the values attended to are q, k, v times them, each one
    value or (B, Hkv) (module docstring).  ``window_size``, ``softcap``, ``sinks`` (Hq,): the
    module docstring's.  Returns out, or (out, lse) with ``return_lse``.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    window = windows.normalize(causal, window_size)
    sinks = None if sinks is None else np.asarray(sinks, np.float32).astype(np.float64).reshape(-1)
    scale = 1.0 / np.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    batch = q.shape[0] if cu_seqlens_q is None else len(cu_seqlens_q) - 1
    hkv = k.shape[-2]
    group = q.shape[-2] // hkv
    dq, dk = (descales_per_head_or_block(n, d, batch, hkv, h, blk) for n, d, h, blk in
              (("descale_q", descale_q, q.shape[-2], Q_BLOCK), ("descale_k", descale_k, hkv, K_BLOCK)))
    dv = descales_per_head("descale_v", descale_v, batch, hkv)

    def rows(d, b, n):
        """The (n, heads, 1) factors of a sequence's n rows (per head: the same for every row)."""
        if d.ndim == 2:
            return d[b][None, :, None]
        return descale_rows(d[b], n, Q_BLOCK if d is dq else K_BLOCK).T[:, :, None]

    def one(b, qs, ks, vs):
        fq = rows(dq, b, len(qs)) if dq.ndim == 3 else np.repeat(dq[b], group)[:, None]
        return _one_sequence(qs * fq, ks * rows(dk, b, len(ks)), vs * dv[b][:, None],
                             scale, window, float(softcap), sinks)
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


def descales_per_head_or_block(name: str, d, batch: int, hkv: int, heads: int, block: int) -> np.ndarray:
    """A Q or K descale as float64, fp32-rounded: (batch, hkv) as :func:`descales_per_head`
    gives it, or a 3-d (batch, heads, blocks) array of ``block``-row blocks kept as it is
    (``heads``: Hq for Q, Hkv for K); any other shape raises ValueError."""
    if d is None or np.ndim(d) != 3:
        return descales_per_head(name, d, batch, hkv)
    a = np.asarray(d, dtype=np.float32)
    if a.shape[:2] != (batch, heads):
        raise ValueError(f"{name} has shape {a.shape}: per block it is ({batch}, {heads}, blocks of {block} rows)")
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
                  cu_seqlens_q=None, cu_seqlens_k=None, return_lse: bool = False,
                  window_size=windows.NONE, softcap: float = 0.0, sinks=None):
    """An FP8 attention forward, exactly as a recipe computes it, in the API's layouts.

    ``q``, ``k``, ``v`` hold OCP e4m3 values (ml_dtypes ``float8_e4m3fn`` arrays or their
    uint8 codes) with fp32 descales, each one value (a number or a one-element array) or one
    a sequence and key/value head ((B, Hkv)): the values attended to are ``q * descale_q``
    and so on, each (sequence, key/value head) through the recipe with its own (the kernels
    fold them into each CTA's score scale and output factor).  Or per block (module
    docstring: descale_q (B, Hq, nQ), descale_k (B, Hkv, nK)), each sequence through the
    recipe with its blocks (how each target folds them: ``Recipe.descale_blocks``).  Layouts, grouped-query heads,
    bottom-right causal masking, rows without keys and the LSE are those of
    :func:`attention`, and so are ``window_size``, ``softcap`` and ``sinks`` (how a recipe
    takes them: fp8_models.sequence_forward).  ``recipe`` is a name of ``fp8_models.RECIPES`` ("aiter", "fa3",
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
    ds = [descales_per_head_or_block(n, d, batch, hkv, h, blk) for n, d, h, blk in
          (("descale_q", descale_q, q.shape[-2], Q_BLOCK), ("descale_k", descale_k, hkv, K_BLOCK))]
    ds.append(descales_per_head("descale_v", descale_v, batch, hkv))
    blocks = ds[0].ndim == 3 or ds[1].ndim == 3
    uniform = all((d == d.flat[0]).all() for d in ds)
    scale = 1.0 / np.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    sinks = None if sinks is None else np.asarray(sinks, np.float32).reshape(-1)
    features = dict(window_size=window_size, softcap=softcap)

    def per_block(d, b, n, repeat, block):
        """Sequence b's descales as (heads, blocks) covering n rows (a per-head one repeated)."""
        return d[b] if d.ndim == 3 else np.repeat(np.repeat(d[b], repeat)[:, None], max(1, -(-n // block)), axis=1)

    def one(b, qs, ks, vs):
        if blocks:
            return fp8_models.sequence_forward(qs, ks, vs, recipe,
                                               descale_q=per_block(ds[0], b, len(qs), group, Q_BLOCK),
                                               descale_k=per_block(ds[1], b, len(ks), 1, K_BLOCK),
                                               descale_v=ds[2][b], causal=causal, softmax_scale=scale,
                                               sinks=sinks, **features)
        if uniform:
            return fp8_models.sequence_forward(qs, ks, vs, recipe, descale_q=ds[0].flat[0], descale_k=ds[1].flat[0],
                                               descale_v=ds[2].flat[0], causal=causal, softmax_scale=scale,
                                               sinks=sinks, **features)
        # each key/value head with its query heads, through the recipe with its own descales
        parts = [fp8_models.sequence_forward(qs[:, g * group:(g + 1) * group], ks[:, g:g + 1], vs[:, g:g + 1], recipe,
                                             descale_q=ds[0][b, g], descale_k=ds[1][b, g], descale_v=ds[2][b, g],
                                             causal=causal, softmax_scale=scale, **features,
                                             sinks=None if sinks is None else sinks[g * group:(g + 1) * group])
                 for g in range(hkv)]
        return np.concatenate([o for o, _ in parts], axis=1), np.concatenate([lse for _, lse in parts], axis=0)
    out, lse = _over_sequences(one, q, k, v, cu_seqlens_q, cu_seqlens_k)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------
# A KV cache: gather each sequence's keys, then the dense references.

def gather_cache(cache, cache_seqlens, page_table=None):
    """Each sequence's keys (or values) of a KV cache, packed: ``(packed (Tk, H, D),
    cu_seqlens_k (B + 1,))``.  Paged (``page_table`` (B, max_pages) int): ``cache`` is
    (num_pages, page_size, H, D) and key t of sequence b is row ``t % page_size`` of page
    ``page_table[b, t // page_size]`` (pages may be shared between sequences); contiguous:
    ``cache`` is (B, max_seqlen_k, H, D) and sequence b's keys are its first
    ``cache_seqlens[b]`` rows."""
    cache = np.asarray(cache)
    lens = [int(n) for n in np.asarray(cache_seqlens).reshape(-1)]
    if page_table is None:
        parts = [cache[b, :n] for b, n in enumerate(lens)]
    else:
        table, page = np.asarray(page_table), cache.shape[1]
        flat = cache.reshape(-1, *cache.shape[2:])
        parts = [flat[[int(table[b, t // page]) * page + t % page for t in range(n)]] for b, n in enumerate(lens)]
    packed = np.concatenate(parts) if parts else cache.reshape(0, *cache.shape[2:])
    return packed.reshape(-1, *cache.shape[2:]), np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)


def kvcache_attention(q, k_cache, v_cache, *, cache_seqlens, page_table=None, cu_seqlens_q=None,
                      recipe=None, return_lse: bool = False, **options):
    """Attention of queries over a KV cache, as ``flash_attn_with_kvcache`` computes it: the keys
    gathered (:func:`gather_cache`), then :func:`attention` (or, with ``recipe``, the exact FP8
    model :func:`fp8_attention`) over them; each sequence's queries are its newest positions
    (bottom-right alignment).  ``q`` (B, Sq, Hq, D) -> out (B, Sq, Hq, Dv), lse (B, Hq, Sq); or
    packed (Tq, Hq, D) with ``cu_seqlens_q`` -> (Tq, Hq, Dv), (Hq, Tq).  ``options``: causal,
    softmax_scale, descales, window_size, softcap, sinks."""
    k, cu_k = gather_cache(k_cache, cache_seqlens, page_table)
    v, _ = gather_cache(v_cache, cache_seqlens, page_table)
    dense = cu_seqlens_q is None
    if dense:
        b, sq = q.shape[:2]
        cu_seqlens_q = np.arange(b + 1) * sq
        q = np.asarray(q).reshape(b * sq, *q.shape[2:])
    run = attention if recipe is None else functools.partial(fp8_attention, recipe=recipe)
    out, lse = run(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_k, return_lse=True, **options)
    if dense:
        out = out.reshape(b, sq, *out.shape[1:])
        lse = lse.reshape(lse.shape[0], b, sq).transpose(1, 0, 2)
    return (out, lse) if return_lse else out


def merge_attention_states(o_a, lse_a, o_b, lse_b):
    """Two partial attentions of the same queries over disjoint key sets, merged, in float64.

    o_a, o_b (..., S, H, D) (dense (B, S, H, D) or packed (T, H, D)); lse_a, lse_b the matching
    natural-log LSEs (..., H, S) ((B, H, S) or (H, T)).  Returns (out, lse): the attention over
    both key sets, ``out = (e^{lse_a} o_a + e^{lse_b} o_b) / (e^{lse_a} + e^{lse_b})`` and
    ``lse = log(e^{lse_a} + e^{lse_b})``, computed from m = max(lse_a, lse_b).  A side whose LSE
    is -inf (no keys) contributes nothing, whatever its O; both: zeros and -inf; a NaN LSE gives
    a NaN row."""
    o_a, o_b = (np.asarray(o, np.float64) for o in (o_a, o_b))
    lse_a, lse_b = (np.asarray(x, np.float64) for x in (lse_a, lse_b))
    m = np.maximum(lse_a, lse_b)
    live = ~np.isneginf(m)           # a NaN LSE makes its row NaN
    m0 = np.where(live, m, 0.0)
    wa, wb = np.exp(lse_a - m0), np.exp(lse_b - m0)   # exp(-inf) = 0: no keys, no weight
    s = wa + wb
    with np.errstate(invalid="ignore", divide="ignore"):
        ca, cb = np.where(live, wa / s, 0.0), np.where(live, wb / s, 0.0)
        lse = np.where(live, m0 + np.log(s), -np.inf)
    row = lambda c: np.swapaxes(c, -1, -2)[..., None]   # noqa: E731  (..., H, S) -> (..., S, H, 1)
    # a side of weight 0 is not read (0 times a NaN or inf left there would poison the row)
    out = (np.where(row(ca) != 0, row(ca) * o_a, 0.0) + np.where(row(cb) != 0, row(cb) * o_b, 0.0))
    return out, lse
