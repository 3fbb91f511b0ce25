"""Read what a compiled code object says about itself (pure Python, no external programs).

* gfx950 ``.hsaco``: the kernels' entries in the NT_AMDGPU_METADATA note (a msgpack
  document) -- argument layout, LDS, scratch, registers, workgroup limits -- and the
  target, cross-checked against the ELF header.
* sm_90a ``.cubin``: per kernel the ``.nv.info.<kernel>`` attribute records (parameter
  layout, parameter bank size, launch bounds), the register count and frame size
  from ``.nv.info``, static shared memory from ``.nv.shared.<kernel>``, and the arch.

Every parser raises :class:`ValueError` on malformed input.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import struct


def _checked(fn):
    """Report any structural surprise in the input as ValueError, not as an internal error."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ValueError:
            raise
        except (struct.error, IndexError, KeyError, TypeError, OverflowError,
                RecursionError) as e:
            raise ValueError(f"malformed code object: {type(e).__name__}: {e}") from e
    return wrapper


# --------------------------------------------------------------------------------------
# ELF64 (little endian)

ELFCLASS64, ELFDATA2LSB = 2, 1
EM_CUDA, EM_AMDGPU = 190, 224
ELFOSABI_AMDGPU_HSA = 64
SHT_SYMTAB, SHT_NOTE, SHT_NOBITS = 2, 7, 8


@dataclasses.dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


@dataclasses.dataclass(frozen=True)
class Symbol:
    name: str
    info: int
    other: int
    shndx: int
    value: int
    size: int


