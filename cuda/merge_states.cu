// zyfa: merge_attention_states for sm_90a: the CUDA spellings of the shared arithmetic
// (cuda/merge_states.cuh).  exp2f and log2f are CUDA's (2 and 1 ulp); the divisions are
// IEEE (no fast-math).

__device__ inline int zyfa_thread() { return int(threadIdx.x); }
__device__ inline int zyfa_block(int axis) { return int(axis == 0 ? blockIdx.x : axis == 1 ? blockIdx.y : blockIdx.z); }
__device__ inline float zyfa_exp2(float x) { return exp2f(x); }
__device__ inline float zyfa_log2(float x) { return log2f(x); }
__device__ inline unsigned zyfa_as_u32(float x) { return __float_as_uint(x); }
__device__ inline float zyfa_as_f32(unsigned u) { return __uint_as_float(u); }
__device__ inline void zyfa_barrier() { __syncthreads(); }

#include "merge_states.cuh"
