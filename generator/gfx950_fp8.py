"""gfx950 (MI355X) FP8 attention forward: a generator of hand-scheduled assembly.

One workgroup is 8 waves x 32 query rows (256 rows) of one query head of one sequence (the
grid (query blocks, heads, sequences); causal (heads, sequences, query blocks), the blocks
taken longest first: ``stage_work``); the keys go by in blocks of N = 64 (the ``gfx950``
recipe's block, ``fp8_models.RECIPES``).
Per block a wave computes, for its 32 queries::

    QK   S^T = K . Q^T        2 x (d_qk / 64) v_mfma_scale_f32_32x32x64_f8f6f4 (K from LDS, Q in
                              AGPRs, Q^T's E8M0 scale 2^-es: the scores come prescaled)
    SM   Lean P               block max, one FMA per two scores onto the fp32 subnormals, a
                              saturating shift per two scores (v_ashr_pk_u8_i32)
         row sum of P         1 x v_mfma_scale_f32_16x16x128_f8f6f4 (P^T against a selector of
                              ones scaled by 2^-127)
         merge                fp32 rescale of O^T to the block's reference (exact block max)
    PV   O^T += V^T . P^T     d_v / 32 x v_mfma_scale_f32_32x32x64_f8f6f4 (V^T by ds_read_b64_tr_b8,
                              P^T straight from the byte pack, 2^-k as P's E8M0 scale)

Ping-pong.  Waves w and w + 4 share a SIMD.  Group A (waves 0-3) and group B (waves 4-7)
run the same pipeline one phase apart, every phase opened by a workgroup barrier: while one
group is in a matrix phase M (QK of block p, PV of block p - 1 and its row sums, at
``s_setprio 1``) the other is in its vector phase SM (the softmax of its current block), so
the matrix pipe of every SIMD always has one wave feeding it::

    phase       0       1       2            3            4 ...
    group A     QK0     SM0     QK1 PV0      SM1          QK2 PV1
    group B     -       QK0     SM0          QK1 PV0      SM1

Data.  Four LDS stages of K and four of V (XOR-swizzled rows: no bank conflicts); in its
matrix phase of iteration p every wave issues its share of the buffer->LDS loads
(``buffer_load_dwordx4 ... lds``) of V(p+2) and K(p+3), in the shadows of its MFMAs, and waits
for them at the end of its next vector phase; they overwrite K(p-1) and V(p-2), last read a
phase earlier.  LDS operands go to VGPRs one phase ahead (d <= 192: an 8-register buffer per
MFMA step, read after the MFMA that frees it, the first QK step's by the vector phase in
between, ``reads_ahead``; d = 256: a ring of buffers that runs on across matrix phases), so a
matrix phase starts with its operands in registers.  The loop is unrolled over the four
stages: every LDS offset is an immediate.

The P arithmetic is the ``gfx950`` recipe of ``zyfa_runtime.fp8_models``, bit for bit
(``Recipe.byte_form == "ashr_u8"``).  The scores arrive as S' = S 2^-es (the QK MFMA's E8M0
scale of Q^T, es chosen once so that a8 = 8c 2^(es - 141) is a normal fp32); with ``Smax``
the block's maximum score and K = 120 - LEAN_CENTRE, per row, in code units (fp32 values
times 2^141)::

    U = fp32(Smax 8c - (K + 1/2)), moved up by |U| 2^-23     (two v_fma_f32)
    z = S 8c - U  as an fp32 subnormal: bits rint(256 (y + 1/2)), y = S 8c - U - 1/2
                                        (one v_pk_fma_f32 per two scores, denormals kept)
    P = bits >> 8, saturated to [0, 255] (one v_ashr_pk_u8_i32 per two scores; z < 0: 0)

P is rint(y) held to 1/256 code.  U's upward move makes ``y + 1/2 <= K + 1/2 + 2^-9`` for
every score of the block, so no byte exceeds 120 (no e4m3 NaN can appear whatever the
magnitudes) and the block's maximum gets code 120 (P = 256 = 2^8 x its exact weight, less
the centring offset; a few codes less where fp32 ulps of U span several codes).  The merge
keeps O^T and the row sum relative to a per-row reference R with ``T_b - R`` an integer
(``T_b = fp32(Smax c)``, the block's exact maximum in log2 units), so the block's factor is
the power of two ``2^-k`` carried by the scaled MFMA, and O^T is rescaled in fp32 by
``2^(R_old - R)`` once per block.

Serving features (runtime arguments; catalogue.FEATURES_OF).  A sliding window moves the
K and V resources to the workgroup's first key block and sets each wave's block counts
(stage_window, skipped by a uniform branch without a window): blocks wholly outside the
workgroup's windows are never loaded, those the window's edges cut are masked (the right edge
as the causal diagonal; the left edge out of line, by a second mask or, where the registers
fit, by biases made once; a block no row of the wave sees is a bare phase).  Sinks join each
row in the epilogue (stage_sink, where the pointer is not null).  A contiguous KV cache gives each
sequence its key count, clamped to its slot of the cache (stage_cache, where the pointer is
not null), before anything derives from it.  A softcap (where the argument is not 0) and a
paged cache (where the page table's pointer is not null) each select a body of the loop out
of line, both together a fourth (stage_loops: one function emits the four): a capped body's
softmax phases cap the scores first (_cap: 112 VALU slots a block), a paged body's K and V
loads each take their 16-row group's page (paged_chunks); the plain loop is unchanged.

Register map, cycle budgets and the stage functions are below; ``plan(v)`` holds every
number that depends on the variant.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from zyfa_runtime import e4m3
from zyfa_runtime.catalogue import Variant, kernarg_size, kernargs, longest_first
from zyfa_runtime.fp8_models import ASHR_EXP, RECIPES

RECIPE = RECIPES["gfx950"]
WAVES = 8              # per workgroup; waves w and w + 4 share a SIMD
DMA_WAVES = 8          # every wave issues its share of the buffer->LDS loads (matrix phase)
STAGES = 4             # LDS stages of K and of V: loads run three blocks ahead
ROWS = 32              # query rows per wave (the 32 columns of S^T)
BLOCK_M = WAVES * ROWS
BLOCK_N = RECIPE.block_keys          # 64 keys per block
NEG_INF = "0xff800000"
LEFT_BIAS = 2 * 32                   # left-edge biases: two blocks x 32 scores a lane
NO_KEY = np.float32(-2.0 ** 64)      # the block max of a row that sees none of the block
RSRC_WORD3 = "0x00020000"            # raw buffer: DATA_FORMAT 32, no swizzle, no ADD_TID
KERNARG_SGPR = 8                     # the kernarg segment is loaded into s[8:...]
VGPR_LIMIT = 256                     # VGPR + AGPR per wave with two waves per SIMD


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _hex(x) -> str:
    return f"0x{int(np.float32(x).view(np.uint32)):08x}"


# --------------------------------------------------------------------------------------
# The plan: every number that depends on the variant.

class _Pool:
    """A bump allocator of named, aligned register ranges."""

    def __init__(self, kind: str, start: int = 0):
        # v0 holds the work-item id until the lane setup is done: VGPR pools start at 1
        self.kind, self.next, self.names = kind, start, {}

    def take(self, name: str, n: int = 1, align: int = 1) -> int:
        base = -(-self.next // align) * align
        self.names[name] = (base, n)
        self.next = base + n
        return base


@dataclasses.dataclass(frozen=True)
class Plan:
    v: Variant
    qk_steps: int          # 64-wide slices of d_qk (one MFMA K-step each)
    pv_chunks: int         # 32-row chunks of O^T (d_v / 32)
    pitch_k: int           # LDS row pitch of K and V (power of two >= 128 bytes)
    pitch_v: int
    k_slots: int           # 1 KiB buffer->LDS loads per DMA wave per K block / V block
    v_slots: int
    lds_k: tuple           # byte offset of the STAGES K stages
    lds_v: tuple           # and of the V stages
    lds_bytes: int
    frag_bufs: int         # LDS->VGPR operand buffers of 8 registers (as many as fit)
    ahead: bool            # a buffer per MFMA step: every operand is read one phase ahead
                           # (else a ring, read frag_bufs steps ahead)
    slack: bool            # the vector phase is shorter than the matrix phase it hides
                           # behind: it takes the loads' address setup and the first K read
    vgpr: dict             # name -> register
    agpr: dict
    sgpr: dict
    args: dict             # kernel argument -> its first SGPR (resident_args, PROLOGUE_ARGS)
    n_vgpr: int
    n_agpr: int
    n_sgpr: int


#: Arguments the prologue reads once, before stage_resources: loaded by stage_arguments into
#: registers free until then (the strides of descale_t into the resource quad of tensor t, the
#: packed totals into a8) rather than kept beside the others, so that the kernel's SGPRs stay
#: within 102.  name -> (register, index).
PROLOGUE_ARGS = {**{f"descale_{t}_stride_{d}": (f"r{t}", 2 * i) for t in "qkv" for i, d in enumerate("bh")},
                 "total_q": ("a8", 0), "total_k": ("a8", 1),
                 # the window's bounds: read by stage_window, before the loop's DMA pair
                 "window_left": ("dl", 0), "window_right": ("dr", 0),
                 # a KV cache's counts: read by stage_sequence, before _madd64 first uses t2
                 "cache_seqlens": ("t2", 0)}
#: Arguments read once straight from the kernarg segment (s[0:1] stays its address), into a
#: register whose argument is dead by then, by stage_descales: the sinks pointer into the
#: descale_v pointer's registers (``sinkp``), for the epilogue; the softcap and its
#: fp32(softmax_scale / softcap) into the descale_q pointer's (``caparg``), for stage_scale
#: and the loop's dispatch (stage_loops).
EPILOGUE_ARGS = ("sinks", "softcap", "softcap_scale")
#: A paged cache's arguments (catalogue "paged_kv"): none is kept in the kernarg image.  The
#: page table's pointer is read by stage_descales into the descale_k pointer's registers
#: (``ptab``, for stage_loops' branch); the others by the paged set-up, out of line, into
#: registers dead by then (``Plan.sgpr``, the paged names).
PAGED_ARGS = ("page_table", "page_table_stride", "page_size", "num_pages", "max_pages", "page_magic")


def kernarg_image(v: Variant) -> list:
    """The dwords of the kernarg segment the kernel keeps in SGPRs, s8 on, in order: all but
    those of PROLOGUE_ARGS, EPILOGUE_ARGS and PAGED_ARGS (alignment gaps included, so that the loads run
    on)."""
    skip = {a.offset // 4 + i for a in kernargs(v)
            if a.name in PROLOGUE_ARGS or a.name in EPILOGUE_ARGS or a.name in PAGED_ARGS
            for i in range(a.size // 4)}
    return [d for d in range(-(-kernarg_size(kernargs(v)) // 4)) if d not in skip]


def resident_args(v: Variant) -> dict:
    """Kernel argument -> its first SGPR in ``kernarg_image``.  A 64-bit argument stays on an
    even register (the dwords left out come in pairs)."""
    at = {d: KERNARG_SGPR + i for i, d in enumerate(kernarg_image(v))}
    out = {a.name: at[a.offset // 4] for a in kernargs(v)
           if a.name not in PROLOGUE_ARGS and a.name not in EPILOGUE_ARGS and a.name not in PAGED_ARGS}
    odd = [a.name for a in kernargs(v) if a.size == 8 and a.name in out and out[a.name] % 2]
    if odd:
        raise ValueError(f"{v.name}: 64-bit arguments on odd SGPRs: {odd}")
    return out


def plan(v: Variant) -> Plan:
    if not (v.arch == "gfx950" and v.dtype == "fp8_e4m3"):
        raise ValueError(f"{v.name} is not a gfx950 FP8 variant")
    qk_steps, pv_chunks = v.d_qk // 64, v.d_v // 32
    pk, pv = max(128, _pow2(v.d_qk)), max(128, _pow2(v.d_v))
    kb, vb = BLOCK_N * pk, BLOCK_N * pv       # one K / V stage; STAGES of each
    flips_k = sorted({16 * (4 * st + 2 * t) for st in range(qk_steps) for t in range(2)} - {0})
    flips_v = sorted({32 * c for c in range(pv_chunks)} - {0})
    # a buffer per MFMA step of a phase (QK halves x d-steps + PV chunks) where that fits
    # (d <= 192), else a ring of up to four
    steps = 2 * qk_steps + pv_chunks
    for frag_bufs, fixed in ((steps, True), (4, True), (4, False), (3, False), (2, False),
                             (1, False)):
        vg = _Pool("v", 1)
        # Persistent per-lane values (register map).
        for name in ("kaddr", "vaddr", "lim0", "ooff", "kconst", "scales", "m", "r",
                     "l", "t", "d", "kf", "e", "sb", "mx", "tmp", "mn", "ninf"):
            vg.take(name)
        vg.take("u", 2, 2)            # U (low half used by the packed FMA)
        vg.take("x", 2, 2)            # rescale factor 2^(R_old - R) (low half)
        if fixed:                     # the swizzled read addresses, made once
            for f in flips_k:
                vg.take(f"kx{f}")
            for f in flips_v:
                vg.take(f"vx{f}")
        vg.take("dmak")               # buffer->LDS source offsets of this lane (K, V)
        vg.take("dmav")
        # MFMA operand tuples need even alignment only (gfx90a and later)
        vg.take("s", 2 * 16, 2)       # S^T: two 32-key halves x 16 registers
        vg.take("p", 8, 2)            # P^T bytes: the B operand of PV (32 keys x 4 bytes)
        vg.take("ls", 4, 2)           # row-sum MFMA result
        vg.take("fr", 8 * frag_bufs, 2)   # operand ring shared by the PV and QK steps
        vg.take("o", 16 * pv_chunks, 2)
        # registers live in disjoint phases share: the loads' offset and the block max (matrix
        # / vector phase); the epilogue's pairs and S^T
        vg.names["dmat"] = vg.names["mx"]
        vg.names["bf"], vg.names["inv"] = (vg.names["s"][0], 2), (vg.names["s"][0] + 2, 2)
        ag = _Pool("a")
        ag.take("q", 8 * qk_steps, 8)
        ag.take("sel", 8, 8)
        n_vgpr = -(-vg.next // 8) * 8
        if n_vgpr + ag.next <= VGPR_LIMIT:
            break
    else:
        raise ValueError(f"{v.name}: {vg.next} VGPRs + {ag.next} AGPRs exceed {VGPR_LIMIT}")
    # the window's left-edge biases (stage_window), where they fit (d64): 0 or -inf per score
    # of S^T for the two blocks a wave's left edge can cut; after every other register, so
    # the plain loop's registers are as they were
    if -(-(vg.next + LEFT_BIAS) // 8) * 8 + ag.next <= VGPR_LIMIT:
        vg.take("lbias", LEFT_BIAS, 2)
        n_vgpr = -(-vg.next // 8) * 8
    sg = _Pool("s", KERNARG_SGPR + len(kernarg_image(v)))
    singles = ("c", "sq", "sk", "qf", "m0row", "diag", "wave", "wrow0", "nb", "wnb",
               "wfull", "p", "pb", "qb", "dv", "kstr64", "vstr64", "t4", "t5", "dl", "dr")
    for name in singles[:2]:          # fill up to the quads' alignment
        sg.take(name)
    # a8: 8c 2^(es - 141) and 2^-23 (U's bump; the packed FMA reads the low half only);
    # c: c 2^es
    for name, n in (("rk", 4), ("rv", 4), ("rq", 4), ("t0", 2), ("t2", 2), ("a8", 2)):
        sg.take(name, n, n)
    for name in singles[2:]:
        sg.take(name)
    # set-up values whose registers are free again before their aliases are first written
    for name, alias in (("dq", "p"), ("dk", "pb"), ("kf", "wfull"), ("hk", "nb"),
                        ("wchunk", "m0row"), ("kb0", "qb")):
        sg.names[name] = sg.names[alias]
    if sg.next > 102:
        raise ValueError(f"{v.name}: {sg.next} SGPRs")
    args = resident_args(v)
    # the loop's window values (stage_window) in the kernarg registers of the q, k and v
    # pointers, dead once stage_resources has made the buffer resources
    for name, (arg, i) in (("wlo_p", ("q", 0)), ("lcut_p", ("q", 1)), ("wnbv", ("k", 0)),
                           ("wleft", ("k", 1)), ("wfr", ("v", 0)), ("sinkp", ("descale_v", 0))):
        sg.names[name] = (args[arg] + i, 1)
    # a paged cache's values (_paged_setup), in kernarg registers dead once the prologue is done
    # (ptab from stage_descales on; the others from the paged set-up, after stage_window): the
    # page table's row (ptab, 64-bit), the K and V caches' head bases (kpb, vpb, 64-bit),
    # page_size / 16, num_pages - 1, the magic, the sequence's last 16-row group, each kind's
    # first group of this wave (plus 4 kb0), and a page-table entry per load of a matrix phase
    for name, (arg, i) in (("ptab", ("descale_k", 0)), ("kpb", ("q_stride_b", 0)),
                           ("vpb", ("q_stride_h", 0)), ("units", ("q_stride_s", 0)),
                           ("lastpage", ("q_stride_s", 1)), ("magic", ("descale_q", 0)),
                           ("lastg", ("descale_q", 1)), ("gofsk", ("k_stride_h", 0)),
                           ("gofsv", ("k_stride_h", 1)), ("ent", ("batch", 0))):
        sg.names[name] = (args[arg] + i, 1)
    # the softcap's arguments (caparg: softcap, softcap_scale) in the descale_q pointer's
    # registers, dead once stage_descales has issued its loads; the cap's constants (_cap's
    # pairs: capa = (1.0, kc), capb = (-2^(1-es), 2^-es)) in those of cu_seqlens_k and
    # v_stride_h, dead once stage_resources has made the K and V resources
    for name, arg in (("caparg", "descale_q"), ("capa", "cu_seqlens_k"), ("capb", "v_stride_h")):
        sg.names[name] = (args[arg], 2)
    names = {a.name for a in kernargs(v)}
    args.update({n: sg.names[reg][0] + i for n, (reg, i) in PROLOGUE_ARGS.items() if n in names})
    return Plan(v, qk_steps, pv_chunks, pk, pv, kb // 1024 // DMA_WAVES, vb // 1024 // DMA_WAVES,
                tuple(i * kb for i in range(STAGES)),
                tuple(STAGES * kb + i * vb for i in range(STAGES)), STAGES * (kb + vb), frag_bufs,
                fixed and frag_bufs == steps,
                # vector phase 388 VALU cycles against 544 of MFMAs at d_v = 128; at d_v = 64
                # 324 against 288, where anything added to it lengthens the period
                v.d_v >= 128,
                {k: b for k, (b, _) in vg.names.items()}, {k: b for k, (b, _) in ag.names.items()},
                {k: b for k, (b, _) in sg.names.items()}, args, n_vgpr, ag.next, sg.next)


# --------------------------------------------------------------------------------------
# Emission helpers

class Asm:
    def __init__(self, p: Plan):
        self.p, self.lines, self._labels = p, [], 0
        self._xpool = [f"v{p.vgpr['tmp']}", f"v{p.vgpr['mn']}"]   # free in matrix phases
        self._xcache: dict = {}
        self.fixed = {}                      # (base, flip) -> VGPR holding base ^ flip
        for kind in ("k", "v"):
            for name, reg in p.vgpr.items():
                if name.startswith(kind + "x"):
                    self.fixed[(f"v{p.vgpr[kind + 'addr']}", int(name[2:]))] = f"v{reg}"
        self.stage = {"k": 0, "v": 0}        # the LDS stage the next K / V reads use
        self.out_of_line: list = []          # emitters of paths placed after s_endpgm
        self.far: list = []                  # the loop's other bodies, after those (stage_loops)

    def __call__(self, text: str) -> None:
        self.lines.append("  " + text)

    def note(self, text: str) -> None:
        self.lines.append("  // " + text)

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")

    def new_label(self, stem: str) -> str:
        self._labels += 1
        return f".L{stem}_{self._labels}"

    # registers by name
    def v(self, name: str, i: int = 0) -> str:
        return f"v{self.p.vgpr[name] + i}"

    def vr(self, name: str, i: int, n: int) -> str:
        b = self.p.vgpr[name] + i
        return f"v[{b}:{b + n - 1}]"

    def ar(self, name: str, i: int, n: int) -> str:
        b = self.p.agpr[name] + i
        return f"a[{b}:{b + n - 1}]"

    def s(self, name: str, i: int = 0) -> str:
        return f"s{self.p.sgpr[name] + i}"

    def sr(self, name: str, n: int) -> str:
        b = self.p.sgpr[name]
        return f"s[{b}:{b + n - 1}]"

    def arg(self, name: str, n: int = 1) -> str:
        """Kernel argument ``name`` (``n`` dwords): its SGPRs (``Plan.args``; those of
        PROLOGUE_ARGS hold it until stage_resources)."""
        b = self.p.args[name]
        return f"s{b}" if n == 1 else f"s[{b}:{b + n - 1}]"

    def swizzled(self, base: str, flip: int) -> str:
        """A VGPR holding ``base ^ flip`` (a swizzled LDS read address): made once and kept
        in one of two matrix-phase temporaries while ``base`` is unchanged."""
        if not flip:
            return base
        key = (base, flip)
        if key in self.fixed:
            return self.fixed[key]
        if key in self._xcache:
            return self._xcache[key]
        used = set(self._xcache.values())
        reg = next((r for r in self._xpool if r not in used), None)
        if reg is None:                      # evict the oldest
            old = next(iter(self._xcache))
            reg = self._xcache.pop(old)
        self(f"v_xor_b32 {reg}, {flip}, {base}")
        self._xcache[key] = reg
        return reg

    def forget_swizzled(self, base: str | None = None) -> None:
        """``base`` changed (or, with None, the temporaries were used elsewhere)."""
        for key in [k for k in self._xcache if base is None or k[0] == base]:
            del self._xcache[key]

    def instructions_since(self, mark: int) -> int:
        """Instructions after line ``mark`` on every path (a lower bound of the wait states
        between them): what a forward branch may skip does not count."""
        n, skipping = 0, None
        for line in self.lines[mark:]:
            text = line.strip()
            if not text or text.startswith("//"):
                continue
            if text.endswith(":"):
                if text[:-1] == skipping:
                    skipping = None
                continue
            if skipping:
                continue
            n += 1
            if text.startswith("s_cbranch"):
                skipping = text.split()[-1]
        return n

    def nops(self, states: int) -> None:
        while states > 0:
            self(f"s_nop {min(states, 16) - 1}")
            states -= 16


def swizzle(key: int, pitch: int) -> int:
    """The XOR applied to a row's 16-byte chunk index in LDS (K and V stages): a bijection
    of the key's low bits chosen so that the 16 keys one ds_read_b128 group reads, and the
    8 keys x 2 chunks one ds_read_b64_tr_b8 group reads, fall in distinct banks (64 banks of
    4 bytes).  Pitch 128 (8 chunks, rows alternate bank halves): bits (k2, k1, k3); pitch
    256 (16 chunks): bits (k2, k0, k1, k3)."""
    bit = [(key >> i) & 1 for i in range(4)]
    if pitch == 128:
        return bit[2] | bit[1] << 1 | bit[3] << 2
    return bit[2] | bit[0] << 1 | bit[1] << 2 | bit[3] << 3


def _swizzle_asm(a: Asm, dst: str, key: str, pitch: int, tmp: str) -> None:
    """``dst = swizzle(key, pitch)`` for a per-lane key (VGPRs; ``tmp`` is clobbered)."""
    order = (2, 1, 3) if pitch == 128 else (2, 0, 1, 3)
    a(f"v_bfe_u32 {dst}, {key}, {order[0]}, 1")
    for pos, bit in enumerate(order[1:], 1):
        a(f"v_bfe_u32 {tmp}, {key}, {bit}, 1")
        a(f"v_lshl_or_b32 {dst}, {tmp}, {pos}, {dst}")


def _madd64(a: Asm, dst: str, idx: str, stride: str) -> None:
    """64-bit ``dst += idx * stride`` (``dst`` and ``stride`` SGPR pairs given as their first
    register index, ``idx`` a non-negative 32-bit SGPR)."""
    d, st = int(dst[1:]), int(stride[1:])
    t0, t1 = a.s("t2"), a.s("t2", 1)
    a(f"s_mul_i32 {t0}, {idx}, s{st}")
    a(f"s_mul_hi_u32 {t1}, {idx}, s{st}")
    a(f"s_mul_i32 {a.s('t4')}, {idx}, s{st + 1}")
    a(f"s_add_u32 {t1}, {t1}, {a.s('t4')}")
    a(f"s_add_u32 s{d}, s{d}, {t0}")
    a(f"s_addc_u32 s{d + 1}, s{d + 1}, {t1}")


# --------------------------------------------------------------------------------------
# Stages, top to bottom.

def stage_arguments(a: Asm) -> None:
    """Load the kernel arguments (layout from the catalogue) into their SGPRs (``Plan.args``):
    each run of dwords contiguous in the segment and in the registers by the widest loads
    their alignment allows (a tuple of 4 or more SGPRs starts on a multiple of 4)."""
    dst = {d: KERNARG_SGPR + i for i, d in enumerate(kernarg_image(a.p.v))}   # segment dword -> SGPR
    dst.update({arg.offset // 4 + i: a.p.args[arg.name] + i for arg in kernargs(a.p.v)
                if arg.name in PROLOGUE_ARGS for i in range(arg.size // 4)})
    order = sorted(dst)
    i = 0
    while i < len(order):
        d, reg = order[i], dst[order[i]]
        run = 1
        while i + run < len(order) and order[i + run] == d + run and dst[order[i + run]] == reg + run:
            run += 1
        n = next(n for n in (16, 8, 4, 2, 1) if n <= run and reg % min(n, 4) == 0)
        regs = f"s[{reg}:{reg + n - 1}]" if n > 1 else f"s{reg}"
        a(f"s_load_dword{'x' + str(n) if n > 1 else ''} {regs}, s[0:1], 0x{4 * d:x}")
        i += n
    stage_lane_constants(a)
    a("s_waitcnt lgkmcnt(0)")


def stage_work(a: Asm) -> None:
    """Causal: the grid is (hq, batch, query blocks) and z counts the blocks from the last
    (``catalogue.work_of``), so the device hands out the longest workgroups first and the short
    ones fill in behind them.  The IDs are moved to where the grid order leaves them (s2 the
    query block, s3 the head, s4 the sequence): seven SALU, once."""
    if not longest_first(a.p.v):
        return
    blk = a.s("t4")
    a.note("longest first: block = ceil(seqlen_q / 256) - 1 - z, head = x, sequence = y")
    a(f"s_add_u32 {blk}, {a.arg('seqlen_q')}, {BLOCK_M - 1}")
    a(f"s_lshr_b32 {blk}, {blk}, {int(math.log2(BLOCK_M))}")
    a(f"s_sub_u32 {blk}, {blk}, 1")
    a(f"s_sub_u32 {blk}, {blk}, s4")
    a("s_mov_b32 s4, s3")
    a("s_mov_b32 s3, s2")
    a(f"s_mov_b32 s2, {blk}")


def stage_sequence(a: Asm) -> None:
    """This workgroup's sequence (varlen through cu_seqlens), early exit, kv head.

    A packed sequence's rows are clamped to the tensors' (hip/bf16_config.h clamped_segment):
    first = clamp(cu[b], 0, total), end = clamp(cu[b + 1], first, total), length =
    min(end - first, max_seqlen) (signed), so that whatever int32 values cu_seqlens holds,
    first + length <= total and length <= the seqlen argument: every buffer resource below
    stays inside its tensor, and spans no more rows than the runtime checked."""
    for t, cu, first, length, seqarg in (("q", "cu_seqlens_q", "qf", "sq", "seqlen_q"),
                                         ("k", "cu_seqlens_k", "kf", "sk", "seqlen_k")):
        done = a.new_label(f"fixed_{t}")
        total = a.arg(f"total_{t}")
        a(f"s_mov_b32 {a.s(first)}, 0")
        a(f"s_mov_b32 {a.s(length)}, {a.arg(seqarg)}")
        a(f"s_cmp_lg_u64 {a.arg(cu, 2)}, 0")
        a(f"s_cbranch_scc0 {done}")
        a(f"s_lshl_b32 {a.s('t4')}, s4, 2")
        a(f"s_load_dwordx2 {a.sr('t0', 2)}, {a.arg(cu, 2)}, {a.s('t4')}")
        a("s_waitcnt lgkmcnt(0)")
        a(f"s_max_i32 {a.s(first)}, {a.s('t0')}, 0")
        a(f"s_min_i32 {a.s(first)}, {a.s(first)}, {total}")
        a(f"s_max_i32 {a.s('t0', 1)}, {a.s('t0', 1)}, {a.s(first)}")
        a(f"s_min_i32 {a.s('t0', 1)}, {a.s('t0', 1)}, {total}")
        a(f"s_sub_i32 {a.s(length)}, {a.s('t0', 1)}, {a.s(first)}")
        a(f"s_min_i32 {a.s(length)}, {a.s(length)}, {a.arg(seqarg)}")
        a.label(done)
    stage_cache(a)
    a.note("the workgroup's first row; a workgroup past the sequence leaves before any barrier")
    a(f"s_lshl_b32 {a.s('m0row')}, s2, {int(math.log2(BLOCK_M))}")
    a(f"s_cmp_ge_i32 {a.s('m0row')}, {a.s('sq')}")
    a("s_cbranch_scc1 .Lend")
    a.note("GQA: ratio = hq / hkv by subtraction (ratio steps: a few)")
    ratio, acc, hk = a.s("t4"), a.s("t5"), a.s("hk")
    a(f"s_mov_b32 {ratio}, 0")
    a(f"s_mov_b32 {acc}, 0")
    a.label(".Lratio")
    a(f"s_add_u32 {acc}, {acc}, {a.arg('hkv')}")
    a(f"s_add_u32 {ratio}, {ratio}, 1")
    a(f"s_cmp_lt_u32 {acc}, {a.arg('hq')}")
    a("s_cbranch_scc1 .Lratio")
    # head / ratio in fp32: both exact, the reciprocal and the product within 2^-22 of the
    # quotient, which for head < 2^22 stays below the next integer, so the truncation is the
    # floor or one short of it (an exact quotient's rounding down): one step up corrects it.
    # Eleven instructions whatever the head (a loop of head / ratio steps took five SALU a step)
    a.note("kv head = head / ratio: fp32 quotient, truncated, one step up where it fell short")
    t = a.p.vgpr["o"]                # O is free until stage_lanes zeroes it
    a(f"v_cvt_f32_u32 v{t + 1}, {ratio}")
    a(f"v_rcp_f32 v{t + 1}, v{t + 1}")
    a(f"v_cvt_f32_u32 v{t}, s3")      # the wait state a transcendental's result needs
    a(f"v_mul_f32 v{t}, v{t}, v{t + 1}")
    a(f"v_cvt_u32_f32 v{t}, v{t}")
    a("s_nop 0")
    a(f"v_readfirstlane_b32 {hk}, v{t}")
    a(f"s_add_u32 {acc}, {hk}, 1")
    a(f"s_mul_i32 {acc}, {acc}, {ratio}")
    a(f"s_cmp_le_u32 {acc}, s3")
    a(f"s_addc_u32 {hk}, {hk}, 0")
    a(f"s_sub_i32 {a.s('diag')}, {a.s('sk')}, {a.s('sq')}")


def stage_cache(a: Asm) -> None:
    """A contiguous KV cache (``flash_attn_with_kvcache`` without pages): sequence b's keys are
    the first ``sk = clamp(cache_seqlens[b], 0, seqlen_k)`` rows of its batch slot (b stride_b,
    as a dense call's), so the count replaces sk before anything derives from it (diag, the
    block counts, the K and V resources' extent: whatever int32 the counts hold, no read leaves
    the slot).  Where the pointer is not null: a uniform branch to the load, placed after the
    kernel's end (without a cache the prologue falls through: two SALU, the loop unchanged).
    The pointer sits in t2 (PROLOGUE_ARGS), which nothing writes before stage_resources."""
    if "cache_seqlens" not in a.p.args:
        return
    a.note("a KV cache: sk = clamp(cache_seqlens[b], 0, seqlen_k) (out of line)")
    a(f"s_cmp_lg_u64 {a.arg('cache_seqlens', 2)}, 0")
    a("s_cbranch_scc1 .Lcache")
    a.label(".Lcache_done")
    a.out_of_line.append(lambda: _cache_count(a))


def _cache_count(a: Asm) -> None:
    """stage_cache's load, after the kernel's end (5 SALU and one scalar load, once)."""
    sk = a.s("sk")
    a.label(".Lcache")
    a(f"s_lshl_b32 {a.s('t4')}, s4, 2")                  # int32 cache_seqlens[b]
    a(f"s_load_dword {a.s('t0')}, {a.arg('cache_seqlens', 2)}, {a.s('t4')}")
    a("s_waitcnt lgkmcnt(0)")
    a(f"s_max_i32 {sk}, {a.s('t0')}, 0")
    a(f"s_min_i32 {sk}, {sk}, {a.arg('seqlen_k')}")
    a("s_branch .Lcache_done")


def stage_descales(a: Asm) -> None:
    """The descales of this workgroup's sequence b (s4) and kv head hk: dq, dk, dv =
    descale_t[b stride_b + hk stride_h] (fp32, strides in elements; 0 and 0 for one value),
    the byte offset in 32 bits (the runtime refuses a view spanning 2^30 elements:
    plan._descale_values) as the load's SGPR offset, in the stride's low dword (read at the
    load's issue, as its address: the resources are made over it while the loads are in
    flight).  The values feed c (stage_scale) and the output factor (stage_epilogue); they,
    the softcap's arguments and the page table's pointer are waited for in
    stage_first_loads."""
    for t, d in (("q", "dq"), ("k", "dk"), ("v", "dv")):
        sb, sh = a.arg(f"descale_{t}_stride_b"), a.arg(f"descale_{t}_stride_h")
        a(f"s_mul_i32 {sb}, s4, {sb}")
        a(f"s_mul_i32 {sh}, {a.s('hk')}, {sh}")
        a(f"s_add_u32 {sb}, {sb}, {sh}")
        a(f"s_lshl_b32 {sb}, {sb}, 2")
        a(f"s_load_dword {a.s(d)}, {a.arg(f'descale_{t}', 2)}, {sb}")
    sink = next((k for k in kernargs(a.p.v) if k.name == "sinks"), None)
    if sink is not None:   # over the descale_v pointer, read above at issue
        a(f"s_load_dwordx2 {a.sr('sinkp', 2)}, s[0:1], 0x{sink.offset:x}")
    for i, name in enumerate(("softcap", "softcap_scale")):   # over the descale_q pointer
        cap = _kernarg(a, name)
        if cap is not None:
            a(f"s_load_dword {a.s('caparg', i)}, s[0:1], 0x{cap.offset:x}")
    table = _kernarg(a, "page_table")
    if table is not None:  # over the descale_k pointer, read above at issue (stage_loops)
        a(f"s_load_dwordx2 {a.sr('ptab', 2)}, s[0:1], 0x{table.offset:x}")


def _kernarg(a: Asm, name: str):
    """Kernel argument ``name`` of the variant (its KernArg), None where it has none."""
    return next((k for k in kernargs(a.p.v) if k.name == name), None)


def _resource(a: Asm, rsrc: str, tensor: str, head: str, first: str, cu: str,
              rows: str, width: int, elem: int, first_row: str | None = None) -> None:
    """Raw buffer resource of one (sequence, head) of ``tensor``: base = ptr + head *
    stride_h + (varlen ? first * stride_s : batch * stride_b) (elements x ``elem`` bytes),
    num_records = ((rows - 1) * stride_s + width) * elem, 0 when ``rows`` is 0.  With
    ``first_row`` (Q and O: the workgroup's first row) the resource starts at that row, so
    offsets stay small (32-bit) however long the sequence."""
    base = a.p.sgpr[rsrc]
    t0 = a.s("t0")
    a(f"s_mov_b64 s[{base}:{base + 1}], {a.arg(tensor, 2)}")
    scale = int(math.log2(elem))
    sh = a.arg(f"{tensor}_stride_h", 2)
    if scale:   # strides in elements -> bytes
        a(f"s_lshl_b64 {a.sr('t0', 2)}, {sh}, {scale}")
        sh = a.sr("t0", 2)
    _madd64(a, f"s{base}", head, sh.split(":")[0].replace("[", ""))
    a(f"s_cmp_lg_u64 {a.arg(cu, 2)}, 0")
    a(f"s_cselect_b32 {a.s('t5')}, {a.s(first)}, s4")
    a(f"s_cselect_b64 {a.sr('t0', 2)}, {a.arg(tensor + '_stride_s', 2)}, {a.arg(tensor + '_stride_b', 2)}")
    if scale:
        a(f"s_lshl_b64 {a.sr('t0', 2)}, {a.sr('t0', 2)}, {scale}")
    _madd64(a, f"s{base}", a.s("t5"), a.s("t0"))
    if first_row is not None:
        a(f"s_lshl_b64 {a.sr('t0', 2)}, {a.arg(tensor + '_stride_s', 2)}, {scale}")
        _madd64(a, f"s{base}", first_row, a.s("t0"))
        a(f"s_sub_u32 {a.s('t5')}, {rows}, {first_row}")     # rows from the first one on
        a(f"s_min_u32 {a.s('t5')}, {a.s('t5')}, {BLOCK_M}")  # the workgroup's (the span plan.py checks)
        rows = a.s("t5")
    a(f"s_and_b32 s{base + 1}, s{base + 1}, 0xffff")
    a(f"s_sub_u32 {t0}, {rows}, 1")
    a(f"s_mul_i32 {t0}, {t0}, {a.arg(tensor + '_stride_s')}")
    a(f"s_add_u32 {t0}, {t0}, {width}")
    if scale:
        a(f"s_lshl_b32 {t0}, {t0}, {scale}")
    a(f"s_cmp_eq_u32 {rows}, 0")
    a(f"s_cselect_b32 s{base + 2}, 0, {t0}")
    a(f"s_mov_b32 s{base + 3}, {RSRC_WORD3}")


def stage_resources(a: Asm) -> None:
    """Buffer resources, block counts of the workgroup and of this wave."""
    p, v = a.p, a.p.v
    t = a.p.vgpr["o"]               # O is free until the loop's prologue zeroes it
    _resource(a, "rq", "q", "s3", "qf", "cu_seqlens_q", a.s("sq"), v.d_qk, 1, a.s("m0row"))
    _resource(a, "rk", "k", a.s("hk"), "kf", "cu_seqlens_k", a.s("sk"), v.d_qk, 1)
    _resource(a, "rv", "v", a.s("hk"), "kf", "cu_seqlens_k", a.s("sk"), v.d_v, 1)
    a(f"s_mul_i32 {a.s('kstr64')}, {a.arg('k_stride_s')}, {BLOCK_N}")
    a(f"s_mul_i32 {a.s('vstr64')}, {a.arg('v_stride_s')}, {BLOCK_N}")
    a.note("blocks: workgroup (nb), this wave's (wnb) and the unmasked ones (wfull)")
    a(f"v_lshrrev_b32 v{t + 6}, 6, v0")
    a("s_nop 0")
    a(f"v_readfirstlane_b32 {a.s('wave')}, v{t + 6}")
    a(f"s_lshl_b32 {a.s('t4')}, {a.s('wave')}, 5")
    a(f"s_add_u32 {a.s('wrow0')}, {a.s('m0row')}, {a.s('t4')}")
    for out, extra, base, shift_round in (("nb", BLOCK_M, "m0row", True),
                                          ("wnb", ROWS, "wrow0", True),
                                          ("wfull", 1, "wrow0", False)):
        e = a.s(out)
        if v.causal:
            a(f"s_add_i32 {e}, {a.s(base)}, {a.s('diag')}")
            a(f"s_add_i32 {e}, {e}, {extra}")
            a(f"s_min_i32 {e}, {e}, {a.s('sk')}")
        else:
            a(f"s_mov_b32 {e}, {a.s('sk')}")
        a(f"s_max_i32 {e}, {e}, 0")
        if shift_round:
            a(f"s_add_u32 {e}, {e}, {BLOCK_N - 1}")
        a(f"s_lshr_b32 {e}, {e}, {int(math.log2(BLOCK_N))}")
    a.note("the loop's window values without a window (stage_window): blocks relative to no "
           "left edge, none cut by it (wlo_p = lcut_p = the group's lag), wnbv = wnb")
    a(f"s_lshr_b32 {a.s('wlo_p')}, {a.s('wave')}, 2")
    a(f"s_mov_b32 {a.s('lcut_p')}, {a.s('wlo_p')}")
    a(f"s_mov_b32 {a.s('wnbv')}, {a.s('wnb')}")


def stage_scale(a: Asm) -> None:
    """The log2-domain score scale c (float64 like the model's) and what follows from it,
    made while the loop's first loads are in flight (stage_first_loads): ~25 VALU, a chain
    of float64 products, that the loads' latency hides."""
    v = a.p.v
    a.note("c = fp32(softmax_scale * log2(e) * dq * dk), products in float64 (fp8_models.log2_scale)")
    l2e = np.float64(1.4426950408889634).view(np.uint64)
    t = a.p.vgpr["o"]               # O is free until the loop's prologue zeroes it
    a(f"s_mov_b32 {a.s('t2')}, 0x{int(l2e) & 0xffffffff:08x}")
    a(f"s_mov_b32 {a.s('t2', 1)}, 0x{int(l2e) >> 32:08x}")
    capped = any(k.name == "softcap" for k in kernargs(v))
    if capped:
        a.note("a softcap: c = fp32(softcap log2(e)) instead, and the cap's constants (out of line)")
        a(f"s_cmp_lg_u32 {a.s('caparg')}, 0")
        a("s_cbranch_scc1 .Lcap_constants")
    a(f"v_cvt_f64_f32 v[{t}:{t + 1}], {a.arg('softmax_scale')}")
    a(f"v_mul_f64 v[{t}:{t + 1}], v[{t}:{t + 1}], {a.sr('t2', 2)}")
    for d in ("dq", "dk"):
        a(f"v_cvt_f64_f32 v[{t + 2}:{t + 3}], {a.s(d)}")
        a(f"v_mul_f64 v[{t}:{t + 1}], v[{t}:{t + 1}], v[{t + 2}:{t + 3}]")
    if capped:
        a.label(".Lcap_constants_done")
        a.out_of_line.append(lambda: _cap_constants(a, t))
    a(f"v_cvt_f32_f64 v{t + 4}, v[{t}:{t + 1}]")
    _prescale(a, t)
    a(f"v_add_u32 v{t + 7}, {-ASHR_EXP}, v{t + 6}")
    a(f"v_ldexp_f32 v{t + 4}, v{t + 4}, v{t + 6}")    # c' = c 2^es
    a(f"v_ldexp_f32 v{t + 5}, v{t + 5}, v{t + 7}")    # a8 = 8c 2^(es - 141)
    a.note("scale bytes: 0 = 1.0 (K, V, P in the row sums), 1 = 2^-127 (the row sums' selector), "
           "2 = 2^-es (Q^T)")
    a(f"v_sub_u32 v{t + 7}, 0x7f, v{t + 6}")
    a(f"v_lshlrev_b32 v{t + 7}, 16, v{t + 7}")
    a(f"v_or_b32 {a.v('scales')}, 0x7f, v{t + 7}")
    a("s_nop 0")
    a(f"v_readfirstlane_b32 {a.s('c')}, v{t + 4}")
    a(f"v_readfirstlane_b32 {a.s('a8')}, v{t + 5}")
    a(f"s_mov_b32 {a.s('a8', 1)}, {_hex(2.0 ** -23)}")


def _prescale(a: Asm, t: int) -> None:
    """v(t + 6) = es from c in v(t + 4) (v(t + 5) = 8c)."""
    a(f"v_mul_f32 v{t + 5}, 0x41000000, v{t + 4}")      # 8c, exact
    a.note("the scores' E8M0 prescale 2^-es (QK's Q^T scale), es = clamp(142 - exponent field of "
           "8c, 0, 127): a8 = 8c 2^(es - 141) is a normal fp32 (>= 2^-126) for every c >= 2^-115, "
           "so z = S' a8 - U is exact before its one rounding")
    a(f"v_bfe_u32 v{t + 6}, v{t + 5}, 23, 8")
    a(f"v_sub_u32 v{t + 6}, {ASHR_EXP + 1}, v{t + 6}")
    a(f"v_max_i32 v{t + 6}, 0, v{t + 6}")
    a(f"v_min_i32 v{t + 6}, 0x7f, v{t + 6}")


def _cap_constants(a: Asm, t: int) -> None:
    """stage_scale's values for a call with a softcap, after the kernel's end (the plain
    prologue falls through; ``fp8_models.gfx950_capped_scores`` is this arithmetic): c =
    fp32(softcap log2(e)) (the recipe's, the capped scores being in units of the softcap; es
    follows from it as without one), and for the cap (:func:`_cap`) the pairs

        capa = (1.0, kc)           kc = fp32(softcap_scale (2 log2 e) dq dk 2^es), float64
                                   products in this order (2^es exact: the MFMA's scores are
                                   S' = S 2^-es, so S' kc is 2 log2(e) x, x the tanh's argument)
        capb = (-2^(1-es), 2^-es)  T' = 2^-es (1 - 2R): the capped score in the scores' scale

    (30 VALU and SALU, once)."""
    a.label(".Lcap_constants")
    a(f"v_cvt_f64_f32 v[{t}:{t + 1}], {a.s('caparg')}")
    a(f"v_mul_f64 v[{t}:{t + 1}], v[{t}:{t + 1}], {a.sr('t2', 2)}")      # softcap log2(e)
    a(f"v_cvt_f32_f64 v{t + 4}, v[{t}:{t + 1}]")
    _prescale(a, t)
    k2 = np.float64(2 * 1.4426950408889634).view(np.uint64)
    a(f"s_mov_b32 {a.s('t0')}, 0x{int(k2) & 0xffffffff:08x}")
    a(f"s_mov_b32 {a.s('t0', 1)}, 0x{int(k2) >> 32:08x}")
    kc, tmp = f"v[{t + 8}:{t + 9}]", f"v[{t + 10}:{t + 11}]"
    a(f"v_cvt_f64_f32 {kc}, {a.s('caparg', 1)}")
    a(f"v_mul_f64 {kc}, {kc}, {a.sr('t0', 2)}")
    for d in ("dq", "dk"):
        a(f"v_cvt_f64_f32 {tmp}, {a.s(d)}")
        a(f"v_mul_f64 {kc}, {kc}, {tmp}")
    a.note("2^es as a float64: exponent field 1023 + es")
    a(f"v_add_u32 v{t + 11}, 0x3ff, v{t + 6}")
    a(f"v_lshlrev_b32 v{t + 11}, 20, v{t + 11}")
    a(f"v_mov_b32 v{t + 10}, 0")
    a(f"v_mul_f64 {kc}, {kc}, {tmp}")
    a(f"v_cvt_f32_f64 v{t + 12}, {kc}")
    a(f"v_sub_u32 v{t + 13}, 0, v{t + 6}")
    a(f"v_ldexp_f32 v{t + 14}, -2.0, v{t + 13}")
    a(f"v_ldexp_f32 v{t + 15}, 1.0, v{t + 13}")
    a("s_nop 1")
    a(f"v_readfirstlane_b32 {a.s('capa', 1)}, v{t + 12}")
    a(f"v_readfirstlane_b32 {a.s('capb')}, v{t + 14}")
    a(f"v_readfirstlane_b32 {a.s('capb', 1)}, v{t + 15}")
    a(f"s_mov_b32 {a.s('capa')}, 1.0")
    a("s_branch .Lcap_constants_done")


def stage_lane_constants(a: Asm) -> None:
    """What each lane holds that follows from its lane and wave alone (no argument): the
    row-sum selector, the K and V^T read addresses, the row state's constants.  Issued while
    the kernel arguments load (stage_arguments), in the scalar loads' shadow: 58 VALU that
    stage_lanes issued after them, where the prologue is bound by the two waves a SIMD
    issuing."""
    p, v = a.p, a.p.v
    tv = p.vgpr["o"]                  # scratch: O is zeroed in the loop's prologue (_zero_o)
    j, g, t1, t2, t3, lane_key = (f"v{tv + i}" for i in range(6))
    a(f"v_and_b32 {j}, 31, v0")
    a(f"v_bfe_u32 {g}, v0, 5, 1")
    a.note("selector of the row-sum MFMA: lane l holds row l%16 and the k group l/16 (see stage_softmax)")
    a(f"v_bfe_u32 {t1}, v0, 4, 1")
    a(f"v_bfe_u32 {t2}, v0, 2, 1")
    a(f"v_cmp_eq_u32 vcc, {t1}, {t2}")
    a(f"v_mov_b32 {t1}, 0x38383838")                   # four e4m3 1.0
    a("s_nop 0")
    a(f"v_cndmask_b32 {t1}, 0, {t1}, vcc")
    for i in range(8):
        a(f"v_accvgpr_write_b32 a{p.agpr['sel'] + i}, {t1}")
    a.note(f"K read address: key j, chunk g ^ swizzle(j) (pitch {p.pitch_k}); a read of chunk "
           "c = 4s + 2t + g XORs 16 (4s + 2t) into it (below the row bits)")
    _swizzle_asm(a, t3, j, p.pitch_k, t2)
    a(f"v_xor_b32 {t3}, {g}, {t3}")
    a(f"v_lshlrev_b32 {t1}, {int(math.log2(p.pitch_k))}, {j}")
    a(f"v_lshl_add_u32 {a.v('kaddr')}, {t3}, 4, {t1}")
    a.note("V^T read address (ds_read_b64_tr_b8): 16-lane group G = l/16 (g = G/2, dh = G%2), "
           "lanes 2r, 2r+1 read key 8(r/4) + 4g + r%4 at chunk dh ^ swizzle(key), byte 8(l%2); "
           "chunk pair c XORs 32c in")
    a(f"v_bfe_u32 {t1}, v0, 3, 1")
    a(f"v_lshlrev_b32 {t1}, 3, {t1}")
    a(f"v_lshl_add_u32 {t1}, {g}, 2, {t1}")
    a(f"v_bfe_u32 {t2}, v0, 1, 2")
    a(f"v_add_u32 {lane_key}, {t1}, {t2}")                  # the key this lane reads
    _swizzle_asm(a, t3, lane_key, p.pitch_v, t2)
    a(f"v_bfe_u32 {t2}, v0, 4, 1")
    a(f"v_xor_b32 {t3}, {t2}, {t3}")                        # chunk dh ^ swizzle(key)
    a(f"v_lshlrev_b32 {t1}, {int(math.log2(p.pitch_v))}, {lane_key}")
    a(f"v_lshl_add_u32 {t1}, {t3}, 4, {t1}")
    a(f"v_bfe_u32 {t2}, v0, 0, 1")
    a(f"v_lshl_add_u32 {a.v('vaddr')}, {t2}, 3, {t1}")
    a(f"v_add_u32 {a.v('vaddr')}, {p.lds_v[0]}, {a.v('vaddr')}")   # the V region (bits above the XORs)
    for key, reg in a.fixed.items():
        a(f"v_xor_b32 {reg}, {key[1]}, {key[0]}")
    a.note("constants and row state: (K + 1/2) 2^-141, the code of a score equal to the block "
           "max (less the centring) plus the byte's 1/2, held to 1/256 code")
    a(f"v_mov_b32 {a.v('kconst')}, {_hex(RECIPE.ashr_constant)}")
    a(f"v_mov_b32 {a.v('ninf')}, {NEG_INF}")
    a(f"v_mov_b32 {a.v('m')}, {NEG_INF}")
    a(f"v_mov_b32 {a.v('r')}, {NEG_INF}")
    a(f"v_mov_b32 {a.v('l')}, 0")
    a(f"v_mov_b32 {a.v('x')}, 1.0")
    a(f"v_mov_b32 {a.v('sb')}, 0x7f")
    for i in range(4):
        a(f"v_mov_b32 {a.v('ls', i)}, 0")


def stage_lanes(a: Asm) -> None:
    """Per-lane addresses and constants (register map in ``plan``).

    lane l: query column j = l % 32 of S^T, g = l / 32 picks k items and accumulator rows.
    """
    p, v = a.p, a.p.v
    tv = p.vgpr["o"]                  # scratch: O is zeroed in the loop's prologue (_zero_o)
    lane, j, g, row, t1, t2, t3, lrow, lane_key = (f"v{tv + i}" for i in range(9))
    a(f"v_and_b32 {lane}, 63, v0")
    a(f"v_and_b32 {j}, 31, v0")
    a(f"v_bfe_u32 {g}, v0, 5, 1")
    a(f"v_add_u32 {row}, {a.s('wrow0')}, {j}")
    a(f"v_subrev_u32 {lrow}, {a.s('m0row')}, {row}")    # row within the workgroup (Q, O)
    a.note("Q^T -> AGPRs: B of S^T, lane holds query row, d = 64s + 16g + t (t < 16), 64s + 32 + 16g + t")
    a(f"v_mul_lo_u32 {t1}, {lrow}, {a.arg('q_stride_s')}")
    a(f"v_lshl_add_u32 {t1}, {g}, 4, {t1}")
    qs = p.vgpr["s"]
    for s in range(p.qk_steps):
        for h in range(2):
            r = qs + 8 * s + 4 * h
            a(f"buffer_load_dwordx4 v[{r}:{r + 3}], {t1}, {a.sr('rq', 4)}, 0 offen offset:{64 * s + 32 * h}")
    a.note("mask limit: key < min(sk, row + diag + 1) (causal) or sk; minus this lane's 4g")
    if v.causal:
        a(f"v_add3_u32 {t1}, {row}, {a.s('diag')}, 1")
        a(f"v_min_i32 {t1}, {a.s('sk')}, {t1}")
    else:
        a(f"v_mov_b32 {t1}, {a.s('sk')}")
    a(f"v_lshlrev_b32 {t2}, 2, {g}")
    a(f"v_sub_u32 {a.v('lim0')}, {t1}, {t2}")
    a.note("O (bf16) byte offset: row, d = 4g + ...")
    a(f"v_mul_lo_u32 {t1}, {lrow}, {a.arg('o_stride_s')}")
    a(f"v_lshlrev_b32 {t1}, 1, {t1}")
    a(f"v_lshl_add_u32 {a.v('ooff')}, {g}, 3, {t1}")
    a(f"s_lshl_b32 {a.s('wchunk')}, {a.s('wave')}, 10")      # this wave's 1 KiB chunk
    a.note("buffer->LDS: wave w loads chunks c = 8i + w (1 KiB each) of a K or V block; lane "
           "l fills LDS byte 1024c + 16l = row (1024c + 16l) / pitch, chunk ((16l) % pitch) / 16, "
           "which holds the row's chunk chunk ^ swizzle(row); padding columns (pitch > d) "
           "reload a valid chunk, never read")
    for kind, pitch, d, sbase in (("k", p.pitch_k, v.d_qk, "k_stride_s"),
                                  ("v", p.pitch_v, v.d_v, "v_stride_s")):
        a(f"v_lshl_add_u32 {t1}, {lane}, 4, {a.s('wchunk')}")
        a(f"v_lshrrev_b32 {t2}, {int(math.log2(pitch))}, {t1}")          # key in block
        a(f"v_bfe_u32 {t1}, {t1}, 4, {int(math.log2(pitch // 16))}")     # chunk in the row
        _swizzle_asm(a, t3, t2, pitch, lane_key)
        a(f"v_xor_b32 {t1}, {t1}, {t3}")                                  # the chunk it holds
        a(f"v_lshlrev_b32 {t1}, 4, {t1}")                                 # column
        if pitch > d:
            a(f"v_subrev_u32 {t3}, {d}, {t1}")
            a(f"v_cmp_le_u32 vcc, {d}, {t1}")
            a("s_nop 1")
            a(f"v_cndmask_b32 {t1}, {t1}, {t3}, vcc")
        a(f"v_mul_lo_u32 {t2}, {t2}, {a.arg(sbase)}")
        a(f"v_add_u32 {a.v('dma' + kind)}, {t1}, {t2}")


def _zero_o(a: Asm) -> None:
    """O = 0, by pairs, while the loop's first loads are in flight (O is the prologue's
    scratch until here)."""
    for i in range(0, 16 * a.p.pv_chunks, 2):
        a(f"v_mov_b64 {a.vr('o', i, 2)}, 0")


def _q_to_agprs(a: Asm) -> None:
    """Q^T, landed in S's registers (stage_lanes' loads), into its AGPRs."""
    p = a.p
    for i in range(8 * p.qk_steps):
        a(f"v_accvgpr_write_b32 a{p.agpr['q'] + i}, v{p.vgpr['s'] + i}")


def _key_bound(a: Asm, dst: str, row: str, extra: int, off: str, up: bool) -> None:
    """``dst`` = the key block ``clamp(row + extra + off, 0, sk) / 64``, rounded up or down
    (a row's window bound as a block bound; 4-5 SALU)."""
    a(f"s_add_i32 {dst}, {row}, {off}")
    if extra:
        a(f"s_add_i32 {dst}, {dst}, {extra}")
    a(f"s_min_i32 {dst}, {dst}, {a.s('sk')}")
    a(f"s_max_i32 {dst}, {dst}, 0")
    if up:
        a(f"s_add_u32 {dst}, {dst}, {BLOCK_N - 1}")
    a(f"s_lshr_b32 {dst}, {dst}, {int(math.log2(BLOCK_N))}")


def stage_window(a: Asm) -> None:
    """A call with a sliding window (``zyfa_runtime.window``'s rule: row i of the sequence sees
    keys ``lo(i) = i + diag - left`` to ``hi(i) - 1``, ``hi(i) = min(i + diag + right + 1, sk)``;
    a bound of -1 is none, the causal kernel's right bound is 0 whatever the argument).  A
    uniform branch (not taken where the call has none: no left bound, and no right bound or a
    causal kernel) leads to it, after the kernel's end: the plain loop's values are
    stage_resources'.

    The workgroup's loop starts at key block ``kb0 = lo(first row) / 64``: the K and V buffer
    resources move ``kb0`` blocks on, and every block count below is relative to it, so the
    loop, its LDS stages and its loads are the plain loop's (blocks before ``kb0`` are never
    loaded).  Per wave (rows ``wrow0 .. wrow0 + 31``), relative to ``kb0``:

    ======== ==================================================================================
    nb       the workgroup's blocks: those up to ``hi(last row)``
    wnb      this wave's (matrix phases compute blocks < wnb)
    wlo      the first block no left edge cuts: ``ceil(lo(wrow0 + 31) / 64)``
    wfull    vector phases index blocks from wlo (``pb = p - wlo_p``, ``wlo_p = wlo`` plus the
             group's lag): ``pb < wfull`` (unsigned) is a block no edge cuts,
             ``floor(hi(wrow0)/64) - wlo`` (0 at least); ``pb < wnbv = wnb - wlo`` one that
             the right edge cuts; else ``p < lcut_p`` (``min(wlo, wnb)`` plus the lag) one that
             the left edge cuts (``pb`` negative, masked out of line; the right edge's mask
             too where ``pb >= wfr``, wfull before its clamp at 0)
    ======== ==================================================================================

    The masks' limits are keys relative to ``kbase = 64 (kb0 + wlo)``: ``lim0`` per lane
    (``hi(row) - kbase - 4g``, as stage_lanes' for the plain loop) and ``wleft = lo(wrow0) -
    kbase`` (the left mask adds the lane's row and -4g).  About 50 SALU and 8 VALU, once."""
    p, v = a.p, a.p.v
    if "window_left" not in p.args:
        return
    left, right, t = a.arg("window_left"), a.arg("window_right"), a.s("t4")
    a.note("a window: a left bound, or a right bound in a kernel that is not causal (bounds are "
           "-1 or >= 0: both -1 iff their AND is negative)")
    if v.causal:
        a(f"s_cmp_ge_i32 {left}, 0")
    else:
        a(f"s_and_b32 {t}, {left}, {right}")
        a(f"s_cmp_ge_i32 {t}, 0")
    a("s_cbranch_scc1 .Lwindow")
    a.label(".Lwindow_done")
    a.out_of_line.append(lambda: _window_values(a))


def _window_values(a: Asm) -> None:
    """stage_window's values, placed after the kernel's end (the plain path falls through)."""
    v = a.p.v
    left, right = a.arg("window_left"), a.arg("window_right")
    offl, offr, m0, wlo, t, kb0 = a.s("t0"), a.s("t0", 1), a.s("t2"), a.s("t2", 1), a.s("t4"), a.s("kb0")
    sk, wrow0 = a.s("sk"), a.s("wrow0")
    a.label(".Lwindow")
    if v.causal:
        a(f"s_mov_b32 {right}, 0")
    a.note("hi(i) = clamp(i + offr, 0, sk), offr = diag + right + 1 (no right bound: sk); "
           "lo(i) = i + offl, offl = diag - left (no left bound: -2^30, no row's lo above 0)")
    a(f"s_add_i32 {offr}, {a.s('diag')}, {right}")
    a(f"s_add_i32 {offr}, {offr}, 1")
    a(f"s_cmp_lt_i32 {right}, 0")
    a(f"s_cselect_b32 {offr}, {sk}, {offr}")
    a(f"s_sub_i32 {offl}, {a.s('diag')}, {left}")
    a(f"s_cmp_lt_i32 {left}, 0")
    a(f"s_cselect_b32 {offl}, 0xc0000000, {offl}")
    a.note("kb0 = lo(first row) / 64 (<= (sk - 1) / 64: the workgroup has a row); K and V "
           "start there")
    a(f"s_lshl_b32 {m0}, s2, {int(math.log2(BLOCK_M))}")
    a(f"s_add_i32 {kb0}, {m0}, {offl}")
    a(f"s_max_i32 {kb0}, {kb0}, 0")
    a(f"s_lshr_b32 {kb0}, {kb0}, {int(math.log2(BLOCK_N))}")
    for rsrc, stride in (("rk", "kstr64"), ("rv", "vstr64")):
        a(f"s_mul_i32 {t}, {kb0}, {a.s(stride)}")          # bytes of kb0 blocks (< num_records)
        a(f"s_add_u32 {a.s(rsrc)}, {a.s(rsrc)}, {t}")
        a(f"s_addc_u32 {a.s(rsrc, 1)}, {a.s(rsrc, 1)}, 0")
        a(f"s_sub_u32 {a.s(rsrc, 2)}, {a.s(rsrc, 2)}, {t}")
    a.note("block counts relative to kb0 (table above)")
    for dst, row, extra in (("nb", m0, BLOCK_M - 1), ("wnb", wrow0, ROWS - 1)):
        _key_bound(a, a.s(dst), row, extra, offr, True)
        a(f"s_sub_i32 {a.s(dst)}, {a.s(dst)}, {kb0}")
        a(f"s_max_i32 {a.s(dst)}, {a.s(dst)}, 0")
    _key_bound(a, a.s("wfull"), wrow0, 0, offr, False)
    _key_bound(a, wlo, wrow0, ROWS - 1, offl, True)
    a(f"s_sub_i32 {a.s('wfull')}, {a.s('wfull')}, {wlo}")
    a(f"s_mov_b32 {a.s('wfr')}, {a.s('wfull')}")
    a(f"s_max_i32 {a.s('wfull')}, {a.s('wfull')}, 0")
    a(f"s_lshl_b32 {m0}, {wlo}, {int(math.log2(BLOCK_N))}")      # kbase
    a(f"s_sub_i32 {wlo}, {wlo}, {kb0}")
    a(f"s_min_u32 {a.s('lcut_p')}, {wlo}, {a.s('wnb')}")
    a(f"s_add_u32 {a.s('lcut_p')}, {a.s('lcut_p')}, {a.s('wlo_p')}")    # plus the group's lag
    a(f"s_add_u32 {a.s('wlo_p')}, {a.s('wlo_p')}, {wlo}")
    a(f"s_sub_i32 {a.s('wnbv')}, {a.s('wnb')}, {wlo}")
    a(f"s_max_i32 {a.s('wnbv')}, {a.s('wnbv')}, 0")
    a(f"s_add_i32 {a.s('wleft')}, {wrow0}, {offl}")
    a(f"s_sub_i32 {a.s('wleft')}, {a.s('wleft')}, {m0}")
    a.note("lim0 = hi(row) - kbase - 4g")
    tv, tg = a.v("tmp"), a.v("mn")
    a(f"s_add_i32 {t}, {wrow0}, {offr}")
    a(f"v_and_b32 {tv}, 31, v0")
    a(f"v_add_u32 {tv}, {t}, {tv}")
    a(f"v_min_i32 {tv}, {sk}, {tv}")
    a(f"v_bfe_u32 {tg}, v0, 5, 1")
    a(f"v_lshlrev_b32 {tg}, 2, {tg}")
    a(f"v_sub_u32 {tv}, {tv}, {tg}")
    a(f"v_subrev_u32 {a.v('lim0')}, {m0}, {tv}")
    a("s_branch .Lwindow_done")


def _biases_in_the_shadow(a: Asm) -> None:
    """Where the left-edge biases fit (d64): a wave with a block the left edge cuts or hides
    (``lcut_p`` past the group's lag: never without a window) makes them out of line while
    the loop's first loads are in flight (3 SALU and a branch not taken on the plain path)."""
    if "lbias" not in a.p.vgpr:
        return
    go, back = a.new_label("biases"), a.new_label("biases_done")
    a(f"s_lshr_b32 {a.s('t4')}, {a.s('wave')}, 2")               # the group's lag
    a(f"s_cmp_lg_u32 {a.s('lcut_p')}, {a.s('t4')}")
    a(f"s_cbranch_scc1 {go}")
    a.label(back)

    def path():
        a.label(go)
        _left_biases(a)
        a(f"s_branch {back}")
    a.out_of_line.append(path)


def _left_biases(a: Asm) -> None:
    """The left edge's masks as additive biases, once a workgroup (where the registers fit):
    a block the left edge cuts but does not wholly hide from the wave is one of the two
    before wlo (``pb`` = -1 or -2: the wave's first keys ``lo(wrow0 .. wrow0 + 31)`` span 32),
    so ``lbias`` holds, for ``pb`` = -1 then -2, per score of S^T (register 16h + r, key
    offset ``_key_offset(h, r)``) 0 where _mask's left compare keeps it, else -inf; the
    vector phase then adds them to the scores, 16 packed adds instead of 69 slots
    (stage_softmax).  64 VALU a set, once; a set whose block the wave never takes (wholly
    hidden: ``wleft + 64 (n + 1) >= 64``) is not made."""
    t, j = a.v("tmp"), a.v("mn")
    a.note("left-edge biases: lbias[32 n + 16h + r] = 0 if key offset >= wleft + 64 (n + 1) "
           "+ row - 4g, else -inf (n = 0, 1: pb = -1, -2)")
    a(f"v_and_b32 {j}, 31, v0")
    a(f"v_bfe_u32 {t}, v0, 5, 1")
    a(f"v_lshlrev_b32 {t}, 2, {t}")
    a(f"v_sub_u32 {j}, {j}, {t}")                       # row - 4g
    masks = ("vcc", a.sr("t0", 2), a.sr("t2", 2))
    b0 = a.p.vgpr["lbias"]
    idx = [(h, r) for h in range(2) for r in range(16)]
    for n in range(2):
        unseen = a.new_label("no_bias")
        a(f"s_cmp_ge_i32 {a.s('wleft')}, {-BLOCK_N * n}")     # pb = -1 - n hidden: no set
        a(f"s_cbranch_scc1 {unseen}")
        a(f"s_add_i32 {a.s('t4')}, {a.s('wleft')}, {BLOCK_N * (n + 1)}")
        a(f"v_add_u32 {t}, {a.s('t4')}, {j}")

        def select(i):
            a(f"v_cndmask_b32_e64 v{b0 + 32 * n + i}, {a.v('ninf')}, 0, {masks[i % 3]}")
        for i, (h, r) in enumerate(idx):   # masks rotate: each read 2+ wait states after its write
            a(f"v_cmp_ge_i32_e64 {masks[i % 3]}, {_key_offset(h, r)}, {t}")
            if i >= 2:
                select(i - 2)
        select(len(idx) - 2)
        select(len(idx) - 1)
        a.label(unseen)


def _paged_setup(a: Asm) -> None:
    """A paged KV cache (``flash_attn_with_kvcache`` with a page table): key t of sequence b is
    row ``t % page_size`` of page ``page_table[b, t / page_size]`` of the caches (num_pages,
    page_size, hkv, d).  Where the page table's pointer (``ptab``, read by stage_descales) is
    not null, stage_loops' branch leads here and on to a paged body of the loop, both after the
    kernel's end (paged_chunks: each buffer->LDS load takes its page).  sk is stage_cache's
    count, clamped to seqlen_k = max_pages page_size.  The paged loop's values (Plan.sgpr, the
    paged names; 43 SALU, 2 scalar loads and 2 VALU, once):

    * kpb, vpb: the caches' bases at this workgroup's kv head, from the plain resources (which
      added ``b stride_b`` and, with a window, moved ``kb0`` blocks on: both taken off again);
    * ptab: the sequence's row of the page table, ``page_table + b page_table_stride``;
    * units = page_size / 16, lastpage = num_pages - 1, magic = page_magic (a 16-row group g
      lies in slot ``mul_hi(2 g, magic) = g / units`` of the row, exactly: plan.page_magic);
    * lastg = max((sk - 1) / 16, 0): the last group with keys (or 0), the group whose page
      stands in for the groups past sk (loaded as zeros: no slot past the row is read);
    * gofsk, gofsv: this wave's first group of a K / V block (its 1 KiB chunk w lies in group
      ``w / (pitch / 64)`` of the block) plus 4 kb0; dmak, dmav lose that group's rows: a lane's
      offset is then that of its row within its 16-row group (the load's buffer starts there);
    * word 3 of rk and rv, the paged loads' buffers (paged_chunks writes words 0-2 a load).
    """
    p, v = a.p, a.p.v
    kb0, t4, t5 = a.s("kb0"), a.s("t4"), a.s("t5")
    if "window_left" in p.args:
        a.note("kb0 is stage_window's where the call has a window, else 0 (the same test)")
        left, right = a.arg("window_left"), a.arg("window_right")
        if v.causal:
            a(f"s_cmp_ge_i32 {left}, 0")
        else:
            a(f"s_and_b32 {t4}, {left}, {right}")
            a(f"s_cmp_ge_i32 {t4}, 0")
        a(f"s_cselect_b32 {kb0}, {kb0}, 0")
    else:
        a(f"s_mov_b32 {kb0}, 0")
    for rsrc, base, stride64, tensor in (("rk", "kpb", "kstr64", "k"), ("rv", "vpb", "vstr64", "v")):
        a.note(f"{base} = the {tensor} resource's base - b {tensor}_stride_b - kb0 64 {tensor}_stride_s")
        sb = a.p.args[f"{tensor}_stride_b"]
        lo, hi = a.s(base), a.s(base, 1)
        a(f"s_mul_i32 {t4}, s4, s{sb}")
        a(f"s_mul_hi_u32 {t5}, s4, s{sb}")
        a(f"s_sub_u32 {lo}, {a.s(rsrc)}, {t4}")
        a(f"s_subb_u32 {hi}, {a.s(rsrc, 1)}, {t5}")
        a(f"s_mul_i32 {t4}, s4, s{sb + 1}")
        a(f"s_sub_u32 {hi}, {hi}, {t4}")
        a(f"s_mul_i32 {t4}, {kb0}, {a.s(stride64)}")
        a(f"s_sub_u32 {lo}, {lo}, {t4}")
        a(f"s_subb_u32 {hi}, {hi}, 0")
    words = _kernarg(a, "page_size").offset
    a(f"s_load_dwordx2 {a.sr('t0', 2)}, s[0:1], 0x{_kernarg(a, 'page_table_stride').offset:x}")
    a(f"s_load_dwordx4 {a.sr('rk', 4)}, s[0:1], 0x{words:x}")   # page_size, num_pages, max_pages, magic
    a("s_waitcnt lgkmcnt(0)")
    a(f"s_lshl_b64 {a.sr('t0', 2)}, {a.sr('t0', 2)}, 2")
    _madd64(a, a.s("ptab"), "s4", a.s("t0"))
    a(f"s_lshr_b32 {a.s('units')}, {a.s('rk')}, 4")
    a(f"s_sub_u32 {a.s('lastpage')}, {a.s('rk', 1)}, 1")
    a(f"s_mov_b32 {a.s('magic')}, {a.s('rk', 3)}")
    a(f"s_sub_i32 {a.s('lastg')}, {a.s('sk')}, 1")
    a(f"s_ashr_i32 {a.s('lastg')}, {a.s('lastg')}, 4")
    a(f"s_max_i32 {a.s('lastg')}, {a.s('lastg')}, 0")
    a(f"s_mov_b32 {a.s('rk', 3)}, {RSRC_WORD3}")                  # the loads' buffers' word 3
    a(f"s_mov_b32 {a.s('rv', 3)}, {RSRC_WORD3}")
    for kind, pitch, gofs in (("k", p.pitch_k, "gofsk"), ("v", p.pitch_v, "gofsv")):
        a(f"s_lshr_b32 {t4}, {a.s('wave')}, {int(math.log2(pitch // 64))}")   # the wave's group
        a(f"s_lshl2_add_u32 {a.s(gofs)}, {kb0}, {t4}")
        a(f"s_lshl_b32 {t4}, {t4}, 4")
        a(f"s_mul_i32 {t4}, {t4}, {a.arg(kind + '_stride_s')}")
        a(f"v_subrev_u32 {a.v('dma' + kind)}, {t4}, {a.v('dma' + kind)}")


def _paged_phase_loads(p: Plan) -> list:
    """A matrix phase's loads as (kind, chunk i, blocks ahead of p): V(p + 2)'s, then
    K(p + 3)'s, as the plain loop issues them."""
    return [("v", i, 2) for i in range(p.v_slots)] + [("k", i, 3) for i in range(p.k_slots)]


def _carried(p: Plan) -> bool:
    """Whether V's loads take K's pages: where ``pitch_k == pitch_v`` chunk i of V block n lies
    in the 16-row group of chunk i of K block n, loaded a phase earlier, so V need read no
    page-table entry of its own and can take K's page and group, kept in two SGPRs a chunk
    (:func:`paged_chunks`).  Taken at d64 and d128 (one chunk a load); at d256 (two) the
    modelled period was 1 % longer with it than with V's own entries (2,798 against 2,770
    cycles a tile, page 16), and d192x128's pitches differ."""
    return p.pitch_k == p.pitch_v and p.k_slots == 1


def _paged_fetches(p: Plan) -> list:
    """The loads of a matrix phase that read a page-table entry (entry j for the j-th)."""
    return [ld for ld in _paged_phase_loads(p) if ld[0] == "k" or not _carried(p)]


def _entry_of(p: Plan, kind: str, i: int) -> int:
    """The SGPR (after ent) of the page-table entry of chunk i of K / V: the fetched loads'
    order (_paged_fetches)."""
    return next(j for j, (k, c, _) in enumerate(_paged_fetches(p)) if (k, c) == (kind, i))


def _group_of(a: Asm, dst: str, kind: str, i: int, ahead: int) -> None:
    """``dst`` = the 16-row group (of the sequence, from kb0's block) of this wave's chunk i of
    K / V block p + ``ahead``: 4 (p + ahead) + gofs + i 512 / pitch (2 SALU)."""
    pitch = a.p.pitch_k if kind == "k" else a.p.pitch_v
    a(f"s_lshl2_add_u32 {dst}, {a.s('p')}, {a.s('gofs' + kind)}")
    a(f"s_add_u32 {dst}, {dst}, {4 * ahead + i * 512 // pitch}")


def _fetch_entries(a: Asm, loads: list, ahead: int = 0, into: list | None = None) -> None:
    """The page-table entries of ``loads`` ((kind, i, blocks ahead) each, at p + ``ahead``) into
    their SGPRs (_entry_of): the slot of each load's group, clamped to lastg (6 SALU and an
    s_load_dword a load).  In the loop: those of the next matrix phase, in the vector phase
    before it (where it has slack, ``Plan.slack``) or in this matrix phase's last MFMA
    shadow, after its last counted LDS wait (pack_shadows' ``tail``: off the phase's end,
    where the two waves of a SIMD queue for its scalar unit); the vector phase's end waits
    for them (lgkmcnt(0), with its vmcnt(0)): no SMEM is pending at a matrix phase's counted
    LDS waits.  ``into``: other SGPRs, one a load."""
    t4 = a.s("t4")
    for n, (kind, i, blocks) in enumerate(loads):
        _group_of(a, t4, kind, i, blocks + ahead)
        a(f"s_min_u32 {t4}, {t4}, {a.s('lastg')}")
        a(f"s_lshl_b32 {t4}, {t4}, 1")
        a(f"s_mul_hi_u32 {t4}, {t4}, {a.s('magic')}")               # its slot
        a(f"s_lshl_b32 {t4}, {t4}, 2")
        dst = into[n] if into else a.s("ent", _entry_of(a.p, kind, i))
        a(f"s_load_dword {dst}, {a.sr('ptab', 2)}, {t4}")


def paged_chunks(a: Asm, kind: str, i: int, ahead: int, stage: int) -> list:
    """Chunk i of this wave's buffer->LDS load of K / V block p + ``ahead`` from a paged cache,
    as pieces (issue slots, emitter) for the MFMA shadows (:func:`pack_shadows`).  Its 1 KiB
    lies in one 16-row group G (page sizes are multiples of 16, blocks start on a multiple of
    64), so one page serves the whole wave: the load's buffer (rk / rv, free in the paged loop;
    word 3 set once by the set-up) starts at the group's first row in its page, ``base + page
    stride_b + 16 (G - slot units) stride_s`` (page = the slot's entry clamped to [0, num_pages
    - 1]: the address lies in the cache, below 2^48, so word 1's stride field stays 0), and spans
    the group's rows that exist, ``clamp(sk - 16 G, 0, 16) stride_s`` (none: zeros, as the plain
    loop's rows past sk); the lane's offset (dmak / dmav) is its row within the group.
    ``stage``: the block's LDS stage, an immediate (the loop is unrolled over the stages).

    Where V takes K's pages (:func:`_carried`), K's chunk i keeps its page (``ent + k_slots +
    i``) and ``16 (G - slot units) 16 + rows`` (``ent + 2 k_slots + i``) for V's chunk i of the
    same block, a phase later.  Cost per load (a wave's 1 KiB) against the plain loop's 3 SALU
    and a VALU (plus dma_setup's 5 a kind and block): 23 SALU (group and extent 7, row in its
    page 7, the clamped page's 64-bit address 8, M0 1), K's 24 where it keeps its page and row;
    a carried V load 12 (rows and row 5, address 6, M0 1); each page-table entry 6 SALU and an
    s_load_dword (_fetch_entries): per block and wave at d64 and d128 42 SALU and one scalar
    load, d192x128 87 and three, d256 116 and four.  The page's offset is a 32 x 32 -> 64-bit
    product: the page stride is below 4 GiB (plan.PAGE_STRIDE_LIMIT, checked before launch).
    M0 is written ahead of the address, so the load needs no nop (m0-lds-dma).  No VALU, no
    VGPR; SGPRs: the entries and kept pages only."""
    p = a.p
    pitch = p.pitch_k if kind == "k" else p.pitch_v
    region = p.lds_k[0] if kind == "k" else p.lds_v[0]
    r, t4, t5 = ("rk" if kind == "k" else "rv"), a.s("t4"), a.s("t5")
    stride, pstride = a.arg(f"{kind}_stride_s"), p.args[f"{kind}_stride_b"]
    base = "kpb" if kind == "k" else "vpb"
    carry = _carried(p)
    keep = carry and kind == "k"
    page = a.s("ent", p.k_slots + i) if carry else t4          # the clamped page
    rows = a.s("ent", 2 * p.k_slots + i) if keep else t5       # then 16 G' 16 + rows (kept)
    entry = None if carry and kind == "v" else a.s("ent", _entry_of(p, kind, i))

    def extent():
        _group_of(a, t4, kind, i, ahead)
        a(f"s_lshl_b32 {rows}, {t4}, 4")
        a(f"s_sub_i32 {rows}, {a.s('sk')}, {rows}")
        a(f"s_max_i32 {rows}, {rows}, 0")
        a(f"s_min_i32 {rows}, {rows}, 16")                           # the group's rows that exist
        a(f"s_mul_i32 {a.s(r, 2)}, {rows}, {stride}")                # num_records

    def row():
        a(f"s_min_u32 {t4}, {t4}, {a.s('lastg')}")                   # as _fetch_entries' slot
        a(f"s_lshl_b32 {t5}, {t4}, 1")
        a(f"s_mul_hi_u32 {t5}, {t5}, {a.s('magic')}")
        a(f"s_mul_i32 {t5}, {t5}, {a.s('units')}")
        a(f"s_sub_u32 {t4}, {t4}, {t5}")                             # the group within its page
        a(f"s_lshl_b32 {t4}, {t4}, 4")
        a(f"s_mul_i32 {a.s(r)}, {t4}, {stride}")                     # its first row's bytes
        if keep:
            a(f"s_lshl4_add_u32 {rows}, {t4}, {rows}")               # for V's chunk i

    def taken():
        """V's chunk i from K's of the same block (a phase earlier): rows and row kept."""
        kept = a.s("ent", 2 * p.k_slots + i)
        a(f"s_and_b32 {t5}, {kept}, 0xff")
        a(f"s_mul_i32 {a.s(r, 2)}, {t5}, {stride}")
        a(f"s_lshr_b32 {t4}, {kept}, 4")
        a(f"s_and_b32 {t4}, {t4}, 0xff0")
        a(f"s_mul_i32 {a.s(r)}, {t4}, {stride}")

    def page_offset():   # page stride_b (stride_b < 2^32: plan's check), 64-bit, in t5 and word 1
        if entry is not None:
            a(f"s_min_i32 {page}, {entry}, {a.s('lastpage')}")
            a(f"s_max_i32 {page}, {page}, 0")                        # the page, clamped
        a(f"s_mul_i32 {t5}, {page}, s{pstride}")
        a(f"s_mul_hi_u32 {a.s(r, 1)}, {page}, s{pstride}")

    def address():          # M0 first: the load needs no wait state after it (m0-lds-dma)
        a(f"s_add_u32 m0, {a.s('wchunk')}, {region + stage * BLOCK_N * pitch + 8 * i * 1024}")
        a(f"s_add_u32 {a.s(r)}, {a.s(r)}, {t5}")
        a(f"s_addc_u32 {a.s(r, 1)}, {a.s(r, 1)}, 0")
        a(f"s_add_u32 {a.s(r)}, {a.s(r)}, {a.s(base)}")
        a(f"s_addc_u32 {a.s(r, 1)}, {a.s(r, 1)}, {a.s(base, 1)}")

    def issue():
        a(f"buffer_load_dwordx4 {a.v('dma' + kind)}, {a.sr(r, 4)}, 0 offen lds")
    first = [(5, taken)] if carry and kind == "v" else [(7, extent), (7 + keep, row)]
    return first + [(2 + 2 * (entry is not None), page_offset), (5, address), (1, issue)]


def _run(pieces: list):
    """One emitter of ``pieces`` (issue slots, emitter)."""
    return lambda: [emit() for _, emit in pieces]


#: Issue slots pack_shadows fills in a 64-cycle MFMA's shadow: 15 lie between the MFMA and the
#: next one (t + 4 .. t + 60), less one for the other wave's VALU, which the next MFMA's issue
#: waits for (d64 paged 16, cycles a tile: 12 slots 867.2, 13 855.7, 14 852.6, 15 854.0, 16
#: 856.6, 17-18 865).
SHADOW_SLOTS = 14


def pack_shadows(a: Asm, pieces: list, pv: bool, qk: bool, tail: list = ()) -> list:
    """The pieces (issue slots, emitter) of a paged matrix phase's loads as one emitter per
    MFMA shadow (stage_matrix runs emitter j after MFMA j, with ``packed`` the last one after
    the last PV MFMA, before the row sums; what is left over at the phase's end): their
    instructions in order, each shadow filled to its free issue slots exactly (a piece may
    straddle two; filled piece by piece, d64 modelled about 943 cycles a tile, instruction by
    instruction 909.5): SHADOW_SLOTS less the operand reads issued there (reads_ahead; the
    last step's come after the row sums).  ``tail``: pieces that start no earlier than the
    last shadow (the next phase's page-table entries: after the phase's last counted LDS
    wait, so that no SMEM is pending at one; there rather than after the phase, with the last
    shadow before the row sums, d64 modelled 856.6 against 909.5 at 16 slots a shadow).  Used
    where the vector phase has no slack (d64: four shadows, too few for a step of a load
    each); with slack stage_loop gives each step of a load (its extent, its address, its
    issue) a shadow of its own, which modelled better there (docs/gfx950_fp8.md)."""
    p = a.p
    steps = _steps(p, pv, qk)
    matrix = reads_ahead(p)[0] if p.ahead and qk else []
    last = len(steps) - 1
    free = [SHADOW_SLOTS - (0 if pv and s == last else
                            sum(1 for j, _ in matrix if j == s or (s == last and j > s)))
            for s in range(len(steps))]

    def text(ps):                       # each piece's instructions, in order
        out = []
        for _, emit in ps:
            mark = len(a.lines)
            emit()
            out += a.lines[mark:]
            del a.lines[mark:]
        return out
    body, after = text(pieces), text(tail)
    ends = np.cumsum(free).tolist()
    cut = ends[-1] - free[-1]           # where the last shadow starts
    shadows = [body[e - f:e] for e, f in zip(ends[:-1], free[:-1])]
    rest = body[cut:] + after
    shadows += [rest[:free[-1]]] + ([rest[free[-1]:]] if len(rest) > free[-1] else [])
    return [lambda t=t: a.lines.extend(t) for t in shadows]


def dma_chunks(a: Asm, kind: str, block: str, ahead: int = 0, regs: str | None = None) -> list:
    """Buffer->LDS loads of K or V block ``block + ahead`` (``block`` an SGPR) into its
    stage, by this wave, as a list of emitters (spread over MFMA shadows by the caller):
    ``slots`` loads of 1 KiB (64 lanes x 16 bytes to LDS M0 + 16 lane).  Chunk 8i + w of the
    block starts (8192 i / pitch) rows after chunk w.  Rows past the sequence read as 0
    (buffer range check), so the (up to three) blocks past the last are loaded too, as
    zeros or as rows no row of the workgroup sees, into the stages they would own: those
    stages' previous blocks are no longer read.  State between the emitters lives in an
    SGPR pair (LDS address, first row in bytes): ``regs``, set up beforehand by
    :func:`dma_setup`, or dl and dr, set up by the first emitter."""
    p = a.p
    n = p.k_slots if kind == "k" else p.v_slots
    pitch = p.pitch_k if kind == "k" else p.pitch_v
    stride = "kstr64" if kind == "k" else "vstr64"
    region = p.lds_k[0] if kind == "k" else p.lds_v[0]
    dl, dr = (a.s(regs), a.s(regs, 1)) if regs else (a.s("dl"), a.s("dr"))

    def load(i):
        def emit():
            if i:   # 8 chunks further: 8192 / pitch rows = stride64 >> log2(pitch / 128)
                a(f"s_lshr_b32 m0, {a.s(stride)}, {int(math.log2(pitch // 128))}")
                a(f"s_add_u32 {dr}, {dr}, m0")
            a(f"v_add_u32 {a.v('dmat')}, {dr}, {a.v('dma' + kind)}")
            a(f"s_add_u32 m0, {dl}, {region + 8 * i * 1024}")
            a("s_nop 0")
            a(f"buffer_load_dwordx4 {a.v('dmat')}, {a.sr('r' + kind, 4)}, 0 offen lds")
        return emit

    def first():
        dma_setup(a, kind, block, ahead, dl, dr)
        load(0)()
    return [load(0) if regs else first] + [load(i) for i in range(1, n)]


def dma_setup(a: Asm, kind: str, block: str, ahead: int, dl: str, dr: str) -> None:
    """``dl``: the LDS address of this wave's first chunk of K / V block ``block + ahead``
    (its stage plus the wave's chunk); ``dr``: the block's first row, in bytes (5 SALU)."""
    pitch = a.p.pitch_k if kind == "k" else a.p.pitch_v
    stride = "kstr64" if kind == "k" else "vstr64"
    a(f"s_add_u32 {dr}, {block}, {ahead}")
    a(f"s_and_b32 {dl}, {dr}, {STAGES - 1}")
    a(f"s_mul_i32 {dl}, {dl}, {BLOCK_N * pitch}")
    a(f"s_mul_i32 {dr}, {dr}, {a.s(stride)}")
    a(f"s_add_u32 {dl}, {dl}, {a.s('wchunk')}")


def _address(a: Asm, kind: str, stage: int) -> None:
    """The K / V reads that follow use LDS stage ``stage`` (an immediate: the loop is
    unrolled over the stages)."""
    a.stage[kind] = stage


def _steps(p: Plan, pv: bool, qk: bool) -> list:
    """The MFMA steps of a matrix phase: QK (half, d-step) pairs, then PV chunks (S^T is then
    written early and the phase ends on the O^T accumulators, which VALU touches last)."""
    return ([("qk", h, s) for s in range(p.qk_steps) for h in range(2)] if qk else []) + \
        ([("pv", c) for c in range(p.pv_chunks)] if pv else [])


def _read(a: Asm, step: tuple, buf: int, parts=None) -> None:
    """LDS reads of one step's operand into buffer ``buf``: the lane's swizzled base
    (kaddr / vaddr XOR the step's chunk offset) plus the stage as an immediate offset;
    ``parts``: only those of its DS instructions.

    * PV step c: V^T rows 32c.. by 4 x ds_read_b64_tr_b8 (read rd gives items 8rd..8rd+7 =
      keys 16rd + 8(r/4) + 4g + r%4: P^T's order);
    * QK step (h, s): K rows 32h + j, d 64s + 16g.. by 2 x ds_read_b128 (t = 0, 1).
    """
    p = a.p
    b = 8 * buf
    swizzled = a.swizzled
    if step[0] == "pv":
        c = step[1]
        addr = swizzled(a.v("vaddr"), 32 * c)
        base = a.stage["v"] * BLOCK_N * p.pitch_v
        for rd in (range(4) if parts is None else parts):
            a(f"ds_read_b64_tr_b8 {a.vr('fr', b + 2 * rd, 2)}, {addr} "
              f"offset:{base + 16 * rd * p.pitch_v}")
    else:
        _, h, s = step
        base = a.stage["k"] * BLOCK_N * p.pitch_k
        for t in (range(2) if parts is None else parts):
            addr = swizzled(a.v("kaddr"), 16 * (4 * s + 2 * t))
            a(f"ds_read_b128 {a.vr('fr', b + 4 * t, 4)}, {addr} offset:{base + 32 * h * p.pitch_k}")


def _ops(step: tuple) -> int:
    return 4 if step[0] == "pv" else 2


def reads_ahead(p: Plan) -> tuple:
    """With ``Plan.ahead`` (a buffer per MFMA step: step j's operand in buffer j), the reads
    of a matrix phase's operands, made in the phase pair before it, as (step index, part):

    * ``matrix``: by the matrix phase before, each after the MFMA that frees its buffer
      (shadow j: step j's reads; d = 128: 2 ds_read_b128 after each QK MFMA, 4
      ds_read_b64_tr_b8 after each PV MFMA);
    * ``vector``: by the vector phase before, first thing after its barrier (with
      ``slack``: the first QK step's, which the matrix phase would read in its first
      shadow, where its four waves' reads all queue for the LDS at once; the vector
      waves' go first, while the LDS is idle across the barrier).

    Issue order (LDS returns in order, so each MFMA waits for the reads up to its own):
    ``matrix`` then ``vector``."""
    both = _steps(p, True, True)
    reads = [(j, part) for j, st in enumerate(both) for part in range(_ops(st))]
    vector = [r for r in reads if r[0] == 0] if p.slack else []
    return [r for r in reads if r not in vector], vector


def stage_prefetch(a: Asm, pv_block: str | None, qk_block: str | None) -> None:
    """Before the first matrix phase (QK only): its first ``frag_bufs`` operand reads (with
    ``ahead``, all of them, in the order :func:`reads_ahead` gives)."""
    a.forget_swizzled()
    _address(a, "k", 0)
    if a.p.ahead:
        both = _steps(a.p, True, True)
        for j, part in sum(reads_ahead(a.p), []):
            if both[j][0] == "qk":
                _read(a, both[j], j, (part,))
        return
    steps = _steps(a.p, pv_block is not None, qk_block is not None)
    for i in range(min(a.p.frag_bufs, len(steps))):
        _read(a, steps[i], i)


def _mfma(a: Asm, st: tuple, buf: int, last: bool, shadow=None) -> None:
    """The MFMA of step ``st`` from operand buffer ``buf``; after the phase's ``last`` step
    (a PV chunk), the row sums of its P, with ``shadow`` (an emitter: a paged phase's last
    loads) between the two, in the PV MFMA's shadow, which the row sums would otherwise
    wait out."""
    frag = a.vr("fr", 8 * buf, 8)
    if st[0] == "pv":
        o = a.vr("o", 16 * st[1], 16)
        a(f"v_mfma_scale_f32_32x32x64_f8f6f4 {o}, {frag}, {a.vr('p', 0, 8)}, {o}, "
          f"{a.v('scales')}, {a.v('sb')}")
        if last and shadow is not None:
            shadow()
        if last:
            a.note("row sums of P: D[i][j] sums the k groups g with g%2 == (i/4)%2 of "
                   "column j, so every lane gets its own query's sum (used by the next "
                   "vector phase or the epilogue, 12+ wait states later)")
            a(f"v_mfma_scale_f32_16x16x128_f8f6f4 {a.vr('ls', 0, 4)}, {a.ar('sel', 0, 8)}, "
              f"{a.vr('p', 0, 8)}, 0, {a.v('scales')}, {a.v('scales')} op_sel:[1,0,0] "
              "op_sel_hi:[0,0,0]")
    else:
        _, h, s = st
        c = "0" if s == 0 else a.vr("s", 16 * h, 16)
        a(f"v_mfma_scale_f32_32x32x64_f8f6f4 {a.vr('s', 16 * h, 16)}, {frag}, "
          f"{a.ar('q', 8 * s, 8)}, {c}, {a.v('scales')}, {a.v('scales')} op_sel:[0,0,0] "
          "op_sel_hi:[0,1,0]")


def _matrix_ahead(a: Asm, pv_block: str | None, qk_block: str | None, loads: list,
                  u: int, packed: bool = False) -> None:
    """The matrix phase with ``ahead``: step j's operand is in buffer j, read before the
    phase (:func:`reads_ahead`); after MFMA j come the next phase's reads into buffer j
    (K of the block after ``qk_block`` from stage u + 1, V of ``qk_block`` from stage u;
    issued even when the next phase has no QK, the last) and a buffer->LDS load.  Each
    MFMA waits for the reads up to its own in issue order (at most 15 counted: lgkmcnt's
    width, which only waits longer).  ``packed``: the loads are :func:`pack_shadows`' (a
    paged phase at d64), whose last shadow is the last PV MFMA's, before the row sums."""
    p = a.p
    both = _steps(p, True, True)
    steps = _steps(p, pv_block is not None, qk_block is not None)
    n = len(steps)
    matrix, vector = reads_ahead(p)
    order = [j for j, _ in matrix + vector]          # buffers of the outstanding reads
    if pv_block is None:                             # the first phase (stage_prefetch)
        order = [j for j in order if both[j][0] == "qk"]
    nxt = matrix if qk_block is not None else []     # the last phase reads nothing ahead
    if qk_block is None and pv_block is not None:
        # the last phase: the reads made for a QK that does not come (a stage the loads may
        # overwrite after the next barrier) are waited for too
        a("s_waitcnt lgkmcnt(0)")
    qk_done = None
    for i, st in enumerate(steps):
        buf = both.index(st)
        last = max(k for k, b in enumerate(order) if b == buf)
        a(f"s_waitcnt lgkmcnt({min(15, len(order) - 1 - last)})")
        sums = i + 1 == n and st[0] == "pv"
        _mfma(a, st, buf, last=sums, shadow=loads.pop(0) if sums and loads and packed else None)
        if st[0] == "qk" and (i + 1 == n or steps[i + 1][0] != "qk"):
            qk_done = len(a.lines)
        # buffer i is free once MFMA i has issued (the last phase, PV only, is shorter)
        for j, part in [r for r in nxt if r[0] == i or (i + 1 == n and r[0] > i)]:
            kind = "v" if both[j][0] == "pv" else "k"
            _address(a, kind, u if kind == "v" else (u + 1) % STAGES)
            _read(a, both[j], j, (part,))
            order.append(j)
        if loads:
            loads.pop(0)()
    _finish_matrix(a, loads, qk_done)


def _finish_matrix(a: Asm, loads: list, qk_done: int | None) -> None:
    """A matrix phase's end: the loads left over (more loads than MFMAs), then the wait
    states S^T's last MFMA owes the VALU that reads it in the next phase."""
    for emit in loads:
        emit()
    if qk_done is not None:
        a.note("S^T is read by VALU in the next phase: 20 wait states after a 16-pass MFMA")
        a.nops(20 - a.instructions_since(qk_done))


def stage_matrix(a: Asm, pv_block: str | None, qk_block: str | None, loads=None,
                 u: int = 0, packed: bool = False) -> None:
    """The matrix phase: QK of block ``qk_block`` (S^T = K . Q^T) and PV of block
    ``pv_block`` (O^T += 2^-k V^T . P^T, then the row sums of its P) as one software
    pipeline whose operands are read ``frag_bufs`` steps ahead in a ring of 8-register
    buffers.  The ring runs on into the wave's next matrix phase (QK of the block after
    ``qk_block``, PV of ``qk_block``): a buffer's last MFMA here is followed by the read of
    that buffer's first step there, so a matrix phase starts with its operands in
    registers.  (Those reads are issued even when the next phase has no QK, the last one,
    which then reads its own operands.)  Matrix pipe per wave and block (d = 128): 4 QK +
    4 PV MFMAs of 64 cycles and the row sums' 32 = 544 cycles.  ``loads`` (the wave's
    buffer->LDS loads, a list of emitters) go one per MFMA shadow."""
    p = a.p
    a.forget_swizzled()                  # the vector phase used the temporaries
    nb = p.frag_bufs
    loads = list(loads or [])
    if p.ahead:
        _matrix_ahead(a, pv_block, qk_block, loads, u, packed)
        return
    steps = _steps(p, pv_block is not None, qk_block is not None)
    n = len(steps)
    nxt = _steps(p, True, True)[:nb] if qk_block is not None else []
    # the next phase's read j goes to buffer j once this phase's last MFMA using it has
    # issued, and after read j - 1 (the next phase counts its reads in this order)
    at, pos = -1, {}
    for j in range(len(nxt)):
        at = max(at, max((i for i in range(n) if i % nb == j), default=-1))
        pos[j] = at
    # a phase without QK (the last) follows one that read ahead for a QK: it waits for
    # those reads and reads its own operands
    prefetched = qk_block is not None
    if not prefetched:
        a("s_waitcnt lgkmcnt(0)")
    issued = min(nb, n) if prefetched else 0
    outstanding = [_ops(st) for st in steps[:issued]]
    ahead = [0]                             # ops of the next phase's reads issued so far
    moved = set()

    def next_reads(after: int):
        for j in range(len(nxt)):
            if pos[j] != after:
                continue
            kind = "v" if nxt[j][0] == "pv" else "k"
            if kind not in moved:          # this phase has issued its last read of the kind
                moved.add(kind)            # next phase: V of this QK block, K of the next
                _address(a, kind, u if kind == "v" else (u + 1) % STAGES)
            _read(a, nxt[j], j)
            ahead[0] += _ops(nxt[j])

    # stages of the steps this phase reads itself
    _address(a, "k", u)
    _address(a, "v", (u - 1) % STAGES)
    while issued < min(nb, n):
        _read(a, steps[issued], issued % nb)
        outstanding.append(_ops(steps[issued]))
        issued += 1
    next_reads(-1)
    qk_done = None
    for i, st in enumerate(steps):
        a(f"s_waitcnt lgkmcnt({min(15, sum(outstanding[1:]) + ahead[0])})")
        outstanding.pop(0)
        _mfma(a, st, i % nb, last=i + 1 == n)
        if st[0] == "qk" and (i + 1 == n or steps[i + 1][0] != "qk"):
            qk_done = len(a.lines)
        if issued < n:
            _read(a, steps[issued], issued % nb)
            outstanding.append(_ops(steps[issued]))
            issued += 1
        next_reads(i)
        if loads:
            loads.pop(0)()
    _finish_matrix(a, loads, qk_done)


def stage_row_sums(a: Asm) -> None:
    """l = l x + 2^-k (row sum of the last PV'd block's P), with that block's x and scale
    byte sb = 127 - k: the row-sum MFMA returns the sum times 2^-127 (its selector's scale),
    so ldexp by sb gives it times 2^-k (the state starts as l = 0, x = 1: a no-op before the
    first block)."""
    t = a.v("d")            # free here: the merge comes later
    a(f"v_ldexp_f32 {t}, {a.v('ls')}, {a.v('sb')}")
    a(f"v_fma_f32 {a.v('l')}, {a.v('l')}, {a.v('x')}, {t}")


def _by_case(a: Asm, body, none=None, prefix=None) -> None:
    """``body(pv_block, qk_block)`` for the blocks in SGPRs pb (PV) and qb (QK) that this wave
    computes (index < wnb; pb = -1 is none): both, PV only or QK only; ``none()`` when it
    computes neither.  ``prefix()`` opens every case (the phase's barrier: the dispatch is
    decided before it)."""
    pb, qb, wnb = a.s("pb"), a.s("qb"), a.s("wnb")
    no_pv, both, done = a.new_label("no_pv"), a.new_label("both"), a.new_label("case_done")
    neither = a.new_label("neither")
    start = prefix or (lambda: None)
    # the common case (both) comes last: its taken branch is before the barrier, where the
    # wave waits anyway, and it falls through to what follows the phase
    a(f"s_cmp_lt_u32 {pb}, {wnb}")
    a(f"s_cbranch_scc0 {no_pv}")
    a(f"s_cmp_lt_u32 {qb}, {wnb}")
    a(f"s_cbranch_scc1 {both}")
    start()
    body(pb, None)
    a(f"s_branch {done}")
    a.label(no_pv)
    a(f"s_cmp_lt_u32 {qb}, {wnb}")
    a(f"s_cbranch_scc0 {neither}")
    start()
    body(None, qb)
    a(f"s_branch {done}")
    a.label(neither)
    start()
    if none is not None:
        none()
    a(f"s_branch {done}")
    a.label(both)
    start()
    body(pb, qb)
    a.label(done)


def _key_offset(h: int, r: int) -> int:
    """Key (within the block, less 4g) of S^T half h, register r: 32h + 8(r/4) + r%4."""
    return 32 * h + 8 * (r // 4) + r % 4


def _mask(a: Asm, block: str, edge: str) -> None:
    """A boundary block: the scores of keys the row must not see become -inf, those past its
    last key (``edge`` "right": key offset < lim0 - 64 block, 65 slots) or before its first
    (``edge`` "left", the window's: key offset >= wleft + row - 4g - 64 block, 69 slots).
    Keys and limits are relative to stage_window's kbase (plain: key 0), ``block`` too."""
    s0, t = a.p.vgpr["s"], a.v("tmp")
    a(f"s_lshl_b32 {a.s('t4')}, {block}, {int(math.log2(BLOCK_N))}")
    if edge == "right":
        a(f"v_subrev_u32 {t}, {a.s('t4')}, {a.v('lim0')}")
        cmp = "v_cmp_lt_i32_e64"
    else:
        g = a.v("mn")
        a(f"s_sub_u32 {a.s('t5')}, {a.s('wleft')}, {a.s('t4')}")
        a(f"v_and_b32 {t}, 31, v0")
        a(f"v_bfe_u32 {g}, v0, 5, 1")
        a(f"v_lshlrev_b32 {g}, 2, {g}")
        a(f"v_sub_u32 {t}, {t}, {g}")
        a(f"v_add_u32 {t}, {a.s('t5')}, {t}")
        cmp = "v_cmp_ge_i32_e64"
    # compares rotate over three masks so that each is read 2+ wait states after its write
    masks = ("vcc", a.sr("t0", 2), a.sr("t2", 2))
    idx = [(h, r) for h in range(2) for r in range(16)]

    def select(i):
        h, r = idx[i]
        reg = f"v{s0 + 16 * h + r}"
        a(f"v_cndmask_b32_e64 {reg}, {a.v('ninf')}, {reg}, {masks[i % 3]}")

    for i, (h, r) in enumerate(idx):
        a(f"{cmp} {masks[i % 3]}, {_key_offset(h, r)}, {t}")
        if i >= 2:
            select(i - 2)
    select(len(idx) - 2)
    select(len(idx) - 1)


def _add_biases(a: Asm, n: int) -> None:
    """S^T += lbias set ``n`` (16 v_pk_add_f32: a kept score plus 0 is itself, a hidden one
    -inf)."""
    b0 = a.p.vgpr["lbias"] + 32 * n
    for i in range(16):
        a(f"v_pk_add_f32 {a.vr('s', 2 * i, 2)}, {a.vr('s', 2 * i, 2)}, v[{b0 + 2 * i}:{b0 + 2 * i + 1}]")


def _block_max(a: Asm, masked: bool) -> None:
    """mx = the row's block max: 32 scores in-lane (16 slots), lanes l and l^32 (3 slots, the
    previous block's row sums in the permlane's shadow).  A boundary row that sees no key of
    the block gets NO_KEY instead of -inf (2 slots, vcc = it sees one): U stays finite, so
    no NaN byte can appear."""
    s0, mx, t = a.p.vgpr["s"], a.v("mx"), a.v("tmp")
    a(f"v_max3_f32 {mx}, v{s0}, v{s0 + 1}, v{s0 + 2}")
    for i in range(3, 31, 2):
        a(f"v_max3_f32 {mx}, {mx}, v{s0 + i}, v{s0 + i + 1}")
    a(f"v_max_f32 {mx}, {mx}, v{s0 + 31}")
    a(f"v_mov_b32 {t}, {mx}")
    stage_row_sums(a)                  # the previous block's (x, k): also the permlane's wait
    a(f"v_permlane32_swap_b32 {t}, {mx}")
    a(f"v_max_f32 {mx}, {mx}, {t}")
    if masked:
        a(f"v_max_f32 {mx}, {_hex(NO_KEY)}, {mx}")
        a(f"v_cmp_lt_f32 vcc, {_hex(NO_KEY)}, {mx}")


def _reference(a: Asm, masked: bool) -> None:
    """U, the merge and P's scale (12 slots; a boundary block 2 more).  In the kernel's
    scaled units (S' = S 2^-es, c' = c 2^es, a8 = 8c 2^(es - 141)), with M the running max
    and R the reference of O^T and l (log2 units, -inf before the first key):

        U0 = fp32(S'max a8 - (K + 1/2) 2^-141)     U = fp32(U0 + |U0| 2^-23)
        T  = fp32(S'max c')                        M = max(M, T)
        kf = ceil(M - T)                           e = fp32(fp32(R - T) - kf)
        R  = fp32(T + kf)                          x = 2^e   (0 < x < 2)
        sb = u32(fp32(127 - kf))                   P's E8M0 scale 2^-min(kf, 127)

    so that T - R = -kf is an integer (the block's factor is P's E8M0 scale) and R - M is
    in [0, 1).  U >= S'max a8 - (K + 1/2) 2^-141 (an ulp up where U0 is normal, within
    2^-149 where it is subnormal), so no byte passes c0.  A row that sees no key of a
    boundary block keeps R and gets x = 1.  x (a transcendental's result) is first read 33
    slots later."""
    mx, u, t, m, d, r = a.v("mx"), a.v("u"), a.v("t"), a.v("m"), a.v("d"), a.v("r")
    kf, e, x, sb = a.v("kf"), a.v("e"), a.v("x"), a.v("sb")
    a(f"v_fma_f32 {u}, {mx}, {a.s('a8')}, -{a.v('kconst')}")
    a(f"v_mul_f32 {t}, {a.s('c')}, {mx}")
    a(f"v_fma_f32 {u}, |{u}|, {a.s('a8', 1)}, {u}")
    a(f"v_max_f32 {m}, {m}, {t}")
    a(f"v_sub_f32 {kf}, {m}, {t}")
    a(f"v_sub_f32 {d}, {r}, {t}")
    a(f"v_ceil_f32 {kf}, {kf}")
    a(f"v_sub_f32 {e}, {d}, {kf}")
    a(f"v_exp_f32 {x}, {e}")
    if masked:
        a(f"v_add_f32 {d}, {t}, {kf}")
        a(f"v_cndmask_b32 {r}, {r}, {d}, vcc")
        a(f"v_cndmask_b32 {x}, 1.0, {x}, vcc")
    else:
        a(f"v_add_f32 {r}, {t}, {kf}")
    a(f"v_sub_f32 {sb}, {_hex(127.0)}, {kf}")
    a(f"v_cvt_u32_f32 {sb}, {sb}")


def _bytes(a: Asm) -> None:
    """P^T bytes (32 slots): per pair of scores one v_pk_fma_f32, z = S' a8 - U (an fp32
    subnormal whose bits are rint(256 (y + 1/2)), fp32 denormals kept), and per pair one
    v_ashr_pk_u8_i32 (bits >> 8, saturated to [0, 255]: z < 0 gives 0), two pairs to a
    register (op_sel[3]: the upper half): item t = 16h + r of S^T is byte t % 4 of P^T
    register t / 4, the B-operand order of PV."""
    s0 = a.p.vgpr["s"]
    for i in range(16):
        a(f"v_pk_fma_f32 {a.vr('s', 2 * i, 2)}, {a.vr('s', 2 * i, 2)}, {a.sr('a8', 2)}, "
          f"{a.vr('u', 0, 2)} op_sel_hi:[1,0,0] neg_lo:[0,0,1] neg_hi:[0,0,1]")
    for q in range(8):
        a(f"v_ashr_pk_u8_i32 {a.v('p', q)}, v{s0 + 4 * q}, v{s0 + 4 * q + 1}, 8")
        a(f"v_ashr_pk_u8_i32 {a.v('p', q)}, v{s0 + 4 * q + 2}, v{s0 + 4 * q + 3}, 8 op_sel:[0,0,0,1]")


def _rescale(a: Asm) -> None:
    """O^T *= x (d_v / 4 v_pk_mul_f32 slots)."""
    for i in range(8 * a.p.pv_chunks):
        a(f"v_pk_mul_f32 {a.vr('o', 2 * i, 2)}, {a.vr('o', 2 * i, 2)}, {a.vr('x', 0, 2)} op_sel_hi:[1,0]")


def _cap(a: Asm) -> None:
    """The softcap (the capped loop bodies, stage_loops): each score S' of S^T becomes its
    capped score T' = 2^-es tanh(x) in place, x = S softcap_scale dq dk, tanh(x) = 1 - 2R with
    R = 1 / (1 + 2^(2 log2(e) x)) (``fp8_models.gfx950_capped_scores``, bit for bit):

        e = fp32(S' kc)         one v_pk_mul_f32 a pair    (kc from capa's high half)
        E = 2^e                 v_exp_f32                  (inf, or 0: R = 0 or 1, no NaN)
        D = fp32(E + 1)         one v_pk_add_f32 a pair    (capa's low half)
        R = 1 / D               v_rcp_f32
        T' = fp32(2^-es - 2^(1-es) R)   one v_pk_fma_f32 a pair (capb's halves)

    112 VALU slots a wave and block (16 + 32 + 16 + 32 + 16): the two transcendentals a score
    have no packed form and are 64 of them.  Each stage goes over all 32 registers before the
    next reads one, so a transcendental's result is read 15+ instructions later.  It runs
    before the masks (a masked score's cap would be finite): they set -inf over T'."""
    s0 = a.p.vgpr["s"]
    pairs = [a.vr("s", 2 * i, 2) for i in range(16)]
    capa, capb = a.sr("capa", 2), a.sr("capb", 2)
    for r in pairs:
        a(f"v_pk_mul_f32 {r}, {r}, {capa} op_sel:[0,1] op_sel_hi:[1,1]")
    for i in range(32):
        a(f"v_exp_f32 v{s0 + i}, v{s0 + i}")
    for r in pairs:
        a(f"v_pk_add_f32 {r}, {r}, {capa} op_sel_hi:[1,0]")
    for i in range(32):
        a(f"v_rcp_f32 v{s0 + i}, v{s0 + i}")
    for r in pairs:
        a(f"v_pk_fma_f32 {r}, {r}, {capb}, {capb} op_sel:[0,0,1] op_sel_hi:[1,0,1]")


def stage_softmax(a: Asm, block: str, masked: bool, left: bool = False, cap: bool = False,
                  bias: int | None = None) -> None:
    """Lean P, the row sums and the merge for one block.  VALU slots per wave and 64-key block
    (d_v = 128; a slot is 4 cycles, and a 32 x 128 block is 2 wave-blocks of 4 cycles a slot,
    so cycles per 32 x 128 = 8 x slots): block max 16 + exchange 3 + row sums 2 + U and
    merge 12 + packed FMA 16 + bytes 16 + O rescale d_v / 4 = 97 (776 cycles per 32 x 128);
    a boundary block (``masked``) adds 69 (the mask 65, NO_KEY 2, the merge's guard 2), one the
    window's left edge cuts (``left``) 69 more (its 64 compares and selects, its limit 5), or
    16 where its biases are made (``bias``: the set, _left_biases); the softcap (``cap``,
    :func:`_cap`) 112 more, first."""
    if cap:
        a.note("softcap: S' -> 2^-es tanh(x), in place")
        _cap(a)
    if masked:
        a.note("boundary block: scores of keys the row must not see become -inf")
        uncut = a.new_label("uncut")
        if left:    # the right edge's mask where it cuts the block too (block >= wfr, signed)
            a(f"s_cmp_lt_i32 {block}, {a.s('wfr')}")
            a(f"s_cbranch_scc1 {uncut}")
        _mask(a, block, "right")
        a.label(uncut)
    if left and bias is not None:
        a.note("the window's left edge: its biases (0 or -inf, _left_biases) added to the scores")
        _add_biases(a, bias)
    elif left:
        a.note("the window's left edge: scores of keys before the row's first become -inf")
        _mask(a, block, "left")
    a.note("block max of the row: 32 scores in-lane, then lanes l and l^32")
    _block_max(a, masked)
    a.note("U, the merge (R = T + ceil(M - T), x = 2^(R_old - R)) and P's scale")
    _reference(a, masked)
    a.note("P bytes: z = S' a8 - U on the fp32 subnormals, then its bits >> 8")
    _bytes(a)
    a.note("O^T *= x")
    _rescale(a)


#: The blocks the loop's prologue loads: K(0..2), V(0..1).
FIRST_LOADS = (("k", 0), ("v", 0), ("k", 1), ("v", 1), ("k", 2))


def stage_first_loads(a: Asm) -> None:
    """The loop's first loads, K(0..2) and V(0..1), for a call without a page table (a paged
    call's body makes its own after its set-up: stage_loops), as soon as the resources and
    the window allow: stage_scale's chain and the zeroing of O then run under them.  The
    blocks are counted from the literal 0 (the loop's p, whose register holds dq until
    stage_scale has read it)."""
    done = ".Lfirst_loads_done"
    a("s_waitcnt lgkmcnt(0)")     # stage_descales' loads, under the resources, lanes and window
    if _kernarg(a, "page_table") is not None:
        a(f"s_cmp_lg_u64 {a.sr('ptab', 2)}, 0")
        a(f"s_cbranch_scc1 {done}")
    for kind, block in FIRST_LOADS:
        for emit in dma_chunks(a, kind, "0", block):
            emit()
    a.label(done)


def stage_loop(a: Asm, paged: bool = False, capped: bool = False) -> None:
    """The ping-pong pipeline (module docstring), one of its four bodies (stage_loops: the plain
    one in line, the others after the kernel's end, each with labels of its own, LOOP_SUFFIX):
    with ``paged`` the loads by paged_chunks, their page-table entries read a phase ahead; with
    ``capped`` each softmax phase caps its scores first (:func:`_cap`).  Iteration p is two
    phases, each opened by
    a workgroup barrier (the case of the phase is dispatched before it):

    ====== ============================================ ====================================
    phase  group A (waves 0-3)                          group B (waves 4-7)
    ====== ============================================ ====================================
    2p     M(p): QK(p), PV(p-1), row sums; loads of     SM(p-1); wait for its loads
           V(p+2), K(p+3)
    2p+1   SM(p); wait for its loads                    M(p): as A's, with its loads
    ====== ============================================ ====================================

    Loads run three blocks ahead into four stages of K and of V: K(p+3) and V(p+2) overwrite
    K(p-1) and V(p-2), whose last reads were in phase 2p-1; each wave waits for its own at the
    end of its next vector phase (phase 2p+1 or 2p+2), and they are first read in phase 2p+4,
    by M(p+2), which reads the operands of M(p+3).  The vector phases hold the softmax and,
    where they have slack (``Plan.slack``), the first QK step's reads and the next loads'
    addresses; the matrix phases hold everything else that needs issue slots.  Each group's
    loop is unrolled over the four stages (u = p mod 4).  Every body but the plain one ends
    in a branch to the plain one's end."""
    sp, pb, qb = a.s("p"), a.s("pb"), a.s("qb")
    wave = a.s("wave")
    x = LOOP_SUFFIX[paged, capped]                 # the labels of this body
    a.note("prologue: K(0..2), V(0..1); both groups prefetch M(0) = QK(0)")
    a(f"s_mov_b32 {sp}, 0")
    early_entries = paged and _carried(a.p)     # K(0..3)'s entries at once, into t0..t3
    if early_entries:
        _fetch_entries(a, [("k", 0, b) for b in range(4)], into=[a.s("t0"), a.s("t0", 1), a.s("t2"), a.s("t2", 1)])
        a("s_waitcnt lgkmcnt(0)")
    for kind, block in FIRST_LOADS if paged else ():   # (dense: stage_first_loads)
        # each block's entries, then its loads (once a workgroup)
        chunks = [(kind, i, block) for i in range(a.p.k_slots if kind == "k" else a.p.v_slots)]
        if early_entries and kind == "k":
            a(f"s_mov_b32 {a.s('ent')}, {a.s('t0' if block < 2 else 't2', block % 2)}")
        elif kind == "k" or not _carried(a.p):
            _fetch_entries(a, chunks)
            a("s_waitcnt lgkmcnt(0)")
        for _, i, _ in chunks:
            for _, emit in paged_chunks(a, kind, i, block, block):
                emit()
    if early_entries:
        a(f"s_mov_b32 {a.s('ent')}, {a.s('t2', 1)}")      # M(0)'s: K(3)
    elif paged:
        _fetch_entries(a, _paged_fetches(a.p))           # M(0)'s: K(3) (and V(2))
    _zero_o(a)
    _biases_in_the_shadow(a)
    a("s_waitcnt vmcnt(0) lgkmcnt(0)" if paged else "s_waitcnt vmcnt(0)")
    _q_to_agprs(a)
    a("s_barrier")
    a(f"s_mov_b32 {sp}, 0")
    a(f"s_mov_b32 {pb}, -1")
    a(f"s_mov_b32 {qb}, 0")
    _by_case(a, lambda pv, qk: stage_prefetch(a, pv, qk))

    early = a.p.slack and not paged    # the loads' addresses made before the barrier, in t0..t3
    wait = "s_waitcnt vmcnt(0) lgkmcnt(0)" if paged else "s_waitcnt vmcnt(0)"

    def loads(u: int, pv=True, qk=True):
        """V(p+2) and K(p+3), as emitters for the MFMA shadows (of a phase with PV / QK)."""
        if paged:
            chunks = [paged_chunks(a, kind, i, ahead, (u + ahead) % STAGES)
                      for kind, i, ahead in _paged_phase_loads(a.p)]
            if a.p.slack:      # a shadow a step of a load (its address, then its issue)
                return [_run(part) for c in chunks for part in (c[:-3], c[-3:-1], c[-1:]) if part]
            entries = [(7 * len(_paged_fetches(a.p)),       # the next matrix phase's
                        lambda: _fetch_entries(a, _paged_fetches(a.p), 1))]
            return pack_shadows(a, sum(chunks, []), pv, qk, tail=entries)
        if early:
            return dma_chunks(a, "v", sp, 2, "t0") + dma_chunks(a, "k", sp, 3, "t2")
        return dma_chunks(a, "v", sp, 2) + dma_chunks(a, "k", sp, 3)

    def matrix(with_loads: bool, u: int):
        """Barrier, then M(p), which also reads the first operands of M(p + 1).  The case
        is dispatched before the barrier, so the first MFMA follows it directly.  With
        ``slack`` the loads' addresses are made here too, at the end of the vector phase
        (10 SALU that would otherwise sit in the first two MFMA shadows, behind the LDS
        reads there: the last wave of the four in the LDS queue ran 40 cycles late)."""
        a(f"s_sub_u32 {pb}, {sp}, 1")
        a(f"s_mov_b32 {qb}, {sp}")
        if early and with_loads:
            dma_setup(a, "v", sp, 2, a.s("t0"), a.s("t0", 1))
            dma_setup(a, "k", sp, 3, a.s("t2"), a.s("t2", 1))

        def open_phase():
            a("s_barrier")
            a("s_setprio 1")
        _by_case(a, lambda pv, qk: stage_matrix(a, pv, qk, loads(u, pv is not None, qk is not None)
                                                if with_loads else None, u,
                                                packed=paged and not a.p.slack),
                 none=(lambda: [emit() for emit in loads(u)]) if with_loads else None,
                 prefix=open_phase)
        a("s_setprio 0")

    def vector(block_of_p: int, u_next: int):
        """Barrier, then SM(q), q = p - block_of_p, if this wave computes block q: an
        interior block (q < wfull, one compare on the common path), a block the right edge
        cuts (the causal diagonal, the sequence's end, a window's right bound) or, with a
        window (stage_window), one its left edge cuts: two compares on the path of no block,
        the masked path placed after the kernel's end, so that the plain loop's code is as it
        was but for those two SALU.
        Opened by the reads that :func:`reads_ahead` gives the vector phase (of M(q + 1),
        whose K is in stage u_next)."""
        both = _steps(a.p, True, True)

        def fetch():
            if paged and a.p.slack:     # the next matrix phase's entries (M(p + 1) or M(p))
                _fetch_entries(a, _paged_fetches(a.p), 1 - block_of_p)

        def reads():
            _address(a, "k", u_next)
            _address(a, "v", (u_next - 1) % STAGES)
            for j, part in (reads_ahead(a.p)[1] if a.p.ahead else []):
                _read(a, both[j], j, (part,))
            fetch()
        masked, no_sm, done = a.new_label("masked"), a.new_label("no_sm"), a.new_label("sm_done")
        left = a.new_label("left_edge")
        a(f"s_sub_u32 {pb}, {sp}, {a.s('wlo_p')}")       # q - wlo (stage_window; plain: q)
        a(f"s_cmp_lt_u32 {pb}, {a.s('wfull')}")
        a(f"s_cbranch_scc0 {masked}")
        a("s_barrier")
        reads()
        stage_softmax(a, pb, masked=False, cap=capped)
        a(f"s_branch {done}")
        a.label(masked)
        a(f"s_cmp_lt_u32 {pb}, {a.s('wnbv')}")
        a(f"s_cbranch_scc0 {no_sm}")
        a("s_barrier")
        reads()
        stage_softmax(a, pb, masked=True, cap=capped)
        a(f"s_branch {done}")
        a.label(no_sm)
        a.note("q < lcut: the window's left edge cuts the block (never without a window), "
               "out of line; else no block: the barrier")
        a(f"s_cmp_lt_u32 {sp}, {a.s('lcut_p')}")
        a(f"s_cbranch_scc1 {left}")
        a("s_barrier")
        fetch()
        a.label(done)

        def left_edge():
            """A block before wlo: wholly before the window of every row of the wave (its
            first row's lo at or past the block's end: wleft - 64 pb >= 64) a bare phase
            that keeps the row state (P = 0, x = 1: the next row sums and PV add nothing),
            else the masked softmax with the left edge."""
            hidden = a.new_label("hidden")
            a.label(left)
            a(f"s_lshl_b32 {a.s('t4')}, {pb}, {int(math.log2(BLOCK_N))}")
            a(f"s_sub_i32 {a.s('t5')}, {a.s('wleft')}, {a.s('t4')}")
            a(f"s_cmp_ge_i32 {a.s('t5')}, {BLOCK_N}")
            a(f"s_cbranch_scc1 {hidden}")
            sets = (0, 1) if "lbias" in a.p.vgpr else (None,)
            if len(sets) > 1:     # pb = -1 or -2 (the others are hidden): the set, before the barrier
                second = a.new_label("bias2")
                a(f"s_cmp_eq_i32 {pb}, -1")
                a(f"s_cbranch_scc0 {second}")
            for n in sets:
                if n == 1:
                    a.label(second)
                a("s_barrier")
                reads()
                stage_softmax(a, pb, masked=True, left=True, cap=capped, bias=n)
                a(f"s_branch {done}")
            a.label(hidden)
            a("s_barrier")
            reads()
            a.note("a block no row of the wave sees: the last block's row sums, then x = 1, P = 0")
            stage_row_sums(a)
            a(f"v_mov_b32 {a.v('x')}, 1.0")
            for q in range(8):
                a(f"v_mov_b32 {a.v('p', q)}, 0")
            a(f"s_branch {done}")
        a.out_of_line.append(left_edge)

    def next_iteration(loop: str | None):
        """p += 1; leave the loop after p = nb (or go round when ``loop`` is given)."""
        a(f"s_add_u32 {sp}, {sp}, 1")
        a(f"s_cmp_le_u32 {sp}, {a.s('nb')}")
        if loop is not None:
            a(f"s_cbranch_scc1 {loop}")
        else:
            a(f"s_cbranch_scc0 .Lloop_end{x}")

    a.note("group A: phase 2p M(p) with its loads, phase 2p+1 SM(p) and the wait for them; "
           "every phase opens with a barrier; unrolled over the 4 stages (p mod 4 = u)")
    a(f"s_bitcmp1_b32 {wave}, 2")
    a(f"s_cbranch_scc1 .Lgroup_b{x}")
    a.label(f".Lloop_a{x}")
    for u in range(STAGES):
        matrix(True, u)
        vector(0, (u + 1) % STAGES)
        a(wait)
        next_iteration(f".Lloop_a{x}" if u == STAGES - 1 else None)
    a(f"s_branch .Lloop_end{x}")
    a.note("group B: phase 2p SM(p-1) and the wait for its loads, phase 2p+1 M(p) with loads; "
           "its first vector phase (p = 0) has no block: a barrier, then the loop from M(0), so "
           "that every vector phase in the loop has q >= 0")
    a.label(f".Lgroup_b{x}")
    a("s_barrier")
    a(f"s_branch .Lloop_b_m0{x}")
    a.label(f".Lloop_b{x}")
    for u in range(STAGES):
        vector(1, u)
        a(wait)
        if u == 0:
            a.label(f".Lloop_b_m0{x}")
        matrix(True, u)
        next_iteration(f".Lloop_b{x}" if u == STAGES - 1 else None)
    a.label(f".Lloop_end{x}")
    if paged:     # the entries read in the last matrix phase land
        a("s_waitcnt lgkmcnt(0)")
    if x:         # then the plain loop's end
        _jump(a, ".Lloop_end")
        return
    a("s_waitcnt vmcnt(0)")       # the loads past the last block land before the end


#: Each loop body's label suffix, by (paged, capped).
LOOP_SUFFIX = {(False, False): "", (True, False): "_paged", (False, True): "_cap", (True, True): "_paged_cap"}


def _jump(a: Asm, label: str) -> None:
    """A branch to ``label`` however far (s_branch reaches 2^15 instructions, 128 KiB; four loop
    bodies are up to 300 KiB): the pc plus the distance, through t0 (free at every use: the
    bodies' entries and ends, where no loop value is live).  5 SALU."""
    here = a.new_label("pc")
    t0, t1 = a.s("t0"), a.s("t0", 1)
    a(f"s_getpc_b64 {a.sr('t0', 2)}")
    a.label(here)
    a(f"s_add_u32 {t0}, {t0}, ({label}-{here})&4294967295")
    a(f"s_addc_u32 {t1}, {t1}, ({label}-{here})>>32")
    a(f"s_setpc_b64 {a.sr('t0', 2)}")


def stage_loops(a: Asm) -> None:
    """The loop body a call runs, chosen once by uniform branches (the plain path falls through
    a compare-and-branch pair a feature to the plain loop as it was):

    ========== ====================================== ==========================================
    page table softcap 0                              softcap not 0
    ========== ====================================== ==========================================
    null       plain, in line                         .Lloop_cap: capped
    not null   .Lpaged: set-up, paged                 .Lpaged: set-up, then .Lpaged_cap: both
    ========== ====================================== ==========================================

    The branches land near (after s_endpgm, with the other paths), and jump on (:func:`_jump`)
    to the bodies, placed last (``Asm.far``), each followed by its own out-of-line paths (its
    left edges) and ending in a jump to the plain body's end, before the epilogue.  The paged
    set-up (:func:`_paged_setup`) writes magic and lastg over caparg, so the paged path decides
    the softcap before it and keeps the answer in capa's low half: 1.0 where the call has a
    softcap (stage_scale's cap path), zeroed here where it has none (no body reads capa
    then); 4 SALU."""
    names = {k.name for k in kernargs(a.p.v)}
    pageable, cappable = "page_table" in names, "softcap" in names
    if pageable:
        a.note("a paged cache: the paged set-up and loop (out of line)")
        a(f"s_cmp_lg_u64 {a.sr('ptab', 2)}, 0")
        a("s_cbranch_scc1 .Lpaged")
    if cappable:
        a.note("a softcap: the capped loop (out of line)")
        a(f"s_cmp_lg_u32 {a.s('caparg')}, 0")
        a("s_cbranch_scc1 .Lloop_cap")
    stage_loop(a)

    def capped():
        a.label(".Lloop_cap")
        _jump(a, ".Lbody_cap")

    def paged():
        a.label(".Lpaged")
        flag = a.s("capa")
        if cappable:
            a.note("the softcap's flag, kept over the set-up: capa's low half (1.0), else 0")
            a(f"s_cmp_lg_u32 {a.s('caparg')}, 0")
            a(f"s_cselect_b32 {flag}, {flag}, 0")
        _paged_setup(a)
        if cappable:
            a(f"s_cmp_lg_u32 {flag}, 0")
            a("s_cbranch_scc1 .Lpaged_cap")
        _jump(a, ".Lbody_paged")
        if cappable:
            a.label(".Lpaged_cap")
            _jump(a, ".Lbody_paged_cap")

    def body(paged: bool, capped: bool):
        def emit():
            a.label(f".Lbody{LOOP_SUFFIX[paged, capped]}")
            start = len(a.out_of_line)
            stage_loop(a, paged=paged, capped=capped)
            while len(a.out_of_line) > start:      # its paths, near it
                a.out_of_line.pop(start)()
        return emit
    for path, on in ((capped, cappable), (paged, pageable)):
        if on:
            a.out_of_line.append(path)
    a.far += [body(pg, cp) for pg, cp in LOOP_SUFFIX
              if (pg or cp) and (pageable or not pg) and (cappable or not cp)]


def stage_sink(a: Asm) -> None:
    """The query head's sink logit z joins the row (``fp8_models._join_sinks``), read where
    the ("sinks", "ptr") argument is not null (a uniform branch; 14 VALU + the O rescale's
    d_v / 4 slots, once a workgroup).  In the row's log2 units the sink sits at ``zs = fp32(z
    fp32(log2 e)) - lse_offset`` (the recipe's offset is 0: zs is the model's, bit for bit).
    Below the reference R it adds ``256 2^(zs - R)`` to l; above, the row moves to it: O and
    l times ``a = 2^(R - zs)``, then ``l += 256``, ``R = zs`` (no term overflows, whichever
    dominates; a row that saw no key gets l = 256, O = 0: zeros, and the sink's LSE).  The
    model compares zs with M and rounds a float64 exp2; the kernel compares with R (R - M in
    [0, 1)) and takes v_exp_f32: l differs by fp32 roundings (a few 2^-24 relative), O by
    the same factor, the LSE by about 2^-23 in log2 units."""
    if not any(k.name == "sinks" for k in kernargs(a.p.v)):
        return
    ptr = a.sr("sinkp", 2)     # loaded by stage_descales
    a(f"s_cmp_lg_u64 {ptr}, 0")
    a("s_cbranch_scc1 .Lsink")
    a.label(".Lsink_done")
    a.out_of_line.append(lambda: _join_sink(a, ptr))


def _join_sink(a: Asm, ptr: str) -> None:
    """stage_sink's arithmetic, placed after the kernel's end (without sinks the epilogue
    falls through)."""
    a.label(".Lsink")
    z = a.s("t4")
    a(f"s_lshl_b32 {z}, s3, 2")                       # fp32 sinks[query head]
    a(f"s_load_dword {z}, {ptr}, {z}")
    a("s_waitcnt lgkmcnt(0)")
    zs, e, w, c256 = a.v("d"), a.v("e"), a.v("kf"), a.v("t")
    r, l, x = a.v("r"), a.v("l"), a.v("x")
    a(f"v_mov_b32 {zs}, {z}")
    a(f"v_mul_f32 {zs}, {_hex(np.float32(math.log2(math.e)))}, {zs}")
    if RECIPE.lse_offset:
        a(f"v_add_f32 {zs}, {_hex(-RECIPE.lse_offset)}, {zs}")
    a(f"v_cmp_gt_f32 vcc, {zs}, {r}")                 # the sink is above R: the row moves
    a(f"v_sub_f32 {e}, {zs}, {r}")
    a(f"v_exp_f32 {w}, {e}")                          # 2^(zs - R)
    a(f"v_exp_f32 {x}, -{e}")                         # 2^(R - zs)
    a(f"v_mov_b32 {c256}, {_hex(RECIPE.p_shift)}")
    a(f"v_ldexp_f32 {w}, {w}, {int(math.log2(RECIPE.p_shift))}")
    a(f"v_cndmask_b32 {x}, 1.0, {x}, vcc")
    a(f"v_cndmask_b32 {w}, {w}, {c256}, vcc")
    a(f"v_mul_f32 {l}, {l}, {x}")
    a(f"v_add_f32 {l}, {l}, {w}")
    a(f"v_cndmask_b32 {r}, {r}, {zs}, vcc")
    _rescale(a)
    a("s_branch .Lsink_done")


def stage_epilogue(a: Asm) -> None:
    """out = O^T * dv / l in bf16 (l = 0: zeros), LSE = ln2 (R + log2 l - 8), after the sink
    joins the row (stage_sink)."""
    p, v = a.p, a.p.v
    a.nops(20)     # the last PV MFMA's result
    stage_row_sums(a)
    stage_sink(a)
    l, t = a.v("l"), a.v("tmp")
    a(f"s_lshl_b32 {a.s('dl')}, s2, {int(math.log2(BLOCK_M))}")      # the first row again
    _resource(a, "rq", "o", "s3", "qf", "cu_seqlens_q", a.s("sq"), v.d_v, 2, a.s("dl"))
    a(f"v_cmp_lt_f32 vcc, 0, {l}")
    a(f"v_rcp_f32 {t}, {l}")
    a("s_nop 0")
    a(f"v_mul_f32 {t}, {a.s('dv')}, {t}")
    a(f"v_cndmask_b32 {t}, 0, {t}, vcc")
    a(f"v_mov_b32 {a.v('inv')}, {t}")
    for c in range(p.pv_chunks):
        for q in range(4):
            o = 16 * c + 4 * q
            for k in (0, 2):
                a(f"v_pk_mul_f32 {a.vr('o', o + k, 2)}, {a.vr('o', o + k, 2)}, {a.vr('inv', 0, 2)} "
                  "op_sel_hi:[1,0]")
            a(f"v_cvt_pk_bf16_f32 {a.v('bf')}, {a.v('o', o)}, {a.v('o', o + 1)}")
            a(f"v_cvt_pk_bf16_f32 {a.v('bf', 1)}, {a.v('o', o + 2)}, {a.v('o', o + 3)}")
            a(f"buffer_store_dwordx2 {a.vr('bf', 0, 2)}, {a.v('ooff')}, {a.sr('rq', 4)}, 0 offen "
              f"offset:{64 * c + 16 * q}")
    a(f"s_cmp_lg_u64 {a.arg('lse', 2)}, 0")
    a("s_cbranch_scc0 .Lend")
    lse_const = -math.log2(RECIPE.p_shift) + RECIPE.lse_offset
    b = p.sgpr["rq"]
    a(f"s_mov_b64 s[{b}:{b + 1}], {a.arg('lse', 2)}")
    for idx, stride in (("s4", "lse_stride_b"), ("s3", "lse_stride_h")):   # fp32 elements
        a(f"s_lshl_b64 {a.sr('t0', 2)}, {a.arg(stride, 2)}, 2")
        _madd64(a, f"s{b}", idx, a.s("t0"))
    a(f"s_add_u32 {a.s('t0')}, {a.s('qf')}, {a.s('dl')}")   # the workgroup's first row (< 2^31)
    a(f"s_mov_b32 {a.s('t0', 1)}, 0")
    a(f"s_lshl_b64 {a.sr('t0', 2)}, {a.sr('t0', 2)}, 2")
    a(f"s_add_u32 s{b}, s{b}, {a.s('t0')}")
    a(f"s_addc_u32 s{b + 1}, s{b + 1}, {a.s('t0', 1)}")
    a(f"s_and_b32 s{b + 1}, s{b + 1}, 0xffff")
    a(f"s_sub_u32 s{b + 2}, {a.s('sq')}, {a.s('dl')}")      # its rows: at most BLOCK_M
    a(f"s_min_u32 s{b + 2}, s{b + 2}, {BLOCK_M}")
    a(f"s_lshl_b32 s{b + 2}, s{b + 2}, 2")
    a(f"s_mov_b32 s{b + 3}, {RSRC_WORD3}")
    a(f"v_log_f32 {t}, {l}")
    a("s_nop 0")
    a(f"v_add_f32 {t}, {a.v('r')}, {t}")
    a(f"v_add_f32 {t}, {_hex(lse_const)}, {t}")
    a(f"v_mul_f32 {t}, {_hex(math.log(2))}, {t}")
    a("s_mov_b32 exec_hi, 0")                     # lanes 0..31 hold the 32 rows
    a(f"v_and_b32 {a.v('mx')}, 31, v0")                 # LSE byte offset: 4 x row in the WG
    a(f"v_add_u32 {a.v('mx')}, {a.s('wrow0')}, {a.v('mx')}")
    a(f"v_subrev_u32 {a.v('mx')}, {a.s('dl')}, {a.v('mx')}")
    a(f"v_lshlrev_b32 {a.v('mx')}, 2, {a.v('mx')}")
    a(f"buffer_store_dword {t}, {a.v('mx')}, {a.sr('rq', 4)}, 0 offen")
    a("s_mov_b32 exec_hi, -1")


# --------------------------------------------------------------------------------------
# The code object

def _descriptor(p: Plan) -> str:
    v = p.v
    accum = -(-p.n_vgpr // 4) * 4
    return "\n".join([
        ".rodata", ".p2align 6", f".amdhsa_kernel {v.symbol}",
        f"  .amdhsa_group_segment_fixed_size {p.lds_bytes}",
        "  .amdhsa_private_segment_fixed_size 0",
        f"  .amdhsa_kernarg_size {kernarg_size(kernargs(v))}",
        "  .amdhsa_user_sgpr_count 2",
        "  .amdhsa_user_sgpr_kernarg_segment_ptr 1",
        "  .amdhsa_system_sgpr_workgroup_id_x 1",
        "  .amdhsa_system_sgpr_workgroup_id_y 1",
        "  .amdhsa_system_sgpr_workgroup_id_z 1",
        "  .amdhsa_system_vgpr_workitem_id 0",
        f"  .amdhsa_next_free_vgpr {accum + p.n_agpr}",
        f"  .amdhsa_accum_offset {accum}",
        f"  .amdhsa_next_free_sgpr {p.n_sgpr}",
        "  .amdhsa_reserve_vcc 1",
        # MODE, chosen: fp32 and fp16/64 denormals kept (the model is IEEE fp32), round to
        # nearest even, IEEE mode off, DX10 clamp on (a clamped NaN is 0), FP16_OVFL off (no
        # conversion to FP8 happens on the device; an overflowing MFMA gives inf, not MAX).
        "  .amdhsa_float_round_mode_32 0",
        "  .amdhsa_float_round_mode_16_64 0",
        "  .amdhsa_float_denorm_mode_32 3",
        "  .amdhsa_float_denorm_mode_16_64 3",
        "  .amdhsa_ieee_mode 0",
        "  .amdhsa_dx10_clamp 1",
        "  .amdhsa_fp16_overflow 0",
        "  .amdhsa_tg_split 0",
        ".end_amdhsa_kernel",
    ])


def _metadata(p: Plan) -> str:
    v = p.v
    args = []
    for k in kernargs(v):
        if k.type == "ptr":
            args.append(f"      - {{.name: {k.name}, .offset: {k.offset}, .size: 8, "
                        ".value_kind: global_buffer, .address_space: global}")
        else:
            vt = {"i64": "i64", "i32": "i32", "f32": "f32"}[k.type]
            args.append(f"      - {{.name: {k.name}, .offset: {k.offset}, .size: {k.size}, "
                        f".value_kind: by_value, .value_type: {vt}}}")
    accum = -(-p.n_vgpr // 4) * 4
    return "\n".join([
        ".amdgpu_metadata", "---", "amdhsa.version: [1, 2]",
        "amdhsa.target: amdgcn-amd-amdhsa--gfx950", "amdhsa.kernels:",
        f"  - .name: {v.symbol}", f"    .symbol: {v.symbol}.kd",
        f"    .kernarg_segment_size: {kernarg_size(kernargs(v))}",
        "    .kernarg_segment_align: 8",
        f"    .group_segment_fixed_size: {p.lds_bytes}",
        "    .private_segment_fixed_size: 0", "    .wavefront_size: 64",
        f"    .sgpr_count: {p.n_sgpr + 2}", f"    .vgpr_count: {accum + p.n_agpr}",
        f"    .agpr_count: {p.n_agpr}",
        f"    .max_flat_workgroup_size: {WAVES * 64}",
        f"    .reqd_workgroup_size: [{WAVES * 64}, 1, 1]",
        "    .args:", *args, "...", ".end_amdgpu_metadata", ""])


def emit(v: Variant) -> str:
    """The complete assembly source of gfx950 FP8 variant ``v``."""
    p = plan(v)
    a = Asm(p)
    head = [f"// zyfa generated: {v.name} (generator/gfx950_fp8.py)",
            f"// VGPR {p.n_vgpr} + AGPR {p.n_agpr}, SGPR {p.n_sgpr}, LDS {p.lds_bytes} bytes, "
            f"operand buffers {p.frag_bufs}",
            '.amdgcn_target "amdgcn-amd-amdhsa--gfx950"', ".amdhsa_code_object_version 6",
            ".text", f".globl {v.symbol}", ".p2align 8", f".type {v.symbol},@function",
            f"{v.symbol}:"]
    stage_arguments(a)
    stage_work(a)
    stage_sequence(a)
    stage_descales(a)
    stage_resources(a)
    stage_lanes(a)
    stage_window(a)
    stage_first_loads(a)
    stage_scale(a)
    stage_loops(a)
    stage_epilogue(a)
    a.label(".Lend")
    a("s_endpgm")
    for path in a.out_of_line:
        path()
    for body in a.far:
        body()
    return "\n".join(head + a.lines + [_descriptor(p), _metadata(p)]) + "\n"
