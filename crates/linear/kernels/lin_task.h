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

// A bank of same-shaped experts (src/gpu.rs `LinExpert`, 128 bytes): `m` is expert 0 of slot 0;
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

// LIN_WAIT_BATCH (measurement builds until timed: PERF.md): boxes a thread reads at once before it
// spins on any not yet written, so that a wait on boxes already written costs one round trip, not
// one a box (a matrix after one of 128 tasks waits on 2048 boxes: 4 a thread at 512 threads).
// 1: each box waited for before the next is read.
#ifndef LIN_WAIT_BATCH
#define LIN_WAIT_BATCH 8u
#endif
// LIN_WAIT_SLEEP (measurement builds until timed): nanoseconds a thread sleeps between polls of a
// box not yet written (NVIDIA), so that a CTA's 512 waiting threads do not keep L2 busy; 0: spins.
#ifndef LIN_WAIT_SLEEP
#define LIN_WAIT_SLEEP 0u
#endif

// Every box of the task's input ranges, read LIN_WAIT_BATCH at a time by each thread, then the
// team agrees; the acquire makes the data published beside the boxes visible.
template <class Team>
MONO_DEV bool lin_wait_inputs(const Team& team, const mbx_task& task, const mbx_ctx& c) {
  constexpr u32 B = LIN_WAIT_BATCH;
  bool ok = true;
  const u32 n_in = mbx_min(task.n_inputs, MBX_MAX_INPUTS);
  for (u32 r = 0; r < n_in && ok; ++r) {
    const u32 first = task.in[r].first, len = task.in[r].len;
    for (u32 base = team.thread(); base < len && ok; base += B * Team::size) {
      u64 word[B];
#pragma unroll
      for (u32 b = 0; b < B; ++b)
        if (base + b * Team::size < len) word[b] = mbx_load(c.scratch + first + base + b * Team::size);
#pragma unroll
      for (u32 b = 0; b < B; ++b) {
        const u32 i = base + b * Team::size;
        if (i >= len || !ok || mbx_tag_of(word[b]) == c.tag) continue;
#if LIN_WAIT_SLEEP && MONO_NVIDIA
        for (u32 n = 0; n < (1u << 20) && mbx_tag_of(word[b]) != c.tag; ++n) {
          asm volatile("nanosleep.u32 %0;" ::"r"((u32)LIN_WAIT_SLEEP));
          word[b] = mbx_load(c.scratch + first + i);
        }
#endif
        u32 v;
        ok = mbx_poll(c, first + i, &v);
      }
    }
  }
  ok = team.all(ok);
  mbx_acquire();
  return ok;
}

// LIN_PREPARE_NEXT (measurement builds until timed): 1: while a task runs, L2 is asked for the
// lines the CTA's next task starts by reading, its descriptor (when the task starts) and its
// matrix's (while the task's publish drains), so that the next task's two dependent reads find
// them there; 2: also the next task's first batch of weights, every group's. 0: neither.
#ifndef LIN_PREPARE_NEXT
#define LIN_PREPARE_NEXT 1
#endif

MONO_DEV void lin_prefetch_l2(const void* p) {
#if MONO_NVIDIA
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// The next task's matrix descriptor (and with LIN_PREPARE_NEXT=2 its first weights) asked of L2,
// by the team's last group while its first group publishes.
template <class Team>
MONO_DEV void lin_prepare_next(const Team& team, const mbx_ctx& c, const lin_args& a) {
  const u32 base = Team::size - LIN_GROUP;
  if (LIN_PREPARE_NEXT == 0 || c.next == nullptr || team.thread() < base) return;
  const mbx_task& t = *c.next;
  if (mbx_stage_of(t.kind) != MBX_STAGE_LINEAR) return;
  const u32 lane = team.thread() - base;
  const u8* desc = nullptr;
  if (mbx_own_kind(t.kind) == LIN_KIND_TILES && t.args[0] < a.n_mats) desc = (const u8*)(a.mats + t.args[0]);
  if (mbx_own_kind(t.kind) == LIN_KIND_EXPERT_TILES && (t.args[0] & 0xffffu) < a.n_experts)
    desc = (const u8*)(a.experts + (t.args[0] & 0xffffu));
  if (desc == nullptr) return;
  if (lane < 2) lin_prefetch_l2(desc + 64u * lane);
  if (LIN_PREPARE_NEXT < 2 || mbx_own_kind(t.kind) != LIN_KIND_TILES) return;
  const lin_matrix& m = a.mats[t.args[0]];
  constexpr u32 groups = Team::size / LIN_GROUP;
  const bool fp8 = (m.flags & LIN_FP8) != 0;
  const lin_plan p = lin_plan_of(groups, m.k / (fp8 ? LIN_K_BLOCK : LIN_K_BLOCK / 2), t.args[2]);
  // Each lane a group's first batch (LIN_UNIT 2 KB, 16 lines), the lanes past the groups none.
  u32 tile = 0, unit = 0;
  if (lane < groups && lin_batch(p, lane, 0, 0, &tile, &unit)) {
    const u8* w = m.w + ((u64)(t.args[1] + tile) * p.units + unit) * (LIN_LOADS * LIN_GROUP * 16u);
    for (u32 j = 0; j < LIN_LOADS * LIN_GROUP * 16u / 128u; ++j) lin_prefetch_l2(w + 128u * j);
  }
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
  auto ready = [&] {
    if (LIN_PREPARE_NEXT && c.next && team.leader()) lin_prefetch_l2(c.next);
    return lin_wait_inputs(team, task, c);
  };
  if (m && !lin_tiles(team, *m, first, count, smem, ready)) return false;
  lin_prepare_next(team, c, a);
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
