// Standalone entry points of the MLA stage (its decoder: mla_tasks.h).
//
// mla_tasks: the generic task-list loop over a one-stage list (src/layout.rs builds it): launch
// with MONO_CTA_THREADS threads, MLA_SMEM_BYTES of dynamic shared memory and every CTA resident.
//
// mla_publish_slots: a stand-in for the select stage in tests and benchmarks: writes slots[i] as
// the tagged pair of box first + (i / per_row) * stride + i % per_row, with the tag of launch
// launch_index of the step. Launch it before mla_tasks, on the same stream.
#include "prelude.h"
#include "mailbox.h"
#include "mla_tasks.h"

#ifndef MONO_CTA_THREADS
#error "mla.hip: the host defines MONO_CTA_THREADS, the fused launch's CTA size"
#endif

extern __shared__ __attribute__((aligned(16))) u8 mla_lds[];

MONO_KERNEL void __launch_bounds__(MONO_CTA_THREADS, 1) mla_tasks(mbx_launch l, mla_args a) {
  const auto team = mono_cta_team<MONO_CTA_THREADS>();
  mbx_run_launch(l, [&](mbx_ctx& c, const mbx_task& t) { return mla_decode(team, t, c, a, mla_lds); });
}

MONO_KERNEL void mla_publish_slots(const i32* slots, u32 n, u32 per_row, u64* scratch, u32 first, u32 stride,
                                   const u32* epoch, u32 launches_per_step, u32 launch_index) {
  mbx_ctx c;
  c.scratch = scratch;
  c.tag = mbx_launch_tag(epoch, launches_per_step, launch_index);
  for (u32 i = mono_block() * mono_block_dim() + mono_thread(); i < n; i += mono_grid_dim() * mono_block_dim())
    mbx_put(c, first + (i / per_row) * stride + i % per_row, (u32)slots[i]);
}
