"""AMD AITER's FAv3 forward attention kernels for gfx950, on the emulator.

Source: the PyPI wheel ``amd-aiter`` (MIT), pinned below by version and sha256.  From it
only these files are used (extracted into the cache, never into the repository):

* ``aiter_meta/hsa/gfx950/fmha_v3_fwd/<kernel>.co`` -- the eight BF16 code objects,
  ``fwd_hd128_bf16``, ``fwd_hd192_hd128_bf16`` and their ``_causal``, ``_group`` and
  ``_causal_group`` forms;
* ``aiter_meta/csrc/include/mha_fwd.h`` -- ``struct fmha_fwd_v3_args``, the kernels'
  argument block, and ``aiter_meta/csrc/include/aiter_hip_common.h`` -- the padding
  structs ``p1``/``p2``/``p3`` it uses.

The argument layout is *parsed from that header* (:func:`parse_struct`) and checked
against each code object's metadata (``.kernarg_segment_size`` and the offsets and
sizes of its named arguments) before anything is launched.  The values follow the
wheel's launch code (``hsa/gfx950/fmha_v3_fwd/codegen.py``, the dispatchers
``fmha_fwd_v3_dispatcher`` / ``fmha_fwd_v3_group_dispatcher``; strides from
``csrc/py_itfs_cu/asm_mha_fwd.cu`` / ``asm_mha_varlen_fwd.cu``):

* strides are element strides times 2 (bf16) in bytes, the LSE head stride times 4;
  ``s_Ts`` = ``ts_qo`` x the Q row stride, ``ts_qo`` = 256 (d 128) or 128 (d 192);
* ``scalar`` = the softmax scale (1/sqrt(d) by default);
* ``s_opt`` = 5, or 3 for a causal kernel when Hq % 8 != 0 or the query length (the
  total in group mode) exceeds 16384; ``s_lse`` = 1 when the LSE is written;
* batch mode: grid (ceil(ceil(Sq / ts_qo) / tg_div), Hq, B); group (varlen) mode: grid
  (Hq, B, ceil(ceil(total_q / ts_qo) / tg_div)), batch strides 0, ``s_seq_len`` /
  ``s_kv_seq_len`` the totals, ``ptr_qseq`` / ``ptr_kseq`` (and the ``_padding`` ones)
  the int32 cumulative sequence starts; tg_div = 2 for causal kernels, else 1;
* block (512, 1, 1) for d 128, (256, 1, 1) for d 192; no dynamic LDS;
* causal masking is bottom-right aligned (the batch dispatcher takes top-left only when
  Sq == Sk, where the two agree).

Layouts: batch q (B, Sq, Hq, d), k (B, Sk, Hkv, d), v (B, Sk, Hkv, dv) -> out
(B, Sq, Hq, dv) bf16, lse (B, Hq, Sq) fp32 (natural log); group mode packed (T, H, D),
lse (Hq, Tq) -- the layouts of ``zyfa_runtime.reference.attention``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from . import PeerUnavailable, peers_dir

PACKAGE = "amd-aiter"
VERSION = "0.1.7.post2.dev18"
WHEEL = f"amd_aiter-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "fe139d74438217c35e87e3b961166bac8db2d381eadccb371da2e63615f05a31"

KERNELS = ("fwd_hd128_bf16", "fwd_hd128_bf16_causal", "fwd_hd128_bf16_group",
           "fwd_hd128_bf16_causal_group", "fwd_hd192_hd128_bf16", "fwd_hd192_hd128_bf16_causal",
           "fwd_hd192_hd128_bf16_group", "fwd_hd192_hd128_bf16_causal_group")
_CO_DIR = "aiter_meta/hsa/gfx950/fmha_v3_fwd/"
HEADERS = ("aiter_meta/csrc/include/mha_fwd.h", "aiter_meta/csrc/include/aiter_hip_common.h")
MEMBERS = tuple(f"{_CO_DIR}{k}.co" for k in KERNELS) + HEADERS
ARGS_STRUCT = "fmha_fwd_v3_args"

#: Hazard-checker rules that only report, never stop, a launch of these kernels: three
#: of LLVM's gfx950 wait-state rules AITER's hand-scheduled code does not meet, and LDS
#: DMA writes over bytes other waves may still be reading (docs/emulator.md, "AMD's own
#: kernels"); every other rule stays fatal.
PEER_REPORT_ONLY = ("m0-lds-dma", "valu-sgpr-valu", "valu-permlane", "lds-dma-unordered")

#: Per head dimension (d, dv): query rows per workgroup (FmhaFwdV3Ts::ts_qo) and
#: work-items per workgroup (the launch code's bdx).
TILE = {(128, 128): (256, 512), (192, 128): (128, 256)}


# --------------------------------------------------------------------------------------
# fetching

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_dir() -> Path:
    return peers_dir() / f"{PACKAGE}-{VERSION}"


def _complete(target: Path) -> bool:
    stamp = target / "SOURCE.json"
    try:
        meta = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    if meta.get("wheel_sha256") != WHEEL_SHA256:
        return False
    files = meta.get("files", {})
    if set(files) != set(MEMBERS):
        return False
    return all((target / m).is_file() and _sha256(target / m) == files[m] for m in MEMBERS)


def _download(dest: Path) -> Path:
    """``pip download`` the pinned wheel from PyPI into ``dest``; returns its path."""
    local = os.environ.get("ZYFA_AITER_WHEEL")
    if local:
        return Path(local).expanduser()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--index-url", "https://pypi.org/simple", "--dest", str(dest),
           f"{PACKAGE}=={VERSION}"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PeerUnavailable(f"could not run pip to fetch {PACKAGE}=={VERSION}: {e}") from None
    wheel = dest / WHEEL
    if res.returncode != 0 or not wheel.is_file():
        tail = (res.stderr or res.stdout or "").strip().splitlines()[-5:]
        raise PeerUnavailable(f"pip download {PACKAGE}=={VERSION} failed (needs PyPI or a pip "
                              f"cache holding {WHEEL}):\n  " + "\n  ".join(tail))
    return wheel


def fetch(refresh: bool = False) -> Path:
    """The directory holding the eight code objects and the two headers (under their
    paths inside the wheel), fetched and extracted on first use.

    The wheel is downloaded with pip (``$ZYFA_AITER_WHEEL`` names an already downloaded
    copy instead), its sha256 must equal :data:`WHEEL_SHA256`, and only :data:`MEMBERS`
    are extracted -- into a temporary directory that is renamed into place, so a
    half-written cache is never seen.  ``SOURCE.json`` records the wheel's and every
    file's hash; a later call re-uses the cache when they still match."""
    target = cache_dir()
    if not refresh and _complete(target):
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
        tmp = Path(tmp)
        wheel = _download(tmp / "download")
        try:
            digest = _sha256(wheel)
        except OSError as e:
            raise PeerUnavailable(f"cannot read {wheel}: {e}") from None
        if digest != WHEEL_SHA256:
            raise PeerUnavailable(f"{wheel.name}: sha256 {digest}, expected the pinned "
                                  f"{WHEEL_SHA256}")
        staged = tmp / "staged"
        files = {}
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            missing = [m for m in MEMBERS if m not in names]
            if missing:
                raise PeerUnavailable(f"{wheel.name} lacks {missing}")
            for m in MEMBERS:
                out = staged / m
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(m))
                files[m] = _sha256(out)
        (staged / "SOURCE.json").write_text(json.dumps(
            {"package": PACKAGE, "version": VERSION, "wheel": WHEEL,
             "wheel_sha256": WHEEL_SHA256, "files": files}, indent=1, sort_keys=True))
        if target.exists():                  # a stale or damaged copy: moved aside, dropped
            os.rename(target, tmp / "old")
        try:
            os.rename(staged, target)
        except OSError:
            if not _complete(target):      # lost a race to a complete copy: keep that one
                raise
    return target


