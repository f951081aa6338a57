// The head stage's task functions: the embedding lookup, a row RMSNorm (the final norm, the dense
// MLP's post-attention norm), the argmax over one vocabulary shard's logits and the pick across
// shards. Kinds: (MBX_STAGE_HEAD << 8) | HEAD_KIND_*; host twin: src/layout.rs. The matrices
// between them (lm_head, the dense MLP) are the linear stage's tasks.
//
// Every task: args[0] an index into its kind's list in head_args, args[1] its first row, args[2]
// its row count. It waits on every box of task.in (inputs published beside the boxes), does its
// rows, then publishes: a release, and every box of task.out gets (tag, rows).
//
// The argmax's result is a pair, one u64 that orders as the reference's rule does: the logit's
// total-order key high (src/layout.rs `pair_of`), the complement of the token id low. The larger
// pair is the larger logit, and of equal logits the lower id, so shards (and ranks) combine by a
// plain max: HEAD_KIND_PICK, or later an all-gather of the pairs then the same pick.
#pragma once
#include "prelude.h"
#include "mailbox.h"
#include "ops/team.h"
#include "ops/rows.h"

// ---- faults a test builds in on purpose, to show that a check catches them ----------------------
// MONO_FAULT names one (0: none). The head's:
#define MONO_FAULT_HEAD_TIES_HIGH 601  // equal logits go to the higher token id
#define MONO_FAULT_HEAD_NEXT_ROW 602   // the embedding copies the row after the token's
#ifndef MONO_FAULT
#define MONO_FAULT 0
#endif

#define HEAD_KIND_EMBED 1u
#define HEAD_KIND_NORM 2u
#define HEAD_KIND_ARGMAX 3u
#define HEAD_KIND_PICK 4u

// y[r] = table[tokens[r]] (bf16 rows of `hidden`). A token past the table gives a row of bf16 NaN,
// so that a bad id fed back from a previous step shows in every later value instead of reading
// another row.
struct head_embed {
  const u16* table;   // [vocab, hidden]
  const u32* tokens;  // [rows]
  u16* y;             // [rows, y_stride]
  u32 vocab;
  u32 hidden;         // a multiple of 8
  u32 y_stride;       // elements, a multiple of 8
  u32 pad;
};

// y[r] = RMSNorm(x[r]) * weight, bf16 (kernels/ops/rows.h has the rounding points). x and y may
// be the same rows.
struct head_norm {
  const u16* x;       // [rows, x_stride]
  const u16* weight;  // [n]
  u16* y;             // [rows, y_stride]
  u32 n;
  u32 x_stride;
  u32 y_stride;
  float eps;
};

// pairs[r * shards + shard] = the largest pair over logits[r, 0..n) with token ids first_id + c.
struct head_argmax {
  const u16* logits;  // [rows, stride] bf16
  u64* pairs;         // [rows, shards]
  u32 n;
  u32 stride;
  u32 first_id;
  u32 shard;
  u32 shards;
  u32 pad;
};

// tokens[r] = the token of the largest of pairs[r, 0..shards).
// The pick reads the pairs of shards first .. first + count only: a launch holds those its own
// argmaxes wrote (one, its rank's) or an exchange brought; the others are whatever the arena held.
struct head_pick {
  const u64* pairs;  // [rows, shards]
  u32* tokens;       // [rows]
  u32 shards;        // the pairs' row length
  u32 first;
  u32 count;
  u32 pad;
};

// The stage's kernel argument (src/gpu.rs `HeadArgs`): each kind's list.
struct head_args {
  const head_embed* embeds;
  const head_norm* norms;
  const head_argmax* argmaxes;
  const head_pick* picks;
  u32 n_embeds;
  u32 n_norms;
  u32 n_argmaxes;
  u32 n_picks;
};

// The total-order key of a float's bits (as Rust's f32::total_cmp orders them): negative values
// flipped whole, positive ones with the sign bit set, so unsigned order is the float order.
MONO_DEV u32 head_key(u32 bits) { return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u; }
#if MONO_FAULT == MONO_FAULT_HEAD_TIES_HIGH
MONO_DEV u32 head_id_bits(u32 id) { return id; }
#else
MONO_DEV u32 head_id_bits(u32 id) { return 0xffffffffu - id; }
#endif
MONO_DEV u64 head_pair(u32 bits, u32 id) { return ((u64)head_key(bits) << 32) | (u64)head_id_bits(id); }
MONO_DEV u32 head_pair_id(u64 pair) { return head_id_bits((u32)pair); }
MONO_DEV u64 head_max_u64(u64 a, u64 b) { return a > b ? a : b; }

// The largest of every thread's `v`, in every thread; `red` holds a u64 a wave of the team.
template <class Team>
MONO_DEV u64 head_team_max(const Team& team, u64 v, u64* red) {
  for (u32 m = 1; m < MONO_WAVE; m *= 2) {
    const u64 o = ((u64)mono_shfl_xor((u32)(v >> 32), m) << 32) | mono_shfl_xor((u32)v, m);
    v = head_max_u64(v, o);
  }
  if (team.lane() == 0) red[team.wave()] = v;
  team.sync();
  u64 best = red[0];
  for (u32 w = 1; w < Team::waves; ++w) best = head_max_u64(best, red[w]);
  team.sync();  // red may be reused by the next call
  return best;
}

