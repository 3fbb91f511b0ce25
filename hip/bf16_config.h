// zyfa gfx950 BF16 body: HIP spellings, types, the variant's tile constants and the
// few synchronisation and addressing helpers the stages share.

static_assert(!zyfa_cfg::kFp8, "the HIP body implements the BF16 kernels only");

#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif

namespace zyfa {

using u16 = unsigned short;
using u32 = unsigned int;
using i64 = long long;
using u64 = unsigned long long;

typedef float f32x2 __attribute__((ext_vector_type(2)));
typedef float f32x16 __attribute__((ext_vector_type(16)));
typedef u32 u32x2 __attribute__((ext_vector_type(2)));
typedef u32 u32x4 __attribute__((ext_vector_type(4)));
typedef short i16x4 __attribute__((ext_vector_type(4)));
typedef __bf16 bf16x2 __attribute__((ext_vector_type(2)));
typedef __bf16 bf16x8 __attribute__((ext_vector_type(8)));

#define ZYFA_LDS __attribute__((address_space(3)))
#define ZYFA_GLOBAL __attribute__((address_space(1)))
#define ZYFA_CONST __attribute__((address_space(4)))

namespace detail {

constexpr int kDqk = zyfa_cfg::kDqk;
constexpr int kDv = zyfa_cfg::kDv;
constexpr int kBlockM = zyfa_cfg::kBlockM;
constexpr int kBlockN = zyfa_cfg::kBlockN;
constexpr int kThreads = zyfa_cfg::kThreads;
constexpr int kWaves = kThreads / 64;
constexpr int kRowsPerWave = 32;  // one 32-column MFMA tile of queries a wave

static_assert(kWaves == 8 && kBlockM == kRowsPerWave * kWaves, "8 waves x 32 query rows");
static_assert(kDqk % 16 == 0 && kDv % 32 == 0 && kBlockN % 32 == 0, "MFMA tiling");
static_assert(zyfa_cfg::kDynamicSmem == 0, "LDS is static on gfx950");

constexpr int kQkSteps = kDqk / 16;    // k-steps of the S^T MFMA over the head dim
constexpr int kKeySubs = kBlockN / 32; // 32-key subtiles of S^T per KV tile
constexpr int kPvSteps = kBlockN / 16; // k-steps of the O^T MFMA over the keys
constexpr int kDvTiles = kDv / 32;     // 32-row tiles of O^T

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ inline float neg_inf() { return -__builtin_inff(); }

// Bit casts take their operand by value: clang mis-handles __builtin_bit_cast
// applied directly to an ext_vector element lvalue (it reads element 0).
__device__ inline int as_int(float x) { return __builtin_bit_cast(int, x); }
__device__ inline float as_float(int x) { return __builtin_bit_cast(float, x); }

// Two floats -> packed bf16 pair (round to nearest even; v_cvt_pk_bf16_f32), low first.
__device__ inline u32 pack_bf16x2(float lo, float hi) {
  return __builtin_bit_cast(u32, __builtin_convertvector(f32x2{lo, hi}, bf16x2));
}

// x combined with the value lane l ^ 32 holds (v_permlane32_swap: the halves trade rows;
// the two results are {own, other} in some order in every lane, so a symmetric op of
// them is the same in both halves).
__device__ inline float max_halves(float x) {
  const auto sw = __builtin_amdgcn_permlane32_swap(as_int(x), as_int(x), false, false);
  return __builtin_elementwise_maximum(as_float(sw[0]), as_float(sw[1]));
}
__device__ inline float sum_halves(float x) {
  const auto sw = __builtin_amdgcn_permlane32_swap(as_int(x), as_int(x), false, false);
  return as_float(sw[0]) + as_float(sw[1]);
}

// __syncthreads(): make LDS writes visible to the workgroup, then barrier.
__device__ inline void sync_workgroup() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// x, hidden from the compiler's value numbering (so that a test on it is made anew where used,
// not kept from an earlier identical one), in an SGPR or a VGPR.
__device__ inline int opaque_sgpr(int x) {
  asm volatile("" : "+s"(x));
  return x;
}
__device__ inline int opaque_vgpr(int x) {
  asm volatile("" : "+v"(x));
  return x;
}

// s_waitcnt vmcnt(0): this wave's buffer loads (and their LDS writes) are complete.
// Encoding (gfx9): vmcnt [3:0] and [15:14], expcnt [6:4], lgkmcnt [11:8]; the others at max.
__device__ inline void wait_vm_all() { __builtin_amdgcn_s_waitcnt(0x0F70); }

// Segment [cu[b], cu[b + 1]) of a packed batch, clamped: its first row to [0, total], its end
// to [first, total], its length to at most max_len; so 0 <= first <= first + len <= total.
__device__ inline void clamped_segment(const int* cu, int b, int total, int max_len, i64& first, int& len) {
  const int c0 = cu[b], c1 = cu[b + 1];
  const int lo = c0 < 0 ? 0 : c0 > total ? total : c0;
  const int hi = c1 < lo ? lo : c1 > total ? total : c1;
  first = lo;
  len = hi - lo < max_len ? hi - lo : max_len;
}

// A count read from memory (cache_seqlens[b]: a sequence's keys), clamped to [0, cap].
__device__ inline int clamped_count(int n, int cap) { return n < 0 ? 0 : n > cap ? cap : n; }

}  // namespace detail
}  // namespace zyfa
