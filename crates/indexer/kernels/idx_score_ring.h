// Scoring one run of pages for one row group on wgmma (IDX_WGMMA; the same scores as idx_score.h).
//
// The keys never wait in registers. The run's pages alternate between the CTA's two warpgroups
// (page 2j + w is warpgroup w's j-th), and each warpgroup streams its own pages: one of its
// threads has the copy engine bring each page from the cache straight into the warpgroup's ring
// of IDX_RING page slots in LDS, each slot with an LDS barrier that completes when its bytes have
// landed, so IDX_RING - 1 pages are in flight while the warpgroup scores the current one. A
// warpgroup barrier frees the slot it scored last, which is refilled right after it: the two
// warpgroups never wait for each other, so one's tensor work runs while the other waits for its
// keys or sums its scores. The group's queries sit in LDS as wgmma's B tile, so a page's whole
// contraction for every row of the group is a handful of asynchronous instructions, and each
// score is complete in the warpgroup: written straight out, no partial sums.
#pragma once
#include "idx_score.h"

#if IDX_WGMMA
static_assert(IDX_BLOCK == IDX_BATCH_PAGES * IDX_WG_THREADS, "a warpgroup a page of each pair");
static_assert(IDX_BATCH_PAGES == 2, "pages alternate between two warpgroups");
static_assert(IDX_GROUP_ROWS <= 4, "a row of the group per lane of a quad writes the scores");
static_assert(IDX_RING >= 2, "a slot being scored and one in flight");
static_assert(IDX_RING * IDX_BATCH_PAGES <= IDX_TASK_PAGES, "the first ring fill's page ids come with the task");

#define IDX_RING_QUERY_BYTES IDX_WG_QUERY_BYTES
#define IDX_RING_WEIGHT_BYTES (((IDX_GROUP_ROWS * IDX_HEADS * 4 + 1023) / 1024) * 1024)
// A slot: one page as cached, keys then scales.
#define IDX_RING_PAGE_BYTES (IDX_PAGE_KEY_BYTES + IDX_PAGE_TOKENS * 4)
// Dynamic LDS of a scoring CTA: 1024 bytes of slack to align the base (the B tiles' swizzle
// repeats every 1024 bytes), the queries, the weights, the two warpgroups' rings.
#define IDX_RING_LDS_BYTES \
  (1024 + IDX_RING_QUERY_BYTES + IDX_RING_WEIGHT_BYTES + IDX_BATCH_PAGES * IDX_RING * IDX_RING_PAGE_BYTES)
#ifdef IDX_SCORE_LDS_BYTES
static_assert(IDX_RING_LDS_BYTES <= IDX_SCORE_LDS_BYTES, "the host's LDS size (gpu.rs score_lds_bytes) is too small");
#endif

struct idx_ring {
  u8* query;       // the B tile: every head of every row in f16 (idx_wg_offset)
  u32 query_start;  // its descriptors' start field (idx_wg_start)
  float* weights;  // [GROUP_ROWS][HEADS]
  u32 landed;      // LDS address of [2][RING] barriers: a slot's copies have landed
  u8* slots;       // [2][RING] pages as cached
  u32 slots_lds;   // their LDS address, for the copies
};
static_assert(IDX_GROUP_ROWS * IDX_HEADS * 4 + IDX_BATCH_PAGES * IDX_RING * 8 <= IDX_RING_WEIGHT_BYTES,
              "the barriers follow the weights");

MONO_DEV idx_ring idx_ring_of(u8* lds) {
  u8* query = lds + ((1024u - (mono_lds_address(lds) & 1023u)) & 1023u);
  u8* weights = query + IDX_RING_QUERY_BYTES;
  u8* slots = weights + IDX_RING_WEIGHT_BYTES;
  return idx_ring{query, idx_wg_start(query), (float*)weights,
                  mono_lds_address(weights + IDX_GROUP_ROWS * IDX_HEADS * 4), slots, mono_lds_address(slots)};
}