class Elf:
    def __init__(self, data: bytes):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError("code object must be bytes")
        self.data = bytes(data)
        if len(self.data) < 64 or self.data[:4] != b"\x7fELF":
            raise ValueError("not an ELF file")
        if self.data[4] != ELFCLASS64 or self.data[5] != ELFDATA2LSB:
            raise ValueError("not a little-endian ELF64 file")
        self.osabi, self.abiversion = self.data[7], self.data[8]
        (self.type, self.machine, _, _, _, shoff, self.flags, _, _, _, shentsize, shnum,
         shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", self.data, 16)
        if shoff == 0 or shnum == 0:
            raise ValueError("ELF file has no section headers")
        if shentsize != 64:
            raise ValueError(f"unexpected ELF section header size {shentsize}")
        self._check_range(shoff, shnum * shentsize, "section header table")
        raw = [struct.unpack_from("<IIQQQQIIQQ", self.data, shoff + 64 * i) for i in range(shnum)]
        if shstrndx >= shnum:
            raise ValueError("ELF section name table index out of range")
        names = self._section_bytes_raw(raw[shstrndx])
        self.sections = []
        for i, (name, typ, flags, _, off, size, link, info, _, entsize) in enumerate(raw):
            sec = Section(i, _cstr(names, name), typ, flags, off, size, link, info, entsize)
            if typ != SHT_NOBITS and typ != 0:
                self._check_range(off, size, f"section {sec.name!r}")
            self.sections.append(sec)
        self.by_name = {s.name: s for s in self.sections}

    def _check_range(self, off: int, size: int, what: str) -> None:
        if off < 0 or size < 0 or off + size > len(self.data):
            raise ValueError(f"{what} lies outside the file")

    def _section_bytes_raw(self, hdr) -> bytes:
        off, size = hdr[4], hdr[5]
        self._check_range(off, size, "section")
        return self.data[off:off + size]

    def section_data(self, sec: Section) -> bytes:
        if sec.type == SHT_NOBITS:
            return b""
        return self.data[sec.offset:sec.offset + sec.size]

    def symbols(self) -> list[Symbol]:
        """Entries of the .symtab section (index = symbol index)."""
        symtab = next((s for s in self.sections if s.type == SHT_SYMTAB), None)
        if symtab is None:
            return []
        if symtab.link >= len(self.sections):
            raise ValueError("symbol table links to a missing string table")
        strtab = self.section_data(self.sections[symtab.link])
        raw = self.section_data(symtab)
        if len(raw) % 24:
            raise ValueError("symbol table size is not a multiple of its entry size")
        out = []
        for off in range(0, len(raw), 24):
            name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", raw, off)
            out.append(Symbol(_cstr(strtab, name), info, other, shndx, value, size))
        return out

    def notes(self):
        """(name, type, desc) of every note in the SHT_NOTE sections."""
        for sec in self.sections:
            if sec.type != SHT_NOTE:
                continue
            raw, off = self.section_data(sec), 0
            while off + 12 <= len(raw):
                namesz, descsz, ntype = struct.unpack_from("<III", raw, off)
                off += 12
                name_end = off + namesz
                desc_off = off + _align4(namesz)
                desc_end = desc_off + descsz
                if name_end > len(raw) or desc_end > len(raw):
                    raise ValueError(f"truncated note in section {sec.name!r}")
                yield raw[off:name_end].rstrip(b"\0").decode("latin-1"), ntype, raw[desc_off:desc_end]
                off = desc_off + _align4(descsz)


def _align4(n: int) -> int:
    return (n + 3) & ~3


def _cstr(table: bytes, off: int) -> str:
    if off == 0 and not table:
        return ""
    if off >= len(table):
        raise ValueError("string table offset out of range")
    end = table.find(b"\0", off)
    if end < 0:
        raise ValueError("unterminated string in string table")
    return table[off:end].decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------
# msgpack (the subset the AMDGPU metadata uses, plus the rest of the basic types)

class _MsgPack:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated msgpack data")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def value(self, depth: int = 0):
        if depth > 64:
            raise ValueError("msgpack nesting too deep")
        b = self.unpack(">B")
        if b <= 0x7f:
            return b
        if b >= 0xe0:
            return b - 0x100
        if 0x80 <= b <= 0x8f:
            return self.map(b & 0x0f, depth)
        if 0x90 <= b <= 0x9f:
            return self.array(b & 0x0f, depth)
        if 0xa0 <= b <= 0xbf:
            return self.str(b & 0x1f)
        simple = {0xc0: None, 0xc2: False, 0xc3: True}
        if b in simple:
            return simple[b]
        sized = {0xc4: ">B", 0xc5: ">H", 0xc6: ">I"}           # bin 8/16/32
        if b in sized:
            return self.take(self.unpack(sized[b]))
        numbers = {0xca: ">f", 0xcb: ">d", 0xcc: ">B", 0xcd: ">H", 0xce: ">I", 0xcf: ">Q",
                   0xd0: ">b", 0xd1: ">h", 0xd2: ">i", 0xd3: ">q"}
        if b in numbers:
            return self.unpack(numbers[b])
        strs = {0xd9: ">B", 0xda: ">H", 0xdb: ">I"}
        if b in strs:
            return self.str(self.unpack(strs[b]))
        if b in (0xdc, 0xdd):
            return self.array(self.unpack(">H" if b == 0xdc else ">I"), depth)
        if b in (0xde, 0xdf):
            return self.map(self.unpack(">H" if b == 0xde else ">I"), depth)
        raise ValueError(f"unsupported msgpack type byte 0x{b:02x}")

    def str(self, n: int) -> str:
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"invalid UTF-8 in msgpack string: {e}") from e

    def array(self, n: int, depth: int) -> list:
        return [self.value(depth + 1) for _ in range(n)]

    def map(self, n: int, depth: int) -> dict:
        out = {}
        for _ in range(n):
            key = self.value(depth + 1)
            try:
                out[key] = self.value(depth + 1)
            except TypeError as e:   # unhashable key (array/map)
                raise ValueError("msgpack map key is not a scalar") from e
        return out


@_checked
def msgpack_loads(data: bytes):
    """Decode one msgpack document (raises ValueError if malformed or followed by junk)."""
    reader = _MsgPack(bytes(data))
    value = reader.value()
    if reader.pos != len(reader.data):
        raise ValueError("trailing bytes after msgpack document")
    return value


# --------------------------------------------------------------------------------------
# AMDGPU code objects

NT_AMDGPU_METADATA = 32

#: EF_AMDGPU_MACH values of the processors we may meet.
AMDGPU_MACH = {0x2c: "gfx908", 0x3f: "gfx90a", 0x4c: "gfx942", 0x4f: "gfx950"}
EF_AMDGPU_MACH = 0xff
EF_AMDGPU_FEATURE_XNACK = 0x300     # v4+: 0x100 any, 0x200 off, 0x300 on
EF_AMDGPU_FEATURE_SRAMECC = 0xc00   # v4+: 0x400 any, 0x800 off, 0xc00 on

