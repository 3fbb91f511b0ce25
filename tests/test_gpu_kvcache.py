"""KV caches on a real GPU: flash_attn_with_kvcache over contiguous and paged caches against the
fp64 reference (reference.kvcache_attention) and, for FP8, the exact recipe model.

Every case runs on the device's variants (d64 and d128 here, d192 and d256 in the full run), causal
and not.  The output and the LSE are poisoned (NaN) first, and so is every row of the cache that no
sequence uses -- the rows past each sequence's keys, the pages no table names -- in K and V alike:
a kernel that lets one of them into a score it does not mask, or multiplies a V row past the keys
by a P of 0 (0 x NaN = NaN), fails.  The sm_90a kernels (the serving variants) run every case; a
kernel elsewhere that does not list a cache refuses the call (ValueError naming it) before
anything is launched, its poisoned output untouched.

Skipped (and reported) where no GPU backend is present, as tests/test_gpu.py; the layouts the
cases rest on are checked on the host.
"""

import dataclasses

import numpy as np
import pytest

from tests import gpu_outputs
from tests.gpu_outputs import model_args, poisoned
from tests.test_gpu import DRIVER, WHY

from zyfa_runtime import flash_attn_with_kvcache, reference
from zyfa_runtime.catalogue import Variant, all_variants
from zyfa_runtime.memory import to_device
from zyfa_runtime.selfcheck import _descales, _quantise

ARCH = DRIVER.arch(0) if DRIVER is not None else None
HQ, HKV = 4, 2


def variants_of(dims):
    return [v for v in all_variants() if v.arch == ARCH and not v.serving and (v.d_qk, v.d_v) in dims]


#: The calls' plain variants (the planner takes the serving one: plan.variant_for); d64 and d128
#: in the default run, the other head dims in the full run.
VARIANTS = ([pytest.param(v, id=v.name) for v in variants_of({(64, 64), (128, 128)})] +
            [pytest.param(v, id=v.name, marks=pytest.mark.slow) for v in variants_of({(192, 128), (256, 256)})])


@dataclasses.dataclass(frozen=True)
class Case:
    page: int                  # rows a page; 0: a contiguous cache
    lens: tuple                # keys a sequence (cache_seqlens)
    sq: tuple                  # queries a sequence: one value (dense q) or one each (packed q)
    window: tuple = (-1, -1)   # (left, right); the right bound of a causal call is 0
    softcap: float = 0.0
    sinks: float | None = None   # the sinks' mean (None: no sinks)
    garbage: bool = False      # cache_seqlens and page_table out of range, unread (check_cache_seqlens=False)

    @property
    def packed(self) -> bool:
        return len(self.sq) > 1


#: Ragged caches: a sequence of no keys, one of fewer keys than queries (bottom-right alignment:
#: its first queries see no key), one past several 128-key tiles.
LENS = (517, 0, 300, 40)
CASES = {
    "contiguous, dense queries": Case(0, LENS, (64,)),
    "contiguous, packed queries": Case(0, LENS, (64, 1, 37, 50)),
    **{f"pages of {p}, dense queries": Case(p, LENS, (64,)) for p in (16, 64, 256)},
    **{f"pages of {p}, packed queries": Case(p, LENS, (64, 1, 37, 50)) for p in (16, 64, 256)},
    "pages of 48 (not a power of two), decode": Case(48, (517, 300, 1, 40), (1,)),
    # 17 tiles of 128 keys: every stage of the K/V ring refilled several times by the producer's
    # lanes from the entries they loaded a tile ahead (pages of 32: two lanes' boxes a page)
    "pages of 32, a long cache": Case(32, (2100, 0, 517, 40), (64,)),
    "pages of 64, window, softcap and sinks": Case(64, LENS, (64, 1, 37, 50), window=(100, 30), softcap=5.0,
                                                   sinks=1.0),
    "contiguous, lengths and pages out of range, unread": Case(0, LENS, (64,), garbage=True),
    "pages of 16, lengths and pages out of range, unread": Case(16, LENS, (64, 1, 37, 50), garbage=True),
}


