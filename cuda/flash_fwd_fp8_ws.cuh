// zyfa attention forward for sm_90a, FP8 (e4m3 in, bf16 out): warp-specialised WGMMA body
// with Lean P.  The layouts and the P arithmetic are flash_fp8_lean.cuh's.
//
// Numerics (fp8_models.RECIPES["sm_90a"], bit for bit in P): 128-key blocks, each with its own
// exact fp32 max T; P is the centred Lean byte of every score (one FFMA a score, then F2FP and
// HFMA2 a pair: no MUFU), so the model predicts every P byte from the fp32 scores.  Each
// block's O_b and l_b (the sum of the rounded P that PV multiplies: a WGMMA against rows of
// ones) are accumulated from zero in the tensor core and merged in fp32 into the row state,
// which is relative to the frame F of the last contributing block:
//   O = O 2^(F - T) + O_b,   l = l 2^(F - T) + l_b,   F = T.
// No running O lives in the tensor core: Hopper's FP8 WGMMA accumulates with fewer bits than
// fp32 and would drop bits of every block of a long sequence.  A block whose max lies 64 below
// the row's running max adds under 2^-50 of l and is skipped (P = 0), which bounds the frame's
// drift (O, l < 2^98).  The model merges with alpha/beta instead; the two differ by the fp32
// rounding of the rescales only.  Output: O / l * dv, LSE = ln 2 (F + log2(l / 256)).
//
// One CTA = a producer and kConsumers consumer warpgroups = 64 kConsumers query rows of one
// (sequence, query head), 128-key blocks; two consumers, three at d64 and at d_v = 128
// non-causal (Tile.block_m).
//   pre-pass   transpose_v (flash_fp8_lean.cuh), a kernel of its own launched first with the
//              same arguments: V -> V^T in a workspace, keys in P's order, each block as a
//              V^T stage holds it.  FP8 WGMMA reads its B operand K-major only, and a
//              transpose on the SM would take issue slots from the consumers.
//   thread 0   as a segment starts, before the CTA's barrier: the mbarriers, Q by TMA (qfull;
//              tmap_q: boxes of 64 bytes x kBlockM rows in the 64B swizzle of the K-blocks) and
//              block 0, the consumers' first waits, issued before anything else.
//   producer   warpgroup 0, setmaxnreg kProducerRegs.  Thread 0 alone, per block n into stage
//              n % kStages: K by TMA (tmap_k: boxes of 64 bytes x 128 keys) and V^T (d_v
//              128B-swizzled rows of 128 key bytes) by one bulk copy, each completing its full
//              barrier with its bytes (one arrival that expects them).  It waits on kempty and
//              vempty before it overwrites a stage, so kStages blocks are in flight.  Warp 2
//              zeroes the rows of Q past a packed sequence's end (the next sequence's:
//              zero_tail_rows).
//   consumers  warpgroups 1 .. kConsumers, kConsumerRows = 64 rows each, setmaxnreg
//              kConsumerRegs; per block n:
//     softmax(n)       mask, block frame, Lean P of S(n) into 16 registers of A fragments
//     turn             issue PV(n) with the row sum (N = d_v + 8: V^T's stage ends in 8 rows
//                      of ones), then S(n + 1) = Q K(n + 1)^T; hand the turn over
//     merge(n)         wait for PV(n): O = O 2^(F - T) + O_b, l likewise; release V^T(n)
//     wait S(n + 1)    release K(n + 1)
//   so one consumer's softmax runs while the others' products do, and the tensor core's queue
//   holds the consumers' products in turn (FA3's ping-pong).  Two consumers alternate their
//   turns; three issue when ready (see Turns).  Where the registers do not hold that schedule:
//   * d_v = 256: one block accumulator is all the registers hold beside a 256-wide O, so PV(n)
//     goes in two passes of 128 columns (the second N = 136, with the row sum), and each pass,
//     then S(n + 1), is a turn of its own: a consumer waits for its pass and merges it while
//     the other's product runs (three turns a block).
//   * three consumers at d_v = 128 (kSerialS): S(n + 1) is issued after merge(n).
//   * causal at d_v <= 128: the blocks the diagonal of a consumer's 64 rows cuts (its last one
//     or two) go through a loop of their own: P in two e4m3 terms (hi_lo_p, the recipe's
//     "hi_lo" diagonal), both products in the block's turn, then S(n + 1) after their wait.
//
// Registers per consumer thread.  Two consumers (384 threads, launched with 168 a thread: 128 x
// 40 + 256 x 232 = 64,512): d_v = 128 acc_o 64, acc_b 68 (PV and the row sum of block n) and
// acc_s 64 (S of block n + 1) in flight together, P 16, acc_l 4, row state 8; d_v = 256 acc_o
// 128 and one of acc_b 68 (the second pass; the first is 64) or acc_s 64.  Three consumers (512
// threads, 128 a thread: 128 x 32 + 384 x 160 = 65,536): d64 acc_o 32, acc_b 36 and acc_s 64
// in flight together; d_v = 128 acc_o 64 with acc_b 68 or acc_s 64, and P 16.  Causal d_v = 128
// keeps two consumers: the diagonal's second P does not fit in 160 beside the rest.
//
// Shared memory (1024-byte aligned tiles): Q | K x kStages | (V^T, 8 rows of ones) x kStages |
// mbarriers (kStages = Tile.stages).  At d256 three stages take all 227 KiB a CTA may have: the
// mbarriers live in stage 0's ones (kBarsInOnes) and the layout starts where the dynamic shared
// memory does, without alignment slack.
// Named barriers: 1 a tail CTA's change of segment (the consumers and the producer's warp 0);
// 2 + g consumer g's turn; 5 + g its epilogue (store_o_rows: O through its Q rows).
// The balanced tail (kSplitTail, FP8 d256 non-causal): see "the balanced tail" below.
// KV caches (serving kernels: kv_cache, paged in flash_common.cuh): the CTA's keys are
// cache_seqlens[b] (clamped), K from the cache by TMA, V^T from the pre-pass, which reads each
// sequence's used rows (paged: from their pages, v_row) into the dense layout, zeros past the
// last key.  Paged, the pre-pass also gathers K's used rows into a contiguous copy (kg,
// catalogue.gathers_k), which the kernel reads as a contiguous cache's: K tiles of two TMA
// boxes, where from pages of 16 rows they were 16 (and FP8's short blocks felt it most).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace zyfa {

using namespace zyfa_cfg;

static_assert(kFp8 && kDqk % 64 == 0 && (kDv == 64 || kDv == 128 || kDv == 256),
              "the warp-specialised FP8 body: head dims in 64-byte K-blocks, d_v in PV passes of <= 128");
static_assert(kThreads == 128 * (1 + kConsumers) && kBlockM == 64 * kConsumers && kBlockN == 128,
              "a producer and consumer warpgroups x 64 rows, 128-key blocks (the sm_90a recipe's block)");

constexpr int kVtStages = kStages;         // V^T stages: one ring with K
constexpr int kTileQ = kBlockM * kDqk;      // bytes
constexpr int kQBuffers = kPersistent ? 2 : 1;   // persistent: the next tile's Q copied during this one
constexpr int kTileK = kBlockN * kDqk;
constexpr int kPvN = kDv < 128 ? kDv : 128;  // N of one PV pass
constexpr int kPasses = kDv / kPvN;
// Each V^T stage is followed by 8 rows of ones, and PV's last pass is one product of N = kPvN
// + 8 whose last 8 columns are the rounded row sum P 1 (wgmma_pv, into kAccB registers).  d256's
// first pass is N = 128 (wgmma_pv_bare) into an array of its own: with both passes in one array
// of 68 ptxas serialises the products.
constexpr int kTileVt = (kDv + 8) * kBlockN;   // V^T and its ones
constexpr int kAccB = kPvN / 2 + 4;            // the last PV pass's accumulators (l_b in the last 4)
// d256's three stages and their ones take all 227 KiB a CTA may have: the mbarriers live in
// rows 2..7 of stage 0's ones (the columns 2..7 of PV's sum, which no one reads: the rounded
// row sum is in column 0, the quad's first lane, from row 0 of the ones; row 1 is ones too, so
// that that lane's registers of both its columns hold it), and the layout starts where the
// dynamic shared memory does, 1024-aligned (checked: smem_base_exact) without the 1 KiB of slack.
constexpr bool kBarsInOnes = kPasses > 1;
constexpr int kOnesRows = kBarsInOnes ? 2 : 8;   // rows of stage 0's ones that are ones
constexpr int kBarBytes = kBarsInOnes ? 0 : (32 * kStages + 16 + 127) / 128 * 128;   // catalogue.tile_for's
constexpr int kSlack = kBarsInOnes ? 0 : 1024;
using Bars = KvBarriers<kStages, kVtStages>;   // kfull, vfull: one arrival, and the copies' bytes
static_assert(kStages >= 2 && Bars::kBytes + 16 <= (kBarsInOnes ? (8 - kOnesRows) * 128 : kBarBytes),
              "the mbarriers' bytes (and qfull, qlanded)");
