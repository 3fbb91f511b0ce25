// zyfa sm_90a kernel bodies: what they share.  Inserted by generator/kernel_source.py after the
// generated configuration and `struct Params`, before the body.
//
// * The work of one CTA: blockIdx = (query-row block, query head, batch entry or varlen
//   sequence); its sequence's bounds, the element offsets of its Q, K, V, O and LSE, its key
//   blocks, and the mask of a block's scores.
// * The asynchronous-copy and WGMMA primitives, the mbarriers of the K/V pipeline, and the
//   register split and turns of the producer and consumer warpgroups.

#include <cuda_bf16.h>
#include <stdint.h>

#include <type_traits>

namespace zyfa {

// Consumer warpgroups of kConsumerRows query rows (the M of their WGMMAs; the generator's
// CONSUMER_ROWS) beside the producer warpgroup (sm_90a bodies).
using zyfa_cfg::kConsumerRows;
constexpr int kConsumers = zyfa_cfg::kThreads / 128 - 1;

// The rows and keys of batch entry (or varlen sequence) b.
struct SeqBounds {
  long long q_start, k_start;   // first row / key in a packed (varlen) batch, else 0
  int sq, sk;                   // its query rows and keys
};

// Sequence [cu[b], cu[b + 1]) of a packed batch, clamped: its first row to [0, total], its
// end to [first, total], its length to at most max_len (max_seqlen: the grid's query blocks,
// the pre-pass's key blocks).  So whatever the values (decreasing, negative, past the end:
// the runtime may pass them unread), 0 <= start <= start + len <= total: a sequence never
// reaches outside its tensor's rows (garbage values give garbage output, in bounds).
__device__ __forceinline__ void clamped_segment(const int* cu, int b, int total, int max_len, long long& start,
                                                int& len) {
  const int first = min(max(cu[b], 0), total);
  const int end = min(max(cu[b + 1], first), total);
  start = first;
  len = min(end - first, max_len);
}

// KV caches (the serving kernels' Params: catalogue._arg_names, "kvcache" and "paged_kv"): whether
// a kernel's arguments have them (the plain kernels' do not: their code is that of no cache),
// and whether this call uses them (a null pointer: K and V are tensors; no page table: the cache
// is contiguous, (batch, seqlen_k, hkv, d)).
template <class P, class = void>
struct HasKvCache : std::false_type {};
template <class P>
struct HasKvCache<P, std::void_t<decltype(P::cache_seqlens)>> : std::true_type {};
template <class P, class = void>
struct HasPages : std::false_type {};
template <class P>
struct HasPages<P, std::void_t<decltype(P::page_table)>> : std::true_type {};
// The softcap (catalogue.Variant.softcap: only the serving kernels' softcap specialisations have
// its arguments): the call's softcap and tanh's argument factor, 0 where the kernel has none, so
// that its code folds away there.
template <class P, class = void>
struct HasSoftcap : std::false_type {};
template <class P>
struct HasSoftcap<P, std::void_t<decltype(P::softcap)>> : std::true_type {};
template <class P>
__device__ __forceinline__ float softcap_of(const P& p) {
  if constexpr (HasSoftcap<P>::value) return p.softcap;
  return 0.f;
}
template <class P>
__device__ __forceinline__ float softcap_scale_of(const P& p) {
  if constexpr (HasSoftcap<P>::value) return p.softcap_scale;
  return 0.f;
}
template <class P>
__device__ __forceinline__ bool kv_cache(const P& p) {
  if constexpr (HasKvCache<P>::value) return p.cache_seqlens != nullptr;
  return false;
}
template <class P>
__device__ __forceinline__ bool paged(const P& p) {
  if constexpr (HasPages<P>::value) return p.page_table != nullptr;
  return false;
}

// Sequence b's rows and keys.  Packed (cu_seqlens_q / cu_seqlens_k): clamped_segment's.  A KV
// cache (kv_cache): its keys are the first cache_seqlens[b] rows of its part of the cache,
// clamped to [0, seqlen_k] (seqlen_k: the cache's rows a sequence, contiguous max_seqlen_k, paged
// max_pages page_size), whatever the value (the runtime may pass it unread); its queries dense
// or packed.
template <class P>
__device__ __forceinline__ SeqBounds sequence_bounds(const P& p, int b) {
  SeqBounds s{0, 0, p.seqlen_q, p.seqlen_k};
  if constexpr (HasKvCache<P>::value) {
    if (p.cu_seqlens_q != nullptr)
      clamped_segment(static_cast<const int*>(p.cu_seqlens_q), b, p.total_q, p.seqlen_q, s.q_start, s.sq);
    if (p.cache_seqlens != nullptr)
      s.sk = min(max(static_cast<const int*>(p.cache_seqlens)[b], 0), p.seqlen_k);
    else if (p.cu_seqlens_k != nullptr)
      clamped_segment(static_cast<const int*>(p.cu_seqlens_k), b, p.total_k, p.seqlen_k, s.k_start, s.sk);
  } else if (p.cu_seqlens_q != nullptr) {
    clamped_segment(static_cast<const int*>(p.cu_seqlens_q), b, p.total_q, p.seqlen_q, s.q_start, s.sq);
    clamped_segment(static_cast<const int*>(p.cu_seqlens_k), b, p.total_k, p.seqlen_k, s.k_start, s.sk);
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

// What one CTA does: blockIdx = (query-row block, query head, batch entry or varlen sequence),
// causal also (query head, query-row block, sequence) or (sequence, query-row block, query
// head), heads or sequences first (catalogue.grid_rule: where their K and V fit in L2).  Causal
// CTAs are taken heaviest first (the most key blocks), so the short ones fill the last wave.
// n_blocks: the kBlockN-key blocks its rows see (0 for an empty key sequence).
struct CtaWork {
  SeqBounds seq;
  TensorOffsets off;
  int b, h, h_kv, row0, diag, n_blocks;   // h_kv: the key/value head of query head h
};

// 2^x, one MUFU.EX2: results below 2^-126 flush to 0 (exp2f adds three instructions per
// element to keep them: BF16's P that small beside the row's 1, FP8's state rescaled that far
// beside the new block's sum of at least 256, change nothing).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- FP8 descales (the FP8 body, and the BF16 body's e4m3 inputs: kFp8In) ----------------------
constexpr double kLog2eD = 1.4426950408889634;

// A descale of sequence b and key/value head h_kv: element [b, h_kv] of a (B, Hkv) view by its
// strides in elements (one value: both 0; a broadcast view: either 0).
__device__ __forceinline__ float descale_at(const void* d, long long stride_b, long long stride_h, int b, int h_kv) {
  return static_cast<const float*>(d)[b * stride_b + h_kv * stride_h];
}

// c = fp32(softmax_scale * log2(e) * dq * dk), the products in double (fp8_models.log2_scale),
// with the descales of the CTA's sequence b and key/value head h_kv (every query head of the
// group shares them).
template <class P>
__device__ __forceinline__ float log2_scale(const P& p, int b, int h_kv) {
  const float dq = descale_at(p.descale_q, p.descale_q_stride_b, p.descale_q_stride_h, b, h_kv);
  const float dk = descale_at(p.descale_k, p.descale_k_stride_b, p.descale_k_stride_h, b, h_kv);
  return static_cast<float>(static_cast<double>(p.softmax_scale) * kLog2eD * static_cast<double>(dq) *
                            static_cast<double>(dk));
}

// x, as the compiler cannot know it: what is computed from the result stays after this point.
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  asm volatile("" : "+r"(x));
  return x;
}

// The CTA's index read afresh (the compiler cannot reuse an earlier read): what is derived
// from it need not stay in registers until it is needed again.
__device__ __forceinline__ uint3 cta_index_again() {
  uint3 c;
  asm volatile("mov.u32 %0, %%ctaid.x;\n mov.u32 %1, %%ctaid.y;\n mov.u32 %2, %%ctaid.z;\n"
               : "=r"(c.x), "=r"(c.y), "=r"(c.z));
  return c;
}

// False when the CTA has no query rows (its block lies past the end of a shorter sequence).
template <class P>
__device__ __forceinline__ bool cta_work(const P& p, CtaWork& w, uint3 cta, uint3 grid) {
  using namespace zyfa_cfg;
  int m_block = cta.x;
  w.h = cta.y;
  w.b = cta.z;
  if constexpr (kCausal) {
    // Heaviest first, in the order the catalogue's rule picked and the grid's shape tells:
    // (blocks, hq, sequences) each head in turn, (hq, blocks, sequences) heads first,
    // (sequences, blocks, hq) sequences first.  Where the grid's shape fits more than one
    // reading, those readings' shapes are the same, and either covers every (block, head,
    // sequence) once (tests/test_catalogue.py reads every order's grid so).
    const bool seqs_first = grid.x == p.batch && grid.z == p.hq;
    const bool heads_first = !seqs_first && grid.y != p.hq;
    m_block = (seqs_first || heads_first ? grid.y - 1 - cta.y : grid.x - 1 - cta.x);
    w.h = seqs_first ? cta.z : heads_first ? cta.x : cta.y;
    w.b = seqs_first ? cta.x : cta.z;
  }
  w.h_kv = w.h / (p.hq / p.hkv);
  w.seq = sequence_bounds(p, w.b);
  w.row0 = m_block * kBlockM;
  if (w.row0 >= w.seq.sq) return false;
  w.off = tensor_offsets(p, w.seq, w.b, w.h, w.h_kv);
  w.diag = w.seq.sk - w.seq.sq;
  int n_end = w.seq.sk;
  if constexpr (kCausal) n_end = min(w.seq.sk, w.row0 + kBlockM + w.diag);
  w.n_blocks = n_end > 0 ? (n_end + kBlockN - 1) / kBlockN : 0;
  return true;
}
// The CTA's own: its index in the launch's grid.
template <class P>
__device__ __forceinline__ bool cta_work(const P& p, CtaWork& w, uint3 cta = blockIdx) {
  return cta_work(p, w, cta, make_uint3(gridDim.x, gridDim.y, gridDim.z));
}

// Scores outside the sequence (col >= sk) or above the causal diagonal -> -inf, in a WGMMA
// accumulator of one kBlockN-key block.  r_lo: the row of s[4j + 0..1] (s[4j + 2..3] are 8
// rows below); n0: the block's first key.
__device__ __forceinline__ void mask_block(float (&s)[zyfa_cfg::kBlockN / 2], int n0, int sk, int r_lo, int diag,
                                           int quad_col) {
  using namespace zyfa_cfg;
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = n0 + j * 8 + quad_col + (e & 1);
      const int row = r_lo + (e >> 1) * 8;
      if (col >= sk || (kCausal && col > row + diag)) s[4 * j + e] = -INFINITY;
    }
  }
}