def code_object_path(kernel: str, directory: Path | None = None) -> Path:
    if kernel not in KERNELS:
        raise ValueError(f"unknown AITER FAv3 kernel {kernel!r}; known: {KERNELS}")
    return (directory or fetch()) / f"{_CO_DIR}{kernel}.co"


def symbol(kernel: str) -> str:
    """The kernel's symbol as the launch code forms it (``_ZN5aiter<len><name>E``,
    name = ``fmha_`` + the code object's stem)."""
    name = "fmha_" + kernel
    return f"_ZN5aiter{len(name)}{name}E"


# --------------------------------------------------------------------------------------
# the argument block, from the header

@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    kind: str        # "ptr", "f32", "u32", "i32", or "pad"
    offset: int
    size: int


_SCALARS = {"float": ("f32", 4), "unsigned int": ("u32", 4), "unsigned": ("u32", 4),
            "uint32_t": ("u32", 4), "int": ("i32", 4), "int32_t": ("i32", 4)}


_MEMBER = re.compile(r"((?:const\s+|volatile\s+)*)([A-Za-z_][\w\s]*?)\s*(\*?)\s*(\w+)")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _struct_bodies(text: str) -> dict[str, tuple[str, bool]]:
    """name -> (body, packed) of every ``struct [attrs] name { ... };`` without nesting."""
    out = {}
    for m in re.finditer(r"\bstruct\s+((?:__attribute__\s*\(\(\s*\w+\s*\)\)\s*)*)(\w+)\s*"
                         r"(?::[^{;]*)?\{([^{}]*)\}\s*;", text):
        attrs, name, body = m.groups()
        out[name] = (body, "packed" in attrs)
    return out


