"""The kernel catalogue: every variant zyfa ships, as data.

A :class:`Variant` names one kernel (arch, dtype, head dims, causal). Everything
else about it -- the kernel arguments, their C layout, the launch grid, the
tile shape -- is derived here from that description, and is what the generator
emits, what ``build.py`` records in the manifest, and what the runtime packs
from.  The argument layout is written down in exactly one place: ``kernargs``.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

ARCHES = ("sm_90a", "gfx950")
DTYPES = ("bf16", "fp8_e4m3")
HEAD_DIMS = ((64, 64), (128, 128), (192, 128), (256, 256))

#: Vendor of each arch, i.e. the driver backend that can run it.
VENDOR = {"sm_90a": "cuda", "gfx950": "hip"}

#: Toolkit each arch's code objects are built for and pinned to.
TOOLKIT = {"sm_90a": "CUDA 13.0", "gfx950": "ROCm 7.2.3"}


def parse_toolkit(toolkit: str) -> tuple[str, tuple[int, ...]]:
    """``"CUDA 13.0"`` -> ``("cuda", (13, 0))``, ``"ROCm 7.2.3"`` -> ``("rocm", (7, 2, 3))``."""
    family, _, version = toolkit.strip().partition(" ")
    try:
        numbers = tuple(int(x) for x in version.strip().split("."))
    except ValueError:
        numbers = ()
    if family.lower() not in ("cuda", "rocm") or len(numbers) < 2:
        raise ValueError(f"toolkit {toolkit!r} is not 'CUDA <major>.<minor>' or "
                         "'ROCm <major>.<minor>[.<patch>]'")
    return family.lower(), numbers


def distribution_name(toolkit: str) -> str:
    """The wheel that carries code objects pinned to ``toolkit``, the pin in its name (PyPI
    refuses local versions such as ``0.1.0+cu13``): ``"CUDA 13.0"`` -> ``zyfa-cuda13`` (a
    driver runs cubins of its own CUDA major and older), ``"ROCm 7.2.3"`` -> ``zyfa-rocm7-2``
    (HIP code objects are pinned to a ROCm major.minor).  See docs/distribution.md."""
    family, v = parse_toolkit(toolkit)
    return f"zyfa-cuda{v[0]}" if family == "cuda" else f"zyfa-rocm{v[0]}-{v[1]}"


#: Code-object file suffix per arch.
SUFFIX = {"sm_90a": ".cubin", "gfx950": ".hsaco"}


class CodeObject:
    """What a built kernel's names derive from its ``name`` and ``arch``: an attention
    Variant's and an AuxKernel's alike."""

    @property
    def symbol(self) -> str:
        """The kernel's entry-point symbol in its code object (extern "C")."""
        return "zyfa_" + self.name

    @property
    def vendor(self) -> str:
        return VENDOR[self.arch]

    @property
    def filename(self) -> str:
        return self.name + SUFFIX[self.arch]


@dataclasses.dataclass(frozen=True, order=True)
class Variant(CodeObject):
    arch: str
    dtype: str
    d_qk: int
    d_v: int
    causal: bool
    #: The serving specialisation (SERVING_FEATURES_OF): the kernel of the same (arch, dtype,
    #: head dims, causal) with the serving features compiled in, beside a plain kernel that
    #: stays as measured; the runtime takes it for a call that needs one of them.
    serving: bool = False
    #: The short-prompt specialisation (SHORT_VARIANTS_OF): the plain kernel with persistent CTAs,
    #: which the runtime takes for a call whose sequences have at most SHORT_KEYS keys, beside a
    #: plain kernel of a CTA a tile that stays as measured on long ones.
    short: bool = False
    #: The softcap specialisation of a serving variant: the serving kernel with the softcap
    #: compiled in, which the runtime takes for a call with a softcap.  The serving kernel
    #: itself has none: its test of the softcap's argument before each block and the capping
    #: code cost the windowed, sink and paged calls 1-2 % (docs/sm90a.md).
    softcap: bool = False
    #: The FP8 inputs in f16 tensor math (F16_VARIANTS_OF): the BF16 body reading e4m3 Q, K and V,
    #: each tile converted exactly to f16 in shared memory by the producer (e4m3 is a subset of
    #: f16), P in f16, no V^T pre-pass; the runtime takes it for a call whose sequences have at
    #: most F16_KEYS keys, where the FP8 kernels' cost is their pre-pass and their causal
    #: diagonal's two terms, not their tensor rate.
    f16: bool = False

    def __post_init__(self) -> None:
        if self.arch not in ARCHES:
            raise ValueError(f"unknown arch {self.arch!r}; known: {ARCHES}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {DTYPES}")
        if (self.d_qk, self.d_v) not in HEAD_DIMS:
            raise ValueError(f"unsupported head dims ({self.d_qk}, {self.d_v}); supported: {HEAD_DIMS}")
        if self.serving and (self.arch, self.dtype) not in SERVING_FEATURES_OF:
            raise ValueError(f"no serving variants of {self.arch} {self.dtype}; those of "
                             f"{sorted(SERVING_FEATURES_OF)} only")
        if self.short and (self.serving or (self.d_qk, self.d_v) not in SHORT_VARIANTS_OF.get((self.arch, self.dtype), ())):
            raise ValueError(f"no short-prompt variant of {self.arch} {self.dtype} d{self.d_qk}x{self.d_v}"
                             f"{' serving' if self.serving else ''}; those of {SHORT_VARIANTS_OF} only")
        if self.softcap and not self.serving:
            raise ValueError("a softcap variant is a serving variant's specialisation (serving=True)")
        if self.f16 and (self.serving or self.short
                         or (self.d_qk, self.d_v) not in F16_VARIANTS_OF.get((self.arch, self.dtype), ())):
            raise ValueError(f"no f16-math variant of {self.arch} {self.dtype} d{self.d_qk}x{self.d_v}"
                             f"{' serving' if self.serving else ''}{' short' if self.short else ''}; "
                             f"those of {F16_VARIANTS_OF} only (plain)")

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        return (f"fwd_{self.arch}_{self.dtype}_d{self.d_qk}x{self.d_v}_{mask}" + ("_serving" if self.serving else "")
                + ("_softcap" if self.softcap else "") + ("_short" if self.short else "")
                + ("_f16" if self.f16 else ""))

    @property
    def tile(self) -> "Tile":
        return tile_for(self)

    @property
    def built_from(self) -> str:
        """How the code object is produced: HIP/CUDA C++, or the FP8 assembly generator."""
        if self.arch == "gfx950" and self.dtype == "fp8_e4m3":
            return "asm-generator"
        return "hip" if self.vendor == "hip" else "cuda"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Variant":
        return cls(arch=d["arch"], dtype=d["dtype"], d_qk=int(d["d_qk"]), d_v=int(d["d_v"]),
                   causal=bool(d["causal"]), serving=bool(d.get("serving", False)),   # absent: before serving
                   short=bool(d.get("short", False)), softcap=bool(d.get("softcap", False)),
                   f16=bool(d.get("f16", False)))


