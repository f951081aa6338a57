// The one CTA over a short row held in registers (at most SEL_REG_KEYS * SEL_BLOCK keys,
// src/layout.rs REG_*): thread t keeps the keys of positions t * SEL_REG_KEYS and the
// SEL_REG_KEYS after it, so a thread's keys are consecutive and thread order is position order.
// Wide digits counted with shared-memory atomics give T (or digits and then ranks), and the keys
// sharing T's 12- and 24-bit prefixes that decide P. The first digit (12 bits) counts every key.
// Then:
// - When at most SEL_REG_STAGE_ROOM keys share T's 12-bit prefix (a random row: a few hundred),
//   P is that prefix. One block scan places the keys above it and stages the keys sharing it in
//   LDS, in position order; an 8-bit digit counts the staged keys, one a thread, each bin keeping
//   its first SEL_REG_BUCKET keys. When T's bin fits its bucket (a random row: one to four keys),
//   wave 0 chooses the digit and finds T by the ranks of the bin's keys, with one barrier for
//   both. Else, when at most SEL_REG_RANK_ROOM staged keys share T's 20-bit prefix, they are
//   gathered and ranked by the block, and otherwise a last 12-bit digit over them gives T. A
//   block scan over the staged keys places them.
// - Otherwise digits of 12 and 8 bits count every key, and one block scan then places the list.
//
// Why a task of its own: the LDS one CTA spends most of a short row on the fixed cost of its
// phases (PERF.md), not on its keys. Here a 12-bit digit costs three block barriers: after
// the counts, after every wave has left the sum of its bins, and after the one thread whose bins
// hold the rank has written the digit (an 8-bit one, chosen by wave 0 alone, costs two). Each
// thread keeps its own bins in registers and learns the keys above them from a suffix scan in its
// wave and the sums of the waves above, so no wave reads another's bins. At 1024 threads the CTA
// is bound by instruction issue (PERF.md). That is why waves with empty bins skip their
// scans, why the last two digits count staged keys rather than test all eight keys of every
// thread (PERF.md), why ranks replace the last digit where few keys are left (one
// barrier fewer, and no bins to read: PERF.md), and why the staged keys' digit is an 8-bit
// one whose bins keep their keys (a few hundred staged keys over 256 bins leave a handful in T's
// bin, which wave 0 ranks: three barriers fewer than a 12-bit digit, a gather and ranks by the
// block; PERF.md). Part of select.h.
#pragma once
#include "select_tasks.h"

// Set by the host (src/gpu.rs source): SEL_REG_KEYS, keys a thread holds (src/layout.rs
// reg_keys_per_thread); SEL_REG_STAGE_ROOM, keys sharing T's 12-bit prefix that the CTA stages
// (REG_STAGE_ROOM), at most the candidate room so that P is that prefix (with their positions they
// take the first digit's histogram, read by then); SEL_REG_RANK_ROOM, staged keys sharing T's
// 20-bit prefix that find T by their ranks at most (REG_RANK_ROOM: each is compared with all of
// them, so the cost grows as the square); SEL_REG_BUCKET, staged keys an 8-bit bin keeps for wave 0
// to rank (REG_RANK_BUCKET, sel_reg_choose_bucket: the 256 buckets fill the second 12-bit digit's bins).
#if !defined(SEL_REG_KEYS) || !defined(SEL_REG_STAGE_ROOM) || !defined(SEL_REG_RANK_ROOM) || !defined(SEL_REG_BUCKET)
#error "the registers task's shape is set by the host (src/gpu.rs source): SEL_REG_KEYS, SEL_REG_STAGE_ROOM, SEL_REG_RANK_ROOM, SEL_REG_BUCKET"
#endif
#define SEL_REG_STAGED (SEL_REG_STAGE_ROOM < SEL_ROOM ? SEL_REG_STAGE_ROOM : SEL_ROOM)
// Lanes that split one ranked key's compares, each loading 4 keys at a time.
#define SEL_REG_RANK_PARTS 8u
#define SEL_REG_RANK_SPAN (4u * SEL_REG_RANK_PARTS)
// The digits from the top: 12 + 12 + 8 bits; thread t owns bins t * SEL_REG_PER .. + SEL_REG_PER
// of a 12-bit digit (the 8-bit one is wave 0's: sel_reg_choose_last).
#define SEL_REG_WIDE_BINS 4096u
#define SEL_REG_LAST_BINS 256u
#define SEL_REG_PER (SEL_REG_WIDE_BINS / SEL_BLOCK)

