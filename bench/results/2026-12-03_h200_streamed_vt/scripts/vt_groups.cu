// Experiment: G groups of 128 threads in one CTA, each transposing its own 128-key blocks the
// way the pre-pass does (loads in registers, rows to shared memory, PRMTs, 16-byte stores).
#include <stdint.h>
#ifndef G
#define G 6
#endif
constexpr int kDv = 256, kB = 128, kPitch = kDv + 16, kT = 128;
constexpr int kTile = kB * kPitch + 16 * 7 + 16;
__device__ __forceinline__ uint32_t row_at(int k) { return k * kPitch + 16 * ((k >> 4) & 7); }
__device__ __forceinline__ uint32_t swz128(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }
extern "C" __global__ void __launch_bounds__(128 * G, 1)
vt_groups(const uint8_t* v, uint8_t* vt, long long v_stride_b, long long v_stride_s, long long v_stride_h,
          long long vt_stride_h, int batch, int hkv, int sk, int first, int unused) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int grp = threadIdx.x / kT, tid = threadIdx.x % kT;
  uint8_t* tile = smem + grp * kTile;
  const int nblk = (sk + kB - 1) / kB, items = batch * hkv * nblk;
  constexpr int kChunks = kDv / 16, kLoads = kB * kChunks / kT, kUnits = kDv / 4 * (kB / 16);
  for (int i = first + blockIdx.x * G + grp; i < items; i += gridDim.x * G) {
    const int blk = i % nblk, h = (i / nblk) % hkv, b = i / (nblk * hkv), n0 = blk * kB;
    const uint8_t* src = v + b * v_stride_b + h * v_stride_h + (long long)n0 * v_stride_s;
    uint4 x[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int q = tid + j * kT, r = q / kChunks, c = q % kChunks;
      x[j] = n0 + r < sk ? *reinterpret_cast<const uint4*>(src + r * v_stride_s + 16 * c) : make_uint4(0u, 0u, 0u, 0u);
    }
    asm volatile("bar.sync %0, %1;\n" :: "r"(grp + 1), "r"(kT) : "memory");   // the tile's last reads done
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int q = tid + j * kT, r = q / kChunks, c = q % kChunks;
      *reinterpret_cast<uint4*>(&tile[row_at(r) + 16 * c]) = x[j];
    }
    asm volatile("bar.sync %0, %1;\n" :: "r"(grp + 1), "r"(kT) : "memory");
    uint8_t* out = vt + h * vt_stride_h + ((long long)b * nblk + blk) * kB * kDv;
#pragma unroll
    for (int j = 0; j < kUnits / kT; ++j) {
      const int u = tid + j * kT, g = u % 8, a = u / 8;
      uint32_t y[16];
#pragma unroll
      for (int o = 0; o < 16; ++o) y[o] = *reinterpret_cast<const uint32_t*>(&tile[row_at(16 * g + o) + 4 * a]);
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
        *reinterpret_cast<uint4*>(out + swz128(4 * a + r, g)) = make_uint4(w[r][0], w[r][1], w[r][2], w[r][3]);
    }
  }
}
