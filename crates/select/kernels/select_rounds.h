// The descent by 6-bit digits: ballot histograms, how a slice trades its counts with the others of
// its row, the first and the fast rounds, and the batched polls. Part of select.h.
#pragma once
#include "select_shape.h"

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

// This slice's box of word w of `round` (SelectBoxes::hist_box).
MONO_DEV u32 sel_my_box(const sel_x& x, u32 round, u32 w) {
  return x.hist_box + (round * SEL_MAX_SLICES + x.me) * SEL_HIST_BOXES + w;
}

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
    const u32 mine = sel_my_box(x, round, 0);
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
// Rounds go in pairs (0-1, 2-3, 4-5: the stops at 12 and 24 bits end a pair). The even round
// counts the keys under the prefix by both digits at once, hist[hi * stride + lo] with hi its own
// digit, lo the next round's and stride = 1 << sel_width(round + 1), on shared-memory atomics
// (SEL_WIDE_BINS words of the candidates' room, which the rounds do not use yet). Its own counts
// are the sums of the rows; the odd round's are the row of the digit the even round chose, so the
// odd round reads no key. The counts published are the same as one 6-bit count a round.
static_assert(SEL_WIDE_BINS >= SEL_BINS * SEL_BINS && SEL_WIDE_BINS <= SEL_CAND_WORDS, "a pair's counts fit");

template <class Src>
MONO_DEV void sel_count_pairs(u32* hist, const Src& src, u32 bits, u32 len, u32 round) {
  const u32 low = ~sel_mask(len), shift = sel_shift(round + 1);
  const u32 pair_mask = (1u << (sel_width(round) + sel_width(round + 1))) - 1u;
  auto count = [&](u32 key) {
    if (sel_shares(key, bits, low)) mono_count_lds_u32(hist + ((key >> shift) & pair_mask));
  };
  for (u32 base = 4 * mono_thread(); base < src.n; base += SEL_LOAD_BATCH * SEL_GROUP) {
    u32 k[SEL_LOAD_BATCH][4];
#pragma unroll
    for (u32 b = 0; b < SEL_LOAD_BATCH; ++b) src.load4(base + b * SEL_GROUP, k[b]);
    // Only a slice's last pass can run past its end: the other passes test no bound.
    if (base + (SEL_LOAD_BATCH - 1) * SEL_GROUP + 4 <= src.n) {
#pragma unroll
      for (u32 b = 0; b < SEL_LOAD_BATCH; ++b)
#pragma unroll
        for (u32 j = 0; j < 4; ++j) count(k[b][j]);
    } else {
#pragma unroll
      for (u32 b = 0; b < SEL_LOAD_BATCH; ++b)
#pragma unroll
        for (u32 j = 0; j < 4; ++j)
          if (base + b * SEL_GROUP + j < src.n) count(k[b][j]);
    }
  }
}

// The even round's counts: sm.total[b] = the sum of row b of the pair counts (`stride` words),
// by every thread: SEL_BLOCK / SEL_BINS consecutive threads a row (8 at 512), 16-byte reads of
// consecutive words, then xor shuffles within the group. Gathered (x.c), the first thread of each
// even row also publishes the round's word of its two rows at once. Block-wide; the caller
// synchronises before reading sm.total.
MONO_DEV void sel_row_sums(sel_smem& sm, const u32* hist, u32 stride, const sel_x& x, u32 round) {
  constexpr u32 parts = SEL_BLOCK / SEL_BINS;
  static_assert(parts >= 1 && 2 * parts <= MONO_WAVE && (parts & (parts - 1)) == 0,
                "a row pair's threads are lanes of one wave");
  const u32 t = mono_thread(), row = t / parts, part = t % parts;
  // A row shorter than its threads (stride 4, the last pair) is summed by its first thread.
  const u32 span = stride >= 4 * parts ? stride / parts : (part == 0 ? stride : 0u);
  const u32* words = hist + row * stride + part * span;
  u32 s = 0;
  for (u32 i = 0; i < span; i += 4) {
    const mono_u32x4 x = *(const mono_u32x4*)(words + i);
    s += x.x + x.y + x.z + x.w;
  }
#pragma unroll
  for (u32 m = 1; m < parts; m <<= 1) s += mono_shfl_xor(s, m);
  const u32 next_row = mono_shfl(s, mono_lane() + parts);  // the odd row's sum, for an even row's first thread
  if (part == 0) sm.total[row] = s;
  if (x.c && part == 0 && row % 2 == 0) sel_put_relaxed(*x.c, sel_my_box(x, round, row / 2), s | (next_row << 16));
}

// Like mbx_wait_all (box i by thread i % SEL_BLOCK), but a thread issues up to SEL_POLL_BATCH
// loads before it looks at the first, and polls again all the boxes of its batch not yet ready
// together: one L2 round trip per sweep, not one per box (bounded in debug builds, as mbx_poll).
// Each ready value goes to take(i, value). This thread's answer: the caller agrees with the block
// (mbx_block_agree), after it has stored what it took, so that one barrier serves both.
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
  return ok;
}

