"""The gfx950 FP8 kernels (``generator/gfx950_fp8.py``) on the emulator, as a specification.

Each launch runs through the runtime exactly as on hardware, hazard-checked, with only the
host tensors the API hands over as valid memory (an access outside them fails), and is
compared with

* the ``gfx950`` recipe of ``zyfa_runtime.fp8_models``: every P byte identical (the model
  evaluated on the kernel's own fp32 scores, captured from the S^T registers and multiplied
  back by the kernel's E8M0 prescale), O within 4e-3 (fp32 accumulation order and the final
  bf16 rounding) and the LSE within 1e-4;
* the fp64 reference on the dequantised inputs, within the recipe's own error (0.05).

Shapes: lengths that are no multiple of the 256-row / 64-key tiles, causal with Sq != Sk
both ways (rows that see no key give zeros and -inf), GQA ratios 1, 3 and 8, strided views,
and varlen batches with empty and single-token sequences.  Descales one value each, or one a
(sequence, key/value head): (B, Hkv) arrays, transposed views and views broadcast by zero
strides, each (sequence, head) through the recipe with its own.
"""

import zlib

import ml_dtypes
import numpy as np
import pytest

from emukit import PREBUILT, emulated
from tests.sweeps import sweep

from zyfa_runtime import catalogue, flash_attn_func, flash_attn_varlen_func, fp8_models, reference
from zyfa_runtime.catalogue import Variant
from zyfa_runtime.selfcheck import MODEL_LSE_BOUND, MODEL_O_BOUND, RECIPE_FP64_BOUND

VARIANTS = [Variant("gfx950", "fp8_e4m3", dq, dv, causal)
            for dq, dv in ((64, 64), (128, 128), (192, 128), (256, 256)) for causal in (False, True)]
F8 = ml_dtypes.float8_e4m3fn
pytestmark = pytest.mark.skipif(
    not all((PREBUILT / f"{v.name}.hsaco").exists() for v in VARIANTS),
    reason="gfx950 code objects not built (python build.py --arch gfx950)")


@pytest.fixture(scope="module")
def emulator(request):
    with emulated(request, ZYFA_EMULATOR_STRICT_HOST="1") as driver:
        yield driver


