// zyfa: gfx950 BF16 attention forward (prefill) kernel body.
//
// This file is not compiled on its own: the generator places it after the
// variant's `zyfa_cfg` namespace and the generated `struct Params`, and appends
// the extern "C" entry that fills Params and calls zyfa::flash_fwd(p).
//
// It is compiled without any HIP headers (clang -cc1 -x hip -fcuda-is-device),
// so the few HIP spellings it needs are defined here on clang attributes, and
// the hardware is reached through clang's amdgcn builtins only.
//
// Work decomposition (one workgroup = 64 query rows of one head of one sequence):
//   grid  x: query block, y: query head, z: sequence
//   block 256 threads = 4 waves of 64 lanes; wave w owns query rows 16w..16w+15.
// Per KV tile of kBlockN keys, the workgroup stages K (row-major) and V^T in LDS;
// each wave then computes
//   S^T = K . Q^T            (v_mfma_f32_16x16x32_bf16, one 16-key subtile at a time)
//   online softmax over S^T  (fp32, exp2 domain)
//   O^T += V^T . P^T         (same MFMA; P^T is fed straight from the S^T registers)
//
// MFMA 16x16x32 bf16 lane layout (lane l, g = l / 16, c = l % 16):
//   A (16 x 32): lane holds row c, k = 8g + t in bf16 item t = 0..7
//   B (32 x 16): lane holds col c, k = 8g + t in bf16 item t = 0..7
//   D (16 x 16): lane holds col c, rows 4g + r in float r = 0..3
// So in S^T a lane holds 4 consecutive keys (4g..4g+3 of a 16-key subtile) of
// query column c.  Two subtiles give the 8 keys {4g..4g+3, 16+4g..16+4g+3} of a
// 32-key step, which the PV MFMA consumes as its k items: the k order inside an
// MFMA only has to agree between A and B, so V^T is read with the same key map.

static_assert(!zyfa_cfg::kFp8, "the HIP body implements the BF16 kernels only");

#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif

