// zyfa gfx950 BF16 body: the K and V tiles in LDS (layouts, the global -> LDS copy) and
// the two matrix stages that read them, S^T = K Q^T and O^T += V^T P^T.
//
// LDS layout of a tile: row-major, one key a row (K: kDqk, V: kDv bf16), each row in
// 16-byte chunks; chunk c of row r sits in slot c ^ swizzle(r).  The swizzles make the
// matrix stages' reads free of bank conflicts (64 banks x 4 bytes):
//   K, ds_read_b128: a phase is 16 lanes (lane bit 5, bit 2 ^ bit 4), reading rows
//     {0-3, 8-11, 20-23, 28-31} (+ 32 kt) at one chunk; their 16 chunks must land in 16
//     distinct 16-byte bank groups.  d 128 / 256 (rows of 256 / 512 bytes): r & 15;
//     d 64 / 192 (rows of 128 / 384 bytes, two row parities a 256-byte line): (r >> 1) & 7.
//   V, ds_read_b64_tr_b16: a phase is 32 lanes reading 4 keys x 64 bytes (32 dv); the
//     4 keys' 64-byte runs must fall in distinct quarters of the bank space: d_v 128 / 256:
//     (r & 3) << 2 (the XOR moves whole 64-byte runs), d_v 64: (r & 3) << 1.
// Both swizzles stay inside an aligned group of 8 chunks where a row is not a power of
// two long (d 192), so every slot exists.

