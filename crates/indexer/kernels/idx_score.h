// Scoring one run of pages for one row group (spec §3.6-3.7): I[r, t] = sum_h w_rh ReLU(q_rh . k_t) s_t
// for t <= p_r, -inf past it, into scores[r * stride + t].
//
// The mma path (every target; the wgmma scorer of idx_score_ring.h replaces it on sm_90a at GLM-5's
// shape). A run's team (IDX_RUN_THREADS) copies the run into LDS a batch of pages at a time
// (16-byte loads into registers, so the next batch's loads are in flight while the waves score the
// current one), the keys converted to f16 once for all the group's rows. Each row of the group has
// its own waves, which hold the row's query and head weights in registers (on NVIDIA, a wave holds
// half the heads and the halves' sums meet in LDS), so every key is read from memory once for the
// whole group.
// Keys this launch writes are taken from their published pairs (idx_key.h), not from the cache:
// the store need not be visible yet.
#pragma once
#include "idx_common.h"
#include "idx_tile.h"

#define IDX_BATCH_TOKENS (IDX_BATCH_PAGES * IDX_PAGE_TOKENS)
#define IDX_KEYS_WORDS (IDX_BATCH_TOKENS * IDX_TOKEN_BYTES / 4)
#define IDX_STAGE_WORDS (IDX_GROUP_ROWS * IDX_QUERY_WORDS)
#define IDX_SMEM_WORDS \
  (IDX_KEYS_WORDS + IDX_BATCH_TOKENS > IDX_STAGE_WORDS ? IDX_KEYS_WORDS + IDX_BATCH_TOKENS : IDX_STAGE_WORDS)
// 16-byte pieces of a page's keys, of a batch's keys, and a batch's scales.
#define IDX_PAGE_CHUNKS (IDX_PAGE_KEY_BYTES / 16)
#define IDX_BATCH_KEY_CHUNKS (IDX_BATCH_PAGES * IDX_PAGE_CHUNKS)
#define IDX_KEY_LOADS ((IDX_BATCH_KEY_CHUNKS + IDX_RUN_THREADS - 1) / IDX_RUN_THREADS)
#define IDX_RUN_WAVES (IDX_RUN_THREADS / MONO_WAVE)
static_assert(IDX_BATCH_TOKENS <= IDX_RUN_THREADS, "a thread loads at most one scale");
static_assert(IDX_BATCH_TOKENS % IDX_TILE_TOKENS == 0, "tiles cover a batch");
static_assert(IDX_GROUP_ROWS * IDX_HEAD_GROUPS <= IDX_RUN_WAVES, "every (row, head group) of a group needs a wave");

// LDS of a run's team: first the group's published queries, then (reused) a batch of keys (f16 or FP8)
// followed by their scales; and the waves' partial sums of two batches (a batch's are summed and
// written while the next is scored).
struct idx_score_smem {
  mono_u32x4 words[(IDX_SMEM_WORDS + 3) / 4];
  float partial[2][IDX_HEAD_GROUPS][IDX_GROUP_ROWS][IDX_BATCH_TOKENS];
};

// One batch's loads, held in registers until the LDS is free. Scales go one a thread (4-byte
// loads): a 16-byte piece would hold 3 more registers in every thread for 32 threads' use.
struct idx_prefetch {
  mono_u32x4 key[IDX_KEY_LOADS];
  float scale;
};

MONO_DEV u32 idx_batch_pages(const idx_run& run, u32 batch) {
  const u32 left = run.n_pages - batch * IDX_BATCH_PAGES;
  return left < IDX_BATCH_PAGES ? left : IDX_BATCH_PAGES;
}

// Physical pages of `batch` (loaded a batch ahead, so the key loads need not wait for them).
MONO_DEV void idx_page_ids(const idx_args& a, const idx_request& q, const idx_run& run, u32 batch,
                           u32 (&phys)[IDX_BATCH_PAGES]) {
#pragma unroll
  for (u32 p = 0; p < IDX_BATCH_PAGES; ++p) {
    const u32 page = batch * IDX_BATCH_PAGES + p;
    phys[p] = page < run.n_pages ? a.page_list[q.page_offset + run.first_page + page] : 0u;
  }
}