// kTmaO (the short and serving variants at d_v = 128, where it fits): O staged for TMA in a tile
// of its own after the Q buffers, two K-blocks of 128-byte rows (stage_o_tma), reused by the next
// tile's epilogue once the last copy has read it (a CTA of one tile: read before the CTA ends).
constexpr int kTileO = kTmaO ? kBlockM * 2 * kDv : 0;
static_assert(!kTmaO || kDv == 128, "O by TMA: the d_v = 128 kernels");
static_assert(kQBuffers * kTileQ + kTileO + kStages * kTileK + kVtStages * kTileVt + kBarBytes + kSlack == kDynamicSmem,
              "smem layout must match the catalogue");
// Three consumers at d_v = 128: S(n + 1) is issued after PV(n)'s wait and merge, as their 160
// registers do not hold the block accumulator and S(n + 1) in flight together.
constexpr bool kSerialS = kConsumers > 2 && kDv > 64;
// Where V^T(n) and K(n + 1) are tested for as block n starts (mbar_test2) rather than waited for
// where the products need them: d256, whose turns wait for both, and d64 non-causal; elsewhere
// the plain waits run faster (docs/sm90a.md, what was tried).
constexpr bool kTestEarly = kPasses > 1 || (kConsumers > 2 && !kSerialS && !kCausal);
// Where the bytes' clamp is decided after the pairs are made (lean_p_late_clamp), rather than by
// a vote before them between two copies of the bytes: causal at d_v <= 128; elsewhere the vote
// first runs faster (docs/sm90a.md, what was tried).
constexpr bool kLateClamp = kCausal && kDv <= 128;
static_assert(kPasses <= 2, "d_v = 256: two passes of 128 columns");
static_assert(kPasses == 1 || kConsumers == 2, "PV in passes (d256) with two consumers, which take all of the CTA's blocks");

// The shared-memory map: every tile at a constant offset from q.
struct Smem {
  static constexpr uint32_t kO = kQBuffers * kTileQ, kK = kO + kTileO, kVt = kK + kStages * kTileK, kOnes = kDv * kBlockN,
                            kBars = kBarsInOnes ? kVt + kOnes + kOnesRows * 128 : kVt + kVtStages * kTileVt;
  uint32_t q;
  __device__ uint32_t q_at(int b) const { return q + b * kTileQ; }
  __device__ uint32_t o_rows(int cw) const { return q + kO + cw * kConsumerRows * 128; }   // kTmaO
  __device__ uint32_t k_at(int s) const { return q + kK + s * kTileK; }
  __device__ uint32_t vt_at(int s) const { return q + kVt + s * kTileVt; }
  // Word i of the ones in the V^T stages (kTileOnes / 4 words a stage), and whether it is one
  // (not where kBarsInOnes puts the mbarriers: stage 0's rows from kOnesRows on).
  __device__ uint32_t ones_at(int i) const {
    return vt_at(i / (kTileOnes / 4)) + kOnes + 4 * (i % (kTileOnes / 4));
  }
  static __device__ bool is_ones(int i) { return !kBarsInOnes || i >= kTileOnes / 4 || i < kOnesRows * 32; }
  static constexpr int kOnesWords = kVtStages * kTileOnes / 4;
  __device__ Bars bars() const { return {q + kBars}; }
  __device__ uint32_t qfull() const { return q + kBars + Bars::kBytes; }         // Q landed (its tail zeroed)
  __device__ uint32_t qlanded() const { return q + kBars + Bars::kBytes + 8; }   // a packed tail's Q copy
  // Serving: the softcap's factor a (ServingFp8Scores), a float after the mbarriers.
  __device__ uint32_t softcap_a() const { return q + kBars + Bars::kBytes + 16; }
};
static_assert(!kServing || Bars::kBytes + 20 <= (kBarsInOnes ? (8 - kOnesRows) * 128 : kBarBytes),
              "the softcap's factor after the mbarriers");

// ---- the producer --------------------------------------------------------------------------

// Block n's V^T into stage s by one bulk copy, completing vfull(s) with its bytes.
__device__ __forceinline__ void copy_vt(const Smem& sm, int s, const uint8_t* gvt, int n) {
  const Bars bars = sm.bars();
  mbar_arrive_expect_tx(bars.vfull(s), kDv * kBlockN);
  bulk_copy(sm.vt_at(s), gvt + static_cast<long long>(n * kBlockN) * kDv, kDv * kBlockN, bars.vfull(s));   // n0 columns on: vt_block
}

// Block n's K and V^T into stage s, by thread 0: K's kBlockN rows by TMA (kDqk / 64 boxes of
// 64 bytes x 128 rows in the 64B swizzle, zeros past the tensor's end; in a packed batch the
// rows past a sequence's end are the next one's, a KV cache's its unused rows (paged: whatever
// the gathered copy holds there), masked), V^T's kDv rows of the block's 128
// key bytes by one bulk copy; each completes its full barrier with its bytes.  first: the
// kernel's first V^T copy, made once the pre-pass has ended (wait_prior_launch), after which the
// tail kernel's CTAs may start; a paged cache's first K copy too (K from the pre-pass's copy).
template <class P>
__device__ __forceinline__ void copy_block(const P& p, const Smem& sm, int s, const uint8_t* gvt, int n,
                                           int h_kv, int krow0, int kbatch, bool first = false) {
  const Bars bars = sm.bars();
  const int n0 = n * kBlockN;
  const bool gathered = first && paged(p);
  if (gathered) wait_prior_launch();
  tma_tile<kBlockN, kDqk, 64>(sm.k_at(s), reinterpret_cast<uint64_t>(p.tmap_k), bars.kfull(s), h_kv, krow0 + n0, kbatch);
  if (first) {
    if (!gathered) wait_prior_launch();
    launch_dependents();
  }
  copy_vt(sm, s, gvt, n);
}

// Thread 0 copies block 0 (with Q, start of the kernel) and then block m into its stage once S
// and PV of block m - kStages have released it; warp 2 zeroes Q's rows past a packed
// sequence's end (rows_q < kBlockM).  krow0, kbatch: the key row and sequence of the tensor
// map where this sequence's keys start (packed: its first key and 0); nb0: the segment's first
// key block (a piece of a cut tile, kSplitTail; else 0).
template <class P>
__device__ __forceinline__ void produce(const P& p, const Smem& sm, const uint8_t* gvt, int rows_q, int h_kv,
                                        int krow0, int kbatch, int n_blocks, int nb0) {
  const Bars bars = sm.bars();
  if (threadIdx.x / 32 == 2 && rows_q < kBlockM)
    zero_tail_rows<kBlockM, 64, kTileQ>(sm.q, sm.qlanded(), sm.qfull(), rows_q);
  if (threadIdx.x != 0) return;
  for (int m = 1; m < n_blocks; ++m) {   // block 0: the segment's start
    const int s = m % kStages;
    if (m >= kStages) {
      mbar_wait(bars.kempty(s), Bars::kempty_parity(m));
      mbar_wait(bars.vempty(s), Bars::vempty_parity(m));
    }
    copy_block(p, sm, s, gvt, nb0 + m, h_kv, krow0, kbatch);
  }
}

// ---- the consumers ---------------------------------------------------------------------------

// S = Q K(stage s)^T for the warpgroup's 64 rows (sQg), issued and committed.
__device__ __forceinline__ void issue_qk(float (&acc_s)[kBlockN / 2], uint32_t sQg, uint32_t sK) {
  const uint64_t dq = desc_64b(sQg), dk = desc_64b(sK);
#pragma unroll
  for (int k = 0; k < kDqk / 32; ++k) {
    const uint32_t kb = k / 2, kk = k % 2;
    wgmma_qk(acc_s, desc_advance(dq, kb * kBlockM * 64 + kk * 32), desc_advance(dk, kb * kBlockN * 64 + kk * 32),
             k > 0);
  }
  wgmma_commit();
}

