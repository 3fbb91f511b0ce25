"""bench/peers.py on any machine: SmolLM2's activations tiled to a benchmark shape keep each
query head with the key/value head it was computed against, derive head dim 128 as the
accuracy study does and refuse head dims they cannot provide; the bar is the fastest peer
measured in the run or carried into it from the H200 anchors."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("peers", ROOT / "bench" / "peers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod      # dataclasses resolve the module's annotations through it
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def real():
    rng = np.random.default_rng(0)   # the shapes of a capture: 2 layers, 40 tokens, 9 / 3 heads
    return {"q": rng.standard_normal((2, 40, 9, 64)).astype(np.float16),
            "k": rng.standard_normal((2, 40, 3, 64)).astype(np.float16),
            "v": rng.standard_normal((2, 40, 3, 64)).astype(np.float16)}


def test_captured_heads_are_reproduced_at_their_own_shape(peers, real):
    q, k, v = peers.tile_real(real, (1, 9, 3, 40, 64, 64))
    assert np.array_equal(q[0], real["q"][0].astype(np.float32))
    assert np.array_equal(k[0], real["k"][0].astype(np.float32))
    assert np.array_equal(v[0], real["v"][0].astype(np.float32))


def test_query_heads_keep_their_key_value_head(peers, real):
    q, k, _ = peers.tile_real(real, (2, 32, 8, 100, 64, 64))
    for b in range(2):
        for h in range(32):
            j = h // 4
            layer, c = (j // 3 + b) % 2, j % 3
            assert np.array_equal(k[b, :40, j], real["k"][layer, :, c].astype(np.float32))
            assert np.array_equal(q[b, :40, h], real["q"][layer, :, c * 3 + h % 3].astype(np.float32))
    assert np.array_equal(q[:, 40:80], q[:, :40])     # sequences repeat the captured tokens
    assert np.array_equal(q[:, 80:], q[:, :20])


def test_head_dim_128_is_the_derived_pair(peers, real):
    q, k, v = peers.tile_real(real, (1, 3, 1, 40, 128, 128))
    assert np.array_equal(k[0, :, 0], np.concatenate([real["k"][0, :, 0], real["k"][0, :, 1]], -1))
    assert np.array_equal(q[0, :, 2], np.concatenate([real["q"][0, :, 2], real["q"][0, :, 5]], -1))


@pytest.mark.parametrize("dims", [(256, 256), (192, 128)])
def test_other_head_dims_have_no_real_inputs(peers, real, dims):
    with pytest.raises(ValueError, match="no real inputs"):
        peers.tile_real(real, (1, 16, 16, 64, *dims))


def _point(shape, causal, **impls):
    ok = lambda v: v if isinstance(v, dict) else {"status": "ok", "tflops": v}   # noqa: E731
    return {"shape": dict(zip(("B", "Hq", "Hkv", "S", "d_qk", "d_v"), shape)), "label": "x",
            "causal": causal, "impls": {n: ok(v) for n, v in impls.items()}}


D256 = (2, 16, 16, 8192, 256, 256)
D128 = (1, 32, 8, 16384, 128, 128)
MISSING = {"status": "missing", "reason": "test"}


def test_fa3_is_bridged_through_this_runs_cudnn_fp8_graph(peers):
    """FA3's FP8 figure moves with the cuDNN FP8 graph timed in its own pass: a run whose graph is
    5 % slower than there lowers FA3's bar by 5 %."""
    there = dict((i, t) for a in peers.ANCHORS[D256][True] if a.peer == "FA3 FP8" for i, t in a.bridges)
    point = _point(D256, True, cudnn_fe_fp8=there["cudnn_fe_fp8"] * 0.95, sdpa_cudnn=601 * 1.2)
    peer, value, how = peers.bar(point, "fp8")
    assert peer == "FA3 FP8" and value == pytest.approx(1063.0 * 0.95) and "cudnn_fe_fp8" in how


