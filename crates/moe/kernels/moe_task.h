// The MoE stage's own tasks (host twin: src/layout.rs). The matrices around them are the linear
// stage's: the router's fp32 logits and the shared expert are LIN_KIND_TILES tasks, the routed
// experts LIN_KIND_EXPERT_TILES tasks reading their expert from the route task's slot boxes.
// Kinds: (MBX_STAGE_MOE << 8) | MOE_KIND_*.
//
// MOE_KIND_ROUTE: waits on task.in (the router's logits tasks: the router is split along k into
// router_splits matrices, whose fp32 partial logits it adds in split order), then for every row:
// s = sigmoid,
// s + bias for the choice only, group-limited routing (n_group / topk_group: groups ranked by the
// sum of their two best biased scores), top_k by biased score (ties to the lower expert), weights
// s / (sum of the chosen s, in rank order, + 1e-20 when normalised) * scaling. The step's chosen
// experts, ascending, fill slots 0..d; it writes each row's slots, experts and weights (ascending
// expert), every slot's per-row weight (0 for rows that did not choose it: the down's row scale),
// a release, then task.out's box j gets slot j's expert (LIN_NO_EXPERT past d).
//
// MOE_KIND_COMBINE: args[0] the first column, args[1] the columns. Waits on task.in (the route
// task, the shared down, every routed down), then out[r, c] = bf16(residual + y) with
// y = bf16(bf16(sum over the row's experts ascending of the weighted outputs, a bf16 running sum)
// + shared): one thread an output, a fixed order, no atomics. Publishes its boxes.
#pragma once
#include "prelude.h"
#include "mailbox.h"
#include "lin_task.h"

#define MOE_KIND_ROUTE 1u
#define MOE_KIND_COMBINE 2u
#define MOE_NORM_TOPK 1u  // moe_args.flags

// The stage's kernel argument (src/gpu.rs `MoeArgs`, 128 bytes).
struct moe_args {
  const float* logits;   // [router_splits, rows, experts] fp32 partial logits
  const float* bias;     // [experts] e_score_correction_bias
  u32* row_slots;        // [rows, top_k]: the slot of each of the row's experts, ascending expert
  u32* row_experts;      // [rows, top_k]
  float* row_weights;    // [rows, top_k]
  float* slot_scale;     // [slots, rows]
  const u16* residual;   // [rows, hidden] bf16
  const u16* shared;     // [rows, hidden] bf16, the shared expert's output
  const u16* routed;     // [rows, slots, hidden] bf16, each slot's weighted expert output
  u16* out;              // [rows, hidden] bf16
  u32 rows;
  u32 experts;
  u32 top_k;
  u32 slots;
  u32 hidden;
  u32 n_group;
  u32 topk_group;
  u32 flags;
  float scaling;
  u32 router_splits;
  u32 pad[2];
};

// Host twin: the logistic sigmoid of model::numerics, which never overflows.
MONO_DEV float moe_sigmoid(float x) {
  if (x >= 0.f) return 1.f / (1.f + mono_expf(-x));
  const float e = mono_expf(x);
  return e / (1.f + e);
}

MONO_DEV float moe_neg_inf() { return mono_bits_f32(0xff800000u); }

// b ranks above a (ties to the lower index).
MONO_DEV bool moe_before(float b, u32 ib, float a, u32 ia) { return b > a || (b == a && ib < ia); }

