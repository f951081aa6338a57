// The attention half's row tasks, between its linears (spec §2.1-2.4): the input RMSNorm, the q
// latent's RMSNorm, the KV latent's RMSNorm with the rope of its key, and the rope of the queries'
// rope parts; and the publication of slot lists as the tagged pairs the splits wait on (lists kept
// in plain memory from an earlier launch, or written by select in the same launch). Each waits on every box of its inputs, works on rows first_row .. first_row + n_rows,
// and publishes its one box after a release. Host side: src/layout.rs `MlaKind::Norm`,
// `MlaKind::RopeQ`, `NormOf`; the pointers are mla_args' half fields (src/gpu.rs `MlaHalfArgs`).
//
// Define (from the host): MLA_ROPE_INTERLEAVED 1: GPT-J pairs (GLM-5); 0: NeoX pairs (the
// half-split form, a negative control).
#pragma once
#include "prelude.h"
#include "mailbox.h"
#include "ops/team.h"
#include "ops/rope.h"
#include "ops/rows.h"
#include "mla_attn.h"

#ifndef MLA_ROPE_INTERLEAVED
#error "mla_rows.h: the host defines MLA_ROPE_INTERLEAVED (the config's rope_interleave)"
#endif

#define MLA_KIND_NORM 3u
#define MLA_KIND_ROPE_Q 4u
#define MLA_KIND_SLOTS 5u
// args[2] of a norm task: which rows it normalises.
#define MLA_NORM_HIDDEN 0u  // hidden -> hidden_normed (RMSNorm_in)
#define MLA_NORM_Q 1u       // q_a -> q_latent (RMSNorm_qa)
#define MLA_NORM_KV 2u      // kv_a's latent -> new_latent (RMSNorm_kv), kv_a's key roped -> new_rope

// The rope of `rows` vectors of MLA_ROPE at src + r * src_stride, to dst + r * MLA_ROPE (bf16), the
// vector r at position positions[first_row + r / per_row]: a thread a pair.
template <class Team>
MONO_DEV void mla_rope_rows(const Team& team, const mla_args& a, const u16* src, u32 src_stride, u16* dst, u32 rows,
                            u32 per_row, u32 first_row) {
  constexpr u32 pairs = MLA_ROPE / 2;
  for (u32 i = team.thread(); i < rows * pairs; i += Team::size) {
    const u32 v = i / pairs, p = i % pairs;
    u32 e0, e1;
    mono_rope_pair_of(p, MLA_ROPE, MLA_ROPE_INTERLEAVED != 0, &e0, &e1);
    const u16* in = src + (u64)v * src_stride;
    float x = mono_bf16_to_f32(in[e0]), y = mono_bf16_to_f32(in[e1]);
    mono_rope_turn(x, y, a.positions[first_row + v / per_row], a.inv_freq[p]);
    dst[(u64)v * MLA_ROPE + e0] = mono_f32_to_bf16(x);
    dst[(u64)v * MLA_ROPE + e1] = mono_f32_to_bf16(y);
  }
}

// args: [first_row, n_rows, which (MLA_NORM_*)].
template <class Team>
MONO_DEV bool mla_norm_task(const Team& team, const mbx_task& task, mbx_ctx& c, const mla_args& a, u8* smem) {
  const u32 first_row = task.args[0], n_rows = task.args[1], which = task.args[2];
  const u16* weight = which == MLA_NORM_HIDDEN ? a.hidden_norm : which == MLA_NORM_Q ? a.q_a_norm : a.kv_a_norm;
  const u32 width = which == MLA_NORM_HIDDEN ? a.hidden_dim : which == MLA_NORM_Q ? a.q_lora : MLA_LATENT;
  if (!mla_wait_inputs(team, task, c, 0)) return false;
  float* scratch = (float*)smem;
  if (which == MLA_NORM_HIDDEN) {
    mono_rmsnorm_rows(team, a.hidden + (u64)first_row * width, width, weight, width, n_rows, a.hidden_eps,
                      a.hidden_normed + (u64)first_row * width, width, scratch);
  } else if (which == MLA_NORM_Q) {
    mono_rmsnorm_rows(team, a.q_a + (u64)first_row * width, width, weight, width, n_rows, a.latent_eps,
                      a.q_latent + (u64)first_row * width, width, scratch);
  } else {
    constexpr u32 stride = MLA_LATENT + MLA_ROPE;
    const u16* kv = a.kv_a + (u64)first_row * stride;
    mono_rmsnorm_rows(team, kv, stride, weight, MLA_LATENT, n_rows, a.latent_eps,
                      a.new_latent + (u64)first_row * MLA_LATENT, MLA_LATENT, scratch);
    mla_rope_rows(team, a, kv + MLA_LATENT, stride, a.new_rope + (u64)first_row * MLA_ROPE, n_rows, 1u, first_row);
  }
  mla_done(team, task, c, 1u);
  return true;
}

// args: [first_row, n_rows, 0]. Every head's rope part of q_b's output, roped, to q_pe.
template <class Team>
MONO_DEV bool mla_rope_q_task(const Team& team, const mbx_task& task, mbx_ctx& c, const mla_args& a) {
  const u32 first_row = task.args[0], n_rows = task.args[1];
  if (!mla_wait_inputs(team, task, c, 0)) return false;
  const u32 head = a.nope + MLA_ROPE;
  mla_rope_rows(team, a, a.q + (u64)first_row * MLA_HEADS * head + a.nope, head,
                a.q_pe + (u64)first_row * MLA_HEADS * MLA_ROPE, n_rows * MLA_HEADS, MLA_HEADS, first_row);
  mla_done(team, task, c, 1u);
  return true;
}

// args: [first_row, n_rows, 0]. Rows first_row .. first_row + n_rows of a.slot_lists (topk
// entries each) as the tagged pairs of task.out: row r's list at out.first + r * a.slot_stride.
// Its inputs, if any, are the boxes that publish the lists in this launch (select's list box of
// each row): waited on, then an acquire, before a list is read. The pairs carry the values, so
// no release is needed.
template <class Team>
MONO_DEV bool mla_slots_task(const Team& team, const mbx_task& task, mbx_ctx& c, const mla_args& a) {
  const u32 first_row = task.args[0], n_rows = task.args[1];
  if (task.n_inputs != 0 && !mla_wait_inputs(team, task, c, 0)) return false;
  for (u32 i = team.thread(); i < n_rows * a.topk; i += Team::size) {
    const u32 r = i / a.topk, e = i % a.topk;
    mbx_put(c, task.out.first + r * a.slot_stride + e, (u32)a.slot_lists[(u64)(first_row + r) * a.topk + e]);
  }
  return true;
}
