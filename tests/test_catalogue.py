"""The catalogue: 32 plain variants, 16 serving ones and 2 short-prompt ones (sm_90a), and the
one definition of each kernel's argument layout."""

import pytest

import numpy as np

from zyfa_runtime.catalogue import (ARG_TYPES, FEATURES_OF, HEAD_DIMS, SERVING_FEATURES_OF, SM90_PARAM_BASE, TMAP_ALIGN, VT_BLOCK, Variant, all_variants,
                                    dependent_launch, dispatch_order, eval_grid, features, gathers_k, grid_rule, has_vt_prepass, iter_select, kernarg_size, longest_first,
                                    kernargs, kv_bytes_per_key, split_tail_counter_bytes, split_tail_grid_rule,
                                    split_tail_slot_bytes, split_tail_symbol, tensor_maps, tiles_rule, vt_column0,
                                    vt_columns, vt_prepass_grid_rule, vt_prepass_symbol, SM90_HEADS_FIRST_BYTES, sm90_body,
                                    SM90_MAX_SMEM, SHORT_KEYS, SHORT_VARIANTS_OF, features, serving_variant,
                                    short_variant, f16_variant, F16_KEYS, F16_VARIANTS_OF)


def test_catalogue_is_the_full_product_and_the_serving_short_softcap_and_f16_variants_of_sm90a():
    vs = all_variants()
    assert len(vs) == 68
    assert len({v.name for v in vs}) == 68 and len({v.symbol for v in vs}) == 68
    assert len({v.filename for v in vs}) == 68
    plain = [v for v in vs if not v.serving and not v.short and not v.f16]
    assert len(plain) == 32 and {(v.d_qk, v.d_v) for v in plain} == set(HEAD_DIMS)
    assert vs[32:48] == [serving_variant(v) for v in plain if v.arch == "sm_90a"]
    assert vs[48:50] == [short_variant(v) for v in plain if short_variant(v) is not None]
    assert [v.name for v in vs[48:50]] == ["fwd_sm_90a_fp8_e4m3_d128x128_full_short",
                                           "fwd_sm_90a_fp8_e4m3_d128x128_causal_short"]
    assert vs[50:66] == [serving_variant(v, softcap=True) for v in plain if v.arch == "sm_90a"]
    assert vs[66:] == [f16_variant(v) for v in plain if f16_variant(v) is not None]
    assert [v.name for v in vs[66:]] == ["fwd_sm_90a_fp8_e4m3_d128x128_full_f16",
                                         "fwd_sm_90a_fp8_e4m3_d128x128_causal_f16"]
    assert all(v.name == serving_variant(p).name == p.name + "_serving" for p, v in zip(plain[:16], vs[32:]))
    assert all(v.name == p.name + "_serving_softcap" and v.serving and v.softcap
               for p, v in zip(plain[:16], vs[50:]))
    # The gfx950 FP8 set comes from the assembly generator.
    assert sorted(v.name for v in vs if v.built_from == "asm-generator") == sorted(
        v.name for v in vs if v.arch == "gfx950" and v.dtype == "fp8_e4m3")