namespace zyfa {
namespace detail {

struct KLayout {
  static constexpr int kWidth = kDqk;  // bf16 a row
  static constexpr int kSpan = kDqk % 128 == 0 ? 16 : 8;  // the swizzle permutes aligned runs of kSpan chunks
  __device__ static int swizzle(int r) { return kDqk % 128 == 0 ? (r & 15) : ((r >> 1) & 7); }
};
struct VLayout {
  static constexpr int kWidth = kDv;
  static constexpr int kSpan = kDv >= 128 ? 16 : 8;
  __device__ static int swizzle(int r) { return kDv >= 128 ? (r & 3) << 2 : (r & 3) << 1; }
};

// The slot of chunk c0 + c1 of a row whose swizzle is `swz`, where c0 is a compile-time
// multiple of the layout's span and c1 < span: c0 stays an immediate offset, and only
// c1 ^ swz (a handful of values a lane) needs a register.
template <class Layout>
__device__ inline int slot(int c0, int c1, int swz) { return c0 + (c1 ^ swz); }

constexpr int kLdsK = kBlockN * kDqk;  // u16 elements of one K tile
constexpr int kLdsV = kBlockN * kDv;
static_assert(2 * (kLdsK + kLdsV) * 2 <= 160 * 1024, "two K and V tiles in the 160 KiB of LDS");

// A raw buffer resource (ISA 9.1.5): base, stride 0, num_records bytes, word 3 0x00020000
// (DATA_FORMAT 32, no swizzle, no ADD_TID).  Offsets at or past num_records read zeros.
__device__ inline u32x4 raw_buffer(const void* base, u32 bytes) {
  const unsigned long long a = reinterpret_cast<unsigned long long>(base);
  return u32x4{u32(a), u32(a >> 32) & 0xffffu, bytes, 0x00020000u};
}

// buffer_load_dwordx4 ... lds: this lane's 16 bytes at `voff` in the buffer go to LDS at
// M0 + 16 lane, M0 = `lds`.  Written as assembly on purpose: the compiler, which cannot
// tell which LDS bytes the copy writes, would otherwise wait for every copy in flight
// (vmcnt(0)) before the next LDS read, and the next tile's copy would no longer overlap
// this tile's work.  The kernel orders the copies itself (wait_vm_all, then a barrier,
// before any wave reads a tile; a barrier before a buffer is overwritten).  The compiler
// cannot see into the assembly, so it brings its own wait states (ISA 4.5): 5 between a
// VALU write of an SGPR (v_readlane of a spilled scalar, v_readfirstlane) and the load
// reading it (s_nop 3, s_mov, s_nop 0), 1 between the SALU write of M0 and the LDS DMA.
__device__ inline void lds_dma16(u32x4 rsrc, u32 voff, u32 lds) {
  asm volatile("s_nop 3\n\ts_mov_b32 m0, %2\n\ts_nop 0\n\tbuffer_load_dwordx4 %0, %1, 0 offen lds"
               : : "v"(voff), "s"(rsrc), "s"(lds) : "memory", "m0");
}

// The four instructions of one wave's share of a tile (KvCopy::kOneBuffer), all from one
// buffer: instruction n's 16 bytes a lane at `voff[n]` go to LDS at M0 + 16 lane,
// M0 = `lds` + n `step`.  One piece of assembly, so that its wait states are paid once a tile
// (ISA 4.5: the s_nop 3 for a VALU write of an SGPR before the first load reads the buffer,
// which the later loads reuse; 1 between each M0 write and its LDS DMA): 16 issue slots a tile,
// where four lds_dma16 with their buffers stepped between them took about 100 (SALU and waits).
template <u32 step>
__device__ inline void lds_dma16_x4(u32x4 rsrc, const u32 (&voff)[4], u32 lds) {
  asm volatile("s_nop 3\n\ts_mov_b32 m0, %5\n\ts_nop 0\n\tbuffer_load_dwordx4 %1, %0, 0 offen lds\n\t"
               "s_add_u32 m0, %5, %6\n\ts_nop 0\n\tbuffer_load_dwordx4 %2, %0, 0 offen lds\n\t"
               "s_add_u32 m0, %5, %7\n\ts_nop 0\n\tbuffer_load_dwordx4 %3, %0, 0 offen lds\n\t"
               "s_add_u32 m0, %5, %8\n\ts_nop 0\n\tbuffer_load_dwordx4 %4, %0, 0 offen lds"
               : : "s"(rsrc), "v"(voff[0]), "v"(voff[1]), "v"(voff[2]), "v"(voff[3]), "s"(lds), "i"(step),
                 "i"(2 * step), "i"(3 * step)
               : "memory", "m0", "scc");
}

// One instruction of that copy on its own (the tile's loads spread over a step: flash_fwd.hip),
// with its own wait states: s_mov (1) and s_nop 3 (4) between whatever precedes it and the
// load (5 for a VALU write of an SGPR -- a paged buffer's v_readlane --, 1 for the M0 write);
// 6 issue slots.
__device__ inline void lds_dma16_lone(u32x4 rsrc, u32 voff, u32 lds) {
  asm volatile("s_mov_b32 m0, %2\n\ts_nop 3\n\tbuffer_load_dwordx4 %0, %1, 0 offen lds"
               : : "v"(voff), "s"(rsrc), "s"(lds) : "memory", "m0");
}

// Instructions n and n + 1 of a paged copy (KvCopy::issue_paged), buffer_load_dwordx4 ... lds
// as lds_dma16 does, each buffer's base, high word and size read out of lanes n and n + 1 of
// `lo`, `hi`, `bytes`.  All in one piece of assembly so that the read-outs of the second
// buffer fill the wait states of the first (ISA 4.5: 5 between a VALU write of an SGPR and a
// load reading it, 1 between the M0 write and an LDS DMA, 1 between a VALU write of a VGPR and
// a v_readlane of it: the leading s_nop 0 where n = 0, the values' VALU ops just before),
// where two lds_dma16 take s_nop 3, s_mov, s_nop 0 each: 14 issue slots a pair against 22
// (the compiler, left the read-outs, also copied the second buffer's words around).  The
// buffers are fixed SGPRs, s[20:23] and s[24:27], clobbered: an SGPR tuple operand's words
// cannot be named one by one.  M0 = `lds` + `off_a` (+ `off_b` for the second).
template <int n, u32 off_a, u32 off_b>
__device__ inline void lds_dma16_pair(u32 lo, u32 hi, u32 bytes, u32 voff_a, u32 voff_b, u32 lds) {
  if constexpr (n == 0) asm volatile("s_nop 0" : : "v"(lo), "v"(hi), "v"(bytes));  // after the values
  asm volatile("v_readlane_b32 s20, %0, %6\n\tv_readlane_b32 s21, %1, %6\n\tv_readlane_b32 s22, %2, %6\n\t"
               "s_mov_b32 s23, 0x20000\n\ts_add_u32 m0, %5, %8\n\t"
               "v_readlane_b32 s24, %0, %7\n\tv_readlane_b32 s25, %1, %7\n\tv_readlane_b32 s26, %2, %7\n\t"
               "buffer_load_dwordx4 %3, s[20:23], 0 offen lds\n\t"
               "s_mov_b32 s27, 0x20000\n\ts_add_u32 m0, %5, %9\n\ts_nop 1\n\t"
               "buffer_load_dwordx4 %4, s[24:27], 0 offen lds"
               : : "v"(lo), "v"(hi), "v"(bytes), "v"(voff_a), "v"(voff_b), "s"(lds), "i"(n), "i"(n + 1),
                 "i"(off_a), "i"(off_b)
               : "memory", "m0", "s20", "s21", "s22", "s23", "s24", "s25", "s26", "s27");
}

// a x b by v_mul_u32_u24 (full rate; v_mul_lo_u32 is quarter rate): the low 32 bits of the
// product of a's and b's low 24 bits; `a_uniform` wave-uniform (an SGPR).  In assembly: given
// masks in C instead, the compiler folded them back into a v_mul_lo_u32.
__device__ inline u32 mul_u24(u32 a_uniform, u32 b) {
  u32 r;
  asm("v_mul_u32_u24 %0, %1, %2" : "=v"(r) : "s"(a_uniform), "v"(b));
  return r;
}

// A sequence's pages in a paged KV cache (the arguments' page_table, page_size, num_pages):
// `table`, its row of page_table (slot i: the page of keys [i page_size, (i + 1) page_size));
// `units`, page_size / 16 (16-row groups a page, 1 .. 16); `magic` = magic_of(page_size) =
// ceil(2^31 / units), with which g / units = mul_hi(2 g, magic) exactly for every group
// g < 2^27 (keys < 2^31: the error magic units - 2^31 < units <= 16, and g x 15 < 2^31);
// `last_page`, num_pages - 1.  The magic is an argument (page_magic, from the runtime: a
// division here took 20 VALU ops a tile).  Wave-uniform: SGPRs.
struct PageMap {
  const ZYFA_GLOBAL int* table;
  u32 units, magic;
  int last_page;

  __device__ PageMap(const ZYFA_GLOBAL int* table_, int page_size, int num_pages, int magic_)
      : table(table_), units(u32(page_size) >> 4), magic(u32(magic_)), last_page(num_pages - 1) {}

