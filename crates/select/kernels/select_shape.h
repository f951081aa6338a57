// The select stage's shape (-D defines and what follows from them), keys and prefixes, the
// slicing, the descent's state and the CTA's shared memory, the trace marks, block scans, and
// the key sources the passes read. Part of select.h (which says how the stage works).
#pragma once
#include "prelude.h"
#include "mailbox.h"

// ---- shape (src/layout.rs; set by the host, src/gpu.rs source) ----------------------------------
// No defaults: a build the host did not shape is an error, not a guess that drifts from layout.rs.
// SEL_K: k. SEL_ROOM_PER_K: the candidate room per k. MONO_CTA_THREADS: the CTA (every select task
// takes the whole CTA). SEL_SLICE_KEYS: keys a slice (or the one CTA, before it streams) keeps in
// LDS, a multiple of 4. SEL_MAX_SLICES, SEL_SLICE_ALIGN: the slicing (layout.rs Slices).
// SEL_PAGE_TOKENS: the cache's page. SEL_LDS_BYTES: the dynamic shared memory a select task may use.
#if !defined(SEL_K) || !defined(SEL_ROOM_PER_K) || !defined(MONO_CTA_THREADS) || !defined(SEL_SLICE_KEYS) || \
    !defined(SEL_MAX_SLICES) || !defined(SEL_SLICE_ALIGN) || !defined(SEL_PAGE_TOKENS) || !defined(SEL_LDS_BYTES)
#error "select's shape is set by the host (src/gpu.rs source): SEL_K, SEL_ROOM_PER_K, MONO_CTA_THREADS, SEL_SLICE_KEYS, SEL_MAX_SLICES, SEL_SLICE_ALIGN, SEL_PAGE_TOKENS, SEL_LDS_BYTES"
#endif
#define SEL_BLOCK MONO_CTA_THREADS
// Polls a thread issues before it looks at the first (rounds, candidates); 8 x 512 threads
// cover the 2 x SEL_ROOM boxes of the candidate pairs in one batch.
#define SEL_POLL_BATCH 8

// Test faults, one define (tests only; 0 in every production build): SEL_FAULT_SKIP_WAIT, a task
// reads its scores without waiting on its input boxes (the hand-off's negative control).
#ifndef SEL_FAULT
#define SEL_FAULT 0
#endif
#define SEL_FAULT_SKIP_WAIT 1

#define SEL_ROOM (SEL_ROOM_PER_K * SEL_K)
// Candidate arrays are read 4 keys at a time.
#define SEL_ROOM4 ((SEL_ROOM + 3) / 4 * 4)
#define SEL_BINS 64
#define SEL_HIST_BOXES 32
#define SEL_ROUNDS 6
#define SEL_WAVES (SEL_BLOCK / MONO_WAVE)
// Keys one pass of the block covers: 4 consecutive keys per thread.
#define SEL_GROUP (4 * SEL_BLOCK)
#define SEL_NONE 0xffffffffu
// Wide digits (shared-memory atomic histograms). The one CTA counts the top SEL_FIRST_BITS of
// every key into SEL_FIRST_COPIES copies of each bin (lane l adds to copy l % copies: the top
// bits of real scores fall in a few bins, and lanes adding to one word queue), then two
// SEL_WIDE_BITS digits over the keys sharing the prefix (8 + 12 + 12 = 32); the top
// SEL_GROUP_BITS of each 12-bit digit decide P = 12 and P = 24. Passes over the multi-slice
// candidates take at most 10 bits.
#define SEL_FIRST_BITS 8
#define SEL_FIRST_BINS (1u << SEL_FIRST_BITS)
#define SEL_FIRST_COPIES 16u
#define SEL_WIDE_BITS 12
#define SEL_WIDE_BINS (1u << SEL_WIDE_BITS)
#define SEL_GROUP_BITS 4
// Bins a thread owns when it chooses a wide digit (the most: 12 bits), and threads per group
// of 1 << (SEL_WIDE_BITS - SEL_GROUP_BITS) bins sharing their top SEL_GROUP_BITS.
#define SEL_WIDE_PER ((SEL_WIDE_BINS + SEL_BLOCK - 1) / SEL_BLOCK)
#define SEL_GROUP_THREADS ((1u << (SEL_WIDE_BITS - SEL_GROUP_BITS)) / SEL_WIDE_PER)
#define SEL_TAIL_BINS 1024u
// Loads a thread issues before it uses the first: LDS loads of the counting passes, global loads
// of a slice's load (which converts as it goes), and the one CTA's bare copy of its row.
#define SEL_LOAD_BATCH 4
#define SEL_COPY_BATCH 8
// The placement pass gives each thread a run of consecutive keys, one bit each in a u64 mask.
#define SEL_PLACE_RUN 64
// Dynamic LDS of a select task: the keys (slice, or the one CTA's row), then either the candidate
// positions and keys (descent by rounds) or the one CTA's histogram (SEL_WIDE_BINS words, which
// also hold the first pass's SEL_FIRST_BINS x SEL_FIRST_COPIES).
#define SEL_CAND_WORDS (2 * SEL_ROOM4 > SEL_WIDE_BINS ? 2 * SEL_ROOM4 : SEL_WIDE_BINS)
#define SEL_LDS_WORDS (SEL_SLICE_KEYS + SEL_CAND_WORDS)