@pytest.mark.parametrize("bad", [dict(arch="gfx942"), dict(dtype="fp16"), dict(d_qk=96, d_v=96),
                                 dict(arch="gfx950", dtype="fp8_e4m3", serving=True), dict(arch="gfx950", serving=True),
                                 dict(dtype="fp8_e4m3", short=True, serving=True), dict(dtype="fp8_e4m3", d_qk=64, d_v=64, short=True),
                                 dict(short=True), dict(arch="gfx950", dtype="fp8_e4m3", short=True),
                                 dict(f16=True), dict(dtype="fp8_e4m3", f16=True, short=True),
                                 dict(dtype="fp8_e4m3", f16=True, serving=True), dict(dtype="fp8_e4m3", d_qk=64, d_v=64, f16=True),
                                 dict(arch="gfx950", dtype="fp8_e4m3", f16=True)])
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
        align = TMAP_ALIGN if a.type == "tmap" else a.size
        base = SM90_PARAM_BASE if a.type == "tmap" else 0     # a tensor map: aligned in the constant bank
        assert (a.offset + base) % align == 0, a
        assert a.offset >= end and a.offset - end < align, "only alignment padding between args"
        end = a.offset + a.size
    assert kernarg_size(args) % 8 == 0 and kernarg_size(args) >= end
    names = [a.name for a in args]
    assert len(set(names)) == len(names)
    assert ("descale_q" in names) == (v.dtype == "fp8_e4m3")
    assert ("vt" in names) == ("vt_stride_h" in names) == has_vt_prepass(v)
    # sm_90a reads Q and K by TMA, and BF16 V too (FP8's V^T comes from the pre-pass's workspace;
    # the f16-math FP8 kernels read V as BF16 does, e4m3 rows of 128 bytes a box); the persistent
    # BF16-body kernels write O by TMA, a consumer's 64 rows of a 128-byte K-block a box
    assert [n for n in names if n.startswith("tmap_")] == list(tensor_maps(v))
    tma_o = v.tile.tma_o
    assert list(tensor_maps(v)) == ([] if v.vendor != "cuda" else
                                    (["tmap_q", "tmap_k"] if has_vt_prepass(v) else ["tmap_q", "tmap_k", "tmap_v"])
                                    + ["tmap_o"] * tma_o)
    # O by TMA: every persistent BF16-body kernel (through Q's buffer); the FP8 short kernels whose
    # staging tile fits beside their deepest ring (two consumers: causal) and the FP8 serving
    # kernels at d_v = 128 (a CTA a tile: one Q buffer, room for the staging tile)
    # (where the staging tile fits: test_fp8_k_v_rings_are_as_deep_as_shared_memory_allows)
    ws_persistent = v.vendor == "cuda" and sm90_body(v) == "ws" and v.tile.persistent
    assert tma_o == ws_persistent or (tma_o and sm90_body(v) == "fp8-ws" and v.d_v == 128
                                      and ((v.tile.persistent and v.tile.block_m == 128) or v.serving))
    if tma_o:
        assert tensor_maps(v)["tmap_o"] == {"tensor": "o", "box": [128, 1, 64, 1], "swizzle_bytes": 128}
    if v.f16:
        assert all(m["box"][0] == 128 == m["swizzle_bytes"] for m in tensor_maps(v).values())
        assert all(m["box"][0] == v.d_qk for a, m in tensor_maps(v).items() if a != "tmap_o")


def test_the_vt_prepass_is_the_sm90a_fp8_kernels_and_leaves_gfx950_layouts_alone():
    assert {v.name for v in all_variants() if has_vt_prepass(v)} == {
        v.name for v in all_variants() if v.arch == "sm_90a" and v.dtype == "fp8_e4m3" and not v.f16}
    # the gfx950 FP8 kernels' argument layout is the sm_90a FP8 serving one without the
    # pre-pass's V^T and gathered K and K's tensor map (window, softcap, sinks and the KV cache's
    # in the same places: the softcap specialisation's), the KV cache's count pointer after the sinks
    amd = [a.name for a in kernargs(Variant("gfx950", "fp8_e4m3", 128, 128, False))]
    serving = Variant("sm_90a", "fp8_e4m3", 128, 128, False, serving=True, softcap=True)
    nv = [a.name for a in kernargs(serving)]
    assert amd[amd.index("sinks") + 1] == "cache_seqlens"
    assert amd == [n for n in nv if not n.startswith(("vt", "tmap_")) and n != "kg"]
    # a paged cache's K gathered by the pre-pass: the FP8 serving kernels, which take pages
    assert {v.name for v in all_variants() if gathers_k(v)} == {
        v.name for v in all_variants() if v.arch == "sm_90a" and v.dtype == "fp8_e4m3" and v.serving}
    assert nv.index("kg") == nv.index("vt") + 1 and "paged_kv" in features(serving)
    # the pre-pass covers every key block of every key/value head and sequence
    v = Variant("sm_90a", "fp8_e4m3", 64, 64, True)
    assert v.tile.block_n == VT_BLOCK
    for sk in (1, VT_BLOCK - 1, VT_BLOCK, VT_BLOCK + 1, 1000):
        x, y, z = eval_grid(vt_prepass_grid_rule(v), {"seqlen_k": sk, "hkv": 3, "batch": 5})
        assert (x - 1) * VT_BLOCK < sk <= x * VT_BLOCK and (y, z) == (3, 5)


