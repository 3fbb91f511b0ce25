"""PEP 517 build backend: one wheel per toolkit, its code objects inside.

    ZYFA_WHEEL_TARGET=cuda python -m build --wheel   ->  zyfa_cuda13-<v>-py3-none-manylinux_2_28_x86_64.whl
    ZYFA_WHEEL_TARGET=rocm python -m build --wheel   ->  zyfa_rocm7_2-<v>-py3-none-manylinux_2_28_x86_64.whl

(``-C target=cuda`` does the same as the variable.)  ``build_wheel`` runs ``build.py`` for
the target's arch into a fresh staging directory, checks every built code object against
the manifest's sha256, and writes the wheel: the packages named in pyproject.toml's
``[tool.setuptools]`` plus ``zyfa_runtime/prebuilt/`` (``manifest.json``, the code objects
and whatever else build.py put there).  The distribution name carries the toolkit pin
(``catalogue.distribution_name``: PyPI refuses local versions such as ``0.1.0+cu13``); the
tag is ``py3-none-manylinux_2_28_x86_64`` (no Python extension, but GPU binaries loaded by
x86_64 Linux drivers; docs/distribution.md).  Zip entries are sorted and time-stamped
``SOURCE_DATE_EPOCH`` (else 1980-01-01), so the wheel is as reproducible as build.py.

Without a target, ``build_wheel`` stops with a message naming both.  The sdist and the
editable install (``pip install -e .``, which loads the repository's ``prebuilt/``) are
setuptools'.  Build time only: nothing here is imported at run time.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

try:
    import tomllib
except ImportError:    # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
TARGET_ENV = "ZYFA_WHEEL_TARGET"
#: Wheel target -> the arch whose code objects it carries.
TARGETS = {"cuda": "sm_90a", "rocm": "gfx950"}
TAG = "py3-none-manylinux_2_28_x86_64"


class WheelError(RuntimeError):
    pass


def _catalogue():
    """zyfa_runtime/catalogue.py alone (stdlib only), without importing the runtime."""
    name = "_zyfa_build_catalogue"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "zyfa_runtime" / "catalogue.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def target_of(config_settings: dict | None) -> str:
    """``cuda`` or ``rocm``, from ``-C target=`` or ``$ZYFA_WHEEL_TARGET``."""
    given = str((config_settings or {}).get("target", "")).strip().lower()
    env = os.environ.get(TARGET_ENV, "").strip().lower()
    if given and env and given != env:
        raise WheelError(f"-C target={given} and {TARGET_ENV}={env} disagree; give one")
    target = given or env
    if target in TARGETS:
        return target
    cat = _catalogue()
    choices = "; ".join(f"{TARGET_ENV}={t} builds {cat.distribution_name(cat.TOOLKIT[a])} "
                        f"({a}, {cat.TOOLKIT[a]})" for t, a in TARGETS.items())
    raise WheelError(("unknown wheel target " + repr(target) + ". " if target else "")
                     + "zyfa wheels are built one per toolkit, the pin in the distribution "
                     f"name: {choices} (or pass -C target=...). For development install the "
                     "source tree instead: pip install -e . (see docs/distribution.md)")


def wheel_identity(target: str) -> tuple[str, str, str, str]:
    """(distribution name, version, arch, toolkit) of the target's wheel."""
    cat = _catalogue()
    arch = TARGETS[target]
    project = _project()["project"]
    version = project["version"]
    init = (ROOT / "zyfa_runtime" / "__init__.py").read_text(encoding="utf-8")
    m = re.search(r'^__version__\s*=\s*"([^"]+)"', init, re.MULTILINE)
    if not m or m.group(1) != version:
        raise WheelError(f"pyproject.toml says version {version} but zyfa_runtime.__version__ is "
                         f"{m.group(1) if m else 'missing'}; the runtime refuses a manifest of "
                         "another version, so make them equal")
    return cat.distribution_name(cat.TOOLKIT[arch]), version, arch, cat.TOOLKIT[arch]


# --------------------------------------------------------------------------------------
# Contents

def _package_files() -> dict[str, bytes]:
    """The .py files of the packages pyproject.toml names (as the setuptools build has them)."""
    out = {}
    for package in _project()["tool"]["setuptools"]["packages"]:
        directory = ROOT.joinpath(*package.split("."))
        for path in sorted(directory.glob("*.py")):
            out[path.relative_to(ROOT).as_posix()] = path.read_bytes()
    return out


