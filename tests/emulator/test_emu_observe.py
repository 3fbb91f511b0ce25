"""Observers see every executed instruction with the wave's pre-instruction state, and
``operands`` names the registers each instruction reads and writes."""

import pytest
from emukit import build, run

from zyfa_emulator import Machine
from zyfa_emulator.operands import Reg, operands

SNIPPETS = {
    "mix": """
  v_mov_b32_e32 v1, 0
  s_mov_b32 s4, 3
loop:
  v_add_u32_e32 v1, 2, v1
  s_sub_u32 s4, s4, 1
  s_cmp_lg_u32 s4, 0
  s_cbranch_scc1 loop
  v_mfma_f32_16x16x32_bf16 a[0:3], v[4:7], v[8:11], a[12:15]
  global_store_dwordx2 v[2:3], v[6:7], off
  ds_read2_b64 v[20:23], v1 offset1:4""",
}


@pytest.fixture(scope="module")
def code():
    return build(SNIPPETS)


def test_observer_sees_each_instruction_in_order(code):
    m = Machine()
    seen = []
    m.observers.append(lambda w, inst: seen.append((w.index, inst.pc, inst.name, int(w.s[4]))))
    # stop before the memory instructions: give EXEC = 0 so they touch nothing
    run(code, "mix", lambda w: setattr(w, "exec", 0) or w.s.__setitem__(4, 0), machine=m)
    names = [s[2] for s in seen]
    assert names[:2] == ["v_mov_b32", "s_mov_b32"]
    assert names.count("s_cbranch_scc1") == 3 and names.count("v_add_u32") == 3
    counters = [s[3] for s in seen if s[2] == "s_sub_u32"]
    assert counters == [3, 2, 1]           # observed before the instruction executes
    assert names[-1] == "s_endpgm"
    assert len(seen) == m.instructions


def test_operands(code):
    insts = {}
    m = Machine()
    m.observers.append(lambda w, inst: insts.setdefault(inst.name, inst))
    run(code, "mix", lambda w: setattr(w, "exec", 0), machine=m)
    mfma = operands(insts["v_mfma_f32_16x16x32_bf16"])
    assert mfma.reads == [Reg("v", 4, 4), Reg("v", 8, 4), Reg("a", 12, 4)]
    assert mfma.writes == [Reg("a", 0, 4)]
    store = operands(insts["global_store_dwordx2"])
    assert Reg("v", 2, 2) in store.reads and Reg("v", 6, 2) in store.reads and not store.writes
    ds = operands(insts["ds_read2_b64"])
    assert ds.writes == [Reg("v", 20, 4)] and Reg("v", 1) in ds.reads
    sub = operands(insts["s_sub_u32"])
    assert sub.reads == [Reg("s", 4), ] and Reg("s", 4) in sub.writes and Reg("scc", 0) in sub.writes
    br = operands(insts["s_cbranch_scc1"])
    assert br.reads == [Reg("scc", 0)]
    add = operands(insts["v_add_u32"])
    assert Reg("v", 1) in add.reads and Reg("s", 126, 2) in add.reads and add.writes == [Reg("v", 1)]
