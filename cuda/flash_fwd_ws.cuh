// zyfa attention forward for sm_90a, BF16: warp-specialised WGMMA body (head dims multiples
// of 64, d_v <= 256), hardware exp2.
//
// One CTA = a producer and kConsumers consumer warpgroups = 64 kConsumers query rows of one
// (sequence, query head), kBlockN-key blocks (128, or 64 at d256 where a 128-key S does not
// fit beside O); three consumers at d64 (192 rows), else two.  At d128 the CTAs are persistent
// (kPersistent, `persistent` below): one an SM, taking such tiles in turn.  A CTA a tile
// (one_tile):
//   thread 0, as the CTA starts: Q (qfull) and K(0) by TMA (the runtime's tensor maps tmap_q,
//     tmap_k), the consumers' first waits, issued before anything else (before the CTA's
//     barrier: Q comes from memory, and its latency is the CTA's first wait)
//   producer (warpgroup 0, setmaxnreg kProducerRegs)
//     per block K and V into stage n % kStages by TMA (tmap_k, tmap_v), each completing its own
//     full barrier with its bytes, in two streams: lane 0 of warp 0 copies K(n + kStages) once
//     S(n) has released its stage, lane 0 of warp 1 V(n + kStages) once PV(n) has (PV(n - 1)
//     ends late in block n where the softmax overlaps it: one stream would hold K back behind
//     V's wait).  Both are K-major/MN-major tiles of 64-element K-blocks with the 128B
//     swizzle, as they lie in memory: the PV WGMMA transposes V (tnspB).
//   consumers (warpgroups 1 .. kConsumers, 64 rows each, setmaxnreg kConsumerRegs: 232, or 160
//   with three), per block n, kOverlap (two consumers, d_v <= 128):
//     softmax(n)       scale, mask, max, P(n) = exp2(S - m) as bf16 A fragments (the S
//                      accumulator layout is the A-register layout), l; PV(n - 1) in flight
//     wait PV(n - 1)   release V(n - 1); O *= 2^(m_old - m_new) if the reference moved
//     turn             issue S(n + 1) = Q K(n + 1)^T, then O += P(n) V(n); hand the turn over
//     wait S(n + 1)    release K(n + 1)
//   so a consumer's softmax runs while its own PV and the other's products do (FA3's
//   ping-pong and its overlap inside a warpgroup).  P(n) goes to one of two register arrays
//   alternately and is "read" after the wait that ends PV(n) (keep_operands), so that ptxas
//   keeps the registers the WGMMA reads.  At d256 (no room for the second P beside O and
//   S) and with three consumers at d64 (the second P does not fit in 160 registers) the turn
//   is PV(n), then S(n + 1), both waited for before softmax(n + 1), which rescales O itself:
//   only the consumers overlap, and at d64 the third one's softmax fills what that serialises
//   (causal, the blocks past a consumer's rows are idle turns, as in FP8 d64).
//
// Registers per consumer thread (d128): acc_o 64 (+ 4: l, kOnesSum) and acc_s 64 in flight
// together, P(n) 32 beside the P(n - 1) that PV(n - 1) still reads, 32, row state 4.
// 128 x 40 + 256 x 232 = 64,512 = 384 x 168, the registers the CTA is launched with (d64, three
// consumers: acc_o 32, acc_s 64 and P 32 in 160; 128 x 32 + 384 x 160 = 65,536 = 512 x 128).
//
// Shared memory (1024-byte aligned tiles): Q (x 2, persistent) | K x 2 | V x 2 (each followed by
// a block of ones, kOnesSum) | mbarriers (the K/V ring, qfull, vlanded).  A tile of R rows is
// split in K-blocks of 64 bf16 (128 bytes); block kb is R x 128 bytes, row r's 16-byte chunk c
// at chunk c ^ (r % 8) (TMA's 128B swizzle): the descriptor's stride between 8-row groups is
// 1024 bytes and a k16 step advances its start address by 32 bytes.
// KV caches (serving kernels: kv_cache, paged in flash_common.cuh): the CTA's keys are cache_seqlens[b]
// (clamped), K and V from the cache by TMA (paged: a box a page piece, the stream's lanes a box
// each), V's rows past the keys zeroed (copy_v's tail), as a packed batch's.
// Named barriers: 2 + g consumer g's turn; 5 + g its epilogue (store_o_rows: O through its Q rows,
// 16 bytes a thread in whole rows); 9 the converters' (kFp8In).
// FP8 inputs, PV in f16 (kFp8In, catalogue.Variant.f16; persistent d128 only): Q, K and V are
// e4m3, each tile copied by TMA as its bytes (rows of 128, one K-block of the 128B swizzle, in
// the first half of the buffer or stage).  S = Q K^T is an e4m3 WGMMA (k32, both K-major, as the
// FP8 body's); V, which FP8 WGMMA cannot read MN-major, lands where its f16 tile's second K-block
// lies, onto vland instead of vfull, and producer warps 2 and 3 convert it there into the two
// f16 K-blocks PV reads (convert_tiles: e4m3 is a subset of f16, so PV multiplies the e4m3
// values), then complete vfull.  P is f16; the scores' factor carries the call's dq dk and O's
// its dv, per tile (the descales of its sequence and key/value head).  No V^T pre-pass.

#include <cuda_bf16.h>
#include <stdint.h>

#include <type_traits>

