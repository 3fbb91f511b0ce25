// zyfa: gfx950 BF16 attention forward (prefill) kernel body.
//
// This file is not compiled on its own: the generator places it after the
// variant's `zyfa_cfg` namespace and the generated `struct Params`, and appends
// the extern "C" entry that fills Params and calls zyfa::flash_fwd(p).
//
// It is compiled without any HIP headers (clang -cc1 -x hip -fcuda-is-device): the
// generator inlines its headers (bf16_config.h: HIP spellings on clang attributes, types,
// constants; bf16_lds.h: LDS layouts, copies, the matrix step; bf16_softmax.h), and the
// hardware is reached through clang's amdgcn builtins and one inline instruction.
//
// Work decomposition (one workgroup = 256 query rows of one head of one sequence):
//   grid (query blocks, query heads, sequences), causal blocks taken longest first
//   block 512 threads = 8 waves of 64 lanes, two on each SIMD; wave w owns query
//   rows 32w..32w+31 of the block.
// Per KV tile of kBlockN keys, K and V are copied into LDS by buffer loads that write
// LDS directly (no registers, no VALU), ahead of the tile being computed (two LDS
// buffers of each).  Each wave then computes
//   S^T = K . Q^T            (v_mfma_f32_32x32x16_bf16; Q^T stays in registers)
//   online softmax over S^T  (fp32, exp2 domain, packed fp32 math, lazy rescale)
//   O^T += V^T . P^T         (same MFMA; P^T from the S^T registers, V^T by
//                             ds_read_b64_tr_b16 from row-major V)
//
// MFMA 32x32x16 bf16 lane layout (lane l, i = l % 32, g = l / 32):
//   A (32 x 16): lane holds row i, k = 8g + t in bf16 item t = 0..7
//   B (16 x 32): lane holds col i, k = 8g + t in bf16 item t = 0..7
//   D (32 x 32): lane holds col i, rows 8j + 4g + r in float 4j + r (j, r = 0..3)
// So in S^T a lane holds 16 keys (8j + 4g + r) of a 32-key subtile for query
// column i: the row statistics of a query live in lanes i and i + 32 only.
// The keys 16ps + {4g..4g+3, 8+4g..8+4g+3} of 16-key step ps are floats
// 8(ps % 2) .. 8(ps % 2) + 7 of subtile ps / 2: P^T's B operand of PV step ps,
// in place.  The k order inside an MFMA only has to agree between A and B, so
// V^T is read with the same key map.

#include "bf16_config.h"
#include "bf16_lds.h"
#include "bf16_softmax.h"

