"""The emulator's own code-object reader and instruction decoder.

Encodings below are decoded by hand from the CDNA4 ISA guide's microcode format tables
(chapter 13); where LLVM 22's disassembler is installed (``llvm-objdump-22``), every
instruction of the sixteen gfx950 kernels (BF16 and FP8) is also rendered and compared with it.
"""

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from zyfa_emulator import CodeObject, CodeObjectFormatError, LoadedCode
from zyfa_emulator.codeobject import msgpack_loads
from zyfa_emulator.isa import decode, decode_all

ROOT = Path(__file__).resolve().parents[2]
KERNELS = sorted((ROOT / "prebuilt").glob("fwd_gfx950_bf16_*.hsaco"))
GFX950_KERNELS = sorted((ROOT / "prebuilt").glob("fwd_gfx950_*.hsaco"))   # BF16 and FP8
needs_kernels = pytest.mark.skipif(not KERNELS, reason="gfx950 code objects not built "
                                   "(python build.py --arch gfx950)")


def words(*ws) -> bytes:
    return b"".join(struct.pack("<I", w) for w in ws)


def test_vop3p_mai_fields():
    # v_mfma_f32_16x16x32_bf16 v[2:5], v[80:83], v[20:23], v[2:5]: VOP3P (0x1a7 << 23),
    # op 53, vdst 2; src0 = 256 + 80, src1 = 256 + 20, src2 = 256 + 2.
    i = decode(words(0xD3B50002, 0x040A2950), 0, 0x100)
    assert (i.fmt, i.name, i.size, i.vdst) == ("MAI", "v_mfma_f32_16x16x32_bf16", 8, 2)
    assert (i.src0, i.src1, i.src2, i.acc_cd, i.acc) == (336, 276, 258, 0, 0)


def test_sopp_waitcnt_and_branch():
    i = decode(words(0xBF8CC07F), 0, 0)
    assert i.name == "s_waitcnt" and i.text() == "s_waitcnt lgkmcnt(0)"
    b = decode(words(0xBF88FE9D), 0, 0x2904)          # s_cbranch_execz -355
    assert b.name == "s_cbranch_execz" and b.simm16 == 0xFE9D


def test_a_wait_on_nothing_reads_as_one():
    """Every counter at its maximum (vmcnt 63: bits 3:0 and 15:14, expcnt 7, lgkmcnt 15) waits
    for nothing; written "s_waitcnt 0" it would read as a wait for everything."""
    assert decode(words(0xBF8CCF7F), 0, 0).text() == "s_waitcnt vmcnt(63) expcnt(7) lgkmcnt(15)"
    assert decode(words(0xBF8C0000), 0, 0).text() == "s_waitcnt vmcnt(0) expcnt(0) lgkmcnt(0)"


def test_a_literal_an_inline_constant_could_hold_is_marked():
    """SOP2 s_addc_u32 (op 4) s77, s77 and ssrc1 255, a literal of 0, which the inline constant
    128 could have encoded: LLVM writes lit(0x0), so that the text reassembles to these bytes."""
    i = decode(words(0x824DFF4D, 0x00000000), 0, 0)
    assert (i.size, i.text()) == (8, "s_addc_u32 s77, s77, lit(0x0)")
    assert decode(words(0x824DFF4D, 0x00000041), 0, 0).text() == "s_addc_u32 s77, s77, 0x41"


def test_vop2_with_literal_and_sdwa():
    i = decode(words(0x0A0202FF, 0x4F7FFFFE), 0, 0)   # v_mul_f32_e32 v1, 0x4f7ffffe, v1
    assert (i.name, i.size, i.literal, i.vdst, i.src1) == ("v_mul_f32", 8, 0x4F7FFFFE, 1, 257)
    s = decode(words(0x280A02F9, 0x04060602), 0, 0)   # v_or_b32_sdwa v5, v2, v1 ... WORD_0
    assert s.name == "v_or_b32" and s.src0 == 258 and s.sdwa.src1_sel == 4 and s.sdwa.dst_sel == 6


