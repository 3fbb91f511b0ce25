"""Matrix instructions (MAI): MFMA, scaled MFMA and the AccVGPR moves.

Operand layouts are the CDNA4 ISA guide's (§7.1.4 "dependent" output layout, §7.1.5.1
per-format input tables, §7.2.1 scale layout), for lane ``l``, register ``r`` and
packed input item ``t`` (items are little-endian across the register tuple):

* A (M x K) lane ``l`` holds row ``l % M`` and B (K x N) lane ``l`` column ``l % N``;
  the K index of item ``t`` depends on the instruction (``_k_index``).
* C/D: 16x16 shapes hold ``D[4*(l//16) + r][l % 16]``; 32x32 shapes hold
  ``D[8*(r//4) + 4*(l//32) + r%4][l % 32]``.

Result: D = C + A.B, computed as exact products summed in float64 and rounded once to
float32 (the order and precision of the matrix core's internal accumulation are not
documented; this is the most accurate choice, so compare with hardware within
tolerances).  MFMAs ignore EXEC, MODE's rounding and MODE's denormal control: input and
output denormals are kept and the result is rounded to nearest even (ISA §7.1.2 rules,
and the same rules for the F8F6F4 forms, scaled or not, in §7.1.5), so an fp32 subnormal
result stays subnormal even when MODE.FP_DENORM flushes VALU results.

Scaled forms (§7.1.5 "Scale", §7.2): each 32-wide K block of a row of A and of a column
of B has an E8M0 scale (``numerics.e8m0_to_f64``: 0x00 is 2^-127, 0xFF is NaN), applied
to the block's dot product before accumulation, so a NaN scale makes the whole row (A)
or column (B) of D NaN.  ABID[0] = 0 makes the hardware use 1.0 for every scale.
"""

from __future__ import annotations

import re

import numpy as np

from .errors import registry

from . import numerics as nx
from .valu import read32
from .wave import F32, F64, U32

HANDLERS, handler = registry()


