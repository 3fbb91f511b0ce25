// zyfa: quantize_fp8, the arithmetic both arches share (the model: zyfa_runtime/quantize_model.py).
//
// Not compiled on its own: cuda/quantize_fp8.cu (sm_90a) and hip/quantize_fp8.hip (gfx950)
// define the vendor spellings it uses, then include it; the generator inlines it and appends
// the generated Params struct before it and one pass's extern "C" entry after it (each pass is
// an auxiliary kernel kind of its own, all with one argument list: catalogue.QUANTIZE_ARGS).
//
//   zyfa_thread(), zyfa_block(axis), zyfa_as_u32, zyfa_as_f32, zyfa_barrier()   as merge_states.cuh
//   __shared__                                                                   a workgroup's memory
//
// Tensors: q (rows, Hq, Dqk), k (rows, Hkv, Dqk), v (rows, Hkv, Dv) bf16 and their e4m3 codes
// q8, k8, v8, element (b, s, h, c) at b stride_b + s stride_s + h stride_h + c (the head dim
// contiguous); dense: seqlen_* rows a sequence; packed (cu_seqlens_* not null): sequence b is
// rows [cu[b], cu[b + 1]) of batch 0 (stride_b 0), clamped to [0, seqlen_*] (the packed length)
// and to max_seqlen_* rows, so that any cu_seqlens values stay inside the tensors.
//
// Passes, each a launch, in stream order (zyfa_runtime/quantize.py):
//   mean         (smooth_k) fp64 sums of K over chunks of kMeanRows keys -> sums
//   mean_finish  each (sequence, kv head, channel): the chunks' sums in chunk order,
//                fp32(sum / n) correctly rounded -> mean
//   blocks       (block granularity) a block of q or k, a whole group: amax, descale, codes
//   amax         a tile (sequence, head of q|k|v, kTileRows rows): max |x| (K: |k - mean|, fp32)
//                as fp32 bits (non-negative floats order as their bits) -> amax[tile]
//   scales       a descale: the max of its tiles' amax, in a workgroup -> descale_q|k|v
//   codes        a tile: e4m3(x / descale), round to nearest even, saturating -> q8|k8|v8
// (with blocks, the last three do v alone: tile_y0, tile_heads and descale_e0 say which part).
// No atomics and no float reduction whose order could vary: every result is the same bits on
// every run.  A tile lies inside one group of every granularity (kTileRows divides the
// blocks' rows, and a tile is one head of one sequence), so a group's amax is the max over
// whole tiles.
//
// Groups: descale array T (T = q, k, v) has shape (T_ds_batches, T_ds_groups, T_ds_blocks),
// contiguous.  Tile (b, h, rows r0..) of T is in entry (b mod T_ds_batches,
// h / T_heads_per_group, r0 / T_block_rows) (T_block_rows 0: the whole sequence):
// tensor (1, 1, 1) with T_heads_per_group = heads; head (B, Hkv, 1) with Hq / Hkv query heads a
// group for q; block (B, H, blocks) with T_block_rows 128 (q) or 64 (k).

