// The linear stage's task functions (the tile itself is kernels/ops/linear.h, shared with every
// stage that streams weights). Kinds: (MBX_STAGE_LINEAR << 8) | LIN_KIND_*; host twin: src/layout.rs.
//
// LIN_KIND_TILES: args[0] the matrix (an index into lin_args.mats), args[1] its first tile,
// args[2] the tile count. Issues its first weight loads, waits on every box of task.in (the x
// rows' completion boxes), computes and stores its columns of y, then publishes: every box of
// task.out gets (tag, tile count) after a release. (y as tagged pairs instead, polled by the next
// matrix, was slower: PERF.md.)
//
// LIN_KIND_EXPERT_PAIR: one member of a slot's gang (the slot's members share one rank, each on a
// CTA of its own): a range of the gate/up of the expert the slot names, then a range of its down.
// args[0] the gate/up's bank (an index into lin_args.experts; the down's is the next one) | the
// slot << 16, args[1] the gate/up's first tile | its count << 16, args[2] the same for the down.
// task.in[0] is the slot's box, whose value is the expert (LIN_NO_EXPERT: the slot is unused, the
// task only publishes); in[1] and in[2] the lines of the gang's members before and after this one;
// in[3], if any, the boxes of the gate/up's x rows. task.out is one line: its first box says the
// member's gate/up columns (a part of the down's x) are stored, the rest that its down columns are.
// The weight follows the slot's box, so the loads start after that one wait. A down of
// LIN_RING_MIN_STEPS steps or more goes into the LDS ring once the gate/up's first loads are out,
// so it lands while the gate/up streams through registers below the ring and the peers finish
// theirs; a shorter one streams through registers after its wait. Between the two the member
// publishes its first box and waits on the first box of each peer's line.
#pragma once
#include "prelude.h"
#include "mailbox.h"
#include "ops/linear.h"

#define LIN_KIND_TILES 1u
#define LIN_KIND_EXPERT_PAIR 2u
#define LIN_NO_EXPERT 0xffffffffu
// LIN_PAIR_EARLY_RING=0 (measurement builds): a pair's down streams after its wait, as a range
// of its own would, instead of filling the ring early.
#ifndef LIN_PAIR_EARLY_RING
#define LIN_PAIR_EARLY_RING 1
#endif
// A pair task's inputs: its slot, its gang peers before and after it, its x rows.
#define LIN_PAIR_SLOT 0u
#define LIN_PAIR_PEERS_BEFORE 1u
#define LIN_PAIR_PEERS_AFTER 2u
#define LIN_PAIR_X 3u

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

// The task's input ranges first .. last, a thread a box (stride 1: mbx_poll_range, a line a
// thread where a range is whole lines), or every stride-th box, then the team agrees; the acquire
// makes the data published beside the boxes visible.
template <class Team>
MONO_DEV bool lin_wait_boxes(const Team& team, const mbx_task& task, const mbx_ctx& c, u32 first, u32 last, u32 stride) {
  bool ok = true;
  const u32 n_in = mbx_min(task.n_inputs, MBX_MAX_INPUTS);
  for (u32 r = first; r <= last && r < n_in && ok; ++r) {
    if (stride == 1) {
      ok = mbx_poll_range(c, task.in[r], team.thread(), Team::size);
      continue;
    }
    for (u32 i = team.thread() * stride; i < task.in[r].len && ok; i += Team::size * stride) {
      u32 v;
      ok = mbx_poll(c, task.in[r].first + i, &v);
    }
  }
  ok = team.all(ok);
  mbx_acquire();
  return ok;
}

// Every box of the task's input ranges from `from` on.
template <class Team>
MONO_DEV bool lin_wait_inputs(const Team& team, const mbx_task& task, const mbx_ctx& c, u32 from = 0) {
  return lin_wait_boxes(team, task, c, from, ~0u, 1u);
}

// The first box of every line of in[first_range .. last_range]: a pair's peers' gate/up boxes.
template <class Team>
MONO_DEV bool lin_wait_line_heads(const Team& team, const mbx_task& task, const mbx_ctx& c, u32 first_range,
                                  u32 last_range) {
  return lin_wait_boxes(team, task, c, first_range, last_range, MBX_BOXES_PER_LINE);
}

