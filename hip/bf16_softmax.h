// zyfa gfx950 BF16 body: masks and the online softmax over one S^T tile.
//
// A lane holds 16 keys of each 32-key subtile of S^T for one query (lanes i and i + 32
// share a query); the row max is a max over the lane's own floats and one
// v_permlane32_swap.  Scores stay raw (unscaled) until the exponent: p = exp2(s c - m)
// with c = softmax_scale log2(e) is one v_pk_fma_f32 a pair of scores, which costs the
// same as the subtraction alone would after folding c into Q, and keeps Q exact.
//
// Lazy rescale: m is a running max in the log2 domain that may lag the true one.  A tile
// moves it only when some row's tile max exceeds it by more than kLazy (a wave-uniform
// vote), and then to the exact max; otherwise p <= 2^kLazy (fp32 and bf16 hold that
// easily) and O and l keep accumulating against the stale m.  O and l always share one
// m, so O / l and LSE = m + log2(l) stay exact.

namespace zyfa {
namespace detail {

constexpr float kLazy = 8.f;

// IEEE maximum (NaN in, NaN out): v_maximum3_f32, with no canonicalising moves in front
// of it (fmaxf's maxnum would quiet each MFMA result first: one more VALU op a score).
__device__ inline float max3(float a, float b, float c) {
  return __builtin_elementwise_maximum(__builtin_elementwise_maximum(a, b), c);
}

// The keys a query row sees (zyfa_runtime/window.py, bottom-right aligned): row r of a
// sequence of sq queries and sk keys sits at key position r + diag (diag = sk - sq) and sees
// keys [r + diag - left, r + diag + right] within [0, sk), a bound of -1 being none; causal
// kernels have right = 0 built in.  first(r) <= first(r + 1) and end(r) <= end(r + 1), so a
// block of rows [r0, r1] sees keys [first(r0), end(r1)) at most and every one of its rows
// sees [first(r1), end(r0)) (either may be empty: first >= end).  Wave-uniform values: SGPRs.
struct KeyWindow {
  int left, right, diag, sk;
  __device__ int first(int row) const {  // the row's first key
    const int f = row + diag - left;
    return left >= 0 && f > 0 ? f : 0;
  }
  __device__ int end(int row) const {  // one past the row's last key
    const int e = row + diag + right + 1;
    return right >= 0 && e < sk ? e : sk;
  }
};

// Masked scores -> -inf.  Each bound has its own pass, run only on tiles that cross it
// (flash_fwd.hip decides per wave): keys before the row's first (left window edge) ...
//
// mask_before, on a wave's left-edge tiles (one or two a wave): a wave's 32 rows start their
// windows on consecutive keys (first_lo .. first_hi, wave-uniform), so each 32-key subtile is
// wholly inside every row's window (left as it is), wholly before every row's first key (-inf:
// one v_mov_b64 a pair of scores) or cut (at most two of a tile's four).  A cut subtile is
// masked in key order under EXEC (mask_before_sub): v_cmpx keeps the lanes whose row does not
// see the key yet and a move writes -inf to those; as the keys grow lanes only leave, so each
// v_cmpx narrows EXEC further, and the pass ends once none is left (tested every four keys).
// A compare and a select a score (the form before) cost 16 cycles a score: each select waited
// two wait states for its compare's VCC; 1,024 cycles a 128-key tile in the step that then
// set the phase (docs/gfx950_bf16.md, windows).  One assembly block a subtile, EXEC saved and
// restored in it (the compiler must not see scores move under a narrowed EXEC).
__device__ inline void mask_before_sub(f32x16& x, int lim, int room) {
  // the subtile's floats in pairs (VGPR pairs): float 2j + h of the subtile is half h of pj
  f32x2 p0 = {x[0], x[1]}, p1 = {x[2], x[3]}, p2 = {x[4], x[5]}, p3 = {x[6], x[7]};
  f32x2 p4 = {x[8], x[9]}, p5 = {x[10], x[11]}, p6 = {x[12], x[13]}, p7 = {x[14], x[15]};
  const f32x2 ninf = {neg_inf(), neg_inf()};
  u64 saved;
  // lim: the row's first key, counted from the subtile's first key of this lane (n0 + 32 n +
  // 4g); room: first_lo minus the subtile's first key (>= 32: wholly masked).  Float e holds key
  // 8 (e / 4) + e % 4 of the lane's: floats 0-3 keys 0-3, 4-7 keys 8-11, 8-11 keys 16-19, 12-15
  // keys 24-27, increasing with e.  A masked float is written by v_pk_mov_b32 with op_sel (the
  // other half of its pair kept).
#define ZYFA_MASK_LO(p, key) "v_cmpx_lt_i32 vcc, " #key ", %[lim]\n v_pk_mov_b32 %[" #p "], %[ninf], %[" #p "] op_sel:[0,1]\n"
#define ZYFA_MASK_HI(p, key) "v_cmpx_lt_i32 vcc, " #key ", %[lim]\n v_pk_mov_b32 %[" #p "], %[" #p "], %[ninf] op_sel:[0,0]\n"
#define ZYFA_MASK_ALL(p) "v_mov_b64 %[" #p "], %[ninf]\n"
  asm volatile(
      "s_mov_b64 %[saved], exec\n"
      "s_cmp_lt_i32 %[room], 32\n"
      "s_cbranch_scc1 1f\n"
      ZYFA_MASK_ALL(p0) ZYFA_MASK_ALL(p1) ZYFA_MASK_ALL(p2) ZYFA_MASK_ALL(p3)
      ZYFA_MASK_ALL(p4) ZYFA_MASK_ALL(p5) ZYFA_MASK_ALL(p6) ZYFA_MASK_ALL(p7)
      "s_branch 2f\n"
      "1:\n"
      ZYFA_MASK_LO(p0, 0) ZYFA_MASK_HI(p0, 1) ZYFA_MASK_LO(p1, 2) ZYFA_MASK_HI(p1, 3)
      "s_cbranch_execz 2f\n"
      ZYFA_MASK_LO(p2, 8) ZYFA_MASK_HI(p2, 9) ZYFA_MASK_LO(p3, 10) ZYFA_MASK_HI(p3, 11)
      "s_cbranch_execz 2f\n"
      ZYFA_MASK_LO(p4, 16) ZYFA_MASK_HI(p4, 17) ZYFA_MASK_LO(p5, 18) ZYFA_MASK_HI(p5, 19)
      "s_cbranch_execz 2f\n"
      ZYFA_MASK_LO(p6, 24) ZYFA_MASK_HI(p6, 25) ZYFA_MASK_LO(p7, 26) ZYFA_MASK_HI(p7, 27)
      "2:\n"
      "s_mov_b64 exec, %[saved]\n"
      : [p0] "+v"(p0), [p1] "+v"(p1), [p2] "+v"(p2), [p3] "+v"(p3), [p4] "+v"(p4), [p5] "+v"(p5),
        [p6] "+v"(p6), [p7] "+v"(p7), [saved] "=&s"(saved)
      : [lim] "v"(lim), [room] "s"(room), [ninf] "v"(ninf)
      : "vcc", "scc");
#undef ZYFA_MASK_LO
#undef ZYFA_MASK_HI
#undef ZYFA_MASK_ALL
  x = f32x16{p0.x, p0.y, p1.x, p1.y, p2.x, p2.y, p3.x, p3.y, p4.x, p4.y, p5.x, p5.y, p6.x, p6.y, p7.x, p7.y};
}

__device__ inline void mask_before(f32x16 (&s)[kKeySubs], int n0, int first, int g, int first_lo, int first_hi) {
  if constexpr (kDqk > 192) {  // d256 (32-key tiles): compare and select (the form above spilled)
    const int lim0 = first - (n0 + 4 * g);
#pragma unroll
    for (int n = 0; n < kKeySubs; ++n) {
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const int key = 8 * (e / 4) + (e % 4) + 32 * n;  // minus n0 + 4g
        s[n][e] = key >= lim0 ? s[n][e] : neg_inf();
      }
    }
    return;
  }
  // (n0 opaque here, on the edge tiles only: otherwise the compiler kept lim0 as a VGPR
  // induction variable stepped in every tile's matrix step, 8 cycles a tile at d128)
  const int lim0 = first - 4 * g - opaque_sgpr(n0);  // the row's first key, minus n0 + 4g
#pragma unroll
  for (int n = 0; n < kKeySubs; ++n) {
    const int k0 = opaque_sgpr(n0) + 32 * n;  // the subtile's first key
    if (k0 >= first_hi) break;  // every row sees all its keys (and the later subtiles')
    mask_before_sub(s[n], lim0 - 32 * n, first_lo - k0);
  }
}

// ... and keys at or past the row's end (past the sequence, after the causal diagonal or
// the right window edge).
__device__ inline void mask_after(f32x16 (&s)[kKeySubs], int n0, int end, int g) {
  const int lim0 = end - (n0 + 4 * g);
#pragma unroll
  for (int n = 0; n < kKeySubs; ++n) {
    const int lim = lim0 - 32 * n;  // keys of subtile n: 32 n + key, key < 32 an inline constant
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const int key = 8 * (e / 4) + (e % 4);  // minus n0 + 32 n + 4g
      s[n][e] = key < lim ? s[n][e] : neg_inf();
    }
  }
}