def all_variants() -> list[Variant]:
    """The variants of the catalogue, in a fixed order: the 32 plain ones (every arch, dtype,
    head dims, causal or full), then the serving ones (SERVING_FEATURES_OF: 8 a listed
    (arch, dtype), in the plain ones' order), then the short-prompt ones (SHORT_VARIANTS_OF:
    causal and full of each listed head dims, in the plain ones' order), then the serving ones'
    softcap specialisations (in the serving ones' order), then the f16-math ones (F16_VARIANTS_OF,
    in the plain ones' order)."""
    plain = [Variant(a, t, dq, dv, c)
             for a, t, (dq, dv), c in itertools.product(ARCHES, DTYPES, HEAD_DIMS, (False, True))]
    serving = [dataclasses.replace(v, serving=True) for v in plain if (v.arch, v.dtype) in SERVING_FEATURES_OF]
    return (plain + serving
            + [dataclasses.replace(v, short=True) for v in plain
               if (v.d_qk, v.d_v) in SHORT_VARIANTS_OF.get((v.arch, v.dtype), ())]
            + [dataclasses.replace(v, softcap=True) for v in serving]
            + [dataclasses.replace(v, f16=True) for v in plain
               if (v.d_qk, v.d_v) in F16_VARIANTS_OF.get((v.arch, v.dtype), ())])


#: The short-prompt variants (Variant.short) of each (arch, dtype) that has them: their head
#: dims.  sm_90a FP8 d128: at 128-512 keys a tile is one to four blocks, and a CTA a tile leaves
#: the SM idle from its last product through its epilogue, the next CTA's start and its first
#: copies; persistent CTAs overlap those with the next tile (1.09-1.40x at B16 S512 to B64
#: S128, docs/sm90a.md), but ran 1-3 % slower than a CTA a tile from 8k keys on.
SHORT_VARIANTS_OF = {("sm_90a", "fp8_e4m3"): ((128, 128),)}

#: The most keys a call's sequences may have (seqlen_k, max_seqlen_k) for the runtime to take a
#: short-prompt variant (plan.variant_for; each such manifest entry's ``short.max_seqlen_k``):
#: at 2k keys the persistent kernel was 5 % faster causal and even non-causal, at 4k 1 % slower.
SHORT_KEYS = 2048


#: The f16-math variants (Variant.f16) of each (arch, dtype) that has them: their head dims.
#: sm_90a FP8 d128: at 128-256 keys a tile is one or two blocks, and the FP8 kernels' V^T
#: pre-pass and their causal diagonal's two terms cost more than FP8's tensor rate saves
#: (docs/sm90a.md); converted to f16 in shared memory, the e4m3 inputs keep their bytes' traffic.
F16_VARIANTS_OF = {("sm_90a", "fp8_e4m3"): ((128, 128),)}

#: The most keys a call's sequences may have for the runtime to take an f16-math variant
#: (plan.variant_for; each such manifest entry's ``f16.max_seqlen_k``).
F16_KEYS = 256


def f16_variant(v: Variant) -> "Variant | None":
    """The f16-math variant of plain ``v``'s (arch, dtype, head dims, causal), None where the
    catalogue has none (F16_VARIANTS_OF)."""
    if v.serving or v.short or (v.d_qk, v.d_v) not in F16_VARIANTS_OF.get((v.arch, v.dtype), ()):
        return None
    return dataclasses.replace(v, f16=True)


def short_variant(v: Variant) -> "Variant | None":
    """The short-prompt variant of plain ``v``'s (arch, dtype, head dims, causal), None where the
    catalogue has none (SHORT_VARIANTS_OF)."""
    if v.serving or v.f16 or (v.d_qk, v.d_v) not in SHORT_VARIANTS_OF.get((v.arch, v.dtype), ()):
        return None
    return dataclasses.replace(v, short=True)


def serving_variant(v: Variant, softcap: bool = False) -> "Variant | None":
    """The serving variant of plain ``v``'s (arch, dtype, head dims, causal), its softcap
    specialisation where ``softcap``; None where that (arch, dtype) has none (its plain kernels
    list their features themselves: FEATURES_OF)."""
    if (v.arch, v.dtype) not in SERVING_FEATURES_OF:
        return None
    return dataclasses.replace(v, serving=True, softcap=softcap)


# --------------------------------------------------------------------------------------
# Tiles: the work decomposition each kernel is compiled for.

@dataclasses.dataclass(frozen=True)
class Tile:
    block_m: int        # query rows per workgroup / CTA
    block_n: int        # keys per inner iteration
    threads: int        # threads per workgroup / CTA
    dynamic_smem: int   # dynamic shared memory bytes (CUDA); 0 where LDS is static (HIP)
    stages: int = 1     # K/V tiles in flight in shared memory (sm_90a's copy ring)
    persistent: bool = False   # sm_90a: one CTA an SM taking tiles from a counter (grid_rule, tiles_rule)
    #: sm_90a BF16: l, the row sum of the bf16-rounded P, from the PV product (N = d_v + 8 over a
    #: block of ones after each V stage), and O and LSE normalised by it (FP8's rounded sums)
    pv_row_sums: bool = False
    #: sm_90a FP8 non-causal: the tiles past the last whole wave are cut by keys into as many
    #: equal pieces as the device has SMs, a CTA each of a second kernel (split_tail_symbol),
    #: which may end one tile and start the next; each piece of a cut tile writes its O / l, l
    #: and frame to a workspace and the tile's last piece to finish merges them (plan.tail_plan)
    split_tail: bool = False
    #: sm_90a: O written by TMA (tmap_o: boxes of a consumer's 64 rows) from shared memory --
    #: the persistent BF16 body through the tile's Q buffer; the FP8 short and serving variants
    #: at d_v = 128 through a staging tile of their own (block_m x d_v bf16) where it fits
    #: beside their deepest ring
    tma_o: bool = False


