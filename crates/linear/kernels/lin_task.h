// The linear stage's task functions (the tile itself is kernels/ops/linear.h, shared with every
// stage that streams weights). Kinds: (MBX_STAGE_LINEAR << 8) | LIN_KIND_*; host twin: src/layout.rs.
//
// LIN_KIND_TILES: args[0] the matrix (an index into lin_args.mats), args[1] its first tile,
// args[2] the tile count. Issues its first weight loads, waits on every box of task.in (the x
// rows' completion boxes), computes and stores its columns of y, then publishes: every box of
// task.out gets (tag, tile count) after a release.
#pragma once
#include "prelude.h"
#include "mailbox.h"
#include "ops/linear.h"

#define LIN_KIND_TILES 1u

// The stage's kernel argument (src/gpu.rs `LinArgs`): the launch's matrices.
struct lin_args {
  const lin_matrix* mats;
  u32 n_mats;
  u32 pad;
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

template <class Team>
MONO_DEV bool lin_task(const Team& team, const mbx_task& task, mbx_ctx& c, const lin_args& a, u8* smem) {
  if (task.args[0] >= a.n_mats) return true;  // the host builds no such task
  const lin_matrix& m = a.mats[task.args[0]];
  const u32 first = task.args[1], count = task.args[2];
  if (!lin_tiles(team, m, first, count, smem, [&] { return lin_wait_inputs(team, task, c); })) return false;
  // lin_tiles ended on a team barrier after the last store: a release, then the boxes.
  for (u32 i = team.thread(); i < task.out.len; i += Team::size) {
    mbx_publish();
    mbx_put(c, task.out.first + i, count);
  }
  return true;
}

template <class Team>
MONO_DEV bool lin_decode(const Team& team, const mbx_task& task, mbx_ctx& c, const lin_args& a, u8* smem) {
  switch (mbx_own_kind(task.kind)) {
    case LIN_KIND_TILES:
      return lin_task(team, task, c, a, smem);
    default:
      return true;
  }
}
