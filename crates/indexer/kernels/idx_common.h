// Shapes, descriptors and shared numerics of the indexer kernels. The descriptors mirror
// src/layout.rs (GroupDesc, RunDesc) and src/gpu.rs (LaunchArgs): keep them in step. Rows and
// requests are the page table's device form (ops/paging.h, model::paging), which select reads too.
#pragma once
#include "prelude.h"
#include "mailbox.h"
#include "ops/team.h"
#include "ops/rope.h"
#include "ops/paging.h"

// ---- shape defines: the host sets every one (src/gpu.rs KernelConfig::source) ------------------------
// IDX_PAGE_TOKENS: the caches' page (model::paging::PAGE_TOKENS).
#if !defined(IDX_HEADS) || !defined(IDX_HEAD_DIM) || !defined(IDX_ROPE_DIM) || !defined(IDX_GROUP_ROWS) || \
    !defined(IDX_TASK_PAGES) || !defined(IDX_PAGE_TOKENS)
#error "the host sets the indexer's shape: IDX_HEADS, IDX_HEAD_DIM, IDX_ROPE_DIM, IDX_GROUP_ROWS, IDX_TASK_PAGES, IDX_PAGE_TOKENS"
#endif
// IDX_ROPE_INTERLEAVED 1: GPT-J pairs (2i, 2i+1) as GLM-5; 0: NeoX pairs (i, i + ROPE_DIM/2) as
// DeepSeek-V3.2. IDX_HADAMARD 1: the 1/sqrt(HEAD_DIM) Hadamard rotation of q and k (spec §3.3); 0:
// SGLang's fused GLM-5 path.
#if !defined(IDX_ROPE_INTERLEAVED) || !defined(IDX_HADAMARD)
#error "the host sets the indexer's numerics: IDX_ROPE_INTERLEAVED, IDX_HADAMARD"
#endif
// IDX_WGMMA 1: queries published as E4M3 with a power-of-two scale per head (the scale folded into
// the head weight) and scored on wgmma (sm_90a; idx_score_ring.h) with an LDS ring of IDX_RING
// pages a warpgroup. 0: queries in bf16, scored on mma.sync (NVIDIA) or MFMA (AMD) with the keys
// widened to f16 in LDS (idx_score.h). The kernel table sets it to MONO_NVIDIA: each target's
// production scorer.
#if !defined(IDX_WGMMA) || !defined(IDX_RING)
#error "the host sets the scorer: IDX_WGMMA, IDX_RING"
#endif
// IDX_LDS_BYTES: the dynamic shared memory a task may use (the launch's; checked against each
// task's need). IDX_TRACE 1: the wgmma scorer stamps its phases into idx_args::trace.
#if !defined(IDX_LDS_BYTES) || !defined(IDX_TRACE)
#error "the host sets IDX_LDS_BYTES and IDX_TRACE"
#endif

// ---- faults a test builds in on purpose, to show that a check catches them ----------------------
// MONO_FAULT names one (0: none). The indexer's:
#define MONO_FAULT_IDX_PATCH_GROUP_ONLY 101  // scorers patch only their own group's new keys (poison check)
#define MONO_FAULT_IDX_SKIP_PRIOR_WAIT 102   // an overlapped launch does not wait for the kernel before
#ifndef MONO_FAULT
#define MONO_FAULT 0
#endif

// Task kinds of the indexer stage (src/layout.rs TaskKind; the stage is MBX_STAGE_INDEXER).
#define IDX_KIND_KEY 0u
#define IDX_KIND_QUERY 1u
#define IDX_KIND_SCORE 2u

// Threads that score one run: two warpgroups (wgmma), or the waves of the mma path. A CTA of the
// fused shape (512 threads) scores two runs at once, as two CTAs a SM did before it.
#define IDX_RUN_THREADS 256
// Pages a run's team takes at once: a warpgroup each (wgmma), a batch (mma path).
#define IDX_BATCH_PAGES 2

// The scorers' tiles are a page of tokens: wgmma's m64 (idx_tile.h), the mma path's page a wave group.
static_assert(IDX_PAGE_TOKENS == 64, "the scorers' tiles take pages of 64 tokens");
#define IDX_PAGE_KEY_BYTES (IDX_PAGE_TOKENS * IDX_HEAD_DIM)
#define IDX_PAGE_BYTES (IDX_PAGE_TOKENS * (IDX_HEAD_DIM + 4))
// Hand-off words (layout.rs key_box_words / query_box_words).
#define IDX_KEY_WORDS (IDX_HEAD_DIM / 4 + 1)
// A query: HEADS * HEAD_DIM values (bf16 pairs, or E4M3 fours), then HEADS weights.
#define IDX_QUERY_VALUE_WORDS (IDX_HEADS * IDX_HEAD_DIM / (IDX_WGMMA ? 4 : 2))
#define IDX_QUERY_WORDS (IDX_QUERY_VALUE_WORDS + IDX_HEADS)
// Elements of one head that a lane holds in the key and query tasks (a wave per vector).
#define IDX_LANE_DIMS (IDX_HEAD_DIM / MONO_WAVE)

