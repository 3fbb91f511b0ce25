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
//   grid (query blocks, query heads, sequences); causal (query heads, sequences, query
//   blocks), the blocks taken longest first
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
// Sliding windows, softcap and attention sinks are runtime arguments (window_left/_right,
// softcap/_scale, sinks): the loop over a workgroup's key tiles runs only over those its rows'
// windows meet, and the features' code lives in a second specialisation of the body (attend
// below), so the plain loop carries none of it.
//
// KV caches (flash_attn_with_kvcache) are runtime arguments too: cache_seqlens (int32, a
// sequence's keys; null: K and V are tensors) gives each sequence its key count, clamped to
// [0, seqlen_k] -- a contiguous cache (B, seqlen_k, hkv, d) is then read as a dense batch
// (sequence b at b k_stride_b) by the plain or the features' loop, at the cost of one scalar
// load a workgroup; page_table (null: not paged) selects a third specialisation (at d64 also a
// fourth, paged without the features, for calls that have none) whose copies read each 16-row
// group of keys from its page (KvCopy::issue_paged, PageMap), with every page index clamped to
// the cache: whatever cache_seqlens and page_table hold, no access leaves k, v or the table's
// rows.
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
namespace detail {

// The kernel's arguments where they lie, the kernel argument segment (the entry's parameters
// are Params' fields in order, both from catalogue.kernargs at natural alignment, so the
// segment holds a Params), read where used: its address hidden from the compiler at the call,
// so that the loads are not merged with those at the start.
__device__ inline const Params& late_params() {
  const void* segment = __builtin_amdgcn_kernarg_segment_ptr();
  asm volatile("" : "+s"(segment));
  return *static_cast<const Params*>(segment);
}

// The same, for values that must stay scalar (a buffer's base): through a constant address
// space pointer, whose loads are uniform (a generic pointer's may be a lane's scratch: its
// loads are taken as divergent, and would land in VGPRs).
__device__ inline const ZYFA_CONST Params* late_constant_params() {
  auto segment = __builtin_amdgcn_kernarg_segment_ptr();
  asm volatile("" : "+s"(segment));
  return (const ZYFA_CONST Params*)segment;
}

// LDS: K tile 0, K tile 1, V tile 0, V tile 1 (kLdsK, kLdsK, kLdsV, kLdsV bf16).
using LdsTiles = u16[2 * (kLdsK + kLdsV)];

// The workgroup's attention, in two specialisations compiled into every variant (flash_fwd
// below picks one per launch, a uniform branch before any work):
//   kFeatures = false: no window (causal kernels: the causal one), no softcap -- the plain
//     loop, with nothing of the features in it (window bounds and the softcap are constants
//     that fold away);
//   kFeatures = true: the window bounds and the softcap from the arguments.
// Sinks (one term a row, after the loop) are read in both.
//   kPaged = true: K and V from a paged cache, through page_table (with kFeatures; at d64 also
//     without, flash_fwd below).
//   kFixedMax = true (without kFeatures, d <= 192): the plain loop with the softcap, whose
//     softmax runs against a fixed max (OnlineSoftmax::fix_max): calls with a softcap in
//     (0, kFixedCap] and no window bound.
// P: Params, or (paged) the Params of the argument segment read anew (late_constant_params):
// the paged specialisation's arguments are loaded where it starts, not at the kernel's entry
// with the others' (held across their branches, they spilled SGPRs).
template <bool kFeatures, bool kPaged = false, bool kFixedMax = false, class P = const Params>
__device__ __attribute__((always_inline)) inline void attend(P& p, LdsTiles& lds) {
  constexpr bool kCausal = zyfa_cfg::kCausal;

  const u32 lds_addr = u32(reinterpret_cast<unsigned long long>((ZYFA_LDS u16*)lds));
  auto k_tile = [](int buf) { return buf * kLdsK; };  // u16 index of K buffer `buf`
  auto v_tile = [](int buf) { return 2 * kLdsK + buf * kLdsV; };

  const int tid = __builtin_amdgcn_workitem_id_x();
  const int lane = tid & 63;
  const int wave = __builtin_amdgcn_readfirstlane(tid >> 6);
  const int i = lane & 31;  // MFMA row/col index: this lane's query column
  const int g = lane >> 5;  // 32-lane half: selects k items and accumulator rows

  // The workgroup's (query block, head, sequence): the grid's (x, y, z); causal, longest
  // first: the grid is (hq, batch, ceil(seqlen_q / kBlockM)) and z counts the blocks from the
  // last (catalogue.work_of), so the device hands out every head and sequence of the last
  // block before any of the one before it.
  int mblock = __builtin_amdgcn_workgroup_id_x();
  int h = __builtin_amdgcn_workgroup_id_y();
  int b = __builtin_amdgcn_workgroup_id_z();
  if constexpr (zyfa_cfg::kLongestFirst) {
    const int blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    const int z = b;
    b = h;
    h = mblock;
    mblock = blocks - 1 - z;
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
  // A KV cache: the sequence's first cache_seqlens[b] keys of its part of the cache (seqlen_k
  // rows: contiguous max_seqlen_k, paged max_pages page_size), the count clamped to it.
  // (Read from the argument segment here, not loaded at the kernel's entry with the others,
  // where the extra SGPRs spilled; a scalar load: the counts are not written while it runs.)
  if (const ZYFA_CONST Params* a = late_constant_params(); a->cache_seqlens)
    sk = clamped_count(((const ZYFA_CONST int*)a->cache_seqlens)[b], a->seqlen_k);
  const int m0 = mblock * kBlockM;
  if (m0 >= sq) return;  // whole workgroup leaves before any barrier

  const int hk = h / (p.hq / p.hkv);  // GQA: query heads share kv heads in groups
  const u16* q = static_cast<const u16*>(p.q) + h * p.q_stride_h +
                 (cu_q ? q_first * p.q_stride_s : b * p.q_stride_b);
  // (paged: the head's rows of page 0; each copy adds its page's offset, stride_b a page)
  const u16* k = static_cast<const u16*>(p.k) + hk * p.k_stride_h +
                 (kPaged ? 0 : cu_k ? k_first * p.k_stride_s : b * p.k_stride_b);
  const u16* v = static_cast<const u16*>(p.v) + hk * p.v_stride_h +
                 (kPaged ? 0 : cu_k ? k_first * p.v_stride_s : b * p.v_stride_b);
  u16* o = static_cast<u16*>(const_cast<void*>(p.o)) + h * p.o_stride_h +
           (cu_q ? q_first * p.o_stride_s : b * p.o_stride_b);

  // The keys each row sees (KeyWindow: bottom-right aligned, row r at key position r + diag;
  // the window's bounds are runtime arguments, -1 none; causal kernels have right = 0).
  const KeyWindow win{kFeatures ? p.window_left : -1, kCausal ? 0 : kFeatures ? p.window_right : -1, sk - sq, sk};
  // The workgroup's tiles: those that meet [first(m0), end(last_row)), tiles t_first ..
  // t_first + n_tiles - 1 of the sequence; a tile wholly outside every row's window is never
  // loaded.  Loop index t is tile t_first + t.
  const int last_row = (m0 + kBlockM < sq ? m0 + kBlockM : sq) - 1;
  const int n_first = win.first(m0), n_end = win.end(last_row);
  const int t_first = n_first / kBlockN;
  const int n_tiles = n_end > n_first ? (n_end + kBlockN - 1) / kBlockN - t_first : 0;

  // This wave's rows [w0, w0 + 32): up to which tile it computes at all (those before
  // w_end), and which tiles need masks: those not inside [w_clean_first, w_clean_end), the
  // keys every row of the wave sees (wave-uniform; interior tiles run mask-free).  A wave
  // whose rows' window starts after the workgroup's runs its first tiles wholly masked (P
  // = 0): the waves pass each barrier together, so skipping them would save no time.
  const int w0 = m0 + kRowsPerWave * wave;
  const int w_last = (w0 + kRowsPerWave < sq ? w0 + kRowsPerWave : sq) - 1;
  const int w_clean_first = win.first(w_last);
  const int w_clean_end = win.end(w0);
  const int w_end = w0 < sq ? win.end(w_last) : 0;  // a wave with no rows only copies tiles

  // ---- Q^T operand, kept in registers -------------------------------------------
  const int row = w0 + i;
  bf16x8 qf[kQkSteps];
  load_q(qf, q, row < sq ? row : -1, p.q_stride_s, g);

  // Group 0 copies K, group 1 V (see the ping-pong below): wave % 4 is a wave's place in it.
  const KvCopy<KLayout, kPaged> kcopy(k, int(p.k_stride_s), wave % (kWaves / 2), lane);
  const KvCopy<VLayout, kPaged> vcopy(v, int(p.v_stride_s), wave % (kWaves / 2), lane);

  // Softcap (a runtime value, wave-uniform): capped scores are r = -1 / (1 + e^{2x}), logits
  // 2 softcap r + softcap (cap_scores).
  // (An integer test of its bits, softcap >= 0: SALU, where a float compare is a VALU one
  // whose 64-bit lane mask would be held across the loop.)
  const bool capped = kFixedMax || (kFeatures && as_int(p.softcap) > 0);
  const float cap_k = 2.f * kLog2e * p.softcap_scale;  // softcap_scale = softmax_scale / softcap
  OnlineSoftmax sm(capped ? 2.f * p.softcap : p.softmax_scale, capped ? p.softcap : 0.f);
  // kFixedMax (capped, softcap <= kFixedCap): the softmax against a fixed m, no row max
  // (OnlineSoftmax::fix_max).
  if constexpr (kFixedMax) sm.fix_max();
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
  auto key0 = [&](int t) { return (t_first + t) * kBlockN; };  // first key of tile t
  auto active = [&](int t) { return t >= 0 && t < n_tiles && key0(t) < w_end; };  // wave-uniform
  // Paged: the sequence's pages (SGPRs held across the loop: read there, a tile's arguments
  // waited 200 cycles of scalar-load latency a tile); the page stride of the tensor this wave
  // copies; lane n's page-table entry for instruction n of the tile it copies next, loaded one
  // tile ahead (after the copies of the tile before, waited for with them; d64: at the matrix
  // step's start, fetch_ahead below; one load outside the K / V branch: the two loads' results
  // merged after it waited for them at once).
  const PageMap pages((const ZYFA_GLOBAL int*)(p.page_table) + b * p.page_table_stride, p.page_size, p.num_pages,
                      p.page_magic);
  const i64 page_stride = lead ? p.k_stride_b : p.v_stride_b;
  // d64 also keeps lane n's row offset in its page from the load to the copy (one VGPR more:
  // its group and slot are then computed once, not again in the copy; d256 had no VGPR free).
  constexpr bool kRowAhead = kDqk <= 64;
  int page_entry = 0;
  u32 page_row = 0;  // (kRowAhead) lane n: the byte offset of instruction n's first row in its page
  auto row_offset = [&](int t, u32& slot) {
    if constexpr (kRowAhead) {  // (K's and V's rows as long: one group; from 2 g)
      const u32 g2 = kcopy.lane_group2(key0(t), sk, lane);
      slot = pages.slot_of2(g2);
      return pages.row_of2(g2, slot) * (2u * u32(lead ? kcopy.stride : vcopy.stride));
    }
    u32 raw;
    const u32 gk = kcopy.lane_group(key0(t), sk, lane, raw), gv = vcopy.lane_group(key0(t), sk, lane, raw);
    const u32 g = lead ? gk : gv;
    slot = pages.slot_of(g);
    return lead ? kcopy.row_offset(g, slot, pages) : vcopy.row_offset(g, slot, pages);
  };
  auto fetch = [&](int t) {
    u32 slot;
    if constexpr (kRowAhead) {
      page_row = row_offset(t, slot);
    } else {
      u32 raw;
      const u32 gk = kcopy.lane_group(key0(t), sk, lane, raw), gv = vcopy.lane_group(key0(t), sk, lane, raw);
      slot = pages.slot_of(lead ? gk : gv);
    }
    page_entry = pages.table[slot];
  };
  auto copy = [&](int t) {  // K(t) for group 0, V(t) for group 1
    if (t >= n_tiles) return;
    if constexpr (kPaged) {
      if (lead)
        kcopy.template issue_paged<kRowAhead>(lds_addr + 2 * k_tile(t & 1), key0(t), sk, page_entry, page_row, pages, page_stride, lane);
      else
        vcopy.template issue_paged<kRowAhead>(lds_addr + 2 * v_tile(t & 1), key0(t), sk, page_entry, page_row, pages, page_stride, lane);
      if (t + 1 < n_tiles) fetch(t + 1);
    } else {
      if (lead) kcopy.issue(lds_addr + 2 * k_tile(t & 1), key0(t), sk);
      else vcopy.issue(lds_addr + 2 * v_tile(t & 1), key0(t), sk);
    }
  };
  // d64 (kSpread, paged or not): the copy of tile t + 1 is issued in S(t) one instruction at a
  // time, spread over the softmax (OnlineSoftmax::update's four `between` points), from K's or
  // V's copy picked once here (one type: CopyCore): issued together at the step's start, the
  // four copying waves' 16 loads queued in the vector-memory pipe (1 KiB in 16 cycles) and held
  // the last wave's softmax about 190 cycles (the step that sets the period at d64).  The
  // tile's buffers (unpaged: one, SALU; paged: the lane-parallel ones, VALU, and 3 v_readlane a
  // piece) are made with the first piece.  Past the last tile the pieces still run (no branch a
  // piece): they fill the buffer the schedule above leaves free then, with zeros past the last
  // key or with keys no wave reads (paged: fetch's groups are clamped to the last key's, so its
  // slots stay in the table's row; a group past the last key has a size of 0).
  constexpr bool kSpread = KvCopy<KLayout, kPaged>::kSpread && KvCopy<VLayout, kPaged>::kSpread && kDqk == kDv;
  const auto mine = [&] {
    if constexpr (kSpread) return lead ? kcopy.core() : vcopy.core();
    else return 0;
  }();
  auto tile_of = [&](int t) {  // (kSpread) the buffers of the copy of tile t
    if constexpr (!kSpread) return 0;
    else if constexpr (kPaged) return mine.tile(key0(t), sk, page_entry, page_row, pages, page_stride, lane);
    else return mine.tile(key0(t), sk);
  };
  // (kSpread, paged) At the start of M(t), at priority 0 before its matrix work: the page-table
  // entries and row offsets of tile t + 1, which S(t) copies (the load's latency under the
  // matrix step; the compiler waits for it at the first piece).  Tile 1's: copy(0).  In S(t),
  // after the last piece, they took 26 cycles a tile more; with the buffers too in M(t), or at
  // the end of M(t), more still (docs/gfx950_bf16.md, paged).
  auto fetch_ahead = [&](int t) {
    if constexpr (kSpread && kPaged) {
      fetch(t + 1);
      __builtin_amdgcn_sched_barrier(0);
    }
  };
  if (n_tiles > 0) {
    if constexpr (kPaged) fetch(0);  // the first tile's entries
    copy(0);
    wait_vm_all();
    sync_workgroup();
    if (!lead) sync_workgroup();  // the stagger
    // M(0)
    f32x16 s[kKeySubs];
    constexpr int kDepthHere = kPaged ? kDepthPaged : kDepth;  // operands in flight (bf16_lds.h)
    // (d 256) the V stage's base held from pv_ahead to the matrix step in the plain loop only:
    // the features' loop (the paged one's too at d 256) spilled the softcap's factor with it
    constexpr bool kHeldBase = kXorReads && !kFeatures;
    __builtin_amdgcn_s_setprio(1);  // matrix work first where both waves of a SIMD can issue
    if (active(0)) qk_step<kDepthHere>(s, lds + k_tile(0), qf, lane);
    // (kFeatures) at priority 1 up to the barrier: the moves the compiler places after QK(0)
    // (its results into the loop's registers) otherwise wait for the VALU behind the other
    // group's S(0) on the same SIMD, whose left-edge masks make it the longest step.
    if constexpr (kFeatures) {
      sync_workgroup();
      __builtin_amdgcn_s_setprio(0);
    } else {
      __builtin_amdgcn_s_setprio(0);
      sync_workgroup();
    }
    bf16x8 pf[kPvSteps];
    for (int t = 0; t < n_tiles; ++t) {
      // S(t)
      decltype(tile_of(0)) next;  // (kSpread) the buffers of tile t + 1
      const u32 next_lds = lds_addr + 2 * (lead ? k_tile((t + 1) & 1) : v_tile((t + 1) & 1));
      auto piece = [&](int k) {  // (kSpread) instruction k of the copy of tile t + 1, pinned where called
        if constexpr (kSpread) {
          static_assert(decltype(mine)::kLoads == 4, "four pieces");
          __builtin_amdgcn_sched_barrier(0);
          if (k == 0) next = tile_of(t + 1);
          mine.issue_one(next, k, next_lds);
          __builtin_amdgcn_sched_barrier(0);
        }
      };
      if constexpr (!kSpread) copy(t + 1);
      if (active(t)) {
        const int n0 = key0(t);
        // (softcap and the left edge expected not: laid out off the tile's straight path, a
        // tile without them takes no branch for them; n0 opaque in mask_after at d <= 192, as
        // in mask_before: no lane-bound induction variable in the matrix step; d256 spilled)
        if (__builtin_expect(capped, 0)) cap_scores(s, cap_k);
        if (kFeatures && __builtin_expect(n0 < w_clean_first, 0))
          mask_before(s, n0, win.first(row), g, win.first(w0), w_clean_first);
        if (n0 + kBlockN > w_clean_end) mask_after(s, kFeatures && kDqk <= 192 ? opaque_sgpr(n0) : n0, win.end(row), g);
        sm.update(s, pf, oacc, piece, kFixedMax);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) piece(k);
      }
      // (kAhead) M(t+1)'s first operands, at the end of S(t) (V(t) is complete: its copy was
      // waited for before the last barrier, and its buffer is refilled only in phase 2t + 4)
      OperandsOf<kDepthHere> ahead;
      u32 vbase = 0;  // (kHeldBase) the V stage's lane base, from pv_ahead
      if constexpr (kAhead) {
        __builtin_amdgcn_sched_barrier(0);
        if (active(t)) vbase = pv_ahead(ahead, lds + v_tile(t & 1), lane);
      }
      wait_vm_all();
      sync_workgroup();
      // M(t+1): PV(t) and QK(t+1) as one pipeline (one code path in the loop: a second,
      // differently pipelined one costs more registers than a wave has).  QK(t+1) also
      // runs where its result is never read (past this wave's last key; t + 1 = n_tiles,
      // on a stale buffer): active(t + 1) implies active(t), and S(t+1) checks it.
      fetch_ahead(t + 1);
      __builtin_amdgcn_s_setprio(1);
      if (active(t))
        pv_qk_step<kDepthHere, kHeldBase>(oacc, lds + v_tile(t & 1), pf, s, lds + k_tile((t + 1) & 1), qf, lane,
                                          ahead, vbase);
      __builtin_amdgcn_s_setprio(0);
      sync_workgroup();
    }
    if (opaque_sgpr(wave) < kWaves / 2) sync_workgroup();  // lead (see the epilogue's row test)
  }

  // ---- epilogue: the sink, normalise, store O (bf16) and LSE ----
  // The arguments only the epilogue reads come from the kernel argument segment here, after
  // the loop (its layout is Params': both are catalogue.kernargs'), not from the values loaded
  // at the start: held across the loop, those took SGPRs the two loops leave none of.
  const Params& late = late_params();
  float l = sm.row_sum();
  float o_factor = 1.f;
  if (late.sinks) o_factor = sm.add_sink(static_cast<const float*>(late.sinks)[h], l);
  // (row and wave recomputed, not the lane masks of before the loop: held across it, those
  // took the SGPRs the two loops leave free and spilled)
  if (opaque_vgpr(row) >= sq) return;
  const float inv = l > 0.f ? o_factor / l : 0.f;  // rows that saw no key output zeros
  store_o(o + i64(row) * p.o_stride_s, oacc, inv, g);
  if (late.lse && g == 0) {
    float* lse = static_cast<float*>(const_cast<void*>(late.lse)) + b * late.lse_stride_b +
                 h * late.lse_stride_h + (q_first + row);
    *lse = sm.lse(l);
  }
}

}  // namespace detail

