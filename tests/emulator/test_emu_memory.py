"""Memory instructions: global, buffer (incl. loads into LDS), LDS, cross-lane DS ops,
counters and barriers.  Expected behaviour from the CDNA4 ISA guide chapters 8-11."""

import numpy as np
import pytest
from emukit import build, run

from zyfa_emulator import Config, EmulatorError, Machine

LANE = np.arange(64)

SNIPPETS = {
    "gload": "global_load_dword v1, v0, s[4:5] offset:8\n  s_waitcnt vmcnt(0)",
    "gload_x4": "global_load_dwordx4 v[4:7], v[0:1], off offset:-16\n  s_waitcnt vmcnt(0)",
    "gload_sub": "global_load_sbyte v1, v0, s[4:5]\n  global_load_ushort v2, v0, s[4:5]\n  s_waitcnt vmcnt(0)",
    "gstore": "global_store_dwordx2 v0, v[2:3], s[4:5]\n  s_waitcnt vmcnt(0)",
    "gload_nowait": "global_load_dword v1, v0, s[4:5]\n  v_mov_b32_e32 v2, v1\n  s_waitcnt vmcnt(0)",
    "two_loads_wait1": "global_load_dword v1, v0, s[4:5]\n  global_load_dword v2, v0, s[4:5] offset:256\n  s_waitcnt vmcnt(1)\n  v_mov_b32_e32 v3, v1\n  v_mov_b32_e32 v4, v2\n  s_waitcnt vmcnt(0)",
    "bload": "buffer_load_dword v1, v0, s[8:11], 0 offen\n  s_waitcnt vmcnt(0)",
    "bload_x4": "buffer_load_dwordx4 v[4:7], v0, s[8:11], s12 offen offset:4\n  s_waitcnt vmcnt(0)",
    "bload_idx": "buffer_load_dword v1, v0, s[8:11], 0 idxen offset:4\n  s_waitcnt vmcnt(0)",
    "bload_soff_consts": "buffer_load_dword v1, v0, s[8:11], 16 offen\n  buffer_load_dword v2, v0, s[8:11], -1 offen\n  s_waitcnt vmcnt(0)",
    "bstore": "buffer_store_dword v1, v0, s[8:11], 0 offen\n  s_waitcnt vmcnt(0)",
    "bload_lds": "s_mov_b32 m0, s12\n  s_nop 0\n  buffer_load_dword v0, s[8:11], 0 offen offset:4 lds\n  s_waitcnt vmcnt(0)",
    "bload_lds_x4": "s_mov_b32 m0, 64\n  s_nop 0\n  buffer_load_dwordx4 v0, s[8:11], 0 offen lds\n  s_waitcnt vmcnt(0)",
    "gload_lds_x4": "s_mov_b32 m0, 0\n  s_nop 0\n  global_load_lds_dwordx4 v0, s[4:5] offset:16\n  s_waitcnt vmcnt(0)",
    "ds_rw": """
  ds_write_b32 v0, v1 offset:4
  ds_write2_b64 v2, v[4:5], v[6:7] offset0:1 offset1:2
  s_waitcnt lgkmcnt(0)
  ds_read_b32 v10, v0 offset:4
  ds_read2_b64 v[12:15], v2 offset0:1 offset1:2
  ds_read_b128 v[16:19], v2 offset:8
  s_waitcnt lgkmcnt(0)""",
    "ds_u8": "ds_write_b8 v0, v1\n  s_waitcnt lgkmcnt(0)\n  ds_read_i8 v2, v0\n  ds_read_u8 v3, v0\n  s_waitcnt lgkmcnt(0)",
    "bpermute": "ds_bpermute_b32 v2, v0, v1\n  s_waitcnt lgkmcnt(0)",
    "permute": "ds_permute_b32 v2, v0, v1\n  s_waitcnt lgkmcnt(0)",
    "swizzle_swap": "ds_swizzle_b32 v2, v1 offset:swizzle(SWAP,16)\n  s_waitcnt lgkmcnt(0)",
    "swizzle_quad": "ds_swizzle_b32 v2, v1 offset:swizzle(QUAD_PERM,1,0,3,2)\n  s_waitcnt lgkmcnt(0)",
    "tr_b16": "ds_read_b64_tr_b16 v[2:3], v0\n  s_waitcnt lgkmcnt(0)",
    "tr_b8": "ds_read_b64_tr_b8 v[2:3], v0\n  s_waitcnt lgkmcnt(0)",
    "tr_b4": "ds_read_b64_tr_b4 v[2:3], v0\n  s_waitcnt lgkmcnt(0)",
    "tr_b6": "ds_read_b96_tr_b6 v[2:4], v0\n  s_waitcnt lgkmcnt(0)",
    "lds_oob": "ds_read_b32 v1, v0\n  s_waitcnt lgkmcnt(0)",
    "barrier_exchange": """
  v_lshlrev_b32_e32 v1, 2, v0
  ds_write_b32 v1, v0
  s_waitcnt lgkmcnt(0)
  s_barrier
  v_xor_b32_e32 v2, 0x100, v1
  ds_read_b32 v3, v2
  s_waitcnt lgkmcnt(0)""",
    "barrier_no_wait": """
  v_lshlrev_b32_e32 v1, 2, v0
  ds_write_b32 v1, v0
  s_barrier
  v_xor_b32_e32 v2, 0x100, v1
  ds_read_b32 v3, v2
  s_waitcnt lgkmcnt(0)""",
    "smem": "s_load_dwordx2 s[6:7], s[4:5], 0x8\n  s_load_dword s8, s[4:5], 0x0\n  s_waitcnt lgkmcnt(0)",
    "smem_nowait": "s_load_dword s8, s[4:5], 0x0\n  s_mov_b32 s9, s8\n  s_waitcnt lgkmcnt(0)",
}