// Slot s of warpgroup w's ring (its j-th page goes to slot j % RING): the page (to read, and as an
// LDS address for the copies), its barrier.
MONO_DEV u32 idx_slot_offset(u32 w, u32 s) { return (w * IDX_RING + s) * IDX_RING_PAGE_BYTES; }
MONO_DEV u8* idx_slot_keys(const idx_ring& ring, u32 w, u32 s) { return ring.slots + idx_slot_offset(w, s); }
MONO_DEV float* idx_slot_scales(const idx_ring& ring, u32 w, u32 s) {
  return (float*)(idx_slot_keys(ring, w, s) + IDX_PAGE_KEY_BYTES);
}
MONO_DEV u32 idx_slot_lds(const idx_ring& ring, u32 w, u32 s) { return ring.slots_lds + idx_slot_offset(w, s); }
MONO_DEV u32 idx_slot_landed(const idx_ring& ring, u32 w, u32 s) { return ring.landed + 8u * (w * IDX_RING + s); }

// Pages of the run that warpgroup w scores.
MONO_DEV u32 idx_wg_pages(const idx_run& run, u32 w) { return (run.n_pages + 1u - w) / 2u; }

// The warpgroup's first thread arms slot s's barrier and starts the copies of a page (physical
// id phys), keys and scales, into the slot; nothing when the page is past the warpgroup's last
// (!live).
MONO_DEV void idx_ring_load(const idx_args& a, const idx_ring& ring, u32 w, u32 s, bool live, u32 phys) {
  if (mono_thread() % IDX_WG_THREADS == 0 && live) {
    const u32 landed = idx_slot_landed(ring, w, s), dst = idx_slot_lds(ring, w, s);
    const u8* src = a.cache_read + (u64)phys * IDX_PAGE_BYTES;
    mono_lds_barrier_expect(landed, IDX_RING_PAGE_BYTES);
    mono_copy_bulk(dst, src, IDX_PAGE_KEY_BYTES, landed);
    mono_copy_bulk(dst + IDX_PAGE_KEY_BYTES, src + IDX_PAGE_KEY_BYTES, IDX_PAGE_TOKENS * 4, landed);
  }
}

// A trace build's marks (src/trace.rs): IDX_TRACE_WORDS words per (run, warpgroup), run-major;
// only the standalone entry (indexer_score) stamps, so the whole-stage kernel keeps its registers.
// Thread 0 of the warpgroup stamps the SM's cycle counter when a phase ends (comparable within a
// CTA), and the global timer at the start and the end (comparable across CTAs and launches). A
// mark after a load is taken once the loaded value is in a register (`after`).
#define IDX_TRACE_WORDS 64
#define IDX_MARK_START_NS 0
#define IDX_MARK_SM 1
#define IDX_MARK_START 2
#define IDX_MARK_TASK 3     // the task's group is loaded
#define IDX_MARK_QUERIES 4  // the queries are in the B tile
#define IDX_MARK_PRIOR 5    // the kernel before has finished (an overlapped launch)
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
template <bool TRACED>
MONO_DEV void idx_mark(const idx_args& a, u32 run, u32 slot, u64 value) {
#if IDX_TRACE
  if (TRACED && a.trace && mono_thread() % IDX_WG_THREADS == 0)
    a.trace[((u64)run * IDX_BATCH_PAGES + mono_thread() / IDX_WG_THREADS) * IDX_TRACE_WORDS + slot] = value;
#else
  (void)a, (void)run, (void)slot, (void)value;
#endif
}
template <bool TRACED>
MONO_DEV void idx_mark_cycles(const idx_args& a, u32 run, u32 slot, u32 after = 0) {
#if IDX_TRACE
  if (!TRACED) return;
  asm volatile("" ::"r"(after));
  idx_mark<TRACED>(a, run, slot, mono_clock_cycles());
#else
  (void)a, (void)run, (void)slot, (void)after;
#endif
}
// Mark `which` (IDX_MARK_WAITING ..) of the warpgroup's j-th page.
template <bool TRACED>
MONO_DEV void idx_mark_page(const idx_args& a, u32 run, u32 j, u32 which) {
  if (j < IDX_MARK_MAX_PAGES) idx_mark_cycles<TRACED>(a, run, IDX_MARK_PAGES + IDX_MARKS_A_PAGE * j + which);
}