// ---- the serving features (zyfa_cfg::kServing: catalogue.Variant.serving) --------------------
//
// Sliding windows (zyfa_runtime/window.py, bottom-right aligned): row r of a sequence sits at key
// position r + diag and sees keys r + diag - left .. r + diag + right, a bound of -1 being none;
// causal kernels have right = 0.  A CTA's rows row0 .. last see keys [first, end) (first from
// row0's left bound, end from last's right bound), its key blocks first / kBlockN ..
// ceil(end / kBlockN) - 1, none where end <= first: blocks wholly outside are never loaded.

struct KeyWindow {
  int left, right;   // -1: no bound (causal: right = 0)
};
template <class P>
__device__ __forceinline__ KeyWindow key_window(const P& p) {
  return {p.window_left, zyfa_cfg::kCausal ? 0 : p.window_right};
}
// The CTA's window blocks: `count` of them from block `first` (none: 0 and 0).
struct WindowBlocks {
  int first, count;
};
template <class P>
__device__ __forceinline__ WindowBlocks window_blocks(const P& p, const CtaWork& w) {
  using namespace zyfa_cfg;
  const KeyWindow win = key_window(p);
  const int sk = w.seq.sk, last = min(w.row0 + kBlockM, w.seq.sq) - 1;
  const int first = win.left >= 0 ? max(w.row0 + w.diag - win.left, 0) : 0;
  const int end = win.right >= 0 ? min(last + w.diag + win.right + 1, sk) : sk;
  if (end <= first) return {0, 0};
  return {first / kBlockN, (end + kBlockN - 1) / kBlockN - first / kBlockN};
}
// The CTA's work narrowed to those blocks (BF16: producer and consumers take the same CtaWork):
// n_blocks of them from key `shift` = first block x kBlockN on, and the keys counted from there
// -- seq.sk and diag less shift -- so that block n's first key is n kBlockN and mask_block's
// tests (the sequence's end, the causal diagonal) hold as they are.  Returns shift.
template <class P>
__device__ __forceinline__ int narrow_to_window(const P& p, CtaWork& w) {
  const WindowBlocks b = window_blocks(p, w);
  const int shift = b.first * zyfa_cfg::kBlockN;
  w.n_blocks = b.count;
  w.seq.sk -= shift;
  w.diag -= shift;
  return shift;
}

// Softcap: each raw score x -> u = (1 + tanh t) / 2, t = x softcap_scale (the runtime's
// softcap_scale = softmax_scale / softcap), so the capped logit softcap tanh t is 2 softcap u -
// softcap.  The softmax takes 2 softcap log2(e) as its score factor and leaves the constant
// -softcap to the LSE and the sink (no instruction a score spent on it); u in [0, 1] keeps the
// quad's integer row maximum (quad_row_max) on its fast path.  Three instructions a score, one
// of them MUFU's (tanh.approx.f32), beside the softmax's own ex2: the logistic by ex2 and rcp it
// replaced took two, and MUFU set the pace (the softcap's TFLOP/s rose 1.10-1.12x, same run,
// bench/results/2026-12-06_h200_softcap_tanh).  Runs before any mask (u of a masked -inf would
// be 0, a weight of e^-softcap, not none).  x of any size gives u in [0, 1] (tanh.approx is
// exactly +-1 from |t| = 16 on, measured to 32, and at +-inf: the PTX ISA); a NaN stays NaN.
// Error: tanh.approx.f32 is within 8.0e-6 absolute of tanh (measured over every fp32 t on an
// H200, the run above), t's rounding moves tanh by at most 0.45 x 2^-24 and u's by 2^-25, so a
// capped logit is within softcap x 8.1e-6 of the exact one (with the softmax's fp32 multiply by 2
// softcap log2(e), softcap x 8.3e-6): each weight within a factor 1 +- 4.2e-4 at Gemma 2's
// softcap 50, below the 2^-9 of P's bf16 rounding that the BF16 kernels' bounds (selfcheck: O
// 8e-3, LSE 1e-3 / 2.5e-3) are made of.
__device__ __forceinline__ void cap_scores(float (&s)[zyfa_cfg::kBlockN / 2], float softcap_scale) {
#pragma unroll
  for (int i = 0; i < zyfa_cfg::kBlockN / 2; ++i) {
    float u;
    asm("{\n.reg .f32 t;\nmul.ftz.f32 t, %1, %2;\ntanh.approx.f32 t, t;\nfma.rn.ftz.f32 %0, t, 0f3F000000, 0f3F000000;\n}\n"
        : "=f"(u) : "f"(s[i]), "f"(softcap_scale));
    s[i] = u;
  }
}

// The scores of a block outside each row's window -> -inf: keys before the row's left bound
// (col < row + lo, where `left`) and past its right bound (col > row + hi, where `right`), in
// the accumulator layout of mask_block (r_lo, quad_col as there; keys counted as the CTA's work
// counts them).  Each test is of the element's column offset j 8 + (e & 1), an immediate, against
// a bound a row half (the key offsets relative to the thread's first column, n0 + quad_col): one
// compare and one select an element.  The causal diagonal and the sequence's end stay mask_block's.
__device__ __forceinline__ void mask_window(float (&s)[zyfa_cfg::kBlockN / 2], int n0, int r_lo, int lo, int hi,
                                            bool left, bool right, int quad_col) {
  using namespace zyfa_cfg;
  const int base = r_lo - n0 - quad_col;                          // row - col at offset 0
  int first[2], last[2];                                          // per row half (r_lo, r_lo + 8)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    first[h] = left ? base + lo + 8 * h : -0x7fffffff - 1;
    last[h] = right ? base + hi + 8 * h : 0x7fffffff;
  }
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int k = j * 8 + (e & 1);
      if (k < first[e >> 1] || k > last[e >> 1])
        s[4 * j + e] = -INFINITY;
    }
  }
}