namespace zyfa {

__device__ __attribute__((always_inline)) inline void flash_fwd(const Params& p) {
  using namespace detail;
  constexpr bool kCausal = zyfa_cfg::kCausal;

  // LDS: K tile 0, K tile 1, V tile 0, V tile 1 (kLdsK, kLdsK, kLdsV, kLdsV bf16).
  __shared__ __attribute__((aligned(1024))) u16 lds[2 * (kLdsK + kLdsV)];
  const u32 lds_addr = u32(reinterpret_cast<unsigned long long>((ZYFA_LDS u16*)lds));
  auto k_tile = [](int buf) { return buf * kLdsK; };  // u16 index of K buffer `buf`
  auto v_tile = [](int buf) { return 2 * kLdsK + buf * kLdsV; };

  const int tid = __builtin_amdgcn_workitem_id_x();
  const int lane = tid & 63;
  const int wave = __builtin_amdgcn_readfirstlane(tid >> 6);
  const int i = lane & 31;  // MFMA row/col index: this lane's query column
  const int g = lane >> 5;  // 32-lane half: selects k items and accumulator rows

  // The workgroup's (query block, head, sequence): the grid's (x, y, z), or causal, longest
  // first (catalogue.work_of; the grid is (ceil(seqlen_q / kBlockM), hq, batch)).
  int mblock = __builtin_amdgcn_workgroup_id_x();
  int h = __builtin_amdgcn_workgroup_id_y();
  int b = __builtin_amdgcn_workgroup_id_z();
  if constexpr (zyfa_cfg::kLongestFirst) {
    const int blocks = (p.seqlen_q + kBlockM - 1) / kBlockM, per_block = p.hq * p.batch;
    const int i = mblock + blocks * (h + p.hq * b), r = i % per_block;
    mblock = blocks - 1 - i / per_block;
    h = r % p.hq;
    b = r / p.hq;
  }

  // ---- this sequence's rows -------------------------------------------------------
  // Packed: [cu[b], cu[b + 1]) clamped to the tensor's rows (first in [0, total], end in
  // [first, total], length at most max_seqlen), so that whatever the values (the runtime may
  // pass them unread) no access leaves q, k, v, o or the LSE: garbage in, garbage out.
  const int* cu_q = static_cast<const int*>(p.cu_seqlens_q);
  const int* cu_k = static_cast<const int*>(p.cu_seqlens_k);
  int sq = p.seqlen_q, sk = p.seqlen_k;
  i64 q_first = 0, k_first = 0;  // packed row of the sequence's row 0 (varlen)
  if (cu_q) clamped_segment(cu_q, b, p.total_q, p.seqlen_q, q_first, sq);
  if (cu_k) clamped_segment(cu_k, b, p.total_k, p.seqlen_k, k_first, sk);
  const int m0 = mblock * kBlockM;
  if (m0 >= sq) return;  // whole workgroup leaves before any barrier

  const int hk = h / (p.hq / p.hkv);  // GQA: query heads share kv heads in groups
  const u16* q = static_cast<const u16*>(p.q) + h * p.q_stride_h +
                 (cu_q ? q_first * p.q_stride_s : b * p.q_stride_b);
  const u16* k = static_cast<const u16*>(p.k) + hk * p.k_stride_h +
                 (cu_k ? k_first * p.k_stride_s : b * p.k_stride_b);
  const u16* v = static_cast<const u16*>(p.v) + hk * p.v_stride_h +
                 (cu_k ? k_first * p.v_stride_s : b * p.v_stride_b);
  u16* o = static_cast<u16*>(const_cast<void*>(p.o)) + h * p.o_stride_h +
           (cu_q ? q_first * p.o_stride_s : b * p.o_stride_b);

  // Bottom-right causal alignment: row r sees key j iff j <= r + diag.
  const int diag = sk - sq;
  const int last_row = (m0 + kBlockM < sq ? m0 + kBlockM : sq) - 1;
  int n_end = sk;
  if (kCausal && last_row + diag + 1 < n_end) n_end = last_row + diag + 1;
  const int n_tiles = n_end > 0 ? (n_end + kBlockN - 1) / kBlockN : 0;

  // This wave's rows [w0, w0 + 32): which tiles it computes at all, and from which one
  // on it needs masks (wave-uniform; interior tiles run mask-free).
  const int w0 = m0 + kRowsPerWave * wave;
  const int w_last = (w0 + kRowsPerWave < sq ? w0 + kRowsPerWave : sq) - 1;
  int w_end = sk;  // keys this wave's last row may see
  if (kCausal && w_last + diag + 1 < w_end) w_end = w_last + diag + 1;
  int w_clean = sk;  // keys every row of this wave sees
  if (kCausal && w0 + diag + 1 < w_clean) w_clean = w0 + diag + 1;
  if (w0 >= sq) w_end = 0;  // a wave with no rows only copies tiles

  // ---- Q^T operand, kept in registers -------------------------------------------
  const int row = w0 + i;
  bf16x8 qf[kQkSteps];
  load_q(qf, q, row < sq ? row : -1, p.q_stride_s, g);

  // Group 0 copies K, group 1 V (see the ping-pong below): wave % 4 is a wave's place in it.
  const KvCopy<KLayout> kcopy(k, int(p.k_stride_s), wave % (kWaves / 2), lane);
  const KvCopy<VLayout> vcopy(v, int(p.v_stride_s), wave % (kWaves / 2), lane);

  OnlineSoftmax sm(p.softmax_scale);
  f32x16 oacc[kDvTiles];
#pragma unroll
  for (int dt = 0; dt < kDvTiles; ++dt) oacc[dt] = f32x16{};

  // ---- the ping-pong ------------------------------------------------------------------
  // Every wave runs the same loop, two steps a tile, each ending at a workgroup barrier:
  //   M(t): O^T += V(t-1)^T P^T(t-1), then S^T(t) = K(t) Q^T  (matrix pipe, LDS reads)
  //   S(t): masks and online softmax of S^T(t) -> P^T(t)      (VALU)
  // but waves 4-7 (group 1) pass one extra barrier first, so they run one step behind
  // waves 0-3 (group 0): in phase 2t group 0 runs M(t) while group 1 runs S(t-1), in phase
  // 2t+1 group 0 runs S(t) and group 1 M(t).  Each SIMD holds one wave of each group, so
  // its matrix pipe takes one wave's M while its VALU takes the other's S.
  // Copies, issued by each group in its S step (the vector memory pipe and the issue slots
  // they take are then free of matrix work) and waited for before that step's barrier:
  // group 0 copies K(t+1) in S(t) (phase 2t+1), group 1 V(t+1) in S(t) (phase 2t+2); K(0)
  // and V(0) in a prologue phase.  K(t) is read in phases 2t and 2t+1 and its buffer
  // refilled (K(t+2)) in 2t+3; V(t) is read in 2t+2 and 2t+3 and refilled in 2t+4: two
  // buffers of each are never overwritten while read.  Phases: the prologue, M(0), then
  // S(t) and M(t+1) for t = 0 .. n_tiles - 1 (M(n_tiles) drains PV); group 0 ends with one
  // barrier more, so that both groups pass the same number.
  const bool lead = wave < kWaves / 2;
  auto active = [&](int t) { return t >= 0 && t < n_tiles && t * kBlockN < w_end; };  // wave-uniform
  auto copy = [&](int t) {  // K(t) for group 0, V(t) for group 1
    if (t >= n_tiles) return;
    if (lead) kcopy.issue(lds_addr + 2 * k_tile(t & 1), t * kBlockN, sk);
    else vcopy.issue(lds_addr + 2 * v_tile(t & 1), t * kBlockN, sk);
  };
  if (n_tiles > 0) {
    copy(0);
    wait_vm_all();
    sync_workgroup();
    if (!lead) sync_workgroup();  // the stagger
    // M(0)
    f32x16 s[kKeySubs];
    __builtin_amdgcn_s_setprio(1);  // matrix work first where both waves of a SIMD can issue
    if (active(0)) qk_step(s, lds + k_tile(0), qf, lane);
    __builtin_amdgcn_s_setprio(0);
    sync_workgroup();
    bf16x8 pf[kPvSteps];
    for (int t = 0; t < n_tiles; ++t) {
      // S(t)
      copy(t + 1);
      if (active(t)) {
        const int n0 = t * kBlockN;
        if (n0 + kBlockN > w_clean || n0 + kBlockN > sk) mask_tile(s, n0, row, diag, sk, g);
        sm.update(s, pf, oacc);
      }
      wait_vm_all();
      sync_workgroup();
      // M(t+1): PV(t) and QK(t+1) as one pipeline (one code path in the loop: a second,
      // differently pipelined one costs more registers than a wave has).  QK(t+1) also
      // runs where its result is never read (past this wave's last key; t + 1 = n_tiles,
      // on a stale buffer): active(t + 1) implies active(t), and S(t+1) checks it.
      __builtin_amdgcn_s_setprio(1);
      if (active(t)) pv_qk_step(oacc, lds + v_tile(t & 1), pf, s, lds + k_tile((t + 1) & 1), qf, lane);
      __builtin_amdgcn_s_setprio(0);
      sync_workgroup();
    }
    if (lead) sync_workgroup();
  }

  // ---- epilogue: normalise, store O (bf16) and LSE ----
  const float l = sm.row_sum();
  if (row >= sq) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;  // rows that saw no key output zeros
  store_o(o + i64(row) * p.o_stride_s, oacc, inv, g);
  if (p.lse && g == 0) {
    float* lse = static_cast<float*>(const_cast<void*>(p.lse)) + b * p.lse_stride_b +
                 h * p.lse_stride_h + (q_first + row);
    *lse = sm.lse(l);
  }
}

}  // namespace zyfa
