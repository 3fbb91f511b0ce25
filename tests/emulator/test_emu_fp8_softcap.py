"""Softcap in the gfx950 FP8 assembly (``generator/gfx950_fp8.py``: _cap_constants, stage_loops,
_cap) on the emulator, as a specification.

The softcap is a runtime argument (0: none): a call with one runs a capped body of the loop
(with a page table, the paged and capped one), whose softmax phases replace every score by
``2^-es tanh(x)`` before the masks, the block max and the bytes.  Each launch runs through the runtime, hazard-checked, with only the call's host tensors
valid memory, outputs poisoned with NaN first, on scores large enough that the cap matters
(scaled scores of about 20 standard deviations: near the cap of 50, far past the cap of 5), and
is compared with

* ``fp8_models.gfx950_capped_scores``, the kernel's fp32 tanh instruction by instruction: every
  capped score identical, given the kernel's own fp32 scores (v_exp_f32 and v_rcp_f32 are
  correctly rounded on the emulator, so an exact model is exact here; on hardware, with their
  1-ulp error, a byte could differ by one where a score sits that near a rounding boundary), and
  within its documented 6 x 2^-24 of float64 tanh;
* the ``gfx950`` recipe given those capped scores: every P byte identical;
* the recipe's O and LSE within ``selfcheck.bounds`` (the fp32 accumulation order and bf16
  rounding), and the fp64 reference on the dequantised inputs (``reference.attention`` with the
  softcap) within the recipe's own error (0.05).
"""

import zlib

import ml_dtypes
import numpy as np
import pytest

from tests.backends import using_backend
from tests.emulator.test_emu_fp8 import PBytes
from tests.emulator.test_emu_fp8_features import call_window, check, expected_blocks, prebuilt, traced_head  # noqa: F401

from zyfa_runtime import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, fp8_models, reference
from zyfa_runtime import window as windows
from zyfa_runtime.catalogue import Variant

F8 = ml_dtypes.float8_e4m3fn
#: The cap's documented error against float64 tanh (fp8_models.gfx950_capped_scores).
TANH_BOUND = 6 * 2.0 ** -24