namespace zyfa {

using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
using i64 = long long;

constexpr int kQThreads = zyfa_cfg::kThreads;
constexpr int kTileRows = 64;     // rows of a tile: catalogue.QUANTIZE_TILE_ROWS
constexpr int kMeanRows = 64;     // keys of a mean chunk: catalogue.QUANTIZE_MEAN_ROWS
constexpr int kMaxHeadDim = 256;  // a mean thread a channel: head dims up to kQThreads
static_assert(kQThreads == kMaxHeadDim, "a mean workgroup covers a head's channels");
// mean_finish: a workgroup kFinishChannels channels, each summed by kQThreads / kFinishChannels
// threads over every such chunk (catalogue.QUANTIZE_FINISH_CHANNELS).
constexpr int kFinishChannels = 32;
constexpr int kFinishSlices = kQThreads / kFinishChannels;

__device__ inline float bf16_to_f32(u16 h) { return zyfa_as_f32(u32(h) << 16); }

struct alignas(16) Bf16x8 { u16 h[8]; };   // 16 bytes of a row: one load
struct alignas(8) Codes8 { u32 w[2]; };    // their 8 codes: one store

// --------------------------------------------------------------------------------------
// e4m3: round to nearest even, saturating to +-448 (the model: e4m3.encode(saturate=True)).
// Normal codes (|y| >= 2^-6): the fp32 bits shifted to 3 mantissa bits, rounded at bit 20 --
// a carry into the exponent is the next binade's code, as the integer add makes it; the code
// is (fp32 exponent - 120) 8 + mantissa.  Below 2^-6: rint(|y| 2^9) steps of 2^-9 (0..8; 8 is
// the least normal, 0x08).  |y| >= 448 (everything up to 464 rounds to 448, 464 ties to 448,
// above would be 480, not a finite code) and inf: 448.  NaN: 0x7F.  The sign as it is (-0: 0x80).
__device__ inline u8 e4m3_code(float y) {
  const u32 u = zyfa_as_u32(y);
  const u32 sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return u8(0x7f);
  if (a >= 0x43e00000u) return u8(sign | 0x7eu);                       // 448
  if (a >= 0x3c800000u) {                                              // 2^-6
    const u32 r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    return u8(sign | (r - (120u << 3)));
  }
  const float s = zyfa_as_f32(a) * 512.0f;             // exact: a power of two, s < 8
  const float n = (s + 8388608.0f) - 8388608.0f;       // rint, ties to even (2^23 s's ulp 1)
  return u8(sign | u32(n));
}

// The descale of a group from its amax's bits (finite, >= 0): 1 for 0; power_of_two: 2^e with
// e the least integer such that amax <= 448 2^e -- amax = m 2^x, m in [0.5, 1) (frexp), 448 =
// 0.875 2^9, so e = x - 9 where m <= 0.875, else x - 8 (an fp32 power of two below 2^-149 is
// 0, as the model's float32 conversion makes it); else fp32 amax / 448.
__device__ inline float descale_of(u32 amax, bool power_of_two) {
  if (amax == 0) return 1.0f;
  if (!power_of_two) return zyfa_as_f32(amax) / 448.0f;
  int x;
  bool small;
  if (amax >= 0x00800000u) {                             // normal: 1.f 2^(E - 127)
    x = int(amax >> 23) - 126;
    small = (amax & 0x7fffffu) <= 0x600000u;             // 1.f <= 1.75
  } else {                                                // subnormal: amax 2^-149, exact as a float
    const u32 f = zyfa_as_u32(float(amax));
    x = int(f >> 23) - 126 - 149;
    small = (f & 0x7fffffu) <= 0x600000u;
  }
  const int e = small ? x - 9 : x - 8;
  if (e >= -126) return zyfa_as_f32(u32(e + 127) << 23);
  return e >= -149 ? zyfa_as_f32(1u << (e + 149)) : 0.0f;
}

// fp32(S / n), correctly rounded, for an exact fp64 sum S and 1 <= n < 2^28: the model's
// fp32(fp64(S / n)) is the same value (a 25-bit midpoint is never within 2^-53 relative of
// A / n for such n, so the two roundings never meet a tie the single one would not).  A first
// guess c from a reciprocal, then c moves to a neighbour while S / n lies beyond the midpoint
// between them: c n is exact (24 + 28 bits) and so is S - c n (within a factor 2 of each
// other: Sterbenz); a midpoint's distance h n is a power of two times n.  Ties go to the even
// code.  fp64 adds, multiplies and compares only (no fp64 division on gfx950's VALU path).
__device__ inline float mean_of(double s, int n) {
  const double nd = double(n);
  float c = float(s * double(1.0f / float(n)));
  for (int i = 0; i < 4; ++i) {
    const u32 cb = zyfa_as_u32(c);
    const bool neg = (cb >> 31) != 0;
    const u32 mag = cb & 0x7fffffffu;
    // the neighbours of c toward +inf and -inf (c = +-0: +-2^-149)
    const float up = mag == 0 ? zyfa_as_f32(1u) : zyfa_as_f32(neg ? cb - 1u : cb + 1u);
    const float dn = mag == 0 ? zyfa_as_f32(0x80000001u) : zyfa_as_f32(neg ? cb + 1u : cb - 1u);
    const double d = s - double(c) * nd;
    const double hu = (double(up) - double(c)) * 0.5 * nd, hd = (double(c) - double(dn)) * 0.5 * nd;
    const bool odd = (cb & 1u) != 0;
    if (d > hu || (d == hu && odd)) c = up;
    else if (-d > hd || (-d == hd && odd)) c = dn;
    else break;
  }
  return c;
}

// --------------------------------------------------------------------------------------
// Where a sequence's rows lie.

struct Seq {
  i64 first;   // its first row (packed: cu[b]; dense: 0, the batch stride does the rest)
  int len;     // its rows
};

__device__ inline Seq seq_of(const void* cu_seqlens, int b, int rows, int max_rows) {
  if (cu_seqlens == nullptr) return {0, rows < max_rows ? rows : max_rows};
  const int* cu = static_cast<const int*>(cu_seqlens);
  int lo = cu[b], hi = cu[b + 1];
  lo = lo < 0 ? 0 : (lo > rows ? rows : lo);
  hi = hi < lo ? lo : (hi > rows ? rows : hi);
  const int len = hi - lo;
  return {i64(lo), len < max_rows ? len : max_rows};
}

// One of three values by tensor t (0 q, 1 k, 2 v), the three read whatever t is: a read of a
// Params field picked at run time (branches, or an address picked among the fields) becomes
// a copy of the Params in scratch memory; selects among values read at fixed places do not.
template <class X>
__device__ inline X pick3(int t, X a, X b, X c) { return t == 0 ? a : (t == 1 ? b : c); }

// A descale array's geometry (see "Groups" above) and y0, its tensor's first head in the
// tiles' combined head axis (q | k | v).
struct Groups {
  int batches, groups, blocks, heads_per_group, block_rows, y0;
  float* descale;
};

template <class P>
__device__ inline Groups groups_of(const P& p, int t) {
  return {pick3(t, p.q_ds_batches, p.k_ds_batches, p.v_ds_batches),
          pick3(t, p.q_ds_groups, p.k_ds_groups, p.v_ds_groups),
          pick3(t, p.q_ds_blocks, p.k_ds_blocks, p.v_ds_blocks),
          pick3(t, p.q_heads_per_group, p.k_heads_per_group, p.v_heads_per_group),
          pick3(t, p.q_block_rows, p.k_block_rows, p.v_block_rows),
          pick3(t, 0, p.heads_q, p.heads_q + p.heads_k),
          static_cast<float*>(const_cast<void*>(pick3(t, p.descale_q, p.descale_k, p.descale_v)))};
}

// One tile's tensor: its (sequence, head)'s row 0 in x and in the codes, row strides, its
// descales; the K mean with smooth_k.
struct View {
  const u16* x;
  u8* codes;
  i64 stride_s, codes_stride_s;
  const float* mean;            // k with smooth_k: the (sequence, head)'s channel means; else null
  Groups g;
  int tensor, head, d, len;
};

template <class P>
__device__ inline View view_of(const P& p, int y, int b) {
  View w;
  const int t = y < p.heads_q ? 0 : (y < p.heads_q + p.heads_k ? 1 : 2);
  w.tensor = t;
  w.g = groups_of(p, t);
  w.head = y - w.g.y0;
  const Seq s = t == 0 ? seq_of(p.cu_seqlens_q, b, p.seqlen_q, p.max_seqlen_q)
                       : seq_of(p.cu_seqlens_k, b, p.seqlen_k, p.max_seqlen_k);
  w.len = s.len;
  const i64 sb = pick3(t, p.q_stride_b, p.k_stride_b, p.v_stride_b);
  const i64 ss = pick3(t, p.q_stride_s, p.k_stride_s, p.v_stride_s);
  const i64 sh = pick3(t, p.q_stride_h, p.k_stride_h, p.v_stride_h);
  const i64 cb = pick3(t, p.q8_stride_b, p.k8_stride_b, p.v8_stride_b);
  const i64 cs = pick3(t, p.q8_stride_s, p.k8_stride_s, p.v8_stride_s);
  const i64 ch = pick3(t, p.q8_stride_h, p.k8_stride_h, p.v8_stride_h);
  w.x = static_cast<const u16*>(pick3(t, p.q, p.k, p.v)) + (b * sb + s.first * ss + w.head * sh);
  w.codes = static_cast<u8*>(const_cast<void*>(pick3(t, p.q8, p.k8, p.v8))) + (b * cb + s.first * cs + w.head * ch);
  w.stride_s = ss;
  w.codes_stride_s = cs;
  w.d = t == 2 ? p.d_v : p.d_qk;
  w.mean = t == 1 && p.smooth_k ? static_cast<const float*>(p.mean) + (i64(b) * p.heads_k + w.head) * p.d_qk
                                : nullptr;
  return w;
}

// Whether a tile's rows can go 8 columns (16 bytes in, 8 codes out) a thread: the head dim in
// whole 8s, every row start 16-byte aligned in x and 8-byte aligned in the codes.
__device__ inline bool wide_rows(const View& w) {
  return w.d % 8 == 0 && (w.stride_s % 8 == 0 || w.len <= 1) && (w.codes_stride_s % 8 == 0 || w.len <= 1) &&
         (reinterpret_cast<unsigned long long>(w.x) & 15) == 0 &&
         (reinterpret_cast<unsigned long long>(w.codes) & 7) == 0;
}

// The max over the workgroup of each thread's u32; every thread gets it.  Two levels (three
// barriers): kWide threads take the max of kQThreads / kWide values each, then every thread the
// max of those kWide (broadcast reads).
__device__ inline u32 workgroup_max(u32 m) {
  constexpr int kWide = 32;
  __shared__ u32 red[kQThreads], wide[kWide];
  const int t = zyfa_thread();
  red[t] = m;
  zyfa_barrier();
  if (t < kWide) {
    u32 x = red[t];
    for (int i = 1; i < kQThreads / kWide; ++i) x = red[t + kWide * i] > x ? red[t + kWide * i] : x;
    wide[t] = x;
  }
  zyfa_barrier();
  u32 out = 0;
  for (int i = 0; i < kWide; ++i) out = wide[i] > out ? wide[i] : out;
  zyfa_barrier();
  return out;
}

// --------------------------------------------------------------------------------------
// The passes.

// mean: grid (cdiv(max_seqlen_k, kMeanRows), heads_k, batch); thread c sums channel c of the
// chunk's keys in row order, from +0 (a channel of -0s sums to +0, as the model's numpy sum).
// sums: fp64 (batch, heads_k, mean_chunks, d_qk).
template <class P>
__device__ inline void quantize_mean(const P& p) {
  const int c = zyfa_thread(), chunk = zyfa_block(0), h = zyfa_block(1), b = zyfa_block(2);
  if (c >= p.d_qk) return;
  const Seq s = seq_of(p.cu_seqlens_k, b, p.seqlen_k, p.max_seqlen_k);
  const u16* x = static_cast<const u16*>(p.k) + (b * p.k_stride_b + s.first * p.k_stride_s + h * p.k_stride_h) + c;
  const int lo = chunk * kMeanRows, hi = s.len < lo + kMeanRows ? s.len : lo + kMeanRows;
  double acc = 0.0;
  for (int r = lo; r < hi; ++r) acc += double(bf16_to_f32(x[r * p.k_stride_s]));
  double* sums = static_cast<double*>(const_cast<void*>(p.sums));
  sums[((i64(b) * p.heads_k + h) * p.mean_chunks + chunk) * p.d_qk + c] = acc;
}

// mean_finish: grid (cdiv(heads_k d_qk, kFinishChannels), batch); kFinishChannels (head,
// channel)s a workgroup, each summed by kFinishSlices threads (slice r: chunks r, r +
// kFinishSlices, ...), their partial sums then added by slice 0 (exact sums: any order and any
// grouping give these bits), then fp32(S / n); a sequence without keys has mean 0, and so has
// every one without smooth_k (the pass then reads nothing: the mean output's zeros, written in
// stream order, not by the host).
template <class P>
__device__ inline void quantize_mean_finish(const P& p) {
  __shared__ double part[kFinishSlices][kFinishChannels];
  const int lane = zyfa_thread() % kFinishChannels, slice = zyfa_thread() / kFinishChannels;
  const int i = zyfa_block(0) * kFinishChannels + lane, b = zyfa_block(1);
  const bool live = i < p.heads_k * p.d_qk;   // no return before the barrier
  const int h = live ? i / p.d_qk : 0, c = live ? i % p.d_qk : 0;
  const Seq s = seq_of(p.cu_seqlens_k, b, p.seqlen_k, p.max_seqlen_k);
  const double* sums = static_cast<const double*>(p.sums) + (i64(b) * p.heads_k + h) * p.mean_chunks * p.d_qk + c;
  const int n = p.smooth_k && live ? s.len : 0;
  double acc = 0.0;
  for (int j = slice; j * kMeanRows < n; j += kFinishSlices) acc += sums[i64(j) * p.d_qk];
  part[slice][lane] = acc;
  zyfa_barrier();
  if (slice != 0 || !live) return;
  for (int r = 1; r < kFinishSlices; ++r) acc += part[r][lane];
  float* mean = static_cast<float*>(const_cast<void*>(p.mean));
  mean[(i64(b) * p.heads_k + h) * p.d_qk + c] = n > 0 ? mean_of(acc, n) : 0.0f;
}

// The value the tile passes quantise: x, or k - mean (fp32) with smooth_k.
__device__ inline float value_at(const View& w, u16 bits, int c) {
  const float x = bf16_to_f32(bits);
  return w.mean != nullptr ? x - w.mean[c] : x;
}

// This thread's max |value| (as fp32 bits) over rows [r0, r0 + rows): elements e = t,
// t + kQThreads, ... of them, 8 columns at a time where wide_rows allows, else one.
__device__ inline u32 rows_amax(const View& w, int r0, int rows) {
  const int t = zyfa_thread();
  u32 m = 0;
  if (wide_rows(w)) {
    const int per_row = w.d / 8;
    for (int e = t; e < rows * per_row; e += kQThreads) {
      const int r = e / per_row, c = (e % per_row) * 8;
      const Bf16x8 v = *reinterpret_cast<const Bf16x8*>(w.x + (r0 + r) * w.stride_s + c);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const u32 a = zyfa_as_u32(value_at(w, v.h[i], c + i)) & 0x7fffffffu;
        m = a > m ? a : m;
      }
    }
  } else {
    for (int e = t; e < rows * w.d; e += kQThreads) {
      const int r = e / w.d, c = e % w.d;
      const u32 a = zyfa_as_u32(value_at(w, w.x[(r0 + r) * w.stride_s + c], c)) & 0x7fffffffu;
      m = a > m ? a : m;
    }
  }
  return m;
}

