// Scoring one run of pages for one row group on wgmma (IDX_WGMMA; the same scores as idx_score.h).
//
// The keys never wait in registers: one thread has the copy engine bring each batch of pages (a
// page per warpgroup) from the cache straight into a ring of IDX_RING batch slots in LDS, each
// slot with an LDS barrier that completes when its bytes have landed, so IDX_RING - 1 batches are
// in flight while the warpgroups score the current one. One block barrier a batch frees the slot
// scored last, which is refilled right after it. The group's queries sit in LDS as wgmma's B
// tile, so a page's whole contraction for every row of the group is a handful of asynchronous
// instructions, and each score is complete in the warpgroup: written straight out, no partial
// sums.
#pragma once
#include "idx_score.h"

#if IDX_WGMMA
static_assert(IDX_BLOCK == IDX_BATCH_PAGES * IDX_WG_THREADS, "a warpgroup a page of the batch");
static_assert(IDX_GROUP_ROWS <= 4, "a row of the group per lane of a quad writes the scores");
static_assert(IDX_RING >= 2, "a slot being scored and one in flight");
static_assert(IDX_RING * IDX_BATCH_PAGES <= IDX_TASK_PAGES, "the first ring fill's page ids come with the task");

#define IDX_RING_QUERY_BYTES IDX_WG_QUERY_BYTES
#define IDX_RING_WEIGHT_BYTES (((IDX_GROUP_ROWS * IDX_HEADS * 4 + 1023) / 1024) * 1024)
// A slot: the batch's pages as cached, keys then scales.
#define IDX_RING_SLOT_BYTES (IDX_BATCH_PAGES * (IDX_PAGE_KEY_BYTES + IDX_PAGE_TOKENS * 4))
// Dynamic LDS of a scoring CTA: 1024 bytes of slack to align the base (the B tiles' swizzle
// repeats every 1024 bytes), the queries, the weights, the ring.
#define IDX_RING_LDS_BYTES (1024 + IDX_RING_QUERY_BYTES + IDX_RING_WEIGHT_BYTES + IDX_RING * IDX_RING_SLOT_BYTES)
#ifdef IDX_SCORE_LDS_BYTES
static_assert(IDX_RING_LDS_BYTES <= IDX_SCORE_LDS_BYTES, "the host's LDS size (gpu.rs score_lds_bytes) is too small");
#endif

struct idx_ring {
  u8* query;       // the B tile: every head of every row in f16 (idx_wg_offset)
  float* weights;  // [GROUP_ROWS][HEADS]
  u64* landed;     // [RING] LDS barriers: a slot's copies have landed
  u8* slots;       // [RING] batches as cached
};
static_assert(IDX_GROUP_ROWS * IDX_HEADS * 4 + IDX_RING * 8 <= IDX_RING_WEIGHT_BYTES, "the barriers follow the weights");

MONO_DEV idx_ring idx_ring_of(u8* lds) {
  u8* query = lds + ((1024u - (mono_lds_address(lds) & 1023u)) & 1023u);
  u8* weights = query + IDX_RING_QUERY_BYTES;
  return idx_ring{query, (float*)weights, (u64*)(weights + IDX_GROUP_ROWS * IDX_HEADS * 4),
                  weights + IDX_RING_WEIGHT_BYTES};
}
MONO_DEV u8* idx_slot_keys(const idx_ring& ring, u32 batch) { return ring.slots + (batch % IDX_RING) * IDX_RING_SLOT_BYTES; }
MONO_DEV float* idx_slot_scales(const idx_ring& ring, u32 batch) {
  return (float*)(idx_slot_keys(ring, batch) + IDX_BATCH_PAGES * IDX_PAGE_KEY_BYTES);
}

// Thread 0 arms batch `batch`'s slot barrier and starts the copies of its pages (physical ids:
// phys), keys and scales, into the slot; nothing past the run's end.
MONO_DEV void idx_ring_load(const idx_args& a, const idx_run& run, const idx_ring& ring, u32 batch, u32 batches,
                            const u32 (&phys)[IDX_BATCH_PAGES]) {
  if (mono_thread() == 0 && batch < batches) {
    const u32 pages = idx_batch_pages(run, batch);
    u64* landed = ring.landed + batch % IDX_RING;
    mono_lds_barrier_expect(landed, pages * (IDX_PAGE_KEY_BYTES + IDX_PAGE_TOKENS * 4));
    for (u32 p = 0; p < pages; ++p) {
      const u8* src = a.cache_read + (u64)idx_pick(phys, p) * IDX_PAGE_BYTES;
      mono_copy_bulk(idx_slot_keys(ring, batch) + p * IDX_PAGE_KEY_BYTES, src, IDX_PAGE_KEY_BYTES, landed);
      mono_copy_bulk(idx_slot_scales(ring, batch) + p * IDX_PAGE_TOKENS, src + IDX_PAGE_KEY_BYTES, IDX_PAGE_TOKENS * 4,
                     landed);
    }
  }
}

