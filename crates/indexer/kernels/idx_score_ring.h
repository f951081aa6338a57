// Scoring one run of pages for one row group on wgmma (IDX_WGMMA; the same scores as idx_score.h).
//
// The keys never wait in registers. The run's pages alternate between the run team's two
// warpgroups (page 2j + w is warpgroup w's j-th), and each warpgroup streams its own pages: one of
// its threads has the copy engine bring each page from the cache straight into the warpgroup's ring
// of IDX_RING page slots in LDS, each slot with an LDS barrier that completes when its bytes have
// landed, so IDX_RING - 1 pages are in flight while the warpgroup scores the current one. A
// warpgroup barrier frees the slot it scored last, which is refilled right after it: the two
// warpgroups never wait for each other, so one's tensor work runs while the other waits for its
// keys or sums its scores. The group's queries sit in LDS as wgmma's B tile, so a page's whole
// contraction for every row of the group is a handful of asynchronous instructions, and each
// score is complete in the warpgroup: written straight out, no partial sums.
#pragma once
#include "idx_score.h"
#include "ops/copy.h"

#if IDX_WGMMA
static_assert(IDX_RUN_THREADS == IDX_BATCH_PAGES * IDX_WG_THREADS, "a warpgroup a page of each pair");
static_assert(IDX_BATCH_PAGES == 2, "pages alternate between two warpgroups");
static_assert(IDX_GROUP_ROWS <= 4, "a row of the group per lane of a quad writes the scores");
static_assert(IDX_RING >= 2, "a slot being scored and one in flight");
static_assert(IDX_RING * IDX_BATCH_PAGES <= IDX_TASK_PAGES, "the first ring fill's page ids come with the task");

#define IDX_RING_QUERY_BYTES IDX_WG_QUERY_BYTES
#define IDX_RING_WEIGHT_BYTES (((IDX_GROUP_ROWS * IDX_HEADS * 4 + 1023) / 1024) * 1024)
// A slot: one page as cached, keys then scales.
#define IDX_RING_PAGE_BYTES (IDX_PAGE_KEY_BYTES + IDX_PAGE_TOKENS * 4)
static_assert(IDX_RING_PAGE_BYTES == IDX_PAGE_BYTES, "a slot holds a page as cached, keys then scales");
// LDS of a run's team: 1024 bytes of slack to align the base (the B tiles' swizzle repeats every
// 1024 bytes), the queries, the weights, the two warpgroups' rings (the host's gpu.rs
// score_lds_bytes reserves as much a team).
#define IDX_RUN_LDS_BYTES \
  (1024 + IDX_RING_QUERY_BYTES + IDX_RING_WEIGHT_BYTES + IDX_BATCH_PAGES * IDX_RING * IDX_RING_PAGE_BYTES)

// A run team's LDS: the B tile (every head of every row in f16, idx_wg_offset) at `query`, 1024-byte
// aligned, then the weights [GROUP_ROWS][HEADS], the [2][RING] barriers of the slots (a slot's
// copies have landed), the run's words (below), and the [2][RING] page slots as cached, each at a
// fixed offset from it. The run's start writes the tile and the weights through the pointer; the page
// loop and what follows it reach everything from the 32-bit LDS address alone, at constant offsets
// the loads and copies take as immediates: held apart, each base or address takes registers of the
// page loop, which then spills at 128.
struct idx_ring {
  u8* query;
  u32 lds;  // LDS address of `query`
};
#define IDX_RING_WEIGHTS_AT IDX_RING_QUERY_BYTES
#define IDX_RING_LANDED_AT (IDX_RING_WEIGHTS_AT + IDX_GROUP_ROWS * IDX_HEADS * 4)
// Words of the run the page loop reads where it needs them rather than hold them through the MMAs
// (held, each takes a register of the 4-row MMAs'): the run's index (on the pages patched and after
// the loop), the first token the patch replaces (idx_patch_lowest: at each page's start), the
// request's page-list offset (by the copying thread, under the MMAs).
#define IDX_RING_RUN_AT (IDX_RING_LANDED_AT + IDX_BATCH_PAGES * IDX_RING * 8)
#define IDX_RING_LOWEST_AT (IDX_RING_RUN_AT + 4)
#define IDX_RING_LIST_AT (IDX_RING_RUN_AT + 8)
// A traced build's: where each warpgroup marks, the run's first page (idx_marker).
#define IDX_RING_MARKS_AT (IDX_RING_RUN_AT + 16)
#define IDX_RING_FIRST_AT (IDX_RING_MARKS_AT + 8 * IDX_BATCH_PAGES)
#define IDX_RING_SLOTS_AT (IDX_RING_WEIGHTS_AT + IDX_RING_WEIGHT_BYTES)
static_assert(IDX_RING_RUN_AT % 8 == 0 && IDX_RING_FIRST_AT + 4 <= IDX_RING_SLOTS_AT,
              "the barriers and the run's words follow the weights");

