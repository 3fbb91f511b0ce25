"""pytest's header names the GPU backend the GPU tests will use, or why there is none (once,
rather than in every skipped test's reason); the fake driver's tests share one build of the
sm_90a kernels they launch."""

import os

import pytest

# The README's test command runs two workers (pytest-xdist) on a machine of two cores: one BLAS
# thread each, not two apiece (set here, before the workers start and load numpy).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from tests.backends import build_sm90a

#: The sm_90a variants the fake driver's tests launch (test_api, test_capture, test_staging;
#: build.py --only substrings): one build a run.  bf16 d256 full stays unbuilt
#: (test_api.test_unbuilt_variant_is_a_clear_error).
FAKE_SM90A = ("bf16_d128x128,bf16_d192x128_full,bf16_d256x256_causal,bf16_d64x64_full,"
              "fp8_e4m3_d64x64_full,fp8_e4m3_d128x128_full,fp8_e4m3_d256x256_full")
#: Not their softcap specialisations: the serving kernels with the softcap's two arguments more,
#: which no fake-driver test launches (the planner's choice of them: tests/test_serving_variants.py).
FAKE_SM90A_SKIP = "_serving_softcap"


@pytest.fixture(scope="session")
def sm90a_prebuilt(tmp_path_factory):
    return build_sm90a(tmp_path_factory, FAKE_SM90A, FAKE_SM90A_SKIP)


def pytest_report_header(config):
    try:
        from zyfa_runtime.driver import get_driver
        d = get_driver()
        return f"zyfa GPU backend: {d.name}, {d.device_count()} device(s)"
    except Exception as e:  # no library, no device
        return f"zyfa GPU backend: none, GPU tests are skipped ({e})"