// The first block that the causal diagonal of the warpgroup's rows (first row wg_row0) cuts:
// the first n with n kBlockN + kBlockN - 1 > wg_row0 + diag (its first row does not see the
// block's last key), within [0, n_blocks].  Every block from it on is masked for these rows, and
// with the recipe's "hi_lo" diagonal its P goes in two terms.  Broadcast from lane 0, so that
// ptxas sees a warp-uniform loop bound around the WGMMAs.
__device__ __forceinline__ int first_diagonal_block(int wg_row0, int diag, int n_blocks) {
  const int x = wg_row0 + diag - (kBlockN - 1);              // n kBlockN > x
  const int n = x < 0 ? 0 : x / kBlockN + 1;
  return lane0(n < n_blocks ? n : n_blocks);
}

// Mask, frame and P of one block's S (acc_s) for the warpgroup whose first row is wg_row0: the
// Lean byte into pa, or with kTwo (a diagonal block) the two terms into pa and pl.
template <bool kTwo>
__device__ __forceinline__ void softmax(uint32_t (&pa)[kBlockN / 8], uint32_t (&pl)[kBlockN / 8],
                                        float (&factor)[2], float (&acc_s)[kBlockN / 2], float (&frame)[2],
                                        float (&m_run)[2], int n0, int sk, int wg_row0, int r_lo, int diag,
                                        int quad_col, float c) {
  const bool need_mask = (n0 + kBlockN > sk) || (kCausal && n0 + kBlockN - 1 > wg_row0 + diag);
  if (need_mask) mask_block(acc_s, n0, sk, r_lo, diag, quad_col);
  float bias[2];
  const bool big = block_frame<kTwo>(acc_s, c, frame, m_run, bias, factor);
  if constexpr (kTwo) {
    // The 16-key groups the warp's last row sees (the diagonal, the sequence's end): the rest
    // of a diagonal block is masked for all 16 of its rows.
    const int warp_last = r_lo - (threadIdx.x % 32) / 4 + 15;
    const int keys = min(sk, warp_last + diag + 1) - n0;
    const int seen = lane0(keys <= 0 ? 0 : (keys + 15) / 16);
    if (__any_sync(0xffffffffu, big)) hi_lo_p<true>(pa, pl, acc_s, c, bias, seen);
    else hi_lo_p<false>(pa, pl, acc_s, c, bias, seen);
  } else {
    if constexpr (kLateClamp) {
      lean_p_late_clamp(pa, acc_s, c, bias, big);
    } else {
      if (__any_sync(0xffffffffu, big)) lean_p<true>(pa, acc_s, c, bias);
      else lean_p<false>(pa, acc_s, c, bias);
    }
  }
}

// O_b = P V^T(stage) for dv columns kPvN pass .. + kPvN, from zero, issued and committed; the
// last pass also l_b = P 1 in acc_b's last 4 registers (its columns kPvN .. kPvN + 7: the rows
// of ones after the stage's V^T).  With `onto`, onto what the accumulators hold (a diagonal
// block's second term of P).
// The last pass's accumulators are kAccB (with l_b), d256's first pass's kPvN / 2.
template <int kN>
__device__ __forceinline__ void issue_pv(float (&acc_b)[kN], const uint32_t (&pa)[kBlockN / 8], uint32_t sVt,
                                         int pass, bool onto = false) {
  const uint64_t dv = desc_128b(sVt);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 32; ++kk) {
    const uint64_t d = desc_advance(dv, pass * kPvN * 128 + kk * 32);
    if constexpr (kN == kAccB) wgmma_pv(acc_b, pa + 4 * kk, d, onto || kk > 0);
    else wgmma_pv_bare(acc_b, pa + 4 * kk, d, onto || kk > 0);
  }
  wgmma_commit();
}

// O = O 2^(F - T) + O_b for the pass's columns, and with the last pass l likewise (factor =
// 2^(F - T) per row half).
template <int kN>
__device__ __forceinline__ void merge(float (&acc_o)[kDv / 2], float (&acc_l)[4], const float (&acc_b)[kN],
                                      const float (&factor)[2], int pass) {
#pragma unroll
  for (int i = 0; i < kPvN / 2; ++i) {
    float& o = acc_o[pass * kPvN / 2 + i];
    o = __fmaf_rn(o, factor[(i >> 1) & 1], acc_b[i]);
  }
  if constexpr (kN == kAccB) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc_l[i] = __fmaf_rn(acc_l[i], factor[i >> 1], acc_b[kAccB - 4 + i]);
  }
}

// One PV pass of d256 as a turn of its own: issued, the turn handed over (`last`: the
// warpgroup's last turn), waited for and merged.
template <int kN>
__device__ __forceinline__ void pv_pass_turn(float (&acc_o)[kDv / 2], float (&acc_l)[4], float (&acc)[kN],
                                             const uint32_t (&pa)[kBlockN / 8], const float (&factor)[2],
                                             uint32_t sVt, const Turns& turns, int pass, bool last) {
  turns.take();
  wgmma_fence();
  issue_pv(acc, pa, sVt, pass);
  if (last) turns.hand_over_last();
  else turns.hand_over();
  wgmma_wait<0>();
  merge(acc_o, acc_l, acc, factor, pass);
}

// PV(n) of a diagonal block (d_v <= 128: one pass), P in two terms: a turn holding the product
// of pa and that of pl onto it, their wait and the merge; V^T released.  `final`: the CTA's
// last turn.  Returns `last` (the warpgroup's last block).
__device__ __forceinline__ bool diagonal_pv(float (&acc_o)[kDv / 2], float (&acc_l)[4], float (&acc_b)[kAccB],
                                            const uint32_t (&pa)[kBlockN / 8],
                                            const uint32_t (&pl)[kBlockN / 8], const float (&factor)[2],
                                            const Smem& sm, const Bars& bars, const Turns& turns, int t, bool last,
                                            bool final) {
  static_assert(!kDiagHiLo || kPasses == 1, "two-term diagonals where PV is one pass (d_v <= 128)");
  turns.take();
  wgmma_fence();
  issue_pv(acc_b, pa, sm.vt_at(t), 0);
  issue_pv(acc_b, pl, sm.vt_at(t), 0, true);
  turns.hand_over(final);
  wgmma_wait<0>();
  merge(acc_o, acc_l, acc_b, factor, 0);
  if (threadIdx.x % 32 == 0) mbar_arrive(bars.vempty(t));
  return last;
}

// S(n + 1) into acc_s once K(n + 1) (stage k1) has landed (its full barrier's phase `parity`),
// waited for; K released.  After a diagonal block's PV, outside the turns (every block takes
// one, the PV's).
__device__ __forceinline__ void next_s(float (&acc_s)[kBlockN / 2], uint32_t sQg, const Smem& sm, const Bars& bars,
                                       uint32_t parity, int k1) {
  mbar_wait(bars.kfull(k1), parity);
  wgmma_fence();
  issue_qk(acc_s, sQg, sm.k_at(k1));
  wgmma_wait<0>();
  if (threadIdx.x % 32 == 0) mbar_arrive(bars.kempty(k1));
}

// ---- the balanced tail (kSplitTail) -----------------------------------------------------------
//
// The launch's tiles (numbered as tiles_rule's grid: query-row block, head, sequence) before
// tail_first are the kernel's, a CTA each (its grid: tail_first CTAs); those from tail_first on
// a second entry's, the tail kernel (flash_fwd_tail), launched after it with tail_ctas CTAs.
// These cut the tail by keys: its U tiles of nb blocks laid end to end, tail CTA j takes the
// blocks [start(j), start(j + 1)) (TailRun).  The host plans no more blocks a CTA than a tile
// has (plan.tail_plan), so a CTA has one or two segments: the end of one tile, the start of
// the next.  Each segment of a cut tile is a piece: its O, l and frame go to slot 2 j + s of
// `partials` (s: the CTA's segment), and the last piece of the tile to finish, counted in
// tail_counter, merges them all in their order (the same sums whichever finishes last) and
// writes O and the LSE.  Between its segments a CTA starts afresh: the consumers' last epilogue
// done, the producer's thread 0 makes new mbarriers and copies the next tile's Q and first block.
// A kernel of its own, so that the whole tiles' code is compiled as where there is no tail (with
// the tail's code beside it in one kernel, ptxas schedules the main loop slower).
//
// The CTAs' shares are equal in time, not in blocks (the plan's tail_gap and tail_ramp):
// * a CTA that goes on to a second tile pays its switch (the piece's store, new mbarriers, the
//   next Q and first block: about 4 block-times), so the tiles lie end to end in a line of
//   units, each tile's nb blocks followed by tail_gap units, and the CTAs share the units: a
//   CTA whose units hold a gap has that many blocks fewer;
// * launched as the kernel's dependent, tail CTA j starts as the j-th of the kernel's last CTAs
//   ends (their ends spread over some 10 block-times), so the CTAs' shares fall by tail_ramp
//   units from the first to the last.
//
// Where the last wave has R < SMs tiles of nb blocks, it takes nb block-times; cut, about R nb /
// SMs plus a second start, a store and a merge (at the bar's shape 33 + ~5 against 64 of the
// ~1,083 block-times a SM has).

