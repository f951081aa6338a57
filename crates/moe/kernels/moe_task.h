// The MoE stage's own tasks (host twin: src/layout.rs). The matrices around them are the linear
// stage's: the router's fp32 logits and the shared expert are LIN_KIND_TILES tasks, the routed
// experts LIN_KIND_EXPERT_PAIR gangs reading their expert from the route task's slot boxes.
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
// MOE_KIND_COMBINE: args[0] the first column, args[1] the columns (both even). Waits on task.in
// (the route task, the shared down, every slot's gang), then out[r, c] = bf16(residual + y) with
// y = bf16(bf16(sum over the row's experts ascending of the weighted outputs, a bf16 running sum)
// + shared): one thread two outputs, a fixed order, no atomics. Publishes its boxes.
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

// A row is routed by one wave, lane l holding experts l + MONO_WAVE j for j below this (host
// twin: layout::ROUTE_MAX_EXPERTS is this times the narrower, 32-lane wave), so that the top-k is
// a few wave argmaxes over registers instead of a rank count over shared memory.
#define MOE_ROUTE_PER_LANE 8u

MONO_DEV u64 moe_lanes_below() { return (1ull << mono_lane()) - 1ull; }

// x joins the two largest values (m1 >= m2) seen so far.
MONO_DEV void moe_top2_add(float& m1, float& m2, float x) {
  if (x > m1) {
    m2 = m1;
    m1 = x;
  } else if (x > m2) {
    m2 = x;
  }
}

// The wave's best (v, e) by moe_before, in every lane: a strict order, so every lane's butterfly
// ends on the same pair.
MONO_DEV void moe_wave_best(float& v, u32& e) {
#pragma unroll
  for (u32 m = MONO_WAVE / 2; m > 0; m >>= 1) {
    const float ov = mono_shfl_xor_f32(v, m);
    const u32 oe = mono_shfl_xor(e, m);
    if (moe_before(ov, oe, v, e)) {
      v = ov;
      e = oe;
    }
  }
}

// Router splits the route task adds at most (host twin: layout::MAX_ROUTER_SPLITS).
#define MOE_MAX_ROUTER_SPLITS 4u
// (row, expert) pairs a thread scores from one batch of loads: a batch's logits, every split's,
// are in flight at once, so that the scores cost one round trip to L2 (a round trip under the
// experts' weight streams is most of a microsecond) instead of one a split and an expert.
#define MOE_SCORE_BATCH 4u
// A row's scores in shared memory: every expert a wave's lanes hold (host twin:
// layout::ROUTE_ROW_SCORES, for the wider, 64-lane wave), those past the experts s = 0 and
// s + bias = -inf, as a lane's registers held them.
#define MOE_ROW_SCORES (MOE_ROUTE_PER_LANE * MONO_WAVE)

// Every (row, expert)'s score s and biased score s + bias into shared memory
// ([rows][MOE_ROW_SCORES] each), by the whole team: the logits summed in split order.
template <class Team>
MONO_DEV void moe_scores(const Team& team, const moe_args& a, const float* bias, float* score, float* biased) {
  constexpr u32 B = MOE_SCORE_BATCH, S = MOE_MAX_ROUTER_SPLITS, N = MOE_ROW_SCORES;
  const u32 E = a.experts, R = a.rows, splits = a.router_splits;
  const u64 split_stride = (u64)R * E;
  for (u32 first = team.thread(); first < R * N; first += Team::size * B) {
    float part[B][S];
#pragma unroll
    for (u32 u = 0; u < B; ++u) {
      const u32 i = first + u * Team::size, r = i / N, e = i % N;
      const bool real = r < R && e < E;
#pragma unroll
      for (u32 p = 0; p < S; ++p) part[u][p] = real && p < splits ? a.logits[p * split_stride + r * E + e] : 0.f;
    }
#pragma unroll
    for (u32 u = 0; u < B; ++u) {
      const u32 i = first + u * Team::size, r = i / N, e = i % N;
      if (r >= R) continue;
      float logit = part[u][0];
#pragma unroll
      for (u32 p = 1; p < S; ++p)
        if (p < splits) logit += part[u][p];
      const float s = e < E ? moe_sigmoid(logit) : 0.f;
      score[i] = s;
      biased[i] = e < E ? s + bias[e] : moe_neg_inf();
    }
  }
}

