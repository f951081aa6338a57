// A host stand-in for kernels/prelude.h, so that a stage's kernels run from their own source on CPU
// threads (select's tests/host_emulation.rs). A CTA is a process, so `__shared__` statics are per CTA;
// its threads are fibers that one OS thread runs in turn, each until it waits (a barrier, a poll,
// a load another thread may be storing to). Block barriers are the launcher's fiber barriers; a
// wave's ballots and shuffles go through an exchange array between two wave barriers, so every
// lane must reach them together, as on a GPU. Device memory is shared between the CTA processes
// by the launcher (launch.h beside this file).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>

#define MONO_AMD 0
#define MONO_NVIDIA 0
#define MONO_HOST 1
#ifndef MONO_WAVE
#define MONO_WAVE 32
#endif

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;
struct alignas(16) mono_u32x4 {
  u32 x, y, z, w;
};

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define MONO_DEV inline
#define MONO_KERNEL extern "C"

// The running fiber's thread id (the launcher sets it at every switch).
extern u32 emu_thread;
extern u32 emu_block, emu_block_dim, emu_grid_dim;
extern u64 emu_exchange[64][64];
void emu_sync_block();
void emu_sync_wave(u32 wave);
// Named barrier `id` of `threads` threads (its count set by the first arrival).
void emu_sync_named(u32 id, u32 threads);

MONO_DEV u32 mono_thread() { return emu_thread; }
MONO_DEV u32 mono_block() { return emu_block; }
MONO_DEV u32 mono_block_dim() { return emu_block_dim; }
MONO_DEV u32 mono_grid_dim() { return emu_grid_dim; }
MONO_DEV u32 mono_lane() { return mono_thread() & (MONO_WAVE - 1); }
MONO_DEV u32 mono_wave() { return mono_thread() / MONO_WAVE; }
MONO_DEV u32 mono_waves_per_block() { return mono_block_dim() / MONO_WAVE; }
MONO_DEV void mono_sync_block() { emu_sync_block(); }
#define MONO_BARRIERS 16
MONO_DEV void mono_named_barriers_init() {}
MONO_DEV void mono_named_sync(u32 id, u32 threads) { emu_sync_named(id, threads); }
MONO_DEV void mono_wait_prior() {}
MONO_DEV void mono_release_next() {}