// One round with one wave deciding. Lane w of wave 0 owns bins 2w and 2w + 1 (box word w). The
// even round counts the pair of digits (unless counted: the load did) and sums the rows into its
// own counts, publishing them as it goes; once it has chosen its digit, wave 0 keeps that digit's
// row (the odd round's counts) in sm.pair_row and publishes it as the odd round's words at once.
// The odd round clears the pair counts for the next pair, which no one reads before its last
// barrier. Barriers: after the counts (even rounds), after the gather (gathered rounds; alone,
// after the row sums), after the decision.
template <class Src>
MONO_DEV bool sel_round_fast(sel_smem& sm, const Src& src, const sel_x& x, u32* hist, bool counted, bool* stalled) {
  sel_state& st = sm.st;
  const u32 t = mono_thread(), l = mono_lane();
  const u32 round = st.round, rank = st.rank, odd = round & 1u;
  const u32 stride = 1u << sel_width(odd ? round : round + 1);
  if (!odd) {
    if (!counted) {
      sel_count_pairs(hist, src, st.bits, st.len, round);
      mono_sync_block();
      sel_mark(sm, SEL_PH_COUNTED);
    }
    sel_row_sums(sm, hist, stride, x, round);
    if (!x.c) mono_sync_block();  // alone, wave 0 reads sm.total next; gathered, after the polls
  }
  const bool owner = mono_wave() == 0 && l < SEL_HIST_BOXES;
  u32 tlo = 0, thi = 0, blo = 0, bhi = 0;  // counts of the low / high bin: total, slices before me
  if (odd)
    for (u32 i = 4 * t; i < SEL_WIDE_BINS; i += SEL_GROUP) *(mono_u32x4*)(hist + i) = mono_u32x4{0, 0, 0, 0};
  if (!x.c && owner) {
    const u32* counts = odd ? sm.pair_row : sm.total;
    tlo = counts[2 * l], thi = counts[2 * l + 1];
  }
  if (x.c) {
    // This round's words are out already: the even round's went with its row sums, the odd
    // round's with the even round's decision.
    // Thread t polls word t % SEL_HIST_BOXES of some slices and sums what it sees.
    u32 s[4] = {0, 0, 0, 0};
    const u32 first = x.hist_box + round * SEL_MAX_SLICES * SEL_HIST_BOXES;
    const bool ok = sel_poll_all(*x.c, first, x.count * SEL_HIST_BOXES, [&](u32 i, u32 v) {
      const u32 lo = v & 0xffffu, hi = v >> 16, before = i / SEL_HIST_BOXES < x.me;
      s[0] += lo, s[1] += hi, s[2] += before ? lo : 0u, s[3] += before ? hi : 0u;
    });
    const u32 g = t / SEL_HIST_BOXES, w = t % SEL_HIST_BOXES;
    sm.sums[g][w] = mono_u32x4{s[0], s[1], s[2], s[3]};
    if (!mbx_block_agree(*x.c, ok)) {
      *stalled = true;
      return false;
    }
    sel_mark(sm, SEL_PH_GATHERED);
    if (owner) {
#pragma unroll
      for (u32 q = 0; q < SEL_BLOCK / SEL_HIST_BOXES; ++q) {
        const mono_u32x4 v = sm.sums[q][l];
        tlo += v.x, thi += v.y, blo += v.z, bhi += v.w;
      }
    }
    sel_mark(sm, SEL_PH_SUMMED);
  }
  if (mono_wave() == 0) {
    // Keys above a lane's bins, of the row and of the slices before this one: the sums over the
    // lanes after it (src/descent.rs choose_digit), both scans side by side.
    const u32 incl = sel_wave_scan(tlo + thi), before_incl = sel_wave_scan(blo + bhi);
    const u32 above_hi = mono_shfl(incl, MONO_WAVE - 1) - incl, above_lo = above_hi + thi;
    const u32 before_hi = mono_shfl(before_incl, MONO_WAVE - 1) - before_incl, before_lo = before_hi + bhi;
    const bool in_hi = above_hi < rank && rank <= above_hi + thi;
    const bool in_lo = !in_hi && above_lo < rank && rank <= above_lo + tlo;
    const u64 found = mono_ballot(in_hi || in_lo);  // one lane at most: the bins tile the counts
    const u32 at = found ? mono_popc64(found - 1) : 0u;
    const u32 d = mono_shfl(in_hi ? 2 * l + 1 : 2 * l, at);
    const u32 d_above = mono_shfl(in_hi ? above_hi : above_lo, at);
    const u32 sharing = mono_shfl(in_hi ? thi : tlo, at);
    const u32 above_before = mono_shfl(in_hi ? before_hi : before_lo, at);
    const u32 sharing_before = mono_shfl(in_hi ? bhi : blo, at);
    sel_mark(sm, SEL_PH_DECIDED);
    if (!odd && owner) {
      // The next round's counts are known now: they go out before the block hears of this digit.
      const u32* row = hist + (found ? d : 0u) * stride;
      const u32 lo = 2 * l < stride ? row[2 * l] : 0u, hi = 2 * l + 1 < stride ? row[2 * l + 1] : 0u;
      sm.pair_row[2 * l] = lo, sm.pair_row[2 * l + 1] = hi;
      if (x.c && found) sel_put_relaxed(*x.c, sel_my_box(x, round + 1, l), lo | (hi << 16));
    }
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
MONO_DEV bool sel_round(sel_smem& sm, const Src& src, const sel_x& x, u32* hist, bool counted, bool* stalled) {
#if SEL_FAST_ROUNDS
  const bool ok = sel_round_fast(sm, src, x, hist, counted, stalled);
#else
  (void)hist, (void)counted;
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