// Row r by the calling wave (score, biased: the row's, in shared memory), lane l holding experts
// l + MONO_WAVE j in registers: the choice, the weights, the row's experts ascending and their
// weights to memory and to experts[0..K), weights[0..K); its chosen set a ballot word a j in
// chosen[j]. A lane's experts are named by j alone (immediates) or from a runtime j: in the fused
// kernel ptxas would otherwise keep l + MONO_WAVE j for every j from the kernel's start, spilled,
// and reload them from L2 on every pass of the top-k.
MONO_DEV void moe_route_row(const moe_args& a, u32 r, const float* score, const float* biased, u64* chosen,
                            u32* experts, float* weights) {
  constexpr u32 P = MOE_ROUTE_PER_LANE, W = MONO_WAVE;
  const u32 E = a.experts, K = a.top_k, G = a.n_group, per_group = E / G;
  const u32 lane = mono_lane();
  float s[P], b[P];
#pragma unroll
  for (u32 j = 0; j < P; ++j) {
    s[j] = score[lane + W * j];
    b[j] = biased[lane + W * j];
  }
  if (G > 1) {
    // Group g's score (the sum of its two best biased scores) in lane g, its rank among the
    // groups (ties to the lower group), then the dropped groups' experts out of the choice.
    float group = 0.f;
    for (u32 g = 0; g < G; ++g) {
      float m1 = moe_neg_inf(), m2 = moe_neg_inf();
#pragma unroll
      for (u32 j = 0; j < P; ++j) {
        const u32 e = lane + W * j;
        if (e < E && e / per_group == g) moe_top2_add(m1, m2, b[j]);
      }
#pragma unroll
      for (u32 m = W / 2; m > 0; m >>= 1) {
        const float o1 = mono_shfl_xor_f32(m1, m), o2 = mono_shfl_xor_f32(m2, m);
        moe_top2_add(m1, m2, o1);
        moe_top2_add(m1, m2, o2);
      }
      if (lane == g) group = m1 + m2;
    }
    u32 rank = 0;
    for (u32 h = 0; h < G; ++h) {
      const float other = mono_bits_f32(mono_shfl(mono_f32_bits(group), h));
      rank += moe_before(other, h, group, lane) ? 1u : 0u;
    }
    const u64 kept = mono_ballot(lane < G && rank < a.topk_group);
#pragma unroll
    for (u32 j = 0; j < P; ++j) {
      const u32 e = lane + W * j;
      if (e < E && !((kept >> (e / per_group)) & 1ull)) b[j] = moe_neg_inf();
    }
  }
  // top_k wave argmaxes, in rank order; the chosen scores summed in that order. A lane scans its
  // experts upwards, so a tie never displaces its best so far (a lower expert) but does displace
  // none yet: moe_before over its experts.
  u32 mine = 0;
  float total = 0.f;
  for (u32 k = 0; k < K; ++k) {
    float v = moe_neg_inf(), sv = 0.f;
    u32 at = P;
#pragma unroll
    for (u32 j = 0; j < P; ++j) {
      if (!((mine >> j) & 1u) && (b[j] > v || (b[j] == v && at == P))) {
        v = b[j];
        sv = s[j];
        at = j;
      }
    }
    u32 best = at == P ? ~0u : lane + W * at;
    moe_wave_best(v, best);
    total += mono_bits_f32(mono_shfl(mono_f32_bits(sv), best % W));
    if (best % W == lane) mine |= 1u << (best / W);
  }
  const float den = (a.flags & MOE_NORM_TOPK) ? total + 1e-20f : 1.f;
  // The row's experts ascending: the chosen ones below an expert are the ballots of the lower
  // j's and this j's lower lanes.
  u32 below = 0;
#pragma unroll 1
  for (u32 j = 0; j < P; ++j) {
    const bool took = (mine >> j) & 1u;
    const u64 word = mono_ballot(took);
    if (took) {
      const u32 p = below + mono_popc64(word & moe_lanes_below()), e = lane + W * j;
      const float w = score[e] / den * a.scaling;
      a.row_experts[r * K + p] = e;
      a.row_weights[r * K + p] = w;
      experts[p] = e;
      weights[p] = w;
    }
    if (lane == 0) chosen[j] = word;
    below += mono_popc64(word);
  }
}