namespace zyfa {

using namespace zyfa_cfg;

static_assert(!kFp8 && kDqk % 64 == 0 && kDv % 64 == 0 && kDv <= 256,
              "the warp-specialised BF16 body: head dims in 64-element K-blocks, d_v <= 256 (one WGMMA N)");
static_assert(kThreads == 128 * (1 + kConsumers) && kBlockM == kConsumerRows * kConsumers &&
                  (kBlockN == 64 || kBlockN == 128),
              "a producer and consumer warpgroups x 64 rows, 64 or 128 keys");

constexpr int kTileQ = kBlockM * 2 * kDqk;     // bytes
constexpr int kTileK = kBlockN * 2 * kDqk;
constexpr int kTileV = kBlockN * 2 * kDv;
// kOnesSum (catalogue: Tile.pv_row_sums, d64 and d128): each V stage is followed by a 64-column
// block of ones (bf16 1.0, MN-major as V: kBlockN keys x 128 bytes), so that PV, N = kDv + 8, gives the
// row sums of the rounded P it multiplies in its last 8 columns (as FP8's V^T does): the
// softmax adds none (70 FADDs a warp and block fewer), O and l are rescaled together, and O and
// LSE are normalised by the sum of what was multiplied.
static_assert(!kOnesSum || kDv + 8 <= 256, "PV's N");
constexpr int kTileOnes = kOnesSum ? kBlockN * 128 : 0;
constexpr int kAccO = kDv / 2 + (kOnesSum ? 4 : 0);   // O's accumulators (+ l's, in kDv / 2 .. + 3)
constexpr int kBarBytes = 128;
constexpr bool kOverlap = kDv <= 128 && kConsumers == 2;   // the softmax overlaps the warpgroup's own PV
constexpr bool kKWithV = kConsumers > 2;   // three consumers wait for K(n + 1) with V(n) (one_tile)
using Bars = KvBarriers<kStages>;   // kfull, vfull: one arrival, and the copies' bytes
static_assert(Bars::kBytes + 24 <= kBarBytes, "the mbarriers' bytes (and qfull, vlanded, qlanded)");
constexpr int kQBuffers = kPersistent ? 2 : 1;   // persistent: the next tile's Q copied during this one
static_assert(kTmaO == kPersistent, "the persistent kernels write O by TMA, through the tile's Q buffer");
static_assert(kQBuffers * kTileQ + kStages * (kTileK + kTileV + kTileOnes) + kBarBytes + 1024 == kDynamicSmem,
              "smem layout must match the catalogue");
static_assert(!kPersistent || kOverlap, "persistent CTAs: the schedule of d_v <= 128 with two consumers");
static_assert(!kFp8In || (kPersistent && kDqk == 128 && kDv == 128 && !kServing),
              "e4m3 inputs (kFp8In): the persistent d128 plain kernel, a row of e4m3 one 128-byte K-block");
// kFp8In: where a tile's e4m3 bytes land (its second f16 K-block), the converters' named barrier
// and threads (warps 2 and 3 of the producer).
constexpr int kConvertBar = 9, kConverters = 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The shared-memory map: every tile at a constant offset from q.
struct Smem {
  static constexpr uint32_t kK = kQBuffers * kTileQ, kV = kK + kStages * kTileK,
                            kBars = kV + kStages * (kTileV + kTileOnes);
  uint32_t q;
  __device__ uint32_t q_at(int b) const { return q + b * kTileQ; }
  __device__ uint32_t k_at(int s) const { return q + kK + s * kTileK; }
  __device__ uint32_t v_at(int s) const { return q + kV + s * (kTileV + kTileOnes); }   // ones after
  __device__ Bars bars() const { return {q + kBars}; }
  __device__ uint32_t qfull() const { return q + kBars + Bars::kBytes; }          // Q landed (and its tail zeroed)
  __device__ uint32_t vlanded() const { return q + kBars + Bars::kBytes + 8; }    // packed tails (zero_tail_rows):
  __device__ uint32_t qlanded() const { return q + kBars + Bars::kBytes + 16; }   //   V's and Q's copies
  // kFp8In: stage s's e4m3 V landed (its TMA copy completes this, the converters vfull)
  __device__ uint32_t vland(int s) const { return q + kBars + Bars::kBytes + 24 + 8 * s; }
};
static_assert(Bars::kBytes + 24 + 8 * kStages <= kBarBytes, "vland after the other mbarriers");

// K-major operand descriptor: 1024 bytes between 8-row groups, 128B swizzle (the leading byte
// offset is unused for swizzled K-major tiles).
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t smem_addr) { return gmma_desc(smem_addr, 16, 1024, 1); }
// MN-major (transposed) operand descriptor: 8-row groups along K 1024 bytes apart, 64-column
// blocks along MN `mn_stride` bytes apart (the leading byte offset), 128B swizzle.
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t smem_addr, uint32_t mn_stride) {
  return gmma_desc(smem_addr, mn_stride, 1024, 1);
}

ZYFA_WGMMA_WRAPPERS

// kOnesSum: the blocks of ones after each V stage, written once by every thread of the CTA
// before its first barrier (bf16 1.0 in every column; PV reads the first 8), and fenced for the
// WGMMAs (the async proxy).
__device__ __forceinline__ void write_ones(const Smem& sm) {
  if constexpr (kOnesSum) {
    constexpr int kChunks = kTileOnes / 16;
    for (int i = threadIdx.x; i < kStages * kChunks; i += kThreads)
      sts128_fill(sm.v_at(i / kChunks) + kTileV + 16 * (i % kChunks), kFp8In ? 0x3c003c00u : 0x3f803f80u);
    fence_async_smem();
  }
}

// ---- the producer --------------------------------------------------------------------------

// Q and K(0) by thread 0 as the CTA starts (start_copies); then K and V by two streams, lane 0
// of warp 0 issuing K's copies and lane 0 of warp 1 V's: the first kStages blocks at once, then
// block m's K once S(m - kStages) has released its stage, and its V once PV(m - kStages) has.
// Each stream waits only for its own stage (PV(n - 1) ends late in block n where the softmax
// overlaps it: one stream would hold K(n + 1) back behind V's wait).  Every tile is a TMA copy
// of the runtime's tensor maps (tmap_q, tmap_k, tmap_v: bytes of (head dim, heads, rows,
// sequences)), 64-element K-blocks with the 128B swizzle, as they lie in memory (the PV WGMMA
// transposes V: tnspB), completing its full barrier with its bytes.  In a packed batch the rows
// past a sequence's end are the next sequence's: for Q and V warp 2 and warp 1 zero them
// (zero_tail_rows; the copy lands on qlanded / vlanded instead), K's are masked in S (0 times
// the next sequence's values need not be 0: they need not be finite); so are a KV cache's rows
// past cache_seqlens[b] (v_tails: its unused rows, or a paged cache's other pages, which TMA does
// not zero).  kv: the key/value head and the tensor maps' key row and sequence where this
// sequence's keys start (packed: its first key and 0; paged: the sequence's key and the
// sequence, tma_tile_kv reading the pages from page_table); sk its keys.
struct KvAt {
  int h, row, seq;
};
template <class P>
__device__ __forceinline__ void copy_k(const P& p, const Smem& sm, const KvAt& kv, int m, int s) {
  if constexpr (kFp8In) {   // e4m3 rows, one K-block, for the e4m3 S
    tma_tile<kBlockN, kDqk, 128>(sm.k_at(s), reinterpret_cast<uint64_t>(p.tmap_k), sm.bars().kfull(s), kv.h,
                                 kv.row + m * kBlockN, kv.seq);
    return;
  }
  tma_tile_kv<kBlockN, 2 * kDqk, 128>(p, sm.k_at(s), reinterpret_cast<uint64_t>(p.tmap_k), sm.bars().kfull(s), kv.h,
                                      kv.row + m * kBlockN, kv.seq);
}

// A Q tile into the buffer at dst, completing bar: the tensor map's head h, row qrow, sequence qseq.
template <class P>
__device__ __forceinline__ void copy_q(const P& p, uint32_t dst, uint32_t bar, int h, int qrow, int qseq) {
  if constexpr (kFp8In) tma_tile<kBlockM, kDqk, 128>(dst, reinterpret_cast<uint64_t>(p.tmap_q), bar, h, qrow, qseq);
  else tma_tile<kBlockM, 2 * kDqk, 128>(dst, reinterpret_cast<uint64_t>(p.tmap_q), bar, h, qrow, qseq);
}

// Thread 0, once the barriers are initialised: Q (onto qlanded where a packed sequence ends
// inside the tile: rows_q < kBlockM) and K(0), the CTA's first wait.  qrow, qseq: the tensor
// map's row and sequence of the tile's first row.
template <class P>
__device__ __forceinline__ void start_copies(const P& p, const Smem& sm, const KvAt& kv, int h, int qrow, int qseq,
                                             bool q_tail) {
  copy_q(p, sm.q, q_tail ? sm.qlanded() : sm.qfull(), h, qrow, qseq);
  copy_k(p, sm, kv, 0, 0);
}

