"""Exact models of FP8 attention forward recipes (zyfa's and the usual baselines).

Inputs are e4m3 codes for Q, K, V with fp32 descales ``dq, dk, dv`` (per tensor, per
key/value head, or per block: "Block descales" below).  A
:class:`Recipe` fixes every arithmetic choice a kernel makes about P; the model evaluates
it for all heads and query rows of one sequence at once (numpy, vectorised over heads,
rows and key blocks; only the fp32 merge of block results runs block by block).

The arithmetic, per query row and key block ``b`` of ``N = block_keys`` keys (blocks are
aligned at key 0 and taken in increasing key order):

1. Scores ``S = q . k`` of the e4m3 values, rounded once to fp32.  (Every product of two
   e4m3 values is a multiple of 2^-18 below 2^17.7, so for any d < 2^17 every partial sum
   fits in 53 bits and the float64 matmul is exact in any order: ``S`` is the correctly
   rounded fp32 score.)
   ``c = fp32(softmax_scale * log2(e) * dq * dk)`` (:func:`log2_scale`); ``t = S c`` is the
   score in log2 units.  Keys the row does not see carry ``S = -inf``.
2. Reference max ``m_b`` (log2 units) by ``max_kind``, with ``T_b = fp32(max_{j in b} S_j *
   c)`` the block's max:
   ``"running_fp32"``    ``m_b = max(m_{b-1}, T_b)``, FlashAttention's running max;
   ``"running_integer"`` ``m_b = max(m_{b-1}, ceil T_b)``: rescales are powers of two;
   ``"block_integer"``   ``m_b = ceil T_b``, the block's own integer max;
   ``"block_fp32"``      ``m_b = T_b``: the block's own max, exact (its P is exactly
   ``p_shift``).  The row state is relative to ``M_b = max(m_1 .. m_b)``.
3. P bytes: ``y = fp32(S * 8c + fp32(c0 - delta - 8 m_b))`` (one FMA; ``c0 = 56 + 8
   log2(p_shift)`` is the code of ``p_shift``, 120 for 2^8; ``delta = code_offset``), then
   ``e4m3.p_codes(y, variant=p_rounding, max_code=c0)``.  The byte decodes to about
   ``p_shift * 2^(t - m_b - delta/8)``.
4. Block sums, exact: ``O_b = sum_j P_j V_j`` (at most N products of two e4m3 values:
   exact in float64 for N <= 128) and ``l_b``: the sum of the decoded P (``sum_of =
   "rounded"``; exact also in fp32 for N <= 128) or of the unrounded ``fp32(2^(y/8 - 7))``
   (``"unrounded"``: FlashAttention sums its fp32 exp2 output, not the FP8 P).
5. Merge into the fp32 row state: ``O = fp32(fp32(O * alpha) + O_b * beta)``, the same for
   ``l``, with ``alpha = 2^(M_{b-1} - M_b)`` and ``beta = 2^(m_b - M_b)``.  With the integer
   kinds both are exact powers of two (gfx950: ``beta`` is the E8M0 scale of the scaled
   MFMA's P operand, ``alpha`` an exact ``v_ldexp``/multiply when the max grows; sm_90a: the
   block is accumulated from zero and merged with one FFMA).  With the fp32 kinds they are
   ``fp32(exp2(.))``; a kernel may apply the factors in another arrangement (sm_90a: ``O =
   fma(O_b, beta, O * alpha)``; gfx950 without a second accumulator: rescale O to the
   current block's reference before the block's MFMA), which changes O only at the level
   of fp32 rounding.
6. ``out = O / l * dv`` in float64 from the fp32 state: the value before the kernel's final
   bf16 rounding (a kernel's fp32 epilogue adds <= 2 ulp of fp32).  ``lse = ln 2 * (M +
   log2(l / p_shift) + Recipe.lse_offset)``, natural log (the offset undoes ``delta`` and,
   for rounded sums of Lean bytes, their mean 4 % overestimate); a row that sees no key
   gets zeros and -inf.

What a kernel must match.  For the "lean" roundings every P byte and every ``m_b`` is a
deterministic function of the fp32 scores, so a kernel must produce the same bytes given
the same fp32 ``S``: compare with :func:`head_forward` and ``scores=`` set to the kernel's
own scores (MFMA/WGMMA round ``S`` their own way; Hopper's FP8 WGMMA accumulates with
fewer than 24 bits).  The model sums each block's ``P V`` exactly and rounds once per block;
a kernel accumulates in fp32 in its own order, so its O may differ per block by the fp32
accumulation error of at most N + 1 terms: ``|dO| <= gamma_{N+1} (|O_prev| + sum_j P_j
|V_j|)``, ``gamma_n = n 2^-24 / (1 - n 2^-24)``.  "exact" rounding is modelled with float64
``exp2``; hardware ``exp2`` is within about an fp32 ulp, so AITER/FA3-style kernels can be
compared by their errors, not byte for byte.

Serving features (window.py's windows, softcap, sinks) keep the arithmetic above: a window
only sets the scores of unseen keys to -inf (blocks stay aligned at key 0, the causal diagonal
keeps its recipe, the left edge's blocks take the plain bytes); softcap hands step 1 the capped
fp32 score in units of softcap (:func:`_capped_scores`: float64 tanh, or the recipe's
``softcap_form``, the kernel's own fp32 arithmetic: :func:`gfx950_capped_scores`); a sink joins
the fp32 row state after the last block (:func:`_join_sinks`).

Block descales (quantize_model's "block" granularity: Q one a (query head, 128-query block),
K one a (key/value head, 64-key block), V one a key/value head; blocks counted from each
sequence's first row) change only step 1, in the way each target takes them
(``Recipe.descale_blocks``, :func:`_scored`): gfx950 ("e8m0") feeds each 32-row Q and 64-key K
operand block's 2^e to the scaled MFMA as its E8M0 scale, so the fp32 scores are ``2^(eq + ek)
S`` exactly and ``c`` is that of descales 1 (powers of two only); sm_90a ("tile") keeps the
scores of the codes and rounds ``c = fp32(softmax_scale log2(e) dq dk)`` per (128-query,
64-key) tile pair, a key tile of 128 keys taking one ``c`` per half.  A block's max ``T_b`` is
then the max of the rounded ``S c`` (rounding is monotonic: the per-tensor ``fp32(max S c)``
when c is one value).  Either way, all block descales equal give the per-tensor call's bits;
for powers of two the two folds give the same bits (``S c`` is the same real number).

Cost per P element of each rounding is in :mod:`zyfa_runtime.e4m3`.  Per element, the row
max costs one ``v_max3_f32`` half-slot (gfx950) or one FMNMX (sm_90a) for every recipe;
``"unrounded"`` sums add a ``v_pk_add_f32`` half-slot or an FADD, ``"rounded"`` sums none
(a column of ones appended to V in the PV MMA).  A non-power-of-two ``alpha``/``beta``
costs ``d / (2N)`` VALU slots per element on gfx950 (``v_pk_mul_f32`` of O, as AITER does
every block) and ``d / N`` FFMA/FMUL on sm_90a (as FA3); a power of two is free on gfx950
(E8M0) and also ``d / N`` FFMA on sm_90a when blocks are accumulated separately.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from . import e4m3
from . import window as windows
from .quantize_model import K_BLOCK, Q_BLOCK, descale_rows

__all__ = ["Recipe", "RECIPES", "MAX_KINDS", "SUMS", "DIAGONALS", "BYTE_FORMS", "ASHR_EXP", "log2_scale",
           "sequence_forward", "head_forward", "HeadResult", "score_prescale", "gfx950_capped_scores"]

MAX_KINDS = ("running_fp32", "running_integer", "block_integer", "block_fp32")
SUMS = ("rounded", "unrounded")
DESCALE_BLOCKS = ("tile", "e8m0")
SOFTCAP_FORMS = ("tanh", "exp_rcp")
#: How a causal diagonal's blocks carry P (``Recipe.diagonal``).
DIAGONALS = ("same", "hi_lo", "f16")
BYTE_FORMS = ("fma", "pk_u8", "ashr_u8", "quad_fold", "quad_h2", "lean_h2")
#: The ``ashr_u8`` byte's fp32 scale: ``z = y 2^-ASHR_EXP`` is a subnormal whose bits hold
#: ``y`` to 1/256 code unit (2^-149 = 2^-ASHR_EXP / 256).
ASHR_EXP = 141
_LOG2E = 1.4426950408889634


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Every arithmetic choice of an FP8 attention forward (see the module docstring).

    ``block_keys``  N, the key-tile size the kernel must use (1..128): where the block
                    maxima are taken and, for the running kinds, how often the max moves.
    ``p_rounding``  one of ``e4m3.P_ROUNDINGS``: "lean", "lean_quad", "exact".
    ``max_kind``    one of ``MAX_KINDS`` (step 2 of the module docstring).
    ``sum_of``      "rounded" (sum of the decoded P bytes) or "unrounded" (fp32 exp2).
    ``p_shift``     the P value of a score equal to the reference max, 2^0 .. 2^8 (the
                    Lean byte needs 2^8 to use e4m3's whole range).
    ``code_offset`` delta, in code units, subtracted in the FMA constant (``LEAN_CENTRE``
                    centres the exact maximum of a "block_fp32" Lean block).
    ``byte_form``   how the Lean byte is formed from the scores: "fma" (step 3 of the
                    module docstring) or "pk_u8", gfx950's: with ``Smax`` the block's
                    maximum fp32 score and ``K = fp32(c0 - delta)``, ``U = nextafter(fp32(Smax
                    8c - K), +inf)``, ``y = fp32(S 8c - U)`` (one FMA each) and the byte
                    ``clamp(rint(y), 0, 255)`` (``v_cvt_pk_u8_f32``).  Rounding ``U`` up
                    makes ``y <= K`` for every score of the block whatever its magnitude, so
                    no byte exceeds ``c0`` (and none can be the e4m3 NaN); ``y`` differs
                    from "fma"'s by the placement of one fp32 rounding.  Needs "lean" and
                    "block_fp32".  Or "ashr_u8", gfx950's: the FMA writes ``z = (S 8c - U)
                    2^-141`` (``ASHR_EXP``), an fp32 subnormal whose bits are ``rint(256 (S
                    8c - U))``, and the byte is that shifted right by 8 with unsigned
                    saturation (``v_ashr_pk_u8_i32``, two scores an instruction; ``z < 0``
                    gives 0; ``e4m3.ashr_u8_codes``): ``floor(y + 1/2)`` with ``y + 1/2`` held
                    to 1/256 code, "pk_u8"'s ``rint(y)`` but where ``y`` lies within about
                    1/256 of a tie.  In code units (the kernel's fp32 values times 2^141):
                    ``U0 = fp32(Smax 8c - (K + 1/2))`` with ``K + 1/2`` held to 1/256 code,
                    ``Ub = fp32(U0 + |U0| 2^-23)`` (at least an ulp up where ``U0`` is
                    normal; a subnormal ``U0`` is within 1/512 code), so ``y + 1/2 <= K + 1/2
                    + 2^-9`` for every score and no byte passes ``c0``; ``U = Ub``, or with
                    ``exact_within`` ``fp32(Ub + 8 f)``, which places a lattice block (below).
                    Needs "lean" and "block_fp32".  Or "quad_fold" (sm_90a/fold's): ``w`` as
                    for "lean_h2" below (one FMA) and ``e4m3.quad_fold_codes(w)``,
                    the "lean_quad" byte in 4 FMA-pipe instructions instead of 6.  Or
                    "quad_h2" (sm_90a/quad's): the same ``w`` and ``e4m3.quad_h2_codes(w)``, the
                    correction in half precision, two scores an instruction.  Both need
                    "lean_quad" and "block_fp32".  Or "lean_h2", sm_90a's: ``w = fp32(S c
                    + fp32(fp32(16 + (c0 - delta)/8) - m_b))`` (the constant rounded once,
                    then the subtraction: the kernel's two fp32 steps) and
                    ``e4m3.lean_h2_codes(w)``, the "lean" byte held to 1/8 code in f16 and
                    rounded onto the f16 subnormals; needs "lean" and "block_fp32".
    ``diagonal``    "same", or "hi_lo": with a causal mask, the key blocks that the diagonal
                    of a row's group of ``diagonal_rows`` rows cuts (the group's first row
                    does not see the block's last key: the blocks a kernel masks for those
                    rows) carry P in two e4m3 terms, ``e4m3.hi_lo_codes(u)`` (about 2^-10
                    relative instead of one byte's 2^-5, RMS), both multiplied with V and
                    both in the rounded sum.  These are the keys nearest each query, where
                    a model's attention is most local and a row near the start of a sequence
                    has all its keys.  ``u = fp32(S c + fp32(log2(p_shift) - m_b))`` (log2
                    of p_shift P: 8 at the block max), with no centring offset (the two terms carry no Lean bias to cancel); needs
                    "block_fp32".  Only where ``d_v <=
                    diagonal_dv`` (``diagonal_at``): sm_90a's d_v = 256 consumer holds no
                    second P beside its 256-wide O and block accumulator.  Or "f16", built
                    for sm_90a, measured and not kept (slower: docs/sm90a.md): those blocks
                    carry P as ``X = f16(2^u)`` itself (``e4m3.exp2_f16``: the first step of
                    "hi_lo" without its cut below 2^-7; about 2^-12 relative, RMS), one product
                    with an f16 V (the e4m3 values exactly) and X in the rounded sum
                    (docs/numerics.md).
    ``exact_within`` None (every block rescaled to its own exact max), or delta in (-8, 64)
                    with byte_form "ashr_u8": an adaptive merge, studied for gfx950 and not
                    adopted (docs/gfx950_fp8.md).  A row keeps its running max ``M`` and a
                    reference ``R`` (fp32; -inf before its first key).  A block it sees, with
                    ``T = fp32(Smax c)``, is exact unless ``fp32(M - T) > delta``: exact blocks
                    take ``M = max(M, T)``, ``kf = ceil(M - T)``, ``R = fp32(T + kf)`` and
                    rescale O and l by ``fp32(2^e)``, ``e = fp32(fp32(R_old - T) - kf)``;
                    the others go on R's lattice: ``kf = floor(fp32(R - T))``, ``R`` kept, no
                    rescale, bytes relative to ``R - kf`` (``U = fp32(Ub + 8 f)``, ``f =
                    fp32(R - T) - kf``: the block's maximum gets code ``c0 - 8 f``).  The
                    block's factor is ``2^-kf`` (E8M0).  A negative delta is headroom: blocks
                    up to ``-delta`` above the running max stay on the lattice (``kf < 0``).
                    Rows that see none of a block keep their state.
    ``exact_unit``  "row" (each row decides alone) or "wave": a block is exact for all 32 rows
                    of a kernel wave (query rows 32w .. 32w + 31 of a sequence) when it is for
                    one of them (the wave rescales O anyway), on the lattice otherwise.
    ``descale_blocks`` how the target takes block descales (quantize_model's "block"
                    granularity: one a 128-query block of a query head, one a 64-key block of
                    a key/value head; module docstring, "Block descales"): "tile" (sm_90a's:
                    folded into the score scale, ``c`` rounded to fp32 per (query block, key
                    block)) or "e8m0" (gfx950's: powers of two only, as E8M0 operand scales of
                    the scaled MFMA; ``c`` stays that of descales 1).
    ``softcap_form`` how the capped score is formed (:func:`_capped_scores`): "tanh" (float64
                    tanh, rounded once: a kernel's tanh is within its measured error of it: docs/sm90a.md)
                    or "exp_rcp" (gfx950's: the kernel's fp32 instructions,
                    :func:`gfx950_capped_scores`, so that bytes compare exactly).
    Sweep a study with ``recipe.replace(field=value, ...)``.
    """

    name: str
    block_keys: int
    p_rounding: str = "lean"
    max_kind: str = "block_integer"
    sum_of: str = "rounded"
    p_shift: float = 256.0
    code_offset: float = 0.0
    byte_form: str = "fma"
    diagonal: str = "same"
    diagonal_rows: int = 64
    diagonal_dv: int = 128
    exact_within: float | None = None
    exact_unit: str = "row"
    descale_blocks: str = "tile"
    softcap_form: str = "tanh"

    def __post_init__(self):
        if not (isinstance(self.block_keys, int) and 1 <= self.block_keys <= 128):
            raise ValueError(f"block_keys must be an int in 1..128 (exact block sums), "
                             f"got {self.block_keys!r}")
        if self.p_rounding not in e4m3.P_ROUNDINGS:
            raise ValueError(f"p_rounding must be one of {e4m3.P_ROUNDINGS}")
        if self.max_kind not in MAX_KINDS:
            raise ValueError(f"max_kind must be one of {MAX_KINDS}")
        if self.sum_of not in SUMS:
            raise ValueError(f"sum_of must be one of {SUMS}")
        if self.byte_form not in BYTE_FORMS:
            raise ValueError(f"byte_form must be one of {BYTE_FORMS}, got {self.byte_form!r}")
        if self.byte_form == "pk_u8" and (self.p_rounding, self.max_kind) != ("lean", "block_fp32"):
            raise ValueError("byte_form 'pk_u8' is defined for lean bytes with a block_fp32 max")
        if self.byte_form in ("quad_fold", "quad_h2") and \
                (self.p_rounding, self.max_kind) != ("lean_quad", "block_fp32"):
            raise ValueError(f"byte_form {self.byte_form!r} is defined for lean_quad bytes with a "
                             "block_fp32 max")
        if self.byte_form == "ashr_u8" and (self.p_rounding, self.max_kind) != ("lean", "block_fp32"):
            raise ValueError("byte_form 'ashr_u8' is defined for lean bytes with a block_fp32 max")
        if self.exact_within is not None and not (
                self.byte_form == "ashr_u8" and self.diagonal == "same" and -8 < self.exact_within < 64):
            raise ValueError("exact_within (-8 < delta < 64) is defined for byte_form 'ashr_u8' "
                             "without a two-term diagonal")
        if self.descale_blocks not in DESCALE_BLOCKS:
            raise ValueError(f"descale_blocks must be one of {DESCALE_BLOCKS}, got {self.descale_blocks!r}")
        if self.softcap_form not in SOFTCAP_FORMS:
            raise ValueError(f"softcap_form must be one of {SOFTCAP_FORMS}, got {self.softcap_form!r}")
        if self.exact_unit not in ("row", "wave"):
            raise ValueError(f"exact_unit must be 'row' or 'wave', got {self.exact_unit!r}")
        if self.byte_form == "lean_h2" and (self.p_rounding, self.max_kind) != ("lean", "block_fp32"):
            raise ValueError("byte_form 'lean_h2' is defined for lean bytes with a block_fp32 max")
        if self.diagonal not in DIAGONALS:
            raise ValueError(f"diagonal must be one of {DIAGONALS}, got {self.diagonal!r}")
        if self.diagonal != "same" and self.max_kind != "block_fp32":
            raise ValueError(f"diagonal {self.diagonal!r} is defined for a block_fp32 max")
        if not (isinstance(self.diagonal_rows, int) and self.diagonal_rows >= 1):
            raise ValueError(f"diagonal_rows must be a positive int, got {self.diagonal_rows!r}")
        if not 0 <= self.code_offset < 8:
            raise ValueError(f"code_offset must be in [0, 8), got {self.code_offset!r}")
        k = math.log2(self.p_shift) if self.p_shift > 0 else -1
        if k != int(k) or not 0 <= k <= 8:
            raise ValueError(f"p_shift must be 2^0 .. 2^8, got {self.p_shift!r}")

    def diagonal_at(self, d_v: int) -> bool:
        """Whether a causal forward with value head dim ``d_v`` takes its diagonal blocks in the
        recipe's ``diagonal`` form (two terms, or f16) rather than in one byte."""
        return self.diagonal != "same" and d_v <= self.diagonal_dv

    @property
    def block_scale(self) -> bool:
        """Whether each key block has its own reference max (the "block" kinds)."""
        return self.max_kind.startswith("block")

    @property
    def c0(self) -> int:
        """The e4m3 code of ``p_shift``: the byte of the row's (or block's) maximum."""
        return 56 + 8 * int(math.log2(self.p_shift))

    @property
    def lse_offset(self) -> float:
        """Added to ``M + log2(l / p_shift)`` (log2 units) to form the LSE: ``delta / 8``
        undoes the offset of the FMA constant, and with "lean" bytes summed as rounded,
        ``- LEAN_CENTRE / 8`` removes their mean overestimate (about 4 %)."""
        lean_sum = self.p_rounding == "lean" and self.sum_of == "rounded"
        return self.code_offset / 8 - (e4m3.LEAN_CENTRE / 8 if lean_sum else 0.0)

    @property
    def w_constant(self) -> np.float32:
        """``fp32(16 + (c0 - delta)/8)``: the ``w`` of a block's maximum in the quad and
        lean_h2 forms (``w = fp32(S c + fp32(w_constant - m_b))``), which a kernel holds as
        a constant; the two-term diagonal's is that of ``c0`` alone (no centring)."""
        return _fp32(16.0 + (self.c0 - self.code_offset) / 8.0)

    @property
    def ashr_constant(self) -> np.float32:
        """The fp32 subnormal ``(K + 1/2) 2^-141`` that the "ashr_u8" kernel subtracts, ``K +
        1/2 = c0 - delta + 1/2`` held to 1/256 code."""
        return np.float32(np.ldexp(np.rint(256.0 * (self.c0 - self.code_offset + 0.5)), -8 - ASHR_EXP))

    def replace(self, **changes) -> "Recipe":
        """A copy with ``changes``; unless ``name`` is given it is derived from them."""
        if "name" not in changes:
            changes["name"] = self.name + "".join(f"/{k}={v}" for k, v in changes.items())
        return dataclasses.replace(self, **changes)