// This thread's codes of rows [r0, r0 + rows) under ``descale``.  power_of_two: x / 2^e is x
// times 2^-e exactly (no rounding but below fp32's normal range, where every value's code is
// +-0 anyway), 2^-e from the exponent bits where both are normal fp32 (biased exponents E and
// 254 - E); else, and for fp32 descales, the correctly rounded division the model makes.
__device__ inline void rows_codes(const View& w, int r0, int rows, float descale, bool power_of_two) {
  const int t = zyfa_thread();
  const u32 bits = zyfa_as_u32(descale), biased = bits >> 23;
  const bool by_mul = power_of_two && (bits & 0x7fffffu) == 0 && biased >= 1 && biased <= 253;
  const float inv = zyfa_as_f32((254u - biased) << 23);
  if (wide_rows(w)) {
    const int per_row = w.d / 8;
    for (int e = t; e < rows * per_row; e += kQThreads) {
      const int r = e / per_row, c = (e % per_row) * 8;
      const Bf16x8 v = *reinterpret_cast<const Bf16x8*>(w.x + (r0 + r) * w.stride_s + c);
      // two words of four codes, little-endian (byte i: column c + i); unrolled, so that no
      // array is indexed at run time (it would live in scratch memory)
      Codes8 out;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        u32 word = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float x = value_at(w, v.h[4 * half + i], c + 4 * half + i);
          word |= u32(e4m3_code(by_mul ? x * inv : x / descale)) << (8 * i);
        }
        out.w[half] = word;
      }
      *reinterpret_cast<Codes8*>(w.codes + (r0 + r) * w.codes_stride_s + c) = out;
    }
  } else {
    for (int e = t; e < rows * w.d; e += kQThreads) {
      const int r = e / w.d, c = e % w.d;
      const float x = value_at(w, w.x[(r0 + r) * w.stride_s + c], c);
      w.codes[(r0 + r) * w.codes_stride_s + c] = e4m3_code(by_mul ? x * inv : x / descale);
    }
  }
}