MONO_DEV u32 idx_pick(const u32 (&phys)[IDX_BATCH_PAGES], u32 p) {
  u32 id = phys[0];
#pragma unroll
  for (u32 k = 1; k < IDX_BATCH_PAGES; ++k) id = p == k ? phys[k] : id;
  return id;
}

// Issues the loads of a batch: keys in 16-byte pieces (piece i by the team's thread i % RUN_THREADS),
// scales one a thread.
MONO_DEV void idx_load_batch(const idx_args& a, u32 thread, const u32 (&phys)[IDX_BATCH_PAGES], u32 pages,
                             idx_prefetch& f) {
#pragma unroll
  for (u32 k = 0; k < IDX_KEY_LOADS; ++k) {
    const u32 i = thread + k * IDX_RUN_THREADS;
    const u32 page = i / IDX_PAGE_CHUNKS;
    if (i < IDX_BATCH_KEY_CHUNKS && page < pages)
      f.key[k] = *(const mono_u32x4*)(a.cache_read + (u64)idx_pick(phys, page) * IDX_PAGE_BYTES +
                                      16u * (i % IDX_PAGE_CHUNKS));
  }
  const u32 page = thread / IDX_PAGE_TOKENS;
  if (thread < IDX_BATCH_TOKENS && page < pages)
    f.scale = *(const float*)(a.cache_read + idx_scale_offset(idx_pick(phys, page), thread % IDX_PAGE_TOKENS));
}

MONO_DEV u8* idx_keys(idx_score_smem& sm) { return (u8*)sm.words; }
MONO_DEV float* idx_scales(idx_score_smem& sm) { return (float*)sm.words + IDX_KEYS_WORDS; }

MONO_DEV void idx_store_batch(idx_score_smem& sm, u32 thread, const idx_prefetch& f, u32 pages) {
#pragma unroll
  for (u32 k = 0; k < IDX_KEY_LOADS; ++k) {
    const u32 i = thread + k * IDX_RUN_THREADS;
    if (i < IDX_BATCH_KEY_CHUNKS && i / IDX_PAGE_CHUNKS < pages)
      idx_store_key_piece(idx_keys(sm), i / (IDX_HEAD_DIM / 16), i % (IDX_HEAD_DIM / 16), f.key[k]);
  }
  if (thread < IDX_BATCH_TOKENS && thread / IDX_PAGE_TOKENS < pages) idx_scales(sm)[thread] = f.scale;
}

// The first token whose key this launch writes and the group reads from its published pairs:
// the request's first row's (the group's own first row's, under the fault PATCH_GROUP_ONLY).
MONO_DEV u32 idx_patch_lowest(const idx_args& a, const idx_request& q, const idx_group& grp) {
#if MONO_FAULT == MONO_FAULT_IDX_PATCH_GROUP_ONLY
  (void)q;
  return idx_row_position(a, grp, 0);
#else
  (void)grp;
  return idx_request_first(a, q);
#endif
}

// Overwrites the copies of keys this launch writes with their published pairs: the keys of the
// request's rows (idx_patch_lowest on) that lie in [t0, t0 + tokens) and at or before the group's
// last position. The team's threads take every team-size-th word; it ends with the team past a
// barrier and returns whether every thread's waits succeeded (false only when a debug wait gave up).
template <class Team>
MONO_DEV bool idx_patch_tokens(const Team& team, const idx_args& a, const mbx_ctx& c, const idx_request& q,
                               const idx_group& grp, u32 t0, u32 tokens, u8* keys, float* scales) {
  const u32 lowest = idx_patch_lowest(a, q, grp);
  const u32 group_last = idx_group_last(a, grp);
  const u32 first = lowest > t0 ? lowest : t0;
  const u32 last = group_last < t0 + tokens - 1u ? group_last : t0 + tokens - 1u;
  if (first > last) return true;
  const u32 row0 = q.first_row + (first - idx_request_first(a, q));
  bool ok = true;
  for (u32 i = team.thread(); i < (last - first + 1u) * IDX_KEY_WORDS && ok; i += Team::size) {
    const u32 key = i / IDX_KEY_WORDS, word = i % IDX_KEY_WORDS;
    u32 value;
    ok = mbx_poll(c, idx_key_box(a, row0 + key, word), &value);
    const u32 token = first + key - t0;
    if (!ok) break;
    if (word == IDX_HEAD_DIM / 4) {
      scales[token] = mono_bits_f32(value);
    } else {
      idx_store_key_word(keys, token, word, value);
    }
  }
  idx_lds_written();
  return team.all(ok);
}

