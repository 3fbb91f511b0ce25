// ex2.approx.ftz.f32 against fp32(2^u) correctly rounded (from double exp2), over every fp32 u
// in [-7, 9): the diagonal's x (cuda/flash_fp8_lean.cuh exp2_x, e4m3.exp2_x).  Counts the u
// whose x differs, the largest difference in ulp, and the u whose x differs after rounding to
// f16 (the value the two-term P is made from), per binade of |u|.
#include <cstdio>
#include <cstdint>
#include <cuda_fp16.h>

struct Acc { unsigned long long n, diff, diff16; unsigned maxulp; };

__global__ void probe(uint32_t lo, uint32_t hi, Acc* acc) {
  unsigned long long n = 0, d = 0, d16 = 0; unsigned mu = 0;
  for (uint64_t b = lo + blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; b < hi; b += (uint64_t)gridDim.x * blockDim.x) {
    const float u = __uint_as_float((uint32_t)b);
    if (!(u >= -7.f && u < 9.f)) continue;
    float x; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(x) : "f"(u));
    const float e = (float)exp2((double)u);
    ++n;
    const int du = abs((int)__float_as_uint(x) - (int)__float_as_uint(e));
    if (du) { ++d; mu = max(mu, (unsigned)du); }
    if (__half_as_ushort(__float2half_rn(x)) != __half_as_ushort(__float2half_rn(e))) ++d16;
  }
  atomicAdd(&acc->n, n); atomicAdd(&acc->diff, d); atomicAdd(&acc->diff16, d16); atomicMax(&acc->maxulp, mu);
}

int main() {
  Acc* acc; cudaMallocManaged(&acc, sizeof(Acc) * 80);
  // ranges of bit patterns: binades of |u| from 2^-30 (everything below in one range) to 8
  int k = 0; uint32_t los[80], his[80]; const char* sg[80]; int e0[80];
  for (int s = 0; s < 2; ++s) {
    uint32_t sign = s ? 0x80000000u : 0u;
    los[k] = sign; his[k] = sign | (97u << 23); sg[k] = s ? "-" : "+"; e0[k] = -999; ++k;   // |u| < 2^-30
    for (int e = -30; e <= 3; ++e) { los[k] = sign | ((uint32_t)(e + 127) << 23); his[k] = sign | ((uint32_t)(e + 128) << 23); sg[k] = s ? "-" : "+"; e0[k] = e; ++k; }
  }
  unsigned long long N = 0, D = 0, D16 = 0; unsigned MU = 0;
  printf("sign binade(|u| in [2^e, 2^(e+1))) values x_differs max_ulp f16_differs\n");
  for (int i = 0; i < k; ++i) {
    Acc z = {0, 0, 0, 0}; acc[i] = z;
    probe<<<1024, 256>>>(los[i], his[i], acc + i);
    cudaDeviceSynchronize();
    if (acc[i].n == 0) continue;
    N += acc[i].n; D += acc[i].diff; D16 += acc[i].diff16; MU = MU > acc[i].maxulp ? MU : acc[i].maxulp;
    if (e0[i] == -999) printf("%s below 2^-30 %llu %llu %u %llu\n", sg[i], acc[i].n, acc[i].diff, acc[i].maxulp, acc[i].diff16);
    else printf("%s 2^%d %llu %llu %u %llu\n", sg[i], e0[i], acc[i].n, acc[i].diff, acc[i].maxulp, acc[i].diff16);
  }
  printf("all u in [-7, 9): %llu values, x differs for %llu (%.3g), at most %u ulp; f16(x) differs for %llu (%.3g)\n",
         N, D, (double)D / N, MU, D16, (double)D16 / N);
  printf("error: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