def sm90_body(v: Variant) -> str:
    """Which CUDA body builds an sm_90a variant (generator/kernel_source.BODY); both have a
    producer warpgroup and two consumer warpgroups in ping-pong:

    * ``"ws"`` -- cuda/flash_fwd_ws.cuh, BF16: WGMMA, hardware exp2;
    * ``"fp8-ws"`` -- cuda/flash_fwd_fp8_ws.cuh, FP8: Lean P, V^T from a pre-pass kernel, K by TMA.

    An f16-math variant (Variant.f16) is the ``"ws"`` body reading e4m3 tiles (its kFp8In).
    """
    if v.vendor != "cuda":
        raise ValueError(f"{v.name} is not an sm_90a variant")
    return "ws" if v.dtype == "bf16" or v.f16 else "fp8-ws"


#: Dynamic shared memory one sm_90a CTA may have (227 KiB).
SM90_MAX_SMEM = 227 * 1024
#: Query rows of one consumer warpgroup of the sm_90a bodies (the M of its WGMMAs).
SM90_CONSUMER_ROWS = 64


def tile_for(v: Variant) -> Tile:
    if v.vendor == "cuda" and sm90_body(v) == "ws":
        # a producer warpgroup and consumer warpgroups x 64 query rows: three at d64 (where
        # O, S and P fit in 160 registers; more warps beside the exp2s), else two; Q, then
        # two stages each of K and V (bf16), 128 bytes of mbarriers, +1 KiB for alignment.
        # 128-key blocks, 64 at d256 (a 128-key S does not fit beside O there).
        # Persistent at d128 (the softmax overlapping the warpgroup's own PV, and room for a
        # second Q tile: the next tile's, copied during this one): Q x 2 first.  The serving
        # variants too: a window's tiles are a few dozen blocks each, where a CTA a tile idles
        # through its epilogue and the next one's first copies (the scheduler publishes each
        # tile narrowed to its window, tile_work).
        block_n = 64 if max(v.d_qk, v.d_v) > 192 else 128
        consumers = 3 if max(v.d_qk, v.d_v) <= 64 else 2
        block_m = SM90_CONSUMER_ROWS * consumers
        persistent = (v.d_qk, v.d_v) == (128, 128)
        # The row sums by PV where the ones fit (a 64-column block, block_n x 128 bytes, after
        # each V stage; PV's N = d_v + 8 <= 256): d64 and d128, not d192/128 (the smem) or d256.
        pv_row_sums = v.d_qk == v.d_v <= 128
        smem = ((1 + persistent) * block_m * 2 * v.d_qk + 2 * block_n * 2 * (v.d_qk + v.d_v)
                + pv_row_sums * 2 * block_n * 128 + 128 + 1024)
        return Tile(block_m=block_m, block_n=block_n, threads=128 * (1 + consumers), dynamic_smem=smem, stages=2,
                    persistent=persistent, pv_row_sums=pv_row_sums, tma_o=persistent)
    if v.vendor == "cuda":
        # fp8-ws: a producer warpgroup and consumer warpgroups of 64 query rows, 128-key
        # blocks (the sm_90a recipe's): three consumers where their registers fit in 160
        # (more warps to hide the softmax's latencies, and each K/V block serves 192 rows):
        # at d64, and at d_v = 128 non-causal, where S(n + 1) then waits for the block's merge
        # (causal, the diagonal blocks' second P does not fit beside O, S and the block
        # accumulator); else two.  Q, a ring of four stages of K and V^T (from the pre-pass;
        # three at d64, where a fourth does not pay, and where four do not fit: d256, all
        # 227 KiB a CTA may have), each V^T followed by 8 x 128 bytes of ones, the mbarriers
        # in 128-byte units, +1 KiB for alignment; at d256, whose three stages fill the
        # 227 KiB, the mbarriers in rows of stage 0's ones that PV's sum does not read and no
        # slack (the kernel's smem_base_exact: the dynamic shared memory starts aligned).
        # Persistent in the short-prompt variants (Variant.short: at short prompts a tile is a
        # few blocks, and a CTA a tile idles through its epilogue and the next one's first
        # copies): Q x 2, the next tile's copied during this one; and where it fits beside the
        # deepest ring (two consumers: the causal ones), a staging tile of O for TMA (tma_o)
        # after the Q buffers, which the next tile's epilogue reuses once the copy has read it;
        # the serving variants at d_v = 128 (a CTA a tile) likewise, their issuing thread
        # waiting for the copy's reads before the CTA ends.
        consumers = 3 if max(v.d_qk, v.d_v) <= 64 or (v.d_v <= 128 and not v.causal) else 2
        persistent = v.short
        o_bytes = SM90_CONSUMER_ROWS * consumers * 2 * v.d_v
        def smem(stages, tma_o=False):
            inside = v.d_v > 128
            barriers = 0 if inside else -(-(32 * stages + 16) // 128) * 128   # four a stage, qfull and qlanded
            return ((1 + persistent) * SM90_CONSUMER_ROWS * consumers * v.d_qk + tma_o * o_bytes
                    + 128 * stages * (v.d_qk + v.d_v) + stages * 8 * 128 + barriers + (0 if inside else 1024))
        deepest = 4 if v.d_qk >= 128 else 3
        stages = next(n for n in range(deepest, 1, -1) if n == 2 or smem(n) <= SM90_MAX_SMEM)
        tma_o = ((persistent or v.serving) and v.d_v == 128 and stages == deepest
                 and smem(stages, True) <= SM90_MAX_SMEM)
        # The balanced tail at d_v = 256 non-causal, where a partial last wave of its long tiles
        # costs most (docs/sm90a.md, "the balanced tail"); not in the serving variants, whose
        # tiles' key ranges follow from the window (a CTA a tile, as BF16's).
        split_tail = v.d_v == 256 and not v.causal and not v.serving
        return Tile(block_m=SM90_CONSUMER_ROWS * consumers, block_n=128, threads=128 * (1 + consumers),
                    dynamic_smem=smem(stages, tma_o), stages=stages, persistent=persistent, split_tail=split_tail,
                    tma_o=tma_o)
    if v.built_from == "asm-generator":
        # gfx950 FP8 (generator/gfx950_fp8.py): 8 waves x 32 query rows, two waves per SIMD
        # in ping-pong; 64-key blocks (the gfx950 recipe's block); LDS is static.
        return Tile(block_m=256, block_n=64, threads=512, dynamic_smem=0)
    # gfx950 BF16 (hip/flash_fwd.hip): 8 waves x 32 query rows, two waves per SIMD; 64-key
    # tiles (32 at d256, where O^T, Q^T and a 64-key S^T do not fit in a wave's 256
    # registers), K and V double-buffered in LDS (static in the HIP source).
    return Tile(block_m=256, block_n=128 if v.d_qk <= 128 else 32 if v.d_qk > 192 else 64, threads=512, dynamic_smem=0)


# --------------------------------------------------------------------------------------
# Kernel arguments: the single definition of every kernel's argument list.

#: C type, size and alignment of each argument kind.
ARG_TYPES = {
    "ptr": ("const void*", 8),
    "i64": ("long long", 8),
    "i32": ("int", 4),
    "f32": ("float", 4),
    "tmap": ("TmaMap", 128),   # a CUtensorMap, encoded by the runtime for each call
}
#: A tensor map must lie 64-byte aligned in the constant bank, where sm_90a kernel parameters
#: start at byte 0x210 (build.py checks every offset against the code object's own).
TMAP_ALIGN, SM90_PARAM_BASE = 64, 0x210


def arg_offset(end: int, ty: str) -> int:
    """Where an argument of type ``ty`` goes after arguments ending at ``end``: its natural
    alignment, and for a tensor map 64 bytes in the constant bank."""
    if ty == "tmap":
        return (end + SM90_PARAM_BASE + TMAP_ALIGN - 1) // TMAP_ALIGN * TMAP_ALIGN - SM90_PARAM_BASE
    size = ARG_TYPES[ty][1]
    return (end + size - 1) // size * size


@dataclasses.dataclass(frozen=True)
class KernArg:
    name: str
    type: str       # one of ARG_TYPES
    offset: int
    size: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _arg_names(v: Variant) -> list[tuple[str, str]]:
    # the TMA tensor maps (sm_90a: K, and for BF16 V), first: one gap before them at most
    args = [(name, "tmap") for name in tensor_maps(v)]
    args += [
        # Tensors.  Strides are in elements; the head dim has unit stride.
        ("q", "ptr"), ("k", "ptr"), ("v", "ptr"), ("o", "ptr"),
        ("lse", "ptr"),              # fp32, may be null (no LSE requested)
        ("cu_seqlens_q", "ptr"),     # int32[batch + 1], null for fixed-length batches
        ("cu_seqlens_k", "ptr"),
    ]
    if v.dtype == "fp8_e4m3":
        # fp32 dequantisation factors: one float each, or, where the kernel takes their strides
        # (per_head_descales), one a (sequence, key/value head): [b, h_kv] at b stride_b + h_kv stride_h
        args += [("descale_q", "ptr"), ("descale_k", "ptr"), ("descale_v", "ptr")]
    if "sinks" in features(v):
        args += [("sinks", "ptr")]   # fp32 (hq,): one logit a query head (scaled-score space), null: none
    if "kvcache" in features(v):
        # int32 (batch,): sequence b's keys are the first cache_seqlens[b] rows of its part of
        # the cache (clamped to [0, seqlen_k]); null: K and V are tensors (no cache)
        args += [("cache_seqlens", "ptr")]
    if "paged_kv" in features(v):
        # int32 at b page_table_stride + i: the page holding keys [i page_size, (i + 1) page_size)
        # of sequence b, a page of k and v (num_pages, page_size, hkv, d): pages at stride_b, rows
        # at stride_s (each index clamped to [0, num_pages - 1]); null: not paged
        args += [("page_table", "ptr")]
    if has_vt_prepass(v):
        args += [("vt", "ptr")]      # the pre-pass's V^T (a workspace of vt_bytes)
    if gathers_k(v):
        # a paged cache's K as the pre-pass gathers it: (batch, seqlen_k, hkv, d_qk) bytes,
        # contiguous, after the V^T in the workspace; null: not paged
        args += [("kg", "ptr")]
    if v.tile.persistent:
        args += [("tile_counter", "ptr")]   # PERSISTENT_COUNTER_BYTES of a workspace, zero between launches
    if v.tile.split_tail:
        args += [("partials", "ptr"),       # the cut tiles' pieces: split_tail_slot_bytes each, two a tail CTA
                 ("tail_counter", "ptr")]   # split_tail_counter_bytes a cut tile, zero between launches
    for t in ("q", "k", "v", "o"):
        args += [(f"{t}_stride_b", "i64"), (f"{t}_stride_s", "i64"), (f"{t}_stride_h", "i64")]
    if has_vt_prepass(v):
        args += [("vt_stride_h", "i64")]   # bytes of a key/value head's V^T: d_v vt_columns
    args += [
        ("lse_stride_b", "i64"),     # LSE is (B, Hq, Sq) or (Hq, T): the row stride is 1
        ("lse_stride_h", "i64"),
    ]
    if "paged_kv" in features(v):
        args += [("page_table_stride", "i64")]   # elements between the page_table rows of two sequences
    if per_head_descales(v):
        # in elements; 0 and 0 for one value, any strides (zero included) for (B, Hkv)
        args += [(f"descale_{t}_stride_{d}", "i64") for t in "qkv" for d in "bh"]
    args += [
        ("batch", "i32"),
        ("hq", "i32"),
        ("hkv", "i32"),
        ("seqlen_q", "i32"),         # per-sequence length, or max_seqlen_q for varlen
        ("seqlen_k", "i32"),
    ]
    if clamps_cu_seqlens(v):
        # the rows of q and of k/v (packed: the packed lengths; dense: batch x seqlen): a packed
        # sequence's rows, from cu_seqlens, are clamped to [0, total) (never read or written outside)
        args += [("total_q", "i32"), ("total_k", "i32")]
    if "paged_kv" in features(v):
        # rows a page (a multiple of 16 from 16 to 256), pages of the cache, page_table entries a
        # sequence (seqlen_k = max_pages page_size) (zeros: not paged); page_magic =
        # ceil(2^31 / (page_size / 16)), the kernel's division of a 16-row group's index by
        # page_size / 16 as a multiply-high (plan.page_magic).  Not last: the gfx950 kernels read
        # them as whole 16-byte words
        args += [("page_size", "i32"), ("num_pages", "i32"), ("max_pages", "i32"), ("page_magic", "i32")]
    args += [("softmax_scale", "f32")]
    if "window" in features(v):
        # window.py's (left, right), -1: no bound; a causal kernel has right = 0 built in
        args += [("window_left", "i32"), ("window_right", "i32")]
    if "softcap" in features(v):
        # 0 and 0: off; else scaled scores s -> softcap tanh(s / softcap), the kernel taking
        # tanh's argument as raw score x softcap_scale, fp32(softmax_scale / softcap) (the value
        # validate.check_softcap checks)
        args += [("softcap", "f32"), ("softcap_scale", "f32")]
    if v.tile.persistent or v.tile.split_tail:
        # tiles_rule evaluated, and the product of the three (the tiles, < 2^31)
        args += [("tiles_x", "i32"), ("tiles_y", "i32"), ("tiles_z", "i32"), ("tile_count", "i32")]
    if v.tile.split_tail:
        # the kernel takes the tiles before tail_first, the tail kernel's tail_ctas CTAs those
        # from it on, cut by keys (plan.tail_plan; tail_first = tile_count: none cut)
        args += [("tail_first", "i32"), ("tail_ctas", "i32"),
                 # how the tail CTAs share its blocks (plan.tail_plan): a tile's switch, the
                 # first CTA's share over the last's, in block-times
                 ("tail_gap", "i32"), ("tail_ramp", "i32")]
    return args


def per_head_descales(v: Variant) -> bool:
    """Whether the variant's kernel reads its FP8 descales per (sequence, key/value head), from
    the strides ``descale_{q,k,v}_stride_{b,h}``: every FP8 kernel (sm_90a: folded into each
    CTA's score scale and output factor; the gfx950 assembly: into each workgroup's)."""
    return v.dtype == "fp8_e4m3"


#: The serving features a kernel may implement beyond plain (causal or full) attention, as
#: the manifest's ``features`` lists them (validate.FEATURES words them; the runtime refuses a
#: call needing one its kernel does not list: plan.require_features).
FEATURES = ("window", "softcap", "sinks", "kvcache", "paged_kv")


#: The FEATURES each (arch, dtype)'s kernels implement, each with its runtime arguments
#: (_arg_names); absent: none yet.
FEATURES_OF = {
    ("gfx950", "bf16"): ("window", "softcap", "sinks", "kvcache", "paged_kv"),
    ("gfx950", "fp8_e4m3"): ("window", "softcap", "sinks", "kvcache", "paged_kv"),
}


#: The FEATURES of the serving variants (Variant.serving) of each (arch, dtype) that has them,
#: each with its runtime arguments (_arg_names): the features live in kernels of their own where
#: the plain kernels are tuned without them (sm_90a: kServing in cuda/flash_fwd_ws.cuh, flash_fwd_fp8_ws.cuh);
#: absent: no serving variants.  The softcap only in their softcap specialisations (Variant.softcap).
SERVING_FEATURES_OF = {
    ("sm_90a", "bf16"): ("window", "softcap", "sinks", "kvcache", "paged_kv"),
    ("sm_90a", "fp8_e4m3"): ("window", "softcap", "sinks", "kvcache", "paged_kv"),
}


def features(v: Variant) -> tuple[str, ...]:
    """The FEATURES variant ``v``'s kernel implements (FEATURES_OF, or SERVING_FEATURES_OF for a
    serving variant, the softcap only in its softcap specialisation), for its manifest entry's
    ``features`` (absent where none)."""
    if not v.serving:
        return FEATURES_OF.get((v.arch, v.dtype), ())
    return tuple(f for f in SERVING_FEATURES_OF[(v.arch, v.dtype)] if f != "softcap" or v.softcap)


def clamps_cu_seqlens(v: Variant) -> bool:
    """Whether the variant's kernel clamps a packed batch's sequences to the tensors' rows
    (arguments ``total_q``, ``total_k``): any cu_seqlens values then stay inside q, k, v, out
    and the LSE (garbage values give garbage output, never an access outside them), so that
    they need not be read back and checked.  Every kernel does (hip/bf16_config.h
    clamped_segment; the gfx950 FP8 assembly's stage_sequence alike)."""
    return True


def kernargs(v: "Variant | AuxKernel") -> list[KernArg]:
    """The argument list of variant ``v`` (or of auxiliary kernel ``v``: its kind's
    ``AuxKind.args``) with its C ABI layout (``arg_offset``)."""
    out, offset = [], 0
    for name, ty in (_arg_names(v) if isinstance(v, Variant) else AUX_KINDS[v.kind].args):
        size = ARG_TYPES[ty][1]
        offset = arg_offset(offset, ty)
        out.append(KernArg(name, ty, offset, size))
        offset += size
    return out


def kernarg_size(args: list[KernArg]) -> int:
    end = max(a.offset + a.size for a in args)
    return (end + 7) // 8 * 8


# --------------------------------------------------------------------------------------
# Auxiliary kernels: the kernels that are not attention, one description a kind.
#
# An AuxKind is data: its argument list (laid out by ``kernargs``, as an attention variant's),
# its launch grid (a rule over the arguments, ``eval_grid``) and its block.  An AuxKernel is a
# kind built for one arch; build.py records it in the manifest's ``aux_kernels`` with its
# ``kind``, the runtime loads it by (device, kind) and the C header declares it.

@dataclasses.dataclass(frozen=True)
class AuxKind:
    args: tuple         # ((name, ARG_TYPES key), ...) in order
    grid: dict          # the launch grid, a rule over the arguments (eval_grid)
    threads: int        # threads a workgroup / CTA
    rows: int           # rows (of the kind's own unit) one workgroup covers: the grid's x


#: merge_attention_states: two partial attentions of the same queries (over disjoint key sets)
#: into one by their LSEs.  O tensors are bf16 (rows, heads, head dim), row b s of a sequence at
#: b stride_b + s stride_s + h stride_h (elements, the head dim contiguous); LSEs fp32 natural
#: log at b stride_b + h stride_h + s stride_s; ``out_lse`` may be null (not written).  Dense
#: (B, S, H, D) / (B, H, S) and packed (T, H, D) / (H, T) (batch 1, stride_b 0) alike.
#: A workgroup: MERGE_ROWS rows of one head of one sequence, 32 threads a row over the head dim.
MERGE_ROWS = 8
MERGE_KIND = AuxKind(
    args=(("o_a", "ptr"), ("o_b", "ptr"), ("out", "ptr"),
          ("lse_a", "ptr"), ("lse_b", "ptr"), ("out_lse", "ptr"),
          *((f"{t}_stride_{d}", "i64") for t in ("o_a", "o_b", "out") for d in "bsh"),
          *((f"{t}_stride_{d}", "i64") for t in ("lse_a", "lse_b", "out_lse") for d in "bhs"),
          ("batch", "i32"), ("heads", "i32"), ("seqlen", "i32"), ("head_dim", "i32")),
    grid={"x": {"cdiv": ["seqlen", MERGE_ROWS]}, "y": "heads", "z": "batch"},
    threads=32 * MERGE_ROWS, rows=MERGE_ROWS)

#: quantize_fp8 (zyfa_runtime/quantize.py, cuda/quantize_fp8.cuh): bf16 q, k, v into e4m3 codes
#: and descales in passes, each a kind, all with QUANTIZE_ARGS: K's mean (partial fp64 sums over
#: chunks of QUANTIZE_MEAN_ROWS keys, then their total over a sequence); at block granularity
#: q's and k's blocks whole (a workgroup a block: amax, descale, codes); each tile's amax (a tile:
#: QUANTIZE_TILE_ROWS rows of one head of one sequence: grid y runs over ``tile_heads`` heads of
#: the combined q | k | v axis from ``tile_y0``), each descale from its tiles' amax, the codes.
#: A workgroup 256 threads.
QUANTIZE_TILE_ROWS, QUANTIZE_MEAN_ROWS, QUANTIZE_THREADS = 64, 64, 256
#: Channels a mean_finish workgroup totals (cuda/quantize_fp8.cuh kFinishChannels).
QUANTIZE_FINISH_CHANNELS = 32
QUANTIZE_ARGS = (
    *((name, "ptr") for name in ("q", "k", "v", "q8", "k8", "v8", "descale_q", "descale_k", "descale_v",
                                 "mean", "cu_seqlens_q", "cu_seqlens_k", "sums", "amax")),
    *((f"{t}_stride_{d}", "i64") for t in ("q", "k", "v", "q8", "k8", "v8") for d in "bsh"),
    *((name, "i32") for name in ("batch", "heads_q", "heads_k", "d_qk", "d_v", "seqlen_q", "seqlen_k",
                                 "max_seqlen_q", "max_seqlen_k", "tile_x", "tile_y0", "tile_heads",
                                 "mean_chunks", "n_descales", "descale_e0", "block_x", "block_heads",
                                 "smooth_k", "power_of_two")),
    *((f"{t}_{f}", "i32") for t in "qkv"
      for f in ("ds_batches", "ds_groups", "ds_blocks", "heads_per_group", "block_rows")))
_TILE_GRID = {"x": "tile_x", "y": "tile_heads", "z": "batch"}
QUANTIZE_KINDS = {
    "quantize_fp8_mean": AuxKind(QUANTIZE_ARGS, {"x": "mean_chunks", "y": "heads_k", "z": "batch"},
                                 QUANTIZE_THREADS, QUANTIZE_MEAN_ROWS),
    "quantize_fp8_mean_finish": AuxKind(QUANTIZE_ARGS, {"x": {"cdiv": [{"mul": ["heads_k", "d_qk"]},
                                                                       QUANTIZE_FINISH_CHANNELS]},
                                                        "y": "batch", "z": 1}, QUANTIZE_THREADS, 1),
    "quantize_fp8_blocks": AuxKind(QUANTIZE_ARGS, {"x": "block_x", "y": "block_heads", "z": "batch"},
                                   QUANTIZE_THREADS, 128),
    "quantize_fp8_amax": AuxKind(QUANTIZE_ARGS, _TILE_GRID, QUANTIZE_THREADS, QUANTIZE_TILE_ROWS),
    "quantize_fp8_scales": AuxKind(QUANTIZE_ARGS, {"x": "n_descales", "y": 1, "z": 1}, QUANTIZE_THREADS, 1),
    "quantize_fp8_codes": AuxKind(QUANTIZE_ARGS, _TILE_GRID, QUANTIZE_THREADS, QUANTIZE_TILE_ROWS),
}

AUX_KINDS = {"merge_attention_states": MERGE_KIND, **QUANTIZE_KINDS}


@dataclasses.dataclass(frozen=True, order=True)
class AuxKernel(CodeObject):
    kind: str
    arch: str

    def __post_init__(self) -> None:
        if self.kind not in AUX_KINDS:
            raise ValueError(f"unknown auxiliary kernel kind {self.kind!r}; known: {tuple(AUX_KINDS)}")
        if self.arch not in ARCHES:
            raise ValueError(f"unknown arch {self.arch!r}; known: {ARCHES}")

    @property
    def spec(self) -> AuxKind:
        return AUX_KINDS[self.kind]

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.arch}"

    @property
    def built_from(self) -> str:
        return self.vendor

    def to_json(self) -> dict:
        return {"kind": self.kind, "arch": self.arch}

    @classmethod
    def from_json(cls, d: dict) -> "AuxKernel":
        return cls(kind=d["kind"], arch=d["arch"])


