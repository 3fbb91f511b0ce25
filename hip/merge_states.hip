// zyfa: merge_attention_states for gfx950: the HIP spellings of the shared arithmetic
// (cuda/merge_states.cuh), on clang's attributes and amdgcn builtins alone (the unit is
// compiled without HIP headers or device libraries).  v_exp_f32 and v_log_f32 are exp2 and
// log2 to 1 ulp; the divisions are clang's correctly rounded expansion.

#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif

__device__ inline int zyfa_thread() { return int(__builtin_amdgcn_workitem_id_x()); }
__device__ inline int zyfa_block(int axis) {
  return int(axis == 0 ? __builtin_amdgcn_workgroup_id_x()
             : axis == 1 ? __builtin_amdgcn_workgroup_id_y() : __builtin_amdgcn_workgroup_id_z());
}
__device__ inline float zyfa_exp2(float x) { return __builtin_amdgcn_exp2f(x); }
__device__ inline float zyfa_log2(float x) { return __builtin_amdgcn_logf(x); }
__device__ inline unsigned zyfa_as_u32(float x) { return __builtin_bit_cast(unsigned, x); }
__device__ inline float zyfa_as_f32(unsigned u) { return __builtin_bit_cast(float, u); }
// HIP's __syncthreads: a workgroup-scope fence (the loads complete) and s_barrier.
__device__ inline void zyfa_barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

#include "merge_states.cuh"
