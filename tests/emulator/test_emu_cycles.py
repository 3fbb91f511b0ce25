"""The cycle model (``zyfa_emulator.cycles``): its rules on small snippets, its calibration
against the design's published budget for one 32-query x 128-key tile at head dim 128
(FP8 matrix work 1,024 cycles, exact softmax 896, Lean P 384; matrix pipe busy 60 %
without and 86 % with two-wave ping-pong), and the figures of a real kernel.

The calibration snippets are written from those descriptions (one wave's share: 64
scores per lane).  ``python tests/emulator/test_emu_cycles.py`` prints the calibration
table that docs/emulator.md quotes."""

import dataclasses
import sys
from pathlib import Path

import pytest

from tests.backends import using_backend

if __name__ == "__main__":          # run as a script: find emukit and the packages
    sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[2])]
from emukit import build, run  # noqa: E402

from zyfa_emulator import Machine  # noqa: E402
from zyfa_emulator.cycles import Params, TraceRecorder, loop_figures, simulate
from zyfa_emulator.hazards import HazardChecker  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# -- calibration snippets (FP8, one wave: 32 queries x 128 keys, d = 128) ------------------


def qk_mfmas() -> list:
    """S^T = K Q^T as 4 key blocks of 32 x 32, each over K = 128 in two 64-deep steps:
    8 x v_mfma_f32_32x32x64_f8f6f4 (16 passes = 64 cycles each).  A = K fragments
    (a[0:63], read from LDS), B = Q fragments (v[160:175]); S^T lands in v[0:63]."""
    out = []
    for blk in range(4):
        for step in range(2):
            c = "0" if step == 0 else f"v[{16 * blk}:{16 * blk + 15}]"
            a = 8 * (2 * blk + step)
            out.append(f"v_mfma_f32_32x32x64_f8f6f4 v[{16 * blk}:{16 * blk + 15}], a[{a}:{a + 7}], "
                       f"v[{160 + 8 * step}:{167 + 8 * step}], {c}")
    return out


def pv_mfmas() -> list:
    """O^T += V^T P^T: 4 blocks of 32 head-dim rows, two 64-key steps each; A = V^T
    fragments (a[64:127], read from LDS), B = P (FP8, v[96:111]); O^T in v[192:255]."""
    out = []
    for blk in range(4):
        for step in range(2):
            a, o = 64 + 8 * (2 * blk + step), 192 + 16 * blk
            out.append(f"v_mfma_f32_32x32x64_f8f6f4 v[{o}:{o + 15}], a[{a}:{a + 7}], "
                       f"v[{96 + 8 * step}:{103 + 8 * step}], v[{o}:{o + 15}]")
    return out


def k_reads() -> list:
    """This wave's K fragments for one tile: 128 keys x 128 bytes = 16 KiB = 16 x
    ds_read_b128 (256 bytes per lane)."""
    return [f"ds_read_b128 a[{4 * i}:{4 * i + 3}], v70 offset:{16 * i}" for i in range(16)]


def v_reads() -> list:
    """V^T fragments: 16 KiB through the transposing read, 32 x ds_read_b64_tr_b8."""
    return [f"ds_read_b64_tr_b8 a[{64 + 2 * i}:{65 + 2 * i}], v71 offset:{8 * i}" for i in range(32)]


def row_max() -> list:
    """Per-element part of the row max: one v_max3_f32 folds two scores (32 for 64)."""
    return [f"v_max3_f32 v64, v64, v{2 * i}, v{2 * i + 1}" for i in range(32)]


def to_fp8(start=96) -> list:
    """Pack 64 fp32 values (v[0:63]) into 16 VGPRs of FP8, two per instruction (low then
    high half of each destination)."""
    out = []
    for j in range(16):
        out.append(f"v_cvt_pk_fp8_f32 v{start + j}, v{4 * j}, v{4 * j + 1}")
        out.append(f"v_cvt_pk_fp8_f32 v{start + j}, v{4 * j + 2}, v{4 * j + 3} op_sel:[0,0,1]")
    return out