// V(m) into stage s by the V stream's warp: lane 0 issuing, or from a paged cache a lane a box
// (tma_tile_lanes; `page`: the lane's entry, tile_page's); where a packed sequence ends inside
// the block (tail) onto vlanded, whose phase `parity` the warp waits for, then zeroes the rows
// past the sequence's end and completes vfull.
template <class P>
__device__ __forceinline__ void copy_v(const P& p, const Smem& sm, const KvAt& kv, int m, int s, int sk, bool tail,
                                       uint32_t parity, int page = 0) {
  const int n0 = m * kBlockN;
  const Bars bars = sm.bars();
  if constexpr (kFp8In) {   // e4m3 bytes onto vland (convert_tiles zeroes the tail)
    if (threadIdx.x % 32 == 0)
      tma_tile<kBlockN, kDv, 128>(sm.v_at(s) + kBlockN * 128, reinterpret_cast<uint64_t>(p.tmap_v), sm.vland(s), kv.h,
                                  kv.row + n0, kv.seq);
    return;
  }
  const uint32_t bar = tail ? sm.vlanded() : bars.vfull(s);
  if constexpr (HasPages<P>::value) {
    if (paged(p))
      tma_tile_lanes<kBlockN, 2 * kDv, 128>(p, page, sm.v_at(s), reinterpret_cast<uint64_t>(p.tmap_v), bar, kv.h,
                                            kv.row + n0);
  }
  if (!paged(p) && threadIdx.x % 32 == 0)
    tma_tile<kBlockN, 2 * kDv, 128>(sm.v_at(s), reinterpret_cast<uint64_t>(p.tmap_v), bar, kv.h, kv.row + n0, kv.seq);
  if (tail) zero_tail_rows<kBlockN, 128, kTileV>(sm.v_at(s), sm.vlanded(), bars.vfull(s), sk - n0, parity);
}

// The persistent streams' (schedule_k, stream_v) page-table entry of the lane's box of block m of
// a tile at kv (tile_page, loaded a block ahead), where the cache is paged and the tile has block
// m (of n_blocks); 0 otherwise, unused.
template <class P>
__device__ __forceinline__ int lane_page(const P& p, const KvAt& kv, int m, int n_blocks) {
  if constexpr (HasPages<P>::value) {
    if (paged(p) && m < n_blocks) return tile_page<kBlockN>(p, kv.row + m * kBlockN, kv.seq);
  }
  return 0;
}

// The K and V streams of a paged cache (paged(p)), as produce's, each warp's lanes issuing a box
// each (tma_tile_lanes) from the entries of the tile that they loaded while its stage was in use
// (tile_page, a tile ahead); K(0): start_copies, thread 0 alone.
template <class P>
__device__ __forceinline__ void produce_paged(const P& p, const Smem& sm, const KvAt& kv, int sk, bool v_tails,
                                              int n_blocks) {
  const Bars bars = sm.bars();
  const int warp = threadIdx.x / 32;   // 0: K, 1: V
  const int m0 = warp == 0 ? 1 : 0;
  int page = m0 < n_blocks ? tile_page<kBlockN>(p, kv.row + m0 * kBlockN, kv.seq) : 0;
  for (int m = m0; m < n_blocks; ++m) {
    const int s = m % kStages, key0 = kv.row + m * kBlockN;
    if (warp == 0) {
      if (m >= kStages) mbar_wait(bars.kempty(s), Bars::kempty_parity(m));
      tma_tile_lanes<kBlockN, 2 * kDqk, 128>(p, page, sm.k_at(s), reinterpret_cast<uint64_t>(p.tmap_k), bars.kfull(s),
                                             kv.h, key0);
    } else {
      if (m >= kStages) mbar_wait(bars.vempty(s), Bars::vempty_parity(m));
      copy_v(p, sm, kv, m, s, sk, v_tails && (m + 1) * kBlockN > sk, 0, page);
    }
    if (m + 1 < n_blocks) page = tile_page<kBlockN>(p, key0 + kBlockN, kv.seq);
  }
}

template <class P>
__device__ __forceinline__ void produce(const P& p, const Smem& sm, const KvAt& kv, int rows_q, int sk, bool v_tails,
                                        int n_blocks) {
  const Bars bars = sm.bars();
  const int warp = threadIdx.x / 32;
  const bool issuer = threadIdx.x % 32 == 0;
  if (warp == 2) {
    if (rows_q < kBlockM) zero_tail_rows<kBlockM, 128, kTileQ>(sm.q, sm.qlanded(), sm.qfull(), rows_q);
    return;
  }
  if (warp > 2) return;
  if constexpr (HasPages<P>::value) {
    if (paged(p)) {
      produce_paged(p, sm, kv, sk, v_tails, n_blocks);
      return;
    }
  }
  for (int m = warp == 0 ? 1 : 0; m < n_blocks; ++m) {   // K(0): start_copies
    const int s = m % kStages;
    if (warp == 0) {
      if (m >= kStages) mbar_wait(bars.kempty(s), Bars::kempty_parity(m));
      if (issuer) copy_k(p, sm, kv, m, s);
    } else {
      if (m >= kStages) mbar_wait(bars.vempty(s), Bars::vempty_parity(m));
      copy_v(p, sm, kv, m, s, sk, v_tails && (m + 1) * kBlockN > sk, 0);
    }
  }
}

// ---- the consumers ---------------------------------------------------------------------------

// S = Q K(stage)^T for the warpgroup's 64 rows (sQg), issued and committed.
__device__ __forceinline__ void issue_qk(float (&acc_s)[kBlockN / 2], uint32_t sQg, uint32_t sK) {
  const uint64_t dq = desc_kmajor(sQg), dk = desc_kmajor(sK);
  if constexpr (kFp8In) {   // e4m3: kDqk bytes a row, one K-block; k32 steps of 32 bytes
#pragma unroll
    for (int k = 0; k < kDqk / 32; ++k) wgmma_qk(acc_s, desc_advance(dq, k * 32), desc_advance(dk, k * 32), k > 0);
    wgmma_commit();
    return;
  }
#pragma unroll
  for (int k = 0; k < kDqk / 16; ++k) {
    const uint32_t kb = k / 4, kk = k % 4;
    wgmma_qk(acc_s, desc_advance(dq, kb * kBlockM * 128 + kk * 32), desc_advance(dk, kb * kBlockN * 128 + kk * 32),
             k > 0);
  }
  wgmma_commit();
}

// O += P V(stage), P from registers, issued and committed; O = P V where not `accumulate`
// (a persistent CTA's first block of a tile: O zeroed in registers instead, the compiler moves
// the zeros next to the WGMMA and ptxas serialises the products).
__device__ __forceinline__ void issue_pv(float (&acc_o)[kAccO], const uint32_t (&pa)[kBlockN / 4], uint32_t sV,
                                         bool accumulate = true) {
  const uint64_t dv = desc_mnmajor(sV, kBlockN * 128);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk)
    wgmma_pv(acc_o, pa + 4 * kk, desc_advance(dv, kk * 16 * 128), kk > 0 || accumulate);
  wgmma_commit();
}

