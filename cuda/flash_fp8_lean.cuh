// zyfa sm_90a FP8: the layouts and arithmetic of the body.  Inserted by generator/kernel_source.py after
// flash_common.cuh, before the FP8 body, with the variant's WGMMA wrappers in place.
//
// * The layouts: Q and K in 64-byte K-blocks with the 64B swizzle, V^T with the 128B swizzle
//   and its keys in P's order, and the pre-pass that writes V^T to global memory.
// * The P arithmetic of fp8_models.RECIPES["sm_90a"]: the block's frame (its exact fp32 max,
//   the skip of negligible blocks) and the Lean byte, centred (the recipe's code_offset in
//   w's constant kWBias) and formed in half precision two scores at a time (byte_form
//   "lean_h2": per score 1 FFMA + 1/2 F2FP + 1/2 HFMA2 + 1/4 PRMT).  The body also builds the
//   byte with the quadratic mantissa correction (kByteQuad: "quad_h2", 1 FFMA + 2 HFMA2 + 1/2
//   F2FP + 1/2 LOP3 + 1/4 PRMT; or in fp32, "quad_fold": 4 FFMA + 1 LOP3 + 1/2 I2IP),
//   whichever the recipe names.  The sm_90a recipe's is the plain byte: the consumers are bound
//   by their instruction issue, and the correction's instructions cost more than it buys.
//
// P in WGMMA-operand order.  The S accumulator gives a thread, per row and 32 keys, the keys
// {2t, 2t+1, 2t+8, 2t+9} and the same + 16 (t = lane % 4); the e4m3 A fragment wants the
// consecutive k positions 4t..4t+3 and 16+4t..16+4t+3.  So k position 4t+i holds key
// {2t, 2t+1, 2t+8, 2t+9}[i] (the same + 16 above): the bytes are packed in accumulator
// order, and V^T is written with its K (key) positions in that order.  A sum over keys
// does not care about their order.
//
// Layouts (every tile 1024-byte aligned):
//   Q, K:    64-byte K-blocks of R rows (R = 128), row r's 16-byte chunk c at c ^ ((r >> 1) & 3)
//            (the 64B swizzle: 512 bytes between 8-row groups, a k32 step is +32 bytes)
//   V^T:     Dv rows of 128 key bytes, 128B swizzle (1024 bytes between 8-row groups): one bulk
//            copy of a block of the pre-pass's V^T, which is stored the same way
//   ones:    8 rows of 128 bytes 0x38 (1.0) after each V^T stage's rows: PV's last pass is
//            N = its columns + 8 (d_v + 8, or 136 at d256, where rows 2..7 of stage 0's hold
//            the mbarriers and the sum is read from column 0)
//
// V^T in global memory (the pre-pass, transpose_v): per key/value head vt_stride_h bytes, a
// block of 128 key columns after another, each as a V^T stage holds it (Dv rows of 128 bytes
// in the 128B swizzle: Dv 128 contiguous bytes, one bulk copy).  Sequence b's keys from column
// vt_column0(b) on, in P's order within each 16, and zeros from its last key to the end of its
// last 128-key block, so that a block past the sequence's end multiplies zeros (never another
// sequence's values, never NaN) by the P of its masked keys.

#include <cuda_bf16.h>
#include <stdint.h>

namespace zyfa {

using namespace zyfa_cfg;

constexpr float kLn2 = 0.6931471805599453f;
constexpr float kSkip = 64.f;               // blocks this far below the running max are skipped
constexpr float kBigT = 262144.f;           // |T| from here on may round a code past 120.5: clamp
// kWBias (generated): fp32(16 + (c0 - delta) / 8), the main bytes' w of the block max, less the
// recipe's centring offset delta where the byte is the plain Lean one (31 for the quad forms);
// the diagonal terms' u of the block max is kLog2Shift (x = p_shift there).
constexpr float kFoldZMax = (kCode0 - kFoldC) / 8.f;   // z whose code is c0 (exact: -62.625)
constexpr int kTileOnes = 8 * 128;

// K-major operand descriptors (the leading byte offset is unused for swizzled K-major tiles):
// Q and K in 64B swizzle (8-row groups 512 bytes apart), V^T and ones in 128B (1024 apart).
__device__ __forceinline__ uint64_t desc_64b(uint32_t smem_addr) { return gmma_desc(smem_addr, 16, 512, 2); }
__device__ __forceinline__ uint64_t desc_128b(uint32_t smem_addr) { return gmma_desc(smem_addr, 16, 1024, 1); }

__device__ __forceinline__ void sts32(uint32_t a, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(a), "r"(v) : "memory");
}
// A word of global memory read with acquire semantics at the GPU's scope (what other CTAs
// wrote before the release that this read sees is visible after it).
__device__ __forceinline__ int ld_acquire_gpu(const int* a) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(a) : "memory");
  return v;
}

