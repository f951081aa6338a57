// The select stage's task functions: the exact top-k of a score row by a 6-bit digit descent, on
// one CTA or on up to 64 slices (one CTA each) that all-gather their digit histograms through
// tagged pairs. The contract is src/reference.rs; src/cpu.rs is this file step for step on CPU
// threads, and src/descent.rs / src/layout.rs hold the formulas mirrored here (same names).
//
// Per round, a slice counts the digits of its keys that match the prefix found so far (a wave
// counts 64 keys at once with 7 ballots, no atomics), publishes the 64 counts as 32 tagged pairs
// of 16-bit counts, waits for every slice of its row, sums them, and picks the digit holding the
// rank-th key. It stops at 12 or 24 bits when the keys sharing the prefix fit in the candidate
// room, else at 32. Then it places its keys above the prefix (in position order, after those of
// the slices before it); at 32 bits its ties take their places directly; otherwise it stages the
// positions of its keys sharing the prefix, and the row's first slice continues the descent on
// those candidates alone and places them.
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
// so one GPU run can time both.
#ifndef SEL_FAST_ROUNDS
#define SEL_FAST_ROUNDS 1
#endif
// Polls a thread issues before it looks at the first (fast rounds); covers SEL_ROOM4 boxes at once.
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
// Dynamic LDS of a select task: the slice's keys, then candidate positions and candidate keys.
#define SEL_LDS_WORDS (SEL_SLICE_KEYS + 2 * SEL_ROOM4)

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
  };
  u32 slice_above[SEL_MAX_SLICES];
  u32 slice_at[SEL_MAX_SLICES];
  u32 scan_a[MONO_WAVE];
  u32 scan_b[MONO_WAVE];
  // Fast rounds: per group of SEL_HIST_BOXES threads, the counts of the gathered words it polled
  // (low and high bin of word w), over all slices and over the slices before this one.
  sel_state st;
};

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

// Exclusive prefix of v over the block in thread order; *total gets the sum. Block-wide, two
// barriers; back-to-back calls are safe (each array is rewritten only after a barrier that every
// reader of its last values has passed).
MONO_DEV u32 sel_block_scan(sel_smem& sm, u32 v, u32* total) {
  const u32 incl = sel_wave_scan(v);
  if (mono_lane() == MONO_WAVE - 1) sm.scan_a[mono_wave()] = incl;
  mono_sync_block();
  if (mono_wave() == 0) {
    const u32 x = mono_lane() < SEL_WAVES ? sm.scan_a[mono_lane()] : 0u;
    sm.scan_b[mono_lane()] = sel_wave_scan(x);
  }
  mono_sync_block();
  *total = sm.scan_b[SEL_WAVES - 1];
  return (mono_wave() > 0 ? sm.scan_b[mono_wave() - 1] : 0u) + incl - v;
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
  MONO_DEV u32 pos(u32 i) const { return positions[i]; }
};

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
MONO_DEV u32 sel_wave_sum(u32 v) {
#pragma unroll
  for (u32 m = MONO_WAVE / 2; m > 0; m >>= 1) v += mono_shfl_xor(v, m);
  return v;
}

// Block-wide, like mbx_wait_all (box i by thread i % SEL_BLOCK, then the block agrees), but a
// thread issues up to SEL_POLL_BATCH loads before it looks at the first: one L2 round trip for
// the boxes that are ready, not one per box. A box not yet ready is polled on alone (bounded in
// debug builds). Each ready value goes to take(i, value).
template <class Take>
MONO_DEV bool sel_poll_all(const mbx_ctx& c, u32 first, u32 n, Take take) {
  bool ok = true;
  for (u32 base = 0; base < n; base += SEL_POLL_BATCH * SEL_BLOCK) {
    u64 w[SEL_POLL_BATCH];
#pragma unroll
    for (u32 j = 0; j < SEL_POLL_BATCH; ++j) {
      const u32 i = base + j * SEL_BLOCK + mono_thread();
      w[j] = i < n ? mbx_load(c.scratch + first + i) : 0;
    }
#pragma unroll
    for (u32 j = 0; j < SEL_POLL_BATCH; ++j) {
      const u32 i = base + j * SEL_BLOCK + mono_thread();
      if (i < n && ok) {
        u32 v = mbx_value_of(w[j]);
        if (mbx_tag_of(w[j]) != c.tag) ok = mbx_poll(c, first + i, &v);
        take(i, v);
      }
    }
  }
  return mbx_block_agree(c, ok);
}

