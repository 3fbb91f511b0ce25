"""zyfa_runtime/launch.py: the balanced tail's plan (tail_plan), as the tail kernel reads it."""

import numpy as np
import pytest

from zyfa_runtime.catalogue import SPLIT_TAIL_OVERHEAD_BLOCKS
from zyfa_runtime.launch import tail_plan

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



def device_pieces(tiles, nb, first, ctas):
    """The same cut as the tail kernel computes it, in 32 bits: total = q ctas + r, start(j) =
    j q + j r / ctas, and the CTA of block x found from x / (q + 1) upwards (TailRun); every
    product checked to stay below 2^32."""
    total = (tiles - first) * nb
    q, r = divmod(total, ctas)

    def start(j):
        assert j * q < 2**32 and j * r < 2**32
        return j * q + j * r // ctas

    def cta_of(x):
        j, steps = x // (q + 1), 0
        while j + 1 < ctas and start(j + 1) <= x:
            j, steps = j + 1, steps + 1
        assert steps <= ctas // max(q, 1) + 1
        return j

    return start, cta_of


@pytest.mark.parametrize("seed", range(2))
def test_the_tail_kernels_32_bit_arithmetic_cuts_as_the_plan_says(seed):
    """Over random plans that cut, and the largest the plan allows: the tail kernel's start(j)
    is floor(j U nb / ctas) and its cta_of(x) the CTA whose blocks hold x, with no 32-bit
    overflow; a run of 2^31 blocks or more is not cut."""
    rng = np.random.default_rng(100 + seed)
    cases = [(2048, 8192, 132), (131, (2**31 - 1) // 131, 132)]
    for _ in range(300):
        cases.append((int(rng.integers(1, 3000)), int(rng.integers(1, 40000)), int(rng.integers(1, 200))))
    for tiles, sk, sms in cases:
        p = plan(tiles, sk, sms=sms, mode="always")
        first, ctas = p["tail_first"], p["tail_ctas"]
        if ctas == 0:
            continue
        nb = -(-sk // 128)
        assert (tiles - first) * nb < 2**31
        start, cta_of = device_pieces(tiles, nb, first, ctas)
        ref = pieces(tiles, nb, first, ctas)
        assert [start(j) for j in range(ctas)] == [a for a, _ in ref]
        for x in {0, (tiles - first) * nb - 1, *map(int, rng.integers(0, (tiles - first) * nb, 20))}:
            j = cta_of(x)
            assert ref[j][0] <= x < ref[j][1]
    assert plan(132 + 131, 2**31 - 128, sms=132, mode="always")["tail_ctas"] == 0   # 131 x 2^24 blocks