@pytest.fixture(scope="module")
def code():
    return build(SNIPPETS)


@pytest.fixture
def machine():
    return Machine()


def buffer(machine, nbytes, name="buf", fill=None):
    arr = np.zeros(nbytes, np.uint8) if fill is None else np.asarray(fill).copy()
    arr = arr.reshape(-1)
    machine.memory.add(arr.ctypes.data, arr.nbytes, name, arr.view(np.uint8))
    return arr


def regs(**kv):
    def setup(w):
        for name, val in kv.items():
            if name == "exec":
                w.exec = val
            elif name.startswith("v"):
                w.v[int(name[1:])] = np.asarray(val).astype(np.uint32)
            else:
                w.s[int(name[1:])] = int(val) & 0xFFFFFFFF
    return setup


def ptr_regs(base: int, lo: int = 4):
    return {f"s{lo}": base & 0xFFFFFFFF, f"s{lo + 1}": base >> 32}


def rsrc(base: int, num_records: int, stride: int = 0):
    """A buffer resource in s[8:11] (ISA §9.1.5 V# layout)."""
    return {"s8": base & 0xFFFFFFFF, "s9": (base >> 32) | stride << 16, "s10": num_records,
            "s11": 0x00020000}


def test_global_load_with_sgpr_base_and_offset(code, machine):
    data = buffer(machine, 4096, fill=np.arange(1024, dtype=np.uint32))
    w = run(code, "gload", regs(v0=LANE * 8, **ptr_regs(data.ctypes.data)), machine=machine)
    assert np.array_equal(w.v[1], 2 * LANE + 2)


def test_global_load_dwordx4_with_vgpr_address(code, machine):
    data = buffer(machine, 2048, fill=np.arange(512, dtype=np.uint32))
    addr = data.ctypes.data + 16 * LANE + 16          # offset:-16 brings it back to 16 * lane
    w = run(code, "gload_x4", regs(v0=addr & 0xFFFFFFFF, v1=addr >> 32), machine=machine)
    for k in range(4):
        assert np.array_equal(w.v[4 + k], 4 * LANE + k)


def test_global_load_sign_and_zero_extension(code, machine):
    data = buffer(machine, 256, fill=np.full(256, 0xF0, np.uint8))
    w = run(code, "gload_sub", regs(v0=LANE, **ptr_regs(data.ctypes.data)), machine=machine)
    assert (w.v[1] == 0xFFFFFFF0).all() and (w.v[2] == 0xF0F0).all()


def test_global_store_respects_exec(code, machine):
    data = buffer(machine, 512)
    ex = 0x00000000_0000FFFF
    w = run(code, "gstore", regs(v0=LANE * 8, v2=LANE, v3=LANE + 100, exec=ex,
                                 **ptr_regs(data.ctypes.data)), machine=machine)
    words = data.view(np.uint32)
    assert np.array_equal(words[0:32:2], LANE[:16]) and np.array_equal(words[1:32:2], LANE[:16] + 100)
    assert (words[32:] == 0).all()
    assert w.status == "done"