def _recipes() -> dict[str, Recipe]:
    """The named recipes: targets, baselines and the ablations of the accuracy study.

    The targets were chosen by the accuracy study (``bench/accuracy.py``, results and
    reasons in ``docs/numerics.md``): per target, the most accurate recipe whose P costs
    fit under the target's matrix-pipe budget per KV tile, or, where the kernel is bound by
    instruction issue (sm_90a), the most accurate whose issue slots it can afford.

    * "gfx950": Lean P with the block's exact fp32 max and the centring offset, rounded
      sum, 64-key blocks: 2 VALU slots per P element plus the O rescale (d / 2N).
    * "sm_90a": the same Lean P (centred, exact fp32 block max, rounded sum) over 128-key
      blocks, the byte held to 1/8 code in half precision, two scores an instruction: 1.5
      FMA-pipe + 0.75 other instructions per element, no MUFU; causal, at d_v <= 128, the
      blocks the diagonal of each 64-row group cuts take P in two e4m3 terms
      (``diagonal="hi_lo"``; "sm_90a/one" is the recipe without them).  "sm_90a/quad": the
      quadratic mantissa correction in half precision, 2.5 + 1.25 ("sm_90a/fold": the same
      byte in fp32, 4 + 1.5; "sm_90a/fma": the FMA form, 6 + 1.5), about 0.85x the error for
      more issue slots than the kernels can afford (docs/numerics.md).

    Kernels take their P arithmetic from these two entries.  "lean64" / "lean128" are the
    first design (Lean P, integer block max, rounded sum) from which the ablations are
    named ``base/change``.
    """
    r = {
        # AITER's gfx950 FP8 forward: exp2 then RNE cast of P in [0, 1], fp32 running max,
        # fp32 sum of the unrounded P.
        "aiter": Recipe("aiter", 128, "exact", "running_fp32", "unrounded", 1.0),
        # FlashAttention-3 FP8: the same with P scaled by 2^8 before the cast.
        "fa3": Recipe("fa3", 128, "exact", "running_fp32", "unrounded", 256.0),
        # The first zyfa design: Lean P, per-block integer max (free E8M0 scale), rounded sum.
        "lean64": Recipe("lean64", 64, "lean", "block_integer", "rounded", 256.0),
        "lean128": Recipe("lean128", 128, "lean", "block_integer", "rounded", 256.0),
        # The targets (see the docstring).
        "gfx950": Recipe("gfx950", 64, "lean", "block_fp32", "rounded", 256.0, e4m3.LEAN_CENTRE,
                         "ashr_u8", descale_blocks="e8m0", softcap_form="exp_rcp"),
        "sm_90a": Recipe("sm_90a", 128, "lean", "block_fp32", "rounded", 256.0, e4m3.LEAN_CENTRE,
                         "lean_h2", "hi_lo"),
        # sm_90a's recipe until the kernels showed the quadratic correction's cost.
        "sm_90a/quad": Recipe("sm_90a/quad", 128, "lean_quad", "block_fp32", "rounded", 256.0, 0.0,
                              "quad_h2", "hi_lo"),
    }
    r["sm_90a/one"] = r["sm_90a"].replace(name="sm_90a/one", diagonal="same")
    r["sm_90a/f16"] = r["sm_90a"].replace(name="sm_90a/f16", diagonal="f16")
    # gfx950's byte until the subnormal FMA and v_ashr_pk_u8_i32: v_cvt_pk_u8_f32
    r["gfx950/pk_u8"] = r["gfx950"].replace(name="gfx950/pk_u8", byte_form="pk_u8")
    r["sm_90a/fold"] = r["sm_90a/quad"].replace(name="sm_90a/fold", byte_form="quad_fold")
    r["sm_90a/fma"] = r["sm_90a/quad"].replace(name="sm_90a/fma", byte_form="fma")
    changes = {
        "exact": dict(p_rounding="exact"),
        "lean_quad": dict(p_rounding="lean_quad"),
        "running": dict(max_kind="running_integer"),
        "unrounded": dict(sum_of="unrounded"),
        "shift1": dict(p_shift=1.0),
        "bfp32": dict(max_kind="block_fp32"),
        "bfp32c": dict(max_kind="block_fp32", code_offset=e4m3.LEAN_CENTRE),
        "quad-bfp32": dict(max_kind="block_fp32", p_rounding="lean_quad"),
    }
    for base in ("lean64", "lean128"):
        for tag, change in changes.items():
            r[f"{base}/{tag}"] = r[base].replace(name=f"{base}/{tag}", **change)
    for tag, change in {"rounded": dict(sum_of="rounded"), "block": dict(max_kind="block_integer"),
                        "bfp32": dict(max_kind="block_fp32")}.items():
        r[f"fa3/{tag}"] = r["fa3"].replace(name=f"fa3/{tag}", **change)
    return r