// The group's published queries, widened to f16, into the B tiles, and the head weights beside
// them. Block-wide.
MONO_DEV bool idx_ring_queries(const idx_args& a, const mbx_ctx& c, const idx_group& grp, const idx_ring& ring) {
  u8* query = ring.query;
  float* weights = ring.weights;
  return idx_wait_slots_to(c, idx_query_box(a, grp.first_row, 0), a.query_box_stride, IDX_QUERY_WORDS, grp.n_rows,
                           [query, weights](u32 i, u32 value) {
                             const u32 r = i / IDX_QUERY_WORDS, w = i % IDX_QUERY_WORDS;
                             if (w >= IDX_QUERY_VALUE_WORDS) {
                               weights[r * IDX_HEADS + w - IDX_QUERY_VALUE_WORDS] = mono_bits_f32(value);
                               return;
                             }
                             const u32 n = r * IDX_HEADS + w / (IDX_HEAD_DIM / 4);
                             const u32 k = idx_wg_k_of_dim(4u * (w % (IDX_HEAD_DIM / 4)));
                             idx_e4m3x4_to_f16_exact(value, (u32*)(query + idx_wg_offset(n, k)),
                                                     (u32*)(query + idx_wg_offset(n, k + 8u)));
                           });
}

// This warpgroup's page of the batch, scored for the group's R rows and written out.
template <u32 R>
MONO_DEV void idx_ring_page(const idx_args& a, const idx_group& grp, const idx_ring& ring, u32 batch, u32 page,
                            u32 t0) {
  float s[R][2];
  idx_wg_page<R>(idx_slot_keys(ring, batch) + page * IDX_PAGE_KEY_BYTES, ring.query, ring.weights, s);
  const float minus_inf = mono_bits_f32(0xff800000u);
  const u32 quad = mono_lane() & 3u;
  const u32 token = 16u * (mono_wave() % (IDX_WG_THREADS / MONO_WAVE)) + mono_lane() / 4u;
  const float* scales = idx_slot_scales(ring, batch) + page * IDX_PAGE_TOKENS;
#pragma unroll
  for (u32 r = 0; r < R; ++r) {
    if (quad != r) continue;
    const u32 position = grp.last_position - (grp.n_rows - 1u - r);
    float* out = a.scores + (u64)(grp.first_row + r) * a.stride + t0;
#pragma unroll
    for (u32 h = 0; h < 2; ++h) {
      const u32 n = token + 8u * h;
      out[n] = t0 + n <= position ? s[r][h] * scales[n] : minus_inf;
    }
  }
}

// next: the physical pages of batch RING - 1, loaded while the first batches' copies went out.
template <u32 R>
MONO_DEV void idx_ring_run(const idx_args& a, const mbx_ctx& c, const idx_request& q, const idx_group& grp,
                           const idx_run& run, const idx_ring& ring, u32 (&next)[IDX_BATCH_PAGES]) {
  const u32 batches = (run.n_pages + IDX_BATCH_PAGES - 1) / IDX_BATCH_PAGES;
  const u32 page = mono_thread() / IDX_WG_THREADS;
  for (u32 b = 0; b < batches; ++b) {
    const u32 pages = idx_batch_pages(run, b);
    mono_lds_barrier_wait(ring.landed + b % IDX_RING, (b / IDX_RING) & 1u);
    mono_sync_block();  // batch b - 1 is scored, so its slot is free
    idx_ring_load(a, run, ring, b + IDX_RING - 1, batches, next);
    // The page ids a batch ahead, so that no copy waits on a page-list load.
    idx_page_ids(a, q, run, b + IDX_RING, next);
    const u32 t0 = (run.first_page + b * IDX_BATCH_PAGES) * IDX_PAGE_TOKENS;
    if (!idx_patch_batch(a, c, q, grp, t0, pages * IDX_PAGE_TOKENS, idx_slot_keys(ring, b), idx_slot_scales(ring, b)))
      return;
    if (page < pages) idx_ring_page<R>(a, grp, ring, b, page, t0 + page * IDX_PAGE_TOKENS);
  }
}

// Block-wide: run `run_index` of the launch. lds: IDX_SCORE_LDS_BYTES of dynamic shared memory.
MONO_DEV void idx_score_ring_task(const idx_args& a, const mbx_ctx& c, u32 run_index, u8* lds) {
  const idx_run_task& task = a.tasks[run_index];
  const idx_run run = task.run;
  const idx_group grp = task.group;
  const idx_request q = task.request;
  const u32 batches = (run.n_pages + IDX_BATCH_PAGES - 1) / IDX_BATCH_PAGES;
  const idx_ring ring = idx_ring_of(lds);
  if (mono_thread() == 0)
    for (u32 s = 0; s < IDX_RING; ++s) mono_lds_barrier_init(ring.landed + s);
  mono_sync_block();
  // The first batches' copies go out before the wait on the queries: they don't depend on it. Their
  // page ids came with the task.
  u32 phys[IDX_RING][IDX_BATCH_PAGES];
#pragma unroll
  for (u32 b = 0; b < IDX_RING; ++b)
#pragma unroll
    for (u32 p = 0; p < IDX_BATCH_PAGES; ++p) phys[b][p] = task.first_pages[b * IDX_BATCH_PAGES + p];
#pragma unroll
  for (u32 b = 0; b + 1 < IDX_RING; ++b) idx_ring_load(a, run, ring, b, batches, phys[b]);
  if (!idx_ring_queries(a, c, grp, ring)) return;
  idx_lds_written();  // the B tile, for the tensor units (the loop's first barrier follows)
  switch (grp.n_rows) {
    case 1: idx_ring_run<1>(a, c, q, grp, run, ring, phys[IDX_RING - 1]); break;
    case 2: idx_ring_run<2>(a, c, q, grp, run, ring, phys[IDX_RING - 1]); break;
    case 3: idx_ring_run<3>(a, c, q, grp, run, ring, phys[IDX_RING - 1]); break;
    default: idx_ring_run<IDX_GROUP_ROWS>(a, c, q, grp, run, ring, phys[IDX_RING - 1]); break;
  }
  idx_write_tail(a, grp, run);
}
#endif