def all_aux() -> list[AuxKernel]:
    """Every auxiliary kernel: each kind on each arch, in a fixed order."""
    return [AuxKernel(k, a) for k in AUX_KINDS for a in ARCHES]


# --------------------------------------------------------------------------------------
# The V^T pre-pass of the sm_90a FP8 kernels.
#
# FP8 WGMMA takes its B operand K-major only, so PV needs V with the keys contiguous: a
# kernel of its own (the pre-pass, a second entry point in the same code object, with the
# same arguments) writes V^T into a workspace before the attention kernel reads it.  Per
# key/value head ``vt_stride_h`` = d_v vt_columns bytes: sequence b's keys from column
# ``vt_column0(b)`` on (cuda/flash_fp8_lean.cuh), in blocks of VT_BLOCK keys, zeros to the end
# of its last block; each block's d_v rows of VT_BLOCK bytes stored together, as a stage of the
# kernel's shared memory holds them (the 128-byte swizzle), so that one bulk copy moves it.

#: Keys per block of the pre-pass (the sm_90a FP8 kernels' block_n).
VT_BLOCK = 128
#: Threads of a pre-pass CTA.
VT_THREADS = 128


def has_vt_prepass(v: Variant) -> bool:
    """Whether the variant's code object has the V^T pre-pass (the sm_90a FP8 kernels but the
    f16-math ones, whose V is read as it lies: f16 WGMMA transposes it)."""
    return v.vendor == "cuda" and v.dtype == "fp8_e4m3" and not v.f16


