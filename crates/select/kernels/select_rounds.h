// The descent by 6-bit digits: how a slice trades its counts with the others of its row, the
// rounds, and the batched polls. Part of select.h.
#pragma once
#include "select_shape.h"

// ---- how a slice trades with the others of its row -----------------------------------------------
struct sel_x {
  const mbx_ctx* c;  // nullptr: the slice is alone (one CTA, or the first slice resolving)
  u32 hist_box;      // box of (this row, round 0, slice 0); SelectBoxes::hist_box
  u32 me, count;     // this slice, slices of the row
};

// This slice's box of word w of `round` (SelectBoxes::hist_box).
MONO_DEV u32 sel_my_box(const sel_x& x, u32 round, u32 w) {
  return x.hist_box + (round * SEL_MAX_SLICES + x.me) * SEL_HIST_BOXES + w;
}

// A box that carries its own data: a relaxed store of (tag, value), no flag behind it.
MONO_DEV void sel_put_relaxed(const mbx_ctx& c, u32 box, u32 value) {
  mono_st_relaxed_u64(c.scratch + box, mbx_pack(c.tag, value));
}

// ---- rounds (PERF.md) ----------------------------------------------------------------------------
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
      if (pending && mbx_bound_expired(++sweeps)) {
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
// after the row sums, or before the odd round's decision), after the decision.
template <class Src>
MONO_DEV bool sel_round_pair(sel_smem& sm, const Src& src, const sel_x& x, u32* hist, bool counted, bool* stalled) {
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
  // Every thread has read this round's state (above, and in the loop around it) before wave 0
  // changes it: gathered, the wait's barrier says so; alone, the even round's barrier after its
  // counts, and for the odd round this one (without it a late wave could read the next round's
  // state, take the other parity and miss a barrier).
  if (odd && !x.c) mono_sync_block();
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
    // lanes after it , both scans side by side.
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
  const bool ok = sel_round_pair(sm, src, x, hist, counted, stalled);
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