// kFp8In: two P as an f16 pair (lo in the low half), the A fragments of the f16 PV.
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Online softmax of one block for the two rows (r_lo, r_lo + 8) a thread holds: scores scaled
// to log2 units and masked, P = exp2(S c - m) packed as bf16 A fragments, l = l alpha + its row
// sums.  The reference m moves only when a row's max passes it by more than kRescaleSlack (or
// has no finite value yet): then, for the whole warp, m becomes the running max and the
// function returns true with alpha = 2^(m_old - m_new), by which O is to be scaled (rescale_o)
// once no PV into it is in flight.  Otherwise P stays below 2^kRescaleSlack and the 64 FMULs
// of the rescale are skipped, which after the first blocks of a row is the rule.
constexpr float kRescaleSlack = 8.f;
__device__ __forceinline__ bool softmax(uint32_t (&pa)[kBlockN / 4], float (&acc_s)[kBlockN / 2],
                                        float (&alpha)[2], float (&m_run)[2], float (&l_run)[2], int n0, int sk,
                                        int wg_row0, int r_lo, int diag, int quad_col, float scale_log2) {
  const bool need_mask = (n0 + kBlockN > sk) || (kCausal && n0 + kBlockN - 1 > wg_row0 + diag);
  if (need_mask) mask_block(acc_s, n0, sk, r_lo, diag, quad_col);
  float mx[2];
  quad_row_max(acc_s, mx);
  bool grow = false;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    mx[hr] = __fmul_rn(mx[hr], scale_log2);              // = max of the scaled scores
    grow |= mx[hr] > m_run[hr] + kRescaleSlack;          // -inf + slack = -inf: a first max grows
  }
  const bool moved = __any_sync(0xffffffffu, grow);
  if (moved) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float m_new = fmaxf(m_run[hr], mx[hr]);
      alpha[hr] = exp2_ftz(m_run[hr] - (m_new == -INFINITY ? 0.f : m_new));   // 0 from -inf
      m_run[hr] = m_new;
      if constexpr (!kOnesSum) l_run[hr] *= alpha[hr];
    }
  }
  const float m_use[2] = {m_run[0] == -INFINITY ? 0.f : m_run[0], m_run[1] == -INFINITY ? 0.f : m_run[1]};
  // P = 2^(S c - m) and its row sums: four partial sums per row, so that the adds are not
  // one chain of kBlockN / 4 dependent FADDs.
  float sum[2][4] = {};
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float& x = acc_s[4 * j + e];
      x = exp2_ftz(__fmaf_rn(x, scale_log2, -m_use[e >> 1]));
      if constexpr (!kOnesSum) sum[e >> 1][(j & 1) * 2 + (e & 1)] += x;
    }
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr)
    if constexpr (!kOnesSum) l_run[hr] += (sum[hr][0] + sum[hr][1]) + (sum[hr][2] + sum[hr][3]);
#pragma unroll
  for (int i = 0; i < kBlockN / 4; ++i)
    pa[i] = kFp8In ? pack_f16(acc_s[2 * i], acc_s[2 * i + 1]) : pack_bf16(acc_s[2 * i], acc_s[2 * i + 1]);
  return moved;
}

// O *= alpha, per row half.
__device__ __forceinline__ void rescale_o(float (&acc_o)[kAccO], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < kAccO / 4; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[4 * i + e] *= alpha[e >> 1];
  }
}

// ---- the serving features (kServing: catalogue.Variant.serving) ------------------------------
//
// Compiled only into the serving kernels; the plain ones are these functions' constant cases
// (PlainScores, o_factor 1).  Window bounds and sinks are runtime arguments, the softcap too:
//   the CTA's key blocks: narrow_to_window (flash_common.cuh), producer and consumers alike;
//   a block's raw scores: capped, then the window's edges masked (ServingScores), before the
//     softmax, whose own masks (the sequence's end, the causal diagonal) follow;
//   the epilogue: the softcap's constant and the sink (with_sink).

// A block's scores as the plain kernels take them: untouched.
struct PlainScores {
  template <class P>
  __device__ PlainScores(const P&, int) {}
  __device__ void apply(float (&)[kBlockN / 2], int, int, int, int) const {}
};
template <class P>
using Scores = std::conditional_t<kServing, ServingScores<P>, PlainScores>;

// The factor that takes a block's scores to log2 units: softmax_scale log2(e), or where a serving
// kernel caps them (cap_scores: u in [0, 1]) 2 softcap log2(e).
template <class P>
__device__ __forceinline__ float score_factor(const P& p) {
  if constexpr (kServing) {
    if (softcap_of(p) > 0.f) return 2.f * softcap_of(p) * kLog2e;
  }
  return p.softmax_scale * kLog2e;
}

// A serving kernel's row at the end (m: its reference in log2 units of the factor's scores, l: its
// sum of 2^(score - m)): the softcap's constant into m (cap_scores: every capped logit is
// 2 softcap u - softcap), then query head h's sink, a logit beside the row's: m and l become those
// of the row with it (m in log2 units of the logits: LSE = ln 2 (m + log2 l)).  Returns the factor
// on O's sum, 2^(m_old - m_new): 0 for a row that saw no key (its O stays zeros, its LSE becomes
// the sink's, as the reference's).
template <class P>
__device__ __forceinline__ float with_sink(const P& p, int h, float& m, float& l) {
  if (softcap_of(p) > 0.f) m -= softcap_of(p) * kLog2e;   // -inf stays -inf
  if (p.sinks == nullptr) return 1.f;
  const float sink = static_cast<const float*>(p.sinks)[h] * kLog2e;
  const float m_new = fmaxf(m, sink);
  const float alpha = m == -INFINITY ? 0.f : exp2_ftz(m - m_new);
  l = l * alpha + exp2_ftz(sink - m_new);
  m = m_new;
  return alpha;
}

