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

import numpy as np
import pytest

from tests.emulator.fp8_traced import (  # noqa: F401  (prebuilt: a fixture)
    call_window, check_against_model, check_cache_against_model, check_packed_call, check_query_blocks,
    packed_inputs, prebuilt, quantised, quantised_per_head, traced_call, traced_head)
from tests.emulator.test_emu_fp8 import PBytes

from zyfa_runtime import flash_attn_func, flash_attn_with_kvcache, fp8_models, reference
from zyfa_runtime import window as windows
from zyfa_runtime.catalogue import Variant

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
        self.work = rec.work


def inputs(rng, v, b, sq, sk, hq, hkv, per_head):
    """Q and K with scaled scores of about 20 standard deviations, V of 1; per_head: one descale
    a (sequence, key/value head), magnitudes apart by up to 2^3."""
    spread = np.sqrt(20.0)
    if not per_head:
        return [quantised(rng, (b, sq, hq, v.d_qk), spread), quantised(rng, (b, sk, hkv, v.d_qk), spread),
                quantised(rng, (b, sk, hkv, v.d_v), 1.0)]
    return quantised_per_head(rng, b, hkv, ((sq, hq, v.d_qk, spread), (sk, hkv, v.d_qk, spread),
                                            (sk, hkv, v.d_v, 1.0)))


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
    out, lse = traced_call(prebuilt, v, rec, flash_attn_func, q, k, vv, causal=v.causal, window_size=window,
                           softcap=softcap, sinks=sinks, softmax_scale=scale, descale_q=np.atleast_1d(dq),
                           descale_k=np.atleast_1d(dk), descale_v=np.atleast_1d(dv))
    check_against_model(v, out, lse, q, k, vv, descale_q=dq, descale_k=dk, descale_v=dv, causal=v.causal,
                        softmax_scale=scale, window_size=window, sinks=sinks, softcap=softcap, return_lse=True)
    g = hq // hkv
    for i in range(b):
        for h in range(hq):
            one = (lambda d: d[i, h // g]) if per_head else (lambda d: d)
            check_query_blocks(
                v, window, sq, sk,
                lambda x: check_capped_scores(rec, v, window, x, h, i, sq, sk, softcap, scale, one(dq), one(dk)),
                lambda capped: fp8_models.head_forward(q[i, :, h], k[i, :, h // g], vv[i, :, h // g], "gfx950",
                                                       descale_q=one(dq), descale_k=one(dk), descale_v=one(dv),
                                                       causal=v.causal, softmax_scale=scale, scores=capped,
                                                       window_size=window, softcap=softcap).p_codes, (i, h))
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
    parts = packed_inputs(rng, v, np.sqrt(20.0))       # two query heads on one key/value head
    check_packed_call(prebuilt, v, parts, softcap=20.0, softmax_scale=float(np.float32(1 / np.sqrt(v.d_qk))))


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
    out, lse = traced_call(prebuilt, v, rec, flash_attn_with_kvcache, q, k, vv, cache_seqlens=paged.SEQLENS,
                           page_table=table, causal=True, softcap=softcap, window_size=window, sinks=sinks,
                           softmax_scale=scale, **ds)
    dq, dk = ds["descale_q"][0], ds["descale_k"][0]
    check_cache_against_model(v, out, lse, q, k, vv, cache_seqlens=paged.SEQLENS, page_table=table, causal=True,
                              softmax_scale=scale, softcap=softcap, window_size=window, sinks=sinks,
                              return_lse=True, **{n: d[0] for n, d in ds.items()})
    kg, cu_k = reference.gather_cache(k, paged.SEQLENS, table)
    vg, _ = reference.gather_cache(vv, paged.SEQLENS, table)
    for b, sk in enumerate(int(n) for n in paged.SEQLENS):
        sq, keys = q.shape[1], slice(int(cu_k[b]), int(cu_k[b + 1]))
        for h in range(paged.HQ):
            if not sk:       # no key: no block, zeros (check); nothing capped
                assert not any(rec.work(wg, sq) == (0, h, b) for wg, _, _ in rec.codes)
                continue
            g = paged.HQ // paged.HKV
            check_query_blocks(       # one query block (40 queries)
                v, window, sq, sk,
                lambda x: check_capped_scores(rec, v, window, x, h, b, sq, sk, softcap, scale, dq, dk),
                lambda capped: fp8_models.head_forward(q[b, :, h], kg[keys, h // g], vg[keys, h // g], "gfx950",
                                                       descale_q=dq, descale_k=dk, descale_v=ds["descale_v"][0],
                                                       causal=True, softmax_scale=scale, scores=capped,
                                                       window_size=window, softcap=softcap).p_codes, (b, h))
