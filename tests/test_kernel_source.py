"""generator/kernel_source: which body each sm_90a variant gets, the WGMMA instructions it
is given, and the FP8 body's recipe constants, taken from the model it must match."""

import re
import struct

import numpy as np
import pytest

from generator import kernel_source as ks
from zyfa_runtime import catalogue, e4m3, fp8_models
from zyfa_runtime.catalogue import Variant

SM90 = [v for v in catalogue.all_variants() if v.arch == "sm_90a"]


@pytest.mark.parametrize("v", SM90, ids=lambda v: v.name)
def test_each_variant_gets_its_body(v):
    src = ks.emit(v)
    assert "ZYFA_WGMMA_WRAPPERS" not in src and "wgmma.mma_async" in src
    if v.dtype == "bf16" or v.f16:   # flash_fwd_ws.cuh: a producer and consumer warpgroups, exp2
        assert ks.body_key(v) == "ws" and "setmaxnreg" in src and "wgmma_sum" not in src
        # the f16-math FP8 kernels: f16 products on e4m3 tiles converted by the producer (kFp8In)
        assert ("constexpr bool kFp8In = true;" in src) == v.f16 and "constexpr bool kFp8 = false;" in src
        assert ("f32.f16.f16" in src) == v.f16 and ("f32.bf16.bf16" in src) != v.f16
        # three consumer warpgroups (192 rows) at d64, else two
        consumers = 3 if max(v.d_qk, v.d_v) <= 64 else 2
        assert (v.tile.block_m, v.tile.threads) == (64 * consumers, 128 * (1 + consumers))
        assert "lean_quad_bits" not in src
    else:                     # flash_fwd_fp8_ws.cuh: the same shape, Lean P (flash_fp8_lean.cuh),
        assert ks.body_key(v) == "fp8-ws" and "setmaxnreg" in src and "wgmma_pv_bare" in src
        # three consumer warpgroups (192 rows) at d64, and at d_v = 128 non-causal
        consumers = 3 if v.d_qk == 64 or (v.d_v == 128 and not v.causal) else 2
        assert (v.tile.block_m, v.tile.threads) == (64 * consumers, 128 * (1 + consumers))
        assert "lean_quad_bits" in src


@pytest.mark.parametrize("v", [v for v in SM90 if v.dtype == "bf16"], ids=lambda v: v.name)
def test_bf16_row_sums_by_pv_widen_it_by_eight_columns_of_ones(v):
    """Where the tile takes l from PV (d64, d128: where the ones fit in shared memory), its
    WGMMA is N = d_v + 8 (the columns of the block of ones after each V stage), the accumulator
    one of d_v / 2 + 4, and the shared memory holds a block of ones (block_n x 128 bytes) per
    stage; elsewhere PV is N = d_v and the softmax sums P itself."""
    src = ks.emit(v)
    assert v.tile.pv_row_sums == (v.d_v <= 128 and v.d_qk == v.d_v)
    pv_n = v.d_v + 8 * v.tile.pv_row_sums
    pv = re.search(r"void wgmma_pv\(float \(&d\)\[(\d+)\]", src)
    assert f"m64n{pv_n}k16.f32.bf16.bf16" in src and int(pv.group(1)) == pv_n // 2 and pv_n <= 256
    assert f"constexpr bool kOnesSum = {'true' if v.tile.pv_row_sums else 'false'};" in src
    assert v.tile.dynamic_smem <= catalogue.SM90_MAX_SMEM