  // The table's slot of 16-row group g of the sequence (keys 16 g ..), and the group's first
  // row in that slot's page.
  __device__ u32 slot_of(u32 g) const { return u32(u64(2u * g) * magic >> 32); }
  __device__ u32 row_of(u32 g, u32 slot) const { return 16u * (g - slot * units); }
  // A table entry as a page of the cache: clamped to [0, last_page] whatever it holds.
  // (In two steps, as first written for an emulator without v_med3_i32: above d 64, whose code
  // objects are kept as they were; d 64 takes clamp_med3.)
  __device__ u32 clamp(int page) const {
    page = page > last_page ? last_page : page;
    asm("" : "+v"(page));
    return u32(page < 0 ? 0 : page);
  }
  // d 64 (CopyCore::tile's kRowGiven, in the softmax step, which sets the period there): the
  // same clamp as one v_med3_i32; and the slot and the row offset of group g from 2 g (`g2`,
  // CopyCore::lane_group2): slot_of's multiply-high takes 2 g as it is, no shift a tile, and
  // 16 (g - slot units) = 8 (2 g - slot 2 units).
  // (In assembly: the compiler forms a v_med3_i32 only for constant bounds.)
  __device__ u32 clamp_med3(int page) const {
    u32 r;
    asm("v_med3_i32 %0, %1, 0, %2" : "=v"(r) : "v"(page), "s"(last_page));
    return r;
  }
  __device__ u32 slot_of2(u32 g2) const { return u32(u64(g2) * magic >> 32); }
  __device__ u32 row_of2(u32 g2, u32 slot) const { return 8u * (g2 - slot * (2u * units)); }
};

// The copy of one tile, global -> LDS, by `buffer_load_dwordx4 ... lds`: each lane's 16
// bytes go to LDS at M0 + 16 lane, so one wave instruction fills 1 KiB of the tile in lane
// order; lane l of instruction n fills byte 1024 n + 16 l of the tile and fetches the global
// chunk that the layout puts there (the swizzle is applied on the global side).  One group
// of four waves copies a tensor (flash_fwd.hip: group 0 K, group 1 V); instruction n of a
// tile is its wave n % 4's.  Rows past the last key lie past the buffer's range (its
// num_records ends at the last key's last byte) and land as zeros.  The buffer's base moves
// with the tile, so its 32-bit offsets span one tile only (kBlockN stride_s 2 < 2^32).
//
// kPaged: the keys come from a paged cache (PageMap): key t of the sequence is row
// t % page_size of page table[t / page_size].  Pages hold whole 16-row groups (page sizes are
// multiples of 16) and an instruction's KiB lies in one 16-row group of the tile (a group is
// 16 rows x 2 kWidth bytes: 2, 4, 6 or 8 KiB), so each instruction's buffer is based at its
// group's first row in that group's page, and a lane's offset is that of its row within the
// group (row % 16: the same for instructions n and n + kPeriod, as the unpaged offsets are).
// The instructions' buffers are computed lane-parallel, lane n for instruction n (VALU), and
// read out with v_readlane; the page-table entries they need were loaded one tile ahead (one
// global_load_dword a tile, lane n's entry, waited for with the copies).  Cost a tile, each
// copying wave (d 128: 8 instructions, d 64 and d 256: 4, d 192: 6): about 25 VALU ops (6 of
// them 32-bit multiplies, quarter rate) and 3 v_readlane an instruction, where the unpaged copy
// steps its buffers with SALU ops; one VGPR across the loop.  A copy of SALU ops only, each
// instruction's page by an s_load_dword, took 1.3x the dense tile at d128 (the loads' waits).
//
// The layout enters only KvCopy's constructor (the lane offsets); the rest is CopyCore, a
// function of the row's bytes alone, so where K's and V's rows are as long (d 64) their copies
// are one type and flash_fwd.hip picks one per wave (kSpread).
template <int kRowBytes_, bool kPaged>
struct CopyCore {
  static constexpr int kCopyWaves = kWaves / 2;  // one group of waves copies a tensor
  static constexpr int kRowBytes = kRowBytes_;
  static constexpr int kLoads = kBlockN * kRowBytes / 1024 / kCopyWaves;  // instructions a wave
  static_assert(kBlockN * kRowBytes % (1024 * kCopyWaves) == 0, "a tile is whole KiB per wave");
  static_assert(16 * kRowBytes % 1024 == 0 && kBlockN % 16 == 0, "an instruction lies in one 16-row group");
  // A wave's instructions n and n + 1 are kStepRows rows apart.  Where that is a whole
  // number of rows dividing 16 or a multiple of it (every swizzle repeats within 16 rows),
  // instruction n's lane offsets are those of n % kPeriod with the buffer based
  // (n - n % kPeriod) kStepRows rows further: kPeriod VGPRs instead of kLoads.
  static constexpr int kStepRows = 1024 * kCopyWaves / kRowBytes;
  static constexpr bool kRepeats = 1024 * kCopyWaves % kRowBytes == 0 && (16 % kStepRows == 0 || kStepRows % 16 == 0);
  // kSpread (d 64, where the copy is issued in the step that sets the period): flash_fwd.hip
  // issues a tile's instructions one at a time, spread over that step: the tile's buffers
  // (tile(): unpaged one SALU buffer, paged the lane-parallel ones) with the first, then
  // issue_one(n).  Paged and unpaged alike.
  static constexpr bool kSpread = kDqk <= 64 && kLoads == 4;
  // kOneBuffer (kSpread, unpaged, where registers are to spare): every instruction's lane
  // offsets in VGPRs of their own (kLoads of them), all from the one buffer of the tile
  // (lds_dma16_x4 in the prologue, lds_dma16_lone spread), no SALU op between the loads.
  static constexpr bool kOneBuffer = !kPaged && kSpread;
  static constexpr int kPeriod = kOneBuffer || !kRepeats ? kLoads
                                 : kStepRows >= 16 ? 1 : (16 / kStepRows < kLoads ? 16 / kStepRows : kLoads);

