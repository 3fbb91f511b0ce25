"""Code objects on disk: where they live, the manifest, integrity checks, atomic publication.

Two places hold code objects:

* the *prebuilt* directory shipped with the package (``zyfa_runtime/prebuilt`` in a
  wheel, the repository's ``prebuilt/`` in a source checkout), overridable with
  ``ZYFA_PREBUILT_DIR``; it holds ``manifest.json`` and is read-only at run time;
* a per-user cache, ``platformdirs.user_cache_dir("zyfa")`` or ``ZYFA_CACHE_DIR``,
  keyed ``<root>/<package_version>/<toolkit-slug>/<arch>/``.

Every read is checked against the manifest's SHA-256 before the bytes are handed
out; every write goes to a unique temporary file in the destination directory and
is published with ``os.replace``, so concurrent writers of the same content are
harmless and readers never see a partial file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
from pathlib import Path, PurePosixPath
from typing import Iterable

import platformdirs

from .catalogue import TOOLKIT
from .errors import CodeObjectError

PREBUILT_ENV = "ZYFA_PREBUILT_DIR"
CACHE_ENV = "ZYFA_CACHE_DIR"
MANIFEST_NAME = "manifest.json"
REQUIRED_KEYS = ("package_version", "toolkits", "compilers", "kernels")

_PACKAGE_DIR = Path(__file__).resolve().parent
_SHA256 = re.compile(r"[0-9a-f]{64}")


# --------------------------------------------------------------------------------------
# Locations

def prebuilt_dir() -> Path:
    """The directory holding the shipped code objects and ``manifest.json``."""
    env = os.environ.get(PREBUILT_ENV)
    if env:
        return Path(env)
    for candidate in (_PACKAGE_DIR / "prebuilt", _PACKAGE_DIR.parent / "prebuilt"):
        if candidate.is_dir():
            return candidate
    return _PACKAGE_DIR / "prebuilt"


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path(platformdirs.user_cache_dir("zyfa"))


def toolkit_slug(toolkit: str) -> str:
    """``"CUDA 13.0"`` -> ``"cuda-13.0"``, ``"ROCm 7.2.3"`` -> ``"rocm-7.2.3"``."""
    slug = re.sub(r"[^a-z0-9.]+", "-", toolkit.strip().lower()).strip("-.")
    if not slug:
        raise CodeObjectError(f"cannot make a directory name from toolkit {toolkit!r}")
    return slug


def user_cache_dir(package_version: str, toolkit: str, arch: str) -> Path:
    return cache_root() / _component(package_version) / toolkit_slug(toolkit) / _component(arch)


def toolkit_of(manifest: dict, arch: str) -> str:
    """The toolkit ``arch``'s code objects were built with, from ``manifest["toolkits"]``."""
    value = manifest.get("toolkits", {}).get(arch, TOOLKIT.get(arch))
    if not isinstance(value, str):
        raise CodeObjectError(f"the manifest names no toolkit for arch {arch!r}")
    return value


def search_dirs(manifest: dict, arch: str, prebuilt: Path | None = None) -> list[Path]:
    """Where ``arch``'s code objects are looked for: prebuilt first, then the user cache."""
    return [Path(prebuilt) if prebuilt else prebuilt_dir(),
            user_cache_dir(str(manifest["package_version"]), toolkit_of(manifest, arch), arch)]


def _component(text: str) -> str:
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\0" in text:
        raise CodeObjectError(f"{text!r} cannot be used as a directory name")
    return text


def _relative(name: str) -> PurePosixPath:
    """A manifest file name as a safe relative path (no absolute paths, no ``..``)."""
    rel = PurePosixPath(str(name))
    if not str(name) or rel.is_absolute() or ".." in rel.parts or "\\" in str(name):
        raise CodeObjectError(f"code object name {name!r} is not a plain relative path")
    return rel


# --------------------------------------------------------------------------------------
# Manifest

def load_manifest(prebuilt: Path | str | None = None) -> dict:
    """Read and validate ``manifest.json`` from the prebuilt directory."""
    path = Path(prebuilt if prebuilt is not None else prebuilt_dir()) / MANIFEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CodeObjectError(f"no kernel manifest at {path}: this installation has no prebuilt "
                              f"code objects (build them, or point {PREBUILT_ENV} at a "
                              "directory that has them)") from None
    except OSError as e:
        raise CodeObjectError(f"cannot read the kernel manifest {path}: {e}") from e
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise CodeObjectError(f"the kernel manifest {path} is not valid JSON: {e}") from e
    if not isinstance(manifest, dict):
        raise CodeObjectError(f"the kernel manifest {path} must be a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise CodeObjectError(f"the kernel manifest {path} lacks {', '.join(missing)}")
    kinds = {"package_version": str, "toolkits": dict, "compilers": dict, "kernels": (list, dict)}
    for key, kind in kinds.items():
        if not isinstance(manifest[key], kind):
            raise CodeObjectError(f"the kernel manifest {path} has a malformed {key!r}")
    return manifest


# --------------------------------------------------------------------------------------
# Integrity

def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _expected_digest(entry: dict) -> str:
    digest = entry.get("sha256")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest.lower()):
        raise CodeObjectError(f"manifest entry for {entry.get('file')!r} has no valid sha256")
    return digest.lower()


def read_code_object(entry: dict, search_dirs: Iterable[Path | str]) -> bytes:
    """The bytes of ``entry["file"]`` from the first directory that holds a copy whose
    SHA-256 matches ``entry["sha256"]``.  Unverified bytes are never returned."""
    if "file" not in entry:
        raise CodeObjectError(f"manifest entry {entry!r} names no file")
    rel, expected = _relative(entry["file"]), _expected_digest(entry)
    dirs = [Path(d) for d in search_dirs]
    problems = []
    for d in dirs:
        path = d / rel
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        except OSError as e:
            problems.append(f"{path}: {e}")
            continue
        actual = sha256_hex(data)
        if actual == expected:
            return data
        problems.append(f"{path}: sha256 {actual}, expected {expected}")
    if problems:
        raise CodeObjectError(f"code object {rel} failed its integrity check and was not "
                              f"loaded: {'; '.join(problems)}")
    raise CodeObjectError(f"code object {rel} (sha256 {expected}) is missing; looked in "
                          + ", ".join(str(d) for d in dirs))


# --------------------------------------------------------------------------------------
# Writing

def atomic_write(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that no reader ever sees a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                         0o644)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def store_code_object(cache_dir: Path | str, name: str, data: bytes, sha256: str) -> Path:
    """Publish a code object into ``cache_dir`` after checking it against ``sha256``."""
    expected = _expected_digest({"file": name, "sha256": sha256})
    actual = sha256_hex(data)
    if actual != expected:
        raise CodeObjectError(f"refusing to store code object {name}: sha256 {actual}, "
                              f"expected {expected}")
    path = Path(cache_dir) / _relative(name)
    try:
        if sha256_hex(path.read_bytes()) == expected:
            return path                         # already there, intact
    except OSError:
        pass
    atomic_write(path, data)
    return path