def test_access_outside_every_allocation_names_the_instruction(code, machine):
    data = buffer(machine, 256, name="small")
    with pytest.raises(EmulatorError) as e:
        run(code, "gload", regs(v0=LANE * 8, **ptr_regs(data.ctypes.data)), machine=machine)
    msg = str(e.value)
    assert "global_load_dword v1, v0, s[4:5] offset:8" in msg
    assert "outside every known allocation" in msg and "small" in msg


def test_loads_complete_only_at_waitcnt(code, machine):
    # Without s_waitcnt the destination still holds its old value when read.
    data = buffer(machine, 256, fill=np.full(64, 7, np.uint32))
    w = run(code, "gload_nowait", regs(v0=LANE * 4, v1=np.full(64, 3), **ptr_regs(data.ctypes.data)),
            machine=machine)
    assert (w.v[2] == 3).all() and (w.v[1] == 7).all()


def test_vmcnt_retires_in_issue_order(code, machine):
    data = buffer(machine, 512, fill=np.concatenate([np.full(64, 1, np.uint32), np.full(64, 2, np.uint32)]))
    w = run(code, "two_loads_wait1", regs(v0=LANE * 4, v1=np.zeros(64), v2=np.zeros(64),
                                          **ptr_regs(data.ctypes.data)), machine=machine)
    assert (w.v[3] == 1).all() and (w.v[4] == 0).all()     # only the older load had completed


def test_buffer_loads_outside_num_records_read_zero(code, machine):
    data = buffer(machine, 1024, fill=np.arange(256, dtype=np.uint32) + 1)
    w = run(code, "bload", regs(v0=LANE * 4, **rsrc(data.ctypes.data, 100)), machine=machine)
    # dword at byte offset o is in range iff o + 4 <= num_records (raw buffer)
    assert np.array_equal(w.v[1], np.where(LANE * 4 + 4 <= 100, LANE + 1, 0))