// A block's window edges (serving), after any softcap: where the block crosses the left or right
// edge of the window of one of a consumer's 64 rows (from wg_row0: they see keys from
// (wg_row0 + 63) + lo on, to wg_row0 + hi, lo = diag - left, hi = diag + right), those masks;
// blocks inside every row's window run none.  The arguments are read from the parameters at
// each block, not held: the consumers' registers have no room for them across the loop (held,
// they spill).
template <class P>
__device__ __forceinline__ void window_edges(const P& p, int diag, float (&s)[zyfa_cfg::kBlockN / 2], int n0,
                                             int wg_row0, int r_lo, int quad_col) {
  using namespace zyfa_cfg;
  const KeyWindow win = key_window(p);
  const bool left = win.left >= 0, right = !kCausal && win.right >= 0;   // causal: mask_block's edge
  const int lo = diag - win.left, hi = diag + win.right;
  const bool cut = (left && n0 < wg_row0 + kConsumerRows - 1 + lo) || (right && n0 + kBlockN - 1 > wg_row0 + hi);
  if (cut) mask_window(s, n0, r_lo, lo, hi, left, right, quad_col);
}

// What a BF16 consumer applies to a block's raw scores before its softmax (serving): the softcap
// (cap_scores, where softcap > 0), then the window's edges.
template <class P>
struct ServingScores {
  const P& p;
  int diag;   // the narrowed CtaWork's
  __device__ ServingScores(const P& p_, int diag_) : p(p_), diag(diag_) {}
  __device__ void apply(float (&s)[zyfa_cfg::kBlockN / 2], int n0, int wg_row0, int r_lo, int quad_col) const {
    if (softcap_of(p) > 0.f) cap_scores(s, softcap_scale_of(p));
    window_edges(p, diag, s, n0, wg_row0, r_lo, quad_col);
  }
};

// The maxima of the two rows a thread's accumulator holds (row hr in s[4j + 2hr], s[4j + 2hr +
// 1]), over the quad's four threads, exactly as fmaxf would give them.  Trees of independent
// instructions, both rows at once (the plain loop is a chain of kN / 2 dependent maxima per
// row, each waiting out the ALU latency, and the rows one after the other).
//
// The first tree takes the scores' bits as signed integers, three at a time (VIMNMX3: half the
// instructions of FMNMX, which takes two): the non-negative floats order as their bits do and
// above every negative one, so wherever a row has a score >= +0 the integer maximum is its
// float maximum.  A row with none (all negative, or masked to -inf) shows a negative integer;
// then the warp takes the maxima again as floats, by FMNMX.
template <int kN>
__device__ __forceinline__ void row_max_fmnmx(const float (&s)[kN], float (&mx)[2]) {
  constexpr int kGroups = kN / 4;
  static_assert((kGroups & (kGroups - 1)) == 0, "a power-of-two number of 8-column groups");
  float v[2][kGroups];
#pragma unroll
  for (int j = 0; j < kGroups; ++j)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) v[hr][j] = fmaxf(s[4 * j + 2 * hr], s[4 * j + 2 * hr + 1]);
#pragma unroll
  for (int w = kGroups / 2; w >= 1; w >>= 1)      // levels of the tree
#pragma unroll
    for (int i = 0; i < kGroups / 2; ++i)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        if (i < w) v[hr][i] = fmaxf(v[hr][i], v[hr][i + w]);
#pragma unroll
  for (int lanes = 1; lanes <= 2; lanes *= 2)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) v[hr][0] = fmaxf(v[hr][0], __shfl_xor_sync(0xffffffffu, v[hr][0], lanes));
  mx[0] = v[0][0];
  mx[1] = v[1][0];
}

// A float's bits as an int, by a volatile asm: it stays after the wait that completes a WGMMA
// writing x (a plain bit cast is free to the compiler, which may place it where x is defined,
// inside the product, and ptxas then serialises the WGMMAs to honour the early read).
__device__ __forceinline__ int bits_after_wait(float x) {
  int r;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

template <int kN>
__device__ __forceinline__ void quad_row_max(const float (&s)[kN], float (&mx)[2]) {
  constexpr int kRow = kN / 2;               // a row's values in this thread
  int v[2][kRow];
#pragma unroll
  for (int j = 0; j < kN / 4; ++j)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      v[hr][2 * j] = bits_after_wait(s[4 * j + 2 * hr]);
      v[hr][2 * j + 1] = bits_after_wait(s[4 * j + 2 * hr + 1]);
    }
#pragma unroll
  for (int n = kRow; n > 1; n = (n + 2) / 3)     // levels of the tree: n values -> ceil(n / 3)
#pragma unroll
    for (int i = 0; i < (kRow + 2) / 3; ++i)      // v[i] from v[3i .. 3i + 2], read before written
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        if (3 * i + 2 < n) v[hr][i] = max(max(v[hr][3 * i], v[hr][3 * i + 1]), v[hr][3 * i + 2]);
        else if (3 * i + 1 < n) v[hr][i] = max(v[hr][3 * i], v[hr][3 * i + 1]);
        else if (3 * i < n) v[hr][i] = v[hr][3 * i];
      }
#pragma unroll
  for (int lanes = 1; lanes <= 2; lanes *= 2)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) v[hr][0] = max(v[hr][0], __shfl_xor_sync(0xffffffffu, v[hr][0], lanes));
  if (__any_sync(0xffffffffu, (v[0][0] | v[1][0]) < 0)) {
    row_max_fmnmx(s, mx);
  } else {
    mx[0] = __int_as_float(v[0][0]);
    mx[1] = __int_as_float(v[1][0]);
  }
}