static_assert(SEL_REG_KEYS % 4 == 0 && SEL_REG_KEYS <= 32, "keys are loaded 4 at a time, marked in a u32");
static_assert(SEL_K < 1u << 16, "the placement packs two counts below k in one word");
static_assert(SEL_REG_KEYS * SEL_BLOCK < 1u << 16, "the staging packs a count below the row's length");
static_assert(2 * SEL_REG_STAGED <= SEL_REG_WIDE_BINS, "the staged keys and positions fit a histogram");
static_assert((SEL_REG_RANK_ROOM + SEL_REG_RANK_SPAN - 1) / SEL_REG_RANK_SPAN * SEL_REG_RANK_SPAN <= SEL_REG_WIDE_BINS,
              "the ranked keys, padded, fit in the second digit's bins");
static_assert(SEL_REG_RANK_ROOM < 1u << 16, "a ranked key's two counts are packed in one word");
static_assert(SEL_REG_LAST_BINS * SEL_REG_BUCKET <= SEL_REG_WIDE_BINS && SEL_REG_BUCKET <= MONO_WAVE,
              "the buckets fit in a 12-bit digit's bins, and one wave ranks a bucket");
static_assert(MONO_WAVE % SEL_REG_RANK_PARTS == 0, "a ranked key's lanes sit in one wave");

// A digit's bin and its counts: keys in the bins above it, keys in it.
struct sel_reg_digit {
  u32 bin, above, count;
};

// The registers task's state, at the start of its LDS.
struct alignas(16) sel_reg_smem {
  // The digits' histograms, one after another: 12, 12 and 8 bits (zeroed together). Once the
  // first is chosen its words take the staged keys and positions; on that way the second's words
  // hold the 8-bit bins' buckets, then the gathered keys to rank or, cleared, the last 12 bits.
  alignas(16) u32 hist[2 * SEL_REG_WIDE_BINS + SEL_REG_LAST_BINS];
  u32 wave_sum[SEL_WAVES];
  sel_reg_digit digit;  // the digit being chosen
  u32 ranked;           // ranked keys written so far
  u32 t, t_above;       // T as the ranks found it, and the ranked keys above it
  u32 wave_total[2][SEL_WAVES];  // the placement's scan
  // The list as positions, placed here and copied out in order: a key placed in LDS costs a few
  // instructions, in global memory about sixteen (PERF.md). The staged way copies out the
  // keys above P while wave 0 finds T, and writes the few staged keys' entries directly.
  u32 list[SEL_K];
#if SEL_TRACE
  u64* trace;  // thread 0 only; nullptr when this CTA is not traced
  u32 marks;
#endif
};
static_assert(sizeof(sel_reg_smem) <= SEL_LDS_BYTES, "the host's LDS size (src/layout.rs task_lds_bytes) is too small for the registers task");

// Inclusive, from the last lane down: lane l gets the sum over lanes l.. of its wave.
MONO_DEV u32 sel_wave_suffix(u32 v) {
#pragma unroll
  for (u32 d = 1; d < MONO_WAVE; d <<= 1) v = mono_shfl_down_add(v, d);
  return v;
}

// A 12-bit digit's bins are owned by the threads in order, SEL_REG_PER each, and read as quads.
// In order, the eight lanes that a 16-byte LDS access serves at once would put two or more of them
// on one bank group (a thread's bins 32 bytes or more apart); thread t's quad q lies at quad
// q ^ sel_reg_swizzle(t) instead, which gives each of the eight its own (PERF.md).
MONO_DEV u32 sel_reg_swizzle(u32 owner) {
  constexpr u32 quads = SEL_REG_PER / 4;
  constexpr u32 spread = quads >= 8 ? 1u : 8u / quads;  // lanes apart that share a group in order
  constexpr u32 mask = (quads < 8 ? quads : 8u) - 1u;
  return (owner / spread) & mask;
}
// The word of bin b of a 12-bit digit (counted there, read by its owner as quad q ^ swizzle).
MONO_DEV u32 sel_reg_slot(u32 b) { return b ^ sel_reg_swizzle(b / SEL_REG_PER) << 2; }