#: Code-object version by ELF EI_ABIVERSION (ELFOSABI_AMDGPU_HSA).
AMDGPU_CODE_OBJECT_VERSION = {1: 3, 2: 4, 3: 5, 4: 6}

#: Metadata keys every kernel entry must carry.
_REQUIRED = ("name", "kernarg_segment_size", "group_segment_fixed_size",
             "private_segment_fixed_size", "wavefront_size", "sgpr_count", "vgpr_count",
             "max_flat_workgroup_size")


def _amdgpu_elf(data: bytes) -> Elf:
    elf = Elf(data)
    if elf.machine != EM_AMDGPU:
        raise ValueError(f"not an AMDGPU code object (e_machine {elf.machine})")
    if elf.osabi != ELFOSABI_AMDGPU_HSA:
        raise ValueError(f"not an HSA code object (OS/ABI {elf.osabi})")
    return elf


@_checked
def amdgpu_metadata(data: bytes) -> dict:
    """The decoded NT_AMDGPU_METADATA document of a code object."""
    elf = _amdgpu_elf(data)
    for name, ntype, desc in elf.notes():
        if name == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
            meta = msgpack_loads(desc)
            if not isinstance(meta, dict):
                raise ValueError("AMDGPU metadata is not a map")
            return meta
    raise ValueError("no NT_AMDGPU_METADATA note in the code object")


def _strip_keys(d: dict) -> dict:
    return {(k[1:] if isinstance(k, str) and k.startswith(".") else k): v for k, v in d.items()}


@_checked
def amdgpu_kernels(data: bytes) -> dict[str, dict]:
    """Per kernel symbol: its metadata with the leading dots of the keys removed.

    Guaranteed keys: the ones in ``_REQUIRED``, ``agpr_count`` (0 when absent) and
    ``args``: a list of {offset, size, value_kind, name (when recorded), ...}.
    """
    kernels = amdgpu_metadata(data).get("amdhsa.kernels")
    if not isinstance(kernels, list):
        raise ValueError("AMDGPU metadata has no amdhsa.kernels list")
    out = {}
    for raw in kernels:
        if not isinstance(raw, dict):
            raise ValueError("AMDGPU kernel metadata entry is not a map")
        k = _strip_keys(raw)
        missing = [key for key in _REQUIRED if key not in k]
        if missing:
            raise ValueError(f"kernel metadata lacks {', '.join(missing)}")
        args = k.get("args", [])
        if not isinstance(args, list):
            raise ValueError(f"kernel {k['name']}: .args is not a list")
        k["args"] = []
        for a in args:
            if not isinstance(a, dict):
                raise ValueError(f"kernel {k['name']}: argument entry is not a map")
            a = _strip_keys(a)
            if not all(isinstance(a.get(f), int) for f in ("offset", "size")) or \
                    not isinstance(a.get("value_kind"), str):
                raise ValueError(f"kernel {k['name']}: argument lacks offset/size/value_kind")
            k["args"].append(a)
        k.setdefault("agpr_count", 0)
        out[k["name"]] = k
    return out


@_checked
def amdgpu_code_object_version(data: bytes) -> int:
    elf = _amdgpu_elf(data)
    try:
        return AMDGPU_CODE_OBJECT_VERSION[elf.abiversion]
    except KeyError:
        raise ValueError(f"unknown AMDGPU code-object ABI version {elf.abiversion}") from None


@_checked
def amdgpu_target(data: bytes) -> str:
    """``amdhsa.target`` of the metadata (e.g. "amdgcn-amd-amdhsa--gfx950"), checked
    against the processor and xnack/sramecc modes encoded in the ELF e_flags."""
    elf = _amdgpu_elf(data)
    target = amdgpu_metadata(data).get("amdhsa.target")
    if not isinstance(target, str):
        raise ValueError("AMDGPU metadata has no amdhsa.target")
    m = re.fullmatch(r"amdgcn-amd-amdhsa--([a-z0-9]+)((?::[a-z]+[+-])*)", target)
    if not m:
        raise ValueError(f"malformed amdhsa.target {target!r}")
    proc, features = m.group(1), dict(
        (f[:-1], f[-1]) for f in m.group(2).split(":") if f)
    mach = AMDGPU_MACH.get(elf.flags & EF_AMDGPU_MACH)
    if mach is not None and mach != proc:
        raise ValueError(f"amdhsa.target {target!r} disagrees with the ELF header ({mach})")
    if elf.abiversion >= 2:   # v4+: explicit feature modes
        modes = {0x0: None, 0x1: None, 0x2: "-", 0x3: "+"}   # unsupported / any / off / on
        for feat, mask, shift in (("xnack", EF_AMDGPU_FEATURE_XNACK, 8),
                                  ("sramecc", EF_AMDGPU_FEATURE_SRAMECC, 10)):
            if features.get(feat) != modes[(elf.flags & mask) >> shift]:
                raise ValueError(f"amdhsa.target {target!r} disagrees with the ELF header "
                                 f"about {feat}")
    return target