// Rows of tile (or block) j of ``block`` rows: 0 past the sequence's end.
__device__ inline int rows_of(const View& w, int j, int block) {
  const int r0 = j * block;
  return w.len - r0 < block ? (w.len > r0 ? w.len - r0 : 0) : block;
}

// A tile's or block's descale entry (the header's "Groups").
__device__ inline int entry_of(const View& w, int b, int r0) {
  return ((b % w.g.batches) * w.g.groups + w.head / w.g.heads_per_group) * w.g.blocks +
         (w.g.block_rows ? r0 / w.g.block_rows : 0);
}

// amax: grid (tile_x, tile_heads, batch): heads tile_y0 .. tile_y0 + tile_heads - 1 of the
// combined axis (q | k | v: all of them, or v's alone where the blocks pass did q and k);
// amax: u32 (batch, heads_q + 2 heads_k, tile_x), 0 for a tile past its sequence's end.
template <class P>
__device__ inline void quantize_amax(const P& p) {
  const int tile = zyfa_block(0), y = p.tile_y0 + zyfa_block(1), b = zyfa_block(2);
  const View w = view_of(p, y, b);
  const int rows = rows_of(w, tile, kTileRows);
  const u32 m = workgroup_max(rows > 0 ? rows_amax(w, tile * kTileRows, rows) : 0u);
  if (zyfa_thread() == 0) {
    u32* amax = static_cast<u32*>(const_cast<void*>(p.amax));
    amax[(i64(b) * (p.heads_q + 2 * p.heads_k) + y) * p.tile_x + tile] = m;
  }
}