def gathers_k(v: Variant) -> bool:
    """Whether the variant's pre-pass also gathers a paged cache's K (the sm_90a FP8 serving
    kernels): each used row from its page into a contiguous copy in the workspace, which the
    kernel then reads as a contiguous cache's, two TMA boxes a K tile.  Read from the pages, a
    K tile at pages of 16 rows was 16 boxes, and FP8's short blocks ran at 0.84 of dense."""
    return has_vt_prepass(v) and "paged_kv" in features(v)


def dependent_launch(v: Variant) -> bool:
    """Whether the variant's kernel may be launched as a programmatic dependent of its pre-pass,
    and its tail kernel (Tile.split_tail) of the kernel (launch.Launch.dependent): the sm_90a FP8
    kernels wait for the launch before them where they read what it writes, and let the next
    start as their CTAs leave the SMs (cuda/flash_fp8_lean.cuh, "the launches' order")."""
    return has_vt_prepass(v)


def vt_prepass_symbol(v: Variant) -> str:
    return "zyfa_vt_" + v.name


def tensor_maps(v: Variant) -> dict:
    """The TMA tensor maps a variant's kernel takes, by argument name: the tensor, the box
    (innermost first, over the tensor's bytes: the maps are of bytes, (head dim, heads, rows,
    sequences)) and the swizzle in bytes.  sm_90a reads Q (block_m rows a box) and K by TMA,
    FP8 in boxes of 64 bytes (a K-block of the 64B swizzle) x 1 head x block_n keys (block_m
    rows) x 1 sequence; BF16 Q, K and V in boxes of 128 bytes (a K-block of the 128B swizzle)."""
    if v.vendor != "cuda":
        return {}
    # (f16-math: the BF16 body's Q, K and V, e4m3 in boxes of 128 bytes: a row of d128)
    box, tensors = (64, "qk") if v.dtype == "fp8_e4m3" and not v.f16 else (128, "qkv")
    maps = {f"tmap_{t}": {"tensor": t, "box": [box, 1, v.tile.block_m if t == "q" else v.tile.block_n, 1],
                          "swizzle_bytes": box} for t in tensors}
    if v.tile.tma_o:
        # O by TMA (Tile.tma_o): a consumer's 64 rows, a box a 128-byte K-block
        maps["tmap_o"] = {"tensor": "o", "box": [128, 1, SM90_CONSUMER_ROWS, 1], "swizzle_bytes": 128}
    return maps


