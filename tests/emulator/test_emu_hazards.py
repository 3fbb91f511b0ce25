"""The hazard and ordering checker (``zyfa_emulator.hazards``): every rule is caught on a
deliberately broken snippet and the same snippet with the wait (or NOPs) passes; the
eight real BF16 kernels run hazard-clean; wave interleavings are compared.

Wait-state numbers are those of CDNA4 ISA §4.5 / §7.6 Table 38 as LLVM's gfx950 hazard
recognizer applies them (the snippets' "fixed" forms use exactly the number of NOPs
``llc -mcpu=gfx950 -run-pass=post-RA-hazard-rec`` inserts for the same pair)."""

import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.emulator.test_emu_kernels import bf16, emulator  # noqa: F401  (emulator: a fixture)
from tests.sweeps import sweep
from emukit import build, run

from zyfa_emulator import Config, Machine
from zyfa_emulator.hazards import HazardChecker, HazardError, interleavings_agree, mfma_passes

ROOT = Path(__file__).resolve().parents[2]
LANE = np.arange(64)

MFMA_F8 = "v_mfma_f32_32x32x64_f8f6f4 a[0:15], v[0:7], v[8:15], 0"       # 16 passes
MFMA_BF = "v_mfma_f32_16x16x32_bf16 a[0:3], v[4:7], v[8:11], 0"          # 4 passes