MONO_DEV idx_ring idx_ring_of(u8* lds) {
  u8* query = lds + ((1024u - (mono_lds_address(lds) & 1023u)) & 1023u);
  return idx_ring{query, mono_lds_address(query)};
}
// The B tile's descriptors' start field (mono_smem_desc_start).
MONO_DEV u32 idx_ring_query_start(const idx_ring& ring) { return (ring.lds & 0x3ffffu) >> 4; }
MONO_DEV u32 idx_ring_landed(const idx_ring& ring) { return ring.lds + IDX_RING_LANDED_AT; }
MONO_DEV u32 idx_ring_run_index(const idx_ring& ring) { return idx_lds_u32(ring.lds + IDX_RING_RUN_AT); }

// Slot s of warpgroup w's ring (its j-th page goes to slot j % RING): the page as an LDS address
// (keys, then scales at IDX_PAGE_KEY_BYTES), its barrier.
MONO_DEV u32 idx_slot_lds(const idx_ring& ring, u32 w, u32 s) {
  return ring.lds + IDX_RING_SLOTS_AT + (w * IDX_RING + s) * IDX_RING_PAGE_BYTES;
}
// (From an unhoisted base: the compiler otherwise adds the barriers' offset to the base once, before
// the page loop, and holds the sum beside the base through it.)
MONO_DEV u32 idx_slot_landed(const idx_ring& ring, u32 w, u32 s) {
  return idx_unhoisted(ring.lds) + 8u * (w * IDX_RING + s) + IDX_RING_LANDED_AT;
}

// Pages of the run that warpgroup w scores.
MONO_DEV u32 idx_wg_pages(const idx_run& run, u32 w) { return (run.n_pages + 1u - w) / 2u; }

// The warpgroup's first thread (leader) arms slot s's barrier and starts the copy of a page
// (physical id phys) into the slot, one bulk copy of its keys and scales (contiguous in the cache
// and in the slot); nothing when the page is past the warpgroup's last (!live).
MONO_DEV void idx_ring_load(const idx_args& a, const idx_ring& ring, u32 w, u32 s, bool leader, bool live, u32 phys) {
  if (leader && live) {
    const u32 landed = idx_slot_landed(ring, w, s), dst = idx_slot_lds(ring, w, s);
    const u8* src = a.cache_read + (u64)phys * IDX_PAGE_BYTES;
    mono_lds_barrier_expect(landed, IDX_RING_PAGE_BYTES);
    mono_copy_bulk(dst, src, IDX_RING_PAGE_BYTES, landed);
  }
}