__device__ __attribute__((always_inline)) inline void flash_fwd(const Params& p) {
  using namespace detail;
  __shared__ __attribute__((aligned(1024))) LdsTiles lds;
  // The features' loop only where the call has one: a window bound (causal kernels: a left
  // one) or a softcap; a paged one for a paged cache.
  const bool features = as_int(p.softcap) > 0 || p.window_left >= 0 || (!zyfa_cfg::kCausal && p.window_right >= 0);
  const bool window = p.window_left >= 0 || (!zyfa_cfg::kCausal && p.window_right >= 0);
  if (p.page_table) {
    // d64: a paged loop without the features too (its softmax step is the longer one, and the
    // features' few SALU ops and registers lengthen it); at larger head dims a fourth loop
    // spilled registers, and the paged copy hides under the matrix step anyway.
    if (zyfa_cfg::kDqk <= 64 && !features) attend<false, true>(*late_constant_params(), lds);
    else attend<true, true>(*late_constant_params(), lds);
  } else if constexpr (zyfa_cfg::kDqk > 192) {  // (d256: a fourth loop spilled)
    if (!features) attend<false>(p, lds);
    else attend<true>(p, lds);
  } else if (!features) {
    attend<false>(p, lds);
  } else if (!window && u32(as_int(p.softcap)) - 1u < u32(as_int(OnlineSoftmax::kFixedCap))) {
    // no window bound, 0 < softcap <= kFixedCap (positive floats order as their bits): the plain
    // loop with the cap and the softmax against a fixed m (OnlineSoftmax::fix_max), a loop of its
    // own (a runtime flag in the features' loop cost its windowed launches 0.3 % at d128).
    attend<false, false, true>(p, lds);
  } else {
    attend<true>(p, lds);
  }
}

}  // namespace zyfa
