// Teams: the threads a task function runs on, handed to it by its caller (ARCHITECTURE.md, "Tasks,
// teams and placement"). A task function is written for a team, never for the block: it takes its
// thread index, its size and its barrier from the team, so the same function runs as the whole CTA
// of the fused launch, as one warpgroup of it, or as a warp, and a standalone entry point and the
// fused kernel call it alike.
//
// A team is THREADS consecutive threads of a CTA of CTA threads, starting at a multiple of THREADS
// (the CTA splits evenly, and so does every team). A team holds no state: its thread index, its
// place among its siblings and its barrier id all follow from the thread's index in the CTA, which
// the hardware keeps in a special register. Stored in the team, the same values hold registers for
// a whole task (enough to make the wgmma scorer spill at the fused shape's 128-register cap).
//
// Barrier ids by a fixed rule: 0 is the whole CTA's; a team of THREADS = CTA / p (p = 2, 4, 8)
// at index k in the CTA syncs on id p - 1 + k, so teams of different sizes that run at once (a
// warpgroup inside a half) never share an id, and ids stay within the 16 that NVIDIA has. A team
// of one wave or less needs no barrier beyond the wave's own.
#pragma once
#include "prelude.h"

template <u32 THREADS, u32 CTA>
struct mono_team {
  static_assert(CTA % THREADS == 0, "a team splits its CTA evenly");
  static_assert(THREADS % MONO_WAVE == 0 || MONO_WAVE % THREADS == 0, "a team is whole waves, or part of one");
  static_assert(THREADS <= MONO_WAVE || CTA / THREADS <= 8, "named barrier ids: teams down to an eighth of the CTA");
  static constexpr u32 size = THREADS;
  static constexpr u32 waves = THREADS >= MONO_WAVE ? THREADS / MONO_WAVE : 1u;

  MONO_DEV u32 thread() const { return mono_thread() % THREADS; }
  MONO_DEV u32 lane() const { return mono_thread() % MONO_WAVE; }
  MONO_DEV u32 wave() const { return thread() / MONO_WAVE; }
  MONO_DEV bool leader() const { return thread() == 0; }
  // This team's index among the CTA's teams of its size.
  MONO_DEV u32 index_in_cta() const { return mono_thread() / THREADS; }
  MONO_DEV u32 barrier() const { return THREADS == CTA ? 0u : CTA / THREADS - 1u + index_in_cta(); }

  MONO_DEV void sync() const {
    if (THREADS <= MONO_WAVE) return;
    if (THREADS == CTA) return mono_sync_block();
    mono_named_sync(barrier(), THREADS);
  }
  // Whether `ok` holds in every thread of the team; a barrier of the team's.
  MONO_DEV bool all(bool ok) const {
    if (THREADS <= MONO_WAVE) return mono_wave_all(ok);
    if (THREADS == CTA) return mono_block_all(ok);
    return mono_named_all(barrier(), THREADS, ok);
  }

  // An even split into sub-teams of SUB threads; index<SUB>() is this thread's sub-team.
  template <u32 SUB>
  MONO_DEV u32 index() const {
    static_assert(THREADS % SUB == 0, "sub-teams split the team evenly");
    return thread() / SUB;
  }
  template <u32 SUB>
  MONO_DEV mono_team<SUB, CTA> split() const {
    static_assert(THREADS % SUB == 0, "sub-teams split the team evenly");
    return mono_team<SUB, CTA>{};
  }
};

// The whole CTA as one team. CTA is the launch's block size (the fused shape's MONO_CTA_THREADS,
// or a standalone entry's own). Block-wide, once, before any of the team's barriers; it ends with
// a block barrier.
template <u32 CTA>
MONO_DEV mono_team<CTA, CTA> mono_cta_team() {
  mono_named_barriers_init();
  mono_sync_block();
  return mono_team<CTA, CTA>{};
}