// scales: grid (n_descales); workgroup e is entry descale_e0 + e of descale_q, then descale_k,
// then descale_v (flattened); the max over the tiles of its group, then descale_of.
template <class P>
__device__ inline void quantize_scales(const P& p) {
  const int t = zyfa_thread();
  int e = p.descale_e0 + zyfa_block(0);
  const int nq = p.q_ds_batches * p.q_ds_groups * p.q_ds_blocks;
  const int nk = p.k_ds_batches * p.k_ds_groups * p.k_ds_blocks;
  const int tensor = e < nq ? 0 : (e < nq + nk ? 1 : 2);
  e -= tensor == 0 ? 0 : (tensor == 1 ? nq : nq + nk);
  const Groups gr = groups_of(p, tensor);
  const int jb = e % gr.blocks, g = (e / gr.blocks) % gr.groups, bb = e / (gr.blocks * gr.groups);
  const int b0 = gr.batches == 1 ? 0 : bb, nb = gr.batches == 1 ? p.batch : 1;
  const int x0 = gr.block_rows ? jb * (gr.block_rows / kTileRows) : 0;
  const int x1 = gr.block_rows ? x0 + gr.block_rows / kTileRows : p.tile_x;
  const int nx = (x1 < p.tile_x ? x1 : p.tile_x) - x0, hpg = gr.heads_per_group;
  const u32* amax = static_cast<const u32*>(p.amax);
  const int heads = p.heads_q + 2 * p.heads_k;
  u32 m = 0;
  const int count = nx > 0 ? nb * hpg * nx : 0;
  for (int i = t; i < count; i += kQThreads) {
    const int x = x0 + i % nx, h = gr.y0 + g * hpg + (i / nx) % hpg, b = b0 + i / (nx * hpg);
    const u32 a = amax[(i64(b) * heads + h) * p.tile_x + x];
    m = a > m ? a : m;
  }
  m = workgroup_max(m);
  if (t == 0) gr.descale[e] = descale_of(m, p.power_of_two != 0);
}