// After the task's last store and a team barrier: a release, then boxes first .. first + len.
template <class Team>
MONO_DEV void lin_publish(const Team& team, const mbx_ctx& c, u32 first, u32 len, u32 count) {
  for (u32 i = team.thread(); i < len; i += Team::size) {
    mbx_publish();
    mbx_put(c, first + i, count);
  }
}

// LIN_STAMPS builds with LIN_STAMP_BUF (the device address of the stamps, LIN_STAMP_WORDS a
// record): the tile's stamps to record `record` (a box of the task's own, so unique to it; a pair
// writes its gate/up's to its first box's and its down's to the next), then cleared.
template <class Team>
MONO_DEV void lin_stamps_out(const Team& team, u32 record) {
#if LIN_STAMPS && defined(LIN_STAMP_BUF)
  LIN_STAMP(team, LIN_STAMP_PUBLISHED, 0u);
  if (team.leader())
    for (u32 j = 0; j < LIN_STAMP_WORDS; ++j) {
      ((u64*)LIN_STAMP_BUF)[(u64)record * LIN_STAMP_WORDS + j] = lin_stamps[j];
      lin_stamps[j] = 0;
    }
#else
  (void)team, (void)record;
#endif
}

// The matrices of the task a team runs, in shared memory (a copy in registers would hold 20 of
// them through the whole tile): its fields are read at the wait, in the x staging and in every
// epilogue, after acquires that empty L1, where a read of the launch's table in global memory
// would be an L2 round trip each time.
MONO_DEV lin_matrix* lin_held() {
  __shared__ lin_matrix held[2];
  return held;
}

// A LIN_KIND_TILES task's matrix, copied to lin_held() by the team's first threads (8 bytes
// each), the team agreeing before any reads it.
template <class Team>
MONO_DEV const lin_matrix* lin_table_matrix(const Team& team, const lin_args& a, u32 index) {
  static_assert(sizeof(lin_matrix) % 8 == 0 && sizeof(lin_matrix) / 8 <= Team::size, "a word a thread");
  const u64* from = (const u64*)(a.mats + index);
  u64* to = (u64*)lin_held();
  if (team.thread() < sizeof(lin_matrix) / 8) to[team.thread()] = from[team.thread()];
  team.sync();
  return lin_held();
}

// The gate/up and down of a pair task's expert, in lin_held(), or null: the slot is unused (or
// the banks are not the launch's). Every thread polls the slot's box; false only when that wait
// gave up.
template <class Team>
MONO_DEV bool lin_expert_matrices(const Team& team, const mbx_task& task, const mbx_ctx& c, const lin_args& a,
                                  const lin_matrix** gate_up, const lin_matrix** down) {
  lin_matrix* chosen = lin_held();
  *gate_up = *down = nullptr;
  const u32 bank = task.args[0] & 0xffffu, slot = task.args[0] >> 16;
  // The host builds no such task.
  if (bank + 1 >= a.n_experts || task.n_inputs <= LIN_PAIR_PEERS_AFTER || task.in[LIN_PAIR_SLOT].len != 1) return true;
  u32 e = LIN_NO_EXPERT;
  if (!team.all(mbx_poll(c, task.in[LIN_PAIR_SLOT].first, &e))) return false;
  if (e >= a.experts[bank].n_experts || e >= a.experts[bank + 1].n_experts) return true;
  if (team.thread() < 2) {
    const lin_expert& b = a.experts[bank + team.thread()];
    lin_matrix& m = chosen[team.thread()];
    m = b.m;
    m.w += e * b.w_stride;
    m.scales += e * b.scales_stride;
    m.x += slot * b.x_slot;
    m.y = (u8*)m.y + slot * b.y_slot * ((m.flags & LIN_OUT_F32) ? 4u : 2u);
    m.row_scale += slot * b.row_scale_slot;
  }
  team.sync();
  *gate_up = &chosen[0];
  *down = &chosen[1];
  return true;
}

MONO_DEV u32 lin_range_first(u32 arg) { return arg & 0xffffu; }
MONO_DEV u32 lin_range_count(u32 arg) { return arg >> 16; }