def parse_struct(name: str, *headers: str) -> list[Field]:
    """The fields of C struct ``name`` with byte offsets, from header texts.

    Understands what AITER's argument blocks use: pointers (``[const] T*``), 32-bit
    scalars, and fields of other structs of these headers (flattened to one ``pad``
    field when their name starts with ``_``, the header's padding convention).  Packed
    structs have no alignment padding; others align every member naturally."""
    structs: dict[str, tuple[str, bool]] = {}
    for h in headers:
        structs.update(_struct_bodies(_strip_comments(h)))

    memo: dict[str, tuple[list, int, int]] = {}

    def layout(sname: str, depth: int = 0):
        if sname in memo:
            return memo[sname]
        if sname not in structs or depth > 8:
            raise ValueError(f"struct {sname} is not defined in the given headers")
        body, packed = structs[sname]
        fields, off, align_max = [], 0, 1
        for decl in (d.strip() for d in body.split(";")):
            if not decl:
                continue
            m = _MEMBER.fullmatch(decl)
            if m is None or "(" in decl or "[" in decl:
                raise ValueError(f"struct {sname}: cannot parse member {decl!r}")
            _, base, star, fname = m.groups()
            base = " ".join(base.split())
            if star:
                kind, size, align = "ptr", 8, 8
            elif base in _SCALARS:
                (kind, size), align = _SCALARS[base], _SCALARS[base][1]
            elif base in structs:
                sub, size, align = layout(base, depth + 1)
                kind = "struct"
            else:
                raise ValueError(f"struct {sname}: unknown member type {base!r}")
            if not packed:
                off = (off + align - 1) // align * align
                align_max = max(align_max, align)
            if fname.startswith("_"):
                kind = "pad"
            elif kind == "struct":
                raise ValueError(f"struct {sname}: nested struct member {fname!r} is not a "
                                 "padding field")
            fields.append(Field(fname, kind, off, size))
            off += size
        if not packed:
            off = (off + align_max - 1) // align_max * align_max
        memo[sname] = (fields, off, 1 if packed else align_max)
        return memo[sname]

    return layout(name)[0]