class PBytes:
    """Observer: per (workgroup, wave, block) the S^T scores a softmax phase starts from (the
    kernel holds them prescaled by 2^-es, its E8M0 scale of Q^T: multiplied back, exactly) and
    the P^T bytes the row-sum MFMA consumes, mapped back to (query row, key)."""

    def __init__(self, v: Variant):
        from generator.gfx950_fp8 import plan
        p = plan(v)
        self.v = v
        self.s0, self.p0, self.scales = p.vgpr["s"], p.vgpr["p"], p.vgpr["scales"]
        self.fresh: dict = {}       # wave -> True when its next v_max3 starts a softmax phase
        self.block: dict = {}
        self.scores: dict = {}      # (wg, wave, block) -> (32 rows, 64 keys) float32
        self.codes: dict = {}

    def __call__(self, w, inst):
        key = (w.wg.id, w.index)
        if inst.name == "v_max3_f32" and self.fresh.get(key, True):
            self.fresh[key] = False
            b = self.block.get(key, 0)
            s = np.zeros((32, 64), np.float32)
            es = 127 - int((w.v[self.scales][0] >> 16) & 0xFF)
            for lane in range(64):
                j, g = lane % 32, lane // 32
                for h in range(2):
                    for r in range(16):
                        s[j, 32 * h + 8 * (r // 4) + 4 * g + r % 4] = \
                            w.vf[self.s0 + 16 * h + r][lane]
            self.scores[key + (b,)] = np.ldexp(s, es)
        elif inst.name == "v_mfma_scale_f32_16x16x128_f8f6f4":
            b = self.block.get(key, 0)
            c = np.zeros((32, 64), np.uint8)
            for lane in range(64):
                j, g = lane % 32, lane // 32
                for t in range(32):
                    word = int(w.v[self.p0 + t // 4][lane])
                    h, r = divmod(t, 16)
                    c[j, 32 * h + 8 * (r // 4) + 4 * g + r % 4] = (word >> (8 * (t % 4))) & 0xFF
            self.codes[key + (b,)] = c
            self.block[key] = b + 1
            self.fresh[key] = True

    def work(self, wg: tuple, sq: int) -> tuple:
        """(query block, head, sequence) of the workgroup whose grid coordinates are ``wg`` in
        a launch of ``sq`` query rows (``catalogue.work_of``: causal launches run longest
        first)."""
        return catalogue.work_of(self.v, *wg, -(-sq // self.v.tile.block_m))

    def head(self, x: int, y: int, z: int, sq: int, sk: int):
        """(scores, codes) of query head y of sequence z, rows of query block x, as (sq, sk)
        arrays (scores -inf, codes 0 where the kernel computed no block)."""
        s = np.full((sq, sk), -np.inf, np.float32)
        c = np.zeros((sq, sk), np.uint8)
        for (wg, wave, b), sc in self.scores.items():
            if self.work(wg, sq) != (x, y, z):
                continue
            r0, k0 = 256 * x + 32 * wave, 64 * b
            rows, keys = min(32, sq - r0), min(64, sk - k0)
            if rows <= 0 or keys <= 0:
                continue
            s[r0:r0 + rows, k0:k0 + keys] = sc[:rows, :keys]
            c[r0:r0 + rows, k0:k0 + keys] = self.codes[(wg, wave, b)][:rows, :keys]
        return s, c


def quantised(rng, shape, spread=1.0):
    x = rng.standard_normal(shape).astype(np.float32) * spread
    d = np.float32(np.abs(x).max() / 448.0)
    return (x / d).astype(F8), d


def run_dense(driver, v, rng, b, sq, sk, hq, hkv, strided=False, trace=False):
    (q, dq), (k, dk), (vv, dv) = (quantised(rng, (b, sq, hq, v.d_qk), 2.0),
                                  quantised(rng, (b, sk, hkv, v.d_qk), 2.0),
                                  quantised(rng, (b, sk, hkv, v.d_v)))
    args = [q, k, vv]
    if strided:   # views into larger buffers: padded rows, heads and head dims
        args = []
        for x in (q, k, vv):
            big = np.zeros((x.shape[0], x.shape[1] + 3, x.shape[2] + 1, x.shape[3] + 32), F8)
            big[:, 1:1 + x.shape[1], 1:, :x.shape[3]] = x
            args.append(big[:, 1:1 + x.shape[1], 1:, :x.shape[3]])
    rec = PBytes(v) if trace else None
    if rec:
        driver.machine.observers.append(rec)
    try:
        out = np.full((b, sq, hq, v.d_v), np.nan, ml_dtypes.bfloat16)
        _, lse = flash_attn_func(*args, causal=v.causal, out=out, return_lse=True,
                                 descale_q=np.array([dq]), descale_k=np.array([dk]),
                                 descale_v=np.array([dv]))
    finally:
        if rec:
            driver.machine.observers.remove(rec)
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    models = [fp8_models.sequence_forward(q[i], k[i], vv[i], "gfx950", descale_q=dq, descale_k=dk,
                                          descale_v=dv, causal=v.causal, softmax_scale=scale)
              for i in range(b)]
    mo, ml = np.stack([m[0] for m in models]), np.stack([m[1] for m in models])
    deq = [x.astype(np.float64) * d for x, d in ((q, dq), (k, dk), (vv, dv))]
    ro, rl = reference.attention(*deq, causal=v.causal, return_lse=True)
    return dict(out=out.astype(np.float64), lse=lse.numpy().astype(np.float64), model=(mo, ml),
                ref=(ro, rl), inputs=(q, k, vv, dq, dk, dv, scale), trace=rec)


def check_outputs(r):
    out, lse = r["out"], r["lse"]
    mo, ml = r["model"]
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert np.array_equal(np.isneginf(lse), np.isneginf(ml)), "rows without keys differ"
    assert reference.relative_error(out, mo) <= MODEL_O_BOUND
    fin = np.isfinite(ml)
    assert not fin.any() or np.abs(lse[fin] - ml[fin]).max() <= MODEL_LSE_BOUND
    assert reference.relative_error(out, r["ref"][0]) <= RECIPE_FP64_BOUND


def check_model_and_fp64(v, out, lse, q, k, vv, **ds):
    """check_outputs of a call with descales (and cu_seqlens) ``ds``: against the ``gfx950``
    recipe's model and fp64 on the dequantised inputs, at the kernel's fp32 softmax scale."""
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    mo, ml = reference.fp8_attention(q, k, vv, recipe="gfx950", causal=v.causal, softmax_scale=scale,
                                     return_lse=True, **ds)
    ro, rl = reference.attention(q.astype(np.float64), k.astype(np.float64), vv.astype(np.float64),
                                 causal=v.causal, softmax_scale=scale, return_lse=True, **ds)
    check_outputs(dict(out=out.astype(np.float64), lse=lse.numpy().astype(np.float64), model=(mo, ml),
                       ref=(ro, rl)))


CASES = {   # name: (b, sq, sk, hq, hkv)
    "gqa3 ragged": (2, 77, 131, 6, 2),
    "gqa8 sq<sk": (1, 45, 150, 8, 1),
    "mha sq>sk": (1, 290, 45, 2, 2),
    # two query blocks (the second ragged) of four heads of three sequences: a causal launch's
    # grid is (heads, sequences, blocks), longest first (catalogue.work_of), and every tile
    # must still be computed once, into its own rows (the three counts differ, so a kernel
    # that read the grid in another order would leave some tile's rows poisoned)
    "blocks heads sequences": (3, 300, 310, 4, 2),
}


def dense_cases():
    """sweep(VARIANTS) x CASES; a non-causal kernel's Sq != Sk cases in the full run only (the
    alignment of Sq to Sk is the causal mask's; gqa3 ragged keeps its tails and groups), and
    the launch order's case at d64 causal only (its mapping is one code path for every variant)."""
    for p in sweep(VARIANTS):
        v = p.values[0]
        for case in CASES:
            quick = case == "gqa3 ragged" or (v.causal and (case != "blocks heads sequences" or v.d_qk == 64))
            slow = () if quick else (pytest.mark.slow,)
            yield pytest.param(v, case, id=f"{v.name}-{case}", marks=(*p.marks, *slow))


@pytest.mark.parametrize("v, case", list(dense_cases()))
def test_dense_matches_model_and_fp64(emulator, v, case):
    rng = np.random.default_rng(zlib.crc32((v.name + case).encode()))
    check_outputs(run_dense(emulator, v, rng, *CASES[case]))


#: The layout and varlen tests' default run: one variant (their addressing is the same code in
#: every variant; test_dense_matches_model_and_fp64 keeps both tile shapes and masks).
QUICK_ONE = {(64, 64, True)}


@pytest.mark.parametrize("v", sweep(VARIANTS, quick=QUICK_ONE))
def test_strided_views(emulator, v):
    rng = np.random.default_rng(zlib.crc32(v.name.encode()))
    check_outputs(run_dense(emulator, v, rng, 2, 70, 70, 4, 2, strided=True))


@pytest.mark.parametrize("v", sweep(VARIANTS))
def test_p_bytes_are_the_models(emulator, v):
    """Every P byte the PV product consumes is the recipe's byte for the kernel's score."""
    rng = np.random.default_rng(zlib.crc32(("bytes" + v.name).encode()))
    b, sq, sk, hq, hkv = 1, 70, 150, 2, 1
    r = run_dense(emulator, v, rng, b, sq, sk, hq, hkv, trace=True)
    q, k, vv, dq, dk, dv, scale = r["inputs"]
    checked = 0
    for h in range(hq):
        s, codes = r["trace"].head(0, h, 0, sq, sk)
        res = fp8_models.head_forward(q[0, :, h], k[0, :, h // (hq // hkv)], vv[0, :, h // (hq // hkv)],
                                      "gfx950", descale_q=dq, descale_k=dk, descale_v=dv,
                                      causal=v.causal, softmax_scale=scale, scores=s)
        assert np.array_equal(codes, res.p_codes)
        assert codes.max() == fp8_models.RECIPES["gfx950"].c0      # each block's max is 256.0
        checked += int((codes > 0).sum())
    assert checked > 1000


@pytest.mark.parametrize("sign", [1, -1])
def test_p_bytes_never_exceed_the_block_max_code_at_extreme_magnitudes(emulator, sign):
    """Scores of +-1e7 in log2 units (all-448 inputs, large descales): U moved up by an ulp
    (an fp32 ulp there spans 32 codes) keeps every byte <= 120 for either sign of U, so no
    e4m3 NaN reaches the MFMA and the output is finite and right."""
    v = Variant("gfx950", "fp8_e4m3", 128, 128, False)
    rng = np.random.default_rng(7)
    q = np.full((1, 40, 1, 128), 448.0, np.float32).astype(F8)
    k = (sign * np.where(rng.random((1, 70, 1, 128)) < 0.5, 448.0, 416.0)).astype(F8)
    vv = rng.standard_normal((1, 70, 1, 128)).astype(F8)
    out = np.full((1, 40, 1, 128), np.nan, ml_dtypes.bfloat16)
    flash_attn_func(q, k, vv, out=out, descale_q=np.array([np.float32(4)]),
                    descale_k=np.array([np.float32(4)]), descale_v=np.array([np.float32(1)]))
    mo, _ = fp8_models.sequence_forward(q[0], k[0], vv[0], "gfx950", descale_q=4.0, descale_k=4.0,
                                        softmax_scale=float(np.float32(1 / np.sqrt(128))))
    o = out.astype(np.float64)[0]
    assert np.isfinite(o).all()
    assert reference.relative_error(o, mo) <= MODEL_O_BOUND


# --------------------------------------------------------------------------------------
# Descales per (sequence, key/value head)

def quantised_by(rng, shape, hkv, spread, by):
    """(B, S, H, D) e4m3 codes of normal values of spread ``spread[b, g]`` (B, Hkv) in the heads
    of key/value head g, and their descales (B, Hkv) float32: one value (``by`` "one"), one a
    head ("head", the same for every sequence) or one a (sequence, head) ("sequence and head");
    amax / 448, but for odd heads the power of two at or above it."""
    b, _, h, _ = shape
    group = h // hkv
    x = rng.standard_normal(shape).astype(np.float32) * np.repeat(spread, group, axis=1)[:, None, :, None]
    heads = np.abs(x).max(axis=(1, 3)).reshape(b, hkv, group).max(axis=2)      # (B, Hkv) amax
    amax = {"one": np.full((b, hkv), heads.max()), "head": np.broadcast_to(heads.max(axis=0), (b, hkv)),
            "sequence and head": heads}[by]
    d = (amax / 448.0).astype(np.float32)
    if by != "one":
        d = np.where(np.arange(hkv) % 2 == 1, np.float32(2.0) ** np.ceil(np.log2(d)), d).astype(np.float32)
    return (x / np.repeat(d, group, axis=1)[:, None, :, None]).astype(F8), d


def descale_view(d: np.ndarray, form: str) -> np.ndarray:
    """The (B, Hkv) descale ``d`` as the caller passes it: "rows" (C order), "transposed" (a
    view of the (Hkv, B) transpose), "broadcast" (zero strides where ``d`` repeats: a head's
    value over the sequences, or one value)."""
    if form == "rows":
        return np.ascontiguousarray(d)
    if form == "transposed":
        return np.ascontiguousarray(d.T).T
    if (d == d[0, 0]).all():
        return np.broadcast_to(d[:1, :1], d.shape)
    assert (d == d[:1]).all()
    return np.broadcast_to(d[:1], d.shape)


#: per tensor (q, k, v): the descales' granularity and the form they are passed in
DESCALE_FORMS = {
    "q by sequence and head, k transposed, v by head broadcast": (
        ("sequence and head", "rows"), ("sequence and head", "transposed"), ("head", "broadcast")),
    "q one value broadcast, k by head, v by sequence and head": (
        ("one", "broadcast"), ("head", "rows"), ("sequence and head", "rows")),
}


@pytest.mark.parametrize("form", [f if i == 0 else pytest.param(f, marks=pytest.mark.slow)
                                  for i, f in enumerate(DESCALE_FORMS)])   # the second with -m slow
@pytest.mark.parametrize("v", sweep(VARIANTS))
def test_descales_per_sequence_and_head_are_each_heads_own(emulator, v, form):
    """Two sequences x two key/value heads (GQA 2) whose magnitudes differ by up to 2^5, each
    (sequence, head) quantised with its own descale (a power of two on odd heads, amax / 448
    on even ones): every P byte is the recipe's for that (sequence, head)'s c (the kernel's c
    bit for bit), O and the LSE within the model bounds, O within the recipe's error of the
    fp64 reference on the dequantised inputs."""
    rng = np.random.default_rng(zlib.crc32((v.name + form).encode()))
    b, sq, sk, hq, hkv = 2, 70, 90, 4, 2
    # spreads of q and k apart by up to 2^5 between heads, their products (the scores') at most 4
    spread_q, spread_k = np.float32([[1.0, 8.0], [0.25, 2.0]]), np.float32([[2.0, 0.5], [1.0, 0.25]])
    (fq, vq), (fk, vk), (fv, vv_) = DESCALE_FORMS[form]
    q, dq = quantised_by(rng, (b, sq, hq, v.d_qk), hkv, spread_q, fq)
    k, dk = quantised_by(rng, (b, sk, hkv, v.d_qk), hkv, spread_k, fk)
    vv, dv = quantised_by(rng, (b, sk, hkv, v.d_v), hkv, spread_q, fv)
    # the score scale c and the output factor differ between heads
    assert len({float(x) for x in (dq * dk).flat}) >= 2 and len({float(x) for x in dv.flat}) >= 2
    rec = PBytes(v)
    emulator.machine.observers.append(rec)
    try:
        out = np.full((b, sq, hq, v.d_v), np.nan, ml_dtypes.bfloat16)
        _, lse = flash_attn_func(q, k, vv, causal=v.causal, out=out, return_lse=True,
                                 descale_q=descale_view(dq, vq), descale_k=descale_view(dk, vk),
                                 descale_v=descale_view(dv, vv_))
    finally:
        emulator.machine.observers.remove(rec)
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    check_model_and_fp64(v, out, lse, q, k, vv, descale_q=dq, descale_k=dk, descale_v=dv)
    for i in range(b):
        for h in range(hq):
            g = h // (hq // hkv)
            s, codes = rec.head(0, h, i, sq, sk)
            res = fp8_models.head_forward(q[i, :, h], k[i, :, g], vv[i, :, g], "gfx950",
                                          descale_q=dq[i, g], descale_k=dk[i, g], descale_v=dv[i, g],
                                          causal=v.causal, softmax_scale=scale, scores=s)
            assert np.array_equal(codes, res.p_codes), (i, h)


@pytest.mark.parametrize("v", sweep(VARIANTS))
def test_packed_descales_are_one_a_sequence_and_head(emulator, v):
    """Packed: descale row b is sequence b's (an empty sequence's included)."""
    rng = np.random.default_rng(zlib.crc32(("packed descales" + v.name).encode()))
    seq_q, seq_k, hq, hkv = [40, 0, 70], [50, 30, 90], 2, 2
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (seq_q, seq_k))
    spread_q, spread_k = np.float32([[1.0, 4.0], [2.0, 0.5], [0.125, 2.0]]), np.float32([[0.5, 1.0], [2.0, 4.0], [8.0, 0.25]])
    parts = []
    for n, t, d, spread in ((cu_q, hq, v.d_qk, spread_q), (cu_k, hkv, v.d_qk, spread_k), (cu_k, hkv, v.d_v, spread_q)):
        codes, ds = zip(*(quantised_by(rng, (1, max(n[i + 1] - n[i], 1), t, d), hkv, spread[i:i + 1],
                                       "sequence and head") for i in range(3)))
        parts.append((np.concatenate([c[0, :n[i + 1] - n[i]] for i, c in enumerate(codes)]),
                      np.concatenate(ds)))
    (q, dq), (k, dk), (vv, dv) = parts
    out = np.full((cu_q[-1], hq, v.d_v), np.nan, ml_dtypes.bfloat16)
    _, lse = flash_attn_varlen_func(q, k, vv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(seq_q),
                                    max_seqlen_k=max(seq_k), causal=v.causal, out=out, return_lse=True,
                                    descale_q=dq, descale_k=descale_view(dk, "transposed"), descale_v=dv)
    check_model_and_fp64(v, out, lse, q, k, vv, descale_q=dq, descale_k=dk, descale_v=dv, cu_seqlens_q=cu_q,
                         cu_seqlens_k=cu_k)


VARLEN = {   # name: (seq_q, seq_k, hq, hkv)
    "empty and single-token": ([1, 0, 66, 3, 20], [1, 7, 80, 0, 20], 3, 1),
    "one long, one empty k": ([300, 9], [130, 0], 2, 2),
}


@pytest.mark.parametrize("case", VARLEN)
@pytest.mark.parametrize("v", sweep(VARIANTS, quick=QUICK_ONE))
def test_varlen(emulator, v, case):
    seq_q, seq_k, hq, hkv = VARLEN[case]
    rng = np.random.default_rng(zlib.crc32((v.name + case).encode()))
    cu_q = np.concatenate([[0], np.cumsum(seq_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(seq_k)]).astype(np.int32)
    (q, dq), (k, dk), (vv, dv) = (quantised(rng, (cu_q[-1], hq, v.d_qk), 2.0),
                                  quantised(rng, (cu_k[-1], hkv, v.d_qk), 2.0),
                                  quantised(rng, (cu_k[-1], hkv, v.d_v)))
    out = np.full((cu_q[-1], hq, v.d_v), np.nan, ml_dtypes.bfloat16)
    _, lse = flash_attn_varlen_func(q, k, vv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                    max_seqlen_q=max(seq_q), max_seqlen_k=max(seq_k),
                                    causal=v.causal, out=out, return_lse=True,
                                    descale_q=np.array([dq]), descale_k=np.array([dk]),
                                    descale_v=np.array([dv]))
    scale = float(np.float32(1 / np.sqrt(v.d_qk)))
    parts = [fp8_models.sequence_forward(q[cu_q[i]:cu_q[i + 1]], k[cu_k[i]:cu_k[i + 1]],
                                         vv[cu_k[i]:cu_k[i + 1]], "gfx950", descale_q=dq,
                                         descale_k=dk, descale_v=dv, causal=v.causal,
                                         softmax_scale=scale) for i in range(len(seq_q))]
    mo = np.concatenate([p[0] for p in parts])
    ml = np.concatenate([p[1] for p in parts], axis=1)
    deq = [x.astype(np.float64) * d for x, d in ((q, dq), (k, dk), (vv, dv))]
    ro, rl = reference.attention(*deq, causal=v.causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                 return_lse=True)
    check_outputs(dict(out=out.astype(np.float64), lse=lse.numpy().astype(np.float64),
                       model=(mo, ml), ref=(ro, rl)))


@pytest.mark.slow
def test_cycle_model_keeps_the_matrix_pipe_busy(emulator):
    """The (128,128) steady state on the cycle model (modelled, not measured), LDS bank
    conflicts charged: the swizzled LDS stages see none, the two-wave ping-pong with operands
    read a phase ahead keeps the matrix pipe >= 91 % busy at CDNA4's 256 B/clk/CU (>= 85 % at
    128, next to the model's calibrated 125, where the LDS reads take 96 % of the MFMA time),
    and the softmax of every vector phase takes 97 VALU slots (776 cycles per 32 x 128 block),
    work the other wave's MFMAs hide."""
    from bench.gfx950_model import kernel_figures
    from zyfa_emulator import cycles
    v = Variant("gfx950", "fp8_e4m3", 128, 128, False)
    busy = {}
    for lds in (256, 128):
        f = kernel_figures(v, seqlen_q=256, seqlen_k=1024, heads=2,
                           params=cycles.Params(lds_bytes_per_clk=lds, lds_bank_conflicts=True))
        busy[lds] = f.loop.mfma_busy
        assert f.loop.valu_busy > 0.5
        assert sum(len(t.conflicts) for t in f.sim.traces) == 0
        t = f.sim.traces[0]
        bars = [k for k, i in enumerate(t.insts) if i.name == "s_barrier"]
        phases = [t.insts[a + 1:b] for a, b in zip(bars, bars[1:])]
        valu = [sum(i.name.startswith("v_") for i in ph) for ph in phases
                if not any(i.name.startswith("v_mfma") for i in ph)]
        assert sorted(set(n for n in valu if n > 40)) == [97]      # every block unmasked here
    assert busy[256] >= 0.91 and busy[128] >= 0.85, busy


def test_bad_layouts_are_refused_before_launch(emulator):
    """Overlapping rows, or a key sequence whose rows span 2 GiB (32-bit buffer offsets),
    give a clear ValueError and launch nothing."""
    from zyfa_runtime import TensorRef
    launches = emulator.machine.instructions
    q = np.zeros((1, 4, 1, 64), F8)
    kv = np.zeros((1, 8, 1, 64), F8)
    # the same buffer viewed with a row stride of 32 < 64: rows overlap
    overlap = TensorRef(ptr=kv.ctypes.data, shape=(1, 8, 1, 64), strides=(512, 32, 64, 1),
                        dtype="fp8_e4m3", device=("cpu", 0))
    with pytest.raises(ValueError, match="rows overlap"):
        flash_attn_func(q, overlap, kv)
    huge = TensorRef(ptr=kv.ctypes.data, shape=(1, 2**16 + 1, 1, 64), strides=(2**32, 2**15, 64, 1),
                     dtype="fp8_e4m3", device=("cpu", 0))
    with pytest.raises(ValueError, match="32-bit offsets"):
        flash_attn_func(q, huge, huge)
    assert emulator.machine.instructions == launches
