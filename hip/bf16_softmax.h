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
__device__ inline void mask_before(f32x16 (&s)[kKeySubs], int n0, int first, int g) {
  const int lim0 = first - (n0 + 4 * g);
#pragma unroll
  for (int n = 0; n < kKeySubs; ++n) {
    const int lim = lim0 - 32 * n;  // keys of subtile n: 32 n + key, key < 32 an inline constant
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const int key = 8 * (e / 4) + (e % 4);  // minus n0 + 32 n + 4g
      s[n][e] = key >= lim ? s[n][e] : neg_inf();
    }
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
  template <class Between>
  __device__ void update(const f32x16 (&s)[kKeySubs], bf16x8 (&pf)[kPvSteps], f32x16 (&oacc)[kDvTiles],
                         Between between) {
    float mx = neg_inf();
    between(0);
#pragma unroll
    for (int n = 0; n < kKeySubs; ++n) {
      if (n == kKeySubs / 2) between(1);
#pragma unroll
      for (int e = 0; e < 16; e += 2) mx = max3(mx, s[n][e], s[n][e + 1]);
    }
    between(2);
    const float mc = max_halves(mx) * c;
    if (__builtin_amdgcn_ballot_w64(mc > m + kLazy)) {  // wave-uniform
      const float mn = __builtin_fmaxf(m, mc);
      const float alpha = mn == neg_inf() ? 1.f : __builtin_amdgcn_exp2f(m - mn);  // m = -inf: 0
      m = mn;
      l2 *= alpha;
#pragma unroll
      for (int dt = 0; dt < kDvTiles; ++dt) oacc[dt] *= alpha;
    }
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
