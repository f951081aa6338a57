// MLA tasks of a fused launch: the cache write of a new token, absorbed sparse attention of a
// group of rows over one block of their selected slots (a split), and the combine of a group's
// splits. The host side of every formula here is src/layout.rs (kinds, arguments, LDS layout)
// and src/gpu.rs (`MlaArgs`); keep them in step.
//
// Shape defines (from the host):
//   MLA_HEADS    heads of the rank (any multiple of 8; 8 at GLM-5 TP8, no padding)
//   MLA_LATENT   kv_lora_rank (a multiple of 128 with FP8, of 16 with bf16)
//   MLA_ROPE     qk_rope_head_dim (a multiple of 16)
//   MLA_FP8      1: records of E4M3 latent + one fp32 scale a 128 + bf16 rope; 0: bf16 records
//   MLA_UNION    most distinct slots one split holds in LDS (a multiple of 16)
//   MLA_SMEM_BYTES  the dynamic shared memory the host gives a CTA
//   MLA_TRACE    1: every task stamps its phases into a.trace (src/trace.rs reads them); default 0
#pragma once
#include "prelude.h"
#include "mailbox.h"
#include "ops/team.h"
#include "mla_tile.h"

#if !defined(MLA_HEADS) || !defined(MLA_LATENT) || !defined(MLA_ROPE) || !defined(MLA_FP8) || !defined(MLA_UNION) || \
    !defined(MLA_SMEM_BYTES)
#error "mla_attn.h: the host defines MLA_HEADS, MLA_LATENT, MLA_ROPE, MLA_FP8, MLA_UNION and MLA_SMEM_BYTES"
#endif
static_assert(MLA_HEADS % 8 == 0, "heads fill whole 8-column MMA tiles");
static_assert(MLA_ROPE % 16 == 0 && MLA_LATENT % 16 == 0, "widths are whole 16-element MMA steps");
static_assert(!MLA_FP8 || MLA_LATENT % 128 == 0, "FP8 latents are whole 128-element scale tiles");
static_assert(MLA_UNION % 16 == 0, "a split's slots fill whole 16-row MMA tiles");
#ifndef MLA_TRACE
#define MLA_TRACE 0
#endif


// Own kinds (src/layout.rs `MlaKind`).
#define MLA_KIND_CACHE_WRITE 0u
#define MLA_KIND_SPLIT 1u
#define MLA_KIND_COMBINE 2u
// A split's args[1] flag (src/layout.rs `SPLIT_AFTER_WRITE`): in[1] is waited on before the records.
#define MLA_SPLIT_AFTER_WRITE 0x80u

#define MLA_TILE 128u
#define MLA_TILES (MLA_LATENT / MLA_TILE)
#define MLA_QK (MLA_LATENT + MLA_ROPE)
// A record: latent (codes or bf16), the FP8 scales, the bf16 rope key (src/layout.rs CacheLayout).
#define MLA_LATENT_BYTES (MLA_FP8 ? MLA_LATENT : 2u * MLA_LATENT)
#define MLA_SCALE_BYTES (MLA_FP8 ? 4u * MLA_TILES : 0u)
#define MLA_RECORD (MLA_LATENT_BYTES + MLA_SCALE_BYTES + 2u * MLA_ROPE)
static_assert(MLA_RECORD % 16 == 0, "records are read in 16-byte pieces");
// LDS rows of keys and queries, padded by 16 bytes so that ldmatrix's eight rows hit distinct banks.
#define MLA_ROW (MLA_QK + 8u)
// Queries a pass; the QK product is summed in MLA_KCHUNKS parts over K (more waves busy at 8 heads).
#define MLA_QCHUNK 16u
#define MLA_KCHUNKS 3u
static_assert((MLA_QK / 16) % MLA_KCHUNKS == 0, "the K parts are whole MMA steps");
#define MLA_KSTEPS (MLA_QK / 16 / MLA_KCHUNKS)
#define MLA_PROW (MLA_UNION + 8u)
// A query's scores are a row of slots, one word longer than the union so that the MMA tiles'
// stores (a slot a lane group, queries across it) do not meet in one bank.
#define MLA_SROW (MLA_UNION + 1u)

// LDS of a split, in bytes from the task's base (src/layout.rs `split_lds_bytes`).
#define MLA_LDS_KEYS 0u
#define MLA_LDS_QUERY (MLA_LDS_KEYS + MLA_UNION * MLA_ROW * 2u)
#define MLA_LDS_SCORES (MLA_LDS_QUERY + MLA_QCHUNK * MLA_ROW * 2u)
#define MLA_LDS_PROBS (MLA_LDS_SCORES + MLA_KCHUNKS * MLA_QCHUNK * MLA_SROW * 4u)
#define MLA_LDS_ENTRIES (MLA_LDS_PROBS + MLA_QCHUNK * MLA_PROW * 2u)
#define MLA_LDS_UNION (MLA_LDS_ENTRIES + MLA_UNION * 4u)
#define MLA_LDS_MASK (MLA_LDS_UNION + MLA_UNION * 4u)
#define MLA_LDS_FRESH (MLA_LDS_MASK + MLA_UNION * 4u)
#define MLA_LDS_COUNT (MLA_LDS_FRESH + MLA_UNION * 4u)
#define MLA_LDS_BYTES (MLA_LDS_COUNT + 16u)
static_assert(MLA_LDS_BYTES <= MLA_SMEM_BYTES, "the split's LDS exceeds the CTA's dynamic shared memory");

