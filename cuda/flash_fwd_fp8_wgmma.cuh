// zyfa attention forward for sm_90a, FP8 (e4m3 in, bf16 out): WGMMA body with Lean P.
//
// The P arithmetic is fp8_models.RECIPES["sm_90a"], so the model predicts every P byte from
// the fp32 scores: 128-key blocks, the block's own exact fp32 max, the Lean byte with the
// quadratic mantissa correction (no MUFU per element), and the output divided by the sum of
// the rounded P that was multiplied (a WGMMA against a tile of ones).
//
// One CTA = 2 warpgroups = 128 query rows of one (sequence, query head); warpgroup g owns
// rows 64g..64g+63.  Per key block of 128 keys:
//   global --cp.async 16 B--> smem K (K-major, 64-byte K-blocks, 64B swizzle) and a V staging
//                             tile (row-major), both double-buffered: block n+1's copies are
//                             in flight while block n computes
//   S  = Q K^T      wgmma m64n128k32 e4m3, both operands from smem, issued asynchronously;
//   V -> V^T        while it runs, every thread transposes 4x4-byte squares of the staged V
//                   into the V^T tile (K-major: FP8 WGMMA takes no transposed B), the key
//                   order permuted within each 32 keys so that P needs no shuffle (below)
//   Lean P          per row: T = fp32(max S * c), bias = fp32(120 - 8T); per score
//                   y = fma(S, 8c, bias), the quadratic correction (FFMA, FFMA, LOP3, FFMA,
//                   FFMA), rint by a subnormal FMUL, then cvt.pack.sat.u8 packs and clamps
//   O += P V        wgmma m64n{min(Dv, 128)}k32 e4m3 per pass of Dv columns, P from registers,
//                   V^T from smem; l += P 1 by wgmma m64n8k32 against 8 rows of ones (every
//                   column holds the row sum).  Each block is accumulated from zero in the
//                   tensor core and merged into fp32 registers, O = O 2^(F - T) + O_b (FFMA):
//                   Hopper's FP8 WGMMA accumulates with fewer bits than fp32, so a running
//                   O kept in it would lose bits with every block of a long sequence
//
// P in WGMMA-operand order and the shared-memory layouts: cuda/flash_fp8_lean.cuh.
//
// The row state is kept in the frame F of the last block that contributed (O and l are
// relative to 2^F): a block with max T rescales them by 2^(F - T) and sets F = T, so the
// block's own O_b needs no scaling.  A block whose max lies 64 below the row's running max adds
// under 2^-50 of l and is skipped (its P set to 0), which bounds the frame's drift (O and l
// stay below 2^98).  The model merges with alpha/beta instead; the two differ by fp32
// rounding of the rescales only.
//
// kCode0 (120), kLog2Shift (8) and kQuadK come with the generated configuration, from the
// recipe.  Register map per thread (Dv = 128): acc_o 64 f32, acc_s 64 f32, acc_l 4 f32, P 16 b32,
// row state F, M, 2 x 2 f32.
//
// Shared memory (1024-byte aligned): Q | K x 2 | V staging x 2 | V^T | ones.

#include <cuda_bf16.h>
#include <stdint.h>

namespace zyfa {

using namespace zyfa_cfg;

static_assert(kFp8 && kDqk % 64 == 0 && kDv % 64 == 0 && kDv <= 256,
              "the FP8 WGMMA body: head dims in 64-byte K-blocks, Dv <= 256 (one WGMMA N)");
static_assert(kThreads == 256 && kBlockM == 128 && kBlockN == 128,
              "2 warpgroups x 64 rows, 128-key blocks (the sm_90a recipe's block)");

constexpr int kTileQ = kBlockM * kDqk;      // bytes
constexpr int kTileK = kBlockN * kDqk;
constexpr int kTileVs = kBlockN * kDv;      // V staging
constexpr int kTileVt = kDv * kBlockN;      // V^T
static_assert(kTileQ + 2 * kTileK + 2 * kTileVs + kTileVt + kTileOnes + 1024 == kDynamicSmem,
              "smem layout must match the catalogue");
constexpr int kPvN = kDv < 128 ? kDv : 128; // N of one PV pass (its block accumulator reuses S's registers)

// Copy a row-major tile (kRows x kCols bytes, global pitch `stride` bytes) into 64-byte
// K-blocks with the 64B swizzle; rows past `rows` are zero-filled.  Constant trip count:
// every thread's smem offsets are loop invariants the compiler keeps.
template <int kRows, int kCols>
__device__ __forceinline__ void load_qk(uint32_t tile, const uint8_t* g, long long stride, int rows) {
  constexpr int kPerRow = kCols / 16, kChunks = kRows * kPerRow;
  static_assert(kChunks % kThreads == 0, "whole rounds of 16-byte chunks");
#pragma unroll 4   // (d256: a full unroll spills)
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = threadIdx.x + it * kThreads;
    const int r = i / kPerRow, c16 = i % kPerRow;
    const bool ok = r < rows;
    cp_async16(tile + (c16 / 4) * kRows * 64 + swz64(r, c16 % 4), g + (ok ? r * stride + c16 * 16 : 0), ok);
  }
}