@dataclasses.dataclass(frozen=True)
class ArgLayout:
    """The argument block: its fields (padding included) and total size."""
    fields: tuple
    size: int

    @classmethod
    def from_headers(cls, directory: Path | None = None) -> ArgLayout:
        directory = directory or fetch()
        texts = [(directory / h).read_text(errors="replace") for h in HEADERS]
        fields = parse_struct(ARGS_STRUCT, *texts)
        size = fields[-1].offset + fields[-1].size if fields else 0
        return cls(tuple(fields), size)

    @property
    def values(self) -> tuple:
        return tuple(f for f in self.fields if f.kind != "pad")

    def check(self, kernel_info) -> None:
        """Compare with a code object's metadata: total size against
        ``.kernarg_segment_size``; offsets, sizes and kinds of the non-padding fields
        against its arguments that are not named ``pad``, in order."""
        meta_size = kernel_info.kernarg_segment_size
        if self.size != meta_size:
            raise ValueError(f"{ARGS_STRUCT} is {self.size} bytes; {kernel_info.name} expects "
                             f"{meta_size}")
        named = [a for a in kernel_info.args if a.get("name") != "pad"]
        mine = self.values
        if len(named) != len(mine):
            raise ValueError(f"{ARGS_STRUCT} has {len(mine)} fields, {kernel_info.name}'s "
                             f"metadata {len(named)} named arguments")
        for f, a in zip(mine, named):
            ptr = a.get("value_kind") == "global_buffer"
            if (f.offset, f.size) != (a["offset"], a["size"]) or (f.kind == "ptr") != ptr:
                raise ValueError(f"{ARGS_STRUCT}.{f.name} at {f.offset} ({f.size} bytes, {f.kind}) "
                                 f"disagrees with metadata argument {a.get('name')!r} at "
                                 f"{a['offset']} ({a['size']} bytes, {a.get('value_kind')})")

    def pack(self, values: dict) -> bytes:
        """The block's bytes: every non-padding field from ``values`` (all required),
        padding zero."""
        names = {f.name for f in self.values}
        extra = set(values) - names
        missing = names - set(values)
        if extra or missing:
            raise ValueError(f"{ARGS_STRUCT}: unknown fields {sorted(extra)}, "
                             f"missing {sorted(missing)}")
        buf = bytearray(self.size)
        fmt = {"ptr": "<Q", "f32": "<f", "u32": "<I", "i32": "<i"}
        for f in self.values:
            v = values[f.name]
            if f.kind == "u32" and not 0 <= int(v) < 1 << 32:
                raise ValueError(f"{f.name} = {v} does not fit unsigned 32 bits")
            struct.pack_into(fmt[f.kind], buf, f.offset, float(v) if f.kind == "f32" else int(v))
        return bytes(buf)


# --------------------------------------------------------------------------------------
# launching

@dataclasses.dataclass
class Launch:
    """What one launch did: its configuration, instruction count and the hazard
    checker's reports (rule -> distinct code-object sites)."""
    kernel: str
    grid: tuple
    block: tuple
    s_opt: int
    instructions: int = 0
    hazards: dict = dataclasses.field(default_factory=dict)

    def hazard_text(self) -> str:
        if not self.hazards:
            return "none"
        return ", ".join(f"{rule} x{len(sites)}" for rule, sites in sorted(self.hazards.items()))


def kernel_name(d: int, dv: int, causal: bool, group: bool) -> str:
    if (d, dv) not in TILE:
        raise ValueError(f"AITER FAv3 gfx950 has no kernel for head dims ({d}, {dv}); "
                         f"it has {sorted(TILE)}")
    base = "fwd_hd128_bf16" if d == 128 else "fwd_hd192_hd128_bf16"
    return base + ("_causal" if causal else "") + ("_group" if group else "")


