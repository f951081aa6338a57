// Standalone entry points of the indexer stage. The fused layer kernel calls the same task
// functions (idx_key_task, idx_query_task, idx_score_task) from its task lists.
#include "prelude.h"
#include "mailbox.h"
#include "idx_common.h"
#include "idx_key.h"
#include "idx_query.h"
#include "idx_score.h"
#include "idx_score_ring.h"

#if IDX_WGMMA
// The ring of IDX_SCORE_LDS_BYTES (idx_score_ring.h) lives in dynamic shared memory.
extern __shared__ __attribute__((aligned(16))) u8 idx_lds[];
#define IDX_SCORE_SMEM
// The wgmma scorer makes its own mailbox context, after its task's loads (idx_score_ring.h).
#define IDX_SCORE(a, c, index) ((void)(c), idx_score_ring_task<false>(a, index, idx_lds))
#else
#define IDX_SCORE_SMEM __shared__ idx_score_smem sm
// The mma.sync scorers wait for an overlapped launch's prior kernel before anything.
#define IDX_SCORE(a, c, run) (idx_wait_prior(), idx_score_task(a, c, run, sm))
#endif

// One launch of the stage: block b < rows writes row b's key, the next `rows` blocks the rows'
// queries, the rest score one run each. Scorers wait on the other blocks' pairs, so launch it
// cooperatively (every block resident at once).
MONO_KERNEL void __launch_bounds__(IDX_BLOCK, 2) indexer_launch(idx_args a) {
  IDX_SCORE_SMEM;
  const mbx_ctx c = mbx_begin(a.scratch, mbx_launch_tag(a.epoch, a.launches_per_step, a.launch_index), a.diag);
  u32 b = mono_block();
  if (b < a.n_rows) return idx_key_task(a, c, b);
  b -= a.n_rows;
  if (b < a.n_rows) return idx_query_task(a, c, b);
  b -= a.n_rows;
  if (b < a.n_runs) IDX_SCORE(a, c, b);
}

// Scoring alone (one run a block), for benchmarks: the queries and new keys must already be in
// the scratch under this launch's tag, from an indexer_launch with the same epoch and launch index.
// It may overlap the kernel before it (Launch::overlap_prior): it reads its task, the cached pages
// and the tagged pairs before waiting for that kernel, and waits before it writes a score (the
// scores may still be read by that kernel, as select reads them).
MONO_KERNEL void __launch_bounds__(IDX_BLOCK, 2) indexer_score(idx_args a) {
  IDX_SCORE_SMEM;
  mono_release_next();
  if (mono_block() >= a.n_runs) return;
#if IDX_WGMMA
  idx_score_ring_task<true>(a, mono_block(), idx_lds);
#else
  const mbx_ctx c = mbx_begin(a.scratch, mbx_launch_tag(a.epoch, a.launches_per_step, a.launch_index), a.diag);
  IDX_SCORE(a, c, mono_block());
#endif
}