namespace zyfa {

using u16 = unsigned short;
using u32 = unsigned int;
using i64 = long long;

typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef u32 u32x2 __attribute__((ext_vector_type(2)));
typedef u32 u32x4 __attribute__((ext_vector_type(4)));
typedef __bf16 bf16x8 __attribute__((ext_vector_type(8)));

namespace detail {

constexpr int kDqk = zyfa_cfg::kDqk;
constexpr int kDv = zyfa_cfg::kDv;
constexpr int kBlockM = zyfa_cfg::kBlockM;
constexpr int kBlockN = zyfa_cfg::kBlockN;
constexpr int kThreads = zyfa_cfg::kThreads;
constexpr int kWaves = kThreads / 64;

static_assert(kThreads == 256 && kBlockM == 16 * kWaves, "one wave per 16 query rows");
static_assert(kDqk % 32 == 0 && kDv % 16 == 0 && kBlockN % 32 == 0, "MFMA tiling");
static_assert(zyfa_cfg::kDynamicSmem == 0, "LDS is static on gfx950");

constexpr int kQkSteps = kDqk / 32;    // k-steps of the S^T MFMA over the head dim
constexpr int kKeySubs = kBlockN / 16; // 16-key subtiles of S^T per KV tile
constexpr int kPvSteps = kBlockN / 32; // k-steps of the O^T MFMA over the keys
constexpr int kDvTiles = kDv / 16;     // 16-row tiles of O^T

// LDS tiles, padded to spread rows over banks.
constexpr int kKStride = kDqk + 8;     // K tile [key][d]; rows stay 16-byte aligned
constexpr int kVtStride = kBlockN + 4; // V^T tile [dv][key]; rows stay 8-byte aligned
constexpr int kLdsK = kBlockN * kKStride;
constexpr int kLdsVt = kDv * kVtStride;
static_assert((kLdsK + kLdsVt) * 2 <= 160 * 1024, "LDS budget");

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ inline float neg_inf() { return -__builtin_inff(); }

// Bit casts take their operand by value: clang mis-handles __builtin_bit_cast
// applied directly to an ext_vector element lvalue (it reads element 0).
__device__ inline int as_int(float x) { return __builtin_bit_cast(int, x); }
__device__ inline float as_float(int x) { return __builtin_bit_cast(float, x); }
__device__ inline u32 bf16_bits(float x) { return __builtin_bit_cast(u16, static_cast<__bf16>(x)); }

// Two floats -> packed bf16 pair (round to nearest even), low half first.
__device__ inline u32 pack_bf16x2(float lo, float hi) { return bf16_bits(lo) | (bf16_bits(hi) << 16); }

// Value of `x` held by lane `lane ^ mask` (all lanes must be active).
__device__ inline float lane_xor(float x, int lane, int mask) {
  return as_float(__builtin_amdgcn_ds_bpermute((lane ^ mask) << 2, as_int(x)));
}

// __syncthreads(): make LDS writes visible to the workgroup, then barrier.
__device__ inline void sync_workgroup() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// Global accesses need only element (2-byte) alignment: code for amdhsa runs in
// unaligned access mode (LLVM assumes it for that OS), so these copies still become
// single dwordx4 / dwordx2 accesses.

// 8 bf16 (16 bytes) from global memory.
__device__ inline u32x4 load8(const u16* src) {
  u32x4 r;
  __builtin_memcpy(&r, src, sizeof(r));
  return r;
}

// 4 packed bf16 (8 bytes) to global memory.
__device__ inline void store4(u16* dst, u32x2 val) { __builtin_memcpy(dst, &val, sizeof(val)); }

// bf16 element e (0..7) of a 16-byte chunk.
__device__ inline u32 half_of(u32x4 v, int e) { return (v[e >> 1] >> ((e & 1) * 16)) & 0xffffu; }

// Segment [cu[b], cu[b + 1]) of a packed batch, clamped: its first row to [0, total], its end
// to [first, total], its length to at most max_len; so 0 <= first <= first + len <= total.
__device__ inline void clamped_segment(const int* cu, int b, int total, int max_len, i64& first, int& len) {
  const int c0 = cu[b], c1 = cu[b + 1];
  const int lo = c0 < 0 ? 0 : c0 > total ? total : c0;
  const int hi = c1 < lo ? lo : c1 > total ? total : c1;
  first = lo;
  len = hi - lo < max_len ? hi - lo : max_len;
}

}  // namespace detail

__device__ __attribute__((always_inline)) inline void flash_fwd(const Params& p) {
  using namespace detail;
  constexpr bool kCausal = zyfa_cfg::kCausal;

  __shared__ __attribute__((aligned(16))) u16 k_lds[kLdsK];
  __shared__ __attribute__((aligned(16))) u16 vt_lds[kLdsVt];

  const int tid = __builtin_amdgcn_workitem_id_x();
  const int lane = tid & 63;
  const int wave = __builtin_amdgcn_readfirstlane(tid >> 6);
  const int c = lane & 15;  // MFMA row/col index: this lane's query column
  const int g = lane >> 4;  // 16-lane group: selects k items and accumulator rows

  const int mblock = __builtin_amdgcn_workgroup_id_x();
  const int h = __builtin_amdgcn_workgroup_id_y();
  const int b = __builtin_amdgcn_workgroup_id_z();

  // ---- this sequence's rows -------------------------------------------------------
  // Packed: [cu[b], cu[b + 1]) clamped to the tensor's rows (first in [0, total], end in
  // [first, total], length at most max_seqlen), so that whatever the values (the runtime may
  // pass them unread) no access leaves q, k, v, o or the LSE: garbage in, garbage out.
  const int* cu_q = static_cast<const int*>(p.cu_seqlens_q);
  const int* cu_k = static_cast<const int*>(p.cu_seqlens_k);
  int sq = p.seqlen_q, sk = p.seqlen_k;
  i64 q_first = 0, k_first = 0;  // packed row of the sequence's row 0 (varlen)
  if (cu_q) clamped_segment(cu_q, b, p.total_q, p.seqlen_q, q_first, sq);
  if (cu_k) clamped_segment(cu_k, b, p.total_k, p.seqlen_k, k_first, sk);
  const int m0 = mblock * kBlockM;
  if (m0 >= sq) return;  // whole workgroup leaves before any barrier

  const int hk = h / (p.hq / p.hkv);  // GQA: query heads share kv heads in groups
  const u16* q = static_cast<const u16*>(p.q) + h * p.q_stride_h +
                 (cu_q ? q_first * p.q_stride_s : b * p.q_stride_b);
  const u16* k = static_cast<const u16*>(p.k) + hk * p.k_stride_h +
                 (cu_k ? k_first * p.k_stride_s : b * p.k_stride_b);
  const u16* v = static_cast<const u16*>(p.v) + hk * p.v_stride_h +
                 (cu_k ? k_first * p.v_stride_s : b * p.v_stride_b);
  u16* o = static_cast<u16*>(const_cast<void*>(p.o)) + h * p.o_stride_h +
           (cu_q ? q_first * p.o_stride_s : b * p.o_stride_b);

  // Bottom-right causal alignment: row i sees key j iff j <= i + diag.
  const int diag = sk - sq;
  int n_end = sk;
  if (kCausal && m0 + kBlockM + diag < n_end) n_end = m0 + kBlockM + diag;
  const int n_tiles = n_end > 0 ? (n_end + kBlockN - 1) / kBlockN : 0;

  // ---- Q^T operand, kept in registers -------------------------------------------
  // B of S^T = K . Q^T: lane holds query `row`, d = 32st + 8g + t in item t.
  const int row = m0 + 16 * wave + c;
  bf16x8 qf[kQkSteps];
  {
    const bool in = row < sq;
    const u16* src = q + (in ? row : 0) * p.q_stride_s + 8 * g;
#pragma unroll
    for (int st = 0; st < kQkSteps; ++st) {
      const u32x4 bits = in ? load8(src + 32 * st) : u32x4{0, 0, 0, 0};
      qf[st] = __builtin_bit_cast(bf16x8, bits);
    }
  }

  // O^T accumulator: oacc[dt] holds dv = 16dt + 4g + r (r = 0..3) of query `row`.
  f32x4 oacc[kDvTiles];
#pragma unroll
  for (int dt = 0; dt < kDvTiles; ++dt) oacc[dt] = f32x4{0.f, 0.f, 0.f, 0.f};
  float m_run = neg_inf();  // running max of scaled scores (log2 domain), per query
  float l_part = 0.f;       // this lane's share of the running sum of exp2
  const float scale2 = p.softmax_scale * kLog2e;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int n0 = tile * kBlockN;
    sync_workgroup();  // all waves are done reading the previous tile

    // ---- K tile -> LDS, row-major, zero-filled past the last key ----
    {
      constexpr int kChunksPerRow = kDqk / 8;
      constexpr int kChunks = kBlockN * kChunksPerRow;
#pragma unroll
      for (int it = 0; it < (kChunks + kThreads - 1) / kThreads; ++it) {
        const int idx = it * kThreads + tid;
        if (kChunks % kThreads == 0 || idx < kChunks) {
          const int r = idx / kChunksPerRow, col8 = idx % kChunksPerRow;
          const int key = n0 + r;
          const u32x4 bits = key < sk ? load8(k + i64(key) * p.k_stride_s + 8 * col8)
                                      : u32x4{0, 0, 0, 0};
          *reinterpret_cast<u32x4*>(&k_lds[r * kKStride + 8 * col8]) = bits;
        }
      }
    }
    // ---- V tile -> LDS transposed (V^T[dv][key]), zero-filled past the last key ----
    // Each item moves 4 keys x 8 dv: four 16-byte row loads, eight 8-byte LDS stores.
    {
      constexpr int kChunksPerRow = kDv / 8;
      constexpr int kItems = (kBlockN / 4) * kChunksPerRow;
#pragma unroll
      for (int it = 0; it < (kItems + kThreads - 1) / kThreads; ++it) {
        const int idx = it * kThreads + tid;
        if (kItems % kThreads == 0 || idx < kItems) {
          const int quad = idx / kChunksPerRow, col8 = idx % kChunksPerRow;
          u32x4 rows[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int key = n0 + 4 * quad + j;
            rows[j] = key < sk ? load8(v + i64(key) * p.v_stride_s + 8 * col8)
                               : u32x4{0, 0, 0, 0};
          }
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const u32x2 keys4 = {half_of(rows[0], e) | (half_of(rows[1], e) << 16),
                                 half_of(rows[2], e) | (half_of(rows[3], e) << 16)};
            *reinterpret_cast<u32x2*>(&vt_lds[(8 * col8 + e) * kVtStride + 4 * quad]) = keys4;
          }
        }
      }
    }
    sync_workgroup();  // tile visible to all waves