// 1: the traced CTA (the one CTA of row 0, or the first slice of row 0) stamps mono_clock_cycles
// at its phase boundaries into the trace buffer (src/gpu.rs PHASES): word 2i the phase, 2i + 1
// its SM's cycle count, up to SEL_TRACE_MARKS marks. Thread 0 stamps, after the barrier that ends
// a phase. SM cycles, not mono_timer_ns: %globaltimer ticks about 1 us on the H200, as long as a
// phase; the stamps all come from one CTA, so the SM's own counter compares them.
#ifndef SEL_TRACE
#define SEL_TRACE 0
#endif
#define SEL_TRACE_MARKS 32
#define SEL_PH_START 0    // the task began
#define SEL_PH_LOADED 1   // keys in LDS (one CTA: and their top 8 bits counted)
#define SEL_PH_ROUND 2    // a 6-bit round (gathered, or alone when streaming)
#define SEL_PH_ABOVE 3    // the keys above P placed, and those sharing P staged (one pass)
#define SEL_PH_CANDS 4    // every slice's candidates received
#define SEL_PH_WIDE 5     // a wide digit chosen
#define SEL_PH_PLACED 6   // the list written (this thread's part)
#define SEL_PH_SCANNED 7  // the list's entries counted and scanned (registers kernel)
#define SEL_PH_COUNTED 8  // a fast round's keys counted (before its exchange)
#define SEL_PH_GATHERED 9 // a fast round's boxes from every slice of the row received
#define SEL_PH_SUMMED 10  // a fast round's counts summed over the slices (wave 0)
#define SEL_PH_DECIDED 11 // a fast round's digit chosen (wave 0, before the block hears of it)
#define SEL_PH_RANKED 12  // T found by the ranks of the keys sharing its 20-bit prefix (registers kernel)

// Per-row error words (flags[row * SEL_FLAGS + i], zeroed by the host).
#define SEL_FLAGS 4
#define SEL_FLAG_NAN 0        // a key is NaN
#define SEL_FLAG_LOST 1       // the histograms counted fewer keys than the rank sought (a bug)
#define SEL_FLAG_STALLED 2    // a bounded wait gave up (MBX_DEBUG builds)
#define SEL_FLAG_SHAPE 3      // a slice empty or longer than SEL_SLICE_KEYS (the launch was sized wrong)

