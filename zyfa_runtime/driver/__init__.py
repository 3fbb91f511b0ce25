"""Driver backends and the choice between them.

``get_driver()`` returns one shared instance per backend.  The backend is the one
named by the caller, else by ``ZYFA_BACKEND`` (``cuda``, ``hip``, ``fake``,
``emulator``), else the first of CUDA and HIP whose library loads and that sees at
least one device.
``ZYFA_FAKE_ARCH`` sets the arch the fake backend reports (default ``sm_90a``),
``ZYFA_FAKE_VERSIONS`` the versions (default: those zyfa's toolkit pins ask for; see fake.py),
``ZYFA_FAKE_DISCRETE=1`` makes its memory a GPU's (host memory apart).
"""

from __future__ import annotations

import importlib
import os
import threading

from ..errors import ZyfaError
from .base import ATTRIBUTES, Driver, Function, Module

__all__ = ["ATTRIBUTES", "BACKENDS", "Driver", "Function", "Module", "get_driver"]

BACKENDS = ("cuda", "hip", "fake", "emulator")
BACKEND_ENV = "ZYFA_BACKEND"

_lock = threading.Lock()
_drivers: dict[str, Driver] = {}


def _create(name: str) -> Driver:
    if name == "cuda":
        from .cuda import CudaDriver
        return CudaDriver()
    if name == "hip":
        from .hip import HipDriver
        return HipDriver()
    if name == "fake":
        from .fake import FakeDriver, parse_versions
        return FakeDriver(arch=os.environ.get("ZYFA_FAKE_ARCH", "sm_90a"),
                          versions=parse_versions(os.environ.get("ZYFA_FAKE_VERSIONS", "")),
                          discrete=os.environ.get("ZYFA_FAKE_DISCRETE", "") == "1")
    if name == "emulator":
        try:
            module = importlib.import_module("zyfa_emulator.driver")
        except ImportError as e:
            raise ZyfaError("backend 'emulator' needs the zyfa_emulator package, which is not "
                            f"installed or failed to import ({e})") from e
        return module.EmulatorDriver()
    raise ZyfaError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


def _cached(name: str) -> Driver:
    with _lock:
        if name not in _drivers:
            _drivers[name] = _create(name)
        return _drivers[name]


def get_driver(name: str | None = None) -> Driver:
    """The driver for backend ``name``, ``$ZYFA_BACKEND``, or the first usable GPU backend."""
    name = name or os.environ.get(BACKEND_ENV)
    if name:
        return _cached(name.strip().lower())
    tried = []
    for candidate in ("cuda", "hip"):
        try:
            driver = _cached(candidate)
            count = driver.device_count()
        except ZyfaError as e:
            tried.append(f"{candidate}: {e}")
            continue
        if count > 0:
            return driver
        tried.append(f"{candidate}: the driver loads but sees no device")
    raise ZyfaError("no GPU backend is usable. " + " | ".join(t.rstrip(".") for t in tried)
                    + f". Set {BACKEND_ENV}=fake (or emulator) to run without a GPU.")


def _reset() -> None:
    """Forget the cached drivers (tests)."""
    with _lock:
        _drivers.clear()