# name: (broken body, fixed body, rule the broken one violates)
PAIRS = {
    # -- counters
    "vm": ("global_load_dword v1, v0, s[4:5]\n  v_mov_b32_e32 v2, v1",
           "global_load_dword v1, v0, s[4:5]\n  s_waitcnt vmcnt(0)\n  v_mov_b32_e32 v2, v1",
           "counter"),
    "vm_partial": ("global_load_dword v1, v0, s[4:5]\n  global_load_dword v2, v0, s[4:5] offset:4\n"
                   "  s_waitcnt vmcnt(1)\n  v_mov_b32_e32 v3, v1\n  v_mov_b32_e32 v4, v2",
                   "global_load_dword v1, v0, s[4:5]\n  global_load_dword v2, v0, s[4:5] offset:4\n"
                   "  s_waitcnt vmcnt(1)\n  v_mov_b32_e32 v3, v1\n  s_waitcnt vmcnt(0)\n"
                   "  v_mov_b32_e32 v4, v2", "counter"),
    "vm_overwrite": ("global_load_dword v1, v0, s[4:5]\n  v_mov_b32_e32 v1, 0",
                     "global_load_dword v1, v0, s[4:5]\n  s_waitcnt vmcnt(0)\n  v_mov_b32_e32 v1, 0",
                     "counter"),
    "lgkm_smem": ("s_load_dword s8, s[4:5], 0x0\n  ds_read_b32 v1, v0\n  s_waitcnt lgkmcnt(1)\n"
                  "  s_mov_b32 s9, s8",
                  "s_load_dword s8, s[4:5], 0x0\n  ds_read_b32 v1, v0\n  s_waitcnt lgkmcnt(0)\n"
                  "  s_mov_b32 s9, s8", "counter"),
    "lgkm_lds_in_order": ("ds_read_b32 v1, v0\n  ds_read_b32 v2, v0 offset:4\n"
                          "  s_waitcnt lgkmcnt(1)\n  v_mov_b32_e32 v3, v2",
                          "ds_read_b32 v1, v0\n  ds_read_b32 v2, v0 offset:4\n"
                          "  s_waitcnt lgkmcnt(1)\n  v_mov_b32_e32 v3, v1", "counter"),
    # -- MFMA dependencies (Table 38)
    "mfma_raw": (f"{MFMA_F8}\n  s_nop 15\n  s_nop 2\n  v_accvgpr_read_b32 v20, a3",
                 f"{MFMA_F8}\n  s_nop 15\n  s_nop 3\n  v_accvgpr_read_b32 v20, a3", "mfma-raw"),
    "mfma_store": (f"{MFMA_BF}\n  s_nop 6\n  global_store_dwordx4 v0, a[0:3], s[4:5]",
                   f"{MFMA_BF}\n  s_nop 7\n  global_store_dwordx4 v0, a[0:3], s[4:5]", "mfma-raw"),
    "mfma_waw": (f"{MFMA_BF}\n  s_nop 6\n  v_accvgpr_write_b32 a1, 0",
                 f"{MFMA_BF}\n  s_nop 7\n  v_accvgpr_write_b32 a1, 0", "mfma-waw"),
    "mfma_srcc": (f"{MFMA_BF}\n  s_nop 4\n  v_mfma_f32_16x16x32_bf16 a[4:7], v[4:7], v[8:11], a[2:5]",
                  f"{MFMA_BF}\n  s_nop 5\n  v_mfma_f32_16x16x32_bf16 a[4:7], v[4:7], v[8:11], a[2:5]",
                  "mfma-srcc"),
    "mfma_srcab": ("v_mfma_f32_16x16x32_bf16 v[20:23], v[4:7], v[8:11], 0\n  s_nop 6\n"
                   "  v_mfma_f32_16x16x32_bf16 a[0:3], v[20:23], v[8:11], 0",
                   "v_mfma_f32_16x16x32_bf16 v[20:23], v[4:7], v[8:11], 0\n  s_nop 7\n"
                   "  v_mfma_f32_16x16x32_bf16 a[0:3], v[20:23], v[8:11], 0", "mfma-srcab"),
    "mfma_war": ("v_mfma_f32_16x16x32_bf16 a[4:7], v[4:7], v[8:11], a[0:3]\n  s_nop 1\n"
                 "  v_accvgpr_write_b32 a1, 0",
                 "v_mfma_f32_16x16x32_bf16 a[4:7], v[4:7], v[8:11], a[0:3]\n  s_nop 2\n"
                 "  v_accvgpr_write_b32 a1, 0", "mfma-war"),
    # -- VALU -> MFMA / permlane and other VALU forwarding rules (Tables 11-12)
    "valu_mfma": ("v_mov_b32_e32 v5, 0\n  s_nop 0\n  " + MFMA_BF,
                  "v_mov_b32_e32 v5, 0\n  s_nop 1\n  " + MFMA_BF, "valu-mfma"),
    "exec_mfma": ("v_cmpx_le_u32_e32 0, v0\n  s_nop 2\n  " + MFMA_BF,
                  "v_cmpx_le_u32_e32 0, v0\n  s_nop 3\n  " + MFMA_BF, "exec-mfma"),
    "valu_permlane": ("v_mov_b32_e32 v1, v0\n  s_nop 0\n  v_permlane32_swap_b32_e32 v1, v2",
                      "v_mov_b32_e32 v1, v0\n  s_nop 1\n  v_permlane32_swap_b32_e32 v1, v2",
                      "valu-permlane"),
    "trans": ("v_exp_f32_e32 v1, v0\n  v_add_f32_e32 v2, v1, v1",
              "v_exp_f32_e32 v1, v0\n  s_nop 0\n  v_add_f32_e32 v2, v1, v1", "trans-forward"),
    "dst_sel": ("v_cvt_pk_fp8_f32 v1, v2, v3 op_sel:[0,0,1]\n  v_mov_b32_e32 v4, v1",
                "v_cvt_pk_fp8_f32 v1, v2, v3 op_sel:[0,0,1]\n  s_nop 0\n  v_mov_b32_e32 v4, v1",
                "dst-sel-forward"),
    "sgpr_vmem": ("v_readfirstlane_b32 s4, v10\n  v_readfirstlane_b32 s5, v11\n  s_nop 3\n"
                  "  global_load_dword v1, v0, s[4:5]\n  s_waitcnt vmcnt(0)",
                  "v_readfirstlane_b32 s4, v10\n  v_readfirstlane_b32 s5, v11\n  s_nop 4\n"
                  "  global_load_dword v1, v0, s[4:5]\n  s_waitcnt vmcnt(0)", "valu-sgpr-vmem"),
    "sgpr_valu": ("v_cmp_eq_u32_e32 vcc, v0, v0\n  s_nop 0\n  v_cndmask_b32_e32 v1, v0, v2, vcc",
                  "v_cmp_eq_u32_e32 vcc, v0, v0\n  s_nop 1\n  v_cndmask_b32_e32 v1, v0, v2, vcc",
                  "valu-sgpr-valu"),
    "store_data": ("global_store_dwordx4 v0, v[4:7], s[4:5]\n  s_nop 0\n  v_mov_b32_e32 v5, 0\n"
                   "  s_waitcnt vmcnt(0)",
                   "global_store_dwordx4 v0, v[4:7], s[4:5]\n  s_nop 1\n  v_mov_b32_e32 v5, 0\n"
                   "  s_waitcnt vmcnt(0)", "store-data"),
    "m0_lds_dma": ("s_mov_b32 m0, 0\n  buffer_load_dword v0, s[8:11], 0 offen lds\n  s_waitcnt vmcnt(0)",
                   "s_mov_b32 m0, 0\n  s_nop 0\n  buffer_load_dword v0, s[8:11], 0 offen lds\n"
                   "  s_waitcnt vmcnt(0)", "m0-lds-dma"),
    # -- LDS DMA (VM_CNT) against a DS read (LGKM_CNT) of the same bytes, one wave
    "lds_dma_order": ("s_mov_b32 m0, 0\n  s_nop 0\n  buffer_load_dword v0, s[8:11], 0 offen lds\n"
                      "  ds_read_b32 v1, v0\n  s_waitcnt lgkmcnt(0)\n  s_waitcnt vmcnt(0)",
                      "s_mov_b32 m0, 0\n  s_nop 0\n  buffer_load_dword v0, s[8:11], 0 offen lds\n"
                      "  s_waitcnt vmcnt(0)\n  ds_read_b32 v1, v0\n  s_waitcnt lgkmcnt(0)",
                      "lds-dma-order"),
    # -- LDS DMA overwriting bytes an earlier DS read of the wave may still be reading
    "lds_dma_unordered": ("s_mov_b32 m0, 0\n  ds_read_b32 v1, v0\n"
                    "  buffer_load_dword v0, s[8:11], 0 offen lds\n"
                    "  s_waitcnt vmcnt(0)\n  s_waitcnt lgkmcnt(0)",
                    "s_mov_b32 m0, 0\n  ds_read_b32 v1, v0\n  s_waitcnt lgkmcnt(0)\n"
                    "  buffer_load_dword v0, s[8:11], 0 offen lds\n  s_waitcnt vmcnt(0)",
                    "lds-dma-unordered"),
}

