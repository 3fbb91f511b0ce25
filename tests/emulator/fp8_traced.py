"""The gfx950 FP8 kernels' calls traced on the emulator, and what a traced call is checked
against: the set-up test_emu_fp8_features, _softcap, _kvcache and _paged share.

A call runs through the runtime on the strict emulator (only the call's host tensors valid
memory), hazard-checked, into an output poisoned with NaN first, a recorder (test_emu_fp8.PBytes
or a subclass) observing the machine.  It is checked against

* the ``gfx950`` recipe of ``zyfa_runtime.fp8_models`` (O and the LSE within
  ``selfcheck.bounds``) and the fp64 reference on the dequantised inputs (the recipe's own
  error, RECIPE_FP64_BOUND): ``check`` and its callers ``check_against_model`` (dense and
  packed calls), ``check_cache_against_model`` (KV caches);
* per head and query block (``check_query_blocks``): the key blocks each wave computed, from the
  workgroup's first (its first row's left bound) to the wave's last (its last row's right
  bound), no other; and every P byte the model's on the kernel's own scores (``traced_head``
  cuts them out of the record).
"""

import ml_dtypes
import numpy as np
import pytest

from tests.backends import using_backend
from tests.emulator.test_emu_fp8 import PBytes

from zyfa_runtime import flash_attn_varlen_func, flash_attn_with_kvcache, reference
from zyfa_runtime import window as windows
from zyfa_runtime.catalogue import Variant
from zyfa_runtime.selfcheck import RECIPE_FP64_BOUND, bounds

F8 = ml_dtypes.float8_e4m3fn
#: The magnitude of each (sequence, key/value head) of the per-head inputs: up to 2^3 apart.
APART = np.float32([[1.0, 4.0], [0.5, 2.0]])
#: The packed calls' queries and keys a sequence (an empty query sequence among them), and
#: their cu_seqlens.
PACKED_Q, PACKED_K = [70, 0, 270, 5], [90, 20, 300, 3]
PACKED_CU_Q, PACKED_CU_K = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (PACKED_Q, PACKED_K))


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    """variant -> a directory holding the code objects of its head dims, causal and not (a
    call without causal whose window's right bound is 0 runs the causal kernel), built once a
    module."""
    import build
    built = {}

    def get(v: Variant):
        dims = f"fwd_gfx950_fp8_e4m3_d{v.d_qk}x{v.d_v}_"
        if dims not in built:
            out = tmp_path_factory.mktemp(dims)
            assert build.main(["--arch", "gfx950", "--only", dims, "--out", str(out), "--jobs", "1"]) == 0
            built[dims] = out
        return built[dims]
    return get


def quantised(rng, shape, spread=1.0):
    x = rng.standard_normal(shape).astype(np.float32) * spread
    d = np.float32(np.abs(x).max() / 448.0)
    return (x / d).astype(F8), d


def quantised_per_head(rng, b, hkv, parts):
    """Q, K and V of ``b`` sequences, ``parts`` their (rows, heads, head dim, magnitude): each
    (sequence, key/value head) scaled by its APART and quantised with its own descale;
    [(values, descales (b, hkv))] in the order of ``parts``."""
    apart = APART[:b, :hkv]
    out = []
    for s, h, d, m in parts:
        g = h // hkv
        x = rng.standard_normal((b, s, h, d)).astype(np.float32) * m * np.repeat(apart, g, 1)[:, None, :, None]
        ds = (np.abs(x).reshape(b, s, hkv, g, d).max(axis=(1, 3, 4)) / 448.0).astype(np.float32)
        out.append(((x / np.repeat(ds, g, 1)[:, None, :, None]).astype(F8), ds))
    return out


def packed_inputs(rng, v: Variant, spread, hq=2, hkv=1):
    """Q and K of magnitude ``spread``, V of 1, packed over the PACKED_Q and PACKED_K sequences:
    (q, dq), (k, dk), (vv, dv), one descale each."""
    return (quantised(rng, (PACKED_CU_Q[-1], hq, v.d_qk), spread),
            quantised(rng, (PACKED_CU_K[-1], hkv, v.d_qk), spread),
            quantised(rng, (PACKED_CU_K[-1], hkv, v.d_v)))