// ---- the launches' order: programmatic dependent launch ----------------------------------------
//
// The runtime queues the pre-pass, the kernel and the tail kernel (where there is one) in that
// order, the kernel and the tail as programmatic dependents of the launch before them (the
// manifest's dependent_launch; launch.Launch.dependent): a dependent's CTAs may start once
// every CTA of the launch before it has started (each triggers as it starts: launch_dependents)
// and take each SM as that launch's CTAs leave it, so the SMs that finish first do not wait for
// the last one, nor the next launch for the host's queue.  So each waits (wait_prior_launch)
// before it reads what the launch before it writes: the kernel before its first V^T copy; the
// tail kernel reads nothing the kernel writes, and waits for the kernel's end before its own,
// so that what follows it on the stream follows both.  Launched plainly, both instructions
// return at once.

// Wait until the launch before this one on the stream has ended and its writes are visible.
__device__ __forceinline__ void wait_prior_launch() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// Let the next launch's CTAs start once every CTA of this one has come here (or ended).
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// ---- V^T: the pre-pass ---------------------------------------------------------------------

// The first V^T column of sequence b: b ceil(sk / 128) 128 for a dense batch; in a packed
// (varlen) batch its first key rounded up to a multiple of 128, plus 128 b, which leaves room
// for every sequence's last block: 128 (ceil((k_b + sk_b) / 128) - ceil(k_b / 128)) + 128 >=
// 128 ceil(sk_b / 128).  catalogue.vt_columns sizes the workspace by the same rule.  k0: the
// sequence's first key as sequence_bounds clamps it (0 <= k0 <= k0 + sk_b <= total_k), so that
// its blocks end within the workspace whatever cu_seqlens_k holds: ceil(k0 / 128) +
// ceil(sk_b / 128) <= ceil(total_k / 128) + 1, and b + 1 <= batch.
static_assert(kVtBlock == kBlockN, "the pre-pass's key blocks are the kernel's (catalogue.VT_BLOCK)");

template <class P>
__device__ __forceinline__ long long vt_column0(const P& p, int b, long long k0) {
  constexpr int kB = kVtBlock;
  if (p.cu_seqlens_k != nullptr) return (k0 + kB - 1) / kB * kB + static_cast<long long>(kB) * b;
  return static_cast<long long>(b) * ((p.seqlen_k + kB - 1) / kB * kB);
}

// Where key column `col` (a multiple of 128) of key/value head h starts in the V^T workspace:
// blocks of 128 columns one after another, each Dv rows of 128 bytes (module comment).
template <class P>
__device__ __forceinline__ uint8_t* vt_block(const P& p, int h, long long col) {
  return static_cast<uint8_t*>(const_cast<void*>(p.vt)) + h * p.vt_stride_h + col * kDv;
}