// N bins from `at` into h, as quads, quad q from quad q ^ swizzle; their sum.
template <u32 N>
MONO_DEV u32 sel_reg_bins(const u32* at, u32 (&h)[N], u32 swizzle) {
  static_assert(N % 4 == 0, "bins are read as quads");
  u32 sum = 0;
#pragma unroll
  for (u32 q = 0; q < N / 4; ++q) {
    const mono_u32x4 v = *(const mono_u32x4*)(at + 4 * (q ^ swizzle));
    h[4 * q] = v.x, h[4 * q + 1] = v.y, h[4 * q + 2] = v.z, h[4 * q + 3] = v.w;
    sum += v.x + v.y + v.z + v.w;
  }
  return sum;
}

// The bin among h (bins first .. first + N, `above` keys in the bins above them) that holds the
// rank-th key from the top, walking down from the last; the caller knows one of them does.
template <u32 N>
MONO_DEV sel_reg_digit sel_reg_walk(const u32 (&h)[N], u32 first, u32 above, u32 rank) {
#pragma unroll
  for (u32 j = N; j-- > 0;) {
    if (rank <= above + h[j]) return sel_reg_digit{first + j, above, h[j]};
    above += h[j];
  }
  return sel_reg_digit{SEL_NONE, above, 0};
}

// The bin of a 12-bit digit's hist (counts done, a barrier since) holding the rank-th key from the
// top. Each thread keeps its bins in registers and learns the keys above them: in its wave (a
// suffix scan), then in the waves above (their sums, after a barrier). The one thread whose bins
// hold the rank walks them and leaves the digit in sm.digit for all after a second barrier.
// Block-wide; false when the counts lost the rank.
MONO_DEV bool sel_reg_choose(sel_reg_smem& sm, const u32* hist, u32 rank, sel_reg_digit* d) {
  const u32 t = mono_thread(), lane = mono_lane(), wave = mono_wave();
  u32 h[SEL_REG_PER];
  const u32 mine = sel_reg_bins(hist + t * SEL_REG_PER, h, sel_reg_swizzle(t));
  // Most waves' bins are empty past the first digit (and many in it): those skip the scans.
  const bool counted = mono_ballot(mine != 0) != 0;
  const u32 suffix = counted ? sel_wave_suffix(mine) : 0u;
  if (lane == 0) sm.wave_sum[wave] = suffix;
  if (t == 0) sm.digit.bin = SEL_NONE;  // every thread read the last digit before the counts
  mono_sync_block();
  u32 above = 0;
  if (counted)
    above = mono_wave_sum_u32(lane > wave && lane < SEL_WAVES ? sm.wave_sum[lane] : 0u) + suffix - mine;
  if (counted && above < rank && rank <= above + mine) sm.digit = sel_reg_walk(h, t * SEL_REG_PER, above, rank);
  mono_sync_block();
  *d = sm.digit;
  return d->bin != SEL_NONE;
}

// The bin of an 8-bit digit's SEL_REG_LAST_BINS (counts done, a barrier since) holding the rank-th
// key from the top, as wave 0 sees it: its lanes hold every bin (SEL_REG_LAST_PER each), so one
// suffix scan finds it, and every lane gets it (bin SEL_NONE when the counts lost the rank).
#define SEL_REG_LAST_PER (SEL_REG_LAST_BINS / MONO_WAVE)
MONO_DEV sel_reg_digit sel_reg_wave_choose(const u32* hist, u32 rank) {
  const u32 lane = mono_lane();
  u32 h[SEL_REG_LAST_PER];
  const u32 mine = sel_reg_bins(hist + lane * SEL_REG_LAST_PER, h, 0u);
  const u32 suffix = sel_wave_suffix(mine), above = suffix - mine;
  const bool holds = above < rank && rank <= suffix;
  sel_reg_digit d{SEL_NONE, 0, 0};
  if (holds) d = sel_reg_walk(h, lane * SEL_REG_LAST_PER, above, rank);
  const u64 who = mono_ballot(holds);
  if (who == 0) return d;
  const u32 holder = mono_popc64(who ^ (who - 1)) - 1;  // the lowest set bit's lane
  return sel_reg_digit{mono_shfl(d.bin, holder), mono_shfl(d.above, holder), mono_shfl(d.count, holder)};
}

// The last digit's bin, as sel_reg_choose, but chosen by wave 0 alone (sel_reg_wave_choose), so
// one block barrier tells the others. Block-wide; false when the counts lost the rank.
MONO_DEV bool sel_reg_choose_last(sel_reg_smem& sm, const u32* hist, u32 rank, sel_reg_digit* d) {
  if (mono_wave() == 0) {
    const sel_reg_digit w = sel_reg_wave_choose(hist, rank);
    if (mono_lane() == 0) sm.digit = w;
  }
  mono_sync_block();
  *d = sm.digit;
  return d->bin != SEL_NONE;
}