// ---- asynchronous copies and WGMMA ---------------------------------------------------------

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// An empty asm that "reads" registers: after the wait that ends a WGMMA taking its A operand
// from these registers, it keeps ptxas from handing them to anything else while the WGMMA runs
// (ptxas protects a WGMMA's accumulators, not its A operand; generator/wgmma_hazards.py checks).
template <int kN>
__device__ __forceinline__ void keep_operands(const uint32_t (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" :: "r"(r[i]));
}
__device__ __forceinline__ void fence_async_smem() {   // generic smem writes -> WGMMA reads
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Two floats as a bf16 pair in one word (lo in the low half).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Byte offset of (row, 16-byte chunk) in a tile of 128-byte rows with the 128B swizzle.
__device__ __forceinline__ uint32_t swz128(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 4);
}
// The same in a K-block of 64-byte rows with the 64B swizzle (512 bytes between 8-row groups).
__device__ __forceinline__ uint32_t swz64(int row, int chunk) {
  return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4);
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

// The descriptor of the same tile `bytes` (a multiple of 16) further on: shared addresses are
// below 2^18, so the 14-bit start-address field never carries out, and a tile's descriptor is
// computed once and stepped by an immediate per WGMMA.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// ---- warp specialisation: mbarriers, named barriers, WGMMA groups ----------------------------

// Before an mbarrier's memory is initialised anew (no arrival or copy on it pending).
__device__ __forceinline__ void mbar_inval(uint32_t bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// Wait until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nzyfa_wait:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra zyfa_wait;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
// Whether the phases of parity parity0 of bar0 and parity1 of bar1 have both completed, without
// waiting: asked well before the waits it spares (mbar_wait_unless), so that the answer is back
// by the time a branch reads it, where a wait's round trip through its barrier stalls the warp
// at the point of use.  One register carries the answer.
__device__ __forceinline__ bool mbar_test2(uint32_t bar0, uint32_t parity0, uint32_t bar1, uint32_t parity1) {
  uint32_t done;
  asm volatile("{\n.reg .pred p, q;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
               "mbarrier.test_wait.parity.shared::cta.b64 q, [%3], %4;\nand.pred p, p, q;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(bar0), "r"(parity0), "r"(bar1), "r"(parity1) : "memory");
  return done != 0;
}
// Wait until both phases have completed: the two round trips through the barriers overlap.
__device__ __forceinline__ void mbar_wait2(uint32_t bar0, uint32_t parity0, uint32_t bar1, uint32_t parity1) {
  asm volatile("{\n.reg .pred p, q;\nzyfa_wait2:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               "mbarrier.try_wait.parity.shared::cta.b64 q, [%2], %3;\n"
               "and.pred p, p, q;\n@!p bra zyfa_wait2;\n}\n"
               :: "r"(bar0), "r"(parity0), "r"(bar1), "r"(parity1) : "memory");
}
// mbar_wait unless an earlier mbar_test2 found the phase completed.
__device__ __forceinline__ void mbar_wait_unless(bool done, uint32_t bar, uint32_t parity) {
  if (!done) mbar_wait(bar, parity);
}
// One arrival that also expects `bytes` of asynchronous copies to complete the phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
// `bytes` contiguous bytes global -> shared by the bulk-copy engine, completing on mbarrier bar.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
// A TMA tile load of the 4-d tensor map at `tmap` (the address of a kernel parameter) at
// coordinates c0..c3 (innermost first) into shared memory at dst, completing mbarrier bar with
// its bytes.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, uint64_t tmap, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
               :: "r"(dst), "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}
// A tile of kRows rows of kRowBytes bytes by TMA, as K-blocks of kBox-byte rows (a box's first
// dimension: one K-block of the tile's swizzle), kRows rows each, one after another from `tile`;
// the box at (row bytes 0, head h, row `row`, sequence `seq`) of the tensor map, then the next
// K-block's.  One arrival on `bar` expects the tile's bytes (TMA fills zeros past the tensor's
// end and counts them).
template <int kRows, int kRowBytes, int kBox>
__device__ __forceinline__ void tma_tile(uint32_t tile, uint64_t tmap, uint32_t bar, int h, int row, int seq) {
  static_assert(kRowBytes % kBox == 0, "whole K-blocks");
  mbar_arrive_expect_tx(bar, kRows * kRowBytes);
#pragma unroll
  for (int kb = 0; kb < kRowBytes / kBox; ++kb) tma_load_4d(tile + kb * kRows * kBox, tmap, kBox * kb, h, row, seq, bar);
}

// ---- paged KV caches (serving kernels: paged) -------------------------------------------------
//
// Key t of sequence b is row t % page_size of page page_table[b page_table_stride + t / page_size]
// of the cache (num_pages, page_size, hkv, d); page sizes are multiples of 16 from 16 to 256.  The
// tensor maps of a paged call are over the whole cache -- bytes of (head dim, heads, page_size
// rows, num_pages) -- with boxes of kPiece = min(lowbit(page_size), tile rows) rows
// (plan._tensor_map_geometry, the same rule): a power of two that divides both the page and the
// tile, so that a tile (whose first key is a multiple of its rows) is tile rows / kPiece whole
// boxes, none of them across a page.  Each box lands kPiece rows further into the tile's K-block;
// the 128B swizzle repeats every 8 rows (1024 bytes) and the 64B swizzle every 4 (512 bytes), and
// the swizzle is a function of the shared address's bits, so boxes of 16 rows or more at 16-row
// offsets put every chunk where one box of the whole tile puts it.  All of a tile's boxes
// complete one mbarrier with the tile's bytes, as tma_tile's.
// Every index is clamped: the table's slot to [0, max_pages - 1] (a tile's rows past the
// sequence's keys may lie past its last page), the entry to [0, num_pages - 1]: whatever
// cache_seqlens and page_table hold, no copy leaves the table's row or the cache.  Rows past the
// sequence's keys then hold some page's rows: K's are masked (-inf before any exp, an assignment
// that drops whatever the product gave), V's zeroed before PV reads them (BF16: zero_tail_rows;
// FP8: the pre-pass writes V^T zeros past the last key), so no value of an unused row -- Inf or
// NaN included -- reaches O.
template <class P>
__device__ __forceinline__ int page_piece(const P& p, int rows) {
  return min(p.page_size & -p.page_size, rows);
}
// The table's slot of 16-row group g (keys 16 g ..) of a sequence and the page it names, both
// clamped: g / (page_size / 16) as a multiply-high by page_magic = ceil(2^31 / (page_size / 16))
// (exact for g < 2^27: plan.page_magic).
template <class P>
__device__ __forceinline__ int page_slot(const P& p, unsigned g) {
  return min(static_cast<int>(__umulhi(2u * g, static_cast<unsigned>(p.page_magic))), p.max_pages - 1);
}
template <class P>
__device__ __forceinline__ int page_at(const P& p, int b, int slot) {
  const int entry = static_cast<const int*>(p.page_table)[b * p.page_table_stride + slot];
  return min(max(entry, 0), p.num_pages - 1);
}

// A tile of kRows keys from key0 of sequence b (a multiple of kRows) out of a paged cache, as
// tma_tile lays it out (K-blocks of kBox-byte rows): box after box of kPiece rows, each from its
// page's entry, by one thread that loads the entries one at a time (the first from L2, the
// others from the lines it brought to L1).  Only the first K tile of a BF16 CTA, by thread 0
// as it starts; the producer's warps issue the other tiles a lane a box (tma_tile_lanes).  The
// FP8 kernels read a paged cache's K from the pre-pass's contiguous copy (gather_k).  (All the
// tile's entries loaded before the first copy, one round trip instead of one and 7 L1 hits,
// changed nothing measurable at pages of 16: docs/sm90a.md.)
template <int kRows, int kRowBytes, int kBox, class P>
__device__ __forceinline__ void tma_tile_paged(const P& p, uint32_t tile, uint64_t tmap, uint32_t bar, int h,
                                               int key0, int b) {
  static_assert(kRows % 16 == 0 && kRowBytes % kBox == 0, "16-row groups, whole K-blocks");
  const int step = page_piece(p, kRows) / 16;   // 16-row groups a box
  const unsigned g0 = static_cast<unsigned>(key0) / 16u;
  mbar_arrive_expect_tx(bar, kRows * kRowBytes);
#pragma unroll 1
  for (int j = 0; j < kRows / 16; j += step) {
    const int slot = page_slot(p, g0 + j);
    const int page = page_at(p, b, slot);
    // past the page only where the group is past the table's pages: TMA fills that box with zeros
    const int row = 16 * static_cast<int>(g0 + j) - slot * p.page_size;
#pragma unroll
    for (int kb = 0; kb < kRowBytes / kBox; ++kb)
      tma_load_4d(tile + kb * kRows * kBox + 16 * j * kBox, tmap, kBox * kb, h, row, page, bar);
  }
}

// A paged tile issued by the producer's warp, a lane a box: lane j < kRows / kPiece holds box j's
// page (tile_page: the warp's lanes read the tile's entries with one coalesced load, made a tile
// ahead, so that it is in flight while the warp waits for the tile's stage) and issues box j's
// copies itself (tma_tile_lanes; any thread may issue TMA: ptxas issues the lanes' copies one
// after another, each from its lane's registers, an ELECT loop of a few instructions a copy).
// Thread 0's tma_tile_paged waited for each box's entry in turn (an L1 round trip, its clamps
// and its copies, times 8 at 16-row pages); here no copy waits for a load.  Lane 0 arrives on
// bar expecting the tile's bytes; a lane's copies may complete before that arrival (the
// barrier's tx-count goes below zero, and its phase waits for the arrival all the same).
// Both are called by every lane of the warp; lanes past the tile's boxes load and issue nothing.
// tile_page returns the entry as loaded and tma_tile_lanes clamps it (page_at's clamp): an
// instruction that read the entry right after its load would make the warp wait for it there.
template <int kRows, class P>
__device__ __forceinline__ int tile_page(const P& p, int key0, int b) {
  const int j = threadIdx.x % 32 * (page_piece(p, kRows) / 16);   // the lane's box: its first 16-row group
  if (j >= kRows / 16) return 0;
  const int slot = page_slot(p, static_cast<unsigned>(key0) / 16u + j);
  return static_cast<const int*>(p.page_table)[b * p.page_table_stride + slot];
}
template <int kRows, int kRowBytes, int kBox, class P>
__device__ __forceinline__ void tma_tile_lanes(const P& p, int page, uint32_t tile, uint64_t tmap, uint32_t bar,
                                               int h, int key0) {
  static_assert(kRows % 16 == 0 && kRows / 16 <= 32 && kRowBytes % kBox == 0, "a lane a box, whole K-blocks");
  const int j = threadIdx.x % 32 * (page_piece(p, kRows) / 16);
  if (threadIdx.x % 32 == 0) mbar_arrive_expect_tx(bar, kRows * kRowBytes);
  if (j < kRows / 16) {
    const unsigned g = static_cast<unsigned>(key0) / 16u + j;
    // past the page only where the group is past the table's pages: TMA fills that box with zeros
    const int row = 16 * static_cast<int>(g) - page_slot(p, g) * p.page_size;
    const int pg = min(max(page, 0), p.num_pages - 1);
#pragma unroll
    for (int kb = 0; kb < kRowBytes / kBox; ++kb)
      tma_load_4d(tile + kb * kRows * kBox + 16 * j * kBox, tmap, kBox * kb, h, row, pg, bar);
  }
}

// A K or V tile of kRows keys by TMA: tma_tile at (head h, row, sequence seq) of the tensor map,
// or from a paged cache (paged(p): row is the sequence's key, seq the sequence) tma_tile_paged.
template <int kRows, int kRowBytes, int kBox, class P>
__device__ __forceinline__ void tma_tile_kv(const P& p, uint32_t tile, uint64_t tmap, uint32_t bar, int h, int row,
                                            int seq) {
  if constexpr (HasPages<P>::value) {
    if (p.page_table != nullptr) {
      tma_tile_paged<kRows, kRowBytes, kBox>(p, tile, tmap, bar, h, row, seq);
      return;
    }
  }
  tma_tile<kRows, kRowBytes, kBox>(tile, tmap, bar, h, row, seq);
}

// Key `key`'s row of a paged cache (paged(p): row key % page_size of its page, page_slot and
// page_at clamped) whose bytes start at `cache`, pages stride_b apart, for key/value head h of
// sequence b (FP8: elements are bytes).
template <class P>
__device__ __forceinline__ const uint8_t* page_row(const P& p, const void* cache, long long stride_b,
                                                   long long stride_h, long long stride_s, int b, int h, int key) {
  const unsigned g = static_cast<unsigned>(key) / 16u;
  const int slot = page_slot(p, g);
  return static_cast<const uint8_t*>(cache) + page_at(p, b, slot) * stride_b + h * stride_h +
         (key - slot * p.page_size) * stride_s;
}

// Key `key`'s row of V for key/value head h of sequence b, as the V^T pre-pass reads it: from
// `head`, the sequence's head (tensor_offsets), rows v_stride_s apart; or from a paged cache
// (paged(p)) its page's row (page_row).
template <class P>
__device__ __forceinline__ const uint8_t* v_row(const P& p, const uint8_t* head, int b, int h, int key) {
  if constexpr (HasPages<P>::value) {
    if (p.page_table != nullptr) return page_row(p, p.v, p.v_stride_b, p.v_stride_h, p.v_stride_s, b, h, key);
  }
  return head + key * p.v_stride_s;
}

// Key `key`'s row of a paged cache's K (paged(p)): the FP8 pre-pass's gather (flash_fp8_lean.cuh,
// gather_k).
template <class P>
__device__ __forceinline__ const uint8_t* k_row(const P& p, int b, int h, int key) {
  return page_row(p, p.k, p.k_stride_b, p.k_stride_h, p.k_stride_s, b, h, key);
}

// 16 bytes of `word` repeated at a shared address.
__device__ __forceinline__ void sts128_fill(uint32_t addr, uint32_t word) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" :: "r"(addr), "r"(word) : "memory");
}
// 16 zero bytes at a shared address.
__device__ __forceinline__ void sts128_zero(uint32_t addr) {
  sts128_fill(addr, 0u);
}
// A packed sequence's tile that runs past its end (rows from `rows` on are the next sequence's):
// once it has landed on `landed` (its copies completed there instead of on `full`), one warp
// zeroes those rows of its K-blocks (kRows rows of kBox bytes each, kBytes in all; any swizzle
// keeps a row's chunks inside it), fences them for the async proxy, and its lane 0 arrives on
// `full`.  parity: the phase of `landed` to wait for (0 where it serves one tile a CTA).
template <int kRows, int kBox, int kBytes>
__device__ __forceinline__ void zero_tail_rows(uint32_t tile, uint32_t landed, uint32_t full, int rows,
                                               uint32_t parity = 0) {
  mbar_wait(landed, parity);
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < kBytes / 16; i += 32)
    if ((i / (kBox / 16)) % kRows >= rows) sts128_zero(tile + 16 * i);
  fence_async_smem();
  __syncwarp();
  if (lane == 0) mbar_arrive(full);
}
// 16 bytes to global memory, as one store (a uint4 assignment through a cast pointer may compile
// to four 4-byte stores).
__device__ __forceinline__ void stg128(void* addr, const uint4& v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n"
               :: "l"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
template <int kGroups>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(kGroups) : "memory");
}

