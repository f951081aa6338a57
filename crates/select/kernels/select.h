// The select stage's task functions: the exact top-k of a score row, on one CTA or on up to 64
// slices (one CTA each) that all-gather their digit histograms through tagged pairs. The contract
// is src/reference.rs; src/cpu.rs is this file step for step on CPU threads, and src/descent.rs /
// src/layout.rs hold the formulas mirrored here (same names).
//
// Multi-slice (and the one CTA over a row too long for LDS): per round, a slice counts the 6-bit
// digits of its keys that match the prefix found so far (a wave counts 64 keys at once with 7
// ballots, no atomics), publishes the 64 counts as 32 tagged pairs of 16-bit counts, waits for
// every slice of its row, sums them, and picks the digit holding the rank-th key. It stops at 12
// or 24 bits when the keys sharing the prefix fit in the candidate room, else at 32. Then it
// places its keys above the prefix (in position order, after those of the slices before it); at
// 32 bits its ties take their places directly; otherwise it stages its keys sharing the prefix as
// (key, position) pairs, and the row's first slice finds the rest of T with wide digits (two
// 10-bit passes from 12 bits, one 8-bit pass from 24) and places them.
//
// One CTA over a row that fits in LDS: the keys are loaded once, and wide digits counted with
// shared-memory atomics find T: 8 bits over every key (counted while loading, into 16 copies of
// each bin), then 12 + 12 bits over the keys sharing the prefix; the top 4 bits of each 12-bit
// digit give the keys sharing T's 12- and 24-bit prefixes, which decide P. One pass in position
// order places the whole list. These loops run over a whole row on one SM: what they cost is
// instructions per key, so each keeps a key's work to a compare and at most one atomic.
#pragma once
#include "prelude.h"
#include "mailbox.h"

// ---- shape (src/layout.rs) -----------------------------------------------------------------------
#ifndef SEL_K
#define SEL_K 2048
#endif
#ifndef SEL_ROOM_PER_K
#define SEL_ROOM_PER_K 2
#endif
#ifndef SEL_BLOCK
#define SEL_BLOCK 512
#endif
// Keys a slice (or the one CTA, before it streams) keeps in LDS; a multiple of 4.
#ifndef SEL_SLICE_KEYS
#define SEL_SLICE_KEYS 4096
#endif
#ifndef SEL_MIN_SLICE_KEYS
#define SEL_MIN_SLICE_KEYS 1024
#endif
#ifndef SEL_MAX_SLICES
#define SEL_MAX_SLICES 64
#endif
#ifndef SEL_SLICE_ALIGN
#define SEL_SLICE_ALIGN 4
#endif
#ifndef SEL_PAGE_TOKENS
#define SEL_PAGE_TOKENS 64
#endif
// 1: the round of PERF.md (one wave decides the digit from per-thread partial sums, a thread
// issues all its polls before it looks at any: 4 block barriers per gathered round, 2 alone).
// 0: the first round (8 barriers, serial loops over bins and slices, one poll at a time), kept
// so one GPU run can time both. The candidates' poll and the tail are the same in both.
#ifndef SEL_FAST_ROUNDS
#define SEL_FAST_ROUNDS 1
#endif
// Polls a thread issues before it looks at the first (fast rounds, candidates); 8 x 512 threads
// cover the 2 x SEL_ROOM boxes of the candidate pairs in one batch.
#ifndef SEL_POLL_BATCH
#define SEL_POLL_BATCH 8
#endif

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

// 1: the traced CTA (the one CTA of row 0, or the first slice of row 0) stamps mono_timer_ns at
// its phase boundaries into the trace buffer (src/gpu.rs PHASES): word 2i the phase, 2i + 1 the
// time, up to SEL_TRACE_MARKS marks. Thread 0 stamps, after the barrier that ends a phase.
#ifndef SEL_TRACE
#define SEL_TRACE 0
#endif
#define SEL_TRACE_MARKS 32
#define SEL_PH_START 0    // the task began
#define SEL_PH_LOADED 1   // keys in LDS (one CTA: and their top 8 bits counted)
#define SEL_PH_ROUND 2    // a 6-bit round (gathered, or alone when streaming)
#define SEL_PH_ABOVE 3    // the keys above P placed
#define SEL_PH_STAGED 4   // the keys sharing P staged
#define SEL_PH_CANDS 5    // every slice's candidates received
#define SEL_PH_WIDE 6     // a wide digit chosen
#define SEL_PH_PLACED 7   // the list written (this thread's part)

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

// ---- keys and prefixes (src/reference.rs radix_key, src/descent.rs Prefix) ------------------------
MONO_DEV u32 sel_radix_key(u32 bits) { return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u); }
MONO_DEV bool sel_is_nan(u32 bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }
MONO_DEV u32 sel_mask(u32 len) { return len == 0 ? 0u : 0xffffffffu << (32u - len); }
// Digits of the rounds, from the top: 6, 6, 6, 6, 6, 2 bits.
MONO_DEV u32 sel_shift(u32 round) { return round < 5 ? 26u - 6u * round : 0u; }
MONO_DEV u32 sel_width(u32 round) { return round < 5 ? 6u : 2u; }

// ---- slicing (src/layout.rs select_slices, Slices::new) ------------------------------------------
MONO_DEV u32 sel_slice_count(u32 len) {
  const u32 c = (len + SEL_MIN_SLICE_KEYS - 1) / SEL_MIN_SLICE_KEYS;
  return c < 1 ? 1u : (c > SEL_MAX_SLICES ? (u32)SEL_MAX_SLICES : c);
}
MONO_DEV u32 sel_chunk(u32 len, u32 count) {
  const u32 per = (len + count - 1) / count;
  return (per + SEL_SLICE_ALIGN - 1) / SEL_SLICE_ALIGN * SEL_SLICE_ALIGN;
}

// ---- the state of the descent (src/descent.rs Descent), in shared memory ---------------------------
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

// Shared memory of a select task besides the dynamic LDS.
struct sel_smem {
  u32 whist[SEL_WAVES][SEL_BINS];
  u32 part[SEL_BLOCK / SEL_BINS][SEL_BINS];
  u32 total[SEL_BINS];
  u32 packed[SEL_HIST_BOXES];
  union {
    // First rounds: every slice's words of the round.
    u32 gather[SEL_MAX_SLICES * SEL_HIST_BOXES];
    // Fast rounds: per group of SEL_HIST_BOXES threads, its sums of the words it polled ([0]: the
    // low bin of word w, [1]: the high), over all slices and over the slices before this one. It
    // shares the room of `gather` so that two CTAs of the longest slices still fit an SM.
    struct {
      u32 total[2][SEL_BLOCK / SEL_HIST_BOXES][SEL_HIST_BOXES];
      u32 before[2][SEL_BLOCK / SEL_HIST_BOXES][SEL_HIST_BOXES];
    } sums;
    // After the rounds (or without them): the candidates' wide digits.
    alignas(16) u32 tail_hist[SEL_TAIL_BINS];
  };
  u32 slice_above[SEL_MAX_SLICES];
  u32 slice_at[SEL_MAX_SLICES];
  u32 wtot[2][MONO_WAVE];  // the wave totals of sel_scan1 and sel_scan1x2
  sel_state st;
#if SEL_TRACE
  u64* trace;  // thread 0 only; nullptr when this CTA is not traced
  u32 marks;
#endif
};