// A compute wave's tiles of the batch (tiles part, part + waves_per_unit, ...) for its row and head
// group, times the key scales, into partial[buf][hg][r].
MONO_DEV void idx_score_batch(const idx_qfrag& qf, idx_score_smem& sm, u32 buf, u32 hg, u32 r, u32 tokens, u32 part,
                              u32 waves_per_unit) {
  const u8* keys = idx_keys(sm);
  const float* scales = idx_scales(sm);
  float* out = sm.partial[buf][hg][r];
  // One tile at a time: the query fragments already take most of the registers.
#pragma unroll 1
  for (u32 tile = part; tile < tokens / IDX_TILE_TOKENS; tile += waves_per_unit) {
    const u32 n0 = tile * IDX_TILE_TOKENS;
    float s[IDX_LANE_TOKENS];
    idx_tile(qf, keys, n0, s);
    if (idx_tile_writer()) {
#pragma unroll
      for (u32 i = 0; i < IDX_LANE_TOKENS; ++i) {
        const u32 n = n0 + idx_tile_token() + i;
        out[n] = s[i] * scales[n];
      }
    }
  }
}

// The run's team: sums a batch's head groups and writes the group's scores for tokens t0 .. t0 +
// tokens, -inf past each row's position (rows of a group are at consecutive positions).
MONO_DEV void idx_combine(const idx_args& a, u32 thread, const idx_group& grp, const idx_score_smem& sm, u32 buf,
                          u32 t0, u32 tokens) {
  const float minus_inf = mono_bits_f32(0xff800000u);
  for (u32 i = thread; i < grp.n_rows * tokens; i += IDX_RUN_THREADS) {
    const u32 r = i / tokens, n = i % tokens;
    float s = 0.0f;
#pragma unroll
    for (u32 hg = 0; hg < IDX_HEAD_GROUPS; ++hg) s += sm.partial[buf][hg][r][n];
    const u32 position = idx_row_position(a, grp, r);
    a.scores[(u64)(grp.first_row + r) * a.stride + t0 + n] = t0 + n <= position ? s : minus_inf;
  }
}

// The group's last planned run also fills the rows' scores past the group's planned pages, up to
// the stride (the run's team, thread `thread`). Planned, not this step's positions: the runs cover
// the planned pages whatever the rows' positions, and the scores between a row's position and the
// planned end are -inf by the scorers' position test.
MONO_DEV void idx_write_tail(const idx_args& a, u32 thread, const idx_group& grp, const idx_run& run) {
  const float minus_inf = mono_bits_f32(0xff800000u);
  const u32 end = grp.planned_last / IDX_PAGE_TOKENS + 1u;
  if (run.first_page + run.n_pages != end) return;
  const u32 begin = end * IDX_PAGE_TOKENS;
  for (u32 r = 0; r < grp.n_rows; ++r)
    for (u32 i = begin + thread; i < a.stride; i += IDX_RUN_THREADS) a.scores[(u64)(grp.first_row + r) * a.stride + i] = minus_inf;
}

// Tells the run's readers that its scores are written: the team's stores, then (after the team's
// barrier, which the caller's last team.all was) a release and one tagged box.
template <class Team>
MONO_DEV void idx_run_done(const Team& team, const idx_args& a, const mbx_ctx& c, u32 run_index) {
  if (!team.leader()) return;
  mbx_publish();
  mbx_put(c, idx_run_box(a, run_index), run_index);
}

