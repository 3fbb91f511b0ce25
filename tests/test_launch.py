"""zyfa_runtime/launch.py: the balanced tail's plan (tail_plan), as the tail kernel reads it;
the launches of a call and which of them are programmatic dependents (assemble)."""

from types import SimpleNamespace

import numpy as np
import pytest

from zyfa_runtime.catalogue import SPLIT_TAIL_OVERHEAD_BLOCKS
from zyfa_runtime.launch import assemble, dependent_launches, tail_plan

ENTRY = {"tile": {"block_n": 128}, "split_tail": {"overhead_blocks": SPLIT_TAIL_OVERHEAD_BLOCKS}}


def plan(tiles, seqlen_k, sms=132, packed=False, mode="auto"):
    return tail_plan(ENTRY, {"tile_count": tiles, "seqlen_k": seqlen_k}, sms, packed, mode)


def pieces(tiles, nb, first, ctas):
    """Tail CTA j's blocks, as the tail kernel cuts them: [floor(j U nb / ctas), floor((j + 1) U nb / ctas))."""
    total = (tiles - first) * nb
    return [(j * total // ctas, (j + 1) * total // ctas) for j in range(ctas)]


def test_the_bar_shape_cuts_its_half_wave_into_a_piece_an_sm():
    """2,048 tiles of 64 blocks on 132 SMs: 15 whole waves, then 68 tiles in 132 pieces of
    32-33 blocks, each within two tiles."""
    p = plan(2048, 8192)
    assert p == {"tail_first": 1980, "tail_ctas": 132}
    sizes = [b - a for a, b in pieces(2048, 64, **{"first": 1980, "ctas": 132})]
    assert set(sizes) == {32, 33} and sum(sizes) == 68 * 64


def test_nothing_is_cut_where_the_model_does_not_gain_or_cannot():
    """Whole waves (no tail), a tile of one block, packed batches (tiles of different lengths),
    ``off``, and 4k tokens, where a CTA's share plus the overhead is not below a tile's blocks
    (B1 H32 S4k lost 2.1 % cut): the kernel takes every tile."""
    for tiles, sk, packed, mode in ((132 * 7, 8192, False, "auto"), (100, 128, False, "always"),
                                    (2048, 8192, True, "always"), (2048, 8192, False, "off"),
                                    (1024, 4096, False, "auto")):
        assert plan(tiles, sk, packed=packed, mode=mode) == {"tail_first": tiles, "tail_ctas": 0}
    assert plan(1024, 4096, mode="always") == {"tail_first": 924, "tail_ctas": 132}


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="ZYFA_SPLIT_TAIL"):
        plan(2048, 8192, mode="sometimes")


@pytest.mark.parametrize("seed", range(4))
def test_every_plan_gives_each_tail_block_to_one_piece_and_no_piece_more_than_a_tile(seed):
    """Over random launches (tiles, keys, SMs, modes): the kernel's tiles and the pieces cover
    every block of every tile once; no piece is empty or longer than a tile, so a tail CTA has
    one segment or two (the tail kernel takes no third); at most min(SMs, blocks) CTAs."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        sms = int(rng.integers(1, 200))
        tiles = int(rng.integers(1, 3000))
        sk = int(rng.integers(1, 40000))
        p = plan(tiles, sk, sms=sms, mode=str(rng.choice(["auto", "always"])))
        nb = -(-sk // 128)
        first, ctas = p["tail_first"], p["tail_ctas"]
        if ctas == 0:
            assert first == tiles
            continue
        assert 0 <= first < tiles and (tiles - first) < sms and first % sms == 0
        assert ctas <= min(sms, (tiles - first) * nb)
        covered = np.zeros((tiles - first) * nb, np.int32)
        for a, b in pieces(tiles, nb, first, ctas):
            assert 0 < b - a <= nb
            assert (b - 1) // nb - a // nb <= 1            # within two tiles
            covered[a:b] += 1
        assert (covered == 1).all()



# -- the launches of a call ---------------------------------------------------------------------

def kernel(dependent_launch=True):
    entry = {"block_size": 384, "dynamic_smem": 1024, "prepass": {"block_size": 128}}
    if dependent_launch:
        entry["dependent_launch"] = True
    return SimpleNamespace(entry=entry, function="kernel", tail="tail", prepass="prepass")


def launched(grids, dependent=True, dependent_launch=True):
    return [(ln.function, ln.dependent) for ln in assemble(kernel(dependent_launch), grids, b"args", dependent)]


PRE, MAIN, TAIL = (64, 16, 2), (1980, 1, 1), (132, 1, 1)


def test_the_kernel_follows_its_pre_pass_and_the_tail_the_kernel_as_dependents():
    """Pre-pass, kernel, tail: the call's first launch plain (it follows the stream's earlier
    work), the kernel its pre-pass's dependent, the tail the kernel's."""
    assert launched((PRE, MAIN, TAIL)) == [("prepass", False), ("kernel", True), ("tail", True)]
    assert launched((PRE, MAIN, None)) == [("prepass", False), ("kernel", True)]


def test_no_launch_is_dependent_where_switched_off_or_the_manifest_does_not_allow_it():
    for kw in ({"dependent": False}, {"dependent_launch": False}):
        assert launched((PRE, MAIN, TAIL), **kw) == [("prepass", False), ("kernel", False), ("tail", False)]


def test_a_launch_is_dependent_only_on_the_launch_it_was_written_to_follow():
    """Where the tail takes every tile the kernel is not launched, and the tail, which reads the
    pre-pass's V^T without waiting for the launch before it, starts after the pre-pass ends;
    with no pre-pass CTA (no keys) the kernel is the call's first launch."""
    assert launched((PRE, (0, 1, 1), TAIL)) == [("prepass", False), ("tail", False)]
    assert launched(((0, 16, 2), MAIN, TAIL)) == [("kernel", False), ("tail", True)]


def test_a_call_with_no_kernel_or_tail_cta_launches_nothing():
    assert launched((PRE, (0, 1, 1), None)) == []
    assert launched((PRE, (0, 16, 2), (0, 1, 1))) == []


def test_an_unknown_dependent_launch_mode_is_refused():
    assert dependent_launches("on") and not dependent_launches("off")
    with pytest.raises(ValueError, match="ZYFA_DEPENDENT_LAUNCH"):
        dependent_launches("yes")