#: Named recipes: "aiter", "fa3", "gfx950", "sm_90a" and ablations named "base/change".
RECIPES: dict[str, Recipe] = _recipes()


def log2_scale(softmax_scale: float, dq: float, dk: float) -> np.float32:
    """``c = fp32(softmax_scale * log2(e) * fp32(dq) * fp32(dk))``, product in float64.

    The runtime must pass the kernel this very constant (and ``8c``, exact), so that the
    kernel's fp32 P arithmetic equals the model's.
    """
    return np.float32(float(softmax_scale) * _LOG2E * float(np.float32(dq)) * float(np.float32(dk)))


def _fp32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def _ashr_u(smax_c8, recipe: Recipe) -> np.ndarray:
    """``Ub`` of the "ashr_u8" byte for the blocks' largest products ``Smax 8c`` (float64,
    exact products of fp32 values), as the kernel's fp32 value (scaled by 2^-ASHR_EXP):
    ``U0 = fp32(Smax 8c - (K + 1/2))`` (one FMA), ``Ub = fp32(U0 + |U0| 2^-23)`` (one FMA)."""
    u0 = e4m3.fma32(np.ldexp(smax_c8, -ASHR_EXP), -recipe.ashr_constant)
    with np.errstate(invalid="ignore"):
        return e4m3.fma32(np.abs(u0.astype(np.float64)) * 2.0 ** -23, u0)