// A paged cache's K (catalogue.gathers_k): keys n0 .. n0 + 127 of key/value head h of sequence
// b, those below sk (its used rows), each from its page (k_row) into the contiguous copy kg,
// (batch, seqlen_k, hkv, kDqk) bytes, which the kernel reads as a contiguous cache's K.  Rows
// from sk on are left as they are: the kernel masks their scores by assignment.  Every load of
// a thread in flight before its stores.
template <class P>
__device__ __forceinline__ void gather_k(const P& p, int b, int h, int n0, int sk) {
  constexpr int kChunks = kDqk / 16, kLoads = kVtBlock * kChunks / kVtThreads;
  static_assert(kVtBlock * kChunks % kVtThreads == 0, "whole rounds");
  uint4 x[kLoads];
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int i = threadIdx.x + j * kVtThreads, r = i / kChunks, c = i % kChunks;
    if (n0 + r < sk) x[j] = *reinterpret_cast<const uint4*>(k_row(p, b, h, n0 + r) + 16 * c);
  }
  uint8_t* kg = static_cast<uint8_t*>(const_cast<void*>(p.kg));
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int i = threadIdx.x + j * kVtThreads, r = i / kChunks, c = i % kChunks;
    if (n0 + r < sk)
      *reinterpret_cast<uint4*>(kg + ((static_cast<long long>(b) * p.seqlen_k + n0 + r) * p.hkv + h) * kDqk + 16 * c) = x[j];
  }
}

// One CTA of the pre-pass (kVtThreads threads): keys n0 .. n0 + 127 (n0 = 128 blockIdx.x) of
// key/value head blockIdx.y of sequence blockIdx.z, V (keys x Dv, rows v_stride_s apart; a paged
// cache's each from its page: v_row) ->
// V^T (Dv rows of those 128 key bytes, in P's order, zeros past the sequence's end, in the 128B
// swizzle of a V^T stage: the block is copied to shared memory as it is).  The rows go into
// shared memory 16 bytes at a time (every load of a thread in flight at once); then a thread
// takes units of 4 dv rows x 16 keys: 16 four-byte words (4 dv bytes of a key each), 32 PRMT
// to 16 words of V^T (4 rows x the 16 keys in P's order), 4 stores of 16 bytes.
template <class P>
__device__ void transpose_v(const P& p) {
  launch_dependents();   // the kernel's CTAs may start on the SMs this launch leaves
  // Key row k of the tile at k kPitch + 16 ((k >> 4) & 7), 16-byte aligned.  A warp's word
  // reads take 8 groups g of 16 keys x 4 consecutive words a: with kPitch = 16 (mod 128) the
  // word of (g, a) lies in bank 4 g + a (+ the key's own offset, the same for the warp).
  constexpr int kPitch = kDv + 16;
  constexpr int kChunks = kDv / 16;
  constexpr int kUnits = kDv / 4 * (kVtBlock / 16);            // (4 dv rows, 16 keys)
  static_assert(kVtBlock * kChunks % kVtThreads == 0 && kUnits % kVtThreads == 0 && kVtThreads % 8 == 0,
                "whole rounds");
  __shared__ __align__(16) uint8_t tile[kVtBlock * kPitch + 16 * 7];   // the last group's rows 112 bytes on
  const auto row_at = [](int k) { return k * kPitch + 16 * ((k >> 4) & 7); };
  const int n0 = blockIdx.x * kVtBlock, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds s = sequence_bounds(p, b);
  if (n0 >= s.sk) return;
  const uint8_t* v = static_cast<const uint8_t*>(p.v) + tensor_offsets(p, s, b, 0, h).v;   // key/value head h
  constexpr int kLoads = kVtBlock * kChunks / kVtThreads;
  uint4 x[kLoads];
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int i = threadIdx.x + j * kVtThreads, r = i / kChunks, c = i % kChunks;
    x[j] = n0 + r < s.sk ? *reinterpret_cast<const uint4*>(v_row(p, v, b, h, n0 + r) + 16 * c) : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int i = threadIdx.x + j * kVtThreads, r = i / kChunks, c = i % kChunks;
    *reinterpret_cast<uint4*>(&tile[row_at(r) + 16 * c]) = x[j];
  }
  __syncthreads();
  // Unit u: keys 16 g .. 16 g + 15 (g = u % 8) of dv rows 4 a .. 4 a + 3 (a = u / 8).  Word t of
  // a V^T chunk holds keys 2t, 2t + 1, 2t + 8, 2t + 9 (P's order): of their words y, the pairs
  // (y[2t], y[2t + 1]) and (y[2t + 8], y[2t + 9]) interleaved by byte, then joined by halves
  // (the module comment: k position 4t + i of a 16-key group holds key {2t, 2t + 1, 2t + 8, 2t + 9}[i]).
  if constexpr (HasPages<P>::value) {
    if (paged(p)) gather_k(p, b, h, n0, s.sk);
  }
  uint8_t* vt = vt_block(p, h, vt_column0(p, b, s.k_start) + n0);
