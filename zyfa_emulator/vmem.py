"""Memory instructions: scalar memory (SMEM), global/flat (FLAT), buffer (MUBUF) and LDS
(DS), from the CDNA4 ISA guide chapters 8-11.

Timing model: an instruction computes its addresses and reads its data registers when
it issues, then queues its completion on its counter -- VM_CNT for global, flat and
buffer accesses (including buffer/global loads into LDS), LGKM_CNT for SMEM and LDS.
The memory access itself and the register write happen when the completion runs, in
issue order per counter, which is when an ``s_waitcnt`` needs it (wave.py).

Bounds: global addresses must fall inside a known region (memory.py); buffer accesses
use the buffer resource's range checking (ISA §9.1.5: out-of-range dwords read as zero,
out-of-range stores are dropped); LDS accesses outside the workgroup's allocation are
errors in strict mode (the default) and follow the ISA otherwise (reads return zero,
writes are dropped).
"""

from __future__ import annotations

import re

import numpy as np

from .errors import EmulatorError, registry
from .wave import CONST32, LANES, MASK32, U32, U64

HANDLERS, handler = registry()


def _what(w, inst):
    def make(lane, addr, message):
        return EmulatorError(f"{inst.where()} ({w.name()}): lane {lane}, "
                             f"address {message}")
    return make


# --------------------------------------------------------------------------------------
# SMEM

_SMEM_DWORDS = {"s_load_dword": 1, "s_load_dwordx2": 2, "s_load_dwordx4": 4, "s_load_dwordx8": 8,
                "s_load_dwordx16": 16, "s_buffer_load_dword": 1, "s_buffer_load_dwordx2": 2,
                "s_buffer_load_dwordx4": 4, "s_buffer_load_dwordx8": 8,
                "s_buffer_load_dwordx16": 16}


def _smem_offset(w, inst) -> int:
    off = inst.offset if inst.imm else 0
    if inst.soffset is not None:
        off += w.s[inst.soffset] if inst.soffset < 128 else 0
    return off


@handler(*_SMEM_DWORDS)
def _s_load(w, inst):
    n = _SMEM_DWORDS[inst.name]
    mem = w.machine.memory
    if inst.name.startswith("s_buffer"):
        base = w.s[inst.sbase] | (w.s[inst.sbase + 1] & 0xFFFF) << 32
        num_records = w.s[inst.sbase + 2]
        off = _smem_offset(w, inst) & ~3
        addr = base + off
    else:
        addr = (w.sget64(inst.sbase) + _smem_offset(w, inst)) & ~3 & ((1 << 64) - 1)
        num_records = None
    sdata = inst.sdata
    if sdata + n > 106 and not (sdata >= 108 and sdata + n <= 124):
        w.fail(inst, "scalar load destination runs past the SGPR file")
    what = _what(w, inst)

    def complete():
        if num_records is not None:
            words = []
            for i in range(n):
                o = off + 4 * i
                words.append(0 if o >= num_records else
                             int.from_bytes(mem.read_scalar(addr + 4 * i, 4, what), "little"))
        else:
            raw = mem.read_scalar(addr, 4 * n, what)
            words = [int.from_bytes(raw[4 * i:4 * i + 4], "little") for i in range(n)]
        w.s[sdata:sdata + n] = words
    w.push_lgkm(complete)


@handler("s_dcache_wb", "s_dcache_inv", "s_dcache_wb_vol", "s_dcache_inv_vol",
         "s_dcache_discard", "s_dcache_discard_x2")
def _s_dcache(w, inst):
    w.push_lgkm(lambda: None)


@handler("s_memtime", "s_memrealtime")
def _s_memtime(w, inst):
    t = w.machine.clock()
    sdata = inst.sdata

    def complete():
        w.s[sdata] = t & MASK32
        w.s[sdata + 1] = (t >> 32) & MASK32
    w.push_lgkm(complete)


# --------------------------------------------------------------------------------------
# Shared helpers for vector memory

_WIDTH = {"ubyte": 1, "sbyte": 1, "ushort": 2, "sshort": 2, "dword": 4, "dwordx2": 8,
          "dwordx3": 12, "dwordx4": 16, "byte": 1, "short": 2}