// A trace build's marks (src/trace.rs): IDX_TRACE_WORDS words per (run, warpgroup), run-major,
// written when idx_args::trace is set. The warpgroup's first thread stamps the SM's cycle counter
// when a phase ends (comparable within a CTA), and the global timer at the start and the end
// (comparable across CTAs and launches). A mark after a load is taken once the loaded value is in
// a register (`after`).
#define IDX_TRACE_WORDS 64
#define IDX_MARK_START_NS 0
#define IDX_MARK_SM 1
#define IDX_MARK_START 2
#define IDX_MARK_TASK 3     // the task's group is loaded
#define IDX_MARK_QUERIES 4  // the queries are in the B tile
// Page j's marks, IDX_MARK_PAGES + IDX_MARKS_A_PAGE j + one of the four below, for j < IDX_MARK_MAX_PAGES.
#define IDX_MARK_PAGES 6
#define IDX_MARKS_A_PAGE 4
#define IDX_MARK_WAITING 0  // the warpgroup starts waiting for the page's bytes
#define IDX_MARK_LANDED 1   // they have landed
#define IDX_MARK_ISSUED 2   // the page's MMAs are issued
#define IDX_MARK_SCORED 3   // its scores are written
#define IDX_MARK_MAX_PAGES 14
#define IDX_MARK_END 62
#define IDX_MARK_END_NS 63
static_assert(IDX_MARK_PAGES + IDX_MARKS_A_PAGE * IDX_MARK_MAX_PAGES <= IDX_MARK_END, "the page marks fit before the end");
// Where one warpgroup of a run marks: its leader's words, or null (no marks), kept in the run's
// LDS (IDX_RING_MARKS_AT) with the run's first page (IDX_RING_FIRST_AT, which numbers the
// warpgroup's pages): held in registers, they spilled the traced build's page loop.
struct idx_marker {
  u32 at;  // LDS address of the run's marks' words
  MONO_DEV void mark(u32 slot, u64 value) const {
#if IDX_TRACE
    const u32 t = mono_thread() % IDX_RUN_THREADS;
    if (t % IDX_WG_THREADS != 0) return;
    u64* words = (u64*)idx_lds_u64(at + IDX_RING_MARKS_AT + 8u * (t / IDX_WG_THREADS));
    if (words) words[slot] = value;
#else
    (void)slot, (void)value;
#endif
  }
  MONO_DEV void cycles(u32 slot, u32 after = 0) const {
#if IDX_TRACE
    asm volatile("" ::"r"(after));
    mark(slot, mono_clock_cycles());
#else
    (void)slot, (void)after;
#endif
  }
  // Mark `which` (IDX_MARK_WAITING ..) of the request's page `page` (the warpgroup's j-th).
  MONO_DEV void page(u32 page, u32 which) const {
#if IDX_TRACE
    const u32 j = (page - idx_lds_u32(at + IDX_RING_FIRST_AT)) / IDX_BATCH_PAGES;
    if (j < IDX_MARK_MAX_PAGES) cycles(IDX_MARK_PAGES + IDX_MARKS_A_PAGE * j + which);
#else
    (void)page, (void)which;
#endif
  }
};
// The marker of warpgroup w of run `run`: its leader stores where it marks (the run's first page
// follows with the run's other words).
MONO_DEV idx_marker idx_marker_of(const idx_args& a, const idx_ring& ring, u32 run, u32 w, bool leader) {
#if IDX_TRACE
  if (leader)
    ((u64**)(ring.query + IDX_RING_MARKS_AT))[w] =
        a.trace ? a.trace + ((u64)run * IDX_BATCH_PAGES + w) * IDX_TRACE_WORDS : nullptr;
#else
  (void)a, (void)run, (void)w, (void)leader;
#endif
  return idx_marker{ring.lds};
}

// The group's query boxes, row by row: each thread t of the run's team loads words t, t +
// RUN_THREADS, ... of every row in one round (the loads miss the cache, and a further round would
// add a round trip to the start of every run), at addresses without a division (a flat index over
// the group's words costs a magic-number division a load, several hundred instructions before the
// first load).
#define IDX_RING_ROW_LOADS (IDX_QUERY_VALUE_WORDS / IDX_RUN_THREADS + 1)
struct idx_query_boxes {
  u64 w[IDX_GROUP_ROWS][IDX_RING_ROW_LOADS];
};
// Box of word `word` of the group's row r.
MONO_DEV u32 idx_ring_query_box(const idx_args& a, const idx_group& grp, u32 r, u32 word) {
  return idx_query_box(a, grp.first_row + r, word);
}
MONO_DEV void idx_ring_query_loads(const idx_args& a, const mbx_ctx& c, u32 t, const idx_group& grp,
                                   idx_query_boxes& q) {
#pragma unroll
  for (u32 r = 0; r < IDX_GROUP_ROWS; ++r)
#pragma unroll
    for (u32 k = 0; k < IDX_RING_ROW_LOADS; ++k) {
      // Every thread has a word of each block of values; the last load is the weights'.
      const bool word = k + 1 < IDX_RING_ROW_LOADS || t + k * IDX_RUN_THREADS < IDX_QUERY_WORDS;
      q.w[r][k] =
          r < grp.n_rows && word ? mbx_load(c.scratch + idx_ring_query_box(a, grp, r, t + k * IDX_RUN_THREADS)) : 0;
    }
}