def exact_softmax() -> list:
    """max, subtract the max, multiply by scale * log2(e), exp2, convert to FP8, sum:
    0.5 + 0.5 + 0.5 + 1 + 0.5 + 0.5 = 3.5 VALU slots per score (224 per wave)."""
    pairs = [f"v[{2 * i}:{2 * i + 1}]" for i in range(32)]
    return (row_max()
            + [f"v_pk_add_f32 {r}, {r}, v[64:65] op_sel_hi:[1,0] neg_lo:[0,1] neg_hi:[0,1]"
               for r in pairs]
            + [f"v_pk_mul_f32 {r}, {r}, s[2:3] op_sel_hi:[1,0]" for r in pairs]
            + [f"v_exp_f32_e32 v{i}, v{i}" for i in range(64)]
            + to_fp8()
            + [f"v_pk_add_f32 v[66:67], v[66:67], {r}" for r in pairs])


def lean_p() -> list:
    """max, one FMA (score x 8 c + (c0 - 8 m), two per v_pk_fma_f32), convert/pack:
    0.5 + 0.5 + 0.5 = 1.5 VALU slots per score (96 per wave).  The pack is timed as a
    two-value v_cvt_pk_fp8_f32 (the same issue cost as any two-value pack)."""
    pairs = [f"v[{2 * i}:{2 * i + 1}]" for i in range(32)]
    return (row_max()
            + [f"v_pk_fma_f32 {r}, {r}, s[2:3], v[68:69] op_sel_hi:[1,0,1]" for r in pairs]
            + to_fp8())


def tile_loop(softmax: list, iterations: int, label: str) -> str:
    """The design's KV-tile loop for one wave: QK^T, softmax (with the cross-half row-max
    exchange), PV, the tile's K and V fragments read from LDS (V before the softmax, the
    next tile's K after it).  Two-wave ping-pong as in AITER's kernels: the waves of a
    SIMD alternate between an MFMA phase (PV of one tile + QK^T of the next, at
    ``s_setprio 1``) and a softmax phase, handing over at workgroup barriers; waves with
    ``s1 = 1`` start one phase late.  With ``s1 = 0`` everywhere (one wave per SIMD) the
    barriers only keep the waves in step.  NOPs make it hazard-clean (checked)."""
    head = [f"s_mov_b32 s0, {iterations}", *k_reads(),
            "s_cmp_eq_u32 s1, 0", f"s_cbranch_scc1 {label}_go", "s_barrier", f"{label}_go:"]
    body = [f"{label}:", "s_waitcnt lgkmcnt(0)", "s_setprio 1", *qk_mfmas(), "s_setprio 0",
            "s_barrier", *v_reads(),
            *softmax[:32],                                     # row max (v_max3)
            "v_mov_b32_e32 v65, v64", "s_nop 1", "v_permlane32_swap_b32_e32 v65, v64",
            "v_max_f32_e32 v64, v64, v65",
            *softmax[32:], *k_reads(),
            "s_waitcnt lgkmcnt(0)", "s_barrier", "s_setprio 1", *pv_mfmas(), "s_setprio 0",
            "s_sub_u32 s0, s0, 1", "s_cmp_lg_u32 s0, 0", f"s_cbranch_scc1 {label}"]
    tail = ["s_cmp_eq_u32 s1, 0", f"s_cbranch_scc0 {label}_end", "s_barrier", f"{label}_end:",
            "s_waitcnt lgkmcnt(0)", "s_nop 15", "s_nop 4"]
    return "\n  ".join(head + body + tail)


ITERS = 8
SNIPPETS = {
    "matrix": "\n  ".join(qk_mfmas() + pv_mfmas()),
    "exact": "\n  ".join(exact_softmax()),
    "lean": "\n  ".join(lean_p()),
    "loop_exact": tile_loop(exact_softmax(), ITERS, "tile_exact"),
    "loop_lean": tile_loop(lean_p(), ITERS, "tile_lean"),
    # rule checks
    "valu4": "v_add_f32_e32 v1, v2, v3\n  v_pk_fma_f32 v[4:5], v[4:5], v[6:7], v[8:9]\n"
             "  v_exp_f32_e32 v10, v11\n  v_mul_lo_u32 v12, v13, v14",
    "mfma_overlap": "v_mfma_f32_32x32x64_f8f6f4 a[0:15], v[0:7], v[8:15], 0\n  "
                    + "\n  ".join(f"v_add_f32_e32 v{20 + i}, v{40 + i}, v{41 + i}" for i in range(10)),
    "nops": "s_nop 7\n  s_nop 0\n  v_add_f32_e32 v1, v2, v3",
    "lds_wait": "ds_read_b128 v[4:7], v0\n  s_waitcnt lgkmcnt(0)\n  v_add_f32_e32 v1, v4, v5",
    "barrier": "s_cmp_eq_u32 s1, 0\n  s_cbranch_scc1 skip\n  s_nop 15\nskip:\n  s_barrier\n"
               "  v_add_f32_e32 v1, v2, v3",
    "prio": "s_setprio 3\n  " + "\n  ".join(f"v_add_f32_e32 v{i}, v{i}, v{i}" for i in range(1, 9)),
}


