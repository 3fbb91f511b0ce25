"""Reader for AMDGPU HSA code objects: ELF64, the NT_AMDGPU_METADATA note (msgpack) and
the 64-byte kernel descriptors (``<symbol>.kd``).

Self-contained on purpose: the emulator must not depend on the build side.  Field
layouts follow LLVM's AMDGPUUsage ("Kernel Descriptor", "Code Object Metadata",
"Initial Kernel Execution State") and AMD's CDNA4 ISA guide (MODE register, §3).
Every structural problem raises :class:`CodeObjectFormatError` (a ``ValueError``).
"""

from __future__ import annotations

import dataclasses
import re
import struct


class CodeObjectFormatError(ValueError):
    """The image is not a well-formed gfx950 HSA code object."""


EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
SHT_SYMTAB, SHT_NOTE, SHT_NOBITS = 2, 7, 8
STT_FUNC, STT_OBJECT = 2, 1
NT_AMDGPU_METADATA = 32
EF_AMDGPU_MACH_MASK = 0xFF
EF_AMDGPU_MACH_GFX950 = 0x4F


# --------------------------------------------------------------------------------------
# ELF64

@dataclasses.dataclass(frozen=True)
class Section:
    name: str
    type: int
    addr: int
    offset: int
    size: int
    link: int


@dataclasses.dataclass(frozen=True)
class Symbol:
    name: str
    type: int
    shndx: int
    value: int
    size: int


class Elf64:
    """The sections, symbols and notes of a little-endian ELF64 image."""

    def __init__(self, data: bytes):
        self.data = bytes(data)
        d = self.data
        if len(d) < 64 or d[:4] != b"\x7fELF":
            raise CodeObjectFormatError("not an ELF file")
        if d[4] != 2 or d[5] != 1:
            raise CodeObjectFormatError("not a little-endian ELF64 file")
        self.osabi, self.abiversion = d[7], d[8]
        (_, self.machine, _, _, _, shoff, self.flags, _, _, _, shentsize, shnum,
         shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", d, 16)
        if shoff == 0 or shnum == 0 or shentsize != 64:
            raise CodeObjectFormatError("ELF file has no usable section header table")
        self._range(shoff, shnum * 64, "section header table")
        raw = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + 64 * i) for i in range(shnum)]
        if shstrndx >= shnum:
            raise CodeObjectFormatError("section name table index out of range")
        names = self._bytes(raw[shstrndx][4], raw[shstrndx][5], "section name table")
        self.sections: list[Section] = []
        for name, typ, _flags, addr, off, size, link, _info, _align, _ent in raw:
            if typ not in (0, SHT_NOBITS):
                self._range(off, size, "section")
            self.sections.append(Section(_cstr(names, name), typ, addr, off, size, link))

    def _range(self, off: int, size: int, what: str) -> None:
        if off < 0 or size < 0 or off + size > len(self.data):
            raise CodeObjectFormatError(f"{what} lies outside the file")

    def _bytes(self, off: int, size: int, what: str) -> bytes:
        self._range(off, size, what)
        return self.data[off:off + size]

    def section_bytes(self, sec: Section) -> bytes:
        return b"" if sec.type == SHT_NOBITS else self.data[sec.offset:sec.offset + sec.size]

    def symbols(self) -> list[Symbol]:
        out = []
        for sec in self.sections:
            if sec.type != SHT_SYMTAB:
                continue
            if sec.link >= len(self.sections):
                raise CodeObjectFormatError("symbol table links to a missing string table")
            strtab = self.section_bytes(self.sections[sec.link])
            raw = self.section_bytes(sec)
            if len(raw) % 24:
                raise CodeObjectFormatError("symbol table size is not a multiple of 24")
            for off in range(0, len(raw), 24):
                name, info, _other, shndx, value, size = struct.unpack_from("<IBBHQQ", raw, off)
                out.append(Symbol(_cstr(strtab, name), info & 0xF, shndx, value, size))
        return out

    def notes(self):
        for sec in self.sections:
            if sec.type != SHT_NOTE:
                continue
            raw, off = self.section_bytes(sec), 0
            while off + 12 <= len(raw):
                namesz, descsz, ntype = struct.unpack_from("<III", raw, off)
                off += 12
                desc = off + ((namesz + 3) & ~3)
                end = desc + descsz
                if off + namesz > len(raw) or end > len(raw):
                    raise CodeObjectFormatError("truncated ELF note")
                yield raw[off:off + namesz].rstrip(b"\0").decode("latin-1"), ntype, raw[desc:end]
                off = desc + ((descsz + 3) & ~3)

    def read_vaddr(self, addr: int, size: int) -> bytes:
        """``size`` bytes at virtual address ``addr`` (from the section that holds them)."""
        for sec in self.sections:
            if sec.type in (0, SHT_NOBITS) or not sec.addr:
                continue
            if sec.addr <= addr and addr + size <= sec.addr + sec.size:
                start = sec.offset + addr - sec.addr
                return self.data[start:start + size]
        raise CodeObjectFormatError(f"address 0x{addr:x}+{size} is in no section of the file")


