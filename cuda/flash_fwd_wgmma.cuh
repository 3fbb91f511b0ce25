// zyfa attention forward for sm_90a, BF16: WGMMA kernel body (head dims multiples of 64, Dv <= 256).
//
// One CTA = 2 warpgroups = 128 query rows of one (sequence, query head); warpgroup g owns
// rows 64g..64g+63.  Per key block of kBlockN (64, or 128 at d128) keys:
//   global --cp.async 16 B--> smem K and V (128B-swizzled rows; K is K-major for S = Q K^T,
//                             V MN-major for O = P V: the WGMMA transposes it, tnspB = 1)
// both double-buffered: block n+1's copies are in flight while block n computes.
//   S  = Q K^T      wgmma m64n{kBlockN}k16 bf16, both operands from smem (descriptors)
//   online softmax  on the S accumulators (a row lives in one quad: shfl.xor 1, 2)
//   O += P V        wgmma m64n{Dv}k16 bf16, P from registers (the S accumulators re-packed:
//                   their layout is the A-register layout), V^T from smem
// The WGMMA wrappers (`wgmma_qk`, `wgmma_pv`) are generated with the unit (operand lists).
//
// Shared-memory tile layout (both K-major, 1024-byte aligned): a tile of R rows is split in
// K-blocks of 64 bf16 (128 bytes); block kb is R x 128 bytes, row r's 16-byte chunk c stored
// at chunk c ^ (r % 8) -- the hardware's 128B swizzle, so the descriptor's stride between
// 8-row groups is 1024 bytes and a k16 step advances its start address by 32 bytes.

#include <cuda_bf16.h>
#include <stdint.h>

namespace zyfa {

using namespace zyfa_cfg;

static_assert(!kFp8 && kDqk % 64 == 0 && kDv % 64 == 0 && kDv <= 256,
              "the WGMMA body: BF16, head dims in 64-element K-blocks, Dv <= 256 (one WGMMA N)");
static_assert(kThreads == 256 && kBlockM == 128 && (kBlockN == 64 || kBlockN == 128),
              "2 warpgroups x 64 rows, 64 or 128 keys");
constexpr int kNS = kBlockN / 8;               // 8-key tiles of S per block
constexpr int kKS = kBlockN / 16;              // k16 steps of the PV product

constexpr int kKB = kDqk / 64;                 // K-blocks of the head dim
constexpr int kTileQ = kBlockM * 128 * kKB;    // bytes of the Q tile
constexpr int kTileK = kBlockN * 128 * kKB;
constexpr int kTileV = kBlockN * 128 * (kDv / 64);   // V: kBlockN key rows per 64-dv block
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kTileQ + 2 * kTileK + 2 * kTileV + 1024 == kDynamicSmem,
              "smem layout must match the catalogue");


__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// K-major operand descriptor: 1024 bytes between 8-row groups, 128B swizzle (the leading byte
// offset is unused for swizzled K-major tiles).
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t smem_addr) {
  return gmma_desc(smem_addr, 16, 1024, 1);
}

ZYFA_WGMMA_WRAPPERS

// Copy a row-major tile (kRows x kCols bf16, global pitch `stride` elements) into a smem tile
// of 64-column blocks with 128B-swizzled rows; rows past `rows` are zero-filled.
template <int kRows, int kCols = kDqk>
__device__ __forceinline__ void load_kmajor(uint32_t tile, const __nv_bfloat16* g, long long stride,
                                            int rows) {
  constexpr int kChunks = kRows * kCols / 8;
  for (int c = threadIdx.x; c < kChunks; c += kThreads) {
    const int r = c / (kCols / 8), col8 = c % (kCols / 8);
    const int kb = col8 / 8, ch = col8 % 8;
    const bool ok = r < rows;
    cp_async16(tile + kb * kRows * 128 + swz128(r, ch), g + (ok ? r * stride + col8 * 8 : 0), ok);
  }
}

// MN-major (transposed) operand descriptor: 8-row groups along K 1024 bytes apart, 64-column
// blocks along MN `mn_stride` bytes apart (the leading byte offset), 128B swizzle.
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t smem_addr, uint32_t mn_stride) {
  return gmma_desc(smem_addr, mn_stride, 1024, 1);
}

