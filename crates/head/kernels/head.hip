// The head stage's standalone entry: the generic task-list loop over a one-stage list (tasks from
// src/layout.rs). Launch with MONO_CTA_THREADS threads and layout::lds_bytes of dynamic shared
// memory.
#include "prelude.h"
#include "mailbox.h"
#include "head_tasks.h"

extern __shared__ __attribute__((aligned(16))) u8 head_lds[];

MONO_KERNEL void __launch_bounds__(MONO_CTA_THREADS, 1) head_tasks(mbx_launch l, head_args a) {
  const auto team = mono_cta_team<MONO_CTA_THREADS>();
  mbx_run_launch(l, [&](mbx_ctx& c, const mbx_task& t) { return head_decode(team, t, c, a, head_lds); });
}
