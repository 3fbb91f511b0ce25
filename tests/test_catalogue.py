"""The catalogue: 32 variants, and the one definition of each kernel's argument layout."""

import pytest

from zyfa_runtime.catalogue import (ARG_TYPES, HEAD_DIMS, Variant, all_variants, buildable,
                                    eval_grid, grid_rule, iter_select, kernarg_size, kernargs)


def test_catalogue_is_the_full_product():
    vs = all_variants()
    assert len(vs) == 32
    assert len({v.name for v in vs}) == 32 and len({v.symbol for v in vs}) == 32
    assert {(v.d_qk, v.d_v) for v in vs} == set(HEAD_DIMS)
    # Every variant is built; the gfx950 FP8 set comes from the assembly generator.
    assert all(buildable(v) for v in vs)
    assert sorted(v.name for v in vs if v.built_from == "asm-generator") == sorted(
        v.name for v in vs if v.arch == "gfx950" and v.dtype == "fp8_e4m3")


@pytest.mark.parametrize("bad", [dict(arch="gfx942"), dict(dtype="fp16"), dict(d_qk=96, d_v=96)])
def test_variant_rejects_what_is_not_in_the_catalogue(bad):
    kw = dict(arch="sm_90a", dtype="bf16", d_qk=128, d_v=128, causal=False) | bad
    with pytest.raises(ValueError):
        Variant(**kw)


@pytest.mark.parametrize("v", all_variants(), ids=lambda v: v.name)
def test_kernarg_layout_is_naturally_aligned_and_dense(v):
    args = kernargs(v)
    end = 0
    for a in args:
        assert a.size == ARG_TYPES[a.type][1]
        assert a.offset % a.size == 0, a
        assert a.offset >= end and a.offset - end < a.size, "only alignment padding between args"
        end = a.offset + a.size
    assert kernarg_size(args) % 8 == 0 and kernarg_size(args) >= end
    names = [a.name for a in args]
    assert len(set(names)) == len(names)
    assert ("descale_q" in names) == (v.dtype == "fp8_e4m3")


def test_grid_rule_covers_every_query_row():
    v = Variant("sm_90a", "bf16", 128, 128, True)
    rule = grid_rule(v)
    bm = v.tile.block_m
    for sq in (1, bm - 1, bm, bm + 1, 1000):
        x, y, z = eval_grid(rule, {"seqlen_q": sq, "hq": 7, "batch": 3})
        assert (x - 1) * bm < sq <= x * bm and (y, z) == (7, 3)
    with pytest.raises(ValueError):
        eval_grid({"x": {"mul": [1, 2]}, "y": 1, "z": 1}, {})


def test_selection_by_arch_and_substring():
    vs = all_variants()
    assert len(list(iter_select(vs, arch="sm_90a"))) == 16
    sel = list(iter_select(vs, only="d64x64_causal,d256"))
    assert sel and all("d64x64_causal" in v.name or "d256" in v.name for v in sel)
