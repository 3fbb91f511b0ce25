"""Host tensors get exact bounds: the runtime hands the emulator each tensor's byte extent for
the launch, so strict mode (no fallback to the process's memory map) runs plain numpy inputs,
strided views included, and the regions are gone afterwards."""

import numpy as np
import pytest

from tests.backends import using_backend

from zyfa_runtime import flash_attn_func, reference
from zyfa_runtime.memory import host_dtype


@pytest.fixture
def strict_emulator():
    with using_backend("emulator", ZYFA_EMULATOR_STRICT_HOST="1") as driver:
        yield driver


def test_strict_host_runs_numpy_views_with_exact_extents(strict_emulator):
    rng = np.random.default_rng()
    big = rng.standard_normal((1, 70, 3, 2, 64)).astype(host_dtype("bf16"))
    q, k, v = big[:, :, 0], big[:, :, 1], big[:, :, 2]          # one buffer, three views
    out = np.full((1, 70, 2, 64), np.nan, dtype=host_dtype("bf16"))
    before = len(strict_emulator.machine.memory.regions())
    flash_attn_func(q, k, v, causal=True, out=out)
    assert len(strict_emulator.machine.memory.regions()) == before
    ref = reference.attention(*(x.astype(np.float64) for x in (q, k, v)), causal=True)
    assert reference.relative_error(out.astype(np.float64), ref) < 8e-3


def test_extents_of_inputs_are_read_only_and_removed(strict_emulator):
    buf = np.zeros(256, np.uint8)
    lo = buf.ctypes.data
    with strict_emulator.tensor_extents({"q": (lo, lo + 128), "out": (lo + 128, lo + 256)}):
        regions = {r.name.split(" (")[0]: r for r in strict_emulator.machine.memory.regions()
                   if r.lo in (lo, lo + 128)}
        assert not regions["host tensor q"].writable and regions["host tensor out"].writable
    assert all(r.lo not in (lo, lo + 128) for r in strict_emulator.machine.memory.regions())