def vt_prepass_grid_rule(v: Variant) -> dict:
    """x: key blocks (of the longest sequence); y: key/value heads; z: sequences."""
    return {"x": {"cdiv": ["seqlen_k", VT_BLOCK]}, "y": "hkv", "z": "batch"}


def vt_column0(b: int, seqlen_k: int, cu_seqlens_k=None) -> int:
    """The first V^T column of sequence ``b`` (cuda/flash_fp8_lean.cuh's vt_column0, the same
    rule): dense, b ceil(seqlen_k / VT_BLOCK) VT_BLOCK; packed, sequence b's first key rounded up
    to a multiple of VT_BLOCK, plus VT_BLOCK b -- room for every sequence's last block, as
    ceil((k_b + sk_b) / VT_BLOCK) - ceil(k_b / VT_BLOCK) + 1 >= ceil(sk_b / VT_BLOCK)."""
    if cu_seqlens_k is None:
        return b * (-(-seqlen_k // VT_BLOCK) * VT_BLOCK)
    return -(-int(cu_seqlens_k[b]) // VT_BLOCK) * VT_BLOCK + VT_BLOCK * b


def vt_columns(batch: int, seqlen_k: int, total_k: int | None) -> int:
    """Key columns of a key/value head's V^T: dense, ``batch`` sequences of ceil(seqlen_k / VT_BLOCK) blocks;
    packed (``total_k`` keys), sequence b from ceil(k_b / VT_BLOCK) VT_BLOCK + VT_BLOCK b on."""
    blocks = -(-seqlen_k // VT_BLOCK) * batch if total_k is None else -(-total_k // VT_BLOCK) + batch
    return max(blocks, 1) * VT_BLOCK


# --------------------------------------------------------------------------------------
# Launch grid, as data the manifest carries and the runtime evaluates.

#: Causal sm_90a CTAs go heads first (every query head's heaviest query-row block, then every
#: head's next one, ...) where the K and V of a sequence's key/value heads fit in this many
#: bytes (a third of the H100/H200's 50 MB L2), else sequences first (every sequence's
#: heaviest block of a head, then their next, head after head) where those of one head's
#: sequences do, else each head in turn.  The GPU starts CTAs in the order of their linear
#: index: heads or sequences first, the last to start are the lightest, so the SMs run out of
#: work together, where each head in turn leaves a head's heavy blocks among the last
#: (bench/cta_order_model.py).  The running CTAs then read the K and V of every head (or
#: sequence) at once, which pays only while they stay in L2: hence the bound.
SM90_HEADS_FIRST_BYTES = 16 << 20


def kv_bytes_per_key(v: Variant) -> int:
    """Bytes of K and V one key takes (a row of each)."""
    return (v.d_qk + v.d_v) * (1 if v.dtype == "fp8_e4m3" else 2)


def grid_rule(v: Variant) -> dict:
    """x: query blocks; y: query heads; z: sequences.  Values name kernel arguments (and
    ``sm_count``, the device's multiprocessors).  Causal sm_90a kernels: (hq, blocks, sequences)
    where the keys and values of a sequence's key/value heads take at most
    SM90_HEADS_FIRST_BYTES, else (sequences, blocks, hq) where those of one head's sequences do
    (the kernel reads the order from the grid's shape).  Causal gfx950 kernels: (hq, sequences,
    blocks), the blocks taken from the last (``work_of``).  Persistent kernels: one CTA an SM, or
    one a tile where there are fewer tiles (``tiles_rule``).  Balanced-tail kernels: a CTA each
    of the tiles before ``tail_first`` (``tiles_rule``'s order, the kernel reads its tile from x),
    the rest its tail kernel's (``split_tail_grid_rule``)."""
    if v.tile.persistent:
        return {"x": {"min": ["tile_count", "sm_count"]}, "y": 1, "z": 1}
    if v.tile.split_tail:
        return {"x": "tail_first", "y": 1, "z": 1}
    return tiles_rule(v)


def longest_first(v: Variant) -> bool:
    """Whether a launch runs its query blocks longest first (``work_of``): the gfx950 causal
    kernels, whose later query blocks see more keys.  The device hands workgroups out in
    order, so the longest go first and the short ones fill in behind them; in grid order a
    causal launch's last wave would hold its longest workgroups (modelled at B1 H32 4k tokens,
    FP8 d128: 1.6x the in-order launch's time)."""
    return v.arch == "gfx950" and v.causal


def work_of(v: Variant, x: int, y: int, z: int, blocks: int) -> tuple:
    """(query block, query head, sequence) that workgroup (x, y, z) of a launch of ``v``
    computes (``tiles_rule``; ``blocks``: the launch's query blocks).  In order, the grid
    (blocks, heads, sequences) itself; longest first, the grid (heads, sequences, blocks) with
    z counting the blocks from the last, so that the dispatch order (x fastest) takes every
    head, then every sequence, of the last block first and the kernel needs no division."""
    if not longest_first(v):
        return x, y, z
    return blocks - 1 - z, x, y


def dispatch_order(v: Variant, seqlen_q: int, heads: int, batch: int) -> list:
    """The (query block, query head, sequence) of every workgroup of a launch of gfx950 variant
    ``v`` (grid ``tiles_rule``), in dispatch order: x fastest, then y, then z."""
    if v.arch != "gfx950":
        raise ValueError(f"{v.name}: dispatch_order models the gfx950 grids")
    blocks = -(-seqlen_q // v.tile.block_m)
    gx, gy, gz = eval_grid(tiles_rule(v), {"seqlen_q": seqlen_q, "hq": heads, "batch": batch})
    return [work_of(v, x, y, z, blocks) for z in range(gz) for y in range(gy) for x in range(gx)]


def split_tail_symbol(v: Variant) -> str:
    """The tail kernel of a balanced-tail variant (Tile.split_tail): a third entry point of the
    code object, launched after the kernel with the same arguments and split_tail_grid_rule."""
    return "zyfa_tail_" + v.name


def split_tail_grid_rule(v: Variant) -> dict:
    """A CTA a piece of the tail (none where tail_ctas is 0: nothing cut)."""
    return {"x": "tail_ctas", "y": 1, "z": 1}


def split_tail_slot_bytes(v: Variant) -> int:
    """Bytes of one piece's partial result in ``partials``: per consumer thread its O
    accumulators over the piece's l as f16 (d_v / 2 of them) and one 16-byte group of its rows'
    l and frame (fp32), in the accumulators' own order (the thread that merges reads the same
    places of each piece)."""
    return v.tile.block_m // SM90_CONSUMER_ROWS * 128 * (v.d_v // 16 + 1) * 16


def split_tail_counter_bytes(v: Variant) -> int:
    """Bytes of ``tail_counter`` a cut tile: two 32-bit counts a consumer warpgroup, its pieces
    that have arrived and those stored, zero between launches (the last piece zeroes them)."""
    return v.tile.block_m // SM90_CONSUMER_ROWS * 8


#: What cutting the tail costs beyond its blocks, in block-times: a CTA's second start and end,
#: its pieces' stores, the merge, and the tail kernel's launch after the kernel.  The tail is cut
#: only where each CTA's share plus this is below a whole tile's blocks (plan.tail_plan).
SPLIT_TAIL_OVERHEAD_BLOCKS = 24

#: A tail CTA's switch from one tile to the next, in block-times: the piece's store, new
#: mbarriers, the next tile's Q and first block from memory and its first S before any PV.  A CTA
#: whose share holds a switch takes this many blocks fewer (plan.tail_plan's ``tail_gap``).
SPLIT_TAIL_SWITCH_BLOCKS = 4

#: The spread, in block-times, over which the kernel's last CTAs end: a tail kernel launched as
#: the kernel's dependent starts its CTA j as the j-th SM comes free, so the first CTAs' shares
#: are larger by up to half of it and the last ones' smaller (``tail_ramp``).
SPLIT_TAIL_DRAIN_BLOCKS = 11


#: Bytes of a persistent kernel's ``tile_counter``: the next tile's counter and the CTAs that
#: have finished (the last one zeroes both for the next launch), zero before the first launch.
PERSISTENT_COUNTER_BYTES = 8


def tiles_rule(v: Variant) -> dict:
    """The tiles of a launch (a tile: ``block_m`` query rows of one sequence and head) as a grid
    (x, y, z) whose linear index orders them: a CTA a tile, it is the launch grid
    (``grid_rule``); a persistent kernel gets it as its arguments ``tiles_x``, ``tiles_y``,
    ``tiles_z`` and takes the tiles in that order."""
    blocks = {"cdiv": ["seqlen_q", v.tile.block_m]}
    if v.vendor == "cuda" and v.causal:
        heads = [{"mul": ["hkv", "seqlen_k", kv_bytes_per_key(v)]}, SM90_HEADS_FIRST_BYTES]
        seqs = [{"mul": ["batch", "seqlen_k", kv_bytes_per_key(v)]}, SM90_HEADS_FIRST_BYTES]
        pick = lambda h, s, other: {"if_le": heads + [h, {"if_le": seqs + [s, other]}]}  # noqa: E731
        return {"x": pick("hq", "batch", blocks), "y": pick(blocks, blocks, "hq"), "z": pick("batch", "hq", "batch")}
    if longest_first(v):
        return {"x": "hq", "y": "batch", "z": blocks}
    return {"x": blocks, "y": "hq", "z": "batch"}


def eval_grid(rule: dict, values: dict) -> tuple[int, int, int]:
    """Evaluate a manifest grid rule against the kernel-argument values of one launch."""
    def ev(term) -> int:
        if isinstance(term, bool):
            raise ValueError(f"malformed grid term {term!r}")
        if isinstance(term, int):
            return term
        if isinstance(term, str):
            return int(values[term])
        if isinstance(term, dict) and set(term) == {"cdiv"}:
            a, b = (ev(t) for t in term["cdiv"])
            return -(-a // b)
        if isinstance(term, dict) and set(term) == {"mul"} and term["mul"]:
            out = 1
            for t in term["mul"]:
                out *= ev(t)
            return out
        if isinstance(term, dict) and set(term) == {"min"} and term["min"]:
            return min(ev(t) for t in term["min"])
        if isinstance(term, dict) and set(term) == {"if_le"} and len(term["if_le"]) == 4:
            a, b, then, other = term["if_le"]
            return ev(then) if ev(a) <= ev(b) else ev(other)
        raise ValueError(f"malformed grid term {term!r}")
    return tuple(max(ev(rule[axis]), 0) for axis in ("x", "y", "z"))


def iter_select(variants: list, arch: str | None = None, only: str | None = None,
                skip: str | None = None) -> Iterator:
    """Variants (or auxiliary kernels) matching ``--arch`` and an ``--only`` substring filter,
    less those a ``--skip`` substring names (both comma-separated), in order."""
    pats = [p for p in (only or "").split(",") if p]
    skips = [s for s in (skip or "").split(",") if s]
    for v in variants:
        if arch and v.arch != arch:
            continue
        if pats and not any(p in v.name for p in pats):
            continue
        if any(s in v.name for s in skips):
            continue
        yield v