#pragma unroll
  for (int j = 0; j < kUnits / kVtThreads; ++j) {
    const int u = threadIdx.x + j * kVtThreads, g = u % 8, a = u / 8;
    uint32_t y[16];
#pragma unroll
    for (int o = 0; o < 16; ++o) y[o] = *reinterpret_cast<const uint32_t*>(&tile[row_at(16 * g + o) + 4 * a]);
    uint32_t w[4][4];                                         // [dv row 4a + i][word t]
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint32_t lo01 = __byte_perm(y[2 * t], y[2 * t + 1], 0x5140), hi01 = __byte_perm(y[2 * t + 8], y[2 * t + 9], 0x5140);
      const uint32_t lo23 = __byte_perm(y[2 * t], y[2 * t + 1], 0x7362), hi23 = __byte_perm(y[2 * t + 8], y[2 * t + 9], 0x7362);
      w[0][t] = __byte_perm(lo01, hi01, 0x5410);
      w[1][t] = __byte_perm(lo01, hi01, 0x7632);
      w[2][t] = __byte_perm(lo23, hi23, 0x5410);
      w[3][t] = __byte_perm(lo23, hi23, 0x7632);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<uint4*>(vt + swz128(4 * a + i, g)) = make_uint4(w[i][0], w[i][1], w[i][2], w[i][3]);
  }
}

// The variant's WGMMA instructions (generator/kernel_source.py).
ZYFA_WGMMA_WRAPPERS

// ---- the P arithmetic --------------------------------------------------------------------

// The reference of one block for the two rows (hr) a thread holds, after masking: T =
// fp32(max S * c), bias = fp32(K - T) (the bytes' w = y/8 + 16 with K = kWBias; a diagonal
// block's u = log2 x with K = kLog2Shift), and the factor 2^(F - T) that moves the row state
// from its frame F to T.  A row with no key in the block keeps its state (P = 0, factor 1);
// one whose block max lies kSkip below its running max M is skipped the same way.  Returns
// whether |T| >= kBigT somewhere (w may then round so far past 31 that a code passes 120.5:
// the clamped path; below it the block max's w is within 2^-5 of 31, its code 120).
template <bool kTwo>
__device__ __forceinline__ bool block_frame(const float (&s)[kBlockN / 2], float c, float (&frame)[2],
                                            float (&m_run)[2], float (&bias)[2], float (&factor)[2]) {
  float mx[2];
  quad_row_max(s, mx);
  bool big = false;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {          // selects, not branches: the two rows overlap
    const float t = __fmul_rn(mx[hr], c);                     // T: the block's reference max
    const bool none = mx[hr] == -INFINITY;                    // no key of this block: P = 0
    const bool live = !none && !(t < m_run[hr] - kSkip);      // else negligible: P = 0
    bias[hr] = live ? __fsub_rn(kTwo ? kLog2Shift : kWBias, t) : (none ? 0.f : -INFINITY);   // fp32(K - T)
    factor[hr] = live ? exp2_ftz(frame[hr] - t) : 1.f;        // 0 for the first: F = -inf
    big |= live && fabsf(t) >= kBigT;
    frame[hr] = live ? t : frame[hr];
    m_run[hr] = live ? fmaxf(m_run[hr], t) : m_run[hr];
  }
  return big;
}