static_assert(IDX_HEAD_DIM % MONO_WAVE == 0 && (IDX_LANE_DIMS == 1 || IDX_LANE_DIMS == 2 || IDX_LANE_DIMS == 4),
              "a wave holds a head at 1, 2 or 4 elements a lane");
static_assert((IDX_HEAD_DIM & (IDX_HEAD_DIM - 1)) == 0, "the Hadamard rotation needs a power-of-two head dim");
static_assert(IDX_ROPE_DIM % 2 == 0 && IDX_ROPE_DIM <= IDX_HEAD_DIM, "rope turns pairs within the head");
static_assert(IDX_ROPE_INTERLEAVED || (IDX_ROPE_DIM / 2 >= IDX_LANE_DIMS && (IDX_ROPE_DIM / 2 & (IDX_ROPE_DIM / 2 - 1)) == 0),
              "half-split partners (d XOR ROPE_DIM/2) must sit in other lanes");

typedef mono_page_row idx_row;
typedef mono_page_request idx_request;
// The group's rows' positions come from idx_args::positions (idx_position and below), never from
// the descriptors: a captured launch's task lists hold for every position the request's pages
// allow, the positions moving on the device between replays. planned_last is the last row's
// position the plan was made for: the group's runs cover its pages, and only the tail fill
// (idx_write_tail) reads it.
struct idx_group {
  u32 request;
  u32 first_row;
  u32 n_rows;
  u32 planned_last;
};
struct idx_run {
  u32 group;
  u32 first_page;
  u32 n_pages;
};
// A scoring CTA's first load (gpu.rs RunTask): its run, the run's group and request, and the
// physical ids of the run's first IDX_TASK_PAGES pages (0 past the run).
struct idx_run_task {
  idx_run run;
  idx_group group;
  idx_request request;
  u32 first_pages[IDX_TASK_PAGES];
};

// Everything the stage's tasks read and write besides the mailbox (src/gpu.rs StageArgs, same
// order, no padding). The tasks find their work in their descriptors' args: a row (key, query) or
// a pair of runs (score), indices into rows / runs.
struct idx_args {
  const u16* key_proj;      // [rows][HEAD_DIM] bf16: W_k x̂
  const float* norm_weight;  // [HEAD_DIM]
  const float* norm_bias;    // [HEAD_DIM]
  const u16* query_proj;     // [rows][HEADS * HEAD_DIM] bf16: W_qb c^Q
  const float* gates;        // [rows][HEADS]: W_w x̂
  const double* inv_freq;    // [ROPE_DIM / 2]: theta^(-2i / ROPE_DIM)
  const idx_row* rows;
  const u32* positions;  // [rows]: each row's position this step (read on the device, never planned)
  const idx_request* requests;
  const idx_run_task* runs;
  const u32* page_list;  // every request's physical pages, at its page_offset
  const u8* cache_read;  // what scorers read
  u8* cache_write;       // where key tasks store (the same buffer outside the poison check)
  float* scores;         // [rows][stride]
  u64* trace;            // a trace build's marks (idx_score_ring.h idx_mark), or null
  u32 stride;
  u32 key_box_offset;
  u32 key_box_stride;
  u32 query_box_offset;
  u32 query_box_stride;
  u32 run_box_offset;  // a run's completion box: its scores are written (mbx_publish before it)
  u32 run_box_stride;
  float weight_scale;  // (HEADS * HEAD_DIM)^-1/2
};

// Row `row`'s position this step.
MONO_DEV u32 idx_position(const idx_args& a, u32 row) { return a.positions[row]; }
// The position of the group's row r (rows of a group are at consecutive positions).
MONO_DEV u32 idx_row_position(const idx_args& a, const idx_group& grp, u32 r) {
  return idx_position(a, grp.first_row + r);
}
// The group's last row's position: the group reads keys up to it.
MONO_DEV u32 idx_group_last(const idx_args& a, const idx_group& grp) {
  return idx_position(a, grp.first_row + grp.n_rows - 1u);
}
// The request's first row's position: its first key this launch writes.
MONO_DEV u32 idx_request_first(const idx_args& a, const idx_request& q) { return idx_position(a, q.first_row); }

