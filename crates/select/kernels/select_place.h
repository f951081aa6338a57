// Placing the list: the row a task works on, compactions in position order, wide digits on
// shared-memory atomics, the one-pass placement, and the candidates' tail. Part of select.h.
#pragma once
#include "select_rounds.h"
#include "ops/paging.h"

// ---- placement -----------------------------------------------------------------------------------
// The row a select task works on.
struct sel_row {
  const float* scores;  // the row's scores
  u32 len;              // its keys
  u32 stride;           // keys readable from scores: at least len, a multiple of 4
  i32* out;             // its SEL_K entries
  const u32* pages;     // its request's pages (ops/paging.h), or nullptr for positions
  u32* flags;           // its SEL_FLAGS error words
};

MONO_DEV i32 sel_entry(const sel_row& r, u32 pos) {
  return r.pages ? mono_page_slot(r.pages, pos, SEL_PAGE_TOKENS) : (i32)pos;
}

MONO_DEV void sel_flag(const sel_row& r, u32 which) {
  if (mono_thread() == 0) mono_st_relaxed_u32(r.flags + which, 1u);
}

// Emits, in position order, the keys of src that keep_a() accepts as indices first_a, first_a + 1,
// ... through emit_a(index, pos, key), and those keep_b() accepts (none of the same keys) from
// first_b through emit_b: both kinds in one pass over the keys. Per chunk of 32 * SEL_BLOCK keys
// (one for a slice or the candidates), thread t takes its run (sel_run, at most 32 keys) and marks
// those of each kind in a 32-bit mask; one block scan of both counts (16 bits each) gives its
// first indices. Block-wide, one barrier a chunk; uses sm.wtot[0], so a barrier must come before
// its next user.
template <class Src, class KeepA, class EmitA, class KeepB, class EmitB>
MONO_DEV void sel_compact2(sel_smem& sm, const Src& src, KeepA keep_a, u32 first_a, EmitA emit_a, KeepB keep_b,
                           u32 first_b, EmitB emit_b) {
  constexpr u32 chunk = 32 * SEL_BLOCK;
  static_assert(chunk <= 0xffffu + 1u, "a chunk's counts fit 16 bits");
  for (u32 c0 = 0; c0 < src.n; c0 += chunk) {
    if (c0 > 0) mono_sync_block();  // every thread has read the last chunk's scan words
    const sel_run run(c0, src.n - c0 < chunk ? src.n - c0 : chunk);
    u32 ma = 0, mb = 0;
    // A run that ends before the chunk's end (all but one thread's) tests no key's bound.
    auto mark = [&](u32 q, bool whole) {
      const u32 at = run.at(q), i = run.start + 4 * at;
      if (i >= run.end) return;
      u32 k[4];
      src.load4(i, k);
#pragma unroll
      for (u32 j = 0; j < 4; ++j) {
        const bool in = whole || i + j < run.end;
        ma |= in && keep_a(k[j]) ? 1u << (4 * at + j) : 0u;
        mb |= in && keep_b(k[j]) ? 1u << (4 * at + j) : 0u;
      }
    };
    if (run.whole())
      for (u32 q = 0; q < run.quads; ++q) mark(q, true);
    else
      for (u32 q = 0; q < run.quads; ++q) mark(q, false);
    u32 total;
    const u32 before = sel_scan1(sm, 0, mono_popc32(ma) | mono_popc32(mb) << 16, &total);
    sel_mark(sm, SEL_PH_SCANNED);
    u32 ia = first_a + (before & 0xffffu), ib = first_b + (before >> 16);
    for (u32 m = ma; m; m &= m - 1) {
      const u32 i = run.start + mono_popc32((m & (~m + 1)) - 1);
      emit_a(ia++, src.pos(i), src.key(i));
    }
    for (u32 m = mb; m; m &= m - 1) {
      const u32 i = run.start + mono_popc32((m & (~m + 1)) - 1);
      emit_b(ib++, src.pos(i), src.key(i));
    }
    first_a += total & 0xffffu, first_b += total >> 16;
  }
}

// sel_compact2 of the keys above st's prefix P (as emit_a) and those sharing it (as emit_b); P's
// keys are bits .. bits + low, so each test is one compare (sel_shares).
template <class Src, class EmitA, class EmitB>
MONO_DEV void sel_compact_prefix(sel_smem& sm, const Src& src, const sel_state& st, u32 first_a, EmitA emit_a,
                                 u32 first_b, EmitB emit_b) {
  const u32 low = ~sel_mask(st.len), top = st.bits | low;
  sel_compact2(sm, src, [&](u32 key) { return key > top; }, first_a, emit_a,
               [&](u32 key) { return sel_shares(key, st.bits, low); }, first_b, emit_b);
}

// The row's entries from index first: every index is below SEL_K by construction for keys above
// T; ties past the k-th are dropped. A masked key (a tie at a masked T) is an entry of -1.
MONO_DEV void sel_write(const sel_row& r, u32 index, u32 pos, u32 key) {
  if (index < SEL_K) r.out[index] = key == SEL_MASKED_KEY ? -1 : sel_entry(r, pos);
}