// The mbarriers of a producer warpgroup feeding K through kKStages stages and V through
// kVStages to the consumer warpgroups: kfull / vfull complete when the stage's copies have
// landed (TMA or bulk copies completing the phase with their bytes, one arrival that expects
// them), kempty / vempty when lane 0 of each of the 4 kConsumers consumer warps has arrived
// (its WGMMAs reading the stage done).  Block n uses K stage n % kKStages and waits for the
// phase n / kKStages of its full barrier, the phase n / kKStages - 1 of its empty one (n >=
// kKStages); V likewise.
template <int kKStages, int kVStages = kKStages>
struct KvBarriers {
  static constexpr int kBytes = 16 * (kKStages + kVStages);
  static constexpr int kKRing = kKStages, kVRing = kVStages;
  uint32_t base;
  __device__ uint32_t kfull(int s) const { return base + 8 * s; }
  __device__ uint32_t kempty(int s) const { return base + 8 * (kKStages + s); }
  __device__ uint32_t vfull(int s) const { return base + 8 * (2 * kKStages + s); }
  __device__ uint32_t vempty(int s) const { return base + 8 * (2 * kKStages + kVStages + s); }
  __device__ void init() const {   // one thread, before a CTA barrier
    for (int s = 0; s < kKStages; ++s) {
      mbar_init(kfull(s), 1);
      mbar_init(kempty(s), 4 * kConsumers);
    }
    for (int s = 0; s < kVStages; ++s) {
      mbar_init(vfull(s), 1);
      mbar_init(vempty(s), 4 * kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __device__ void inval() const {   // one thread, once no copy or arrival on them is pending
    for (int s = 0; s < kKStages; ++s) {
      mbar_inval(kfull(s));
      mbar_inval(kempty(s));
    }
    for (int s = 0; s < kVStages; ++s) {
      mbar_inval(vfull(s));
      mbar_inval(vempty(s));
    }
  }
  static __device__ uint32_t kfull_parity(int n) { return (n / kKStages) & 1; }
  static __device__ uint32_t kempty_parity(int n) { return (n / kKStages + 1) & 1; }   // n >= kKStages
  static __device__ uint32_t vfull_parity(int n) { return (n / kVStages) & 1; }
  static __device__ uint32_t vempty_parity(int n) { return (n / kVStages + 1) & 1; }   // n >= kVStages
};

// The stage after s of a ring of kN.
template <int kN>
__device__ __forceinline__ int next_stage(int s) { return s + 1 == kN ? 0 : s + 1; }


// ---- the warpgroups: one producer, kConsumers consumers --------------------------------------

// The CTA is launched with 65,536 / kThreads registers a thread, in steps of 8 (168 at 384
// threads, 128 at 512); setmaxnreg moves them between warpgroups and never grows the pool (.inc
// waits for what .dec frees).  The split is the variant's (generator/kernel_source.py).
using zyfa_cfg::kProducerRegs;
using zyfa_cfg::kConsumerRegs;
static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <=
                  zyfa_cfg::kThreads * (65536 / zyfa_cfg::kThreads / 8 * 8),
              "a producer and the consumer warpgroups within the CTA's register pool");
__device__ __forceinline__ void producer_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(kProducerRegs));
}
__device__ __forceinline__ void consumer_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(kConsumerRegs));
}

