"""Find and drive the compilers that turn emitted sources into code objects.

gfx950: HIP C++ is compiled with clang's device front end (``-cc1 ... -x hip
-fcuda-is-device``, no HIP headers or device libraries needed) and linked into a
code object with ``ld.lld -shared``.  Any clang that knows gfx950 will do; they are
searched in this order:

1. ``ZYFA_GFX950_CLANG`` (and optionally ``ZYFA_GFX950_LLD``), if set;
2. ROCm's own LLVM: ``$ROCM_PATH/llvm/bin``, ``/opt/rocm/llvm/bin``, ``/opt/rocm-*/llvm/bin``;
3. a system LLVM >= 20 on ``PATH`` (``clang-22``, ``clang-21``, ``clang-20``, ``clang``);
4. the ``ziglang`` Python package (``pip install ziglang``), which bundles clang and lld.

sm_90a: ``nvcc`` from ``CUDA_HOME`` / ``CUDA_PATH`` / ``PATH`` / ``/usr/local/cuda``.

Every compile runs in a private temporary directory on fixed relative file names,
so no path or time ends up in the output: two builds of one source are
byte-identical.  Code objects for gfx950 are pinned to code-object version 6
(what LLVM's assembler defaults to, and what ROCm 7 loads).
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: Oldest system LLVM accepted (gfx950 support landed in LLVM 20).
MIN_LLVM_MAJOR = 20
#: Oldest CUDA that targets sm_90a.
MIN_CUDA_MAJOR = 12

CODE_OBJECT_VERSION = 6

#: clang -cc1 flags for the HIP device compile (input and output names are appended).
HIP_FLAGS = (
    "-cc1", "-triple", "amdgcn-amd-amdhsa", "-target-cpu", "gfx950",
    "-x", "hip", "-fcuda-is-device", "-std=c++17", "-O3",
    f"-mcode-object-version={CODE_OBJECT_VERSION}",
    "-ffp-contract=fast-honor-pragmas",   # hipcc's default
    "-fno-threadsafe-statics",
    "-emit-obj",
)
#: clang -cc1as flags for gfx950 assembly (the source sets its own code-object version).
ASM_FLAGS = ("-cc1as", "-triple", "amdgcn-amd-amdhsa", "-target-cpu", "gfx950",
             "-filetype", "obj", "-mrelocation-model", "pic")
#: ld.lld flags turning one relocatable object into a loadable code object.
LINK_FLAGS = ("-shared", "--no-undefined", "--build-id=none")
#: nvcc flags for the sm_90a cubin.
NVCC_FLAGS = ("-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17")

TIMEOUT_S = 900

#: What ptxas says when it serialises a kernel's WGMMAs (a register of one in flight is read or
#: written before its wait, on some path): the kernel still runs, but its products no longer
#: overlap anything, so a build that meets it fails.
WGMMA_SERIALISED = "wgmma.mma_async instructions are serialized"


class ToolchainError(RuntimeError):
    """No usable compiler was found; the message says what to install."""


class CompileError(RuntimeError):
    """A compiler or linker run failed; the message carries its output."""


@dataclasses.dataclass(frozen=True)
class Toolchain:
    arch: str                      # "gfx950" or "sm_90a"
    name: str                      # "rocm-llvm", "llvm-22", "ziglang", "nvcc", ...
    version: str                   # the compiler's own version line
    compiler: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    linker: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    linker_version: str = ""

    @property
    def flags(self) -> tuple[str, ...]:
        return NVCC_FLAGS if self.arch == "sm_90a" else HIP_FLAGS + ASM_FLAGS + LINK_FLAGS

    def identity(self) -> str:
        """What determines the output besides the source (no paths): for content hashes."""
        parts = [self.arch, self.name, self.version, self.linker_version, " ".join(self.flags)]
        return "\n".join(p for p in parts if p)

    def compile_cxx(self, source: str, out: Path) -> None:
        """Compile one translation unit to ``out`` (.hsaco for gfx950, .cubin for sm_90a)."""
        if self.arch == "sm_90a":
            image = _in_tempdir(
                {"kernel.cu": source},
                [[*self.compiler, *NVCC_FLAGS, "-o", "kernel.cubin", "kernel.cu"]],
                "kernel.cubin", tmp_env=True, check_log=_refuse_serialised_wgmma)
        else:
            image = _in_tempdir(
                {"kernel.hip": source},
                [[*self.compiler, *HIP_FLAGS, "-o", "kernel.o", "kernel.hip"],
                 [*self.linker, *LINK_FLAGS, "-o", "kernel.hsaco", "kernel.o"]],
                "kernel.hsaco")
        Path(out).write_bytes(image)

    def assemble(self, asm: str, out: Path) -> None:
        """Assemble gfx950 assembly to a code object at ``out``."""
        if self.arch != "gfx950":
            raise NotImplementedError(f"no assembler path for {self.arch}")
        image = _in_tempdir(
            {"kernel.s": asm},
            [[*self.compiler, *ASM_FLAGS, "-o", "kernel.o", "kernel.s"],
             [*self.linker, *LINK_FLAGS, "-o", "kernel.hsaco", "kernel.o"]],
            "kernel.hsaco")
        Path(out).write_bytes(image)


def find_toolchain(arch: str) -> Toolchain:
    if arch == "gfx950":
        return _find_gfx950()
    if arch == "sm_90a":
        return _find_nvcc()
    raise ToolchainError(f"no toolchain for unknown arch {arch!r}")


# --------------------------------------------------------------------------------------
# Running the compilers

def _run(cmd: list[str], cwd: str | None = None, env: dict | None = None,
         stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, input=stdin, capture_output=True,
                              text=True, errors="replace", timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompileError(f"could not run {_show(cmd)}: {e}") from e


def _show(cmd: list[str]) -> str:
    return " ".join(cmd)


def _refuse_serialised_wgmma(cmd: list[str], log: str) -> None:
    lines = [line for line in log.splitlines() if WGMMA_SERIALISED in line]
    if lines:
        raise CompileError(f"{_show(cmd)}: ptxas serialised the WGMMAs:\n" + "\n".join(lines))


def _in_tempdir(inputs: dict[str, str], steps: list[list[str]], result: str,
                tmp_env: bool = False, check_log=None) -> bytes:
    """Write ``inputs`` into a fresh directory, run ``steps`` there, return ``result``'s bytes.
    ``check_log(cmd, output)``, if given, sees each successful step's output and may raise."""
    with tempfile.TemporaryDirectory(prefix="zyfa-build-") as tmp:
        for name, text in inputs.items():
            Path(tmp, name).write_text(text, encoding="utf-8")
        env = None
        if tmp_env:   # keep the compiler's own intermediates in the private directory too
            env = dict(os.environ, TMPDIR=tmp, TMP=tmp, TEMP=tmp)
        for cmd in steps:
            proc = _run(cmd, cwd=tmp, env=env)
            if proc.returncode != 0:
                log = (proc.stderr + proc.stdout).strip()
                raise CompileError(f"{_show(cmd)} failed (exit {proc.returncode}):\n{log}")
            if check_log is not None:
                check_log(cmd, proc.stderr + proc.stdout)
        return Path(tmp, result).read_bytes()