// Epilogue: the factors O / l takes to bf16 for the warpgroup's 64 rows (inv, per row half), and
// LSE = ln 2 (m + log2 l) for the two rows r_lo, r_lo + 8 a thread holds (l: the quad's four
// partial sums, or with kOnesSum PV's column kDv + quad_col, every one of the quad's the row's
// sum).  w: the CTA's work as the kernel read it first (derived again here, as the FP8 body
// does, it has ptxas serialise the WGMMAs of d128 causal).
template <class P>
__device__ __forceinline__ void finish_rows(const P& p, const CtaWork& w, const float (&acc_o)[kAccO],
                                            const float (&l_run)[2], const float (&m_run)[2], int r_lo,
                                            float (&inv)[2]) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float l;
    if constexpr (kOnesSum) {
      l = acc_o[kDv / 2 + 2 * hr];
    } else {
      l = l_run[hr];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
    }
    const int row = r_lo + hr * 8;
    float m = m_run[hr], o_factor = 1.f;
    if constexpr (kServing) o_factor = with_sink(p, w.h, m, l);
    if constexpr (kFp8In) o_factor = descale_at(p.descale_v, p.descale_v_stride_b, p.descale_v_stride_h, w.b, w.h_kv);
    inv[hr] = l > 0.f ? o_factor / l : 0.f;
    if (p.lse != nullptr && (threadIdx.x % 4) == 0 && row < w.seq.sq) {
      float* glse = lse_rows(p, w.seq, w.b, w.h);
      glse[row] = l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

// The epilogue: finish_rows, then O from the warpgroup's first row wg_row0 by store_o_rows
// (through its Q rows at sQg).
template <class P>
__device__ __forceinline__ void write_rows(const P& p, const CtaWork& w, const float (&acc_o)[kAccO],
                                           const float (&l_run)[2], const float (&m_run)[2], int r_lo, int wg_row0,
                                           int cw, uint32_t sQg) {
  float inv[2];
  finish_rows(p, w, acc_o, l_run, m_run, r_lo, inv);
  store_o_rows<128>(reinterpret_cast<const float (&)[kDv / 2]>(acc_o), inv, sQg,
                    static_cast<__nv_bfloat16*>(const_cast<void*>(p.o)) + w.off.o +
                        static_cast<long long>(wg_row0) * p.o_stride_s,
                    p.o_stride_s, w.seq.sq - wg_row0, cw);
}

template <class P>
__device__ void one_tile(const P& p) {
  const Smem sm{smem_base_1024()};

  const int wg = threadIdx.x / 128;
  CtaWork w;
  if (!cta_work(p, w)) return;
  int shift = 0;   // serving: the first key of the CTA's first block, keys counted from it (narrow_to_window)
  if constexpr (kServing) shift = narrow_to_window(p, w);
  const int sq = w.seq.sq, sk = w.seq.sk, row0 = w.row0, diag = w.diag, n_blocks = w.n_blocks;

  const Bars bars = sm.bars();
  const bool packed = p.cu_seqlens_k != nullptr;
  const KvAt kv{w.h_kv, (packed ? static_cast<int>(w.seq.k_start) : 0) + shift, packed ? 0 : w.b};
  // V's rows past the sequence's keys zeroed (copy_v's tail) where they may hold anything: a packed
  // batch's next sequence, a KV cache's unused rows or other pages (kv_cache: TMA fills zeros only
  // past the tensor's end).
  const bool v_tails = packed || kv_cache(p);
  const bool packed_q = p.cu_seqlens_q != nullptr;
  const int rows_q = packed_q ? sq - row0 : kBlockM;   // dense: TMA zero-fills past the sequence's rows
  if (threadIdx.x == 0) {
    mbar_init(sm.qfull(), 1);
    mbar_init(sm.vlanded(), 1);
    mbar_init(sm.qlanded(), 1);
    bars.init();
    if (n_blocks > 0)
      start_copies(p, sm, kv, w.h, packed_q ? static_cast<int>(w.seq.q_start) + row0 : row0, packed_q ? 0 : w.b,
                   rows_q < kBlockM);
  }
  write_ones(sm);
  __syncthreads();

  if (wg == 0) {
    producer_registers();
    if (n_blocks > 0) produce(p, sm, kv, rows_q, sk, v_tails, n_blocks);
    return;
  }
  consumer_registers();

  // The consumer's index shuffled (warp-uniform) for its descriptors and barriers; the branch
  // above stays on the plain thread index (with the shuffled one ptxas serialises d64's WGMMAs).
  const ConsumerLane me(warpgroup_index(), row0);
  const int cw = me.cw, wg_row0 = me.wg_row0, lane = me.lane, quad_col = me.quad_col, r_lo = me.r_lo;
  const uint32_t sQg = sm.q + cw * kConsumerRows * 128;     // this warpgroup's rows (in each 128-byte K-block)
  const float scale_log2 = score_factor(p);
  const Scores<P> scores(p, diag);
  const Turns turns{cw};

  float acc_o[kAccO];
#pragma unroll
  for (int i = 0; i < kAccO; ++i) acc_o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};

  if (n_blocks > 0) {
    float acc_s[kBlockN / 2];
    mbar_wait(sm.qfull(), 0);
    turns.first(bars, [&] { issue_qk(acc_s, sQg, sm.k_at(0)); });

    if constexpr (kOverlap) {
      // Block n: P(n) goes to pa_a or pa_b alternately (two iterations of the loop per trip,
      // so that each array is fixed registers); its softmax runs while PV(n - 1) reads the
      // other array, which is "read" again after the wait that ends PV(n - 1).
      const auto block = [&](int n, uint32_t (&pa)[kBlockN / 4], uint32_t (&pa_prev)[kBlockN / 4]) -> bool {
        const int s = n % kStages, s1 = (n + 1) % kStages;
        const bool last = n + 1 == n_blocks;
        // V(n) and K(n + 1), asked for now and waited for below only where they had not
        // landed (as in the persistent kernel, consume_tiles).
        const bool landed = mbar_test2(bars.vfull(s), Bars::vfull_parity(n), bars.kfull(s1), Bars::kfull_parity(n + 1));
        float alpha[2];
        scores.apply(acc_s, n * kBlockN, wg_row0, r_lo, quad_col);
        const bool moved =
            softmax(pa, acc_s, alpha, m_run, l_run, n * kBlockN, sk, wg_row0, r_lo, diag, quad_col, scale_log2);
        wgmma_wait<0>();                                     // PV(n - 1)
        keep_operands(pa_prev);
        if (n > 0 && lane == 0) mbar_arrive(bars.vempty((n - 1) % kStages));
        if (moved) rescale_o(acc_o, alpha);
        mbar_wait_unless(landed, bars.vfull(s), Bars::vfull_parity(n));
        if (!last) mbar_wait_unless(landed, bars.kfull(s1), Bars::kfull_parity(n + 1));
        turns.take();
        wgmma_fence();
        if (!last) issue_qk(acc_s, sQg, sm.k_at(s1));
        issue_pv(acc_o, pa, sm.v_at(s));
        if (last) {
          turns.hand_over_last();
          wgmma_wait<0>();
          keep_operands(pa);
          if (lane == 0) mbar_arrive(bars.vempty(s));
          return false;
        }
        turns.hand_over();
        wgmma_wait<1>();                                     // S(n + 1); PV(n) in flight
        if (lane == 0) mbar_arrive(bars.kempty(s1));
        return true;
      };
      uint32_t pa_a[kBlockN / 4], pa_b[kBlockN / 4];
#pragma unroll
      for (int i = 0; i < kBlockN / 4; ++i) pa_b[i] = 0u;
      for (int n = 0; n < n_blocks; n += 2) {
        if (!block(n, pa_a, pa_b)) break;
        if (!block(n + 1, pa_b, pa_a)) break;
      }
      wgmma_wait<0>();   // a no-op (the last block waited in its turn), for ptxas's view of the exits
    } else {
      // The last block leaves the loop from its turn: the rest of the body is the same for
      // every block, so that the compiler keeps S(n + 1) in flight beside PV(n).  With three
      // consumers (d64) blocks n_mine .. n_blocks - 1 lie past the warpgroup's rows (the end
      // of the sequence's rows, or causal the diagonal of its last row): idle turns after it.
      const int n_mine = consumer_blocks(wg_row0, sq, sk, diag, n_blocks);
      for (int n = 0; n < n_mine; ++n) {
        const int s = n % kStages, s1 = (n + 1) % kStages;
        uint32_t pa[kBlockN / 4];
        float alpha[2];
        scores.apply(acc_s, n * kBlockN, wg_row0, r_lo, quad_col);
        if (softmax(pa, acc_s, alpha, m_run, l_run, n * kBlockN, sk, wg_row0, r_lo, diag, quad_col,
                    scale_log2))
          rescale_o(acc_o, alpha);

        // ---- turn: PV(n), then S(n + 1) --------------------------------------------------------
        // Three consumers (d64, no turns): K(n + 1) waited for with V(n), the two round trips
        // overlapping, rather than between the products (where turns are taken, d256, waiting
        // for both before the turn runs slower: docs/sm90a.md, what was tried).
        if (!kKWithV || n + 1 == n_mine) mbar_wait(bars.vfull(s), bars.vfull_parity(n));
        else mbar_wait2(bars.vfull(s), bars.vfull_parity(n), bars.kfull(s1), bars.kfull_parity(n + 1));
        turns.take();
        wgmma_fence();
        issue_pv(acc_o, pa, sm.v_at(s));
        if (n + 1 == n_mine) {
          turns.hand_over(n_mine == n_blocks);
          wgmma_wait<0>();
          if (lane == 0) mbar_arrive(bars.vempty(s));
          break;
        }
        if (!kKWithV) mbar_wait(bars.kfull(s1), bars.kfull_parity(n + 1));
        issue_qk(acc_s, sQg, sm.k_at(s1));
        turns.hand_over();
        wgmma_wait<1>();
        if (lane == 0) mbar_arrive(bars.vempty(s));
        wgmma_wait<0>();
        if (lane == 0) mbar_arrive(bars.kempty(s1));
      }
      for (int m = n_mine; m < n_blocks; ++m) idle_turn(bars, turns, m, m + 1 == n_blocks);
    }
  }

  // Serving: the epilogue's offsets derived again from the CTA's index (the same work: the
  // narrowing changes nothing write_rows reads); held across the loop beside the serving
  // features' registers, they spill.
  if constexpr (kServing) cta_work(p, w, cta_index_again());
  write_rows(p, w, acc_o, l_run, m_run, r_lo, wg_row0, cw, sQg);
}