// ---- wide digits on shared-memory atomics --------------------------------------------------------
// These loops run over every key of a row on one SM, so their cost is instructions per key, not
// latency: each keeps the per-key work to a compare and (for a matching key) one atomic.

// The digit of `width` bits holding the rank-th key from the top, from hist: SEL_FIRST_BINS bins
// of SEL_FIRST_COPIES copies each when `copies` (the first pass, bin b copy c at b * copies + c),
// else 1 << width plain bins. Extends sm.st by it. Thread t
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
        if (i + j < src.n && (k[b][j] & mask) == bits) mono_atomic_add_lds_u32(hist + ((k[b][j] >> shift) & dmask), 1u);
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

// ---- the placement of a list in one pass ---------------------------------------------------------
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

// Writes the keys of a thread's run marked in m (bit b: key first + b), in order, from index, all
// of them equal to `key` (the ties) or above it (SEL_NONE).
template <class Src>
MONO_DEV void sel_write_marked(const Src& src, const sel_row& r, u32 first, u64 m, u32 index, u32 key = SEL_NONE) {
  while (m) {
    const u64 low = m & (~m + 1);
    m ^= low;
    sel_write(r, index++, src.pos(first + mono_popc64(low - 1)), key);
  }
}

// Places every key of src the cut takes, in position order. Thread t takes a run of `run`
// consecutive keys: it counts them by kind (reading its quads rotated by t, so the threads of a
// wave hit different banks) and marks each kind in a mask; one block scan gives each thread its
// first index of each kind; then it writes its marked keys in order. Block-wide, one barrier.
template <class Src>
MONO_DEV void sel_place(sel_smem& sm, const Src& src, const sel_cut& cut, const sel_row& r) {
  const sel_run run(0, src.n);
  const u32 first = run.start, end = run.end;
  u64 m1 = 0, m2 = 0, m3 = 0;  // above P; sharing P above T; equal to T
  for (u32 q = 0; q < run.quads; ++q) {
    const u32 at = run.at(q), i = first + 4 * at;
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
  sel_write_marked(src, r, first, m3, cut.above_t + c_before, cut.t);
}

// ---- the first slice (or the streaming one CTA): the candidates ----------------------------------
// At most a wave of candidates (the usual case at 24 bits: a handful of keys share T's 24-bit
// prefix): one wave ranks them against each other with shuffles, finds T (the rank-th largest),
// and places them with ballots, with no block barrier and no histogram. The same list as the
// wide digits give. Lanes past n hold key 0, below every candidate.
MONO_DEV bool sel_tail_wave(const sel_state& st, const sel_row& r, const u32* cand_pos, const u32* cand_key, u32 n) {
  const u32 lane = mono_lane();
  const bool in = lane < n;
  const u32 key = in ? cand_key[lane] : 0u;
  u32 greater = 0, equal = 0;
  for (u32 j = 0; j < n; ++j) {
    const u32 other = mono_shfl(key, j);
    greater += other > key ? 1u : 0u;
    equal += other == key ? 1u : 0u;
  }
  const u64 t_lanes = mono_ballot(in && greater < st.rank && st.rank <= greater + equal);
  if (t_lanes == 0) return false;
  const u32 t = mono_shfl(key, mono_popc64((t_lanes & (~t_lanes + 1)) - 1));
  const u64 below = ((u64)1 << lane) - 1u;
  const u64 above_t = mono_ballot(in && key > t), ties = mono_ballot(in && key == t);
  if (in && key > t) sel_write(r, st.above + mono_popc64(above_t & below), cand_pos[lane], key);
  if (in && key == t) sel_write(r, st.above + mono_popc64(above_t) + mono_popc64(ties & below), cand_pos[lane], key);
  return true;
}

// Finds the rest of T among the n candidates (keys and positions, in position order, all sharing
// the prefix P in sm.st) and places them after the row's keys above P. Block-wide.
MONO_DEV bool sel_tail(sel_smem& sm, const sel_row& r, const u32* cand_pos, const u32* cand_key, u32 n) {
  if (n <= MONO_WAVE) {
    const bool ok = mono_wave() != 0 || sel_tail_wave(sm.st, r, cand_pos, cand_key, n);
    sel_mark(sm, SEL_PH_PLACED);
    return ok;
  }
  for (u32 i = mono_thread(); i < SEL_TAIL_BINS; i += SEL_BLOCK) sm.tail_hist[i] = 0;
  mono_sync_block();
  const sel_cand_keys src{cand_key, cand_pos, n};
  const u32 p_len = sm.st.len, p_bits = sm.st.bits, p_above = sm.st.above;
  if (!sel_wide_finish(sm, sm.tail_hist, src)) return false;
  sel_place(sm, src, sel_cut_of(p_len, p_bits, p_above, sm.st), r);
  sel_mark(sm, SEL_PH_PLACED);
  return true;
}
