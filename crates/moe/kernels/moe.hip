// The MoE layer's standalone entry: the generic task-list loop over the two stages its tasks
// belong to (the linear stage's matrices and expert banks, the MoE stage's route and combine;
// tasks from src/layout.rs). The fused generator makes the same loop (executor::fused). Launch with
// MONO_CTA_THREADS threads and src/layout.rs `lds_bytes` of dynamic shared memory.
#include "prelude.h"
#include "mailbox.h"
#include "lin_task.h"
#include "moe_task.h"

extern __shared__ __attribute__((aligned(16))) u8 moe_lds[];

MONO_KERNEL void __launch_bounds__(MONO_CTA_THREADS, 1) moe_layer_tasks(mbx_launch l, lin_args la, moe_args a) {
  const auto team = mono_cta_team<MONO_CTA_THREADS>();
  mbx_run_launch(l, [&](mbx_ctx& c, const mbx_task& t) {
    switch (mbx_stage_of(t.kind)) {
      case MBX_STAGE_LINEAR:
        return lin_decode(team, t, c, la, moe_lds);
      case MBX_STAGE_MOE:
        return moe_decode(team, t, c, a, moe_lds);
      default:
        return false;
    }
  });
}