// Barrier of warpgroup w's 128 threads alone (named barrier 1 + w; 0 is the block's).
MONO_DEV void idx_wg_sync(u32 w) { asm volatile("bar.sync %0, %1;" ::"r"(1u + w), "n"(IDX_WG_THREADS) : "memory"); }
// The same, returning whether `ok` holds in every thread of the warpgroup.
MONO_DEV bool idx_wg_agree(u32 w, bool ok) {
  u32 all;
  asm volatile("{ .reg .pred p, q; setp.ne.u32 p, %1, 0; bar.red.and.pred q, %2, %3, p; selp.u32 %0, 1, 0, q; }"
               : "=r"(all)
               : "r"((u32)ok), "r"(1u + w), "n"(IDX_WG_THREADS)
               : "memory");
  return all != 0;
}

// The group's query boxes, row by row: each thread loads words t, t + BLOCK, ... of every row in
// one round (the loads miss the cache, and a further round would add a round trip to the start
// of every scoring CTA), at addresses without a division (a flat index over the group's words
// took a magic-number division a load, several hundred instructions before the first load).
#define IDX_RING_ROW_LOADS (IDX_QUERY_VALUE_WORDS / IDX_BLOCK + 1)
struct idx_query_boxes {
  u64 w[IDX_GROUP_ROWS][IDX_RING_ROW_LOADS];
};
// Box of word `word` of the group's row r.
MONO_DEV u32 idx_ring_query_box(const idx_args& a, const idx_group& grp, u32 r, u32 word) {
  return idx_query_box(a, grp.first_row + r, word);
}
MONO_DEV void idx_ring_query_loads(const idx_args& a, const mbx_ctx& c, const idx_group& grp, idx_query_boxes& q) {
  const u32 t = mono_thread();
#pragma unroll
  for (u32 r = 0; r < IDX_GROUP_ROWS; ++r)
#pragma unroll
    for (u32 k = 0; k < IDX_RING_ROW_LOADS; ++k) {
      // Every thread has a word of each block of values; the last load is the weights'.
      const bool word = k + 1 < IDX_RING_ROW_LOADS || t + k * IDX_BLOCK < IDX_QUERY_WORDS;
      q.w[r][k] = r < grp.n_rows && word ? mbx_load(c.scratch + idx_ring_query_box(a, grp, r, t + k * IDX_BLOCK)) : 0;
    }
}

// The loaded boxes (waiting for any not published yet) widened to f16 into the B tile, and the head
// weights beside it. Block-wide. A thread's words, t + BLOCK k of each row, are all word t % 32 of
// a head (BLOCK is a multiple of a head's 32 words), of heads t / 32 + 8 k: their B-tile columns
// differ by multiples of 8, which the swizzle does not see, so each word's place is the thread's
// first place plus a constant. Computed word by word, the places took most of the 0.8 us the
// widening took at every CTA's start (H200, 1 row; every warp of the SM does it at once).
static_assert(IDX_BLOCK % (IDX_HEAD_DIM / 4) == 0 && IDX_QUERY_VALUE_WORDS % IDX_BLOCK == 0,
              "a thread's words are one word of a head, in whole blocks");
static_assert(IDX_QUERY_WORDS - IDX_QUERY_VALUE_WORDS <= IDX_BLOCK, "a row's weights take one load a thread");
MONO_DEV bool idx_ring_queries(const idx_args& a, const mbx_ctx& c, const idx_group& grp,
                               const idx_query_boxes& boxes, const idx_ring& ring) {
  constexpr u32 head_words = IDX_HEAD_DIM / 4, heads_per_block = IDX_BLOCK / head_words;
  constexpr u32 value_loads = IDX_QUERY_VALUE_WORDS / IDX_BLOCK;
  const u32 t = mono_thread();
  const u32 kk = idx_wg_k_of_dim(4u * (t % head_words));
  u8* const lo = ring.query + idx_wg_offset(t / head_words, kk);
  u8* const hi = ring.query + idx_wg_offset(t / head_words, kk + 8u);
  bool ok = true;
  // The box's value, polling for it if it was loaded before it was published.
  auto value_of = [&](u32 r, u32 k, u32& value) {
    value = mbx_value_of(boxes.w[r][k]);
    if (mbx_tag_of(boxes.w[r][k]) != c.tag) ok = ok && mbx_poll(c, idx_ring_query_box(a, grp, r, t + k * IDX_BLOCK), &value);
    return ok;
  };
#pragma unroll
  for (u32 r = 0; r < IDX_GROUP_ROWS; ++r) {
    if (r >= grp.n_rows) break;
    u32 value;
#pragma unroll
    for (u32 k = 0; k < value_loads; ++k) {
      if (!value_of(r, k, value)) continue;
      const u32 columns = (r * IDX_HEADS + k * heads_per_block) * 128u;
      idx_e4m3x4_to_f16_exact(value, (u32*)(lo + columns), (u32*)(hi + columns));
    }
    if (t < IDX_QUERY_WORDS - IDX_QUERY_VALUE_WORDS && value_of(r, value_loads, value))
      ring.weights[r * IDX_HEADS + t] = mono_bits_f32(value);
  }
  return mbx_block_agree(c, ok);
}

