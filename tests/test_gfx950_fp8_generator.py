"""The gfx950 FP8 assembly generator as data: register budgets, the LDS swizzle's bank
property, the kernel descriptor it sets, and the code objects' metadata."""

import numpy as np
import pytest

from generator import gfx950_fp8 as gen
from tests.sweeps import sweep
from zyfa_runtime import catalogue
from zyfa_runtime.catalogue import HEAD_DIMS, Variant, kernargs

VARIANTS = [Variant("gfx950", "fp8_e4m3", dq, dv, c) for dq, dv in HEAD_DIMS for c in (False, True)]
#: VARIANTS with all but d128 causal in the full run only (tests that emit whole kernels)
ONE_IN_DEFAULT = [pytest.param(v, marks=() if (v.d_qk, v.causal) == (128, True) else pytest.mark.slow)
                  for v in VARIANTS]


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_plan_fits_two_waves_per_simd_and_the_lds(v):
    p = gen.plan(v)
    assert p.n_vgpr + p.n_agpr <= 256          # two waves per SIMD: the ping-pong needs it
    assert p.n_sgpr <= 102
    assert p.lds_bytes <= 160 * 1024 and p.frag_bufs >= 1
    # every named register range lies inside the budget and ranges of live values are disjoint
    assert max(p.vgpr.values()) < p.n_vgpr and max(p.agpr.values()) < p.n_agpr
    # LDS stage offsets fit a DS instruction's 16-bit immediate with the largest in-stage offset
    assert p.lds_k[-1] + 32 * p.pitch_k + 64 * p.qk_steps < 1 << 16
    assert (p.lds_v[-1] - p.lds_v[0]) + 48 * p.pitch_v < 1 << 16