def _cstr(table: bytes, off: int) -> str:
    if off >= len(table):
        if off == 0:
            return ""
        raise CodeObjectFormatError("string table offset out of range")
    end = table.find(b"\0", off)
    if end < 0:
        raise CodeObjectFormatError("unterminated string in a string table")
    return table[off:end].decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------
# msgpack (what the AMDGPU metadata note uses)

def msgpack_loads(data: bytes):
    value, pos = _mp_value(bytes(data), 0, 0)
    if pos != len(data):
        raise CodeObjectFormatError("trailing bytes after the metadata document")
    return value


def _mp_take(d: bytes, pos: int, n: int) -> tuple[bytes, int]:
    if pos + n > len(d):
        raise CodeObjectFormatError("truncated metadata document")
    return d[pos:pos + n], pos + n


def _mp_value(d: bytes, pos: int, depth: int):
    if depth > 64:
        raise CodeObjectFormatError("metadata nested too deeply")
    raw, pos = _mp_take(d, pos, 1)
    b = raw[0]
    if b <= 0x7F:
        return b, pos
    if b >= 0xE0:
        return b - 0x100, pos
    if 0x80 <= b <= 0x8F:
        return _mp_map(d, pos, b & 0xF, depth)
    if 0x90 <= b <= 0x9F:
        return _mp_array(d, pos, b & 0xF, depth)
    if 0xA0 <= b <= 0xBF:
        return _mp_str(d, pos, b & 0x1F)
    if b in (0xC0, 0xC2, 0xC3):
        return {0xC0: None, 0xC2: False, 0xC3: True}[b], pos
    fixed = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
             0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
    if b in fixed:
        n = struct.calcsize(fixed[b])
        raw, pos = _mp_take(d, pos, n)
        return struct.unpack(fixed[b], raw)[0], pos
    lengths = {0xC4: ">B", 0xC5: ">H", 0xC6: ">I", 0xD9: ">B", 0xDA: ">H", 0xDB: ">I",
               0xDC: ">H", 0xDD: ">I", 0xDE: ">H", 0xDF: ">I"}
    if b in lengths:
        n = struct.calcsize(lengths[b])
        raw, pos = _mp_take(d, pos, n)
        count = struct.unpack(lengths[b], raw)[0]
        if b in (0xC4, 0xC5, 0xC6):
            return _mp_take(d, pos, count)
        if b in (0xD9, 0xDA, 0xDB):
            return _mp_str(d, pos, count)
        if b in (0xDC, 0xDD):
            return _mp_array(d, pos, count, depth)
        return _mp_map(d, pos, count, depth)
    raise CodeObjectFormatError(f"unsupported metadata type byte 0x{b:02x}")


def _mp_str(d: bytes, pos: int, n: int):
    raw, pos = _mp_take(d, pos, n)
    try:
        return raw.decode("utf-8"), pos
    except UnicodeDecodeError as e:
        raise CodeObjectFormatError(f"invalid UTF-8 in metadata: {e}") from None


def _mp_array(d: bytes, pos: int, n: int, depth: int):
    out = []
    for _ in range(n):
        v, pos = _mp_value(d, pos, depth + 1)
        out.append(v)
    return out, pos


def _mp_map(d: bytes, pos: int, n: int, depth: int):
    out = {}
    for _ in range(n):
        k, pos = _mp_value(d, pos, depth + 1)
        v, pos = _mp_value(d, pos, depth + 1)
        if isinstance(k, (list, dict)):
            raise CodeObjectFormatError("metadata map key is not a scalar")
        out[k] = v
    return out, pos


# --------------------------------------------------------------------------------------
# Kernel descriptor (AMDGPUUsage "Kernel Descriptor", code object V3+)

