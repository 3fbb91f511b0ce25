"""bench/peers.py on any machine: SmolLM2's activations tiled to a benchmark shape keep each
query head with the key/value head it was computed against, derive head dim 128 as the
accuracy study does and refuse head dims they cannot provide; the bar is bridged."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("peers", ROOT / "bench" / "peers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def test_the_bar_is_bridged_through_this_runs_cudnn(peers):
    """A run whose cuDNN is 10 % faster than the anchor's raises the bar by 10 %."""
    shape = (1, 32, 8, 16384, 128, 128)
    point = {"shape": dict(zip(("B", "Hq", "Hkv", "S", "d_qk", "d_v"), shape)), "label": "x",
             "causal": False,
             "impls": {"sdpa_cudnn": {"status": "ok", "tflops": 613 * 1.1},
                       "zyfa_fp8": {"status": "ok", "tflops": 933 * 1.1 * 0.5},
                       "zyfa_bf16": {"status": "missing", "reason": "test"}}}
    lines = peers.bridged_table({"points": [point]})
    row = lines[-1]
    assert "| 1.100 |" in row and "cuDNN FP8 1026" in row and "(0.50x)" in row and "missing" in row
    assert peers.bridged_table({"points": [dict(point, causal=None)]}) == []


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
