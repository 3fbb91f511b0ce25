// Experiment: V^T transposition by few persistent CTAs (one an SM), bulk-copied rows, staged.
#include <stdint.h>
#ifndef DV
#define DV 256
#endif
#ifndef STAGES
#define STAGES 5
#endif
#ifndef WARPS
#define WARPS 8
#endif
constexpr int kDv = DV, kB = 128, kPitch = kDv + 16;
constexpr int kTile = kB * kPitch + 16 * 7 + 16;   // padded rows, 16-byte multiple
__device__ __forceinline__ uint32_t row_at(int k) { return k * kPitch + 16 * ((k >> 4) & 7); }
__device__ __forceinline__ uint32_t swz128(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory"); }
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory"); }
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra W;\n}\n" :: "r"(bar), "r"(parity) : "memory"); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory"); }
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, uint64_t pol) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory"); }

extern "C" __global__ void __launch_bounds__(32 * (WARPS + 1), 1)
vt_stream(const uint8_t* v, uint8_t* vt, long long v_stride_b, long long v_stride_s, long long v_stride_h,
          long long vt_stride_h, int batch, int hkv, int sk, int first, int evict_first) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bars = base + STAGES * kTile;   // full[s] at bars + 8 s, empty[s] at bars + 8 (STAGES + s)
  const int nblk = (sk + kB - 1) / kB, items = batch * hkv * nblk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) { mbar_init(bars + 8 * s, 1); mbar_init(bars + 8 * (STAGES + s), WARPS); }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  uint64_t pol;
  if (evict_first) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  else asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(pol));
  int j = 0;
  for (int i = first + blockIdx.x; i < items; i += gridDim.x, ++j) {
    const int s = j % STAGES, ph = (j / STAGES) & 1;
    const uint32_t tile = base + s * kTile;
    const int blk = i % nblk, h = (i / nblk) % hkv, b = i / (nblk * hkv), n0 = blk * kB;
    if (warp == 0) {
      if (j >= STAGES) mbar_wait(bars + 8 * (STAGES + s), ph ^ 1);
      const int rows = min(kB, sk - n0);
      #ifdef NOCOPY
      if (lane == 0) mbar_arrive(bars + 8 * s);
      continue;
#endif
      if (lane == 0) mbar_arrive_expect_tx(bars + 8 * s, rows * kDv);
      __syncwarp();
      const uint8_t* src = v + b * v_stride_b + h * v_stride_h + (long long)n0 * v_stride_s;
      for (int r = lane; r < rows; r += 32) bulk_copy(tile + row_at(r), src + r * v_stride_s, kDv, bars + 8 * s, pol);
    } else {
      mbar_wait(bars + 8 * s, ph);
      const uint8_t* t = smem + s * kTile;
      uint8_t* out = vt + h * vt_stride_h + ((long long)b * nblk + blk) * kB * kDv;
      constexpr int kUnits = kDv / 4 * (kB / 16), kT = WARPS * 32;
      const int tid = threadIdx.x - 32;
      for (int u = tid; u < kUnits; u += kT) {
        const int g = u % 8, a = u / 8;
        uint32_t y[16];
#pragma unroll
        for (int o = 0; o < 16; ++o) {
          const int k = 16 * g + o;
          y[o] = n0 + k < sk ? *reinterpret_cast<const uint32_t*>(t + row_at(k) + 4 * a) : 0u;
        }
        uint32_t w[4][4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t lo01 = __byte_perm(y[2 * q], y[2 * q + 1], 0x5140), hi01 = __byte_perm(y[2 * q + 8], y[2 * q + 9], 0x5140);
          const uint32_t lo23 = __byte_perm(y[2 * q], y[2 * q + 1], 0x7362), hi23 = __byte_perm(y[2 * q + 8], y[2 * q + 9], 0x7362);
          w[0][q] = __byte_perm(lo01, hi01, 0x5410); w[1][q] = __byte_perm(lo01, hi01, 0x7632);
          w[2][q] = __byte_perm(lo23, hi23, 0x5410); w[3][q] = __byte_perm(lo23, hi23, 0x7632);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r)
#ifdef NOSTORE
          if ((w[r][0] ^ w[r][1] ^ w[r][2] ^ w[r][3]) == 0x12345678u)
#endif
          *reinterpret_cast<uint4*>(out + swz128(4 * a + r, g)) = make_uint4(w[r][0], w[r][1], w[r][2], w[r][3]);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(bars + 8 * (STAGES + s));
    }
  }
}