def _ashr_codes(scores, c8, u) -> np.ndarray:
    """The "ashr_u8" bytes of fp32 ``scores`` (..., n) against the kernel's fp32 ``U`` (...)."""
    return e4m3.ashr_u8_codes(scores.astype(np.float64) * np.asarray(c8, np.float64),
                              np.ldexp(u.astype(np.float64), ASHR_EXP)[..., None])


def _adaptive_blocks(sb, v1b, recipe: Recipe, c: np.float32):
    """The adaptive merge of ``Recipe.exact_within`` over the key blocks of a chunk of rows,
    block by block (each block's bytes depend on the reference the earlier blocks left).
    ``sb`` (H, R, nb, n) fp32 scores (-inf where unseen), ``v1b`` (H, nb, n, Dv + 1).
    Returns O (H, R, Dv) and l (H, R) fp32, the final reference R (float64), the codes
    (H, R, nb, n), each block's reference ``R - kf`` (H, R, nb) and where it is exact."""
    h, rows, nb, n = sb.shape
    dv = v1b.shape[-1] - 1
    c8 = np.float32(8) * c
    delta = np.float32(recipe.exact_within)
    r = np.full((h, rows), -np.inf, np.float32)
    m = np.full((h, rows), -np.inf, np.float32)
    o = np.zeros((h, rows, dv), np.float32)
    l = np.zeros((h, rows), np.float32)
    codes = np.zeros(sb.shape, np.uint8)
    ref = np.full((h, rows, nb), -np.inf)
    resc = np.zeros((h, rows, nb), bool)
    for b in range(nb):
        blk = sb[:, :, b]
        smax = blk.max(axis=2)
        seen = np.isfinite(smax)
        sm = np.where(seen, smax, np.float32(0))
        t = _fp32(sm.astype(np.float64) * float(c))
        with np.errstate(invalid="ignore"):
            lattice = seen & ((m - t) > delta)
            if recipe.exact_unit == "wave":     # the chunk's rows start at a multiple of 32
                want = np.pad(seen & ~lattice, ((0, 0), (0, -rows % 32)))
                wave = want.reshape(h, -1, 32).any(axis=2).repeat(32, axis=1)[:, :rows]
                lattice = seen & ~wave
            exact = seen & ~lattice
            m = np.where(seen, np.maximum(m, t), m)
            d = r - t                                          # fp32
            kf = np.where(lattice, np.floor(d), np.ceil(m - t)).astype(np.float32)
            e = (d - kf).astype(np.float32)
            f = np.where(lattice, e, np.float32(0))
        u = e4m3.fma32(f.astype(np.float64) * 2.0 ** (3 - ASHR_EXP),
                       _ashr_u(sm.astype(np.float64) * float(c8), recipe))
        r_new = np.where(exact, (t + kf).astype(np.float32), r)
        with np.errstate(over="ignore"):
            x = np.where(exact, _fp32(np.exp2(e.astype(np.float64))), 1).astype(np.float64)
        kk = np.clip(np.nan_to_num(kf.astype(np.float64), nan=0.0), -127, 127)
        beta = np.where(seen, np.exp2(-kk), 0.0)              # the E8M0 factor 2^-kf
        cb = np.where(seen[..., None], _ashr_codes(blk, c8, u), 0).astype(np.uint8)
        codes[:, :, b] = cb
        ob = np.matmul(e4m3.decode(cb), v1b[:, b])          # (H, R, Dv + 1), exact
        o = _fp32(_fp32(o * x[..., None]) + ob[..., :dv] * beta[..., None])
        l = _fp32(_fp32(l * x) + ob[..., dv] * beta)
        ref[:, :, b] = np.where(seen, r_new.astype(np.float64) - kf, -np.inf)
        resc[:, :, b] = exact
        r = r_new
    return o, l, r.astype(np.float64), codes, ref, resc


#: Elements of one (heads, rows, keys) score chunk: small enough to stay in cache.
_CHUNK = 1 << 17