@pytest.mark.parametrize("pitch", [128, 256])
def test_swizzle_is_a_bijection_that_keeps_every_read_group_on_distinct_banks(pitch):
    chunks = pitch // 16
    for key in range(64):                      # a bijection of the chunks of each row
        assert sorted(c ^ gen.swizzle(key, pitch) for c in range(chunks)) == list(range(chunks))

    def banks(addresses, nbytes):
        words = [a // 4 + w for a in addresses for w in range(nbytes // 4)]
        return np.bincount(np.array(words) % 64, minlength=64).max()

    def addr(key, chunk, byte=0):
        return key * pitch + 16 * (chunk ^ gen.swizzle(key, pitch)) + byte

    # ds_read_b128 of K: 16 lanes = 16 consecutive keys (+32h), one logical chunk (4s+2t+g)
    for h in (0, 1):
        for c in range(chunks):
            for lanes in (range(0, 16), range(16, 32)):
                assert banks([addr(32 * h + j, c) for j in lanes], 16) == 1
    # ds_read_b64_tr_b8 of V: 32 lanes = 8 keys (8(r/4) + 4g + r%4, +16rd) x chunks 2c+dh x 8-byte
    # halves
    for g in (0, 1):
        for rd in range(4):
            for c in range(chunks // 2):
                group = [addr(16 * rd + 8 * (r // 4) + 4 * g + r % 4, 2 * c + dh, 8 * half)
                         for dh in (0, 1) for r in range(8) for half in (0, 1)]
                assert banks(group, 8) == 1


def test_kernel_descriptor_sets_the_mode_and_registers_deliberately():
    v = Variant("gfx950", "fp8_e4m3", 128, 128, False)
    src = gen.emit(v)
    p = gen.plan(v)
    for directive in (".amdhsa_float_denorm_mode_32 3", ".amdhsa_float_round_mode_32 0",
                      ".amdhsa_ieee_mode 0", ".amdhsa_dx10_clamp 1", ".amdhsa_fp16_overflow 0",
                      f".amdhsa_group_segment_fixed_size {p.lds_bytes}",
                      f".amdhsa_accum_offset {-(-p.n_vgpr // 4) * 4}"):
        assert directive in src
    # the argument list is the catalogue's, offset for offset
    for a in kernargs(v):
        assert f".name: {a.name}, .offset: {a.offset}, .size: {a.size}" in src


def test_code_objects_carry_the_catalogue_layout():
    from pathlib import Path

    from generator import codeobject
    root = Path(__file__).resolve().parent.parent / "prebuilt"
    for v in VARIANTS:
        path = root / v.filename
        if not path.exists():
            pytest.skip("gfx950 code objects not built (python build.py --arch gfx950)")
        meta = codeobject.amdgpu_kernels(path.read_bytes())[v.symbol]
        assert [(a["offset"], a["size"]) for a in meta["args"]] == \
            [(a.offset, a.size) for a in kernargs(v)]
        assert meta["group_segment_fixed_size"] == gen.plan(v).lds_bytes
        assert meta["max_flat_workgroup_size"] == 512 and meta["wavefront_size"] == 64


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_vector_phase_slots(v):
    """The softmax of one 64-key block as emitted (VALU slots per wave): 65 + d_v / 4 (the O
    rescale), 97 at d_v = 128 (776 cycles per 32 x 128 block, under 820); a boundary block
    adds the mask (65) and the guards of rows that see no key (4)."""
    p = gen.plan(v)
    slots = {}
    for masked in (False, True):
        a = gen.Asm(p)
        gen.stage_softmax(a, a.s("pb"), masked=masked)
        slots[masked] = sum(1 for line in a.lines if line.strip().startswith("v_"))
    assert slots[False] == 65 + v.d_v // 4 and slots[True] == slots[False] + 69
    a = gen.Asm(p)
    gen.stage_softmax(a, a.s("pb"), masked=True, left=True)     # the window's left edge: its mask
    assert sum(1 for line in a.lines if line.strip().startswith("v_")) == slots[True] + 69
    for masked in (False, True):                                # the softcap: 112 more, first
        a = gen.Asm(p)
        gen.stage_softmax(a, a.s("pb"), masked=masked, cap=True)
        body = [line.strip() for line in a.lines if line.strip().startswith("v_")]
        assert len(body) == slots[masked] + 112
        assert [op.split()[0] for op in body[:112:16]] == ["v_pk_mul_f32", "v_exp_f32", "v_exp_f32",
                                                          "v_pk_add_f32", "v_rcp_f32", "v_rcp_f32",
                                                          "v_pk_fma_f32"]


def _body(lines: list, sfx: str) -> list:
    """The loop body's lines from .Lloop_a{sfx} to .Lloop_end{sfx}, numbered labels unnumbered,
    the suffix dropped: two bodies of the loop compare as text."""
    import re
    body = lines[lines.index(f".Lloop_a{sfx}:"):lines.index(f".Lloop_end{sfx}:") + 1]
    body = [re.sub(r"(\.L[a-z_]+?)_\d+\b", r"\1", line) for line in body]
    return [re.sub(rf"(\.L[a-z_0-9]+?){sfx}\b", r"\1", line) for line in body] if sfx else body


@pytest.mark.parametrize("v", ONE_IN_DEFAULT, ids=lambda v: v.name)
def test_the_capped_loops_are_the_plain_and_paged_loops_with_the_cap_before_each_softmax(v):
    """A call's softcap selects, once, a body of the loop placed after the kernel's end: the
    plain body (the paged one, with a page table), instruction for instruction, but for _cap's
    112 VALU opening every softmax phase (interior, boundary and left-edge blocks); the plain
    and paged bodies have no cap.  The plain prologue gains two scalar loads (with the
    descales') and two compare-and-branch pairs."""
    p = gen.plan(v)
    lines = [line.split("//")[0].strip() for line in gen.emit(v).splitlines()]
    lines = [line for line in lines if line]
    a = gen.Asm(p)
    gen._cap(a)
    cap = [line.strip() for line in a.lines]
    for uncapped, with_cap in (("", "_cap"), ("_paged", "_paged_cap")):
        plain, capped = _body(lines, uncapped), _body(lines, with_cap)
        assert not any(line in cap for line in plain)
        starts = [i for i in range(len(capped)) if capped[i:i + len(cap)] == cap]
        assert len(starts) >= 3               # interior, boundary, left edge: per group and stage
        for i in reversed(starts):
            del capped[i:i + len(cap)]
        assert capped == plain, uncapped
    end = lines.index("s_endpgm")
    assert lines.index(".Lloop_cap:") > end and lines.index(".Lcap_constants:") > end
    for branch, then in ((".Lcap_constants", "v_cvt_f64_f32"), (".Lloop_cap", f"s_mov_b32 s{p.sgpr['p']}, 0")):
        at = lines.index(f"s_cbranch_scc1 {branch}")       # falls through to the plain path
        assert lines[at - 1] == f"s_cmp_lg_u32 s{p.sgpr['caparg']}, 0" and lines[at + 1].startswith(then)


@pytest.mark.parametrize("v", ONE_IN_DEFAULT, ids=lambda v: v.name)
def test_a_paged_call_decides_its_softcap_before_the_paged_set_up_writes_over_the_argument(v):
    """The paged set-up writes magic and lastg over caparg: the paged path reads the softcap
    first and keeps the answer in capa's low half (1.0 from the cap's constants, else 0), which
    nothing in the set-up writes, and branches on it to the paged and capped body after it.  The
    three out-of-line bodies lie after every other path, each reached by a jump that reaches
    past 128 KiB (getpc + distance + setpc) and opening with the loop's first instruction."""
    p = gen.plan(v)
    lines = [line.split("//")[0].strip() for line in gen.emit(v).splitlines()]
    lines = [line for line in lines if line]
    flag, caparg = f"s{p.sgpr['capa']}", f"s{p.sgpr['caparg']}"
    start = lines.index(".Lpaged:")
    assert lines[start + 1:start + 3] == [f"s_cmp_lg_u32 {caparg}, 0", f"s_cselect_b32 {flag}, {flag}, 0"]
    branch = lines.index("s_cbranch_scc1 .Lpaged_cap")
    assert lines[branch - 1] == f"s_cmp_lg_u32 {flag}, 0"
    pc = f"s[{p.sgpr['t0']}:{p.sgpr['t0'] + 1}]"
    for at, target in ((branch + 1, ".Lbody_paged"), (lines.index(".Lpaged_cap:") + 1, ".Lbody_paged_cap"),
                       (lines.index(".Lloop_cap:") + 1, ".Lbody_cap")):
        assert lines[at] == f"s_getpc_b64 {pc}" and f"({target}-" in lines[at + 2]
        assert lines[at + 4] == f"s_setpc_b64 {pc}"
        body = lines.index(f"{target}:")
        assert lines[body + 1] == f"s_mov_b32 s{p.sgpr['p']}, 0" and body > lines.index(".Lpaged_cap:")
    setup = lines[start + 3:branch - 1]
    assert any(line.split()[1].rstrip(",") == f"s{p.sgpr['magic']}" for line in setup if " " in line)
    assert not any(flag in line.replace(",", " ").split() for line in setup)
    assert caparg != flag and p.sgpr["magic"] in (p.sgpr["caparg"], p.sgpr["caparg"] + 1)


@pytest.mark.parametrize("v", ONE_IN_DEFAULT, ids=lambda v: v.name)
def test_the_softcap_takes_no_sgpr_of_its_own(v):
    """softcap and softcap_scale are loaded from the kernarg segment with the sinks pointer, over
    the descale_q pointer (read by its load at issue); the cap's constants go to the registers of
    cu_seqlens_k and v_stride_h, which nothing but the cap reads once the K and V resources are
    made (before the constants' branch), and the paged path's softcap flag (capa's low half)."""
    p = gen.plan(v)
    image = gen.kernarg_image(v)
    offsets = {a.name: a.offset for a in kernargs(v)}
    assert offsets["softcap"] // 4 not in image and offsets["softcap_scale"] // 4 not in image
    assert (p.sgpr["caparg"], p.sgpr["capa"], p.sgpr["capb"]) == \
        (p.args["descale_q"], p.args["cu_seqlens_k"], p.args["v_stride_h"])
    src = gen.emit(v)
    lines = [line.split("//")[0].strip() for line in src.splitlines()]
    loads = [lines.index(f"s_load_dword s{p.sgpr['caparg'] + i}, s[0:1], 0x{offsets[name]:x}")
             for i, name in enumerate(("softcap", "softcap_scale"))]
    ptr = f"s[{p.args['descale_q']}:{p.args['descale_q'] + 1}],"
    assert max(i for i, line in enumerate(lines) if ptr in line) < min(loads)
    branch = lines.index("s_cbranch_scc1 .Lcap_constants")
    regs = {f"s{r}" for base in (p.sgpr["capa"], p.sgpr["capb"]) for r in (base, base + 1)}
    pairs = {f"s[{b}:{b + 1}]" for b in (p.sgpr["capa"], p.sgpr["capb"])}
    uses = [line for line in lines[branch:] if set(line.replace(",", " ").split()[1:]) & (regs | pairs)]
    flag = f"s{p.sgpr['capa']}"
    flags = {f"s_cselect_b32 {flag}, {flag}, 0", f"s_cmp_lg_u32 {flag}, 0"}
    assert uses and all(line.startswith(("v_readfirstlane_b32", "s_mov_b32", "v_pk_")) or line in flags
                        for line in uses)


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_window_and_sinks_take_no_sgpr_of_their_own(v):
    """The window's bounds are read once (into the DMA pair, before the loop uses it), the sinks
    pointer from the kernarg segment into the descale_v pointer's registers once the descales
    are loaded; the loop's window values live in the registers of the q, k and v pointers,
    which nothing reads once they are written."""
    p = gen.plan(v)
    image = gen.kernarg_image(v)
    for arg in kernargs(v):
        if arg.name in ("window_left", "window_right", "sinks"):
            assert arg.offset // 4 not in image
    assert (p.args["window_left"], p.args["window_right"]) == (p.sgpr["dl"], p.sgpr["dr"])
    src = gen.emit(v)
    assert f"s_load_dwordx2 s[{p.args['descale_v']}:{p.args['descale_v'] + 1}], s[0:1], " \
        f"0x{next(a.offset for a in kernargs(v) if a.name == 'sinks'):x}" in src
    owned = {p.sgpr[n] for n in ("wlo_p", "lcut_p", "wnbv", "wleft", "wfr")}
    assert owned == {p.args["q"], p.args["q"] + 1, p.args["k"], p.args["k"] + 1, p.args["v"]}
    lines = [line.split("//")[0].strip() for line in src.splitlines()]
    first = next(i for i, line in enumerate(lines) if line.startswith(f"s_lshr_b32 s{p.sgpr['wlo_p']},"))
    pointers = [f"s[{p.args[t]}:{p.args[t] + 1}]" for t in "qkv"]
    assert not any(ptr in line for line in lines[first:] for ptr in pointers)


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_a_kv_cache_takes_no_sgpr_of_its_own_and_two_salu_without_one(v):
    """The cache_seqlens pointer is loaded with the prologue's arguments into t2 (free until
    stage_resources' first 64-bit multiply-add), read by stage_sequence before anything derives
    from sk; without a cache the prologue runs a compare and a branch not taken, the load and
    the clamp lie after the kernel's end."""
    p = gen.plan(v)
    arg = next(a for a in kernargs(v) if a.name == "cache_seqlens")
    assert arg.offset // 4 not in gen.kernarg_image(v) and p.args["cache_seqlens"] == p.sgpr["t2"]
    lines = [line.split("//")[0].strip() for line in gen.emit(v).splitlines()]
    lines = [line for line in lines if line]
    ptr = f"s[{p.sgpr['t2']}:{p.sgpr['t2'] + 1}]"
    test = lines.index(f"s_cmp_lg_u64 {ptr}, 0")
    assert lines[test + 1:test + 3] == ["s_cbranch_scc1 .Lcache", ".Lcache_done:"]
    assert test < lines.index(f"s_sub_i32 s{p.sgpr['diag']}, s{p.sgpr['sk']}, s{p.sgpr['sq']}")
    t2 = (f"s{p.sgpr['t2']}", f"s[{p.sgpr['t2']}:")
    written = [i for i, line in enumerate(lines) if " " in line and line.split(" ")[1].startswith(t2)
               and not line.startswith("s_cmp")]   # the first operand is the one written
    assert lines[written[0]] == f"s_load_dwordx2 {ptr}, s[0:1], 0x{arg.offset:x}"
    assert written[1] > test                       # nothing else writes t2 before the pointer is read
    cache = lines.index(".Lcache:")
    assert lines.index("s_endpgm") < cache and lines[cache + 2].startswith(f"s_load_dword s{p.sgpr['t0']}, {ptr},")
    assert lines[cache + 4:cache + 7] == [f"s_max_i32 s{p.sgpr['sk']}, s{p.sgpr['t0']}, 0",
                                          f"s_min_i32 s{p.sgpr['sk']}, s{p.sgpr['sk']}, s{p.args['seqlen_k']}",
                                          "s_branch .Lcache_done"]


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_operands_are_read_a_phase_ahead_where_a_buffer_per_step_fits(v):
    """d <= 192: a buffer per MFMA step, every DS read of a phase's operands made once in the
    phase pair before it, each after the MFMA that frees its buffer; where the vector phase
    has slack (d_v >= 128) it takes the first QK step's reads and the loads' address setup.
    d = 256: a ring of operand buffers read within the phase."""
    p = gen.plan(v)
    steps = gen._steps(p, True, True)
    assert p.ahead == (v.d_qk <= 192) and p.slack == (v.d_v >= 128)
    if not p.ahead:
        assert p.frag_bufs < len(steps)
        return
    assert p.frag_bufs == len(steps)
    matrix, vector = gen.reads_ahead(p)
    every = [(j, part) for j, st in enumerate(steps) for part in range(gen._ops(st))]
    assert sorted(matrix + vector) == every and len(set(matrix + vector)) == len(every)
    assert vector == ([(0, 0), (0, 1)] if p.slack else [])
    # the matrix phase emits them in its shadows in that order: after MFMA j, buffer j's
    a = gen.Asm(p)
    gen.stage_matrix(a, "s0", "s1", None, 0)
    body = [line.split()[0] for line in a.lines if not line.strip().startswith("//")]
    shadows = " ".join(body).split("v_mfma_scale_f32_32x32x64_f8f6f4")[1:]
    reads = [sum(1 for op in sh.split() if op.startswith("ds_read")) for sh in shadows]
    assert reads == [gen._ops(st) - (2 if j == 0 and p.slack else 0) for j, st in enumerate(steps)]


PAGED = ("ptab", "kpb", "vpb", "units", "lastpage", "magic", "lastg", "gofsk", "gofsv", "ent")


def _loop(src: str, start: str, end: str) -> list:
    lines = [line for line in src.splitlines() if not line.strip().startswith("//")]
    return lines[lines.index(start):lines.index(end)]


@pytest.mark.parametrize("v", sweep(VARIANTS, quick={(128, 128, False)}))
def test_a_paged_cache_takes_no_sgpr_of_its_own_and_leaves_the_plain_loop_as_it_was(v, monkeypatch):
    """The paged arguments stay out of the kernarg image (the kernel keeps its 101 SGPRs); the
    page table's pointer comes into the descale_k pointer's registers with the descales, the
    paged values into kernarg registers no later code reads (not the epilogue's o, lse and
    strides, not the page strides and row strides the paged loads read, not the window's or
    the sinks' registers); without a page table the prologue runs two compares and branches not
    taken (over the dense first loads, to the paged body), and the plain loop is, instruction for instruction, the loop of a kernel without
    the feature (so are its modelled periods)."""
    p = gen.plan(v)
    image = gen.kernarg_image(v)
    assert all(a.offset // 4 not in image for a in kernargs(v) if a.name in gen.PAGED_ARGS)
    assert p.n_sgpr <= 102
    dead = {p.args[n] + i for n in ("descale_q", "descale_k", "q_stride_b", "q_stride_s", "q_stride_h",
                                    "k_stride_h") for i in (0, 1)} | {p.args["batch"] + i for i in range(4)}
    owned = {p.sgpr[n] + i for n in PAGED for i in ((0, 1) if n in ("ptab", "kpb", "vpb") else (0,))}
    entries = 3 * p.k_slots if gen._carried(p) else p.k_slots + p.v_slots   # (and kept pages, rows)
    owned |= {p.sgpr["ent"] + i for i in range(entries)}
    assert owned <= dead and len(owned) == 2 * 3 + 6 + entries
    src = gen.emit(v)
    table = next(a for a in kernargs(v) if a.name == "page_table")
    ptr = f"s[{p.sgpr['ptab']}:{p.sgpr['ptab'] + 1}]"
    assert f"s_load_dwordx2 {ptr}, s[0:1], 0x{table.offset:x}" in src
    lines = [line.split("//")[0].strip() for line in src.splitlines()]
    lines = [line for line in lines if line]
    tests = [i for i, line in enumerate(lines) if line == f"s_cmp_lg_u64 {ptr}, 0"]
    assert [lines[i + 1] for i in tests] == ["s_cbranch_scc1 .Lfirst_loads_done",   # dense loads
                                             "s_cbranch_scc1 .Lpaged"]              # the body
    assert lines.index("s_endpgm") < lines.index(".Lpaged:")
    monkeypatch.setitem(catalogue.FEATURES_OF, (v.arch, v.dtype),
                        tuple(f for f in catalogue.FEATURES_OF[(v.arch, v.dtype)] if f != "paged_kv"))
    plain = gen.emit(v)
    assert _loop(src, ".Lloop_a:", ".Lloop_end:") == _loop(plain, ".Lloop_a:", ".Lloop_end:")


@pytest.mark.parametrize("v", sweep(VARIANTS, quick={(64, 64, True), (256, 256, False)}))
def test_a_paged_load_costs_23_salu_a_carried_v_load_12_and_an_entry_6_and_no_valu(v):
    """Per load of a block (a wave's 1 KiB, one 16-row group): its group, extent and row in its
    page (14 SALU), the clamped page's 64-bit address (8: a 32 x 32-bit page offset), M0 (1,
    ahead of the address: no nop before the load) and the load; K's one more where V takes its
    page a phase later (d64, d128), that V load 12 (its rows and row 5, address 6, M0 1); each
    page-table entry 6 SALU and an s_load_dword.  No VALU."""
    p = gen.plan(v)
    carried = (v.d_qk, v.d_v) in ((64, 64), (128, 128))
    assert gen._carried(p) == carried
    for kind, i, ahead in gen._paged_phase_loads(p):
        a = gen.Asm(p)
        pieces = gen.paged_chunks(a, kind, i, ahead, 1)
        for _, emit in pieces:
            emit()
        ops = [line.split()[0] for line in a.lines if not line.strip().startswith("//")]
        m0 = [n for n, line in enumerate(a.lines) if line.split()[1].startswith("m0")]
        assert ops[-1] == "buffer_load_dwordx4" and "s_nop" not in ops and m0 == [len(ops) - 6]
        salu = sum(op.startswith("s_") for op in ops)
        assert salu == (12 if kind == "v" else 24) if carried else salu == 23
        assert not any(op.startswith("v_") for op in ops) and sum(n for n, _ in pieces) == len(ops)
    a = gen.Asm(p)
    gen._fetch_entries(a, gen._paged_fetches(p), 1)
    ops = [line.split()[0] for line in a.lines]
    n = p.k_slots if carried else p.k_slots + p.v_slots
    assert ops.count("s_load_dword") == n and len(ops) == 7 * n


def test_d64s_paged_loads_fill_the_four_mfma_shadows_instruction_by_instruction():
    """d64's matrix phase with QK and PV has four MFMA shadows (12, 12, 10 and 14 free issue
    slots: SHADOW_SLOTS less the operand reads issued in each; the last is the last PV MFMA's,
    before the row sums, whose reads come after them): the paged loads' instructions go into
    them in order, a piece straddling two where it must, so V's load issues in the second
    shadow and K's in the fourth; the next phase's page-table entries (the tail) follow in the
    fourth, after the phase's last counted LDS wait, and nothing is left over for the phase's
    end."""
    v = Variant("gfx950", "fp8_e4m3", 64, 64, True)
    p = gen.plan(v)
    a = gen.Asm(p)
    pieces = [pc for kind, i, ahead in gen._paged_phase_loads(p) for pc in gen.paged_chunks(a, kind, i, ahead, 1)]
    tail = [(7, lambda: gen._fetch_entries(a, gen._paged_fetches(p), 1))]
    whole = gen.Asm(p)
    for _, emit in [pc for kind, i, ahead in gen._paged_phase_loads(p)
                    for pc in gen.paged_chunks(whole, kind, i, ahead, 1)]:
        emit()
    gen._fetch_entries(whole, gen._paged_fetches(p), 1)
    shadows = []
    for emit in gen.pack_shadows(a, pieces, True, True, tail=tail):
        mark = len(a.lines)
        emit()
        shadows.append(a.lines[mark:])
    assert sum(shadows, []) == whole.lines and len(shadows) == 4
    assert [len(s) for s in shadows[:3]] == [gen.SHADOW_SLOTS - 2, gen.SHADOW_SLOTS - 2, gen.SHADOW_SLOTS - 4]
    assert len(shadows[3]) <= gen.SHADOW_SLOTS
    loads = [n for n, s in enumerate(shadows) for line in s if "buffer_load" in line]
    assert loads == [1, 3]
    entries = [n for n, s in enumerate(shadows) for line in s if line.split()[0] == "s_load_dword"]
    assert entries == [3]


@pytest.mark.parametrize("ulps", [0, -1, 1])
def test_the_kv_head_quotient_is_the_floor_for_every_head_and_group_size(ulps):
    """stage_sequence's kv head: fp32 head x rcp(ratio), truncated, one step up where
    (t + 1) ratio <= head.  Exact for every head below 2^16 and every GQA ratio up to 256, with
    the reciprocal correctly rounded (the emulator's) or one ulp off either way (the ISA's
    bound for v_rcp_f32)."""
    head = np.arange(1 << 16, dtype=np.int64)
    for ratio in range(1, 257):
        r = np.float32(1) / np.float32(ratio)
        if ulps:
            r = np.nextafter(r, np.float32(np.inf if ulps > 0 else 0), dtype=np.float32)
        t = (head.astype(np.float32) * r).astype(np.float32).astype(np.int64)   # v_cvt_u32_f32
        hk = t + ((t + 1) * ratio <= head)
        assert np.array_equal(hk, head // ratio), ratio