static_assert(SEL_BLOCK % MONO_WAVE == 0 && SEL_BLOCK % SEL_BINS == 0, "block of whole waves and bin groups");
static_assert(SEL_WAVES <= MONO_WAVE, "one wave scans the wave totals");
static_assert(SEL_SLICE_KEYS % 4 == 0, "slices are read 4 keys at a time");
static_assert(SEL_BINS % MONO_WAVE == 0 || MONO_WAVE == 64, "a lane counts whole bins");
static_assert(SEL_HIST_BOXES <= MONO_WAVE && SEL_BLOCK % SEL_HIST_BOXES == 0, "a lane of wave 0 owns a box word");
static_assert(SEL_SLICE_KEYS <= SEL_PLACE_RUN * SEL_BLOCK && SEL_ROOM4 <= SEL_PLACE_RUN * SEL_BLOCK,
              "a thread places at most SEL_PLACE_RUN keys");
static_assert(SEL_K < 1u << 16, "the placement packs two counts below k in one word");
static_assert(SEL_FIRST_BINS * SEL_FIRST_COPIES == SEL_WIDE_BINS, "the first pass's copies fill the wide histogram");
static_assert(SEL_WIDE_BINS % SEL_BLOCK == 0 && SEL_GROUP_THREADS >= 1 && SEL_GROUP_THREADS <= MONO_WAVE &&
                  (SEL_GROUP_THREADS & (SEL_GROUP_THREADS - 1)) == 0,
              "a group of 12-bit bins is a power-of-two run of lanes within a wave");
static_assert(MONO_WAVE % SEL_FIRST_COPIES == 0, "lane l adds to copy l % SEL_FIRST_COPIES");
static_assert(SEL_FIRST_BITS + SEL_GROUP_BITS == 12 && SEL_FIRST_BITS + SEL_WIDE_BITS + SEL_GROUP_BITS == 24 &&
                  SEL_FIRST_BITS + 2 * SEL_WIDE_BITS == 32,
              "the one CTA's digits meet the stops 12 and 24 and end at 32 bits");

// ---- keys and prefixes (src/reference.rs radix_key) ----------------------------------------------
// Negative: all bits flipped; otherwise the sign bit set. Written as one xor with the sign spread
// (2 instructions, not a select of 3: the registers kernel runs it on every key).
MONO_DEV u32 sel_radix_key(u32 bits) { return bits ^ ((u32)((i32)bits >> 31) | 0x80000000u); }
MONO_DEV bool sel_is_nan(u32 bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }
// -inf is a masked score (src/reference.rs): never selected. Its key is the smallest of any
// non-NaN score, so a row's masked keys are all ties, at T only when fewer than k keys are
// unmasked, and their entries are then -1.
#define SEL_MASKED_BITS 0xff800000u
#define SEL_MASKED_KEY 0x007fffffu
MONO_DEV u32 sel_mask(u32 len) { return len == 0 ? 0u : 0xffffffffu << (32u - len); }
// The key has the prefix bits whose unknown bits are low (~sel_mask(len)): a subtract and one
// unsigned compare, where (key & mask) == bits takes a mask, a compare and a select in the loops.
MONO_DEV bool sel_shares(u32 key, u32 bits, u32 low) { return key - bits <= low; }
// Digits of the rounds, from the top: 6, 6, 6, 6, 6, 2 bits.
MONO_DEV u32 sel_shift(u32 round) { return round < 5 ? 26u - 6u * round : 0u; }
MONO_DEV u32 sel_width(u32 round) { return round < 5 ? 6u : 2u; }

// ---- slicing (src/layout.rs Slices::new) ----------------------------------------------------------
// Keys of every slice but the last, of a row of len keys cut into count slices.
MONO_DEV u32 sel_chunk(u32 len, u32 count) {
  const u32 per = (len + count - 1) / count;
  return (per + SEL_SLICE_ALIGN - 1) / SEL_SLICE_ALIGN * SEL_SLICE_ALIGN;
}

