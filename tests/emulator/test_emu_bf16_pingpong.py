"""The gfx950 BF16 kernels (hip/flash_fwd.hip: 8 waves in two groups one step apart, S^T = K Q^T
on 32x32x16 MFMAs, K and V copied to LDS by buffer loads, lazy rescale, causal query blocks
longest first) on the emulator, every launch hazard-checked, against the float64 reference
within the BF16 bounds of ``zyfa_runtime.selfcheck`` (O relative error <= 8e-3, LSE absolute
error <= 1e-3), outputs poisoned with NaN first."""

import zlib

import ml_dtypes
import numpy as np
import pytest

from emukit import PREBUILT, bf16, emulator  # noqa: F401 (emulator: a fixture)
from tests.sweeps import sweep

from zyfa_runtime import catalogue, flash_attn_func, reference
from zyfa_runtime.catalogue import Variant
from zyfa_runtime.selfcheck import LSE_BOUND, O_BOUND

VARIANTS = [Variant("gfx950", "bf16", dq, dv, causal)
            for dq, dv in ((64, 64), (128, 128), (192, 128), (256, 256)) for causal in (False, True)]
pytestmark = pytest.mark.skipif(
    not all((PREBUILT / f"{v.name}.hsaco").exists() for v in VARIANTS),
    reason="gfx950 code objects not built (python build.py --arch gfx950)")


def check(q, k, v, causal, **kw):
    """Run the kernel into a NaN-poisoned output; O and LSE errors against float64."""
    out = np.full(q.shape[:-1] + (v.shape[-1],), np.nan, ml_dtypes.bfloat16)
    _, lse = flash_attn_func(q, k, v, causal=causal, out=out, return_lse=True, **kw)
    ref_o, ref_lse = reference.attention(q, k, v, causal=causal, return_lse=True, **kw)
    o = out.astype(np.float64)
    lse = np.asarray(lse.numpy(), np.float64)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), "rows without keys differ"
    finite = np.isfinite(ref_lse)
    assert reference.relative_error(o, ref_o) <= O_BOUND
    assert np.abs(lse[finite] - ref_lse[finite]).max(initial=0.0) <= LSE_BOUND


@pytest.mark.parametrize("v", sweep(VARIANTS))
def test_a_row_max_that_jumps_late_is_rescaled_and_one_that_creeps_is_not_and_both_stay_exact(emulator, v):
    # Keys grow with their index: each 64-key tile's scores exceed the last tile's max by
    # tens of log2 units for half the rows (the vote rescales O and l) and by a fraction of
    # one for the other half (p up to 2^8 against a stale max).  A skipped rescale overflows
    # to inf / NaN; a wrong one shows in O or the LSE.
    rng = np.random.default_rng(zlib.crc32(v.name.encode()))
    sq, sk = 80, 300
    q = rng.standard_normal((1, sq, 2, v.d_qk)).astype(np.float32)
    k = rng.standard_normal((1, sk, 2, v.d_qk)).astype(np.float32)
    growth = np.where(np.arange(2) == 0, 0.08, 0.002)[None, None, :, None]
    k *= 1 + growth * np.arange(sk)[None, :, None, None]
    vv = rng.standard_normal((1, sk, 2, v.d_v)).astype(np.float32)
    check(bf16(q), bf16(k), bf16(vv), v.causal, softmax_scale=0.5)


#: the full run only (its grid is the largest of the file; the default run's several heads and
#: sequences: tests/emulator/test_emu_kvcache.py, test_emu_features.py)
@pytest.mark.parametrize("v", sweep(VARIANTS, quick=set()))
def test_several_query_blocks_heads_and_sequences_each_land_in_their_own_rows(emulator, v):
    # 520 query rows = 3 blocks of 256 (the last of 8 rows), 2 sequences, 2 query heads on 1
    # KV head: causal launches take the blocks longest first (catalogue.work_of), so every
    # (block, head, sequence) must still be computed once and stored where it belongs.
    rng = np.random.default_rng(zlib.crc32(v.name.encode()) + 1)
    q = bf16(rng.standard_normal((2, 520, 2, v.d_qk)))
    k = bf16(rng.standard_normal((2, 530, 1, v.d_qk)))
    vv = bf16(rng.standard_normal((2, 530, 1, v.d_v)))
    check(q, k, vv, v.causal)


@pytest.mark.parametrize("v", sweep(VARIANTS))
def test_keys_past_the_sequence_are_never_read_even_where_memory_holds_nan(emulator, v):
    # K and V are views of the first 77 keys of 128 whose rest is NaN: the buffer loads'
    # range ends at the last key's last byte, so the ragged last tile reads zeros there.
    # With Sq > Sk causal, the first rows see no key (zeros, LSE -inf).
    rng = np.random.default_rng(zlib.crc32(v.name.encode()) + 2)
    kbig = np.full((1, 128, 2, v.d_qk), np.nan, np.float32)
    vbig = np.full((1, 128, 2, v.d_v), np.nan, np.float32)
    kbig[:, :77] = rng.standard_normal((1, 77, 2, v.d_qk))
    vbig[:, :77] = rng.standard_normal((1, 77, 2, v.d_v))
    k, vv = bf16(kbig)[:, :77], bf16(vbig)[:, :77]
    q = bf16(rng.standard_normal((1, 100, 2, v.d_qk)))
    check(q, k, vv, v.causal)


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_causal_work_order_visits_every_block_head_and_sequence_once_longest_first(dtype):
    v = Variant("gfx950", dtype, 128, 128, True)
    seqlen_q, heads, batch = 5 * 256 - 3, 3, 2
    work = catalogue.dispatch_order(v, seqlen_q, heads, batch)
    every = [(x, y, z) for z in range(batch) for y in range(heads) for x in range(5)]
    assert sorted(work) == sorted(every)
    assert [w[0] for w in work] == sorted((w[0] for w in work), reverse=True)
    # every head, then every sequence, of a block before the next block
    assert work[:heads * batch] == [(4, h, b) for b in range(batch) for h in range(heads)]
    plain = Variant("gfx950", dtype, 128, 128, False)
    assert catalogue.dispatch_order(plain, seqlen_q, heads, batch) == every


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_code_objects_are_eight_waves_without_scratch_and_two_kv_tiles_of_lds(v):
    from generator import codeobject
    image = (PREBUILT / f"{v.name}.hsaco").read_bytes()
    meta = codeobject.amdgpu_kernels(image)[v.symbol]
    t = v.tile
    assert (t.block_m, t.threads, meta["max_flat_workgroup_size"]) == (256, 512, 512)
    assert meta["private_segment_fixed_size"] == 0
    assert meta["vgpr_count"] + meta.get("agpr_count", 0) <= 256    # two waves a SIMD
    assert meta["group_segment_fixed_size"] == 2 * 2 * t.block_n * (v.d_qk + v.d_v) <= 160 * 1024


@pytest.mark.parametrize("v", sweep([VARIANTS[3], VARIANTS[4]], quick={(128, 128, True)}))
def test_lds_reads_of_k_and_v_are_free_of_bank_conflicts(emulator, v):
    # The swizzles of hip/bf16_lds.h against the cycle model's bank rule
    # (cycles.lds_conflict_factor): the recorder keeps every access whose factor exceeds 1.
    from bench.gfx950_model import trace
    tr = trace(v, seqlen_q=256, seqlen_k=256, heads=1)
    reads = sum(i.name.startswith("ds_read") for wg in tr.workgroups for t in wg for i in t.insts)
    assert reads > 0
    assert not [t.insts[p].name for wg in tr.workgroups for t in wg for p in t.conflicts]
