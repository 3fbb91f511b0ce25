// zyfa: quantize_fp8 for gfx950: the HIP spellings of the shared arithmetic
// (cuda/quantize_fp8.cuh), on clang's attributes and amdgcn builtins alone (the unit is
// compiled without HIP headers or device libraries).  The divisions are clang's correctly
// rounded expansion.  No contraction: the fp64 product in mean_of stays a v_mul_f64 (exact
// either way; an fma would be v_fma_f64 for nothing).

#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif

#pragma clang fp contract(off)

__device__ inline int zyfa_thread() { return int(__builtin_amdgcn_workitem_id_x()); }
__device__ inline int zyfa_block(int axis) {
  return int(axis == 0 ? __builtin_amdgcn_workgroup_id_x()
             : axis == 1 ? __builtin_amdgcn_workgroup_id_y() : __builtin_amdgcn_workgroup_id_z());
}
__device__ inline unsigned zyfa_as_u32(float x) { return __builtin_bit_cast(unsigned, x); }
__device__ inline float zyfa_as_f32(unsigned u) { return __builtin_bit_cast(float, u); }
// HIP's __syncthreads: a workgroup-scope fence (the loads complete) and s_barrier.
__device__ inline void zyfa_barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

#include "quantize_fp8.cuh"