# Two waves exchange a dword per lane through LDS (v31 = work-item id): wave 0 writes
# bytes 0..255 and reads 256..511, wave 1 the other way round.
EXCHANGE = """
  v_lshlrev_b32_e32 v1, 2, v31
  v_add_u32_e32 v6, 1, v31
  ds_write_b32 v1, v6
  {wait_before}
  {barrier}
  v_xor_b32_e32 v2, 0x100, v1
  ds_read_b32 v3, v2
  s_waitcnt lgkmcnt(0)"""
RACES = {
    "race_no_barrier": EXCHANGE.format(wait_before="s_waitcnt lgkmcnt(0)", barrier=""),
    "race_wait_after_barrier": EXCHANGE.format(wait_before="", barrier="s_barrier"),
    "race_ok": EXCHANGE.format(wait_before="s_waitcnt lgkmcnt(0)", barrier="s_barrier"),
}

# Both waves read LDS bytes 0..63, pass a barrier, then each LDS-DMAs into its own 256
# bytes (M0 = 4 x its first work-item id): wave 0's DMA overwrites what wave 1 read.
WAR_DMA = """
  v_readfirstlane_b32 s0, v31
  s_lshl_b32 m0, s0, 2
  ds_read_b32 v3, v0
  {wait}
  s_barrier
  buffer_load_dword v0, s[8:11], 0 offen lds
  s_waitcnt vmcnt(0)
  s_waitcnt lgkmcnt(0)"""