def test_without_the_frontend_fa3_is_bridged_through_sdpa(peers):
    """A run that could not time the cuDNN FP8 graph carries FA3 through torch SDPA's cuDNN,
    as the anchors' own runs measured it."""
    point = _point(D256, True, cudnn_fe_fp8=MISSING, sdpa_cudnn=601 * 1.1)
    peer, value, how = peers.bar(point, "fp8")
    assert peer == "FA3 FP8" and value == pytest.approx(1063.0 * 1.1) and "sdpa_cudnn" in how


def test_a_peer_measured_in_the_run_replaces_its_anchor(peers):
    """cuDNN FP8 measured here sets the bar at its own figure, not the anchor's bridged one,
    even where the bridge would have put it higher."""
    point = _point(D128, False, cudnn_fe_fp8=900.0, sdpa_cudnn=613 * 1.2, triton_fp8=500.0)
    assert peers.bar(point, "fp8") == ("cudnn_fe_fp8", 900.0, "measured")
    point = _point(D128, False, cudnn_fe_fp8=950.0, sdpa_cudnn=613.0)
    assert peers.bar(point, "fp8")[:2] == ("cudnn_fe_fp8", 950.0)


def test_bf16_bar_is_the_fastest_of_measured_and_bridged(peers):
    point = _point(D128, True, sdpa_cudnn=573.0, cudnn_fe_bf16=700.0, sdpa_flash=300.0)
    assert peers.bar(point, "bf16") == ("cudnn_fe_bf16", 700.0, "measured")
    point = _point(D128, True, sdpa_cudnn=573.0, cudnn_fe_bf16=MISSING)
    assert peers.bar(point, "bf16")[:2] == ("FA3", pytest.approx(658.0))


def test_a_shape_without_anchors_is_judged_on_the_run_alone(peers):
    point = _point((1, 8, 8, 1024, 128, 128), False, cudnn_fe_fp8=MISSING, sdpa_cudnn=500.0)
    assert peers.bar(point, "fp8") is None
    assert peers.bar(point, "bf16") == ("sdpa_cudnn", 500.0, "measured")


def test_the_bar_table_gives_zyfa_against_the_bar(peers):
    point = _point(D128, False, cudnn_fe_fp8=900.0, zyfa_fp8=990.0, zyfa_bf16=MISSING, sdpa_cudnn=613.0)
    row = peers.bar_table({"points": [point]})[-1]
    assert "cudnn_fe_fp8 900 (measured) | 990 (1.10x)" in row and row.endswith("| missing |")


def test_fp8_accuracy_is_compared_with_bf16_output_peers_only(peers):
    """The cuDNN FP8 graph's e4m3 output does not set the accuracy bar (zyfa writes bf16); a
    peer whose output held NaN does not either."""
    err = lambda e, **kw: dict({"status": "ok", "tflops": 1.0, "rel_err": e}, **kw)   # noqa: E731
    point = _point(D128, False, zyfa_fp8=err(1.0e-2), triton_fp8=err(2.5e-2),
                   cudnn_fe_fp8=err(1.0e-3, output="e4m3"))
    row = peers.accuracy_table({"points": [point]})[-1]
    assert "triton_fp8 2.50e-02" in row and row.endswith("| 0.40 |")
    point["impls"]["triton_fp8"]["nan_count"] = 3
    assert peers.accuracy_table({"points": [point]}) == []