// Softcap: the logit of raw score s is softcap tanh(x), x = s softmax_scale / softcap, i.e.
// softcap (1 + 2 r) with r = -1 / (1 + e^{2x}) in [-1, 0]: v_exp_f32 and v_rcp_f32 (gfx950 has
// no tanh; exp2 -> 0 gives r = -1, -> inf gives r = -0: the limits, no sign handling; NaN stays
// NaN).  cap_scores replaces each score by r, one v_pk_mul_f32, one v_pk_add_f32 and two
// transcendentals a pair (the negation is a source modifier of v_rcp_f32); the softmax then
// takes 2 softcap as the score factor and leaves the constant softcap of every logit to the
// LSE and the sink (OnlineSoftmax::bias): the weights exp(logit - max) do not depend on it, so
// no op a score is spent on it.  kc = 2 log2(e) softmax_scale / softcap.  Error: |1 + 2 r -
// tanh(x)| <= 4.6e-7 with v_exp_f32 and v_rcp_f32 at their 1-ulp bound (1.9e-7 correctly
// rounded; docs/gfx950_bf16.md), so a logit is off by at most softcap x 5e-7, far below what
// P's bf16 rounding costs.  Runs before the masks (r of -inf is -1, not -inf).
__device__ inline void cap_scores(f32x16 (&s)[kKeySubs], float kc) {
#pragma unroll
  for (int n = 0; n < kKeySubs; ++n)
#pragma unroll
    for (int e = 0; e < 16; e += 2) {
      f32x2 x = f32x2{s[n][e], s[n][e + 1]} * kc;                                 // v_pk_mul_f32
      x = f32x2{__builtin_amdgcn_exp2f(x.x), __builtin_amdgcn_exp2f(x.y)} + 1.f;  // v_pk_add_f32
      s[n][e] = __builtin_amdgcn_rcpf(-x.x);
      s[n][e + 1] = __builtin_amdgcn_rcpf(-x.y);
    }
}