# --------------------------------------------------------------------------------------
# CUDA cubins

# EIATTR record formats: one byte format, one byte attribute, then
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4   # ... u16 value, or u16 size + payload

# EIATTR attributes read here.
EIATTR_MAX_THREADS = 0x05
EIATTR_PARAM_CBANK = 0x0a
EIATTR_REQNTID = 0x10
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_MAXREG_COUNT = 0x1b
EIATTR_MAX_STACK_SIZE = 0x23
EIATTR_REGCOUNT = 0x2f
EIATTR_CUDA_API_VERSION = 0x37
EIATTR_KPARAM_INFO_V2 = 0x45

#: .nv.compat attribute that is 1 for arch-specific ("a") targets.
_COMPAT_ARCH_SPECIFIC = 0x09

#: Shared memory the driver reserves at the start of each CTA's window on sm_90+; a cubin
#: that carries `.nv.shared.reserved.0` counts it in every `.nv.shared.<kernel>` section.
RESERVED_SHARED_BYTES = 1024


@_checked
def eiattr_records(raw: bytes) -> list[tuple[int, int, int | bytes]]:
    """(format, attribute, value) of each record: an int for N/B/HVAL, bytes for SVAL."""
    out, off = [], 0
    while off < len(raw):
        if off + 4 > len(raw):
            raise ValueError("truncated EIATTR record")
        fmt, attr, val = struct.unpack_from("<BBH", raw, off)
        off += 4
        if fmt == EIFMT_SVAL:
            if off + val > len(raw):
                raise ValueError(f"EIATTR 0x{attr:02x} payload runs past its section")
            out.append((fmt, attr, raw[off:off + val]))
            off += val
        elif fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
            out.append((fmt, attr, val))
        else:
            raise ValueError(f"unknown EIATTR format {fmt} (attribute 0x{attr:02x})")
    return out


def _words(payload, n: int, what: str) -> tuple[int, ...]:
    if not isinstance(payload, bytes) or len(payload) != 4 * n:
        raise ValueError(f"{what}: malformed payload")
    return struct.unpack(f"<{n}I", payload)


def _kparam(payload) -> dict:
    # u32 index, u16 ordinal, u16 offset, u32 {flags: bits 0..17 (cbank 12..16), size: 18..31}
    if not isinstance(payload, bytes) or len(payload) != 12:
        raise ValueError("EIATTR_KPARAM_INFO: malformed payload")
    index, ordinal, offset, packed = struct.unpack("<IHHI", payload)
    return {"ordinal": ordinal, "offset": offset, "size": packed >> 18,
            "flags": packed & 0x3ffff, "index": index}


@_checked
def cubin_arch(data: bytes) -> str:
    """The SASS target of a cubin, e.g. "sm_90a"."""
    return _cubin_arch(_cubin_elf(data))


def _cubin_elf(data: bytes) -> Elf:
    elf = Elf(data)
    if elf.machine != EM_CUDA:
        raise ValueError(f"not a CUDA cubin (e_machine {elf.machine})")
    return elf


def _cubin_arch(elf: Elf) -> str:
    sm = (elf.flags >> 16) & 0xff or (elf.flags >> 8) & 0xff   # pre-/post-CUDA 12.8 layouts
    if not sm:
        raise ValueError(f"cannot read the SM version from e_flags 0x{elf.flags:x}")
    suffix = ""
    for name, ntype, desc in elf.notes():     # the ptxas command line, when recorded
        m = re.search(rb"-arch sm_(\d+)([a-z]?)\b", desc) if name == "NVIDIA Corp" else None
        if m:
            if int(m.group(1)) != sm:
                raise ValueError(f"cubin notes say sm_{m.group(1).decode()}, e_flags say sm_{sm}")
            suffix = m.group(2).decode()
    compat = elf.by_name.get(".nv.compat")
    if not suffix and compat is not None:
        for fmt, attr, val in eiattr_records(elf.section_data(compat)):
            if attr == _COMPAT_ARCH_SPECIFIC and fmt == EIFMT_BVAL and val & 0xff:
                suffix = "a"
    return f"sm_{sm}{suffix}"