def _version_line(cmd: list[str]) -> str:
    proc = _run([*cmd, "--version"])
    out = (proc.stdout or proc.stderr).strip()
    if proc.returncode != 0 or not out:
        raise CompileError(f"{_show(cmd)} --version failed: {(proc.stderr or proc.stdout).strip()}")
    return out.splitlines()[0].strip()


def _major(version_line: str) -> int:
    m = re.search(r"(?:version|LLD)\s+(\d+)\.", version_line)
    return int(m.group(1)) if m else 0


# --------------------------------------------------------------------------------------
# gfx950

def _knows_gfx950(clang: list[str]) -> bool:
    """Whether this clang accepts gfx950 (a syntax-only run on an empty HIP unit)."""
    cmd = [*clang, "-cc1", "-triple", "amdgcn-amd-amdhsa", "-target-cpu", "gfx950",
           "-x", "hip", "-fcuda-is-device", "-fsyntax-only", "-"]
    try:
        return _run(cmd, stdin="").returncode == 0
    except CompileError:
        return False


def _llvm_pair(clang: list[str], lld: list[str], name: str, min_major: int) -> Toolchain | None:
    try:
        version = _version_line(clang)
        linker_version = _version_line(lld)
    except CompileError:
        return None
    if min(_major(version), _major(linker_version)) < min_major or not _knows_gfx950(clang):
        return None
    return Toolchain("gfx950", name, version, tuple(clang), tuple(lld), linker_version)