# Wave 0 LDS-DMAs bytes 0..255 before a barrier, wave 1 the same bytes after it.
WAW_DMA = """
  s_mov_b32 m0, 0
  v_readfirstlane_b32 s0, v31
  s_cmp_eq_u32 s0, 0
  s_cbranch_scc0 .Lsecond_{n}
  buffer_load_dword v0, s[8:11], 0 offen lds
  {wait}
.Lsecond_{n}:
  s_barrier
  s_cmp_eq_u32 s0, 0
  s_cbranch_scc1 .Ldone_{n}
  buffer_load_dword v0, s[8:11], 0 offen lds
.Ldone_{n}:
  s_waitcnt vmcnt(0)"""
RACES["waw_dma_cross"] = WAW_DMA.format(wait="", n=0)
RACES["waw_dma_cross_ok"] = WAW_DMA.format(wait="s_waitcnt vmcnt(0)", n=1)
RACES["war_dma_cross"] = WAR_DMA.format(wait="")
RACES["war_dma_cross_ok"] = WAR_DMA.format(wait="s_waitcnt lgkmcnt(0)")

SNIPPETS = {}
for _n, (_bad, _good, _rule) in PAIRS.items():
    SNIPPETS[f"{_n}_bad"] = _bad
    SNIPPETS[f"{_n}_ok"] = _good
SNIPPETS.update(RACES)
SNIPPETS["chain"] = ("v_mfma_f32_16x16x32_bf16 a[0:3], v[4:7], v[8:11], 0\n"
                     "  v_mfma_f32_16x16x32_bf16 a[0:3], v[4:7], v[8:11], a[0:3]\n"
                     "  v_mfma_f32_32x32x64_f8f6f4 a[16:31], v[0:7], v[8:15], a[16:31]\n"
                     "  v_mfma_f32_32x32x64_f8f6f4 a[16:31], v[0:7], v[8:15], a[16:31]\n"
                     "  s_nop 15\n  s_nop 3\n  v_accvgpr_read_b32 v1, a17")


@pytest.fixture(scope="module")
def code():
    return build(SNIPPETS)


def _setup(buf):
    base = buf.ctypes.data

    def setup(w):
        w.v[31] = w.v[0]                                    # the work-item id
        w.v[0] = (4 * (LANE % 16)).astype(np.uint32)       # small offsets / LDS addresses
        w.v[1:31] = 0
        w.v[10] = base & 0xFFFFFFFF
        w.v[11] = base >> 32
        w.s[4], w.s[5] = base & 0xFFFFFFFF, base >> 32
        w.s[8], w.s[9], w.s[10], w.s[11] = base & 0xFFFFFFFF, base >> 32, 256, 0x00020000
        w.v[256:288] = 0                                    # a0..a31 (accum_offset 256)
    return setup


def _run(code, name, waves=1, **config):
    m = Machine(config=Config(**config))
    buf = np.zeros(1024, np.uint8)
    m.memory.add(buf.ctypes.data, buf.nbytes, "buf", buf)
    chk = HazardChecker(raise_on_error=False).attach(m)
    wg = run(code, name, _setup(buf), waves=waves, lds=1024, machine=m)
    return chk, wg


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_rule_caught_and_fix_passes(code, pair):
    _, _, rule = PAIRS[pair]
    chk, _ = _run(code, f"{pair}_bad")
    assert [v.rule for v in chk.violations][:1] == [rule], [str(v) for v in chk.violations]
    chk, _ = _run(code, f"{pair}_ok")
    assert not chk.violations, [str(v) for v in chk.violations]