@_checked
def cubin_kernels(data: bytes) -> dict[str, dict]:
    """Per kernel symbol: params [{ordinal, offset, size, ...}] in ordinal order,
    param_size, param_offset (in constant bank 0), registers, local_bytes (stack
    frame), shared_static (bytes, excluding the driver's reserved window),
    shared_section_size, max_threads / reqntid when declared, and arch."""
    elf = _cubin_elf(data)
    arch = _cubin_arch(elf)
    syms = elf.symbols()

    def sym_name(idx: int) -> str:
        if idx >= len(syms):
            raise ValueError(f"EIATTR refers to missing symbol {idx}")
        return syms[idx].name

    per_symbol: dict[str, dict] = {}   # from the global .nv.info section
    glob_info = elf.by_name.get(".nv.info")
    if glob_info is not None:
        keys = {EIATTR_REGCOUNT: "registers", EIATTR_FRAME_SIZE: "local_bytes",
                EIATTR_MIN_STACK_SIZE: "min_stack_size", EIATTR_MAX_STACK_SIZE: "max_stack_size"}
        for fmt, attr, val in eiattr_records(elf.section_data(glob_info)):
            if attr in keys:
                idx, value = _words(val, 2, f"EIATTR 0x{attr:02x}")
                per_symbol.setdefault(sym_name(idx), {})[keys[attr]] = value

    reserved = RESERVED_SHARED_BYTES if any(
        s.name.startswith(".nv.shared.reserved") for s in elf.sections) else 0
    out = {}
    for sec in elf.sections:
        if not sec.name.startswith(".nv.info."):
            continue
        name = sec.name[len(".nv.info."):]
        k: dict = {"name": name, "arch": arch, "params": [], "registers": None, "local_bytes": 0}
        k.update(per_symbol.get(name, {}))
        v2 = False
        for fmt, attr, val in eiattr_records(elf.section_data(sec)):
            if attr == EIATTR_KPARAM_INFO:
                k["params"].append(_kparam(val))
            elif attr == EIATTR_KPARAM_INFO_V2:
                v2 = True
            elif attr == EIATTR_PARAM_CBANK:
                if not isinstance(val, bytes) or len(val) != 8:
                    raise ValueError("EIATTR_PARAM_CBANK: malformed payload")
                _, k["param_offset"], k["param_size"] = struct.unpack("<IHH", val)
            elif attr == EIATTR_CBANK_PARAM_SIZE and fmt == EIFMT_HVAL:
                k.setdefault("param_size", val)
            elif attr in (EIATTR_MAX_THREADS, EIATTR_REQNTID):
                key = "max_threads" if attr == EIATTR_MAX_THREADS else "reqntid"
                k[key] = list(_words(val, 3, f"EIATTR 0x{attr:02x}"))
            elif attr == EIATTR_MAXREG_COUNT and fmt == EIFMT_HVAL:
                k["max_registers"] = val
            elif attr == EIATTR_CUDA_API_VERSION:
                k["cuda_api_version"] = _words(val, 1, "EIATTR_CUDA_API_VERSION")[0]
        if v2 and not k["params"]:
            raise ValueError(f"{name}: only EIATTR_KPARAM_INFO_V2 parameter records, "
                             "which this reader does not decode")
        k["params"].sort(key=lambda p: p["ordinal"])
        if [p["ordinal"] for p in k["params"]] != list(range(len(k["params"]))):
            raise ValueError(f"{name}: parameter ordinals are not 0..n-1")
        k.setdefault("param_size", max((p["offset"] + p["size"] for p in k["params"]), default=0))
        if k["registers"] is None:    # older cubins: register count in .text.<kernel> sh_info
            text = elf.by_name.get(".text." + name)
            k["registers"] = (text.info >> 24) if text is not None else 0
        shared = elf.by_name.get(".nv.shared." + name)
        size = shared.size if shared is not None else 0
        k["shared_section_size"] = size
        k["shared_static"] = max(size - reserved, 0) if size else 0
        out[name] = k
    return out