class CapBytes(PBytes):
    """PBytes (the capped scores the block max starts from, the bytes) and the raw scores the
    cap starts from: S^T at its first v_pk_mul_f32, as ``raw`` (wg, wave, block) -> (32, 64)."""

    def __init__(self, v: Variant):
        super().__init__(v)
        self.raw: dict = {}

    def __call__(self, w, inst):
        key = (w.wg.id, w.index)
        b = self.block.get(key, 0)
        if inst.name == "v_pk_mul_f32" and self.fresh.get(key, True) and key + (b,) not in self.raw:
            es = 127 - int((w.v[self.scales][0] >> 16) & 0xFF)
            s = np.zeros((32, 64), np.float32)
            for lane in range(64):
                j, g = lane % 32, lane // 32
                for h in range(2):
                    for r in range(16):
                        s[j, 32 * h + 8 * (r // 4) + 4 * g + r % 4] = w.vf[self.s0 + 16 * h + r][lane]
            with np.errstate(over="ignore"):     # rows and keys past the sequence: never compared
                self.raw[key + (b,)] = np.ldexp(s, es)
        super().__call__(w, inst)


class _Raw:
    """The raw scores in PBytes' shape (for traced_head), of the blocks that made bytes (the
    epilogue's v_pk_mul_f32 after a wave's last block records no block)."""

    def __init__(self, rec: CapBytes):
        self.scores = {k: s for k, s in rec.raw.items() if k in rec.codes}
        self.codes = rec.codes


def quantised(rng, shape, spread):
    x = rng.standard_normal(shape).astype(np.float32) * spread
    d = np.float32(np.abs(x).max() / 448.0)
    return (x / d).astype(F8), d


def inputs(rng, v, b, sq, sk, hq, hkv, per_head):
    """Q and K with scaled scores of about 20 standard deviations, V of 1; per_head: one descale
    a (sequence, key/value head), magnitudes apart by up to 2^3."""
    spread = np.sqrt(20.0)
    if not per_head:
        return [quantised(rng, (b, sq, hq, v.d_qk), spread), quantised(rng, (b, sk, hkv, v.d_qk), spread),
                quantised(rng, (b, sk, hkv, v.d_v), 1.0)]
    apart = np.float32([[1.0, 4.0], [0.5, 2.0]])[:b, :hkv]
    parts = []
    for s, h, d, m in ((sq, hq, v.d_qk, spread), (sk, hkv, v.d_qk, spread), (sk, hkv, v.d_v, 1.0)):
        g = h // hkv
        x = rng.standard_normal((b, s, h, d)).astype(np.float32) * m * np.repeat(apart, g, 1)[:, None, :, None]
        ds = (np.abs(x).reshape(b, s, hkv, g, d).max(axis=(1, 3, 4)) / 448.0).astype(np.float32)
        parts.append(((x / np.repeat(ds, g, 1)[:, None, :, None]).astype(F8), ds))
    return parts


def check_capped_scores(rec, v, window, x, h, i, sq, sk, softcap, scale, dq, dk):
    """The kernel's capped scores of one head and query block: the model's, bit for bit, from the
    kernel's raw scores, and within TANH_BOUND of float64 tanh.  Returns them."""
    raw, _, _ = traced_head(_Raw(rec), v, window, x, h, i, sq, sk)
    capped, codes, counts = traced_head(rec, v, window, x, h, i, sq, sk)
    seen = np.isfinite(raw)
    model = fp8_models.gfx950_capped_scores(raw, softcap, np.float32(scale / softcap), dq, dk)
    live = seen & np.isfinite(capped)          # masked scores are -inf after the cap
    assert live.any()
    assert np.array_equal(capped[live].view(np.uint32), model[live].view(np.uint32)), (i, h, x)
    arg = raw[live].astype(np.float64) * scale * float(dq) * float(dk) / softcap
    assert np.abs(capped[live] - np.tanh(arg)).max() <= TANH_BOUND
    return capped, codes, counts


def run(prebuilt, v, seed, sq, sk, softcap, window=windows.NONE, sink_mean=None, b=1, hq=2, hkv=1,
        per_head=False):
    """One dense call with ``softcap`` (and ``window``, sinks of mean ``sink_mean``), traced;
    checks outputs, every capped score and P byte and the blocks each wave computed."""
    window = call_window(v, window)
    rng = np.random.default_rng(zlib.crc32(f"{v.name} {seed}".encode()))
    (q, dq), (k, dk), (vv, dv) = inputs(rng, v, b, sq, sk, hq, hkv, per_head)
    sinks = None if sink_mean is None else (sink_mean + 2 * rng.standard_normal(hq)).astype(np.float32)
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    rec = CapBytes(v)
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(prebuilt(v)), ZYFA_EMULATOR_HAZARDS="1",
                       ZYFA_EMULATOR_STRICT_HOST="1") as driver:
        driver.machine.observers.append(rec)
        out = np.full((b, sq, hq, v.d_v), np.nan, ml_dtypes.bfloat16)
        _, lse = flash_attn_func(q, k, vv, causal=v.causal, out=out, return_lse=True, window_size=window,
                                 softcap=softcap, sinks=sinks, softmax_scale=scale, descale_q=np.atleast_1d(dq),
                                 descale_k=np.atleast_1d(dk), descale_v=np.atleast_1d(dv))
        lse = lse.numpy()
        assert driver.hazards.instructions > 0 and not driver.hazards.violations   # it raises on one
    ds = dict(descale_q=dq, descale_k=dk, descale_v=dv, causal=v.causal, softmax_scale=scale,
              window_size=window, sinks=sinks, softcap=softcap, return_lse=True)
    model = reference.fp8_attention(q, k, vv, recipe="gfx950", **ds)
    ref = reference.attention(q.astype(np.float64), k.astype(np.float64), vv.astype(np.float64), **ds)
    check(v, out, lse, model, ref)
    g = hq // hkv
    for i in range(b):
        for h in range(hq):
            one = (lambda d: d[i, h // g]) if per_head else (lambda d: d)
            for x in range(-(-sq // 256)):
                capped, codes, counts = check_capped_scores(rec, v, window, x, h, i, sq, sk, softcap, scale,
                                                            one(dq), one(dk))
                assert counts == {w: n for w in range(8)
                                  if (n := expected_blocks(v, window, sq, sk, x, w))}, (x, counts)
                res = fp8_models.head_forward(q[i, :, h], k[i, :, h // g], vv[i, :, h // g], "gfx950",
                                              descale_q=one(dq), descale_k=one(dk), descale_v=one(dv),
                                              causal=v.causal, softmax_scale=scale, scores=capped,
                                              window_size=window, softcap=softcap)
                rows = slice(256 * x, min(256 * x + 256, sq))
                assert np.array_equal(codes[rows], res.p_codes[rows]), (i, h, x)
    return out, lse


def variants(dims):
    return [Variant("gfx950", "fp8_e4m3", dq, dv, c) for dq, dv in dims for c in (True, False)]


def test_the_cap_model_is_tanh_within_its_bound_and_saturates_without_nan():
    """gfx950_capped_scores over every magnitude of x (and the fp32 extremes): within 6 x 2^-24 of
    float64 tanh, exactly -1 and 1 far out, odd up to that error, never NaN."""
    rng = np.random.default_rng(47)
    s = np.concatenate([rng.standard_normal(20000) * 10.0 ** rng.uniform(-3, 5, 20000),
                        [0.0, 3e38, -3e38, 1e-30]]).astype(np.float32)
    for softcap, scale, dq, dk in ((50.0, 0.0883883, 0.01, 0.02), (5.0, 0.125, 1.0, 1.0), (30.0, 0.0625, 0.5, 3.0)):
        cs = np.float32(scale / softcap)
        t = fp8_models.gfx950_capped_scores(s, softcap, cs, dq, dk)
        x = s.astype(np.float64) * float(cs) * float(np.float32(dq)) * float(np.float32(dk))
        assert not np.isnan(t).any()
        assert np.abs(t - np.tanh(x)).max() <= TANH_BOUND
        assert (t[x > 10] == 1).all() and (t[x < -10] == -1).all()
        assert np.abs(t + fp8_models.gfx950_capped_scores(-s, softcap, cs, dq, dk)).max() <= 2 * TANH_BOUND


@pytest.mark.parametrize("v", [Variant("gfx950", "fp8_e4m3", 64, 64, True)], ids=lambda v: v.name)
def test_a_softcap_far_below_the_scores_matches_the_kernels_tanh_bytes_and_fp64(prebuilt, v):
    """d64 causal, softcap 5 under scores of about 20: every score saturates near +-1, the rows
    see a nearly flat softmax; 80 queries after 220 cached keys (the diagonal cuts two blocks)."""
    run(prebuilt, v, "far", 80, 300, 5.0, hq=1)


#: name: (sq, sk, softcap); every case on every variant with -m slow
CASES = {
    "softcap near the scores": (100, 200, 50.0),
    "softcap far below the scores": (100, 200, 5.0),
    "two query blocks, the causal diagonal in both": (300, 300, 50.0),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("v", variants(((64, 64), (128, 128))), ids=lambda v: v.name)
def test_dense_softcaps_match_the_kernels_tanh_bytes_and_fp64(prebuilt, v, case):
    sq, sk, softcap = CASES[case]
    run(prebuilt, v, case, sq, sk, softcap)


@pytest.mark.slow
@pytest.mark.parametrize("v", variants(((192, 128), (256, 256))), ids=lambda v: v.name)
def test_the_other_head_dims_cap_their_scores_too(prebuilt, v):
    run(prebuilt, v, "dims", 100, 200, 50.0)


@pytest.mark.slow
@pytest.mark.parametrize("v", variants(((64, 64), (128, 128))), ids=lambda v: v.name)
def test_softcap_window_and_sinks_together_match_the_model(prebuilt, v):
    """A window cutting blocks on both edges, sinks beside the capped logits (the sink is a logit
    in natural-log units, as the capped scores times softcap are: the model joins it unchanged)."""
    run(prebuilt, v, "window sinks", 300, 330, 50.0, window=(40, 25), sink_mean=20.0)


@pytest.mark.slow
@pytest.mark.parametrize("v", variants(((64, 64), (128, 128))), ids=lambda v: v.name)
def test_softcap_with_descales_per_sequence_and_head(prebuilt, v):
    """Two sequences x two key/value heads (GQA 2), each (sequence, head) with its own descale:
    the cap's argument takes that workgroup's dq dk."""
    run(prebuilt, v, "descales", 70, 90, 30.0, b=2, hq=4, hkv=2, per_head=True)


@pytest.mark.slow
@pytest.mark.parametrize("v", variants(((64, 64), (128, 128))), ids=lambda v: v.name)
def test_packed_sequences_take_the_softcap(prebuilt, v):
    """Packed (cu_seqlens), an empty query sequence among them: O and the LSE against the model
    and fp64 for every sequence."""
    rng = np.random.default_rng(zlib.crc32(f"packed softcap {v.name}".encode()))
    seq_q, seq_k, hq, hkv = [70, 0, 270, 5], [90, 20, 300, 3], 2, 1
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (seq_q, seq_k))
    spread = np.sqrt(20.0)
    (q, dq), (k, dk), (vv, dv) = (quantised(rng, (cu_q[-1], hq, v.d_qk), spread),
                                  quantised(rng, (cu_k[-1], hkv, v.d_qk), spread),
                                  quantised(rng, (cu_k[-1], hkv, v.d_v), 1.0))
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(prebuilt(v)), ZYFA_EMULATOR_HAZARDS="1",
                       ZYFA_EMULATOR_STRICT_HOST="1"):
        out = np.full((cu_q[-1], hq, v.d_v), np.nan, ml_dtypes.bfloat16)
        _, lse = flash_attn_varlen_func(q, k, vv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(seq_q),
                                        max_seqlen_k=max(seq_k), causal=v.causal, out=out, return_lse=True,
                                        softcap=20.0, softmax_scale=scale, descale_q=np.array([dq]),
                                        descale_k=np.array([dk]), descale_v=np.array([dv]))
        lse = lse.numpy()
    ds = dict(descale_q=dq, descale_k=dk, descale_v=dv, causal=v.causal, softmax_scale=scale, softcap=20.0,
              return_lse=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    model = reference.fp8_attention(q, k, vv, recipe="gfx950", **ds)
    ref = reference.attention(q.astype(np.float64), k.astype(np.float64), vv.astype(np.float64), **ds)
    check(v, out, lse, model, ref)


@pytest.mark.slow
@pytest.mark.parametrize("v", [Variant("gfx950", "fp8_e4m3", dq, dv, True)
                               for dq, dv in ((64, 64), (192, 128), (256, 256))], ids=lambda v: v.name)
def test_a_softcap_over_a_paged_cache_with_a_window_and_sinks_is_the_models_bit_for_bit(prebuilt, v):
    """The paged and capped body (the softcap decided before the paged set-up writes over its
    argument): pages of 16 rows through a shuffled table (test_emu_fp8_paged's caches, rows no
    sequence owns NaN), counts 150, 0 and 30 for 40 queries, a window and sinks; every capped
    score and P byte the model's on the keys gathered through the table, O and the LSE against
    the model and fp64, each wave's blocks those up to its last row's last key.  d192 and d256:
    the bodies past 128 KiB of the dispatch (reached by _jump)."""
    from tests.emulator import test_emu_fp8_paged as paged
    q, k, vv, table, ds = paged.inputs(v, "softcap", 16)
    softcap, window = 5.0, (70, 0)
    sinks = np.array([0.5, 3.0], np.float32)
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    rec = CapBytes(v)
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(prebuilt(v)), ZYFA_EMULATOR_HAZARDS="1",
                       ZYFA_EMULATOR_STRICT_HOST="1") as driver:
        driver.machine.observers.append(rec)
        out = np.full(q.shape[:-1] + (v.d_v,), np.nan, ml_dtypes.bfloat16)
        _, lse = flash_attn_with_kvcache(q, k, vv, cache_seqlens=paged.SEQLENS, page_table=table, causal=True,
                                         out=out, return_lse=True, softcap=softcap, window_size=window,
                                         sinks=sinks, softmax_scale=scale, **ds)
        lse = lse.numpy()
        assert driver.hazards.instructions > 0 and not driver.hazards.violations
    dq, dk = ds["descale_q"][0], ds["descale_k"][0]
    opts = dict(cache_seqlens=paged.SEQLENS, page_table=table, causal=True, softmax_scale=scale, softcap=softcap,
                window_size=window, sinks=sinks, return_lse=True, **{n: d[0] for n, d in ds.items()})
    model = reference.kvcache_attention(q, k, vv, recipe="gfx950", **opts)
    ref = reference.kvcache_attention(*(x.astype(np.float64) for x in (q, k, vv)), **opts)
    check(v, out, lse, model, ref)
    kg, cu_k = reference.gather_cache(k, paged.SEQLENS, table)
    vg, _ = reference.gather_cache(vv, paged.SEQLENS, table)
    for b, sk in enumerate(int(n) for n in paged.SEQLENS):
        sq, keys = q.shape[1], slice(int(cu_k[b]), int(cu_k[b + 1]))
        for h in range(paged.HQ):
            if not sk:       # no key: no block, zeros (check); nothing capped
                assert not any(wg == (0, h, b) for wg, _, _ in rec.codes)
                continue
            capped, codes, counts = check_capped_scores(rec, v, window, 0, h, b, sq, sk, softcap, scale, dq, dk)
            assert counts == {w: n for w in range(8)
                              if (n := expected_blocks(v, window, sq, sk, 0, w))}, (b, counts)
            g = paged.HQ // paged.HKV
            res = fp8_models.head_forward(q[b, :, h], kg[keys, h // g], vg[keys, h // g], "gfx950", descale_q=dq,
                                          descale_k=dk, descale_v=ds["descale_v"][0], causal=True,
                                          softmax_scale=scale, scores=capped, window_size=window, softcap=softcap)
            assert np.array_equal(codes, res.p_codes), (b, h)