def call_window(v: Variant, window) -> tuple[int, int]:
    """``window`` as a call to ``v`` passes it: a causal call's right bound is 0 (or -1)."""
    return (window[0], min(window[1], 0)) if v.causal else tuple(window)


def key_bounds(v: Variant, window, sq: int, sk: int, row: int) -> tuple[int, int]:
    """(lo, hi) of query row ``row`` (any row, past the sequence too, as the kernel takes its
    waves' rows): keys lo .. hi - 1, unclamped below."""
    left, right = windows.normalize(v.causal, window)
    off = sk - sq
    hi = min(row + off + right + 1, sk) if right >= 0 else sk
    return (row + off - left if left >= 0 else 0), max(hi, 0)


def first_block(v, window, sq, sk, x) -> int:
    return max(key_bounds(v, window, sq, sk, 256 * x)[0], 0) // 64


def traced_head(rec, v, window, x, y, z, sq, sk):
    """(scores, codes) of query head y of sequence z, rows of query block x, as (sq, sk) arrays
    (-inf and 0 where the kernel computed no block), the blocks of each wave counted from the
    workgroup's first; and per wave the number of blocks it computed."""
    s = np.full((sq, sk), -np.inf, np.float32)
    c = np.zeros((sq, sk), np.uint8)
    kb0 = first_block(v, window, sq, sk, x)
    counts = {}
    for (wg, wave, b), sc in rec.scores.items():
        if rec.work(wg, sq) != (x, y, z):
            continue
        counts[wave] = max(counts.get(wave, 0), b + 1)
        r0, k0 = 256 * x + 32 * wave, 64 * (kb0 + b)
        rows, keys = min(32, sq - r0), min(64, sk - k0)
        if rows <= 0 or keys <= 0:
            continue
        s[r0:r0 + rows, k0:k0 + keys] = sc[:rows, :keys]
        c[r0:r0 + rows, k0:k0 + keys] = rec.codes[(wg, wave, b)][:rows, :keys]
    return s, c, counts