def test_accumulation_chain_needs_no_nops(code):
    chk, _ = _run(code, "chain")
    assert not chk.violations, [str(v) for v in chk.violations]


def test_violation_names_instruction_wave_register_and_rule(code):
    m = Machine()
    buf = np.zeros(1024, np.uint8)
    m.memory.add(buf.ctypes.data, buf.nbytes, "buf", buf)
    HazardChecker().attach(m)
    with pytest.raises(HazardError) as e:
        run(code, "mfma_raw_bad", _setup(buf), machine=m)
    msg = str(e.value)
    assert msg.startswith("mfma-raw: v_accvgpr_read_b32 v20, a3 at 0x")
    assert "<mfma_raw_bad+0x" in msg and "wave 0 of workgroup (0, 0, 0)" in msg
    assert "a3: 19 wait state(s) since the producer, 20 required" in msg
    assert "Table 38" in msg
    with pytest.raises(HazardError) as e:
        run(code, "vm_bad", _setup(buf), machine=m)
    msg = str(e.value)
    assert msg.startswith("counter: v_mov_b32_e32 v2, v1 at") and "<vm_bad+0x" in msg
    assert "reads v1 still owed by 'global_load_dword v1, v0, s[4:5]'" in msg and "vmcnt" in msg


@pytest.mark.parametrize("name", ["race_no_barrier", "race_wait_after_barrier"])
def test_lds_race_between_waves_detected(code, name):
    chk, _ = _run(code, name, waves=2)
    assert chk.violations and chk.violations[0].rule == "lds-race", [str(v) for v in chk.violations]
    assert "LDS bytes 0x" in chk.violations[0].detail


def test_lds_dma_write_after_an_unwaited_read_of_another_wave(code):
    chk, _ = _run(code, "war_dma_cross", waves=2)
    rules = {v.rule for v in chk.violations}
    assert rules == {"lds-dma-unordered"}, [str(v) for v in chk.violations]
    assert any("wave 0" in v.detail and v.wave.startswith("wave 1") for v in chk.violations)
    chk, _ = _run(code, "war_dma_cross_ok", waves=2)
    assert not chk.violations, [str(v) for v in chk.violations]


def test_lds_dma_over_another_waves_unwaited_lds_dma(code):
    chk, _ = _run(code, "waw_dma_cross", waves=2)
    assert {v.rule for v in chk.violations} == {"lds-dma-unordered"}, \
        [str(v) for v in chk.violations]
    chk, _ = _run(code, "waw_dma_cross_ok", waves=2)
    assert not chk.violations, [str(v) for v in chk.violations]


def test_report_only_rules_are_recorded_not_raised(code):
    m = Machine()
    buf = np.zeros(1024, np.uint8)
    m.memory.add(buf.ctypes.data, buf.nbytes, "buf", buf)
    chk = HazardChecker(report_only={"m0-lds-dma"}).attach(m)
    run(code, "m0_lds_dma_bad", _setup(buf), lds=1024, machine=m)
    assert [v.rule for v in chk.violations] == ["m0-lds-dma"]
    with pytest.raises(HazardError):
        run(code, "valu_mfma_bad", _setup(buf), lds=1024, machine=m)
    with pytest.raises(ValueError, match="unknown hazard rule"):
        HazardChecker(report_only={"no-such-rule"})


def test_lds_exchange_with_wait_and_barrier_is_clean(code):
    chk, wg = _run(code, "race_ok", waves=2)
    assert not chk.violations, [str(v) for v in chk.violations]
    assert (wg.waves[0].v[3] == 65 + LANE).all() and (wg.waves[1].v[3] == 1 + LANE).all()


def _exchange_runner(code, name):
    def launch(quantum, seed):
        _, wg = _run(code, name, waves=2, quantum=quantum, seed=seed)
        return [w.v[3].copy() for w in wg.waves]
    return launch