template <class Team>
MONO_DEV bool moe_route(const Team& team, const mbx_task& task, mbx_ctx& c, const moe_args& a, u8* smem) {
  static_assert(Team::size % MONO_WAVE == 0, "the route takes whole waves, a row a wave");
  constexpr u32 P = MOE_ROUTE_PER_LANE, W = MONO_WAVE, N = MOE_ROW_SCORES;
  const u32 R = a.rows, E = a.experts, K = a.top_k;
  u64* chosen = (u64*)smem;                      // [R][P] ballot words of each row's choice
  u64* any = chosen + R * P;                     // [P] their union over the rows
  float* weights = (float*)(any + P);            // [R][K] each row's weights, ascending expert
  u32* experts = (u32*)(weights + R * K);        // [R][K] each row's experts, ascending
  u32* slot_expert = experts + R * K;            // [slots]
  u32* expert_slot = slot_expert + a.slots;      // [N]
  float* bias = (float*)(expert_slot + N);       // [E]
  float* score = bias + E;                       // [R][N] s
  float* biased = score + R * N;                 // [R][N] s + bias, for the choice
  // Read before the waits: after the publish's fence each would be another load from memory.
  const u32 first_box = task.out.first, boxes = task.out.len;
  for (u32 i = team.thread(); i < a.slots; i += Team::size) slot_expert[i] = LIN_NO_EXPERT;
  for (u32 i = team.thread(); i < a.slots * R; i += Team::size) a.slot_scale[i] = 0.f;
  for (u32 e = team.thread(); e < E; e += Team::size) bias[e] = a.bias[e];
  if (!lin_wait_inputs(team, task, c)) return false;  // its barrier also shows every thread the bias
  moe_scores(team, a, bias, score, biased);
  team.sync();
  for (u32 r = team.wave(); r < R; r += Team::waves)
    moe_route_row(a, r, score + r * N, biased + r * N, chosen + r * P, experts + r * K, weights + r * K);
  team.sync();
  // The step's chosen experts, ascending, fill the slots: the slot of an expert is the number of
  // chosen experts below it in the union of the rows' ballot words.
  for (u32 j = team.thread(); j < P; j += Team::size) {
    u64 word = 0;
    for (u32 r = 0; r < R; ++r) word |= chosen[r * P + j];
    any[j] = word;
  }
  team.sync();
  for (u32 e = team.thread(); e < N; e += Team::size) {
    const u32 j = e / W, l = e % W;
    u32 below = 0;
    for (u32 q = 0; q < j; ++q) below += mono_popc64(any[q]);
    if ((any[j] >> l) & 1ull) {
      const u32 slot = below + mono_popc64(any[j] & ((1ull << l) - 1ull));
      expert_slot[e] = slot;
      if (slot < a.slots) slot_expert[slot] = e;
    }
  }
  team.sync();
  for (u32 i = team.thread(); i < R * K; i += Team::size) {
    const u32 slot = expert_slot[experts[i]];
    a.row_slots[i] = slot;
    if (slot < a.slots) a.slot_scale[slot * R + i / K] = weights[i];
  }
  team.sync();
  for (u32 j = team.thread(); j < boxes; j += Team::size) {
    mbx_publish();
    mbx_put(c, first_box + j, j < a.slots ? slot_expert[j] : LIN_NO_EXPERT);
  }
  return true;
}

// Expert outputs a combine thread has in flight at once: a row's top_k at GLM-5's 8.
#define MOE_COMBINE_BATCH 8u

// A thread a (row, column pair): the row's slots, then every expert output of the row (up to
// MOE_COMBINE_BATCH at a time) in flight before the first is added, as are the shared output and
// the residual. One load after another, a row's eight experts were about sixteen dependent round
// trips to L2 a thread (the combine link's time in the step's timeline, PERF.md). The sums are
// taken in the same order, so the bits are the same. Two columns a thread and not more: wider
// loads hold more registers in a kernel that already spills at its cap of 128.
template <class Team>
MONO_DEV bool moe_combine(const Team& team, const mbx_task& task, mbx_ctx& c, const moe_args& a) {
  constexpr u32 B = MOE_COMBINE_BATCH;
  if (!lin_wait_inputs(team, task, c)) return false;
  const u32 first = task.args[0], pairs = task.args[1] / 2;  // layout: even columns
  for (u32 i = team.thread(); i < a.rows * pairs; i += Team::size) {
    const u32 r = i / pairs, col = first + 2 * (i % pairs);
    const u64 at = (u64)r * a.hidden + col;
    const u32 shared = *(const u32*)(a.shared + at), residual = *(const u32*)(a.residual + at);
    float y[2] = {0.f, 0.f};
    for (u32 p0 = 0; p0 < a.top_k; p0 += B) {
      u32 slot[B], v[B];
#pragma unroll
      for (u32 b = 0; b < B; ++b) slot[b] = p0 + b < a.top_k ? a.row_slots[r * a.top_k + p0 + b] : a.slots;
#pragma unroll
      for (u32 b = 0; b < B; ++b)  // the route task writes no slot past a.slots
        v[b] = slot[b] < a.slots ? *(const u32*)(a.routed + ((u64)r * a.slots + slot[b]) * a.hidden + col) : 0u;
#pragma unroll
      for (u32 b = 0; b < B; ++b)
        if (slot[b] < a.slots)
#pragma unroll
          for (u32 h = 0; h < 2; ++h) y[h] = lin_bf16(y[h] + mono_bf16_to_f32((u16)(v[b] >> (16 * h))));
    }
    u32 out = 0;
#pragma unroll
    for (u32 h = 0; h < 2; ++h) {
      const float s = lin_bf16(y[h] + mono_bf16_to_f32((u16)(shared >> (16 * h))));
      out |= (u32)mono_f32_to_bf16(mono_bf16_to_f32((u16)(residual >> (16 * h))) + s) << (16 * h);
    }
    *(u32*)(a.out + at) = out;
  }
  team.sync();
  lin_publish(team, c, task.out.first, task.out.len, task.args[1]);
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