// The loaded boxes (waiting for any not published yet) widened to f16 into the B tile, and the head
// weights beside it; the run's team. A thread's words, t + RUN_THREADS k of each row, are all word
// t % 32 of a head (RUN_THREADS is a multiple of a head's 32 words), of heads t / 32 + 8 k: their
// B-tile columns differ by multiples of 8, which the swizzle does not see, so each word's place is
// the thread's first place plus a constant. Computed word by word, the places cost most of
// 0.8 us at every run's start (H200, 1 row; every warp of the SM does it at once).
static_assert(IDX_RUN_THREADS % (IDX_HEAD_DIM / 4) == 0 && IDX_QUERY_VALUE_WORDS % IDX_RUN_THREADS == 0,
              "a thread's words are one word of a head, in whole rounds");
static_assert(IDX_QUERY_WORDS - IDX_QUERY_VALUE_WORDS <= IDX_RUN_THREADS, "a row's weights take one load a thread");
template <class Team>
MONO_DEV bool idx_ring_queries(const Team& team, const idx_args& a, const mbx_ctx& c, const idx_group& grp,
                               const idx_query_boxes& boxes, const idx_ring& ring) {
  constexpr u32 head_words = IDX_HEAD_DIM / 4, heads_per_round = IDX_RUN_THREADS / head_words;
  constexpr u32 value_loads = IDX_QUERY_VALUE_WORDS / IDX_RUN_THREADS;
  const u32 t = team.thread();
  const u32 kk = idx_wg_k_of_dim(4u * (t % head_words));
  u8* const lo = ring.query + idx_wg_offset(t / head_words, kk);
  u8* const hi = ring.query + idx_wg_offset(t / head_words, kk + 8u);
  bool ok = true;
  // The box's value, polling for it if it was loaded before it was published.
  auto value_of = [&](u32 r, u32 k, u32& value) {
    value = mbx_value_of(boxes.w[r][k]);
    if (mbx_tag_of(boxes.w[r][k]) != c.tag)
      ok = ok && mbx_poll(c, idx_ring_query_box(a, grp, r, t + k * IDX_RUN_THREADS), &value);
    return ok;
  };
#pragma unroll
  for (u32 r = 0; r < IDX_GROUP_ROWS; ++r) {
    if (r >= grp.n_rows) break;
    u32 value;
#pragma unroll
    for (u32 k = 0; k < value_loads; ++k) {
      if (!value_of(r, k, value)) continue;
      const u32 columns = (r * IDX_HEADS + k * heads_per_round) * 128u;
      idx_e4m3x4_to_f16_exact(value, (u32*)(lo + columns), (u32*)(hi + columns));
    }
    if (t < IDX_QUERY_WORDS - IDX_QUERY_VALUE_WORDS && value_of(r, value_loads, value))
      ((float*)(ring.query + IDX_RING_WEIGHTS_AT))[r * IDX_HEADS + t] = mono_bits_f32(value);
  }
  return team.all(ok);
}

// One page (at: its slot's LDS address, keys then scales; first token t0), scored by this
// warpgroup for the group's R rows and written out, a row by each lane of a quad; meanwhile() runs
// while the tensor units work.
// t: the thread of the warpgroup; position: the lane's row's position (idx_row_position of row
// t % 4, when the group has that row); out: the lane's row's score of its first token, idx_wg_token(t) into the page (both
// unused when the lane has no row).
template <u32 R, class Meanwhile>
MONO_DEV void idx_ring_page(u32 t, const idx_ring& ring, u32 at, u32 t0, u32 position, float* out, Meanwhile meanwhile) {
  float s[2];
  idx_wg_page<R>(t, at, idx_ring_query_start(ring), ring.lds + IDX_RING_WEIGHTS_AT, s, meanwhile);
  if ((t & 3u) >= R) return;
  const float minus_inf = mono_bits_f32(0xff800000u);
  const u32 token = idx_wg_token(t);
#pragma unroll
  for (u32 h = 0; h < 2; ++h) {
    const u32 n = token + 8u * h;
    const float scale = mono_bits_f32(idx_lds_u32(at + IDX_PAGE_KEY_BYTES + 4u * n));
    out[8u * h] = t0 + n <= position ? s[h] * scale : minus_inf;
  }
}