MONO_DEV void sel_mark(sel_smem& sm, u32 phase) {
#if SEL_TRACE
  if (mono_thread() == 0 && sm.trace && sm.marks < SEL_TRACE_MARKS) {
    sm.trace[2 * sm.marks] = phase;
    sm.trace[2 * sm.marks + 1] = mono_timer_ns();
    ++sm.marks;
  }
#else
  (void)sm, (void)phase;
#endif
}

MONO_DEV void sel_trace_begin(sel_smem& sm, u64* trace, bool traced) {
#if SEL_TRACE
  if (mono_thread() == 0) sm.trace = traced ? trace : nullptr, sm.marks = 0;
  sel_mark(sm, SEL_PH_START);
#else
  (void)sm, (void)trace, (void)traced;
#endif
}

// ---- block scan ----------------------------------------------------------------------------------
MONO_DEV u32 sel_wave_scan(u32 v) {  // inclusive, lane 0 first
  const u32 lane = mono_lane();
#pragma unroll
  for (u32 d = 1; d < MONO_WAVE; d <<= 1) {
    const u32 o = mono_shfl(v, lane >= d ? lane - d : lane);
    if (lane >= d) v += o;
  }
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

// Adds v to a shared-memory word.
MONO_DEV void sel_lds_add(u32* p, u32 v) {
#if MONO_AMD
  __hip_atomic_fetch_add((__attribute__((address_space(3))) u32*)p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
#elif MONO_NVIDIA
  asm volatile("{\n .reg .u64 a;\n cvta.to.shared.u64 a, %0;\n red.shared.add.u32 [a], %1;\n}" ::"l"(p), "r"(v) : "memory");
#else
  __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}

// ---- histogram (src/descent.rs histogram) --------------------------------------------------------
// Adds this wave's digit counts, one key per lane (ok: it counts), to cnt: lane l holds bins
// l, l + MONO_WAVE, ... Bit i of bits[i] is set for the lanes whose digit has bit i; a bin's count
// is the popcount of the lanes whose 6 bits all agree with it. Whole wave, uniform control flow.
MONO_DEV void sel_count(u32 digit, bool ok, u32 (&cnt)[SEL_BINS / MONO_WAVE]) {
  const u64 live = mono_ballot(ok);
  if (live == 0) return;
  u64 bit[6];
#pragma unroll
  for (u32 i = 0; i < 6; ++i) bit[i] = mono_ballot(ok && ((digit >> i) & 1u));
#pragma unroll
  for (u32 j = 0; j < SEL_BINS / MONO_WAVE; ++j) {
    const u32 bin = mono_lane() + j * MONO_WAVE;
    u64 m = live;
#pragma unroll
    for (u32 i = 0; i < 6; ++i) m &= ((bin >> i) & 1u) ? bit[i] : ~bit[i];
    cnt[j] += mono_popc64(m);
  }
}

// sm.whist[w][b] = keys of wave w's share of src matching (bits, len) whose digit of `round` is b.
// Whole waves; the caller synchronises before reading another wave's row.
template <class Src>
MONO_DEV void sel_count_waves(sel_smem& sm, const Src& src, u32 bits, u32 len, u32 round) {
  const u32 mask = sel_mask(len), shift = sel_shift(round), dmask = (1u << sel_width(round)) - 1u;
  u32 cnt[SEL_BINS / MONO_WAVE];
#pragma unroll
  for (u32 j = 0; j < SEL_BINS / MONO_WAVE; ++j) cnt[j] = 0;
  for (u32 base = 0; base < src.n; base += SEL_GROUP) {
    const u32 i = base + 4 * mono_thread();
    u32 k[4];
    src.load4(i, k);
#pragma unroll
    for (u32 j = 0; j < 4; ++j) sel_count((k[j] >> shift) & dmask, i + j < src.n && (k[j] & mask) == bits, cnt);
  }
#pragma unroll
  for (u32 j = 0; j < SEL_BINS / MONO_WAVE; ++j) sm.whist[mono_wave()][mono_lane() + j * MONO_WAVE] = cnt[j];
}

// sm.total[b] = keys of src matching (bits, len) whose digit of `round` is b. Block-wide.
template <class Src>
MONO_DEV void sel_histogram(sel_smem& sm, const Src& src, u32 bits, u32 len, u32 round) {
  sel_count_waves(sm, src, bits, len, round);
  mono_sync_block();
  const u32 t = mono_thread();
  if (t < SEL_BINS) {
    u32 s = 0;
#pragma unroll
    for (u32 w = 0; w < SEL_WAVES; ++w) s += sm.whist[w][t];
    sm.total[t] = s;
  }
  mono_sync_block();
}

// ---- how a slice trades with the others of its row -----------------------------------------------
struct sel_x {
  const mbx_ctx* c;  // nullptr: the slice is alone (one CTA, or the first slice resolving)
  u32 hist_box;      // box of (this row, round 0, slice 0); SelectBoxes::hist_box
  u32 me, count;     // this slice, slices of the row
};

MONO_DEV u32 sel_unpack(u32 word, u32 bin) { return (bin & 1u) ? word >> 16 : word & 0xffffu; }

// A box that carries its own data: a relaxed store of (tag, value), no flag behind it.
MONO_DEV void sel_put_relaxed(const mbx_ctx& c, u32 box, u32 value) {
  mono_st_relaxed_u64(c.scratch + box, mbx_pack(c.tag, value));
}

// One round of the descent (src/descent.rs Descent::step), as first written (SEL_FAST_ROUNDS=0).
// Block-wide; false when a wait gave up or the counts lost the rank (the caller flags it and stops).
template <class Src>
MONO_DEV bool sel_round_first(sel_smem& sm, const Src& src, const sel_x& x, bool* stalled) {
  sel_state& st = sm.st;
  const u32 t = mono_thread();
  const u32 round = st.round, rank = st.rank, me = x.c ? x.me : 0u;
  sel_histogram(sm, src, st.bits, st.len, round);
  if (x.c) {
    // Publish 32 tagged pairs of 16-bit counts; thread i stores word i, which it packed itself.
    const u32 mine = x.hist_box + (round * SEL_MAX_SLICES + x.me) * SEL_HIST_BOXES;
    if (t < SEL_HIST_BOXES) sm.packed[t] = (sm.total[2 * t] & 0xffffu) | (sm.total[2 * t + 1] << 16);
    mbx_put_row(*x.c, mine, sm.packed, SEL_HIST_BOXES);
    // Every slice's row of this round, consecutive boxes (slot stride = SEL_HIST_BOXES).
    const u32 first = x.hist_box + round * SEL_MAX_SLICES * SEL_HIST_BOXES;
    if (!mbx_wait_all(*x.c, first, x.count * SEL_HIST_BOXES, sm.gather)) {
      *stalled = true;
      return false;
    }
    // Sum over slices: thread (p, b) adds slices p, p + parts, ... of bin b.
    const u32 parts = SEL_BLOCK / SEL_BINS, b = t % SEL_BINS, p = t / SEL_BINS;
    u32 s = 0;
    for (u32 c = p; c < x.count; c += parts) s += sel_unpack(sm.gather[c * SEL_HIST_BOXES + b / 2], b);
    sm.part[p][b] = s;
    mono_sync_block();
    if (t < SEL_BINS) {
      u32 sum = 0;
#pragma unroll
      for (u32 q = 0; q < parts; ++q) sum += sm.part[q][t];
      sm.total[t] = sum;
    }
    mono_sync_block();
  }
  // The digit (src/descent.rs choose_digit): exactly one bin has above < rank <= above + count.
  if (t < SEL_BINS) {
    u32 above = 0;
#pragma unroll
    for (u32 b = 0; b < SEL_BINS; ++b) above += b > t ? sm.total[b] : 0u;
    if (above < rank && rank <= above + sm.total[t]) {
      st.digit = t;
      st.digit_above = above;
    }
  }
  mono_sync_block();
  const u32 d = st.digit;
  if (d == SEL_NONE) return false;
  if (x.c) {
    // Per slice: its keys above the digit and at it. A slice's 32 words sit in 32 consecutive
    // threads, reduced with xor shuffles inside aligned groups of 32 lanes.
    for (u32 base = 0; base < x.count * SEL_HIST_BOXES; base += SEL_BLOCK) {
      const u32 i = base + t, j = i % SEL_HIST_BOXES;
      const u32 w = i < x.count * SEL_HIST_BOXES ? sm.gather[i] : 0u;
      const u32 lo = w & 0xffffu, hi = w >> 16;
      u32 above = (2 * j > d ? lo : 0u) + (2 * j + 1 > d ? hi : 0u);
      u32 at = (2 * j == d ? lo : 0u) + (2 * j + 1 == d ? hi : 0u);
#pragma unroll
      for (u32 m = SEL_HIST_BOXES / 2; m > 0; m >>= 1) {
        above += mono_shfl_xor(above, m);
        at += mono_shfl_xor(at, m);
      }
      if (j == 0 && i < x.count * SEL_HIST_BOXES) {
        sm.slice_above[i / SEL_HIST_BOXES] = above;
        sm.slice_at[i / SEL_HIST_BOXES] = at;
      }
    }
  }
  mono_sync_block();
  if (t == 0) {
    u32 above_before = 0, sharing_before = 0;
    if (x.c) {
#pragma unroll
      for (u32 c = 0; c < SEL_MAX_SLICES; ++c) {
        above_before += c < me ? sm.slice_above[c] : 0u;
        sharing_before += c < me ? sm.slice_at[c] : 0u;
      }
    }
    st.above_before += above_before;
    st.sharing_before = sharing_before;
    st.above += st.digit_above;
    st.rank -= st.digit_above;
    st.sharing = sm.total[d];
    st.bits |= d << sel_shift(round);
    st.len += sel_width(round);
    st.round = round + 1;
    st.digit = SEL_NONE;
  }
  mono_sync_block();
  return true;
}

// ---- fast rounds (PERF.md) -----------------------------------------------------------------------
// Fast rounds count on shared-memory atomics: lane l of every wave adds to its own copy of each
// bin (bin b copy l at b * MONO_WAVE + l), so no two lanes of one access meet on a word, and
// every lane's copies sit in its own bank. SEL_BINS * MONO_WAVE words of the candidates' room,
// which the rounds do not use yet.
#define SEL_COPY_WORDS (SEL_BINS * MONO_WAVE)
static_assert(SEL_COPY_WORDS <= SEL_CAND_WORDS, "the round's copies fit the candidates' room");

template <class Src>
MONO_DEV void sel_count_copies(u32* cnt, const Src& src, u32 bits, u32 len, u32 round) {
  const u32 mask = sel_mask(len), shift = sel_shift(round), dmask = (1u << sel_width(round)) - 1u;
  u32* mine = cnt + mono_lane();
  for (u32 base = 4 * mono_thread(); base < src.n; base += SEL_LOAD_BATCH * SEL_GROUP) {
    u32 k[SEL_LOAD_BATCH][4];
#pragma unroll
    for (u32 b = 0; b < SEL_LOAD_BATCH; ++b) src.load4(base + b * SEL_GROUP, k[b]);
#pragma unroll
    for (u32 b = 0; b < SEL_LOAD_BATCH; ++b) {
      const u32 i = base + b * SEL_GROUP;
#pragma unroll
      for (u32 j = 0; j < 4; ++j)
        if (i + j < src.n && (k[b][j] & mask) == bits) sel_lds_add(mine + ((k[b][j] >> shift) & dmask) * MONO_WAVE, 1u);
    }
  }
}

// The count of bin b over its MONO_WAVE copies, which it zeroes (its reader alone reads them).
// 16-byte reads rotated by the lane, so the lanes of wave 0 that read bins 2l spread over banks.
MONO_DEV u32 sel_take_bin(u32* cnt, u32 b) {
  u32 s = 0;
#pragma unroll
  for (u32 q = 0; q < MONO_WAVE / 4; ++q) {
    mono_u32x4* v = (mono_u32x4*)(cnt + b * MONO_WAVE + 4 * ((q + mono_lane()) % (MONO_WAVE / 4)));
    const mono_u32x4 x = *v;
    *v = mono_u32x4{0, 0, 0, 0};
    s += x.x + x.y + x.z + x.w;
  }
  return s;
}

MONO_DEV u32 sel_wave_sum(u32 v) {
#pragma unroll
  for (u32 m = MONO_WAVE / 2; m > 0; m >>= 1) v += mono_shfl_xor(v, m);
  return v;
}

// Block-wide, like mbx_wait_all (box i by thread i % SEL_BLOCK, then the block agrees), but a
// thread issues up to SEL_POLL_BATCH loads before it looks at the first, and polls again all the
// boxes of its batch not yet ready together: one L2 round trip per sweep, not one per box
// (bounded in debug builds, as mbx_poll). Each ready value goes to take(i, value).
template <class Take>
MONO_DEV bool sel_poll_all(const mbx_ctx& c, u32 first, u32 n, Take take) {
  static_assert(SEL_POLL_BATCH <= 32, "a thread's pending boxes are bits of a u32");
  bool ok = true;
  for (u32 base = 0; base < n && ok; base += SEL_POLL_BATCH * SEL_BLOCK) {
    u32 pending = 0;
#pragma unroll
    for (u32 j = 0; j < SEL_POLL_BATCH; ++j) pending |= (u32)(base + j * SEL_BLOCK + mono_thread() < n) << j;
#if MBX_DEBUG
    u32 sweeps = 0;
#endif
    while (pending) {
      u64 w[SEL_POLL_BATCH];
#pragma unroll
      for (u32 j = 0; j < SEL_POLL_BATCH; ++j)
        w[j] = (pending >> j) & 1u ? mbx_load(c.scratch + first + base + j * SEL_BLOCK + mono_thread()) : 0;
#pragma unroll
      for (u32 j = 0; j < SEL_POLL_BATCH; ++j) {
        if (((pending >> j) & 1u) && mbx_tag_of(w[j]) == c.tag) {
          take(base + j * SEL_BLOCK + mono_thread(), mbx_value_of(w[j]));
          pending &= ~(1u << j);
        }
      }
#if MBX_DEBUG
      if (pending && ++sweeps >= (u32)MBX_POLL_LIMIT) {
        const u32 box = first + base + mono_popc64((pending & (~pending + 1)) - 1) * SEL_BLOCK + mono_thread();
        mbx_report(c, box, mbx_load(c.scratch + box));  // w stays in registers: no dynamic index
        ok = false;
        break;
      }
      // Once someone gave up, stop soon rather than after a full bound per waiter.
      if (pending && (sweeps & 1023u) == 0 && mono_ld_relaxed_u32(c.diag) != 0) {
        ok = false;
        break;
      }
#endif
    }
  }
  return mbx_block_agree(c, ok);
}

// One round with one wave deciding. Lane w of wave 0 owns bins 2w and 2w + 1 (box word w).
// Barriers: after the counts, after the gather (gathered only), after the decision.
template <class Src>
MONO_DEV bool sel_round_fast(sel_smem& sm, const Src& src, const sel_x& x, u32* cnt, bool* stalled) {
  sel_state& st = sm.st;
  const u32 t = mono_thread(), l = mono_lane();
  const u32 round = st.round, rank = st.rank;
  sel_count_copies(cnt, src, st.bits, st.len, round);
  mono_sync_block();
  const bool owner = mono_wave() == 0 && l < SEL_HIST_BOXES;
  u32 tlo = 0, thi = 0, blo = 0, bhi = 0;  // counts of the low / high bin: total, slices before me
  if (owner) tlo = sel_take_bin(cnt, 2 * l), thi = sel_take_bin(cnt, 2 * l + 1);
  if (x.c) {
    if (owner) sel_put_relaxed(*x.c, x.hist_box + (round * SEL_MAX_SLICES + x.me) * SEL_HIST_BOXES + l, tlo | (thi << 16));
    // Thread t polls word t % SEL_HIST_BOXES of some slices and sums what it sees.
    u32 s[4] = {0, 0, 0, 0};
    const u32 first = x.hist_box + round * SEL_MAX_SLICES * SEL_HIST_BOXES;
    const bool ok = sel_poll_all(*x.c, first, x.count * SEL_HIST_BOXES, [&](u32 i, u32 v) {
      const u32 lo = v & 0xffffu, hi = v >> 16, before = i / SEL_HIST_BOXES < x.me;
      s[0] += lo, s[1] += hi, s[2] += before ? lo : 0u, s[3] += before ? hi : 0u;
    });
    if (!ok) {
      *stalled = true;
      return false;
    }
    const u32 g = t / SEL_HIST_BOXES, w = t % SEL_HIST_BOXES;
    sm.sums.total[0][g][w] = s[0], sm.sums.total[1][g][w] = s[1];
    sm.sums.before[0][g][w] = s[2], sm.sums.before[1][g][w] = s[3];
    mono_sync_block();
    tlo = thi = 0;
    if (owner) {
#pragma unroll
      for (u32 q = 0; q < SEL_BLOCK / SEL_HIST_BOXES; ++q) {
        tlo += sm.sums.total[0][q][l], thi += sm.sums.total[1][q][l];
        blo += sm.sums.before[0][q][l], bhi += sm.sums.before[1][q][l];
      }
    }
  }
  if (mono_wave() == 0) {
    // Keys above a lane's bins: the sum over the lanes after it (src/descent.rs choose_digit).
    const u32 incl = sel_wave_scan(tlo + thi);
    const u32 above_hi = mono_shfl(incl, MONO_WAVE - 1) - incl, above_lo = above_hi + thi;
    const bool in_hi = above_hi < rank && rank <= above_hi + thi;
    const bool in_lo = !in_hi && above_lo < rank && rank <= above_lo + tlo;
    const u64 found = mono_ballot(in_hi || in_lo);  // one lane at most: the bins tile the counts
    const u32 at = found ? mono_popc64(found - 1) : 0u;
    const u32 d = mono_shfl(in_hi ? 2 * l + 1 : 2 * l, at);
    const u32 d_above = mono_shfl(in_hi ? above_hi : above_lo, at);
    const u32 sharing = mono_shfl(in_hi ? thi : tlo, at);
    const u32 above_before = sel_wave_sum((2 * l > d ? blo : 0u) + (2 * l + 1 > d ? bhi : 0u));
    const u32 sharing_before = sel_wave_sum((2 * l == d ? blo : 0u) + (2 * l + 1 == d ? bhi : 0u));
    if (l == 0) {
      st.digit = found ? d : SEL_NONE;
      if (found) {
        st.above_before += above_before;
        st.sharing_before = sharing_before;
        st.above += d_above;
        st.rank -= d_above;
        st.sharing = sharing;
        st.bits |= d << sel_shift(round);
        st.len += sel_width(round);
        st.round = round + 1;
      }
    }
  }
  mono_sync_block();
  return st.digit != SEL_NONE;
}

template <class Src>
MONO_DEV bool sel_round(sel_smem& sm, const Src& src, const sel_x& x, u32* cnt, bool* stalled) {
#if SEL_FAST_ROUNDS
  const bool ok = sel_round_fast(sm, src, x, cnt, stalled);
#else
  (void)cnt;
  const bool ok = sel_round_first(sm, src, x, stalled);
#endif
  sel_mark(sm, SEL_PH_ROUND);
  return ok;
}

// The descent stops: all 32 bits known, or at 12 / 24 bits the keys sharing the prefix fit the room.
MONO_DEV bool sel_stopped(const sel_state& st) {
  return st.round == SEL_ROUNDS || ((st.len == 12 || st.len == 24) && st.sharing <= SEL_ROOM);
}

MONO_DEV void sel_start(sel_smem& sm, u32 len) {
  if (mono_thread() == 0) {
    sel_state& st = sm.st;
    st.bits = 0, st.len = 0, st.round = 0, st.rank = SEL_K, st.above = 0, st.above_before = 0;
    st.sharing = len, st.sharing_before = 0, st.digit = SEL_NONE, st.digit_above = 0;
  }
  mono_sync_block();
}

// ---- placement -----------------------------------------------------------------------------------
// The row a select task works on.
struct sel_row {
  const float* scores;  // the row's scores
  u32 len;              // its keys
  i32* out;             // its SEL_K entries
  const i32* pages;     // its page table, or nullptr for positions
  u32* flags;           // its SEL_FLAGS error words
};

MONO_DEV i32 sel_entry(const sel_row& r, u32 pos) {
  return r.pages ? r.pages[pos / SEL_PAGE_TOKENS] * SEL_PAGE_TOKENS + (i32)(pos % SEL_PAGE_TOKENS) : (i32)pos;
}

MONO_DEV void sel_flag(const sel_row& r, u32 which) {
  if (mono_thread() == 0) mono_st_relaxed_u32(r.flags + which, 1u);
}

// Emits, in position order, the keys of src that keep() accepts, as indices first, first + 1, ...
// through emit(index, pos, key). Per chunk of SEL_PLACE_RUN * SEL_BLOCK keys (one for a slice or
// the candidates), thread t takes a run of consecutive keys (as sel_place) and marks those kept;
// one block scan on sm.wtot[buf] gives its first index. Block-wide, one barrier a chunk; two
// calls in a row take different bufs.
template <class Src, class Keep, class Emit>
MONO_DEV void sel_compact(sel_smem& sm, u32 buf, const Src& src, Keep keep, u32 first, Emit emit) {
  for (u32 c0 = 0; c0 < src.n; c0 += SEL_PLACE_RUN * SEL_BLOCK) {
    if (c0 > 0) mono_sync_block();  // every thread has read the last chunk's scan words
    const u32 n = src.n - c0 < SEL_PLACE_RUN * SEL_BLOCK ? src.n - c0 : SEL_PLACE_RUN * SEL_BLOCK;
    const u32 run = ((n + SEL_BLOCK - 1) / SEL_BLOCK + 3) / 4 * 4, quads = run / 4;
    const u32 start = c0 + mono_thread() * run, end = start + run < c0 + n ? start + run : c0 + n;
    const u32 rot = quads ? mono_thread() % quads : 0u;
    u64 m = 0;
    for (u32 q = 0; q < quads; ++q) {
      const u32 at = q + rot < quads ? q + rot : q + rot - quads, i = start + 4 * at;
      if (i >= end) continue;
      u32 k[4];
      src.load4(i, k);
      u32 c = 0;
#pragma unroll
      for (u32 j = 0; j < 4; ++j) c |= (u32)(i + j < end && keep(k[j])) << j;
      m |= (u64)c << (4 * at);
    }
    u32 total;
    u32 index = first + sel_scan1(sm, buf, mono_popc64(m), &total);
    while (m) {
      const u64 low = m & (~m + 1);
      m ^= low;
      const u32 i = start + mono_popc64(low - 1);
      emit(index++, src.pos(i), src.key(i));
    }
    first += total;
  }
}

// The row's entries from index first: every index is below SEL_K by construction for keys above
// T; ties past the k-th are dropped.
MONO_DEV void sel_write(const sel_row& r, u32 index, u32 pos) {
  if (index < SEL_K) r.out[index] = sel_entry(r, pos);
}

// ---- wide digits on shared-memory atomics (src/descent.rs wide_histogram, Descent::wide_step) ---
// These loops run over every key of a row on one SM, so their cost is instructions per key, not
// latency: each keeps the per-key work to a compare and (for a matching key) one atomic.

// The digit of `width` bits holding the rank-th key from the top, from hist: SEL_FIRST_BINS bins
// of SEL_FIRST_COPIES copies each when `copies` (the first pass, bin b copy c at b * copies + c),
// else 1 << width plain bins. Extends sm.st by it (src/descent.rs Descent::wide_step). Thread t
// owns `per` consecutive bins (ascending with t): it sums them, one block scan says which thread
// holds the rank, and that one walks its bins. A 12-bit digit also gives the keys sharing and
// above the prefix of its top SEL_GROUP_BITS (sm.st.group_*): a group is SEL_GROUP_THREADS
// threads. Each thread zeroes the bins it owns (no other thread reads them) for the next pass.
// Block-wide, two barriers; false when the counts lost the rank.
MONO_DEV bool sel_wide_choose(sel_smem& sm, u32* hist, u32 width, bool copies) {
  const u32 bins = copies ? SEL_FIRST_BINS : 1u << width, per = (bins + SEL_BLOCK - 1) / SEL_BLOCK;
  const u32 first = mono_thread() * per;
  const sel_state st = sm.st;  // read before the barriers below, written only after them
  u32 count[SEL_WIDE_PER];      // this thread's bins
#pragma unroll
  for (u32 j = 0; j < SEL_WIDE_PER; ++j) count[j] = 0;
  if (copies) {
#pragma unroll
    for (u32 j = 0; j < SEL_WIDE_PER; ++j) {
      if (j >= per || first + j >= bins) continue;
      u32* at = hist + (first + j) * SEL_FIRST_COPIES;
      // 16-byte reads rotated by the thread, so the lanes of a phase spread over the banks.
#pragma unroll
      for (u32 q = 0; q < SEL_FIRST_COPIES / 4; ++q) {
        mono_u32x4* v = (mono_u32x4*)(at + 4 * ((q + mono_thread()) % (SEL_FIRST_COPIES / 4)));
        const mono_u32x4 x = *v;
        *v = mono_u32x4{0, 0, 0, 0};
        count[j] += x.x + x.y + x.z + x.w;
      }
    }
  } else if (per % 4 == 0) {
    // Whole quads as 16-byte accesses (2-way bank conflicts, not 8-way).
#pragma unroll
    for (u32 q = 0; q < SEL_WIDE_PER / 4; ++q) {
      if (4 * q >= per) continue;
      mono_u32x4* v = (mono_u32x4*)(hist + first + 4 * q);
      const mono_u32x4 x = *v;
      *v = mono_u32x4{0, 0, 0, 0};
      count[4 * q] = x.x, count[4 * q + 1] = x.y, count[4 * q + 2] = x.z, count[4 * q + 3] = x.w;
    }
  } else {
#pragma unroll
    for (u32 j = 0; j < SEL_WIDE_PER; ++j) {
      if (j >= per || first + j >= bins) continue;
      count[j] = hist[first + j];
      hist[first + j] = 0;
    }
  }
  u32 mine = 0;
#pragma unroll
  for (u32 j = 0; j < SEL_WIDE_PER; ++j) mine += count[j];
  u32 total;
  const u32 below = sel_scan1(sm, 0, mine, &total);
  u32 above = total - below - mine;  // keys in the bins above this thread's
  u32 g_sharing = 0, g_above = 0;
  if (!copies && width == SEL_WIDE_BITS) {
    g_sharing = mine;
#pragma unroll
    for (u32 m = 1; m < SEL_GROUP_THREADS; m <<= 1) g_sharing += mono_shfl_xor(g_sharing, m);
    g_above = total - mono_shfl(below, mono_lane() & ~(SEL_GROUP_THREADS - 1u)) - g_sharing;
  }
  if (first < bins && above < st.rank && st.rank <= above + mine) {
#pragma unroll
    for (u32 j = SEL_WIDE_PER; j-- > 0;) {
      if (j >= per) continue;
      const u32 b = first + j, h = count[j];
      if (above < st.rank && st.rank <= above + h) {
        sm.st.bits = st.bits | b << (32u - st.len - width);
        sm.st.len = st.len + width;
        sm.st.rank = st.rank - above;
        sm.st.above = st.above + above;
        sm.st.sharing = h;
        sm.st.round = st.round + 1;
        sm.st.group_sharing = g_sharing;
        sm.st.group_above = st.above + g_above;
        break;
      }
      above += h;
    }
  }
  mono_sync_block();
  sel_mark(sm, SEL_PH_WIDE);
  return sm.st.round == st.round + 1;
}

// Counts the `width` bits below the prefix (bits, len) of src's keys that share it into hist
// (zeroed): per key a compare and, when it matches, one atomic. Each thread issues its loads of a
// batch before it uses the first. Block-wide, no barrier.
template <class Src>
MONO_DEV void sel_wide_count(u32* hist, const Src& src, u32 bits, u32 len, u32 width) {
  const u32 mask = sel_mask(len), shift = 32u - len - width, dmask = (1u << width) - 1u;
  for (u32 base = 4 * mono_thread(); base < src.n; base += SEL_LOAD_BATCH * SEL_GROUP) {
    u32 k[SEL_LOAD_BATCH][4];
#pragma unroll
    for (u32 b = 0; b < SEL_LOAD_BATCH; ++b) src.load4(base + b * SEL_GROUP, k[b]);
#pragma unroll
    for (u32 b = 0; b < SEL_LOAD_BATCH; ++b) {
      const u32 i = base + b * SEL_GROUP;
#pragma unroll
      for (u32 j = 0; j < 4; ++j)
        if (i + j < src.n && (k[b][j] & mask) == bits) sel_lds_add(hist + ((k[b][j] >> shift) & dmask), 1u);
    }
  }
}

// One wide pass: counts, then chooses. Block-wide.
template <class Src>
MONO_DEV bool sel_wide_pass(sel_smem& sm, u32* hist, const Src& src, u32 width) {
  sel_wide_count(hist, src, sm.st.bits, sm.st.len, width);
  mono_sync_block();
  return sel_wide_choose(sm, hist, width, false);
}

// The rest of T from a 12-bit prefix (two 10-bit digits) or a 24-bit one (one 8-bit digit).
template <class Src>
MONO_DEV bool sel_wide_finish(sel_smem& sm, u32* hist, const Src& src) {
  if (sm.st.len == 12) return sel_wide_pass(sm, hist, src, 10) && sel_wide_pass(sm, hist, src, 10);
  return sel_wide_pass(sm, hist, src, 8);
}

// ---- the placement of a list in one pass (src/descent.rs Cut) ------------------------------------
// Where a key goes once P and T are known: after the keys above P (from 0), the keys sharing P
// above T (from above_p), the ties (from above_t, until k). P is T's prefix, so a key above P is
// above T, and a key is in the list iff it is at least T.
struct sel_cut {
  u32 mask, bits;        // P
  u32 t;                 // T
  u32 above_p, above_t;  // keys of the row above P, above T
};

// P (len, bits) with the row's keys above it, and T from the finished descent t.
MONO_DEV sel_cut sel_cut_of(u32 len, u32 bits, u32 above, const sel_state& t) {
  return sel_cut{sel_mask(len), bits, t.bits, above, t.above};
}

// Writes the keys of a thread's run marked in m (bit b: key first + b), in order, from *index.
template <class Src>
MONO_DEV void sel_write_marked(const Src& src, const sel_row& r, u32 first, u64 m, u32 index) {
  while (m) {
    const u64 low = m & (~m + 1);
    m ^= low;
    sel_write(r, index++, src.pos(first + mono_popc64(low - 1)));
  }
}

// Places every key of src the cut takes, in position order. Thread t takes a run of `run`
// consecutive keys: it counts them by kind (reading its quads rotated by t, so the threads of a
// wave hit different banks) and marks each kind in a mask; one block scan gives each thread its
// first index of each kind; then it writes its marked keys in order. Block-wide, one barrier.
template <class Src>
MONO_DEV void sel_place(sel_smem& sm, const Src& src, const sel_cut& cut, const sel_row& r) {
  const u32 n = src.n, run = ((n + SEL_BLOCK - 1) / SEL_BLOCK + 3) / 4 * 4, quads = run / 4;
  const u32 first = mono_thread() * run, end = first + run < n ? first + run : n;
  const u32 rot = quads ? mono_thread() % quads : 0u;
  u64 m1 = 0, m2 = 0, m3 = 0;  // above P; sharing P above T; equal to T
  for (u32 q = 0; q < quads; ++q) {
    const u32 at = q + rot < quads ? q + rot : q + rot - quads, i = first + 4 * at;
    if (i >= end) continue;
    u32 k[4];
    src.load4(i, k);
    u32 a = 0, b = 0, c = 0;
#pragma unroll
    for (u32 j = 0; j < 4; ++j) {
      const bool in = i + j < end, gt = in && k[j] > cut.t, p = (k[j] & cut.mask) > cut.bits;
      a |= (u32)(gt && p) << j;
      b |= (u32)(gt && !p) << j;
      c |= (u32)(in && k[j] == cut.t) << j;
    }
    m1 |= (u64)a << (4 * at), m2 |= (u64)b << (4 * at), m3 |= (u64)c << (4 * at);
  }
  // Kinds 1 and 2 packed (low, high 16 bits: each below k), kind 3.
  u32 ab_before, c_before;
  sel_scan1x2(sm, mono_popc64(m1) | mono_popc64(m2) << 16, mono_popc64(m3), &ab_before, &c_before);
  sel_write_marked(src, r, first, m1, ab_before & 0xffffu);
  sel_write_marked(src, r, first, m2, cut.above_p + (ab_before >> 16));
  sel_write_marked(src, r, first, m3, cut.above_t + c_before);
}

// ---- the first slice (or the streaming one CTA): the candidates ----------------------------------
// Finds the rest of T among the n candidates (keys and positions, in position order, all sharing
// the prefix P in sm.st) and places them after the row's keys above P. Block-wide.
MONO_DEV bool sel_tail(sel_smem& sm, const sel_row& r, const u32* cand_pos, const u32* cand_key, u32 n) {
  for (u32 i = mono_thread(); i < SEL_TAIL_BINS; i += SEL_BLOCK) sm.tail_hist[i] = 0;
  mono_sync_block();
  const sel_cand_keys src{cand_key, cand_pos, n};
  const u32 p_len = sm.st.len, p_bits = sm.st.bits, p_above = sm.st.above;
  if (!sel_wide_finish(sm, sm.tail_hist, src)) return false;
  sel_place(sm, src, sel_cut_of(p_len, p_bits, p_above, sm.st), r);
  sel_mark(sm, SEL_PH_PLACED);
  return true;
}

// ---- a slice, or the streaming one CTA -----------------------------------------------------------
// After the keys are in src and the row has more than k: the descent, then the placement. x.c set:
// slice x.me of x.count, candidates staged to boxes cand_box.. as (key, position) pairs; alone:
// candidates to cand_pos / cand_key.
template <class Src>
MONO_DEV bool sel_descend(sel_smem& sm, const Src& src, const sel_row& r, const sel_x& x, u32 cand_box, u32* cand_pos,
                          u32* cand_key) {
  // The fast rounds' per-lane copies live where the candidates go after the rounds.
  for (u32 i = 4 * mono_thread(); i < SEL_COPY_WORDS; i += SEL_GROUP) *(mono_u32x4*)(cand_pos + i) = mono_u32x4{0, 0, 0, 0};
  sel_start(sm, r.len);
  bool stalled = false;
  while (!sel_stopped(sm.st)) {
    if (!sel_round(sm, src, x, cand_pos, &stalled)) {
      sel_flag(r, stalled ? SEL_FLAG_STALLED : SEL_FLAG_LOST);
      return false;
    }
  }
  const sel_state st = sm.st;  // a copy: the tail's passes change sm.st
  const u32 mask = sel_mask(st.len);
  auto write = [&](u32 i, u32 pos, u32) { sel_write(r, i, pos); };
  sel_compact(sm, 0, src, [&](u32 key) { return (key & mask) > st.bits; }, st.above_before, write);
  sel_mark(sm, SEL_PH_ABOVE);
  if (st.len == 32) {
    sel_compact(sm, 1, src, [&](u32 key) { return key == st.bits; }, st.above + st.sharing_before, write);
    sel_mark(sm, SEL_PH_PLACED);
    return true;
  }
  auto sharing = [&](u32 key) { return (key & mask) == st.bits; };
  if (x.c) {
    sel_compact(sm, 1, src, sharing, st.sharing_before, [&](u32 i, u32 pos, u32 key) {
      sel_put_relaxed(*x.c, cand_box + 2 * i, key);
      sel_put_relaxed(*x.c, cand_box + 2 * i + 1, pos);
    });
    sel_mark(sm, SEL_PH_STAGED);
    if (x.me != 0) return true;
    // Every slice's pairs in one batched poll; ends on a block barrier.
    const bool ok = sel_poll_all(*x.c, cand_box, 2 * st.sharing, [&](u32 i, u32 v) {
      if (i & 1u)
        cand_pos[i / 2] = v;
      else
        cand_key[i / 2] = v;
    });
    if (!ok) {
      sel_flag(r, SEL_FLAG_STALLED);
      return false;
    }
    sel_mark(sm, SEL_PH_CANDS);
  } else {
    sel_compact(sm, 1, src, sharing, 0, [&](u32 i, u32 pos, u32 key) { cand_pos[i] = pos, cand_key[i] = key; });
    mono_sync_block();
  }
  if (!sel_tail(sm, r, cand_pos, cand_key, st.sharing)) {
    sel_flag(r, SEL_FLAG_LOST);
    return false;
  }
  return true;
}

// Loads positions first..first + n of the row into LDS as radix keys, flagging NaN (a NaN's key
// lies outside [key(-inf), key(+inf)]). Each thread issues SEL_LOAD_BATCH 16-byte loads before
// it uses the first. Block-wide.
MONO_DEV void sel_load(const sel_row& r, u32 first, u32 n, u32* keys) {
  u32 lo = 0xffffffffu, hi = 0;
  for (u32 base = 4 * mono_thread(); base < n; base += SEL_LOAD_BATCH * SEL_GROUP) {
    mono_u32x4 v[SEL_LOAD_BATCH];
#pragma unroll
    for (u32 b = 0; b < SEL_LOAD_BATCH; ++b) {
      const u32 i = base + b * SEL_GROUP;
      v[b] = i < n ? *(const mono_u32x4*)(r.scores + first + i) : mono_u32x4{0, 0, 0, 0};
    }
#pragma unroll
    for (u32 b = 0; b < SEL_LOAD_BATCH; ++b) {
      const u32 i = base + b * SEL_GROUP;
      if (i >= n) continue;
      const u32 k[4] = {sel_radix_key(v[b].x), sel_radix_key(v[b].y), sel_radix_key(v[b].z), sel_radix_key(v[b].w)};
      *(mono_u32x4*)(keys + i) = mono_u32x4{k[0], k[1], k[2], k[3]};
#pragma unroll
      for (u32 j = 0; j < 4; ++j) {
        if (i + j >= n) continue;
        lo = lo < k[j] ? lo : k[j];
        hi = hi > k[j] ? hi : k[j];
      }
    }
  }
  if (lo < sel_radix_key(0xff800000u) || hi > sel_radix_key(0x7f800000u)) mono_st_relaxed_u32(r.flags + SEL_FLAG_NAN, 1u);
  mono_sync_block();
}

// The one CTA's load: the row's keys into LDS as radix keys (flagging NaN), their top
// SEL_FIRST_BITS counted into hist (zeroed; bin b copy c at b * SEL_FIRST_COPIES + c). First a
// bare copy of the scores into LDS, SEL_COPY_BATCH 16-byte loads a thread in flight (a 32K row
// is two round trips, not one per SEL_LOAD_BATCH); then each thread turns the quads it copied
// into keys and counts them (its own copies: no barrier between). A NaN's key lies outside
// [key(-inf), key(+inf)], so a thread only tracks its smallest and largest key. Block-wide; ends
// on a barrier.
MONO_DEV void sel_load_count(const sel_row& r, u32* keys, u32* hist) {
  const u32 n = r.len, copy = mono_lane() % SEL_FIRST_COPIES, shift = 32u - SEL_FIRST_BITS;
  for (u32 base = 4 * mono_thread(); base < n; base += SEL_COPY_BATCH * SEL_GROUP) {
    mono_u32x4 v[SEL_COPY_BATCH];
#pragma unroll
    for (u32 b = 0; b < SEL_COPY_BATCH; ++b) {
      const u32 i = base + b * SEL_GROUP;
      v[b] = i < n ? *(const mono_u32x4*)(r.scores + i) : mono_u32x4{0, 0, 0, 0};
    }
#pragma unroll
    for (u32 b = 0; b < SEL_COPY_BATCH; ++b) {
      const u32 i = base + b * SEL_GROUP;
      if (i < n) *(mono_u32x4*)(keys + i) = v[b];
    }
  }
  u32 lo = 0xffffffffu, hi = 0;
  for (u32 i = 4 * mono_thread(); i < n; i += SEL_GROUP) {
    const mono_u32x4 v = *(const mono_u32x4*)(keys + i);
    const u32 k[4] = {sel_radix_key(v.x), sel_radix_key(v.y), sel_radix_key(v.z), sel_radix_key(v.w)};
    *(mono_u32x4*)(keys + i) = mono_u32x4{k[0], k[1], k[2], k[3]};
#pragma unroll
    for (u32 j = 0; j < 4; ++j) {
      if (i + j >= n) continue;
      lo = lo < k[j] ? lo : k[j];
      hi = hi > k[j] ? hi : k[j];
      sel_lds_add(hist + (k[j] >> shift) * SEL_FIRST_COPIES + copy, 1u);
    }
  }
  if (lo < sel_radix_key(0xff800000u) || hi > sel_radix_key(0x7f800000u)) mono_st_relaxed_u32(r.flags + SEL_FLAG_NAN, 1u);
  mono_sync_block();
}

// The one CTA's last pass when P (12 bits) is known before it, fused with the placement: thread t
// takes its run of consecutive keys (as sel_place) and marks the keys whose 20-bit prefix is
// above T's (above P, or sharing P above T: T's 20 bits are enough), while it counts the last 12
// bits of those sharing T's 20 bits into hist and marks them; once T is chosen it sorts only
// those into above T and ties. One pass over the keys instead of two. Block-wide.
MONO_DEV bool sel_last_pass_placed(sel_smem& sm, u32* hist, const sel_lds_keys& src, u32 p_mask, u32 p_bits,
                                   u32 above_p, const sel_row& r) {
  const u32 t20 = sm.st.bits, mask20 = sel_mask(sm.st.len), shift = 32u - sm.st.len - SEL_WIDE_BITS;
  const u32 n = src.n, run = ((n + SEL_BLOCK - 1) / SEL_BLOCK + 3) / 4 * 4, quads = run / 4;
  const u32 first = mono_thread() * run, end = first + run < n ? first + run : n;
  const u32 rot = quads ? mono_thread() % quads : 0u;
  u64 m1 = 0, m2 = 0, mc = 0;  // above P; sharing P above T's 20 bits; sharing T's 20 bits
  for (u32 q = 0; q < quads; ++q) {
    const u32 at = q + rot < quads ? q + rot : q + rot - quads, i = first + 4 * at;
    if (i >= end) continue;
    u32 k[4];
    src.load4(i, k);
    u32 a = 0, b = 0, c = 0;
#pragma unroll
    for (u32 j = 0; j < 4; ++j) {
      const u32 hi = k[j] & mask20;
      const bool in = i + j < end, gt = in && hi > t20, p = (k[j] & p_mask) > p_bits;
      a |= (u32)(gt && p) << j;
      b |= (u32)(gt && !p) << j;
      if (in && hi == t20) {
        c |= 1u << j;
        sel_lds_add(hist + ((k[j] >> shift) & (SEL_WIDE_BINS - 1u)), 1u);
      }
    }
    m1 |= (u64)a << (4 * at), m2 |= (u64)b << (4 * at), mc |= (u64)c << (4 * at);
  }
  mono_sync_block();
  if (!sel_wide_choose(sm, hist, SEL_WIDE_BITS, false)) return false;
  const u32 t = sm.st.bits;
  u64 m3 = 0;
  for (u64 m = mc; m;) {
    const u64 low = m & (~m + 1);
    m ^= low;
    const u32 key = src.key(first + mono_popc64(low - 1));
    if (key > t) m2 |= low;
    if (key == t) m3 |= low;
  }
  u32 ab_before, c_before;
  sel_scan1x2(sm, mono_popc64(m1) | mono_popc64(m2) << 16, mono_popc64(m3), &ab_before, &c_before);
  sel_write_marked(src, r, first, m1, ab_before & 0xffffu);
  sel_write_marked(src, r, first, m2, above_p + (ab_before >> 16));
  sel_write_marked(src, r, first, m3, sm.st.above + c_before);
  return true;
}

// The one CTA over a row of more than k keys that fits in LDS (keys: SEL_SLICE_KEYS words, hist:
// SEL_WIDE_BINS): 8 bits over every key, then 12 and 12 over the keys sharing the prefix, so T
// in three passes whatever the row. P is T's 12-bit prefix when the keys sharing it fit the
// room, else its 24-bit prefix when those fit, else T (the contract's stops, src/reference.rs).
// P = 12 is known after the second pass, so the third places the list as it counts.
MONO_DEV bool sel_one_cta_lds(sel_smem& sm, u32* keys, u32* hist, const sel_row& r) {
  for (u32 i = 4 * mono_thread(); i < SEL_WIDE_BINS; i += SEL_GROUP) *(mono_u32x4*)(hist + i) = mono_u32x4{0, 0, 0, 0};
  sel_start(sm, r.len);
  sel_load_count(r, keys, hist);
  sel_mark(sm, SEL_PH_LOADED);
  const sel_lds_keys src{keys, r.len, 0};
  if (!sel_wide_choose(sm, hist, SEL_FIRST_BITS, true) || !sel_wide_pass(sm, hist, src, SEL_WIDE_BITS)) {
    sel_flag(r, SEL_FLAG_LOST);
    return false;
  }
  const sel_state at20 = sm.st;  // its group_*: P = 12
  if (at20.group_sharing <= SEL_ROOM) {
    if (!sel_last_pass_placed(sm, hist, src, sel_mask(12), at20.bits & sel_mask(12), at20.group_above, r)) {
      sel_flag(r, SEL_FLAG_LOST);
      return false;
    }
  } else {
    if (!sel_wide_pass(sm, hist, src, SEL_WIDE_BITS)) {
      sel_flag(r, SEL_FLAG_LOST);
      return false;
    }
    const sel_state& t = sm.st;  // T; its group_*: P = 24
    sel_place(sm, src,
              t.group_sharing <= SEL_ROOM ? sel_cut_of(24, t.bits & sel_mask(24), t.group_above, t)
                                          : sel_cut_of(32, t.bits, t.above, t),
              r);
  }
  sel_mark(sm, SEL_PH_PLACED);
  return true;
}

// A row of at most k keys: entry i is position i, then -1 (the padding by the first slice).
MONO_DEV void sel_short_row(const sel_row& r, u32 first, u32 n, u32 me) {
  bool nan = false;
  for (u32 i = mono_thread(); i < n; i += SEL_BLOCK) {
    nan |= sel_is_nan(mono_f32_bits(r.scores[first + i]));
    r.out[first + i] = sel_entry(r, first + i);
  }
  if (nan) mono_st_relaxed_u32(r.flags + SEL_FLAG_NAN, 1u);
  if (me == 0)
    for (u32 i = r.len + mono_thread(); i < SEL_K; i += SEL_BLOCK) r.out[i] = -1;
}

// ---- task functions ------------------------------------------------------------------------------
// Slice `me` of the row (of sel_slice_count(len) slices). Every slice of the row must run at once
// (each waits for the others' histograms). lds: SEL_LDS_WORDS words of dynamic shared memory.
// hist_box: SelectBoxes::hist_box(row, 0, 0); cand_box: SelectBoxes::cand_box(row, 0).
MONO_DEV bool sel_slice_task(sel_smem& sm, u32* lds, const mbx_ctx& c, const sel_row& r, u32 me, u32 hist_box,
                             u32 cand_box) {
  const u32 count = sel_slice_count(r.len);
  if (me >= count) return true;
  const u32 chunk = sel_chunk(r.len, count), first = me * chunk;
  // Slices past the first never start at or past the end (src/layout.rs proves it for the
  // production constants); other defines could break that, so it is checked.
  if (me > 0 && first >= r.len) {
    sel_flag(r, SEL_FLAG_SHAPE);
    return false;
  }
  const u32 n = (first + chunk < r.len ? first + chunk : r.len) - first;
  if (r.len <= SEL_K) {
    sel_short_row(r, first, n, me);
    return true;
  }
  if (chunk > SEL_SLICE_KEYS) {
    sel_flag(r, SEL_FLAG_SHAPE);
    return false;
  }
  sel_load(r, first, n, lds);
  sel_mark(sm, SEL_PH_LOADED);
  const sel_lds_keys src{lds, n, first};
  const sel_x x{&c, hist_box, me, count};
  return sel_descend(sm, src, r, x, cand_box, lds + SEL_SLICE_KEYS, lds + SEL_SLICE_KEYS + SEL_ROOM4);
}

// The whole row on this CTA: keys in LDS with wide digits when they fit, else by rounds read from
// global memory every pass.
MONO_DEV bool sel_one_cta_task(sel_smem& sm, u32* lds, const sel_row& r) {
  if (r.len <= SEL_K) {
    sel_short_row(r, 0, r.len, 0);
    return true;
  }
  if (r.len <= SEL_SLICE_KEYS) return sel_one_cta_lds(sm, lds, lds + SEL_SLICE_KEYS, r);
  const sel_x alone{nullptr, 0, 0, 1};
  u32* cand_pos = lds + SEL_SLICE_KEYS;
  u32* cand_key = cand_pos + SEL_ROOM4;
  // The NaN check of a streamed row: one pass of its own.
  bool nan = false;
  for (u32 i = mono_thread(); i < r.len; i += SEL_BLOCK) nan |= sel_is_nan(mono_f32_bits(r.scores[i]));
  if (nan) mono_st_relaxed_u32(r.flags + SEL_FLAG_NAN, 1u);
  return sel_descend(sm, sel_row_keys{r.scores, r.len}, r, alone, 0, cand_pos, cand_key);
}
