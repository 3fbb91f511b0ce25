// zyfa: merge_attention_states, the arithmetic both arches share.
//
// Not compiled on its own: cuda/merge_states.cu (sm_90a) and hip/merge_states.hip (gfx950)
// define the vendor spellings it uses, then include it; the generator inlines it and
// appends the generated Params struct before it and the extern "C" entry after it.
//
//   zyfa_thread()          the thread's index in its workgroup / CTA (x)
//   zyfa_block(axis)       the workgroup's index in the grid (0: x, 1: y, 2: z)
//   zyfa_exp2, zyfa_log2   fp32 base-2 exponential and logarithm
//   zyfa_as_u32, zyfa_as_f32   bit casts
//   zyfa_barrier()         the workgroup's barrier, its global reads before it complete
//
// Two partial attentions of one query row over disjoint key sets A and B, each O normalised
// by its own softmax sum and its LSE the natural log of that sum (with the scores' max folded
// in), merge as
//     m = max(lse_a, lse_b),  w_a = e^(lse_a - m),  w_b = e^(lse_b - m)    (one of them is 1)
//     out = (w_a o_a + w_b o_b) / (w_a + w_b),      out_lse = m + ln(w_a + w_b).
// A side with no keys has LSE -inf: its weight is exactly 0 and it is never read, so the
// other side comes out bit for bit (1 o + nothing, rounded to bf16, is o; m + ln 1 is m).
// Both -inf: zeros and -inf.  A NaN LSE makes the row NaN.

namespace zyfa {

using u16 = unsigned short;
using u32 = unsigned int;
using i64 = long long;

constexpr int kMergeRows = zyfa_cfg::kRows;                 // rows a workgroup
constexpr int kMergeLanes = zyfa_cfg::kThreads / kMergeRows;  // threads a row, over the head dim
static_assert(kMergeLanes * kMergeRows == zyfa_cfg::kThreads, "whole rows a workgroup");

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ inline float bf16_to_f32(u16 h) { return zyfa_as_f32(u32(h) << 16); }

// fp32 -> bf16, round to nearest even; a NaN stays a (quiet) NaN of its sign.
__device__ inline u16 f32_to_bf16(float x) {
  const u32 u = zyfa_as_u32(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return u16((u >> 16) | 0x0040u);
  return u16((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

struct MergeWeights {
  float ca, cb;   // w_a / s and w_b / s, s = w_a + w_b in [1, 2]
  float lse;      // m + ln s
};

__device__ inline MergeWeights merge_weights(float la, float lb) {
  const float m = la >= lb ? la : lb;   // a NaN on either side reaches its own weight below
  const float ninf = -__builtin_inff();
  if (m == ninf) return {0.0f, 0.0f, ninf};   // no keys on either side
  const float wa = zyfa_exp2((la - m) * kLog2e);   // exp2(0) = 1, exp2(-inf) = 0 exactly
  const float wb = zyfa_exp2((lb - m) * kLog2e);
  const float s = wa + wb;
  return {wa / s, wb / s, m + zyfa_log2(s) * kLn2};   // correctly rounded divisions: 1 / 1 = 1
}

struct alignas(16) Bf16x8 { u16 h[8]; };   // 16 bytes of a row: one load or store

// One output element, rounded once to bf16: a term only where its weight is not 0, and a
// lone term not added to 0 (1 o keeps o's bits, -0 included: -0 + 0 would be +0); no term: +0.
__device__ inline u16 merge_one(const MergeWeights& w, u16 a, u16 b) {
  const float ta = w.ca * bf16_to_f32(a), tb = w.cb * bf16_to_f32(b);
  const float x = w.ca != 0.0f ? (w.cb != 0.0f ? ta + tb : ta) : (w.cb != 0.0f ? tb : 0.0f);
  return f32_to_bf16(x);
}

__device__ inline void merge_states(const Params& p) {
  const int t = zyfa_thread();
  const int row = zyfa_block(0) * kMergeRows + t / kMergeLanes;
  const int lane = t % kMergeLanes;
  const i64 h = zyfa_block(1), b = zyfa_block(2);
  const bool live = row < p.seqlen;
  const float* lse_a = static_cast<const float*>(p.lse_a);
  const float* lse_b = static_cast<const float*>(p.lse_b);
  MergeWeights w = {0.0f, 0.0f, 0.0f};
  if (live)
    w = merge_weights(lse_a[b * p.lse_a_stride_b + h * p.lse_a_stride_h + row * p.lse_a_stride_s],
                      lse_b[b * p.lse_b_stride_b + h * p.lse_b_stride_h + row * p.lse_b_stride_s]);
  // Every thread of a row reads its two LSEs; one writes out_lse, which may be lse_a or lse_b
  // itself (the merge in place): the workgroup's reads all land before any write.
  zyfa_barrier();
  if (!live) return;
  if (lane == 0 && p.out_lse != nullptr) {
    float* out_lse = static_cast<float*>(const_cast<void*>(p.out_lse));
    out_lse[b * p.out_lse_stride_b + h * p.out_lse_stride_h + row * p.out_lse_stride_s] = w.lse;
  }
  const u16* oa = static_cast<const u16*>(p.o_a) + (b * p.o_a_stride_b + row * p.o_a_stride_s + h * p.o_a_stride_h);
  const u16* ob = static_cast<const u16*>(p.o_b) + (b * p.o_b_stride_b + row * p.o_b_stride_s + h * p.o_b_stride_h);
  u16* out = static_cast<u16*>(const_cast<void*>(p.out)) + (b * p.out_stride_b + row * p.out_stride_s + h * p.out_stride_h);
  // Each element is read by the thread that writes it, before it writes it: out may be o_a or
  // o_b itself.  16 bytes (8 columns) a thread where the head dim and the three rows allow it,
  // else a column a thread.
  const bool wide = p.head_dim % 8 == 0 && ((reinterpret_cast<unsigned long long>(oa) |
      reinterpret_cast<unsigned long long>(ob) | reinterpret_cast<unsigned long long>(out)) & 15) == 0;
  if (wide) {
    for (int c = 8 * lane; c < p.head_dim; c += 8 * kMergeLanes) {
      Bf16x8 a = {}, bb = {}, r;
      if (w.ca != 0.0f) a = *reinterpret_cast<const Bf16x8*>(oa + c);   // a weight of 0: not read
      if (w.cb != 0.0f) bb = *reinterpret_cast<const Bf16x8*>(ob + c);
      for (int i = 0; i < 8; ++i) r.h[i] = merge_one(w, a.h[i], bb.h[i]);
      *reinterpret_cast<Bf16x8*>(out + c) = r;
    }
    return;
  }
  for (int c = lane; c < p.head_dim; c += kMergeLanes) {
    const u16 a = w.ca != 0.0f ? oa[c] : u16(0), bb = w.cb != 0.0f ? ob[c] : u16(0);
    out[c] = merge_one(w, a, bb);
  }
}

}  // namespace zyfa