static_assert(!kSplitTail || !kCausal, "the balanced tail cuts tiles of equal blocks: non-causal");

// A CTA's segment: tile, its key blocks [kb0, kb1), and the piece's slot (-1: the whole tile).
struct Segment {
  int tile, kb0, kb1, slot;
};

// The tail laid end to end in units: tile u's block k at u (nb + gap) + k, each tile followed by
// `gap` units where no block lies; `cost` = U (nb + gap) - gap units = q ctas + r.  CTA j takes
// the units from floor(j cost / ctas + ramp j (ctas - j) / (2 ctas)) on (equal shares but for a
// ramp: ramp / 2 units more for the first CTA, ramp / 2 fewer for the last) and the blocks that
// lie in them.  In 32 bits (plan.tail_plan keeps cost below 2^31 and ctas below 2^12, and
// ramp < 2^8): a 64-bit division is a subroutine.
struct TailRun {
  unsigned nb, first, ctas, gap, ramp, q, r;
  // CTA j's first unit (2 j r < 2 ctas^2, ramp j (ctas - j) <= ramp ctas^2 / 4).
  __device__ unsigned unit_start(unsigned j) const {
    return j * q + (2 * j * r + ramp * j * (ctas - j)) / (2 * ctas);
  }
  // Block x's unit.
  __device__ unsigned unit_of(unsigned x) const { return x + x / nb * gap; }
  // The run's first block of CTA j: the first block whose unit is at or past its first unit
  // (one in a gap: the next tile's first block).
  __device__ unsigned start(unsigned j) const {
    const unsigned s = unit_start(j), u = s / (nb + gap);
    return u * nb + min(s - u * (nb + gap), nb);
  }
  // The tail CTA whose blocks hold block x: the last j whose first unit is at or before x's
  // (a binary search: the ramp leaves no closed form).
  __device__ unsigned cta_of(unsigned x) const {
    const unsigned y = unit_of(x);
    unsigned lo = 0, hi = ctas - 1;
    while (lo < hi) {
      const unsigned mid = (lo + hi + 1) / 2;
      if (unit_start(mid) <= y) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }
};

template <class P>
__device__ __forceinline__ TailRun tail_run(const P& p) {
  const unsigned nb = (static_cast<unsigned>(p.seqlen_k) + kBlockN - 1) / kBlockN;
  const unsigned ctas = p.tail_ctas, gap = p.tail_gap;
  const unsigned cost = static_cast<unsigned>(p.tile_count - p.tail_first) * (nb + gap) - gap;
  return {nb, static_cast<unsigned>(p.tail_first), ctas, gap, static_cast<unsigned>(p.tail_ramp), cost / ctas,
          cost % ctas};
}

// Tile t of the launch as its CTA index in tiles_rule's grid (query-row block, head, sequence).
template <class P>
__device__ __forceinline__ uint3 tile_index(const P& p, int t) {
  const int xy = p.tiles_x * p.tiles_y;
  return make_uint3(t % p.tiles_x, t % xy / p.tiles_x, t / xy);
}

// Segment s of CTA `cta` and its work (cta_work's, n_blocks the segment's); false where the CTA
// has no such segment or its tile no rows.  The kernel's CTAs (kTail false) have one, the whole
// tile: with a tail (kSplitTail), tile cta.x of a grid of tail_first CTAs, so that no CTA of
// the kernel waits for an SM only to return (the tail kernel's CTAs start once every CTA of
// the kernel has); the tail kernel's one or two.
template <bool kTail, class P>
__device__ __forceinline__ bool segment_work(const P& p, uint3 cta, int s, Segment& g, CtaWork& w) {
  if constexpr (!kTail) {
    if (s > 0) return false;
    if constexpr (kSplitTail) {
      const uint3 tile = tile_index(p, static_cast<int>(cta.x));
      if (!cta_work(p, w, tile, tile)) return false;   // non-causal: the grid's shape is not read
    } else {
      if (!cta_work(p, w, cta)) return false;
    }
    g = {0, 0, w.n_blocks, -1};
    if constexpr (kServing) {
      // The window's blocks are the segment's [kb0, kb1) (the producer copies from kb0, the
      // consumers count keys from it), broadcast from lane 0 as the tail's (warp-uniform).
      const WindowBlocks b = window_blocks(p, w);
      g = {0, lane0(b.first), lane0(b.first + b.count), -1};
      w.n_blocks = lane0(b.count);
    }
    return true;
  } else {
    if (s > 1) return false;
    // The segment's tile u (segment 1: the next one), x0 its first block in the run, and its
    // blocks [kb0, kb1) (none where segment 1 lies past the CTA's).  Broadcast from lane 0, as
    // what ptxas cannot prove warp-uniform (here the 32-bit min) would leave the consumer's
    // whole loop in code it takes as divergent: its WGMMA descriptors in vector registers moved
    // by R2UR, the max's shuffles behind BRA.DIV, spills (tests/test_sass_convergence.py holds
    // the loop convergent).  32-bit arithmetic throughout: a 64-bit division is a subroutine
    // whose result ptxas does not take as warp-uniform.
    const TailRun t = tail_run(p);
    const unsigned j = cta.x, a = t.start(j), e = t.start(j + 1);
    const unsigned u = a / t.nb + s, x0 = u * t.nb;
    const int kb0 = lane0(max(a, x0) - x0), kb1 = lane0(min(max(e, x0), x0 + t.nb) - x0);
    if (kb1 <= kb0) return false;
    g = {lane0(t.first + u), kb0, kb1, kb0 == 0 && kb1 == static_cast<int>(t.nb) ? -1 : static_cast<int>(2 * j + s)};
    const uint3 tile = tile_index(p, g.tile);
    if (!cta_work(p, w, tile, tile)) return false;
    w.n_blocks = g.kb1 - g.kb0;
    return true;
  }
}

// A piece's slot, per consumer thread: its O normalised by the piece's l, O / l, as f16 (|O / l|
// <= 448, the largest e4m3 V, so f16's range holds it and its 2^-11 rounding stays 4x below the
// output's bf16), 8 of its accumulators a 16-byte group; then one group of its rows' l and frame,
// fp32.  The warpgroup's 128 threads side by side, so that the thread that merges reads the same
// places of each piece.  f16 halves the bytes that fp32 would take: the pieces' stores and loads
// are what a cut costs.
constexpr int kSlotVecs = kDv / 16 + 1;

// A thread's group 0 of slot k in `partials` (consumer cw).
template <class P>
__device__ __forceinline__ uint4* slot_of(const P& p, long long k, int cw) {
  return static_cast<uint4*>(const_cast<void*>(p.partials)) + (k * kConsumers + cw) * kSlotVecs * 128 +
         threadIdx.x % 128;
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ float2 unpack_f16(uint32_t u) {
  return __half22float2(*reinterpret_cast<const __half2*>(&u));
}

// A piece's O / l as stored, 8 accumulators a 16-byte group: pk[4 v .. 4 v + 3] the group of
// accumulators 8 v .. 8 v + 7 (column groups 2 v, 2 v + 1); and its rows' l and frame.
__device__ __forceinline__ void pack_piece(uint32_t (&pk)[kDv / 4], float4& lf, const float (&acc_o)[kDv / 2],
                                           const float (&acc_l)[4], const float (&frame)[2]) {
  const float inv0 = acc_l[0] > 0.f ? 1.f / acc_l[0] : 0.f, inv1 = acc_l[2] > 0.f ? 1.f / acc_l[2] : 0.f;
#pragma unroll
  for (int v = 0; v < kDv / 16; ++v) {
    const float* o = acc_o + 8 * v;
    pk[4 * v] = pack_f16(o[0] * inv0, o[1] * inv0);
    pk[4 * v + 1] = pack_f16(o[2] * inv1, o[3] * inv1);
    pk[4 * v + 2] = pack_f16(o[4] * inv0, o[5] * inv0);
    pk[4 * v + 3] = pack_f16(o[6] * inv1, o[7] * inv1);
  }
  lf = make_float4(acc_l[0], acc_l[2], frame[0], frame[1]);
}

// The tile's pieces j0 .. j1 merged, in their order, into the last one's registers (its own as
// it would have stored it, pk and lf: the same sums whichever piece ends last): with w_k = l_k
// 2^(F_k - F), F = max F_k, O = sum w_k (O / l)_k and l = sum w_k, in the frame F (acc_l's
// first column of each row, as the epilogue reads it).
template <class P>
__device__ __forceinline__ void merge_pieces(const P& p, const TailRun& t, unsigned x0, unsigned j0, unsigned j1,
                                             const uint32_t (&pk)[kDv / 4], float4 own, float (&acc_o)[kDv / 2],
                                             float (&acc_l)[4], float (&frame)[2], int cw) {
  const unsigned me = lane0(blockIdx.x);   // this tail CTA: piece j = the CTA that holds it
  const auto piece = [&](unsigned j) { return slot_of(p, 2LL * j + (t.start(j) < x0 ? 1 : 0), cw); };
  const auto lf_of = [&](unsigned j) {
    if (j == me) return own;
    const uint4 u = __ldcg(piece(j) + (kSlotVecs - 1) * 128);
    return *reinterpret_cast<const float4*>(&u);
  };
  float f[2] = {-INFINITY, -INFINITY};
  for (unsigned j = j0; j <= j1; ++j) {
    const float4 lf = lf_of(j);
    f[0] = fmaxf(f[0], lf.z);
    f[1] = fmaxf(f[1], lf.w);
  }
#pragma unroll
  for (int i = 0; i < kDv / 2; ++i) acc_o[i] = 0.f;
  acc_l[0] = acc_l[2] = 0.f;
  for (unsigned j = j0; j <= j1; ++j) {
    const uint4* src = piece(j);
    const bool mine = j == me;
    const float4 lf = lf_of(j);
    const float w0 = lf.z == -INFINITY ? 0.f : lf.x * exp2f(lf.z - f[0]);
    const float w1 = lf.w == -INFINITY ? 0.f : lf.y * exp2f(lf.w - f[1]);
#pragma unroll
    for (int v = 0; v < kDv / 16; ++v) {
      const uint4 h = mine ? make_uint4(pk[4 * v], pk[4 * v + 1], pk[4 * v + 2], pk[4 * v + 3]) : __ldcg(src + v * 128);
      const float2 a = unpack_f16(h.x), b = unpack_f16(h.y), c = unpack_f16(h.z), d = unpack_f16(h.w);
      float* o = acc_o + 8 * v;
      o[0] = __fmaf_rn(a.x, w0, o[0]);
      o[1] = __fmaf_rn(a.y, w0, o[1]);
      o[2] = __fmaf_rn(b.x, w1, o[2]);
      o[3] = __fmaf_rn(b.y, w1, o[3]);
      o[4] = __fmaf_rn(c.x, w0, o[4]);
      o[5] = __fmaf_rn(c.y, w0, o[5]);
      o[6] = __fmaf_rn(d.x, w1, o[6]);
      o[7] = __fmaf_rn(d.y, w1, o[7]);
    }
    acc_l[0] += w0;
    acc_l[2] += w1;
  }
  frame[0] = f[0];
  frame[1] = f[1];
}

// A piece of a cut tile (g.slot >= 0), at the consumer's end.  The warpgroup's thread 0 counts it
// in the tile's `arrived` (tail_counter: arrived, stored a consumer of a cut tile) before anything
// is stored: a piece that is not the tile's last to arrive stores its slot and then counts it in
// `stored`; the last keeps its own in registers, waits until every other is stored (each has
// arrived, so each is running or done), zeroes both counts for the next launch and merges them
// all (merge_pieces).  So the piece that ends last, most often the one that ends its CTA, neither
// stores nor reads itself back.  True where this piece merged: the tile's rows are its to write.
// sflag: a word of the warpgroup's Q rows (free: its last S is done) to broadcast the count.
template <class P>
__device__ __forceinline__ bool finish_piece(const P& p, const Segment& g, float (&acc_o)[kDv / 2],
                                             float (&acc_l)[4], float (&frame)[2], int cw, uint32_t sflag) {
  const TailRun t = tail_run(p);
  const unsigned u = g.tile - t.first, x0 = u * t.nb;
  const unsigned j0 = lane0(t.cta_of(x0)), j1 = lane0(t.cta_of(x0 + t.nb - 1));
  int* count = static_cast<int*>(const_cast<void*>(p.tail_counter)) + 2 * (u * kConsumers + cw);
  if (threadIdx.x % 128 == 0) sts32(sflag, atomicAdd(count, 1) == static_cast<int>(j1 - j0));
  uint32_t pk[kDv / 4];
  float4 lf;
  pack_piece(pk, lf, acc_o, acc_l, frame);
  bar_sync(kOutBar + cw, 128);
  uint32_t last;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(last) : "r"(sflag) : "memory");
  if (!last) {
    uint4* mine = slot_of(p, g.slot, cw);
#pragma unroll
    for (int v = 0; v < kDv / 16; ++v) mine[v * 128] = make_uint4(pk[4 * v], pk[4 * v + 1], pk[4 * v + 2], pk[4 * v + 3]);
    mine[(kSlotVecs - 1) * 128] = *reinterpret_cast<const uint4*>(&lf);
    __threadfence();                       // the slot before its count
    bar_sync(kOutBar + cw, 128);
    if (threadIdx.x % 128 == 0) atomicAdd(count + 1, 1);
    return false;
  }
  if (threadIdx.x % 128 == 0) {
    while (ld_acquire_gpu(count + 1) < static_cast<int>(j1 - j0)) {
    }
    count[0] = 0;                          // zero for the next launch
    count[1] = 0;
    __threadfence();                       // the other pieces' slots after their count
  }
  bar_sync(kOutBar + cw, 128);             // the other pieces stored; sflag read before the epilogue stages O over it
  merge_pieces(p, t, x0, j0, j1, pk, lf, acc_o, acc_l, frame, cw);
  return true;
}

// ---- the serving features (kServing: catalogue.Variant.serving) ------------------------------
//
// Compiled only into the serving kernels, the recipe's arithmetic kept (fp8_models: "Serving
// features"): the window's blocks are the CTA's segment (segment_work: blocks wholly outside are
// never loaded, the blocks stay aligned at key 0), a block crossing a window edge has those
// scores -inf before its softmax (the left edge's blocks take the plain bytes; the causal
// diagonal keeps its recipe); softcap hands the softmax tanh(S a), a = fp32(softmax_scale dq dk
// / softcap), with c = fp32(softcap log2(e)); a sink joins the row in the epilogue (with_sink).

// The softcap of a block's raw scores: t = tanh(x), x = fp32(S a) (the model's x exactly), by
// MUFU's tanh.approx.f32: two instructions a score.  Its error, measured over every fp32 x on an
// H200 (bench/results/2026-12-06_h200_softcap_tanh): at most 8.0e-6 (2^-16.9) absolute and
// 1.1e-5 relative for |x| <= 32, exactly +-1 from |x| = 16 on (+-1 at +-inf and NaN for NaN: the
// PTX ISA's special values, so no x gives a NaN that S had not); with the model's own rounding
// of tanh (2^-25) a capped logit is within softcap x 8.1e-6 of the model's (fp8_models: hardware
// tanh within its measured error, not byte for byte), 4.1e-4 at Gemma 2's softcap 50 against
// the Lean byte's 1/8 step of log2(P).  It replaced 1 - 2 / (1 + 2^(2 log2(e) x)) by ex2.approx
// and a reciprocal on the FMA pipe (eleven instructions a score, within 2.6e-6): the consumers
// are bound by their instruction issue, and the softcap's TFLOP/s rose 1.31-1.35x (same run).
__device__ __forceinline__ void cap_tanh(float (&s)[kBlockN / 2], float a) {
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {
    float x;
    asm("mul.rn.f32 %0, %1, %2;\n" : "=f"(x) : "f"(s[i]), "f"(a));   // not contracted: the model's x
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(s[i]) : "f"(x));
  }
}

