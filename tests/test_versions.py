"""Load-time checks of versions.py: the drivers' versions against the manifest's toolkit
pins, the device arch against the kernels present, the manifest against the runtime.
Every refusal names both sides and the command that fixes it."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from tests.backends import forget_runtime_state

from zyfa_runtime import __version__, api, flash_attn_func, versions
from zyfa_runtime import driver as drivers
from zyfa_runtime.__main__ import main as cli
from zyfa_runtime.catalogue import (
    TOOLKIT,
    all_variants,
    distribution_name,
    parse_toolkit,
)
from zyfa_runtime.driver import cuda, hip
from zyfa_runtime.driver.fake import FakeDriver, parse_versions
from zyfa_runtime.errors import InstallationError, ZyfaError
from zyfa_runtime.kernels import KernelTable
from zyfa_runtime.memory import host_dtype

CUDA_WHEEL = f"pip install zyfa-cuda13=={__version__}"
ROCM_WHEEL = f"pip install zyfa-rocm7-2=={__version__}"


def manifest(*arches: str, package_version: str = __version__) -> dict:
    """A manifest with every kernel of ``arches`` built (no files: nothing is loaded here)."""
    kernels = [{"name": v.name, "variant": v.to_json(), "built": v.arch in arches,
                "file": v.filename, "symbol": v.symbol} for v in all_variants()]
    return {"format": 1, "package_version": package_version, "toolkits": dict(TOOLKIT),
            "compilers": {}, "kernels": kernels}


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in (versions.SKIP_ENV, "ROCM_PATH", "ZYFA_FAKE_VERSIONS", "ZYFA_FAKE_ARCH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ROCM_PATH", "/nonexistent-rocm")   # no .info/version unless a test makes one
    forget_runtime_state()
    yield
    forget_runtime_state()


class StubLib:
    """A cffi library stand-in: every call succeeds unless overridden."""

    def __init__(self, **overrides):
        self.overrides = overrides

    def __getattr__(self, name):
        return self.overrides.get(name, lambda *args: 0)


def refusal(driver, m) -> str:
    with pytest.raises(InstallationError) as info:
        KernelTable(driver, m, None)
    assert isinstance(info.value, ZyfaError)
    return str(info.value)


# --------------------------------------------------------------------------------------
# Names

def test_distribution_names_carry_the_toolkit_pin():
    assert [distribution_name(TOOLKIT[a]) for a in ("sm_90a", "gfx950")] == ["zyfa-cuda13",
                                                                             "zyfa-rocm7-2"]
    assert distribution_name("CUDA 12.8") == "zyfa-cuda12"
    assert distribution_name("ROCm 6.4.1") == "zyfa-rocm6-4"
    assert parse_toolkit("ROCm 7.2.3") == ("rocm", (7, 2, 3))
    for bad in ("CUDA", "ROCm seven", "OpenCL 3.0"):
        with pytest.raises(ValueError):
            parse_toolkit(bad)


# --------------------------------------------------------------------------------------
# Matching versions pass

@pytest.mark.parametrize("arch,fake_versions", [
    ("sm_90a", {}),                                          # the pin itself: 13.0
    ("sm_90a", {"driver_version": 13020}),                   # a newer 13.x driver
    ("sm_90a", {"driver_version": 14000}),                   # a newer major runs older cubins
    ("gfx950", {}),                                          # ROCm 7.2.3
    ("gfx950", {"runtime_version": 70200000, "rocm": "7.2.0-1"}),   # another 7.2 patch
    ("gfx950", {"rocm": ""}),                                # no .info/version: runtime only
])
def test_matching_versions_pass(arch, fake_versions):
    table = KernelTable(FakeDriver(arch, versions=fake_versions), manifest(arch), None)
    assert table.device_arch(0) == arch


def test_the_pins_of_another_vendor_do_not_apply():
    # A CUDA 12 driver with a ROCm-only manifest: no toolkit question, the arch check decides.
    table = KernelTable(FakeDriver("sm_90a", versions={"driver_version": 12080}),
                        manifest("gfx950"), None)
    with pytest.raises(InstallationError, match="gfx950 only.*is sm_90a.*pip install zyfa-cuda13"):
        table.device_arch(0)


# --------------------------------------------------------------------------------------
# Mismatches

def test_cuda_driver_older_than_the_pin_is_refused():
    msg = refusal(FakeDriver("sm_90a", versions={"driver_version": 12080}), manifest("sm_90a"))
    assert "CUDA 13.0" in msg and "CUDA 12.8" in msg and "12080" in msg
    assert "zyfa-cuda13" in msg and f"pip install zyfa-cuda12=={__version__}" in msg
    assert "580" in msg and versions.SKIP_ENV in msg


def test_cuda_driver_versions_come_from_the_driver_api(monkeypatch):
    def version(p):
        p[0] = 12040
        return 0
    monkeypatch.setattr(cuda, "_library", SimpleNamespace(get=lambda: StubLib(cuDriverGetVersion=version)))
    msg = refusal(cuda.CudaDriver(), manifest("sm_90a"))
    assert "CUDA 12.4 (cuDriverGetVersion() = 12040)" in msg


@pytest.mark.parametrize("fake_versions,shown,wheel", [
    ({"runtime_version": 70100000, "rocm": "7.1.0"}, "7.1.0 (hipRuntimeGetVersion() = 70100000)",
     "zyfa-rocm7-1"),
    ({"runtime_version": 80000000, "rocm": ""}, "8.0.0 (hipRuntimeGetVersion() = 80000000)",
     "zyfa-rocm8-0"),
    ({"rocm": "6.4.1-120"}, ".info/version says 6.4.1-120", "zyfa-rocm6-4"),   # runtime 7.2, file not
])
def test_hip_runtime_or_rocm_release_other_than_the_pin_is_refused(fake_versions, shown, wheel):
    msg = refusal(FakeDriver("gfx950", versions=fake_versions), manifest("gfx950"))
    assert "ROCm 7.2.3" in msg and "need ROCm 7.2" in msg and shown in msg
    assert f"pip install {wheel}=={__version__}" in msg and versions.SKIP_ENV in msg


def test_hip_versions_come_from_the_runtime_and_rocm_info(monkeypatch, tmp_path):
    def setter(value):
        def f(p):
            p[0] = value
            return 0
        return f
    lib = StubLib(hipDriverGetVersion=setter(70253021), hipRuntimeGetVersion=setter(70151830))
    monkeypatch.setattr(hip, "_library", SimpleNamespace(get=lambda: lib))
    (tmp_path / ".info").mkdir()
    (tmp_path / ".info" / "version").write_text("7.1.1-38\n")
    monkeypatch.setenv("ROCM_PATH", str(tmp_path))
    got = hip.HipDriver().versions()
    assert got["runtime"] == "7.1.51830" and got["rocm"] == "7.1.1-38"
    msg = refusal(hip.HipDriver(), manifest("gfx950"))
    assert "HIP runtime is 7.1.51830" in msg and ".info/version says 7.1.1-38" in msg


def test_rocm_release_reads_rocm_path_else_nothing(monkeypatch, tmp_path):
    assert versions.rocm_release(str(tmp_path)) is None
    (tmp_path / ".info").mkdir()
    (tmp_path / ".info" / "version").write_text("7.2.3-76\n")
    monkeypatch.setenv("ROCM_PATH", str(tmp_path))
    assert versions.rocm_release() == "7.2.3-76"


def test_the_override_warns_and_loads(monkeypatch):
    monkeypatch.setenv(versions.SKIP_ENV, "1")
    with pytest.warns(RuntimeWarning, match=r"CUDA 12\.8.*ZYFA_SKIP_VERSION_CHECK is set"):
        table = KernelTable(FakeDriver("sm_90a", versions={"driver_version": 12080}),
                            manifest("sm_90a"), None)
    assert table.device_arch(0) == "sm_90a"
    monkeypatch.setenv(versions.SKIP_ENV, "0")             # "0" means no override
    refusal(FakeDriver("sm_90a", versions={"driver_version": 12080}), manifest("sm_90a"))


def test_the_emulator_is_exempt_from_toolkit_checks():
    emulator = pytest.importorskip("zyfa_emulator.driver")
    assert emulator.EmulatorDriver.vendor is None

    class NoVersions(FakeDriver):
        def versions(self):
            raise AssertionError("an exempt driver's versions are not consulted")
    exempt = NoVersions("gfx950")
    exempt.vendor = None
    table = KernelTable(exempt, manifest("gfx950"), None)
    assert table.device_arch(0) == "gfx950"


# --------------------------------------------------------------------------------------
# Arch and manifest

@pytest.mark.parametrize("arch", ["sm_80", "gfx942"])
def test_a_device_arch_without_kernels_is_refused(arch):
    table = KernelTable(FakeDriver(arch), manifest("sm_90a"), None)
    with pytest.raises(InstallationError) as info:
        table.device_arch(0)
    msg = str(info.value)
    assert "has kernels for sm_90a only" in msg and f"is {arch}" in msg
    assert "zyfa has no kernels" in msg and "zyfa-cuda13" in msg and "zyfa-rocm7-2" in msg


def test_a_supported_arch_missing_here_names_its_wheel():
    table = KernelTable(FakeDriver("gfx950"), manifest("sm_90a"), None)
    with pytest.raises(InstallationError, match=f"sm_90a only.*is gfx950.*{ROCM_WHEEL}"):
        table.device_arch(0)


def test_the_api_refuses_an_unknown_arch_before_launching(monkeypatch, tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest("sm_90a")))
    monkeypatch.setenv("ZYFA_PREBUILT_DIR", str(tmp_path))
    monkeypatch.setenv("ZYFA_BACKEND", "fake")
    monkeypatch.setenv("ZYFA_FAKE_ARCH", "sm_80")
    q = np.zeros((1, 16, 2, 64), host_dtype("bf16"))
    with pytest.raises(InstallationError, match="is sm_80"):
        flash_attn_func(q, q, q)
    assert drivers.get_driver().launches == []


def test_a_manifest_of_another_version_is_refused_even_with_the_override(monkeypatch):
    monkeypatch.setenv(versions.SKIP_ENV, "1")
    msg = refusal(FakeDriver("sm_90a"), manifest("sm_90a", package_version="0.0.9"))
    assert "zyfa 0.0.9" in msg and f"zyfa {__version__}" in msg
    assert f"pip install --force-reinstall zyfa-cuda13=={__version__}" in msg
    assert "python build.py" in msg


# --------------------------------------------------------------------------------------
# The fake's versions and the command line

def test_fake_versions_from_the_environment(monkeypatch):
    assert parse_versions("driver_version=12080, rocm=7.1.0") == {"driver_version": 12080,
                                                                   "rocm": "7.1.0"}
    with pytest.raises(ZyfaError, match="key=value"):
        parse_versions("12080")
    monkeypatch.setenv("ZYFA_FAKE_VERSIONS", "driver_version=12080")
    assert drivers.get_driver("fake").versions() == {"driver_version": 12080, "driver": "12.8"}


def test_info_and_check_report_a_refusal(monkeypatch, tmp_path, capsys):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest("sm_90a")))
    monkeypatch.setenv("ZYFA_PREBUILT_DIR", str(tmp_path))
    monkeypatch.setenv("ZYFA_BACKEND", "fake")
    monkeypatch.setenv("ZYFA_FAKE_VERSIONS", "driver_version=12080")
    assert cli(["info"]) == 1
    out = capsys.readouterr().out
    # 16 plain, 16 serving, 2 short, 16 softcap
    assert "sm_90a: 52 kernels for CUDA 13.0 (the pin), built with" in out
    assert "gfx950: ROCm 7.2.3, no kernels in this installation (zyfa-rocm7-2 has them)" in out
    assert "refused      zyfa-cuda13" in out and "CUDA 12.8" in out
    api._tables.clear()
    assert cli(["check"]) == 1
    assert "zyfa: zyfa-cuda13" in capsys.readouterr().err
    api._tables.clear()
    drivers._reset()
    monkeypatch.setenv("ZYFA_FAKE_VERSIONS", "")
    monkeypatch.setenv("ZYFA_FAKE_ARCH", "gfx950")
    assert cli(["info"]) == 1
    assert "refused: this zyfa installation has kernels for sm_90a only" in capsys.readouterr().out


def test_no_warning_when_everything_matches():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KernelTable(FakeDriver("sm_90a"), manifest("sm_90a", "gfx950"), None)
        KernelTable(FakeDriver("gfx950"), manifest("sm_90a", "gfx950"), None)
    assert versions.built_arches(manifest("gfx950", "sm_90a")) == ["sm_90a", "gfx950"]