MONO_DEV bool sel_wait_all(const mbx_ctx& c, u32 first, u32 n, u32* dst) {
#if SEL_FAST_ROUNDS
  return sel_poll_all(c, first, n, [&](u32 i, u32 v) { dst[i] = v; });
#else
  return mbx_wait_all(c, first, n, dst);
#endif
}

// One round with one wave deciding. Lane w of wave 0 owns bins 2w and 2w + 1 (box word w).
// Barriers: after the counts, after the gather (gathered only), after the decision.
template <class Src>
MONO_DEV bool sel_round_fast(sel_smem& sm, const Src& src, const sel_x& x, bool* stalled) {
  sel_state& st = sm.st;
  const u32 t = mono_thread(), l = mono_lane();
  const u32 round = st.round, rank = st.rank;
  sel_count_waves(sm, src, st.bits, st.len, round);
  mono_sync_block();
  const bool owner = mono_wave() == 0 && l < SEL_HIST_BOXES;
  u32 tlo = 0, thi = 0, blo = 0, bhi = 0;  // counts of the low / high bin: total, slices before me
  if (owner) {
#pragma unroll
    for (u32 w = 0; w < SEL_WAVES; ++w) tlo += sm.whist[w][2 * l], thi += sm.whist[w][2 * l + 1];
  }
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
MONO_DEV bool sel_round(sel_smem& sm, const Src& src, const sel_x& x, bool* stalled) {
#if SEL_FAST_ROUNDS
  return sel_round_fast(sm, src, x, stalled);
#else
  return sel_round_first(sm, src, x, stalled);
#endif
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
// through emit(index, pos). Block-wide.
template <class Src, class Keep, class Emit>
MONO_DEV void sel_compact(sel_smem& sm, const Src& src, Keep keep, u32 first, Emit emit) {
  u32 run = first;
  for (u32 base = 0; base < src.n; base += SEL_GROUP) {
    const u32 i = base + 4 * mono_thread();
    u32 k[4];
    src.load4(i, k);
    bool take[4];
    u32 n = 0;
#pragma unroll
    for (u32 j = 0; j < 4; ++j) {
      take[j] = i + j < src.n && keep(k[j]);
      n += take[j];
    }
    u32 total;
    u32 at = run + sel_block_scan(sm, n, &total);
#pragma unroll
    for (u32 j = 0; j < 4; ++j)
      if (take[j]) emit(at++, src.pos(i + j));
    run += total;
  }
}

// The row's entries from index first: every index is below SEL_K by construction for keys above
// T; ties past the k-th are dropped.
MONO_DEV void sel_write(const sel_row& r, u32 index, u32 pos) {
  if (index < SEL_K) r.out[index] = sel_entry(r, pos);
}

// ---- the first slice (or the one CTA): the candidates ---------------------------------------------
// Continues the descent on the n candidates (positions in cand_pos, position order) and places
// them: those above T after the row's keys above the prefix, then the ties until k.
MONO_DEV bool sel_resolve(sel_smem& sm, const sel_row& r, u32* cand_pos, u32* cand_key, u32 n) {
  for (u32 i = mono_thread(); i < n; i += SEL_BLOCK) cand_key[i] = sel_radix_key(mono_f32_bits(r.scores[cand_pos[i]]));
  mono_sync_block();
  const sel_cand_keys src{cand_key, cand_pos, n};
  const u32 stop_above = sm.st.above;
  const sel_x alone{nullptr, 0, 0, 1};
  bool stalled = false;
  while (sm.st.len < 32)
    if (!sel_round(sm, src, alone, &stalled)) return false;
  const u32 t = sm.st.bits, above = sm.st.above;
  sel_compact(sm, src, [&](u32 key) { return key > t; }, stop_above, [&](u32 i, u32 pos) { sel_write(r, i, pos); });
  sel_compact(sm, src, [&](u32 key) { return key == t; }, above, [&](u32 i, u32 pos) { sel_write(r, i, pos); });
  return true;
}

// ---- a slice, or the one CTA ---------------------------------------------------------------------
// After the keys are in src and the row has more than k: the descent, then the placement. x.c set:
// slice x.me of x.count, candidates staged to boxes cand_box..; alone: candidates to cand_pos.
template <class Src>
MONO_DEV bool sel_descend(sel_smem& sm, const Src& src, const sel_row& r, const sel_x& x, u32 cand_box, u32* cand_pos,
                          u32* cand_key) {
  sel_start(sm, r.len);
  bool stalled = false;
  while (!sel_stopped(sm.st)) {
    if (!sel_round(sm, src, x, &stalled)) {
      sel_flag(r, stalled ? SEL_FLAG_STALLED : SEL_FLAG_LOST);
      return false;
    }
  }
  const sel_state st = sm.st;  // a copy: the resolver's rounds change sm.st
  const u32 mask = sel_mask(st.len);
  auto write = [&](u32 i, u32 pos) { sel_write(r, i, pos); };
  sel_compact(sm, src, [&](u32 key) { return (key & mask) > st.bits; }, st.above_before, write);
  if (st.len == 32) {
    sel_compact(sm, src, [&](u32 key) { return key == st.bits; }, st.above + st.sharing_before, write);
    return true;
  }
  auto sharing = [&](u32 key) { return (key & mask) == st.bits; };
  if (x.c) {
    sel_compact(sm, src, sharing, st.sharing_before, [&](u32 i, u32 pos) { sel_put_relaxed(*x.c, cand_box + i, pos); });
    if (x.me != 0) return true;
    if (!sel_wait_all(*x.c, cand_box, st.sharing, cand_pos)) {
      sel_flag(r, SEL_FLAG_STALLED);
      return false;
    }
  } else {
    sel_compact(sm, src, sharing, 0, [&](u32 i, u32 pos) { cand_pos[i] = pos; });
    mono_sync_block();
  }
  if (!sel_resolve(sm, r, cand_pos, cand_key, st.sharing)) {
    sel_flag(r, SEL_FLAG_LOST);
    return false;
  }
  return true;
}

// Loads positions first..first + n of the row into LDS as radix keys, flagging NaN. Block-wide.
MONO_DEV void sel_load(const sel_row& r, u32 first, u32 n, u32* keys) {
  bool nan = false;
  for (u32 i = 4 * mono_thread(); i < n; i += SEL_GROUP) {
    const mono_u32x4 v = *(const mono_u32x4*)(r.scores + first + i);
    const u32 b[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (u32 j = 0; j < 4; ++j) nan |= i + j < n && sel_is_nan(b[j]);
    *(mono_u32x4*)(keys + i) = mono_u32x4{sel_radix_key(v.x), sel_radix_key(v.y), sel_radix_key(v.z), sel_radix_key(v.w)};
  }
  if (nan) mono_st_relaxed_u32(r.flags + SEL_FLAG_NAN, 1u);
  mono_sync_block();
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
  const sel_lds_keys src{lds, n, first};
  const sel_x x{&c, hist_box, me, count};
  return sel_descend(sm, src, r, x, cand_box, lds + SEL_SLICE_KEYS, lds + SEL_SLICE_KEYS + SEL_ROOM4);
}

// The whole row on this CTA: keys in LDS when they fit, else read from global memory every pass.
MONO_DEV bool sel_one_cta_task(sel_smem& sm, u32* lds, const sel_row& r) {
  if (r.len <= SEL_K) {
    sel_short_row(r, 0, r.len, 0);
    return true;
  }
  const sel_x alone{nullptr, 0, 0, 1};
  u32* cand_pos = lds + SEL_SLICE_KEYS;
  u32* cand_key = cand_pos + SEL_ROOM4;
  if (r.len <= SEL_SLICE_KEYS) {
    sel_load(r, 0, r.len, lds);
    return sel_descend(sm, sel_lds_keys{lds, r.len, 0}, r, alone, 0, cand_pos, cand_key);
  }
  // The NaN check of a streamed row: one pass of its own.
  bool nan = false;
  for (u32 i = mono_thread(); i < r.len; i += SEL_BLOCK) nan |= sel_is_nan(mono_f32_bits(r.scores[i]));
  if (nan) mono_st_relaxed_u32(r.flags + SEL_FLAG_NAN, 1u);
  return sel_descend(sm, sel_row_keys{r.scores, r.len}, r, alone, 0, cand_pos, cand_key);
}