// The dynamic shared memory's first 1024-byte aligned address (every tile of both bodies is
// 1024-aligned; the catalogue's smem has the 1 KiB this may skip).
__device__ __forceinline__ uint32_t smem_base_1024() {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  return (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023) & ~1023u;
}
// The dynamic shared memory where a layout takes all of it, with no slack to align it: on sm_90a
// it starts 1024-aligned (the CTA's shared window after its 1 KiB reserved for the system), which
// this asserts: a kernel never runs on a misaligned layout (it would overrun its window).
__device__ __forceinline__ uint32_t smem_base_exact() {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  if (base & 1023u) __trap();
  return base;
}

// v as lane 0 of the warp has it: the same value, which the compiler then knows warp-uniform
// (a loop bound or branch on it keeps the code after it convergent to ptxas).
__device__ __forceinline__ int lane0(int v) { return __shfl_sync(0xffffffffu, v, 0); }

// The thread's warpgroup, shuffled from lane 0 so that the compiler knows it warp-uniform:
// what derives from it (the warpgroup's WGMMA descriptors, its named barriers) then lives in
// uniform registers, computed by the uniform datapath, instead of being rebuilt from the thread
// index (S2R, R2UR) in every block where the consumers' registers are short.
__device__ __forceinline__ int warpgroup_index() { return lane0(threadIdx.x / 128); }

// Where a consumer thread (of warpgroup wg = 1 .. kConsumers) sits: consumer cw = wg - 1 of
// kConsumerRows rows from wg_row0, its warp's 16 rows, and in the WGMMA accumulator layout the
// rows r_lo (acc[4j + 0..1]) and r_lo + 8 (acc[4j + 2..3]) at columns quad_col, quad_col + 1 of
// each 8.
struct ConsumerLane {
  int cw, wg_row0, warp, lane, quad_col, r_lo;
  __device__ ConsumerLane(int wg, int row0)
      : cw(wg - 1), wg_row0(row0 + cw * kConsumerRows), warp((threadIdx.x % 128) / 32), lane(threadIdx.x % 32),
        quad_col((lane % 4) * 2), r_lo(wg_row0 + warp * 16 + lane / 4) {}
};

// The consumers' turns at issuing WGMMAs.  Two consumers alternate (ping-pong): named
// barrier 2 + g is consumer g's, completed by its own bar.sync and the other's bar.arrive.
// Consumer 0 goes first (consumer 1 arrives on its barrier once at the start); each consumer
// takes n_blocks + 1 turns (S(0), then one per block) and hands over after each, except
// consumer 1 after its last, so both barriers end balanced.  Three consumers (the 192-row
// tiles) issue whenever they are ready, in no set order: with a third warp per scheduler the
// softmaxes overlap the products anyway, and a rotation only makes a consumer that is ready
// wait for the one before it.  Two consumers keep the turns: without them their products no
// longer alternate with their softmaxes, and they run slower (docs/sm90a.md, what was tried).
struct Turns {
  static_assert(kConsumers == 2 || kConsumers == 3, "two consumers in turn, or three free");
  static constexpr bool kAlternate = kConsumers == 2;
  static constexpr int kBar = 2;
  int cw;   // consumer 0 .. kConsumers - 1
  __device__ void take() const {
    if constexpr (kAlternate) bar_sync(kBar + cw, 256);
  }
  __device__ void hand_over() const {
    if constexpr (kAlternate) bar_arrive(kBar + 1 - cw, 256);
  }
  __device__ void hand_over_last() const { if (cw == 0) hand_over(); }
  // After a turn that may be the CTA's last (`final`).
  __device__ void hand_over(bool final) const {
    if (final) hand_over_last();
    else hand_over();
  }

  // Before the consumers' first turn: consumer 1 arrives on consumer 0's barrier.
  __device__ void begin() const {
    if (kAlternate && cw == 1) bar_arrive(kBar, 256);
  }
  // A tile's first turn: S(0) = Q K(0)^T by issue_s0() once K(0) has landed (its full barrier's
  // phase `parity`), waited for, K(0)'s stage released.
  template <class Bars, class IssueS0>
  __device__ void s0(const Bars& bars, uint32_t parity, IssueS0&& issue_s0) const {
    mbar_wait(bars.kfull(0), parity);
    take();
    wgmma_fence();
    issue_s0();
    hand_over();
    wgmma_wait<0>();
    if (threadIdx.x % 32 == 0) mbar_arrive(bars.kempty(0));
  }
  // A CTA of one tile's first turn.
  template <class Bars, class IssueS0>
  __device__ void first(const Bars& bars, IssueS0&& issue_s0) const {
    begin();
    s0(bars, 0, issue_s0);
  }
};

// The geometry of O's passes through Q's K-blocks (kQBlock-byte rows: 64 FP8, 128 BF16).
template <int kQBlock>
struct OPasses {
  static constexpr int kBlockCols = kQBlock / 2, kBlockChunks = kQBlock / 16;
  static constexpr int kPieces = zyfa_cfg::kDv / kBlockCols;   // K-blocks of Q a row of O fills
  static constexpr int kPerPass = [] {                         // the most of Q's kDqk / 64 that divide kPieces
    int n = zyfa_cfg::kDqk / 64 < kPieces ? zyfa_cfg::kDqk / 64 : kPieces;
    while (kPieces % n) --n;
    return n;
  }();
  static constexpr int kPassCols = kBlockCols * kPerPass, kRowChunks = kPassCols / 8;
  static constexpr int kPasses = zyfa_cfg::kDv / kPassCols;
  // The shared address of 16-byte chunk c of row r of a pass (K-block c / kBlockChunks).
  static __device__ __forceinline__ uint32_t chunk(uint32_t sQg, int r, int c) {
    const int cc = c % kBlockChunks;
    return sQg + (c / kBlockChunks) * (zyfa_cfg::kBlockM * kQBlock) + (kQBlock == 64 ? swz64(r, cc) : swz128(r, cc));
  }
};

// Pass `pass` of O, scaled by inv per row half and rounded to bf16, into the warpgroup's Q rows
// at sQg: each warp's 16 rows by stmatrix (the accumulator layout is stmatrix's: matrix j of a
// warp's x4 is rows 8 (j & 1) .. + 7, columns 8 (i + (j >> 1)) .. + 7).
template <int kQBlock>
__device__ __forceinline__ void stage_o_pass(const float (&acc_o)[zyfa_cfg::kDv / 2], const float (&inv)[2],
                                             uint32_t sQg, int pass, int lane, int warp) {
  using O = OPasses<kQBlock>;
#pragma unroll
  for (int q = 0; q < O::kPassCols / 16; ++q) {       // column groups i, i + 1 (8 columns each)
    const int i = pass * O::kPassCols / 8 + 2 * q;
    uint32_t m[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int hr = j & 1, g = i + (j >> 1);
      m[j] = pack_bf16(acc_o[4 * g + 2 * hr] * inv[hr], acc_o[4 * g + 2 * hr + 1] * inv[hr]);
    }
    const int mat = lane / 8;                         // lane L addresses row L % 8 of matrix L / 8
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(O::chunk(sQg, warp * 16 + (mat & 1) * 8 + lane % 8, 2 * q + (mat >> 1))),
                    "r"(m[0]), "r"(m[1]), "r"(m[2]), "r"(m[3]) : "memory");
  }
}

