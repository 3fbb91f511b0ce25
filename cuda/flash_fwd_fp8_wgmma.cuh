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
// P in WGMMA-operand order.  The S accumulator gives a thread, per row and 32 keys, the keys
// {2t, 2t+1, 2t+8, 2t+9} and the same + 16 (t = lane % 4); the e4m3 A fragment wants the
// consecutive k positions 4t..4t+3 and 16+4t..16+4t+3.  So k position 4t+i holds key
// {2t, 2t+1, 2t+8, 2t+9}[i] (the same + 16 above): the bytes are packed in accumulator
// order, and V^T is written with its K (key) positions in that order.  A sum over keys
// does not care about their order.
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
//   Q, K:   64-byte K-blocks of R rows (R = 128), row r's 16-byte chunk c at c ^ ((r >> 1) & 3)
//           (the 64B swizzle: 512 bytes between 8-row groups, a k32 step is +32 bytes)
//   staging: row k (key) of Dv bytes, 16-byte chunk c at c ^ f(k), f(k) = bits 1, 2, 4 of k
//           (the transpose's 4-byte reads then hit at most 2 ways of a bank, its writes 1)
//   V^T:    Dv rows of 128 key bytes, 128B swizzle (1024 bytes between 8-row groups)
//   ones:   8 rows of 128 bytes 0x38 (1.0)

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
constexpr int kTileOnes = 8 * 128;
static_assert(kTileQ + 2 * kTileK + 2 * kTileVs + kTileVt + kTileOnes + 1024 == kDynamicSmem,
              "smem layout must match the catalogue");
constexpr int kNS = kBlockN / 8;            // 8-key tiles of S per block
constexpr int kPvN = kDv < 128 ? kDv : 128; // N of one PV pass (its block accumulator reuses S's registers)
constexpr float kLn2 = 0.6931471805599453f;
constexpr double kLog2eD = 1.4426950408889634;
constexpr float kSkip = 64.f;               // blocks this far below the running max are skipped
constexpr float kBigT = 262144.f;           // |T| from here on may round y past 120.5: clamp

// 64B-swizzled K-block offset of (row, 16-byte chunk) for Q and K.
__device__ __forceinline__ uint32_t swz64(int row, int chunk) {
  return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4);
}
// Staging offset of (key row k, byte d).
__device__ __forceinline__ uint32_t stg(int k, int d) {
  constexpr int kMask = (kDv / 16 >= 8 ? 8 : kDv / 16) - 1;
  const int f = (((k >> 1) & 3) | ((k >> 2) & 4)) & kMask;
  return k * kDv + (((d >> 4) ^ f) << 4) + (d & 15);
}
// V^T offset of (dv row n, key position L): 128B swizzle.
__device__ __forceinline__ uint32_t vt(int n, int l) {
  return swz128(n, l >> 4) + (l & 15);
}

// K-major operand descriptors (the leading byte offset is unused for swizzled K-major tiles):
// Q and K in 64B swizzle (8-row groups 512 bytes apart), V^T and ones in 128B (1024 apart).
__device__ __forceinline__ uint64_t desc_64b(uint32_t smem_addr) { return gmma_desc(smem_addr, 16, 512, 2); }
__device__ __forceinline__ uint64_t desc_128b(uint32_t smem_addr) { return gmma_desc(smem_addr, 16, 1024, 1); }

__device__ __forceinline__ uint32_t lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ void sts32(uint32_t a, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(a), "r"(v) : "memory");
}


ZYFA_WGMMA_WRAPPERS

// The Lean byte of one score, before clamping: rint(z) as the bits of a subnormal (an int in
// [0, 2^23) for 0 <= z, negative for z < 0; -inf gives a negative int too).  The arithmetic of
// e4m3.p_codes("lean_quad") on y = fma(S, 8c, bias), one fp32 rounding per step.
template <bool kClamp>
__device__ __forceinline__ int lean_quad_bits(float s, float c8, float bias) {
  const float y = __fmaf_rn(s, c8, bias);
  const float w = __fmaf_rn(y, 0.125f, 16.f);                   // in [16, 32) for every code > 0
  uint32_t fb;                                                    // 1 + x/16: one LOP3
  asm("lop3.b32 %0, %1, 0x7FFFF, %2, 0xEA;\n" : "=r"(fb) : "r"(__float_as_uint(w)), "r"(0x3F800000u));
  const float f = __uint_as_float(fb);
  const float x = __fmaf_rn(f, 16.f, -16.f);                     // w - floor(w), exact
  const float h = __fmaf_rn(x, x, -x);
  float z = __fmaf_rn(h, kQuadK, y);
  if constexpr (kClamp) z = fminf(z, kCode0);
  float r;
  asm("mul.rn.f32 %0, %1, 0f00000001;\n" : "=f"(r) : "f"(z));    // z * 2^-149, no flush
  return __float_as_int(r);
}