// ---- the state of the descent, in shared memory --------------------------------------------------
struct sel_state {
  u32 bits, len;       // the prefix, in place, and its length
  u32 round;           // rounds done
  u32 rank;            // rank of T among the keys sharing the prefix (1-based)
  u32 above;           // keys of the row above the prefix
  u32 above_before;    // of those, in the slices before this one
  u32 sharing;         // keys of the row sharing the prefix
  u32 sharing_before;  // of those, in the slices before this one
  u32 digit, digit_above;  // this round's choice (SEL_NONE until made)
  // After a 12-bit wide digit: keys of the row sharing, and above, the prefix that ends
  // SEL_WIDE_BITS - SEL_GROUP_BITS bits before it (P = 12 or 24 of the one CTA).
  u32 group_sharing, group_above;
};

// A select task's state in shared memory, at the start of its LDS (the keys and candidates follow,
// sel_lds_words).
struct sel_smem {
  u32 total[SEL_BINS];  // the even round's row sums
  union {
    // Per group of SEL_HIST_BOXES threads, its sums of the words it polled: of word w, the low bin
    // and the high bin over all slices, then over the slices before this one (16 bytes, so that
    // wave 0 reads a group's in one load).
    mono_u32x4 sums[SEL_BLOCK / SEL_HIST_BOXES][SEL_HIST_BOXES];
    // After the rounds (or without them): the candidates' wide digits.
    alignas(16) u32 tail_hist[SEL_TAIL_BINS];
  };
  u32 wtot[2][MONO_WAVE];  // the wave totals of sel_scan1 and sel_scan1x2
  u32 pair_row[SEL_BINS];  // the odd round's counts, kept by the even round
  sel_state st;
#if SEL_TRACE
  u64* trace;  // thread 0 only; nullptr when this CTA is not traced
  u32 marks;
#endif
};
// Where the keys start in a select task's LDS, in words, and what the task takes in all.
#define SEL_SMEM_WORDS ((sizeof(sel_smem) + 15) / 16 * 4)
static_assert(SEL_SMEM_WORDS * 4 + SEL_LDS_WORDS * 4 <= SEL_LDS_BYTES,
              "the host's LDS size (src/layout.rs task_lds_bytes) is too small for the one CTA and the slices");

// Any shared state with the trace fields (sel_smem, the registers kernel's sel_reg_smem).
template <class Smem>
MONO_DEV void sel_mark(Smem& sm, u32 phase) {
#if SEL_TRACE
  if (mono_thread() == 0 && sm.trace && sm.marks < SEL_TRACE_MARKS) {
    sm.trace[2 * sm.marks] = phase;
    sm.trace[2 * sm.marks + 1] = mono_clock_cycles();
    ++sm.marks;
  }
#else
  (void)sm, (void)phase;
#endif
}

template <class Smem>
MONO_DEV void sel_trace_begin(Smem& sm, u64* trace, bool traced) {
#if SEL_TRACE
  if (mono_thread() == 0) sm.trace = traced ? trace : nullptr, sm.marks = 0;
  sel_mark(sm, SEL_PH_START);
#else
  (void)sm, (void)trace, (void)traced;
#endif
}

// ---- block scan ----------------------------------------------------------------------------------
MONO_DEV u32 sel_wave_scan(u32 v) {  // inclusive, lane 0 first
#pragma unroll
  for (u32 d = 1; d < MONO_WAVE; d <<= 1) v = mono_shfl_up_add(v, d);
  return v;
}

// Exclusive prefix of v over the block in thread order, with one barrier: the wave totals go to
// sm.wtot[buf], and every thread adds those of the waves before its own. *total gets the sum.
// Two calls on one buf need a barrier between them (a call on the other buf does not).
MONO_DEV u32 sel_scan1(sel_smem& sm, u32 buf, u32 v, u32* total) {
  const u32 incl = sel_wave_scan(v), w = mono_wave();
  if (mono_lane() == MONO_WAVE - 1) sm.wtot[buf][w] = incl;
  mono_sync_block();
  u32 before = 0, all = 0;
#pragma unroll
  for (u32 i = 0; i < SEL_WAVES; ++i) {
    const u32 x = sm.wtot[buf][i];
    before += i < w ? x : 0u;
    all += x;
  }
  *total = all;
  return before + incl - v;
}