// The consumer's pass over a block's raw scores before its softmax: the plain kernels' nothing.
struct PlainScores {
  template <class P>
  __device__ PlainScores(const P&, const Smem&, int, int, int) {}
  __device__ void apply(float (&)[kBlockN / 2], int, int, int, int) const {}
};
// A serving kernel's: the softcap (where softcap > 0), then the window's edges (window_edges).
// The softcap's factor a = fp32(softmax_scale dq dk / softcap) (the products in double, as the
// model's) is kept in shared memory (Smem::softcap_a: every consumer thread writes the same
// value, then reads it at each block), not in a register: held through the loop it spills the
// three-consumer kernels' O.
template <class P>
struct ServingFp8Scores {
  const P& p;
  const Smem& sm;
  int diag;   // counted from the segment's first key, as consume's
  __device__ ServingFp8Scores(const P& p_, const Smem& sm_, int diag_, int b, int h_kv) : p(p_), sm(sm_), diag(diag_) {
    if (softcap_of(p) > 0.f) {
      const float dq = descale_at(p.descale_q, p.descale_q_stride_b, p.descale_q_stride_h, b, h_kv);
      const float dk = descale_at(p.descale_k, p.descale_k_stride_b, p.descale_k_stride_h, b, h_kv);
      const float a = static_cast<float>(static_cast<double>(p.softmax_scale) * static_cast<double>(dq) *
                                         static_cast<double>(dk) / static_cast<double>(softcap_of(p)));
      asm volatile("st.shared.f32 [%0], %1;\n" :: "r"(sm.softcap_a()), "f"(a) : "memory");
    }
  }
  __device__ void apply(float (&s)[kBlockN / 2], int n0, int wg_row0, int r_lo, int quad_col) const {
    if (softcap_of(p) > 0.f) {
      float a;
      asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(a) : "r"(sm.softcap_a()) : "memory");
      cap_tanh(s, a);
    }
    window_edges(p, diag, s, n0, wg_row0, r_lo, quad_col);
  }
};
// The plain kernels' (PlainScores) or a serving kernel's pass.
template <class P>
using Scores = std::conditional_t<kServing, ServingFp8Scores<P>, PlainScores>;

