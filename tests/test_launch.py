"""The balanced tail's plan (plan.tail_plan), as the tail kernel reads it; the launches of a
call and which of them are programmatic dependents (launch.assemble, plan.dependent_launches)."""

from types import SimpleNamespace

import numpy as np
import pytest

from zyfa_runtime.catalogue import SPLIT_TAIL_DRAIN_BLOCKS, SPLIT_TAIL_OVERHEAD_BLOCKS, SPLIT_TAIL_SWITCH_BLOCKS
from zyfa_runtime.launch import assemble
from zyfa_runtime.plan import dependent_launches, tail_plan, tail_units

ENTRY = {"tile": {"block_n": 128}, "split_tail": {"overhead_blocks": SPLIT_TAIL_OVERHEAD_BLOCKS,
                                                  "switch_blocks": SPLIT_TAIL_SWITCH_BLOCKS,
                                                  "drain_blocks": SPLIT_TAIL_DRAIN_BLOCKS}}
GAP, RAMP = SPLIT_TAIL_SWITCH_BLOCKS, SPLIT_TAIL_DRAIN_BLOCKS


def plan(tiles, seqlen_k, sms=132, packed=False, mode="auto", dependent=True):
    return tail_plan(ENTRY, {"tile_count": tiles, "seqlen_k": seqlen_k}, sms, packed, mode, dependent)


def whole(tiles):
    return {"tail_first": tiles, "tail_ctas": 0, "tail_gap": 0, "tail_ramp": 0}


def pieces(p, tiles, nb):
    """Tail CTA j's blocks [a, b) of the run, from tail_units (the tail kernel's TailRun)."""
    s = tail_units(p, tiles, nb)
    return list(zip(s[:-1], s[1:]))


def segments(a, b, nb):
    return 0 if b <= a else (b - 1) // nb - a // nb + 1


def test_the_bar_shape_cuts_its_half_wave_into_shares_equal_in_time():
    """2,048 tiles of 64 blocks on 132 SMs: 15 whole waves, then 68 tiles among 132 CTAs of one
    or two segments.  A CTA that goes on to a second tile takes GAP blocks fewer than one that
    does not, and launched as the kernel's dependent the first CTA takes about RAMP blocks more
    than the last; launched plainly every share is equal in time."""
    for dependent, ramp in ((True, RAMP), (False, 0)):
        p = plan(2048, 8192, dependent=dependent)
        assert p == {"tail_first": 1980, "tail_ctas": 132, "tail_gap": GAP, "tail_ramp": ramp}
        ps = pieces(p, 2048, 64)
        assert sum(b - a for a, b in ps) == 68 * 64
        time = [b - a + GAP * (segments(a, b, 64) - 1) for a, b in ps]
        want = [(68 * 68 - GAP) / 132 + ramp * (131 - 2 * j) / 264 for j in range(132)]
        assert max(abs(t - w) for t, w in zip(time, want)) <= GAP + 1   # a share that starts in a gap loses part of it
        assert sum(abs(t - w) <= 1 for t, w in zip(time, want)) >= 120
        assert abs((time[0] - time[-1]) - ramp) <= 2
        assert {segments(a, b, 64) for a, b in ps} == {1, 2}


def test_nothing_is_cut_where_the_model_does_not_gain_or_cannot():
    """Whole waves (no tail), a tile of one block, packed batches (tiles of different lengths),
    ``off``, and 4k tokens, where a CTA's share plus the overhead is not below a tile's blocks
    (B1 H32 S4k lost 2.1 % cut): the kernel takes every tile."""
    for tiles, sk, packed, mode in ((132 * 7, 8192, False, "auto"), (100, 128, False, "always"),
                                    (2048, 8192, True, "always"), (2048, 8192, False, "off"),
                                    (1024, 4096, False, "auto")):
        assert plan(tiles, sk, packed=packed, mode=mode) == whole(tiles)
    # cut anyway: a share of 25 blocks and 4 of a gap leave no room for half the ramp in 32
    assert plan(1024, 4096, mode="always") == {"tail_first": 924, "tail_ctas": 132, "tail_gap": 0, "tail_ramp": 0}
    assert plan(4096, 8192, sms=4096) == whole(4096)   # the kernel's 32-bit unit arithmetic


def test_the_tail_alone_has_no_kernel_to_follow_and_no_ramp():
    """Fewer tiles than SMs (``always``): the tail takes every tile, its CTAs start together."""
    assert plan(100, 8192, mode="always") == {"tail_first": 0, "tail_ctas": 132, "tail_gap": GAP, "tail_ramp": 0}


