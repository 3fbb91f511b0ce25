"""The project's real gfx950 BF16 kernels, executed by the emulator through the runtime
(``ZYFA_BACKEND=emulator``): manifest, argument packing, validation and launch exactly
as on hardware, compared with the float64 reference within the BF16 error bounds of
``zyfa_runtime.selfcheck`` (O relative error <= 8e-3, LSE absolute error <= 1e-3)."""

import os
import subprocess
import sys
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from emukit import emulated

from zyfa_runtime import flash_attn_func, flash_attn_varlen_func, reference
from zyfa_runtime.catalogue import Variant
from zyfa_runtime.selfcheck import LSE_BOUND, O_BOUND, check_variant

from tests.sweeps import sweep

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = [Variant("gfx950", "bf16", dq, dv, causal)
            for dq, dv in ((64, 64), (128, 128), (192, 128), (256, 256)) for causal in (False, True)]
pytestmark = pytest.mark.skipif(
    not all((ROOT / "prebuilt" / f"{v.name}.hsaco").exists() for v in VARIANTS),
    reason="gfx950 code objects not built (python build.py --arch gfx950)")


@pytest.fixture(scope="module")
def emulator(request):
    # every kernel run is also hazard-checked in the full run (emukit.hazards)
    with emulated(request, ROOT / "prebuilt") as driver:
        yield driver


def bf16(rng, shape):
    return rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.bfloat16)


def lse_error(lse, ref):
    lse = np.asarray(lse, np.float64)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref)), "rows without keys differ"
    finite = np.isfinite(ref)
    assert not np.isnan(lse).any()
    return float(np.abs(lse[finite] - ref[finite]).max()) if finite.any() else 0.0


@pytest.mark.parametrize("v", sweep(VARIANTS))
def test_numpy_inputs_gqa3_causal_offset(emulator, v):
    # NumPy arrays straight into the API (host memory is device memory here): GQA ratio 3,
    # Sq != Sk with lengths that are not tile multiples, LSE requested.
    rng = np.random.default_rng(zlib.crc32(v.name.encode()))
    q, k, vv = bf16(rng, (2, 45, 3, v.d_qk)), bf16(rng, (2, 70, 1, v.d_qk)), bf16(rng, (2, 70, 1, v.d_v))
    out = np.full((2, 45, 3, v.d_v), np.nan, ml_dtypes.bfloat16)
    _, lse = flash_attn_func(q, k, vv, causal=v.causal, out=out, return_lse=True)
    ref_o, ref_lse = reference.attention(q, k, vv, causal=v.causal, return_lse=True)
    assert not np.isnan(out.astype(np.float32)).any()
    assert reference.relative_error(out.astype(np.float64), ref_o) <= O_BOUND
    assert lse_error(lse.numpy(), ref_lse) <= LSE_BOUND


@pytest.mark.parametrize("v", sweep(VARIANTS))
def test_numpy_inputs_varlen_with_an_empty_sequence(emulator, v):
    rng = np.random.default_rng(zlib.crc32(v.name.encode()) + 1)
    seq_q, seq_k = [9, 0, 70], [20, 5, 33]
    cu_q = np.concatenate([[0], np.cumsum(seq_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(seq_k)]).astype(np.int32)
    q = bf16(rng, (cu_q[-1], 2, v.d_qk))
    k, vv = bf16(rng, (cu_k[-1], 2, v.d_qk)), bf16(rng, (cu_k[-1], 2, v.d_v))
    out, lse = flash_attn_varlen_func(q, k, vv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                      max_seqlen_q=max(seq_q), max_seqlen_k=max(seq_k),
                                      causal=v.causal, return_lse=True)
    ref_o, ref_lse = reference.attention(q, k, vv, causal=v.causal, cu_seqlens_q=cu_q,
                                         cu_seqlens_k=cu_k, return_lse=True)
    o = out.numpy().astype(np.float64)
    assert not np.isnan(o).any()
    assert reference.relative_error(o, ref_o) <= O_BOUND
    assert lse_error(lse.numpy(), ref_lse) <= LSE_BOUND


@pytest.mark.parametrize("v", sweep(VARIANTS, quick={(64, 64, True)}))
def test_selfcheck_cases(emulator, v):
    # The same cases `python -m zyfa_runtime check` runs on a GPU (device allocations,
    # strided views, GQA 3 and 5, Sq > Sk causal rows without keys, varlen).
    results = check_variant(emulator, 0, v, seed=11)
    bad = [(r.case, r.o_error, r.lse_error) for r in results if not r.ok]
    assert not bad, bad


def test_cli_quick_check_runs_attention_on_the_gpu_or_else_the_emulator():
    # README command 1's last step: with no backend named it takes the GPU if one is usable,
    # otherwise it says so and runs one BF16 and one FP8 gfx950 kernel on the emulator.
    env = {k: v for k, v in os.environ.items() if k != "ZYFA_BACKEND"}
    env.update(ZYFA_PREBUILT_DIR=str(ROOT / "prebuilt"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "zyfa_runtime", "check", "--quick", "--seed", "3"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if "CPU emulator instead" in proc.stdout:
        assert "backend emulator" in proc.stdout and "2/2 cases passed over 2 variants" in proc.stdout
        assert "bf16_d64x64_causal" in proc.stdout and "fp8_e4m3_d64x64_causal" in proc.stdout
    else:
        assert "cases passed" in proc.stdout and "FAIL" not in proc.stdout


@pytest.mark.parametrize("v", sweep([VARIANTS[1], VARIANTS[6]], quick={(64, 64, True)}))
def test_results_do_not_depend_on_wave_interleaving(emulator, v):
    # Waves of a workgroup run round-robin; a missing barrier or wait would make the
    # output depend on how finely they interleave.
    rng = np.random.default_rng(5)
    q, k, vv = bf16(rng, (1, 70, 2, v.d_qk)), bf16(rng, (1, 90, 2, v.d_qk)), bf16(rng, (1, 90, 2, v.d_v))
    outs = []
    default = emulator.machine.config.quantum
    try:
        for quantum in (1, 7, 10_000):
            emulator.machine.config.quantum = quantum
            out, lse = flash_attn_func(q, k, vv, causal=v.causal, return_lse=True)
            outs.append((out.numpy().view(np.uint16), lse.numpy().view(np.uint32)))
    finally:
        emulator.machine.config.quantum = default
    for o, l in outs[1:]:
        assert np.array_equal(o, outs[0][0]) and np.array_equal(l, outs[0][1])