class AiterFav3:
    """Launches AITER's FAv3 forward code objects on an emulator driver.

    ``hazards``: attach the hazard checker (``zyfa_emulator.hazards``); every rule is
    fatal except those in ``report_only`` (default :data:`PEER_REPORT_ONLY`, see
    ``docs/emulator.md``: the rules are LLVM's for gfx950 and AITER's sites are recorded
    as findings, per launch in :attr:`Launch.hazards`)."""

    def __init__(self, driver=None, directory: Path | None = None, hazards: bool = True,
                 report_only=PEER_REPORT_ONLY):
        from ..driver import EmulatorDriver
        self.directory = directory or fetch()
        self.driver = driver or EmulatorDriver()
        self.layout = ArgLayout.from_headers(self.directory)
        self._functions: dict = {}
        self.checker = None
        if hazards:
            from ..hazards import HazardChecker
            self.checker = HazardChecker(report_only=report_only).attach(self.driver.machine)
        self.launches: list[Launch] = []

    def function(self, kernel: str):
        fn = self._functions.get(kernel)
        if fn is None:
            image = code_object_path(kernel, self.directory).read_bytes()
            module = self.driver.load_module(0, image)
            fn = self.driver.get_function(module, symbol(kernel))
            self.layout.check(fn.handle)
            self._functions[kernel] = fn
        return fn

    # -- memory helpers -------------------------------------------------------------------
    def _upload(self, arr: np.ndarray, keep: list) -> int:
        arr = np.ascontiguousarray(arr)
        ptr = self.driver.alloc(0, arr.nbytes)
        self.driver.copy_htod(ptr, arr)
        keep.append(ptr)
        return ptr

    def _output(self, shape, dtype, keep: list) -> tuple[int, np.ndarray]:
        host = np.empty(shape, dtype)
        ptr = self.driver.alloc(0, host.nbytes)      # the driver fills it with 0xFF (NaN)
        keep.append(ptr)
        return ptr, host

    # -- the two launch modes -------------------------------------------------------------
    def forward(self, q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                return_lse: bool = True):
        """Batch mode: q (B, Sq, Hq, d), k (B, Sk, Hkv, d), v (B, Sk, Hkv, dv), bf16.
        Returns (out (B, Sq, Hq, dv) bf16, lse (B, Hq, Sq) fp32 or None, Launch)."""
        q, k, v = (_bf16(x) for x in (q, k, v))
        b, sq, hq, d = q.shape
        _, sk, hkv, _ = k.shape
        dv = v.shape[3]
        _check_shapes(q, k, v, batch=True)
        name = kernel_name(d, dv, causal, group=False)
        ts_qo, bdx = TILE[(d, dv)]
        tg_div = 2 if causal else 1
        grid = (_cdiv(_cdiv(sq, ts_qo), tg_div), hq, b)
        strides = dict(
            s_Seqs=hq * d * 2, s_Ts=ts_qo * hq * d * 2, s_Hs=d * 2, s_Bs=sq * hq * d * 2,
            s_k_Seqs=hkv * d * 2, s_k_Hs=d * 2, s_k_Bs=sk * hkv * d * 2,
            s_v_Seqs=hkv * dv * 2, s_v_Hs=dv * 2, s_v_Bs=sk * hkv * dv * 2,
            s_o_Seqs=hq * dv * 2, s_o_Hs=dv * 2, s_o_Bs=sq * hq * dv * 2,
            s_lse_Hs=sq * 4)
        return self._run(name, grid, bdx, q, k, v, (b, sq, hq, dv), (b, hq, sq), sq, sk, hq, hkv,
                         d, dv, causal, softmax_scale, return_lse, strides, None)

    def forward_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal: bool = False,
                       softmax_scale: float | None = None, return_lse: bool = True):
        """Group (varlen) mode: packed q (Tq, Hq, d), k (Tk, Hkv, d), v (Tk, Hkv, dv), bf16,
        int32 cumulative starts ``cu_seqlens_*`` of length B + 1.  Returns
        (out (Tq, Hq, dv) bf16, lse (Hq, Tq) fp32 or None, Launch)."""
        q, k, v = (_bf16(x) for x in (q, k, v))
        tq, hq, d = q.shape
        tk, hkv, _ = k.shape
        dv = v.shape[2]
        _check_shapes(q, k, v, batch=False)
        cq = np.ascontiguousarray(cu_seqlens_q, dtype=np.int32)
        ck = np.ascontiguousarray(cu_seqlens_k, dtype=np.int32)
        if cq.ndim != 1 or cq.shape != ck.shape or len(cq) < 2 or cq[0] != 0 or ck[0] != 0 \
                or cq[-1] != tq or ck[-1] != tk or (np.diff(cq) < 0).any() \
                or (np.diff(ck) < 0).any():
            raise ValueError("cu_seqlens_q/k must be non-decreasing int32 starts 0..T of "
                             "equal length B + 1")
        b = len(cq) - 1
        name = kernel_name(d, dv, causal, group=True)
        ts_qo, bdx = TILE[(d, dv)]
        tg_div = 2 if causal else 1
        grid = (hq, b, _cdiv(_cdiv(tq, ts_qo), tg_div))
        strides = dict(
            s_Seqs=hq * d * 2, s_Ts=ts_qo * hq * d * 2, s_Hs=d * 2, s_Bs=0,
            s_k_Seqs=hkv * d * 2, s_k_Hs=d * 2, s_k_Bs=0,
            s_v_Seqs=hkv * dv * 2, s_v_Hs=dv * 2, s_v_Bs=0,
            s_o_Seqs=hq * dv * 2, s_o_Hs=dv * 2, s_o_Bs=0,
            s_lse_Hs=tq * 4)
        return self._run(name, grid, bdx, q, k, v, (tq, hq, dv), (hq, tq), tq, tk, hq, hkv,
                         d, dv, causal, softmax_scale, return_lse, strides, (cq, ck))

    def _run(self, name, grid, bdx, q, k, v, out_shape, lse_shape, sq, sk, hq, hkv, d, dv,
             causal, softmax_scale, return_lse, strides, seqs):
        import ml_dtypes
        fn = self.function(name)
        scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
        s_opt = 3 if causal and (hq % 8 != 0 or sq > 16384) else 5
        keep: list = []
        try:
            pq, pk, pv = (self._upload(x, keep) for x in (q, k, v))
            po, out = self._output(out_shape, ml_dtypes.bfloat16, keep)
            plse, lse = self._output(lse_shape, np.float32, keep) if return_lse else (0, None)
            pqs = pks = 0
            if seqs is not None:
                pqs, pks = (self._upload(s, keep) for s in seqs)
            values = dict(ptr_o=po, ptr_q=pq, ptr_k=pk, ptr_v=pv, ptr_lse=plse, scalar=scale,
                          s_seq_len=sq, s_gqa=hq // hkv, s_opt=s_opt, s_lse=int(return_lse),
                          s_kv_seq_len=sk, s_qk_head_dim=d, s_v_head_dim=dv, s_q_head_num=hq,
                          ptr_qseq=pqs, ptr_kseq=pks, ptr_qseq_padding=pqs,
                          ptr_kseq_padding=pks, **strides)
            launch = Launch(name, grid, (bdx, 1, 1), s_opt)
            seen = len(self.checker.violations) if self.checker else 0
            before = self.driver.machine.instructions
            self.driver.launch(fn, grid, (bdx, 1, 1), 0, 0, self.layout.pack(values))
            launch.instructions = self.driver.machine.instructions - before
            if self.checker is not None:
                for viol in self.checker.violations[seen:]:
                    site = viol.where.split(" at ", 1)[-1].split(" ", 1)[0]
                    launch.hazards.setdefault(viol.rule, set()).add(site)
            self.driver.copy_dtoh(out, po)
            if lse is not None:
                self.driver.copy_dtoh(lse, plse)
        finally:
            for ptr in keep:
                self.driver.free(ptr)
        self.launches.append(launch)
        return out, lse, launch