def test_interleavings_expose_a_race_and_agree_without_one(code):
    ok, diffs = interleavings_agree(_exchange_runner(code, "race_no_barrier"))
    assert not ok and diffs
    ok, diffs = interleavings_agree(_exchange_runner(code, "race_ok"))
    assert ok, diffs


def test_pass_counts():
    assert mfma_passes("v_mfma_f32_16x16x32_bf16") == 4
    assert mfma_passes("v_mfma_f32_32x32x16_bf16") == 8
    assert mfma_passes("v_mfma_f32_16x16x128_f8f6f4") == 8
    assert mfma_passes("v_mfma_f32_32x32x64_f8f6f4") == 16
    assert mfma_passes("v_mfma_f32_32x32x64_f8f6f4", cbsz=4, blgp=4) == 8       # FP4 x FP4
    assert mfma_passes("v_mfma_scale_f32_16x16x128_f8f6f4", cbsz=0, blgp=4) == 8
    assert mfma_passes("v_mfma_f32_4x4x4_16b_f16") == 2


# -- the real kernels ---------------------------------------------------------------------

VARIANTS = [(dq, dv, causal) for dq, dv in ((64, 64), (128, 128), (192, 128), (256, 256))
            for causal in (False, True)]
kernels = pytest.mark.skipif(
    not all((ROOT / "prebuilt" / f"fwd_gfx950_bf16_d{dq}x{dv}_{'causal' if c else 'full'}.hsaco")
            .exists() for dq, dv, c in VARIANTS),
    reason="gfx950 code objects not built (python build.py --arch gfx950)")


@kernels
@pytest.mark.parametrize("variant", sweep(VARIANTS, key=tuple,
                                           name=lambda v: f"d{v[0]}x{v[1]}_{'causal' if v[2] else 'full'}"))
def test_bf16_kernels_are_hazard_clean(emulator, variant):
    from zyfa_runtime import flash_attn_func, reference
    dq, dv, causal = variant
    chk = emulator.hazards
    assert chk is not None and chk.raise_on_error
    rng = np.random.default_rng(zlib.crc32(repr(variant).encode()))
    # 2 query blocks x 2 heads, several KV tiles with a partial last one, GQA 2
    q, k, v = bf16(rng, (1, 70, 2, dq)), bf16(rng, (1, 90, 1, dq)), bf16(rng, (1, 90, 1, dv))
    before = chk.instructions
    out = flash_attn_func(q, k, v, causal=causal)          # raises HazardError on a violation
    assert chk.instructions - before == emulator.machine.last.instructions > 0
    assert not chk.violations
    ref = reference.attention(q, k, v, causal=causal)
    assert reference.relative_error(out.numpy().astype(np.float64), ref) <= 8e-3


@kernels
def test_bf16_kernel_interleavings_agree(emulator):
    from zyfa_runtime import flash_attn_func
    rng = np.random.default_rng(7)
    q, k, v = bf16(rng, (1, 64, 1, 64)), bf16(rng, (1, 80, 1, 64)), bf16(rng, (1, 80, 1, 64))
    cfg = emulator.machine.config
    saved = cfg.quantum, cfg.seed

    def launch(quantum, seed):
        cfg.quantum, cfg.seed = quantum, seed
        out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
        return out.numpy().view(np.uint16), lse.numpy().view(np.uint32)
    try:
        ok, diffs = interleavings_agree(launch, schedules=((16, None), (5, 11), (40, 12)))
    finally:
        cfg.quantum, cfg.seed = saved
    assert ok, diffs


def _capture_launch(emulator, fn):
    """Run ``fn()`` and return (function, grid, block, shared bytes, stream, args) of its
    launch."""
    seen = []
    real = emulator.launch
    emulator.launch = lambda *a, **kw: seen.append(a) or real(*a, **kw)
    try:
        fn()
    finally:
        del emulator.launch
    return seen[-1]