// O, scaled by inv per row half and rounded to bf16, for the warpgroup's 64 rows, through its
// own Q rows (free once its last S is done: only its own WGMMAs read them).  Q's tile is
// kDqk / 64 K-blocks of kQBlock-byte rows (FP8: 64 bytes in the 64B swizzle, BF16: 128 in the
// 128B swizzle), kBlockM rows apart, from sQg; each holds kQBlock / 2 columns of O.  O goes
// through as many of them at a time as divide its row (kPassCols columns): per pass,
// stage_o_pass, the warpgroup's named barrier kOutBar + cw, then every thread reads 16 bytes
// of a row and stores them, rows from `rows` on (past the sequence's end) left out.  go: the
// warpgroup's first row; row_stride in elements (a multiple of 8: validate.py).  16-byte
// stores of whole rows, where the accumulators' own layout gives four-byte stores, eight rows
// a warp instruction.
constexpr int kOutBar = Turns::kBar + 3;   // named barriers 5 .. 7, after the turns' (2 + consumer)
static_assert(Turns::kBar + kConsumers <= kOutBar && kOutBar + kConsumers <= 16,
              "named barriers");

template <int kQBlock>
__device__ __forceinline__ void store_o_rows(const float (&acc_o)[zyfa_cfg::kDv / 2], const float (&inv)[2],
                                             uint32_t sQg, __nv_bfloat16* go, long long row_stride, int rows,
                                             int cw) {
  using O = OPasses<kQBlock>;
  static_assert(kQBlock == 64 || kQBlock == 128, "Q's K-blocks: the 64B or the 128B swizzle");
  // The addresses from values read here (opaque): none of them is computed ahead, where its
  // registers would stay live through the consumer's loop.
  sQg = opaque(sQg);
  const int tid = opaque(threadIdx.x) % 128, lane = tid % 32, warp = tid / 32;
#pragma unroll
  for (int pass = 0; pass < O::kPasses; ++pass) {
    if (pass > 0) bar_sync(kOutBar + cw, 128);        // the last pass's chunks read
    stage_o_pass<kQBlock>(acc_o, inv, sQg, pass, lane, warp);
    bar_sync(kOutBar + cw, 128);
#pragma unroll
    for (int k = 0; k < 64 * O::kRowChunks / 128; ++k) {
      const int q = tid + 128 * k, r = q / O::kRowChunks, c = q % O::kRowChunks;
      uint4 v;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(O::chunk(sQg, r, c)) : "memory");
      if (r < rows) stg128(go + r * row_stride + pass * O::kPassCols + 8 * c, v);
    }
  }
}

