// zyfa sm_90a kernel bodies: what they share.  Inserted by generator/kernel_source.py after the
// generated configuration and `struct Params`, before the body.
//
// * The work of one CTA: blockIdx = (query-row block, query head, batch entry or varlen
//   sequence); its sequence's bounds, and the element offsets of its Q, K, V, O and LSE.
// * The asynchronous-copy and WGMMA primitives of the WGMMA bodies.

#include <stdint.h>

namespace zyfa {

// The rows and keys of batch entry (or varlen sequence) b.
struct SeqBounds {
  long long q_start, k_start;   // first row / key in a packed (varlen) batch, else 0
  int sq, sk;                   // its query rows and keys
};

template <class P>
__device__ __forceinline__ SeqBounds sequence_bounds(const P& p, int b) {
  SeqBounds s{0, 0, p.seqlen_q, p.seqlen_k};
  if (p.cu_seqlens_q != nullptr) {
    const int* cq = static_cast<const int*>(p.cu_seqlens_q);
    const int* ck = static_cast<const int*>(p.cu_seqlens_k);
    s.q_start = cq[b];
    s.sq = cq[b + 1] - cq[b];
    s.k_start = ck[b];
    s.sk = ck[b + 1] - ck[b];
  }
  return s;
}

// Element offsets of the (sequence, head) in Q, K, V and O: dense by the batch stride, varlen
// by the sequence's first row; K and V by the query head's key/value head h_kv.
struct TensorOffsets {
  long long q, k, v, o;
};

template <class P>
__device__ __forceinline__ TensorOffsets tensor_offsets(const P& p, const SeqBounds& s, int b, int h,
                                                        int h_kv) {
  return {(p.cu_seqlens_q ? s.q_start * p.q_stride_s : b * p.q_stride_b) + h * p.q_stride_h,
          (p.cu_seqlens_k ? s.k_start * p.k_stride_s : b * p.k_stride_b) + h_kv * p.k_stride_h,
          (p.cu_seqlens_k ? s.k_start * p.v_stride_s : b * p.v_stride_b) + h_kv * p.v_stride_h,
          (p.cu_seqlens_q ? s.q_start * p.o_stride_s : b * p.o_stride_b) + h * p.o_stride_h};
}

// The LSE of row 0 of the sequence for head h (fp32, [B, Hq, S] or [Hq, total rows] varlen).
template <class P>
__device__ __forceinline__ float* lse_rows(const P& p, const SeqBounds& s, int b, int h) {
  return static_cast<float*>(const_cast<void*>(p.lse)) + b * p.lse_stride_b + h * p.lse_stride_h +
         s.q_start;
}

// ---- asynchronous copies and WGMMA ---------------------------------------------------------

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_async_smem() {   // generic smem writes -> WGMMA reads
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Byte offset of (row, 16-byte chunk) in a tile of 128-byte rows with the 128B swizzle.
__device__ __forceinline__ uint32_t swz128(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 4);
}

// WGMMA shared-memory descriptor: start address, leading and stride byte offsets, swizzle
// mode (1 = 128B, 2 = 64B).
__device__ __forceinline__ uint64_t gmma_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo, int mode) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(lbo >> 4) << 16;
  d |= static_cast<uint64_t>(sbo >> 4) << 32;
  d |= static_cast<uint64_t>(mode) << 62;
  return d;
}

}  // namespace zyfa