@pytest.mark.parametrize("v", [v for v in SM90 if v.dtype == "fp8_e4m3" and not v.f16], ids=lambda v: v.name)
def test_fp8_wgmma_shapes_follow_the_tile_and_head_dims(v):
    src = ks.emit(v)
    n = v.tile.block_n
    assert f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 {{" in src
    # PV in passes of N <= 128, the last one N = its columns + 8 against V^T and the 8 rows of
    # ones after each stage (the rounded row sum in its last 8 columns); d256's first pass N = 128
    pv = re.search(r"void wgmma_pv\(float \(&d\)\[(\d+)\]", src)
    bare = re.search(r"void wgmma_pv_bare\(float \(&d\)\[(\d+)\]", src)
    pv_n = min(v.d_v, 128)
    assert f"m64n{pv_n + 8}k32.f32.e4m3.e4m3" in src and int(pv.group(1)) == (pv_n + 8) // 2
    assert f"m64n{pv_n}k32.f32.e4m3.e4m3" in src and int(bare.group(1)) == pv_n // 2
    assert "m64n8k32" not in src and "wgmma_sum" not in src
    assert "constexpr int kTileVt = (kDv + 8) * kBlockN;" in src
    # one PTX operand per accumulator: N/2 of S, the scale-d predicate after the operands
    qk = re.search(r"void wgmma_qk\(float \(&d\)\[(\d+)\]", src)
    assert int(qk.group(1)) == n // 2


def test_recipe_constants_are_the_models():
    """The folded byte's constants reach the kernel exactly as the model holds them."""
    v = Variant("sm_90a", "fp8_e4m3", 128, 128, False)
    cfg = ks.config(v)
    for name, value in (("kFoldA1", e4m3.QUAD_FOLD_A1), ("kFoldA0", e4m3.QUAD_FOLD_A0)):
        text = re.search(rf"{name} = (\S+)f;", cfg).group(1)
        assert float.fromhex(text) == float(value)                     # exactly, as fp32
        assert struct.unpack("<f", struct.pack("<f", float.fromhex(text)))[0] == float.fromhex(text)
    assert f"kFoldC = {e4m3.QUAD_FOLD_C};" in cfg
    r = fp8_models.RECIPES["sm_90a"]
    assert f"kCode0 = {float(r.c0)!r}f" in cfg and r.block_keys == v.tile.block_n
    # the plain Lean byte in half precision, its w constant with the centring offset, in fp32
    # as the model rounds it
    assert "kByteH2 = true;" in cfg and "kByteQuad = false;" in cfg
    w_bias = float.fromhex(re.search(r"kWBias = (\S+)f;", cfg).group(1))
    assert w_bias == float(np.float32(16 + (r.c0 - e4m3.LEAN_CENTRE) / 8)) and 30.9 < w_bias < 31
    # the correction's constants (for the quad forms), both halves of each b32 the model's f16 bits
    for name, value in (("kH2A", e4m3.QUAD_H2_A), ("kH2NegA", -e4m3.QUAD_H2_A), ("kH2B", e4m3.QUAD_H2_B),
                        ("kH2NegB17", -e4m3.QUAD_H2_B17), ("kH2ZMax", np.float16((r.c0 + 128) / 8))):
        word = int(re.search(rf"{name} = 0x([0-9A-F]{{8}})u;", cfg).group(1), 16)
        half = np.uint16(word & 0xFFFF).view(np.float16)
        assert word >> 16 == word & 0xFFFF and half == np.float16(value)
    assert e4m3.quad_h2_codes(np.float32([(r.c0 + 128) / 8]))[0] == r.c0   # w = z = ZMax: code c0


@pytest.mark.parametrize("dv,causal,two", [(128, True, True), (64, True, True), (128, False, False),
                                           (256, True, False)])
def test_the_diagonal_terms_reach_the_kernel_where_the_recipe_takes_them(dv, causal, two):
    """kDiagHiLo where the recipe's two-term diagonal applies (causal, d_v <= 128; the body
    tests kCausal too), and u's clamp and zero bound exactly as the model holds them."""
    cfg = ks.config(Variant("sm_90a", "fp8_e4m3", 192 if dv == 128 and causal else dv, dv, causal))
    assert f"kDiagHiLo = {'true' if two or not causal and dv <= 128 else 'false'};" in cfg
    u_max = float.fromhex(re.search(r"kExpUMax = (\S+)f;", cfg).group(1))
    assert u_max == float(e4m3.EXP2_U_MAX) == 9 - 2.0 ** -19
    assert float(re.search(r"kExpUZero = (\S+)f;", cfg).group(1)) == float(e4m3.EXP2_U_ZERO) == -7


@pytest.mark.parametrize("name,h2", [("sm_90a/quad", "true"), ("sm_90a/fold", "false")])
def test_the_quadratic_forms_are_still_built_where_the_recipe_names_them(monkeypatch, name, h2):
    monkeypatch.setitem(fp8_models.RECIPES, "sm_90a", fp8_models.RECIPES[name])
    cfg = ks.config(Variant("sm_90a", "fp8_e4m3", 128, 128, False))
    assert f"kByteH2 = {h2};" in cfg and "kByteQuad = true;" in cfg
    assert float.fromhex(re.search(r"kWBias = (\S+)f;", cfg).group(1)) == 31.0


@pytest.mark.parametrize("change", [dict(byte_form="fma"), dict(p_rounding="lean_quad", byte_form="fma"),
                                    dict(block_keys=64),
                                    dict(code_offset=0.0),    # uncentred Lean sums need an LSE offset
                                    dict(diagonal="f16")])    # built, not kept: the body has none
def test_a_recipe_the_body_does_not_implement_is_refused(monkeypatch, change):
    v = Variant("sm_90a", "fp8_e4m3", 128, 128, False)
    other = fp8_models.RECIPES["sm_90a"].replace(**change)
    monkeypatch.setitem(fp8_models.RECIPES, "sm_90a", other)
    with pytest.raises(ValueError, match="the FP8 WGMMA body implements lean bytes in the lean_h2 form"):
        ks.config(v)


@pytest.mark.parametrize("v", SM90, ids=lambda v: v.name)
def test_warp_specialised_register_split_fits_the_launch(v):
    """setmaxnreg only moves registers between warpgroups: the producer's and the consumers'
    counts must fit the pool the CTA is launched with (168 a thread at 384 threads, 128 at
    512), or the consumers' .inc waits forever."""
    src = ks.emit(v)
    prod, cons = map(int, re.search(r"kProducerRegs = (\d+), kConsumerRegs = (\d+);", src).groups())
    consumers = v.tile.threads // 128 - 1
    launch = 65536 // v.tile.threads // 8 * 8
    assert launch == {2: 168, 3: 128}[consumers] and v.tile.block_m == 64 * consumers
    assert prod % 8 == 0 and cons % 8 == 0 and 24 <= prod < launch < cons <= 256
    assert 128 * (prod + consumers * cons) <= v.tile.threads * launch


def test_register_split_refuses_a_tile_it_has_no_split_for():
    from zyfa_runtime.catalogue import Tile
    with pytest.raises(ValueError, match="not 384 threads"):
        ks.register_split(Tile(block_m=192, block_n=128, threads=384, dynamic_smem=0))
    with pytest.raises(ValueError, match="no register split for 4 consumer"):
        ks.register_split(Tile(block_m=256, block_n=128, threads=640, dynamic_smem=0))