# --------------------------------------------------------------------------------------
# checking against the fp64 reference

#: Bounds of the correctness check (relative Frobenius error against fp64).
O_BOUND, LSE_BOUND = 4e-3, 1e-3


@dataclasses.dataclass(frozen=True)
class Case:
    """One launch to check: batch mode (``seqlens_q``/``seqlens_k`` = one (B, S) each) or
    group mode (per-sequence lengths, packed)."""
    kernel: str
    hq: int
    hkv: int
    seqlens_q: tuple
    seqlens_k: tuple
    seed: int = 0

    @property
    def group(self) -> bool:
        return self.kernel.endswith("_group")

    @property
    def causal(self) -> bool:
        return "_causal" in self.kernel

    @property
    def dims(self) -> tuple[int, int]:
        return (192, 128) if "hd192" in self.kernel else (128, 128)

    def shape_text(self) -> str:
        gqa = f"Hq {self.hq}/Hkv {self.hkv}"
        if self.group:
            return f"varlen q {list(self.seqlens_q)} k {list(self.seqlens_k)}, {gqa}"
        return (f"B {len(self.seqlens_q)}, Sq {self.seqlens_q[0]}, Sk {self.seqlens_k[0]}, "
                f"{gqa}")


@dataclasses.dataclass
class Result:
    case: Case
    o_error: float
    lse_error: float
    launch: Launch
    seconds: float

    @property
    def ok(self) -> bool:
        # NaN compares False: a NaN error never passes
        return bool(self.o_error <= O_BOUND and self.lse_error <= LSE_BOUND)