@dataclasses.dataclass(frozen=True)
class KernelDescriptor:
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    kernel_code_entry_byte_offset: int
    compute_pgm_rsrc3: int
    compute_pgm_rsrc1: int
    compute_pgm_rsrc2: int
    kernel_code_properties: int
    kernarg_preload: int

    @classmethod
    def parse(cls, raw: bytes) -> KernelDescriptor:
        if len(raw) != 64:
            raise CodeObjectFormatError(f"kernel descriptor is {len(raw)} bytes, not 64")
        gs, ps, ks = struct.unpack_from("<III", raw, 0)
        entry, = struct.unpack_from("<q", raw, 16)
        rsrc3, rsrc1, rsrc2 = struct.unpack_from("<III", raw, 44)
        props, preload = struct.unpack_from("<HH", raw, 56)
        return cls(gs, ps, ks, entry, rsrc3, rsrc1, rsrc2, props, preload)

    # compute_pgm_rsrc1
    @property
    def float_round_mode_32(self) -> int:
        return (self.compute_pgm_rsrc1 >> 12) & 3

    @property
    def float_round_mode_16_64(self) -> int:
        return (self.compute_pgm_rsrc1 >> 14) & 3

    @property
    def float_denorm_mode_32(self) -> int:
        return (self.compute_pgm_rsrc1 >> 16) & 3

    @property
    def float_denorm_mode_16_64(self) -> int:
        return (self.compute_pgm_rsrc1 >> 18) & 3

    @property
    def dx10_clamp(self) -> bool:
        return bool(self.compute_pgm_rsrc1 >> 21 & 1)

    @property
    def ieee_mode(self) -> bool:
        return bool(self.compute_pgm_rsrc1 >> 23 & 1)

    @property
    def fp16_overflow(self) -> bool:
        return bool(self.compute_pgm_rsrc1 >> 26 & 1)

    # compute_pgm_rsrc2
    @property
    def enable_private_segment(self) -> bool:
        return bool(self.compute_pgm_rsrc2 & 1)

    @property
    def user_sgpr_count(self) -> int:
        return (self.compute_pgm_rsrc2 >> 1) & 0x1F

    @property
    def workgroup_id_enable(self) -> tuple[bool, bool, bool]:
        r = self.compute_pgm_rsrc2
        return bool(r >> 7 & 1), bool(r >> 8 & 1), bool(r >> 9 & 1)

    @property
    def workgroup_info_enable(self) -> bool:
        return bool(self.compute_pgm_rsrc2 >> 10 & 1)

    @property
    def workitem_id_enable(self) -> int:
        """0: x only, 1: x and y, 2: x, y and z."""
        return (self.compute_pgm_rsrc2 >> 11) & 3

    # compute_pgm_rsrc3 (gfx90a+)
    @property
    def accum_offset(self) -> int:
        """First AccVGPR's index in the unified register file."""
        return ((self.compute_pgm_rsrc3 & 0x3F) + 1) * 4

    @property
    def tg_split(self) -> bool:
        return bool(self.compute_pgm_rsrc3 >> 16 & 1)

    # kernel_code_properties: which user SGPRs are set up, in this order
    USER_SGPRS = (("private_segment_buffer", 4), ("dispatch_ptr", 2), ("queue_ptr", 2),
                  ("kernarg_segment_ptr", 2), ("dispatch_id", 2), ("flat_scratch_init", 2),
                  ("private_segment_size", 1))

    def enabled_user_sgprs(self) -> list[tuple[str, int]]:
        return [(name, n) for bit, (name, n) in enumerate(self.USER_SGPRS)
                if self.kernel_code_properties >> bit & 1]

    @property
    def wavefront_size32(self) -> bool:
        return bool(self.kernel_code_properties >> 10 & 1)

    @property
    def kernarg_preload_length(self) -> int:
        return self.kernarg_preload & 0x7F

    @property
    def kernarg_preload_offset(self) -> int:
        return self.kernarg_preload >> 7


# --------------------------------------------------------------------------------------
# Code object

@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """One kernel entry point of a code object."""
    name: str
    descriptor: KernelDescriptor
    entry: int                    # virtual address of the first instruction
    metadata: dict                # its amdhsa.kernels entry, keys without the leading dot
    args: tuple                   # metadata .args entries (offset, size, value_kind, name?)

    @property
    def kernarg_segment_size(self) -> int:
        return int(self.metadata.get("kernarg_segment_size", self.descriptor.kernarg_size))

    @property
    def group_segment_fixed_size(self) -> int:
        return self.descriptor.group_segment_fixed_size


