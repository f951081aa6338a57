// The MLA stage's decoder: the attention tasks (mla_attn.h) and the attention half's row tasks
// (mla_rows.h). The fused kernel's generator includes this header (src/gpu.rs `stage_kernel`).
#pragma once
#include "mla_attn.h"
#include "mla_rows.h"

template <class Team>
MONO_DEV bool mla_decode(const Team& team, const mbx_task& task, mbx_ctx& c, const mla_args& a, u8* smem) {
  switch (mbx_own_kind(task.kind)) {
    case MLA_KIND_CACHE_WRITE:
      return mla_cache_write_task(team, task, c, a);
    case MLA_KIND_SPLIT:
      return mla_split_task(team, task, c, a, smem);
    case MLA_KIND_COMBINE:
      return mla_combine_task(team, task, c, a, smem);
    case MLA_KIND_NORM:
      return mla_norm_task(team, task, c, a, smem);
    case MLA_KIND_ROPE_Q:
      return mla_rope_q_task(team, task, c, a);
    case MLA_KIND_SLOTS:
      return mla_slots_task(team, task, c, a);
    default:
      return true;
  }
}