def _forward(q, kt, v1, recipe: Recipe, c: np.float32, causal: bool, scores=None,
             trace: bool = False, window=None, fold=None):
    """The recipe for H heads of one sequence.

    ``q`` (H, Sq, D) and ``kt`` (H, D, Sk) hold decoded e4m3 values (float64), ``v1`` (H,
    Sk, Dv + 1) the decoded V with a last column of ones (the rounded row sum comes out of
    the same exact matmul).  ``scores`` (H, Sq, Sk) float32, if given, replaces ``q kt``.
    Rows are independent, so they go in chunks; within a chunk every key block is encoded
    at once and only the merge (step 5) walks the blocks.  Returns the fp32 state ``O``
    (H, Sq, Dv), ``l`` (H, Sq), the float64 ``M`` (H, Sq), and with ``trace`` the P codes
    (H, Sq, Sk) and the reference max per block (H, Sq, blocks).  ``window``: (left, right) as
    window.normalize gives it (None: ``causal``'s); where its right bound is 0 (causal) the
    recipe's ``diagonal`` applies to the blocks the diagonal cuts, the left bound's blocks
    take the plain bytes.  ``fold``: None (``c`` is one constant), or the "tile" fold of
    block descales ``(base, dq_rows (H, Sq), dk_keys (H, Sk))``, float64: the score of row i
    and key j has its own ``c = fp32(base dq_i dk_j)`` (:func:`_tile_c`).
    """
    window = window if window is not None else windows.normalize(causal, windows.NONE)
    left, right = window
    causal = right == 0
    h, sq = q.shape[:2]
    sk, dv = v1.shape[1], v1.shape[2] - 1
    if sq == 0 or sk == 0:
        return (np.zeros((h, sq, dv), np.float32), np.zeros((h, sq), np.float32),
                np.full((h, sq), -np.inf), np.zeros((h, sq, sk), np.uint8) if trace else None,
                np.zeros((h, sq, 0)) if trace else None,
                np.zeros((h, sq, sk), np.uint8) if trace else None,
                np.zeros((h, sq, 0), bool) if trace else None)
    n = recipe.block_keys
    nb_all = -(-sk // n)
    pad = nb_all * n - sk
    kt = np.pad(kt, ((0, 0), (0, 0), (0, pad)))
    v1b = np.pad(v1, ((0, 0), (0, pad), (0, 0))).reshape(h, nb_all, n, dv + 1)
    if scores is not None:
        scores = np.pad(np.asarray(scores, np.float32), ((0, 0), (0, 0), (0, pad)),
                        constant_values=-np.inf)
    c0 = recipe.c0 - recipe.code_offset
    if fold is not None:
        fold = (fold[0], fold[1], np.pad(fold[2], ((0, 0), (0, pad)), constant_values=1.0))
    off = sk - sq
    o = np.zeros((h, sq, dv), np.float32)
    l = np.zeros((h, sq), np.float32)
    m = np.full((h, sq), -np.inf)
    codes_all = np.zeros((h, sq, sk), np.uint8) if trace else None
    lo_all = np.zeros((h, sq, sk), np.uint8) if trace else None
    ref_all = np.full((h, sq, nb_all), -np.inf) if trace else None
    resc_all = np.zeros((h, sq, nb_all), bool) if trace else None
    rows = -(-max(16, _CHUNK // (h * nb_all * n)) // 32) * 32   # whole waves of 32 rows
    for r0 in range(0, sq, rows):
        r1 = min(sq, r0 + rows)
        kfirst, kend = windows.key_range(r0, r1, sq, sk, window)   # keys the chunk's rows may see
        if kend <= kfirst:
            continue
        nb = -(-kend // n)
        s = (q[:, r0:r1] @ kt[:, :, :nb * n]).astype(np.float32) if scores is None \
            else scores[:, r0:r1, :nb * n].copy()
        # the first key some row of the chunk does not see: past the right bound of its first
        # row, or key 0 where a left bound cuts its last row's keys
        j_lo = min(max(0, r0 + off + right + 1), kend) if right >= 0 else kend
        if left >= 0 and r1 - 1 + off - left > 0:
            j_lo = 0
        if j_lo < nb * n:
            cols = np.arange(j_lo, nb * n)[None, :]
            pos = np.arange(r0, r1)[:, None] + off
            seen = (cols < sk) & ((right < 0) | (cols <= pos + right)) & ((left < 0) | (cols >= pos - left))
            s[:, :, j_lo:] = np.where(seen, s[:, :, j_lo:], -np.inf)
        sb = s.reshape(h, r1 - r0, nb, n)
        if fold is not None:
            c = _tile_c(fold, r0, r1, nb * n).reshape(sb.shape)      # one c a score
        c8 = np.float32(8) * c
        if recipe.exact_within is not None:
            oc, lc, mc, codes, ref, resc = _adaptive_blocks(sb, v1b[:, :nb], recipe, c)
            o[:, r0:r1], l[:, r0:r1], m[:, r0:r1] = oc, lc, mc
            if trace:
                codes_all[:, r0:r1, :kend] = codes.reshape(h, r1 - r0, nb * n)[:, :, :kend]
                ref_all[:, r0:r1, :nb] = ref
                resc_all[:, r0:r1, :nb] = resc
            continue
        if fold is None:
            t_max = _fp32(sb.max(axis=3) * np.float64(c))           # (H, R, nb)
        else:   # rounding is monotonic: the max of the rounded products is T_b
            t_max = _fp32(sb.astype(np.float64) * c).max(axis=3)
        if recipe.max_kind == "running_fp32":
            ref = big = np.maximum.accumulate(t_max, axis=2)
        elif recipe.max_kind == "running_integer":
            ref = big = np.maximum.accumulate(np.ceil(t_max), axis=2)
        else:
            ref = np.ceil(t_max) if recipe.max_kind == "block_integer" else t_max
            big = np.maximum.accumulate(ref, axis=2)
        ref, big = ref.astype(np.float64), big.astype(np.float64)
        live = np.isfinite(ref)
        # fp32(fp32(16 + c0/8) - m_b): the constant of w = y/8 + 16, the quad and lean_h2
        # forms' argument (0 where the block has no reference: its scores are -inf); the
        # diagonal terms' u = log2 x, fp32(log2(p_shift) - m_b), has no centring offset (they carry
        # no Lean bias to cancel).
        def w_bias_at(k16):
            return _fp32(np.where(live, np.float64(k16) - np.where(live, ref, 0.0), 0.0))[..., None]
        w_bias = w_bias_at(recipe.w_constant)
        if recipe.byte_form == "ashr_u8":
            with np.errstate(invalid="ignore"):
                smax_c8 = sb.max(axis=3).astype(np.float64) * float(c8) if fold is None else \
                    (sb.astype(np.float64) * c8).max(axis=3)
                u = _ashr_u(smax_c8, recipe)
                codes = _ashr_codes(sb, c8, u)
                y = _fp32(sb.astype(np.float64) * np.asarray(c8, np.float64) - 0.5
                          - np.ldexp(u.astype(np.float64), ASHR_EXP)[..., None])
        elif recipe.byte_form == "pk_u8":
            kc = np.float32(c0)
            with np.errstate(invalid="ignore"):
                top = e4m3.fma_f32(sb.max(axis=3), c8, -kc) if fold is None else \
                    e4m3.fma32((sb.astype(np.float64) * c8).max(axis=3), -kc)
                u = np.nextafter(top, np.float32(np.inf))
                y = e4m3.fma_f32(sb, c8, -u[..., None])
            codes = np.clip(np.rint(np.nan_to_num(y, nan=0.0, neginf=0.0)), 0, 255).astype(np.uint8)
        elif recipe.byte_form in ("quad_fold", "quad_h2", "lean_h2"):
            w = e4m3.fma_f32(sb, c, w_bias)
            byte = {"quad_fold": e4m3.quad_fold_codes, "quad_h2": e4m3.quad_h2_codes,
                    "lean_h2": e4m3.lean_h2_codes}[recipe.byte_form]
            codes = byte(w, max_code=recipe.c0)
            y = _fp32((w.astype(np.float64) - 16.0) * 8.0)        # for an "unrounded" sum
        else:
            bias = _fp32(np.where(live, c0 - 8.0 * np.where(live, ref, 0.0), 0.0))
            y = e4m3.fma_f32(sb, c8, bias[..., None])
            codes = e4m3.p_codes(y, variant=recipe.p_rounding, max_code=recipe.c0)
        pd = e4m3.decode(codes)
        if causal and recipe.diagonal_at(dv):
            # The blocks the causal diagonal of each row's group cuts: the group's first row
            # (g0) does not see the block's last key.
            g = recipe.diagonal_rows
            g0 = (np.arange(r0, r1) // g) * g
            cut = (np.arange(nb)[None, :] * n + n - 1) > (g0 + off)[:, None]        # (R, nb)
            sel = np.broadcast_to(cut[None, :, :, None], pd.shape)
            u_diag = w_bias_at(_fp32(np.log2(recipe.p_shift)))   # log2 x: no centring offset
            c_sel = c if fold is None else c[sel]
            u_sel = e4m3.fma_f32(sb[sel], c_sel, np.broadcast_to(u_diag, sb.shape)[sel])
            if recipe.diagonal == "hi_lo":
                hi, lo = e4m3.hi_lo_codes(u_sel)
                pd[sel] = e4m3.decode(hi) + e4m3.decode(lo)
            else:   # "f16": X itself; the trace keeps X's nearest byte, no second term
                x16 = e4m3.exp2_f16(u_sel)
                hi, lo = e4m3.encode(x16, saturate=True), np.zeros(x16.shape, np.uint8)
                pd[sel] = x16.astype(np.float64)
            codes[sel] = hi
            if trace:
                lo_blk = np.zeros(codes.shape, np.uint8)
                lo_blk[sel] = lo
        ob = np.matmul(pd.transpose(0, 2, 1, 3), v1b[:, :nb])  # (H, nb, R, Dv+1)
        if recipe.sum_of == "rounded":
            lb = ob[..., dv].transpose(0, 2, 1)
        else:
            lb = _fp32(_fp32(np.exp2(y.astype(np.float64) / 8 - 7)).sum(axis=3, dtype=np.float64))
        prev = np.concatenate([np.full((h, r1 - r0, 1), -np.inf), big[..., :-1]], axis=2)
        with np.errstate(invalid="ignore"):
            alpha = np.where(np.isfinite(prev), np.exp2(prev - big), 0.0)
            beta = np.where(live, np.exp2(ref - big), 0.0)
        if recipe.max_kind in ("running_fp32", "block_fp32"):
            alpha, beta = _fp32(alpha).astype(np.float64), _fp32(beta).astype(np.float64)
        oc = np.zeros((h, r1 - r0, dv), np.float32)
        lc = np.zeros((h, r1 - r0), np.float32)
        for b in range(nb):
            a, bt = alpha[..., b], beta[..., b]
            oc = _fp32(_fp32(oc * a[..., None]) + ob[:, b, :, :dv] * bt[..., None])
            lc = _fp32(_fp32(lc * a) + lb[..., b] * bt)
        o[:, r0:r1], l[:, r0:r1], m[:, r0:r1] = oc, lc, big[..., -1]
        if trace:
            codes_all[:, r0:r1, :kend] = codes.reshape(h, r1 - r0, nb * n)[:, :, :kend]
            if causal and recipe.diagonal_at(dv):
                lo_all[:, r0:r1, :kend] = lo_blk.reshape(h, r1 - r0, nb * n)[:, :, :kend]
            ref_all[:, r0:r1, :nb] = ref
            resc_all[:, r0:r1, :nb] = live
    return o, l, m, codes_all, ref_all, lo_all, resc_all


def _finish(o, l, m, recipe: Recipe, dv, sinks=None):
    """out (H, Sq, Dv) and natural-log lse (H, Sq) in float64 from the fp32 state; ``dv`` one
    value or one a head (H,); ``sinks`` (H,) fp32 logits or None (:func:`_join_sinks`)."""
    if sinks is not None:
        o, l, m = _join_sinks(o, l, m, recipe, sinks)
    l64 = l.astype(np.float64)
    live = l64 > 0
    safe = np.where(live, l64, 1.0)
    dv = float(np.float32(dv)) if np.ndim(dv) == 0 else np.asarray(dv, np.float32).astype(np.float64)[:, None, None]
    out = np.where(live[..., None], o.astype(np.float64) / safe[..., None] * dv, 0.0)
    lse = np.where(live, math.log(2) * (np.where(live, m, 0.0) + np.log2(safe)
                                        - math.log2(recipe.p_shift) + recipe.lse_offset),
                   -np.inf)
    return out, lse


def _join_sinks(o, l, m, recipe: Recipe, sinks):
    """A sink logit ``z`` per head joins each row's state as one more term of the row sum,
    with no value.  In the row's log2 units (those of ``M``, where a key of natural-log score
    s weighs about ``p_shift 2^(s log2 e - M - lse_offset)`` in l) the sink sits at ``ms -
    lse_offset``, ``ms = fp32(z fp32(log2 e))``.  Where it is below ``M`` it adds ``fp32(p_shift
    2^(ms - lse_offset - M))`` to l; above, the row moves to it: ``a = fp32(2^(M - ms +
    lse_offset))``, ``l = fp32(fp32(l a) + p_shift)``, O times a, ``M = ms - lse_offset`` (so
    that neither term overflows fp32, whichever dominates).  A row that saw no key (M = -inf)
    gets l = p_shift, O = 0: zeros, and the LSE of the sink alone.  The exp2 is float64 (a
    kernel's hardware exp2 is within about an fp32 ulp)."""
    ms = _fp32(np.asarray(sinks, np.float32).astype(np.float64) * float(np.float32(_LOG2E)))[:, None]
    zs = ms.astype(np.float64) - recipe.lse_offset                 # (H, 1), float64
    above = zs > m
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.where(above, _fp32(np.exp2(np.where(above, m - zs, 0.0))), np.float32(1)).astype(np.float32)
        add = np.where(above, np.float32(recipe.p_shift),
                       _fp32(recipe.p_shift * np.exp2(np.where(above, 0.0, zs - m)))).astype(np.float32)
    l = np.where(above, _fp32(_fp32(l * a) + add), _fp32(l + add))
    o = np.where(above[..., None], _fp32(o * a[..., None]), o)
    return o, l, np.where(above, zs, m)


def _capped_scores(qh, kt, scale: float, dq, dk, softcap: float, form: str = "tanh"):
    """The softcapped scores a kernel hands the recipe, and its log2 constant: ``S`` the fp32
    score (exact, as step 1), ``x = fp32(S a)`` with ``a = fp32(scale dq dk / softcap)``, the
    capped score ``fp32(tanh(x))`` (float64 tanh: a kernel's hardware tanh is within its
    measured error of it, not byte for byte), in units of ``softcap``: the recipe's ``c`` is
    then ``fp32(softcap log2 e)``.  ``dq``, ``dk``: one value each, or with the "tile" fold of
    block descales (H, Sq, 1) and (H, 1, Sk): ``a`` per score.  ``form`` "exp_rcp": the capped
    score of :func:`gfx950_capped_scores` instead (the same units and ``c``)."""
    if form == "exp_rcp":
        s = (qh @ kt).astype(np.float32)
        return (gfx950_capped_scores(s, softcap, np.float32(float(scale) / float(softcap)), dq, dk),
                np.float32(float(softcap) * _LOG2E))
    if np.ndim(dq) == 0 and np.ndim(dk) == 0:
        a = np.float32(float(scale) * float(np.float32(dq)) * float(np.float32(dk)) / float(softcap))
    else:
        a = _fp32(float(scale) * _f32_64(dq) * _f32_64(dk) / float(softcap))
    s = (qh @ kt).astype(np.float32)
    x = _fp32(s.astype(np.float64) * np.asarray(a, np.float64))
    return _fp32(np.tanh(x.astype(np.float64))), np.float32(float(softcap) * _LOG2E)


def score_prescale(c) -> int:
    """gfx950's ``es``: the scores' E8M0 prescale 2^-es (the QK MFMA's scale of Q^T) for the log2
    constant ``c``, ``clamp(ASHR_EXP + 1 - (exponent field of fp32(8c)), 0, 127)``, so that ``8c
    2^(es - ASHR_EXP)`` is a normal fp32."""
    field = int((np.float32(8 * np.float32(c)).view(np.uint32) >> 23) & 0xFF)
    return int(np.clip(ASHR_EXP + 1 - field, 0, 127))


def gfx950_capped_scores(s, softcap, softcap_scale, dq=1.0, dk=1.0) -> np.ndarray:
    """The capped scores ``T ~ tanh(x)``, ``x = S softcap_scale dq dk``, of the gfx950 FP8 kernel
    (``generator/gfx950_fp8.py``: _cap_constants, _cap), for fp32 scores ``S`` and the call's fp32
    ``softcap_scale = fp32(softmax_scale / softcap)``: its fp32 instructions one by one, with
    ``es = score_prescale(fp32(softcap log2 e))`` (the kernel's scores are ``S' = S 2^-es``)::

        kc = fp32(softcap_scale (2 log2 e) dq dk 2^es)    float64 products, in this order
        e  = fp32(S' kc);  E = fp32(2^e), a subnormal flushed to 0 (v_exp_f32)
        D  = fp32(E + 1);  R = fp32(1 / D)                 (v_rcp_f32)
        T' = fp32(2^-es - 2^(1-es) R)  (one FMA);  T = T' 2^es

    so ``T = tanh(x)`` where exact (``1 - 2 / (1 + e^(2x))``), -1 and 1 in the limits (E = 0 or
    inf), never NaN for finite scores.  v_exp_f32 and v_rcp_f32 are taken correctly rounded, as
    the emulator takes them (zyfa_emulator.valu), so the kernel's bytes compare exactly there.
    Error against float64 ``tanh(x)``: the roundings of kc and e move 2x by 2 x 2^-24 relative
    (|dR| <= R (1 - R) 2|x| 2^-24 x 2 <= 0.45 x 2^-24), E's 2^-24 (<= 0.25 x 2^-24), D's and R's
    (<= 2 x 2^-24), T's 2^-25: ``|T - tanh(x)| <= 2 x 2.7 x 2^-24 + 2^-25 < 6 x 2^-24``
    (hardware's 1-ulp v_exp_f32 and v_rcp_f32 about double the E, D and R terms: < 11 x 2^-24,
    where a byte may differ by one from this model's if its score lies that near a rounding
    boundary)."""
    c = np.float32(float(np.float32(softcap)) * _LOG2E)
    es = score_prescale(c)
    kc = np.float64(np.float32(softcap_scale)) * (2.0 * _LOG2E) * _f32_64(dq) * _f32_64(dk)
    kc = _fp32(np.ldexp(kc, es)).astype(np.float64)
    sp = _fp32(np.ldexp(np.asarray(s, np.float32).astype(np.float64), -es)).astype(np.float64)
    e = _fp32(sp * kc)
    with np.errstate(over="ignore", divide="ignore"):
        big = _fp32(np.exp2(e.astype(np.float64)))
        big = np.where(np.abs(big) < np.float32(2.0 ** -126), np.float32(0), big)
        d = _fp32(big.astype(np.float64) + 1.0)
        r = _fp32(1.0 / d.astype(np.float64))
    t = e4m3.fma32(r.astype(np.float64) * -2.0 ** (1 - es), np.float32(2.0 ** -es))
    return _fp32(np.ldexp(t.astype(np.float64), es))


def _check_features(window, softcap, sinks, hq: int):
    left, right = (int(x) for x in window)
    if left < -1 or right < -1:
        raise ValueError(f"window_size bounds are -1 (none) or >= 0, got {window}")
    if not (np.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be finite and >= 0, got {softcap!r}")
    if sinks is not None and np.asarray(sinks).shape != (hq,):
        raise ValueError(f"sinks has shape {np.asarray(sinks).shape}, not (heads_q,) = ({hq},)")


def _recipe(recipe) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    try:
        return RECIPES[recipe]
    except KeyError:
        raise ValueError(f"unknown recipe {recipe!r}; known: {sorted(RECIPES)}") from None


def _check_scalars(softmax_scale, descales):
    if not softmax_scale > 0:
        raise ValueError(f"softmax_scale must be positive, got {softmax_scale!r}")
    for d in descales:
        a = np.asarray(d, np.float32)
        if not (np.isfinite(a).all() and (a > 0).all()):
            raise ValueError(f"descales must be positive and finite, got {d!r}")


def _f32_64(x) -> np.ndarray:
    """fp32-rounded values as float64 (how a kernel reads an fp32 descale)."""
    return np.asarray(x, np.float32).astype(np.float64)


def _tile_c(fold, r0: int, r1: int, width: int) -> np.ndarray:
    """The "tile" fold's ``c`` of rows r0..r1 and keys 0..width: (H, R, width) fp32, ``c =
    fp32(softmax_scale log2(e) dq_i dk_j)`` with the products in :func:`log2_scale`'s order."""
    base, dq_rows, dk_keys = fold
    return _fp32(base * dq_rows[:, r0:r1, None] * dk_keys[:, None, :width])


def _block_descales(descale_q, descale_k, descale_v, sq: int, sk: int, kv) -> tuple:
    """Block descales of one sequence as the recipe reads them: ``descale_q`` one value or
    (Hq, nQ) (a 128-query block each), ``descale_k`` one value or (Hkv, nK) (64 keys each),
    ``descale_v`` one value or (Hkv,); ``kv`` (Hq,): each query head's key/value head.
    Returns float64 (Hq, Sq) and (Hq, Sk) per row and key, and descale_v (Hq,)."""

    hq = len(kv)
    dq = _f32_64(descale_q)
    dq = np.full((hq, sq), dq) if dq.ndim == 0 else descale_rows(dq, sq, Q_BLOCK)
    dk = _f32_64(descale_k)
    dk = np.full((hq, sk), dk) if dk.ndim == 0 else descale_rows(dk, sk, K_BLOCK)[kv]
    dv = _f32_64(descale_v)
    dv = np.full(hq, dv) if dv.ndim == 0 else dv[kv]
    if dq.shape != (hq, sq):
        raise ValueError(f"descale_q blocks have {dq.shape[0]} heads, not heads_q = {hq}")
    return dq, dk, dv


def _is_pow2(x) -> bool:
    m, _ = np.frexp(np.asarray(x, np.float64))
    return bool((m == 0.5).all())


def _scored(qh, kt, recipe: Recipe, scale: float, descale_q, descale_k, descale_v, softcap, kv):
    """What step 1 hands ``_forward`` for one sequence's heads (qh (H, Sq, D), kt (H, D, Sk),
    decoded e4m3): ``(qh, kt, scores, c, fold, dv)``.  One value each: ``c`` from
    :func:`log2_scale`.  Block descales (:func:`_block_descales`), by ``recipe.descale_blocks``:

    * "e8m0" (gfx950): every descale a power of two 2^e, the E8M0 scale of its operand block
      (a 128-query block is four 32-row A blocks, a 64-key block one B block): the MFMA's
      scores are ``2^(eq_i + ek_j) S_ij`` exactly (scaling a float64 operand by 2^e is exact,
      and so is the fp32 rounding of the scaled sum), and ``c = log2_scale(scale, 1, 1)``, the
      kernel's constant for descales 1.  With all descales equal to 2^e this is the per-tensor
      call bit for bit: ``S c`` is the same real number either way.
    * "tile" (sm_90a): the fp32 scores of the codes, and per (query block, key block) ``c =
      fp32(scale log2(e) dq dk)`` (``fold``; with softcap the fold goes into the cap's ``a``):
      the kernel loads the descales of its 128-row Q tile and of the two 64-key halves of its
      key tile and multiplies them into the score scale before the tile's FMAs.  With all
      descales equal this is the per-tensor call's ``c`` everywhere, bit for bit.

    ``dv``: descale_v per query head (its key/value head's) or one value."""
    blocks = np.ndim(descale_q) > 0 or np.ndim(descale_k) > 0
    if not blocks:
        if softcap:
            scores, c = _capped_scores(qh, kt, scale, descale_q, descale_k, softcap, recipe.softcap_form)
        else:
            scores, c = None, log2_scale(scale, descale_q, descale_k)
        dv = descale_v if np.ndim(descale_v) == 0 else _block_descales(1.0, 1.0, descale_v, 0, 0, kv)[2]
        return qh, kt, scores, c, None, dv
    if recipe.exact_within is not None:
        raise ValueError("block descales are not defined for the adaptive merge (exact_within)")
    dq, dk, dv = _block_descales(descale_q, descale_k, descale_v, qh.shape[1], kt.shape[2], kv)
    fold = None
    if recipe.descale_blocks == "e8m0":
        if not (_is_pow2(dq) and _is_pow2(dk)):
            raise ValueError(f"recipe {recipe.name!r} takes block descales as E8M0 scales: powers of two only")
        qh, kt = qh * dq[:, :, None], kt * dk[:, None, :]
        dq0 = dk0 = 1.0
    else:
        fold = (float(scale) * _LOG2E, dq, dk)
        dq0, dk0 = dq[:, :, None], dk[:, None, :]
    if softcap:
        scores, c = _capped_scores(qh, kt, scale, dq0, dk0, softcap, recipe.softcap_form)
        fold = None
    else:
        scores, c = None, log2_scale(scale, 1.0, 1.0)
    return qh, kt, scores, c, fold, dv


def sequence_forward(q, k, v, recipe, *, descale_q=1.0, descale_k=1.0, descale_v=1.0,
                     causal=False, softmax_scale=None, window_size=windows.NONE, softcap=0.0,
                     sinks=None):
    """One sequence, all heads: q (Sq, Hq, D), k (Sk, Hkv, D), v (Sk, Hkv, Dv) as e4m3
    (ml_dtypes ``float8_e4m3fn`` or uint8 codes) -> out (Sq, Hq, Dv) float64, lse (Hq, Sq).

    Query head h reads key/value head ``h // (Hq // Hkv)``; causal is bottom-right aligned.
    ``window_size`` (left, right) limits the keys a row sees (window.py); ``softcap`` > 0 caps
    the scores (:func:`_capped_scores`); ``sinks`` (Hq,) join each row's sum (:func:`_join_sinks`).
    Descales: one value each, or per block: ``descale_q`` (Hq, nQ), one a 128-query block,
    ``descale_k`` (Hkv, nK), one a 64-key block, ``descale_v`` (Hkv,) (blocks past the
    sequence's end are not read); the recipe's ``descale_blocks`` says how (:func:`_scored`).
    """
    recipe = _recipe(recipe)
    qd, kd, vd = (e4m3.decode(e4m3.as_codes(x)) for x in (q, k, v))
    sq, hq, d = qd.shape
    sk, hkv, dv = vd.shape
    if kd.shape[:2] != (sk, hkv) or kd.shape[2] != d or hq % max(hkv, 1):
        raise ValueError(f"shapes q {qd.shape}, k {kd.shape}, v {vd.shape} do not fit")
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    _check_scalars(scale, (descale_q, descale_k, descale_v))
    _check_features(window_size, softcap, sinks, hq)
    if sq == 0 or sk == 0:
        lse = np.full((hq, sq), -np.inf)
        if sinks is not None:
            lse[:] = np.asarray(sinks, np.float32).astype(np.float64)[:, None]
        return np.zeros((sq, hq, dv)), lse
    if not (np.isfinite(qd).all() and np.isfinite(kd).all() and np.isfinite(vd).all()):
        raise ValueError("q, k, v hold e4m3 NaN codes")
    kv = np.arange(hq) // (hq // hkv)
    qh = np.ascontiguousarray(qd.transpose(1, 0, 2))
    kt = np.ascontiguousarray(kd.transpose(1, 2, 0)[kv])
    v1 = np.concatenate([vd.transpose(1, 0, 2), np.ones((hkv, sk, 1))], axis=2)[kv]
    window = windows.normalize(causal, window_size)
    qh, kt, scores, c, fold, dv = _scored(qh, kt, recipe, scale, descale_q, descale_k, descale_v, softcap, kv)
    o, l, m, _, _, _, _ = _forward(qh, kt, v1, recipe, c, causal, scores=scores, window=window, fold=fold)
    out, lse = _finish(o, l, m, recipe, dv, sinks)
    return out.transpose(1, 0, 2), lse


@dataclasses.dataclass(frozen=True)
class HeadResult:
    """One head through a recipe, with everything a kernel must reproduce.

    ``p_codes`` (Sq, Sk) uint8: the P byte multiplied with key j's V row for query row i (0
    for keys the row does not see).  ``ref_max`` (Sq, blocks): the reference max ``m_b``
    used for that row and key block (log2 units; an integer for the integer kinds; -inf
    where the row has seen no key yet, and for the block kinds where it sees none of the
    block).  ``row_max`` (Sq,): the final ``M``.  ``p_lo`` (Sq, Sk) uint8: the second term
    of P where the recipe's ``diagonal`` is "hi_lo" (``p_codes`` holds the first there), else 0
    (with "f16", ``p_codes`` holds the byte nearest the f16 P there).
    ``rescaled`` (Sq, blocks) bool: where the block rescales the row's O to a new reference
    (every block the row sees, but the lattice blocks of ``Recipe.exact_within``).
    """

    out: np.ndarray
    lse: np.ndarray
    p_codes: np.ndarray
    ref_max: np.ndarray
    row_max: np.ndarray
    p_lo: np.ndarray
    rescaled: np.ndarray


def head_forward(q, k, v, recipe, *, descale_q=1.0, descale_k=1.0, descale_v=1.0,
                 causal=False, softmax_scale=None, scores=None, window_size=windows.NONE,
                 softcap=0.0, sink=None) -> HeadResult:
    """One head, traced: q (Sq, D), k (Sk, D), v (Sk, Dv) as e4m3.  ``scores`` (Sq, Sk)
    float32, if given, replaces the model's fp32 ``q . k`` (pass a kernel's own scores to
    check its P bytes and block maxima byte for byte; with ``softcap``, the capped ones, in
    units of softcap).  ``window_size``, ``softcap`` and ``sink`` (one logit) as
    :func:`sequence_forward`'s; descales one value each, or per block ``descale_q`` (nQ,)
    and ``descale_k`` (nK,) (:func:`_scored`)."""
    recipe = _recipe(recipe)
    qd, kd, vd = (e4m3.decode(e4m3.as_codes(x)) for x in (q, k, v))
    scale = 1.0 / math.sqrt(qd.shape[1]) if softmax_scale is None else float(softmax_scale)
    _check_scalars(scale, (descale_q, descale_k, descale_v))
    if scores is not None:
        scores = np.asarray(scores, dtype=np.float32)[None]
    sinks = None if sink is None else np.full(1, sink, np.float32)
    _check_features(window_size, softcap, sinks, 1)
    v1 = np.concatenate([vd, np.ones((vd.shape[0], 1))], axis=1)[None]
    blocks = [np.asarray(d, np.float32)[None] if np.ndim(d) else d for d in (descale_q, descale_k)]
    qh, kt, capped, c, fold, _ = _scored(qd[None], kd.T[None], recipe, scale, *blocks, descale_v, softcap,
                                         np.zeros(1, int))
    scores = capped if scores is None else scores
    o, l, m, codes, ref, lo, resc = _forward(qh, kt, v1, recipe, c, causal,
                                   scores=scores, trace=True,
                                   window=windows.normalize(causal, window_size), fold=fold)
    out, lse = _finish(o, l, m, recipe, descale_v, sinks)
    return HeadResult(out[0], lse[0], codes[0], ref[0], m[0], lo[0], resc[0])