template <class P>
__device__ void flash_fwd(const P& p) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t sQ = (smem0 + 1023) & ~1023u;        // swizzled tiles want 1024-byte alignment
  const uint32_t sK0 = sQ + kTileQ;                   // K stages: sK0, sK0 + kTileK
  const uint32_t sVt0 = sK0 + 2 * kTileK;             // V^T stages: sVt0, sVt0 + kTileV

  const int m_block = blockIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int h_kv = h / (p.hq / p.hkv);
  const int wg = threadIdx.x / 128;
  const int warp = (threadIdx.x % 128) / 32;
  const int lane = threadIdx.x % 32;
  const int quad_row = lane / 4;
  const int quad_col = (lane % 4) * 2;

  const SeqBounds seq = sequence_bounds(p, b);
  const int sq = seq.sq, sk = seq.sk;
  const int row0 = m_block * kBlockM;
  if (row0 >= sq) return;
  const TensorOffsets off = tensor_offsets(p, seq, b, h, h_kv);
  const __nv_bfloat16* gq = static_cast<const __nv_bfloat16*>(p.q) + off.q;
  const __nv_bfloat16* gk = static_cast<const __nv_bfloat16*>(p.k) + off.k;
  const __nv_bfloat16* gv = static_cast<const __nv_bfloat16*>(p.v) + off.v;
  const float scale_log2 = p.softmax_scale * kLog2e;

  const int diag = sk - sq;
  int n_end = sk;
  if constexpr (kCausal) n_end = min(sk, row0 + kBlockM + diag);
  const int n_blocks = n_end > 0 ? (n_end + kBlockN - 1) / kBlockN : 0;

  load_kmajor<kBlockM>(sQ, gq + static_cast<long long>(row0) * p.q_stride_s, p.q_stride_s, sq - row0);
  if (n_blocks > 0) {   // block 0 into stage 0
    load_kmajor<kBlockN>(sK0, gk, p.k_stride_s, sk);
    load_kmajor<kBlockN, kDv>(sVt0, gv, p.v_stride_s, sk);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  fence_async_smem();   // generic writes -> WGMMA reads
  __syncthreads();

  float acc_o[kDv / 2];
#pragma unroll
  for (int i = 0; i < kDv / 2; ++i) acc_o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};
  const int r_lo = row0 + wg * 64 + warp * 16 + quad_row;   // rows of acc[4j+0..1]; +8 for [4j+2..3]
  const uint32_t sQg = sQ + wg * 64 * 128;                  // this warpgroup's 64 rows

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int n0 = nb * kBlockN;
    const uint32_t sK = sK0 + (nb & 1) * kTileK, sVt = sVt0 + (nb & 1) * kTileV;
    const bool more = nb + 1 < n_blocks;
    if (more) {   // block nb + 1 into the other stage (read last by block nb - 1: all done)
      const long long n1 = n0 + kBlockN;
      load_kmajor<kBlockN>(sK0 + ((nb + 1) & 1) * kTileK, gk + n1 * p.k_stride_s, p.k_stride_s,
                           sk - static_cast<int>(n1));
      load_kmajor<kBlockN, kDv>(sVt0 + ((nb + 1) & 1) * kTileV, gv + n1 * p.v_stride_s, p.v_stride_s,
                           sk - static_cast<int>(n1));
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }

    // ---- S = Q K^T ---------------------------------------------------------------------
    float acc_s[kBlockN / 2];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDqk / 16; ++k) {
      const uint32_t kb = k / 4, kk = k % 4;
      wgmma_qk(acc_s, desc_kmajor(sQg + kb * kBlockM * 128 + kk * 32),
               desc_kmajor(sK + kb * kBlockN * 128 + kk * 32), k > 0);
    }
    wgmma_commit();
    wgmma_wait0();

    // ---- scale, mask, online softmax ---------------------------------------------------
    const bool need_mask = (n0 + kBlockN > sk) || (kCausal && n0 + kBlockN - 1 > row0 + wg * 64 + diag);
#pragma unroll
    for (int j = 0; j < kNS; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float s = acc_s[4 * j + e] * scale_log2;
        if (need_mask) {
          const int col = n0 + j * 8 + quad_col + (e & 1);
          const int row = r_lo + (e >> 1) * 8;
          if (col >= sk || (kCausal && col > row + diag)) s = -INFINITY;
        }
        acc_s[4 * j + e] = s;
      }
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float mx = m_run[hr];
#pragma unroll
      for (int j = 0; j < kNS; ++j) mx = fmaxf(mx, fmaxf(acc_s[4 * j + 2 * hr], acc_s[4 * j + 2 * hr + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_use = mx == -INFINITY ? 0.f : mx;
      const float alpha = exp2f(m_run[hr] - m_use);
      m_run[hr] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kNS; ++j) {
        acc_s[4 * j + 2 * hr] = exp2f(acc_s[4 * j + 2 * hr] - m_use);
        acc_s[4 * j + 2 * hr + 1] = exp2f(acc_s[4 * j + 2 * hr + 1] - m_use);
        sum += acc_s[4 * j + 2 * hr] + acc_s[4 * j + 2 * hr + 1];
      }
      l_run[hr] = l_run[hr] * alpha + sum;
#pragma unroll
      for (int i = 0; i < kDv / 8; ++i) {
        acc_o[4 * i + 2 * hr] *= alpha;
        acc_o[4 * i + 2 * hr + 1] *= alpha;
      }
    }

    // ---- O += P V: P from registers (the accumulator layout is the A-register layout) ------
    uint32_t pa[4 * kKS];
#pragma unroll
    for (int kk = 0; kk < kKS; ++kk) {
      pa[4 * kk + 0] = pack_bf16(acc_s[8 * kk + 0], acc_s[8 * kk + 1]);
      pa[4 * kk + 1] = pack_bf16(acc_s[8 * kk + 2], acc_s[8 * kk + 3]);
      pa[4 * kk + 2] = pack_bf16(acc_s[8 * kk + 4], acc_s[8 * kk + 5]);
      pa[4 * kk + 3] = pack_bf16(acc_s[8 * kk + 6], acc_s[8 * kk + 7]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKS; ++kk)
      wgmma_pv(acc_o, pa + 4 * kk, desc_mnmajor(sVt + kk * 16 * 128, kBlockN * 128));
    wgmma_commit();
    wgmma_wait0();
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    fence_async_smem();
    __syncthreads();   // block nb + 1 staged; every warpgroup done with block nb's stage
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
    for (int i = 0; i < kDv / 8; ++i) {
      *reinterpret_cast<uint32_t*>(orow + i * 8 + quad_col) =
          pack_bf16(acc_o[4 * i + 2 * hr] * inv, acc_o[4 * i + 2 * hr + 1] * inv);
    }
    if (p.lse != nullptr && (lane % 4) == 0) {
      float* glse = lse_rows(p, seq, b, h);
      glse[row] = l > 0.f ? (m_run[hr] + log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

}  // namespace zyfa