def _build_code_objects(arch: str, out: Path) -> dict[str, bytes]:
    """Run build.py for ``arch`` into ``out``; the files for ``zyfa_runtime/prebuilt/``."""
    cmd = [sys.executable, str(ROOT / "build.py"), "--arch", arch, "--out", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, check=False)
    if result.returncode != 0:
        raise WheelError(f"build.py --arch {arch} failed (exit {result.returncode}); see above")
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    built = [e for e in manifest["kernels"] if e.get("built")]
    if not built or any(e["variant"]["arch"] != arch for e in built):
        raise WheelError(f"the staged manifest should hold {arch} kernels only, and some")
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())
             if p.is_file() and not p.name.startswith(".")}
    aux = [e for e in manifest.get("aux_kernels", []) if e.get("built")]
    if any(e["arch"] != arch for e in aux):
        raise WheelError(f"the staged manifest's auxiliary kernels should be {arch}'s only")
    for e in built + aux:
        if hashlib.sha256(files.get(e["file"], b"")).hexdigest() != e["sha256"]:
            raise WheelError(f"{e['file']} is missing or differs from its manifest sha256")
    return {f"zyfa_runtime/prebuilt/{name}": data for name, data in files.items()}


def metadata(name: str, version: str, arch: str, toolkit: str) -> str:
    project = _project()["project"]
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             f"Summary: {project['description']} ({toolkit} build: {arch} code objects)"]
    licence = project.get("license", {})
    if isinstance(licence, dict) and licence.get("text"):
        lines.append(f"License: {licence['text']}")
    lines.append(f"Requires-Python: {project['requires-python']}")
    # The runtime's dependencies only: the extras (build, test, numerics) serve the source
    # tree, whose tools and tests the wheel does not carry.
    lines += [f"Requires-Dist: {r}" for r in project.get("dependencies", [])]
    readme = ROOT / project.get("readme", "README.md")
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + readme.read_text(encoding="utf-8")


def _epoch() -> tuple[int, int, int, int, int, int]:
    seconds = max(int(os.environ.get("SOURCE_DATE_EPOCH", "0") or 0), 315532800)   # >= 1980
    return time.gmtime(seconds)[:6]


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_wheel(directory: Path, name: str, version: str, files: dict[str, bytes],
                dist_info: dict[str, bytes]) -> Path:
    """A wheel of ``files`` plus ``<dist>.dist-info/`` (``dist_info`` and its RECORD)."""
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    info_dir = f"{stem}.dist-info"
    entries = dict(sorted(files.items()))
    entries.update({f"{info_dir}/{k}": v for k, v in sorted(dist_info.items())})
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in entries.items())
    entries[f"{info_dir}/RECORD"] = (record + f"{info_dir}/RECORD,,\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}-{TAG}.whl"
    date_time = _epoch()
    with zipfile.ZipFile(path, "w") as zf:
        for arcname, data in entries.items():
            info = zipfile.ZipInfo(arcname, date_time=date_time)
            info.create_system = 3                     # Unix: external_attr holds the mode
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return path


# --------------------------------------------------------------------------------------
# PEP 517 hooks

def get_requires_for_build_wheel(config_settings=None):
    """build.py imports the runtime (its dependencies); the ROCm target may need ziglang."""
    target = target_of(config_settings)
    project = _project()["project"]
    extra = project.get("optional-dependencies", {}).get("build", []) if target == "rocm" else []
    return list(project.get("dependencies", [])) + list(extra)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    target = target_of(config_settings)
    name, version, arch, toolkit = wheel_identity(target)
    with tempfile.TemporaryDirectory(prefix="zyfa-wheel-") as tmp:
        files = {**_package_files(), **_build_code_objects(arch, Path(tmp) / "prebuilt")}
    dist_info = {
        "METADATA": metadata(name, version, arch, toolkit).encode(),
        "WHEEL": (f"Wheel-Version: 1.0\nGenerator: zyfa generator/wheel.py\n"
                  f"Root-Is-Purelib: false\nTag: {TAG}\n").encode(),
        "top_level.txt": "".join(sorted({p.split("/")[0] + "\n" for p in files})).encode(),
    }
    path = write_wheel(Path(wheel_directory), name, version, files, dist_info)
    print(f"zyfa wheel: {path.name} ({target}: {arch}, {toolkit})", file=sys.stderr)
    return path.name


def _setuptools():
    from setuptools import build_meta
    return build_meta


def get_requires_for_build_sdist(config_settings=None):
    return _setuptools().get_requires_for_build_sdist(config_settings)


def build_sdist(sdist_directory, config_settings=None):
    return _setuptools().build_sdist(sdist_directory, config_settings)


def get_requires_for_build_editable(config_settings=None):
    return _setuptools().get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _setuptools().prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _setuptools().build_editable(wheel_directory, config_settings, metadata_directory)