def expected_blocks(v, window, sq, sk, x, wave) -> int:
    """The blocks wave ``wave`` of query block x computes: from the workgroup's first to the
    last its rows' windows meet; none where its first row's window starts at or past their end
    (blocks no row of the wave sees keep its state without a softmax)."""
    hi = key_bounds(v, window, sq, sk, 256 * x + 32 * wave + 31)[1]
    kb0 = first_block(v, window, sq, sk, x)
    n = max(-(-hi // 64) - kb0, 0)
    return 0 if key_bounds(v, window, sq, sk, 256 * x + 32 * wave)[0] >= 64 * (kb0 + n) else n


def traced_call(prebuilt, v: Variant, rec, call, q, k, vv, **args):
    """``call(q, k, vv, **args)`` (a runtime entry point) on the strict emulator, hazard-checked,
    ``rec`` observing, into an output poisoned with NaN first: (out, lse)."""
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(prebuilt(v)), ZYFA_EMULATOR_HAZARDS="1",
                       ZYFA_EMULATOR_STRICT_HOST="1") as driver:
        driver.machine.observers.append(rec)
        out = np.full(q.shape[:-1] + (v.d_v,), np.nan, ml_dtypes.bfloat16)
        _, lse = call(q, k, vv, out=out, return_lse=True, **args)
        lse = lse.numpy()
        assert driver.hazards.instructions > 0 and not driver.hazards.violations   # it raises on one
    return out, lse


def traced_cache_call(prebuilt, v: Variant, q, k, vv, descales, seqlens, cu_seqlens_q=None, **call):
    """flash_attn_with_kvcache over caches of ``seqlens`` keys a sequence, dense queries or
    packed by ``cu_seqlens_q``, traced (traced_call): (out, lse, the PBytes record)."""
    packed = {} if cu_seqlens_q is None else dict(cu_seqlens_q=cu_seqlens_q,
                                                  max_seqlen_q=int(np.diff(cu_seqlens_q).max()))
    rec = PBytes(v)
    out, lse = traced_call(prebuilt, v, rec, flash_attn_with_kvcache, q, k, vv, cache_seqlens=seqlens,
                           causal=v.causal, **packed, **descales, **call)
    return out, lse, rec


def check(v, out, lse, model, ref):
    """O and the LSE against the model (bounds) and the fp64 reference (the recipe's error)."""
    o_bound, lse_bound = bounds(v)
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    (mo, ml), (ro, _) = model, ref
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert np.array_equal(np.isneginf(lse), np.isneginf(ml)), "rows without keys differ"
    assert np.array_equal(np.abs(mo).max(axis=-1) == 0, np.abs(out).max(axis=-1) == 0), "zero rows differ"
    assert reference.relative_error(out, mo) <= o_bound
    fin = np.isfinite(ml)
    assert not fin.any() or np.abs(lse[fin] - ml[fin]).max() <= lse_bound
    assert reference.relative_error(out, ro) <= RECIPE_FP64_BOUND


def check_against_model(v, out, lse, q, k, vv, **opts):
    """``check`` of a dense or packed call made with ``opts``: the recipe's model
    (reference.fp8_attention) and fp64 (reference.attention on the dequantised inputs)."""
    model = reference.fp8_attention(q, k, vv, recipe="gfx950", **opts)
    ref = reference.attention(q.astype(np.float64), k.astype(np.float64), vv.astype(np.float64), **opts)
    check(v, out, lse, model, ref)


def check_cache_against_model(v, out, lse, q, k, vv, **opts):
    """``check`` of a call over a KV cache made with ``opts``: the recipe's model and fp64 over
    the keys gathered from the cache (reference.kvcache_attention)."""
    check(v, out, lse, reference.kvcache_attention(q, k, vv, recipe="gfx950", **opts),
          reference.kvcache_attention(*(x.astype(np.float64) for x in (q, k, vv)), **opts))


def check_query_blocks(v, window, sq, sk, traced, model_codes, where):
    """One head of ``sq`` queries over ``sk`` keys, query block by query block x: ``traced(x)``
    is the kernel's (scores, codes, blocks a wave) (traced_head): each wave computed
    expected_blocks' blocks; ``model_codes(scores)`` the model's P bytes on those scores, every
    byte of block x's rows the kernel's (``model_codes`` None: the blocks only).  ``where``
    labels a failure."""
    for x in range(-(-sq // 256)):
        s, codes, counts = traced(x)
        assert counts == {w: n for w in range(8)
                          if (n := expected_blocks(v, window, sq, sk, x, w))}, where + (x, counts)
        if model_codes is not None:
            rows = slice(256 * x, min(256 * x + 256, sq))
            assert np.array_equal(codes[rows], model_codes(s)[rows]), where + (x,)


def check_packed_call(prebuilt, v: Variant, parts, **args):
    """flash_attn_varlen_func with ``args`` over ``parts`` (packed_inputs) on the strict emulator,
    hazard checker on, into an output poisoned with NaN first; O and the LSE against the model
    and fp64 (check_against_model; the softmax scale the kernel's fp32 1/sqrt(d) unless ``args``
    has one)."""
    (q, dq), (k, dk), (vv, dv) = parts
    cu = dict(cu_seqlens_q=PACKED_CU_Q, cu_seqlens_k=PACKED_CU_K)
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(prebuilt(v)), ZYFA_EMULATOR_HAZARDS="1",
                       ZYFA_EMULATOR_STRICT_HOST="1"):
        out = np.full(q.shape[:-1] + (v.d_v,), np.nan, ml_dtypes.bfloat16)
        _, lse = flash_attn_varlen_func(q, k, vv, **cu, max_seqlen_q=max(PACKED_Q), max_seqlen_k=max(PACKED_K),
                                        causal=v.causal, out=out, return_lse=True, descale_q=np.array([dq]),
                                        descale_k=np.array([dk]), descale_v=np.array([dv]), **args)
        lse = lse.numpy()
    opts = {"softmax_scale": float(np.float32(1 / np.sqrt(v.d_qk))), **args}
    check_against_model(v, out, lse, q, k, vv, descale_q=dq, descale_k=dk, descale_v=dv, causal=v.causal,
                        return_lse=True, **cu, **opts)