// ---- O by TMA (kTmaO, catalogue.Tile.tma_o: tmap_o) ----------------------------------------------
//
// The warpgroup's 64 rows of O staged as store_o_rows stages them -- in one pass, two K-blocks of
// 128-byte rows in the 128B swizzle, kBlockM rows apart (BF16: the tile's Q buffer; FP8: a
// staging tile of its own), each K-block a TMA box of 64 rows (tmap_o: bytes of (head dim,
// heads, rows, sequences), boxes of 128 bytes x 1 x 64 x 1) -- fenced for the async proxy and
// the warpgroup synchronised (stage_o_tma); then one thread copies the boxes out (copy_o_tma)
// as a bulk group, which TMA clips at the tensor's ends, and must wait for the group's reads
// (tma_store_read) before the staging rows are written again.  Instead of 64 16-byte stores a
// warp, each computing its address, and the row checks: one instruction a K-block.
__device__ __forceinline__ void tma_store_4d(uint64_t tmap, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
               :: "l"(tmap), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void tma_store_read() {   // this thread's bulk groups have read shared memory
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void tma_store_done() {   // this thread's bulk groups have written
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

template <int kCols = zyfa_cfg::kDv>   // (a template: the assertion only where it is used)
__device__ __forceinline__ void stage_o_tma(const float (&acc_o)[kCols / 2], const float (&inv)[2],
                                            uint32_t sOg, int cw) {
  static_assert(kCols == 128, "O's row: two 128-byte K-blocks, staged in one pass");
  sOg = opaque(sOg);
  const int tid = opaque(threadIdx.x) % 128;
  stage_o_pass<128>(acc_o, inv, sOg, 0, tid % 32, tid / 32);
  fence_async_smem();                                 // stmatrix's writes, for TMA's reads
  bar_sync(kOutBar + cw, 128);
}

// O of a warpgroup's rows from wg_row0 of tile w by TMA: its box of 64 rows stays in the
// sequence (a dense tensor's end clips it; past a packed sequence's end lie the next one's rows).
template <class P>
__device__ __forceinline__ bool o_by_tma(const P& p, const CtaWork& w, int wg_row0) {
  return p.cu_seqlens_q == nullptr || w.seq.sq - wg_row0 >= zyfa_cfg::kConsumerRows;
}

// A warpgroup's staged rows (at sOg) to its rows from wg_row0 of tile w in tmap_o (a packed
// batch one sequence of all its rows, as Q's map: copy_tile_q), committed as one bulk group.
template <class P>
__device__ __forceinline__ void copy_o_tma(const P& p, uint32_t sOg, const CtaWork& w, int wg_row0) {
  const bool packed = p.cu_seqlens_q != nullptr;
  const int row = packed ? static_cast<int>(w.seq.q_start) + wg_row0 : wg_row0, seq = packed ? 0 : w.b;
#pragma unroll
  for (int kb = 0; kb < OPasses<128>::kPieces; ++kb)
    tma_store_4d(reinterpret_cast<uint64_t>(p.tmap_o), sOg + kb * (zyfa_cfg::kBlockM * 128), 128 * kb, w.h, row, seq);
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// The key blocks a consumer's rows (first row wg_row0) see of the CTA's n_blocks: with three
// consumers none past the end of the sequence's rows, and causal, none past the diagonal of
// its last row; the CTA's other blocks are idle turns for it.  Broadcast from lane 0 (a
// warp-uniform loop bound around the WGMMAs).  With two, all of the CTA's: both consumers'
// rows end in the same block wherever the diagonal is block-aligned, and the general bound
// only slows their main loop.
__device__ __forceinline__ int consumer_blocks(int wg_row0, int sq, int sk, int diag, int n_blocks) {
  using namespace zyfa_cfg;
  if constexpr (kConsumers == 2) return n_blocks;
  int n_end = wg_row0 >= sq ? 0 : sk;
  if constexpr (kCausal) n_end = min(n_end, wg_row0 + kConsumerRows + diag);
  const int n = n_end > 0 ? min(n_blocks, (n_end + kBlockN - 1) / kBlockN) : 0;
  return lane0(n);
}

// ---- persistent CTAs: what both bodies' schedulers share --------------------------------------
//
// A persistent CTA (zyfa_cfg::kPersistent) takes tiles in turn: thread 0 takes each next one from
// tile_counter (TileQueue) and publishes it in slot j % 2 of Sched (its work; the end), with its
// Q copied into buffer j % 2; the consumers read the slot, and each reader releases it (qempty)
// once done with the slot and the buffer.  The bodies' own sections say who reads and when.
struct Sched {
  uint64_t tfull[2];    // slot b published (the scheduler's arrival)
  uint64_t qempty[2];   // slot b and Q buffer b free: each consumer warp, the body's other readers
  uint64_t qfull[2];    // Q buffer b landed (its rows past a packed sequence's end zeroed)
  uint64_t qlanded[2];  // the copy of a packed sequence's last Q tile into buffer b
  CtaWork work[2];      // the tile in slot b; n_blocks < 0: the end
};
__device__ __forceinline__ uint32_t shared_addr(const void* x) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(x));
}

// The K/V ring of kN stages over a persistent CTA's tiles: each tile starts at stage 0 (its
// block n in stage n % kN), so that a block's stage, and the WGMMA descriptors of its K and V,
// follow from n alone (a stage counted over the CTA's blocks is a per-thread register to ptxas,
// and so are the descriptors derived from it: an R2UR before every WGMMA).  Phases are counted
// per stage: bit s of `phases` the parity of stage s's uses by the tiles before, of `used`
// whether it has had any.  A CTA of one tile (phases = used = 0) has KvBarriers' parities.
template <int kN>
struct TileRing {
  static_assert(kN >= 2 && kN <= 32, "a stage a bit");
  uint32_t phases = 0, used = 0;
  __device__ uint32_t full_parity(int n) const {
    const uint32_t u = static_cast<uint32_t>(n);
    return ((phases >> (u % kN)) ^ (u / kN)) & 1u;
  }
  // Whether block n's stage was filled before (its empty barrier to be waited for), and the parity.
  __device__ bool refill(int n) const { return n >= kN || ((used >> (static_cast<uint32_t>(n) % kN)) & 1u); }
  __device__ uint32_t empty_parity(int n) const { return full_parity(n) ^ 1u; }
  // After a tile of n_blocks: stage s had ceil((n_blocks - s) / kN) uses.
  __device__ void end_tile(int n_blocks) {
#pragma unroll
    for (int s = 0; s < kN; ++s) {
      const uint32_t uses = n_blocks > s ? static_cast<uint32_t>(n_blocks - 1 - s) / kN + 1 : 0u;
      phases ^= (uses & 1u) << s;
      used |= (uses > 0 ? 1u : 0u) << s;
    }
  }
};

// The ring of a CTA of one tile: KvBarriers' parities (TileRing's where phases = used = 0).
template <class Bars>
struct OneTileRing {
  __device__ uint32_t full_parity(int n) const { return Bars::kfull_parity(n); }
};

// Tile t's work (false where its rows lie past its sequence's end).  A serving kernel's tile is
// narrowed to its window (narrow_to_window) with the shift folded into seq.k_start, which is
// then the tensor maps' key row of its block 0 (0 + shift where not packed): every reader of
// the published work copies from the same keys.
template <class P>
__device__ __forceinline__ bool tile_work(const P& p, int t, CtaWork& w) {
  const uint3 grid = make_uint3(p.tiles_x, p.tiles_y, p.tiles_z);
  const uint32_t u = t, xy = grid.x * grid.y;
  if (!cta_work(p, w, make_uint3(u % grid.x, u % xy / grid.x, u / xy), grid)) return false;
  if constexpr (zyfa_cfg::kServing) w.seq.k_start += narrow_to_window(p, w);
  return true;
}

// The tiles of a launch, thread 0's: counter[0] the tiles taken past the grid's, counter[1]
// the CTAs finished.
template <class P>
struct TileQueue {
  const P& p;
  unsigned* counter;
  int n_tiles;
  __device__ explicit TileQueue(const P& p_)
      : p(p_), counter(static_cast<unsigned*>(const_cast<void*>(p_.tile_counter))), n_tiles(p_.tile_count) {}
  __device__ int take() const { return gridDim.x + atomicAdd(counter, 1u); }
  // The first tile with rows from tile t on, w its work; false at the end of the tiles, where
  // the last CTA to get there zeroes the counter (every CTA's last take is before its count).
  __device__ bool next(int t, CtaWork& w) const {
    for (;; t = take()) {
      if (t >= n_tiles) {
        __threadfence();
        if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {
          __threadfence();
          atomicExch(counter, 0u);
          atomicExch(counter + 1, 0u);
        }
        return false;
      }
      if (tile_work(p, t, w)) return true;
    }
  }
};

// Thread 0, before the CTA's barrier: both slots' mbarriers, `readers` arrivals releasing a
// slot (qempty: each consumer warp and the body's other readers).
__device__ __forceinline__ void init_sched(Sched& sh, int readers) {
  for (int b = 0; b < 2; ++b) {
    mbar_init(shared_addr(&sh.tfull[b]), 1);
    mbar_init(shared_addr(&sh.qempty[b]), readers);
    mbar_init(shared_addr(&sh.qfull[b]), 1);
    mbar_init(shared_addr(&sh.qlanded[b]), 1);
  }
}

// Slot j % 2 := w (null: the end), published.
__device__ __forceinline__ void publish(Sched& sh, int j, const CtaWork* w) {
  const int b = j & 1;
  if (w != nullptr) sh.work[b] = *w;
  else sh.work[b].n_blocks = -1;
  mbar_arrive(shared_addr(&sh.tfull[b]));
}

// Thread 0 after tile j's last copy: the next tile taken into w (false: the end), published in
// slot (j + 1) % 2 once tile j - 1 has released it (qempty: its epilogue done, the other readers
// past it), and its Q copied into buffer (j + 1) % 2 by copy_q(dst, full, landed).
template <class P, class Smem, class CopyQ>
__device__ __forceinline__ bool take_next_tile(const TileQueue<P>& queue, const Smem& sm, Sched& sh, int j,
                                               CtaWork& w, CopyQ&& copy_q) {
  const bool more = queue.next(queue.take(), w);
  const int b = (j + 1) & 1;
  if (j >= 1) mbar_wait(shared_addr(&sh.qempty[b]), ((j - 1) >> 1) & 1);   // tile j - 1's slot and Q
  publish(sh, j + 1, more ? &w : nullptr);
  if (more && w.n_blocks > 0) copy_q(sm.q_at(b), shared_addr(&sh.qfull[b]), shared_addr(&sh.qlanded[b]));
  return more;
}

// Thread 0, once the CTA's mbarriers are made: its first tile (from blockIdx.x on) into w and
// slot 0, published; false where there is none.
template <class P>
__device__ __forceinline__ bool take_first_tile(const P& p, Sched& sh, CtaWork& w) {
  const bool more = TileQueue<P>(p).next(blockIdx.x, w);
  publish(sh, 0, more ? &w : nullptr);
  return more;
}

// Warp 2 where Q is packed: each tile's rows past its sequence's end zeroed (zero_tail_rows:
// Q's tiles of kRows rows in K-blocks of kBox-byte rows, kTileBytes each, at q_at(b)).
template <int kRows, int kBox, int kTileBytes, class Smem>
__device__ void zero_q_tails(const Smem& sm, Sched& sh) {
  uint32_t landed = 0;   // bit b: the phase of qlanded[b]
  for (int j = 0;; ++j) {
    const int b = j & 1;
    mbar_wait(shared_addr(&sh.tfull[b]), (j >> 1) & 1);
    const int n_blocks = sh.work[b].n_blocks, rows = sh.work[b].seq.sq - sh.work[b].row0;
    if (n_blocks < 0) return;
    if (n_blocks > 0 && rows < kRows) {
      zero_tail_rows<kRows, kBox, kTileBytes>(sm.q_at(b), shared_addr(&sh.qlanded[b]), shared_addr(&sh.qfull[b]),
                                              rows, (landed >> b) & 1);
      landed ^= 1u << b;
    }
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(shared_addr(&sh.qempty[b]));
  }
}

// A turn of block m past the consumer's rows: no products; its K and V stages released in
// order (each after the producer filled it, so that no release runs ahead of its phase: kpar,
// vpar, their full barriers').  K(0) was released by the first turn's S(0).  `final`: the
// CTA's last block.
template <class Bars>
__device__ __forceinline__ void idle_turn(const Bars& bars, const Turns& turns, int m, bool final, uint32_t kpar,
                                          uint32_t vpar) {
  const int k = m % Bars::kKRing, t = m % Bars::kVRing;
  mbar_wait(bars.kfull(k), kpar);
  mbar_wait(bars.vfull(t), vpar);
  turns.take();
  turns.hand_over(final);
  if (threadIdx.x % 32 == 0) {
    if (m > 0) mbar_arrive(bars.kempty(k));
    mbar_arrive(bars.vempty(t));
  }
}
// A CTA of one tile's (KvBarriers' parities).
template <class Bars>
__device__ __forceinline__ void idle_turn(const Bars& bars, const Turns& turns, int m, bool final) {
  idle_turn(bars, turns, m, final, Bars::kfull_parity(m), Bars::vfull_parity(m));
}

}  // namespace zyfa