MONO_DEV u32 mono_f32_bits(float f) {
  u32 u;
  memcpy(&u, &f, 4);
  return u;
}
MONO_DEV float mono_bits_f32(u32 u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

MONO_DEV u32 mono_shfl(u32 v, u32 src_lane) {
  const u32 w = mono_wave();
  emu_exchange[w][mono_lane()] = v;
  emu_sync_wave(w);
  const u32 r = (u32)emu_exchange[w][src_lane & (MONO_WAVE - 1)];
  emu_sync_wave(w);
  return r;
}
MONO_DEV u32 mono_shfl_xor(u32 v, u32 mask) { return mono_shfl(v, mono_lane() ^ mask); }
MONO_DEV u32 mono_wave_sum_u32(u32 v) {
  for (u32 m = MONO_WAVE / 2; m > 0; m >>= 1) v += mono_shfl_xor(v, m);
  return v;
}
MONO_DEV u32 mono_shfl_up_add(u32 v, u32 d) {
  const u32 lane = mono_lane(), o = mono_shfl(v, lane >= d ? lane - d : lane);
  return lane >= d ? v + o : v;
}
MONO_DEV u32 mono_shfl_down_add(u32 v, u32 d) {
  const u32 lane = mono_lane(), o = mono_shfl(v, lane + d < MONO_WAVE ? lane + d : lane);
  return lane + d < MONO_WAVE ? v + o : v;
}
MONO_DEV u64 mono_ballot(bool pred) {
  const u32 w = mono_wave();
  emu_exchange[w][mono_lane()] = pred;
  emu_sync_wave(w);
  u64 r = 0;
  for (u32 i = 0; i < MONO_WAVE; ++i)
    if (emu_exchange[w][i]) r |= 1ull << i;
  emu_sync_wave(w);
  return r;
}
MONO_DEV u32 mono_popc64(u64 v) { return (u32)__builtin_popcountll(v); }
MONO_DEV u32 mono_popc32(u32 v) { return (u32)__builtin_popcount(v); }

// Waiting threads give the others their turn: a fiber runs until it waits, so every wait on
// memory or a barrier switches to the CTA's next fiber (emu_yield, launch.h). A CTA whose fibers
// all waited through a round with no store and no barrier passed gives its core up (launch.h).
extern u64 emu_cta_progress;
extern u32* emu_stalled;
void emu_yield();
// The thread made progress (a store other threads may wait on, or a barrier passed).
MONO_DEV void emu_busy() { ++emu_cta_progress; }
MONO_DEV void emu_poll_pause() { emu_yield(); }
// The launcher saw no progress for its stall time: a bounded wait (mailbox.h, MBX_DEBUG) that
// has polled long enough gives up and reports, as it would on a GPU after MBX_POLL_LIMIT polls.
MONO_DEV bool emu_launch_stalled() { return __atomic_load_n(emu_stalled, __ATOMIC_RELAXED) != 0; }
MONO_DEV u64 mono_ld_relaxed_u64(const u64* p) {
  emu_poll_pause();
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
MONO_DEV u64 mono_ld_acquire_u64(const u64* p) {
  emu_poll_pause();
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
// A u32 may be polled too (a counter every CTA adds to), by a thread whose CTA's other fibers
// must run before it fills: these loads wait as the u64 ones do.
MONO_DEV u32 mono_ld_relaxed_u32(const u32* p) {
  emu_poll_pause();
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
MONO_DEV u32 mono_ld_acquire_u32(const u32* p) {
  emu_poll_pause();
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
MONO_DEV void mono_st_relaxed_u64(u64* p, u64 v) {
  emu_busy();
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
MONO_DEV void mono_st_release_u64(u64* p, u64 v) {
  emu_busy();
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
MONO_DEV void mono_st_relaxed_u32(u32* p, u32 v) {
  emu_busy();
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
MONO_DEV void mono_st_release_u32(u32* p, u32 v) {
  emu_busy();
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
MONO_DEV u32 mono_atomic_add_u32(u32* p, u32 v) {
  emu_busy();
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
MONO_DEV void mono_atomic_add_lds_u32(u32* p, u32 v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
MONO_DEV u32 mono_fetch_add_lds_u32(u32* p, u32 v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
MONO_DEV void mono_count_lds_u32(u32* p) { (void)mono_fetch_add_lds_u32(p, 1u); }
MONO_DEV void mono_fence_acquire() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
MONO_DEV void mono_fence_release() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
MONO_DEV void mono_fence_acq_rel() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
MONO_DEV void mono_trap() { abort(); }

MONO_DEV bool mono_wave_all(bool ok) { return mono_ballot(!ok) == 0; }
// Agreement through an exchange word per barrier id, as the AMD prelude does in LDS.
extern u32 emu_agree[MONO_BARRIERS];
MONO_DEV bool emu_agree_on(u32 id, bool ok, void (*sync)(u32, u32), u32 threads) {
  if (mono_thread() % threads == 0) __atomic_store_n(&emu_agree[id], 0u, __ATOMIC_RELAXED);
  sync(id, threads);
  if (!ok) __atomic_store_n(&emu_agree[id], 1u, __ATOMIC_RELAXED);
  sync(id, threads);
  const bool all_ok = __atomic_load_n(&emu_agree[id], __ATOMIC_RELAXED) == 0;
  sync(id, threads);
  return all_ok;
}
MONO_DEV bool mono_named_all(u32 id, u32 threads, bool ok) { return emu_agree_on(id, ok, emu_sync_named, threads); }
MONO_DEV bool mono_block_all(bool ok) {
  return emu_agree_on(0, ok, [](u32, u32) { emu_sync_block(); }, emu_block_dim);
}

MONO_DEV float mono_shfl_xor_f32(float v, u32 mask) { return mono_bits_f32(mono_shfl_xor(mono_f32_bits(v), mask)); }
MONO_DEV float mono_fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
MONO_DEV float mono_fminf(float a, float b) { return __builtin_fminf(a, b); }
MONO_DEV float mono_sqrtf(float a) { return __builtin_sqrtf(a); }
MONO_DEV float mono_expf(float a) { return __builtin_expf(a); }

// Timers: one monotonic clock in nanoseconds serves both (every CTA shares it, so the cycle
// counter's "comparable within one CTA" holds too); the CTA's index stands in for the SM.
MONO_DEV u64 mono_timer_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (u64)t.tv_sec * 1000000000ull + (u64)t.tv_nsec;
}
MONO_DEV u64 mono_clock_cycles() { return mono_timer_ns(); }
MONO_DEV u32 mono_sm_id() { return emu_block; }

// The conversions and wave reductions are the device's own (their portable paths).
#include "numerics.h"