// The stage's buffers and sizes, passed by value (src/gpu.rs `MlaArgs`).
struct mla_args {
  const u16* q_abs;      // [rows][heads][latent] bf16: q_nope through W_UK
  u16* q_pe;             // [rows][heads][rope] bf16, roped (the attention half's rope task writes it)
  u16* new_latent;       // [rows][latent] bf16: the new tokens' normed latent (the half's kv norm task writes it)
  u16* new_rope;         // [rows][rope] bf16: their roped key (likewise)
  const u32* new_slots;  // [rows]: the slot each row's new token is written to
  u8* cache;             // records of MLA_RECORD bytes; slot s at cache + s * MLA_RECORD
  float* part_o;         // [rows][max_splits][heads][latent]: a split's unnormalised output
  float* part_ml;        // [rows][max_splits][heads][2]: its max score and sum of weights
  u16* out;              // [rows][heads][latent] bf16: the attention output in latent space
  float scale;           // the softmax scale, 1/sqrt(qk_nope + qk_rope)
  u32 slot_stride;       // boxes from one row's selected slots to the next
  u32 max_splits;
  u32 pad;
  u64* trace;            // a trace build's marks: MLA_TRACE_WORDS words a task, by its global order
  // The attention half's row tasks (mla_rows.h: the norms and ropes between its linears); null
  // where a launch runs the attention alone.
  const u16* hidden;       // [rows][hidden_dim]: the layer's input rows
  u16* hidden_normed;      // [rows][hidden_dim]: RMSNorm_in of them, the x of q_a and kv_a
  const u16* hidden_norm;  // [hidden_dim] bf16 weight
  const u16* q_a;          // [rows][q_lora]: q_a's output
  u16* q_latent;           // [rows][q_lora]: RMSNorm_qa of it, the x of q_b
  const u16* q_a_norm;     // [q_lora]
  const u16* kv_a;         // [rows][MLA_LATENT + MLA_ROPE]: kv_a's output (latent, then the rope key)
  const u16* kv_a_norm;    // [MLA_LATENT]
  const u16* q;            // [rows][MLA_HEADS][nope + MLA_ROPE]: q_b's output
  const u32* positions;    // [rows]: each row's position in its request
  const double* inv_freq;  // [MLA_ROPE / 2]: theta^(-2i / MLA_ROPE)
  const i32* slot_lists;   // [rows][topk]: selected slots in plain memory (a launch that reuses an
                           // earlier launch's top-k, or takes it as an input), published by MLA_KIND_SLOTS
  u32 hidden_dim;
  u32 q_lora;
  u32 nope;
  float hidden_eps;
  float latent_eps;
  u32 topk;
};

// ---- a trace build's marks (src/trace.rs) ------------------------------------------------------------
// Per task: the global timer (ns) at its start and end, which compare across CTAs; its SM and kind;
// then SM cycles: the whole task, and each phase's share (a phase's cycles summed over the task's
// passes). The team's first thread stamps, so a phase ends when that thread leaves it: right
// after a barrier for most, and for a gather when its own loads have landed.
#define MLA_TRACE_WORDS 16u
#define MLA_TRACE_START_NS 0u
#define MLA_TRACE_END_NS 1u
#define MLA_TRACE_WHO 2u
#define MLA_TRACE_CYCLES 3u
#define MLA_TRACE_PHASES 4u
// Phases of a split.
#define MLA_PH_SLOTS 0u     // its rows' slot boxes seen
#define MLA_PH_DISTINCT 1u  // the distinct slots listed
#define MLA_PH_WRITTEN 2u   // the cache write waited on (when the block lists a new slot)
#define MLA_PH_KEYS 3u      // records gathered and dequantised into LDS
#define MLA_PH_QUERIES 4u   // the queries' boxes seen and the queries in LDS
#define MLA_PH_SCORES 5u
#define MLA_PH_SOFTMAX 6u
#define MLA_PH_VALUES 7u    // the weighted latents, written as the partial output
#define MLA_PH_DONE 8u      // the release and the completion box
// Phases of a combine.
#define MLA_PH_WAITS 0u     // the splits' boxes seen
#define MLA_PH_WEIGHTS 1u   // their maxima and sums read, the splits' weights
#define MLA_PH_OUTPUT 2u    // partial outputs read and summed, the output written
// Phases of a cache write: MLA_PH_WAITS (inputs), MLA_PH_OUTPUT (the records), MLA_PH_DONE.

