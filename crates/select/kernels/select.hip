// The standalone entry of the select stage: the generic task-list loop (mailbox.h mbx_run_launch)
// over a one-stage list that the host builds (src/gpu.rs, src/layout.rs SelectPlan), each task
// decoded by sel_decode (select_decode.h says what a descriptor holds). Launch with
// MONO_CTA_THREADS threads and SEL_LDS_BYTES of dynamic shared memory, one CTA per list, all
// resident at once. It may be launched to overlap the kernel before it (Launch::overlap_prior): it
// lets the next launch's CTAs in at once, and waits for the last one before any global access.
#include "prelude.h"
#include "mailbox.h"
#include "select.h"

extern __shared__ __attribute__((aligned(16))) u8 sel_lds[];

MONO_KERNEL void __launch_bounds__(MONO_CTA_THREADS, 1) select_tasks(mbx_launch l, sel_args a) {
  mono_release_next();
  mono_wait_prior();
  const auto team = mono_cta_team<MONO_CTA_THREADS>();
  mbx_run_launch(l, [&](mbx_ctx& c, const mbx_task& t) { return sel_decode(team, t, c, a, sel_lds); });
}