def _lld_beside(clang_path: str, major: int | None = None) -> str | None:
    """The ld.lld of clang's own installation, else a version-suffixed one on PATH."""
    real_dir = os.path.dirname(os.path.realpath(clang_path))
    cand = os.path.join(real_dir, "ld.lld")
    if os.access(cand, os.X_OK):
        return cand
    if major and shutil.which(f"ld.lld-{major}"):
        return shutil.which(f"ld.lld-{major}")
    cand = os.path.join(os.path.dirname(clang_path), "ld.lld")
    return cand if os.access(cand, os.X_OK) else None


def _rocm_dirs() -> list[str]:
    roots = []
    if os.environ.get("ROCM_PATH"):
        roots.append(os.environ["ROCM_PATH"])
    roots.append("/opt/rocm")
    roots += sorted(glob.glob("/opt/rocm-*"), reverse=True)
    return [os.path.join(r, "llvm", "bin") for r in roots]


def _find_gfx950() -> Toolchain:
    tried = []

    override = os.environ.get("ZYFA_GFX950_CLANG")
    if override:
        lld = os.environ.get("ZYFA_GFX950_LLD") or _lld_beside(shutil.which(override) or override)
        tc = lld and _llvm_pair([override], [lld], "custom-llvm", 0)
        if tc:
            return tc
        raise ToolchainError(
            f"ZYFA_GFX950_CLANG={override} is not a working clang with gfx950 support"
            + ("" if lld else " (and no ld.lld beside it: set ZYFA_GFX950_LLD)"))

    for d in _rocm_dirs():
        clang, lld = os.path.join(d, "clang"), os.path.join(d, "ld.lld")
        if os.access(clang, os.X_OK) and os.access(lld, os.X_OK):
            tried.append(clang)
            tc = _llvm_pair([clang], [lld], "rocm-llvm", 0)
            if tc:
                return tc

    for exe in ("clang-22", "clang-21", "clang-20", "clang"):
        path = shutil.which(exe)
        if not path:
            continue
        tried.append(exe)
        try:
            major = _major(_version_line([path]))
        except CompileError:
            continue
        lld = _lld_beside(path, major)
        if major >= MIN_LLVM_MAJOR and lld:
            tc = _llvm_pair([path], [lld], f"llvm-{major}", MIN_LLVM_MAJOR)
            if tc:
                return tc

    if importlib.util.find_spec("ziglang") is not None:
        tried.append("ziglang")
        zig = [sys.executable, "-m", "ziglang"]
        tc = _llvm_pair([*zig, "clang"], [*zig, "ld.lld"], "ziglang", MIN_LLVM_MAJOR)
        if tc:
            return tc

    raise ToolchainError(
        "no compiler for gfx950 found"
        + (f" (tried: {', '.join(tried)})" if tried else "")
        + ": install ROCm (set ROCM_PATH), or LLVM >= 20 with lld (e.g. the clang-22 and "
          "lld-22 packages), or `pip install ziglang`; or point ZYFA_GFX950_CLANG at a clang")


# --------------------------------------------------------------------------------------
# sm_90a

def _nvcc_candidates() -> list[str]:
    out = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            out.append(os.path.join(os.environ[var], "bin", "nvcc"))
    if shutil.which("nvcc"):
        out.append(shutil.which("nvcc"))
    out.append("/usr/local/cuda/bin/nvcc")
    return out


def _find_nvcc() -> Toolchain:
    tried = []
    for nvcc in _nvcc_candidates():
        if not os.access(nvcc, os.X_OK) or nvcc in tried:
            continue
        tried.append(nvcc)
        try:
            proc = _run([nvcc, "--version"])
        except CompileError:
            continue
        build = re.search(r"Build (\S+)", proc.stdout)
        release = re.search(r"V(\d+)\.(\d+)\.(\d+)", proc.stdout)
        if proc.returncode != 0 or not release:
            continue
        if int(release.group(1)) < MIN_CUDA_MAJOR:
            continue
        version = f"{build.group(1)} {release.group(0)}" if build else release.group(0)
        return Toolchain("sm_90a", "nvcc", version, (nvcc,))
    raise ToolchainError(
        "no nvcc >= CUDA 12.0 found"
        + (f" (tried: {', '.join(tried)})" if tried else "")
        + ": install the CUDA toolkit and set CUDA_HOME, or put nvcc on PATH")