def test_buffer_range_check_is_per_dword_and_counts_soffset(code, machine):
    data = buffer(machine, 4096, fill=np.arange(1024, dtype=np.uint32))
    # offset = v0 + 4, dwords at offset + 4k; dword k is in range iff
    # offset + 4k + SOFFSET + 4 <= num_records (SOFFSET s12 = 64 counts)
    w = run(code, "bload_x4", regs(v0=LANE * 16, s12=64, **rsrc(data.ctypes.data, 104)),
            machine=machine)
    for k in range(4):
        off = LANE * 16 + 4 + 4 * k
        expect = np.where(off + 64 + 4 <= 104, (off + 64) // 4, 0)
        assert np.array_equal(w.v[4 + k], expect), k
    assert 0 < np.count_nonzero(w.v[4:8]) < 4 * 64          # a ragged edge inside one lane
    # the same resource with num_records 40: with SOFFSET counted nothing is in range
    w = run(code, "bload_x4", regs(v0=LANE * 16, s12=64, **rsrc(data.ctypes.data, 40)),
            machine=machine)
    assert not w.v[4:8].any()


def test_buffer_range_check_end_of_dword_and_wrapped_soffset(code, machine):
    data = buffer(machine, 4096, fill=np.arange(1024, dtype=np.uint32) + 1)
    # a dword straddling num_records is out of range: 4 * lane + 4 <= 102
    w = run(code, "bload", regs(v0=LANE * 4, **rsrc(data.ctypes.data, 102)), machine=machine)
    assert np.array_equal(w.v[1], np.where(LANE * 4 + 4 <= 102, LANE + 1, 0))
    # SOFFSET is unsigned 32-bit: 0xFFFFFFC0 ("-64") does not step back, it puts every
    # dword out of range (the sum is not wrapped), even with the largest num_records
    w = run(code, "bload_x4", regs(v0=LANE * 16 + 64, s12=-64,
                                   **rsrc(data.ctypes.data, 0xFFFFFFFF)), machine=machine)
    assert not w.v[4:8].any()
    # VOFFSET + inst_offset is formed in 32 bits: 0xFFFFFFFC + 4 wraps to offset 0
    w = run(code, "bload_x4", regs(v0=np.full(64, 0xFFFFFFFC), s12=0,
                                   **rsrc(data.ctypes.data, 64)), machine=machine)
    assert np.array_equal(w.v[4:8, 0], [1, 2, 3, 4])


def test_buffer_soffset_inline_constants(code, machine):
    data = buffer(machine, 1024, fill=np.arange(256, dtype=np.uint32) + 1)
    # SOFFSET 16 moves the address and counts in the check; -1 is 0xFFFFFFFF: out of range
    w = run(code, "bload_soff_consts", regs(v0=LANE * 4, **rsrc(data.ctypes.data, 100)),
            machine=machine)
    assert np.array_equal(w.v[1], np.where(LANE * 4 + 16 + 4 <= 100, LANE + 5, 0))
    assert not w.v[2].any()


def test_buffer_raw_check_without_idxen_ignores_stride(code, machine):
    data = buffer(machine, 1024, fill=np.arange(256, dtype=np.uint32) + 1)
    # STRIDE != 0 but no IDXEN: a raw access, checked on the byte offset
    w = run(code, "bload", regs(v0=LANE * 4, **rsrc(data.ctypes.data, 100, stride=16)),
            machine=machine)
    assert np.array_equal(w.v[1], np.where(LANE * 4 + 4 <= 100, LANE + 1, 0))


def test_buffer_index_addressing(code, machine):
    data = buffer(machine, 4096, fill=np.arange(1024, dtype=np.uint32))
    # address = base + stride * index + offset; out of range iff index >= num_records
    w = run(code, "bload_idx", regs(v0=LANE, **rsrc(data.ctypes.data, 50, stride=12)),
            machine=machine)
    assert np.array_equal(w.v[1], np.where(LANE < 50, (12 * LANE + 4) // 4, 0))


def test_buffer_stores_outside_range_are_dropped(code, machine):
    data = buffer(machine, 512)
    run(code, "bstore", regs(v0=LANE * 4, v1=LANE + 1, **rsrc(data.ctypes.data, 128)),
        machine=machine)
    words = data.view(np.uint32)
    assert np.array_equal(words[:32], LANE[:32] + 1) and (words[32:] == 0).all()


def test_buffer_load_into_lds_uses_m0_and_lane_index(code, machine):
    data = buffer(machine, 1024, fill=np.arange(256, dtype=np.uint32))
    # LDS_ADDR = M0 + inst_offset + 4 * lane; memory offset = v0 + inst_offset
    wg = run(code, "bload_lds", regs(v0=LANE * 4, s12=128, **rsrc(data.ctypes.data, 1024)),
             waves=2, lds=1024, machine=machine)
    lds = wg.lds.view(np.uint32)
    assert np.array_equal(lds[33:33 + 64], LANE + 1)


def test_buffer_load_dwordx4_into_lds(code, machine):
    data = buffer(machine, 2048, fill=np.arange(512, dtype=np.uint32))
    wg = run(code, "bload_lds_x4", regs(v0=LANE * 16, **rsrc(data.ctypes.data, 2048)),
             waves=2, lds=2048, machine=machine)
    lds = wg.lds.view(np.uint32)
    assert np.array_equal(lds[16:16 + 256], np.arange(256))


def test_global_load_into_lds(code, machine):
    data = buffer(machine, 2048, fill=np.arange(512, dtype=np.uint32))
    wg = run(code, "gload_lds_x4", regs(v0=LANE * 16, **ptr_regs(data.ctypes.data)), waves=2,
             lds=2048, machine=machine)
    lds = wg.lds.view(np.uint32)
    assert np.array_equal(lds[4:4 + 256], np.arange(4, 260))


def test_lds_reads_and_writes(code):
    # write2_b64 offsets count 8-byte units: lane l writes [base+8, base+24), base = 1024 + 32 l
    w = run(code, "ds_rw", regs(v0=LANE * 4, v1=LANE + 10, v2=1024 + LANE * 32,
                                v4=LANE, v5=LANE + 64, v6=LANE + 128, v7=LANE + 192), lds=4096)
    assert np.array_equal(w.v[10], LANE + 10)
    assert np.array_equal(w.v[12], LANE) and np.array_equal(w.v[13], LANE + 64)
    assert np.array_equal(w.v[14], LANE + 128) and np.array_equal(w.v[15], LANE + 192)
    for k, add in enumerate((0, 64, 128, 192)):          # ds_read_b128 covers both qwords
        assert np.array_equal(w.v[16 + k], LANE + add)


def test_lds_byte_access(code):
    w = run(code, "ds_u8", regs(v0=LANE, v1=np.full(64, 0x1F0)), lds=64)
    assert (w.v[2] == 0xFFFFFFF0).all() and (w.v[3] == 0xF0).all()


def test_bpermute_pulls_from_the_addressed_lane(code):
    src = (63 - LANE) * 4 + 256             # address wraps modulo 64 lanes
    ex = (1 << 64) - 1 - (1 << 63)          # lane 63 disabled: lane 0 reads 0
    w = run(code, "bpermute", regs(v0=src, v1=LANE + 1000, v2=np.full(64, 5), exec=ex))
    expect = np.where(LANE == 0, 0, 63 - LANE + 1000)
    expect[63] = 5                           # not written
    assert np.array_equal(w.v[2], expect)


def test_permute_pushes_to_the_addressed_lane(code):
    w = run(code, "permute", regs(v0=((LANE + 1) % 64) * 4, v1=LANE, v2=np.zeros(64)))
    assert np.array_equal(w.v[2], (LANE - 1) % 64)


def test_swizzle_modes(code):
    w = run(code, "swizzle_swap", regs(v1=LANE))
    assert np.array_equal(w.v[2], LANE ^ 16)
    w = run(code, "swizzle_quad", regs(v1=LANE))
    assert np.array_equal(w.v[2], LANE ^ 1)


def test_transpose_read_b16(code):
    # A row-major K x 16 matrix X of 16-bit values; each group of 16 lanes reads 4 rows:
    # lane s addresses row k0 + s // 4, columns 4 * (s % 4) .. +3.  After the transposed
    # read lane d of the group holds X[k0 + r][d] for r = 0..3 (4 consecutive K of one N).
    X = (np.arange(16)[:, None] * 100 + np.arange(16)[None, :]).astype(np.uint16)   # [k][n]
    g, s = LANE // 16, LANE % 16
    k0 = 4 * g
    addr = (k0 + s // 4) * 32 + 8 * (s % 4)

    def setup(w):
        w.v[0] = addr.astype(np.uint32)
        w.wg.lds[:X.nbytes] = X.view(np.uint8).reshape(-1)
    w = run(code, "tr_b16", setup, lds=1024)
    got = np.stack([w.v[2] & 0xFFFF, w.v[2] >> 16, w.v[3] & 0xFFFF, w.v[3] >> 16], axis=1)
    expect = np.stack([X[k0 + r, s] for r in range(4)], axis=1)
    assert np.array_equal(got, expect)


def test_transpose_read_b8(code):
    # 8-bit: lane s addresses row k0 + s // 2, columns 8 * (s % 2) .. +7; lane d gets
    # X[k0 + r][d] for r = 0..7.
    X = ((np.arange(32)[:, None] * 16 + np.arange(16)[None, :]) % 251).astype(np.uint8)
    g, s = LANE // 16, LANE % 16
    k0 = 8 * g
    addr = (k0 + s // 2) * 16 + 8 * (s % 2)

    def setup(w):
        w.v[0] = addr.astype(np.uint32)
        w.wg.lds[:X.nbytes] = X.reshape(-1)
    w = run(code, "tr_b8", setup, lds=1024)
    got = np.concatenate([w.v[2:4].T.copy().view(np.uint8)], axis=1)
    expect = np.stack([X[k0 + r, s] for r in range(8)], axis=1)
    assert np.array_equal(got, expect)


def test_transpose_read_b4(code):
    # 4-bit: 16 elements per lane, one row per lane: a 16 x 16 nibble transpose per group.
    rng = np.random.default_rng(4)
    X = rng.integers(0, 16, (64, 16))                  # row = source lane, 16 nibbles
    packed = np.zeros((64, 8), np.uint8)
    for e in range(16):
        packed[:, e // 2] |= (X[:, e] << (4 * (e % 2))).astype(np.uint8)

    def setup(w):
        w.v[0] = (LANE * 8).astype(np.uint32)
        w.wg.lds[:packed.nbytes] = packed.reshape(-1)
    w = run(code, "tr_b4", setup, lds=1024)
    words = w.v[2:4].T.astype(np.uint64)
    got = (words[:, 0] | (words[:, 1] << np.uint64(32)))
    nib = np.stack([(got >> np.uint64(4 * r)) & np.uint64(15) for r in range(16)], axis=1)
    g, d = LANE // 16, LANE % 16
    expect = np.stack([X[16 * g + r, d] for r in range(16)], axis=1)
    assert np.array_equal(nib.astype(np.int64), expect)


def test_transpose_read_needs_full_exec(code):
    with pytest.raises(EmulatorError, match="EXEC"):
        run(code, "tr_b16", regs(v0=np.zeros(64), exec=1), lds=64)


TR_MNEMONIC = {"tr_b16": "ds_read_b64_tr_b16", "tr_b8": "ds_read_b64_tr_b8",
               "tr_b4": "ds_read_b64_tr_b4", "tr_b6": "ds_read_b96_tr_b6"}


@pytest.mark.parametrize("name", sorted(TR_MNEMONIC))
@pytest.mark.parametrize("exec_mask", [0x7FFFFFFFFFFFFFFF, 0xFFFFFFFF00000000, 0xFFFF0000FFFFFFFF,
                                       0xFFFFFFFFFFFFFFFE, 0x5555555555555555, 0])
def test_transpose_read_refuses_partial_exec(code, name, exec_mask):
    # ISA §11.4 requires EXEC to be all ones for these cross-lane reads and says nothing
    # about inactive lanes (whether their addresses still feed active lanes, whether their
    # registers are kept): any other mask, a single missing lane or EXEC = 0 included,
    # is refused with the instruction named, instead of made-up semantics.  Addresses
    # are valid, so EXEC is the only reason to refuse.
    setup = regs(v0=(LANE * 16).astype(np.uint32), exec=exec_mask)
    with pytest.raises(EmulatorError, match=rf"{TR_MNEMONIC[name]} .*EXEC is 0x{exec_mask:016x}"):
        run(code, name, setup, lds=1024)


@pytest.mark.parametrize("name", sorted(TR_MNEMONIC))
def test_transpose_read_with_full_exec_runs(code, name):
    # the same setup with EXEC all ones is accepted (the refusal above is EXEC's doing)
    w = run(code, name, regs(v0=(LANE * 16).astype(np.uint32), exec=(1 << 64) - 1), lds=1024)
    assert w.exec == (1 << 64) - 1


def test_lds_out_of_range(code):
    with pytest.raises(EmulatorError, match="outside the workgroup's 256 bytes of LDS"):
        run(code, "lds_oob", regs(v0=LANE * 4 + 4), lds=256)
    w = run(code, "lds_oob", regs(v0=LANE * 4 + 4), lds=256, strict_lds=False)
    assert w.v[1][63] == 0                       # ISA: out-of-range reads return zero


def test_barrier_orders_lds_between_waves(code):
    wg = run(code, "barrier_exchange", waves=2, lds=512)
    # each wave reads the value the other wave wrote (address ^ 256 bytes)
    assert np.array_equal(wg.waves[0].v[3], LANE + 64)
    assert np.array_equal(wg.waves[1].v[3], LANE)


def test_barrier_without_waitcnt_exposes_the_race(code):
    # s_barrier does not wait for outstanding LDS writes (ISA §4.3): the other wave can
    # still see the old contents (the emulator's poison) -- the kernel bug it models.
    wg = run(code, "barrier_no_wait", waves=2, lds=512)
    assert (wg.waves[0].v[3] == 0xFFFFFFFF).all()


@pytest.mark.parametrize("quantum", [1, 3, 1000])
def test_results_do_not_depend_on_the_interleaving(code, quantum):
    wg = run(code, "barrier_exchange", waves=2, lds=512, quantum=quantum)
    assert np.array_equal(wg.waves[1].v[3], LANE)


def test_scalar_loads(code, machine):
    data = buffer(machine, 64, fill=np.arange(16, dtype=np.uint32) + 100)
    w = run(code, "smem", regs(**ptr_regs(data.ctypes.data)), machine=machine)
    assert (w.s[6], w.s[7], w.s[8]) == (102, 103, 100)
    w = run(code, "smem_nowait", regs(s8=5, **ptr_regs(data.ctypes.data)), machine=machine)
    assert w.s[9] == 5 and w.s[8] == 100


def test_machine_memory_rejects_overlapping_regions():
    m = Machine()
    a = np.zeros(64, np.uint8)
    m.memory.add(a.ctypes.data, 64, "a", a)
    with pytest.raises(EmulatorError, match="overlaps"):
        m.memory.add(a.ctypes.data + 8, 8, "b", a[8:16])


def test_strict_host_memory():
    m = Machine(config=Config())
    m.memory.host_fallback = False
    a = np.zeros(64, np.uint8)
    assert m.memory.find(a.ctypes.data) is None
