// A slice's (or the streaming one CTA's) descent, the loads, the one CTA over a row in LDS, short
// rows, and the bodies of the slice and one-CTA tasks (select_decode.h). Part of select.h.
#pragma once
#include "select_place.h"

// ---- a slice, or the streaming one CTA -----------------------------------------------------------
// After the keys are in src and the row has more than k: the descent, then the placement. x.c set:
// slice x.me of x.count, candidates staged to boxes cand_box.. as (key, position) pairs; alone:
// candidates to cand_pos / cand_key. The rounds' pair counts live where the candidates go after
// the rounds; first_counted: the load counted the first pair there (sel_load). Errors are flagged
// on the row; false (in every thread) only when a wait gave up.
template <class Src>
MONO_DEV bool sel_descend(sel_smem& sm, const Src& src, const sel_row& r, const sel_x& x, u32 cand_box, u32* cand_pos,
                          u32* cand_key, bool first_counted) {
  if (!first_counted)
    for (u32 i = 4 * mono_thread(); i < SEL_WIDE_BINS; i += SEL_GROUP) *(mono_u32x4*)(cand_pos + i) = mono_u32x4{0, 0, 0, 0};
  sel_start(sm, r.len);
  bool stalled = false;
  while (!sel_stopped(sm.st)) {
    if (!sel_round(sm, src, x, cand_pos, first_counted && sm.st.round == 0, &stalled)) {
      sel_flag(r, stalled ? SEL_FLAG_STALLED : SEL_FLAG_LOST);
      return !stalled;
    }
  }
  const sel_state st = sm.st;  // a copy: the tail's passes change sm.st
  // One pass places the keys above P and, at 32 bits, the ties; else stages the keys sharing P.
  auto write = [&](u32 i, u32 pos, u32 key) { sel_write(r, i, pos, key); };
  if (st.len == 32) {
    sel_compact_prefix(sm, src, st, st.above_before, write, st.above + st.sharing_before, write);
    sel_mark(sm, SEL_PH_PLACED);
    return true;
  }
  if (x.c) {
    sel_compact_prefix(sm, src, st, st.above_before, write, st.sharing_before, [&](u32 i, u32 pos, u32 key) {
      sel_put_relaxed(*x.c, cand_box + 2 * i, key);
      sel_put_relaxed(*x.c, cand_box + 2 * i + 1, pos);
    });
    sel_mark(sm, SEL_PH_ABOVE);
    if (x.me != 0) return true;
    // Every slice's pairs in one batched poll, then the block agrees (a barrier).
    const bool ok = sel_poll_all(*x.c, cand_box, 2 * st.sharing, [&](u32 i, u32 v) {
      if (i & 1u)
        cand_pos[i / 2] = v;
      else
        cand_key[i / 2] = v;
    });
    if (!mbx_block_agree(*x.c, ok)) {
      sel_flag(r, SEL_FLAG_STALLED);
      return false;
    }
    sel_mark(sm, SEL_PH_CANDS);
  } else {
    sel_compact_prefix(sm, src, st, st.above_before, write, 0,
                       [&](u32 i, u32 pos, u32 key) { cand_pos[i] = pos, cand_key[i] = key; });
    mono_sync_block();
    sel_mark(sm, SEL_PH_ABOVE);
  }
  if (!sel_tail(sm, r, cand_pos, cand_key, st.sharing)) sel_flag(r, SEL_FLAG_LOST);
  return true;
}