def test_memory_formats():
    g = decode(words(0xDC5C8040, 0x467F0002), 0, 0)   # global_load_dwordx4 v[70:73], v[2:3], off offset:64
    assert (g.fmt, g.name, g.offset, g.saddr, g.addr, g.vdst) == \
        ("GLOBAL", "global_load_dwordx4", 64, 0x7F, 258, 256 + 70)
    d = decode(words(0xD8EE2420, 0x58000013), 0, 0)   # ds_read2_b64 v[88:91], v19 offset0:32 offset1:36
    assert (d.name, d.offset0, d.offset1, d.addr, d.vdst) == ("ds_read2_b64", 32, 36, 275, 256 + 88)
    s = decode(words(0xC0120300, 0x00000040), 0, 0)   # s_load_dwordx16 s[12:27], s[0:1], 0x40
    assert (s.name, s.sdata, s.sbase, s.offset, s.imm) == ("s_load_dwordx16", 12, 0, 0x40, 1)
    b = decode(words(0xE05D1040, 0x80020000), 0, 0)   # buffer_load_dwordx4 v0, s[8:11], 0 offen offset:64 lds
    assert (b.name, b.offen, b.lds, b.offset, b.srsrc, b.soffset) == \
        ("buffer_load_dwordx4", 1, 1, 64, 8, 0x80)


def test_scaled_mfma_is_one_16_byte_instruction():
    raw = bytes([0x00, 0x00, 0xAC, 0xD3, 0x14, 0x2B, 0x02, 0x00,
                 0x00, 0x08, 0xAD, 0xD3, 0x04, 0x19, 0x02, 0x04])
    i = decode(raw, 0, 0)
    assert i.size == 16 and i.name == "v_mfma_scale_f32_16x16x128_f8f6f4"
    assert i.scale[:2] == (256 + 20, 256 + 21)


def test_unknown_opcode_is_an_error():
    with pytest.raises(ValueError, match="opcode"):
        decode(words(0xBE80FF00), 0, 0)      # SOP1 opcode 0xff


@pytest.mark.parametrize("raw,value", [(b"\x05", 5), (b"\xd1\xff\x00", -256),
                                       (b"\x82\xa1a\x01\xa1b\x90", {"a": 1, "b": []}),
                                       (b"\xcb" + struct.pack(">d", 2.5), 2.5)])
def test_msgpack(raw, value):
    assert msgpack_loads(raw) == value


@pytest.mark.parametrize("raw", [b"", b"\xa3ab", b"\x92\x01", b"\xc1", b"\x01\x02"])
def test_msgpack_rejects_malformed(raw):
    with pytest.raises(CodeObjectFormatError):
        msgpack_loads(raw)


def test_rejects_non_code_objects():
    for junk in (b"", b"\x7fELF", b"\x7fELF" + b"\0" * 100):
        with pytest.raises(CodeObjectFormatError):
            CodeObject(junk)


@needs_kernels
@pytest.mark.parametrize("path", KERNELS, ids=lambda p: p.stem)
def test_kernel_descriptors(path):
    co = CodeObject(path.read_bytes())
    (k,) = co.kernels.values()
    kd = k.descriptor
    assert k.name == "zyfa_" + path.stem
    assert kd.enabled_user_sgprs() == [("kernarg_segment_ptr", 2)] and kd.user_sgpr_count == 2
    assert kd.workgroup_id_enable == (True, True, True) and kd.workitem_id_enable == 0
    assert kd.float_denorm_mode_32 == 3 and kd.float_round_mode_32 == 0
    assert kd.group_segment_fixed_size == k.metadata["group_segment_fixed_size"]
    manifest = json.loads((path.parent / "manifest.json").read_text())
    (entry,) = [e for e in manifest["kernels"] if e["name"] == path.stem]
    assert k.kernarg_segment_size == entry["kernarg_size"]   # the layout the runtime packs
    assert co.text_addr <= k.entry < co.text_addr + len(co.text)


@needs_kernels
@pytest.mark.parametrize("path", KERNELS, ids=lambda p: p.stem)
def test_every_instruction_has_semantics(path):
    code = LoadedCode(CodeObject(path.read_bytes()))
    assert [i.text() for i in code.check_all()] == []


def _objdump():
    for name in ("llvm-objdump-22", "llvm-objdump-21", "llvm-objdump-20"):
        if shutil.which(name):
            return name
    return None


@needs_kernels
@pytest.mark.skipif(_objdump() is None, reason="llvm-objdump (LLVM >= 20) not installed")
@pytest.mark.parametrize("path", GFX950_KERNELS, ids=lambda p: p.stem)
def test_decoder_agrees_with_llvm_objdump(path):
    co = CodeObject(path.read_bytes())
    mine = {i.pc: " ".join(i.text().split()) for i in decode_all(co.text, co.text_addr)}
    out = subprocess.run([_objdump(), "-d", "--mcpu=gfx950", str(path)], capture_output=True,
                         text=True, check=True).stdout
    seen = 0
    for line in out.splitlines():
        m = re.match(r"\s+(\S.*?)\s*// ([0-9A-F]{12}):", line)
        if m:
            seen += 1
            assert mine.get(int(m.group(2), 16)) == " ".join(m.group(1).split()), line
    assert seen == len(mine)