def _vt_spans(batch, sk, cu):
    """Each sequence's V^T columns, its first to the end of its last block."""
    lengths = [sk] * batch if cu is None else list(np.diff(cu))
    return [(vt_column0(b, sk, cu), vt_column0(b, sk, cu) + -(-int(n) // VT_BLOCK) * VT_BLOCK)
            for b, n in enumerate(lengths)]


@pytest.mark.parametrize("seed", range(20))
def test_vt_workspace_holds_every_sequence_s_blocks_apart(seed):
    """The V^T layout: each sequence's blocks (its last one padded with zeros) start at a
    block boundary, never overlap another's and end within vt_columns -- dense and packed,
    with empty sequences and lengths on and off the block size."""
    rng = np.random.default_rng(seed)
    batch = int(rng.integers(1, 9))
    lengths = rng.choice([0, 1, VT_BLOCK - 1, VT_BLOCK, VT_BLOCK + 1, 300, 1000], size=batch)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    for sk, cu_k, total in ((int(lengths.max()), None, None), (int(lengths.max()), cu, int(cu[-1]))):
        spans = _vt_spans(batch, sk, cu_k)
        end = vt_columns(batch, sk, total)
        assert end % VT_BLOCK == 0 and end >= VT_BLOCK
        for lo, hi in spans:
            assert lo % VT_BLOCK == 0 and 0 <= lo <= hi <= end
        for (lo1, hi1), (lo2, hi2) in zip(spans, spans[1:]):
            assert hi1 <= lo2


@pytest.mark.parametrize("v", [Variant("sm_90a", "bf16", 128, 128, False), Variant("gfx950", "bf16", 128, 128, True),
                               Variant("gfx950", "fp8_e4m3", 128, 128, False),
                               Variant("gfx950", "fp8_e4m3", 128, 128, True)], ids=lambda v: v.name)
def test_grid_rule_covers_every_query_row(v):
    """The tiles (a CTA's each, or a persistent CTA's in turn) cover every query row."""
    rule = tiles_rule(v)
    assert (grid_rule(v) == rule) == (not v.tile.persistent)
    bm = v.tile.block_m
    for sq in (1, bm - 1, bm, bm + 1, 1000):
        grid = eval_grid(rule, {"seqlen_q": sq, "seqlen_k": 1 << 20, "hq": 7, "hkv": 7, "batch": 3})
        # gfx950 causal: (heads, sequences, blocks), the blocks longest first (work_of)
        x, y, z = (grid[2], *grid[:2]) if longest_first(v) else grid
        assert (x - 1) * bm < sq <= x * bm and (y, z) == (7, 3)
        if v.arch == "gfx950":
            work = dispatch_order(v, sq, 7, 3)
            assert sorted(work) == [(b, h, s) for b in range(x) for h in range(7) for s in range(3)]
    for bad in ({"pow": [1, 2]}, {"mul": []}, {"if_le": [1, 2, 3]}, True, 1.5):
        with pytest.raises(ValueError):
            eval_grid({"x": bad, "y": 1, "z": 1}, {})


@pytest.mark.parametrize("v", [v for v in all_variants() if v.arch == "sm_90a" and v.causal], ids=lambda v: v.name)
def test_causal_sm90a_grid_order_follows_what_fits_in_l2(v):
    """The tiles (the grid, or a persistent kernel's tiles in the order of their linear index)
    heads first, (hq, blocks, sequences), where the keys and values of a sequence's
    key/value heads take at most SM90_HEADS_FIRST_BYTES; else sequences first, (sequences,
    blocks, hq), where those of one head's sequences do; else each head in turn, (blocks, hq,
    sequences)."""
    bm, per_key = v.tile.block_m, kv_bytes_per_key(v)
    assert per_key == (v.d_qk + v.d_v) * (1 if v.dtype == "fp8_e4m3" else 2)
    for b, hq, hkv, sq, sk in ((8, 16, 16, 4096, 4096), (1, 32, 8, 16384, 16384), (4, 32, 32, 4096, 4096),
                               (2, 16, 16, 8192, 8192), (64, 32, 32, 32768, 32768), (3, 5, 1, 300, 70000),
                               (3, 4, 4, 1, 1)):
        blocks = -(-sq // bm)
        grid = eval_grid(tiles_rule(v), {"seqlen_q": sq, "seqlen_k": sk, "hq": hq, "hkv": hkv, "batch": b})
        if hkv * sk * per_key <= SM90_HEADS_FIRST_BYTES:
            assert grid == (hq, blocks, b)
        elif b * sk * per_key <= SM90_HEADS_FIRST_BYTES:
            assert grid == (b, blocks, hq)
        else:
            assert grid == (blocks, hq, b)


@pytest.mark.parametrize("v", [v for v in all_variants() if v.arch == "sm_90a"], ids=lambda v: v.name)
def test_persistent_kernels_take_a_cta_an_sm_over_their_tiles(v):
    """BF16 d128 (plain and serving) and the FP8 d128 short-prompt and f16-math variants are
    persistent (two Q tiles fit beside the K/V ring): the grid is one CTA an SM, or a tile, where there are
    fewer; the arguments carry the tiles' grid, their count and the counter.  Every sm_90a
    argument list ends on 8 bytes: cuLaunchKernel takes a buffer of the cubin's parameter size,
    and kernarg_size rounds up to 8."""
    assert v.tile.persistent == (((v.d_qk, v.d_v) == (128, 128) and v.dtype == "bf16") or v.short or v.f16)
    names = [a.name for a in kernargs(v)]
    tile_args = ["tiles_x", "tiles_y", "tiles_z", "tile_count"]
    assert ("tile_counter" in names) == v.tile.persistent
    assert all(n in names for n in tile_args) == (v.tile.persistent or v.tile.split_tail)
    assert not any(n in names for n in tile_args) or v.tile.persistent or v.tile.split_tail
    args = kernargs(v)
    assert kernarg_size(args) == max(a.offset + a.size for a in args)
    if v.tile.persistent:
        for tiles, sms in ((5, 132), (132, 132), (4096, 132), (4096, 78)):
            assert eval_grid(grid_rule(v), {"tile_count": tiles, "sm_count": sms}) == (min(tiles, sms), 1, 1)
    if v.tile.persistent and (v.dtype == "bf16" or v.f16):   # FP8's: test_fp8_k_v_rings_are_as_deep_as_shared_memory_allows
        ones = 2 * v.tile.block_n * 128 if v.tile.pv_row_sums else 0   # a block of ones after each V stage
        smem = 2 * v.tile.block_m * 2 * v.d_qk + 2 * v.tile.block_n * 2 * (v.d_qk + v.d_v) + ones + 128 + 1024
        assert v.tile.dynamic_smem == smem <= SM90_MAX_SMEM


@pytest.mark.parametrize("v", [v for v in all_variants() if v.arch == "sm_90a" and v.dtype != "bf16" and not v.f16],
                         ids=lambda v: v.name)
def test_fp8_k_v_rings_are_as_deep_as_shared_memory_allows(v):
    """FP8: four K/V^T stages where they fit at d_qk >= 128 (d128, d192/128), three at d64
    (where a fourth did not gain) and at d256 (where four do not fit); the layout Q (x 2 where
    persistent: the next tile's) | O's staging tile (tma_o: block_m x d_v bf16, where it fits
    beside four stages) | K x stages | (V^T, ones) x stages | mbarriers (four a stage, two more,
    in 128-byte units) | 1 KiB of alignment within the 227 KiB a CTA may have; at d256, whose
    three stages with their ones take all of it, the mbarriers inside stage 0's ones and no slack."""
    stages = v.tile.stages
    assert stages == (3 if v.d_qk == 64 or v.d_v == 256 else 4)
    ones = 8 * 128 * stages
    barriers, slack = (0, 0) if v.d_v == 256 else (128 if stages <= 3 else 256, 1024)
    smem = (1 + v.tile.persistent) * v.tile.block_m * v.d_qk + stages * 128 * (v.d_qk + v.d_v) + ones + barriers + slack
    o_tile = v.tile.block_m * 2 * v.d_v
    assert v.tile.tma_o == ((v.tile.persistent or v.serving) and v.d_v == 128 and smem + o_tile <= SM90_MAX_SMEM)
    smem += o_tile * v.tile.tma_o
    assert v.tile.dynamic_smem == smem <= SM90_MAX_SMEM
    if v.d_v == 256:     # exactly all of it; a fourth stage would not fit
        assert smem == SM90_MAX_SMEM and smem + 128 * (v.d_qk + v.d_v) > SM90_MAX_SMEM


def _kernel_reading(grid, hq, batch):
    """cta_work's reading of a causal grid (flash_common.cuh), as a map from the CTA index
    to (row block, head, sequence)."""
    gx, gy, gz = grid
    seqs_first = gx == batch and gz == hq
    heads_first = not seqs_first and gy != hq
    def read(x, y, z):
        m = gy - 1 - y if seqs_first or heads_first else gx - 1 - x
        return m, (z if seqs_first else x if heads_first else y), (x if seqs_first else z)
    return read


@pytest.mark.parametrize("blocks,hq,batch", [(5, 3, 2), (3, 3, 2), (2, 3, 3), (3, 3, 3), (1, 4, 4), (4, 2, 4), (2, 2, 1)])
def test_causal_grid_reading_covers_every_block_once_in_any_order(blocks, hq, batch):
    """Every order's grid, read as the kernel reads it, gives every (block, head, sequence)
    exactly once -- including the shapes where two orders' grids look alike."""
    want = {(m, h, b) for m in range(blocks) for h in range(hq) for b in range(batch)}
    for grid in ((blocks, hq, batch), (hq, blocks, batch), (batch, blocks, hq)):
        read = _kernel_reading(grid, hq, batch)
        got = [read(x, y, z) for x in range(grid[0]) for y in range(grid[1]) for z in range(grid[2])]
        assert len(got) == len(want) and set(got) == want, grid


def test_selection_by_arch_and_substring():
    vs = all_variants()
    assert len(list(iter_select(vs, arch="sm_90a"))) == 52
    assert len(list(iter_select(vs, arch="sm_90a", only="_f16"))) == 2
    assert len(list(iter_select(vs, arch="sm_90a", only="_serving"))) == 32
    assert len(list(iter_select(vs, arch="sm_90a", only="_softcap"))) == 16
    assert len(list(iter_select(vs, arch="sm_90a", only="_short"))) == 2
    sel = list(iter_select(vs, only="d64x64_causal,d256"))
    assert sel and all("d64x64_causal" in v.name or "d256" in v.name for v in sel)
    kept = list(iter_select(vs, arch="sm_90a", only="_serving", skip="_softcap,d256"))
    assert len(kept) == 12 and not any("_softcap" in v.name or "d256" in v.name for v in kept)


def test_lse_bound_follows_the_row_sums_the_kernel_normalises_by():
    """Where l is the sum of the bf16-rounded P (from PV), the LSE is held to ln of a factor
    1 +- 2^-9 of the exact sum, with margin; elsewhere to the fp32 sums' 1e-3.  O's bound is
    the same for both (normalised by what it sums)."""
    import math

    from zyfa_runtime.selfcheck import LSE_BOUND, O_BOUND, ROUNDED_SUM_LSE_BOUND, bounds
    assert -math.log(1 - 2.0 ** -9) < ROUNDED_SUM_LSE_BOUND < 2 * -math.log(1 - 2.0 ** -9)
    for v in all_variants():
        if v.dtype != "bf16":
            continue
        assert bounds(v) == (O_BOUND, ROUNDED_SUM_LSE_BOUND if v.tile.pv_row_sums else LSE_BOUND)
        assert v.tile.pv_row_sums == (v.arch == "sm_90a" and v.d_qk == v.d_v <= 128)


@pytest.mark.parametrize("v", [v for v in all_variants() if v.arch == "sm_90a"], ids=lambda v: v.name)
def test_fp8_d256_non_causal_balances_its_last_wave(v):
    """FP8 d256 non-causal cuts the tiles past its last whole wave by keys (Tile.split_tail):
    its kernel takes the tiles before tail_first, a CTA each, a tail kernel of its own
    tail_ctas CTAs; the tiles' grid, the plan, the partials and the counter are arguments of
    both; no other variant has any of them.  Every sm_90a FP8 kernel (and so its tail) may be
    launched as its pre-pass's dependent; no BF16 one (it has no pre-pass)."""
    assert v.tile.split_tail == (v.dtype == "fp8_e4m3" and v.d_v == 256 and not v.causal and not v.serving)
    if v.f16:   # no pre-pass: launched plainly
        assert not v.tile.split_tail and not dependent_launch(v)
        return
    names = [a.name for a in kernargs(v)]
    tail_args = ["tail_first", "tail_ctas", "tail_gap", "tail_ramp", "partials", "tail_counter"]
    assert all(n in names for n in tail_args) == v.tile.split_tail
    assert not any(n in names for n in tail_args) or v.tile.split_tail
    assert dependent_launch(v) == (v.dtype == "fp8_e4m3")
    if v.tile.split_tail:
        plan = {"tail_first": 1980, "tail_ctas": 132}
        assert eval_grid(grid_rule(v), plan) == (1980, 1, 1) and tiles_rule(v)["y"] == "hq"
        assert eval_grid(split_tail_grid_rule(v), plan) == (132, 1, 1)
        assert split_tail_symbol(v) not in (v.symbol, vt_prepass_symbol(v))
        # a thread's O / l (d_v / 2 f16) and one 16-byte group of l and frame, 128 threads a consumer
        assert split_tail_slot_bytes(v) == 2 * 128 * (128 * 2 + 16)
        assert split_tail_counter_bytes(v) == 2 * 8      # arrived and stored, a consumer


@pytest.mark.parametrize("v", [v for v in all_variants() if v.short], ids=lambda v: v.name)
def test_a_short_variant_is_its_plain_kernel_with_persistent_ctas(v):
    """The short-prompt variant of sm_90a FP8 d128 (SHORT_VARIANTS_OF): the plain kernel's tile
    (rows, keys, threads, ring) with persistent CTAs -- a second Q tile, the tile counter and the
    tiles' grid in its arguments, one CTA an SM -- where the plain kernel is a CTA a tile; taken
    for at most SHORT_KEYS keys a sequence (plan.variant_for)."""
    plain = Variant(v.arch, v.dtype, v.d_qk, v.d_v, v.causal)
    assert short_variant(plain) == v and short_variant(v) == v and v.name == plain.name + "_short"
    assert (v.d_qk, v.d_v) in SHORT_VARIANTS_OF[(v.arch, v.dtype)] and SHORT_KEYS == 2048
    assert v.tile.persistent and not plain.tile.persistent and not v.tile.split_tail
    same = ("block_m", "block_n", "threads", "stages", "pv_row_sums")
    assert all(getattr(v.tile, f) == getattr(plain.tile, f) for f in same)
    # Q x 2 (e4m3), and where O goes by TMA its staging tile (bf16) and tensor map
    assert v.tile.dynamic_smem == (plain.tile.dynamic_smem + v.tile.block_m * v.d_qk
                                   + v.tile.tma_o * v.tile.block_m * 2 * v.d_v)
    assert v.tile.tma_o == v.causal and not plain.tile.tma_o   # (two consumers: room beside four stages)
    names, plain_names = [a.name for a in kernargs(v)], [a.name for a in kernargs(plain)]
    assert [n for n in names if n not in plain_names] == ["tmap_o"] * v.tile.tma_o + [
        "tile_counter", "tiles_x", "tiles_y", "tiles_z", "tile_count"]
    assert grid_rule(v) == {"x": {"min": ["tile_count", "sm_count"]}, "y": 1, "z": 1}
    assert grid_rule(plain) == tiles_rule(plain)
    assert Variant.from_json(v.to_json()) == v and v.to_json()["short"] is True


@pytest.mark.parametrize("v", [v for v in all_variants() if v.serving], ids=lambda v: v.name)
def test_a_serving_variant_is_its_plain_kernel_with_the_features_arguments(v):
    """The serving variant of an sm_90a kernel: the plain tile and schedule (persistent where the
    plain kernel is: BF16 d128), without a balanced tail, the features of SERVING_FEATURES_OF
    with their arguments added to the plain kernel's (less a balanced-tail kernel's tail
    arguments); the plain kernel lists none.  The manifest's variant round-trips (an entry
    without ``serving`` is a plain kernel)."""
    plain = Variant(v.arch, v.dtype, v.d_qk, v.d_v, v.causal)
    assert serving_variant(plain, softcap=v.softcap) == v
    assert features(v) == tuple(f for f in SERVING_FEATURES_OF[(v.arch, v.dtype)] if f != "softcap" or v.softcap)
    assert features(plain) == FEATURES_OF.get((v.arch, v.dtype), ()) == ()
    assert v.tile.persistent == plain.tile.persistent and not v.tile.split_tail
    assert grid_rule(v) == grid_rule(plain) if v.tile.persistent else grid_rule(v) == tiles_rule(v)
    same = ("block_m", "block_n", "threads", "stages", "pv_row_sums")
    assert all(getattr(v.tile, f) == getattr(plain.tile, f) for f in same)
    # FP8 at d_v = 128: O by TMA through a staging tile (block_m x d_v bf16) the plain kernel lacks
    staged = v.tile.tma_o and not plain.tile.tma_o
    assert not staged or (v.dtype == "fp8_e4m3" and v.d_v == 128)
    assert v.tile.dynamic_smem == plain.tile.dynamic_smem + staged * v.tile.block_m * 2 * v.d_v
    names, plain_names = [a.name for a in kernargs(v)], [a.name for a in kernargs(plain)]
    names = [n for n in names if not (staged and n == "tmap_o")]
    tail = ("partials", "tail_counter", "tail_first", "tail_ctas", "tail_gap", "tail_ramp")
    tiles = ("tile_counter", "tiles_x", "tiles_y", "tiles_z", "tile_count")
    assert [n for n in names if n not in plain_names] == [
        "sinks", "cache_seqlens", "page_table"] + (["kg"] if gathers_k(v) else []) + [
        "page_table_stride", "page_size", "num_pages", "max_pages",
        "page_magic", "window_left", "window_right"] + (["softcap", "softcap_scale"] if v.softcap else [])
    assert ("softcap" in features(v)) == v.softcap
    kept = tail + (() if v.tile.persistent else tiles)
    assert [n for n in plain_names if n not in kept] == [n for n in names if n in plain_names]
    assert Variant.from_json(v.to_json()) == v and v.to_json()["serving"] is True
    assert Variant.from_json({k: x for k, x in plain.to_json().items() if k != "serving"}) == plain
    assert serving_variant(Variant("gfx950", "bf16", v.d_qk, v.d_v, v.causal)) is None


def test_f16_math_variants_are_the_bf16_body_on_e4m3_tiles_for_short_keys():
    """sm_90a FP8 d128's f16-math variants (Variant.f16): the BF16 body and tile (persistent, row
    sums from PV), FP8's arguments (descales per sequence and key/value head) without the
    pre-pass's, and the runtime takes them up to F16_KEYS keys (plan.variant_for)."""
    assert F16_VARIANTS_OF == {("sm_90a", "fp8_e4m3"): ((128, 128),)} and 128 <= F16_KEYS < SHORT_KEYS
    for causal in (False, True):
        plain = Variant("sm_90a", "fp8_e4m3", 128, 128, causal)
        v, bf16 = f16_variant(plain), Variant("sm_90a", "bf16", 128, 128, causal)
        assert v.f16 and v.name == plain.name + "_f16" and Variant.from_json(v.to_json()) == v
        assert v.tile == bf16.tile and v.tile.persistent and v.tile.pv_row_sums
        assert not has_vt_prepass(v) and not dependent_launch(v)
        names = [a.name for a in kernargs(v)]
        assert "vt" not in names and "descale_v_stride_h" in names and "tile_counter" in names
        assert f16_variant(v) == v and short_variant(v) is None and f16_variant(short_variant(plain)) is None
    assert f16_variant(Variant("sm_90a", "bf16", 128, 128, True)) is None
    assert f16_variant(Variant("sm_90a", "fp8_e4m3", 64, 64, True)) is None
