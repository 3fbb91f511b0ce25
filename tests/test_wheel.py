"""The wheels, built by the standard flow and installed into a fresh venv.

Each target's wheel is built once (``python -m build --wheel``, ZYFA_WHEEL_TARGET), then
installed into one new venv -- no system site-packages: the dependencies come from pip's
index or cache -- the CUDA wheel, then in its place the ROCm one.  The
installed runtime runs with nothing but the venv on PATH (no nvcc, no clang) from an empty
directory, and must find its own ``zyfa_runtime/prebuilt/``, report its toolkit and
kernels, and load and launch without compiling anything.  ``-m "not wheel"`` skips this.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from generator import toolchain
from zyfa_runtime import __version__
from zyfa_runtime import catalogue
from zyfa_runtime.catalogue import TOOLKIT

pytestmark = [pytest.mark.wheel, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
TAG = "py3-none-manylinux_2_28_x86_64"
WHEELS = {  # target -> (distribution, arch, kernels built)
    "cuda": ("zyfa-cuda13", "sm_90a", 52),   # 16 plain, 16 serving, 2 short-prompt, 16 softcap, 2 f16-math
    "rocm": ("zyfa-rocm7-2", "gfx950", 16),
}
COMPILERS = ("nvcc", "clang", "clang++", "hipcc", "amdclang", "zig", "ld.lld")


def _clean_env(**extra) -> dict:
    """The environment without anything that would point Python or zyfa at the source tree."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("ZYFA_")}
    env.update(extra)
    return env


def _run(cmd, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _have_build(cwd: Path) -> bool:
    return _run([sys.executable, "-m", "build", "--version"], cwd, _clean_env()).returncode == 0


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    if not _have_build(out):
        pytest.skip("the PyPA `build` package is not installed (pip install -e '.[test]')")
    return out


def _build(wheel_dir: Path, target: str) -> Path:
    """The target's wheel, built once per test session."""
    done = list((wheel_dir / target).glob("*.whl"))
    if done:
        return done[0]
    arch = WHEELS[target][1]
    try:
        toolchain.find_toolchain(arch)
    except toolchain.ToolchainError as e:
        pytest.skip(f"no {arch} toolchain to build the {target} wheel: {e}")
    # --no-isolation: build.py runs with this interpreter's packages, offline; -x: the
    # wheel path needs no setuptools, so an older one installed here is fine.
    r = _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "-x",
              "--outdir", str(wheel_dir / target), str(ROOT)], wheel_dir,
             _clean_env(ZYFA_WHEEL_TARGET=target))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (path,) = (wheel_dir / target).glob("*.whl")
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("venv")
    r = _run([sys.executable, "-m", "venv", str(path)], path, _clean_env())
    assert r.returncode == 0, r.stderr
    return path


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _zyfa(venv: Path, *args, **env) -> subprocess.CompletedProcess:
    """The installed zyfa, run from an empty directory with only the venv on PATH."""
    workdir = venv / "work"
    workdir.mkdir(exist_ok=True)
    path = str(venv / "bin")
    assert not [c for c in COMPILERS if shutil.which(c, path=path)]
    run_env = {"PATH": path, "HOME": str(workdir), "ZYFA_CACHE_DIR": str(workdir / "cache"),
               **env}
    for key in ("LD_LIBRARY_PATH", "SYSTEMROOT"):
        if key in os.environ:
            run_env[key] = os.environ[key]
    return _run([str(_python(venv)), *args], workdir, run_env)