// Wave 0 alone, the staged keys' 8-bit counts done (a barrier since): the bin of hist holding the
// rank-th key from the top, in sm.digit (bin SEL_NONE when the counts lost the rank); and when
// that bin's keys all sit in its bucket (buckets + bin * SEL_REG_BUCKET, any order), T among them
// by their ranks, in sm.t and sm.t_above (left SEL_NONE when no key has that rank). The caller's
// barrier tells the block.
MONO_DEV void sel_reg_choose_bucket(sel_reg_smem& sm, const u32* hist, const u32* buckets, u32 rank) {
  const u32 lane = mono_lane();
  const sel_reg_digit d = sel_reg_wave_choose(hist, rank);
  if (lane == 0) sm.digit = d;
  if (d.bin == SEL_NONE || d.count > SEL_REG_BUCKET) return;
  const u32 x = lane < d.count ? buckets[d.bin * SEL_REG_BUCKET + lane] : 0u, in_bin = rank - d.above;
  u32 over = 0, at_or_over = 0;
  for (u32 j = 0; j < d.count; ++j) {
    const u32 y = mono_shfl(x, j);
    over += y > x;
    at_or_over += y >= x;
  }
  // Keys equal to T all pass and write the same two words.
  if (lane < d.count && over < in_bin && in_bin <= at_or_over) sm.t = x, sm.t_above = over;
}

// Counts the digit (key >> shift) & dmask of this thread's valid keys that match (mask, bits):
// in the slots of a 12-bit digit (sel_reg_choose) or in order (the last digit's).
MONO_DEV void sel_reg_count(const u32 (&keys)[SEL_REG_KEYS], u32 valid, u32* hist, u32 mask, u32 bits, u32 shift,
                            u32 dmask, bool wide) {
#pragma unroll
  for (u32 j = 0; j < SEL_REG_KEYS; ++j) {
    const u32 b = (keys[j] >> shift) & dmask;
    if (j < valid && (keys[j] & mask) == bits) mono_count_lds_u32(hist + (wide ? sel_reg_slot(b) : b));
  }
}

// Places the positions of this thread's keys marked in m (bit j: position first + j) in the list,
// in order, from entry `index` while below k (only ties can reach it): a loop over the marks,
// which costs each wave about eleven instructions a mark of its busiest thread. Masked ties are
// placed as SEL_NONE (an entry of -1).
MONO_DEV void sel_reg_place_ties(sel_reg_smem& sm, u32 first, u32 m, u32 index, bool masked = false) {
#pragma unroll 1
  for (; m && index < SEL_K; m &= m - 1u) sm.list[index++] = masked ? SEL_NONE : first + mono_popc32((m & (~m + 1u)) - 1u);
}

// As sel_reg_place_ties for keys above T, which all lie below k. With 8 keys a thread, unrolled:
// a few predicated instructions a key, which beat the loop (PERF.md); with 16, the loop.
MONO_DEV void sel_reg_place(sel_reg_smem& sm, u32 first, u32 m, u32 index) {
  if constexpr (SEL_REG_KEYS <= 8) {
#pragma unroll
    for (u32 j = 0; j < SEL_REG_KEYS; ++j)
      if (m >> j & 1u) sm.list[index++] = first + j;
  } else {
    sel_reg_place_ties(sm, first, m, index);
  }
}

// The list, every entry placed (a barrier since), written out in order: positions, or cache
// slots through the page table. Block-wide.
MONO_DEV void sel_reg_write_list(sel_reg_smem& sm, const sel_row& r) {
  for (u32 e = mono_thread(); e < SEL_K; e += SEL_BLOCK) {
    const u32 pos = sm.list[e];
    r.out[e] = pos == SEL_NONE ? -1 : sel_entry(r, pos);
  }
}

// Exclusive prefix of v over the block in thread order, with one barrier (as sel_scan1, but the
// waves' totals, in sm.wave_total[0], summed by shuffles); two calls need a barrier between them.
MONO_DEV u32 sel_reg_scan(sel_reg_smem& sm, u32 v) {
  const u32 incl = sel_wave_scan(v), lane = mono_lane(), wave = mono_wave();
  if (lane == MONO_WAVE - 1) sm.wave_total[0][wave] = incl;
  mono_sync_block();
  return mono_wave_sum_u32(lane < wave ? sm.wave_total[0][lane] : 0u) + incl - v;
}