// One page (keys, scales: its slot; first token t0), scored by this warpgroup for the group's R
// rows and written out, a row by each lane of a quad; meanwhile() runs while the tensor units work.
// out: the lane's row's score of its first token, idx_wg_token() into the page (unused when the
// lane has no row).
template <u32 R, class Meanwhile>
MONO_DEV void idx_ring_page(const idx_group& grp, const idx_ring& ring, const u8* keys, const float* scales, u32 t0,
                            float* out, Meanwhile meanwhile) {
  float s[2];
  idx_wg_page<R>(keys, ring.query_start, ring.weights, s, meanwhile);
  const u32 r = mono_lane() & 3u;
  if (r >= R) return;
  const float minus_inf = mono_bits_f32(0xff800000u);
  const u32 token = idx_wg_token();
  const u32 position = idx_row_position(grp, r);
#pragma unroll
  for (u32 h = 0; h < 2; ++h) {
    const u32 n = token + 8u * h;
    out[8u * h] = t0 + n <= position ? s[h] * scales[n] : minus_inf;
  }
}

// Warpgroup w's pages of the run. next: the physical id of its page RING - 1 (from the task);
// each pass loads the id a page ahead of the copy it starts, so that no copy waits on a page-list
// load. The copy and the load go out while the tensor units work on the page: issued before the
// MMAs, they held the whole warpgroup's MMAs behind its first thread (about 250 ns a page on the
// H200).
template <u32 R, bool TRACED>
MONO_DEV void idx_ring_run(const idx_args& a, const mbx_ctx& c, const idx_request& q, const idx_group& grp,
                           const idx_run& run, u32 run_index, const idx_ring& ring, u32 w, u32 next) {
  const u32 pages = idx_wg_pages(run, w);
  // The lane's row's score of its first token of page j, advanced a page pair at a time: computed
  // from the row every page, its 64-bit address took about a dozen instructions a page.
  float* out = a.scores + (u64)(grp.first_row + (mono_lane() & 3u)) * a.stride + (run.first_page + w) * IDX_PAGE_TOKENS +
               idx_wg_token();
  // Page j's slot, j % RING, and its barrier's phase parity, (j / RING) % 2, kept as j goes up
  // (computed from j, they were two divisions a page).
  u32 slot = 0, parity = 0;
  // Only pages that reach the launch's new keys are patched: tested once a page, the patch's own
  // bounds took about ten instructions a page on every page.
  const u32 lowest = idx_patch_lowest(q, grp);
  for (u32 j = 0; j < pages; ++j) {
    idx_mark_page<TRACED>(a, run_index, j, IDX_MARK_WAITING);
    mono_lds_barrier_wait(idx_slot_landed(ring, w, slot), parity);
    idx_mark_page<TRACED>(a, run_index, j, IDX_MARK_LANDED);
    idx_wg_sync(w);  // page j - 1 is scored, so its slot is free
    const u32 t0 = (run.first_page + 2u * j + w) * IDX_PAGE_TOKENS;
    u8* keys = idx_slot_keys(ring, w, slot);
    float* scales = idx_slot_scales(ring, w, slot);
    if (t0 + IDX_PAGE_TOKENS > lowest &&
        !idx_patch_tokens(a, c, q, grp, t0, IDX_PAGE_TOKENS, keys, scales, mono_thread() % IDX_WG_THREADS,
                          IDX_WG_THREADS, [w](bool ok) { return idx_wg_agree(w, ok); }))
      return;
    idx_ring_page<R>(grp, ring, keys, scales, t0, out, [&] {
      idx_mark_page<TRACED>(a, run_index, j, IDX_MARK_ISSUED);
      // Page j + RING - 1 takes the slot page j - 1 left.
      idx_ring_load(a, ring, w, slot == 0 ? IDX_RING - 1 : slot - 1, j + IDX_RING - 1 < pages, next);
      const u32 ahead = 2u * (j + IDX_RING) + w;
      if (mono_thread() % IDX_WG_THREADS == 0 && ahead < run.n_pages)
        next = a.page_list[q.page_offset + run.first_page + ahead];
    });
    idx_mark_page<TRACED>(a, run_index, j, IDX_MARK_SCORED);
    out += IDX_BATCH_PAGES * IDX_PAGE_TOKENS;
    if (++slot == IDX_RING) {
      slot = 0;
      parity ^= 1u;
    }
  }
}