@pytest.fixture(scope="module")
def code():
    return build(SNIPPETS)


def trace_of(code, name, waves=1, check=True):
    """Run snippet ``name`` as one workgroup of ``waves`` waves (hazard-checked) and
    return the recorded traces.  s1 = wave index // 4: the ping-pong phase of the wave."""
    m = Machine()
    rec = TraceRecorder()
    m.observers.append(rec)
    if check:
        HazardChecker().attach(m)

    def setup(w):
        w.v[0:512] = 0
        w.s[1] = w.index // 4
    run(code, name, setup, waves=waves, lds=8192, machine=m)
    return rec.traces


def sim(code, name, waves_on_simd0=1, params=None):
    """Independent single-wave runs of ``name`` sharing SIMD 0."""
    traces = []
    for _ in range(waves_on_simd0):
        traces += trace_of(code, name)
    return simulate(traces, params, simd_of=[0] * len(traces), groups=list(range(len(traces))))


def sim_cu(code, name, waves, params=None):
    """One workgroup of ``waves`` waves on a CU: wave i on SIMD i % 4 (4 waves: one per
    SIMD; 8 waves: two per SIMD, waves i and i + 4 in opposite ping-pong phases)."""
    traces = trace_of(code, name, waves)
    return simulate(traces, params, simd_of=[i % 4 for i in range(waves)], groups=[0] * waves)


def cycles_of(res, kind):
    lst = res.mfma_busy[0] if kind == "mfma" else res.valu_busy[0]
    return sum(b - a for a, b in lst)


# -- rules -----------------------------------------------------------------------------


def test_valu_costs(code):
    res = sim(code, "valu4")
    # add 4, pk_fma 4 (two FP32 results per lane), exp 4 (default), mul_lo_u32 16
    assert [b - a for a, b in res.valu_busy[0]] == [4, 4, 4, 16]
    res = sim(code, "valu4", params=Params(trans=16))
    assert [b - a for a, b in res.valu_busy[0]] == [4, 4, 16, 16]


def test_mfma_runs_while_independent_valu_issues(code):
    res = sim(code, "mfma_overlap")
    assert res.mfma_busy[0] == [(0, 64)]
    starts = [a for a, _ in res.valu_busy[0]]
    assert starts == [4 + 4 * i for i in range(10)]      # behind the MFMA's issue slot


def test_nops_idle_the_wave_and_waits_stall_it(code):
    res = sim(code, "nops")
    assert res.valu_busy[0][0][0] == 4 * (8 + 1)
    res = sim(code, "lds_wait", params=Params(lds_latency=64, lds_bytes_per_clk=128))
    # 64 lanes x 16 bytes at 128 B/cycle = 8 cycles in the LDS pipe, then 64 of latency
    assert res.valu_busy[0][0][0] == 8 + 64


def test_barrier_waits_for_the_slowest_wave(code):
    # wave 1 idles 16 issue cycles before the barrier; wave 0 leaves with it
    m = Machine()
    rec = TraceRecorder()
    m.observers.append(rec)

    def setup(w):
        w.s[1] = w.index
    run(code, "barrier", setup, waves=2, machine=m)
    p = Params(barrier_latency=16)
    res = simulate(rec.traces, p, simd_of=[0, 1], groups=[0, 0])
    t_bar = 4 + 4 + 4 * 16              # wave 1: s_cmp, branch not taken, s_nop 15
    assert res.valu_busy[0][0][0] == res.valu_busy[1][0][0] == t_bar + 16


def test_priority_wins_the_valu(code):
    # two waves on one SIMD: the one at s_setprio 3 issues its VALU work first
    t = trace_of(code, "prio", check=False)
    hi = trace_of(code, "prio", check=False)
    lo = [dataclasses.replace(t[0], insts=t[0].insts[1:], lanes=t[0].lanes[1:])]  # no setprio
    res = simulate(lo + hi, simd_of=[0, 0], groups=[0, 1])
    # the older wave 0 takes the VALU at cycle 0 (wave 1 is still at its s_setprio), then
    # wave 1's eight adds all go first, although wave 0 is older
    assert res.issue_times[1][1:9] == [4 + 4 * k for k in range(8)]
    assert res.issue_times[0][1] == 36