// codes: grid as amax's; each tile under its group's descale (the scales pass's).
template <class P>
__device__ inline void quantize_codes(const P& p) {
  const int tile = zyfa_block(0), y = p.tile_y0 + zyfa_block(1), b = zyfa_block(2);
  const View w = view_of(p, y, b);
  const int rows = rows_of(w, tile, kTileRows);
  if (rows <= 0) return;
  const int r0 = tile * kTileRows;
  rows_codes(w, r0, rows, w.g.descale[entry_of(w, b, r0)], p.power_of_two != 0);
}

// blocks (block granularity): grid (block_x, heads_q + heads_k, batch); a workgroup a block of
// q (128 queries) or k (64 keys) -- a whole group: its amax, descale and codes in one pass
// (the codes read the block again, from the cache).  A block past the sequence's end gets
// descale 1; past the tensor's blocks, nothing.
template <class P>
__device__ inline void quantize_blocks(const P& p) {
  const int j = zyfa_block(0), y = zyfa_block(1), b = zyfa_block(2);
  const View w = view_of(p, y, b);
  if (j >= w.g.blocks) return;
  const int block = w.g.block_rows, rows = rows_of(w, j, block);
  const u32 m = workgroup_max(rows > 0 ? rows_amax(w, j * block, rows) : 0u);
  const float descale = descale_of(m, p.power_of_two != 0);
  if (zyfa_thread() == 0) w.g.descale[entry_of(w, b, j * block)] = descale;
  if (rows > 0) rows_codes(w, j * block, rows, descale, p.power_of_two != 0);
}

}  // namespace zyfa