// Two exclusive prefixes with the one barrier of sel_scan1 (both bufs).
MONO_DEV void sel_scan1x2(sel_smem& sm, u32 a, u32 b, u32* before_a, u32* before_b) {
  const u32 ia = sel_wave_scan(a), ib = sel_wave_scan(b), w = mono_wave();
  if (mono_lane() == MONO_WAVE - 1) sm.wtot[0][w] = ia, sm.wtot[1][w] = ib;
  mono_sync_block();
  u32 xa = 0, xb = 0;
#pragma unroll
  for (u32 i = 0; i < SEL_WAVES; ++i) {
    xa += i < w ? sm.wtot[0][i] : 0u;
    xb += i < w ? sm.wtot[1][i] : 0u;
  }
  *before_a = xa + ia - a;
  *before_b = xb + ib - b;
}

// Thread t's run of consecutive keys among the n from `first` (the placement's walk: its marks
// are in position order): keys [start, end), read as quads from a quad that depends on the
// thread, so that the 16-byte reads of neighbouring threads fall in different banks.
struct sel_run {
  u32 start, end, quads, rot;
  MONO_DEV sel_run(u32 first, u32 n) {
    const u32 run = ((n + SEL_BLOCK - 1) / SEL_BLOCK + 3) / 4 * 4;
    start = first + mono_thread() * run;
    end = start + run < first + n ? start + run : first + n;
    quads = run / 4;
    rot = quads ? mono_thread() % quads : 0u;
  }
  // The q-th quad this thread reads, as its offset in quads from start.
  MONO_DEV u32 at(u32 q) const { return q + rot < quads ? q + rot : q + rot - quads; }
  // No key of the run lies past the end: the keys need no bound test.
  MONO_DEV bool whole() const { return start + 4 * quads <= end; }
};

// ---- key sources: 4 consecutive keys per thread and pass -----------------------------------------
// A slice's keys in LDS; positions first + i.
struct sel_lds_keys {
  const u32* keys;
  u32 n, first;
  MONO_DEV void load4(u32 i, u32 (&k)[4]) const {
    const mono_u32x4 v = i < n ? *(const mono_u32x4*)(keys + i) : mono_u32x4{0, 0, 0, 0};
    k[0] = v.x, k[1] = v.y, k[2] = v.z, k[3] = v.w;
  }
  MONO_DEV u32 key(u32 i) const { return keys[i]; }
  MONO_DEV u32 pos(u32 i) const { return first + i; }
};
// A row too long for LDS, read from global memory on every pass (one-CTA select only).
struct sel_row_keys {
  const float* scores;  // the row
  u32 n;
  MONO_DEV void load4(u32 i, u32 (&k)[4]) const {
    const mono_u32x4 v = i < n ? *(const mono_u32x4*)(scores + i) : mono_u32x4{0, 0, 0, 0};
    k[0] = sel_radix_key(v.x), k[1] = sel_radix_key(v.y), k[2] = sel_radix_key(v.z), k[3] = sel_radix_key(v.w);
  }
  MONO_DEV u32 key(u32 i) const { return sel_radix_key(mono_f32_bits(scores[i])); }
  MONO_DEV u32 pos(u32 i) const { return i; }
};
// The candidates in LDS: keys and their positions.
struct sel_cand_keys {
  const u32* keys;
  const u32* positions;
  u32 n;
  MONO_DEV void load4(u32 i, u32 (&k)[4]) const {
    const mono_u32x4 v = i < n ? *(const mono_u32x4*)(keys + i) : mono_u32x4{0, 0, 0, 0};
    k[0] = v.x, k[1] = v.y, k[2] = v.z, k[3] = v.w;
  }
  MONO_DEV u32 key(u32 i) const { return keys[i]; }
  MONO_DEV u32 pos(u32 i) const { return positions[i]; }
};