def _install(venv: Path, wheel: Path, target: str) -> None:
    """Install ``wheel`` after removing the other target's (they share the import packages)."""
    pip = [str(_python(venv)), "-m", "pip", "--disable-pip-version-check", "-q"]
    others = [dist for t, (dist, _, _) in WHEELS.items() if t != target]
    r = _run([*pip, "uninstall", "-y", *others], venv, _clean_env())
    assert r.returncode == 0, r.stderr
    r = _run([*pip, "install", str(wheel)], venv, _clean_env())
    assert r.returncode == 0, (f"installing {wheel.name} and its dependencies from pip's index "
                               f"or cache failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


def _check_wheel_file(wheel: Path, target: str) -> dict:
    """The wheel's name, tags, metadata, RECORD and code objects; returns its manifest."""
    dist, arch, n_kernels = WHEELS[target]
    stem = f"{dist.replace('-', '_')}-{__version__}"
    assert wheel.name == f"{stem}-{TAG}.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        files = {n: zf.read(n) for n in names}
    info = f"{stem}.dist-info"
    assert f"Tag: {TAG}" in files[f"{info}/WHEEL"].decode()
    meta = files[f"{info}/METADATA"].decode()
    assert f"Name: {dist}\n" in meta and f"Version: {__version__}\n" in meta
    assert "Requires-Dist: numpy" in meta and "extra ==" not in meta
    record = list(csv.reader(io.StringIO(files[f"{info}/RECORD"].decode())))
    assert {row[0] for row in record} == set(names)
    for path, digest, size in record:
        if path != f"{info}/RECORD":
            raw = hashlib.sha256(files[path]).digest()
            assert digest == "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
            assert int(size) == len(files[path])
    # Runtime packages and prebuilt/ only: no generator, build.py, tests or kernel sources.
    assert {n.split("/")[0] for n in names} == {"zyfa_runtime", "zyfa_emulator", info}
    manifest = json.loads(files["zyfa_runtime/prebuilt/manifest.json"])
    assert manifest["package_version"] == __version__ and manifest["toolkits"][arch] == TOOLKIT[arch]
    assert manifest["compilers"][arch]["version"]
    built = [e for e in manifest["kernels"] if e["built"]]
    assert len(built) == n_kernels and {e["variant"]["arch"] for e in built} == {arch}
    # the auxiliary kernels (merge_attention_states) ship beside the attention ones
    aux = [e for e in manifest.get("aux_kernels", []) if e["built"]]
    assert len(aux) == len(catalogue.AUX_KINDS) and {e["arch"] for e in aux} == {arch}
    for e in built + aux:
        data = files[f"zyfa_runtime/prebuilt/{e['file']}"]
        assert hashlib.sha256(data).hexdigest() == e["sha256"]
    objects = [n for n in names if n.endswith((".cubin", ".hsaco"))]
    assert sorted(objects) == sorted(f"zyfa_runtime/prebuilt/{e['file']}" for e in built + aux)
    return manifest


#: Run in the venv: import and launch on the fake backend with process creation forbidden,
#: so nothing can compile; print where the code objects came from.
NO_COMPILE = r"""
import json, os, subprocess, sys
def refuse(*a, **k):
    raise AssertionError(f"zyfa started a process: {a}")
subprocess.Popen = os.posix_spawn = os.fork = os.execv = os.system = refuse
import numpy as np
import zyfa_runtime
from zyfa_runtime import cache, flash_attn_func
from zyfa_runtime.driver import get_driver
from zyfa_runtime.memory import host_dtype
q = np.zeros((1, 64, 2, 64), host_dtype("bf16"))
flash_attn_func(q, q, q, causal=True)
assert len(get_driver().launches) == 1
assert not [m for m in sys.modules if m == "generator" or m.startswith("generator.")]
print(json.dumps({"prebuilt": str(cache.prebuilt_dir()), "package": zyfa_runtime.__file__,
                  "prefix": sys.prefix}))
"""


def _check_installed(venv: Path, target: str) -> None:
    _, arch, n_kernels = WHEELS[target]
    other_dist, other, _ = next(w for t, w in WHEELS.items() if t != target)

    r = _zyfa(venv, "-c", NO_COMPILE, ZYFA_BACKEND="fake", ZYFA_FAKE_ARCH=arch)
    assert r.returncode == 0, r.stderr
    where = json.loads(r.stdout)
    assert where["package"].startswith(where["prefix"])                  # not the source tree
    assert Path(where["prebuilt"]) == Path(where["package"]).parent / "prebuilt"

    r = _zyfa(venv, "-m", "zyfa_runtime", "info")                       # no GPU needed
    assert r.returncode == 0, r.stderr
    assert f"prebuilt     {where['prebuilt']}" in r.stdout
    assert f"installed    {WHEELS[target][0]} {__version__}\n" in r.stdout    # and nothing else
    assert f"{arch}: {n_kernels} kernels for {TOOLKIT[arch]} (the pin), built with" in r.stdout
    assert f"{other}: {TOOLKIT[other]}, no kernels in this installation" in r.stdout

    r = _zyfa(venv, "-m", "zyfa_runtime", "info", ZYFA_BACKEND="fake", ZYFA_FAKE_ARCH=arch)
    assert r.returncode == 0, r.stderr
    assert f"({arch}), {n_kernels} kernels available" in r.stdout

    r = _zyfa(venv, "-m", "zyfa_runtime", "info", ZYFA_BACKEND="fake", ZYFA_FAKE_ARCH=other)
    assert r.returncode == 1
    assert f"has kernels for {arch} only" in r.stdout
    assert f"pip install {other_dist}=={__version__}" in r.stdout


def test_no_target_is_a_clear_error(tmp_path):
    if not _have_build(tmp_path):
        pytest.skip("the PyPA `build` package is not installed (pip install -e '.[test]')")
    r = _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "-x",
              "--outdir", str(tmp_path), str(ROOT)], tmp_path, _clean_env())
    assert r.returncode != 0
    text = r.stdout + r.stderr
    assert "ZYFA_WHEEL_TARGET=cuda builds zyfa-cuda13" in text
    assert "ZYFA_WHEEL_TARGET=rocm builds zyfa-rocm7-2" in text and "pip install -e ." in text
    assert not list(tmp_path.glob("*.whl"))


def test_cuda_wheel_installs_and_runs_without_a_compiler(wheel_dir, venv):
    wheel = _build(wheel_dir, "cuda")
    _check_wheel_file(wheel, "cuda")
    _install(venv, wheel, "cuda")
    _check_installed(venv, "cuda")
    r = _zyfa(venv, "-m", "zyfa_runtime", "info", ZYFA_BACKEND="fake",
              ZYFA_FAKE_VERSIONS="driver_version=12080")
    assert r.returncode == 1 and "CUDA 12.8" in r.stdout and "zyfa-cuda13" in r.stdout


def test_rocm_wheel_installs_and_runs_on_the_emulator(wheel_dir, venv):
    wheel = _build(wheel_dir, "rocm")
    _check_wheel_file(wheel, "rocm")
    _install(venv, wheel, "rocm")
    _check_installed(venv, "rocm")
    # The installed gfx950 code objects execute, on the CPU emulator, against the reference.
    r = _zyfa(venv, "-m", "zyfa_runtime", "check", "--only", "bf16_d64x64_full", "--seed", "0",
              ZYFA_BACKEND="emulator")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4/4 cases passed" in r.stdout
