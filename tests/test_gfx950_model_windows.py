"""The cycle model's windowed launches (bench/gfx950_model.py): the key tiles it charges each
query block are those the kernel visits under zyfa_runtime/window.py's rule, and the FLOPs
it counts inside a window are exactly the visible (query, key) pairs.  Pure enumeration, no
emulator."""

import numpy as np
import pytest

from tests.backends import using_backend
from zyfa_runtime import window as windows
from zyfa_runtime.catalogue import Variant


@pytest.fixture(scope="module")
def model():
    # the emulator named, not left to the environment: the model sets ZYFA_BACKEND only where
    # nothing had (at its first import), and a test of another file may have imported it
    # inside a backend of its own, since restored
    from bench import gfx950_model
    with using_backend("emulator"):
        yield gfx950_model


VARIANTS = [Variant("gfx950", "bf16", 64, 64, c) for c in (False, True)] + \
           [Variant("gfx950", "bf16", 128, 128, True)]
#: (Sq, Sk, window as a call passes it): left and right edges inside tiles and on tile
#: boundaries, rows without keys (Sq > Sk causal, a window ending before key 0), ragged ends.
CASES = [(512, 512, (-1, -1)), (512, 512, (127, 0)), (512, 512, (128, 5)), (700, 700, (300, -1)),
         (300, 1000, (-1, 130)), (1000, 300, (50, 0)), (513, 777, (0, 0)), (640, 384, (10, -1)),
         (256, 1024, (1023, 1023)), (384, 640, (1, 200))]


