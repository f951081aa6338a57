// The platform prelude: everything a stage's .hip file needs from the platform, for AMD (clang -x hip,
// no ROCm headers) and NVIDIA (NVRTC, no CUDA headers). Stage code uses only the mono_* names below, so
// per-platform code lives here and nowhere else.
#pragma once

#if defined(__HIP__)
#define MONO_AMD 1
#define MONO_NVIDIA 0
#define MONO_WAVE 64
#elif defined(__CUDACC__)
#define MONO_AMD 0
#define MONO_NVIDIA 1
#define MONO_WAVE 32
#else
#error "prelude.h: compile as HIP (clang -x hip) or CUDA (NVRTC)"
#endif

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// 16 bytes moved as one access, with .x .y .z .w. Native vector types on both platforms: on AMD
// a plain struct would be copied through private memory (scratch or even LDS).
#if MONO_AMD
typedef u32 mono_u32x4 __attribute__((ext_vector_type(4)));
#else
typedef uint4 mono_u32x4;
#endif

#if MONO_AMD
// Without the HIP headers clang knows the attributes but not the keywords.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(threads, ...) __attribute__((amdgpu_flat_work_group_size(1, threads)))
#endif

#define MONO_DEV __device__ __forceinline__
// Entry points keep C names so hosts and resource reports find them without demangling.
#define MONO_KERNEL extern "C" __global__

// ---- indices ---------------------------------------------------------------------------------------
#if MONO_AMD
MONO_DEV u32 mono_thread() { return __builtin_amdgcn_workitem_id_x(); }
MONO_DEV u32 mono_block() { return __builtin_amdgcn_workgroup_id_x(); }
MONO_DEV u32 mono_block_dim() { return __builtin_amdgcn_workgroup_size_x(); }
MONO_DEV u32 mono_grid_dim() { return __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(); }
#else
MONO_DEV u32 mono_thread() { return threadIdx.x; }
MONO_DEV u32 mono_block() { return blockIdx.x; }
MONO_DEV u32 mono_block_dim() { return blockDim.x; }
MONO_DEV u32 mono_grid_dim() { return gridDim.x; }
#endif
MONO_DEV u32 mono_lane() { return mono_thread() & (MONO_WAVE - 1); }
MONO_DEV u32 mono_wave() { return mono_thread() / MONO_WAVE; }
MONO_DEV u32 mono_waves_per_block() { return mono_block_dim() / MONO_WAVE; }

// ---- block barrier ---------------------------------------------------------------------------------
MONO_DEV void mono_sync_block() {
#if MONO_AMD
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
#else
  __syncthreads();
#endif
}

// ---- launches that overlap the kernel before them (NVIDIA sm_90: programmatic dependent launch) ---
// A kernel launched with Launch::overlap_prior may start while the kernel before it on the stream
// still runs; mono_wait_prior() holds it until that kernel has finished and its writes are visible,
// so it must come before any global access that kernel could see or make. mono_release_next() lets
// the next such kernel's CTAs be scheduled (to wait) before this one ends. On a plain launch, and
// on AMD, both do nothing.
MONO_DEV void mono_wait_prior() {
#if MONO_NVIDIA && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
MONO_DEV void mono_release_next() {
#if MONO_NVIDIA && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---- bit casts -------------------------------------------------------------------------------------
MONO_DEV u32 mono_f32_bits(float f) {
#if MONO_AMD
  return __builtin_bit_cast(u32, f);
#else
  u32 u;
  asm("mov.b32 %0, %1;" : "=r"(u) : "f"(f));
  return u;
#endif
}
MONO_DEV float mono_bits_f32(u32 u) {
#if MONO_AMD
  return __builtin_bit_cast(float, u);
#else
  float f;
  asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u));
  return f;
#endif
}

// ---- wave shuffles and ballots (whole wave active) -------------------------------------------------
MONO_DEV u32 mono_shfl(u32 v, u32 src_lane) {
#if MONO_AMD
  return (u32)__builtin_amdgcn_ds_bpermute((int)(src_lane << 2), (int)v);
#else
  u32 r;
  asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(src_lane));
  return r;
#endif
}
MONO_DEV u32 mono_shfl_xor(u32 v, u32 mask) {
#if MONO_AMD
  return mono_shfl(v, mono_lane() ^ mask);
#else
  u32 r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(mask));
  return r;