struct mla_trace {
#if MLA_TRACE
  u64* rec;
  u64 start;
  u64 last;
#endif
  template <class Team>
  MONO_DEV mla_trace(const Team& team, const mbx_task& task, const mla_args& a) {
#if MLA_TRACE
    rec = team.leader() && a.trace ? a.trace + (u64)task.order * MLA_TRACE_WORDS : nullptr;
    if (!rec) return;
    for (u32 i = 0; i < MLA_TRACE_WORDS; ++i) rec[i] = 0;
    rec[MLA_TRACE_START_NS] = mono_timer_ns();
    rec[MLA_TRACE_WHO] = ((u64)mbx_own_kind(task.kind) << 32) | mono_sm_id();
    start = last = mono_clock_cycles();
#else
    (void)team;
    (void)task;
    (void)a;
#endif
  }
  MONO_DEV void mark(u32 phase) {
#if MLA_TRACE
    if (!rec) return;
    const u64 now = mono_clock_cycles();
    rec[MLA_TRACE_PHASES + phase] += now - last;
    last = now;
#else
    (void)phase;
#endif
  }
  MONO_DEV void end() {
#if MLA_TRACE
    if (!rec) return;
    mark(MLA_PH_DONE);
    rec[MLA_TRACE_CYCLES] = last - start;
    rec[MLA_TRACE_END_NS] = mono_timer_ns();
#endif
  }
};

struct alignas(16) mla_f32x4 {
  float x, y, z, w;
};

MONO_DEV float mla_neg_inf() { return mono_bits_f32(0xff800000u); }

// Waits on boxes first..first + n, box i by the team's thread i % size; values to dst (if any).
template <class Team>
MONO_DEV bool mla_wait(const Team& team, const mbx_ctx& c, u32 first, u32 n, i32* dst) {
  bool ok = true;
  for (u32 i = team.thread(); i < n && ok; i += Team::size) {
    u32 v = 0;
    ok = mbx_poll(c, first + i, &v);
    if (dst) dst[i] = (i32)v;
  }
  return team.all(ok);
}

// Inputs from..n_inputs (mbx_poll_range), one team agreement, then an acquire: data published
// beside them is visible.
template <class Team>
MONO_DEV bool mla_wait_inputs(const Team& team, const mbx_task& task, const mbx_ctx& c, u32 from,
                               u32 to = MBX_MAX_INPUTS) {
  bool ok = true;
  for (u32 i = from; i < task.n_inputs && i < to && ok; ++i) ok = mbx_poll_range(c, task.in[i], team.thread(), Team::size);
  if (!team.all(ok)) return false;
  mbx_acquire();
  return true;
}

// After the team's global writes: a release, then every box of the task's output (a thread a
// box), so that a consumer may wait on a whole range of such outputs.
template <class Team>
MONO_DEV void mla_done(const Team& team, const mbx_task& task, const mbx_ctx& c, u32 value) {
  team.sync();
  for (u32 i = team.thread(); i < task.out.len; i += Team::size) {
    mbx_publish();
    mbx_put(c, task.out.first + i, value);
  }
}

// ---- the cache write ------------------------------------------------------------------------------
#if MLA_FP8
#define MLA_TILE_LANE (MLA_TILE / MONO_WAVE)
// A wave's share of one 128-element tile of a new latent (bf16): lane l's MLA_TILE_LANE codes from
// element l * MLA_TILE_LANE, and the tile's scale, as MlaCache::push makes them. Every lane.
MONO_DEV float mla_quantise_tile(u32 lane, const u16* tile, u8 (&codes)[MLA_TILE_LANE]) {
  float v[MLA_TILE_LANE];
  float amax = 0.f;
  for (u32 j = 0; j < MLA_TILE_LANE; ++j) {
    v[j] = mono_bf16_to_f32(tile[lane * MLA_TILE_LANE + j]);
    amax = mono_fmaxf(amax, v[j] < 0.f ? -v[j] : v[j]);
  }
  amax = mono_wave_max(amax);
  const float scale = mono_fmaxf(amax / 448.f, mono_bits_f32(0x00800000u));
  for (u32 j = 0; j < MLA_TILE_LANE; ++j) codes[j] = mono_f32_to_e4m3(mono_fminf(mono_fmaxf(v[j] / scale, -448.f), 448.f));
  return scale;
}
#endif