// ---- persistent CTAs (kPersistent) -----------------------------------------------------------
//
// One CTA an SM (the grid: the SMs, or the tiles where there are fewer), each taking tiles in
// turn -- a tile is what one_tile's CTA does: 128 query rows of one sequence and head -- its
// first its blockIdx.x, the next ones from the counter at tile_counter (atomicAdd, past the
// grid's own), in the order of their linear index over the grid of tiles (tiles_x, tiles_y,
// tiles_z: catalogue.tiles_rule, heaviest first where causal), so that the SMs that finish
// early take more.  The next tile's Q and K(0) are copied during this tile (Q x 2 in shared
// memory), and one consumer's epilogue runs while the other's last products do, so that the
// SM's tensor core is not idle from one tile's last epilogue to the next tile's S(0).
//   thread 0, the scheduler and K's stream (warp 0 with it where a paged cache's tiles are
//     issued a lane a box, HasPages: the serving kernels): per tile j its K blocks, then the next tile, taken
//     from the counter once tile j's last K is copied (two blocks before its end: a tile taken
//     earlier waits in a CTA that is still busy while another SM could run it), published in
//     slot (j + 1) % 2 (its work, or the end) once tile j - 1 has released the slot (qempty:
//     its epilogue done, the other readers past it), and its Q copied into buffer (j + 1) % 2.
//     The last CTA to finish zeroes the counter.
//   warp 1, V's stream: per tile its V blocks.  Warp 2 (a packed Q): the rows past a
//     sequence's end zeroed.  The K/V ring runs on over the tiles, each tile from stage 0
//     (TileRing).
//   consumers: per tile, S(0) in a turn of its own, the blocks as one_tile's overlapped
//     schedule takes them, the epilogue (O through the tile's Q buffer).  Tiles without keys
//     (an empty key sequence) are written out (O = 0, LSE = -inf) without a turn.  Consumer 1
//     arrives once on consumer 0's barrier before its first turn and every turn is handed
//     over; at the end consumer 0 takes the last hand-over.  S(0) has a turn of its own: moved
//     into the tile's last turn it gains nothing, as both consumers' epilogues leave the tensor
//     core idle together whichever turn S(0) takes.
// The tensor maps' head, row and sequence of tile w's block 0 (serving: seq.k_start holds the
// window's shift, tile_work).
template <class P>
__device__ __forceinline__ KvAt kv_at(const P& p, const CtaWork& w) {
  const bool packed = p.cu_seqlens_k != nullptr;
  return {w.h_kv, packed || kServing ? static_cast<int>(w.seq.k_start) : 0, packed ? 0 : w.b};
}

// Tile w's Q into the buffer at dst, onto full, or onto landed where a packed sequence ends
// inside it (warp 2 zeroes the rest, then completes full).
template <class P>
__device__ __forceinline__ void copy_tile_q(const P& p, uint32_t dst, uint32_t full, uint32_t landed,
                                            const CtaWork& w) {
  const bool packed = p.cu_seqlens_q != nullptr;
  copy_q(p, dst, packed && w.seq.sq - w.row0 < kBlockM ? landed : full, w.h,
         packed ? static_cast<int>(w.seq.q_start) + w.row0 : w.row0, packed ? 0 : w.b);
}

// Thread 0 after the CTA's barrier, or warp 0 (kWarpK): w the tile in slot 0 (more: there is
// one); K(0) copied already where k0 (as the CTA started, by thread 0).  kWarpK: the kernels
// that may read a paged cache, whose K tiles the warp's lanes issue a box each (tma_tile_lanes,
// each lane's entry loaded a block ahead, as stream_v's), lane 0 taking and publishing the next
// tile, which the other lanes then read from its slot (after __syncwarp, which orders lane 0's
// writes before their reads; the slot is rewritten only by lane 0, two tiles later).
template <class P>
__device__ void schedule_k(const P& p, const Smem& sm, Sched& sh, CtaWork w, bool more, bool k0) {
  constexpr bool kWarpK = HasPages<P>::value;
  const TileQueue<P> queue(p);
  const Bars bars = sm.bars();
  TileRing<kStages> ring;
  for (int j = 0; more; ++j) {
    const KvAt kv = kv_at(p, w);
    const int m0 = j == 0 && k0 ? 1 : 0;
    int page = lane_page(p, kv, m0, w.n_blocks);
    for (int m = m0; m < w.n_blocks; ++m) {
      if (ring.refill(m)) mbar_wait(bars.kempty(m & 1), ring.empty_parity(m));
      if constexpr (kWarpK) {
        if (paged(p))
          tma_tile_lanes<kBlockN, 2 * kDqk, 128>(p, page, sm.k_at(m & 1), reinterpret_cast<uint64_t>(p.tmap_k),
                                                 bars.kfull(m & 1), kv.h, kv.row + m * kBlockN);
        else if (threadIdx.x == 0)
          copy_k(p, sm, kv, m, m & 1);
        page = lane_page(p, kv, m + 1, w.n_blocks);
      } else {
        copy_k(p, sm, kv, m, m & 1);
      }
    }
    ring.end_tile(w.n_blocks);
    // The next tile, taken once this one's last K is copied, two blocks before its end (a tile
    // taken earlier would wait in this CTA while another SM could run it).
    const auto take = [&] {
      return take_next_tile(queue, sm, sh, j, w, [&](uint32_t dst, uint32_t full, uint32_t landed) {
        copy_tile_q(p, dst, full, landed, w);
      });
    };
    if constexpr (kWarpK) {
      if (threadIdx.x == 0) more = take();
      __syncwarp();
      more = __shfl_sync(0xffffffffu, more, 0);
      if (more) w = sh.work[(j + 1) & 1];
    } else {
      more = take();
    }
  }
}

// Warp 1: every tile's V blocks (a paged cache's: a lane a box, each lane's entry loaded a block
// ahead, as produce_paged's).
template <class P>
__device__ void stream_v(const P& p, const Smem& sm, Sched& sh) {
  const Bars bars = sm.bars();
  const bool v_tails = p.cu_seqlens_k != nullptr || kv_cache(p);   // as one_tile's
  TileRing<kStages> ring;
  uint32_t tails = 0;   // tails zeroed (vlanded's phases)
  for (int j = 0;; ++j) {
    const int b = j & 1;
    mbar_wait(shared_addr(&sh.tfull[b]), (j >> 1) & 1);
    const CtaWork w = sh.work[b];
    if (w.n_blocks < 0) return;
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(shared_addr(&sh.qempty[b]));
    const KvAt kv = kv_at(p, w);
    int page = lane_page(p, kv, 0, w.n_blocks);
    for (int m = 0; m < w.n_blocks; ++m) {
      if (ring.refill(m)) mbar_wait(bars.vempty(m & 1), ring.empty_parity(m));
      const bool tail = v_tails && (m + 1) * kBlockN > w.seq.sk;
      copy_v(p, sm, kv, m, m & 1, w.seq.sk, tail, tails & 1, page);
      tails += tail;
      page = lane_page(p, kv, m + 1, w.n_blocks);
    }
    ring.end_tile(w.n_blocks);
  }
}