// Copy kBlockN key rows of V (kDv bytes each) into the staging tile.
__device__ __forceinline__ void load_v(uint32_t tile, const uint8_t* g, long long stride, int rows) {
  constexpr int kPerRow = kDv / 16, kChunks = kBlockN * kPerRow;
  static_assert(kChunks % kThreads == 0, "whole rounds of 16-byte chunks");
#pragma unroll 4   // (d256: a full unroll spills)
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = threadIdx.x + it * kThreads;
    const int r = i / kPerRow, c16 = i % kPerRow;
    const bool ok = r < rows;
    cp_async16(tile + stg(r, c16 * 16), g + (ok ? r * stride + c16 * 16 : 0), ok);
  }
}

// Staged V (keys x Dv) -> V^T (Dv x keys, keys in P's order).  A unit is 4 keys {2t, 2t+1,
// 2t+8, 2t+9} (+ 32c + 16h) x 4 bytes of dv (4g..4g+3): transpose_unit.
// Lane bits -> (c0, h, t0, t1, g0), the rest -> (c1, g1 ...): see the module comment.
__device__ __forceinline__ void transpose_v(uint32_t vt_tile, uint32_t st_tile) {
  static_assert(8 * kDv % kThreads == 0, "whole rounds of units");
#pragma unroll
  for (int it = 0; it < 8 * kDv / kThreads; ++it) {
    const int u = threadIdx.x + it * kThreads;
    const int l = u & 31, rest = u >> 5;
    const int c = (l & 1) | ((rest & 1) << 1), h = (l >> 1) & 1, t = (l >> 2) & 3;
    const int g = ((l >> 4) & 1) | ((rest >> 1) << 1);
    const int k0 = 32 * c + 16 * h + 2 * t, pos = 32 * c + 16 * h + 4 * t;
    transpose_unit(st_tile + stg(k0, 4 * g), vt_tile + vt(4 * g + 0, pos), vt_tile + vt(4 * g + 1, pos),
                   vt_tile + vt(4 * g + 2, pos), vt_tile + vt(4 * g + 3, pos));
  }
}

