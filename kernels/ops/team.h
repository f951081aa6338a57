// Teams: the threads a task function runs on, handed to it by its caller (ARCHITECTURE.md, "Tasks,
// teams and placement"). A task function is written for a team, never for the block: it takes its
// thread index, its size and its barrier from the team, so the same function runs as a whole CTA of
// the fused launch, as one warpgroup of it, or as a warp, and a standalone entry point and the fused
// kernel call it alike.
//
// A team is THREADS consecutive threads of the CTA, starting at a multiple of THREADS. It syncs on
// one barrier id of its own, and may hand the ids in [spare_first, spare_first + spare_count) to the
// sub-teams it splits into. Barrier 0 is the whole CTA's (mono_sync_block); ids 1..15 are NVIDIA's
// named barriers. AMD (gfx950) has no named barriers: a sub-CTA team of several waves syncs on a pair
// of LDS words (arrivals, generation) of its own, which the CTA's caller provides (mono_team_lds).
#pragma once
#include "prelude.h"

#define MONO_BARRIERS 16

#if MONO_AMD
// One (arrivals, generation) pair per barrier id, in static LDS: the launch's kernel declares it
// once through this header.
__shared__ u32 mono_team_lds[2 * MONO_BARRIERS];
#endif

// Syncs the THREADS threads that use barrier `id` (0: the whole CTA, which must then have THREADS
// threads). A warp-sized or smaller team needs no barrier beyond the wave's own lockstep.
template <u32 THREADS>
MONO_DEV void mono_barrier_sync(u32 id) {
  if (THREADS <= MONO_WAVE) {
#if MONO_NVIDIA
    __syncwarp();
#endif
    return;
  }
  if (id == 0) return mono_sync_block();
#if MONO_NVIDIA
  asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(THREADS) : "memory");
#else
  // Sense-reversing barrier on LDS: the last of the team's waves to arrive bumps the generation.
  u32* arrivals = &mono_team_lds[2 * id];
  u32* generation = arrivals + 1;
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  if (mono_lane() == 0) {
    const u32 gen = __hip_atomic_load(generation, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
    const u32 waves = THREADS / MONO_WAVE;
    if (__hip_atomic_fetch_add(arrivals, 1u, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_WORKGROUP) == waves - 1) {
      __hip_atomic_store(arrivals, 0u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
      __hip_atomic_store(generation, gen + 1u, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_WORKGROUP);
    } else {
      while (__hip_atomic_load(generation, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_WORKGROUP) == gen)
        __builtin_amdgcn_s_sleep(1);
    }
  }
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
#endif
}

// The same barrier, returning whether `ok` holds in every thread of the team.
template <u32 THREADS>
MONO_DEV bool mono_barrier_all(u32 id, bool ok) {
#if MONO_NVIDIA
  if (THREADS <= MONO_WAVE) return __all_sync(0xffffffffu, ok);
  u32 all;
  asm volatile("{ .reg .pred p, q; setp.ne.u32 p, %1, 0; bar.red.and.pred q, %2, %3, p; selp.u32 %0, 1, 0, q; }"
               : "=r"(all)
               : "r"((u32)ok), "r"(id), "n"(THREADS)
               : "memory");
  return all != 0;
#else
  // Each wave's verdict through its ballot, then the team's through an LDS word per barrier id
  // that is cleared before and read after the barrier's two crossings.
  const bool wave_ok = mono_ballot(!ok) == 0;
  if (THREADS <= MONO_WAVE) return wave_ok;
  static __shared__ u32 failed[MONO_BARRIERS];
  if (mono_thread() % THREADS == 0) failed[id] = 0;
  mono_barrier_sync<THREADS>(id);
  if (!wave_ok && mono_lane() == 0) failed[id] = 1;
  mono_barrier_sync<THREADS>(id);
  const bool all_ok = *(volatile u32*)&failed[id] == 0;
  mono_barrier_sync<THREADS>(id);
  return all_ok;
#endif
}

template <u32 THREADS>
struct mono_team {
  static_assert(THREADS % MONO_WAVE == 0 || (MONO_WAVE % THREADS == 0),
                "a team is whole waves, or a power-of-two part of one");
  static constexpr u32 size = THREADS;
  static constexpr u32 waves = THREADS >= MONO_WAVE ? THREADS / MONO_WAVE : 1u;

  u32 thread;       // 0 .. THREADS
  u32 barrier;      // the id the team syncs on
  u32 spare_first;  // ids its sub-teams may use
  u32 spare_count;

  MONO_DEV u32 lane() const { return thread % MONO_WAVE; }
  MONO_DEV u32 wave() const { return thread / MONO_WAVE; }
  MONO_DEV bool leader() const { return thread == 0; }
  MONO_DEV void sync() const { mono_barrier_sync<THREADS>(barrier); }
  // Whether `ok` holds in every thread of the team (a barrier of its own).
  MONO_DEV bool all(bool ok) const { return mono_barrier_all<THREADS>(barrier, ok); }

  // This thread's place in an even split of the team into sub-teams of SUB threads: sub-team
  // index() gets barrier spare_first + index(), and an equal share of the spares after them.
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

// The whole CTA as one team: barrier 0 and every named barrier id as its spares. THREADS must be
// the launch's block size (the fused shape's MONO_CTA_THREADS, or a standalone entry's own).
template <u32 THREADS>
MONO_DEV mono_team<THREADS> mono_cta_team() {
#if MONO_AMD
  if (mono_thread() < 2 * MONO_BARRIERS) mono_team_lds[mono_thread()] = 0;
  mono_sync_block();
#endif
  return mono_team<THREADS>{mono_thread(), 0u, 1u, MONO_BARRIERS - 1u};
}