def _access(name: str):
    """(kind, bytes, signed, d16) of a vector memory mnemonic."""
    m = re.search(r"_(load|store)(?:_lds)?_(ubyte|sbyte|ushort|sshort|dwordx[234]|dword|byte|short)"
                  r"(_d16(?:_hi)?)?$", name)
    if not m:
        return None
    return m.group(1), _WIDTH[m.group(2)], m.group(2) in ("sbyte", "sshort"), m.group(3)


def _bytes_to_rows(data: np.ndarray, nbytes: int, signed: bool) -> np.ndarray:
    """uint8[lanes, nbytes] -> uint32[ndwords, lanes] register rows (sub-dword extended)."""
    if nbytes >= 4:
        return np.ascontiguousarray(data).view("<u4").T
    if nbytes == 1:
        v = data[:, 0].astype(np.int8 if signed else np.uint8)
    else:
        v = np.ascontiguousarray(data).view("<i2" if signed else "<u2")[:, 0]
    return v.astype(np.int64).astype(U32)[None, :]


def _rows_to_bytes(rows: np.ndarray, nbytes: int) -> np.ndarray:
    """uint32[ndwords, lanes] -> uint8[lanes, nbytes] (sub-dword: the low bytes)."""
    b = np.ascontiguousarray(rows.T).view(np.uint8)
    return b[:, :nbytes]


def _vrows(w, inst, code: int, n: int) -> int:
    row = w.vrow(code, bool(inst.acc))
    if row + n > 512:
        w.fail(inst, "register tuple runs past the register file")
    return row


# --------------------------------------------------------------------------------------
# FLAT / GLOBAL

def _flat_addrs(w, inst) -> np.ndarray:
    if inst.saddr != 0x7F and inst.seg != 0:
        base = w.sget64(inst.saddr)
        voff = w.v[inst.addr - 256].astype(U64)
        a = U64(base) + voff
    else:
        r = inst.addr - 256
        a = w.v[r].astype(U64) | (w.v[r + 1].astype(U64) << U64(32))
    return (a + U64(inst.offset & ((1 << 64) - 1))) if inst.offset >= 0 else a - U64(-inst.offset)


@handler("global_load_ubyte", "global_load_sbyte", "global_load_ushort", "global_load_sshort",
         "global_load_dword", "global_load_dwordx2", "global_load_dwordx3", "global_load_dwordx4",
         "flat_load_ubyte", "flat_load_sbyte", "flat_load_ushort", "flat_load_sshort",
         "flat_load_dword", "flat_load_dwordx2", "flat_load_dwordx3", "flat_load_dwordx4")