template <class P>
__device__ void flash_fwd(const P& p) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t sQ = (smem0 + 1023) & ~1023u;
  const uint32_t sK0 = sQ + kTileQ;                   // K stages: sK0, sK0 + kTileK
  const uint32_t sVs0 = sK0 + 2 * kTileK;             // V staging stages
  const uint32_t sVt = sVs0 + 2 * kTileVs;
  const uint32_t sOnes = sVt + kTileVt;

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
  const uint8_t* gq = static_cast<const uint8_t*>(p.q) + off.q;
  const uint8_t* gk = static_cast<const uint8_t*>(p.k) + off.k;
  const uint8_t* gv = static_cast<const uint8_t*>(p.v) + off.v;

  const float c = log2_scale(p);
  const float c8 = 8.f * c;
  const float dv_scale = *static_cast<const float*>(p.descale_v);

  const int diag = sk - sq;
  int n_end = sk;
  if constexpr (kCausal) n_end = min(sk, row0 + kBlockM + diag);
  const int n_blocks = n_end > 0 ? (n_end + kBlockN - 1) / kBlockN : 0;

  load_qk<kBlockM, kDqk>(sQ, gq + static_cast<long long>(row0) * p.q_stride_s, p.q_stride_s, sq - row0);
  if (n_blocks > 0) {   // block 0 into stage 0
    load_qk<kBlockN, kDqk>(sK0, gk, p.k_stride_s, sk);
    load_v(sVs0, gv, p.v_stride_s, sk);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  for (int i = threadIdx.x; i < kTileOnes / 4; i += kThreads) sts32(sOnes + 4 * i, 0x38383838u);
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  fence_async_smem();
  __syncthreads();

  float acc_o[kDv / 2];
#pragma unroll
  for (int i = 0; i < kDv / 2; ++i) acc_o[i] = 0.f;
  float acc_l[4] = {0.f, 0.f, 0.f, 0.f};
  float frame[2] = {-INFINITY, -INFINITY};    // F: the exponent O and l are relative to
  float m_run[2] = {-INFINITY, -INFINITY};    // M: the running max of the block maxima
  const int r_lo = row0 + wg * 64 + warp * 16 + quad_row;   // rows of acc[4j+0..1]; +8 for [4j+2..3]
  const uint32_t sQg = sQ + wg * 64 * 64;                   // this warpgroup's 64 rows (in each K-block)

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int n0 = nb * kBlockN;
    const uint32_t sK = sK0 + (nb & 1) * kTileK, sVs = sVs0 + (nb & 1) * kTileVs;
    if (nb + 1 < n_blocks) {   // block nb + 1 into the other stage (its last readers are done)
      const long long n1 = n0 + kBlockN;
      load_qk<kBlockN, kDqk>(sK0 + ((nb + 1) & 1) * kTileK, gk + n1 * p.k_stride_s, p.k_stride_s,
                             sk - static_cast<int>(n1));
      load_v(sVs0 + ((nb + 1) & 1) * kTileVs, gv + n1 * p.v_stride_s, p.v_stride_s, sk - static_cast<int>(n1));
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }

    // ---- S = Q K^T (asynchronous), V^T meanwhile ------------------------------------------
    float acc_s[kBlockN / 2];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDqk / 32; ++k) {
      const uint32_t kb = k / 2, kk = k % 2;
      wgmma_qk(acc_s, desc_64b(sQg + kb * kBlockM * 64 + kk * 32),
               desc_64b(sK + kb * kBlockN * 64 + kk * 32), k > 0);
    }
    wgmma_commit();
    transpose_v(sVt, sVs);
    fence_async_smem();
    wgmma_wait0();

    // ---- mask, block max, frame ---------------------------------------------------------
    const bool need_mask = (n0 + kBlockN > sk) || (kCausal && n0 + kBlockN - 1 > row0 + wg * 64 + diag);
    if (need_mask) mask_block(acc_s, n0, sk, r_lo, diag, quad_col);
    float bias[2], factor[2];
    const bool big = block_frame(acc_s, c, frame, m_run, bias, factor);

    // ---- Lean P, rescale, O += P V and l += P 1 --------------------------------------------
    uint32_t pa[kBlockN / 8];
    if (__any_sync(0xffffffffu, big)) lean_p<true>(pa, acc_s, c8, bias);
    else lean_p<false>(pa, acc_s, c8, bias);
    __syncthreads();   // V^T complete (both warpgroups wrote it)
#pragma unroll
    for (int pass = 0; pass < kDv / kPvN; ++pass) {
      // The block from zero in the tensor core (its FP8 accumulation is not fp32: it keeps
      // fewer bits and would bias a long running sum), merged into the fp32 state by one FFMA.
      float acc_b[kPvN / 2], acc_lb[4];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 32; ++kk) {
        wgmma_pv(acc_b, pa + 4 * kk, desc_128b(sVt + pass * kPvN * 128 + kk * 32), kk > 0);
        if (pass == 0) wgmma_sum(acc_lb, pa + 4 * kk, desc_128b(sOnes + kk * 32), kk > 0);
      }
      wgmma_commit();
      wgmma_wait0();
#pragma unroll
      for (int i = 0; i < kPvN / 2; ++i) {
        float& o = acc_o[pass * kPvN / 2 + i];
        o = __fmaf_rn(o, factor[(i >> 1) & 1], acc_b[i]);
      }
      if (pass == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc_l[i] = __fmaf_rn(acc_l[i], factor[i >> 1], acc_lb[i]);
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    fence_async_smem();
    __syncthreads();   // block nb + 1 staged; every warpgroup done with V^T and block nb's stage
  }

  write_rows(p, seq, off, b, h, acc_o, acc_l, frame, r_lo, dv_scale);
}

}  // namespace zyfa