#endif
}
MONO_DEV float mono_shfl_xor_f32(float v, u32 mask) { return mono_bits_f32(mono_shfl_xor(mono_f32_bits(v), mask)); }
// The sum of v over the wave, in every lane: one `redux.sync` on NVIDIA (sm_80 and later), where
// a butterfly of shuffles takes ten instructions and five shuffle latencies.
MONO_DEV u32 mono_wave_sum_u32(u32 v) {
#if MONO_AMD
#pragma unroll
  for (u32 m = MONO_WAVE / 2; m > 0; m >>= 1) v += mono_shfl_xor(v, m);
  return v;
#else
  u32 r;
  asm volatile("redux.sync.add.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
  return r;
#endif
}
// v plus lane l - d's v, where there is such a lane (the steps of a prefix scan); and v plus lane
// l + d's (a suffix scan). On NVIDIA the shuffle's own in-range predicate guards the add: two
// instructions a step, where a computed source lane and a select take five.
MONO_DEV u32 mono_shfl_up_add(u32 v, u32 d) {
#if MONO_AMD
  const u32 lane = mono_lane(), o = mono_shfl(v, lane >= d ? lane - d : lane);
  return lane >= d ? v + o : v;
#else
  u32 r;
  asm volatile("{ .reg .pred p; .reg .u32 t; mov.u32 %0, %1; shfl.sync.up.b32 t|p, %1, %2, 0, 0xffffffff; @p add.u32 %0, %0, t; }"
               : "=r"(r) : "r"(v), "r"(d));
  return r;
#endif
}
MONO_DEV u32 mono_shfl_down_add(u32 v, u32 d) {
#if MONO_AMD
  const u32 lane = mono_lane(), o = mono_shfl(v, lane + d < MONO_WAVE ? lane + d : lane);
  return lane + d < MONO_WAVE ? v + o : v;
#else
  u32 r;
  asm volatile("{ .reg .pred p; .reg .u32 t; mov.u32 %0, %1; shfl.sync.down.b32 t|p, %1, %2, 0x1f, 0xffffffff; @p add.u32 %0, %0, t; }"
               : "=r"(r) : "r"(v), "r"(d));
  return r;
#endif
}
// Bit i is lane i's predicate; on NVIDIA the upper 32 bits are zero.
MONO_DEV u64 mono_ballot(bool pred) {
#if MONO_AMD
  return __builtin_amdgcn_ballot_w64(pred);
#else
  u32 r;
  asm volatile("{ .reg .pred p; setp.ne.u32 p, %1, 0; vote.sync.ballot.b32 %0, p, 0xffffffff; }"
               : "=r"(r) : "r"((u32)pred));
  return r;
#endif
}
MONO_DEV u32 mono_popc64(u64 v) {
#if MONO_AMD
  return (u32)__builtin_popcountll(v);
#else
  u32 n;
  asm("popc.b64 %0, %1;" : "=r"(n) : "l"(v));
  return n;
#endif
}
MONO_DEV u32 mono_popc32(u32 v) {
#if MONO_AMD
  return (u32)__builtin_popcount(v);
#else
  u32 n;
  asm("popc.b32 %0, %1;" : "=r"(n) : "r"(v));
  return n;
#endif
}

// A block barrier that returns whether `ok` holds in every thread of the block.
MONO_DEV bool mono_block_all(bool ok) {
#if MONO_AMD
  __shared__ u32 failed;
  if (mono_thread() == 0) failed = 0;
  mono_sync_block();
  if (!ok) failed = 1;
  mono_sync_block();
  const bool all_ok = *(volatile u32*)&failed == 0;
  mono_sync_block();
  return all_ok;
#else
  return __syncthreads_and(ok) != 0;
#endif
}

// ---- named barriers: a part of the CTA syncs alone (the teams of ops/team.h) ----------------------
// Syncs the `threads` threads (whole waves) that use barrier id `id` in 1..15 (0 is the block's
// barrier, mono_sync_block). NVIDIA: the hardware's named barriers. AMD (gfx950) has none: a
// sense-reversing barrier on a pair of LDS words per id (arrivals, generation), which the kernel's
// first block barrier after mono_named_barriers_init() makes ready.
#define MONO_BARRIERS 16
#if MONO_AMD
__shared__ u32 mono_named_lds[2 * MONO_BARRIERS];
#endif
// Block-wide, once before any named barrier is used; a block barrier must follow.
MONO_DEV void mono_named_barriers_init() {
#if MONO_AMD
  if (mono_thread() < 2 * MONO_BARRIERS) mono_named_lds[mono_thread()] = 0;
#endif
}
MONO_DEV void mono_named_sync(u32 id, u32 threads) {
#if MONO_AMD
  u32* arrivals = &mono_named_lds[2 * id];
  u32* generation = arrivals + 1;
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  if (mono_lane() == 0) {
    const u32 gen = __hip_atomic_load(generation, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
    if (__hip_atomic_fetch_add(arrivals, 1u, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_WORKGROUP) == threads / MONO_WAVE - 1) {
      __hip_atomic_store(arrivals, 0u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
      __hip_atomic_store(generation, gen + 1u, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_WORKGROUP);
    } else {
      while (__hip_atomic_load(generation, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_WORKGROUP) == gen)
        __builtin_amdgcn_s_sleep(1);
    }
  }
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
#else
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
#endif
}
// The same barrier, returning whether `ok` holds in every one of its threads.
MONO_DEV bool mono_named_all(u32 id, u32 threads, bool ok) {
#if MONO_AMD
  // A wave's verdict by ballot, the team's through an LDS word per id, cleared before the
  // barrier's first crossing and read between its second and third.
  __shared__ u32 failed[MONO_BARRIERS];
  const bool wave_ok = mono_ballot(!ok) == 0;
  if (mono_thread() % threads == 0) failed[id] = 0;
  mono_named_sync(id, threads);
  if (!wave_ok && mono_lane() == 0) failed[id] = 1;
  mono_named_sync(id, threads);
  const bool all_ok = *(volatile u32*)&failed[id] == 0;
  mono_named_sync(id, threads);
  return all_ok;
#else
  u32 all;
  asm volatile("{ .reg .pred p, q; setp.ne.u32 p, %1, 0; bar.red.and.pred q, %2, %3, p; selp.u32 %0, 1, 0, q; }"
               : "=r"(all)
               : "r"((u32)ok), "r"(id), "r"(threads)
               : "memory");
  return all != 0;
#endif
}
// Whether `ok` holds in every lane of the wave (the whole wave active).
MONO_DEV bool mono_wave_all(bool ok) { return mono_ballot(!ok) == 0; }

// ---- device-scope memory ordering ------------------------------------------------------------------
// Hand-offs between CTAs go through these: relaxed/acquire loads that bypass the non-coherent L1,
// relaxed/release stores, and device-scope fences.
#if MONO_AMD
#define MONO_LD(order, p) __hip_atomic_load(p, order, __HIP_MEMORY_SCOPE_AGENT)
#define MONO_ST(order, p, v) __hip_atomic_store(p, v, order, __HIP_MEMORY_SCOPE_AGENT)
MONO_DEV u64 mono_ld_relaxed_u64(const u64* p) { return MONO_LD(__ATOMIC_RELAXED, p); }
MONO_DEV u64 mono_ld_acquire_u64(const u64* p) { return MONO_LD(__ATOMIC_ACQUIRE, p); }
MONO_DEV u32 mono_ld_relaxed_u32(const u32* p) { return MONO_LD(__ATOMIC_RELAXED, p); }
MONO_DEV u32 mono_ld_acquire_u32(const u32* p) { return MONO_LD(__ATOMIC_ACQUIRE, p); }
MONO_DEV void mono_st_relaxed_u64(u64* p, u64 v) { MONO_ST(__ATOMIC_RELAXED, p, v); }
MONO_DEV void mono_st_release_u64(u64* p, u64 v) { MONO_ST(__ATOMIC_RELEASE, p, v); }
MONO_DEV void mono_st_relaxed_u32(u32* p, u32 v) { MONO_ST(__ATOMIC_RELAXED, p, v); }
MONO_DEV void mono_st_release_u32(u32* p, u32 v) { MONO_ST(__ATOMIC_RELEASE, p, v); }
MONO_DEV u32 mono_atomic_add_u32(u32* p, u32 v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
MONO_DEV void mono_fence_acquire() { __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent"); }
MONO_DEV void mono_fence_release() { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent"); }
MONO_DEV void mono_fence_acq_rel() { __builtin_amdgcn_fence(__ATOMIC_ACQ_REL, "agent"); }
#undef MONO_LD
#undef MONO_ST
#else
MONO_DEV u64 mono_ld_relaxed_u64(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MONO_DEV u64 mono_ld_acquire_u64(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MONO_DEV u32 mono_ld_relaxed_u32(const u32* p) {
  u32 v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
MONO_DEV u32 mono_ld_acquire_u32(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
MONO_DEV void mono_st_relaxed_u64(u64* p, u64 v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
MONO_DEV void mono_st_release_u64(u64* p, u64 v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
MONO_DEV void mono_st_relaxed_u32(u32* p, u32 v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
MONO_DEV void mono_st_release_u32(u32* p, u32 v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
MONO_DEV u32 mono_atomic_add_u32(u32* p, u32 v) {
  u32 old;
  asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
// One-way fences for the acquire pattern (relaxed loads, then fence.acquire) and the release
// pattern (fence.release, then relaxed stores) of the PTX memory model: on the H200 a linear task
// was ready 0.3 to 0.4 us sooner after its wait with them than with fence.acq_rel, and published
// sooner (crates/linear/PERF.md).
MONO_DEV void mono_fence_acquire() { asm volatile("fence.acquire.gpu;" ::: "memory"); }
MONO_DEV void mono_fence_release() { asm volatile("fence.release.gpu;" ::: "memory"); }
MONO_DEV void mono_fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
#endif
// Adds v to a word of this CTA's shared memory (LDS): relaxed, workgroup scope, no old value.
MONO_DEV void mono_atomic_add_lds_u32(u32* p, u32 v) {
#if MONO_AMD
  __hip_atomic_fetch_add((__attribute__((address_space(3))) u32*)p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
#else
  asm volatile("{\n .reg .u64 a;\n cvta.to.shared.u64 a, %0;\n red.shared.add.u32 [a], %1;\n}" ::"l"(p), "r"(v) : "memory");
#endif
}

// Adds v to a word of this CTA's shared memory (LDS) and returns the word before: relaxed,
// workgroup scope (a slot in a list that threads fill in any order).
MONO_DEV u32 mono_fetch_add_lds_u32(u32* p, u32 v) {
#if MONO_AMD
  return __hip_atomic_fetch_add((__attribute__((address_space(3))) u32*)p, v, __ATOMIC_RELAXED,
                                __HIP_MEMORY_SCOPE_WORKGROUP);
#else
  return atomicAdd(p, v);
#endif
}

// Adds 1 to a counter in this CTA's shared memory (LDS), as mono_atomic_add_lds_u32, but through
// the compiler's builtin on NVIDIA (mono_fetch_add_lds_u32, the old value unused): it then
// addresses the shared window directly and predicates the atomic instead of branching around it
// (the registers select counts every key this way). Not a replacement for the asm form: in the
// larger select kernels the builtin made NVRTC spill.
MONO_DEV void mono_count_lds_u32(u32* p) { (void)mono_fetch_add_lds_u32(p, 1u); }

// The 32-bit LDS address of a pointer into this CTA's shared memory (NVIDIA), what ldmatrix, LDS
// barriers and bulk copies take: a pointer is converted at every use, several 64-bit instructions
// each time in a loop. Bulk copies into LDS and their LDS barriers are the ops layer's (ops/copy.h).
#if MONO_NVIDIA
MONO_DEV u32 mono_lds_address(const void* p) {
  u32 address;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(address) : "l"(p));
  return address;
}
#endif

// ---- timers ----------------------------------------------------------------------------------------
// Nanoseconds on a clock shared by all SMs/CUs, for in-kernel timestamps that can be compared across CTAs.
MONO_DEV u64 mono_timer_ns() {
#if MONO_AMD
  return __builtin_amdgcn_s_memrealtime() * 10;  // the real-time counter runs at 100 MHz
#else
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}
// The cycle counter of the SM/CU this CTA runs on: finer than mono_timer_ns (whose %globaltimer
// ticks about 1 us on the H200), but per SM/CU, so only comparable within one CTA.
MONO_DEV u64 mono_clock_cycles() {
#if MONO_AMD
  return __builtin_readcyclecounter();
#else
  u64 t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
  return t;
#endif
}
// The SM (NVIDIA) or hardware wave slot id (AMD) this CTA runs on, for traces.
MONO_DEV u32 mono_sm_id() {
#if MONO_AMD
  return __builtin_amdgcn_s_getreg((4 << 0) | (0 << 6) | (31 << 11));  // HW_REG_HW_ID, all 32 bits
#else
  u32 id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
#endif
}

// ---- math (device builtins on both platforms, no libm headers) -------------------------------------
#if MONO_AMD
MONO_DEV float mono_fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
MONO_DEV float mono_fminf(float a, float b) { return __builtin_fminf(a, b); }
MONO_DEV float mono_sqrtf(float a) { return __builtin_sqrtf(a); }
MONO_DEV float mono_expf(float a) { return __builtin_expf(a); }
#else
MONO_DEV float mono_fmaxf(float a, float b) { return fmaxf(a, b); }
MONO_DEV float mono_fminf(float a, float b) { return fminf(a, b); }
MONO_DEV float mono_sqrtf(float a) { return sqrtf(a); }
MONO_DEV float mono_expf(float a) { return expf(a); }
#endif

MONO_DEV void mono_trap() {
#if MONO_AMD
  __builtin_trap();
#else
  asm volatile("trap;");
#endif
}

#include "numerics.h"