class CodeObject:
    """A parsed gfx950 code object: its text and its kernels by symbol name."""

    def __init__(self, image: bytes):
        elf = Elf64(image)
        if elf.machine != EM_AMDGPU:
            raise CodeObjectFormatError(f"not an AMDGPU code object (e_machine {elf.machine})")
        if elf.osabi != ELFOSABI_AMDGPU_HSA:
            raise CodeObjectFormatError(f"not an HSA code object (OS/ABI {elf.osabi})")
        mach = elf.flags & EF_AMDGPU_MACH_MASK
        if mach != EF_AMDGPU_MACH_GFX950:
            raise CodeObjectFormatError(f"code object is for EF_AMDGPU_MACH 0x{mach:x}, "
                                        "not gfx950 (0x4f)")
        self.elf = elf
        self.abi_version = elf.abiversion
        self.metadata = self._metadata(elf)
        self.target = self._target(elf, self.metadata)
        text = next((s for s in elf.sections if s.name == ".text"), None)
        if text is None:
            raise CodeObjectFormatError("code object has no .text section")
        self.text_addr = text.addr
        self.text = elf.section_bytes(text)
        symbols = {s.name: s for s in elf.symbols()}
        meta_kernels = self.metadata.get("amdhsa.kernels")
        if not isinstance(meta_kernels, list):
            raise CodeObjectFormatError("metadata has no amdhsa.kernels list")
        self.kernels: dict[str, KernelInfo] = {}
        for raw in meta_kernels:
            if not isinstance(raw, dict):
                raise CodeObjectFormatError("kernel metadata entry is not a map")
            meta = {(k[1:] if isinstance(k, str) and k.startswith(".") else k): v
                    for k, v in raw.items()}
            name, kd_name = meta.get("name"), meta.get("symbol")
            if not isinstance(name, str) or not isinstance(kd_name, str):
                raise CodeObjectFormatError("kernel metadata lacks .name or .symbol")
            kd_sym = symbols.get(kd_name)
            if kd_sym is None or kd_sym.size != 64:
                raise CodeObjectFormatError(f"kernel {name}: descriptor symbol {kd_name} is "
                                            "missing or not 64 bytes")
            kd = KernelDescriptor.parse(elf.read_vaddr(kd_sym.value, 64))
            entry = kd_sym.value + kd.kernel_code_entry_byte_offset
            if not self.text_addr <= entry < self.text_addr + len(self.text) or entry % 4:
                raise CodeObjectFormatError(f"kernel {name}: entry 0x{entry:x} is not in .text")
            if meta.get("wavefront_size", 64) != 64 or kd.wavefront_size32:
                raise CodeObjectFormatError(f"kernel {name}: not a wave64 kernel")
            args = []
            for a in meta.get("args", []) or []:
                if not isinstance(a, dict):
                    raise CodeObjectFormatError(f"kernel {name}: argument entry is not a map")
                a = {(k[1:] if isinstance(k, str) and k.startswith(".") else k): v
                     for k, v in a.items()}
                if not isinstance(a.get("offset"), int) or not isinstance(a.get("size"), int):
                    raise CodeObjectFormatError(f"kernel {name}: argument lacks offset/size")
                args.append(a)
            self.kernels[name] = KernelInfo(name, kd, entry, meta, tuple(args))

    @staticmethod
    def _target(elf: Elf64, metadata: dict) -> str:
        """The target ID (``amdgcn-amd-amdhsa--gfx950[:feature±...]``).

        The metadata's ``amdhsa.target`` when it is there; it must name processor gfx950.
        Code objects built by hand-written assembly flows (AMD's own kernel libraries)
        may omit the key; the target is then the one the ELF header states:
        ``EF_AMDGPU_MACH`` (checked by the caller) and, from code object V4 on
        (ABI version >= 2), the XNACK bits 8-9 and SRAMECC bits 10-11 (0: unsupported,
        1: any, 2: off, 3: on), in V3 (ABI version 1) the single bits 8 and 9 (on/off).
        Features do not change what the emulator executes."""
        target = metadata.get("amdhsa.target")
        if target is not None:
            if not isinstance(target, str):
                raise CodeObjectFormatError(f"metadata target {target!r} is not a string")
            m = re.fullmatch(r"amdgcn-amd-amdhsa--([a-z0-9]+)((?::[a-z]+[+-])*)", target)
            if m is None or m.group(1) != "gfx950":
                raise CodeObjectFormatError(f"metadata target {target!r} is not gfx950")
            return target
        flags, features = elf.flags, []
        if elf.abiversion >= 2:
            for name, shift in (("sramecc", 10), ("xnack", 8)):
                setting = flags >> shift & 3
                if setting >= 2:
                    features.append(f":{name}{'-+'[setting - 2]}")
        elif elf.abiversion == 1:
            for name, bit in (("sramecc", 9), ("xnack", 8)):
                features.append(f":{name}{'-+'[flags >> bit & 1]}")
        return "amdgcn-amd-amdhsa--gfx950" + "".join(features)

    @staticmethod
    def _metadata(elf: Elf64) -> dict:
        for name, ntype, desc in elf.notes():
            if name == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
                meta = msgpack_loads(desc)
                if not isinstance(meta, dict):
                    raise CodeObjectFormatError("AMDGPU metadata is not a map")
                return meta
        raise CodeObjectFormatError("no NT_AMDGPU_METADATA note")

    def kernel(self, symbol: str) -> KernelInfo:
        """A kernel by its name (the ``.kd`` suffix is accepted too)."""
        if symbol.endswith(".kd"):
            symbol = symbol[:-3]
        try:
            return self.kernels[symbol]
        except KeyError:
            raise KeyError(f"no kernel {symbol!r} in the code object; it has "
                           f"{sorted(self.kernels)}") from None

    def code_bytes(self, addr: int, n: int) -> bytes:
        off = addr - self.text_addr
        return self.text[off:off + n]