def _global_load(w, inst):
    _, nbytes, signed, _ = _access(inst.name)
    ndw = max(1, nbytes // 4)
    row = _vrows(w, inst, inst.vdst, ndw)
    mask = w.execmask().copy()
    lanes = np.nonzero(mask)[0]
    addrs = _flat_addrs(w, inst)[lanes]
    mem = w.machine.memory
    what = _what(w, inst)

    def complete():
        if len(lanes) == 0:
            return
        data = mem.read(addrs, nbytes, what)
        rows = _bytes_to_rows(data, nbytes, signed)
        w.v[row:row + ndw, lanes] = rows
    w.push_vm(complete)
    if inst.fmt == "FLAT":
        w.push_lgkm(lambda: None)


@handler("global_store_byte", "global_store_short", "global_store_dword", "global_store_dwordx2",
         "global_store_dwordx3", "global_store_dwordx4", "flat_store_byte", "flat_store_short",
         "flat_store_dword", "flat_store_dwordx2", "flat_store_dwordx3", "flat_store_dwordx4",
         "global_store_byte_d16_hi", "global_store_short_d16_hi")
def _global_store(w, inst):
    _, nbytes, _, d16 = _access(inst.name)
    ndw = max(1, nbytes // 4)
    row = _vrows(w, inst, inst.data0, ndw)
    lanes = np.nonzero(w.execmask())[0]
    addrs = _flat_addrs(w, inst)[lanes]
    rows = w.v[row:row + ndw, lanes].copy()
    if d16 == "_d16_hi":
        rows = rows >> U32(16)
    data = _rows_to_bytes(rows, nbytes)
    mem = w.machine.memory
    what = _what(w, inst)

    def complete():
        if len(lanes):
            mem.write(addrs, data, what)
    w.push_vm(complete)
    if inst.fmt == "FLAT":
        w.push_lgkm(lambda: None)


def _lds_dma_width(name: str) -> int:
    return {"dword": 4, "dwordx3": 12, "dwordx4": 16}.get(name.rsplit("_", 1)[-1], 0)


@handler("global_load_lds_dword", "global_load_lds_dwordx3", "global_load_lds_dwordx4")
def _global_load_lds(w, inst):
    nbytes = _lds_dma_width(inst.name)
    lanes = np.nonzero(w.execmask())[0]
    addrs = _flat_addrs(w, inst)[lanes]
    stride = 4 if nbytes == 4 else 16
    lds_off = (w.s[124] & 0x3FFFF) + inst.offset + stride * lanes
    mem = w.machine.memory
    what = _what(w, inst)

    def complete():
        if len(lanes):
            data = mem.read(addrs, nbytes, what)
            w.wg.lds_write(w, inst, lds_off, data)
    w.push_vm(complete)


# --------------------------------------------------------------------------------------
# MUBUF (ISA §9.1: buffer resource, address computation, range checking)

class BufferResource:
    __slots__ = ("base", "stride", "num_records", "swizzle", "add_tid", "words")

    def __init__(self, words):
        self.words = words
        self.base = words[0] | (words[1] & 0xFFFF) << 32
        self.stride = (words[1] >> 16) & 0x3FFF
        self.swizzle = (words[1] >> 31) & 1
        self.num_records = words[2]
        self.add_tid = (words[3] >> 23) & 1


def _buffer_setup(w, inst):
    rsrc = BufferResource(w.s[inst.srsrc:inst.srsrc + 4])
    if rsrc.swizzle:
        w.fail(inst, "swizzled buffer resources are not modelled")
    if rsrc.add_tid:
        w.fail(inst, "buffer resources with ADD_TID_ENABLE are not modelled")
    soff = _soffset(w, inst)
    v0 = w.v[inst.addr - 256].astype(np.int64)
    v1 = w.v[inst.addr - 255].astype(np.int64) if inst.addr < 511 else np.zeros(64, np.int64)
    if inst.idxen and inst.offen:
        index, voff = v0, v1
    elif inst.idxen:
        index, voff = v0, np.zeros(64, np.int64)
    elif inst.offen:
        index, voff = np.zeros(64, np.int64), v0
    else:
        index = voff = np.zeros(64, np.int64)
    offset = (voff + inst.offset) & MASK32       # formed in 32-bit offset space
    return rsrc, soff, index, offset


def _soffset(w, inst) -> int:
    """SOFFSET as the unsigned 32-bit value it supplies: an SGPR (or M0), or an inline
    constant's 32-bit pattern (-1 is 0xFFFFFFFF, not a subtraction)."""
    code = inst.soffset
    if code < 128:
        return int(w.s[code])
    value = CONST32[code]
    if value is None:
        w.fail(inst, f"SOFFSET operand code {code} is not modelled")
    return int(value) & MASK32


def _buffer_dwords(rsrc, soff, index, offset, nbytes, idxen=False):
    """Per lane and dword: (address, in range) for an access of ``nbytes``.

    Range check of a linear (unswizzled, no ADD_TID) buffer:
    * structured (IDXEN with STRIDE != 0): the whole access is in range iff
      index < NUM_RECORDS;
    * raw (otherwise): element ``k`` (a dword; the whole access for byte/short) is in
      range iff ``offset + SOFFSET + (k + 1) * size <= NUM_RECORDS``, where offset =
      VOFFSET + inst_offset in 32-bit arithmetic and SOFFSET is unsigned 32-bit, the sum
      not wrapped -- so a "negative" (wrapped) SOFFSET puts the access out of range.
    Out-of-range elements read 0 and are not stored (CDNA4 ISA §9.1 buffer range
    checking, per dword for dwordx2/3/4).  The ISA text quoted for gfx9 leaves SOFFSET
    out of the raw check; gfx950 hardware counts it (see docs/emulator.md, "Buffer
    range checking")."""
    size = min(nbytes, 4)
    ndw = max(1, nbytes // 4)
    k = np.arange(ndw, dtype=np.int64) * 4
    off_k = offset[:, None] + k[None, :]
    if idxen and rsrc.stride != 0:
        in_range = np.broadcast_to((index < rsrc.num_records)[:, None], off_k.shape)
    else:
        in_range = off_k + (soff + size) <= rsrc.num_records
    addr = rsrc.base + soff + rsrc.stride * index[:, None] + off_k
    return addr, in_range


@handler("buffer_load_ubyte", "buffer_load_sbyte", "buffer_load_ushort", "buffer_load_sshort",
         "buffer_load_dword", "buffer_load_dwordx2", "buffer_load_dwordx3", "buffer_load_dwordx4")
def _buffer_load(w, inst):
    _, nbytes, signed, _ = _access(inst.name)
    rsrc, soff, index, offset = _buffer_setup(w, inst)
    addr, in_range = _buffer_dwords(rsrc, soff, index, offset, nbytes, inst.idxen)
    lanes = np.nonzero(w.execmask())[0]
    addr, in_range = addr[lanes], in_range[lanes]
    mem = w.machine.memory
    what = _what(w, inst)
    unit = min(nbytes, 4)
    ndw = addr.shape[1]
    if inst.lds:
        if nbytes not in (4, 12, 16):
            w.fail(inst, "only dword, dwordx3 and dwordx4 buffer loads can write LDS")
        stride = 4 if nbytes == 4 else 16
        lds_off = (w.s[124] & 0x3FFFF) + inst.offset + stride * lanes

        def complete_lds():
            if len(lanes):
                data = _gather_checked(mem, addr, in_range, unit, what)
                w.wg.lds_write(w, inst, lds_off, data)
        w.push_vm(complete_lds)
        return
    row = _vrows(w, inst, inst.data0, ndw)

    def complete():
        if len(lanes) == 0:
            return
        data = _gather_checked(mem, addr, in_range, unit, what)
        w.v[row:row + ndw, lanes] = _bytes_to_rows(data, nbytes, signed)
    w.push_vm(complete)


def _gather_checked(mem, addr, in_range, unit, what) -> np.ndarray:
    """uint8[lanes, ndw*unit]: in-range dwords from memory, zeros elsewhere."""
    n, ndw = addr.shape
    out = np.zeros((n, ndw * unit), np.uint8)
    flat_ok = in_range.reshape(-1)
    if flat_ok.any():
        data = mem.read(addr.reshape(-1)[flat_ok].astype(U64), unit, what)
        view = out.reshape(n * ndw, unit)
        view[flat_ok] = data
    return out


@handler("buffer_store_byte", "buffer_store_short", "buffer_store_dword", "buffer_store_dwordx2",
         "buffer_store_dwordx3", "buffer_store_dwordx4")
def _buffer_store(w, inst):
    _, nbytes, _, _ = _access(inst.name)
    rsrc, soff, index, offset = _buffer_setup(w, inst)
    addr, in_range = _buffer_dwords(rsrc, soff, index, offset, nbytes, inst.idxen)
    lanes = np.nonzero(w.execmask())[0]
    addr, in_range = addr[lanes], in_range[lanes]
    ndw = addr.shape[1]
    row = _vrows(w, inst, inst.data0, ndw)
    unit = min(nbytes, 4)
    data = _rows_to_bytes(w.v[row:row + ndw, lanes].copy(), nbytes).reshape(len(lanes) * ndw, unit)
    mem = w.machine.memory
    what = _what(w, inst)

    def complete():
        ok = in_range.reshape(-1)
        if ok.any():
            mem.write(addr.reshape(-1)[ok].astype(U64), data[ok], what)
    w.push_vm(complete)


@handler("buffer_wbl2", "buffer_inv", "buffer_wbinvl1", "buffer_wbinvl1_vol")
def _buffer_cache(w, inst):
    w.push_vm(lambda: None)


# --------------------------------------------------------------------------------------
# DS (LDS)

def _ds_base(w, inst) -> np.ndarray:
    return w.v[inst.addr - 256].astype(np.int64)


_DS_READ = {"ds_read_b32": 4, "ds_read_b64": 8, "ds_read_b96": 12, "ds_read_b128": 16,
            "ds_read_u8": 1, "ds_read_i8": 1, "ds_read_u16": 2, "ds_read_i16": 2}
_DS_WRITE = {"ds_write_b32": 4, "ds_write_b64": 8, "ds_write_b96": 12, "ds_write_b128": 16,
             "ds_write_b8": 1, "ds_write_b16": 2}


@handler(*_DS_READ)
def _ds_read(w, inst):
    nbytes = _DS_READ[inst.name]
    signed = inst.name in ("ds_read_i8", "ds_read_i16")
    ndw = max(1, nbytes // 4)
    row = _vrows(w, inst, inst.vdst, ndw)
    lanes = np.nonzero(w.execmask())[0]
    addr = _ds_base(w, inst)[lanes] + inst.offset

    def complete():
        if len(lanes):
            data = w.wg.lds_read(w, inst, addr, nbytes)
            w.v[row:row + ndw, lanes] = _bytes_to_rows(data, nbytes, signed)
    w.push_lgkm(complete)


@handler(*_DS_WRITE)
def _ds_write(w, inst):
    nbytes = _DS_WRITE[inst.name]
    ndw = max(1, nbytes // 4)
    row = _vrows(w, inst, inst.data0, ndw)
    lanes = np.nonzero(w.execmask())[0]
    addr = _ds_base(w, inst)[lanes] + inst.offset
    data = _rows_to_bytes(w.v[row:row + ndw, lanes].copy(), nbytes)

    def complete():
        if len(lanes):
            w.wg.lds_write(w, inst, addr, data)
    w.push_lgkm(complete)


_DS_READ2 = {"ds_read2_b32": (4, 4), "ds_read2st64_b32": (4, 256), "ds_read2_b64": (8, 8),
             "ds_read2st64_b64": (8, 512)}
_DS_WRITE2 = {"ds_write2_b32": (4, 4), "ds_write2st64_b32": (4, 256), "ds_write2_b64": (8, 8),
              "ds_write2st64_b64": (8, 512)}


@handler(*_DS_READ2)
def _ds_read2(w, inst):
    size, scale = _DS_READ2[inst.name]
    ndw = size // 4
    row = _vrows(w, inst, inst.vdst, 2 * ndw)
    lanes = np.nonzero(w.execmask())[0]
    base = _ds_base(w, inst)[lanes]
    a0, a1 = base + inst.offset0 * scale, base + inst.offset1 * scale

    def complete():
        if len(lanes):
            d0 = w.wg.lds_read(w, inst, a0, size)
            d1 = w.wg.lds_read(w, inst, a1, size)
            w.v[row:row + ndw, lanes] = _bytes_to_rows(d0, size, False)
            w.v[row + ndw:row + 2 * ndw, lanes] = _bytes_to_rows(d1, size, False)
    w.push_lgkm(complete)


@handler(*_DS_WRITE2)
def _ds_write2(w, inst):
    size, scale = _DS_WRITE2[inst.name]
    ndw = size // 4
    r0 = _vrows(w, inst, inst.data0, ndw)
    r1 = _vrows(w, inst, inst.data1, ndw)
    lanes = np.nonzero(w.execmask())[0]
    base = _ds_base(w, inst)[lanes]
    a0, a1 = base + inst.offset0 * scale, base + inst.offset1 * scale
    d0 = _rows_to_bytes(w.v[r0:r0 + ndw, lanes].copy(), size)
    d1 = _rows_to_bytes(w.v[r1:r1 + ndw, lanes].copy(), size)

    def complete():
        if len(lanes):
            w.wg.lds_write(w, inst, a0, d0)
            w.wg.lds_write(w, inst, a1, d1)
    w.push_lgkm(complete)


@handler("ds_bpermute_b32", "ds_permute_b32")
def _ds_permute(w, inst):
    # ISA pseudocode (§12.13): lane = (ADDR + OFFSET) / 4 % 64.  bpermute pulls from the
    # addressed lane (0 if that lane is disabled); permute pushes to it (the highest
    # source lane wins).  Only enabled lanes are written.
    ex = w.execmask().copy()
    sel = ((w.v[inst.addr - 256].astype(np.int64) + inst.offset) // 4) % 64
    data = w.v[inst.data0 - 256].copy()
    row = inst.vdst - 256
    if inst.name == "ds_bpermute_b32":
        res = np.where(ex[sel], data[sel], U32(0)).astype(U32)
    else:
        res = np.zeros(64, U32)
        src = np.nonzero(ex)[0]
        res[sel[src]] = data[src]   # numpy assigns in order: the last (highest) lane wins

    def complete():
        np.copyto(w.v[row], res, where=ex)
    w.push_lgkm(complete)


def _swizzle_sources(offset: int) -> np.ndarray:
    lane = LANES
    if offset & 0x8000:
        sel = np.array([(offset >> (2 * i)) & 3 for i in range(4)])
        return (lane & ~3) | sel[lane & 3]
    and_m, or_m, xor_m = offset & 0x1F, (offset >> 5) & 0x1F, (offset >> 10) & 0x1F
    return (lane & 0x20) | ((((lane & 0x1F) & and_m) | or_m) ^ xor_m)


@handler("ds_swizzle_b32")
def _ds_swizzle(w, inst):
    ex = w.execmask().copy()
    src = _swizzle_sources(inst.offset)
    data = w.v[inst.addr - 256].copy()
    res = np.where(ex[src], data[src], U32(0)).astype(U32)
    row = inst.vdst - 256

    def complete():
        np.copyto(w.v[row], res, where=ex)
    w.push_lgkm(complete)


_TR = {"ds_read_b64_tr_b4": (4, 2), "ds_read_b64_tr_b8": (8, 2), "ds_read_b64_tr_b16": (16, 2),
       "ds_read_b96_tr_b6": (6, 3)}


@handler(*_TR)
def _ds_read_tr(w, inst):
    # ISA §11.4 "MFMA Transpose Load from LDS": each group of 16 lanes reads 16 x 8 (or
    # 12) bytes, one row per lane address, and each lane receives one column of the
    # group's element matrix: with n = elements per lane, lane d of a group gets element
    # (d % n) of source lane (16 / n) * r + d // n as its element r.
    # §11.4 makes a full EXEC a precondition of these reads.  A lane's result comes from
    # other lanes' addresses and the guide does not say what inactive lanes contribute or
    # receive, so any other EXEC (zero included) is refused at issue: nothing is read and
    # no register changes.
    if not w.exec_full():
        w.fail(inst, f"transpose LDS reads require EXEC to be all ones (ISA §11.4); EXEC is "
                     f"0x{w.exec:016x}, and what a partial EXEC does is not specified")
    bits, ndw = _TR[inst.name]
    nbytes = 4 * ndw
    if (inst.offset % 8) or np.any(w.v[inst.addr - 256] % 8):
        w.fail(inst, "transpose LDS reads need addresses aligned to 8 bytes")
    row = _vrows(w, inst, inst.vdst, ndw)
    addr = _ds_base(w, inst) + inst.offset
    n = (8 * nbytes) // bits
    per_row = 16 // n if n <= 16 else 1

    src_lane, elem = _tr_index(n, per_row)

    def complete():
        data = w.wg.lds_read(w, inst, addr, nbytes)             # [64, nbytes]
        vals = _unpack_bits(data, bits, n)                       # [64, n] element codes
        out = vals[src_lane, elem]                               # [64, n]
        w.v[row:row + ndw] = _pack_bits(out, bits, ndw)
    w.push_lgkm(complete)


_TR_INDEX: dict = {}


def _tr_index(n: int, per_row: int):
    key = (n, per_row)
    if key not in _TR_INDEX:
        lane = np.arange(64)[:, None]
        r = np.arange(n)[None, :]
        d = lane % 16
        _TR_INDEX[key] = ((lane - d) + per_row * r + d // n, np.broadcast_to(d % n, (64, n)))
    return _TR_INDEX[key]


def _unpack_bits(data: np.ndarray, bits: int, n: int) -> np.ndarray:
    """uint8[lanes, nbytes] -> int64[lanes, n] little-endian fields of ``bits`` bits."""
    if bits in (8, 16):
        return np.ascontiguousarray(data).view("<u1" if bits == 8 else "<u2").astype(np.int64)
    bitsarr = np.unpackbits(data, axis=1, bitorder="little")[:, :bits * n]
    weights = 1 << np.arange(bits)
    return (bitsarr.reshape(data.shape[0], n, bits) * weights).sum(axis=2).astype(np.int64)


def _pack_bits(vals: np.ndarray, bits: int, ndw: int) -> np.ndarray:
    """int64[lanes, n] fields -> uint32[ndw, lanes] register rows."""
    lanes, n = vals.shape
    if bits in (8, 16):
        b = vals.astype(np.uint8 if bits == 8 else "<u2")
        return np.ascontiguousarray(b).view("<u4").reshape(lanes, ndw).T.astype(U32)
    fields = ((vals[:, :, None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(lanes, n * bits)
    pad = np.zeros((lanes, 32 * ndw - n * bits), np.uint8)
    packed = np.packbits(np.concatenate([fields, pad], axis=1), axis=1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u4").reshape(lanes, ndw).T.astype(U32)


@handler("ds_nop")
def _ds_nop(w, inst):
    w.push_lgkm(lambda: None)
