// Asynchronous copies into LDS (CTA scope): the copy engine moves a block of global memory into
// LDS on its own while the threads compute, and an LDS barrier completes when its bytes have landed.
//
// NVIDIA sm_90: `cp.async.bulk` with an `mbarrier` that counts the bytes (transaction count). One
// thread arms a barrier with the bytes to expect and starts the copies; waiters spin on the
// barrier's phase parity (the n-th completion of a barrier flips it to n % 2 == 1). AMD (gfx950)
// has no such engine: these are not defined there, and a caller's AMD path loads through registers.
//
// Barriers and copies take 32-bit LDS addresses (mono_lds_address), not pointers: a pointer is
// converted to one at every use, several 64-bit instructions each time in a loop.
#pragma once
#include "prelude.h"

// Orders this thread's plain LDS stores before later reads of the same LDS by the asynchronous
// units (the copy engine, wgmma's shared-memory operands). A barrier with the reading threads must
// still follow. Nothing to order on AMD.
MONO_DEV void mono_fence_lds_async() {
#if MONO_NVIDIA
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

#if MONO_NVIDIA
// One thread; a barrier of the waiting threads must follow before anyone waits on or arms it.
MONO_DEV void mono_lds_barrier_init(u32 bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One thread, once every copy counted on the barrier has been waited for: the 8 bytes may then be
// reused as plain LDS (the next task's), which an initialised barrier must not be.
MONO_DEV void mono_lds_barrier_inval(u32 bar) { asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(bar) : "memory"); }
// Arms the barrier for the next phase: it completes once `bytes` have landed.
MONO_DEV void mono_lds_barrier_expect(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Starts a copy of `bytes` (a multiple of 16, both ends 16-byte aligned) from global memory to LDS,
// counted against `bar`. The copy engine writes through the async proxy, so plain stores to the
// destination must be ordered before it by the threads that made them (mono_fence_lds_async, then
// a barrier with the issuing thread); reads of it are ordered by the LDS barrier alone. No fence
// here: on sm_90 it compiles to MEMBAR.ALL.CTA, a wait for every memory access the issuing thread
// still has in flight (its global stores included), and most copies need none.
MONO_DEV void mono_copy_bulk(u32 lds, const void* global, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(lds),
               "l"(global), "r"(bytes), "r"(bar)
               : "memory");
}
// Spins until the barrier's phase with this parity has completed.
MONO_DEV void mono_lds_barrier_wait(u32 bar, u32 parity) {
  u32 done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
}
#endif