# -- calibration -------------------------------------------------------------------------

PUBLISHED = {"matrix": 1024, "exact": 896, "lean": 384, "busy_single": 0.60, "busy_pingpong": 0.86}


def calibration(code, params=None) -> dict:
    out = {}
    res = sim(code, "matrix", params=params)
    out["matrix"] = cycles_of(res, "mfma")
    out["matrix_wall"] = res.cycles
    for name in ("exact", "lean"):
        out[name] = cycles_of(sim(code, name, params=params), "valu")
        out[name + "_quarter_rate"] = cycles_of(sim(code, name, params=Params(trans=16)), "valu")
    for name in ("loop_exact", "loop_lean"):
        t4, t8 = trace_of(code, name, 4), trace_of(code, name, 8)
        runs = {  # one SIMD alone (its own LDS traffic only) and a full CU (shared LDS)
            "1w_simd": simulate(t4[:1], params, simd_of=[0], groups=[0]),
            "1w": simulate(t4, params, simd_of=[0, 1, 2, 3], groups=[0] * 4),
            "2w_simd": simulate([t8[0], t8[4]], params, simd_of=[0, 0], groups=[0, 0]),
            "2w": simulate(t8, params, simd_of=[i % 4 for i in range(8)], groups=[0] * 8)}
        for key, res in runs.items():
            lf = loop_figures(res)
            out[f"{name}_{key}"] = lf.mfma_busy
            out[f"{name}_{key}_valu"] = lf.valu_busy
            out[f"{name}_{key}_cycles"] = lf.cycles_per_iteration
    return out


@pytest.fixture(scope="module")
def calib(code):
    return calibration(code)


def test_matrix_work_is_1024_cycles(calib):
    # 16 x 32x32x64 FP8 MFMAs x 16 passes x 4 cycles: the pass counts make this exact
    assert calib["matrix"] == PUBLISHED["matrix"]
    assert calib["matrix_wall"] <= PUBLISHED["matrix"] + 8     # + issue of s_endpgm


def test_softmax_budgets(calib):
    # exact: 224 VALU slots of 4 cycles with v_exp_f32 at one slot each; Lean P: 96 slots.
    # Both exact (integer slot counts); quarter-rate exp2 would cost 64 x 12 more.
    assert calib["exact"] == PUBLISHED["exact"]
    assert calib["lean"] == PUBLISHED["lean"]
    assert calib["exact_quarter_rate"] == PUBLISHED["exact"] + 64 * 12
    assert calib["lean_quarter_rate"] == PUBLISHED["lean"]


def test_matrix_pipe_busy_with_and_without_ping_pong(calib):
    # The design's loop: Lean P, K and V fragments read from LDS, no O rescale (with an
    # integer block max the rescale is rare in the steady state).
    # * Without ping-pong the published 60 % is a per-SIMD figure: one wave doing QK^T,
    #   softmax and PV in series with its own LDS reads exposed -> 1 wave on a SIMD alone.
    # * With ping-pong the pair of waves on a SIMD keeps the matrix pipe busy while the
    #   other does its softmax; on a full CU the 8 waves' fragment reads (8 x 32 KiB per
    #   tile at 128 B/cycle = 2,048 cycles, as long as the pair's MFMA work) make the LDS
    #   a co-bottleneck -> 86 %.
    # Tolerance 3 points: the published figures are whole percents and do not itemise
    # the per-tile extras (barriers, the row-max exchange, loop control); barrier latency
    # 0..32 cycles moves the model by 1.2 points.  The LDS assumptions matter more (LDS
    # latency 128 instead of 64 cycles: 88 -> 75 %; 256 B/cycle: -> 100 %), so this
    # test pins them: changing them must be a conscious recalibration.
    assert abs(calib["loop_lean_1w_simd"] - PUBLISHED["busy_single"]) <= 0.03
    assert abs(calib["loop_lean_2w"] - PUBLISHED["busy_pingpong"]) <= 0.03
    # a pair on a SIMD alone is MFMA-bound; four lock-stepped waves collide on the LDS
    assert calib["loop_lean_2w_simd"] > 0.99
    assert calib["loop_lean_1w"] < calib["loop_lean_1w_simd"] - 0.05
    # the exact softmax (2.3x the VALU work) keeps the matrix pipe less busy everywhere
    for key in ("1w_simd", "1w", "2w_simd", "2w"):
        assert calib[f"loop_exact_{key}"] < calib[f"loop_lean_{key}"] - 0.05


