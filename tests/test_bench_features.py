"""bench/features.py's counts and table, without a GPU."""

import math

from bench import features


def test_the_window_counts_each_querys_newest_keys_itself_included():
    s, w = 1000, 64
    assert features.pair_count(s, s, True, (-1, -1)) == s * (s + 1) // 2
    assert features.pair_count(s, s, True, (w - 1, 0)) == sum(min(i + 1, w) for i in range(s))
    assert features.pair_count(s, s, False, (-1, -1)) == s * s


def test_the_table_reports_timed_refused_and_wrong_rows():
    row = {"shape": [1, 4096, 32, 8, 128], "impl": "zyfa bf16 dense", "median_ms": 1.0,
           "tflops_window": 500.0, "tflops_all": 500.0, "vs_dense": 1.0, "rel_err": 1e-3}
    data = {"device": "GPU", "rows": [row, dict(row, impl="zyfa fp8 sinks", refused="ValueError: no sinks"),
                                      dict(row, impl="cudnn bf16 window 64", wrong=True, rel_err=0.5)]}
    text = features.markdown(data)
    assert "| 1x4096x32x8x128 | zyfa bf16 dense | 1000.0 | 500.0 | 500.0 | 1.000 | 1.00e-03 |" in text
    assert "ValueError: no sinks" in text and "wrong: rel err 0.5" in text
    assert math.isclose(features.flops(1, 32, 128, 10), 2 * 32 * 10 * 256)
