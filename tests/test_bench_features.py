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


def test_rows_are_timed_in_rotating_rounds_and_compared_with_the_same_rounds_dense(monkeypatch):
    """--rounds: each round times every row in turn, starting one row later each round; a row
    reports the median of its rounds, and vs dense the median of its ratios to the dense row of
    the same round (so a clock drift between rounds moves both alike)."""
    import types

    from bench import peers
    order, ms = [], {"dense": [10.0, 20.0, 10.0], "paged 16": [10.5, 21.0, 30.0]}
    seen = {"dense": 0, "paged 16": 0}

    def fake_time_call(call, min_s, warm_s, sampler):
        name = call()
        order.append(name)
        t = ms[name][seen[name]]
        seen[name] += 1
        return {"median_ms": t, "min_ms": t, "max_ms": t, "calls": 10}
    monkeypatch.setattr(peers, "time_call", fake_time_call)
    rows = [{"impl": f"zyfa fp8 {n}", "rel_err": 1e-3, "flops_window": 100.0} for n in ms]
    timed = [(row, lambda n=n: n) for row, n in zip(rows, ms)]
    features.time_rows(timed, 100.0, types.SimpleNamespace(rounds=3, min_s=0.1, warm_s=0.1), None)
    assert order == ["dense", "paged 16", "paged 16", "dense", "dense", "paged 16"]
    assert rows[0]["vs_dense"] == 1.0 and rows[0]["median_ms"] == 10.0
    assert rows[1]["round_vs_dense"] == [10.0 / 10.5, 20.0 / 21.0, 10.0 / 30.0]
    assert rows[1]["vs_dense"] == 20.0 / 21.0 and rows[1]["median_ms"] == 21.0