// args: [first_row, n_rows]. Writes each row's new latent and rope key into the record of
// a.new_slots[row], as crates/mla/src/reference/cache.rs MlaCache::push does: in FP8 each
// 128-element tile gets the scale amax / 448 (at least the smallest normal float) and codes of
// v / scale. in[..]: completion boxes of the new latents and rope keys.
template <class Team>
MONO_DEV bool mla_cache_write_task(const Team& team, const mbx_task& task, mbx_ctx& c, const mla_args& a) {
  const u32 first_row = task.args[0], n_rows = task.args[1];
  mla_trace trace(team, task, a);
  if (!mla_wait_inputs(team, task, c, 0)) return false;
  trace.mark(MLA_PH_WAITS);
  // A wave a (row, 128-element tile): the rows' tiles all at once.
#if MLA_FP8
  for (u32 item = team.wave(); item < n_rows * MLA_TILES; item += Team::waves) {
    const u32 row = first_row + item / MLA_TILES, tile = item % MLA_TILES;
    u8* rec = a.cache + (u64)a.new_slots[row] * MLA_RECORD;
    u8 codes[MLA_TILE_LANE];
    const float scale = mla_quantise_tile(team.lane(), a.new_latent + (u64)row * MLA_LATENT + tile * MLA_TILE, codes);
    for (u32 j = 0; j < MLA_TILE_LANE; ++j) rec[tile * MLA_TILE + team.lane() * MLA_TILE_LANE + j] = codes[j];
    if (team.lane() == 0) *(float*)(rec + MLA_LATENT + 4 * tile) = scale;
  }
#else
  for (u32 i = team.thread(); i < n_rows * MLA_LATENT; i += Team::size) {
    const u32 row = first_row + i / MLA_LATENT;
    ((u16*)(a.cache + (u64)a.new_slots[row] * MLA_RECORD))[i % MLA_LATENT] = a.new_latent[(u64)row * MLA_LATENT + i % MLA_LATENT];
  }
#endif
  for (u32 i = team.thread(); i < n_rows * MLA_ROPE; i += Team::size) {
    const u32 row = first_row + i / MLA_ROPE;
    u8* rec = a.cache + (u64)a.new_slots[row] * MLA_RECORD;
    ((u16*)(rec + MLA_LATENT_BYTES + MLA_SCALE_BYTES))[i % MLA_ROPE] = a.new_rope[(u64)row * MLA_ROPE + i % MLA_ROPE];
  }
  trace.mark(MLA_PH_OUTPUT);
  mla_done(team, task, c, 1u);
  trace.end();
  return true;
}

// ---- a split ----------------------------------------------------------------------------------------
// args: [first_row, n_rows | MLA_SPLIT_AFTER_WRITE? | split << 8, block]. in[0]: the selected slots
// of rows first_row .. first_row + n_rows, a.slot_stride boxes a row; the split reads entries
// split * block .. (split + 1) * block of each. With MLA_SPLIT_AFTER_WRITE, in[1] is the cache
// writes of the request's groups before this one (their rows' new tokens, which these rows may
// list), waited on before any record is read. The other inputs: completion boxes of what the launch
// produces for it (the queries, the new latents and rope keys), waited on once the first records
// are in flight. A row of the group's own new token is made from the new latent (mla_fresh_keys),
// never read back from the cache. The distinct slots of the rows' blocks are loaded once (the verify rows of a request share
// most of them); a query attends only to the slots in its own row's block.
struct mla_split_lds {
  u16* keys;     // [MLA_UNION][MLA_ROW] bf16: the distinct slots' latent ‖ rope, dequantised
  u16* query;    // [MLA_QCHUNK][MLA_ROW] bf16: q_abs ‖ q_pe of a pass's queries
  float* scores; // [MLA_KCHUNKS][MLA_QCHUNK][MLA_SROW]: the K parts of the scores
  u16* probs;    // [MLA_QCHUNK][MLA_PROW] bf16: exp(score - max)
  i32* entries;  // [n_rows * block]: the rows' slots
  i32* slots;    // [MLA_UNION]: the distinct ones, in entry order
  u32* rows;     // [MLA_UNION]: bit r: row r's block lists the slot
  u32* fresh;    // [count[2]]: distinct index | row << 16 of each row's new slot among them
  u32* count;    // [0] unused; [1]: the distinct slots hold a row's new one; [2]: how many
};

MONO_DEV mla_split_lds mla_split_lds_at(u8* smem) {
  mla_split_lds s;
  s.keys = (u16*)(smem + MLA_LDS_KEYS);
  s.query = (u16*)(smem + MLA_LDS_QUERY);
  s.scores = (float*)(smem + MLA_LDS_SCORES);
  s.probs = (u16*)(smem + MLA_LDS_PROBS);
  s.entries = (i32*)(smem + MLA_LDS_ENTRIES);
  s.slots = (i32*)(smem + MLA_LDS_UNION);
  s.rows = (u32*)(smem + MLA_LDS_MASK);
  s.fresh = (u32*)(smem + MLA_LDS_FRESH);
  s.count = (u32*)(smem + MLA_LDS_COUNT);
  return s;
}