struct OnlineSoftmax {
  float c;     // the score factor in log2 units: softmax_scale log2(e) (capped: 2 softcap log2(e))
  float bias;  // what every logit has beyond c s, log2 units (capped: softcap log2(e); else 0)
  float m;     // running max of c s over this query's keys (may lag by <= kLazy)
  f32x2 l2;  // this lane's share of the running sum of exp2(c s - m), in two halves

  // A logit is factor s + offset (natural-log units): softmax_scale s + 0, or for capped
  // scores (cap_scores: s = r) 2 softcap r + softcap.
  __device__ OnlineSoftmax(float factor, float offset)
      : c(factor * kLog2e), bias(offset * kLog2e), m(neg_inf()), l2{0.f, 0.f} {}

  // Scores of one tile -> P^T (bf16, the PV B operand: pf[ps] = keys of 16-key step ps),
  // rescaling O and l first when the vote says so.
  // `between(k)`, k = 0 .. 3, runs at four points of it (work of the same step spread over it,
  // flash_fwd.hip): at its start, halfway through the row max, after the row max, after the
  // first 16-key step's exponentials.
  // `fixed` (flash_fwd.hip's capped loop, kFixedMax): m stays where fix_max put it, no row max
  // is taken, no vote (and the three first points run together at the start).
  template <class Between>
  __device__ void update(const f32x16 (&s)[kKeySubs], bf16x8 (&pf)[kPvSteps], f32x16 (&oacc)[kDvTiles],
                         Between between, bool fixed = false) {
    auto vote = [&](float mx) {  // m to the exact max where the tile's exceeds it by kLazy
      const float mc = max_halves(mx) * c;
      if (__builtin_amdgcn_ballot_w64(mc > m + kLazy)) {  // wave-uniform
        const float mn = __builtin_fmaxf(m, mc);
        const float alpha = mn == neg_inf() ? 1.f : __builtin_amdgcn_exp2f(m - mn);  // m = -inf: 0
        m = mn;
        l2 *= alpha;
#pragma unroll
        for (int dt = 0; dt < kDvTiles; ++dt) oacc[dt] *= alpha;
      }
    };
    float mx = neg_inf();
    if (__builtin_expect(fixed, 0)) {
      between(0);
      between(1);
      between(2);
    } else {
      between(0);
#pragma unroll
      for (int n = 0; n < kKeySubs; ++n) {
        if (n == kKeySubs / 2) between(1);
#pragma unroll
        for (int e = 0; e < 16; e += 2) mx = max3(mx, s[n][e], s[n][e + 1]);
      }
      between(2);
      vote(mx);
    }
    finish(s, pf, between);
  }
  // The exponentials, the row sum and P^T, against m.
  template <class Between>
  __device__ void finish(const f32x16 (&s)[kKeySubs], bf16x8 (&pf)[kPvSteps], Between between) {
    const float nm = m == neg_inf() ? 0.f : -m;  // no key seen yet: every score is -inf
#pragma unroll
    for (int ps = 0; ps < kPvSteps; ++ps) {
      u32 packed[4];
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        const int x = 8 * (ps % 2) + e;
        f32x2 t = f32x2{s[ps / 2][x], s[ps / 2][x + 1]} * c + nm;   // v_pk_fma_f32
        t = f32x2{__builtin_amdgcn_exp2f(t.x), __builtin_amdgcn_exp2f(t.y)};
        l2 += t;                                                      // v_pk_add_f32
        packed[e / 2] = pack_bf16x2(t.x, t.y);
      }
      pf[ps] = __builtin_bit_cast(bf16x8, u32x4{packed[0], packed[1], packed[2], packed[3]});
      if (ps == 0) between(3);
    }
  }
  __device__ void update(const f32x16 (&s)[kKeySubs], bf16x8 (&pf)[kPvSteps], f32x16 (&oacc)[kDvTiles]) {
    update(s, pf, oacc, [](int) {});
  }

  // Capped logits are bounded: 2 softcap r + softcap, r in [-1, 0], lies in [-softcap, softcap].
  // Where softcap <= kFixedCap, the softmax can run against the fixed m = -bias (m + bias = 0 in
  // logit units: p = e^logit in [e^-softcap, e^softcap] = [2^-72.2, 2^72.2] at most), with no
  // row max a tile (update's `fixed`): every p and every sum of up to 2^31 of them times a V of
  // magnitude below 2^24 stays inside fp32's (and bf16's) normal range, so O / l and the LSE are
  // as exact as with the running max (which needs 33 v_maximum3_f32 a tile and the vote; with
  // the cap's 3 VALU slots a score it set the period at d 128).  Above kFixedCap the running
  // max (the exponents would leave that range).  No key seen: l = 0, as before.
  static constexpr float kFixedCap = 50.f;
  __device__ void fix_max() { m = -bias; }

  // The query's full row sum (both halves); the same in lanes i and i + 32.
  __device__ float row_sum() const { return sum_halves(l2.x + l2.y); }

  // An attention sink (logit `sink`, natural-log units, scaled-score space as the scores'):
  // one more term exp(sink) of the denominator with no value.  Folded in once, after the
  // loop: m moves to max(m, sink log2 e) (O and l scaled by alpha = exp2(m_old - m)), l gains
  // exp2(sink log2 e - m).  Returns alpha, the factor O still needs (an underflow to 0 is the
  // limit: a sink about 100 nats above every score leaves O at 0 against a denominator of 1).  Rows
  // without keys: m = -inf, alpha = 0, l = 1, LSE = sink (reference.py); a sink of -inf
  // changes nothing.
  __device__ float add_sink(float sink, float& l) {
    const float s2 = sink * kLog2e - bias;  // in m's units
    const float mn = __builtin_fmaxf(m, s2);
    if (mn == neg_inf()) return 1.f;
    const float alpha = m == neg_inf() ? 0.f : __builtin_amdgcn_exp2f(m - mn);
    l = l * alpha + __builtin_amdgcn_exp2f(s2 - mn);
    m = mn;
    return alpha;
  }

  // Natural-log LSE of a row with sum l (-inf for a row without keys).
  __device__ float lse(float l) const { return l > 0.f ? (m + bias + __builtin_amdgcn_logf(l)) * kLn2 : neg_inf(); }
};

}  // namespace detail
}  // namespace zyfa
