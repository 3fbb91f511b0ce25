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

// Masked scores -> -inf: keys past the sequence and, causal, keys after the row's
// diagonal (bottom-right aligned: key <= row + diag).  Only tiles that need it run this.
__device__ inline void mask_tile(f32x16 (&s)[kKeySubs], int n0, int row, int diag, int sk, int g) {
  constexpr bool kCausal = zyfa_cfg::kCausal;
  int lim = sk - 1;  // last key this row sees
  if (kCausal && row + diag < lim) lim = row + diag;
  lim -= n0 + 4 * g;
#pragma unroll
  for (int n = 0; n < kKeySubs; ++n)
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const int key = 32 * n + 8 * (e / 4) + (e % 4);  // minus n0 + 4g
      s[n][e] = key <= lim ? s[n][e] : neg_inf();
    }
}

struct OnlineSoftmax {
  float c;   // softmax_scale log2(e)
  float m;   // running max of c s over this query's keys (may lag by <= kLazy)
  f32x2 l2;  // this lane's share of the running sum of exp2(c s - m), in two halves

  __device__ explicit OnlineSoftmax(float scale) : c(scale * kLog2e), m(neg_inf()), l2{0.f, 0.f} {}

  // Scores of one tile -> P^T (bf16, the PV B operand: pf[ps] = keys of 16-key step ps),
  // rescaling O and l first when the vote says so.
  __device__ void update(const f32x16 (&s)[kKeySubs], bf16x8 (&pf)[kPvSteps], f32x16 (&oacc)[kDvTiles]) {
    float mx = neg_inf();
#pragma unroll
    for (int n = 0; n < kKeySubs; ++n)
#pragma unroll
      for (int e = 0; e < 16; e += 2) mx = max3(mx, s[n][e], s[n][e + 1]);
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
    }
  }

  // The query's full row sum (both halves); the same in lanes i and i + 32.
  __device__ float row_sum() const { return sum_halves(l2.x + l2.y); }

  // Natural-log LSE of a row with sum l (-inf for a row without keys).
  __device__ float lse(float l) const { return l > 0.f ? (m + __builtin_amdgcn_logf(l)) * kLn2 : neg_inf(); }
};

}  // namespace detail
}  // namespace zyfa