def test_a_run_records_the_code_objects_it_loads(peers, tmp_path, monkeypatch):
    """results.json names every built sm_90a code object by its sha256 (from the manifest the
    runtime reads), so a run is tied to the kernels it timed, not only to a commit label."""
    import json
    kernel = {"name": "fwd_sm_90a_bf16_d64x64_full", "sha256": "ab" * 32, "built": True,
              "variant": {"arch": "sm_90a"}}
    other = dict(kernel, name="fwd_gfx950_bf16_d64x64_full", variant={"arch": "gfx950"})
    unbuilt = dict(kernel, name="fwd_sm_90a_bf16_d64x64_causal", built=False)
    manifest = {"format": 1, "package_version": "0.1.0", "toolkits": {}, "compilers": {},
                "kernels": [kernel, other, unbuilt]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("ZYFA_PREBUILT_DIR", str(tmp_path))
    assert peers.code_objects() == {"fwd_sm_90a_bf16_d64x64_full": "ab" * 32}
    monkeypatch.setenv("ZYFA_PREBUILT_DIR", str(tmp_path / "missing"))
    assert "error" in peers.code_objects()


def test_power_is_reported_only_for_windows_the_sensor_follows(peers):
    """A short window's samples read a fraction of the power (the board's reading lags): no W or
    TFLOP/J there; a long one takes W from the energy counter, else from the samples."""
    short = {"window_s": 0.2, "power_w": 190.0, "power_w_energy": 640.0}
    assert peers.energy_metrics(633.0, short) == {"watts": None, "tflop_per_j": None}
    long = {"window_s": peers.POWER_MIN_WINDOW_S + 8, "power_w": 665.0, "power_w_energy": 692.0}
    got = peers.energy_metrics(626.0, long)
    assert got["watts"] == 692.0 and got["tflop_per_j"] == pytest.approx(626.0 / 692.0)
    no_counter = {"window_s": 10.0, "power_w": 665.0}
    assert peers.energy_metrics(626.0, no_counter)["watts"] == 665.0
    assert peers.energy_metrics(626.0, {"window_s": 10.0}) == {"watts": None, "tflop_per_j": None}


def test_rounds_combine_to_their_medians(peers):
    """A point's timed rounds report the median round (one slow round moves nothing), the
    calls of all of them and the extremes of any."""
    rounds = [{"calls": 10, "median_ms": 2.0, "min_ms": 1.9, "max_ms": 2.2, "window_s": 0.21, "sm_clock_mhz": 1700.0},
              {"calls": 12, "median_ms": 3.0, "min_ms": 2.8, "max_ms": 3.5, "window_s": 0.25, "sm_clock_mhz": 1500.0},
              {"calls": 11, "median_ms": 2.1, "min_ms": 2.0, "max_ms": 2.4, "window_s": 0.22, "sm_clock_mhz": 1650.0}]
    got = peers.combine_rounds(rounds)
    assert got["median_ms"] == 2.1 and got["sm_clock_mhz"] == 1650.0 and got["window_s"] == 0.22
    assert got["calls"] == 33 and got["min_ms"] == 1.9 and got["max_ms"] == 3.5 and got["rounds"] == 3


def test_the_sweep_keeps_tokens_and_width_constant(peers):
    shapes = peers.sweep_shapes()
    assert {(s[4], s[5]) for s in shapes} == set(peers.SWEEP_HEAD_DIMS)
    for b, hq, hkv, s, dqk, dv in shapes:
        assert b * s == 16384 and hq == hkv and (hq * dqk == 2048 or (dqk, dv) == (192, 128))


def test_seqlen_series_are_per_variant_and_ordered(peers):
    """A plot line per implementation and variant (head dims, causal), points ordered by
    sequence length; a variant seen at one length only gets none; a missing point is left out."""
    pts = [_point((16384 // s, 16, 16, s, 128, 128), c, zyfa_fp8=float(s), cudnn_fe_fp8=MISSING)
           for s in (4096, 1024, 2048) for c in (False, True)]
    pts.append(_point((1, 8, 8, 8192, 256, 256), False, zyfa_fp8=1.0))
    got = peers.seqlen_series({"points": pts})
    assert set(got) == {(128, 128, False), (128, 128, True)}
    assert got[(128, 128, True)] == {"zyfa_fp8": [(1024, 1024.0), (2048, 2048.0), (4096, 4096.0)]}


@pytest.fixture(scope="module")
def bar_runs():
    spec = importlib.util.spec_from_file_location("bar_runs", ROOT / "bench" / "bar_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_runs_are_each_judged_against_their_own_bar(peers, bar_runs):
    """Over several runs each ratio is zyfa over the bar of its own run (a run whose bridge reads
    the cuDNN graph 10 % faster raises FA3's bar by 10 % there), and the minimum shows the run
    that fell short."""
    there = dict((i, t) for a in peers.ANCHORS[D256][True] if a.peer == "FA3 FP8" for i, t in a.bridges)
    runs = [{"points": [_point(D256, True, cudnn_fe_fp8=there["cudnn_fe_fp8"] * k, zyfa_fp8=1063.0 * z)]}
            for k, z in ((1.0, 1.05), (1.1, 1.05), (0.9, 0.95))]
    got = bar_runs.ratios(runs, peers)[("x", True, "fp8")]
    assert got == pytest.approx([1.05, 1.05 / 1.1, 0.95 / 0.9])
    rows = bar_runs.table(runs, ["a", "b", "c"], peers).splitlines()
    fp8 = next(r for r in rows if "| fp8 |" in r)
    assert fp8.endswith(f"| {1.05 / 1.1:.3f} | {1.05:.3f} |")
    bf16 = next(r for r in rows if "| bf16 |" in r)   # no zyfa_bf16 in any run: no ratios, no minimum
    assert bf16.endswith("| - | - | - | - | - |")


def test_a_run_missing_zyfa_does_not_count(peers, bar_runs):
    runs = [{"points": [_point(D128, False, cudnn_fe_fp8=900.0, zyfa_fp8=990.0)]},
            {"points": [_point(D128, False, cudnn_fe_fp8=900.0, zyfa_fp8=MISSING)]}]
    assert bar_runs.ratios(runs, peers)[("x", False, "fp8")] == [pytest.approx(1.1), None]
    row = next(r for r in bar_runs.table(runs, ["a", "b"], peers).splitlines() if "| fp8 |" in r)
    assert row.endswith("| 1.100 | - | 1.100 | 1.100 |")


def test_a_run_names_the_card_it_ran_on(peers):
    assert peers.card({"gpu": {"serial": "1652123456789", "uuid": "GPU-ab"}}) == "1652123456789"
    assert peers.card({"gpu": {"serial": "error: not supported", "uuid": "GPU-ab"}}) == "GPU-ab"
    assert peers.card({"gpu": {"name": "NVIDIA H200"}}) == "unknown"


def test_a_point_with_a_call_under_the_threshold_is_timed_in_graphs(peers):
    assert peers.graph_timed([5e-3, 0.4e-3], 1.0)          # one short call: the whole point
    assert not peers.graph_timed([5e-3, 1.2e-3], 1.0)
    assert not peers.graph_timed([0.1e-3], 0.0)            # --graph-below-ms 0: always eager
    assert not peers.graph_timed([], 1.0)


def test_graph_timed_points_are_marked_in_both_tables(peers):
    impl = {"status": "ok", "tflops": 500.0, "rel_err": 1e-3}
    point = lambda timing: {"label": "B16 H32/8 S512 d128", "causal": False, "timing": timing,
                            "shape": dict(B=16, Hq=32, Hkv=8, S=512, d_qk=128, d_v=128),
                            "impls": {"zyfa_fp8": dict(impl), "cudnn_fe_fp8": dict(impl)}}
    data = {"gpu": {"name": "GPU"}, "versions": {}, "date": "d", "mode": "full",
            "impls": ["zyfa_fp8", "cudnn_fe_fp8"], "points": [point("graph"), point("eager")]}
    rows = [r for r in peers.markdown(data).splitlines() if r.startswith("| B16")]
    assert "(graph)" in rows[0] and "(graph)" not in rows[1]
    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "bench" / "readme_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    lines = table.rows(data, peers)[2:]
    assert lines[0].startswith("| B16 H32/8 S512 d128 (graph) |") and "(graph)" not in lines[1]