    // ---- S^T = K . Q^T: s[n] holds keys n0 + 16n + 4g + r of query `row` ----
    f32x4 s[kKeySubs];
#pragma unroll
    for (int n = 0; n < kKeySubs; ++n) {
      s[n] = f32x4{0.f, 0.f, 0.f, 0.f};
      // A: lane holds key 16n + c, d = 32st + 8g + t.
      const u16* src = &k_lds[(16 * n + c) * kKStride + 8 * g];
#pragma unroll
      for (int st = 0; st < kQkSteps; ++st) {
        const bf16x8 kf = __builtin_bit_cast(bf16x8, *reinterpret_cast<const u32x4*>(src + 32 * st));
        s[n] = __builtin_amdgcn_mfma_f32_16x16x32_bf16(kf, qf[st], s[n], 0, 0, 0);
      }
    }

    // ---- mask, scale to the log2 domain, row max over the 4 lanes of a query ----
    float mx = neg_inf();
#pragma unroll
    for (int n = 0; n < kKeySubs; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = n0 + 16 * n + 4 * g + r;
        const bool ok = key < sk && (!kCausal || key <= row + diag);
        const float t = ok ? s[n][r] * scale2 : neg_inf();
        s[n][r] = t;
        mx = __builtin_fmaxf(mx, t);
      }
    }
    mx = __builtin_fmaxf(mx, lane_xor(mx, lane, 16));
    mx = __builtin_fmaxf(mx, lane_xor(mx, lane, 32));

    // ---- online softmax update ----
    const float m_new = __builtin_fmaxf(m_run, mx);
    const float m_use = m_new == neg_inf() ? 0.f : m_new;  // no key seen yet: avoid inf - inf
    const float corr = __builtin_amdgcn_exp2f(m_run - m_use);
    float psum = 0.f;