def test_shares_too_short_for_the_gap_or_the_ramp_are_equal_in_blocks():
    """Where a share is not above its gap and half the ramp (a CTA could get no block), or a tile
    is too short to hold a share and half the ramp (a third segment), the plan drops both."""
    assert plan(133, 128 * 9, mode="always") == {"tail_first": 132, "tail_ctas": 9, "tail_gap": 0, "tail_ramp": 0}
    assert plan(132 + 131, 128 * 14, mode="always") == {"tail_first": 132, "tail_ctas": 132, "tail_gap": 0,
                                                         "tail_ramp": 0}   # q + 2 + 6 = 21 > 14
    assert plan(132 + 66, 128 * 40, mode="always")["tail_gap"] == GAP      # 21 + 2 + 6 <= 40


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="ZYFA_SPLIT_TAIL"):
        plan(2048, 8192, mode="sometimes")


@pytest.mark.parametrize("seed", range(4))
def test_every_plan_gives_each_tail_block_to_one_piece_and_no_piece_more_than_a_tile(seed):
    """Over random launches (tiles, keys, SMs, modes, dependent or not): the kernel's tiles and
    the pieces cover every block of every tile once; no share is empty or longer than a tile, so
    a tail CTA has one segment or two (the tail kernel takes no third); at most min(SMs, blocks)
    CTAs."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        sms = int(rng.integers(1, 200))
        tiles = int(rng.integers(1, 3000))
        sk = int(rng.integers(1, 40000))
        p = plan(tiles, sk, sms=sms, mode=str(rng.choice(["auto", "always"])), dependent=bool(rng.integers(2)))
        nb = -(-sk // 128)
        first, ctas = p["tail_first"], p["tail_ctas"]
        if ctas == 0:
            assert p == whole(tiles)
            continue
        assert 0 <= first < tiles and (tiles - first) < sms and first % sms == 0
        assert ctas <= min(sms, (tiles - first) * nb)
        covered = np.zeros((tiles - first) * nb, np.int32)
        for a, b in pieces(p, tiles, nb):
            assert 0 < b - a <= nb
            assert segments(a, b, nb) <= 2                 # within two tiles
            covered[a:b] += 1
        assert (covered == 1).all()


def device_pieces(p, tiles, nb):
    """The cut as the tail kernel computes it, in 32 bits (TailRun): cost = q ctas + r units,
    CTA j's first unit j q + (2 j r + ramp j (ctas - j)) / (2 ctas), its first block the first
    whose unit is at or past it, and the CTA of block x by a binary search; every intermediate
    value checked to stay below 2^32."""
    ctas, gap, ramp = p["tail_ctas"], p["tail_gap"], p["tail_ramp"]
    cost = (tiles - p["tail_first"]) * (nb + gap) - gap
    assert cost < 2**31
    q, r = divmod(cost, ctas)

    def u32(x):
        assert 0 <= x < 2**32
        return x

    def unit_start(j):
        return u32(u32(j * q) + u32(u32(2 * j * r) + u32(ramp * j * (ctas - j))) // (2 * ctas))

    def start(j):
        s = unit_start(j)
        u = s // (nb + gap)
        return u32(u * nb + min(s - u * (nb + gap), nb))

    def cta_of(x):
        y = u32(x + x // nb * gap)
        lo, hi = 0, ctas - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if unit_start(mid) <= y else (lo, mid - 1)
        return lo

    return start, cta_of


@pytest.mark.parametrize("seed", range(2))
def test_the_tail_kernels_32_bit_arithmetic_cuts_as_the_plan_says(seed):
    """Over random plans that cut, and the largest the plan allows: the tail kernel's start(j)
    is the plan's and its cta_of(x) the CTA whose blocks hold x, with no 32-bit overflow; a run
    of 2^31 units or more is not cut."""
    rng = np.random.default_rng(100 + seed)
    cases = [(2048, 8192, 132, True), (131, (2**31 - 1) // 140, 132, True), (131, (2**31 - 1) // 132, 132, False)]
    for _ in range(300):
        cases.append((int(rng.integers(1, 3000)), int(rng.integers(1, 40000)), int(rng.integers(1, 200)),
                      bool(rng.integers(2))))
    for tiles, sk, sms, dependent in cases:
        p = plan(tiles, sk, sms=sms, mode="always", dependent=dependent)
        if p["tail_ctas"] == 0:
            continue
        nb = -(-sk // 128)
        start, cta_of = device_pieces(p, tiles, nb)
        ref = pieces(p, tiles, nb)
        assert [start(j) for j in range(p["tail_ctas"])] == [a for a, _ in ref]
        for x in {0, (tiles - p["tail_first"]) * nb - 1, *map(int, rng.integers(0, (tiles - p["tail_first"]) * nb, 20))}:
            j = cta_of(x)
            assert ref[j][0] <= x < ref[j][1]
    assert plan(132 + 131, 2**31 - 128, sms=132, mode="always") == whole(263)   # 131 x 2^24 blocks


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