// The task's input ranges (mbx_poll_range), then the team agrees; the acquire makes the data
// published beside the boxes visible.
template <class Team>
MONO_DEV bool head_wait_inputs(const Team& team, const mbx_task& task, const mbx_ctx& c) {
  bool ok = true;
  const u32 n_in = mbx_min(task.n_inputs, MBX_MAX_INPUTS);
  for (u32 r = 0; r < n_in && ok; ++r) ok = mbx_poll_range(c, task.in[r], team.thread(), Team::size);
  ok = team.all(ok);
  mbx_acquire();
  return ok;
}

// A release after the team's stores (the caller ends them on a team barrier), then the boxes.
template <class Team>
MONO_DEV void head_publish(const Team& team, const mbx_task& task, const mbx_ctx& c, u32 value) {
  for (u32 i = team.thread(); i < task.out.len; i += Team::size) {
    mbx_publish();
    mbx_put(c, task.out.first + i, value);
  }
}

template <class Team>
MONO_DEV void head_embed_rows(const Team& team, const head_embed& e, u32 first, u32 count) {
  const u32 chunks = e.hidden / 8;
  for (u32 i = team.thread(); i < count * chunks; i += Team::size) {
    const u32 r = first + i / chunks, c = i % chunks;
#if MONO_FAULT == MONO_FAULT_HEAD_NEXT_ROW
    const u32 token = e.tokens[r] + 1u;
#else
    const u32 token = e.tokens[r];
#endif
    mono_u32x4 v = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    if (token < e.vocab) v = *(const mono_u32x4*)(e.table + (u64)token * e.hidden + 8 * c);
    *(mono_u32x4*)(e.y + (u64)r * e.y_stride + 8 * c) = v;
  }
}

MONO_DEV u32 head_word(const mono_u32x4& v, u32 q) { return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w; }

// Loads of a thread in flight at once: the logits were just written, so each load waits on L2,
// and a thread's loads issued together take one wait instead of one each.
#define HEAD_ARGMAX_LOADS 4u

template <class Team>
MONO_DEV void head_argmax_rows(const Team& team, const head_argmax& a, u32 first, u32 count, u8* smem) {
  u64* red = (u64*)smem;
  constexpr u32 U = HEAD_ARGMAX_LOADS;
  for (u32 r = first; r < first + count; ++r) {
    const u16* row = a.logits + (u64)r * a.stride;
    u64 best = 0;  // below every pair: no id has the complement 0xffffffff - id = 0 with key 0
    // 16-byte chunks of 8 logits where the row is aligned to them, then single logits.
    const u32 chunks = ((u64)row % 16 == 0) ? a.n / 8 : 0u;
    const mono_u32x4* v = (const mono_u32x4*)row;
    for (u32 base = 0; base < chunks; base += U * Team::size) {
      mono_u32x4 w[U];
#pragma unroll
      for (u32 u = 0; u < U; ++u) {
        const u32 i = base + u * Team::size + team.thread();
        if (i < chunks) w[u] = v[i];
      }
#pragma unroll
      for (u32 u = 0; u < U; ++u) {
        const u32 i = base + u * Team::size + team.thread();
        if (i >= chunks) continue;
#pragma unroll
        for (u32 e = 0; e < 8; ++e) {
          const u32 bits = (head_word(w[u], e / 2) >> (16 * (e % 2))) << 16;
          best = head_max_u64(best, head_pair(bits, a.first_id + 8 * i + e));
        }
      }
    }
    for (u32 c = 8 * chunks + team.thread(); c < a.n; c += Team::size)
      best = head_max_u64(best, head_pair((u32)row[c] << 16, a.first_id + c));
    best = head_team_max(team, best, red);
    if (team.leader()) a.pairs[(u64)r * a.shards + a.shard] = best;
  }
}

template <class Team>
MONO_DEV void head_pick_rows(const Team& team, const head_pick& p, u32 first, u32 count) {
  for (u32 r = first + team.thread(); r < first + count; r += Team::size) {
    u64 best = 0;
    for (u32 s = p.first; s < p.first + p.count; ++s) best = head_max_u64(best, p.pairs[(u64)r * p.shards + s]);
    p.tokens[r] = head_pair_id(best);
  }
}

template <class Team>
MONO_DEV bool head_decode(const Team& team, const mbx_task& task, mbx_ctx& c, const head_args& a, u8* smem) {
  const u32 kind = mbx_own_kind(task.kind), op = task.args[0], first = task.args[1], count = task.args[2];
  // The host builds no task past its kind's list.
  const u32 ops = kind == HEAD_KIND_EMBED    ? a.n_embeds
                  : kind == HEAD_KIND_NORM   ? a.n_norms
                  : kind == HEAD_KIND_ARGMAX ? a.n_argmaxes
                  : kind == HEAD_KIND_PICK   ? a.n_picks
                                             : 0u;
  if (op >= ops) return true;
  if (!head_wait_inputs(team, task, c)) return false;
  switch (kind) {
    case HEAD_KIND_EMBED:
      head_embed_rows(team, a.embeds[op], first, count);
      break;
    case HEAD_KIND_NORM: {
      const head_norm& n = a.norms[op];
      mono_rmsnorm_rows(team, n.x + (u64)first * n.x_stride, n.x_stride, n.weight, n.n, count, n.eps,
                        n.y + (u64)first * n.y_stride, n.y_stride, (float*)smem);
      break;
    }
    case HEAD_KIND_ARGMAX:
      head_argmax_rows(team, a.argmaxes[op], first, count, smem);
      break;
    case HEAD_KIND_PICK:
      head_pick_rows(team, a.picks[op], first, count);
      break;
  }
  team.sync();
  head_publish(team, task, c, count);
  return true;
}