// The Lean byte of one score, before clamping: rint(8z + C) as the bits of a subnormal (an
// int in [0, 2^23) for codes >= 0, negative below; -inf gives a negative int too).  The
// arithmetic of e4m3.quad_fold_codes on w = fma(S, c, bias), one fp32 rounding per step:
//   w = S c + (31 - T)            FFMA   y / 8 + 16: in [16, 32) for every code > 0
//   f = 1 + frac(w) / 16          LOP3   w's low 19 mantissa bits under 1.0's exponent
//   g = f A1 + A0                 FFMA   A1 = 32 K', A0 = -66 K'
//   z = f g + w                   FFMA   8z + C = y + K' (x^2 - x), x = frac(w)
//   code = rint(8z + C)           FFMA   z 2^-146 + C 2^-149: rounded once, onto the subnormals
template <bool kClamp>
__device__ __forceinline__ int lean_quad_bits(float s, float c, float bias) {
  const float w = __fmaf_rn(s, c, bias);
  uint32_t fb;
  asm("lop3.b32 %0, %1, 0x7FFFF, %2, 0xEA;\n" : "=r"(fb) : "r"(__float_as_uint(w)), "r"(0x3F800000u));
  const float f = __uint_as_float(fb);
  const float g = __fmaf_rn(f, kFoldA1, kFoldA0);
  float z = __fmaf_rn(f, g, w);
  if constexpr (kClamp) z = fminf(z, kFoldZMax);
  float r;
  asm("fma.rn.f32 %0, %1, 0f00000008, %2;\n" : "=f"(r) : "f"(z), "f"(__int_as_float(kFoldC)));  // 2^-146, C 2^-149
  return __float_as_int(r);
}

// The Lean byte of two scores in half precision, the arithmetic of e4m3.lean_h2_codes on the
// fp32 w of each (one rounding per step, f16 subnormals kept):
//   W = f16x2(w_hi, w_lo)        1/2 F2FP  y / 8 + 16 to 1/64: 4 bits of binade, 6 of x
//   code = sat(W 2^-21 - 2^-17)  1/2 HFMA2 rint(8W - 128) as the bits of an f16 subnormal, the
//                                          negative codes (and -inf, NaN) saturated to 0
// or with kByteQuad (e4m3.quad_h2_codes) the quadratic correction between them, z for W:
//   F = 1 + x / 16               1/2 LOP3  W's low 6 mantissa bits under 1.0's exponent
//   t1 = F A - A = A x / 16      1/2 HFMA2
//   t2 = F B - 17 B / 16         1/2 HFMA2 = B (x - 1) / 16 (17 B / 16 is an f16: B = 75/8)
//   z = t1 t2 + W                1/2 HFMA2 8z - 128 = y + K'' (x^2 - x), K'' = A B / 32
//   code = sat(z 2^-21 - 2^-17)  1/2 HFMA2 rint(8z - 128) as the bits of an f16 subnormal, the
//                                          negative codes (and -inf, NaN) saturated to 0
// Returns the two codes in the low bytes of the two halves (bits above them zero).
// Its steps: W of a pair (F2FP), W held to the code 120 (HMNMX2), the codes (HFMA2.SAT).
__device__ __forceinline__ uint32_t lean_w2(float w_lo, float w_hi) {
  uint32_t big_w;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(big_w) : "f"(w_hi), "f"(w_lo));
  return big_w;
}
__device__ __forceinline__ uint32_t lean_clamp2(uint32_t z) {
  asm("min.f16x2 %0, %1, %2;\n" : "=r"(z) : "r"(z), "r"(kH2ZMax));
  return z;
}
__device__ __forceinline__ uint32_t lean_code2(uint32_t z) {
  uint32_t code;
  asm("fma.rn.sat.f16x2 %0, %1, %2, %3;\n" : "=r"(code) : "r"(z), "r"(0x00080008u), "r"(0x80808080u));  // 2^-21, -2^-17
  return code;
}

template <bool kClamp>
__device__ __forceinline__ uint32_t lean_h2(float w_lo, float w_hi) {
  const uint32_t big_w = lean_w2(w_lo, w_hi);
  uint32_t z;
  if constexpr (kByteQuad) {
    uint32_t f, t1, t2;
    asm("lop3.b32 %0, %1, 0x003F003F, %2, 0xEA;\n" : "=r"(f) : "r"(big_w), "r"(0x3C003C00u));
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(t1) : "r"(f), "r"(kH2A), "r"(kH2NegA));
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(t2) : "r"(f), "r"(kH2B), "r"(kH2NegB17));
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(z) : "r"(t1), "r"(t2), "r"(big_w));
  } else {
    z = big_w;
  }
  if constexpr (kClamp) z = lean_clamp2(z);
  return lean_code2(z);
}