// The distinct non-negative entries in entry order, each with the rows that list it, and those of
// them that are a row's new slot (fresh: their count, listed in s.fresh). A thread an entry: one pass over the rows' blocks (LDS
// reads every lane of a wave shares) finds whether an equal entry comes earlier and which rows list
// it; first occurrences are numbered by a ballot in each wave and the waves' counts, which
// `counts` (Team::waves words of LDS free until the scores are written) holds.
template <class Team>
MONO_DEV u32 mla_distinct(const Team& team, const mla_split_lds& s, const mla_args& a, u32 first_row, u32 n_rows,
                          u32 block, u32* counts, u32& fresh) {
  const u32 n = n_rows * block;
  if (team.leader()) s.count[1] = s.count[2] = 0;
  u32 base = 0;
  for (u32 i0 = 0; i0 < n; i0 += Team::size) {
    const u32 i = i0 + team.thread();
    const i32 slot = i < n ? s.entries[i] : -1;
    bool is_first = slot >= 0;
    u32 rows = 0;
    if (is_first) {
      for (u32 r = 0; r < n_rows; ++r) {
        const i32* e = s.entries + r * block;
        bool hit = false;
#pragma unroll 4
        for (u32 j = 0; j < block; ++j) {
          const bool eq = e[j] == slot;
          hit |= eq;
          is_first &= !(eq && r * block + j < i);
        }
        rows |= (u32)hit << r;
      }
    }
    const u64 ballot = mono_ballot(is_first);
    if (team.lane() == 0) counts[team.wave()] = mono_popc64(ballot);
    team.sync();
    u32 index = base + mono_popc64(ballot & ((1ull << team.lane()) - 1ull));
    u32 total = 0;
    for (u32 w = 0; w < Team::waves; ++w) {
      index += w < team.wave() ? counts[w] : 0u;
      total += counts[w];
    }
    if (is_first) {
      s.slots[index] = slot;
      s.rows[index] = rows;
      for (u32 r = 0; r < n_rows; ++r)
        if ((u32)slot == a.new_slots[first_row + r]) {
          s.count[1] = 1;
          s.fresh[mono_fetch_add_lds_u32(&s.count[2], 1u)] = index | r << 16;
          break;
        }
    }
    base += total;
    team.sync();
  }
  fresh = s.count[2];
  return base;
}

// Records of the distinct slots into LDS as bf16 rows (FP8 latents times their tile's scale, as the
// cache reads back), rows up to the next 16 zero (an MMA over them must read numbers; a zero FP8
// scale makes the zero codes zero).
// `between()` runs on every thread once the first batch's loads are in flight (the queries' wait
// and loads, so that their round trip overlaps the records').
template <class Team, class Between>
MONO_DEV bool mla_load_keys(const Team& team, const mla_split_lds& s, const mla_args& a, u32 n, u32 rows16,
                            Between between) {
  constexpr u32 latent_chunks = MLA_LATENT_BYTES / 16, rope_chunks = MLA_ROPE * 2 / 16;
  constexpr u32 chunks = latent_chunks + rope_chunks;
  // `batch` pieces a thread in flight before the first is used: a gather is a round trip
  // to memory, and one at a time would cost one each.
  constexpr u32 batch = 8;
  const u32 total = rows16 * chunks;
  for (u32 base = team.thread(), pass = 0; pass == 0 || base < total; base += batch * Team::size, ++pass) {
    mono_u32x4 v[batch];
    float scale[batch];
#pragma unroll
    for (u32 b = 0; b < batch; ++b) {
      const u32 i = base + b * Team::size, u = i / chunks, j = i % chunks;
      v[b] = mono_u32x4{0, 0, 0, 0};
      scale[b] = 0.f;
      if (i >= total || u >= n) continue;
      const u8* rec = a.cache + (u64)s.slots[u] * MLA_RECORD;
      if (j >= latent_chunks) {
        v[b] = *(const mono_u32x4*)(rec + MLA_LATENT_BYTES + MLA_SCALE_BYTES + (j - latent_chunks) * 16);
      } else {
        v[b] = *(const mono_u32x4*)(rec + j * 16);
#if MLA_FP8
        scale[b] = *(const float*)(rec + MLA_LATENT + 4 * (j * 16 / MLA_TILE));
#endif
      }
    }
    if (pass == 0 && !between()) return false;
#pragma unroll
    for (u32 b = 0; b < batch; ++b) {
      const u32 i = base + b * Team::size, u = i / chunks, j = i % chunks;
      if (i >= total) continue;
      u16* dst = s.keys + u * MLA_ROW;
      if (j >= latent_chunks) {
        *(mono_u32x4*)(dst + MLA_LATENT + (j - latent_chunks) * 8) = v[b];
        continue;
      }
#if MLA_FP8
      const u32 words[4] = {v[b].x, v[b].y, v[b].z, v[b].w};
      u32 packed[8];
      for (u32 w = 0; w < 4; ++w) {
        float f0, f1, f2, f3;
        mla_e4m3x2_to_f32(words[w], f0, f1);
        mla_e4m3x2_to_f32(words[w] >> 16, f2, f3);
        packed[2 * w] = mla_bf16x2(f0 * scale[b], f1 * scale[b]);
        packed[2 * w + 1] = mla_bf16x2(f2 * scale[b], f3 * scale[b]);
      }
      *(mono_u32x4*)(dst + j * 16) = mono_u32x4{packed[0], packed[1], packed[2], packed[3]};
      *(mono_u32x4*)(dst + j * 16 + 8) = mono_u32x4{packed[4], packed[5], packed[6], packed[7]};
#else
      *(mono_u32x4*)(dst + j * 8) = v[b];
#endif
    }
  }
  return true;
}

