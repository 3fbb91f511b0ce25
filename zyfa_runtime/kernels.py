"""Load stage: manifest entry -> verified code object -> module -> function, once per device.

Creating the table checks that the manifest is this runtime's and that the driver's
versions meet the manifest's toolkit pins; a device's arch is checked before its first
kernel (``versions.py``)."""

from __future__ import annotations

import dataclasses
import threading

from . import cache, versions
from .catalogue import AuxKernel, KernArg, Variant
from .errors import ZyfaError


@dataclasses.dataclass(frozen=True, eq=False)
class Kernel:
    """One loaded kernel: its manifest entry and the driver's function handle, and those of its
    pre-pass (launched first) and its tail kernel (launched after it), where the entry has them,
    all with the same arguments.  Compared and hashed by identity: a table loads one a (device,
    variant).  An auxiliary kernel (the manifest's ``aux_kernels``) has its AuxKernel as
    ``variant``."""
    variant: Variant | AuxKernel
    entry: dict
    function: object
    prepass: object = None
    tail: object = None

    @property
    def kernargs(self) -> list[KernArg]:
        return [KernArg(**a) for a in self.entry["kernargs"]]


class KernelTable:
    """The kernels of one manifest, loaded lazily per (device, variant); thread-safe."""

    def __init__(self, driver, manifest: dict, prebuilt):
        versions.check_manifest(manifest, prebuilt)
        versions.check_toolkit(driver, manifest)
        self.driver = driver
        self.manifest = manifest
        self.prebuilt = prebuilt
        self._entries = {Variant.from_json(e["variant"]): e for e in manifest["kernels"]}
        self._aux_entries = {AuxKernel.from_json(e): e for e in manifest.get("aux_kernels", [])}
        self._loaded: dict[tuple[int, Variant], Kernel] = {}
        self._archs: dict[int, str] = {}
        self._lock = threading.Lock()

    def device_arch(self, device: int) -> str:
        """The arch of ``device``, checked to have kernels in this manifest."""
        arch = self._archs.get(device)
        if arch is None:
            arch = self.driver.arch(device)
            versions.check_arch(self.manifest, arch,
                                f"device {device} ({self.driver.device_name(device)})")
            self._archs[device] = arch
        return arch

    def entry(self, variant: Variant) -> dict | None:
        return self._entries.get(variant)

    def available(self, arch: str) -> list[Variant]:
        return sorted(v for v, e in self._entries.items() if v.arch == arch and e.get("built"))

    def aux(self, device: int, kind: str) -> Kernel:
        """The auxiliary kernel of ``kind`` for ``device``'s arch, loaded once."""
        return self.get(device, AuxKernel(kind, self.device_arch(device)))

    def get(self, device: int, variant: Variant | AuxKernel) -> Kernel:
        key = (device, variant)
        kernel = self._loaded.get(key)
        if kernel is not None:
            return kernel
        with self._lock:
            kernel = self._loaded.get(key)
            if kernel is None:
                # A first call may come inside a graph capture, whose global mode refuses module
                # loads: loaded in the relaxed mode (no stream operation is involved).
                with self.driver.relaxed_capture():
                    kernel = self._load(device, variant)
                self._loaded[key] = kernel
        return kernel

    def _load(self, device: int, variant: Variant | AuxKernel) -> Kernel:
        entries = self._aux_entries if isinstance(variant, AuxKernel) else self._entries
        entry = entries.get(variant)
        if entry is None:
            raise ZyfaError(f"no kernel {variant.name} in the manifest")
        if not entry.get("built"):
            raise ZyfaError(f"kernel {variant.name} is listed but not built: {entry.get('reason', '')}")
        arch = self.device_arch(device)
        if variant.arch != arch:
            raise ZyfaError(f"kernel {variant.name} is for {variant.arch}; device {device} is {arch}")
        dirs = cache.search_dirs(self.manifest, variant.arch, self.prebuilt)
        image = cache.read_code_object(entry, dirs)   # sha256-verified bytes
        self.driver.make_current(device)
        module = self.driver.load_module(device, image)
        function = self.driver.get_function(module, entry["symbol"])
        if entry["dynamic_smem"] > 0:
            self.driver.set_max_dynamic_shared(function, entry["dynamic_smem"])
        prepass = tail = None
        if "prepass" in entry:
            prepass = self.driver.get_function(module, entry["prepass"]["symbol"])
        if "split_tail" in entry:
            tail = self.driver.get_function(module, entry["split_tail"]["symbol"])
            if entry["dynamic_smem"] > 0:
                self.driver.set_max_dynamic_shared(tail, entry["dynamic_smem"])
        return Kernel(variant, entry, function, prepass, tail)
