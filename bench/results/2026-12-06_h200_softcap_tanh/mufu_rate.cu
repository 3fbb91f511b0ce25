// Throughput of tanh.approx.f32 against ex2.approx.f32 and rcp.approx.f32: 8 independent chains
// a thread, 2,048 dependent ops each, 132 x 8 blocks of 256 threads; ops per SM clock.
#include <cstdio>
#define BODY(OP) \
  float v[8]; for (int j = 0; j < 8; ++j) v[j] = 0.001f * (threadIdx.x + j); \
  for (int it = 0; it < 2048; ++it) { _Pragma("unroll") for (int j = 0; j < 8; ++j) asm volatile(OP " %0, %0;" : "+f"(v[j])); } \
  float s = 0; for (int j = 0; j < 8; ++j) s += v[j]; if (s == 12345.f) *out = s;
__global__ void k_tanh(float* out) { BODY("tanh.approx.f32") }
__global__ void k_ex2(float* out) { BODY("ex2.approx.ftz.f32") }
__global__ void k_rcp(float* out) { BODY("rcp.approx.ftz.f32") }
__global__ void k_fma(float* out) { BODY("add.ftz.f32 %0, %0, 0f3F800000; //") }
int main() {
  float* o; cudaMalloc(&o, 4); int sms, clk; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  void (*ks[4])(float*) = {k_tanh, k_ex2, k_rcp, k_fma}; const char* names[4] = {"tanh.approx.f32", "ex2.approx.ftz.f32", "rcp.approx.ftz.f32", "add.f32"};
  for (int r = 0; r < 2; ++r) for (int i = 0; i < 4; ++i) {
    ks[i]<<<sms * 8, 256>>>(o); cudaEventRecord(a); ks[i]<<<sms * 8, 256>>>(o); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b);
    double ops = (double)sms * 8 * 256 * 8 * 2048;
    if (r) printf("%-20s %.3f ms  %.1f ops per SM per ns  (%.1f per SM clock at the %d MHz max clock)\n", names[i], ms, ops / sms / (ms * 1e6), ops / sms / (ms * 1e-3 * clk * 1e3), clk / 1000);
  }
  return 0;
}
