"""Serving features on a real GPU: sliding windows, softcap, attention sinks and KV caches
(contiguous and paged) against the fp64 reference and, for FP8, the exact recipe model.

Every case runs on every variant of the device's arch.  Where the variant's manifest entry
lists the features the case needs (catalogue.features), its output -- poisoned first -- must be
within the variant's bounds of the references; where it does not, the call must be refused
(ValueError naming the variant) before anything is launched: the poisoned output stays as it
was.  Cases whose window cuts no key run the plain kernels and are always checked.

Skipped (and reported) where no GPU backend is present, as tests/test_gpu.py.
"""

import numpy as np
import pytest

from tests.gpu_outputs import check, model_args, poisoned
from tests.test_gpu import DRIVER, WHY

from zyfa_runtime import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, reference
from zyfa_runtime.catalogue import Variant, all_variants
from zyfa_runtime.memory import to_device
from zyfa_runtime.selfcheck import _descales, _quantise

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DRIVER is None, reason=WHY)]
ARCH = DRIVER.arch(0) if DRIVER is not None else None
#: The calls' (dtype, head dims, causal) on the device's arch: the planner takes the kernel, a
#: serving variant (catalogue.Variant.serving) for a call that needs a feature where the manifest
#: lists one (plan.variant_for), so each call is made once, under its plain variant's name.
VARIANTS = [v for v in all_variants() if v.arch == ARCH and not v.serving]

#: (name, options, seed of the sinks: None, or their mean -- 12 dominates a row's sum of
#: weights, about e^3 x the keys here), on sequences of 300 queries and 400 keys.
CASES = [
    ("window smaller than the sequence", dict(window_size=(100, -1)), None),
    ("window around the diagonal", dict(window_size=(64, 37)), None),
    ("window larger than the sequence", dict(window_size=(5000, 5000)), None),
    ("softcap", dict(softcap=2.0), None),
    ("sinks beside the scores", {}, 0.0),
    ("sinks dominating the row", {}, 12.0),
    ("window, softcap and sinks", dict(window_size=(80, 0), softcap=5.0), 0.0),
]


def needs_refusal(call):
    """Run ``call``; True where it was refused for a feature the kernel does not implement."""
    try:
        call()
    except ValueError as e:
        if "does not implement" not in str(e):
            raise
        return True
    return False


def inputs(v: Variant, rng, lead_q, lead_k, hq=4, hkv=2):
    """Host inputs in the variant's dtype, their exact values and descales, and device copies."""
    made = [_quantise(rng.standard_normal(lead + (h, d)).astype(np.float32), v.dtype)
            for lead, h, d in ((lead_q, hq, v.d_qk), (lead_k, hkv, v.d_qk), (lead_k, hkv, v.d_v))]
    dev = [to_device(DRIVER, 0, m[0], v.dtype) for m in made]
    return made, dev, _descales(DRIVER, 0, tuple(m[2] for m in made))


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("name,options,sink_mean", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "varlen"])
def test_window_softcap_and_sinks_match_the_references_or_are_refused(v, name, options, sink_mean, packed):
    right = options.get("window_size", (-1, -1))[1]
    if v.causal and right > 0:
        pytest.skip("a right bound above 0 is a non-causal call: the full variant's case")
    rng = np.random.default_rng()
    b, sq, sk, hq = 2, 300, 400, 4
    lead_q, lead_k = ((b * sq,), (b * sk,)) if packed else ((b, sq), (b, sk))
    made, (q, k, vv), scales = inputs(v, rng, lead_q, lead_k)
    opts = dict(options, causal=v.causal)
    sinks_host = None if sink_mean is None else (rng.standard_normal(hq) + sink_mean).astype(np.float32)
    if sinks_host is not None:
        opts["sinks"] = to_device(DRIVER, 0, sinks_host, "float32")
    out = poisoned(lead_q + (hq, v.d_v), "bf16")
    lse = poisoned((hq, b * sq) if packed else (b, hq, sq), "float32")
    cu = dict(cu_seqlens_q=np.arange(b + 1, dtype=np.int32) * sq, cu_seqlens_k=np.arange(b + 1, dtype=np.int32) * sk)

    def call():
        if packed:
            flash_attn_varlen_func(q, k, vv, max_seqlen_q=sq, max_seqlen_k=sk, out=out, lse=lse, return_lse=True,
                                   **cu, **opts, **scales)
        else:
            flash_attn_func(q, k, vv, out=out, lse=lse, return_lse=True, **opts, **scales)
        DRIVER.synchronize(0)

    def run_ref(recipe):
        ref_opts = dict(opts, sinks=sinks_host, return_lse=True, **(cu if packed else {}))
        if recipe is None:
            return reference.attention(*(m[1] for m in made), **ref_opts)
        return reference.fp8_attention(*(m[0] for m in made), recipe=recipe, **ref_opts, **model_args(v, made))
    refused = needs_refusal(call)
    assert not (refused and name == "window larger than the sequence"), "a window that cuts nothing was refused"
    check(v, out, lse, refused, run_ref)


#: (name, page size (0: a contiguous cache), keys a sequence, queries a sequence, options)
KV_CASES = [
    ("decode over pages of 16", 16, [517, 300, 0], 1, dict(causal=True)),
    ("chunked prefill over pages of 64, a shared prefix", 64, [700, 450, 65], 37, dict(causal=True)),
    ("prefill over pages of 256 with a window", 256, [900, 512, 256], 128, dict(causal=True, window_size=(200, 0))),
    ("contiguous cache with sinks", 0, [333, 1, 120], 16, dict(causal=True)),
]


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("name,page,lens,sq,options", KV_CASES, ids=[c[0] for c in KV_CASES])
def test_kvcache_matches_the_references_or_is_refused(v, name, page, lens, sq, options):
    """Paged: sequences 0 and 1 share their first pages (a cached prefix); the pages are
    scattered in the pool.  Queries are each sequence's newest positions."""
    if not v.causal:
        pytest.skip("KV-cache cases are causal")
    rng = np.random.default_rng()
    b, hq, hkv = len(lens), 4, 2
    if page:
        per = -(-max(lens) // page)
        pool = b * per + 2
        order = rng.permutation(pool)
        table = order[:b * per].reshape(b, per).astype(np.int32)
        table[1, :lens[1] // page // 2] = table[0, :lens[1] // page // 2]    # the shared prefix
        cache_lead = (pool, page)
    else:
        table, cache_lead = None, (b, max(lens))
    made, (q, kc, vc), scales = inputs(v, rng, (b, sq), cache_lead, hq, hkv)
    sinks_host = (rng.standard_normal(hq) + 2).astype(np.float32) if "sinks" in name else None
    opts = dict(options)
    if sinks_host is not None:
        opts["sinks"] = to_device(DRIVER, 0, sinks_host, "float32")
    seqlens = np.array(lens, np.int32)
    out = poisoned((b, sq, hq, v.d_v), "bf16")
    lse = poisoned((b, hq, sq), "float32")

    def call():
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=to_device(DRIVER, 0, seqlens, "int32"),
                                page_table=None if table is None else to_device(DRIVER, 0, table, "int32"),
                                out=out, lse=lse, return_lse=True, **opts, **scales)
        DRIVER.synchronize(0)

    def run_ref(recipe):
        kw = dict(opts, sinks=sinks_host, cache_seqlens=seqlens, page_table=table, return_lse=True)
        if recipe is None:
            return reference.kvcache_attention(*(m[1] for m in made), **kw)
        return reference.kvcache_attention(*(m[0] for m in made), recipe=recipe, **kw, **model_args(v, made))
    check(v, out, lse, needs_refusal(call), run_ref)