def table(calib) -> str:
    rows = [("FP8 matrix work (16 x 32x32x64, cycles)", PUBLISHED["matrix"], calib["matrix"]),
            ("exact softmax (VALU cycles)", PUBLISHED["exact"], calib["exact"]),
            ("  ... with quarter-rate v_exp_f32 (trans=16)", "-", calib["exact_quarter_rate"]),
            ("Lean P (VALU cycles)", PUBLISHED["lean"], calib["lean"])]
    where = {"1w_simd": "1 wave, one SIMD alone", "1w": "1 wave per SIMD, full CU",
             "2w_simd": "2-wave ping-pong, one SIMD alone", "2w": "2-wave ping-pong, full CU"}
    pub = {("loop_lean", "1w_simd"): "60 %", ("loop_lean", "2w"): "86 %"}
    for name, label in (("loop_lean", "Lean P"), ("loop_exact", "exact softmax")):
        for key, text in where.items():
            rows.append((f"matrix pipe busy, {label} loop, {text}", pub.get((name, key), "-"),
                         f"{100 * calib[f'{name}_{key}']:.1f} % (VALU "
                         f"{100 * calib[f'{name}_{key}_valu']:.0f} %, "
                         f"{calib[f'{name}_{key}_cycles']:.0f} cycles per tile per wave)"))
    out = ["| quantity | published | model |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(out)


if __name__ == "__main__":
    print(table(calibration(build(SNIPPETS))))


# -- a real kernel -------------------------------------------------------------------------

@pytest.mark.skipif(not (ROOT / "prebuilt" / "fwd_gfx950_bf16_d64x64_full.hsaco").exists(),
                    reason="gfx950 code objects not built (python build.py --arch gfx950)")
def test_kernel_figures_are_consistent():
    import os as _os

    from zyfa_emulator.cycles import _classify, _Kind, kernel_figures
    from zyfa_emulator.hazards import is_mfma, mfma_passes
    from zyfa_runtime.catalogue import Variant
    hazards = _os.environ.pop("ZYFA_EMULATOR_HAZARDS", None)   # the figures want a plain run
    try:
        with using_backend("emulator", ZYFA_PREBUILT_DIR=str(ROOT / "prebuilt")):
            f = kernel_figures(Variant("gfx950", "bf16", 64, 64, False), seqlen_q=128,
                               seqlen_k=384, heads=3)
    finally:
        if hazards is not None:
            _os.environ["ZYFA_EMULATOR_HAZARDS"] = hazards
    # occupancy: 92 VGPRs -> 96 -> 5 waves per SIMD; 17,920 B of LDS -> 9; 4-wave WGs -> 5
    assert f.resident_workgroups == 5 and f.workgroups == 6
    res, lf = f.sim, f.loop
    # every MFMA accounted for: 4 cycles per pass
    want = sum(4 * mfma_passes(i.name, i.cbsz, i.blgp) for t in res.traces for i in t.insts
               if is_mfma(i))
    assert sum(b - a for s in res.mfma_busy for a, b in s) == want
    # a wave's loop period cannot beat its SIMD's VALU: 5 waves share it
    t = res.traces[0]
    marks = [k for k, i in enumerate(t.insts[:-1])
             if i.pc == lf.backedge and t.insts[k + 1].pc < i.pc]
    body = t.insts[marks[0] + 1:marks[1] + 1]
    valu = sum(_classify(i, Params())[1] for i in body if _classify(i, Params())[0] == _Kind.VALU)
    mfma = sum(4 * mfma_passes(i.name, i.cbsz, i.blgp) for i in body if is_mfma(i))
    assert mfma == 256                     # 16 x 16x32 bf16 per wave and 64-key tile
    assert 0.9 * 5 * valu <= lf.cycles_per_iteration <= 2 * 5 * valu
    assert 0 < f.tflops_whole < f.tflops_loop < 2516   # BF16 dense peak, 256 x 4 x 1024 x 2.4
    assert f.tile_flops == 2 * 64 * 64 * 128