  const u16* src;
  int stride;            // elements between keys
  int wave;              // 0 .. kCopyWaves - 1
  u32 row_bytes;         // kRowBytes (a field: with the constant, tile()'s size became a branch)
  u32 voff[kPeriod];     // byte offset of this lane's chunk from its buffer's first key (KvCopy)

  // LDS byte of instruction n's KiB in the tile at `lds`.
  __device__ u32 lds_of(u32 lds, int n) const { return lds + 1024u * u32(n * kCopyWaves + wave); }

  // Start the copy of keys [n0, n0 + kBlockN) into the tile at LDS byte address `lds`
  // (completes under VM_CNT).  Each instruction's buffer starts at its first row, so that
  // the range check never depends on the scalar offset.  The per-instruction bases and
  // sizes are stepped here from the stride, hidden from the compiler's loop-invariant
  // hoisting: held across the loop they took more SGPRs than there are (spilled to VGPR
  // lanes at 128-key tiles).
  __device__ void issue(u32 lds, int n0, int sk) const {
    int st = stride;
    asm volatile("" : "+s"(st));
    constexpr int kBufferRows = kRepeats ? kPeriod * kStepRows : 0;  // rows between buffers
    const u16* base = src + i64(n0) * st;
    int rows = sk - n0 < kBlockN ? sk - n0 : kBlockN;  // rows of the current buffer that exist
    if constexpr (kOneBuffer) {
      lds_dma16_x4<1024u * kCopyWaves>(tile(n0, sk), voff, lds_of(lds, 0));
      return;
    }
#pragma unroll
    for (int n = 0; n < kLoads; ++n) {
      if (n > 0 && n % kPeriod == 0) {
        base += i64(kBufferRows) * st;
        rows -= kBufferRows;
      }
      const u32 bytes = rows > 0 ? u32(rows - 1) * u32(st) * 2u + u32(kRowBytes) : 0u;  // none: zeros
      lds_dma16(raw_buffer(base, bytes), voff[n % kPeriod], lds_of(lds, n));
    }
  }

  // kOneBuffer: the one buffer of the tile of keys [n0, n0 + kBlockN): from key n0, rows at or
  // past sk past its range (zeros; none at all where n0 >= sk).
  __device__ u32x4 tile(int n0, int sk) const {
    int st = stride;
    asm volatile("" : "+s"(st));  // (not hoisted out of the loop: SGPRs)
    const int rows = sk - n0 < kBlockN ? sk - n0 : kBlockN;
    const u32 bytes = rows > 0 ? u32(rows - 1) * u32(st) * 2u + row_bytes : 0u;
    return raw_buffer(src + i64(n0) * st, bytes);
  }
  // Instruction n of that copy on its own, into the LDS tile at byte `lds`.
  __device__ void issue_one(u32x4 rsrc, int n, u32 lds) const { lds_dma16_lone(rsrc, voff[n], lds_of(lds, n)); }