// Four codes -> one b32 of bytes [q0, q1, q2, q3] (q0 lowest), each saturated to [0, 255].
__device__ __forceinline__ uint32_t pack4(int q0, int q1, int q2, int q3) {
  uint32_t hi, d;
  asm("cvt.pack.sat.u8.s32.b32 %0, %1, %2, 0;\n" : "=r"(hi) : "r"(q3), "r"(q2));
  asm("cvt.pack.sat.u8.s32.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(q1), "r"(q0), "r"(hi));
  return d;
}

// P bytes of the block in A-fragment order (module comment): per 32 keys k, registers
// {row lo: k 4t..4t+3, row hi: same, row lo: 16+4t.., row hi: 16+4t..}.
template <bool kClamp>
__device__ __forceinline__ void lean_p(uint32_t (&pa)[kBlockN / 8], const float (&s)[kBlockN / 2], float c,
                                       const float (&bias)[2]) {
#pragma unroll
  for (int k = 0; k < kBlockN / 32; ++k) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {            // r: (16-key half) * 2 + row half
      const int j = 16 * k + 8 * (r >> 1) + 2 * (r & 1);
      const float b = bias[r & 1];
      if constexpr (kByteH2) {
        const uint32_t lo = lean_h2<kClamp>(__fmaf_rn(s[j], c, b), __fmaf_rn(s[j + 1], c, b));
        const uint32_t hi = lean_h2<kClamp>(__fmaf_rn(s[j + 4], c, b), __fmaf_rn(s[j + 5], c, b));
        pa[4 * k + r] = __byte_perm(lo, hi, 0x6420);
      } else {
        pa[4 * k + r] = pack4(lean_quad_bits<kClamp>(s[j], c, b), lean_quad_bits<kClamp>(s[j + 1], c, b),
                              lean_quad_bits<kClamp>(s[j + 4], c, b), lean_quad_bits<kClamp>(s[j + 5], c, b));
      }
    }
  }
}

// The same bytes with the clamp decided after the pairs are made (the recipe's lean_h2 form): W of
// every pair first (FFMA, F2FP), then, where some row of the warp has |T| >= kBigT
// (`clamp`, warp-uniform), W held to the code 120, then the codes and their packing.  The FFMAs
// and F2FPs need not wait for the warp's vote on `clamp`.
__device__ __forceinline__ void lean_p_late_clamp(uint32_t (&pa)[kBlockN / 8], const float (&s)[kBlockN / 2],
                                                  float c, const float (&bias)[2], bool clamp) {
  static_assert(kByteH2 && !kByteQuad, "the plain Lean byte in half precision");
  uint32_t w[kBlockN / 4];                   // pair 2 (4k + r) + h: keys j, j + 1 (h = 0) or j + 4, j + 5
#pragma unroll
  for (int k = 0; k < kBlockN / 32; ++k) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int j = 16 * k + 8 * (r >> 1) + 2 * (r & 1);
      const float b = bias[r & 1];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float w_hi = __fmaf_rn(s[j + 4 * h + 1], c, b), w_lo = __fmaf_rn(s[j + 4 * h], c, b);
        w[2 * (4 * k + r) + h] = lean_w2(w_lo, w_hi);
      }
    }
  }
  if (__any_sync(0xffffffffu, clamp)) {
#pragma unroll
    for (int i = 0; i < kBlockN / 4; ++i) w[i] = lean_clamp2(w[i]);
  }
#pragma unroll
  for (int i = 0; i < kBlockN / 8; ++i) pa[i] = __byte_perm(lean_code2(w[2 * i]), lean_code2(w[2 * i + 1]), 0x6420);
}

// ---- the diagonal blocks: P in two terms -------------------------------------------------
//
// Where the causal diagonal of the warpgroup's 64 rows cuts a block (the recipe's "hi_lo"
// diagonal: the keys nearest each query), P goes in two e4m3 terms, both multiplied with V^T
// (two PV products into one accumulator, the ones rows summing both):
//   u  = S c + (8 - T)   1 FFMA    log2 x: 8 at the block max (x = p_shift = 256)
//   x  = 2^u             1 MUFU    e4m3.exp2_x: ex2.approx, 0 for u < -7 (and masked keys)
//   X  = f16(x)          1/2 F2FP
//   hi = e4m3(X)         1/2 F2FP (cvt.rn.satfinite.e4m3x2.f16x2)
//   lo = e4m3(X - hi)    1/2 F2FP back to f16x2, 1/2 HADD2 (exact), 1/2 F2FP
// about 2^-10 of P (RMS) instead of one byte's 2^-5.  A warpgroup meets one such block, two
// where the diagonal crosses a block boundary inside its rows.  x by MUFU: the consumers are
// bound by their instruction issue and their MUFU pipe is otherwise idle (the Lean byte has no
// exponential), so one ex2.approx a score (a warp's taking the SM sub-partition's MUFU 8
// cycles) costs them less than an exp2 polynomial's nine instructions on the FMA pipe.

