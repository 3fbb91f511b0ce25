// zyfa attention forward for sm_90a, BF16: the FA2-style kernel body (d64 causal, where the
// WGMMA body's 128-row tiles measured slower).
//
// One CTA = 4 warps = kBlockM (64) query rows of one (sequence, query head); each warp
// owns 16 rows.  Per key block of kBlockN keys:
//   global --16-byte loads--> smem (bf16)
//   S  = Q K^T        mma.m16n8k16 bf16, Q/K fragments read from smem as 32-bit words
//   online softmax    rows live in one quad (4 lanes), reductions by shfl.xor 1, 2
//   O += P V          P re-packed from the S accumulators (no smem round trip),
//                     V fragments by ldmatrix.x4.trans
// Register map per thread (Dv = 128, kBlockN = 64): acc_o 64 f32, acc_s 32 f32,
// row state m/l 2 x 2 f32.
//
// This file is included after the generated `zyfa_cfg` constants and `struct Params`.

#include <cuda_bf16.h>
#include <stdint.h>

namespace zyfa {

using namespace zyfa_cfg;

constexpr int kWarps = kThreads / 32;
constexpr int kPad = 8;                        // bf16 elements per smem row of padding
constexpr int kLdQK = kDqk + kPad;             // smem row pitch of Q and K tiles
constexpr int kLdV = kDv + kPad;               // smem row pitch of the V tile
static_assert(!kFp8, "FP8 variants use the WGMMA body with Lean P (flash_fwd_fp8_wgmma.cuh)");
constexpr int kElemBytes = 2;                  // bytes per global input element
constexpr int kChunk = 16 / kElemBytes;        // elements per 16-byte global load
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(kWarps * 16 == kBlockM, "one warp per 16 query rows");
static_assert(kBlockN % 16 == 0 && kDqk % 16 == 0 && kDv % 16 == 0, "mma tile multiples");
static_assert(2 * ((kBlockM + kBlockN) * kLdQK + kBlockN * kLdV) == kDynamicSmem,
              "shared-memory layout must match the catalogue");

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* p) {
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ uint32_t lds32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Copy `rows` valid rows (of `cols` elements, global row pitch `stride` elements) into a
// kRows x cols bf16 smem tile of pitch `ld`; rows past `rows` are zero-filled.
template <int kRows, int kCols>
__device__ __forceinline__ void load_tile(__nv_bfloat16* smem, int ld, const uint8_t* gbase,
                                          long long stride, int rows) {
  constexpr int kChunksPerRow = kCols / kChunk;
  for (int c = threadIdx.x; c < kRows * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * kChunk;
    __nv_bfloat16* dst = smem + r * ld + col;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (r < rows) {
      raw = __ldg(reinterpret_cast<const uint4*>(gbase + (static_cast<long long>(r) * stride + col) *
                                                            kElemBytes));
    }
    *reinterpret_cast<uint4*>(dst) = raw;
  }
}

template <class P>
__device__ void flash_fwd(const P& p) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* sK = sQ + kBlockM * kLdQK;
  __nv_bfloat16* sV = sK + kBlockN * kLdQK;

  const int m_block = blockIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int h_kv = h / (p.hq / p.hkv);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int quad_row = lane / 4;        // row of this thread within its warp's 16 (and +8)
  const int quad_col = (lane % 4) * 2;  // first of the two columns this thread holds

  // ---- this sequence's rows and keys ----------------------------------------------
  const SeqBounds seq = sequence_bounds(p, b);
  const int sq = seq.sq, sk = seq.sk;
  const int row0 = m_block * kBlockM;
  if (row0 >= sq) return;
  const TensorOffsets off = tensor_offsets(p, seq, b, h, h_kv);
  const uint8_t* gq = static_cast<const uint8_t*>(p.q) + off.q * kElemBytes;
  const uint8_t* gk = static_cast<const uint8_t*>(p.k) + off.k * kElemBytes;
  const uint8_t* gv = static_cast<const uint8_t*>(p.v) + off.v * kElemBytes;

  float scale_log2 = p.softmax_scale * kLog2e;

  // Causal, bottom-right aligned: row i sees key j iff j <= i + (sk - sq).
  const int diag = sk - sq;
  int n_end = sk;
  if constexpr (kCausal) n_end = min(sk, row0 + kBlockM + diag);
  const int n_blocks = n_end > 0 ? (n_end + kBlockN - 1) / kBlockN : 0;

  load_tile<kBlockM, kDqk>(sQ, kLdQK, gq + static_cast<long long>(row0) * p.q_stride_s * kElemBytes,
                           p.q_stride_s, sq - row0);

  constexpr int kNS = kBlockN / 8;  // S n-tiles per warp
  constexpr int kNO = kDv / 8;      // O n-tiles per warp
  float acc_o[kNO][4];
#pragma unroll
  for (int i = 0; i < kNO; ++i) acc_o[i][0] = acc_o[i][1] = acc_o[i][2] = acc_o[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max of scaled scores (log2 units)
  float l_run[2] = {0.f, 0.f};              // this thread's partial row sums

  const int r_lo = row0 + warp * 16 + quad_row;  // sequence row of acc[.][0..1]; +8 for [2..3]
  const __nv_bfloat16* sQw = sQ + warp * 16 * kLdQK;

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int n0 = nb * kBlockN;
    __syncthreads();  // previous iteration's readers of sK/sV are done (and sQ is written)
    load_tile<kBlockN, kDqk>(sK, kLdQK, gk + static_cast<long long>(n0) * p.k_stride_s * kElemBytes,
                             p.k_stride_s, sk - n0);
    load_tile<kBlockN, kDv>(sV, kLdV, gv + static_cast<long long>(n0) * p.v_stride_s * kElemBytes,
                            p.v_stride_s, sk - n0);
    __syncthreads();

    // ---- S = Q K^T -----------------------------------------------------------------
    float acc_s[kNS][4];
#pragma unroll
    for (int i = 0; i < kNS; ++i) acc_s[i][0] = acc_s[i][1] = acc_s[i][2] = acc_s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kDqk; kk += 16) {
      const __nv_bfloat16* qa = sQw + quad_row * kLdQK + kk + quad_col;
      const uint32_t a0 = lds32(qa), a1 = lds32(qa + 8 * kLdQK);
      const uint32_t a2 = lds32(qa + 8), a3 = lds32(qa + 8 * kLdQK + 8);
#pragma unroll
      for (int nt = 0; nt < kNS; ++nt) {
        const __nv_bfloat16* kb = sK + (nt * 8 + quad_row) * kLdQK + kk + quad_col;
        mma_bf16(acc_s[nt], a0, a1, a2, a3, lds32(kb), lds32(kb + 8));
      }
    }

    // ---- scale, mask, online softmax ---------------------------------------------------
    const bool need_mask = (n0 + kBlockN > sk) || (kCausal && n0 + kBlockN - 1 > row0 + diag);
#pragma unroll
    for (int nt = 0; nt < kNS; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float s = acc_s[nt][e] * scale_log2;
        if (need_mask) {
          const int j = n0 + nt * 8 + quad_col + (e & 1);
          const int i = r_lo + (e >> 1) * 8;
          if (j >= sk || (kCausal && j > i + diag)) s = -INFINITY;
        }
        acc_s[nt][e] = s;
      }
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {  // the thread's two rows: r_lo and r_lo + 8
      float mx = m_run[hr];
#pragma unroll
      for (int nt = 0; nt < kNS; ++nt) mx = fmaxf(mx, fmaxf(acc_s[nt][2 * hr], acc_s[nt][2 * hr + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row with no visible key so far keeps max -inf; offset by 0 so exp2 gives 0, not NaN.
      const float m_use = mx == -INFINITY ? 0.f : mx;
      const float alpha = exp2f(m_run[hr] - m_use);
      m_run[hr] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNS; ++nt) {
        acc_s[nt][2 * hr] = exp2f(acc_s[nt][2 * hr] - m_use);
        acc_s[nt][2 * hr + 1] = exp2f(acc_s[nt][2 * hr + 1] - m_use);
        sum += acc_s[nt][2 * hr] + acc_s[nt][2 * hr + 1];
      }
      l_run[hr] = l_run[hr] * alpha + sum;
#pragma unroll
      for (int i = 0; i < kNO; ++i) {
        acc_o[i][2 * hr] *= alpha;
        acc_o[i][2 * hr + 1] *= alpha;
      }
    }

    // ---- O += P V --------------------------------------------------------------------
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t a0 = pack_bf16(acc_s[2 * kk][0], acc_s[2 * kk][1]);
      const uint32_t a1 = pack_bf16(acc_s[2 * kk][2], acc_s[2 * kk][3]);
      const uint32_t a2 = pack_bf16(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
      const uint32_t a3 = pack_bf16(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
      // ldmatrix.x4.trans: lanes 0-7 / 8-15 / 16-23 / 24-31 address the 8 key rows of
      // (keys +0, dv +0) / (keys +8, dv +0) / (keys +0, dv +8) / (keys +8, dv +8).
      const int mi = lane / 8;
      const __nv_bfloat16* vrow = sV + (kk * 16 + (mi & 1) * 8 + lane % 8) * kLdV + (mi >> 1) * 8;
#pragma unroll
      for (int nd = 0; nd < kDv / 16; ++nd) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, vrow + nd * 16);
        mma_bf16(acc_o[2 * nd], a0, a1, a2, a3, bv[0], bv[1]);
        mma_bf16(acc_o[2 * nd + 1], a0, a1, a2, a3, bv[2], bv[3]);
      }
    }
  }

  // ---- epilogue: normalise, store O (bf16) and LSE (fp32, natural log) -----------------
  __nv_bfloat16* go = static_cast<__nv_bfloat16*>(const_cast<void*>(p.o)) + off.o;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float l = l_run[hr];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = r_lo + hr * 8;
    if (row >= sq) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    __nv_bfloat16* orow = go + static_cast<long long>(row) * p.o_stride_s;
#pragma unroll
    for (int i = 0; i < kNO; ++i) {
      *reinterpret_cast<uint32_t*>(orow + i * 8 + quad_col) =
          pack_bf16(acc_o[i][2 * hr] * inv, acc_o[i][2 * hr + 1] * inv);
    }
    if (p.lse != nullptr && (lane % 4) == 0) {
      float* glse = lse_rows(p, seq, b, h);
      glse[row] = l > 0.f ? (m_run[hr] + log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

}  // namespace zyfa