// The factor c that takes a block's scores to log2 units: log2_scale, or for a serving kernel's
// capped scores (tanh, in units of softcap) fp32(softcap log2(e)) (fp8_models._capped_scores).
template <class P>
__device__ __forceinline__ float score_factor(const P& p, int b, int h_kv) {
  if constexpr (kServing) {
    if (softcap_of(p) > 0.f) return static_cast<float>(static_cast<double>(softcap_of(p)) * kLog2eD);
  }
  return log2_scale(p, b, h_kv);
}

// The consumer's blocks of one tile or segment into its O, l and frame: w, the tile's work
// (its n_blocks: the segment's, warp-uniform); nb0, the segment's first key block; sQg, the
// warpgroup's rows of its Q tile (in each 64-byte K-block), landed once qfull's phase qparity
// completes; ring, the K/V ring's phases as the tile starts (TileRing, OneTileRing).  kOwnTurns: the consumers' turns
// are the segment's own (a CTA a tile, a tail CTA's segment: begun here, consumer 1's last not
// handed over), else a persistent CTA's, which run on over its tiles (begun once by the caller,
// every turn handed over).
template <bool kOwnTurns, class Ring, class P>
__device__ __forceinline__ void attend(const P& p, const Smem& sm, const CtaWork& w, int n_blocks,
                                       const ConsumerLane& me, uint32_t sQg, uint32_t qfull, uint32_t qparity,
                                       int nb0, const Ring& ring, float (&acc_o)[kDv / 2],
                                       float (&acc_l)[4], float (&frame)[2]) {
  static_assert(kVtStages == kStages, "K and V^T: one ring (TileRing)");
  const Bars bars = sm.bars();
  // Keys counted from the segment's first (nb0 blocks in: a piece of a cut tile), so that nb0
  // is not held through the loop.
  const int sq = w.seq.sq, sk = w.seq.sk - nb0 * kBlockN, diag = w.diag - nb0 * kBlockN;
  const int cw = me.cw, wg_row0 = me.wg_row0, lane = me.lane, quad_col = me.quad_col, r_lo = me.r_lo;
  const float c = score_factor(p, w.b, w.h_kv);
  const Scores<P> scores(p, sm, diag, w.b, w.h_kv);
  const Turns turns{cw};

#pragma unroll
  for (int i = 0; i < kDv / 2; ++i) acc_o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) acc_l[i] = 0.f;
  frame[0] = frame[1] = -INFINITY;            // F: the exponent O and l are relative to
  float m_run[2] = {-INFINITY, -INFINITY};    // M: the running max of the block maxima

  if (n_blocks > 0) {
    float acc_s[kBlockN / 2];
    mbar_wait(qfull, qparity);   // also where S(0) is not issued: the epilogue stages O in Q's rows
    if constexpr (kOwnTurns) turns.begin();
    // Blocks n_mine .. n_blocks - 1 lie past the warpgroup's rows (the causal diagonal of its
    // last row, or the end of the sequence): idle turns after the loops below.  A consumer of
    // three with none of the blocks (its rows past a short sequence's end: at 128 rows, the
    // 192-row tile's third) issues no S(0) either in the persistent kernel, where short prompts
    // run: it releases K(0) and each block's stages (three consumers take no turns) and is done.
    // (A branch around S(0) alone leaves its accumulators undefined on one path, and ptxas
    // serialises the loop's WGMMAs; in the kernels of a CTA a tile this one spills 56-112 bytes.)
    const int n_mine = consumer_blocks(wg_row0, sq, sk, diag, n_blocks);
    static_assert(!kBarsInOnes || kConsumers == 2, "nothing after the blocks where a consumer may leave early");
    if (kPersistent && kConsumers > 2 && n_mine == 0) {
      mbar_wait(bars.kfull(0), ring.full_parity(0));
      if (lane == 0) mbar_arrive(bars.kempty(0));
      for (int m = 0; m < n_blocks; ++m) idle_turn(bars, turns, m, false, ring.full_parity(m), ring.full_parity(m));
      return;
    }
    turns.s0(bars, ring.full_parity(0), [&] { issue_qk(acc_s, sQg, sm.k_at(0)); });

    // The diagonal blocks (the "hi_lo" recipe at this d_v: P in two terms) are the warpgroup's
    // last, from n_two on, in a loop of their own after this one, so that the registers of
    // their second P never weigh on the other blocks'.  The last block leaves the loop from its
    // turn: the rest of the body is the same for every block, so that the compiler keeps
    // S(n + 1) in flight across the merge of block n.
    int n_two = n_mine;
    if constexpr (kCausal && kDiagHiLo) {
      n_two = first_diagonal_block(wg_row0, diag, n_blocks);   // <= n_blocks
      if constexpr (kConsumers > 2) n_two = min(n_two, n_mine);
    }
    int n = 0, k1 = 1 % kStages;              // k1: the K stage of block n + 1
    for (; n < n_two; ++n, k1 = next_stage<kStages>(k1)) {
      const int t = n % kVtStages;            // V^T stage of block n
      const bool last = n + 1 == n_mine;
      const bool landed =
          kTestEarly && mbar_test2(bars.vfull(t), ring.full_parity(n), bars.kfull(k1), ring.full_parity(n + 1));
      // ---- softmax(n): mask, frame, Lean P ------------------------------------------------
      uint32_t pa[kBlockN / 8];
      float factor[2];
      scores.apply(acc_s, n * kBlockN, wg_row0, r_lo, quad_col);
      softmax<false>(pa, pa, factor, acc_s, frame, m_run, n * kBlockN, sk, wg_row0, r_lo, diag, quad_col, c);

      // ---- turn: PV(n) and P 1, then S(n + 1) ----------------------------------------------
      // The block from zero in the tensor core (its FP8 accumulation is not fp32: it keeps
      // fewer bits and would bias a long running sum), merged into the fp32 state below.
      float acc_b[kAccB];
      mbar_wait_unless(landed, bars.vfull(t), ring.full_parity(n));
      if constexpr (kPasses > 1) {
        // d_v = 256: the registers hold one block accumulator and no S beside O, so each pass
        // of PV(n) and then S(n + 1) is a turn of its own: the other consumer's product runs
        // while this one waits for its pass and merges it.
        // (The first pass into an array of its own: see kAccB.)
        float acc_c[kPvN / 2];
        pv_pass_turn(acc_o, acc_l, acc_c, pa, factor, sm.vt_at(t), turns, 0, false);
        pv_pass_turn(acc_o, acc_l, acc_b, pa, factor, sm.vt_at(t), turns, 1, kOwnTurns && last);
        if (lane == 0) mbar_arrive(bars.vempty(t));
        if (last) {
          n = n_blocks;
          break;
        }
        mbar_wait_unless(landed, bars.kfull(k1), ring.full_parity(n + 1));
        turns.take();
        wgmma_fence();
        issue_qk(acc_s, sQg, sm.k_at(k1));
        turns.hand_over();
        wgmma_wait<0>();
        if (lane == 0) mbar_arrive(bars.kempty(k1));
        continue;
      }
      turns.take();
      wgmma_fence();
      issue_pv(acc_b, pa, sm.vt_at(t), 0);
      if (kSerialS || last) {
        // ---- merge(n); then (kSerialS) S(n + 1) outside the turns ----------------------------
        turns.hand_over(kOwnTurns && last && n_mine == n_blocks);
        wgmma_wait<0>();
        if (lane == 0) mbar_arrive(bars.vempty(t));
        merge(acc_o, acc_l, acc_b, factor, 0);
        if (last) {
          n = n_mine;
          break;
        }
        next_s(acc_s, sQg, sm, bars, ring.full_parity(n + 1), k1);
        continue;
      }
      mbar_wait_unless(landed, bars.kfull(k1), ring.full_parity(n + 1));
      issue_qk(acc_s, sQg, sm.k_at(k1));
      turns.hand_over();

      // ---- merge(n), then S(n + 1) ----------------------------------------------------------
      wgmma_wait<1>();
      if (lane == 0) mbar_arrive(bars.vempty(t));
      merge(acc_o, acc_l, acc_b, factor, 0);
      wgmma_wait<0>();
      if (lane == 0) mbar_arrive(bars.kempty(k1));
    }

    // The diagonal blocks: P in two terms.
    if constexpr (kCausal && kDiagHiLo) {
      for (; n < n_mine; ++n, k1 = next_stage<kStages>(k1)) {
        uint32_t pa[kBlockN / 8], pl[kBlockN / 8];
        float factor[2];
        scores.apply(acc_s, n * kBlockN, wg_row0, r_lo, quad_col);
        softmax<true>(pa, pl, factor, acc_s, frame, m_run, n * kBlockN, sk, wg_row0, r_lo, diag, quad_col, c);
        float acc_b[kAccB];
        const int t = n % kVtStages;
        mbar_wait(bars.vfull(t), ring.full_parity(n));
        if (diagonal_pv(acc_o, acc_l, acc_b, pa, pl, factor, sm, bars, turns, t, n + 1 == n_mine,
                        kOwnTurns && n + 1 == n_blocks)) break;
        // the registers do not hold pl beside S(n + 1) in flight
        next_s(acc_s, sQg, sm, bars, ring.full_parity(n + 1), k1);
      }
    }

    // The CTA's blocks past the warpgroup's rows: turns without products.
    for (int m = n_mine; m < n_blocks; ++m)
      idle_turn(bars, turns, m, kOwnTurns && m + 1 == n_blocks, ring.full_parity(m), ring.full_parity(m));
  }
  if constexpr (kBarsInOnes) {   // l: the quad's first lane's (column 0 of the sum; see kBarsInOnes)
#pragma unroll
    for (int i = 0; i < 4; i += 2) acc_l[i] = __shfl_sync(0xffffffffu, acc_l[i], lane & ~3);
  }
}