// Both kinds, through one call of the tile (one inlined copy of it in the kernel): a LIN_KIND_TILES
// task's range, or a pair's gate/up and then its down.
template <class Team>
MONO_DEV bool lin_task(const Team& team, const mbx_task& task, mbx_ctx& c, const lin_args& a, u8* smem) {
  const bool pair = mbx_own_kind(task.kind) == LIN_KIND_EXPERT_PAIR;
  // Each phase's values are scalars picked by a select, not arrays indexed by the phase: an array
  // indexed at run time would live on the stack.
  const lin_matrix* up = nullptr;
  const lin_matrix* down = nullptr;
  u32 up_first = task.args[1], up_count = task.args[2], down_first = 0u, down_count = 0u;
  lin_ring_use up_use = lin_ring_default(), down_use = lin_ring_default();
  if (!pair) {
    if (task.args[0] >= a.n_mats) return true;  // the host builds no such task
    up = lin_table_matrix(team, a, task.args[0]);
  } else {
    if (!lin_expert_matrices(team, task, c, a, &up, &down)) return false;
    if (!up) {
      // An unused slot's member writes nothing, so it publishes without waiting (and, in
      // LIN_STAMPS builds, clears its records: a tile start of 0 says "no tile" to the reader).
      lin_publish(team, c, task.out.first, task.out.len, 0u);
      lin_stamps_out(team, task.out.first);
      lin_stamps_out(team, task.out.first + 1u);
      return true;
    }
    up_first = lin_range_first(task.args[1]), up_count = lin_range_count(task.args[1]);
    down_first = lin_range_first(task.args[2]), down_count = lin_range_count(task.args[2]);
    // The gate/up through registers only, so that the LDS beyond its partial slots and x is the down's
    // ring from the start.
    constexpr u32 groups = Team::size / LIN_GROUP;
    const u32 up_lds = lin_lds_regs(groups, *up), down_lds = lin_lds_used(groups, *down);
    // A down of fewer steps than the ring takes streams through registers after its wait: the downs
    // of 1 and 4 rows (3 and 12 steps) were faster that way than through the early ring (PERF.md).
    if (LIN_PAIR_EARLY_RING) {
      up_use = {0u, ~0u, false};
      down_use = {up_lds > down_lds ? up_lds : down_lds, LIN_RING_MIN_STEPS, false};
    }
  }
  bool ok = true, started = !pair || down_count == 0 || !LIN_PAIR_EARLY_RING;
  auto start_down = [&] {
    if (!started) down_use.filled = lin_ring_start(team, *down, down_first, down_count, smem, down_use);
    started = true;
  };
  for (u32 phase = 0; phase < (pair ? 2u : 1u); ++phase) {
    const bool second = phase != 0;
    const u32 count = second ? down_count : up_count;
    if (count == 0) {
      start_down();
    } else if (!lin_tiles(team, second ? *down : *up, second ? down_first : up_first, count, smem,
                          second ? down_use : up_use, [&] {
                            if (!pair) return lin_wait_inputs(team, task, c);
                            if (!second) {
                              start_down();
                              return lin_wait_inputs(team, task, c, LIN_PAIR_X);
                            }
                            // After a failed gate/up this fails at once, and a ring already filled
                            // lands first.
                            return ok && lin_wait_line_heads(team, task, c, LIN_PAIR_PEERS_BEFORE, LIN_PAIR_PEERS_AFTER);
                          })) {
      ok = false;
    }
    if (!ok) continue;
    // A pair's gate/up publishes its line's first box, its down the rest.
    const u32 box = pair ? task.out.first + phase : task.out.first;
    const u32 len = !pair ? task.out.len : second ? task.out.len - 1u : 1u;
    lin_publish(team, c, box, len, count);
    lin_stamps_out(team, box);
  }
  return ok;
}

template <class Team>
MONO_DEV bool lin_decode(const Team& team, const mbx_task& task, mbx_ctx& c, const lin_args& a, u8* smem) {
#if LIN_STAMPS
  if (team.leader())
    for (u32 j = 0; j < LIN_STAMP_WORDS; ++j) lin_stamps[j] = 0;
#endif
  switch (mbx_own_kind(task.kind)) {
    case LIN_KIND_TILES:
    case LIN_KIND_EXPERT_PAIR:
      return lin_task(team, task, c, a, smem);
    default:
      return true;
  }
}