// The rows' new tokens among the distinct slots (s.fresh) into LDS from the new latents and rope
// keys, as a read of the records the cache write makes would give them (FP8: the same codes and
// scale, dequantised as mla_load_keys does), so no split waits on the cache write.
template <class Team>
MONO_DEV void mla_fresh_keys(const Team& team, const mla_split_lds& s, const mla_args& a, u32 first_row, u32 fresh) {
#if MLA_FP8
  for (u32 item = team.wave(); item < fresh * MLA_TILES; item += Team::waves) {
    const u32 f = s.fresh[item / MLA_TILES], tile = item % MLA_TILES;
    const u32 row = first_row + (f >> 16);
    u8 codes[MLA_TILE_LANE];
    const float scale = mla_quantise_tile(team.lane(), a.new_latent + (u64)row * MLA_LATENT + tile * MLA_TILE, codes);
    u16* dst = s.keys + (f & 0xffffu) * MLA_ROW + tile * MLA_TILE + team.lane() * MLA_TILE_LANE;
    for (u32 j = 0; j < MLA_TILE_LANE; ++j) dst[j] = mono_f32_to_bf16(mono_e4m3_to_f32(codes[j]) * scale);
  }
#else
  for (u32 i = team.thread(); i < fresh * MLA_LATENT; i += Team::size) {
    const u32 f = s.fresh[i / MLA_LATENT];
    s.keys[(f & 0xffffu) * MLA_ROW + i % MLA_LATENT] = a.new_latent[(u64)(first_row + (f >> 16)) * MLA_LATENT + i % MLA_LATENT];
  }
#endif
  for (u32 i = team.thread(); i < fresh * MLA_ROPE; i += Team::size) {
    const u32 f = s.fresh[i / MLA_ROPE];
    s.keys[(f & 0xffffu) * MLA_ROW + MLA_LATENT + i % MLA_ROPE] = a.new_rope[(u64)(first_row + (f >> 16)) * MLA_ROPE + i % MLA_ROPE];
  }
}

// Queries q0 .. q0 + nq of the group (query q: row q / heads, head q % heads) into LDS.
template <class Team>
MONO_DEV void mla_load_queries(const Team& team, const mla_split_lds& s, const mla_args& a, u32 first_row, u32 q0,
                               u32 nq) {
  constexpr u32 latent_chunks = MLA_LATENT / 8, chunks = latent_chunks + MLA_ROPE / 8;
  for (u32 i = team.thread(); i < nq * chunks; i += Team::size) {
    const u32 q = i / chunks, j = i % chunks;
    const u64 query = (u64)first_row * MLA_HEADS + q0 + q;
    const u16* src = j < latent_chunks ? a.q_abs + query * MLA_LATENT + j * 8 : a.q_pe + query * MLA_ROPE + (j - latent_chunks) * 8;
    *(mono_u32x4*)(s.query + q * MLA_ROW + j * 8) = *(const mono_u32x4*)src;
  }
}