// Patches the page at t0 (at: its slot's LDS address) with the launch's new keys, the
// warpgroup's team. The run's task is read again here, on the few pages that reach the new keys:
// its request and group, held through the page loop, take registers of the 4-row MMAs.
template <class Warpgroup>
MONO_DEV bool idx_ring_patch(const Warpgroup& wg, const idx_args& a, const mbx_ctx& c, const idx_ring& ring, u32 t0,
                             u32 at) {
  const idx_run_task& task = a.runs[idx_ring_run_index(ring)];
  u8* keys = (u8*)__cvta_shared_to_generic(at);
  return idx_patch_tokens(wg, a, c, task.request, task.group, t0, IDX_PAGE_TOKENS, keys,
                          (float*)(keys + IDX_PAGE_KEY_BYTES));
}

// Warpgroup w's pages of the run (wg: the warpgroup's team), by the request's page number (the
// run's pages first_page + w, + 2, ...). next: the physical id of its page RING - 1 (from the
// task); each pass loads the id a page ahead of the copy it starts, so that no copy waits on a
// page-list load. The copy and the load go out while the tensor units work on the page: issued
// before the MMAs, they held the whole warpgroup's MMAs behind its first thread (about 250 ns a
// page on the H200). Every value the loop holds is a register the 4-row MMAs' 96 cannot have (128
// a thread): it counts the request's page, not the warpgroup's, so one counter serves the token,
// the bounds and the page list.
template <u32 R, class Warpgroup>
MONO_DEV bool idx_ring_run(const Warpgroup& wg, const idx_args& a, const mbx_ctx& c, const idx_request& q,
                           const idx_group& grp, const idx_run& run, const idx_ring& ring, u32 w, u32 next,
                           const idx_marker& marks) {
  const u32 t = wg.thread();
  // The lane's row's score of its first token of the page, advanced a page pair at a time:
  // computed from the row every page, its 64-bit address costs about a dozen instructions a page.
  float* out = a.scores + (u64)(grp.first_row + (t & 3u)) * a.stride + (run.first_page + w) * IDX_PAGE_TOKENS +
               idx_wg_token(t);
  const u32 position = (t & 3u) < grp.n_rows ? idx_row_position(a, grp, t & 3u) : 0u;
  const u32 end = run.first_page + run.n_pages;
  // The page's slot, j % RING for the warpgroup's j-th, and its barrier's phase parity, (j / RING)
  // % 2, kept as the page goes up rather than two divisions a page.
  u32 slot = 0, parity = 0;
  for (u32 page = run.first_page + w; page < end; page += IDX_BATCH_PAGES) {
    // Only pages that reach the launch's new keys are patched: one compare a page, where the
    // patch's own bounds cost about ten instructions on every page.
    const u32 lowest = idx_lds_u32(ring.lds + IDX_RING_LOWEST_AT);
    marks.page(page, IDX_MARK_WAITING);
    mono_lds_barrier_wait(idx_slot_landed(ring, w, slot), parity);
    marks.page(page, IDX_MARK_LANDED);
    wg.sync();  // the page before is scored, so its slot is free
    const u32 t0 = page * IDX_PAGE_TOKENS;
    const u32 at = idx_slot_lds(ring, w, slot);
    if (t0 + IDX_PAGE_TOKENS > lowest && !idx_ring_patch(wg, a, c, ring, t0, at)) return false;
    idx_ring_page<R>(t, ring, at, t0, position, out, [&] {
      marks.page(page, IDX_MARK_ISSUED);
      // The page RING - 1 of the warpgroup's ahead takes the slot the page before left.
      const u32 ahead = page + IDX_BATCH_PAGES * (IDX_RING - 1);
      idx_ring_load(a, ring, w, slot == 0 ? IDX_RING - 1 : slot - 1, t == 0, ahead < end, next);
      if (t == 0 && ahead + IDX_BATCH_PAGES < end)
        next = a.page_list[idx_lds_u32(ring.lds + IDX_RING_LIST_AT) + ahead + IDX_BATCH_PAGES];
    });
    marks.page(page, IDX_MARK_SCORED);
    out += IDX_BATCH_PAGES * IDX_PAGE_TOKENS;
    if (++slot == IDX_RING) {
      slot = 0;
      parity ^= 1u;
    }
  }
  return true;
}