def run_case(runner: AiterFav3, case: Case) -> Result:
    """Fresh random normal bf16 inputs, the launch (outputs poisoned by the driver), and
    the relative errors of O and LSE against ``zyfa_runtime.reference.attention``."""
    import time

    import ml_dtypes

    from zyfa_runtime.reference import attention, relative_error
    runner.function(case.kernel)        # loads it and checks the layout against it
    d, dv = case.dims
    rng = np.random.default_rng(case.seed)
    bf16 = ml_dtypes.bfloat16
    if case.group:
        tq, tk = sum(case.seqlens_q), sum(case.seqlens_k)
        q = rng.standard_normal((tq, case.hq, d)).astype(bf16)
        k = rng.standard_normal((tk, case.hkv, d)).astype(bf16)
        v = rng.standard_normal((tk, case.hkv, dv)).astype(bf16)
        cq = np.concatenate([[0], np.cumsum(case.seqlens_q)]).astype(np.int32)
        ck = np.concatenate([[0], np.cumsum(case.seqlens_k)]).astype(np.int32)
        t = time.perf_counter()
        out, lse, launch = runner.forward_varlen(q, k, v, cq, ck, causal=case.causal)
        seconds = time.perf_counter() - t
        ref, ref_lse = attention(q, k, v, causal=case.causal, cu_seqlens_q=cq,
                                 cu_seqlens_k=ck, return_lse=True)
    else:
        b, sq, sk = len(case.seqlens_q), case.seqlens_q[0], case.seqlens_k[0]
        if set(case.seqlens_q) != {sq} or set(case.seqlens_k) != {sk} or \
                len(case.seqlens_k) != b:
            raise ValueError("batch mode takes one Sq and one Sk for every batch entry")
        q = rng.standard_normal((b, sq, case.hq, d)).astype(bf16)
        k = rng.standard_normal((b, sk, case.hkv, d)).astype(bf16)
        v = rng.standard_normal((b, sk, case.hkv, dv)).astype(bf16)
        t = time.perf_counter()
        out, lse, launch = runner.forward(q, k, v, causal=case.causal)
        seconds = time.perf_counter() - t
        ref, ref_lse = attention(q, k, v, causal=case.causal, return_lse=True)
    return Result(case, relative_error(out, ref), relative_error(lse, ref_lse), launch, seconds)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _bf16(x) -> np.ndarray:
    import ml_dtypes
    x = np.asarray(x)
    if x.dtype != ml_dtypes.bfloat16:
        raise TypeError(f"AITER's FAv3 kernels take bf16 inputs, got {x.dtype}")
    return np.ascontiguousarray(x)


def _check_shapes(q, k, v, batch: bool) -> None:
    nd = 4 if batch else 3
    if q.ndim != nd or k.ndim != nd or v.ndim != nd:
        raise ValueError(f"q, k, v must be {nd}-dimensional")
    if k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1] or \
            (batch and q.shape[0] != k.shape[0]):
        raise ValueError(f"inconsistent shapes q {q.shape}, k {k.shape}, v {v.shape}")
    hq, hkv = q.shape[-2], k.shape[-2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"Hq ({hq}) must be a multiple of Hkv ({hkv})")


__all__ = ["PACKAGE", "VERSION", "WHEEL", "WHEEL_SHA256", "KERNELS", "MEMBERS", "TILE",
           "fetch", "cache_dir", "code_object_path", "symbol", "Field", "parse_struct",
           "ArgLayout", "Launch", "AiterFav3", "kernel_name", "PeerUnavailable", "Case",
           "Result", "run_case", "O_BOUND", "LSE_BOUND", "PEER_REPORT_ONLY"]
