// The linear stage's task functions (the tile itself is kernels/ops/linear.h, shared with every
// stage that streams weights). Kinds: (MBX_STAGE_LINEAR << 8) | LIN_KIND_*; host twin: src/layout.rs.
//
// LIN_KIND_TILES: args[0] the matrix (an index into lin_args.mats), args[1] its first tile,
// args[2] the tile count. Issues its first weight loads, waits on every box of task.in (the x
// rows' completion boxes), computes and stores its columns of y, then publishes: every box of
// task.out gets (tag, tile count) after a release.
//
// LIN_KIND_EXPERT_TILES: a range of tiles of an expert chosen on the device. args[0] the bank (an
// index into lin_args.experts) | the slot << 16, args[1] the first tile, args[2] the tile count;
// task.in[0] is the slot's box, whose value is the expert (LIN_NO_EXPERT: the slot is unused, the
// task only publishes). The weight follows the box, so its loads start after that one wait; the
// rest of task.in (the x rows' boxes) is waited on after them, as for LIN_KIND_TILES.
#pragma once
#include "prelude.h"
#include "mailbox.h"
#include "ops/linear.h"

#define LIN_KIND_TILES 1u
#define LIN_KIND_EXPERT_TILES 2u
#define LIN_NO_EXPERT 0xffffffffu

// A bank of same-shaped experts (src/gpu.rs `LinExpert`, 144 bytes): `m` is expert 0 of slot 0;
// expert e's weight and scales lie e strides further, slot j's x, y and row scales j strides.
struct lin_expert {
  lin_matrix m;
  u64 w_stride;          // bytes
  u64 scales_stride;     // floats
  u64 x_slot;            // elements (0: every slot reads the same x)
  u64 y_slot;            // elements
  u64 row_scale_slot;    // floats
  u32 n_experts;
  u32 pad;
};

// The stage's kernel argument (src/gpu.rs `LinArgs`): the launch's matrices and expert banks.
struct lin_args {
  const lin_matrix* mats;
  const lin_expert* experts;
  u32 n_mats;
  u32 n_experts;
};

// Every box of the task's input ranges, a thread a box, then the team agrees; the acquire makes
// the data published beside the boxes visible.
template <class Team>
MONO_DEV bool lin_wait_inputs(const Team& team, const mbx_task& task, const mbx_ctx& c) {
  bool ok = true;
  const u32 n_in = mbx_min(task.n_inputs, MBX_MAX_INPUTS);
  for (u32 r = 0; r < n_in && ok; ++r)
    for (u32 i = team.thread(); i < task.in[r].len && ok; i += Team::size) {
      u32 v;
      ok = mbx_poll(c, task.in[r].first + i, &v);
    }
  ok = team.all(ok);
  mbx_acquire();
  return ok;
}

// After the task's last store and a team barrier: a release, then every box of task.out.
template <class Team>
MONO_DEV void lin_publish(const Team& team, const mbx_task& task, const mbx_ctx& c, u32 count) {
  for (u32 i = team.thread(); i < task.out.len; i += Team::size) {
    mbx_publish();
    mbx_put(c, task.out.first + i, count);
  }
}

// The matrix of an expert task, in shared memory (a copy in registers would hold 20 of them
// through the whole tile), or null: the slot is unused (or the bank is not the launch's).
// Every thread polls the slot's box; false only when that wait gave up.
template <class Team>
MONO_DEV bool lin_expert_matrix(const Team& team, const mbx_task& task, const mbx_ctx& c, const lin_args& a,
                                const lin_matrix** out) {
  __shared__ lin_matrix chosen;
  *out = nullptr;
  const u32 bank = task.args[0] & 0xffffu, slot = task.args[0] >> 16;
  if (bank >= a.n_experts || task.n_inputs == 0 || task.in[0].len != 1) return true;  // the host builds no such task
  const lin_expert& b = a.experts[bank];
  u32 e = LIN_NO_EXPERT;
  if (!team.all(mbx_poll(c, task.in[0].first, &e))) return false;
  if (e >= b.n_experts) return true;
  if (team.leader()) {
    chosen = b.m;
    chosen.w += e * b.w_stride;
    chosen.scales += e * b.scales_stride;
    chosen.x += slot * b.x_slot;
    chosen.y = (u8*)chosen.y + slot * b.y_slot * ((chosen.flags & LIN_OUT_F32) ? 4u : 2u);
    chosen.row_scale += slot * b.row_scale_slot;
  }
  team.sync();
  *out = &chosen;
  return true;
}

// Both kinds, through one call of the tile (one inlined copy of it in the kernel).
template <class Team>
MONO_DEV bool lin_task(const Team& team, const mbx_task& task, mbx_ctx& c, const lin_args& a, u8* smem) {
  const lin_matrix* m = nullptr;
  if (mbx_own_kind(task.kind) == LIN_KIND_TILES) {
    if (task.args[0] >= a.n_mats) return true;  // the host builds no such task
    m = a.mats + task.args[0];
  } else if (!lin_expert_matrix(team, task, c, a, &m)) {
    return false;
  }
  const u32 first = task.args[1], count = task.args[2];
#if LIN_STAMPS && MONO_NVIDIA
  if (team.leader())
    for (u32 j = 0; j < LIN_STAMP_WORDS; ++j) lin_stamps[j] = 0;
#endif
  // An unused slot's task writes nothing, so it publishes without waiting.
  if (m && !lin_tiles(team, *m, first, count, smem, [&] { return lin_wait_inputs(team, task, c); })) return false;
  lin_publish(team, task, c, count);
#if LIN_STAMPS && MONO_NVIDIA && defined(LIN_STAMP_BUF)
  // LIN_STAMP_BUF: the device address of the stamps (LIN_STAMP_WORDS a task, by its order).
  LIN_STAMP(team, LIN_STAMP_PUBLISHED, 0u);
  if (team.leader())
    for (u32 j = 0; j < LIN_STAMP_WORDS; ++j) ((u64*)LIN_STAMP_BUF)[(u64)task.order * LIN_STAMP_WORDS + j] = lin_stamps[j];
#endif
  return true;
}

template <class Team>
MONO_DEV bool lin_decode(const Team& team, const mbx_task& task, mbx_ctx& c, const lin_args& a, u8* smem) {
  switch (mbx_own_kind(task.kind)) {
    case LIN_KIND_TILES:
    case LIN_KIND_EXPERT_TILES:
      return lin_task(team, task, c, a, smem);
    default:
      return true;
  }
}