// e4m3.exp2_x of one score: x = 2^u by ex2.approx.ftz.f32 (within 2 ulp of fp32(2^u) over
// every u in [-7, 9), measured: docs/numerics.md), 0 where u < -7 (P under
// 2^-15 of the block max; -inf and NaN included).  kClamp (|T| >= kBigT somewhere): u held
// below 9 first, as the model holds it (x < 512, so that X stays finite in f16).
template <bool kClamp>
__device__ __forceinline__ float exp2_x(float s, float c, float bias) {
  float u = __fmaf_rn(s, c, bias);
  if constexpr (kClamp) u = fminf(u, kExpUMax);
  float x;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(x) : "f"(u));
  return u >= kExpUZero ? x : 0.f;
}

// Four scores' x (keys in A-fragment order: x0, x1 then x4, x5) -> their hi and lo codes
// (e4m3.hi_lo_codes), one byte each, x0's the lowest: per pair F2FP to f16x2, the hi pair, back
// to f16x2, the exact difference, the lo pair.  One asm block, so that the two 16-bit pairs go
// into one register as they are made (as separate statements, each is zero-extended to 32 bits
// and the two joined by a PRMT: six instructions more per four scores).
__device__ __forceinline__ void hi_lo_quad(float x0, float x1, float x4, float x5, uint32_t& hi, uint32_t& lo) {
  asm("{\n.reg .b32 x01, x45, b01, b45;\n.reg .b16 h01, h45, l01, l45;\n"
      "cvt.rn.f16x2.f32 x01, %3, %2;\n"
      "cvt.rn.f16x2.f32 x45, %5, %4;\n"
      "cvt.rn.satfinite.e4m3x2.f16x2 h01, x01;\n"
      "cvt.rn.satfinite.e4m3x2.f16x2 h45, x45;\n"
      "cvt.rn.f16x2.e4m3x2 b01, h01;\n"
      "cvt.rn.f16x2.e4m3x2 b45, h45;\n"
      "sub.rn.f16x2 x01, x01, b01;\n"
      "sub.rn.f16x2 x45, x45, b45;\n"
      "cvt.rn.satfinite.e4m3x2.f16x2 l01, x01;\n"
      "cvt.rn.satfinite.e4m3x2.f16x2 l45, x45;\n"
      "mov.b32 %0, {h01, h45};\n"
      "mov.b32 %1, {l01, l45};\n}\n"
      : "=r"(hi), "=r"(lo) : "f"(x0), "f"(x1), "f"(x4), "f"(x5));
}

// P of a diagonal block in A-fragment order (as lean_p): pa the first terms, pl the second.
// The block's 16-key groups from `seen` on (warp-uniform) are masked for every row of the warp:
// their terms are 0, and they are written so without the arithmetic.
template <bool kClamp>
__device__ __forceinline__ void hi_lo_p(uint32_t (&pa)[kBlockN / 8], uint32_t (&pl)[kBlockN / 8],
                                        const float (&s)[kBlockN / 2], float c, const float (&bias)[2],
                                        int seen) {
#pragma unroll
  for (int k = 0; k < kBlockN / 32; ++k) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if (2 * k + (r >> 1) >= seen) {        // group (r >> 1) of keys 32k ..
        pa[4 * k + r] = pl[4 * k + r] = 0u;
        continue;
      }
      const int j = 16 * k + 8 * (r >> 1) + 2 * (r & 1);
      const float b = bias[r & 1];
      hi_lo_quad(exp2_x<kClamp>(s[j], c, b), exp2_x<kClamp>(s[j + 1], c, b), exp2_x<kClamp>(s[j + 4], c, b),
                 exp2_x<kClamp>(s[j + 5], c, b), pa[4 * k + r], pl[4 * k + r]);
    }
  }
}