// Four codes -> one b32 of bytes [q0, q1, q2, q3] (q0 lowest), each saturated to [0, 255].
__device__ __forceinline__ uint32_t pack4(int q0, int q1, int q2, int q3) {
  uint32_t hi, d;
  asm("cvt.pack.sat.u8.s32.b32 %0, %1, %2, 0;\n" : "=r"(hi) : "r"(q3), "r"(q2));
  asm("cvt.pack.sat.u8.s32.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(q1), "r"(q0), "r"(hi));
  return d;
}

// P bytes of the block in A-fragment order (module comment): per 32 keys c, registers
// {row lo: k 4t..4t+3, row hi: same, row lo: 16+4t.., row hi: 16+4t..}.
template <bool kClamp>
__device__ __forceinline__ void lean_p(uint32_t (&pa)[kBlockN / 8], const float (&s)[kBlockN / 2],
                                       float c8, const float (&bias)[2]) {
#pragma unroll
  for (int c = 0; c < kBlockN / 32; ++c) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {            // r: (16-key half) * 2 + row half
      const int j = 16 * c + 8 * (r >> 1) + 2 * (r & 1);
      const float b = bias[r & 1];
      pa[4 * c + r] = pack4(lean_quad_bits<kClamp>(s[j], c8, b), lean_quad_bits<kClamp>(s[j + 1], c8, b),
                            lean_quad_bits<kClamp>(s[j + 4], c8, b), lean_quad_bits<kClamp>(s[j + 5], c8, b));
    }
  }
}

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
// 2t+8, 2t+9} (+ 32c + 16h) x 4 bytes of dv (4g..4g+3): 4 reads, 8 byte permutes, 4 writes.
// Lane bits -> (c0, h, t0, t1, g0), the rest -> (c1, g1 ...): see the module comment.
__device__ __forceinline__ void transpose_v(uint32_t vt_tile, uint32_t st_tile) {
  static_assert(8 * kDv % kThreads == 0, "whole rounds of units");
#pragma unroll
  for (int it = 0; it < 8 * kDv / kThreads; ++it) {
    const int u = threadIdx.x + it * kThreads;
    const int l = u & 31, rest = u >> 5;
    const int c = (l & 1) | ((rest & 1) << 1), h = (l >> 1) & 1, t = (l >> 2) & 3;
    const int g = ((l >> 4) & 1) | ((rest >> 1) << 1);
    const int k0 = 32 * c + 16 * h + 2 * t;
    const uint32_t w0 = lds32(st_tile + stg(k0, 4 * g)), w1 = lds32(st_tile + stg(k0 + 1, 4 * g));
    const uint32_t w2 = lds32(st_tile + stg(k0 + 8, 4 * g)), w3 = lds32(st_tile + stg(k0 + 9, 4 * g));
    const uint32_t lo01 = __byte_perm(w0, w1, 0x5140), hi01 = __byte_perm(w0, w1, 0x7362);
    const uint32_t lo23 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
    const int pos = 32 * c + 16 * h + 4 * t;
    sts32(vt_tile + vt(4 * g + 0, pos), __byte_perm(lo01, lo23, 0x5410));
    sts32(vt_tile + vt(4 * g + 1, pos), __byte_perm(lo01, lo23, 0x7632));
    sts32(vt_tile + vt(4 * g + 2, pos), __byte_perm(hi01, hi23, 0x5410));
    sts32(vt_tile + vt(4 * g + 3, pos), __byte_perm(hi01, hi23, 0x7632));
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

  // c = fp32(softmax_scale * log2(e) * dq * dk), the products in double (fp8_models.log2_scale).
  const float c = static_cast<float>(static_cast<double>(p.softmax_scale) * kLog2eD *
                                     static_cast<double>(*static_cast<const float*>(p.descale_q)) *
                                     static_cast<double>(*static_cast<const float*>(p.descale_k)));
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
    if (need_mask) {
#pragma unroll
      for (int j = 0; j < kNS; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n0 + j * 8 + quad_col + (e & 1);
          const int row = r_lo + (e >> 1) * 8;
          if (col >= sk || (kCausal && col > row + diag)) acc_s[4 * j + e] = -INFINITY;
        }
      }
    }
    float bias[2], factor[2];
    bool big = false;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kNS; ++j) mx = fmaxf(mx, fmaxf(acc_s[4 * j + 2 * hr], acc_s[4 * j + 2 * hr + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float t = __fmul_rn(mx, c);                  // T: the block's reference max
      if (mx == -INFINITY) {                             // no key of this block: P = 0, state kept
        bias[hr] = 0.f;
        factor[hr] = 1.f;
      } else if (t < m_run[hr] - kSkip) {                // negligible (module comment): P = 0
        bias[hr] = -INFINITY;
        factor[hr] = 1.f;
      } else {
        bias[hr] = __fmaf_rn(-8.f, t, kCode0);           // fp32(120 - 8T)
        factor[hr] = frame[hr] == -INFINITY ? 0.f : exp2f(frame[hr] - t);
        frame[hr] = t;
        m_run[hr] = fmaxf(m_run[hr], t);
        big |= fabsf(t) >= kBigT;
      }
    }

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

  // ---- epilogue: O / l * dv (bf16) and LSE = ln 2 (F + log2(l / 256)) -------------------------
  __nv_bfloat16* go = static_cast<__nv_bfloat16*>(const_cast<void*>(p.o)) + off.o;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float l = acc_l[2 * hr];                      // every column holds the row sum
    const int row = r_lo + hr * 8;
    if (row >= sq) continue;
    const float inv = l > 0.f ? dv_scale / l : 0.f;
    __nv_bfloat16* orow = go + static_cast<long long>(row) * p.o_stride_s;
#pragma unroll
    for (int i = 0; i < kDv / 8; ++i) {
      __nv_bfloat162 v2 = __floats2bfloat162_rn(acc_o[4 * i + 2 * hr] * inv, acc_o[4 * i + 2 * hr + 1] * inv);
      *reinterpret_cast<__nv_bfloat162*>(orow + i * 8 + quad_col) = v2;
    }
    if (p.lse != nullptr && (lane % 4) == 0) {
      float* glse = lse_rows(p, seq, b, h);
      glse[row] = l > 0.f ? (frame[hr] + log2f(l) - kLog2Shift) * kLn2 : -INFINITY;
    }
  }
}

}  // namespace zyfa