  // Paged (kPaged; `pages`: the sequence's PageMap): lane n's 16-row group, that of
  // instruction n of the tile from key n0 (lanes past kLoads: the last instruction's), or the
  // last group with keys where it starts past sk (whose page is one of the table's row, never
  // past it: sk <= max_pages page_size).  `raw`: the group as it is, unclamped.
  __device__ u32 lane_group(int n0, int sk, int lane, u32& raw) const {
    const int n = lane < kLoads ? lane : kLoads - 1;
    raw = (u32(n0) >> 4) + u32(1024 * (n * kCopyWaves + wave) / kRowBytes) / 16u;
    const u32 last = u32(sk - 1) >> 4;  // sk >= 1: a tile is copied only below sk
    return raw < last ? raw : last;
  }
  // lane_group's group doubled, 2 g (PageMap::slot_of2): 2 raw = n0 / 8 + twice the group's
  // place in the tile (n0 is a multiple of kBlockN), clamped to 2 last.
  __device__ u32 lane_group2(int n0, int sk, int lane) const {
    const int n = lane < kLoads ? lane : kLoads - 1;
    const u32 raw2 = (u32(n0) >> 3) + 2u * (u32(1024 * (n * kCopyWaves + wave) / kRowBytes) / 16u);
    const u32 last2 = 2u * (u32(sk - 1) >> 4);
    return raw2 < last2 ? raw2 : last2;
  }
  // The bytes between a page's first row and 16-row group g's (`slot`: the group's slot,
  // pages.slot_of(g)), as tile() wants them; the caller computes them a tile ahead, with
  // the slot whose entry it loads.  A row's offset in its page (< 256 rows) times the stride is
  // taken to fit 32 bits, as a tile's is above.
  __device__ u32 row_offset(u32 g, u32 slot, const PageMap& pages) const {
    return pages.row_of(g, slot) * (2u * u32(stride));
  }
  // Lane n: instruction n's buffer, its base (low word, high word) and size.
  struct PagedTile {
    u32 lo, hi, bytes;
  };
  // The buffers of the copy of keys [n0, n0 + kBlockN), `entry` lane n's page-table entry for
  // instruction n and `row_off` the byte offset of its first row in that page (row_offset; the
  // caller loads the entries a tile ahead: pages.table[slot]).  Instruction n's buffer: from its
  // group's first row in its page (the page clamped to the cache), over the group's rows that
  // exist (rows x stride bytes: no lane reads past its own row's kWidth; none: zeros).
  // `page_stride`: elements between two pages of the tensor (its stride_b).
  // kRowGiven = false: `row_off` is ignored and computed here (above d 64; at d 256 a VGPR held
  // for it from the load spilled).  kRowGiven (d 64, where this is in the step that sets the
  // period): the page's offset one 32 x 32 -> 64-bit multiply-add (v_mad_u64_u32) onto the
  // base, not two (the runtime refuses page strides of 4 GiB or more: plan.PAGE_STRIDE_LIMIT),
  // the size a 24-bit multiply (rows <= 16; row strides of 16 MiB or more refused:
  // plan.PAGE_ROW_STRIDE_LIMIT), no mask of the high word (the page is clamped to the cache,
  // whose addresses are below 2^48), and both clamps (the page, the rows) one v_med3_i32 each.
  // Above d 64 the code of before (the copy hides under the matrix step there).
  template <bool kRowGiven = true>
  __device__ PagedTile tile(int n0, int sk, int entry, u32 row_off, const PageMap& pages, i64 page_stride,
                            int lane) const {
    u32 raw;
    const u32 g = lane_group(n0, sk, lane, raw);
    const u32 row_step = 2u * u32(stride);  // bytes from a row of a page to the next
    if constexpr (kRowGiven) {
      const int have = sk - int(16u * raw);  // the group's rows below sk, clamped to [0, 16]: one v_med3_i32
      const u32 rows = u32(have < 0 ? 0 : have > 16 ? 16 : have);
      const u64 at = (reinterpret_cast<u64>(src) + row_off) + u64(pages.clamp_med3(entry)) * u64(u32(2 * page_stride));
      return {u32(at), u32(at >> 32), mul_u24(row_step, rows)};
    } else {
      int left = sk - int(16u * raw) < 16 ? sk - int(16u * raw) : 16;
      asm("" : "+v"(left));  // (two steps, as first written for an emulator without v_med3_i32)
      const u32 rows = u32(left < 0 ? 0 : left);  // 0 .. 16
      const u64 at = reinterpret_cast<u64>(src) + u64(pages.clamp(entry)) * (2ull * u64(page_stride)) +
                     pages.row_of(g, pages.slot_of(g)) * row_step;
      return {u32(at), u32(at >> 32) & 0xffffu, rows * row_step};
    }
  }
  // Instruction n's buffer, read out of lane n (v_readlane).
  __device__ static u32x4 lane_buffer(const PagedTile& b, int n) {
    return u32x4{u32(__builtin_amdgcn_readlane(b.lo, n)), u32(__builtin_amdgcn_readlane(b.hi, n)),
                 u32(__builtin_amdgcn_readlane(b.bytes, n)), 0x00020000u};
  }
  // Instruction n of a paged copy on its own (kSpread): its buffer read out, then the load
  // (lds_dma16_lone's wait states cover the v_readlane's SGPR writes).
  __device__ void issue_one(const PagedTile& b, int n, u32 lds) const {
    lds_dma16_lone(lane_buffer(b, n), voff[n % kPeriod], lds_of(lds, n));
  }
  // The whole paged copy of a tile at once (tile(), then every instruction).
  template <bool kRowGiven = true>
  __device__ void issue_paged(u32 lds, int n0, int sk, int entry, u32 row_off, const PageMap& pages,
                              i64 page_stride, int lane) const {
    const PagedTile b = tile<kRowGiven>(n0, sk, entry, row_off, pages, page_stride, lane);
    if constexpr (kPairs) {
      issue_pairs<0>(b.lo, b.hi, b.bytes, lds_of(lds, 0));
    } else {
#pragma unroll
      for (int n = 0; n < kLoads; ++n) {
        // (each instruction's read-outs after the previous instruction: hoisted together, they
        // took 3 kLoads SGPRs at once)
        __builtin_amdgcn_sched_barrier(0);
        lds_dma16(lane_buffer(b, n), voff[n % kPeriod], lds_of(lds, n));
      }
    }
  }
  // Instructions in pairs (lds_dma16_pair) at d 64, where the copy is in the step that sets the
  // period (d 128: the paged launch 0.2 % slower with them); the loop's copy is spread there
  // (kSpread), the prologue's goes out in pairs.
  static constexpr bool kPairs = kDqk <= 64 && kLoads % 2 == 0;