template <class Team>
MONO_DEV bool mla_split_task(const Team& team, const mbx_task& task, mbx_ctx& c, const mla_args& a, u8* smem) {
  const u32 first_row = task.args[0], n_rows = task.args[1] & 0x7fu, split = task.args[1] >> 8;
  const bool after_write = (task.args[1] & MLA_SPLIT_AFTER_WRITE) != 0;
  const u32 block = task.args[2];
  const mla_split_lds s = mla_split_lds_at(smem);
  mla_trace trace(team, task, a);
  for (u32 r = 0; r < n_rows; ++r)
    if (!mla_wait(team, c, task.in[0].first + r * a.slot_stride + split * block, block, s.entries + r * block))
      return false;
  if (after_write && !mla_wait_inputs(team, task, c, 1, 2)) return false;
  trace.mark(MLA_PH_SLOTS);
  u32 fresh = 0;
  const u32 n = mla_distinct(team, s, a, first_row, n_rows, block, (u32*)s.scores, fresh);
  trace.mark(MLA_PH_DISTINCT);
  const u32 rows16 = (n + 15) / 16 * 16;
  const u32 queries = n_rows * MLA_HEADS;
  const bool loaded = mla_load_keys(team, s, a, n, rows16, [&] {
    if (!mla_wait_inputs(team, task, c, after_write ? 2u : 1u)) return false;
    mla_load_queries(team, s, a, first_row, 0, queries < MLA_QCHUNK ? queries : MLA_QCHUNK);
    return true;
  });
  if (!loaded) return false;
  if (fresh > 0) {
    // Their records were read as they stood (the cache write may not have landed): replaced.
    team.sync();
    mla_fresh_keys(team, s, a, first_row, fresh);
  }
  trace.mark(MLA_PH_KEYS);
  for (u32 q0 = 0; q0 < queries; q0 += MLA_QCHUNK) {
    const u32 nq = queries - q0 < MLA_QCHUNK ? queries - q0 : MLA_QCHUNK;
    if (q0 > 0) mla_load_queries(team, s, a, first_row, q0, nq);
    team.sync();
    trace.mark(MLA_PH_QUERIES);
    // Scores in K parts: item = (key tile, query tile, K part).
    const u32 qtiles = nq / 8, items = rows16 / 16 * qtiles * MLA_KCHUNKS;
    for (u32 it = team.wave(); it < items; it += Team::waves) {
      const u32 part = it % MLA_KCHUNKS, qt = it / MLA_KCHUNKS % qtiles, kt = it / MLA_KCHUNKS / qtiles;
      float* dst = s.scores + (part * MLA_QCHUNK + qt * 8) * MLA_SROW + kt * 16;
      mla_tile_rows_dot(team.lane(), s.keys, MLA_ROW, s.query, MLA_ROW, kt * 16, qt * 8, part * MLA_KSTEPS * 16,
                        MLA_KSTEPS, [&](u32 t, u32 q, float v) { dst[q * MLA_SROW + t] = v; });
    }
    team.sync();
    trace.mark(MLA_PH_SCORES);
    // Softmax of each query over its row's slots: a wave a query, a lane's scores kept in
    // registers between the max and the weights.
    constexpr u32 per_lane = (MLA_UNION + MONO_WAVE - 1) / MONO_WAVE;
    for (u32 q = team.wave(); q < nq; q += Team::waves) {
      const u32 row_bit = 1u << ((q0 + q) / MLA_HEADS);
      float m = mla_neg_inf();
      float score[per_lane];
      u32 listed = 0;
#pragma unroll
      for (u32 k = 0; k < per_lane; ++k) {
        const u32 t = team.lane() + k * MONO_WAVE;
        score[k] = 0.f;
        if (t >= n || !(s.rows[t] & row_bit)) continue;
        float sum = 0.f;
        for (u32 p = 0; p < MLA_KCHUNKS; ++p) sum += s.scores[(p * MLA_QCHUNK + q) * MLA_SROW + t];
        score[k] = sum * a.scale;
        listed |= 1u << k;
        m = mono_fmaxf(m, score[k]);
      }
      m = mono_wave_max(m);
      float l = 0.f;
#pragma unroll
      for (u32 k = 0; k < per_lane; ++k) {
        const u32 t = team.lane() + k * MONO_WAVE;
        if (t >= rows16) continue;
        u16 p = 0;
        if (listed & (1u << k)) {
          p = mono_f32_to_bf16(mono_expf(score[k] - m));
          l += mono_bf16_to_f32(p);
        }
        s.probs[q * MLA_PROW + t] = p;
      }
      l = mono_wave_sum(l);
      if (team.lane() == 0) {
        const u32 row = first_row + (q0 + q) / MLA_HEADS, head = (q0 + q) % MLA_HEADS;
        float* ml = a.part_ml + (((u64)row * a.max_splits + split) * MLA_HEADS + head) * 2;
        ml[0] = m;
        ml[1] = l;
      }
    }
    team.sync();
    trace.mark(MLA_PH_SOFTMAX);
    // Weighted latents: item = (latent tile, query tile), straight to the partial output.
    const u32 vitems = MLA_LATENT / 16 * qtiles;
    for (u32 it = team.wave(); it < vitems; it += Team::waves) {
      const u32 qt = it % qtiles, dt = it / qtiles;
      mla_tile_cols_dot(team.lane(), s.keys, MLA_ROW, s.probs, MLA_PROW, dt * 16, qt * 8, rows16 / 16,
                        [&](u32 d, u32 q, float v) {
                          const u32 query = q0 + qt * 8 + q;
                          const u32 row = first_row + query / MLA_HEADS, head = query % MLA_HEADS;
                          a.part_o[(((u64)row * a.max_splits + split) * MLA_HEADS + head) * MLA_LATENT + dt * 16 + d] = v;
                        });
    }
    team.sync();
    trace.mark(MLA_PH_VALUES);
  }
  mla_done(team, task, c, 1u);
  trace.end();
  return true;
}