// Loads positions first..first + n of the row into LDS as radix keys, flagging NaN (a NaN's key
// lies outside [key(-inf), key(+inf)]), and counts the descent's first pair of digits of every
// key (the prefix is empty) into pairs, zeroed here: the first round then reads no key
// (sel_count_pairs). Each thread issues SEL_LOAD_BATCH 16-byte loads before it uses the first.
// Block-wide.
MONO_DEV void sel_load(const sel_row& r, u32 first, u32 n, u32* keys, u32* pairs) {
  for (u32 i = 4 * mono_thread(); i < SEL_WIDE_BINS; i += SEL_GROUP) *(mono_u32x4*)(pairs + i) = mono_u32x4{0, 0, 0, 0};
  mono_sync_block();
  const u32 shift = sel_shift(1);
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
        mono_count_lds_u32(pairs + (k[j] >> shift));
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
      mono_atomic_add_lds_u32(hist + (k[j] >> shift) * SEL_FIRST_COPIES + copy, 1u);
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
  const sel_run run(0, src.n);
  const u32 first = run.start, end = run.end;
  u64 m1 = 0, m2 = 0, mc = 0;  // above P; sharing P above T's 20 bits; sharing T's 20 bits
  for (u32 q = 0; q < run.quads; ++q) {
    const u32 at = run.at(q), i = first + 4 * at;
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
        mono_atomic_add_lds_u32(hist + ((k[j] >> shift) & (SEL_WIDE_BINS - 1u)), 1u);
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
  sel_write_marked(src, r, first, m3, sm.st.above + c_before, t);
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

// A row of at most k keys: its unmasked keys in position order, then -1 (a NaN flagged), SEL_BLOCK
// positions at a time, each placed by a ballot and the waves' totals (wave_totals: SEL_WAVES
// words of shared memory). Block-wide.
MONO_DEV void sel_short_row(const sel_row& r, u32* wave_totals) {
  const u32 lane = mono_lane(), wave = mono_wave();
  bool nan = false;
  u32 next = 0;  // entries of the chunks before this one
  for (u32 c0 = 0; c0 < r.len; c0 += SEL_BLOCK) {
    const u32 i = c0 + mono_thread();
    const u32 bits = i < r.len ? mono_f32_bits(r.scores[i]) : SEL_MASKED_BITS;
    nan |= sel_is_nan(bits);
    const bool keep = bits != SEL_MASKED_BITS;
    const u64 votes = mono_ballot(keep);
    if (lane == 0) wave_totals[wave] = mono_popc64(votes);
    mono_sync_block();
    u32 before = 0, total = 0;
#pragma unroll
    for (u32 w = 0; w < SEL_WAVES; ++w) {
      const u32 x = wave_totals[w];
      before += w < wave ? x : 0u;
      total += x;
    }
    if (keep) r.out[next + before + mono_popc64(votes & (((u64)1 << lane) - 1u))] = sel_entry(r, i);
    next += total;
    mono_sync_block();  // every thread has read the totals before the next chunk's
  }
  if (nan) mono_st_relaxed_u32(r.flags + SEL_FLAG_NAN, 1u);
  for (u32 i = next + mono_thread(); i < SEL_K; i += SEL_BLOCK) r.out[i] = -1;
}

// ---- task bodies ---------------------------------------------------------------------------------
// Slice `me` of the `count` slices of the row (src/layout.rs Slices). Every slice of the row must
// run at once (each waits for the others' histograms): they are a gang. lds: SEL_LDS_WORDS words.
// hist_box: SelectBoxes::hist_box(row, 0, 0); cand_box: SelectBoxes::cand_box(row, 0). Errors are
// flagged on the row; false only when a wait gave up.
MONO_DEV bool sel_slice_run(sel_smem& sm, u32* lds, const mbx_ctx& c, const sel_row& r, u32 me, u32 count,
                            u32 hist_box, u32 cand_box) {
  if (count == 0 || count > SEL_MAX_SLICES || me >= count || (r.len <= SEL_K && count != 1)) {
    sel_flag(r, SEL_FLAG_SHAPE);
    return true;
  }
  if (r.len <= SEL_K) {
    sel_short_row(r, sm.wtot[0]);
    return true;
  }
  const u32 chunk = sel_chunk(r.len, count), first = me * chunk;
  // A slice past the first never starts at or past the end, and none is longer than the LDS room,
  // when the host cut the row (src/layout.rs Slices::new); a descriptor that says otherwise is flagged.
  if (first >= r.len || chunk > SEL_SLICE_KEYS) {
    sel_flag(r, SEL_FLAG_SHAPE);
    return true;
  }
  const u32 n = (first + chunk < r.len ? first + chunk : r.len) - first;
  u32* cand_pos = lds + SEL_SLICE_KEYS;
  sel_load(r, first, n, lds, cand_pos);
  sel_mark(sm, SEL_PH_LOADED);
  const sel_lds_keys src{lds, n, first};
  const sel_x x{&c, hist_box, me, count};
  return sel_descend(sm, src, r, x, cand_box, cand_pos, cand_pos + SEL_ROOM4, true);
}

// The whole row on this CTA: keys in LDS with wide digits when they fit, else by rounds read from
// global memory every pass. Errors are flagged on the row.
MONO_DEV void sel_one_cta_run(sel_smem& sm, u32* lds, const sel_row& r) {
  if (r.len <= SEL_K) return sel_short_row(r, sm.wtot[0]);
  if (r.len <= SEL_SLICE_KEYS) return (void)sel_one_cta_lds(sm, lds, lds + SEL_SLICE_KEYS, r);
  const sel_x alone{nullptr, 0, 0, 1};
  u32* cand_pos = lds + SEL_SLICE_KEYS;
  u32* cand_key = cand_pos + SEL_ROOM4;
  // The NaN check of a streamed row: one pass of its own.
  bool nan = false;
  for (u32 i = mono_thread(); i < r.len; i += SEL_BLOCK) nan |= sel_is_nan(mono_f32_bits(r.scores[i]));
  if (nan) mono_st_relaxed_u32(r.flags + SEL_FLAG_NAN, 1u);
  sel_descend(sm, sel_row_keys{r.scores, r.len}, r, alone, 0, cand_pos, cand_key, false);
}
