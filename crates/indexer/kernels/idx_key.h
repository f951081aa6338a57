// The index key of one row (spec §3.1-3.5): LayerNorm, rope, Hadamard, E4M3 with a power-of-two
// scale, stored into the row's cache slot and published as tagged pairs, so this launch's scorers
// need not wait for the store to become visible.
#pragma once
#include "idx_common.h"

// The key of row task.args[0]. Wave 0 of the team computes it (one HEAD_DIM vector, a wave's
// worth); the other waves have nothing to do. Waits on its inputs (the projection's boxes) first.
template <class Team>
MONO_DEV bool idx_key_task(const Team& team, const mbx_task& task, mbx_ctx& c, const idx_args& a, u8* smem) {
  (void)smem;
  if (!idx_wait_inputs(team, task, c)) return false;
  if (idx_unhoisted(team.wave()) != 0) return true;
  const u32 row = task.args[0];
  const u32 lane = idx_unhoisted(team.lane());
  const idx_row r = a.rows[row];
  const u32 position = idx_position(a, row);
  float v[IDX_LANE_DIMS];
#pragma unroll
  for (u32 i = 0; i < IDX_LANE_DIMS; ++i)
    v[i] = mono_bf16_to_f32(a.key_proj[(u64)row * IDX_HEAD_DIM + lane * IDX_LANE_DIMS + i]);

  // LayerNorm in fp32, mean then variance (two passes, as torch), eps 1e-6, affine.
  float sum = 0.0f;
#pragma unroll
  for (u32 i = 0; i < IDX_LANE_DIMS; ++i) sum += v[i];
  const float mean = mono_wave_sum(sum) / (float)IDX_HEAD_DIM;
  float squares = 0.0f;
#pragma unroll
  for (u32 i = 0; i < IDX_LANE_DIMS; ++i) squares += (v[i] - mean) * (v[i] - mean);
  const float inv_std = 1.0f / mono_sqrtf(mono_wave_sum(squares) / (float)IDX_HEAD_DIM + 1e-6f);
#pragma unroll
  for (u32 i = 0; i < IDX_LANE_DIMS; ++i) {
    const u32 d = lane * IDX_LANE_DIMS + i;
    v[i] = (v[i] - mean) * inv_std * a.norm_weight[d] + a.norm_bias[d];
  }

  idx_rope(v, lane, position, a.inv_freq);
#if IDX_HADAMARD
  idx_hadamard(v, lane);
#endif

  u8 codes[IDX_LANE_DIMS];
  const float scale = idx_quantise(v, codes);
  u32 word;
  const bool owner = idx_pack_codes(codes, lane, &word);

  const idx_request q = a.requests[r.request];
  const u32 page = a.page_list[q.page_offset + position / IDX_PAGE_TOKENS];
  const u32 slot = position % IDX_PAGE_TOKENS;
  const u32 w = lane * IDX_LANE_DIMS / 4;
  if (owner) {
    *(u32*)(a.cache_write + idx_key_offset(page, slot) + 4u * w) = word;
    mono_st_relaxed_u64(c.scratch + idx_key_box(a, row, w), mbx_pack(c.tag, word));
  }
  if (lane == 0) {
    *(float*)(a.cache_write + idx_scale_offset(page, slot)) = scale;
    mono_st_relaxed_u64(c.scratch + idx_key_box(a, row, IDX_HEAD_DIM / 4), mbx_pack(c.tag, mono_f32_bits(scale)));
  }
  return true;
}