  // Instructions n and n + 1 of a tile, then the pairs after them.
  template <int n>
  __device__ void issue_pairs(u32 lo, u32 hi, u32 bytes, u32 base) const {
    lds_dma16_pair<n, 1024u * n * kCopyWaves, 1024u * (n + 1) * kCopyWaves>(lo, hi, bytes, voff[n % kPeriod],
                                                                            voff[(n + 1) % kPeriod], base);
    if constexpr (n + 2 < kLoads) issue_pairs<n + 2>(lo, hi, bytes, base);
  }
};

// A tensor's copy: CopyCore with this lane's offsets in the tensor's layout.
template <class Layout, bool kPaged = false>
struct KvCopy : CopyCore<2 * Layout::kWidth, kPaged> {
  using Core = CopyCore<2 * Layout::kWidth, kPaged>;
  __device__ KvCopy(const u16* src_, int stride_, int wave_, int lane)
      : Core{src_, stride_, wave_, u32(Core::kRowBytes), {}} {
#pragma unroll
    for (int n = 0; n < Core::kPeriod; ++n) {
      u32 pos = 1024u * u32(n * Core::kCopyWaves + wave_) + 16u * u32(lane);  // byte in the LDS tile
      asm("" : "+v"(pos));  // range unknown to the compiler: 32-bit math (no 16-bit VALU ops)
      const u32 r = pos / Core::kRowBytes, slot = pos % Core::kRowBytes / 16u;
      this->voff[n] = (kPaged ? r & 15u : r) * u32(stride_) * 2u + 16u * (slot ^ u32(Layout::swizzle(int(r))));
    }
  }
  // The copy without its layout (kSpread: K's and V's of one type, flash_fwd.hip picks one per
  // wave), built field by field (as a slice, a few SALU ops of the unpaged d64 loop moved).
  __device__ Core core() const {
    Core c{this->src, this->stride, this->wave, this->row_bytes, {}};
#pragma unroll
    for (int n = 0; n < Core::kPeriod; ++n) c.voff[n] = this->voff[n];
    return c;
  }
};

// Q^T, the B operand of S^T = K Q^T, in registers for the whole loop: lane (i, g) holds
// query `row`, d = 16 st + 8 g + t in item t of qf[st] (zeros where row < 0).
__device__ inline void load_q(bf16x8 (&qf)[kQkSteps], const u16* q, int row, i64 stride, int g) {
  const u16* src = q + (row >= 0 ? row : 0) * stride + 8 * g;
#pragma unroll
  for (int st = 0; st < kQkSteps; ++st) {
    u32x4 bits = {0, 0, 0, 0};
    if (row >= 0) __builtin_memcpy(&bits, src + 16 * st, sizeof(bits));
    qf[st] = __builtin_bit_cast(bf16x8, bits);
  }
}

// The matrix step's LDS reads and MFMAs, the reads kDepth operands ahead: read(x) for
// x < kDepth first, then MFMA x follows the issue of read x + kDepth, so an MFMA never
// waits for the LDS latency of its own operand (64+ cycles against the 32 it runs), also
// across the seam between PV and QK.  Operands 0 .. N1-1 take R1 LDS instructions each,
// N1 .. N1+N2-1 R2 each; every operand is 16 bytes.  Registers: kDepth operands in flight.
// d 64: 3, not 4 (its registers allow 4): the four matrix waves' first reads go to the CU's one
// LDS in a burst at the step's start, and the last wave to get it starts its MFMAs that much
// later (2,804 cycles a tile against 2,879; 2: 2,937, the MFMAs wait on LDS latency).
// d 256: 3 (2 before its reads took one address register: kXorReads; at 2 each MFMA waited
// for the read issued after the MFMA two before it, about 78 cycles of LDS latency a pair),
// except in the paged loop, whose page state leaves room for 2 only (3 spilled there).
constexpr int kDepth = kDqk > 128 ? 3 : kDqk > 64 ? 4 : 3;
constexpr int kDepthPaged = kDqk > 192 ? 2 : kDepth;

// kPrimed: `buf` holds operands 0 .. kDepth-1 already, read before the step (pv_ahead below).
// (The functions below take the depth as a template parameter of the same name: the paged
// loop's is kDepthPaged.)
template <int D>
using OperandsOf = u32x4[D];

template <int N1, int R1, int N2, int R2, bool kPrimed = false, int kDepth, class Read, class Use>
__device__ inline void pipelined(OperandsOf<kDepth>& buf, Read read, Use use) {
  constexpr int N = N1 + N2;
  if constexpr (!kPrimed) {
#pragma unroll
    for (int x = 0; x < kDepth && x < N; ++x) buf[x] = read(x);
  }
#pragma unroll
  for (int x = 0; x < N; ++x) {
    const u32x4 cur = buf[x % kDepth];
    if (x + kDepth < N) buf[x % kDepth] = read(x + kDepth);
    use(x, cur);
  }
  // Pin that order (the scheduler would otherwise pull each read down to its MFMA): the
  // first kDepth operands' reads (unless primed), then MFMA x and the reads of operand
  // x + kDepth.
  constexpr int kDsRead = 0x100, kMfma = 0x008;
  constexpr int kAhead = kDepth < N ? kDepth : N, kAhead1 = kAhead < N1 ? kAhead : N1;
  if constexpr (!kPrimed) __builtin_amdgcn_sched_group_barrier(kDsRead, R1 * kAhead1 + R2 * (kAhead - kAhead1), 0);
#pragma unroll
  for (int x = 0; x < N; ++x) {
    __builtin_amdgcn_sched_group_barrier(kMfma, 1, 0);
    if (x + kDepth < N1) __builtin_amdgcn_sched_group_barrier(kDsRead, R1, 0);
    else if (x + kDepth < N) __builtin_amdgcn_sched_group_barrier(kDsRead, R2, 0);
  }
}

// At d 256, O^T and Q^T take 192 of a wave's 256 registers: there the stages' lane bases
// (kXorReads) are made anew each tile (a few VALU ops beside 32 MFMAs) instead of being kept
// in registers for the whole loop.
__device__ inline int lane_for_addresses(int lane) {
  if constexpr (kDqk > 192) asm volatile("" : "+v"(lane));
  return lane;
}

// d 256 (kXorReads): a matrix step's read addresses are one lane base a stage and a constant
// XOR a read (plus the read's immediate offset), not a register per distinct address.  Both
// swizzles XOR a lane's row bits into chunk-index bits that no other part of the address
// touches (K: bits 5-7 of the byte address, V: bits 6-7; the tile's base is a multiple of
// 16 KiB, a row 512 bytes), so the address of chunk c ^ swizzle is (base with c = 0) ^ 16 c'
// for the chunk bits c' the XOR covers, the rest an immediate.  Operands that share a XOR are
// taken one after the other (QK: st and st + 8, 256 bytes apart; PV: the four (ps, dt) of one
// dt % 4), so one VALU op serves them: a stage holds its base and one address where the
// step held twelve addresses, each made by a few VALU ops at its start.
constexpr bool kXorReads = kDqk > 192;
static_assert(!kXorReads || (kKeySubs == 1 && kQkSteps == 16 && KLayout::kSpan == 16 && kDvTiles == 8 &&
                             kPvSteps == 2 && VLayout::kSpan == 16 && kDv == 256),
              "the XOR reads are d 256's: one 32-key subtile, 512-byte rows, swizzles on 16 chunks");

// The LDS byte address of a generic pointer into LDS, and an LDS pointer from one.
__device__ inline u32 lds_byte(const u16* p) {
  return u32(reinterpret_cast<unsigned long long>((const ZYFA_LDS u16*)p));
}
template <class T>
__device__ inline const ZYFA_LDS T* lds_ptr(u32 a) { return __builtin_bit_cast(const ZYFA_LDS T*, a); }

// S^T = K . Q^T, operand x = (n, st) = (x / kQkSteps, x % kQkSteps) (kXorReads: n = 0 and
// st = 0, 8, 1, 9, ..: st and st + 8 share a XOR): s[n] holds keys 32n + 8j + 4g + r
// (float 4j + r) of this lane's query.  A: lane (i, g) reads key 32n + i, chunk 2 st + g
// (d = 16 st + 8 g ..): one ds_read_b128.
struct QkStage {
  static constexpr int kOperands = kKeySubs * kQkSteps, kReads = 1;
  const u16* kt;
  int i, g;
  u32 base;  // (kXorReads) this lane's byte address of chunk g ^ swizzle of its row (st 0)
  __device__ QkStage(const u16* kt_, int lane) : kt(kt_), i(lane & 31), g(lane >> 5) {
    if constexpr (kXorReads) base = lds_byte(kt) + u32(2 * kDqk * i + 16 * (g ^ KLayout::swizzle(i)));
  }
  __device__ static constexpr int step(int x) {
    return kXorReads ? 8 * (x % 2) + x / 2 % 8 + 16 * (x / 16) : x % kQkSteps;
  }
  __device__ u32x4 read(int x) const {
    if constexpr (kXorReads) {
      const int st = step(x);  // chunk 2 st + g: bits 1-3 of 2 st under the XOR, bit 4 an offset
      return *lds_ptr<u32x4>((base ^ u32(32 * (st % 8))) + u32(256 * (st / 8)));
    }
    constexpr int kSpan = KLayout::kSpan;
    const int n = x / kQkSteps, st = x % kQkSteps, r = 32 * n + i, c = 2 * st;  // chunk c + g
    const u16* src = kt + r * kDqk + 8 * slot<KLayout>(c / kSpan * kSpan, (c % kSpan) | g, KLayout::swizzle(r));
    return *reinterpret_cast<const u32x4*>(src);
  }
  __device__ static void mfma(f32x16 (&s)[kKeySubs], const bf16x8 (&qf)[kQkSteps], int x, u32x4 kf) {
    const int n = x / kQkSteps, st = step(x);
    s[n] = __builtin_amdgcn_mfma_f32_32x32x16_bf16(__builtin_bit_cast(bf16x8, kf), qf[st],
                                                   x % kQkSteps == 0 ? f32x16{} : s[n], 0, 0, 0);
  }
};

// 4 keys x 1 dv of V^T by ds_read_b64_tr_b16 (ISA 11.4): in each 16-lane group, lane d
// receives as item e the element (d % 4) of the 8 bytes lane 4e + d / 4 addressed.  Lane
// s of the group addresses V[key0 + s / 4][dv0 + 4 (s % 4) ..+3], so lane d gets
// V[key0 + e][dv0 + d], e = 0..3: one A-operand row (dv) with 4 consecutive keys.
__device__ inline i16x4 read_vt4(const u16* vt, int key, int dv) {
  constexpr int kSpan = VLayout::kSpan;
  const int c = dv >> 3;
  const u16* src = vt + key * kDv + 8 * slot<VLayout>(c / kSpan * kSpan, c % kSpan, VLayout::swizzle(key)) + (dv & 7);
  return __builtin_amdgcn_ds_read_tr16_b64_v4i16((ZYFA_LDS i16x4*)(src));
}

// O^T += V^T . P^T, operand x = (ps, dt) = (x / kDvTiles, x % kDvTiles) over the tile's
// 16-key steps (kXorReads: the four of dt % 4 = x / 4 together, ps = x / 2 % 2, dt / 4 = x % 2).
// A: lane (i, g) of 16-lane group G = lane / 16 holds dv 32 dt + i
// (i = 16 (G % 2) + lane % 16) and keys 16 ps + 4 g + {0..3} (items 0-3),
// 16 ps + 8 + 4 g + {0..3} (items 4-7): P^T's key map.  Two ds_read_b64_tr_b16.
struct PvStage {
  static constexpr int kOperands = kPvSteps * kDvTiles, kReads = 2;
  const u16* vt;
  int g, sl, half;
  u32 base;  // (kXorReads) this lane's byte address of its 8 bytes at (ps, dt) = (0, 0)
  __device__ PvStage(const u16* vt_, int lane) : vt(vt_), g(lane >> 5), sl(lane & 15), half((lane >> 4) & 1) {
    if constexpr (kXorReads) {
      const int key = 4 * g + sl / 4, dv = 16 * half + 4 * (sl % 4);  // chunk dv / 8 < 4: under no XOR
      base = lds_byte(vt) + u32(2 * kDv * key + 16 * ((dv >> 3) ^ VLayout::swizzle(key)) + 2 * (dv & 7));
    }
  }
  // (kXorReads) The stage of a base made before (pv_ahead's, held across the barrier).
  __device__ PvStage(u32 base_) : vt(nullptr), g(0), sl(0), half(0), base(base_) {}
  __device__ static constexpr int ps_of(int x) { return kXorReads ? x / 2 % 2 : x / kDvTiles; }
  __device__ static constexpr int dt_of(int x) { return kXorReads ? x / 4 + 4 * (x % 2) : x % kDvTiles; }
  __device__ u32x4 read(int x) const {
    const int ps = ps_of(x), dt = dt_of(x);
    if constexpr (kXorReads) {
      // dv 32 dt ..: chunk 4 dt + .., bits 2-3 (dt % 4) under the XOR, dt / 4 an offset of 256
      const u32 a = (base ^ u32(64 * (dt % 4))) + u32(2 * kDv * 16 * ps + 256 * (dt / 4));
      const i16x4 lo = __builtin_amdgcn_ds_read_tr16_b64_v4i16((ZYFA_LDS i16x4*)lds_ptr<i16x4>(a));
      const i16x4 hi = __builtin_amdgcn_ds_read_tr16_b64_v4i16((ZYFA_LDS i16x4*)lds_ptr<i16x4>(a + 2 * kDv * 8));
      return __builtin_bit_cast(u32x4, __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7));
    }
    const int key = 16 * ps + 4 * g + sl / 4, dv = 32 * dt + 16 * half + 4 * (sl % 4);
    return __builtin_bit_cast(u32x4, __builtin_shufflevector(read_vt4(vt, key, dv), read_vt4(vt, key + 8, dv),
                                                             0, 1, 2, 3, 4, 5, 6, 7));
  }
  __device__ static void mfma(f32x16 (&oacc)[kDvTiles], const bf16x8 (&pf)[kPvSteps], int x, u32x4 vf) {
    const int ps = ps_of(x), dt = dt_of(x);
    oacc[dt] = __builtin_amdgcn_mfma_f32_32x32x16_bf16(__builtin_bit_cast(bf16x8, vf), pf[ps], oacc[dt], 0, 0, 0);
  }
};

// The matrix step M(t) as one pipeline: O^T += V(t-1)^T P^T(t-1), then S^T(t) = K(t) Q^T
// (QK's first reads issue under PV's last MFMAs).  One code path only: a second,
// differently pipelined one in the same loop costs more registers than the 256 a wave has.
// kAhead (d 192 and 256, whose matrix step is the longer one): its first kDepth operands
// (V(t-1)'s) are read at the end of the softmax step before it (pv_ahead, into `ahead`), where
// the wave has time to spare and these registers are free; the step then starts with its first
// MFMA instead of its address arithmetic and a read's latency.  (d 128: the registers held
// across the barrier spilled; d 64: the softmax step, the longer one there, got longer.)
constexpr bool kAhead = kDqk > 128;

// Returns (kXorReads) the V stage's lane base, which pv_qk_step (kHeldBase) then takes instead
// of making it again: one VGPR across the barrier, where the base's dozen VALU ops at the
// matrix step's start held its first MFMA (the plain loop's only: flash_fwd.hip).
template <int kDepth>
__device__ inline u32 pv_ahead(OperandsOf<kDepth>& ahead, const u16* vt, int lane) {
  static_assert(kDepth <= PvStage::kOperands, "the operands read ahead are PV's");
  lane = lane_for_addresses(lane);
  const PvStage v(vt, lane);
#pragma unroll
  for (int x = 0; x < kDepth; ++x) ahead[x] = v.read(x);
  if constexpr (kXorReads) return v.base;
  else return 0;
}
template <int kDepth, bool kHeldBase = false>
__device__ inline void pv_qk_step(f32x16 (&oacc)[kDvTiles], const u16* vt, const bf16x8 (&pf)[kPvSteps],
                                  f32x16 (&s)[kKeySubs], const u16* kt, const bf16x8 (&qf)[kQkSteps], int lane,
                                  OperandsOf<kDepth>& ahead, u32 vbase) {
  lane = lane_for_addresses(lane);
  const PvStage v = kHeldBase ? PvStage(vbase) : PvStage(vt, lane);
  const QkStage k(kt, lane);
  constexpr int NP = PvStage::kOperands, NQ = QkStage::kOperands;
  pipelined<NP, PvStage::kReads, NQ, QkStage::kReads, kAhead>(
      ahead, [&](int x) { return x < NP ? v.read(x) : k.read(x - NP); },
      [&](int x, u32x4 a) {
        if (x < NP) PvStage::mfma(oacc, pf, x, a);
        else QkStage::mfma(s, qf, x - NP, a);
      });
}

// M(0): S^T(0) = K(0) Q^T alone.
template <int kDepth = detail::kDepth>
__device__ inline void qk_step(f32x16 (&s)[kKeySubs], const u16* kt, const bf16x8 (&qf)[kQkSteps], int lane) {
  lane = lane_for_addresses(lane);
  const QkStage k(kt, lane);
  OperandsOf<kDepth> buf;
  pipelined<QkStage::kOperands, QkStage::kReads, 0, 1>(buf, [&](int x) { return k.read(x); },
                                                       [&](int x, u32x4 a) { QkStage::mfma(s, qf, x, a); });
}

// O (bf16) of this lane's query: dv 32 dt + 8 j + 4 g + {0..3} from oacc[dt][4j ..4j+3].
__device__ inline void store_o(u16* dst, const f32x16 (&oacc)[kDvTiles], float inv, int g) {
#pragma unroll
  for (int dt = 0; dt < kDvTiles; ++dt) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const f32x2 a = f32x2{oacc[dt][4 * j], oacc[dt][4 * j + 1]} * inv;
      const f32x2 c = f32x2{oacc[dt][4 * j + 2], oacc[dt][4 * j + 3]} * inv;
      const u32x2 val = {pack_bf16x2(a.x, a.y), pack_bf16x2(c.x, c.y)};
      __builtin_memcpy(dst + 32 * dt + 8 * j + 4 * g, &val, sizeof(val));
    }
  }
}

}  // namespace detail
}  // namespace zyfa