#if !IDX_WGMMA
// LDS of a run's team, whole KiB (the host's gpu.rs score_lds_bytes reserves as much a team).
#define IDX_RUN_LDS_BYTES (((sizeof(idx_score_smem) + 1023) / 1024) * 1024)

// Run `run_index` of the launch by a team of IDX_RUN_THREADS; lds: IDX_RUN_LDS_BYTES of its own.
template <class Team>
MONO_DEV bool idx_score_run(const Team& team, const mbx_ctx& c, const idx_args& a, u32 run_index, u8* lds) {
  static_assert(Team::size == IDX_RUN_THREADS, "a run's team");
  idx_score_smem& sm = *(idx_score_smem*)lds;
  const u32 thread = team.thread(), wave = team.wave();
  const idx_run_task& task = a.runs[run_index];
  const idx_run run = task.run;
  const idx_group grp = task.group;
  const idx_request q = task.request;
  const u32 batches = (run.n_pages + IDX_BATCH_PAGES - 1) / IDX_BATCH_PAGES;

  // The first batch's loads go out before the wait on the queries: they don't depend on it.
  u32 phys[IDX_BATCH_PAGES];
  idx_prefetch f;
  idx_page_ids(a, q, run, 0, phys);
  idx_load_batch(a, thread, phys, idx_batch_pages(run, 0), f);
  idx_page_ids(a, q, run, 1, phys);

  // Each (row, head group) of the group gets RUN_WAVES / units waves; wave w takes unit w % units.
  u32* stage = (u32*)sm.words;
  if (!idx_wait_slots(team, c, idx_query_box(a, grp.first_row, 0), a.query_box_stride, IDX_QUERY_WORDS, grp.n_rows,
                      stage))
    return false;
  const u32 units = grp.n_rows * IDX_HEAD_GROUPS;
  const u32 waves_per_unit = IDX_RUN_WAVES / units;
  const bool computes = wave < units * waves_per_unit;
  const u32 unit = wave % units;
  const u32 r = unit % grp.n_rows, hg = unit / grp.n_rows;
  const u32 part = wave / units;
  idx_qfrag qf;
  if (computes) idx_load_query(stage + r * IDX_QUERY_WORDS, hg * IDX_WAVE_M_TILES, qf);
  team.sync();  // the staged queries are read; the LDS now holds keys

  for (u32 b = 0; b < batches; ++b) {
    const u32 pages = idx_batch_pages(run, b);
    const u32 t0 = (run.first_page + b * IDX_BATCH_PAGES) * IDX_PAGE_TOKENS;
    idx_store_batch(sm, thread, f, pages);
    team.sync();
    // The previous batch was full; its partials were finished before the barrier above.
    if (b > 0) idx_combine(a, thread, grp, sm, (b - 1u) & 1u, t0 - IDX_BATCH_TOKENS, IDX_BATCH_TOKENS);
    if (!idx_patch_tokens(team, a, c, q, grp, t0, pages * IDX_PAGE_TOKENS, idx_keys(sm), idx_scales(sm))) return false;
    if (b + 1 < batches) {
      idx_load_batch(a, thread, phys, idx_batch_pages(run, b + 1), f);
      idx_page_ids(a, q, run, b + 2, phys);
    }
    if (computes) idx_score_batch(qf, sm, b & 1u, hg, r, pages * IDX_PAGE_TOKENS, part, waves_per_unit);
    team.sync();  // every wave is done with the batch before the next overwrites it
  }
  const u32 last = batches - 1u;
  idx_combine(a, thread, grp, sm, last & 1u, (run.first_page + last * IDX_BATCH_PAGES) * IDX_PAGE_TOKENS,
              idx_batch_pages(run, last) * IDX_PAGE_TOKENS);
  idx_write_tail(a, thread, grp, run);
  team.sync();
  idx_run_done(team, a, c, run_index);
  return true;
}
#endif