// Run `run_index` of the launch by a team of IDX_RUN_THREADS (two warpgroups); lds:
// IDX_RUN_LDS_BYTES of its own.
//
// The loads go out in the order the start needs them, each before anything waits: the task and
// the first pages' ids (in the task), the queries' boxes, then the first copies. Loads issued
// behind the copies queue behind them (on the H200 a run then had its queries 4.8 us after it
// started).
template <class Team>
MONO_DEV bool idx_score_run(const Team& team, const mbx_ctx& c, const idx_args& a, u32 run_index, u8* lds) {
  static_assert(Team::size == IDX_RUN_THREADS, "a run's team");
  const auto wg = team.template split<IDX_WG_THREADS>();
  const u32 w = team.thread() / IDX_WG_THREADS;
  const idx_ring ring = idx_ring_of(lds);
  const idx_marker marks = idx_marker_of(a, ring, run_index, w, wg.thread() == 0);
  marks.mark(IDX_MARK_START_NS, mono_timer_ns());
  marks.mark(IDX_MARK_SM, mono_sm_id());
  marks.cycles(IDX_MARK_START);
  const idx_run_task& task = a.runs[run_index];
  const idx_run run = task.run;
  const idx_group grp = task.group;
  const idx_request q = task.request;
  u32 first[IDX_RING];
#pragma unroll
  for (u32 j = 0; j < IDX_RING; ++j) first[j] = task.first_pages[2u * j + w];
  marks.cycles(IDX_MARK_TASK, grp.first_row);
  if (team.leader()) {
    for (u32 s = 0; s < IDX_BATCH_PAGES * IDX_RING; ++s) mono_lds_barrier_init(idx_ring_landed(ring) + 8u * s);
    *(u32*)(ring.query + IDX_RING_RUN_AT) = run_index;
    *(u32*)(ring.query + IDX_RING_LOWEST_AT) = idx_patch_lowest(a, q, grp);
    *(u32*)(ring.query + IDX_RING_LIST_AT) = q.page_offset;
#if IDX_TRACE
    *(u32*)(ring.query + IDX_RING_FIRST_AT) = run.first_page;
#endif
  }
  idx_query_boxes boxes;
  idx_ring_query_loads(a, c, team.thread(), grp, boxes);
  team.sync();
  const u32 pages = idx_wg_pages(run, w);
#pragma unroll
  for (u32 j = 0; j + 1 < IDX_RING; ++j) idx_ring_load(a, ring, w, j, wg.thread() == 0, j < pages, first[j]);
  const u32 next = first[IDX_RING - 1];
  if (!idx_ring_queries(team, a, c, grp, boxes, ring)) return false;
  idx_lds_written();  // the B tile, for the tensor units: both warpgroups' writes, before either reads
  team.sync();
  marks.cycles(IDX_MARK_QUERIES);
  // Not a switch: its jump table is a constant-bank load, a cache miss at the start of every run
  // (seen on the H200 as 13% of the stalls of a 1-row launch).
  bool ok;
  if (grp.n_rows == 1)
    ok = idx_ring_run<1>(wg, a, c, q, grp, run, ring, w, next, marks);
  else if (grp.n_rows == 2)
    ok = idx_ring_run<2>(wg, a, c, q, grp, run, ring, w, next, marks);
  else if (grp.n_rows == 3)
    ok = idx_ring_run<3>(wg, a, c, q, grp, run, ring, w, next, marks);
  else
    ok = idx_ring_run<IDX_GROUP_ROWS>(wg, a, c, q, grp, run, ring, w, next, marks);
  // The run, its group and its task read again (not held through the page loop).
  const u32 run_again = idx_ring_run_index(ring);
  idx_write_tail(a, team.thread(), a.runs[run_again].group, a.runs[run_again].run);
  if (!team.all(ok)) return false;
  // Every copy was waited for: the barriers' words may become plain LDS for the next task.
  if (team.leader())
    for (u32 s = 0; s < IDX_BATCH_PAGES * IDX_RING; ++s) mono_lds_barrier_inval(idx_ring_landed(ring) + 8u * s);
  idx_run_done(team, a, c, run_again);
  marks.cycles(IDX_MARK_END);
  marks.mark(IDX_MARK_END_NS, mono_timer_ns());
  return true;
}
#endif