MONO_DEV u32 idx_key_box(const idx_args& a, u32 row, u32 word) { return a.key_box_offset + row * a.key_box_stride + word; }
MONO_DEV u32 idx_query_box(const idx_args& a, u32 row, u32 word) {
  return a.query_box_offset + row * a.query_box_stride + word;
}
MONO_DEV u32 idx_run_box(const idx_args& a, u32 run) { return a.run_box_offset + run * a.run_box_stride; }

// Byte offset of (physical page, slot) in the cache (layout.rs CacheLayout).
MONO_DEV u64 idx_key_offset(u32 page, u32 slot) { return (u64)page * IDX_PAGE_BYTES + slot * IDX_HEAD_DIM; }
MONO_DEV u64 idx_scale_offset(u32 page, u32 slot) {
  return (u64)page * IDX_PAGE_BYTES + IDX_PAGE_KEY_BYTES + slot * 4u;
}

// `v` as a value the compiler can neither move nor share: what is computed from it is computed
// where it is used. A loop-invariant value (a lane number, from the thread register alone; a base
// address) and all that follows from it are otherwise computed once, before the loop, and held
// through it: the key and query tasks' lane numbers would be held through every task, the score
// task's 4-row page loop among them, which then spills at the fused shape's 128 registers.
MONO_DEV u32 idx_unhoisted(u32 v) {
#if MONO_NVIDIA
  asm volatile("" : "+r"(v));
#endif
  return v;
}

// ---- a head held by a wave: lane l has dims l*LANE_DIMS .. +LANE_DIMS --------------------------------
// Rope on dims 0..ROPE_DIM-1 at `position`, in f64 from f32 values as the reference does.
MONO_DEV void idx_rope(float (&v)[IDX_LANE_DIMS], u32 lane, u32 position, const double* inv_freq) {
  float partner[IDX_LANE_DIMS];
#pragma unroll
  for (u32 i = 0; i < IDX_LANE_DIMS; ++i) {
#if IDX_ROPE_INTERLEAVED
#if IDX_LANE_DIMS >= 2
    partner[i] = v[i ^ 1u];
#else
    partner[i] = mono_bits_f32(mono_shfl_xor(mono_f32_bits(v[i]), 1u));
#endif
#else
    partner[i] = mono_bits_f32(mono_shfl_xor(mono_f32_bits(v[i]), (IDX_ROPE_DIM / 2) / IDX_LANE_DIMS));
#endif
  }
#pragma unroll
  for (u32 i = 0; i < IDX_LANE_DIMS; ++i) {
    const u32 d = lane * IDX_LANE_DIMS + i;
    if (d >= IDX_ROPE_DIM) continue;
#if IDX_ROPE_INTERLEAVED
    const u32 pair = d / 2;
    const bool first = (d & 1u) == 0;
#else
    const u32 pair = d % (IDX_ROPE_DIM / 2);
    const bool first = d < IDX_ROPE_DIM / 2;
#endif
    double s, c;
    mono_sincos_f64((double)position * inv_freq[pair], &s, &c);
    const double self = v[i], other = partner[i];
    // First of a pair: x cos - y sin; second: y cos + x sin.
    v[i] = (float)(first ? self * c - other * s : self * c + other * s);
  }
}

// x <- H x / sqrt(HEAD_DIM), by butterflies: in-lane spans first, then across lanes.
MONO_DEV void idx_hadamard(float (&v)[IDX_LANE_DIMS], u32 lane) {
#pragma unroll
  for (u32 span = 1; span < IDX_LANE_DIMS; span <<= 1) {
#pragma unroll
    for (u32 i = 0; i < IDX_LANE_DIMS; ++i) {
      if (i & span) continue;
      const float a = v[i], b = v[i + span];
      v[i] = a + b;
      v[i + span] = a - b;
    }
  }
#pragma unroll
  for (u32 mask = 1; mask < MONO_WAVE; mask <<= 1) {
#pragma unroll
    for (u32 i = 0; i < IDX_LANE_DIMS; ++i) {
      const float other = mono_shfl_xor_f32(v[i], mask);
      v[i] = (lane & mask) ? other - v[i] : v[i] + other;
    }
  }
  const float scale = 1.0f / mono_sqrtf((float)IDX_HEAD_DIM);
#pragma unroll
  for (u32 i = 0; i < IDX_LANE_DIMS; ++i) v[i] *= scale;
}