// As sel_reg_scan of a | b << 16 for two flags, a thread's wave counted by ballots rather than a
// scan of shuffles (a few instructions and no chain of shuffle latencies).
MONO_DEV u32 sel_reg_scan_kinds(sel_reg_smem& sm, bool a, bool b) {
  const u32 lane = mono_lane(), wave = mono_wave();
  const u64 in_a = mono_ballot(a), in_b = mono_ballot(b), below = (1ull << lane) - 1u;
  if (lane == 0) sm.wave_total[0][wave] = mono_popc64(in_a) | mono_popc64(in_b) << 16;
  mono_sync_block();
  return mono_wave_sum_u32(lane < wave ? sm.wave_total[0][lane] : 0u) + (mono_popc64(in_a & below) | mono_popc64(in_b & below) << 16);
}

// T among the n (at most SEL_REG_RANK_ROOM) keys at `ranked`, in any order and padded with zeros
// to SEL_REG_RANK_SPAN: the key with fewer than `rank` of them above it and at least `rank` at or
// above it. SEL_REG_RANK_PARTS neighbouring lanes split a key's compares (four keys a load, so a
// key's lanes read consecutive words), and whole waves go round the loop, as their shuffles need.
// sm.t_above must be SEL_NONE, set before a barrier. Block-wide; false when no key has that rank
// (the counts lost it).
MONO_DEV bool sel_reg_rank(sel_reg_smem& sm, const u32* ranked, u32 n, u32 rank, u32* t, u32* t_above) {
  const u32 part = mono_thread() % SEL_REG_RANK_PARTS;
  const u32 pairs = (n * SEL_REG_RANK_PARTS + MONO_WAVE - 1) / MONO_WAVE * MONO_WAVE;
  for (u32 p = mono_thread(); p < pairs; p += SEL_BLOCK) {
    const u32 i = p / SEL_REG_RANK_PARTS, x = ranked[i];  // i < n rounded up to 8: padded
    u32 above = 0, at_or_above = 0;
    for (u32 j = 4 * part; j < n; j += SEL_REG_RANK_SPAN) {
      const mono_u32x4 v = *(const mono_u32x4*)(ranked + j);
      above += (v.x > x) + (v.y > x) + (v.z > x) + (v.w > x);
      at_or_above += (v.x >= x) + (v.y >= x) + (v.z >= x) + (v.w >= x);
    }
    u32 both = above | at_or_above << 16;
#pragma unroll
    for (u32 d = 1; d < SEL_REG_RANK_PARTS; d <<= 1) both += mono_shfl_xor(both, d);
    above = both & 0xffffu, at_or_above = both >> 16;
    // Keys equal to T all pass and write the same two words.
    if (part == 0 && i < n && above < rank && rank <= at_or_above) sm.t = x, sm.t_above = above;
  }
  mono_sync_block();
  *t = sm.t, *t_above = sm.t_above;
  return *t_above != SEL_NONE;
}