// ---- kFp8In: the converters (warps 2 and 3) ---------------------------------------------------
//
// Four e4m3 (a b32) -> four f16 (two b32, the first two in lo), exactly.
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t x, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 a, b;\nmov.b32 {a, b}, %2;\ncvt.rn.f16x2.e4m3x2 %0, a;\ncvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(lo), "=r"(hi) : "r"(x));
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void sts128(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" :: "r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// A tile of kRows rows whose e4m3 bytes TMA put where its second f16 K-block lies (kRows rows of
// 128 bytes, the 128B swizzle: row r's 16-byte chunk c at c ^ (r % 8)), converted into both f16
// K-blocks (the same swizzle): bytes 16c .. 16c + 15 of row r are f16 chunks 2c % 8 and 2c % 8 + 1
// of row r of K-block c / 4.  Converter t takes rows t, t + 64: K-block 0's half first (outside
// the bytes), then, with the rest of the row's bytes read, K-block 1's over them (row r of it is
// row r's bytes, and no other thread's).  Rows from `valid` on are zeroed (a packed sequence's
// next one, a tile past the sequence's end).  Conflict-free: a quarter warp's eight rows take
// eight different chunks of their banks.
template <int kRows>
__device__ __forceinline__ void convert_rows(uint32_t tile, int valid, int t) {
#pragma unroll 1
  for (int r = t; r < kRows; r += kConverters) {
    const uint32_t row0 = tile + r * 128, row1 = row0 + kRows * 128, x = r & 7;
    if (r >= valid) {
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        sts128_zero(row0 + 16 * c);
        sts128_zero(row1 + 16 * c);
      }
      continue;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint4 a[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = lds128(row1 + (((4 * half + i) ^ x) << 4));
      const uint32_t dst = half ? row1 : row0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint4 lo, hi;
        e4m3x4_to_f16(a[i].x, lo.x, lo.y);
        e4m3x4_to_f16(a[i].y, lo.z, lo.w);
        e4m3x4_to_f16(a[i].z, hi.x, hi.y);
        e4m3x4_to_f16(a[i].w, hi.z, hi.w);
        sts128(dst + (((2 * i) ^ x) << 4), lo);
        sts128(dst + (((2 * i + 1) ^ x) << 4), hi);
      }
    }
  }
}

// The converters' writes fenced for the async proxy, all of them done, then one arrival on full.
__device__ __forceinline__ void converted(uint32_t full) {
  fence_async_smem();
  bar_sync(kConvertBar, kConverters);
  if (threadIdx.x == 64) mbar_arrive(full);
}

// Warps 2 and 3 (kFp8In): every tile's blocks' V, each once it has landed (vland: the copies'
// own phases, TileRing's over the ring), then vfull completed; before them, where a packed
// sequence ends inside the tile, Q's rows past its end zeroed (zero_q_tails' work, Q's e4m3 rows
// one K-block); a reader of each slot (qempty), as the V stream is.
template <class P>
__device__ void convert_tiles(const P& p, const Smem& sm, Sched& sh) {
  const int t = threadIdx.x - 64;
  const Bars bars = sm.bars();
  TileRing<kStages> ring;
  uint32_t qland = 0;   // bit b: the phase of qlanded[b]
  for (int j = 0;; ++j) {
    const int b = j & 1;
    mbar_wait(shared_addr(&sh.tfull[b]), (j >> 1) & 1);
    const CtaWork w = sh.work[b];
    if (w.n_blocks < 0) return;
    const int rows_q = w.seq.sq - w.row0;
    if (w.n_blocks > 0 && p.cu_seqlens_q != nullptr && rows_q < kBlockM) {
      if (threadIdx.x / 32 == 2)
        zero_tail_rows<kBlockM, 128, kBlockM * 128>(sm.q_at(b), shared_addr(&sh.qlanded[b]),
                                                    shared_addr(&sh.qfull[b]), rows_q, (qland >> b) & 1);
      qland ^= 1u << b;
    }
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(shared_addr(&sh.qempty[b]));
    for (int m = 0; m < w.n_blocks; ++m) {
      const int s = m & 1, keys = w.seq.sk - m * kBlockN;
      mbar_wait(sm.vland(s), ring.full_parity(m));
      convert_rows<kBlockN>(sm.v_at(s), keys, t);
      converted(bars.vfull(s));
    }
    ring.end_tile(w.n_blocks);
  }
}