@kernels
def test_real_kernel_with_one_nop_or_wait_removed_is_caught(emulator):
    # Mutate the d64 kernel's machine code: shorten an s_nop that LLVM sized exactly, and
    # loosen an s_waitcnt whose data is used right after; the checker must object.
    from zyfa_emulator import CodeObject, LoadedCode
    from zyfa_runtime import flash_attn_func
    rng = np.random.default_rng(3)
    q, k, v = bf16(rng, (1, 64, 1, 64)), bf16(rng, (1, 64, 1, 64)), bf16(rng, (1, 64, 1, 64))
    chk = emulator.hazards
    chk.record_tight = True
    try:
        function, grid, block, shared, _, args = _capture_launch(
            emulator, lambda: flash_attn_func(q, k, v))
    finally:
        chk.record_tight = False
    code = function.module.handle
    image = bytearray((ROOT / "prebuilt" / "fwd_gfx950_bf16_d64x64_full.hsaco").read_bytes())
    text = next(s for s in CodeObject(bytes(image)).elf.sections if s.name == ".text")

    def patched_run(pc_to_word):
        img = bytearray(image)
        for pc, word in pc_to_word.items():
            off = text.offset + (pc - code.base) - text.addr
            img[off:off + 4] = word.to_bytes(4, "little")
        patched = LoadedCode(CodeObject(bytes(img)))
        m = Machine()
        HazardChecker().attach(m)
        m.dispatch(patched, patched.co.kernel(function.symbol), grid, block, args, shared)

    # 1. an exactly sized s_nop N (N >= 1) right before its consumer -> s_nop N-1
    nops = []
    for pc, rule in sorted(chk.tight):
        prev = max((p for p in code.cache if p < pc), default=None)
        inst = code.cache.get(prev)
        if inst is not None and inst.name == "s_nop" and inst.simm16 & 0xF and prev + 4 == pc:
            nops.append((prev, inst, rule))
    assert nops, "no exactly sized s_nop found"
    pc, inst, rule = nops[0]
    word = int.from_bytes(code.image[pc - code.base:pc - code.base + 4], "little")
    with pytest.raises(HazardError, match=rule) as e:
        patched_run({pc: word - 1})
    assert "<zyfa_fwd_gfx950_bf16_d64x64_full+0x" in str(e.value)
    # 2. an s_waitcnt lgkmcnt(N) directly followed by a use of LDS data -> lgkmcnt(N+1)
    waits = [i for p, i in sorted(code.cache.items()) if i.name == "s_waitcnt"
             and (i.simm16 >> 8 & 0xF) < 15 and code.cache.get(p + 4) is not None
             and code.cache[p + 4].fmt in ("MAI", "VOP1", "VOP2", "VOP3")]
    assert waits
    w0 = waits[0]
    word = int.from_bytes(code.image[w0.pc - code.base:w0.pc - code.base + 4], "little")
    with pytest.raises(HazardError, match="counter") as e:
        patched_run({w0.pc: word + (1 << 8)})
    assert "<zyfa_fwd_gfx950_bf16_d64x64_full+0x" in str(e.value)


def test_whole_kernel_tests_run_the_checker_in_the_full_run_and_here_always(request):
    """emukit.hazards: on wherever the run selects the slow tests (CI's ``-m "slow or not
    slow"``, ``-m slow``, no expression), off in the default run's other modules, and on in
    this module whatever the run."""
    import types

    import emukit

    class Config:
        def __init__(self, expr):
            self.expr = expr

        def getoption(self, name):
            assert name == "markexpr"
            return self.expr

    class Request:
        def __init__(self, expr, module):
            self.config, self.module = Config(expr), types.SimpleNamespace(__name__=module)

    for expr, full in (("slow or not slow", True), ("slow", True), ("", True), ("not slow", False),
                       ("gpu and not slow", False)):
        assert emukit.full_run(Config(expr)) is full, expr
        assert emukit.hazards(Request(expr, "tests.emulator.test_emu_fp8")) == ("1" if full else "0")
        assert emukit.hazards(Request(expr, "tests.emulator.test_emu_hazards")) == "1"
    assert emukit.hazards(request) == "1"