// The rest of the row when P is T's 12-bit prefix d and its d.count keys fit the stage (above12
// keys lie above it): the keys above P placed, those sharing it staged, an 8-bit digit from the
// staged keys, then T by the ranks of the staged keys sharing its 20-bit prefix when they fit
// the rank room, else by a 12-bit digit over them, then the staged keys placed. Block-wide.
MONO_DEV bool sel_regs_staged(sel_reg_smem& sm, const sel_row& r, const u32 (&keys)[SEL_REG_KEYS], u32 first,
                              u32 valid, sel_reg_digit d, u32 above12) {
  const u32 p12 = d.bin << 20, p_top = p12 | ~sel_mask(12);
  u32 ma = 0, ms = 0;  // above P; sharing it
#pragma unroll
  for (u32 j = 0; j < SEL_REG_KEYS; ++j) {
    ma |= (u32)(keys[j] > p_top) << j;
    ms |= (u32)(keys[j] >= p12 && keys[j] <= p_top) << j;
  }
  // Past the row's end a key is 0, which a prefix of NaN keys can match: exactly d.count are staged.
  if (valid < SEL_REG_KEYS) ms &= (1u << valid) - 1u;
  const u32 t = mono_thread();
  if (t == 0) sm.ranked = 0, sm.t_above = SEL_NONE;
  const u32 before = sel_reg_scan(sm, mono_popc32(ma) | mono_popc32(ms) << 16);
  u32* staged = sm.hist;
  u32* staged_pos = staged + SEL_REG_STAGED;
  if (ms) {
    u32 i = before >> 16;
#pragma unroll
    for (u32 j = 0; j < SEL_REG_KEYS; ++j)
      if (ms >> j & 1u) staged[i] = keys[j], staged_pos[i] = first + j, ++i;
  }
  mono_sync_block();
  // The keys above P, placed in the list while the few threads with staged keys count them.
  sel_reg_place(sm, first, ma, before & 0xffffu);
  sel_mark(sm, SEL_PH_ABOVE);
  // The second digit (8 bits) over the staged keys, each bin keeping its first SEL_REG_BUCKET
  // keys in its bucket (in the 12-bit bins, unused so far on this way); wave 0 chooses it, and
  // finds T by ranks when T's bin fits its bucket (a random row: one to four keys).
  const u32 n = d.count;
  u32* second = sm.hist + SEL_REG_WIDE_BINS;
  u32* last = sm.hist + 2 * SEL_REG_WIDE_BINS;
  for (u32 s = t; s < n; s += SEL_BLOCK) {
    const u32 key = staged[s], b = (key >> 12) & (SEL_REG_LAST_BINS - 1u);
    const u32 slot = mono_fetch_add_lds_u32(last + b, 1u);
    if (slot < SEL_REG_BUCKET) second[b * SEL_REG_BUCKET + slot] = key;
  }
  mono_sync_block();
  if (mono_wave() == 0)
    sel_reg_choose_bucket(sm, last, second, SEL_K - above12);
  else  // The list's first above12 entries are final: the other waves write them out meanwhile.
    for (u32 e = t - MONO_WAVE; e < above12; e += SEL_BLOCK - MONO_WAVE) r.out[e] = sel_entry(r, sm.list[e]);
  mono_sync_block();
  const sel_reg_digit w = sm.digit;
  if (w.bin == SEL_NONE) {
    sel_flag(r, SEL_FLAG_LOST);
    return false;
  }
  const u32 p20 = p12 | w.bin << 12, rank20 = SEL_K - above12 - w.above, above20 = above12 + w.above;
  u32 bits, above_t;
  if (w.count <= SEL_REG_BUCKET) {
    if (sm.t_above == SEL_NONE) {
      sel_flag(r, SEL_FLAG_LOST);
      return false;
    }
    bits = sm.t, above_t = above20 + sm.t_above;
    sel_mark(sm, SEL_PH_RANKED);
  } else if (w.count <= SEL_REG_RANK_ROOM) {
    // The staged keys sharing T's 20-bit prefix, gathered (any order) over the buckets, read by
    // now, and padded; T is the one of the right rank among them.
    for (u32 s = t; s < n; s += SEL_BLOCK)
      if (staged[s] >> 12 == p20 >> 12) second[mono_fetch_add_lds_u32(&sm.ranked, 1u)] = staged[s];
    const u32 padded = (w.count + SEL_REG_RANK_SPAN - 1) / SEL_REG_RANK_SPAN * SEL_REG_RANK_SPAN;
    if (w.count + t < padded) second[w.count + t] = 0;
    mono_sync_block();
    u32 above_in_20;
    if (!sel_reg_rank(sm, second, w.count, rank20, &bits, &above_in_20)) {
      sel_flag(r, SEL_FLAG_LOST);
      return false;
    }
    above_t = above20 + above_in_20;
    sel_mark(sm, SEL_PH_RANKED);
  } else {
    // The last 12 bits over the staged keys sharing T's 20-bit prefix, in the 12-bit bins, once
    // the buckets are cleared from them.
    for (u32 i = t; i < SEL_REG_WIDE_BINS / 4; i += SEL_BLOCK) *(mono_u32x4*)(second + 4 * i) = mono_u32x4{0, 0, 0, 0};
    mono_sync_block();
    for (u32 s = t; s < n; s += SEL_BLOCK)
      if (staged[s] >> 12 == p20 >> 12) mono_count_lds_u32(second + sel_reg_slot(staged[s] & (SEL_REG_WIDE_BINS - 1u)));
    mono_sync_block();
    sel_reg_digit v;
    if (!sel_reg_choose(sm, second, rank20, &v)) {
      sel_flag(r, SEL_FLAG_LOST);
      return false;
    }
    bits = p20 | v.bin, above_t = above20 + v.above;
    sel_mark(sm, SEL_PH_WIDE);
  }
  // The staged keys above T from above12, then the ties from above_t until k, written out
  // directly (the list's last entries, one a thread): a block scan of both kinds (packed) over the
  // staged keys, SEL_BLOCK at a time.
  u32 next_above = above12, next_tie = above_t;
  for (u32 c = 0; c < n; c += SEL_BLOCK) {
    if (c > 0) mono_sync_block();  // every thread has read the last round's totals
    const u32 i = c + t, key = i < n ? staged[i] : 0u;
    const bool above = i < n && key > bits, tied = i < n && key == bits;
    const u32 k_before = sel_reg_scan_kinds(sm, above, tied);
    if (above) r.out[next_above + (k_before & 0xffffu)] = sel_entry(r, staged_pos[i]);
    const u32 tie = next_tie + (k_before >> 16);
    if (tied && tie < SEL_K) r.out[tie] = bits == SEL_MASKED_KEY ? -1 : sel_entry(r, staged_pos[i]);
    if (c + SEL_BLOCK < n) {
      const u32 total = mono_wave_sum_u32(mono_lane() < SEL_WAVES ? sm.wave_total[0][mono_lane()] : 0u);
      next_above += total & 0xffffu, next_tie += total >> 16;
    }
  }
  sel_mark(sm, SEL_PH_PLACED);
  return true;
}

