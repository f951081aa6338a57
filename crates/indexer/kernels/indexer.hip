// The indexer stage's standalone entry point: the generic task-list loop over a one-stage list
// (src/layout.rs StageTasks), the fused layer kernel's loop with the indexer's decoder alone. One
// CTA of MONO_CTA_THREADS a SM, all resident at once (scorers wait on the key and query tasks of
// other CTAs).
#include "prelude.h"
#include "mailbox.h"
#include "ops/team.h"
#include "idx_tasks.h"

#ifndef MONO_CTA_THREADS
#error "the host sets MONO_CTA_THREADS, the fused CTA shape's thread count"
#endif

// A launch may overlap the kernel before it (Launch::overlap_prior, CUDA's programmatic dependent
// launch): it lets the next one in at once and waits for the one before before any task, since
// its scores may still be read there (as select reads them).
MONO_KERNEL void __launch_bounds__(MONO_CTA_THREADS, 1) indexer_tasks(mbx_launch l, idx_args a) {
  extern __shared__ __attribute__((aligned(16))) u8 idx_lds[];
  mono_release_next();
#if MONO_FAULT != MONO_FAULT_IDX_SKIP_PRIOR_WAIT
  mono_wait_prior();
#endif
  const auto team = mono_cta_team<MONO_CTA_THREADS>();
  mbx_run_launch(l, [&](mbx_ctx& c, const mbx_task& t) { return idx_decode(team, t, c, a, idx_lds); });
}