template <class P>
__device__ void consume_tiles(const P& p, const Smem& sm, Sched& sh) {
  consumer_registers();
  const ConsumerLane me(warpgroup_index(), 0);   // rows from the tile's first
  const int cw = me.cw, lane = me.lane, quad_col = me.quad_col, r_off = me.r_lo;
  float scale_log2 = score_factor(p);   // kFp8In: the tile's (load_tile)
  const Turns turns{cw};
  const Bars bars = sm.bars();

  float acc_o[kAccO], acc_s[kBlockN / 2], m_run[2], l_run[2];
  uint32_t pa_a[kBlockN / 4], pa_b[kBlockN / 4];
#pragma unroll
  for (int i = 0; i < kBlockN / 4; ++i) pa_b[i] = 0u;
  int j = 0;                                  // the CTA's tile
  TileRing<kStages> ring;
  int n_blocks = 0, sk = 0, diag = 0, row0 = 0;
  uint32_t qphase = 0;                        // bit b: the phase of qfull[b]
  bool turned = false;

  const auto reset = [&] {   // the row state; O by the tile's first PV, which does not accumulate
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.f;
  };
  const auto q_rows = [&](int b) { return sm.q_at(b) + cw * kConsumerRows * 128; };
  const auto wait_q = [&](int b) {
    mbar_wait(shared_addr(&sh.qfull[b]), (qphase >> b) & 1);
    qphase ^= 1u << b;
  };
  // A slot's block count, warp-uniform to the compiler (read from shared memory it is not, and
  // ptxas serialises WGMMAs whose issue depends on a value it takes to diverge).
  const auto blocks_at = [&](int b) { return lane0(sh.work[b].n_blocks); };
  const auto load_tile = [&](int b) {
    n_blocks = blocks_at(b);
    sk = sh.work[b].seq.sk;
    diag = sh.work[b].diag;
    row0 = sh.work[b].row0;
    if constexpr (kFp8In) scale_log2 = log2_scale(p, sh.work[b].b, sh.work[b].h_kv);
  };
  // The epilogue of the tile in slot b (O from acc_o, l_run, m_run; zeros for a tile without
  // keys: acc_o is not zeroed, where the compiler moved the zeros into the products' registers
  // and ptxas serialised them), then slot and Q buffer b released.  O by TMA through the
  // buffer (stage_o_tma, copy_o_tma) where o_by_tma, else store_o_rows.  The copy's issuer (the
  // warpgroup's thread 0) releases the buffer once the copy has read it: `held`, and release().
  bool held = false;   // thread 0 of the warpgroup: buffer held_b still read by its O's copy
  int held_b = 0;
  const auto release = [&] {
    if (held) {
      tma_store_read();
      mbar_arrive(shared_addr(&sh.qempty[held_b]));
      held = false;
    }
  };
  const auto write_out = [&](int b, bool no_keys = false) {
    release();   // (a tile without keys after the last: its buffer before this one's)
    const CtaWork w = sh.work[b];
    const int r_lo = w.row0 + r_off, wg_row0 = w.row0 + cw * kConsumerRows;
    const bool tma = o_by_tma(p, w, wg_row0);
    const auto out = [&](const float (&o)[kAccO]) {
      float inv[2];
      finish_rows(p, w, o, l_run, m_run, r_lo, inv);
      const auto& o_dv = reinterpret_cast<const float (&)[kDv / 2]>(o);
      if (tma) {
        stage_o_tma(o_dv, inv, q_rows(b), cw);
      } else {
        store_o_rows<128>(o_dv, inv, q_rows(b),
                          static_cast<__nv_bfloat16*>(const_cast<void*>(p.o)) + w.off.o +
                              static_cast<long long>(wg_row0) * p.o_stride_s,
                          p.o_stride_s, w.seq.sq - wg_row0, cw);
        fence_async_smem();   // the epilogue's reads of Q's buffer before the next tile's copy into it
      }
    };
    if (no_keys) {
      float zeros[kAccO];
#pragma unroll
      for (int i = 0; i < kAccO; ++i) zeros[i] = 0.f;
      out(zeros);
    } else {
      out(acc_o);
    }
    held = tma && threadIdx.x % 128 == 0;
    held_b = b;
    if (held) copy_o_tma(p, q_rows(b), w, wg_row0);
    __syncwarp();
    if (lane == 0 && !held) mbar_arrive(shared_addr(&sh.qempty[b]));
  };
  // From tile j on: the tiles without keys written out; false at the end.  Else the tile's
  // state, its Q landed, and its S(0) issued in a turn of its own and waited for.
  const auto enter = [&]() -> bool {
    for (;; ++j) {
      const int b = j & 1;
      mbar_wait(shared_addr(&sh.tfull[b]), (j >> 1) & 1);
      const int blocks = blocks_at(b);
      if (blocks > 0) break;
      if (blocks < 0) {
        if (turned && cw == 0) turns.take();   // consumer 1's last hand-over
        release();
        tma_store_done();   // the last O written before the CTA ends
        return false;
      }
      reset();
      write_out(b, true);
    }
    const int b = j & 1;
    load_tile(b);
    reset();
    wait_q(b);
    if (!turned && cw == 1) bar_arrive(Turns::kBar, 256);
    turned = true;
    mbar_wait(bars.kfull(0), ring.full_parity(0));
    turns.take();
    wgmma_fence();
    issue_qk(acc_s, q_rows(b), sm.k_at(0));
    turns.hand_over();
    release();   // the last tile's buffer, its O's copy long past its reads by now
    wgmma_wait<0>();
    if (lane == 0) mbar_arrive(bars.kempty(0));
    return true;
  };
  // Block n of tile j (its K and V in stage n % 2): P(n) into pa while PV(n - 1) reads
  // pa_prev; the turn issues S(n + 1), then PV(n).  False after the tile's last block, its PV waited for.
  // (n an argument and the loop bounded by n_blocks, as one_tile's: with n counted in the
  // lambda and the loop left only by its `false`, ptxas serialises the products.)
  const auto block = [&](const int n, uint32_t (&pa)[kBlockN / 4], uint32_t (&pa_prev)[kBlockN / 4]) -> bool {
    const int b = j & 1, s = n & 1, s1 = s ^ 1;
    const bool last = n + 1 == n_blocks;
    // V(n) and K(n + 1) tested for as the block starts: the two waits before the turn, each a
    // round trip through its barrier after the softmax, are then only where a copy is late.
    const bool landed = mbar_test2(bars.vfull(s), ring.full_parity(n), bars.kfull(s1), ring.full_parity(n + 1));
    float alpha[2];
    Scores<P>(p, diag).apply(acc_s, n * kBlockN, row0 + cw * kConsumerRows, row0 + r_off, quad_col);
    const bool moved = softmax(pa, acc_s, alpha, m_run, l_run, n * kBlockN, sk, row0 + cw * kConsumerRows,
                               row0 + r_off, diag, quad_col, scale_log2);
    wgmma_wait<0>();                                       // PV(n - 1) (none at n = 0)
    keep_operands(pa_prev);
    if (n > 0 && lane == 0) mbar_arrive(bars.vempty(s1));   // PV(n - 1)'s stage
    if (moved && n > 0) rescale_o(acc_o, alpha);
    mbar_wait_unless(landed, bars.vfull(s), ring.full_parity(n));
    if (!last) mbar_wait_unless(landed, bars.kfull(s1), ring.full_parity(n + 1));
    turns.take();
    wgmma_fence();
    if (!last) issue_qk(acc_s, q_rows(b), sm.k_at(s1));
    issue_pv(acc_o, pa, sm.v_at(s), n > 0);
    turns.hand_over();
    if (last) {
      wgmma_wait<0>();
      keep_operands(pa);
      if (lane == 0) mbar_arrive(bars.vempty(s));
      return false;
    }
    wgmma_wait<1>();                                       // S(n + 1); PV(n) in flight
    if (lane == 0) mbar_arrive(bars.kempty(s1));
    return true;
  };

  while (enter()) {
    for (int n = 0; n < n_blocks; n += 2) {
      if (!block(n, pa_a, pa_b)) break;
      if (!block(n + 1, pa_b, pa_a)) break;
    }
    wgmma_wait<0>();   // a no-op (the last block waited), for ptxas's view of the loop's exits
    write_out(j & 1);
    ring.end_tile(n_blocks);
    ++j;
  }
}

template <class P>
__device__ void persistent(const P& p) {
  const Smem sm{smem_base_1024()};
  __shared__ Sched sh;
  CtaWork w;          // thread 0: the tile in slot 0
  bool more = false, k0 = false;
  if (threadIdx.x == 0) {
    // a slot's readers: the consumer warps, the V stream, and warp 2 where Q is packed (zero_q_tails)
    // or the converters' two warps (kFp8In)
    init_sched(sh, 4 * kConsumers + 1 + (kFp8In ? 2 : p.cu_seqlens_q != nullptr));
    mbar_init(sm.vlanded(), 1);
    if constexpr (kFp8In) {
      for (int s = 0; s < kStages; ++s) mbar_init(sm.vland(s), 1);
    }
    sm.bars().init();
    more = take_first_tile(p, sh, w);
    if (more && w.n_blocks > 0) {
      copy_tile_q(p, sm.q_at(0), shared_addr(&sh.qfull[0]), shared_addr(&sh.qlanded[0]), w);
      copy_k(p, sm, kv_at(p, w), 0, 0);
      k0 = true;
    }
  }
  write_ones(sm);
  __syncthreads();

  if (threadIdx.x / 128 == 0) {
    producer_registers();
    const int warp = threadIdx.x / 32;
    if (threadIdx.x == 0 || (HasPages<P>::value && warp == 0)) {   // schedule_k's kWarpK: the warp
      if (threadIdx.x != 0) {   // thread 0's first tile, from slot 0
        w = sh.work[0];
        more = w.n_blocks >= 0;
        k0 = more && w.n_blocks > 0;
      }
      schedule_k(p, sm, sh, w, more, k0);
    } else if (warp == 1) {
      stream_v(p, sm, sh);
    } else if (kFp8In && warp >= 2) {
      convert_tiles(p, sm, sh);
    } else if (warp == 2 && p.cu_seqlens_q != nullptr) {
      zero_q_tails<kBlockM, 128, kTileQ>(sm, sh);
    }
    return;
  }
  consume_tiles(p, sm, sh);
}

template <class P>
__device__ void flash_fwd(const P& p) {
  if constexpr (kPersistent) persistent(p);
  else one_tile(p);
}

}  // namespace zyfa
