"""Does the installed zyfa fit this machine?  Checked when the runtime creates the kernel
table for a driver (manifest, toolkit) and before a device's first kernel (arch).

* Manifest: its ``package_version`` must be this runtime's ``__version__``; the runtime
  packs arguments by the manifest's layouts, which are only known to match its own.
* Toolkit: the code objects are pinned to the toolkit the manifest names per arch.
  CUDA: the driver API version (``cuDriverGetVersion``, 13000 for 13.0) must be at least
  the pin's major: a CUDA 12 driver cannot load CUDA 13 cubins; any 13.x or later driver can.
  HIP: the HIP runtime version (``hipRuntimeGetVersion``, major * 10**7 + minor * 10**5 +
  patch) and, where present, ROCm's ``.info/version`` (``$ROCM_PATH``, else ``/opt/rocm``)
  must have the pin's major.minor.
  ``ZYFA_SKIP_VERSION_CHECK=1`` turns a toolkit mismatch into a ``RuntimeWarning``.
* Arch: a device whose arch has no built kernel in the manifest is refused, with the
  wheel that has its kernels where there is one.

The manifest and arch checks cannot be skipped.  Which toolkit checks apply follows
``driver.vendor``: ``"cuda"``, ``"hip"``, or None -- the emulator, which runs the code
objects on the CPU with no toolkit involved, is exempt (its ``versions()`` are its own).
The fake backend reports the pinned versions unless told otherwise (``ZYFA_FAKE_VERSIONS``).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from .catalogue import ARCHES, TOOLKIT, VENDOR, distribution_name, parse_toolkit
from .errors import InstallationError

SKIP_ENV = "ZYFA_SKIP_VERSION_CHECK"
ROCM_DEFAULT_PREFIX = "/opt/rocm"

#: Oldest Linux driver branch per CUDA major, for the error message.
CUDA_MIN_DRIVER = {12: "525", 13: "580"}


def rocm_release(rocm_path: str | None = None) -> str | None:
    """ROCm's record of its own version, ``<prefix>/.info/version`` (``7.2.3-45``), or None."""
    prefix = rocm_path or os.environ.get("ROCM_PATH") or ROCM_DEFAULT_PREFIX
    try:
        text = (Path(prefix) / ".info" / "version").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return text.strip() or None


def built_arches(manifest: dict) -> list[str]:
    """The arches with at least one built kernel in the manifest, in catalogue order."""
    kernels = manifest.get("kernels", [])
    entries = kernels.values() if isinstance(kernels, dict) else kernels
    found = {e.get("variant", {}).get("arch") for e in entries if e.get("built")}
    return [a for a in ARCHES if a in found] + sorted(a for a in found - set(ARCHES) if a)


def _toolkit(manifest: dict, arch: str) -> str:
    return manifest.get("toolkits", {}).get(arch) or TOOLKIT[arch]


def _install(toolkit: str, *, force: bool = False) -> str:
    from . import __version__
    return (f"pip install {'--force-reinstall ' if force else ''}"
            f"{distribution_name(toolkit)}=={__version__}")


def _skip_requested() -> bool:
    return os.environ.get(SKIP_ENV, "").strip().lower() not in ("", "0", "false", "no")


# --------------------------------------------------------------------------------------
# Manifest

def check_manifest(manifest: dict, prebuilt=None) -> None:
    """The manifest must come from this very zyfa version."""
    from . import __version__
    got = str(manifest.get("package_version"))
    if got == __version__:
        return
    where = f" in {prebuilt}" if prebuilt is not None else ""
    fixes = [_install(_toolkit(manifest, a), force=True) for a in built_arches(manifest)
             if a in TOOLKIT]
    raise InstallationError(
        f"the kernel manifest{where} is from zyfa {got}, but this runtime is zyfa {__version__}: "
        "its kernel-argument layouts are not known to be this runtime's. Reinstall the wheel ("
        + (" or ".join(fixes) or "pip install --force-reinstall <the zyfa wheel>")
        + ") or, in a source checkout, rerun python build.py.")


# --------------------------------------------------------------------------------------
# Toolkit