def _block_masks(model, v, sq, sk, window_size):
    """Per query block: the kernel's visited tiles and the block's rows of window.visible."""
    bm, bn = v.tile.block_m, v.tile.block_n
    seen = windows.visible(sq, sk, windows.normalize(v.causal, window_size))
    for (t0, n), m0 in zip(model.visited_tiles(v, sq, sk, window_size), range(0, sq, bm)):
        rows = seen[m0:m0 + bm]
        tiles_seen = {j // bn for j in np.flatnonzero(rows.any(axis=0))}
        yield set(range(t0, t0 + n)), tiles_seen


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("sq,sk,window_size", CASES)
def test_every_visible_pair_lies_in_a_visited_tile_and_no_visited_tile_is_wholly_outside(
        model, v, sq, sk, window_size):
    if v.causal and window_size[1] not in (-1, 0):
        window_size = (window_size[0], 0)   # causal calls take right 0 (validate.check_window)
    blocks = list(_block_masks(model, v, sq, sk, window_size))
    assert len(blocks) == -(-sq // v.tile.block_m)
    for visited, needed in blocks:
        assert needed <= visited, f"visible keys in tiles {sorted(needed - visited)} never loaded"
        assert visited <= needed, f"tiles {sorted(visited - needed)} loaded with no visible key"


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_without_a_window_the_tiles_are_the_plain_kernels_all_or_up_to_the_diagonal(model, v):
    from zyfa_emulator import cycles
    t = v.tile
    for sq, sk in ((512, 512), (1000, 300), (300, 1000), (4096, 4096)):
        got = model.grid_tiles(v, 2, 3, sq, sk)
        blocks = -(-sq // t.block_m)
        per_block = [cycles.kv_tiles(b * t.block_m, (b + 1) * t.block_m, sq, sk, t.block_n,
                                     v.causal) for b in range(blocks)]
        assert sorted(got) == sorted(per_block * 6)


def test_a_window_that_cuts_no_key_is_charged_as_the_plain_launch(model):
    v = Variant("gfx950", "bf16", 128, 128, True)
    assert model.launch_window(v, (8191, 0), 4096, 4096) == (-1, 0)
    plain = model.grid_tiles(v, 1, 4, 4096, 4096)
    assert model.grid_tiles(v, 1, 4, 4096, 4096, (8191, 0)) == plain
    assert sum(model.grid_tiles(v, 1, 4, 4096, 4096, (1023, 0))) < sum(plain)


@pytest.mark.parametrize("sq,sk,window_size", CASES)
@pytest.mark.parametrize("causal", (False, True))
def test_in_window_flops_are_two_d_qk_plus_d_v_a_visible_pair(model, sq, sk, window_size, causal):
    if causal and window_size[1] not in (-1, 0):
        window_size = (window_size[0], 0)
    v = Variant("gfx950", "bf16", 128, 128, causal)
    pairs = int(windows.visible(sq, sk, windows.normalize(causal, window_size)).sum())
    assert windows.visible_count(sq, sk, windows.normalize(causal, window_size)) == pairs
    assert model.window_flops(v, 2, 3, sq, sk, window_size) == 2 * 3 * pairs * 2 * (128 + 128)


def test_dense_causal_in_window_flops_count_the_diagonal_exactly(model):
    v = Variant("gfx950", "bf16", 64, 64, True)
    s = 1000
    assert model.window_flops(v, 1, 1, s, s) == s * (s + 1) // 2 * 2 * 128


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("window_size", [(4095, 0), (1023, 0), (16383, 0), (5000, 3000), (100, -1)])
def test_the_traced_window_cuts_its_trace_at_the_launchs_edge_offsets(model, v, window_size):
    """The cost of a windowed launch is traced at a shorter shape; the window fitted into it
    must still cut (the features' loop runs, edge tiles masked) and cut each tile at the
    same key offset as the launch's bound does."""
    win = windows.normalize(v.causal, window_size)
    shape, traced = model.trace_setup(v, model.Features(window=win))
    tw = traced.window
    sq, sk = shape["seqlen_q"], shape["seqlen_k"]
    assert windows.reduce(tw, sq, sk) == tw, "a bound of the traced window cuts nothing"
    bn = v.tile.block_n
    for got, want in zip(tw, win):
        assert (got < 0) == (want < 0) and got % bn == want % bn
    blocks = model.visited_tiles(v, sq, sk, tw)
    assert any(t0 > 0 for t0, _ in blocks), "no traced workgroup starts at its left edge"
    if win[0] >= 1023:   # wide windows: most traced workgroups loop long enough for a period
        assert 2 * sum(n >= 8 for _, n in blocks) > len(blocks), blocks


def test_softcap_and_sinks_alone_are_traced_at_the_plain_shape(model):
    v = Variant("gfx950", "bf16", 128, 128, True)
    for f in (model.Features(softcap=30.0), model.Features(sinks=True)):
        shape, traced = model.trace_setup(v, f)
        assert shape == model.cost_shape(v) and traced == f


def _mfma_pcs(tr):
    return {i.pc for wg in tr.workgroups for t in wg for i in t.insts
            if i.name.startswith("v_mfma")}


@pytest.mark.slow
@pytest.mark.parametrize("v,window_size", [(Variant("gfx950", "bf16", 128, 128, True), (4095, 0)),
                                           (Variant("gfx950", "bf16", 64, 64, False), (1023, 300))],
                         ids=("d128_causal", "d64_full"))
def test_the_traced_kernel_loads_exactly_the_tiles_the_model_charges_in_the_features_loop(
        model, v, window_size):
    """On the emulator, each traced workgroup issues one K and one V tile copy (16-byte loads,
    a wave's 64 lanes a kilobyte: block_n (d_qk + d_v) 2 / 1024 loads) for each tile
    ``traced_tiles`` gives it -- and at d64, whose copy of tile t + 1 is spread over S(t)'s
    softmax with no branch a piece (hip/flash_fwd.hip, kSpread), one tile more: the pieces past
    the last tile fill the free buffer with keys no wave reads --, and its matrix instructions
    are the features' loop's, none of the plain loop's; a softcap above 50 alone runs the
    features' loop too, one of 50 or less a loop of its own (against a fixed max:
    docs/gfx950_bf16.md), sinks alone the plain one."""
    win = windows.normalize(v.causal, window_size)
    runs = {}
    for f in (model.PLAIN, model.Features(window=win), model.Features(softcap=30.0),
              model.Features(softcap=100.0), model.Features(sinks=True)):
        shape, traced = model.trace_setup(v, f)
        tr = runs[f] = model._trace_cached(v, f)
        tiles = model.traced_tiles(v, tr.keys, shape["seqlen_q"], shape["seqlen_k"], traced.window)
        per_tile = v.tile.block_n * (v.d_qk + v.d_v) * 2 // 1024
        loads = [sum(i.name == "buffer_load_dwordx4" for t in wg for i in t.insts)
                 for wg in tr.workgroups]
        spread = v.d_qk == v.d_v == 64
        assert loads == [per_tile * (n + (spread and n > 0)) for n in tiles]
    plain, window_run, fixed_cap_run, softcap_run, sinks_run = runs.values()
    assert _mfma_pcs(window_run) and not _mfma_pcs(window_run) & _mfma_pcs(plain)
    assert _mfma_pcs(softcap_run) == _mfma_pcs(window_run)
    fixed_cap = _mfma_pcs(fixed_cap_run)
    assert fixed_cap and not fixed_cap & (_mfma_pcs(plain) | _mfma_pcs(window_run))
    assert _mfma_pcs(sinks_run) == _mfma_pcs(plain)