#pragma unroll
    for (int n = 0; n < kKeySubs; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float pr = __builtin_amdgcn_exp2f(s[n][r] - m_use);
        s[n][r] = pr;
        psum += pr;
      }
    }
    l_part = l_part * corr + psum;
    m_run = m_new;
#pragma unroll
    for (int dt = 0; dt < kDvTiles; ++dt) oacc[dt] *= corr;

    // ---- O^T += V^T . P^T over 32-key steps ----
    // k item t of lane group g <-> key 32ps + (t < 4 ? 4g + t : 16 + 4g + t - 4).
#pragma unroll
    for (int ps = 0; ps < kPvSteps; ++ps) {
      const f32x4 lo = s[2 * ps], hi = s[2 * ps + 1];
      bf16x8 pf;  // B: P^T, column = this lane's query
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        pf[r] = static_cast<__bf16>(lo[r]);
        pf[4 + r] = static_cast<__bf16>(hi[r]);
      }
#pragma unroll
      for (int dt = 0; dt < kDvTiles; ++dt) {
        // A: V^T, row dv = 16dt + c, the same key map as P^T.
        const u16* src = &vt_lds[(16 * dt + c) * kVtStride + 32 * ps + 4 * g];
        const u32x2 k03 = *reinterpret_cast<const u32x2*>(src);
        const u32x2 k47 = *reinterpret_cast<const u32x2*>(src + 16);
        const bf16x8 vf = __builtin_bit_cast(bf16x8, u32x4{k03.x, k03.y, k47.x, k47.y});
        oacc[dt] = __builtin_amdgcn_mfma_f32_16x16x32_bf16(vf, pf, oacc[dt], 0, 0, 0);
      }
    }
  }

  // ---- epilogue: normalise, store O (bf16) and LSE ----
  float l = l_part;
  l += lane_xor(l, lane, 16);
  l += lane_xor(l, lane, 32);
  if (row >= sq) return;

  const float inv = l > 0.f ? 1.f / l : 0.f;  // rows that saw no key output zeros
  u16* dst = o + i64(row) * p.o_stride_s + 4 * g;
#pragma unroll
  for (int dt = 0; dt < kDvTiles; ++dt) {
    const f32x4 a = oacc[dt] * inv;
    store4(dst + 16 * dt, u32x2{pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w)});
  }
  if (p.lse && g == 0) {
    float* lse = static_cast<float*>(const_cast<void*>(p.lse)) + b * p.lse_stride_b +
                 h * p.lse_stride_h + (q_first + row);
    *lse = l > 0.f ? (m_run + __builtin_amdgcn_logf(l)) * kLn2 : neg_inf();
  }
}

}  // namespace zyfa