// The histograms zeroed, as sel_regs_run needs them: it touches no global memory, so a task does
// it before it waits on its inputs. Block-wide, no barrier.
MONO_DEV void sel_regs_clear(sel_reg_smem& sm) {
  constexpr u32 hist_quads = sizeof(sm.hist) / 16;
#pragma unroll
  for (u32 i = 0; i < (hist_quads + SEL_BLOCK - 1) / SEL_BLOCK; ++i)
    if (i * SEL_BLOCK + mono_thread() < hist_quads)
      *(mono_u32x4*)(sm.hist + 4 * (i * SEL_BLOCK + mono_thread())) = mono_u32x4{0, 0, 0, 0};
}

// The row on this CTA, its keys in registers; sel_regs_clear before it (its first barrier
// comes after the keys are loaded). Block-wide.
MONO_DEV bool sel_regs_run(sel_reg_smem& sm, const sel_row& r) {
  const u32 first = mono_thread() * SEL_REG_KEYS;
  u32 keys[SEL_REG_KEYS];
#pragma unroll
  for (u32 q = 0; q < SEL_REG_KEYS / 4; ++q) {
    const mono_u32x4 v =
        first + 4 * q + 4 <= r.stride ? *(const mono_u32x4*)(r.scores + first + 4 * q) : mono_u32x4{0, 0, 0, 0};
    keys[4 * q] = v.x, keys[4 * q + 1] = v.y, keys[4 * q + 2] = v.z, keys[4 * q + 3] = v.w;
  }
  if (r.len <= SEL_K) {
    sel_short_row(r, sm.wave_total[0]);
    return true;
  }
  if (r.len > SEL_REG_KEYS * SEL_BLOCK) {
    sel_flag(r, SEL_FLAG_SHAPE);
    return false;
  }
  const u32 valid = r.len > first ? (r.len - first < SEL_REG_KEYS ? r.len - first : SEL_REG_KEYS) : 0u;
  // Scores to keys, flagging NaN. Past the row's end a key is 0, below every valid key, so it is
  // never counted in T's bins (a row here has more than k keys) nor placed; only a thread's quads
  // at or past the end need that, so whole quads take the short way.
  bool nan = false;
#pragma unroll
  for (u32 q = 0; q < SEL_REG_KEYS / 4; ++q) {
    if (4 * q + 4 <= valid) {
#pragma unroll
      for (u32 j = 4 * q; j < 4 * q + 4; ++j) {
        nan |= (keys[j] & 0x7fffffffu) > 0x7f800000u;
        keys[j] = sel_radix_key(keys[j]);
      }
    } else {
#pragma unroll
      for (u32 j = 4 * q; j < 4 * q + 4; ++j) {
        nan |= j < valid && (keys[j] & 0x7fffffffu) > 0x7f800000u;
        keys[j] = j < valid ? sel_radix_key(keys[j]) : 0u;
      }
    }
  }
  if (nan) mono_st_relaxed_u32(r.flags + SEL_FLAG_NAN, 1u);
  mono_sync_block();
  sel_mark(sm, SEL_PH_LOADED);
  // The first digit (12 bits) over every key: no prefix to test, and a thread whose keys are all
  // in the row tests no bound either (the common loop takes about 90 instructions a warp here).
  if (valid == SEL_REG_KEYS) {
#pragma unroll
    for (u32 j = 0; j < SEL_REG_KEYS; ++j) mono_count_lds_u32(sm.hist + sel_reg_slot(keys[j] >> 20));
  } else {
#pragma unroll
    for (u32 j = 0; j < SEL_REG_KEYS; ++j)
      if (j < valid) mono_count_lds_u32(sm.hist + sel_reg_slot(keys[j] >> 20));
  }
  mono_sync_block();
  sel_reg_digit d12;
  if (!sel_reg_choose(sm, sm.hist, SEL_K, &d12)) {
    sel_flag(r, SEL_FLAG_LOST);
    return false;
  }
  if (d12.count <= SEL_REG_STAGED) return sel_regs_staged(sm, r, keys, first, valid, d12, d12.above);
  sel_mark(sm, SEL_PH_WIDE);
  // The other two digits over every key, one loop body for both (the second runs from the
  // instruction cache): T's bits so far, their length, the rank of T below them, the keys above
  // them; and at 12 and 24 bits, the keys sharing and above the prefix (P's candidates).
  u32 bits = d12.bin << 20, len = 12, rank = SEL_K - d12.above, above = d12.above;
  const u32 sharing12 = d12.count, above12 = d12.above;
  u32 sharing24 = 0, above24 = 0, ties = 0;
#pragma unroll 1
  for (u32 i = 1; i < 3; ++i) {
    const u32 width = i < 2 ? 12u : 8u, shift = 32u - len - width;
    u32* hist = sm.hist + i * SEL_REG_WIDE_BINS;
    sel_reg_count(keys, valid, hist, sel_mask(len), bits, shift, (1u << width) - 1u, i < 2);
    mono_sync_block();
    sel_reg_digit d;
    if (!(i < 2 ? sel_reg_choose(sm, hist, rank, &d) : sel_reg_choose_last(sm, hist, rank, &d))) {
      sel_flag(r, SEL_FLAG_LOST);
      return false;
    }
    bits |= d.bin << shift, len += width, rank -= d.above, above += d.above;
    if (i == 1) sharing24 = d.count, above24 = above;
    if (i == 2) ties = d.count;
    sel_mark(sm, SEL_PH_WIDE);
  }
  // P: T's 12-bit prefix when the keys sharing it fit the room, else its 24-bit one when those
  // fit, else T (the contract's stops, src/reference.rs threshold).
  // A key's prefix is above P iff the key is above P's largest key (P with every bit below set).
  const u32 t = bits, above_t = above;
  const bool at12 = sharing12 <= SEL_ROOM, at24 = !at12 && sharing24 <= SEL_ROOM;
  const u32 p_top = t | (at12 ? ~sel_mask(12) : (at24 ? ~sel_mask(24) : 0u));
  const u32 above_p = at12 ? above12 : (at24 ? above24 : above_t);
  u32 ma = 0, mb = 0, mc = 0;  // above P; sharing P above T; equal to T
#pragma unroll
  for (u32 j = 0; j < SEL_REG_KEYS; ++j) {
    ma |= (u32)(keys[j] > p_top) << j;
    mb |= (u32)(keys[j] > t && keys[j] <= p_top) << j;
    mc |= (u32)(keys[j] == t) << j;
  }
  // One block scan of the three kinds' counts (the first two packed: each below k). The ties need
  // theirs only when T repeats: a lone T is the k-th entry, whoever holds it.
  const u32 ab = mono_popc64(ma) | mono_popc64(mb) << 16, c = mono_popc64(mc);
  const u32 lane = mono_lane(), wave = mono_wave();
  const u32 iab = sel_wave_scan(ab), ic = ties > 1 ? sel_wave_scan(c) : c;
  if (lane == MONO_WAVE - 1) sm.wave_total[0][wave] = iab, sm.wave_total[1][wave] = ic;
  mono_sync_block();
  const u32 ab_before = mono_wave_sum_u32(lane < wave ? sm.wave_total[0][lane] : 0u) + iab - ab;
  const u32 c_before = ties > 1 ? mono_wave_sum_u32(lane < wave ? sm.wave_total[1][lane] : 0u) + ic - c : 0u;
  sel_mark(sm, SEL_PH_SCANNED);
  sel_reg_place(sm, first, ma, ab_before & 0xffffu);
  sel_reg_place(sm, first, mb, above_p + (ab_before >> 16));
  sel_reg_place_ties(sm, first, mc, above_t + c_before, t == SEL_MASKED_KEY);
  mono_sync_block();
  sel_reg_write_list(sm, r);
  sel_mark(sm, SEL_PH_PLACED);
  return true;
}