def _cuda_problem(arch: str, toolkit: str, versions: dict) -> str | None:
    from . import __version__
    major = parse_toolkit(toolkit)[1][0]
    have = versions.get("driver_version")
    if not isinstance(have, int) or have >= major * 1000:
        return None
    have_major = have // 1000
    branch = CUDA_MIN_DRIVER.get(major)
    return (f"{distribution_name(toolkit)} {__version__} holds {arch} cubins built with "
            f"{toolkit}, which need an NVIDIA driver for CUDA {major}.0 or newer, but this "
            f"driver supports CUDA {have_major}.{have % 1000 // 10} (cuDriverGetVersion() = "
            f"{have}). Update the NVIDIA driver"
            + (f" (CUDA {major} needs the {branch} branch or newer)" if branch else "")
            + f", or install the zyfa wheel for CUDA {have_major}: pip install "
            f"zyfa-cuda{have_major}=={__version__} (if published; otherwise build from source "
            "with python build.py).")


def _major_minor(text: str) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _hip_problem(arch: str, toolkit: str, versions: dict) -> str | None:
    from . import __version__
    want = parse_toolkit(toolkit)[1][:2]
    found = []   # (what the machine says, its major.minor)
    runtime = versions.get("runtime_version")
    if isinstance(runtime, int):
        major, minor, patch = runtime // 10**7, runtime // 10**5 % 100, runtime % 10**5
        text = f"the HIP runtime is {major}.{minor}.{patch} (hipRuntimeGetVersion() = {runtime})"
        found.append((text, (major, minor)))
    release = versions.get("rocm")
    if isinstance(release, str) and _major_minor(release):
        found.append((f"ROCm's .info/version says {release}", _major_minor(release)))
    wrong = [(text, mm) for text, mm in found if mm != want]
    if not wrong:
        return None
    have = wrong[0][1]
    return (f"{distribution_name(toolkit)} {__version__} holds {arch} code objects built for "
            f"{toolkit}, which need ROCm {want[0]}.{want[1]}, but "
            + " and ".join(text for text, _ in wrong)
            + f". Install ROCm {want[0]}.{want[1]}, or the zyfa wheel for ROCm {have[0]}.{have[1]}: "
            f"pip install zyfa-rocm{have[0]}-{have[1]}=={__version__} (if published; otherwise "
            "build from source with python build.py).")


def check_toolkit(driver, manifest: dict) -> None:
    """The driver's versions against the toolkit pins of the arches it could run."""
    vendor = getattr(driver, "vendor", None)
    if vendor is None:
        return
    pins = [(a, _toolkit(manifest, a)) for a in built_arches(manifest) if VENDOR.get(a) == vendor]
    if not pins:
        return   # nothing here for this driver: check_arch names the right wheel per device
    versions = driver.versions()
    problem_of = _cuda_problem if vendor == "cuda" else _hip_problem
    problems = [p for a, tk in pins if (p := problem_of(a, tk, versions))]
    if not problems:
        return
    message = " ".join(problems)
    if _skip_requested():
        warnings.warn(f"{message} ({SKIP_ENV} is set: loading the kernels anyway)",
                      RuntimeWarning, stacklevel=2)
        return
    raise InstallationError(f"{message} Set {SKIP_ENV}=1 to load them anyway, at your own risk.")


# --------------------------------------------------------------------------------------
# Arch

def check_arch(manifest: dict, arch: str, device: str = "the device") -> None:
    """``arch`` must have built kernels in the manifest."""
    from . import __version__
    built = built_arches(manifest)
    if arch in built:
        return
    have = (f"has kernels for {' and '.join(built)} only" if built
            else "has no built kernels (in a source checkout: python build.py)")
    message = f"this zyfa installation {have}; {device} is {arch}"
    if arch in TOOLKIT:
        dist = distribution_name(TOOLKIT[arch])
        message += f". Its kernels are in {dist}: pip install {dist}=={__version__}"
    else:
        message += (", for which zyfa has no kernels (zyfa supports "
                    + ", ".join(f"{a} with {distribution_name(TOOLKIT[a])}" for a in ARCHES) + ")")
    raise InstallationError(message + ".")