def cache_layout(case: Case, rng):
    """The table (None: contiguous), the cache's leading dims and the rows each sequence uses
    (as the kernel reads them: lengths clamped to the cache, pages to the pool).  Paged: the
    pages shuffled over a pool with spares no table names, sequences 0 and 2 sharing their first
    page (a cached prefix).  With ``garbage`` the values passed are out of range (returned
    beside the effective ones): sequence 1's length far past its pages, sequence 3's negative,
    page entries negative and past the pool."""
    b = len(case.lens)
    lens = np.array(case.lens, np.int32)
    if case.page == 0:
        capacity = max(case.lens) + 5
        lead, table = (b, capacity), None
    else:
        per = -(-max(case.lens) // case.page) + 1
        capacity = per * case.page
        pool = b * per + 3
        table = rng.permutation(pool)[:b * per].reshape(b, per).astype(np.int32)
        table[2, 0] = table[0, 0]
        lead = (pool, case.page)
    passed_lens, passed_table = lens, table
    if case.garbage:
        passed_lens = lens.copy()
        passed_lens[1], passed_lens[3] = 2**30, -7
        if table is not None:
            passed_table = table.copy()
            passed_table[1, ::2] = -3
            passed_table[1, 1::2] = 10**6
    eff_lens = np.clip(passed_lens, 0, capacity).astype(np.int32)
    eff_table = None if table is None else np.clip(passed_table, 0, lead[0] - 1).astype(np.int32)
    used = np.zeros(lead, bool)
    for s, n in enumerate(eff_lens):
        for t in range(int(n)):
            if eff_table is None:
                used[s, t] = True
            else:
                used[eff_table[s, t // case.page], t % case.page] = True
    return (passed_lens, passed_table), (eff_lens, eff_table), lead, used


def make(v: Variant, shape, rng, unused=None):
    """A host input in the variant's dtype (NaN in the ``unused`` rows), its exact values, its descale."""
    xq, exact, scale = _quantise(rng.standard_normal(shape).astype(np.float32), v.dtype)
    if unused is not None:
        xq[unused] = np.nan
        exact[unused] = np.nan
    return xq, exact, scale


def check(v: Variant, out, lse, refused, run_ref):
    """The call was refused (not on sm_90a) with the poisoned output untouched; or out and lse
    are within the variant's bounds of the fp64 reference (FP8: also of its recipe's model)."""
    if refused:
        assert ARCH != "sm_90a", "the sm_90a serving kernels run every KV cache"
    gpu_outputs.check(v, out, lse, refused, run_ref)


@pytest.mark.gpu
@pytest.mark.skipif(DRIVER is None, reason=WHY)
@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("name", list(CASES))
def test_a_kvcache_call_matches_the_references_and_reads_no_unused_row(v, name):
    case = CASES[name]
    rng = np.random.default_rng()
    b = len(case.lens)
    (lens, table), (eff_lens, eff_table), lead, used = cache_layout(case, rng)
    sq = case.sq if case.packed else case.sq * b
    q_lead = (sum(sq),) if case.packed else (b, case.sq[0])
    cu_q = np.concatenate([[0], np.cumsum(sq)]).astype(np.int32) if case.packed else None
    made = [make(v, q_lead + (HQ, v.d_qk), rng), make(v, lead + (HKV, v.d_qk), rng, ~used),
            make(v, lead + (HKV, v.d_v), rng, ~used)]
    q, kc, vc = (to_device(DRIVER, 0, m[0], v.dtype) for m in made)
    scales = _descales(DRIVER, 0, tuple(m[2] for m in made))
    opts = dict(causal=v.causal)
    if case.window != (-1, -1):
        opts["window_size"] = (case.window[0], 0 if v.causal else case.window[1])
    if case.softcap:
        opts["softcap"] = case.softcap
    sinks_host = None if case.sinks is None else (rng.standard_normal(HQ) + case.sinks).astype(np.float32)
    if sinks_host is not None:
        opts["sinks"] = to_device(DRIVER, 0, sinks_host, "float32")
    out = poisoned(q_lead + (HQ, v.d_v), "bf16")
    lse = poisoned((HQ, sum(sq)) if case.packed else (b, HQ, case.sq[0]), "float32")
    packed = dict(cu_seqlens_q=to_device(DRIVER, 0, cu_q, "int32"), max_seqlen_q=max(sq)) if case.packed else {}

    def call():
        try:
            flash_attn_with_kvcache(q, kc, vc, cache_seqlens=to_device(DRIVER, 0, lens, "int32"),
                                    page_table=None if table is None else to_device(DRIVER, 0, table, "int32"),
                                    out=out, lse=lse, return_lse=True, check_cache_seqlens=not case.garbage,
                                    **packed, **opts, **scales)
        except ValueError as e:
            if "does not implement" not in str(e):
                raise
            return True
        DRIVER.synchronize(0)
        return False

    def run_ref(recipe):
        kw = dict(opts, sinks=sinks_host, cache_seqlens=eff_lens, page_table=eff_table, cu_seqlens_q=cu_q,
                  return_lse=True)
        if recipe is None:
            return reference.kvcache_attention(*(m[1] for m in made), **kw)
        return reference.kvcache_attention(*(m[0] for m in made), recipe=recipe, **kw, **model_args(v, made))
    check(v, out, lse, call(), run_ref)


def test_the_cases_poison_rows_past_the_keys_and_pages_no_table_names():
    """What the GPU cases rest on, checked on the host: every layout leaves rows no sequence
    uses (poisoned NaN), the paged ones whole spare pages and a page two sequences share; the
    garbage cases pass values out of range whose clamps are what the reference reads."""
    rng = np.random.default_rng(0)
    for name, case in CASES.items():
        (lens, table), (eff_lens, eff_table), lead, used = cache_layout(case, rng)
        assert (~used).any(), name
        assert (eff_lens <= lead[1] * (1 if table is None else table.shape[1])).all()
        if table is not None:
            assert (~used.any(axis=1)).any() and table[0, 0] == table[2, 0], name
            assert case.garbage or len(np.unique(table)) == table.size - 1   # shuffled, one page shared
        if case.garbage:
            assert (lens != eff_lens).any() and (table is None or (table != eff_table).any()), name