// The power-of-two ("ue8m0") scale of a block with largest magnitude amax, as model::numerics::ue8m0_scale:
// 2^ceil(log2(max(amax, 1e-4) / 448)), the ceiling taken from the bits.
MONO_DEV float idx_ue8m0_scale(float amax) {
  const u32 bits = mono_f32_bits(mono_fmaxf(amax, 1e-4f) / 448.0f);
  i32 e = (i32)((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0u ? 1 : 0);
  e = e < -126 ? -126 : (e > 127 ? 127 : e);
  return mono_bits_f32((u32)(e + 127) << 23);
}

// Packs each lane's E4M3 codes into 32-bit words of four; returns true in the lane that owns word
// (lane * LANE_DIMS) / 4, whose value is `word`.
MONO_DEV bool idx_pack_codes(const u8 (&codes)[IDX_LANE_DIMS], u32 lane, u32* word) {
  u32 packed = 0;
#pragma unroll
  for (u32 i = 0; i < IDX_LANE_DIMS; ++i) packed |= (u32)codes[i] << (8u * ((lane * IDX_LANE_DIMS + i) & 3u));
#pragma unroll
  for (u32 m = 1; m < 4 / IDX_LANE_DIMS; m <<= 1) packed |= mono_shfl_xor(packed, m);
  *word = packed;
  return (lane * IDX_LANE_DIMS) % 4 == 0;
}

// A wave's vector (LANE_DIMS a lane) as E4M3 codes and its power-of-two scale (spec §3.4), as the
// reference's quantise_block_e4m3.
MONO_DEV float idx_quantise(const float (&v)[IDX_LANE_DIMS], u8 (&codes)[IDX_LANE_DIMS]) {
  float amax = 0.0f;
#pragma unroll
  for (u32 i = 0; i < IDX_LANE_DIMS; ++i) amax = mono_fmaxf(amax, v[i] < 0.0f ? -v[i] : v[i]);
  const float scale = idx_ue8m0_scale(mono_wave_max(amax));
#pragma unroll
  for (u32 i = 0; i < IDX_LANE_DIMS; ++i)
    codes[i] = mono_f32_to_e4m3(mono_fminf(mono_fmaxf(v[i] / scale, -448.0f), 448.0f));
  return scale;
}

// ---- a team's waits on many boxes ------------------------------------------------------------------
// Every box of the task's inputs (a key or query task's: the completion boxes of the projections
// it reads, made earlier in the same launch), box i of an input by the team's thread i % size, then
// an acquire in every thread: what was published before the boxes is visible. A task without
// inputs (projections written before the launch) returns at once.
template <class Team>
MONO_DEV bool idx_wait_inputs(const Team& team, const mbx_task& task, const mbx_ctx& c) {
  if (task.n_inputs == 0) return true;
  bool ok = true;
  for (u32 in = 0; in < task.n_inputs; ++in)
    for (u32 i = team.thread(); i < task.in[in].len && ok; i += Team::size) {
      u32 value;
      ok = mbx_poll(c, task.in[in].first + i, &value);
    }
  const bool all = team.all(ok);
  mbx_acquire();
  return all;
}

#define IDX_POLL_BATCH 8
// Boxes of `slots` consecutive slots (`words` boxes each, `stride` apart, from box `first`), box
// i = slot * words + word by thread i % team size, into dst[i]. Each thread loads BATCH boxes before
// looking at any, so boxes already ready cost one round trip per batch rather than one each; a box
// not ready yet is polled alone (mbx_poll, bounded in debug builds). Only the boxes' own values are
// read, so no acquire is needed. Ends with a barrier of the team; false when a debug wait gave up.
template <class Team>
MONO_DEV bool idx_wait_slots(const Team& team, const mbx_ctx& c, u32 first, u32 stride, u32 words, u32 slots, u32* dst) {
  constexpr u32 threads = Team::size;
  const u32 n = slots * words;
  bool ok = true;
  for (u32 base = team.thread(); base < n; base += IDX_POLL_BATCH * threads) {
    u64 w[IDX_POLL_BATCH];
#pragma unroll
    for (u32 k = 0; k < IDX_POLL_BATCH; ++k) {
      const u32 i = base + k * threads;
      w[k] = i < n ? mbx_load(c.scratch + first + (i / words) * stride + i % words) : 0;
    }
#pragma unroll
    for (u32 k = 0; k < IDX_POLL_BATCH; ++k) {
      const u32 i = base + k * threads;
      if (i >= n) continue;
      u32 value = mbx_value_of(w[k]);
      if (mbx_tag_of(w[k]) != c.tag) {
        ok = ok && mbx_poll(c, first + (i / words) * stride + i % words, &value);
        if (!ok) continue;
      }
      dst[i] = value;
    }
  }
  return team.all(ok);
}
