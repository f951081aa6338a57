// Teams: the threads a task function runs on, handed to it by its caller (ARCHITECTURE.md, "Tasks,
// teams and placement"). A task function is written for a team, never for the block: it takes its
// thread index, its size and its barrier from the team, so the same function runs as the whole CTA
// of the fused launch, as one warpgroup of it, or as a warp, and a standalone entry point and the
// fused kernel call it alike.
//
// A team is THREADS consecutive threads of the CTA, starting at a multiple of THREADS. It syncs on
// one barrier id of its own (0: the whole CTA), and hands the ids in [spare_first, spare_first +
// spare_count) to the sub-teams it splits into. Barriers are the prelude's (mono_sync_block,
// mono_named_sync); a team of one wave or less needs none beyond the wave's own.
#pragma once
#include "prelude.h"

template <u32 THREADS>
struct mono_team {
  static_assert(THREADS % MONO_WAVE == 0 || MONO_WAVE % THREADS == 0, "a team is whole waves, or part of one");
  static constexpr u32 size = THREADS;
  static constexpr u32 waves = THREADS >= MONO_WAVE ? THREADS / MONO_WAVE : 1u;

  u32 thread;       // 0 .. THREADS
  u32 barrier;      // the id the team syncs on
  u32 spare_first;  // ids its sub-teams may use
  u32 spare_count;

  MONO_DEV u32 lane() const { return thread % MONO_WAVE; }
  MONO_DEV u32 wave() const { return thread / MONO_WAVE; }
  MONO_DEV bool leader() const { return thread == 0; }

  MONO_DEV void sync() const {
    if (THREADS <= MONO_WAVE) return;
    if (barrier == 0) return mono_sync_block();
    mono_named_sync(barrier, THREADS);
  }
  // Whether `ok` holds in every thread of the team; a barrier of the team's.
  MONO_DEV bool all(bool ok) const {
    if (THREADS <= MONO_WAVE) return mono_wave_all(ok);
    if (barrier == 0) return mono_block_all(ok);
    return mono_named_all(barrier, THREADS, ok);
  }

  // An even split into sub-teams of SUB threads: this thread's sub-team is index<SUB>(), which
  // syncs on spare_first + index and gets an equal share of the spares after the parts' own ids.
  template <u32 SUB>
  MONO_DEV u32 index() const {
    static_assert(THREADS % SUB == 0, "sub-teams split the team evenly");
    return thread / SUB;
  }
  template <u32 SUB>
  MONO_DEV mono_team<SUB> split() const {
    constexpr u32 parts = THREADS / SUB;
    const u32 i = index<SUB>();
    const u32 share = spare_count > parts ? (spare_count - parts) / parts : 0u;
    return mono_team<SUB>{thread % SUB, spare_first + i, spare_first + parts + i * share, share};
  }
};

// The whole CTA as one team: barrier 0, and every named barrier id as its spares. THREADS is the
// launch's block size (the fused shape's, or a standalone entry's own). Block-wide, once, before
// any of the team's barriers; it ends with a block barrier.
template <u32 THREADS>
MONO_DEV mono_team<THREADS> mono_cta_team() {
  mono_named_barriers_init();
  mono_sync_block();
  return mono_team<THREADS>{mono_thread(), 0u, 1u, MONO_BARRIERS - 1u};
}