// Block-wide: run `run_index` of the launch. lds: IDX_SCORE_LDS_BYTES of dynamic shared memory.
// TRACED: stamp the phases in a trace build.
//
// The loads go out in the order the start needs them, each before anything waits: the task and
// the first pages' ids (in the task), the mailbox's epoch (the code waits for the tag as soon as
// it is loaded: before the task's loads, it made them a second round trip), the queries' boxes,
// then the first copies. Loads issued behind the copies queued behind them (on the H200 a CTA
// then had its queries 4.8 us after it started); the tag after the copies made groups of 4 rows
// 0.5 us slower.
template <bool TRACED>
MONO_DEV void idx_score_ring_task(const idx_args& a, u32 run_index, u8* lds) {
  idx_mark<TRACED>(a, run_index, IDX_MARK_START_NS, mono_timer_ns());
  idx_mark<TRACED>(a, run_index, IDX_MARK_SM, mono_sm_id());
  idx_mark_cycles<TRACED>(a, run_index, IDX_MARK_START);
  const idx_run_task& task = a.tasks[run_index];
  const idx_run run = task.run;
  const idx_group grp = task.group;
  const idx_request q = task.request;
  const u32 w = mono_thread() / IDX_WG_THREADS;
  u32 first[IDX_RING];
#pragma unroll
  for (u32 j = 0; j < IDX_RING; ++j) first[j] = task.first_pages[2u * j + w];
  const mbx_ctx c = mbx_begin(a.scratch, mbx_launch_tag(a.epoch, a.launches_per_step, a.launch_index), a.diag);
  idx_mark_cycles<TRACED>(a, run_index, IDX_MARK_TASK, grp.first_row);
  const idx_ring ring = idx_ring_of(lds);
  if (mono_thread() == 0)
    for (u32 s = 0; s < IDX_BATCH_PAGES * IDX_RING; ++s) mono_lds_barrier_init(ring.landed + 8u * s);
  idx_query_boxes boxes;
  idx_ring_query_loads(a, c, grp, boxes);
  mono_sync_block();
  const u32 pages = idx_wg_pages(run, w);
#pragma unroll
  for (u32 j = 0; j + 1 < IDX_RING; ++j) idx_ring_load(a, ring, w, j, j < pages, first[j]);
  const u32 next = first[IDX_RING - 1];
  if (!idx_ring_queries(a, c, grp, boxes, ring)) return;
  idx_lds_written();  // the B tile, for the tensor units: both warpgroups' writes, before either reads
  mono_sync_block();
  idx_mark_cycles<TRACED>(a, run_index, IDX_MARK_QUERIES);
  // An overlapped launch (indexer_score) writes scores the kernel before it may still read.
  idx_wait_prior();
  idx_mark_cycles<TRACED>(a, run_index, IDX_MARK_PRIOR);
  // Not a switch: its jump table is a constant-bank load, a cache miss at the start of every CTA
  // (seen on the H200 as 13% of the stalls of a 1-row launch).
  if (grp.n_rows == 1)
    idx_ring_run<1, TRACED>(a, c, q, grp, run, run_index, ring, w, next);
  else if (grp.n_rows == 2)
    idx_ring_run<2, TRACED>(a, c, q, grp, run, run_index, ring, w, next);
  else if (grp.n_rows == 3)
    idx_ring_run<3, TRACED>(a, c, q, grp, run, run_index, ring, w, next);
  else
    idx_ring_run<IDX_GROUP_ROWS, TRACED>(a, c, q, grp, run, run_index, ring, w, next);
  idx_write_tail(a, grp, run);
  idx_mark_cycles<TRACED>(a, run_index, IDX_MARK_END);
  idx_mark<TRACED>(a, run_index, IDX_MARK_END_NS, mono_timer_ns());
}
#endif