// ---- the combine ------------------------------------------------------------------------------------
// args: [first_row, n_splits, q0 | nq << 16]. in[0]: the splits' completion boxes, one every
// in[0].len / n_splits boxes (a split's box has a line of its own). Queries q0 ..
// q0 + nq of the group (row first_row + q / heads, head q % heads) from the splits' partial
// outputs, in split order, so every replay gives the same bits.
template <class Team>
MONO_DEV bool mla_combine_task(const Team& team, const mbx_task& task, mbx_ctx& c, const mla_args& a, u8* smem) {
  const u32 first_row = task.args[0], n_splits = task.args[1];
  const u32 q0 = task.args[2] & 0xffffu, nq = task.args[2] >> 16;
  const u32 stride = n_splits ? task.in[0].len / n_splits : 0;
  mla_trace trace(team, task, a);
  bool ok = true;
  for (u32 sp = team.thread(); sp < n_splits && ok; sp += Team::size) {
    u32 v;
    ok = mbx_poll(c, task.in[0].first + sp * stride, &v);
  }
  if (!team.all(ok)) return false;
  mbx_acquire();
  trace.mark(MLA_PH_WAITS);
  // A thread a (query, 4 latent columns, group of splits): the first batch of its partial outputs
  // is in flight while a wave a query turns the splits' maxima and sums into weights
  // exp(m_s - m) and a total in LDS. Each group sums its splits in order, then the groups are added
  // in order: every replay gives the same bits.
  constexpr u32 cols = MLA_LATENT / 4;
  constexpr u32 groups = Team::size >= 2 * cols ? (Team::size / cols < 4 ? Team::size / cols : 4) : 1;
  constexpr u32 per_pass = groups == 1 ? Team::size : Team::size / (cols * groups) * cols * groups;
  constexpr u32 batch = 8;
  float* weight = (float*)(smem + Team::size * 16);
  float* total = weight + nq * n_splits;
  mla_f32x4* sums = (mla_f32x4*)smem;
  const u32 per_group = (n_splits + groups - 1) / groups;
  const u64 split_step = (u64)MLA_HEADS * MLA_LATENT / 4;
  for (u32 p0 = 0; p0 < nq * cols * groups; p0 += per_pass) {
    const u32 item = p0 + team.thread(), col = item % cols, g = item / cols % groups, q = item / cols / groups;
    const bool mine = team.thread() < per_pass && q < nq;
    const u32 query = q0 + (mine ? q : 0u);
    const u32 row = first_row + query / MLA_HEADS, head = query % MLA_HEADS;
    const mla_f32x4* part =
        (const mla_f32x4*)a.part_o + ((u64)row * a.max_splits * MLA_HEADS + head) * (MLA_LATENT / 4) + col;
    const u32 sp_begin = g * per_group, sp_end = sp_begin + per_group < n_splits ? sp_begin + per_group : n_splits;
    // Every slot of the batch written each time (zeros past the group's splits, which the sums
    // skip): a slot kept from the batch before would be live across the loop, and the fused
    // kernels kept such a batch in local memory, each store waiting for its load to land. Zeros
    // first and then the load, not a select of the two: the select cost gfx950 a scratch slot.
    const mla_f32x4 none = {0.f, 0.f, 0.f, 0.f};
    mla_f32x4 v[batch];
#pragma unroll
    for (u32 b = 0; b < batch; ++b) {
      v[b] = none;
      if (mine && sp_begin + b < sp_end) v[b] = part[(sp_begin + b) * split_step];
    }
    if (p0 == 0) {
      for (u32 wq = team.wave(); wq < nq; wq += Team::waves) {
        const u32 wquery = q0 + wq;
        const u32 wrow = first_row + wquery / MLA_HEADS, whead = wquery % MLA_HEADS;
        float m = mla_neg_inf();
        for (u32 sp = team.lane(); sp < n_splits; sp += MONO_WAVE) {
          const float* at = a.part_ml + (((u64)wrow * a.max_splits + sp) * MLA_HEADS + whead) * 2;
          const float ms = at[0];
          weight[wq * n_splits + sp] = ms;
          m = mono_fmaxf(m, ms);
        }
        m = mono_wave_max(m);
        float l = 0.f;
        for (u32 sp = team.lane(); sp < n_splits; sp += MONO_WAVE) {
          const float* at = a.part_ml + (((u64)wrow * a.max_splits + sp) * MLA_HEADS + whead) * 2;
          const float ms = weight[wq * n_splits + sp];
          const float w = ms == mla_neg_inf() ? 0.f : mono_expf(ms - m);
          weight[wq * n_splits + sp] = w;
          l += w * at[1];
        }
        l = mono_wave_sum(l);
        if (team.lane() == 0) total[wq] = l;
      }
      team.sync();
      trace.mark(MLA_PH_WEIGHTS);
    }
    mla_f32x4 o = {0.f, 0.f, 0.f, 0.f};
    for (u32 sp0 = sp_begin; mine && sp0 < sp_end; sp0 += batch) {
      if (sp0 != sp_begin) {
#pragma unroll
        for (u32 b = 0; b < batch; ++b) {
          v[b] = none;
          if (sp0 + b < sp_end) v[b] = part[(sp0 + b) * split_step];
        }
      }
#pragma unroll
      for (u32 b = 0; b < batch; ++b) {
        if (sp0 + b >= sp_end) continue;
        const float w = weight[q * n_splits + sp0 + b];
        o.x += w * v[b].x;
        o.y += w * v[b].y;
        o.z += w * v[b].z;
        o.w += w * v[b].w;
      }
    }
    if (team.thread() < per_pass) sums[team.thread()] = o;
    team.sync();
    if (mine && g == 0) {
      mla_f32x4 t = o;
      for (u32 k = 1; k < groups; ++k) {
        const mla_f32x4 u = sums[team.thread() + k * cols];
        t.x += u.x;
        t.y += u.y;
        t.z += u.z;
        t.w += u.w;
      }
      const float l = total[q];
      const u32 lo = (u32)mono_f32_to_bf16(l > 0.f ? t.x / l : 0.f) | ((u32)mono_f32_to_bf16(l > 0.f ? t.y / l : 0.f) << 16);
      const u32 hi = (u32)mono_f32_to_bf16(l > 0.f ? t.z / l : 0.f) | ((u32)mono_f32_to_bf16(l > 0.f ? t.w / l : 0.f) << 16);
      u32* dst = (u32*)(a.out + ((u64)row * MLA_HEADS + head) * MLA_LATENT + col * 4);
      dst[0] = lo;
      dst[1] = hi;
    }
    team.sync();
  }
  trace.mark(MLA_PH_OUTPUT);
  mla_done(team, task, c, 1u);
  trace.end();
  return true;
}