// ---- the epilogue --------------------------------------------------------------------------

// A serving kernel's row at the end (F: its frame, l: its rounded sum, in which a score at F
// weighs p_shift): query head h's sink z joins it as fp8_models._join_sinks states, at ms =
// fp32(z fp32(log2 e)) in F's units (the recipe's lse_offset is 0): below F it adds p_shift
// 2^(ms - F) to l; above, the row moves to it, l = l 2^(F - ms) + p_shift and O times
// 2^(F - ms), the factor returned (0 for a row that saw no key: zeros, the LSE of the sink
// alone).  exp2 by ex2.approx, within about an fp32 ulp of the model's float64 one.
template <class P>
__device__ __forceinline__ float with_sink(const P& p, int h, float& f, float& l) {
  if (p.sinks == nullptr) return 1.f;
  const float ms = static_cast<const float*>(p.sinks)[h] * static_cast<float>(kLog2eD);
  if (!(ms > f)) {
    l += kPShift * exp2_ftz(ms - f);
    return 1.f;
  }
  const float a = f == -INFINITY ? 0.f : exp2_ftz(f - ms);
  l = l * a + kPShift;
  f = ms;
  return a;
}

// A consumer warpgroup's 64 rows of O, scaled by inv[hr] per row half, out as bf16, 16 bytes a
// thread, through shared memory (store_o_rows, flash_common.cuh, with Q's 64-byte K-blocks as
// the staging area): four-byte stores straight from the WGMMA accumulators' layout would fill
// the store queue.
//
// The factors O takes to O / l * dv (inv, per row half) and LSE = ln 2 (F + log2(l / 256)) for the
// two rows r_lo, r_lo + 8 a thread holds (acc_l's first column holds the sum: the body broadcast
// it where only that one does).  w: the CTA's work, derived again by the caller
// (cta_index_again), so that none of it stays in registers through the consumer's loop.
template <class P>
__device__ __forceinline__ void finish_rows(const P& p, const CtaWork& w, const float (&acc_l)[4],
                                            const float (&frame)[2], int r_lo, float (&inv)[2]) {
  // The key/value head derived afresh (opaque: the group size hq / hkv of the prologue is not
  // kept through the consumer's loop for it).
  const int h_kv = w.h / (static_cast<int>(opaque(static_cast<uint32_t>(p.hq))) / p.hkv);
  const float dv_scale = descale_at(p.descale_v, p.descale_v_stride_b, p.descale_v_stride_h, w.b, h_kv);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float l = acc_l[2 * hr], f = frame[hr], o_factor = 1.f;
    if constexpr (zyfa_cfg::kServing) o_factor = with_sink(p, w.h, f, l);
    const int row = r_lo + hr * 8;
    inv[hr] = l > 0.f ? dv_scale * o_factor / l : 0.f;
    if (p.lse != nullptr && (threadIdx.x % 4) == 0 && row < w.seq.sq) {
      float* glse = lse_rows(p, w.seq, w.b, w.h);
      glse[row] = l > 0.f ? (f + log2f(l) - kLog2Shift) * kLn2 : -INFINITY;
    }
  }
}

// finish_rows, then O as bf16 for the warpgroup's 64 rows (from wg_row0) by store_o_rows, through
// its Q rows at sQg.
template <class P>
__device__ __forceinline__ void write_rows(const P& p, const CtaWork& w, const float (&acc_o)[kDv / 2],
                                           const float (&acc_l)[4], const float (&frame)[2], int r_lo, int wg_row0,
                                           int cw, uint32_t sQg) {
  float inv[2];
  finish_rows(p, w, acc_l, frame, r_lo, inv);
  store_o_rows<64>(acc_o, inv, sQg,
               static_cast<__nv_bfloat16*>(const_cast<void*>(p.o)) + w.off.o + static_cast<long long>(wg_row0) * p.o_stride_s,
               p.o_stride_s, w.seq.sq - wg_row0, cw);
}

}  // namespace zyfa