// The consumers' work on one segment (s) of the CTA: w, its tile's; nb0, its first key block.
// A warpgroup's O by TMA through its staging rows (kTmaO): finish_rows' 1 / l, the rows staged
// (stage_o_tma) and copied out by the warpgroup's first thread (copy_o_tma).  kOwnCta: the rows
// are this CTA's one tile's, and the copy's reads are waited for before the CTA ends; otherwise
// (a persistent CTA) the last tile's copy is waited for before the rows are staged again.
template <bool kOwnCta, class P>
__device__ __forceinline__ void o_by_staging(const P& p, const Smem& sm, const CtaWork& w, const float (&acc_o)[kDv / 2],
                                             const float (&acc_l)[4], const float (&frame)[2], int r_lo, int cw,
                                             int wg_row0) {
  float inv[2];
  finish_rows(p, w, acc_l, frame, r_lo, inv);
  const bool first = threadIdx.x % 128 == 0;
  if constexpr (!kOwnCta) {
    if (first) tma_store_read();
    bar_sync(kOutBar + cw, 128);
  }
  stage_o_tma(acc_o, inv, sm.o_rows(cw), cw);
  if (first) {
    copy_o_tma(p, sm.o_rows(cw), w, wg_row0);
    if constexpr (kOwnCta) tma_store_read();
  }
}

template <bool kTail, class P>
__device__ __forceinline__ void consume(const P& p, const Smem& sm, const CtaWork& w, int wg, int nb0, int s) {
  const ConsumerLane me(wg, w.row0);
  const int cw = me.cw, wg_row0 = me.wg_row0, r_lo = me.r_lo;
  const uint32_t sQg = sm.q + cw * kConsumerRows * 64;      // this warpgroup's rows (in each 64-byte K-block)
  float acc_o[kDv / 2], acc_l[4], frame[2];
  attend<true>(p, sm, w, w.n_blocks, me, sQg, sm.qfull(), 0, nb0, OneTileRing<Bars>{}, acc_o, acc_l, frame);
  // The work derived again (its registers free through the loop).
  Segment g;
  CtaWork wo;
  segment_work<kTail>(p, cta_index_again(), s, g, wo);
  if constexpr (kTail) {
    if (g.slot >= 0) {   // a piece of a cut tile: stored, or the tile's last, which merges them all
      if (!finish_piece(p, g, acc_o, acc_l, frame, cw, sQg)) return;
    }
  }
  if constexpr (kTmaO && !kTail) {
    if (o_by_tma(p, wo, wg_row0)) {
      o_by_staging<true>(p, sm, wo, acc_o, acc_l, frame, r_lo, cw, wg_row0);
      return;
    }
  }
  write_rows(p, wo, acc_o, acc_l, frame, r_lo, wg_row0, cw, sQg);
}

// Where a CTA's copies read: its head's V^T, Q's rows (dense: TMA zero-fills past the sequence's
// rows), and the key row and sequence of the tensor map where this sequence's keys start
// (packed: its first key and 0).
struct Copies {
  const uint8_t* gvt;
  int rows_q, krow0, kbatch;
};

template <class P>
__device__ __forceinline__ Copies copies(const P& p, const CtaWork& w) {
  const bool packed_k = p.cu_seqlens_k != nullptr;
  return {vt_block(p, w.h_kv, vt_column0(p, w.b, w.seq.k_start)), p.cu_seqlens_q != nullptr ? w.seq.sq - w.row0 : kBlockM,
          packed_k ? static_cast<int>(w.seq.k_start) : 0, packed_k ? 0 : w.b};
}

template <bool kTail, class P>
__device__ __forceinline__ void attention(const P& p) {
  const Smem sm{kSlack ? smem_base_1024() : smem_base_exact()};

  const int wg = warpgroup_index();
  Segment g;
  CtaWork w;
  if (!segment_work<kTail>(p, blockIdx, 0, g, w)) return;
  const Bars bars = sm.bars();
  const bool packed_q = p.cu_seqlens_q != nullptr;
  Copies c = copies(p, w);
  // The segment's start, by thread 0: Q (qfull) by TMA (the runtime's tensor map tmap_q: boxes
  // of 64 bytes x kBlockM rows in the 64B swizzle of the K-blocks) and its first block, the
  // consumers' first waits, issued before anything else (before the CTA's barrier: Q comes from
  // memory, no other CTA reads it, and its latency is the CTA's first wait).
  const auto start = [&](const CtaWork& w, const Copies& c, int nb0) {
    mbar_init(sm.qfull(), 1);
    mbar_init(sm.qlanded(), 1);
    bars.init();
    if (w.n_blocks > 0) {
      tma_tile<kBlockM, kDqk, 64>(sm.q, reinterpret_cast<uint64_t>(p.tmap_q),
                                  c.rows_q < kBlockM ? sm.qlanded() : sm.qfull(), w.h,
                                  packed_q ? static_cast<int>(w.seq.q_start) + w.row0 : w.row0, packed_q ? 0 : w.b);
      copy_block(p, sm, 0, c.gvt, nb0, w.h_kv, c.krow0, c.kbatch, !kTail);
    }
  };
  if (threadIdx.x == 0) start(w, c, g.kb0);
  for (int i = threadIdx.x; i < Smem::kOnesWords; i += kThreads)
    if (Smem::is_ones(i)) sts32(sm.ones_at(i), 0x38383838u);
  fence_async_smem();
  __syncthreads();

  // Between a tail CTA's two segments: the consumers and the producer's warp 0
  // meet once the consumers' epilogue is done (its stores through Q's rows), thread 0 makes new
  // mbarriers and starts the next segment, and they meet again.
  constexpr int kSegBar = 1, kSegThreads = 128 * kConsumers + 32;
  if (wg == 0) {
    producer_registers();
    for (int s = 0;;) {
      if (w.n_blocks > 0) produce(p, sm, c.gvt, c.rows_q, w.h_kv, c.krow0, c.kbatch, w.n_blocks, g.kb0);
      if (!kTail || threadIdx.x >= 32 || !segment_work<kTail>(p, blockIdx, ++s, g, w)) return;
      c = copies(p, w);
      bar_sync(kSegBar, kSegThreads);
      if (threadIdx.x == 0) {
        bars.inval();
        mbar_inval(sm.qfull());
        mbar_inval(sm.qlanded());
        start(w, c, g.kb0);
      }
      bar_sync(kSegBar, kSegThreads);
    }
  }
  consumer_registers();
  for (int s = 0;;) {
    consume<kTail>(p, sm, w, wg, g.kb0, s);
    if (!kTail || !segment_work<kTail>(p, cta_index_again(), ++s, g, w)) return;
    fence_async_smem();    // the epilogue's generic reads and writes of Q's rows before the TMA's
    bar_sync(kSegBar, kSegThreads);
    bar_sync(kSegBar, kSegThreads);
  }
}