template <class Team>
MONO_DEV bool moe_route(const Team& team, const mbx_task& task, mbx_ctx& c, const moe_args& a, u8* smem) {
  const u32 R = a.rows, E = a.experts, K = a.top_k, G = a.n_group, per_group = E / G;
  float* s = (float*)smem;               // [R][E] sigmoid
  float* b = s + R * E;                  // [R][E] biased; -inf in a dropped group
  float* gs = b + R * E;                 // [R][G] group scores
  u32* sel = (u32*)(gs + R * G);         // [R][K] expert by rank
  u32* used = sel + R * K;               // [E] chosen by some row
  u32* slot_of = used + E;               // [E]
  u32* slot_expert = slot_of + E;        // [slots]
  u32* used_below = slot_expert + a.slots;  // [E / 32 + 1]: chosen experts below each 32
  for (u32 i = team.thread(); i < E; i += Team::size) used[i] = 0;
  for (u32 i = team.thread(); i < a.slots; i += Team::size) slot_expert[i] = LIN_NO_EXPERT;
  for (u32 i = team.thread(); i < a.slots * R; i += Team::size) a.slot_scale[i] = 0.f;
  if (!lin_wait_inputs(team, task, c)) return false;
  for (u32 i = team.thread(); i < R * E; i += Team::size) {
    float logit = a.logits[i];
    for (u32 p = 1; p < a.router_splits; ++p) logit += a.logits[(u64)p * R * E + i];
    const float v = moe_sigmoid(logit);
    s[i] = v;
    b[i] = v + a.bias[i % E];
  }
  team.sync();
  if (G > 1) {
    for (u32 i = team.thread(); i < R * G; i += Team::size) {
      const float* x = b + (i / G) * E + (i % G) * per_group;
      float m1 = moe_neg_inf(), m2 = moe_neg_inf();
      for (u32 e = 0; e < per_group; ++e) {
        if (x[e] > m1) {
          m2 = m1;
          m1 = x[e];
        } else if (x[e] > m2) {
          m2 = x[e];
        }
      }
      gs[i] = m1 + m2;
    }
    team.sync();
    for (u32 i = team.thread(); i < R * G; i += Team::size) {
      const u32 r = i / G, g = i % G;
      u32 rank = 0;
      for (u32 h = 0; h < G; ++h) rank += moe_before(gs[r * G + h], h, gs[i], g) ? 1u : 0u;
      if (rank >= a.topk_group)
        for (u32 e = 0; e < per_group; ++e) b[r * E + g * per_group + e] = moe_neg_inf();
    }
    team.sync();
  }
  for (u32 i = team.thread(); i < R * E; i += Team::size) {
    const u32 r = i / E, e = i % E;
    const float x = b[i];
    if (x == moe_neg_inf()) continue;
    u32 rank = 0;
    for (u32 h = 0; h < E && rank < K; ++h) rank += moe_before(b[r * E + h], h, x, e) ? 1u : 0u;
    if (rank < K) {
      sel[r * K + rank] = e;
      used[e] = 1;
    }
  }
  team.sync();
  // Slot of a chosen expert: the chosen experts below it (counts of each 32 first, in order).
  const u32 words = (E + 31) / 32;
  for (u32 w = team.thread(); w < words; w += Team::size) {
    u32 n = 0;
    for (u32 h = 32 * w; h < E && h < 32 * w + 32; ++h) n += used[h];
    used_below[w] = n;
  }
  team.sync();
  if (team.leader())
    for (u32 w = 0, below = 0; w < words; ++w) {
      const u32 n = used_below[w];
      used_below[w] = below;
      below += n;
    }
  team.sync();
  for (u32 e = team.thread(); e < E; e += Team::size) {
    if (!used[e]) continue;
    u32 below = used_below[e / 32];
    for (u32 h = e / 32 * 32; h < e; ++h) below += used[h];
    slot_of[e] = below;
    if (below < a.slots) slot_expert[below] = e;
  }
  team.sync();
  for (u32 r = team.thread(); r < R; r += Team::size) {
    u32* mine = sel + r * K;
    float total = 0.f;
    for (u32 i = 0; i < K; ++i) total += s[r * E + mine[i]];
    const float den = (a.flags & MOE_NORM_TOPK) ? total + 1e-20f : 1.f;
    // The row's experts ascending (insertion sort of K ranks).
    for (u32 i = 1; i < K; ++i)
      for (u32 j = i; j > 0 && mine[j - 1] > mine[j]; --j) {
        const u32 t = mine[j];
        mine[j] = mine[j - 1];
        mine[j - 1] = t;
      }
    for (u32 p = 0; p < K; ++p) {
      const u32 e = mine[p], slot = slot_of[e];
      const float w = s[r * E + e] / den * a.scaling;
      a.row_slots[r * K + p] = slot;
      a.row_experts[r * K + p] = e;
      a.row_weights[r * K + p] = w;
      if (slot < a.slots) a.slot_scale[slot * R + r] = w;
    }
  }
  team.sync();
  for (u32 j = team.thread(); j < task.out.len; j += Team::size) {
    mbx_publish();
    mbx_put(c, task.out.first + j, j < a.slots ? slot_expert[j] : LIN_NO_EXPERT);
  }
  return true;
}

template <class Team>
MONO_DEV bool moe_combine(const Team& team, const mbx_task& task, mbx_ctx& c, const moe_args& a) {
  if (!lin_wait_inputs(team, task, c)) return false;
  const u32 first = task.args[0], count = task.args[1];
  for (u32 i = team.thread(); i < a.rows * count; i += Team::size) {
    const u32 r = i / count, col = first + i % count;
    if (col >= a.hidden) continue;
    float y = 0.f;
    for (u32 p = 0; p < a.top_k; ++p) {
      const u32 slot = a.row_slots[r * a.top_k + p];
      if (slot >= a.slots) continue;  // the route task writes no such slot
      y = lin_bf16(y + mono_bf16_to_f32(a.routed[((u64)r * a.slots + slot) * a.hidden + col]));
    }
    const u64 at = (u64)r * a.hidden + col;
    y = lin_bf16(y + mono_bf16_to_f32(a.shared[at]));
    a.out[at] = mono_f32_to_bf16(mono_bf16_to_f32(a.residual[at]) + y);
  }
  team.sync();
  lin_publish(team, task, c, count);
  return true;
}

template <class Team>
MONO_DEV bool moe_decode(const Team& team, const mbx_task& task, mbx_ctx& c, const moe_args& a, u8* smem) {
  switch (mbx_own_kind(task.kind)) {
    case MOE_KIND_ROUTE:
      return moe_route(team, task, c, a, smem);
    case MOE_KIND_COMBINE:
      return moe_combine(team, task, c, a);
    default:
      return true;
  }
}