class Shape:
    """What an MFMA mnemonic means: sizes, element formats and the K index of each item."""

    def __init__(self, name: str, cbsz: int = 0, blgp: int = 0):
        m = re.match(r"v_mfma(?:_scale)?_f32_(\d+)x(\d+)x(\d+)_(\w+)$", name)
        if not m:
            raise ValueError(f"{name} is not a supported MFMA")
        self.M, self.N, self.K = int(m.group(1)), int(m.group(2)), int(m.group(3))
        typ = m.group(4)
        self.f8f6f4 = typ == "f8f6f4"
        if self.f8f6f4:
            self.fmt_a, self.fmt_b = cbsz, blgp
        elif typ in ("bf16", "f16"):
            self.fmt_a = self.fmt_b = typ
        elif re.fullmatch(r"(fp8|bf8)_(fp8|bf8)", typ):
            a, b = typ.split("_")
            self.fmt_a, self.fmt_b = (0 if a == "fp8" else 1), (0 if b == "fp8" else 1)
        else:
            raise ValueError(f"{name}: element type {typ} is not supported")
        self.bits_a = _bits(self.fmt_a)
        self.bits_b = _bits(self.fmt_b)
        if self.M * self.N // 64 not in (4, 16) or self.M != self.N:
            raise ValueError(f"{name}: shape not supported")
        self.groups = 64 // self.M                      # lane groups along K
        self.items_a = self.K // self.groups
        self.items_b = self.K // self.groups
        self.regs_a = self.items_a * self.bits_a // 32
        self.regs_b = self.items_b * self.bits_b // 32
        self.regs_cd = self.M * self.N // 64
        self.perm_a = self._perm(self.k_index(self.fmt_a, self.items_a), self.M)
        self.perm_b = self._perm(self.k_index(self.fmt_b, self.items_b), self.N)
        drow = self.d_rows()
        dcol = (np.arange(64) % self.N)[None, :]
        self.d_index = (drow * self.N + dcol).reshape(-1)          # (r, lane) -> D flat index
        self.d_inverse = np.argsort(self.d_index)                   # D flat index -> (r, lane)

    def _perm(self, k_idx: np.ndarray, size: int) -> np.ndarray:
        """Flat gather index: matrix[row, k] = items.flat[perm[row * K + k]]."""
        rows = (np.arange(64) % size)[:, None]
        target = (rows * self.K + k_idx).reshape(-1)                # (lane, t) -> matrix flat index
        if len(np.unique(target)) != self.K * size or target.size != self.K * size:
            raise ValueError("operand layout does not cover the matrix")
        return np.argsort(target)

    def k_index(self, fmt, items: int) -> np.ndarray:
        """int[64, items]: the K index of item t in lane l."""
        g = (np.arange(64) // self.M)[:, None]
        t = np.arange(items)[None, :]
        if self.f8f6f4 and fmt in (0, 1):
            # FP8/BF8: two 16-item halves; the second half starts at K/2.
            half = self.K // 2
            per = 16
            return np.where(t < per, per * g + t, half + per * g + (t - per))
        return items * g + t                            # contiguous K per lane group

    def d_rows(self) -> np.ndarray:
        """int[regs_cd, 64]: the row of D held by (register r, lane l)."""
        r = np.arange(self.regs_cd)[:, None]
        g = (np.arange(64) // self.M)[None, :]
        if self.M == 16:
            return 4 * g + r
        return 8 * (r // 4) + 4 * g + (r % 4)


def _bits(fmt) -> int:
    return {"bf16": 16, "f16": 16, 0: 8, 1: 8, 2: 6, 3: 6, 4: 4}[fmt]


_SHAPES: dict = {}


def shape_of(inst) -> Shape:
    key = (inst.name, inst.cbsz, inst.blgp)
    s = _SHAPES.get(key)
    if s is None:
        s = _SHAPES[key] = Shape(inst.name.replace("_scale_", "_"), inst.cbsz, inst.blgp)
    return s


def _decode_items(rows: np.ndarray, fmt, items: int) -> np.ndarray:
    """uint32[regs, 64] register tuple -> float64[64, items] element values."""
    lanes = np.ascontiguousarray(rows.T)               # [64, regs]
    if fmt in ("bf16", "f16"):
        h = lanes.view("<u2")                           # [64, 2 * regs]
        # Registers may hold any bits (a hazard test's stale data): a signalling NaN widens to a
        # quiet one (a NaN in the product either way), without numpy's invalid-cast warning.
        with np.errstate(invalid="ignore"):
            if fmt == "bf16":
                return nx.bf16_bits_to_f32(h.astype(U32)).astype(F64)
            return h.view(np.float16).astype(F64)
    if fmt in (0, 1):
        b = lanes.view(np.uint8)
        return nx.FP8_FORMATS[fmt].decode(b).astype(F64)
    bits = _bits(fmt)
    raw = lanes.view(np.uint8)
    allbits = np.unpackbits(raw, axis=1, bitorder="little")[:, :bits * items]
    codes = (allbits.reshape(64, items, bits) * (1 << np.arange(bits))).sum(axis=2)
    table = {2: nx.E2M3_TABLE, 3: nx.E3M2_TABLE, 4: nx.E2M1_TABLE}[fmt]
    return table[codes].astype(F64)


def _operand_rows(w, inst, code: int, acc: bool, n: int):
    if code < 256:
        w.fail(inst, "MFMA A/B operands must be VGPRs or AccVGPRs")
    row = w.vrow(code, acc)
    if row + n > 512:
        w.fail(inst, "MFMA operand tuple runs past the register file")
    return w.v[row:row + n]


@handler("v_mfma_f32_16x16x32_bf16", "v_mfma_f32_32x32x16_bf16", "v_mfma_f32_16x16x16_bf16",
         "v_mfma_f32_32x32x8_bf16", "v_mfma_f32_16x16x32_f16", "v_mfma_f32_32x32x16_f16",
         "v_mfma_f32_16x16x16_f16", "v_mfma_f32_32x32x8_f16", "v_mfma_f32_16x16x128_f8f6f4",
         "v_mfma_f32_32x32x64_f8f6f4", "v_mfma_scale_f32_16x16x128_f8f6f4",
         "v_mfma_scale_f32_32x32x64_f8f6f4", "v_mfma_f32_16x16x32_fp8_fp8",
         "v_mfma_f32_16x16x32_fp8_bf8", "v_mfma_f32_16x16x32_bf8_fp8",
         "v_mfma_f32_16x16x32_bf8_bf8", "v_mfma_f32_32x32x16_fp8_fp8",
         "v_mfma_f32_32x32x16_fp8_bf8", "v_mfma_f32_32x32x16_bf8_fp8",
         "v_mfma_f32_32x32x16_bf8_bf8")
def _v_mfma(w, inst):
    try:
        sh = shape_of(inst)
    except (ValueError, KeyError) as e:
        w.fail(inst, str(e))
    if not sh.f8f6f4 and (inst.cbsz or inst.abid or inst.blgp):
        w.fail(inst, "CBSZ/ABID/BLGP broadcast modes are not modelled")
    a_rows = _operand_rows(w, inst, inst.src0, bool(inst.acc & 1), sh.regs_a)
    b_rows = _operand_rows(w, inst, inst.src1, bool(inst.acc & 2), sh.regs_b)
    A = _decode_items(a_rows, sh.fmt_a, sh.items_a).reshape(-1)[sh.perm_a].reshape(sh.M, sh.K)
    Bt = _decode_items(b_rows, sh.fmt_b, sh.items_b).reshape(-1)[sh.perm_b].reshape(sh.N, sh.K)
    acc_cd = bool(inst.acc_cd)
    if inst.src2 >= 256:
        c_rows = _operand_rows(w, inst, inst.src2, acc_cd, sh.regs_cd)
        C = c_rows.view(F32).reshape(-1)[sh.d_inverse].reshape(sh.M, sh.N).astype(F64)
    else:
        C = np.asarray(read32(w, inst, inst.src2)).view(F32).astype(F64)
    if inst.scale is None:
        P = A @ Bt.T
    else:
        P = _scaled_product(w, inst, sh, A, Bt)
    with np.errstate(all="ignore"):
        D = (C + P).astype(F32)
    if w.mode >> 23 & 1:        # FP16_OVFL: clamp overflow to +-max instead of +-inf
        big = np.isinf(D) & ~np.isinf(np.broadcast_to(C, P.shape) + P)
        D = np.where(big, np.copysign(np.finfo(F32).max, D), D).astype(F32)
    out = D.reshape(-1)[sh.d_index].view(U32).reshape(sh.regs_cd, 64)
    row = w.vrow(256 + inst.vdst, acc_cd)
    if row + sh.regs_cd > 512:
        w.fail(inst, "MFMA destination runs past the register file")
    w.v[row:row + sh.regs_cd] = out                      # EXEC is ignored


def _scaled_product(w, inst, sh: Shape, A: np.ndarray, Bt: np.ndarray) -> np.ndarray:
    """Sum over 32-wide K blocks of scale_A scale_B A_blk.B_blk (ISA §7.2.1), each scale
    an E8M0 byte: 2^(e-127) for e = 0x00..0xFE (0x00 is 2^-127, not zero), NaN for 0xFF."""
    sa_code, sb_code, sel, sel_hi = inst.scale
    if sa_code < 256 or sb_code < 256:
        # §7.2.1 also allows float inline constants (their exponent field is the scale);
        # LLVM's assembler takes only VGPRs, and nothing else is modelled
        w.fail(inst, "scale operands other than VGPRs are not modelled")
    byte_a = (sel_hi & 1) << 1 | (sel & 1)
    byte_b = (sel_hi >> 1 & 1) << 1 | (sel >> 1 & 1)
    sa = (np.broadcast_to(np.asarray(read32(w, inst, sa_code), U32), (64,)) >> U32(8 * byte_a)) & U32(0xFF)
    sb = (np.broadcast_to(np.asarray(read32(w, inst, sb_code), U32), (64,)) >> U32(8 * byte_b)) & U32(0xFF)
    if not inst.abid & 1:
        # §7.1.5: ABID[0] = 0 forces every scale into the ALU as 1.0 (biased exponent 0x7f)
        sa = sb = np.full(64, 0x7F, U32)
    nblk = sh.K // 32
    lane = np.arange(64)
    # lane l supplies the scale of row/column l % M for K block l // M
    scale_a = np.zeros((sh.M, nblk), F64)
    scale_b = np.zeros((sh.N, nblk), F64)
    scale_a[lane % sh.M, lane // sh.M] = nx.e8m0_to_f64(sa)
    scale_b[lane % sh.N, lane // sh.N] = nx.e8m0_to_f64(sb)
    P = np.zeros((sh.M, sh.N), F64)
    for blk in range(nblk):
        ks = slice(32 * blk, 32 * blk + 32)
        P += np.outer(scale_a[:, blk], scale_b[:, blk]) * (A[:, ks] @ Bt[:, ks].T)
    return P


@handler("v_accvgpr_read_b32")
def _v_accvgpr_read(w, inst):
    src = w.vrow(inst.src0, True)
    w.v[inst.vdst] = np.where(w.execmask(), w.v[src], w.v[inst.vdst])


@handler("v_accvgpr_write_b32")
def _v_accvgpr_write(w, inst):
    dst = w.vrow(256 + inst.vdst, True)
    val = np.broadcast_to(np.asarray(read32(w, inst, inst.src0)).view(U32), (64,))
    w.v[dst] = np.where(w.execmask(), val, w.v[dst])


@handler("v_accvgpr_mov_b32")
def _v_accvgpr_mov(w, inst):
    dst = w.vrow(256 + inst.vdst, True)
    src = w.vrow(inst.src0, True)
    w.v[dst] = np.where(w.execmask(), w.v[src], w.v[dst])
