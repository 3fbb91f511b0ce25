// zyfa: quantize_fp8 for sm_90a: the CUDA spellings of the shared arithmetic
// (cuda/quantize_fp8.cuh).  The divisions are IEEE (no fast-math); the one fp64 product that
// meets an add (mean_of's c n) is exact, so nvcc's contraction into an fma changes no bit.

__device__ inline int zyfa_thread() { return int(threadIdx.x); }
__device__ inline int zyfa_block(int axis) { return int(axis == 0 ? blockIdx.x : axis == 1 ? blockIdx.y : blockIdx.z); }
__device__ inline unsigned zyfa_as_u32(float x) { return __float_as_uint(x); }
__device__ inline float zyfa_as_f32(unsigned u) { return __uint_as_float(u); }
__device__ inline void zyfa_barrier() { __syncthreads(); }

#include "quantize_fp8.cuh"