// ---- persistent CTAs (kPersistent) -----------------------------------------------------------
//
// One CTA an SM (the grid: the SMs, or the tiles where there are fewer), taking tiles in turn as
// BF16 d128's do (flash_fwd_ws.cuh; the shared parts in flash_common.cuh): its first tile its
// blockIdx.x, the next ones from tile_counter in tiles_rule's order (heaviest first where
// causal).  At short prompts a tile is one to four key blocks, and a CTA a tile leaves the SM
// idle from its last product through its epilogue, the next CTA's start and its first copies
// (the tile's Q, K(0), V^T(0) from memory) to its S(0): about as long as the tile's blocks.
//   thread 0, the scheduler and the copies: per tile j its K and V^T blocks into the ring (each
//     tile from stage 0: TileRing), then the next tile, taken once tile j's last block is copied,
//     published in slot (j + 1) % 2 once tile j - 1 has released it (qempty: its epilogue done,
//     warp 2 past it), and its Q copied into buffer (j + 1) % 2: the next tile's copies run
//     while this one's blocks and epilogue do.  The first V^T copy waits for the pre-pass.
//   warp 2 (a packed Q): the rows past a sequence's end zeroed (zero_q_tails).
//   consumers: per tile, the blocks as a CTA a tile takes them (attend), every turn handed over
//     (consumer 1 arrives once before its first; at the end consumer 0 takes its last hand-over),
//     the epilogue through the tile's Q buffer, the slot released.  A tile without keys (an
//     empty key sequence) is written out (O = 0, LSE = -inf) without a turn.
static_assert(!kPersistent || (!kSplitTail && !kServing), "persistent: the plain kernels without a tail");

// Tile w's Q into the buffer at dst, onto full, or onto landed where a packed sequence ends
// inside it (warp 2 zeroes the rest, then completes full).
template <class P>
__device__ __forceinline__ void copy_tile_q(const P& p, uint32_t dst, uint32_t full, uint32_t landed,
                                            const CtaWork& w) {
  const bool packed = p.cu_seqlens_q != nullptr;
  tma_tile<kBlockM, kDqk, 64>(dst, reinterpret_cast<uint64_t>(p.tmap_q),
                              packed && w.seq.sq - w.row0 < kBlockM ? landed : full, w.h,
                              packed ? static_cast<int>(w.seq.q_start) + w.row0 : w.row0, packed ? 0 : w.b);
}

// Thread 0 after the CTA's barrier: w the tile in slot 0 (more: there is one); its block 0
// copied already where started (as the CTA started, after the pre-pass).
template <class P>
__device__ void schedule(const P& p, const Smem& sm, Sched& sh, CtaWork w, bool more, bool started) {
  static_assert(!HasPages<P>::value, "persistent: no KV cache");
  const TileQueue<P> queue(p);
  const Bars bars = sm.bars();
  TileRing<kStages> ring;
  bool waited = started;   // for the pre-pass, before the first V^T copy
  for (int j = 0; more; ++j) {
    const Copies c = copies(p, w);
    for (int m = j == 0 && started ? 1 : 0; m < w.n_blocks; ++m) {
      const int s = m % kStages;
      if (ring.refill(m)) {
        mbar_wait(bars.kempty(s), ring.empty_parity(m));
        mbar_wait(bars.vempty(s), ring.empty_parity(m));
      }
      copy_block(p, sm, s, c.gvt, m, w.h_kv, c.krow0, c.kbatch, !waited);
      waited = true;
    }
    ring.end_tile(w.n_blocks);
    // The next tile, taken once this one's last block is copied (kStages blocks before its end:
    // a tile taken earlier would wait in this CTA while another SM could run it).
    more = take_next_tile(queue, sm, sh, j, w, [&](uint32_t dst, uint32_t full, uint32_t landed) {
      copy_tile_q(p, dst, full, landed, w);
    });
  }
}

template <class P>
__device__ void consume_tiles(const P& p, const Smem& sm, Sched& sh) {
  consumer_registers();
  const int wg = warpgroup_index();
  const Turns turns{wg - 1};
  TileRing<kStages> ring;
  uint32_t qphase = 0;                        // bit b: the phase of qfull[b]
  bool turned = false;
  for (int j = 0;; ++j) {
    const int b = j & 1;
    mbar_wait(shared_addr(&sh.tfull[b]), (j >> 1) & 1);
    // The slot's block count, warp-uniform to the compiler (read from shared memory it is not,
    // and ptxas serialises WGMMAs whose issue depends on a value it takes to diverge).
    const int n_blocks = lane0(sh.work[b].n_blocks);
    if (n_blocks < 0) {
      if (turned && wg == 1) turns.take();    // consumer 1's last hand-over
      if (kTmaO && threadIdx.x % 128 == 0) tma_store_done();   // the last O written before the CTA ends
      return;
    }
    if (n_blocks > 0 && !turned) {
      turns.begin();
      turned = true;
    }
    const ConsumerLane me(wg, sh.work[b].row0);
    const uint32_t sQg = sm.q_at(b) + me.cw * kConsumerRows * 64;
    float acc_o[kDv / 2], acc_l[4], frame[2];
    attend<false>(p, sm, sh.work[b], n_blocks, me, sQg, shared_addr(&sh.qfull[b]), (qphase >> b) & 1, 0, ring,
                  acc_o, acc_l, frame);
    if (n_blocks > 0) qphase ^= 1u << b;
    bool by_tma = false;
    if constexpr (kTmaO) {
      by_tma = o_by_tma(p, sh.work[b], me.wg_row0);
      if (by_tma) o_by_staging<false>(p, sm, sh.work[b], acc_o, acc_l, frame, me.r_lo, me.cw, me.wg_row0);
    }
    if (!by_tma) {
      write_rows(p, sh.work[b], acc_o, acc_l, frame, me.r_lo, me.wg_row0, me.cw, sQg);
      fence_async_smem();   // the epilogue's writes to Q's buffer before the next tile's copy into it
    }
    __syncwarp();
    if (me.lane == 0) mbar_arrive(shared_addr(&sh.qempty[b]));
    ring.end_tile(n_blocks);
  }
}

template <class P>
__device__ void persistent(const P& p) {
  const Smem sm{smem_base_1024()};
  __shared__ Sched sh;
  CtaWork w;          // thread 0: the tile in slot 0
  bool more = false, started = false;
  if (threadIdx.x == 0) {
    init_sched(sh, 4 * kConsumers + (p.cu_seqlens_q != nullptr));
    sm.bars().init();
    more = take_first_tile(p, sh, w);
    if (more && w.n_blocks > 0) {
      copy_tile_q(p, sm.q_at(0), shared_addr(&sh.qfull[0]), shared_addr(&sh.qlanded[0]), w);
      const Copies c = copies(p, w);
      copy_block(p, sm, 0, c.gvt, 0, w.h_kv, c.krow0, c.kbatch, true);
      started = true;
    }
  }
  for (int i = threadIdx.x; i < Smem::kOnesWords; i += kThreads)
    if (Smem::is_ones(i)) sts32(sm.ones_at(i), 0x38383838u);
  fence_async_smem();
  __syncthreads();

  if (warpgroup_index() == 0) {
    producer_registers();
    if (threadIdx.x == 0) schedule(p, sm, sh, w, more, started);
    else if (threadIdx.x / 32 == 2 && p.cu_seqlens_q != nullptr) zero_q_tails<kBlockM, 64, kTileQ>(sm, sh);
    return;
  }
  consume_tiles(p, sm, sh);
}

// The kernel: the launch's whole tiles (those before tail_first, where the variant has a tail),
// a CTA each, or (kPersistent) one CTA an SM taking them in turn.
template <class P>
__device__ void flash_fwd(const P& p) {
  if constexpr (kPersistent) persistent(p);
  else attention<false>(p);
}

// The tail kernel (kSplitTail): the tiles from tail_first on, cut by keys (see above).
template <class P>
__device__ void flash_fwd_tail(const P& p) {
  attention<true>(p);
  if (threadIdx.x == 0) wait_prior_launch();   // ends after the kernel (the launches' order)
}

}  // namespace zyfa
