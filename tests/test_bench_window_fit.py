"""bench/window_fit.py's counts and fit, without a GPU."""

import math

from bench import window_fit


def test_a_tile_visits_the_blocks_its_window_meets():
    # BF16 d128 serving: tiles of 128 rows, blocks of 128 keys.  Window 256, causal, 1,024
    # tokens: tile i sees keys from 128 i - 255 on, blocks i - 2 .. i (tiles 0 and 1: 1 and 2).
    blocks, tiles = window_fit.visits((1, 1024, 2, 1, 128), True, "bf16", (255, 0))
    assert (blocks, tiles) == (2 * (1 + 2 + 3 * 6), 2 * 8)
    # no window: the causal triangle, tile i blocks 0 .. i
    assert window_fit.visits((1, 1024, 2, 1, 128), True, "bf16", (-1, -1)) == (2 * 36, 16)


def test_the_fit_returns_the_block_and_tile_costs_the_rows_were_made_of():
    t_block, f, sms = 1.5, 4.0, 132
    shape = [2, 8192, 32, 8, 128]
    rows = []
    for w in (1024, 2048, 4096):
        nb, nt = window_fit.visits(shape, True, "fp8", (w - 1, 0))
        rows.append({"shape": shape, "causal": True, "impl": f"zyfa fp8 window {w}",
                     "features": {"window_size": [w - 1, 0]}, "median_ms": (nb * t_block + nt * f) / sms / 1e3})
    rows.append(dict(rows[0], impl="zyfa fp8 dense", features={}))        # not a window row
    rows.append(dict(rows[1], impl="zyfa fp8 window 9", wrong=True))      # a wrong row is not fitted
    [r] = window_fit.fits({"rows": rows}, sms)
    assert r["windows"] == 3 and r["dtype"] == "fp8"
    assert math.isclose(r["t_block_us"], t_block, rel_tol=1e-9) and math.isclose(r["f_us"], f, rel_tol=1e-9)
    assert math.isclose(r["f_blocks"], f / t_block, rel_tol=1e-9) and r["worst_residual"] < 1e-9
    assert "| 2x8192x32x8x128 | fp8 | 3 | 1.500 | 4.00 | 2.67 | 0.0 % |" in window_fit.markdown([r], sms)
